//! Device tests: the rs tools against the installed perftest (`ib_*`) and against each other,
//! on a real RDMA device (soft-RoCE `rxe0` in the VM: `cargo xtask test`). Declared with
//! `test = false`, so a plain `cargo test` on a machine without RDMA does not run them; run
//! here without a device, every test fails (none skips).
//!
//! Each test uses its own TCP port, gives every process a time limit, and kills what it
//! started if it fails.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod support;
use support::{device, gid_index, ip as cm_ip};

/// A distinct TCP port per use.
fn port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(19600);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn rs(tool: &str) -> &'static str {
    match tool {
        "send_bw" => env!("CARGO_BIN_EXE_rs_send_bw"),
        "send_lat" => env!("CARGO_BIN_EXE_rs_send_lat"),
        "write_bw" => env!("CARGO_BIN_EXE_rs_write_bw"),
        "write_lat" => env!("CARGO_BIN_EXE_rs_write_lat"),
        "read_bw" => env!("CARGO_BIN_EXE_rs_read_bw"),
        "read_lat" => env!("CARGO_BIN_EXE_rs_read_lat"),
        "atomic_bw" => env!("CARGO_BIN_EXE_rs_atomic_bw"),
        "atomic_lat" => env!("CARGO_BIN_EXE_rs_atomic_lat"),
        _ => panic!("unknown tool {tool}"),
    }
}

