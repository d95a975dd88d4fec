//! Command-line options: perftest's flags, defaults and derived rules (spec section 2.1).
//!
//! Parsing is pure (no device is opened): [`parse`] turns `argv` into [`Params`] or a
//! [`ParseOutcome`] saying what to print and which exit code to use. clap reads the flags and
//! checks every value (`cli`, `values`); `rules` applies what depends on the tool and on
//! other flags. Rules that need the device (inline defaults, the UD size cap, outstanding
//! reads) are applied later by the engine.

mod cli;
mod help;
mod params;
mod rules;
mod values;

pub use help::help_text;
pub use params::{AtomicType, Conn, OutputOnly, Params};

use crate::{Kind, Tool, Verb};
use cli::Cli;

/// perftest's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// The largest message of `-a` (2^23 bytes).
pub const MAX_ALL_SIZE: u64 = 1 << 23;
/// perftest's `RESULT_LINE`: 87 dashes and a newline.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------\n";
/// The version perftest 4.5-0.17 reports and sends.
pub const VERSION: &str = "6.06";

/// What to do instead of running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseOutcome {
    /// Print `stdout` (help or version) and exit with `code`.
    Print {
        /// Text for stdout.
        stdout: String,
        /// Exit code (perftest exits 1 even for `-h`/`-V`).
        code: i32,
    },
    /// A bad command line: print `stderr` (and usage on stdout when set), exit 1.
    Error {
        /// Text for stderr.
        stderr: String,
        /// Usage for stdout, or empty.
        stdout: String,
    },
}

/// perftest's parser error: the message, then ` Parser function exited with Error`.
fn parser_error(msg: &str) -> ParseOutcome {
    ParseOutcome::Error {
        stderr: format!(" {msg}\n Parser function exited with Error\n"),
        stdout: String::new(),
    }
}

/// A clap error as perftest reports it: a value's own message as a parser error, anything else
/// (an unknown flag, a missing value) as getopt's complaint with the usage on stdout.
fn clap_error(tool: Tool, e: &clap::Error) -> ParseOutcome {
    if let Some(msg) = values::perftest_message(e) {
        return parser_error(&msg);
    }
    let text = e.to_string();
    let first = text
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("error: ");
    ParseOutcome::Error {
        stderr: format!(
            "{}: {first}\n Invalid Command or flag.\n Please check command line and run again.\n\n Parser function exited with Error\n",
            tool.binary_name()
        ),
        stdout: help_text(tool),
    }
}

/// Parses `args` (without the program name) for `tool`.
///
/// # Errors
/// A [`ParseOutcome`] for help, version, and every invalid command line.
pub fn parse(tool: Tool, args: &[String]) -> Result<Params, ParseOutcome> {
    let cli = Cli::parse_args(tool, args).map_err(|e| clap_error(tool, &e))?;
    if cli.help {
        return Err(ParseOutcome::Print {
            stdout: help_text(tool),
            code: 1,
        });
    }
    if cli.version {
        return Err(ParseOutcome::Print {
            stdout: format!("Version: {VERSION}\n"),
            code: 1,
        });
    }
    rules::check_tool_flags(tool, &cli)?;
    let atomic_type = rules::atomic_type(&cli)?;
    let conn = cli.conn.unwrap_or(Conn::Rc);
    rules::check_combinations(&cli, conn)?;
    let size = cli.size.unwrap_or(help::default_size(tool));
    let iters = cli.iters.unwrap_or(help::default_iters(tool));
    let depths = rules::depths(tool, &cli, conn, iters);
    let moderation = rules::moderation(tool, &cli, conn, size, iters, depths.tx)?;
    let mut p = params(tool, cli, conn, size, iters, depths, moderation);
    p.atomic_type = atomic_type;
    Ok(p)
}

/// The [`Params`] of a checked command line.
fn params(
    tool: Tool,
    cli: Cli,
    conn: Conn,
    size: u64,
    iters: u64,
    depths: rules::Depths,
    moderation: rules::Moderation,
) -> Params {
    // perftest warns about an MTU that is not one and then uses the port's.
    let mtu_valid = |m: &u32| rsrdma::Mtu::from_bytes(*m).is_some();
    let out_json = match (cli.out_json, cli.out_json_file) {
        (_, Some(f)) => Some(f),
        (true, None) => Some("perftest_out.json".to_string()),
        (false, None) => None,
    };
    // write_lat always runs without relaxed ordering: its last-byte polling needs the bytes
    // of a write to land in order.
    let write_lat = tool.verb == Verb::Write && tool.kind == Kind::Lat;
    Params {
        tool,
        host: cli.host,
        device: cli.device,
        ib_port: cli.ib_port.unwrap_or(1),
        gid_index: cli.gid_index,
        // perftest lets -a override -s; so do these tools.
        size: if cli.all { 2 } else { size },
        size_explicit: cli.size.is_some() && !cli.all,
        all: cli.all,
        iters,
        duration: cli.duration,
        margin: cli.margin.unwrap_or(2),
        tx_depth: depths.tx,
        rx_depth: depths.rx,
        num_qps: cli.qps.unwrap_or(1),
        inline: cli.inline,
        post_list: cli.post_list.unwrap_or(1),
        cq_mod: moderation.cq_mod,
        conn,
        rdma_cm: cli.rdma_cm,
        port: cli.port.unwrap_or(DEFAULT_PORT),
        mtu: cli.mtu.filter(mtu_valid),
        mtu_invalid: cli.mtu.filter(|m| !mtu_valid(m)),
        events: cli.events,
        bidir: cli.bidir,
        out_reads: cli.outs,
        atomic_type: AtomicType::FetchAndAdd,
        no_peak_flag: cli.no_peak,
        report_gbits: cli.report_gbits,
        output: cli.output,
        out_json,
        loopback: cli.loopback,
        qp_timeout: cli.qp_timeout.unwrap_or(14),
        sl: cli.sl.unwrap_or(0),
        tclass: cli.tclass.unwrap_or(0),
        pkey_index: cli.pkey_index.unwrap_or(0),
        report_cycles: cli.report_cycles,
        histogram: cli.histogram || cli.unsorted,
        unsorted: cli.unsorted,
        relaxed_ordering: !(cli.disable_relaxed || write_lat),
        new_post_send: cli.new_post_send,
        notes: moderation.notes,
    }
}

#[cfg(test)]
mod tests;
