//! perftest's rules on a parsed command line (spec 2.1): which flags a tool takes, which flags
//! go together, and the values derived from others.

use super::cli::{Cli, UD_INLINE};
use super::params::{AtomicType, Conn};
use super::{parser_error, ParseOutcome, RESULT_LINE};
use crate::{Kind, Tool, Verb};

/// A flag this tool does not have: perftest's getopt error, with the usage on stdout.
fn not_for(tool: Tool, flag: &str) -> ParseOutcome {
    ParseOutcome::Error {
        stderr: format!(
            "{}: option {flag} is not available in this test\n Invalid Command or flag.\n Please check command line and run again.\n\n Parser function exited with Error\n",
            tool.binary_name()
        ),
        stdout: super::help_text(tool),
    }
}

/// Refuses the flags `tool` does not take.
pub(super) fn check_tool_flags(tool: Tool, cli: &Cli) -> Result<(), ParseOutcome> {
    let lat = tool.kind == Kind::Lat;
    if lat && cli.qps.is_some() {
        return Err(parser_error("Multiple QPs only available on bw tests"));
    }
    if lat && cli.bidir {
        return Err(parser_error(
            "Bidirectional mode only available on bw tests",
        ));
    }
    if tool.verb == Verb::Atomic {
        check_atomic_size(cli)?;
    }
    // perftest's latency tools accept --report_gbits and ignore it; so do these.
    let refused = [
        (tool.verb != Verb::Atomic && cli.atomic_type.is_some(), "-A"),
        (lat && cli.post_list.is_some(), "-l"),
        (lat && cli.cq_mod.is_some(), "-Q"),
        (lat && cli.no_peak, "-N"),
        (tool.verb != Verb::Send && cli.rx_depth.is_some(), "-r"),
        (!tool.verb.reads() && cli.outs.is_some(), "-o"),
        (tool.verb.reads() && cli.inline.is_some(), "-I"),
        (tool.verb == Verb::Write && cli.events, "-e"),
        (
            !lat && (cli.report_cycles || cli.histogram || cli.unsorted),
            "-C/-H/-U",
        ),
        (lat && cli.tx_depth.is_some(), "-t"),
        // rdma_cm makes the QPs on its ids, the classic way.
        (
            cli.rdma_cm && cli.new_post_send,
            "--use_new_post_send with -R",
        ),
    ];
    match refused.iter().find(|(bad, _)| *bad) {
        Some((_, flag)) => Err(not_for(tool, flag)),
        None => Ok(()),
    }
}

/// The atomics move 8 bytes: perftest refuses any other `-s`, and `-a`, with this text on
/// stdout.
fn check_atomic_size(cli: &Cli) -> Result<(), ParseOutcome> {
    if cli.all || cli.size.is_some_and(|s| s != ATOMIC_SIZE) {
        return Err(ParseOutcome::Error {
            stderr: String::new(),
            stdout: format!("{RESULT_LINE}Message size cannot be changed for Atomic tests \n"),
        });
    }
    Ok(())
}

/// The size of every atomic operation.
pub(super) const ATOMIC_SIZE: u64 = 8;

/// `-A`: perftest's names only; its complaint comes without the parser's trailer.
pub(super) fn atomic_type(cli: &Cli) -> Result<AtomicType, ParseOutcome> {
    match cli.atomic_type.as_deref() {
        None => Ok(AtomicType::FetchAndAdd),
        Some(name) => AtomicType::from_name(name).ok_or_else(|| ParseOutcome::Error {
            stderr: " Invalid Atomic type! please choose from {CMP_AND_SWAP,FETCH_AND_ADD}\n"
                .into(),
            stdout: String::new(),
        }),
    }
}

