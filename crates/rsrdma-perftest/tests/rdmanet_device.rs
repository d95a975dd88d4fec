//! Device tests of `rs_rdmanet_bw` and `rs_rdmanet_lat`: server and client as child
//! processes on a real RDMA device (soft-RoCE `rxe0` in the VM: `cargo xtask test`). Declared
//! with `test = false`; run here without a device, every test fails (none skips).
//!
//! rdma_cm runs dial 10.77.0.1 (rxe cannot route rdma_cm to 127.0.0.1); the TCP handshake and
//! `--raw` dial 127.0.0.1. Sizes and counts are small: the VM emulates its CPU. Each test uses
//! its own port and gives every process a time limit; whatever it started is killed when it
//! ends.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BW: &str = env!("CARGO_BIN_EXE_rs_rdmanet_bw");
const LAT: &str = env!("CARGO_BIN_EXE_rs_rdmanet_lat");
/// How long a run may take in the VM.
const LIMIT: Duration = Duration::from_secs(30);
/// How soon a dead peer must end the other side.
const DEAD_PEER_LIMIT: Duration = Duration::from_secs(5);

mod support;
use support::{device, gid_index, ip};

fn port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(19900);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A child process whose stdout and stderr lines arrive as they are printed; killed on drop.
struct Proc {
    name: String,
    child: Child,
    lines: Receiver<String>,
    stdout: String,
    err_lines: Receiver<String>,
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
        let mut child = Command::new(prog)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {prog}: {e}"));
        let so = child.stdout.take().expect("piped stdout");
        let mut se = child.stderr.take().expect("piped stderr");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(so).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let (err_tx, err_lines) = channel();
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let mut r = BufReader::new(&mut se);
            let mut l = String::new();
            while matches!(r.read_line(&mut l), Ok(n) if n > 0) {
                let _ = err_tx.send(l.trim_end_matches('\n').to_string());
                s.push_str(&l);
                l.clear();
            }
            let _ = r.read_to_string(&mut s);
            s
        });
        Proc {
            name: format!("{prog} {}", args.join(" ")),
            child,
            lines,
            stdout: String::new(),
            err_lines,
            err: Some(err),
        }
    }

    /// Reads stdout until a line contains `what`, for at most `limit`.
    fn wait_line(&mut self, what: &str, limit: Duration) {
        self.wait_line_in(false, what, limit);
    }

    /// Reads stdout (or, with `stderr`, stderr) until a line contains `what`, for at most
    /// `limit`.
    fn wait_line_in(&mut self, stderr: bool, what: &str, limit: Duration) {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let from = if stderr { &self.err_lines } else { &self.lines };
            match from.recv_timeout(left) {
                Ok(l) => {
                    if !stderr {
                        self.stdout.push_str(&l);
                        self.stdout.push('\n');
                    }
                    if l.contains(what) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "{}: no {what:?} after {limit:?}:\n{}",
                        self.name, self.stdout
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.child.wait();
                    let se = self.err.take().map(|h| h.join().unwrap_or_default());
                    panic!(
                        "{}: ended before printing {what:?}\n--- stdout\n{}--- stderr\n{}",
                        self.name,
                        self.stdout,
                        se.unwrap_or_default()
                    )
                }
            }
        }
    }

    /// Waits at most `limit` for the exit; a process still running then fails the test.
    fn wait(mut self, limit: Duration) -> Done {
        let start = Instant::now();
        let code = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st.code();
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.stdout.extend(self.lines.try_iter().map(|l| l + "\n"));
                panic!(
                    "{} still running after {limit:?}: killed\n--- stdout\n{}",
                    self.name, self.stdout
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = start.elapsed();
        // The reader ends at EOF, after the exit.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.stdout.push_str(&l);
            self.stdout.push('\n');
        }
        Done {
            code,
            stdout: std::mem::take(&mut self.stdout),
            stderr: self
                .err
                .take()
                .map(|h| h.join().unwrap_or_default())
                .unwrap_or_default(),
            took,
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn args(port: u16, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        "-d".to_string(),
        device(),
        "-x".into(),
        gid_index(),
        "-p".into(),
        port.to_string(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// The address a client dials: rdma_cm needs the device's IP.
fn host(extra: &[&str]) -> String {
    if extra.contains(&"--handshake") || extra.contains(&"--raw") {
        "127.0.0.1".into()
    } else {
        ip()
    }
}

/// Starts a server and waits for its listening line.
fn server(prog: &str, port: u16, extra: &[&str]) -> Proc {
    let mut s = Proc::spawn(prog, &args(port, extra));
    s.wait_line("listening on", Duration::from_secs(15));
    s
}

fn client(prog: &str, port: u16, extra: &[&str]) -> Proc {
    let mut a = args(port, extra);
    a.push(host(extra));
    Proc::spawn(prog, &a)
}

/// Runs a server and a client to the end; both must exit 0.
fn pair(prog: &str, server_extra: &[&str], client_extra: &[&str]) -> (Done, Done) {
    let port = port();
    let s = server(prog, port, server_extra);
    let c = client(prog, port, client_extra).wait(LIMIT);
    let s = s.wait(LIMIT);
    assert_eq!(
        c.code,
        Some(0),
        "{}\n{}",
        show("client", &c),
        show("server", &s)
    );
    assert_eq!(
        s.code,
        Some(0),
        "{}\n{}",
        show("client", &c),
        show("server", &s)
    );
    eprint!("{}{}", show("client", &c), show("server", &s));
    (s, c)
}

fn show(what: &str, d: &Done) -> String {
    format!(
        "{what}: exit {:?} after {:?}\n--- stdout\n{}--- stderr\n{}",
        d.code, d.took, d.stdout, d.stderr
    )
}

/// The one line starting with `prefix`.
fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    let found: Vec<&str> = out.lines().filter(|l| l.starts_with(prefix)).collect();
    assert_eq!(found.len(), 1, "one line {prefix:?} expected in:\n{out}");
    found[0]
}

/// `…: sent N x S bytes in D: X Gb/s, Y Mpps`: the rates are those of N, S and D (as
/// printed: 2 and 3 decimals), and D is a positive Go duration.
fn check_rates(l: &str) {
    let w: Vec<&str> = l.split_whitespace().collect();
    assert!(w.len() == 12 && w[1] == "sent" && w[3] == "x", "{l}");
    let (n, size): (f64, f64) = (w[2].parse().unwrap(), w[4].parse().unwrap());
    let d = w[7].trim_end_matches(':');
    let secs = go_seconds(d).unwrap_or_else(|| panic!("{d:?} in {l}"));
    assert!(secs > 0.0, "{l}");
    let (gbits, mpps): (f64, f64) = (w[8].parse().unwrap(), w[10].parse().unwrap());
    assert_eq!((w[9], w[11]), ("Gb/s,", "Mpps"), "{l}");
    assert!((gbits - n * size * 8.0 / secs / 1e9).abs() <= 0.0051, "{l}");
    assert!((mpps - n / secs / 1e6).abs() <= 0.00051, "{l}");
}

/// A Go duration (`12.3µs`, `1.5ms`, `2s`; no minutes here) in seconds.
fn go_seconds(s: &str) -> Option<f64> {
    let unit_at = s.find(|c: char| c.is_alphabetic())?;
    let (num, unit) = s.split_at(unit_at);
    let scale = match unit {
        "ns" => 1e-9,
        "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

/// A positive Go duration.
fn go_duration_ok(s: &str) -> bool {
    go_seconds(s).is_some_and(|v| v > 0.0)
}

#[test]
fn rdmanet_bw_send_msg_over_rdma_cm_with_event_polling() {
    let (s, c) = pair(BW, &["--poll", "event"], &["-n", "100", "-s", "4096"]);
    let l = line(&c.stdout, "SendMsg: ");
    assert!(l.starts_with("SendMsg: sent 100 x 4096 bytes in "), "{l}");
    check_rates(l);
    let _ = line(&s.stdout, &format!("accepted a connection from {}:", ip()));
    line(&s.stdout, "server received 100 messages (409600 bytes)");
    assert!(s.stdout.contains("(rdma_cm)"), "{}", s.stdout);
}

#[test]
fn rdmanet_bw_send_batch_over_the_tcp_handshake_with_busy_polling() {
    let (s, c) = pair(
        BW,
        &["--handshake", "--poll", "busy", "-b", "8"],
        &[
            "--handshake",
            "--poll",
            "busy",
            "-b",
            "8",
            "-n",
            "100",
            "-s",
            "1000",
        ],
    );
    let l = line(&c.stdout, "SendBatch(8): ");
    assert!(
        l.starts_with("SendBatch(8): sent 100 x 1000 bytes in "),
        "{l}"
    );
    check_rates(l);
    line(&s.stdout, "server received 100 messages (100000 bytes)");
    assert!(s.stdout.contains("(TCP handshake)"), "{}", s.stdout);
    // A batch larger than the run is the run (an outside tester's find: `-b 4294967295`
    // allocated a 64 GiB group and aborted).
    let (s, c) = pair(
        BW,
        &["--handshake", "-b", "4294967295"],
        &["--handshake", "-b", "4294967295", "-n", "20", "-s", "64"],
    );
    let l = line(&c.stdout, "SendBatch(4294967295): ");
    assert!(l.contains("sent 20 x 64 bytes"), "{l}");
    line(&s.stdout, "server received 20 messages (1280 bytes)");
}

#[test]
fn rdmanet_bw_large_messages_and_a_small_credit_window_with_adaptive_polling() {
    // 100 KiB messages over 32 KiB slots: fragmented and reassembled; --depth 8 credits.
    let (s, c) = pair(
        BW,
        &["--handshake", "--poll", "adaptive", "--depth", "8"],
        &[
            "--handshake",
            "--poll",
            "adaptive",
            "--depth",
            "8",
            "-n",
            "10",
            "-s",
            "102400",
        ],
    );
    check_rates(line(&c.stdout, "SendMsg: sent 10 x 102400 bytes in "));
    line(&s.stdout, "server received 10 messages (1024000 bytes)");
}

#[test]
fn rdmanet_bw_raw_prints_perftests_table() {
    let (s, c) = pair(
        BW,
        &["--raw", "-b", "16"],
        &["--raw", "-b", "16", "-n", "300", "-s", "4096"],
    );
    for out in [&s.stdout, &c.stdout] {
        assert!(out.contains("                    Send BW Test\n"), "{out}");
        assert!(out.contains(" local address: LID "), "{out}");
        assert!(out.contains(" remote address: LID "), "{out}");
        assert!(out.contains(" GID: "), "{out}");
    }
    assert!(c.stdout.contains(" TX depth        : 16\n"), "{}", c.stdout);
    assert!(c.stdout.contains(" CQ Moderation   : 2\n"), "{}", c.stdout);
    assert!(s.stdout.contains(" RX depth        : 16\n"), "{}", s.stdout);
    line(&c.stdout, " #bytes     #iterations    BW peak[MB/sec]");
    let row: Vec<&str> = line(&c.stdout, " 4096 ").split_whitespace().collect();
    assert_eq!(row.len(), 5, "{row:?}");
    assert_eq!((row[0], row[1], row[2]), ("4096", "300", "0.00"), "{row:?}");
    let avg: f64 = row[3].parse().unwrap();
    let rate: f64 = row[4].parse().unwrap();
    assert!(avg > 0.0 && rate > 0.0, "{row:?}");
    // MiB/s and Mpps describe the same run.
    assert!(
        (avg - rate * 1e6 * 4096.0 / 1_048_576.0).abs() < avg * 0.01 + 0.01,
        "{row:?}"
    );
    line(&s.stdout, "server received 300 messages (1228800 bytes)");
}

#[test]
fn rdmanet_bw_raw_onebuf_single_posts() {
    let (s, c) = pair(
        BW,
        &["--raw", "--raw-onebuf", "--depth", "8"],
        &[
            "--raw",
            "--raw-onebuf",
            "--raw-single",
            "--depth",
            "8",
            "-n",
            "100",
            "-s",
            "1024",
        ],
    );
    assert!(c.stdout.contains(" CQ Moderation   : 1\n"), "{}", c.stdout);
    let row: Vec<&str> = line(&c.stdout, " 1024 ").split_whitespace().collect();
    assert_eq!(row[1], "100", "{row:?}");
    line(&s.stdout, "server received 100 messages (102400 bytes)");
}

/// `--raw` on the client only: it exits 1 at once and names the flag (on soft0 it said "the
/// peer closed the connection during handshake hello": soft0's rdma_cm took its TCP
/// connection; an outside tester's find). The server, a listener, serves on.
#[test]
fn rdmanet_bw_raw_on_the_client_only_names_the_flag() {
    let port = port();
    let mut s = server(BW, port, &[]);
    let c = client(BW, port, &["--raw", "-n", "10"]).wait(LIMIT);
    s.kill();
    assert_eq!(c.code, Some(1), "{}", show("client", &c));
    assert!(c.took < Duration::from_secs(5), "{}", show("client", &c));
    assert!(
        c.stderr.contains("this side has --raw: does the server?"),
        "{}",
        show("client", &c)
    );
}

/// `--depth` deeper than the device takes, on a striped connection: the refusal names the
/// flag, as one `Conn`'s does (it named only the library's options). On the TCP handshake,
/// whose listener checks its options against the device as it binds (rdma_cm's on the
/// unspecified address learns its device from each request).
#[test]
fn rdmanet_bw_rails_with_a_depth_the_device_refuses_names_the_flag() {
    let flags = ["--handshake", "--rails", "2", "--depth", "16384"];
    let s = Proc::spawn(BW, &args(port(), &flags)).wait(LIMIT);
    assert_eq!(s.code, Some(1), "{}", show("server", &s));
    assert!(
        s.stderr
            .contains("(--depth 16384 sets recv_slots, send_slots and sq_depth)"),
        "{}",
        show("server", &s)
    );
}

#[test]
fn rdmanet_bw_raw_onebuf_on_one_end_only_is_refused() {
    let port = port();
    let s = server(BW, port, &["--raw", "--raw-onebuf"]);
    let c = client(BW, port, &["--raw", "-n", "10"]).wait(LIMIT);
    let s = s.wait(LIMIT);
    for d in [&s, &c] {
        assert_eq!(d.code, Some(1), "{}", show("one end", d));
        assert!(d.stderr.contains("--raw-onebuf"), "{}", show("one end", d));
    }
}

#[test]
fn rdmanet_lat_over_rdma_cm_with_adaptive_polling() {
    let (s, c) = pair(
        LAT,
        &["--poll", "adaptive"],
        &["--poll", "adaptive", "-n", "20"],
    );
    let l = line(&c.stdout, "round-trips=20 ");
    let fields: Vec<(&str, &str)> = l
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.split_once('='))
        .collect();
    let names: Vec<&str> = fields.iter().map(|f| f.0).collect();
    assert_eq!(names, ["avg", "p50", "p99", "min", "max"], "{l}");
    assert!(fields.iter().all(|f| go_duration_ok(f.1)), "{l}");
    line(&s.stdout, "server echoed 20 messages (1280 bytes)");
}

#[test]
fn rdmanet_lat_over_the_tcp_handshake_with_busy_polling() {
    let (s, c) = pair(
        LAT,
        &["--handshake", "--poll", "busy"],
        &["--handshake", "--poll", "busy", "-n", "30", "-s", "1000"],
    );
    line(&c.stdout, "round-trips=30 avg=");
    line(&s.stdout, "server echoed 30 messages (30000 bytes)");
}

/// Starts a long run, kills `victim` once data flows, and returns the survivor's end.
fn kill_mid_run(prog: &str, extra: &[&str], kill_server: bool) -> Done {
    let port = port();
    let mut s = server(prog, port, extra);
    let mut long_run = extra.to_vec();
    long_run.extend(["-n", "100000000", "-s", "1024"]);
    let mut c = client(prog, port, &long_run);
    s.wait_line("accepted a connection", Duration::from_secs(15));
    // Let data flow before the peer dies.
    std::thread::sleep(Duration::from_millis(300));
    for (p, what) in [(&mut c, "client"), (&mut s, "server")] {
        let st = p.child.try_wait().expect("try_wait");
        assert!(st.is_none(), "the {what} ended ({st:?}) before the kill");
    }
    let survivor = if kill_server {
        s.kill();
        c
    } else {
        c.kill();
        s
    };
    let d = survivor.wait(DEAD_PEER_LIMIT + Duration::from_secs(5));
    eprint!("{}", show("survivor", &d));
    assert_eq!(d.code, Some(1), "{}", show("survivor", &d));
    assert!(d.took < DEAD_PEER_LIMIT, "{}", show("survivor", &d));
    assert!(d.stderr.starts_with("error: "), "{}", show("survivor", &d));
    d
}

#[test]
fn rdmanet_bw_client_exits_1_within_5_s_when_the_rdma_cm_server_is_killed() {
    let d = kill_mid_run(BW, &[], true);
    assert!(d.stderr.contains("send_msg"), "{}", d.stderr);
}

#[test]
fn rdmanet_lat_client_exits_1_within_5_s_when_the_tcp_handshake_server_is_killed() {
    kill_mid_run(LAT, &["--handshake", "--poll", "busy"], true);
}

#[test]
fn rdmanet_raw_client_exits_1_within_5_s_when_the_server_is_killed() {
    let d = kill_mid_run(BW, &["--raw"], true);
    assert!(d.stderr.contains("send"), "{}", d.stderr);
}

#[test]
fn rdmanet_bw_server_exits_1_within_5_s_when_the_client_is_killed() {
    kill_mid_run(BW, &["--handshake", "-b", "4"], false);
}

/// `payload copied into send slots: N bytes`: N.
fn copied(out: &str) -> u64 {
    line(out, "payload copied into send slots: ")
        .split_whitespace()
        .nth(5)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no copied bytes in:\n{out}"))
}

#[test]
fn rdmanet_bw_zero_copy_64_kib_eager_from_a_ring_of_buffers_verified() {
    // Below the rendezvous threshold: lent frames (header from a slot, payload from the
    // buffer). The server checks every message's stamps, so order and delivery are verified.
    let (s, c) = pair(
        BW,
        &["--zero-copy"],
        &["--zero-copy", "--buffers", "4", "-n", "40", "-s", "65536"],
    );
    check_rates(line(&c.stdout, "SendBuffer(4): sent 40 x 65536 bytes in "));
    assert_eq!(copied(&c.stdout), 0, "{}", c.stdout);
    line(&s.stdout, "server received 40 messages (2621440 bytes)");
}

#[test]
fn rdmanet_bw_zero_copy_1_mib_by_rendezvous_verified() {
    // At 1 MiB (above the 256 KiB threshold) the server READs each message into its buffer.
    let (s, c) = pair(
        BW,
        &["--zero-copy", "--handshake", "--poll", "busy"],
        &[
            "--zero-copy",
            "--handshake",
            "--poll",
            "busy",
            "-n",
            "8",
            "-s",
            "1048576",
        ],
    );
    check_rates(line(&c.stdout, "SendBuffer(8): sent 8 x 1048576 bytes in "));
    assert_eq!(copied(&c.stdout), 0, "{}", c.stdout);
    line(&s.stdout, "server received 8 messages (8388608 bytes)");
}

#[test]
fn rdmanet_bw_zero_copy_just_below_and_at_a_lowered_threshold() {
    // --rendezvous on both ends (the settled threshold is the larger): 4095 bytes go eagerly,
    // 4096 by READ; a server buffer that starts too small is replaced.
    for size in ["4095", "4096"] {
        let (s, c) = pair(
            BW,
            &["--zero-copy", "--rendezvous", "4096", "-s", "64"],
            &[
                "--zero-copy",
                "--rendezvous",
                "4096",
                "-n",
                "20",
                "-s",
                size,
            ],
        );
        assert_eq!(copied(&c.stdout), 0, "{}", c.stdout);
        let bytes = 20 * size.parse::<u64>().unwrap();
        line(
            &s.stdout,
            &format!("server received 20 messages ({bytes} bytes)"),
        );
    }
}

#[test]
fn rdmanet_bw_copying_client_to_a_zero_copy_server_fails_the_stamp_check() {
    // The check can fail: unstamped messages are refused by a --zero-copy server.
    let port = port();
    let s = server(BW, port, &["--zero-copy"]);
    let c = client(BW, port, &["-n", "5", "-s", "4096"]).wait(LIMIT);
    let s = s.wait(LIMIT);
    assert_eq!(s.code, Some(1), "{}", show("server", &s));
    assert!(
        s.stderr
            .contains("message 0 (4096 bytes) carries the stamp"),
        "{}",
        show("server", &s)
    );
    eprint!("{}", show("client", &c));
}

#[test]
fn rdmanet_lat_zero_copy_both_ends() {
    for size in ["64", "300000"] {
        let (s, c) = pair(
            LAT,
            &["--zero-copy", "--poll", "busy"],
            &["--zero-copy", "--poll", "busy", "-n", "10", "-s", size],
        );
        line(&c.stdout, "round-trips=10 avg=");
        let bytes = 10 * size.parse::<u64>().unwrap();
        line(
            &s.stdout,
            &format!("server echoed 10 messages ({bytes} bytes)"),
        );
    }
}

#[test]
fn rdmanet_bw_server_with_a_shared_receive_pool_prints_its_memory() {
    let (s, c) = pair(
        BW,
        &["--shared-recv", "64", "--handshake"],
        &["--handshake", "-n", "50", "-s", "4096"],
    );
    check_rates(line(&c.stdout, "SendMsg: sent 50 x 4096 bytes in "));
    line(&s.stdout, "server received 50 messages (204800 bytes)");
    let l = line(&s.stdout, "listener receive memory: ");
    let w: Vec<&str> = l.split_whitespace().collect();
    let total: u64 = w[3].parse().unwrap();
    let pool: u64 = w[6].parse().unwrap();
    // 64 slots of the default 32 KiB + 16 B, and the one connection's bookkeeping only.
    assert_eq!(pool, 64 * (32 * 1024 + 16), "{l}");
    assert!(
        w[9] == "64" && total >= pool && total < pool + 64 * 1024,
        "{l}"
    );
    assert!(l.ends_with("for 1 connections)"), "{l}");
}

#[test]
fn rdmanet_bad_zero_copy_flag_combinations_are_refused_before_any_connection() {
    for (prog, argv, says) in [
        (
            BW,
            &["--shared-recv", "64", "10.77.0.1"][..],
            "server option",
        ),
        (LAT, &["--shared-recv", "8", "10.77.0.1"], "server option"),
        (BW, &["--raw", "--zero-copy"], "--raw (RawConn) takes none"),
        (BW, &["--zero-copy", "-b", "8"], "does not combine"),
        (BW, &["--buffers", "4"], "--zero-copy"),
    ] {
        let started = Instant::now();
        let d = Proc::spawn(prog, &args(port(), argv)).wait(Duration::from_secs(10));
        assert_eq!(d.code, Some(2), "{argv:?}: {}", show("tool", &d));
        assert!(d.stderr.contains(says), "{argv:?}: {}", show("tool", &d));
        assert!(started.elapsed() < Duration::from_secs(5), "{argv:?}");
    }
}

/// The fields of a flat JSON object of strings and numbers on one line (what `--json`
/// prints), as (key, value) with the quotes of string values removed.
fn json_fields(line: &str) -> Vec<(String, String)> {
    let body = line
        .trim()
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not a JSON object: {line}"));
    body.split(',')
        .map(|kv| {
            let (k, v) = kv
                .split_once(':')
                .unwrap_or_else(|| panic!("{kv:?} in {line}"));
            let unquote = |s: &str| {
                s.strip_prefix('"')
                    .and_then(|s| s.strip_suffix('"'))
                    .unwrap_or(s)
                    .to_string()
            };
            assert!(k.starts_with('"') && k.ends_with('"'), "{k} in {line}");
            (unquote(k), unquote(v))
        })
        .collect()
}

/// The one JSON object a `--json` run printed on stdout, as fields.
fn json_of(d: &Done) -> Vec<(String, String)> {
    let lines: Vec<&str> = d.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one JSON line expected on stdout:\n{}",
        d.stdout
    );
    json_fields(lines[0])
}

fn field<'a>(fields: &'a [(String, String)], key: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key:?} in {fields:?}"))
}

fn num(fields: &[(String, String)], key: &str) -> f64 {
    let v = field(fields, key);
    v.parse()
        .unwrap_or_else(|_| panic!("{key}: {v:?} is not a number"))
}

/// Runs a `--json` pair: the server's listening line is on stderr then.
fn json_pair(prog: &str, server_extra: &[&str], client_extra: &[&str]) -> (Done, Done) {
    let port = port();
    let mut s = Proc::spawn(prog, &args(port, server_extra));
    s.wait_line_in(true, "listening on", Duration::from_secs(15));
    let c = client(prog, port, client_extra).wait(LIMIT);
    let s = s.wait(LIMIT);
    let both = format!("{}\n{}", show("client", &c), show("server", &s));
    assert_eq!((c.code, s.code), (Some(0), Some(0)), "{both}");
    eprint!("{both}");
    (s, c)
}

#[test]
fn rdmanet_bw_json_prints_one_object_per_end() {
    let (s, c) = json_pair(
        BW,
        &["--json", "--poll", "busy"],
        &["--json", "--poll", "busy", "-n", "50", "-s", "2048"],
    );
    let cj = json_of(&c);
    let keys: Vec<&str> = cj.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(&keys[..3], ["tool", "role", "transport"], "{cj:?}");
    assert_eq!(field(&cj, "tool"), "rs_rdmanet_bw");
    assert_eq!(field(&cj, "role"), "client");
    assert_eq!(field(&cj, "transport"), "conn");
    assert_eq!(field(&cj, "mode"), "send_msg");
    assert_eq!(field(&cj, "poll"), "busy");
    assert_eq!(num(&cj, "messages"), 50.0);
    assert_eq!(num(&cj, "size"), 2048.0);
    assert_eq!(num(&cj, "bytes"), 102_400.0);
    let secs = num(&cj, "seconds");
    assert!(secs > 0.0, "{cj:?}");
    let gbits = num(&cj, "gbits");
    assert!(
        (gbits - 102_400.0 * 8.0 / secs / 1e9).abs() <= 1e-9 * gbits.max(1.0),
        "{cj:?}"
    );
    assert!(num(&cj, "registered_bytes") > 0.0, "{cj:?}");
    assert!(num(&cj, "cpu_seconds") >= 0.0, "{cj:?}");
    // The human lines went to stderr.
    assert!(
        c.stderr.contains("SendMsg: sent 50 x 2048 bytes"),
        "{}",
        c.stderr
    );
    let sj = json_of(&s);
    assert_eq!(field(&sj, "role"), "server");
    assert_eq!(num(&sj, "messages"), 50.0);
    assert_eq!(num(&sj, "bytes"), 102_400.0);
    assert!(s.stderr.contains("listening on"), "{}", s.stderr);
}

#[test]
fn rdmanet_bw_raw_json_names_the_pipeline() {
    let (s, c) = json_pair(
        BW,
        &["--raw", "--json"],
        &["--raw", "--json", "-n", "64", "-s", "4096", "-b", "16"],
    );
    let cj = json_of(&c);
    assert_eq!(field(&cj, "transport"), "raw");
    assert_eq!(field(&cj, "mode"), "pipeline_batch");
    assert_eq!(num(&cj, "tx_depth"), 16.0);
    assert_eq!(num(&cj, "messages"), 64.0);
    assert_eq!(num(&cj, "registered_bytes"), 16.0 * 4096.0);
    let sj = json_of(&s);
    assert_eq!(field(&sj, "transport"), "raw");
    assert_eq!(num(&sj, "messages"), 64.0);
    assert_eq!(num(&sj, "bytes"), 64.0 * 4096.0);
}

#[test]
fn rdmanet_lat_json_orders_its_percentiles() {
    let (s, c) = json_pair(
        LAT,
        &["--json", "--poll", "busy"],
        &["--json", "--poll", "busy", "-n", "25", "-s", "64"],
    );
    let cj = json_of(&c);
    assert_eq!(field(&cj, "tool"), "rs_rdmanet_lat");
    assert_eq!(num(&cj, "round_trips"), 25.0);
    assert_eq!(num(&cj, "size"), 64.0);
    let (min, p50, p99, max) = (
        num(&cj, "min_ns"),
        num(&cj, "p50_ns"),
        num(&cj, "p99_ns"),
        num(&cj, "max_ns"),
    );
    assert!(
        0.0 < min && min <= p50 && p50 <= p99 && p99 <= max,
        "{cj:?}"
    );
    let avg = num(&cj, "avg_ns");
    assert!(min <= avg && avg <= max, "{cj:?}");
    let sj = json_of(&s);
    assert_eq!(num(&sj, "messages"), 25.0);
    assert_eq!(num(&sj, "bytes"), 25.0 * 64.0);
}
