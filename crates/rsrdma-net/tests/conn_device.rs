//! Conn and Listener on a real device (rxe0 in the VM), on both establishment paths: echo of
//! messages from 0 B to MiBs, a byte stream, full duplex from two threads, short buffers,
//! the message cap, timeouts, close waking a blocked reader, a QP forced to ERROR, garbage
//! and half handshakes on the listener, a peer that dies or hangs (a child process), and
//! the CPU an idle connection uses. Every wait is bounded.

use rsrdma_net::progress::PollMode;
use rsrdma_net::{Conn, ConnOptions, Establish, Listener, NetError};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "RSRDMA_CONN_CHILD";

fn ip() -> String {
    std::env::var("RSRDMA_TEST_IP").unwrap_or_else(|_| "10.77.0.1".into())
}

fn opts(path: Establish) -> ConnOptions {
    ConnOptions::default()
        .establish(path)
        .device(std::env::var("RSRDMA_TEST_DEVICE").unwrap_or_else(|_| "rxe0".into()))
        .gid_index(
            std::env::var("RSRDMA_TEST_GID_INDEX")
                .ok()
                .and_then(|v| v.parse().ok()),
        )
}

fn listen(o: ConnOptions) -> Listener {
    let host = match o.establish {
        Establish::Tcp => "127.0.0.1".to_string(),
        _ => ip(),
    };
    Listener::bind(format!("{host}:0"), o).unwrap()
}

/// (dialer, acceptor).
fn pair(client: ConnOptions, server: ConnOptions) -> (Conn, Conn) {
    let l = listen(server);
    let addr = l.local_addr();
    assert_ne!(addr.port(), 0, "the real bound port");
    let t = thread::spawn(move || l.accept_timeout(Duration::from_secs(20)).unwrap());
    let c = Conn::dial(addr, client).unwrap();
    (c, t.join().unwrap())
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Echoes messages until the end of the stream, then closes.
fn echo_server(s: Conn) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let mut n = 0;
        while let Some(m) = s.recv_msg().unwrap() {
            s.send_msg(&m).unwrap();
            n += 1;
        }
        s.close().unwrap();
        n
    })
}

fn echo_sizes(path: Establish) {
    let (c, s) = pair(opts(path), opts(path));
    let info = c.info().clone();
    assert_eq!(info.establish, path);
    assert_eq!(info.device, "rxe0");
    assert_eq!(info.peer_qpn, s.info().local_qpn);
    assert_eq!(info.local_qpn, s.info().peer_qpn);
    assert_eq!(info.local_gid, s.info().peer_gid);
    assert!(info.mtu.is_some());
    assert_eq!(info.settled.frame_size, 32 * 1024);
    assert_eq!(
        info.registered_bytes,
        2 << 20,
        "default memory per connection"
    );
    assert_eq!(c.peer_addr().port(), s.local_addr().port());
    assert_eq!(s.peer_addr().port(), c.local_addr().port());
    let server = echo_server(s);
    let sizes = [
        0,
        1,
        100,
        32 * 1024 - 16,
        32 * 1024,
        100_000,
        1 << 20,
        3 << 20,
    ];
    for (i, &len) in sizes.iter().enumerate() {
        let msg = pattern(len, i as u64);
        c.send_msg(&msg).unwrap();
        let back = c.recv_msg().unwrap().expect("an echo, not EOF");
        assert_eq!(back.len(), len);
        assert!(back == msg, "echo of {len} bytes differs");
    }
    c.shutdown(Shutdown::Write).unwrap();
    assert_eq!(c.recv_msg().unwrap(), None, "EOF after the server's close");
    assert_eq!(server.join().unwrap(), sizes.len());
    c.close().unwrap();
}

#[test]
fn echo_0_bytes_to_3_mib_over_rdma_cm() {
    echo_sizes(Establish::Cm);
}

#[test]
fn echo_0_bytes_to_3_mib_over_tcp_handshake() {
    echo_sizes(Establish::Tcp);
}

