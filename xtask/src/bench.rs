//! `cargo xtask bench perftest`: ours against C perftest, side by side, in one run.
//!
//! Every case runs A and B alternately (A B A B …, `--rounds` times), each as a server and a
//! client process on the same device, and the table reports the median of each side and their
//! ratio. The cases:
//! - `ib_{send,write,read}_bw` against `rs_{send,write,read}_bw` at 64 KiB and 1 KiB;
//! - `ib_{send,write,read}_lat` against `rs_*_lat` at 2 bytes (t_typical);
//! - `ib_atomic_bw` and `ib_atomic_lat` against `rs_atomic_*` (fetch-and-add, 8 bytes);
//! - `rs_send_bw` against RawConn's `pipeline_batch` (the `rawconn_bw` example) at 64 KiB;
//! - RawConn per-WR `pipeline` against `pipeline_batch` at 1 KiB.
//!
//! By default it boots the soft-RoCE VM (`rxe0`, GID index 1): useful for ratios, not absolute
//! speed. On a machine with an RDMA NIC, `--no-vm -d mlx5_0 -x 3` runs the same cases there.

use crate::vm::{self, sh_quote, VmOpts};
use anyhow::{anyhow, bail, Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const USAGE: &str = "usage: cargo xtask bench perftest [--rounds N] [--quick] \
                     [--no-vm -d DEVICE -x GID_INDEX] [--timeout SECS] [--sizes A,B,..] \
                     [--svg FILE]\n       \
                     cargo xtask bench rdmanet [--rounds N] [--quick] \
                     [--no-vm -d DEVICE -x GID_INDEX] [--timeout SECS] [--svg FILE]\n       \
                     cargo xtask bench overhead [--rounds N] [--wrs N]\n       \
                     cargo xtask bench soft [--rounds N] [--quick] [--sizes A,B,..] [--svg FILE]";

/// What a case measures.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Metric {
    /// BW average, Gb/s: higher is better.
    Gbits,
    /// t_typical, µs: lower is better.
    Typical,
}

pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) metric: Metric,
    /// (label, server command, client command) for A and B; `{port}`, `{dev}`, `{gid}` and
    /// `{host}` are filled in per run.
    pub(crate) a: (String, String, String),
    pub(crate) b: (String, String, String),
    /// What the ratio B/A (or A/B for latency) is held to, as text for the table.
    pub(crate) target: &'static str,
}

pub(crate) fn perftest_case(op: &str, kind: &str, size: u32, iters: u32, bin: &Path) -> Case {
    let flags = format!("-d {{dev}} -x {{gid}} -p {{port}} -s {size} -n {iters} -F --report_gbits");
    let c = |tool: &str| {
        (
            tool.to_string(),
            format!("{tool} {flags}"),
            format!("{tool} {flags} {{host}}"),
        )
    };
    let ib = format!("ib_{op}_{kind}");
    let rs = bin.join(format!("rs_{op}_{kind}")).display().to_string();
    let (mut a, mut b) = (c(&ib), c(&rs));
    a.0 = ib.clone();
    b.0 = format!("rs_{op}_{kind}");
    Case {
        name: format!("{op}_{kind} {}", human(size)),
        metric: if kind == "bw" {
            Metric::Gbits
        } else {
            Metric::Typical
        },
        a,
        b,
        target: if kind == "bw" {
            "rs/ib >= 1.00"
        } else {
            "rs/ib <= 1.00"
        },
    }
}

fn rawconn(size: u32, iters: u32, batch: u32, examples: &Path) -> (String, String, String) {
    let exe = examples.join("rawconn_bw").display().to_string();
    let label = if batch == 1 {
        "RawConn pipeline"
    } else {
        "RawConn pipeline_batch"
    };
    (
        label.to_string(),
        format!("{exe} server --port {{port}} -d {{dev}} -x {{gid}}"),
        format!("{exe} client {{host}} --port {{port}} -d {{dev}} -x {{gid}} -s {size} -n {iters} -t 128 --batch {batch}"),
    )
}

pub(crate) fn human(size: u32) -> String {
    match size {
        s if s >= 1024 && s % 1024 == 0 => format!("{} KiB", s / 1024),
        s => format!("{s} B"),
    }
}

/// The options `bench perftest` and `bench rdmanet` share.
pub(crate) struct BenchArgs {
    pub(crate) rounds: u32,
    pub(crate) quick: bool,
    pub(crate) no_vm: bool,
    pub(crate) dev: String,
    pub(crate) gid: String,
    pub(crate) opts: VmOpts,
    /// `--svg PATH`: also write the results as a chart.
    pub(crate) svg: Option<PathBuf>,
    /// `--sizes A,B,..`: the message sizes of the size-swept rows (bench perftest, bench soft).
    pub(crate) sizes: Option<Vec<u32>>,
}

