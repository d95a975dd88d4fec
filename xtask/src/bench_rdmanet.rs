//! `cargo xtask bench rdmanet`: rsrdma-net's `Conn` against its baselines, side by side, in
//! one run (as `bench perftest`: A B A B …, `--rounds` times, medians, ratio B/A).
//!
//! Rows (A is the baseline, B is `Conn`):
//! - 64 KiB streaming: `rs_rdmanet_bw --raw` (RawConn `pipeline_batch`) against
//!   `rs_rdmanet_bw --poll busy` (`send_msg` per message), Gb/s;
//! - 1 KiB message rate: `rs_rdmanet_bw --raw` against `rs_rdmanet_bw -b 32 --poll adaptive`
//!   (`send_batch` with the library's defaults: 32 credits, adaptive polling);
//! - 64 B latency: `rs_send_lat`'s t_typical against `rs_rdmanet_lat --poll busy`'s median
//!   round trip / 2 (both busy-poll);
//! - information, from the 64 KiB runs: registered memory per connection and CPU seconds per
//!   GB moved (user + sys of client and server over the transfer, each tool's own rusage as
//!   it prints it; the kernel's rxe work outside the processes is not in it);
//! - zero-copy 1 MiB: `rs_rdmanet_bw --no-rendezvous` (copied through the slots on both
//!   ends) against `rs_rdmanet_bw --zero-copy` (registered buffers; the receiver READs each
//!   message into its buffer), Gb/s ([`zerocopy_row`]);
//! - `async_vs_blocking`'s ratio, when rsrdma-net has that example.
//!
//! - 64 KiB both ways: rdma-core's rsocket (`rstream -S 65536 -C N`) against
//!   `rs_rdmanet_bw --both-ways --poll adaptive` (Conn with its defaults), Gb/s both ways.
//! - 64 KiB over a striped connection: 1 rail against 2 rails on the one device
//!   (`rs_rdmanet_bw --rails N`, [`rails_row`]): the cost of striping, not a speed-up.
//!
//! The stream, latency and zero-copy rows busy-poll on both sides, as RawConn and perftest
//! always do: they compare the work per message, not two ways of waiting (in the TCG VM an
//! event-mode wake-up costs more than a 1 KiB message; `rs_rdmanet_bw --poll event` shows
//! that cost). The message-rate and rsocket rows run Conn with the library's defaults
//! (adaptive polling, 32 credits), as a user does. The tools run at their defaults otherwise
//! (rdma_cm, 32 credits; `--raw`: tx depth 128, lists of 16).

use crate::bench::{self, BenchArgs, Case, Metric, Run};
use crate::vm::{self, sh_quote};
use anyhow::{bail, Result};
use std::fmt::Write as _;
use std::path::Path;

const USAGE: &str = "usage: cargo xtask bench rdmanet [--rounds N] [--quick] \
                     [--case stream|rate|latency|zerocopy|rsocket|rails]... \
                     [--no-vm -d DEVICE -x GID_INDEX --host DEVICE_IP] [--timeout SECS]\n\
                     Conn (rsrdma-net) against RawConn and rs_send_lat, medians of alternating \
                     rounds (5 by default) in the soft-RoCE VM.\n\
                     --case: run only these rows (repeatable; the information rows come with \
                     `stream`, the async row only with every row), to iterate on one quickly.\n\
                     --host: the address rdma_cm resolves to DEVICE (needed with --no-vm: \
                     rdma_cm cannot use 127.0.0.1).";

/// The example that compares the async `Conn` with the blocking one, when it exists.
const ASYNC_EXAMPLE: &str = "async_vs_blocking";
/// Its output file in the output directory.
const ASYNC_OUT: &str = "async.out";
/// Messages per `Conn` send group in the message-rate row. The row's Conn runs with the
/// library's defaults otherwise (32 credits, adaptive polling), as a user has them: an
/// earlier version gave it 128 credits and busy polling, which no user sets by default.
const BATCH: u32 = 32;

/// What a row's runs are read as.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Measure {
    /// Gb/s, higher is better.
    Gbits,
    /// Million messages per second of this many bytes, higher is better.
    Mpps(u32),
    /// One-way latency in µs (round trip / 2, or perftest's t_typical), lower is better.
    OneWayUs,
}

