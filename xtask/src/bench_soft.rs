//! `cargo xtask bench soft`: the software device `soft0` against the software transports of
//! the peer libraries on the same machine, side by side, in one run (alternating rounds,
//! medians, ratios). Each case is a server and a client process on this host, A the peer and
//! B rsrdma on `soft0`:
//! - UCX `ucp_put_bw` over shared memory (`UCX_TLS=posix,self`) against `rs_write_bw -d soft0`,
//!   64 KiB: both are one-sided puts into the peer's memory;
//! - libfabric's `fi_pingpong -p shm` against `rs_write_bw`, 64 KiB;
//! - UCX `tag_lat` over shared memory against `rs_send_lat`, 8 B, one way;
//! - one iperf3 TCP stream on loopback against `rs_send_bw`, 64 KiB;
//! - UCX `ucp_put_bw` over TCP (`UCX_TLS=tcp`) against `rs_send_bw`, 64 KiB.
//!
//! The peers come from Debian's packages (`ucx-utils`, `libfabric-bin`, `iperf3`), installed
//! when missing. soft0 carries packets between processes of one host through shared-memory
//! rings (a copy in at the sender, a copy out at the receiver); the TCP rows turn those off
//! (`RSRDMA_SOFT_SHM=0`), so that its processes talk over loopback TCP as soft devices on two
//! hosts do. Conn against RawConn on soft0 is
//! `RSRDMA_SOFT_DEVICE=1 cargo xtask bench rdmanet --no-vm -d soft0 -x 1`.
//!
//! After the table (without `--sizes`), rsrdma's `idle_queue_pairs` example measures what
//! idle queue pairs cost the busy ones on soft0: a send and its receive with 2 queue pairs
//! in the process against beside 1024 more, in alternating rounds (its own table).

use crate::bench::{self, BenchArgs, Case, Metric};
use crate::vm;
use anyhow::Result;
use std::path::Path;

const USAGE: &str = "usage: cargo xtask bench soft [--rounds N] [--quick] [--sizes A,B,..] \
                     [--svg FILE]";