impl BenchArgs {
    /// An iteration count: sized for soft-RoCE in the VM (a quarter with `--quick`), or for a
    /// real NIC with `--no-vm`.
    pub(crate) fn scale(&self, vm_iters: u32, nic_iters: u32) -> u32 {
        if self.no_vm {
            nic_iters
        } else if self.quick {
            vm_iters / 4
        } else {
            vm_iters
        }
    }

    /// The address clients connect to.
    pub(crate) fn host(&self) -> &'static str {
        if self.no_vm {
            "127.0.0.1"
        } else {
            vm::GUEST_IP
        }
    }

    /// Where the runs' output files go.
    pub(crate) fn out_dir(&self, target: &Path) -> PathBuf {
        target.join(if self.no_vm { "bench-out" } else { "vm-out" })
    }
}

/// Parses the options after `bench <what>`; `None` when `--help` printed `usage`.
pub(crate) fn parse_args(args: &[String], usage: &str) -> Result<Option<BenchArgs>> {
    let mut a = BenchArgs {
        rounds: 5,
        quick: false,
        no_vm: false,
        dev: vm::GUEST_DEVICE.to_string(),
        gid: vm::GUEST_GID_INDEX.to_string(),
        opts: VmOpts {
            timeout: Duration::from_secs(1800),
            ..VmOpts::default()
        },
        svg: None,
        sizes: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if vm::parse_common_opt(arg, &mut it, &mut a.opts)? {
            continue;
        }
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--rounds" => a.rounds = value()?.parse().context("--rounds")?,
            "--quick" => a.quick = true,
            "--no-vm" => a.no_vm = true,
            "-d" => a.dev = value()?,
            "-x" => a.gid = value()?,
            "--svg" => a.svg = Some(PathBuf::from(value()?)),
            "--sizes" => {
                let v = value()?;
                let sizes = v
                    .split(',')
                    .map(|x| x.trim().parse::<u32>().ok().filter(|n| *n > 0))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| anyhow!("--sizes takes sizes in bytes, as 4096,65536"))?;
                a.sizes = Some(sizes);
            }
            "-h" | "--help" => {
                eprintln!("{usage}");
                return Ok(None);
            }
            _ => bail!("unknown argument {arg:?}\n{usage}"),
        }
    }
    if a.rounds < 1 {
        bail!("--rounds must be at least 1");
    }
    Ok(Some(a))
}