#[test]
fn a_byte_stream_with_io_copy() {
    let (c, s) = pair(opts(Establish::Tcp), opts(Establish::Tcp));
    let data = pattern(6 << 20, 7);
    let expect = data.clone();
    let reader = thread::spawn(move || {
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).unwrap();
        s.close().unwrap();
        got
    });
    let mut src = &data[..];
    let n = std::io::copy(&mut src, &mut &c).unwrap();
    assert_eq!(n, data.len() as u64);
    (&c).flush().unwrap();
    c.close().unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got.len(), expect.len());
    assert!(got == expect, "the stream differs");
}

#[test]
fn full_duplex_from_two_threads_each_side() {
    let (c, s) = pair(opts(Establish::Cm), opts(Establish::Cm));
    let count = 300;
    let run = |conn: Arc<Conn>, seed: u64| {
        let tx = {
            let conn = conn.clone();
            thread::spawn(move || {
                for i in 0..count {
                    conn.send_msg(&pattern(1 + (i * 997) % 70_000, seed + i as u64))
                        .unwrap();
                }
            })
        };
        let rx = thread::spawn(move || {
            for i in 0..count {
                let m = conn.recv_msg().unwrap().unwrap();
                let want = pattern(1 + (i * 997) % 70_000, (seed ^ 1) + i as u64);
                assert!(m == want, "message {i} differs");
            }
        });
        (tx, rx)
    };
    let (c, s) = (Arc::new(c), Arc::new(s));
    let (a, b) = run(c.clone(), 100);
    let (d, e) = run(s.clone(), 101);
    for t in [a, b, d, e] {
        t.join().unwrap();
    }
}

#[test]
fn short_buffer_keeps_the_message_and_the_cap_is_enforced() {
    let small = opts(Establish::Tcp).max_message(100_000);
    let (c, s) = pair(opts(Establish::Tcp), small);
    assert_eq!(c.info().settled.max_message, 100_000, "the smaller cap");
    let err = c.send_msg(&vec![1u8; 100_001]).unwrap_err();
    assert!(
        matches!(
            err,
            NetError::MessageTooLarge {
                len: 100_001,
                max: 100_000
            }
        ),
        "{err}"
    );
    let msg = pattern(50_000, 3);
    c.send_msg(&msg).unwrap();
    let mut buf = vec![0u8; 1000];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    match s.recv_msg_into(&mut buf) {
        Err(NetError::ShortBuffer { needed }) => assert_eq!(needed, 50_000),
        other => panic!("expected ShortBuffer, got {other:?}"),
    }
    let mut buf = vec![0u8; 60_000];
    let n = s.recv_msg_into(&mut buf).unwrap().unwrap();
    assert_eq!(&buf[..n], &msg[..]);
    c.send_msg(b"still usable").unwrap();
    assert_eq!(s.recv_msg().unwrap().unwrap(), b"still usable");
    // Batches: all lengths are checked before anything goes.
    let e = c.send_batch(&[b"a", &[0u8; 100_001]]).unwrap_err();
    assert!(matches!(e, NetError::MessageTooLarge { .. }), "{e}");
    c.send_batch(&[b"one", b"", b"three"]).unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(s.recv_batch(8).unwrap());
    }
    assert_eq!(got, vec![b"one".to_vec(), Vec::new(), b"three".to_vec()]);
}

#[test]
fn read_timeout_then_still_usable_and_a_slow_reader_times_the_writer_out() {
    for mode in [PollMode::Event, PollMode::Busy, PollMode::default()] {
        let (c, s) = pair(
            opts(Establish::Tcp).poll_mode(mode),
            opts(Establish::Tcp).poll_mode(mode),
        );
        s.set_read_timeout(Some(Duration::from_millis(150)))
            .unwrap();
        let t0 = Instant::now();
        let e = s.recv_msg().unwrap_err();
        assert!(matches!(e, NetError::Timeout { .. }), "{mode:?}: {e}");
        assert!(t0.elapsed() >= Duration::from_millis(150));
        let io = (&s).read(&mut [0u8; 4]).unwrap_err();
        assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
        c.send_msg(b"after the timeout").unwrap();
        assert_eq!(
            s.recv_msg().unwrap().unwrap(),
            b"after the timeout",
            "{mode:?}"
        );
    }
    // Nobody reads: credits run out, the sender blocks, then times out.
    let (c, _s) = pair(opts(Establish::Cm), opts(Establish::Cm));
    c.set_write_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let msg = vec![5u8; 20_000];
    let t0 = Instant::now();
    let mut sent = 0;
    let err = loop {
        match c.send_msg(&msg) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never blocked");
    };
    assert!(matches!(err, NetError::Timeout { .. }), "{err}");
    assert!(sent >= 20, "sent {sent} messages before blocking");
}