impl Measure {
    fn unit(self) -> &'static str {
        match self {
            Measure::Gbits => "Gb/s",
            Measure::Mpps(_) => "Mpps",
            Measure::OneWayUs => "us",
        }
    }

    /// Whether `ratio` (B/A) meets the row's target.
    fn met(self, ratio: f64, bound: f64) -> bool {
        match self {
            Measure::OneWayUs => ratio <= bound,
            _ => ratio >= bound,
        }
    }
}

/// One measured row: a case for [`bench::script`], how to read it, and its target.
struct Row {
    /// Its `--case` name.
    key: &'static str,
    case: Case,
    measure: Measure,
    /// The ratio B/A is held to this bound (at least, or at most for latency).
    bound: f64,
}

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    let (host, rest) = take_host(args)?;
    let (only, rest) = take_cases(&rest)?;
    let Some(a) = bench::parse_args(&rest, USAGE)? else {
        return Ok(0);
    };
    let host = match (host, a.no_vm) {
        (Some(h), _) => h,
        (None, false) => vm::GUEST_IP.to_string(),
        (None, true) => bail!("--no-vm needs --host DEVICE_IP (rdma_cm cannot use 127.0.0.1)"),
    };
    vm::ensure_packages(vm::HOST_PACKAGES)?;
    bench::cargo_build(
        root,
        &["build", "--release", "-p", "rsrdma-perftest", "--bins"],
    )?;
    let async_features = if only.is_empty() {
        async_example_features(root)?
    } else {
        None
    };
    if let Some(features) = &async_features {
        let mut cmd = vec!["build", "--release", "-p", "rsrdma-net"];
        if !features.is_empty() {
            cmd.extend(["--features", features]);
        }
        cmd.extend(["--example", ASYNC_EXAMPLE]);
        bench::cargo_build(root, &cmd)?;
    }
    let target = vm::target_dir()?;
    let bin = target.join("release");
    let mut rows = rows(&a, &bin.display().to_string());
    if !only.is_empty() {
        rows.retain(|r| only.contains(&r.key));
    }
    let out_dir = a.out_dir(&target);
    let cases: Vec<Case> = rows.iter().map(|r| clone_case(&r.case)).collect();
    let (mut script, runs) = bench::script(&cases, a.rounds, &a.dev, &a.gid, &host, &out_dir);
    if async_features.is_some() {
        let exe = bin.join("examples").join(ASYNC_EXAMPLE);
        let out = out_dir.join(ASYNC_OUT);
        let _ = write!(
            script,
            "\necho '[bench] {ASYNC_EXAMPLE}' >&2\ntimeout 600 {} {} {} {} > {} 2>&1",
            sh_quote(&exe.display().to_string()),
            sh_quote(&host),
            a.scale(500, 5000),
            a.rounds,
            sh_quote(&out.display().to_string()),
        );
    }
    let status = bench::run_script(&a, root, &script, &out_dir)?;
    let read = |stem: &str, end: &str| {
        std::fs::read_to_string(out_dir.join(format!("{stem}.{end}"))).unwrap_or_default()
    };
    let mut table = report_title(&a);
    table += &measured_rows(&rows, &runs, &read);
    if let Some(stream) = rows.iter().position(|r| r.key == "stream") {
        table += &info_rows(stream, &rows[stream], &runs, &read);
    }
    if only.is_empty() {
        table += &async_row(
            async_features
                .is_some()
                .then(|| std::fs::read_to_string(out_dir.join(ASYNC_OUT)).unwrap_or_default())
                .as_deref(),
        );
    }
    table += "\nratio = B/A (latency: B's one-way time over A's, below 1 is faster)\n";
    let chart_value = |text: &str, m: Metric| match m {
        Metric::Gbits => value(text, Measure::Gbits),
        Metric::Typical => value(text, Measure::OneWayUs),
    };
    bench::write_chart(
        &a,
        &cases,
        &runs,
        &out_dir,
        "Conn, RawConn and the tools (bench rdmanet)",
        &chart_value,
    )?;
    print!("{table}");
    let saved = target.join("bench-rdmanet.txt");
    std::fs::write(&saved, &table)?;
    eprintln!("[bench] table saved to {}", saved.display());
    Ok(status)
}

