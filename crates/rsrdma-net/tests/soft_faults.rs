//! Conn's failure paths reached on purpose and at once, with soft0's fault injection
//! (`rsrdma::soft_faults`): a queue pair's fatal error, a link cut under a stream, receives
//! refused (RNR) and completions held back. Both ends live in this process, over the TCP
//! handshake, so no RDMA stack is needed; the tests run in the host's unit-test stage.

use rsrdma::soft_faults;
use rsrdma_net::{Conn, ConnOptions, Establish, Listener, NetError};
use std::thread;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

fn opts() -> ConnOptions {
    ConnOptions::default()
        .device("soft0")
        .establish(Establish::Tcp)
        .keepalive(Some(Duration::from_millis(100)))
        .peer_timeout(Duration::from_millis(800))
}

/// A striped pair of `rails` rails (dialer, listener's side) on the TCP handshake (this
/// binary also runs where soft0's rdma_cm is off); the listener's side reads with [`WAIT`].
fn rail_pair(rails: usize) -> (rsrdma_net::RailConn, rsrdma_net::RailConn) {
    use rsrdma_net::{RailConn, RailListener, RailOptions};
    let o = RailOptions::new(opts(), rails);
    let l = RailListener::bind("127.0.0.1:0", o.clone()).unwrap();
    let addr = l.local_addr();
    let server = thread::spawn(move || l.accept().unwrap());
    let rc = RailConn::dial(addr, o).unwrap();
    let rs = server.join().unwrap();
    rs.set_read_timeout(Some(WAIT)).unwrap();
    (rc, rs)
}

/// A connected pair (client, server).
fn pair(o: ConnOptions) -> (Conn, Conn) {
    pair_with(o.clone(), o)
}

/// A connected pair (client, server) of a dialer with `client` and a listener with `server`.
fn pair_with(client: ConnOptions, server: ConnOptions) -> (Conn, Conn) {
    let l = Listener::bind("127.0.0.1:0", server).unwrap();
    let addr = l.local_addr();
    let server = thread::spawn(move || l.accept().unwrap());
    let c = Conn::dial(addr, client).unwrap();
    let s = server.join().unwrap();
    for x in [&c, &s] {
        x.set_read_timeout(Some(WAIT)).unwrap();
        x.set_write_timeout(Some(WAIT)).unwrap();
    }
    (c, s)
}

fn msg(k: usize) -> Vec<u8> {
    (0..100 + (k * 997) % 5000)
        .map(|i| (i * 7 + k) as u8)
        .collect()
}