/// The peers' packages.
const PEER_PACKAGES: &[&str] = &["ucx-utils", "libfabric-bin", "iperf3"];

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    let Some(mut a) = bench::parse_args(args, USAGE)? else {
        return Ok(0);
    };
    // Everything runs on this host, over soft0.
    a.no_vm = true;
    a.dev = "soft0".into();
    a.gid = "1".into();
    vm::ensure_packages(PEER_PACKAGES)?;
    bench::cargo_build(
        root,
        &["build", "--release", "-p", "rsrdma-perftest", "--bins"],
    )?;
    bench::cargo_build(
        root,
        &[
            "build",
            "--release",
            "-p",
            "rsrdma",
            "--example",
            "idle_queue_pairs",
        ],
    )?;
    let target = vm::target_dir()?;
    let bin = target.join("release");
    let cases = match &a.sizes {
        Some(sizes) => sweep(&a, &bin, sizes),
        None => cases(&a, &bin),
    };
    let out_dir = a.out_dir(&target);
    let (script, runs) = bench::script(&cases, a.rounds, &a.dev, &a.gid, "127.0.0.1", &out_dir);
    // The tools find soft0 by listing the devices.
    std::env::set_var("RSRDMA_SOFT_DEVICE", "1");
    let status = bench::run_script(&a, root, &script, &out_dir)?;
    let title = "soft0 against UCX, libfabric and kernel TCP on this host";
    let table = bench::report(&cases, &runs, &out_dir, a.rounds, title, &value)?;
    bench::write_chart(&a, &cases, &runs, &out_dir, title, &value)?;
    let mut table = table;
    if a.sizes.is_none() {
        let out = std::process::Command::new(bin.join("examples/idle_queue_pairs"))
            .args(["-d", "soft0", "--rounds", &a.rounds.max(3).to_string()])
            .output()?;
        table.push_str(&format!(
            "\nidle queue pairs (rsrdma's idle_queue_pairs example):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    print!("{table}");
    std::fs::write(target.join("bench-soft.txt"), &table)?;
    eprintln!(
        "[bench] table saved to {}",
        target.join("bench-soft.txt").display()
    );
    Ok(status)
}

/// An rs tool pair with soft0's shared-memory links off (`RSRDMA_SOFT_SHM=0`): the two
/// processes talk over loopback TCP, as soft devices of two hosts do.
fn over_tcp((label, server, client): (String, String, String)) -> (String, String, String) {
    (
        format!("{label} (TCP)"),
        format!("env RSRDMA_SOFT_SHM=0 {server}"),
        format!("env RSRDMA_SOFT_SHM=0 {client}"),
    )
}

/// A UCX `ucx_perftest` pair: the server waits for one client on `{port}`.
fn ucx(label: &str, tls: &str, test: &str, size: u32, iters: u32) -> (String, String, String) {
    let env = format!("env UCX_TLS={tls} ucx_perftest -p {{port}}");
    (
        label.to_string(),
        env.clone(),
        format!("{env} {{host}} -t {test} -s {size} -n {iters}"),
    )
}

/// `--sizes`: each system at each size, for the chart: the bandwidth rows (UCX put over
/// shared memory and TCP, fi_pingpong over shm, iperf3, against rs_write_bw and rs_send_bw)
/// and the latency row (UCX tag_lat against rs_send_lat). Iterations move about as many
/// bytes at each size as the 64 KiB rows do.
fn sweep(a: &BenchArgs, bin: &Path, sizes: &[u32]) -> Vec<Case> {
    let q = |n: u64| if a.quick { n / 4 } else { n };
    let count = |size: u32, bytes: u64, least: u64| {
        q((bytes / u64::from(size)).clamp(least, 1_000_000)) as u32
    };
    let rs = |op: &str, kind: &str, size: u32, iters: u32| {
        bench::perftest_case(op, kind, size, iters, bin).b
    };
    let mut v = Vec::new();
    for &size in sizes {
        let n = count(size, 20_000 * 65536, 2000);
        let h = bench::human(size);
        v.push(Case {
            name: format!("{h} put, shared memory"),
            metric: Metric::Gbits,
            a: ucx(
                "UCX ucp_put_bw posix",
                "posix,self",
                "ucp_put_bw",
                size,
                count(size, 200_000 * 65536, 20_000),
            ),
            b: rs("write", "bw", size, n),
            target: "chart",
        });
        v.push(Case {
            name: format!("{h} vs fi_pingpong shm"),
            metric: Metric::Gbits,
            a: (
                "fi_pingpong -p shm".into(),
                format!("fi_pingpong -p shm -e rdm -B {{port}} -S {size} -I {n}"),
                format!("fi_pingpong -p shm -e rdm -P {{port}} -S {size} -I {n} {{host}}"),
            ),
            b: rs("send", "bw", size, n),
            target: "chart",
        });
        v.push(Case {
            name: format!("{h}, TCP"),
            metric: Metric::Gbits,
            a: (
                "iperf3, one stream".into(),
                "iperf3 -s -1 -p {port}".into(),
                format!(
                    "iperf3 -c {{host}} -p {{port}} -l {size} -t {}",
                    if a.quick { 1 } else { 3 }
                ),
            ),
            b: over_tcp(rs("send", "bw", size, n)),
            target: "chart",
        });
        v.push(Case {
            name: format!("{h} put, TCP"),
            metric: Metric::Gbits,
            a: ucx("UCX ucp_put_bw tcp", "tcp", "ucp_put_bw", size, n),
            b: over_tcp(rs("write", "bw", size, n)),
            target: "chart",
        });
        v.push(Case {
            name: format!("{h} latency, one way"),
            metric: Metric::Typical,
            a: ucx(
                "UCX tag_lat posix",
                "posix,self",
                "tag_lat",
                size,
                q(100_000) as u32,
            ),
            b: rs("send", "lat", size, q(2_000) as u32),
            target: "chart",
        });
    }
    v
}

fn cases(a: &BenchArgs, bin: &Path) -> Vec<Case> {
    let q = |n: u32| if a.quick { n / 4 } else { n };
    let (n64k, nlat) = (q(20_000), q(4_000));
    let rs = |op: &str, kind: &str, size: u32, iters: u32| {
        bench::perftest_case(op, kind, size, iters, bin).b
    };
    vec![
        Case {
            name: "64 KiB put, shared memory".into(),
            metric: Metric::Gbits,
            a: ucx(
                "UCX ucp_put_bw posix",
                "posix,self",
                "ucp_put_bw",
                65536,
                q(200_000),
            ),
            b: rs("write", "bw", 65536, n64k),
            target: "soft0/UCX >= 0.5",
        },
        Case {
            name: "64 KiB vs fi_pingpong shm".into(),
            metric: Metric::Gbits,
            a: (
                "fi_pingpong -p shm".into(),
                format!(
                    "fi_pingpong -p shm -e rdm -B {{port}} -S 65536 -I {}",
                    q(20_000)
                ),
                format!(
                    "fi_pingpong -p shm -e rdm -P {{port}} -S 65536 -I {} {{host}}",
                    q(20_000)
                ),
            ),
            b: rs("write", "bw", 65536, n64k),
            target: "soft0/fi > 1",
        },
        Case {
            name: "8 B latency, one way".into(),
            metric: Metric::Typical,
            a: ucx("UCX tag_lat posix", "posix,self", "tag_lat", 8, q(200_000)),
            b: rs("send", "lat", 8, nlat),
            target: "soft0/UCX <= 2",
        },
        Case {
            name: "64 KiB, TCP".into(),
            metric: Metric::Gbits,
            a: (
                "iperf3, one stream".into(),
                "iperf3 -s -1 -p {port}".into(),
                format!(
                    "iperf3 -c {{host}} -p {{port}} -l 65536 -t {}",
                    if a.quick { 1 } else { 3 }
                ),
            ),
            b: over_tcp(rs("send", "bw", 65536, n64k)),
            target: "soft0/iperf3 >= 0.8",
        },
        Case {
            name: "64 KiB put, TCP".into(),
            metric: Metric::Gbits,
            a: ucx("UCX ucp_put_bw tcp", "tcp", "ucp_put_bw", 65536, q(20_000)),
            b: over_tcp(rs("send", "bw", 65536, n64k)),
            target: "soft0/UCX > 1",
        },
    ]
}

/// A client's figure: UCX's `Final:` row (bandwidth in MiB/s; latency at the 50th
/// percentile, one way), fi_pingpong's row (MB/s), iperf3's receiver line, else a
/// perftest-style table (the rs tools).
fn value(text: &str, m: Metric) -> Option<f64> {
    ucx_value(text, m)
        .or_else(|| fabtests_gbits(text))
        .or_else(|| iperf3_gbits(text))
        .or_else(|| bench::parse_metric(text, m))
}

fn ucx_value(text: &str, m: Metric) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("Final:"))?;
    let w: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // iterations, latency 50%ile, average, overall (µs), bandwidth average, overall (MiB/s),
    // message rate average, overall.
    match m {
        Metric::Typical => w.get(1).copied(),
        Metric::Gbits => Some(w.get(5)? * 1_048_576.0 * 8.0 / 1e9),
    }
}