fn program(side: Side, tool: &str) -> String {
    match side {
        Side::Rs => rs(tool).to_string(),
        Side::Ib => format!("ib_{tool}"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    Rs,
    Ib,
}

/// A child process that is killed if the test ends before it does.
struct Proc {
    name: String,
    child: Option<Child>,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

#[derive(Debug)]
struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Proc {
    fn spawn(prog: &str, args: &[String]) -> Proc {
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {prog}: {e}"));
        let mut so = child.stdout.take().unwrap();
        let mut se = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = so.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = se.read_to_string(&mut s);
            s
        });
        Proc {
            name: format!("{prog} {}", args.join(" ")),
            child: Some(child),
            out: Some(out),
            err: Some(err),
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Waits at most `limit`; a process still running then is killed and the test fails.
    fn wait(self, limit: Duration) -> Done {
        let name = self.name.clone();
        self.wait_for(limit).unwrap_or_else(|d| {
            panic!(
                "{name} still running after {limit:?}: killed\n--- stdout\n{}\n--- stderr\n{}",
                d.stdout, d.stderr
            )
        })
    }

    /// Waits at most `limit`: its end, or (`Err`) what it said before it was killed then.
    fn wait_for(mut self, limit: Duration) -> Result<Done, Done> {
        let start = Instant::now();
        let mut child = self.child.take().unwrap();
        let (code, killed) = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break (st.code(), false);
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                break (None, true);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let d = Done {
            code,
            stdout: self.out.take().unwrap().join().unwrap_or_default(),
            stderr: self.err.take().unwrap().join().unwrap_or_default(),
            took: start.elapsed(),
        };
        if killed {
            Err(d)
        } else {
            Ok(d)
        }
    }

    fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until something listens on TCP `port` (read from /proc: a test connection would be
/// taken as the client by a perftest server).
fn wait_listening(port: u16, server: &mut Proc) {
    let start = Instant::now();
    let want = format!(":{port:04X} ");
    loop {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if tcp.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && format!("{} ", f[1]).ends_with(&want) && f[3] == "0A"
        }) {
            return;
        }
        if let Some(Some(st)) = server.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
            let so = server.out.take().map(|h| h.join().unwrap_or_default());
            let se = server.err.take().map(|h| h.join().unwrap_or_default());
            panic!(
                "the server exited ({st}) before listening\n--- stdout\n{}\n--- stderr\n{}",
                so.unwrap_or_default(),
                se.unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "nothing listens on port {port} after 15 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until an rdma_cm id listens on `port` (the `-R` servers open no TCP socket), as
/// iproute2's `rdma resource show cm_id` lists them; on soft0, whose CM listens on a TCP
/// socket of the same port, as `/proc/net/tcp` lists it.
fn wait_listening_cm(port: u16, server: &mut Proc) {
    let start = Instant::now();
    let want = format!("src-addr 0.0.0.0:{port} ");
    loop {
        if device() == "soft0" {
            // `/proc/net/tcp`: local address `00000000:PORT` (hex), state 0A (LISTEN).
            let local = format!("00000000:{port:04X}");
            let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
            if text.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1] == local && f[3] == "0A"
            }) {
                return;
            }
        } else {
            let out = Command::new("rdma")
                .args(["resource", "show", "cm_id"])
                .output()
                .expect("iproute2's rdma tool");
            let text = String::from_utf8_lossy(&out.stdout);
            if text
                .lines()
                .any(|l| l.contains("state LISTEN") && format!("{l} ").contains(&want))
            {
                return;
            }
        }
        if let Some(Some(st)) = server.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
            let se = server.err.take().map(|h| h.join().unwrap_or_default());
            panic!(
                "the server exited ({st}) before listening\n--- stderr\n{}",
                se.unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no rdma_cm listener on port {port} after 15 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn common(port: u16) -> Vec<String> {
    vec![
        "-d".into(),
        device(),
        "-x".into(),
        gid_index(),
        "-p".into(),
        port.to_string(),
    ]
}

fn with(mut v: Vec<String>, extra: &[&str]) -> Vec<String> {
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Runs a server and a client; returns (server, client).
/// C perftest's own failure to calibrate its cycle counter under emulation on a loaded
/// machine (`Correlation coefficient r^2 < 0.9`): the C tool gives up before reporting.
const C_CALIBRATION_FAILED: &str = "Can't produce a report";

/// Runs a server and a client, and runs them again (twice at most) when the only failure is
/// C perftest's clock calibration: that says nothing about rsrdma, and any other failure is
/// returned as it is.
fn pair(srv: (Side, &str, &[&str]), cli: (Side, &str, &[&str]), limit: Duration) -> (Done, Done) {
    let mut tries = 0;
    loop {
        let (s, c) = pair_once(srv, cli, limit);
        let calibration = [&s, &c].iter().any(|d| {
            d.code != Some(0)
                && (d.stdout.contains(C_CALIBRATION_FAILED)
                    || d.stderr.contains(C_CALIBRATION_FAILED))
        });
        // The server was killed, left waiting by a client that failed.
        let left_waiting = s.code.is_none() && c.code != Some(0);
        // A C server still running 20 s after rsrdma's client succeeded: seen once in a full
        // VM run (stop 46: `ib_write_lat -D 2`, whose end is its own alarm, not the client;
        // 12 of 12 runs of that group alone passed). An rsrdma server that hangs still fails
        // at once ([`pair_once`]).
        let c_server_hung = srv.0 == Side::Ib && s.code.is_none() && c.code == Some(0);
        tries += 1;
        if !(calibration || left_waiting || c_server_hung) || tries == 3 {
            return (s, c);
        }
        eprintln!(
            "running the pair again: {}\n{}{}",
            if calibration {
                "C perftest could not calibrate its clock"
            } else if c_server_hung {
                "the C server still ran 20 s after the client succeeded"
            } else {
                "the client failed and left its server waiting"
            },
            show("client", &c),
            show("server", &s)
        );
    }
}

fn pair_once(
    srv: (Side, &str, &[&str]),
    cli: (Side, &str, &[&str]),
    limit: Duration,
) -> (Done, Done) {
    let port = port();
    let cm = srv.2.contains(&"-R");
    let mut s = Proc::spawn(&program(srv.0, srv.1), &with(common(port), srv.2));
    let host = if cm {
        wait_listening_cm(port, &mut s);
        cm_ip()
    } else {
        wait_listening(port, &mut s);
        "127.0.0.1".into()
    };
    let c = Proc::spawn(
        &program(cli.0, cli.1),
        &with(with(common(port), cli.2), &[host.as_str()]),
    );
    let c = c.wait(limit);
    match s.wait_for(Duration::from_secs(20)) {
        Ok(s) => (s, c),
        // A client that failed left its server waiting: [`pair`] runs the pair again (a full
        // VM run once saw an rdma_cm server wait for a C client that had ended: the C tools'
        // rdma_cm calls time out under the emulated machine's load).
        Err(s) if c.code != Some(0) => (s, c),
        // A C server: [`pair`] runs the pair again.
        Err(s) if srv.0 == Side::Ib => (s, c),
        Err(s) => panic!(
            "the server still ran 20 s after its client succeeded: killed\n{}{}",
            show("server", &s),
            show("client", &c)
        ),
    }
}

fn show(what: &str, d: &Done) -> String {
    format!(
        "{what}: exit {:?} after {:?}\n--- stdout\n{}--- stderr\n{}",
        d.code, d.took, d.stdout, d.stderr
    )
}

/// The fields of the result lines (those starting with the size).
fn result_lines(out: &str, size: u64) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| l.starts_with(&format!(" {size} ")))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// A successful interop run: both exit 0, and whoever prints a table prints a sane line.
fn interop(tool: &str, ud: bool, srv: Side, cli: Side) {
    interop_with(tool, ud, false, srv, cli);
}

/// As [`interop`], over rdma_cm (`-R`) when `cm`: then both ends also print perftest's
/// rdma_cm header lines, and the server its extra lines.
fn interop_with(tool: &str, ud: bool, cm: bool, srv: Side, cli: Side) {
    let bw = tool.ends_with("_bw");
    let n = if cm { "100" } else { "200" };
    let iters: u64 = n.parse().unwrap();
    let size = match (bw, ud) {
        _ if tool.starts_with("atomic") => 8,
        (true, true) => 1024,
        (true, false) => 65536,
        (false, _) => 2,
    };
    let mut extra = vec!["-n", n];
    if ud {
        extra.extend(["-c", "UD"]);
    }
    if cm {
        extra.push("-R");
    }
    if bw && ud {
        extra.extend(["-s", "1024"]);
    }
    let (s, c) = pair(
        (srv, tool, &extra),
        (cli, tool, &extra),
        Duration::from_secs(90),
    );
    let ctx = format!("{}\n{}", show("server", &s), show("client", &c));
    assert_eq!(s.code, Some(0), "server failed\n{ctx}");
    assert_eq!(c.code, Some(0), "client failed\n{ctx}");
    for (who, d) in [("client", &c), ("server", &s)] {
        if who == "server" && (tool == "read_lat" || tool == "atomic_lat") {
            continue; // perftest's read_lat and atomic_lat servers print no table
        }
        let lines = result_lines(&d.stdout, size);
        assert_eq!(lines.len(), 1, "{who} printed no single result line\n{ctx}");
        let f = &lines[0];
        assert_eq!(f[1], iters.to_string(), "{who} iterations\n{ctx}");
        let avg: f64 = f[if bw { 3 } else { 5 }].parse().unwrap();
        assert!(avg > 0.0, "{who} average is 0\n{ctx}");
        assert!(d.stdout.contains("---------------------------------------------------------------------------------------\n"));
    }
    // write/read/atomic_bw servers print the client's report: the REPORT exchange is exact.
    if tool == "write_bw" || tool == "read_bw" || tool == "atomic_bw" {
        assert_eq!(
            result_lines(&s.stdout, size),
            result_lines(&c.stdout, size),
            "the server must print the client's report\n{ctx}"
        );
    }
    for d in [&s, &c] {
        assert!(!d.stderr.contains("panicked"), "{ctx}");
    }
    if cm {
        for d in [&s, &c] {
            assert!(
                d.stdout
                    .contains(" rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n"),
                "{ctx}"
            );
            // Over rdma_cm perftest shows LID, QPN and PSN only.
            assert!(!d.stdout.contains("RKey"), "{ctx}");
        }
        let waiting = " Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n";
        assert!(s.stdout.contains(waiting), "{ctx}");
        assert!(!c.stdout.contains(waiting), "{ctx}");
    }
}

macro_rules! matrix {
    ($($name:ident: $tool:literal, $ud:literal;)*) => {
        mod interop {
            use super::*;
            $(
                mod $name {
                    use super::*;
                    #[test]
                    fn rs_client_ib_server() {
                        interop($tool, $ud, Side::Ib, Side::Rs);
                    }
                    #[test]
                    fn ib_client_rs_server() {
                        interop($tool, $ud, Side::Rs, Side::Ib);
                    }
                    #[test]
                    fn rs_client_rs_server() {
                        interop($tool, $ud, Side::Rs, Side::Rs);
                    }
                }
            )*
        }
    };
}

matrix! {
    send_bw_rc: "send_bw", false;
    send_lat_rc: "send_lat", false;
    write_bw_rc: "write_bw", false;
    write_lat_rc: "write_lat", false;
    read_bw_rc: "read_bw", false;
    read_lat_rc: "read_lat", false;
    send_bw_ud: "send_bw", true;
    send_lat_ud: "send_lat", true;
    atomic_bw_rc: "atomic_bw", false;
    atomic_lat_rc: "atomic_lat", false;
}

macro_rules! matrix_rdma_cm {
    ($($name:ident: $tool:literal, $ud:literal;)*) => {
        mod rdma_cm {
            use super::*;
            $(
                mod $name {
                    use super::*;
                    #[test]
                    fn rs_client_ib_server() {
                        interop_with($tool, $ud, true, Side::Ib, Side::Rs);
                    }
                    #[test]
                    fn ib_client_rs_server() {
                        interop_with($tool, $ud, true, Side::Rs, Side::Ib);
                    }
                    #[test]
                    fn rs_client_rs_server() {
                        interop_with($tool, $ud, true, Side::Rs, Side::Rs);
                    }
                }
            )*
        }
    };
}

matrix_rdma_cm! {
    send_bw_rc: "send_bw", false;
    send_lat_rc: "send_lat", false;
    write_bw_rc: "write_bw", false;
    write_lat_rc: "write_lat", false;
    read_bw_rc: "read_bw", false;
    read_lat_rc: "read_lat", false;
    atomic_bw_rc: "atomic_bw", false;
    atomic_lat_rc: "atomic_lat", false;
}

/// The atomics against perftest and each other: the header, and what the client's atomics
/// did to the server's memory (the rs server's `RSRDMA_PERFTEST_ATOMIC_TOTAL` line).
mod atomics {
    use super::*;

    /// Runs an rs server with the total check against `cli`; returns both ends.
    fn checked(tool: &str, cli: Side, extra: &[&str]) -> (Done, Done) {
        std::env::set_var("RSRDMA_PERFTEST_ATOMIC_TOTAL", "1");
        let r = pair(
            (Side::Rs, tool, extra),
            (cli, tool, extra),
            Duration::from_secs(60),
        );
        std::env::remove_var("RSRDMA_PERFTEST_ATOMIC_TOTAL");
        r
    }

    fn total(d: &Done) -> Option<u64> {
        d.stdout
            .lines()
            .find_map(|l| l.strip_prefix(" atomic target total: +"))
            .and_then(|v| v.trim().parse().ok())
    }

    #[test]
    fn fetch_and_add_adds_iterations_rs_and_ib_clients() {
        for (tool, cli) in [
            ("atomic_bw", Side::Rs),
            ("atomic_bw", Side::Ib),
            ("atomic_lat", Side::Rs),
            ("atomic_lat", Side::Ib),
        ] {
            let (s, c) = checked(tool, cli, &["-n", "150"]);
            let ctx = format!("{}\n{}", show("server", &s), show("client", &c));
            assert_eq!((s.code, c.code), (Some(0), Some(0)), "{ctx}");
            assert_eq!(total(&s), Some(150), "{tool} {cli:?}\n{ctx}");
        }
    }

    #[test]
    fn compare_and_swap_header_and_unchanged_memory() {
        let args: &[&str] = &["-n", "100", "-A", "CMP_AND_SWAP"];
        let (s, c) = checked("atomic_bw", Side::Ib, args);
        let ctx = format!("{}\n{}", show("server", &s), show("client", &c));
        assert_eq!((s.code, c.code), (Some(0), Some(0)), "{ctx}");
        // Compare 0, swap 0: the random target never changes.
        assert_eq!(total(&s), Some(0), "{ctx}");
        for d in [&s, &c] {
            assert!(
                d.stdout
                    .contains("                    Atomic CMP_AND_SWAP BW Test\n"),
                "{ctx}"
            );
            assert!(d.stdout.contains(" Outstand reads  : "), "{ctx}");
        }
        assert_eq!(
            result_lines(&s.stdout, 8),
            result_lines(&c.stdout, 8),
            "{ctx}"
        );
    }

    #[test]
    fn different_atomic_types_between_rs_tools() {
        let (s, c) = pair(
            (Side::Rs, "atomic_bw", &["-n", "100"]),
            (Side::Rs, "atomic_bw", &["-n", "100", "-A", "CMP_AND_SWAP"]),
            Duration::from_secs(30),
        );
        for (who, d) in [("server", &s), ("client", &c)] {
            assert_eq!(d.code, Some(1), "{}", show(who, d));
            assert!(d.stderr.contains("-A (atomic type)"), "{}", show(who, d));
        }
    }
}

/// `-D` on the latency tools: perftest's duration table, against perftest both ways.
mod latency_duration {
    use super::*;

    fn check(tool: &str, srv: Side, cli: Side) {
        let args: &[&str] = &["-D", "2"];
        let (s, c) = pair(
            (srv, tool, args),
            (cli, tool, args),
            Duration::from_secs(60),
        );
        let ctx = format!("{}\n{}", show("server", &s), show("client", &c));
        assert_eq!((s.code, c.code), (Some(0), Some(0)), "{ctx}");
        let header = " #bytes        #iterations       t_avg[usec]    tps average\n";
        let size = if tool.starts_with("atomic") { 8 } else { 2 };
        let passive_server = tool == "read_lat" || tool == "atomic_lat";
        for (who, d) in [("client", &c), ("server", &s)] {
            if who == "server" && passive_server {
                assert!(!d.stdout.contains(header), "{ctx}");
                continue;
            }
            assert!(d.stdout.contains(header), "{who}\n{ctx}");
            let l = result_lines(&d.stdout, size);
            assert_eq!(l.len(), 1, "{who}\n{ctx}");
            let iters: u64 = l[0][1].parse().unwrap();
            let (avg, tps): (f64, f64) = (l[0][2].parse().unwrap(), l[0][3].parse().unwrap());
            // At least one round trip: under emulation on a loaded machine a 2 s window held
            // 6 (a rehearsal of stop 40; the check once wanted more than 10).
            assert!(iters >= 1 && avg > 0.0 && tps > 0.0, "{who}\n{ctx}");
            // tps x t_avg x rtt = 10^6 µs: the two columns describe one window.
            let rtt = if passive_server { 1.0 } else { 2.0 };
            let one_second = tps * avg * rtt;
            assert!((one_second - 1e6).abs() < 2e4, "{who}: {one_second}\n{ctx}");
        }
    }

    #[test]
    fn write_lat_rs_client_ib_server() {
        check("write_lat", Side::Ib, Side::Rs);
    }

    #[test]
    fn send_lat_ib_client_rs_server() {
        check("send_lat", Side::Rs, Side::Ib);
    }

    #[test]
    fn atomic_lat_rs_client_rs_server() {
        check("atomic_lat", Side::Rs, Side::Rs);
    }

    /// write_lat has no closing handshake: the side whose duration ends first exits, and the
    /// other's last WRITE finds no peer. That ends its run, not in an error (on soft0, which
    /// sees the peer gone at once, one side failed in about 4 runs of 10).
    #[test]
    fn write_lat_rs_client_rs_server() {
        check("write_lat", Side::Rs, Side::Rs);
    }
}

fn loopback(tool: &str, extra: &[&str], env: &[(&str, &str)]) -> Done {
    let port = port();
    let mut cmd_args = with(common(port), extra);
    cmd_args.push("--loopback".into());
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    let p = Proc::spawn(rs(tool), &cmd_args);
    for (k, _) in env {
        std::env::remove_var(k);
    }
    let d = p.wait(Duration::from_secs(90));
    assert_eq!(d.code, Some(0), "{}", show(tool, &d));
    d
}

mod loopback {
    use super::*;

    fn check(tool: &str, size: u64, extra: &[&str]) {
        let mut args = vec!["-n", "100"];
        args.extend_from_slice(extra);
        let d = loopback(tool, &args, &[]);
        assert_eq!(result_lines(&d.stdout, size).len(), 1, "{}", show(tool, &d));
        assert!(
            d.stdout.contains(" TX depth "),
            "prints the client's header\n{}",
            d.stdout
        );
    }

    #[test]
    fn send_bw() {
        check("send_bw", 65536, &[]);
    }
    #[test]
    fn send_bw_ud() {
        // UD messages are cut to the port's MTU (rxe0 in the VM: 1024; soft0: 4096), which
        // the header reports.
        let d = loopback("send_bw", &["-n", "100", "-c", "UD"], &[]);
        let mtu: u64 = d
            .stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("Mtu"))
            .and_then(|l| l.trim().trim_start_matches(':').trim().strip_suffix("[B]"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no MTU in the header\n{}", d.stdout));
        assert!(mtu == 1024 || mtu == 4096, "{mtu}");
        assert_eq!(
            result_lines(&d.stdout, mtu).len(),
            1,
            "{}",
            show("send_bw", &d)
        );
    }
    #[test]
    fn send_lat() {
        check("send_lat", 2, &[]);
    }
    #[test]
    fn write_bw() {
        check("write_bw", 65536, &[]);
    }
    #[test]
    fn write_lat() {
        check("write_lat", 2, &[]);
    }
    #[test]
    fn read_bw() {
        check("read_bw", 65536, &[]);
    }
    #[test]
    fn read_lat() {
        check("read_lat", 2, &[]);
    }
    #[test]
    fn atomic_bw() {
        check("atomic_bw", 8, &[]);
    }
    #[test]
    fn atomic_lat() {
        check("atomic_lat", 8, &["-A", "CMP_AND_SWAP"]);
    }

    #[test]
    fn probe_line_follows_the_table() {
        let d = loopback(
            "write_bw",
            &["-n", "100", "-s", "4096"],
            &[("RSRDMA_PROBE", "1")],
        );
        let after: Vec<&str> = d
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with(" 4096 "))
            .collect();
        assert!(after.len() >= 3, "{}", d.stdout);
        assert!(after[2].starts_with(" probe: post "), "{}", d.stdout);
        assert!(
            after[2].contains("ns/WR") && after[2].contains("poll"),
            "{}",
            d.stdout
        );
    }

    #[test]
    fn events_bidirectional_and_duration() {
        let d = loopback("send_bw", &["-n", "100", "-e", "-s", "4096"], &[]);
        assert_eq!(result_lines(&d.stdout, 4096).len(), 1, "{}", d.stdout);
        let d = loopback("read_lat", &["-n", "100", "-e"], &[]);
        assert_eq!(result_lines(&d.stdout, 2).len(), 1, "{}", d.stdout);
        let d = loopback("write_bw", &["-n", "100", "-b", "-s", "4096"], &[]);
        assert!(
            d.stdout.contains("RDMA_Write Bidirectional BW Test"),
            "{}",
            d.stdout
        );
        assert_eq!(result_lines(&d.stdout, 4096).len(), 1, "{}", d.stdout);
        // A 3 s window between the 1 s margins: a 1 s window once counted 0 iterations when
        // the emulated VM stalled across all of it on a loaded host.
        let d = loopback("write_bw", &["-D", "5", "-f", "1", "-s", "4096"], &[]);
        let l = result_lines(&d.stdout, 4096);
        assert_eq!(l.len(), 1, "{}", d.stdout);
        assert_eq!(l[0][2], "0.00", "no peak in duration mode");
        assert!(l[0][1].parse::<u64>().unwrap() > 0, "{}", d.stdout);
    }

    #[test]
    fn output_bandwidth_prints_only_the_value() {
        let d = loopback("write_bw", &["-n", "100", "--output=bandwidth"], &[]);
        let v: f64 = d
            .stdout
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{:?}", d.stdout));
        assert!(v > 0.0);
    }

    #[test]
    fn multiple_qps_post_list_and_all_sizes() {
        let d = loopback(
            "write_bw",
            &["-n", "100", "-q", "2", "-l", "10", "-s", "4096"],
            &[],
        );
        let l = result_lines(&d.stdout, 4096);
        assert_eq!(l.len(), 1, "{}", d.stdout);
        assert_eq!(l[0][1], "200", "iterations x QPs");
        assert!(d.stdout.contains(" Post List       : 10\n"));
        let d = loopback("send_lat", &["-n", "5", "-a"], &[]);
        for size in [2u64, 1024, 8 << 20] {
            assert_eq!(
                result_lines(&d.stdout, size).len(),
                1,
                "{size}\n{}",
                d.stdout
            );
        }
    }
}

mod features {
    use super::*;

    #[test]
    fn bidirectional_send_bw_rs_with_ib() {
        let (s, c) = pair(
            (Side::Ib, "send_bw", &["-b", "-n", "200"]),
            (Side::Rs, "send_bw", &["-b", "-n", "200"]),
            Duration::from_secs(90),
        );
        let ctx = format!("{}\n{}", show("server", &s), show("client", &c));
        assert_eq!((s.code, c.code), (Some(0), Some(0)), "{ctx}");
        assert_eq!(result_lines(&c.stdout, 65536).len(), 1, "{ctx}");
        assert!(c.stdout.contains("Send Bidirectional BW Test"), "{ctx}");
    }

    /// `--use_new_post_send` (ours, not perftest's): the QPs are made by `ibv_create_qp_ex` and
    /// the requests posted in `ibv_wr_*` batches, on the client and on both sides; the runs
    /// end as with the classic post. Inline is off (`-I 0`): rxe delivers inline data on this
    /// path empty. VM only: soft0 has no extended QPs.
    #[test]
    fn the_new_post_send_path_runs_every_kind_of_test() {
        // The server alternates between the two paths: each side meets the other's.
        for (i, (tool, size)) in [
            ("send_bw", 65536u64),
            ("write_bw", 65536),
            ("read_bw", 65536),
            ("atomic_bw", 8),
            ("send_lat", 2),
        ]
        .into_iter()
        .enumerate()
        {
            let lat = tool.ends_with("lat");
            let mut base: Vec<&str> = vec!["-n", "48"];
            if !tool.starts_with("read") && !tool.starts_with("atomic") {
                base.extend(["-I", "0"]);
            }
            if !lat {
                base.extend(["-l", "4"]);
            }
            let mut newer = base.clone();
            newer.push("--use_new_post_send");
            let server = if i % 2 == 0 { &base } else { &newer };
            let (s, c) = pair(
                (Side::Rs, tool, server),
                (Side::Rs, tool, &newer),
                Duration::from_secs(90),
            );
            let ctx = format!("{tool}\n{}\n{}", show("server", &s), show("client", &c));
            assert_eq!((s.code, c.code), (Some(0), Some(0)), "{ctx}");
            assert_eq!(result_lines(&c.stdout, size).len(), 1, "{ctx}");
        }
    }

    /// `-a` runs one handshake pair per size (send_bw) or none until the end (write_bw).
    ///
    /// `-F` on both sides: C perftest calibrates its clock again for every size's report (23
    /// of them) and exits when one calibration fails, which under emulation on a loaded
    /// machine happened three runs in a row (CI, stop 39). With `-F` it prints that size's
    /// figures as zero and goes on; this test reads only which sizes ran, not their figures.
    /// Our tools take `-F` and ignore it, as they have no calibration.
    #[test]
    fn all_sizes_against_ib() {
        for (tool, srv, cli) in [
            ("send_bw", Side::Ib, Side::Rs),
            ("write_bw", Side::Rs, Side::Ib),
        ] {
            let args: &[&str] = &["-a", "-n", "5", "-F"];
            let (s, c) = pair(
                (srv, tool, args),
                (cli, tool, args),
                Duration::from_secs(120),
            );
            let ctx = format!("{}\n{}", show("server", &s), show("client", &c));
            assert_eq!((s.code, c.code), (Some(0), Some(0)), "{ctx}");
            for size in [2u64, 4096, 8 << 20] {
                assert_eq!(result_lines(&c.stdout, size).len(), 1, "{size}\n{ctx}");
            }
        }
    }

    #[test]
    fn two_qps_and_post_list_against_ib() {
        let args: &[&str] = &["-q", "2", "-l", "10", "-n", "200", "-s", "8192"];
        let (s, c) = pair(
            (Side::Ib, "write_bw", args),
            (Side::Rs, "write_bw", args),
            Duration::from_secs(90),
        );
        let ctx = format!("{}\n{}", show("server", &s), show("client", &c));
        assert_eq!((s.code, c.code), (Some(0), Some(0)), "{ctx}");
        assert_eq!(
            result_lines(&s.stdout, 8192),
            result_lines(&c.stdout, 8192),
            "{ctx}"
        );
    }
}

mod failures {
    use super::*;

    /// A JSON report that cannot be written fails the run at once, before it waits for a
    /// peer (it printed "Couldn't write the json report" after the run and exited 0, so a
    /// script took the run for a success).
    #[test]
    fn an_unwritable_json_report_fails_before_the_run() {
        let path = "/nonexistent-rsrdma-dir/report.json";
        let flag = format!("--out_json_file={path}");
        let server = Proc::spawn(
            &program(Side::Rs, "send_bw"),
            &with(common(port()), &[flag.as_str()]),
        );
        let d = server.wait(Duration::from_secs(10));
        let ctx = show("rs_send_bw with an unwritable report", &d);
        assert_eq!(d.code, Some(1), "{ctx}");
        assert!(d.stderr.contains(path), "{ctx}");
    }

    /// The survivor of a killed peer exits non-zero within 10 s, with a message.
    fn killed(tool: &str, kill_server: bool, srv_side: Side, cli_side: Side) {
        killed_with(tool, kill_server, srv_side, cli_side, false);
    }

    /// As [`killed`], over rdma_cm (`-R`) when `cm`.
    fn killed_with(tool: &str, kill_server: bool, srv_side: Side, cli_side: Side, cm: bool) {
        killed_with_flags(
            tool,
            kill_server,
            srv_side,
            cli_side,
            if cm { &["-R"] } else { &[] },
        );
    }

    /// As [`killed`], both ends with `flags` too (and many iterations unless they name a
    /// duration).
    fn killed_with_flags(
        tool: &str,
        kill_server: bool,
        srv_side: Side,
        cli_side: Side,
        flags: &[&str],
    ) {
        let port = port();
        let cm = flags.contains(&"-R");
        let mut extra: Vec<&str> = match (flags.contains(&"-D"), tool.ends_with("_bw")) {
            (true, _) => vec![],
            (false, true) => vec!["-n", "5000000"],
            (false, false) => vec!["-n", "10000000"],
        };
        extra.extend(flags);
        let mut s = Proc::spawn(&program(srv_side, tool), &with(common(port), &extra));
        let host = if cm {
            wait_listening_cm(port, &mut s);
            cm_ip()
        } else {
            wait_listening(port, &mut s);
            "127.0.0.1".into()
        };
        let c = Proc::spawn(
            &program(cli_side, tool),
            &with(with(common(port), &extra), &[host.as_str()]),
        );
        std::thread::sleep(Duration::from_secs(3));
        let (victim, survivor) = if kill_server { (s, c) } else { (c, s) };
        let pid = victim.pid();
        victim.kill();
        let d = survivor.wait(Duration::from_secs(10));
        let ctx = show(&format!("survivor (killed pid {pid})"), &d);
        assert_ne!(d.code, Some(0), "{ctx}");
        assert!(d.code.is_some(), "died by a signal\n{ctx}");
        assert!(d.stderr.trim().len() > 10, "no message\n{ctx}");
        assert!(!d.stderr.contains("panicked"), "{ctx}");
    }

    #[test]
    fn rdma_cm_write_bw_ib_client_killed_rs_server_survives() {
        killed_with("write_bw", false, Side::Rs, Side::Ib, true);
    }

    #[test]
    fn rdma_cm_send_lat_ib_server_killed_rs_client_survives() {
        killed_with("send_lat", true, Side::Ib, Side::Rs, true);
    }

    /// In event mode too, with iterations or a duration (the receiver's watchdog looked
    /// only every 1024th idle turn, each a 50 ms sleep on the channel: it noticed the
    /// killed sender after 34 to 48 s, and with `-D` not at all, reporting a result with
    /// status 0; an outside tester's find).
    #[test]
    fn event_mode_send_bw_client_killed_rs_server_survives() {
        killed_with_flags("send_bw", false, Side::Rs, Side::Rs, &["-e"]);
        killed_with_flags("send_bw", false, Side::Rs, Side::Rs, &["-e", "-D", "20"]);
    }

    /// A passive server (read_lat: its client does the reads) whose client is killed learns
    /// it at the closing handshake and fails with exit status 1, as perftest's read_lat (it
    /// reported it but exited 0, as send_bw does: an outside tester's find).
    #[test]
    fn read_lat_client_killed_rs_server_fails() {
        killed_with_flags("read_lat", false, Side::Rs, Side::Rs, &["-D", "5"]);
    }

    #[test]
    fn write_bw_client_killed_rs_server_survives() {
        killed("write_bw", false, Side::Rs, Side::Rs);
    }

    #[test]
    fn write_bw_server_killed_rs_client_survives() {
        killed("write_bw", true, Side::Rs, Side::Rs);
    }

    #[test]
    fn send_bw_client_killed_rs_server_survives() {
        killed("send_bw", false, Side::Rs, Side::Ib);
    }

    #[test]
    fn write_lat_ib_server_killed_rs_client_survives() {
        killed("write_lat", true, Side::Ib, Side::Rs);
    }

    fn garbage(bytes: &[u8], expect: &str) {
        let port = port();
        let mut s = Proc::spawn(rs("send_bw"), &common(port));
        wait_listening(port, &mut s);
        let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
        t.write_all(bytes).unwrap();
        // End of input right away: the server must cope with what it got. A server quick
        // enough to refuse the first bytes and close with the rest unread has reset the
        // connection by now (shutdown then says ENOTCONN): that is not the test's failure.
        let _ = t.shutdown(std::net::Shutdown::Write);
        t.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut sink = Vec::new();
        let _ = t.read_to_end(&mut sink);
        drop(t);
        let d = s.wait(Duration::from_secs(10));
        let ctx = show("server", &d);
        assert_eq!(d.code, Some(1), "{ctx}");
        assert!(d.stderr.contains(expect), "{ctx}");
        assert!(!d.stderr.contains("panicked"), "{ctx}");
    }

    #[test]
    fn garbage_instead_of_a_version() {
        garbage(
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            "not compatible with versions older than 5.70",
        );
    }

    #[test]
    fn garbage_instead_of_an_endpoint() {
        let mut b = b"6.06".to_vec();
        b.resize(16, 0);
        b.extend([0, 0, 0x10, 0, 0, 0, 0, 0x40, b'3', 0]);
        b.extend([0xa5u8; 108]);
        garbage(&b, "Couldn't parse line");
    }

    #[test]
    fn truncated_then_closed() {
        garbage(b"6.0", "closed the connection");
    }

    #[test]
    fn size_mismatch_between_two_rs_tools() {
        named_mismatch(
            &["-s", "1024", "-n", "100"],
            &["-s", "4096", "-n", "100"],
            "-s (message size)",
            ["1024", "4096"],
        );
    }

    /// Two rs_send_bw ends started with `server` and `client` flags both exit 1 naming
    /// `option` and both `values`.
    fn named_mismatch(server: &[&str], client: &[&str], option: &str, values: [&str; 2]) {
        let (s, c) = pair(
            (Side::Rs, "send_bw", server),
            (Side::Rs, "send_bw", client),
            Duration::from_secs(30),
        );
        for (who, d) in [("server", &s), ("client", &c)] {
            let ctx = show(who, d);
            assert_eq!(d.code, Some(1), "{ctx}");
            assert!(d.stderr.contains(option), "{ctx}");
            assert!(values.iter().all(|v| d.stderr.contains(v)), "{ctx}");
        }
    }

    /// write_lat has no closing handshake (as perftest's): the end with more iterations
    /// finds its peer gone when the other finished, and says it may have had a shorter run
    /// (an outside tester's -n 2000 against -n 1000 read as a crash).
    #[test]
    fn write_lat_with_fewer_iterations_on_one_end_names_n() {
        let (s, c) = pair(
            (Side::Rs, "write_lat", &["-n", "400"]),
            (Side::Rs, "write_lat", &["-n", "200"]),
            Duration::from_secs(30),
        );
        let (sctx, cctx) = (show("server", &s), show("client", &c));
        assert_eq!(c.code, Some(0), "{cctx}");
        assert_eq!(s.code, Some(1), "{sctx}");
        assert!(s.stderr.contains("the same -n"), "{sctx}");
    }

    /// Two durations (`-D`) are named as such (before: only whether `-D` was on was
    /// compared, and the end left waiting blamed `-n` or the connection type: an outside
    /// tester's find).
    #[test]
    fn duration_mismatch_between_two_rs_tools() {
        named_mismatch(&["-D", "4"], &["-D", "2"], "-D (duration)", ["4 s", "2 s"]);
    }

    #[test]
    fn size_mismatch_with_ib_sender_is_detected_by_the_rs_receiver() {
        let port = port();
        let mut s = Proc::spawn(
            rs("send_bw"),
            &with(common(port), &["-s", "8192", "-n", "100"]),
        );
        wait_listening(port, &mut s);
        // perftest's client itself never notices (it blocks once the receiver is gone), so
        // it is killed after the rs server has spoken.
        let c = Proc::spawn(
            "ib_send_bw",
            &with(common(port), &["-s", "4096", "-n", "100", "127.0.0.1"]),
        );
        let d = s.wait(Duration::from_secs(30));
        c.kill();
        let ctx = show("server", &d);
        assert_eq!(d.code, Some(1), "{ctx}");
        assert!(
            d.stderr
                .contains("-s (message size): this side 8192, peer 4096"),
            "{ctx}"
        );
    }

    #[test]
    fn wrong_device_matches_perftest() {
        let args = vec!["-d".to_string(), "nosuch0".into()];
        let ours = Proc::spawn(rs("send_bw"), &args).wait(Duration::from_secs(10));
        let theirs = Proc::spawn("ib_send_bw", &args).wait(Duration::from_secs(10));
        assert_eq!(ours.code, Some(1), "{}", show("rs", &ours));
        assert_eq!(ours.code, theirs.code);
        assert_eq!(
            ours.stderr,
            "IB device nosuch0 not found\n Unable to find the Infiniband/RoCE device\n"
        );
        let norm = |s: &str| s.replace('\r', "");
        assert_eq!(
            norm(&ours.stderr) + &ours.stdout,
            norm(&theirs.stderr) + &theirs.stdout
        );
    }

    #[test]
    fn empty_gid_index_fails_like_perftest() {
        let (s, c) = pair(
            (Side::Rs, "send_bw", &["-x", "40", "-n", "100"]),
            (Side::Rs, "send_bw", &["-x", "40", "-n", "100"]),
            Duration::from_secs(30),
        );
        for (who, d) in [("server", &s), ("client", &c)] {
            assert_eq!(d.code, Some(1), "{}", show(who, d));
            assert!(
                d.stderr
                    .contains("Unable to Connect the HCA's through the link"),
                "{}",
                show(who, d)
            );
        }
    }

    #[test]
    fn gid_index_out_of_range_is_a_parser_error() {
        let d =
            Proc::spawn(rs("send_bw"), &["-x".into(), "200".into()]).wait(Duration::from_secs(10));
        assert_eq!(d.code, Some(1));
        assert_eq!(
            d.stderr,
            " Gid index should be between 0 and 64\n Parser function exited with Error\n"
        );
    }
}