/// Refuses flags that do not go together.
pub(super) fn check_combinations(cli: &Cli, conn: Conn) -> Result<(), ParseOutcome> {
    let refused = [
        (
            cli.duration.is_some() && cli.iters.is_some(),
            "Duration (-D) and iterations (-n) cannot be used together".to_string(),
        ),
        (
            cli.duration.is_some() && cli.all,
            "Duration (-D) with all sizes (-a) is not supported".into(),
        ),
        (
            conn == Conn::Ud && cli.inline.is_some_and(|i| u64::from(i) > UD_INLINE.hi()),
            UD_INLINE.out_of_range(),
        ),
        (
            cli.loopback && cli.host.is_some(),
            "--loopback runs both ends: give no host".into(),
        ),
        (
            cli.rdma_cm && conn == Conn::Uc,
            "rdma_cm (-R) does not support UC".into(),
        ),
        (
            cli.rdma_cm && conn == Conn::Ud,
            "rdma_cm (-R) with UD is not supported by the rs_* tools".into(),
        ),
        (
            cli.rdma_cm && cli.loopback,
            "--loopback with rdma_cm (-R) is not supported: run a server and a client".into(),
        ),
    ];
    match refused.into_iter().find(|(bad, _)| *bad) {
        Some((_, msg)) => Err(parser_error(&msg)),
        None => Ok(()),
    }
}

/// The queue depths after perftest's clamps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Depths {
    /// `-t` after derivation.
    pub tx: u32,
    /// `-r` after derivation.
    pub rx: u32,
}

/// tx depth and (SEND) rx depth: clamped to the iterations, UD/UC's default rx depth, an even
/// rx depth.
pub(super) fn depths(tool: Tool, cli: &Cli, conn: Conn, iters: u64) -> Depths {
    let bw = tool.kind == Kind::Bw;
    let iter_cap = iters.min(u64::from(u32::MAX)) as u32;
    let counted = cli.duration.is_none();
    let mut tx = cli.tx_depth.unwrap_or(if bw { 128 } else { 1 });
    if counted {
        tx = tx.min(iter_cap);
    }
    let mut rx = cli
        .rx_depth
        .unwrap_or(if tool.verb == Verb::Send { 512 } else { 1 });
    if tool.verb == Verb::Send {
        if counted {
            rx = rx.min(iter_cap);
        }
        if conn != Conn::Rc && cli.rx_depth.is_none() {
            rx = if counted {
                iters.min(16000) as u32
            } else {
                512
            };
        }
        if !cli.all && rx % 2 == 1 {
            rx += 1;
        }
    }
    Depths { tx, rx }
}

/// What perftest's CQ moderation rules decide.
#[derive(Debug, Clone)]
pub(super) struct Moderation {
    /// Signal every `cq_mod`-th request.
    pub cq_mod: u32,
    /// Lines printed before anything else.
    pub notes: Vec<String>,
}

/// CQ moderation: 1 for latency tests; else 100, forced to 1 for large messages (a warning
/// when `-Q` was given), at most the tx depth, and the post list's length with `-l`.
pub(super) fn moderation(
    tool: Tool,
    cli: &Cli,
    conn: Conn,
    size: u64,
    iters: u64,
    tx_depth: u32,
) -> Result<Moderation, ParseOutcome> {
    let mut notes = Vec::new();
    if tool.kind == Kind::Lat {
        return Ok(Moderation { cq_mod: 1, notes });
    }
    let mut cq_mod = cli.cq_mod.unwrap_or(100);
    if size > 8192 && conn != Conn::Ud && !cli.all && !cli.events {
        // perftest warns only of a moderation that is one (`-Q 1` moderates nothing).
        if cli.cq_mod.is_some() {
            if cq_mod > 1 {
                notes.push(format!(
                "{RESULT_LINE}Warning: Large message requested and CQ moderation enabled\nWarning: It can lead to inaccurate results\n"
            ));
            }
        } else {
            cq_mod = 1;
        }
    }
    cq_mod = cq_mod.min(tx_depth);
    let post_list = cli.post_list.unwrap_or(1);
    if post_list > 1 {
        cq_mod = post_list;
        notes.push(format!(
            "{RESULT_LINE}Post List requested - CQ moderation will be the size of the post list\n"
        ));
        if cli.duration.is_none() && iters % u64::from(post_list) != 0 {
            return Err(parser_error(
                "Number of iterations must be a multiple of the post list size",
            ));
        }
        if post_list > tx_depth {
            return Err(parser_error(
                "Post list size must not exceed the tx depth (-t)",
            ));
        }
    }
    Ok(Moderation { cq_mod, notes })
}