/// fi_pingpong's result row (`64k 1k =1k 125m 0.03s 4770.24 13.74 0.07`): its MB/sec column
/// (10^6 bytes, both directions' bytes over the whole time).
fn fabtests_gbits(text: &str) -> Option<f64> {
    let mut lines = text.lines().skip_while(|l| !l.contains("Mxfers/sec"));
    lines.next()?;
    let row = lines.find(|l| !l.trim().is_empty())?;
    let mbs: f64 = row.split_whitespace().nth(5)?.parse().ok()?;
    Some(mbs * 8.0 / 1e3)
}

/// iperf3's receiver line (`[  5] 0.00-3.00 sec 5.9 GBytes 16.8 Gbits/sec  receiver`).
fn iperf3_gbits(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.trim_end().ends_with("receiver"))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let at = w.iter().position(|x| x.ends_with("bits/sec"))?;
    let v: f64 = w.get(at.checked_sub(1)?)?.parse().ok()?;
    let scale = match w[at] {
        "Gbits/sec" => 1.0,
        "Mbits/sec" => 1e-3,
        "Kbits/sec" => 1e-6,
        _ => return None,
    };
    Some(v * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_peers_outputs() {
        let ucx = "Final:                  2000      0.572     0.574     0.574   108796.02  \
                   108796.02     1740736     1740736";
        let g = value(ucx, Metric::Gbits).unwrap();
        assert!(
            (g - 108_796.02 * 1_048_576.0 * 8.0 / 1e9).abs() < 1e-6,
            "{g}"
        );
        assert_eq!(value(ucx, Metric::Typical), Some(0.572));
        let fi = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                  64k     1k      =1k      125m        0.03s   4770.24      13.74       0.07";
        assert!((value(fi, Metric::Gbits).unwrap() - 38.16192).abs() < 1e-9);
        let ip = "[  5]   0.00-2.00   sec  3.92 GBytes  16.9 Gbits/sec   12             sender\n\
                  [  5]   0.00-2.00   sec  3.92 GBytes  16.8 Gbits/sec                  receiver";
        assert_eq!(value(ip, Metric::Gbits), Some(16.8));
    }
}