/// `cargo <args>` in the workspace root, failing unless it succeeds.
pub(crate) fn cargo_build(root: &Path, args: &[&str]) -> Result<()> {
    eprintln!("[bench] cargo {}", args.join(" "));
    let status = Command::new(vm::cargo())
        .args(args)
        .current_dir(root)
        .status()?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

/// Runs a script made by [`script`] in the VM, or here with `--no-vm`; its exit status.
pub(crate) fn run_script(a: &BenchArgs, root: &Path, script: &str, out_dir: &Path) -> Result<i32> {
    let status = if a.no_vm {
        let _ = std::fs::remove_dir_all(out_dir);
        std::fs::create_dir_all(out_dir)?;
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(root)
            .status()?
            .code()
            .unwrap_or(1)
    } else {
        vm::run_in_vm(&a.opts, script)?
    };
    if status != 0 {
        eprintln!("[bench] the benchmark script exited with status {status}");
    }
    Ok(status)
}

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    match args.first().map(String::as_str) {
        Some("perftest") => {}
        Some("overhead") => return crate::bench_overhead::main(root, &args[1..]),
        Some("rdmanet") => return crate::bench_rdmanet::main(root, &args[1..]),
        Some("soft") => return crate::bench_soft::main(root, &args[1..]),
        _ => bail!("{USAGE}"),
    }
    let Some(a) = parse_args(&args[1..], USAGE)? else {
        return Ok(0);
    };
    vm::ensure_packages(vm::HOST_PACKAGES)?;
    cargo_build(
        root,
        &["build", "--release", "-p", "rsrdma-perftest", "--bins"],
    )?;
    cargo_build(
        root,
        &[
            "build",
            "--release",
            "-p",
            "rsrdma-net",
            "--example",
            "rawconn_bw",
        ],
    )?;
    let target = vm::target_dir()?;
    let bin = target.join("release");
    let examples = bin.join("examples");

    // Soft-RoCE under emulation moves about 0.2 Gb/s: sized so that a 64 KiB run takes a few
    // seconds there. On real NICs the iteration counts are perftest's defaults.
    let scale = |vm_iters: u32, nic_iters: u32| a.scale(vm_iters, nic_iters);
    let mut cases = Vec::new();
    // With --sizes, every bandwidth and latency row at each size (for the chart).
    let (bw_sizes, lat_sizes) = match &a.sizes {
        Some(s) => (s.clone(), s.clone()),
        None => (vec![65536, 1024], vec![2]),
    };
    // Iterations: the 64 KiB rows' count from 64 KiB up, the 1 KiB rows' below.
    let bw_iters = |size: u32| {
        if size < 65536 {
            scale(4000, 100_000)
        } else {
            // As many bytes as the 64 KiB rows move, and at least 50 messages.
            let by_bytes = |n: u32| (u64::from(n) * 65536 / u64::from(size)).max(50) as u32;
            scale(by_bytes(500), by_bytes(5000))
        }
    };
    for op in ["send", "write", "read"] {
        for &size in &bw_sizes {
            cases.push(perftest_case(op, "bw", size, bw_iters(size), &bin));
        }
    }
    for op in ["send", "write", "read"] {
        for &size in &lat_sizes {
            cases.push(perftest_case(op, "lat", size, scale(1000, 10_000), &bin));
        }
    }
    // The atomics move 8 bytes each (perftest takes no other -s).
    cases.push(perftest_case("atomic", "bw", 8, scale(4000, 100_000), &bin));
    cases.push(perftest_case("atomic", "lat", 8, scale(1000, 10_000), &bin));
    // The extended work-request path against the classic post, both rs_send_bw, 1 KiB with
    // post lists of 16 (where the posting cost shows).
    // Iterations a multiple of the post list in every mode (--quick divides by 4).
    let classic = perftest_case("send", "bw", 1024, scale(4096, 102_400), &bin).b;
    let with_flag = |t: &str| t.replace(" -F ", " -l 16 -F ");
    let newer = |t: &str| with_flag(t).replace(" -F ", " --use_new_post_send -F ");
    cases.push(Case {
        name: "ibv_wr_* vs ibv_post_send 1 KiB".into(),
        metric: Metric::Gbits,
        a: (
            "rs_send_bw -l 16".into(),
            with_flag(&classic.1),
            with_flag(&classic.2),
        ),
        b: (
            "rs_send_bw -l 16 --use_new_post_send".into(),
            newer(&classic.1),
            newer(&classic.2),
        ),
        target: "new/old (info)",
    });
    let send = perftest_case("send", "bw", 65536, scale(500, 5000), &bin);
    cases.push(Case {
        name: "RawConn vs rs_send_bw 64 KiB".into(),
        metric: Metric::Gbits,
        a: send.b,
        b: rawconn(65536, scale(500, 5000), 16, &examples),
        target: "batch/rs >= 0.98",
    });
    cases.push(Case {
        name: "RawConn per-WR vs batch 1 KiB".into(),
        metric: Metric::Gbits,
        a: rawconn(1024, scale(4000, 100_000), 1, &examples),
        b: rawconn(1024, scale(4000, 100_000), 16, &examples),
        target: "batch/per-WR > 1",
    });

    let out_dir = a.out_dir(&target);
    let (script, runs) = script(&cases, a.rounds, &a.dev, &a.gid, a.host(), &out_dir);
    let status = run_script(&a, root, &script, &out_dir)?;
    let where_ = if a.no_vm {
        format!("device {}", a.dev)
    } else {
        "soft-RoCE (rxe0) in a TCG VM: ratios only, not absolute speed".to_string()
    };
    let title = format!("rsrdma vs C perftest, {where_}");
    let table = report(&cases, &runs, &out_dir, a.rounds, &title, &parse_metric)?;
    write_chart(&a, &cases, &runs, &out_dir, &title, &parse_metric)?;
    print!("{table}");
    std::fs::write(target.join("bench-perftest.txt"), &table)?;
    eprintln!(
        "[bench] table saved to {}",
        target.join("bench-perftest.txt").display()
    );
    Ok(status)
}

/// One run: the case, A or B, the round, and its output file's stem.
pub(crate) struct Run {
    pub(crate) case: usize,
    pub(crate) b: bool,
    pub(crate) stem: String,
}