#[test]
fn a_fatal_queue_pair_error_fails_its_connection_and_the_peer_learns_within_its_timeout() {
    let (c, s) = pair(opts());
    c.send_msg(b"before").unwrap();
    assert_eq!(s.recv_msg().unwrap().as_deref(), Some(&b"before"[..]));
    soft_faults::fail_qp(c.info().local_qpn).unwrap();
    // The failed side: its next operation fails at once, with no hang.
    let t0 = Instant::now();
    let e = c.send_msg(b"after").and_then(|()| c.recv_msg().map(drop));
    assert!(e.is_err(), "an operation on a failed QP succeeded");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // The peer hears nothing more: its peer timeout declares the other end dead.
    let t0 = Instant::now();
    let e = s.recv_msg().unwrap_err();
    assert!(matches!(e, NetError::ConnFailed(_)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn a_link_cut_under_a_stream_fails_the_sender_and_loses_nothing_it_reported_sent() {
    let (c, s) = pair(opts());
    let reader = thread::spawn(move || {
        let mut got = Vec::new();
        loop {
            match s.recv_msg() {
                Ok(Some(m)) => got.push(m),
                Ok(None) | Err(_) => return got,
            }
        }
    });
    let mut sent = 0;
    let mut failed = None;
    for k in 0..2000 {
        if k == 200 {
            soft_faults::cut_link(c.info().local_qpn).unwrap();
        }
        match c.send_msg(&msg(k)) {
            Ok(()) => sent += 1,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let e = failed.expect("sends went on after the link was cut");
    assert!(matches!(e, NetError::ConnFailed(_)), "{e}");
    drop(c);
    let got = reader.join().unwrap();
    // What arrived is a prefix of what was sent, each message whole and in order; `Ok`
    // promised delivery only for messages the peer's side took before the cut.
    assert!(
        got.len() <= sent,
        "{} arrived, {sent} reported sent",
        got.len()
    );
    for (k, m) in got.iter().enumerate() {
        assert_eq!(m, &msg(k), "message {k}");
    }
    assert!(
        got.len() >= 100,
        "only {} of the first 200 arrived",
        got.len()
    );
}

#[test]
fn refused_receives_are_retried_and_nothing_is_lost_or_reordered() {
    // RNR waits hold the sender's later frames (keepalives too) behind the refused one: the
    // default peer timeout, not the short one of the other tests.
    let (c, s) = pair(opts().peer_timeout(Duration::from_secs(5)));
    // The first SEND meets two RNR NAKs (the peer "had no receive" yet): within the
    // connection's RNR retries, so it goes again after the timer, twice.
    soft_faults::refuse_receives(s.info().local_qpn, 2).unwrap();
    let writer = thread::spawn(move || {
        for k in 0..100 {
            c.send_msg(&msg(k)).unwrap();
        }
        c.shutdown(std::net::Shutdown::Write).unwrap();
        c
    });
    for k in 0..100 {
        // Once more mid-stream (the first two were spent long before message 50 arrived).
        if k == 50 {
            soft_faults::refuse_receives(s.info().local_qpn, 2).unwrap();
        }
        assert_eq!(s.recv_msg().unwrap().unwrap(), msg(k), "message {k}");
    }
    assert_eq!(s.recv_msg().unwrap(), None);
    let c = writer.join().unwrap();
    s.close().unwrap();
    c.close().unwrap();
}

#[test]
fn a_peer_that_posts_no_receive_fails_the_connection_instead_of_hanging_it() {
    let (c, s) = pair(opts());
    // More refusals in a row than the connection retries (RNR_RETRY_EXC_ERR).
    soft_faults::refuse_receives(s.info().local_qpn, 1000).unwrap();
    let t0 = Instant::now();
    let e = (0..1000)
        .map(|k| c.send_msg(&msg(k)))
        .find_map(Result::err)
        .expect("every send succeeded against a peer that took none");
    assert!(matches!(e, NetError::ConnFailed(_)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    drop(s);
}

#[test]
fn held_back_completions_delay_but_lose_or_reorder_nothing() {
    let (c, s) = pair(opts());
    // The server's completions (its receives, its credit returns) reach it 30 ms late.
    soft_faults::delay_completions(s.info().local_qpn, Duration::from_millis(30)).unwrap();
    let echo = thread::spawn(move || {
        while let Some(m) = s.recv_msg().unwrap() {
            s.send_msg(&m).unwrap();
        }
        s.close().unwrap();
    });
    for k in 0..40 {
        c.send_msg(&msg(k)).unwrap();
        assert_eq!(c.recv_msg().unwrap().unwrap(), msg(k), "message {k}");
    }
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(c.recv_msg().unwrap(), None);
    echo.join().unwrap();
    c.close().unwrap();
}

/// A peer's clean close whose messages and FIN complete late at the receiver (its
/// completions 300 ms late, past the 200 ms a transport's end once gave the FIN to surface):
/// the close says `Ok`, and the receiver reads every message, then the end. (It read none,
/// then `ConnFailed(Disconnected)`: an outside tester's find.) Then the same with the peer
/// gone without a FIN (the link cut under it): the messages that landed, then the failure.
#[test]
fn a_clean_close_whose_completions_come_late_at_the_receiver_loses_nothing() {
    // On its own receive slots, and on a listener's shared receive pool (whose receives the
    // QP's flush does not complete: the 200 ms grace stayed there, and a third tester lost
    // the tail of a clean close to it).
    let pooled = opts().shared_recv(rsrdma_net::SharedRecv::new(8));
    for (client, server) in [(opts(), opts()), (opts(), pooled)] {
        let (c, s) = pair_with(client, server);
        soft_faults::delay_completions(s.info().local_qpn, Duration::from_millis(300)).unwrap();
        // Read as they come: unread messages would hold the pool's slots.
        let reader = thread::spawn(move || {
            let mut got = Vec::new();
            let end = loop {
                match s.recv_msg() {
                    Ok(Some(m)) => got.push(m),
                    other => break other.map(|_| ()),
                }
            };
            (got, end)
        });
        for k in 0..10 {
            c.send_msg(&msg(k)).unwrap();
        }
        c.close().unwrap();
        let (got, end) = reader.join().unwrap();
        let want: Vec<_> = (0..10).map(msg).collect();
        assert!(got == want, "{} of 10 messages, then {end:?}", got.len());
        assert!(end.is_ok(), "the end of the stream, not {end:?}");
    }

    let (c, s) = pair(opts());
    soft_faults::delay_completions(s.info().local_qpn, Duration::from_millis(300)).unwrap();
    for k in 0..3 {
        c.send_msg(&msg(k)).unwrap();
    }
    // Every message delivered, then the sender gone without its FIN.
    thread::sleep(Duration::from_millis(50));
    soft_faults::cut_link(c.info().local_qpn).unwrap();
    drop(c);
    for k in 0..3 {
        assert_eq!(s.recv_msg().unwrap().unwrap(), msg(k), "message {k}");
    }
    let e = s.recv_msg().unwrap_err();
    assert!(matches!(e, NetError::ConnFailed(_)), "{e}");
}

/// A striped connection's close ends its rails at once, not one after another: with every
/// rail's completions 300 ms late, 8 rails took 3.9 s to close (16 rails 6.7 s; a linger of
/// 2 s), each rail waiting out its own FIN and flush (an outside tester's find). Now about
/// one rail's worth; and the reader gets every message, then the end.
#[test]
fn a_striped_close_ends_its_rails_at_once() {
    let (rc, rs) = rail_pair(8);
    for r in 0..rc.rails() {
        let qpn = rc.rail(r).unwrap().info().local_qpn;
        soft_faults::delay_completions(qpn, Duration::from_millis(300)).unwrap();
    }
    let reader = thread::spawn(move || {
        let mut n = 0;
        let end = loop {
            match rs.recv_msg() {
                Ok(Some(m)) => {
                    assert_eq!(m, msg(n), "message {n}");
                    n += 1;
                }
                other => break other.map(|_| ()),
            }
        };
        (n, end)
    });
    for k in 0..12 {
        rc.send_msg(&msg(k)).unwrap();
    }
    let started = Instant::now();
    let closed = rc.close();
    let took = started.elapsed();
    let (n, end) = reader.join().unwrap();
    assert_eq!((n, end.is_ok()), (12, true), "{end:?}");
    assert!(closed.is_ok(), "{closed:?}");
    assert!(took < Duration::from_secs(3), "the close took {took:?}");
}

#[test]
fn faults_name_queue_pairs_of_soft0_only() {
    let e = soft_faults::fail_qp(0xff_fff0).unwrap_err();
    assert!(e.to_string().contains("no queue pair numbered"), "{e}");
}

/// The child of the environment-variable tests: a pair in this process, under whatever
/// `RSRDMA_SOFT_FAULTS` its parent set; streams until an operation fails and says when.
#[test]
#[ignore = "runs as the child of faults_from_the_environment_reach_every_queue_pair"]
fn env_faults_child() {
    let t0 = Instant::now();
    let (c, s) = match Listener::bind("127.0.0.1:0", opts()) {
        Ok(l) => {
            let addr = l.local_addr();
            let server = thread::spawn(move || l.accept());
            match Conn::dial(addr, opts()) {
                Ok(c) => (c, server.join().unwrap().unwrap()),
                Err(e) => {
                    println!("refused: {e}");
                    return;
                }
            }
        }
        Err(e) => {
            println!("refused: {e}");
            return;
        }
    };
    let reader = thread::spawn(move || while let Ok(Some(_)) = s.recv_msg() {});
    let stream_for = std::env::var("CHILD_STREAM_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(WAIT, Duration::from_millis);
    for k in 0.. {
        if let Err(e) = c.send_msg(&msg(k)) {
            println!("failed after {} ms: {e}", t0.elapsed().as_millis());
            break;
        }
        if t0.elapsed() > stream_for {
            println!("still sending");
            break;
        }
    }
    drop(c);
    let _ = reader.join();
}

fn run_child(faults: &str) -> String {
    run_child_with(faults, &[])
}

/// [`run_child`] with more of the environment set.
fn run_child_with(faults: &str, env: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "env_faults_child", "--ignored", "--nocapture"])
        .envs(env.iter().copied())
        .env(rsrdma::soft_faults::ENV, faults)
        .env("CHILD_STREAM_MS", "1500")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the child failed:\n{text}");
    text
}

#[test]
fn faults_from_the_environment_reach_every_queue_pair() {
    assert_eq!(rsrdma::soft_faults::ENV, "RSRDMA_SOFT_FAULTS");
    // The peer vanishes 400 ms after the queue pairs were made: the stream fails then.
    let out = run_child("cut_after=400ms");
    let ms: u64 = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("failed after ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the stream did not fail:\n{out}"));
    assert!((300..10_000).contains(&ms), "failed after {ms} ms:\n{out}");
    // A fatal error instead.
    let out = run_child("fail_after=300ms");
    assert!(out.contains("failed after "), "{out}");
    // Completions held back and receives refused only slow it down.
    let out = run_child("delay=1ms,refuse=2");
    assert!(out.contains("still sending"), "{out}");
    // A fault soft0 cannot read refuses the device: never silently left out.
    let out = run_child("explode=1s");
    assert!(
        out.contains("refused: ")
            && out.contains("RSRDMA_SOFT_FAULTS")
            && out.contains("unknown fault"),
        "{out}"
    );
    // And a value that is not UTF-8 (it was taken as unset: an outside tester's find).
    let out = {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(b"cut_after=0s\xff");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "env_faults_child", "--ignored", "--nocapture"])
            .env(rsrdma::soft_faults::ENV, bad)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        out.contains("refused: ") && out.contains("not UTF-8"),
        "{out}"
    );
    // So does an address it cannot read, and the error names the variable (an outside
    // tester's find: it said only "Invalid argument (os error 22)").
    for bad in ["bogus", "127.0.0.1:99999"] {
        let out = run_child_with("", &[("RSRDMA_SOFT_ADDR", bad)]);
        assert!(
            out.contains("refused: ") && out.contains(&format!("RSRDMA_SOFT_ADDR=\"{bad}\"")),
            "{bad}: {out}"
        );
    }
}

/// F6: a device that reports a fatal error (`IBV_EVENT_DEVICE_FATAL`) fails the connections
/// on it within about a keepalive interval, though its queues (here) go on working: the
/// event is the only sign a dead device may give, and the connections read it without a
/// thread. With default options, as a user runs; the reader waits with no traffic at all.
#[test]
fn a_fatal_device_event_fails_its_connections_promptly() {
    let o = ConnOptions::default()
        .device("soft0")
        .establish(Establish::Tcp);
    let (c, s) = pair(o);
    c.send_msg(b"before").unwrap();
    assert_eq!(s.recv_msg().unwrap().as_deref(), Some(&b"before"[..]));
    soft_faults::fail_device(c.info().local_qpn).unwrap();
    let t0 = Instant::now();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let e = c.recv_msg().unwrap_err();
    assert!(matches!(e, NetError::ConnFailed(_)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(c.send_msg(b"after").is_err());
    // The peer's device is well: it learns that the other end is gone by its own means.
    drop(c);
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    assert!(s.recv_msg().map_or(true, |m| m.is_none()));
}

#[test]
fn a_rails_port_going_down_takes_the_rail_out_and_a_plain_conn_waits() {
    // A plain connection whose port goes down only logs it: its queues still work here.
    let (c, s) = pair(opts());
    soft_faults::port_down(c.info().local_qpn).unwrap();
    thread::sleep(Duration::from_millis(600));
    c.send_msg(b"still here").unwrap();
    assert_eq!(s.recv_msg().unwrap().as_deref(), Some(&b"still here"[..]));
    soft_faults::port_up(c.info().local_qpn).unwrap();
    // A striped connection takes the rail on that port out at once; its stripes go on.
    let (rc, rs) = rail_pair(2);
    let rail1 = rc.rail(1).unwrap().info().local_qpn;
    let t0 = Instant::now();
    soft_faults::port_down(rail1).unwrap();
    for k in 0..200 {
        rc.send_msg(&msg(k)).unwrap();
        assert!(rs.recv_msg().unwrap().unwrap() == msg(k), "message {k}");
        if rc.live_rails() == 1 {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(rc.live_rails(), 1, "the rail on the downed port is out");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    for k in 200..260 {
        rc.send_msg(&msg(k)).unwrap();
        assert!(rs.recv_msg().unwrap().unwrap() == msg(k), "message {k}");
    }
    assert_eq!(rc.counters().rails_failed, 1);
    rc.close().unwrap();
    assert_eq!(rs.recv_msg().unwrap(), None);
    rs.close().unwrap();
}

/// A UD endpoint whose queue pair fails says so in both directions: a receive returns the
/// flushed completion's error within moments (it timed out on every call, or blocked for
/// ever without a read timeout), and once a send failed every later send fails (they
/// alternated Ok and Err, each Ok a datagram flushed unsent).
#[test]
fn a_failed_ud_queue_pair_is_an_error_both_ways() {
    use rsrdma_net::packet::{PacketConn, PacketOptions};
    let o = || {
        PacketOptions::default()
            .device("soft0")
            .read_timeout(Duration::from_secs(5))
    };
    let (a, b) = (
        PacketConn::bind(o()).unwrap(),
        PacketConn::bind(o()).unwrap(),
    );
    a.send_to(b"before", &b.local_addr()).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(b.recv_from(&mut buf).unwrap().0, 6);
    soft_faults::fail_qp(b.local_addr().qpn).unwrap();
    let t0 = Instant::now();
    let e = b.recv_from(&mut buf).unwrap_err();
    assert!(!matches!(e, NetError::Timeout { .. }), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // The first send after the fault is flushed; flush waits for its completion.
    let _ = b.send_to(b"x", &a.local_addr());
    assert!(b.flush(Duration::from_secs(2)).is_err());
    let sent: Vec<bool> = (0..3)
        .map(|_| b.send_to(b"x", &a.local_addr()).is_ok())
        .collect();
    assert_eq!(sent, [false; 3]);
}

/// A striped connection whose sender loses a rail on its side only (its queue pair fails;
/// the receiver learns nothing until that rail's keepalive gives up, 5 s by default): the
/// confirmations the receiver sends on that rail are lost with it while the sender's window
/// is full. The sender sends again what the lost rail carried unconfirmed; the receiver,
/// finding it has those already, confirms again (on the next rail), so no send waits for
/// the dead rail's keepalive, and nothing is lost.
#[test]
fn a_rail_lost_on_the_senders_side_only_does_not_stall_the_stream() {
    use rsrdma_net::{RailConn, RailListener, RailOptions};
    let o = RailOptions::new(
        ConnOptions::default()
            .device("soft0")
            .establish(Establish::Tcp),
        2,
    );
    let l = RailListener::bind("127.0.0.1:0", o.clone()).unwrap();
    let addr = l.local_addr();
    let t = thread::spawn(move || l.accept_timeout(WAIT).unwrap());
    let c = RailConn::dial(addr, o).unwrap();
    let s = t.join().unwrap();
    let len = 256 * 1024;
    let count = 300u64;
    let reader = thread::spawn(move || {
        s.set_read_timeout(Some(WAIT)).unwrap();
        for i in 0..count {
            let m = s.recv_msg().unwrap().expect("a message");
            assert!(m.len() == len && m[..8] == i.to_le_bytes(), "message {i}");
        }
        assert_eq!(s.recv_msg().unwrap(), None);
    });
    c.set_write_timeout(Some(WAIT)).unwrap();
    let mut slowest = Duration::ZERO;
    let mut m = vec![7u8; len];
    for i in 0..count {
        if i == count / 3 {
            soft_faults::fail_qp(c.rail(1).unwrap().info().local_qpn).unwrap();
        }
        m[..8].copy_from_slice(&i.to_le_bytes());
        let t0 = Instant::now();
        c.send_msg(&m).unwrap();
        if i >= count / 3 {
            slowest = slowest.max(t0.elapsed());
        }
    }
    c.close().unwrap();
    reader.join().unwrap();
    assert!(
        slowest < Duration::from_secs(2),
        "a send after the rail failed waited {slowest:?}"
    );
}

/// A large reply (rendezvous) that the peer reads whole and then closes at once succeeds,
/// promptly. Its window's invalidation completes only after the transport's end, which made
/// the sender ignore that completion: `send_msg` waited out the 10 s grace and failed the
/// connection, though the peer had the message (an outside tester's echo server, 1 to 2 in
/// 300 connections under load; here the server's completions are held back so that the peer's
/// DONE, FIN and teardown all come before it looks).
#[test]
fn a_large_reply_read_whole_by_a_peer_that_closes_at_once_succeeds() {
    let (c, s) = pair(opts());
    let big = vec![7u8; 1 << 20];
    let server = thread::spawn(move || {
        soft_faults::delay_completions(s.info().local_qpn, Duration::from_millis(100)).unwrap();
        let t0 = Instant::now();
        let sent = s.send_msg(&big);
        (sent, t0.elapsed(), s)
    });
    let got = c.recv_msg().unwrap().expect("the reply");
    assert_eq!(got.len(), 1 << 20);
    c.close().unwrap();
    let (sent, took, s) = server.join().unwrap();
    assert!(
        sent.is_ok(),
        "the peer read it whole, yet: {sent:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // What the peer sent before it left still reads to its end.
    assert_eq!(s.recv_msg().unwrap(), None);
}

/// A large message the peer left unread, unanswered (its close ran out of linger before its
/// driver saw the offer), ends its `send_msg` with `PeerGone` at once, its memory cut off.
/// It once waited out the 10 s grace and failed the connection (an outside tester: 9 of 200
/// connections of a client that sent a request and closed without reading the reply). Here
/// the client's completions are held back past its linger, so its driver never sees the
/// offer.
#[test]
fn a_large_message_a_closing_peer_left_unanswered_fails_at_once() {
    let l = Listener::bind("127.0.0.1:0", opts()).unwrap();
    let addr = l.local_addr();
    let accepted = thread::spawn(move || l.accept().unwrap());
    let c = Conn::dial(addr, opts().linger(Duration::from_millis(50))).unwrap();
    let s = accepted.join().unwrap();
    s.set_write_timeout(Some(WAIT)).unwrap();
    soft_faults::delay_completions(c.info().local_qpn, Duration::from_millis(150)).unwrap();
    let server = thread::spawn(move || {
        let t0 = Instant::now();
        let sent = s.send_msg(&vec![9u8; 1 << 20]);
        (sent, t0.elapsed())
    });
    thread::sleep(Duration::from_millis(20));
    let _ = c.close();
    let (sent, took) = server.join().unwrap();
    assert!(
        matches!(sent, Err(NetError::PeerGone { .. }) | Ok(())),
        "{sent:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{sent:?} after {took:?}");
}

/// `recv_msg_into` keeps to its read timeout while a large (rendezvous) message's READ lands
/// slowly, and the connection stays usable: the message comes whole to a later read (an
/// outside tester's find: a READ straight into the caller's slice had to end before the call
/// returned, so a 20 ms read waited for it, up to 10 s, and then failed the connection).
/// Completions of the reader's queue pair are held back 600 ms each.
#[test]
fn a_timed_out_recv_msg_into_leaves_a_slow_rendezvous_read_to_the_next_read() {
    let o = ConnOptions::default()
        .device("soft0")
        .establish(Establish::Tcp);
    let (c, s) = pair(o);
    let big: Vec<u8> = (0..4usize << 20).map(|i| (i * 31 + 7) as u8).collect();
    soft_faults::delay_completions(s.info().local_qpn, Duration::from_millis(600)).unwrap();
    let sent = big.clone();
    let sender = thread::spawn(move || c.send_msg(&sent).map(|()| c));
    let limit = Duration::from_millis(50);
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = vec![0u8; big.len()];
    let (t0, mut timeouts) = (Instant::now(), 0);
    let n = loop {
        assert!(t0.elapsed() < WAIT, "nothing arrived in {WAIT:?}");
        let t = Instant::now();
        let r = s.recv_msg_into(&mut buf);
        let took = t.elapsed();
        assert!(
            took < limit + Duration::from_millis(450),
            "a {limit:?} read took {took:?}: {r:?}"
        );
        match r {
            Ok(Some(n)) => break n,
            // It names the caller's timeout (it said 0 ms when a first wait used it up).
            Err(NetError::Timeout { millis, .. }) => {
                assert_eq!(millis, 50, "{r:?}");
                timeouts += 1
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(n, big.len());
    assert!(buf == big, "the message arrived whole");
    assert!(timeouts > 0, "the read never waited");
    let c = sender.join().unwrap().unwrap();
    // Still usable both ways.
    s.set_read_timeout(Some(WAIT)).unwrap();
    c.send_msg(b"after").unwrap();
    assert_eq!(s.recv_msg().unwrap().as_deref(), Some(&b"after"[..]));
}

/// A striped connection whose rails all fail reports the failure after every message its
/// rails received whole, and then for good: no message after the error (an outside
/// tester's find, 2 of 21 runs: a read said ConnFailed, and the next one returned a message
/// that a failed rail's reader handed over late). Every rail of the reader's side fails
/// (or the writer's) while 1 MiB messages stream; the runs repeat because the race is
/// narrow (here it did not show in 54 runs without the fix: what holds for certain is that
/// no message follows the error).
#[test]
fn a_failed_striped_connection_reports_its_failure_after_every_message_and_for_good() {
    let big = |k: usize| -> Vec<u8> { (0..1 << 20).map(|i| (i * 13 + k) as u8).collect() };
    for run in 0..4 {
        let (rc, rs) = rail_pair(2);
        rc.set_write_timeout(Some(WAIT)).unwrap();
        let writer_rails: Vec<u32> = (0..2)
            .map(|r| rc.rail(r).unwrap().info().local_qpn)
            .collect();
        let writer = thread::spawn(move || {
            let mut k = 0;
            while rc.send_msg(&big(k)).is_ok() {
                k += 1;
            }
        });
        let mut k = 0;
        let first_error = loop {
            match rs.recv_msg() {
                Ok(Some(m)) => {
                    assert!(m == big(k), "run {run}: message {k}");
                    k += 1;
                }
                Ok(None) => panic!("run {run}: end of stream"),
                Err(e) => break e,
            }
            // Alternate runs fail the reader's rails and the writer's.
            if k == 12 {
                for (r, &writer_rail) in writer_rails.iter().enumerate() {
                    let qpn = match run % 2 {
                        0 => rs.rail(r).unwrap().info().local_qpn,
                        _ => writer_rail,
                    };
                    soft_faults::fail_qp(qpn).unwrap();
                }
            }
        };
        assert!(
            matches!(first_error, NetError::ConnFailed(_)),
            "run {run}: {first_error:?}"
        );
        for _ in 0..3 {
            let r = rs.recv_msg();
            assert!(
                matches!(r, Err(NetError::ConnFailed(_))),
                "run {run}: after the error, message {k}: {:?}",
                r.map(|m| m.map(|m| m.len()))
            );
        }
        writer.join().unwrap();
    }
}

/// The child processes of [`a_cm_listener_whose_queue_pair_fails_says_why`]: a listener on
/// rdma_cm (`RSRDMA_CM_CHILD=listen`), or a dialer of the address that follows `dial `.
#[test]
#[ignore = "runs as a child of a_cm_listener_whose_queue_pair_fails_says_why"]
fn cm_child() {
    use std::io::Write;
    let o = opts().establish(Establish::Cm);
    match std::env::var("RSRDMA_CM_CHILD")
        .unwrap_or_default()
        .as_str()
    {
        bind if bind.starts_with("bind ") => match Listener::bind(&bind["bind ".len()..], o) {
            Ok(l) => println!("BOUND {}", l.local_addr()),
            Err(e) => println!("REFUSED {e}"),
        },
        "listen" => {
            let l = Listener::bind("127.0.0.1:0", o).unwrap();
            println!("LISTENING {}", l.local_addr());
            std::io::stdout().flush().unwrap();
            // Handshakes run while someone accepts; a failed one is not handed out.
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                let _ = l.accept_timeout(Duration::from_millis(200));
            }
        }
        dial => {
            let addr = dial.strip_prefix("dial ").expect("RSRDMA_CM_CHILD");
            // The listener's queue pair fails at once: at one step of the handshake or
            // another (a race), or only once connected. Every refusal is printed.
            for _ in 0..20 {
                match Conn::dial(addr, o.clone()) {
                    Ok(_) => println!("DIALED ok"),
                    Err(e) => println!("DIALED {e:?}"),
                }
            }
        }
    }
}

/// A listener on rdma_cm whose queue pair fails during the handshake (soft0's
/// `fail_after=0s`, which fails it before its accept brings it up in about half the dials)
/// refuses the dialer with the reason: it dropped the request's id, and
/// the dialer read "an rdma_cm reject that gives no reason: not an rsrdma listener, or one
/// that went away" (an outside tester's find). Two processes on soft0's CM.
#[test]
fn a_cm_listener_whose_queue_pair_fails_says_why() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let child = |mode: &str, faults: &str| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "cm_child", "--ignored", "--nocapture"])
            .env("RSRDMA_CM_CHILD", mode)
            .env("RSRDMA_SOFT_CM", "1")
            .env("RSRDMA_SOFT_DEVICE", "1")
            .env(rsrdma::soft_faults::ENV, faults)
            .stdout(Stdio::piped());
        c
    };
    let mut listener = child("listen", "fail_after=0s").spawn().unwrap();
    let mut lines = std::io::BufReader::new(listener.stdout.take().unwrap()).lines();
    let addr = lines
        .find_map(|l| l.ok()?.split("LISTENING ").nth(1).map(str::to_owned))
        .expect("the listener's address");
    let out = child(&format!("dial {addr}"), "").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = listener.kill();
    let _ = listener.wait();
    let refusals: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("DIALED ").nth(1))
        .filter(|d| *d != "ok")
        .collect();
    assert!(!refusals.is_empty(), "no dial was refused:\n{text}");
    for r in refusals {
        assert!(
            r.starts_with("PeerAborted(") && !r.contains("gives no reason"),
            "{r}"
        );
    }
}

/// An rdma_cm listener is refused at bind where soft0 cannot serve it, as the TCP path's is,
/// with the reason (outside testers' finds on two hosts): in a process whose soft0 did not
/// open (`RSRDMA_SOFT_ADDR` names a port another process holds; it bound, and its accept
/// never returned), and on an address of this host that is not soft0's (soft0 on loopback:
/// it bound, and its queue pairs told a peer on another host to send to that host's own
/// loopback).
#[test]
fn an_rdma_cm_listener_where_soft0_cannot_serve_is_refused_at_bind() {
    use std::process::Command;
    let bind = |at: &str, env: &[(&str, &str)]| {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "cm_child", "--ignored", "--nocapture"])
            .env("RSRDMA_CM_CHILD", format!("bind {at}"))
            .env("RSRDMA_SOFT_CM", "1")
            .env("RSRDMA_SOFT_DEVICE", "1")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = format!("127.0.0.1:{}", held.local_addr().unwrap().port());
    let out = bind("127.0.0.1:0", &[("RSRDMA_SOFT_ADDR", &taken)]);
    assert!(
        out.contains("REFUSED") && out.contains("its log says why"),
        "{out}"
    );
    let out = bind("0.0.0.0:0", &[("RSRDMA_SOFT_ADDR", &taken)]);
    assert!(out.contains("REFUSED"), "{out}");
    // The device is fine there: it binds.
    assert!(bind("127.0.0.1:0", &[]).contains("BOUND"));
    // This host's address on its route out (any interface but loopback), if it has one.
    let own = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").and_then(|()| u.local_addr()));
    match own {
        Ok(a) if !a.ip().is_loopback() => {
            let out = bind(&format!("{}:0", a.ip()), &[]);
            assert!(
                out.contains("REFUSED") && out.contains("is not an address of an RDMA device"),
                "{out}"
            );
        }
        other => println!("this host has no address but loopback ({other:?}): not checked"),
    }
}