/// Removes `--host ADDR` from the arguments (the other options are `bench perftest`'s).
fn take_host(args: &[String]) -> Result<(Option<String>, Vec<String>)> {
    let mut host = None;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--host" {
            match it.next() {
                Some(h) => host = Some(h.clone()),
                None => bail!("--host needs a value\n{USAGE}"),
            }
        } else {
            rest.push(arg.clone());
        }
    }
    Ok((host, rest))
}

/// The row keys of every `--case KEY` (checked), and the other arguments.
fn take_cases(args: &[String]) -> Result<(Vec<&'static str>, Vec<String>)> {
    let mut only = Vec::new();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg != "--case" {
            rest.push(arg.clone());
            continue;
        }
        let Some(v) = it.next() else {
            bail!("--case needs a value\n{USAGE}");
        };
        match ROW_KEYS.iter().find(|k| **k == v.as_str()) {
            Some(k) => only.push(*k),
            None => bail!("--case {v:?}: one of {}\n{USAGE}", ROW_KEYS.join(", ")),
        }
    }
    Ok((only, rest))
}

/// The `--case` names of the measured rows, in table order.
const ROW_KEYS: [&str; 6] = ["stream", "rate", "latency", "zerocopy", "rsocket", "rails"];

/// `None` without the async example; else the features it requires (comma-separated).
fn async_example_features(root: &Path) -> Result<Option<String>> {
    let src = root.join(format!("crates/rsrdma-net/examples/{ASYNC_EXAMPLE}.rs"));
    if !src.exists() {
        return Ok(None);
    }
    let meta = vm::cargo_metadata()?;
    let features = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == "rsrdma-net")
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .find(|t| t["name"] == ASYNC_EXAMPLE)
        .and_then(|t| t["required-features"].as_array())
        .map(|f| {
            f.iter()
                .filter_map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    Ok(Some(features))
}

fn clone_case(c: &Case) -> Case {
    Case {
        name: c.name.clone(),
        metric: c.metric,
        a: c.a.clone(),
        b: c.b.clone(),
        target: c.target,
    }
}

/// (label, server, client) for an rs_rdmanet tool with `flags` on both ends.
fn tool(label: &str, exe: &str, flags: &str, client_flags: &str) -> (String, String, String) {
    let common = format!("{exe} -d {{dev}} -x {{gid}} -p {{port}} {flags}");
    (
        label.to_string(),
        common.clone(),
        format!("{common} {client_flags} {{host}}"),
    )
}

fn rows(a: &BenchArgs, bin: &str) -> Vec<Row> {
    let bw = format!("{bin}/rs_rdmanet_bw");
    let lat = format!("{bin}/rs_rdmanet_lat");
    // Sized as bench perftest's: a few seconds per 64 KiB run on soft-RoCE under emulation.
    let (n64k, n1k, nlat) = (
        a.scale(500, 5000),
        a.scale(4000, 100_000),
        a.scale(1000, 10_000),
    );
    let stream = |label: &str, flags: &str| tool(label, &bw, flags, &format!("-s 65536 -n {n64k}"));
    let rate = |label: &str, flags: &str| tool(label, &bw, flags, &format!("-s 1024 -n {n1k}"));
    let mut send_lat = bench::perftest_case("send", "lat", 64, nlat, Path::new(bin)).b;
    send_lat.0 = "rs_send_lat t_typical".into();
    vec![
        Row {
            key: ROW_KEYS[0],
            case: Case {
                name: "64 KiB stream".into(),
                metric: Metric::Gbits,
                a: stream("RawConn pipeline_batch", "--raw"),
                b: stream("Conn send_msg (busy)", "--poll busy"),
                target: "Conn/Raw >= 0.8",
            },
            measure: Measure::Gbits,
            bound: 0.8,
        },
        Row {
            key: ROW_KEYS[1],
            case: Case {
                name: "1 KiB message rate".into(),
                metric: Metric::Gbits,
                a: rate("RawConn pipeline_batch", "--raw"),
                b: rate(
                    &format!("Conn batch({BATCH}) default"),
                    &format!("-b {BATCH} --poll adaptive"),
                ),
                target: "Conn/Raw >= 0.5",
            },
            measure: Measure::Mpps(1024),
            bound: 0.5,
        },
        Row {
            key: ROW_KEYS[2],
            case: Case {
                name: "64 B latency, one way".into(),
                metric: Metric::Typical,
                a: send_lat,
                b: tool(
                    "Conn p50 RTT/2 (busy)",
                    &lat,
                    "--poll busy",
                    &format!("-s 64 -n {nlat}"),
                ),
                target: "Conn/rs <= 1.2",
            },
            measure: Measure::OneWayUs,
            bound: 1.2,
        },
        zerocopy_row(a, bin),
        rsocket_row(a, bin),
        rails_row(a, bin),
    ]
}

/// A striped connection over 1 rail against 2 rails (`rs_rdmanet_bw --rails N`, 64 KiB
/// messages, timed until the server confirmed reading every one). Every rail is a queue pair
/// of the same device: this shows what striping costs and that it works, not a speed-up (2
/// rails share one link, and in the VM one emulated CPU does all of rxe's work). With a NIC per rail, run it with
/// `--no-vm` and the rails on different devices to see the sum of their links.
fn rails_row(a: &BenchArgs, bin: &str) -> Row {
    let bw = format!("{bin}/rs_rdmanet_bw");
    let client = format!("-s 65536 -n {}", a.scale(500, 20_000));
    Row {
        key: ROW_KEYS[5],
        case: Case {
            name: "64 KiB, 2 rails on one device".into(),
            metric: Metric::Gbits,
            a: tool("RailConn, 1 rail", &bw, "--rails 1", &client),
            b: tool("RailConn, 2 rails", &bw, "--rails 2", &client),
            target: "2 rails/1 >= 0.8 (one device: cost, not speed-up)",
        },
        measure: Measure::Gbits,
        bound: 0.8,
    }
}

/// rdma-core's rsocket (`rstream -S 65536 -C N`: the client sends N messages of 64 KiB, the
/// server receives them all and sends as many back, and the rate counts both directions)
/// against Conn doing the same with default options (`rs_rdmanet_bw --both-ways`, adaptive
/// polling, the library's default). rstream busy-loops on non-blocking calls. Its server
/// prints nothing until the end and opens no TCP port: it says it listens before it starts,
/// and its client waits a second (outside rstream's timed part).
fn rsocket_row(a: &BenchArgs, bin: &str) -> Row {
    let bw = format!("{bin}/rs_rdmanet_bw");
    let n = a.scale(500, 5000);
    let rstream = format!("rstream -p {{port}} -S 65536 -C {n}");
    Row {
        key: ROW_KEYS[4],
        case: Case {
            name: "64 KiB both ways".into(),
            metric: Metric::Gbits,
            a: (
                "rsocket rstream".into(),
                format!("echo 'listening on rstream'; exec {rstream} -b {{host}}"),
                format!("sleep 1; exec {rstream} -s {{host}}"),
            ),
            b: tool(
                "Conn send_msg (default)",
                &bw,
                "--both-ways --poll adaptive",
                &format!("-s 65536 -n {n}"),
            ),
            target: "Conn/rsocket >= 1",
        },
        measure: Measure::Gbits,
        bound: 1.0,
    }
}

/// Conn copying 1 MiB messages (A: rendezvous off on both ends, so every message goes as
/// eager frames, copied into the sender's slots and out of the receiver's) against Conn
/// zero-copy (B: `--zero-copy`, a ring of 8 registered buffers; at 1 MiB, above the 256 KiB
/// threshold, the receiver READs each message straight into its registered buffer).
fn zerocopy_row(a: &BenchArgs, bin: &str) -> Row {
    let bw = format!("{bin}/rs_rdmanet_bw");
    // 32 MiB per run in the VM, as the 64 KiB stream's runs.
    let client = format!("-s 1048576 -n {}", a.scale(32, 2000));
    Row {
        key: ROW_KEYS[3],
        case: Case {
            name: "zero-copy 1 MiB".into(),
            metric: Metric::Gbits,
            a: tool("Conn copy (eager)", &bw, "--no-rendezvous", &client),
            b: tool("Conn zero-copy (READ)", &bw, "--zero-copy", &client),
            target: "zc/copy > 1",
        },
        measure: Measure::Gbits,
        // Strictly above 1: the smallest ratio above it.
        bound: 1.0 + f64::EPSILON,
    }
}

fn report_title(a: &BenchArgs) -> String {
    let where_ = if a.no_vm {
        format!("device {}", a.dev)
    } else {
        "soft-RoCE (rxe0) in a TCG VM: ratios only, not absolute speed".to_string()
    };
    let mut t = format!(
        "\nrsrdma-net Conn vs RawConn and rs_send_lat, {where_}; medians of {} alternating rounds\n\n",
        a.rounds
    );
    let _ = writeln!(
        t,
        "{:<24} {:<24} {:>14} {:<24} {:>14} {:>7}  target",
        "case", "A", "median A", "B", "median B", "ratio"
    );
    t
}

/// The medians of the measured rows, and the runs that printed no result.
fn measured_rows(rows: &[Row], runs: &[Run], read: &dyn Fn(&str, &str) -> String) -> String {
    let mut t = String::new();
    for (ci, row) in rows.iter().enumerate() {
        let mut failed = Vec::new();
        let mut side = |b: bool| {
            let mut vals = Vec::new();
            for r in runs.iter().filter(|r| r.case == ci && r.b == b) {
                let text = read(&r.stem, "client");
                match value(&text, row.measure) {
                    Some(v) => vals.push(v),
                    None => failed.push(format!("{}: {}", r.stem, last_lines(&text))),
                }
            }
            bench::median(vals)
        };
        let (ma, mb) = (side(false), side(true));
        let ratio = match (ma, mb) {
            (Some(a), Some(b)) if a > 0.0 => Some(b / a),
            _ => None,
        };
        let unit = row.measure.unit();
        let fmt = |m: Option<f64>| m.map_or("failed".into(), |v| format!("{v:.4} {unit}"));
        let verdict = ratio.map_or("", |r| {
            if row.measure.met(r, row.bound) {
                " (met)"
            } else {
                " (MISSED)"
            }
        });
        let c = &row.case;
        let _ = writeln!(
            t,
            "{:<24} {:<24} {:>14} {:<24} {:>14} {:>7}  {}{verdict}",
            c.name,
            c.a.0,
            fmt(ma),
            c.b.0,
            fmt(mb),
            ratio.map_or("-".into(), |r| format!("{r:.3}")),
            c.target,
        );
        for f in failed {
            let _ = writeln!(t, "    failed run {f}");
        }
    }
    t
}

/// Registered memory per connection and CPU per GB, from the 64 KiB stream's runs.
/// `index` is the stream row's case index in `runs`.
fn info_rows(
    index: usize,
    stream: &Row,
    runs: &[Run],
    read: &dyn Fn(&str, &str) -> String,
) -> String {
    let bytes = stream_bytes(&stream.case.b.2).unwrap_or(0) as f64;
    let side = |b: bool| {
        let (mut client_mem, mut server_mem, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
        for r in runs.iter().filter(|r| r.case == index && r.b == b) {
            let (c, s) = (read(&r.stem, "client"), read(&r.stem, "server"));
            client_mem.extend(registered(&c).map(|v| v as f64));
            server_mem.extend(registered(&s).map(|v| v as f64));
            // Only runs that moved every byte count.
            if value(&c, Measure::Gbits).is_some() && bytes > 0.0 {
                if let (Some(x), Some(y)) = (cpu_seconds(&c), cpu_seconds(&s)) {
                    cpu.push((x + y) / (bytes / 1e9));
                }
            }
        }
        (
            bench::median(client_mem),
            bench::median(server_mem),
            bench::median(cpu),
        )
    };
    let (a, b) = (side(false), side(true));
    let mib = |c: Option<f64>, s: Option<f64>| match (c, s) {
        (Some(c), Some(s)) => format!("{:.2}+{:.2} MiB", c / MIB, s / MIB),
        _ => "failed".into(),
    };
    let sum = |m: &(Option<f64>, Option<f64>, Option<f64>)| Some(m.0? + m.1?);
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if x > 0.0 => format!("{:.3}", y / x),
        _ => "-".into(),
    };
    let cpu = |v: Option<f64>| v.map_or("failed".into(), |v| format!("{v:.2} s/GB"));
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{:<24} {:<24} {:>14} {:<24} {:>14} {:>7}  info",
        "registered mem/conn",
        "RawConn client+server",
        mib(a.0, a.1),
        "Conn client+server",
        mib(b.0, b.1),
        ratio(sum(&a), sum(&b)),
    );
    let _ = writeln!(
        t,
        "{:<24} {:<24} {:>14} {:<24} {:>14} {:>7}  info",
        "CPU per GB, 64 KiB",
        "RawConn user+sys c+s",
        cpu(a.2),
        "Conn user+sys c+s",
        cpu(b.2),
        ratio(a.2, b.2),
    );
    t
}