/// The shell script that runs every case, alternating A and B.
pub(crate) fn script(
    cases: &[Case],
    rounds: u32,
    dev: &str,
    gid: &str,
    host: &str,
    out: &Path,
) -> (String, Vec<Run>) {
    let mut s = String::from(
        r#"set -u
out=$1
wait_listen() { # port server-output: wait until something listens on the port, or the server
  # says it does (an rdma_cm listener opens no TCP port); the perftest client never retries
  i=0
  while [ $i -lt 200 ]; do
    ss -ltn 2>/dev/null | grep -q ":$1 " && return 0
    grep -qs '^listening on ' "$2" && return 0
    sleep 0.05; i=$((i+1))
  done
  return 1
}
pair() { # stem port server client
  timeout 300 sh -c "$3" > "$out/$1.server" 2>&1 &
  spid=$!
  wait_listen "$2" "$out/$1.server" || echo "server did not listen on $2" >> "$out/$1.client"
  timeout 300 sh -c "$4" >> "$out/$1.client" 2>&1
  echo "client status $?" >> "$out/$1.client"
  wait $spid
  echo "server status $?" >> "$out/$1.server"
}
"#,
    );
    let mut runs = Vec::new();
    let mut port = 21000;
    for (ci, case) in cases.iter().enumerate() {
        let _ = writeln!(s, "echo '[bench] {}' >&2", case.name);
        for round in 0..rounds {
            for b in [false, true] {
                let (_, server, client) = if b { &case.b } else { &case.a };
                let fill = |t: &str| {
                    t.replace("{port}", &port.to_string())
                        .replace("{dev}", dev)
                        .replace("{gid}", gid)
                        .replace("{host}", host)
                };
                let stem = format!("c{ci}-{}-r{round}", if b { "b" } else { "a" });
                let _ = writeln!(
                    s,
                    "pair {stem} {port} {} {}",
                    sh_quote(&fill(server)),
                    sh_quote(&fill(client))
                );
                runs.push(Run { case: ci, b, stem });
                port += 1;
            }
        }
    }
    let out = out.display().to_string();
    (
        format!("sh -c {} bench {}", sh_quote(&s), sh_quote(&out)),
        runs,
    )
}