#[test]
fn close_wakes_a_blocked_reader_and_writer_on_other_threads() {
    let (c, _s) = pair(opts(Establish::Cm), opts(Establish::Cm));
    let c = Arc::new(c);
    let reader = {
        let c = c.clone();
        thread::spawn(move || {
            let e = c.recv_msg().unwrap_err();
            (Instant::now(), e)
        })
    };
    thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let _ = c.close();
    let (woke, e) = reader.join().unwrap();
    assert!(
        matches!(e, NetError::Closed { .. }),
        "the blocked reader got {e}"
    );
    assert!(woke.duration_since(t0) < Duration::from_millis(500));
    assert!(matches!(c.send_msg(b"x"), Err(NetError::Closed { .. })));
}

#[test]
fn a_qp_forced_to_error_fails_both_sides_promptly() {
    let fast = || {
        opts(Establish::Tcp)
            .keepalive(Duration::from_millis(200))
            .peer_timeout(Duration::from_millis(1000))
    };
    let (c, s) = pair(fast(), fast());
    let c = Arc::new(c);
    let reader = {
        let c = c.clone();
        thread::spawn(move || c.recv_msg().unwrap_err())
    };
    thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    c.inject_qp_error().unwrap();
    let e = reader.join().unwrap();
    assert!(matches!(e, NetError::ConnFailed(_)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let e = s.recv_msg().unwrap_err();
    assert!(matches!(e, NetError::ConnFailed(_)), "the peer got {e}");
    eprintln!("QP forced to ERROR: peer failed after {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn garbage_and_half_handshakes_on_the_listener_then_a_good_client() {
    let l = listen(opts(Establish::Tcp).connect_timeout(Duration::from_millis(800)));
    let addr = l.local_addr();
    let mut junk = TcpStream::connect(addr).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\n\r\nthis is not a handshake")
        .unwrap();
    let e = l.accept_timeout(Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, NetError::Handshake { .. }), "{e}");
    let _silent = TcpStream::connect(addr).unwrap();
    let t0 = Instant::now();
    let e = l.accept_timeout(Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, NetError::Handshake { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    let client = thread::spawn(move || Conn::dial(addr, opts(Establish::Tcp)).unwrap());
    let s = l.accept_timeout(Duration::from_secs(10)).unwrap();
    let c = client.join().unwrap();
    c.send_msg(b"hello").unwrap();
    assert_eq!(s.recv_msg().unwrap().unwrap(), b"hello");

    // rdma_cm: a connect request whose private data is not a Conn announcement.
    let l = listen(opts(Establish::Cm));
    let addr = l.local_addr();
    let bad = thread::spawn(move || raw_cm_connect(addr, b"not rsrdma at all"));
    let e = l.accept_timeout(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(e, NetError::Handshake { .. }), "{e}");
    let client_err = bad.join().unwrap();
    assert!(client_err.contains("bad magic"), "{client_err}");
    let client = thread::spawn(move || Conn::dial(addr, opts(Establish::Cm)).unwrap());
    let s = l.accept_timeout(Duration::from_secs(10)).unwrap();
    let c = client.join().unwrap();
    c.send_msg(b"hello cm").unwrap();
    assert_eq!(s.recv_msg().unwrap().unwrap(), b"hello cm");
}

/// Connects with plain rdma_cm and `data` as private data; returns the error text.
fn raw_cm_connect(addr: SocketAddr, data: &[u8]) -> String {
    use rsrdma::cm::{CmId, ConnParam};
    use rsrdma::{Cq, Pd, Qp, QpType};
    let t = Duration::from_secs(5);
    let id = CmId::new().unwrap();
    id.resolve_addr(None, addr, t).unwrap();
    id.resolve_route(t).unwrap();
    let ctx = id.context().unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 4, None).unwrap();
    let _qp = id
        .create_qp(&pd, &Qp::builder(QpType::Rc), &cq, &cq)
        .unwrap();
    let e = id
        .connect(&ConnParam::default().with_private_data(data.to_vec()), t)
        .unwrap_err();
    format!("{e}: {:?}", String::from_utf8_lossy(&rejected_data(&e)))
}

fn rejected_data(e: &rsrdma::Error) -> Vec<u8> {
    match e {
        rsrdma::Error::CmEvent { private_data, .. } => private_data.clone(),
        _ => Vec::new(),
    }
}

/// The peer of the death tests, run only as a child process: dials, says "up", then
/// idles (never calling in) until killed.
#[test]
#[ignore = "runs as the child process of peer_death_is_detected_on_a_receive_only_side"]
fn conn_child_peer() {
    let spec = std::env::var(CHILD_ENV).unwrap();
    let (path, addr) = spec.split_once(' ').unwrap();
    let path = if path == "cm" {
        Establish::Cm
    } else {
        Establish::Tcp
    };
    let c = Conn::dial(addr, opts(path)).unwrap();
    println!("up");
    thread::sleep(Duration::from_secs(60));
    drop(c);
}

/// Dials a child peer and returns the accepted side and the child.
fn child_peer(path: Establish, server: ConnOptions) -> (Conn, std::process::Child) {
    let l = listen(server);
    let tag = if path == Establish::Cm { "cm" } else { "tcp" };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "conn_child_peer", "--ignored", "--nocapture"])
        .env(CHILD_ENV, format!("{tag} {}", l.local_addr()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let s = l.accept_timeout(Duration::from_secs(20)).unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 256];
    let t0 = Instant::now();
    let mut seen = String::new();
    while !seen.contains("up") && t0.elapsed() < Duration::from_secs(20) {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "the child exited: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    (s, child)
}

fn signal(child: &std::process::Child, sig: libc::c_int) {
    // SAFETY: plain syscall on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

#[test]
fn peer_death_is_detected_on_a_receive_only_side() {
    // A peer that hangs (stopped): only the keepalive can tell, within the peer timeout.
    for path in [Establish::Tcp, Establish::Cm] {
        let server = opts(path)
            .keepalive(Duration::from_millis(250))
            .peer_timeout(Duration::from_millis(1500));
        let (s, mut child) = child_peer(path, server);
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        signal(&child, libc::SIGSTOP);
        let t0 = Instant::now();
        let e = s.recv_msg().unwrap_err();
        let took = t0.elapsed();
        signal(&child, libc::SIGKILL);
        let _ = child.wait();
        eprintln!("{path:?}: a hung peer detected after {took:?}");
        assert!(matches!(e, NetError::ConnFailed(_)), "{path:?}: {e}");
        assert!(
            took >= Duration::from_millis(1000) && took < Duration::from_millis(2500),
            "{path:?}: {took:?}"
        );
    }
    // A peer that dies: its kernel closes the TCP channel or disconnects the rdma_cm id.
    for path in [Establish::Tcp, Establish::Cm] {
        let (s, mut child) = child_peer(path, opts(path));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        signal(&child, libc::SIGKILL);
        let t0 = Instant::now();
        let e = s.recv_msg().unwrap_err();
        let took = t0.elapsed();
        let _ = child.wait();
        eprintln!("{path:?}: a killed peer detected after {took:?}");
        assert!(matches!(e, NetError::ConnFailed(_)), "{path:?}: {e}");
        assert!(took < Duration::from_secs(5), "{path:?}: {took:?}");
    }
}

/// utime + stime of this process, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn an_idle_connection_uses_no_cpu() {
    for mode in [PollMode::Event, PollMode::default()] {
        let (c, s) = pair(
            opts(Establish::Cm).poll_mode(mode),
            opts(Establish::Cm).poll_mode(mode),
        );
        c.send_msg(b"warm").unwrap();
        assert_eq!(s.recv_msg().unwrap().unwrap(), b"warm");
        let before = cpu_ticks();
        thread::sleep(Duration::from_secs(2));
        let used = cpu_ticks() - before;
        eprintln!("{mode:?}: an idle pair used {used} ticks in 2 s");
        // A spinning thread would use about 200 ticks; keepalives cost a few wake-ups.
        assert!(used <= 10, "{mode:?}: {used} ticks");
        c.send_msg(b"after idling").unwrap();
        assert_eq!(s.recv_msg().unwrap().unwrap(), b"after idling");
    }
}