const MIB: f64 = 1024.0 * 1024.0;

/// Bytes a bandwidth client command moves: its `-s` times its `-n`.
fn stream_bytes(client: &str) -> Option<u64> {
    let words: Vec<&str> = client.split_whitespace().collect();
    let flag = |f: &str| -> Option<u64> {
        let i = words.iter().position(|w| *w == f)?;
        words.get(i + 1)?.parse().ok()
    };
    Some(flag("-s")? * flag("-n")?)
}

/// The async row: the example's ratio when it ran, or why there is none.
fn async_row(output: Option<&str>) -> String {
    let (name, target) = ("async Conn, 64 KiB", "async/blocking >= 0.9");
    let Some(text) = output else {
        return not_measured(name, "no async Conn in this build", target);
    };
    match async_ratio(text) {
        Some(r) => {
            let fmt = |m: Option<f64>| m.map_or("-".into(), |v| format!("{v:.1} MiB/s"));
            let verdict = if r.ratio >= 0.9 { "met" } else { "MISSED" };
            format!(
                "{:<24} {:<24} {:>14} {:<24} {:>14} {:>7.3}  {target} ({verdict})\n",
                name,
                "Conn (blocking)",
                fmt(r.blocking),
                "AsyncConn",
                fmt(r.async_),
                r.ratio
            )
        }
        None => format!(
            "{name:<24} failed: {ASYNC_EXAMPLE} printed no ratio: {}\n",
            last_lines(text)
        ),
    }
}