/// The figure a client printed: BW average (Gb/s) from a perftest-style bw table or the
/// `rawconn_bw` line, or t_typical (µs) from a latency table.
pub(crate) fn parse_metric(text: &str, metric: Metric) -> Option<f64> {
    if let Some(line) = text.lines().find(|l| l.starts_with("rawconn_bw:")) {
        let v = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("gbits="))?;
        return v.parse().ok();
    }
    // The result row follows the header row that starts with "#bytes".
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next()?;
    let row: Vec<f64> = lines
        .find(|l| !l.trim().is_empty())?
        .split_whitespace()
        .map(|w| w.parse().ok())
        .collect::<Option<_>>()?;
    match metric {
        // The BW columns have two decimals, too coarse at soft-RoCE speeds; MsgRate (Mpps)
        // has six, and BW average = MsgRate x size.
        Metric::Gbits => Some(row.get(4)? * row.first()? * 8.0 / 1e3),
        Metric::Typical => row.get(4).copied(),
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The message size a case moves: the `-s N` of its B (else A) client command.
pub(crate) fn case_size(case: &Case) -> Option<u32> {
    [&case.b.2, &case.a.2].iter().find_map(|cmd| {
        let mut words = cmd.split_whitespace();
        while let Some(w) = words.next() {
            if w == "-s" {
                return words.next()?.parse().ok();
            }
        }
        None
    })
}

/// The chart of `cases` (`--svg`): per system (a case side's label), its medians against the
/// message size, bandwidth and latency in two panels. Cases with no size are left out.
pub(crate) fn chart(
    cases: &[Case],
    runs: &[Run],
    out: &Path,
    title: &str,
    parse: &dyn Fn(&str, Metric) -> Option<f64>,
) -> String {
    use crate::svg::{Panel, Series};
    let mut panels = [
        Panel {
            y_label: "bandwidth, Gb/s (higher is better)".into(),
            series: Vec::new(),
        },
        Panel {
            y_label: "latency, µs (lower is better)".into(),
            series: Vec::new(),
        },
    ];
    for (ci, case) in cases.iter().enumerate() {
        let Some(size) = case_size(case) else {
            continue;
        };
        let panel = &mut panels[usize::from(case.metric == Metric::Typical)];
        for (b, label) in [(false, &case.a.0), (true, &case.b.0)] {
            let Some(m) = median(side_values(ci, b, case.metric, runs, out, parse).0) else {
                continue;
            };
            let i = match panel.series.iter().position(|se| &se.name == label) {
                Some(i) => i,
                None => {
                    panel.series.push(Series {
                        name: label.clone(),
                        points: Vec::new(),
                    });
                    panel.series.len() - 1
                }
            };
            let points = &mut panel.series[i].points;
            // The same system at the same size twice (two cases share a side): the first.
            if !points.iter().any(|(x, _)| *x == f64::from(size)) {
                points.push((f64::from(size), m));
            }
        }
    }
    let kept: Vec<Panel> = panels
        .into_iter()
        .filter(|p| !p.series.is_empty())
        .collect();
    crate::svg::chart(title, &kept)
}

/// Writes [`chart`] to `path` when `--svg` asked for it.
pub(crate) fn write_chart(
    a: &BenchArgs,
    cases: &[Case],
    runs: &[Run],
    out: &Path,
    title: &str,
    parse: &dyn Fn(&str, Metric) -> Option<f64>,
) -> Result<()> {
    if let Some(path) = &a.svg {
        std::fs::write(path, chart(cases, runs, out, title, parse))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("[bench] chart saved to {}", path.display());
    }
    Ok(())
}

/// One side's figures over its rounds, and the runs that gave none.
fn side_values(
    ci: usize,
    b: bool,
    metric: Metric,
    runs: &[Run],
    out: &Path,
    parse: &dyn Fn(&str, Metric) -> Option<f64>,
) -> (Vec<f64>, Vec<String>) {
    let mut vals = Vec::new();
    let mut errs = Vec::new();
    for r in runs.iter().filter(|r| r.case == ci && r.b == b) {
        let path: PathBuf = out.join(format!("{}.client", r.stem));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        match parse(&text, metric) {
            Some(v) => vals.push(v),
            None => errs.push(format!(
                "{}: {}",
                r.stem,
                text.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
            )),
        }
    }
    (vals, errs)
}

/// The side-by-side table of `cases`: medians of A and B (each run's figure read from its
/// client's output by `parse`) and their ratio.
pub(crate) fn report(
    cases: &[Case],
    runs: &[Run],
    out: &Path,
    rounds: u32,
    title: &str,
    parse: &dyn Fn(&str, Metric) -> Option<f64>,
) -> Result<String> {
    let mut t = String::new();
    let _ = writeln!(t, "\n{title}; medians of {rounds} alternating rounds\n");
    let _ = writeln!(
        t,
        "{:<32} {:<24} {:>12} {:<24} {:>12} {:>8}  target",
        "case", "A", "median A", "B", "median B", "ratio"
    );
    for (ci, case) in cases.iter().enumerate() {
        let unit = if case.metric == Metric::Gbits {
            "Gb/s"
        } else {
            "us"
        };
        let collect = |b: bool| side_values(ci, b, case.metric, runs, out, parse);
        let (va, ea) = collect(false);
        let (vb, eb) = collect(true);
        let (ma, mb) = (median(va), median(vb));
        let ratio = match (ma, mb, case.metric) {
            (Some(a), Some(b), _) if a > 0.0 => Some(b / a),
            _ => None,
        };
        let fmt = |m: Option<f64>| m.map_or("failed".to_string(), |v| format!("{v:.3} {unit}"));
        let _ = writeln!(
            t,
            "{:<32} {:<24} {:>12} {:<24} {:>12} {:>8}  {}",
            case.name,
            case.a.0,
            fmt(ma),
            case.b.0,
            fmt(mb),
            ratio.map_or("-".into(), |r| format!("{r:.3}")),
            case.target,
        );
        for e in ea.iter().chain(&eb) {
            let _ = writeln!(t, "    failed run {e}");
        }
    }
    let _ = writeln!(
        t,
        "\nratio = B/A (for latency, B's t_typical over A's: below 1 is faster)"
    );
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perftest_tables_and_rawconn_lines() {
        let bw = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536      1000             0.21               0.20   \t\t   0.000390\n";
        let g = parse_metric(bw, Metric::Gbits).unwrap();
        assert!((g - 0.000390 * 65536.0 * 8.0 / 1e3).abs() < 1e-12, "{g}");
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       1000          35.12          410.20       48.33    \t55.10       \t20.00   \t\t120.00  \t\t400.00  \n";
        assert_eq!(parse_metric(lat, Metric::Typical), Some(48.33));
        let rc = "rawconn_bw: mode=batch size=65536 iters=1000 depth=128 batch=16 gbits=0.215000 mpps=0.000410 post_calls=70 secs=2.4\n";
        assert_eq!(parse_metric(rc, Metric::Gbits), Some(0.215));
        assert_eq!(
            parse_metric("Couldn't connect to 10.77.0.1:18515\n", Metric::Gbits),
            None
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