fn not_measured(name: &str, why: &str, target: &str) -> String {
    format!(
        "{name:<24} {:<87}  {target}\n",
        format!("not measured: {why}")
    )
}

fn last_lines(text: &str) -> String {
    let mut l: Vec<&str> = text.lines().rev().take(3).collect();
    l.reverse();
    l.join(" | ")
}

/// A client's figure for `m`: from `rs_rdmanet_bw`'s `SendMsg:`/`SendBatch(b):` line or
/// `rs_rdmanet_lat`'s `round-trips=` line, else from a perftest table (`--raw`, `rs_send_lat`).
fn value(text: &str, m: Measure) -> Option<f64> {
    match m {
        Measure::Gbits => conn_gbits(text)
            .or_else(|| rstream_gbits(text))
            .or_else(|| bench::parse_metric(text, Metric::Gbits)),
        Measure::Mpps(size) => Some(value(text, Measure::Gbits)? * 1e3 / (8.0 * f64::from(size))),
        Measure::OneWayUs => {
            conn_half_rtt_us(text).or_else(|| bench::parse_metric(text, Metric::Typical))
        }
    }
}

/// Gb/s from `SendMsg: sent N x S bytes in D: …` (from N, S and D: the printed rates are
/// rounded too coarsely for soft-RoCE).
fn conn_gbits(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| {
        [
            "SendMsg: ",
            "SendBatch(",
            "SendBuffer(",
            "BothWays: ",
            "Rails(",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    })?;
    let w: Vec<&str> = line.split_whitespace().collect();
    if w.get(1) != Some(&"sent") || w.get(3) != Some(&"x") || w.get(6) != Some(&"in") {
        return None;
    }
    let n: f64 = w[2].parse().ok()?;
    let size: f64 = w[4].parse().ok()?;
    let secs = go_seconds(w.get(7)?.trim_end_matches(':'))?;
    (secs > 0.0).then(|| n * size * 8.0 / secs / 1e9)
}

/// Gb/s from rstream's result row (`custom 64k 500 1 62m 3.56s 0.15 3559.83`): from the size
/// and usec/xfer (half of each transfer's share of the time, both directions counted), as
/// its own Gb/sec column is rounded to two decimals.
fn rstream_gbits(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("custom "))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let size = w.get(1)?;
    let (digits, shift) = match size.chars().last()? {
        'k' => (&size[..size.len() - 1], 10),
        'm' => (&size[..size.len() - 1], 20),
        'g' => (&size[..size.len() - 1], 30),
        _ => (&size[..], 0),
    };
    let bytes = digits.parse::<u64>().ok()? << shift;
    let usec_per_xfer: f64 = w.get(7)?.parse().ok()?;
    (usec_per_xfer > 0.0).then(|| bytes as f64 * 8.0 / (usec_per_xfer * 1000.0))
}

/// Half the median round trip, µs, from `round-trips=N avg=… p50=… …`.
fn conn_half_rtt_us(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("round-trips="))?;
    let p50 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("p50="))?;
    Some(go_seconds(p50)? * 1e6 / 2.0)
}

/// Seconds in a Go duration (`850ns`, `12.345µs`, `1.5ms`, `1m30s`).
fn go_seconds(s: &str) -> Option<f64> {
    match s {
        "" => return None,
        "0" => return Some(0.0),
        _ => {}
    }
    let mut total = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&i| i > 0)?;
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "µs" | "us" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Some(total)
}

/// The user + sys seconds a tool spent on its transfer: `cpu: S s user+sys …`.
fn cpu_seconds(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix("cpu: "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `registered memory: N bytes for this connection`.
fn registered(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("registered memory: "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What `async_vs_blocking` printed last: both medians (when it names them) and the ratio.
#[derive(Debug, PartialEq)]
struct AsyncRatio {
    blocking: Option<f64>,
    async_: Option<f64>,
    ratio: f64,
}

/// From a line like `… blocking median 21.3 MiB/s, async median 20.9 MiB/s, async/blocking
/// 0.981`.
fn async_ratio(text: &str) -> Option<AsyncRatio> {
    let line = text.lines().rev().find(|l| l.contains("async/blocking"))?;
    let after = |key: &str| -> Option<f64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.trim_start_matches([' ', ':', '='])
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()?
            .parse()
            .ok()
    };
    Some(AsyncRatio {
        blocking: after("blocking median"),
        async_: after("async median"),
        ratio: after("async/blocking")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rstream_and_both_ways_rates_are_read_precisely() {
        let rs = "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer\n\
                  custom    64k     500     1       62m         3.56s      0.15    3559.83\n";
        let g = rstream_gbits(rs).unwrap();
        assert!((g - 65536.0 * 8.0 / 3_559_830.0).abs() < 1e-9, "{g}");
        let both = "BothWays: sent 1000 x 65536 bytes in 2.5s: 0.21 Gb/s, 0.000 Mpps\n";
        let g = value(both, Measure::Gbits).unwrap();
        assert!((g - 1000.0 * 65536.0 * 8.0 / 2.5e9).abs() < 1e-9, "{g}");
    }

    #[test]
    fn go_durations() {
        let near = |s: &str, want: f64| {
            let got = go_seconds(s).unwrap_or_else(|| panic!("{s:?}"));
            assert!((got - want).abs() < 1e-12, "{s}: {got} != {want}");
        };
        near("0s", 0.0);
        near("0", 0.0);
        near("850ns", 850e-9);
        near("12.345µs", 12.345e-6);
        near("1.5ms", 1.5e-3);
        near("163.01639ms", 0.16301639);
        near("2.000001s", 2.000001);
        near("1m30s", 90.0);
        near("1h2m3.5s", 3723.5);
        for bad in ["", "s", "12", "1.5xs", "ms5", "1m30"] {
            assert_eq!(go_seconds(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn conn_lines() {
        let bw = "registered memory: 2097152 bytes for this connection\n\
                  SendMsg: sent 500 x 65536 bytes in 1.5s: 0.17 Gb/s, 0.000 Mpps\n";
        let g = value(bw, Measure::Gbits).unwrap();
        assert!((g - 500.0 * 65536.0 * 8.0 / 1.5 / 1e9).abs() < 1e-12, "{g}");
        let zc = "SendBuffer(8): sent 32 x 1048576 bytes in 2s: 0.13 Gb/s, 0.000 Mpps\n";
        let g = value(zc, Measure::Gbits).unwrap();
        assert!(
            (g - 32.0 * 1048576.0 * 8.0 / 2.0 / 1e9).abs() < 1e-12,
            "{g}"
        );
        let batch = "SendBatch(32): sent 4000 x 1024 bytes in 2s: 0.02 Gb/s, 0.002 Mpps\n";
        let m = value(batch, Measure::Mpps(1024)).unwrap();
        assert!((m - 0.002).abs() < 1e-12, "{m}");
        let lat = "round-trips=1000 avg=210.5µs p50=180µs p99=1.2ms min=150µs max=3ms\n";
        let one_way = value(lat, Measure::OneWayUs).unwrap();
        assert!((one_way - 90.0).abs() < 1e-9, "{one_way}");
        assert_eq!(registered(bw), Some(2 << 20));
        assert_eq!(registered("SendMsg: x\n"), None);
        for broken in [
            "SendMsg: sent 500 x 65536 bytes in 0s: 0.00 Gb/s, 0.000 Mpps\n",
            "SendMsg: sent many x 65536 bytes in 1s: 0.00 Gb/s, 0.000 Mpps\n",
            "error: connect to 10.77.0.1:21000: refused\n",
        ] {
            assert_eq!(value(broken, Measure::Gbits), None, "{broken}");
        }
    }

    #[test]
    fn perftest_tables_feed_the_same_measures() {
        // `--raw`'s table: MB/sec columns, MsgRate in Mpps.
        let raw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 1024       4000             0.00               24.41\t\t   0.025000\nregistered memory: 131072 bytes for this connection\n";
        let m = value(raw, Measure::Mpps(1024)).unwrap();
        assert!((m - 0.025).abs() < 1e-12, "{m}");
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n 64      1000          35.12          410.20       48.33    \t55.10\n";
        assert_eq!(value(lat, Measure::OneWayUs), Some(48.33));
    }

    #[test]
    fn cpu_lines() {
        let out = "server received 500 messages (32768000 bytes)\ncpu: 1.750000 s user+sys during the transfer\nserver status 0\n";
        assert_eq!(cpu_seconds(out), Some(1.75));
        assert_eq!(cpu_seconds("server status 0\n"), None);
        assert_eq!(cpu_seconds("cpu: lots\n"), None);
    }

    #[test]
    fn client_bytes_from_the_command() {
        let cmd = "x/rs_rdmanet_bw -d {dev} -x {gid} -p {port} --raw -s 65536 -n 500 {host}";
        assert_eq!(stream_bytes(cmd), Some(65536 * 500));
        assert_eq!(stream_bytes("x -s 64"), None);
    }

    #[test]
    fn async_ratio_lines() {
        let out = "run 0 blocking:     20.0 MiB/s\n64 KiB messages, 500 per run, 3 runs each, Adaptive: blocking median 21.3 MiB/s, async median 20.9 MiB/s, async/blocking 0.981\n";
        assert_eq!(
            async_ratio(out),
            Some(AsyncRatio {
                blocking: Some(21.3),
                async_: Some(20.9),
                ratio: 0.981
            })
        );
        assert_eq!(
            async_ratio("async/blocking: 1.02\n"),
            Some(AsyncRatio {
                blocking: None,
                async_: None,
                ratio: 1.02
            })
        );
        assert_eq!(async_ratio("thread panicked\n"), None);
        assert!(async_row(None).contains("not measured: no async Conn in this build"));
        assert!(async_row(Some("panicked\n")).contains("failed"));
    }

    #[test]
    fn host_is_taken_out_of_the_options() {
        let args: Vec<String> = ["--no-vm", "--host", "192.168.1.5", "-d", "mlx5_0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (host, rest) = take_host(&args).unwrap();
        assert_eq!(host.as_deref(), Some("192.168.1.5"));
        assert_eq!(rest, ["--no-vm", "-d", "mlx5_0"]);
        assert!(take_host(&args[..2]).is_err());
    }

    #[test]
    fn cases_pick_rows_and_bad_names_are_refused() {
        let args: Vec<String> = ["--case", "latency", "--rounds", "3", "--case", "rate"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (only, rest) = take_cases(&args).unwrap();
        assert_eq!(only, ["latency", "rate"]);
        assert_eq!(rest, ["--rounds", "3"]);
        let bad: Vec<String> = vec!["--case".into(), "lat".into()];
        assert!(take_cases(&bad).unwrap_err().to_string().contains("stream"));
        assert!(take_cases(&bad[..1]).is_err());
    }
}
