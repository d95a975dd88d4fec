//! Zero-copy on a real device (rxe0 in the VM): registered `Buffer`s both ways, rendezvous
//! (RDMA READ) for messages just below, at, just above and far above the threshold, hashed,
//! on both establishment paths; eager `send_buffer` below the threshold with no copy (two
//! SGEs per fragment: header slot + buffer) for sizes around the fragment boundary, shown by
//! the core's copy counter, and busy until its last completion; buffer misuse errors; a pool shared by connections on one
//! protection domain; the fallback to eager with a peer that does not offer rendezvous; and
//! close or abort with a rendezvous in flight. Every wait is bounded.

use rsrdma::Pd;
use rsrdma_net::{Buffer, BufferPool, Conn, ConnOptions, Establish, Listener, NetError};
use std::thread;
use std::time::{Duration, Instant};

mod support;
use support::{assert_close_told_the_truth, device, hash_of as hash, listen_addr, opts, pattern};

/// A small threshold keeps the emulated VM fast while every case still crosses it.
const T: usize = 64 * 1024;

fn zc(path: Establish) -> ConnOptions {
    opts(path).rendezvous(Some(T as u32))
}

/// (dialer, acceptor), both with read and write timeouts, so no call can hang.
fn pair(client: ConnOptions, server: ConnOptions) -> (Conn, Conn) {
    let l = Listener::bind(listen_addr(&server), server).unwrap();
    let addr = l.local_addr();
    let t = thread::spawn(move || l.accept_timeout(Duration::from_secs(20)).unwrap());
    let c = Conn::dial(addr, client).unwrap();
    let s = t.join().unwrap();
    for x in [&c, &s] {
        x.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        x.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    (c, s)
}

fn frames_sent(c: &Conn) -> u64 {
    c.counters().unwrap().frames_sent
}

fn copied(c: &Conn) -> u64 {
    c.counters().unwrap().send_copied_bytes
}

fn filled(c: &Conn, len: usize, seed: u64) -> Buffer {
    let mut b = c.alloc_buffer(len).unwrap();
    b.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(len, seed));
    b
}

/// Sizes around and far above the threshold, every combination of buffer and slice on
/// both ends, with the frames each message cost (1 RTS by rendezvous, ⌈len/32 KiB⌉ eager).
fn both_ways(path: Establish) {
    let (c, s) = pair(zc(path), zc(path));
    assert_eq!(c.info().settled.rendezvous(), Some(T as u32));
    let sizes = [T - 1, T, T + 1, 4 * T, 3 << 20];
    let mut rbuf = s.alloc_buffer(3 << 20).unwrap();
    let mut slice = vec![0u8; 3 << 20];
    for (i, &len) in sizes.iter().enumerate() {
        let want = pattern(len, i as u64);
        let h = hash(&want);
        let rdv = len >= T;
        for way in 0..4 {
            let before = frames_sent(&c);
            let got = thread::scope(|sc| {
                let rx = sc.spawn(|| match way {
                    0 => {
                        let n = s.recv_buffer(&mut rbuf).unwrap().unwrap();
                        hash(&rbuf.as_slice().unwrap()[..n])
                    }
                    1 => hash(&s.recv_msg().unwrap().unwrap()),
                    2 => {
                        let n = s.recv_buffer(&mut rbuf).unwrap().unwrap();
                        hash(&rbuf.as_slice().unwrap()[..n])
                    }
                    _ => {
                        let n = s.recv_msg_into(&mut slice).unwrap().unwrap();
                        hash(&slice[..n])
                    }
                });
                if way < 2 {
                    let b = filled(&c, len, i as u64);
                    c.send_buffer(&b, len).unwrap();
                    assert!(
                        !b.is_busy(),
                        "send_buffer returned with the buffer in flight"
                    );
                } else {
                    c.send_msg(&want).unwrap();
                }
                rx.join().unwrap()
            });
            assert_eq!(got, h, "{path:?}: {len} bytes, way {way}");
            // Every frame counts, a PING or CREDIT among them: rendezvous costs one RTS, so
            // fewer frames than the eager fragments would be.
            let frames = frames_sent(&c) - before;
            let eager_frames = len.div_ceil(32 * 1024) as u64;
            if rdv {
                assert!(
                    frames < eager_frames,
                    "{len} B by rendezvous cost {frames} frames"
                );
            } else {
                assert!(frames >= eager_frames, "{len} B eager cost {frames} frames");
            }
        }
    }
    assert_eq!(c.counters().unwrap().rendezvous_unreleased, 0);
    assert_eq!(s.counters().unwrap().reassembly_bytes, 0);
    c.close().unwrap();
    s.close().unwrap();
}

#[test]
fn zerocopy_both_ways_around_the_threshold_over_rdma_cm() {
    both_ways(Establish::Cm);
}

#[test]
fn zerocopy_both_ways_around_the_threshold_over_tcp_handshake() {
    both_ways(Establish::Tcp);
}

/// Eager `send_buffer` (default 256 KiB threshold) of sizes around the fragment boundary,
/// several fragments and just below the threshold: hashed, eager (one frame per fragment),
/// and not one payload byte copied into a send slot; `send_msg` of the same bytes does copy
/// (the counter can fail).
fn eager_buffers(path: Establish) {
    let (c, s) = pair(opts(path), opts(path));
    let threshold = c.info().settled.rendezvous().expect("rendezvous settled") as usize;
    let p = c.info().settled.frame_payload() as usize;
    let sizes = [0, 1, p - 1, p, p + 1, 3 * p + 7, threshold - 1];
    let mut rbuf = s.alloc_buffer(threshold).unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        let b = filled(&c, len.max(1), i as u64);
        let want = hash(&pattern(len.max(1), i as u64)[..len]);
        let (frames, copies) = (frames_sent(&c), copied(&c));
        let got = thread::scope(|sc| {
            let rx = sc.spawn(|| {
                if i % 2 == 0 {
                    let n = s.recv_buffer(&mut rbuf).unwrap().unwrap();
                    hash(&rbuf.as_slice().unwrap()[..n])
                } else {
                    hash(&s.recv_msg().unwrap().unwrap())
                }
            });
            c.send_buffer(&b, len).unwrap();
            assert!(
                !b.is_busy(),
                "send_buffer returned with the buffer in flight"
            );
            rx.join().unwrap()
        });
        assert_eq!(got, want, "{path:?}: {len} bytes");
        assert_eq!(
            copied(&c),
            copies,
            "{path:?}: send_buffer of {len} B copied"
        );
        let fragments = len.div_ceil(p).max(1) as u64;
        assert!(
            frames_sent(&c) - frames >= fragments,
            "{path:?}: {len} B went eagerly in {fragments} fragments"
        );
        assert_eq!(c.counters().unwrap().lent_unreleased, 0);
    }
    // The same bytes by send_msg are copied (so the counter above could have moved).
    let m = pattern(3 * p + 7, 1);
    let before = copied(&c);
    thread::scope(|sc| {
        let rx = sc.spawn(|| s.recv_msg().unwrap().unwrap());
        c.send_msg(&m).unwrap();
        assert_eq!(hash(&rx.join().unwrap()), hash(&m));
    });
    assert_eq!(copied(&c) - before, m.len() as u64);
    c.close().unwrap();
    s.close().unwrap();
}

#[test]
fn zerocopy_eager_send_buffer_copies_nothing_over_rdma_cm() {
    eager_buffers(Establish::Cm);
}

#[test]
fn zerocopy_eager_send_buffer_copies_nothing_over_tcp_handshake() {
    eager_buffers(Establish::Tcp);
}

/// Sends one-byte messages the reader leaves unread until no data credit is left, so that
/// the next message must wait in the core.
fn exhaust_credit(c: &Conn) -> usize {
    let mut sent = 0;
    loop {
        let k = c.counters().unwrap();
        if k.peer_limit - k.frames_sent <= 3 {
            return sent;
        }
        c.send_msg(&[sent as u8]).unwrap();
        sent += 1;
    }
}

#[test]
fn zerocopy_eager_buffer_is_busy_until_sent_and_released_by_close() {
    let server = opts(Establish::Cm).recv_slots(8);
    let (c, s) = pair(opts(Establish::Cm), server.clone());
    let p = c.info().settled.frame_payload() as usize;
    let len = 2 * p + 3;
    let mut b = filled(&c, len, 11);
    let small = exhaust_credit(&c);
    assert!(small > 0);
    // Queued without credit: in flight (the NIC will read it) until its last completion.
    c.start_send_buffer(&b, len).unwrap();
    assert!(b.is_busy());
    assert!(matches!(b.as_mut_slice(), Err(NetError::BufferBusy { .. })));
    assert!(matches!(b.as_slice(), Err(NetError::BufferBusy { .. })));
    assert!(matches!(
        c.start_send_buffer(&b, 10),
        Err(NetError::BufferBusy { .. })
    ));
    assert_eq!(c.counters().unwrap().lent_unreleased, 1);
    for i in 0..small {
        assert_eq!(s.recv_msg().unwrap().unwrap(), [i as u8]);
    }
    assert_eq!(
        hash(&s.recv_msg().unwrap().unwrap()),
        hash(&pattern(len, 11))
    );
    c.wait_buffer(&b).unwrap();
    assert!(!b.is_busy());
    b.as_mut_slice().unwrap()[0] ^= 1;
    assert_eq!(
        copied(&c),
        small as u64,
        "only the one-byte messages were copied"
    );
    c.close().unwrap();
    s.close().unwrap();

    // Closing with a lent message that can never go: the buffer comes back after the
    // teardown's flush, not before, and close does not hang.
    let (c, s) = pair(
        opts(Establish::Tcp).linger(Duration::from_millis(300)),
        server.establish(Establish::Tcp),
    );
    let b = filled(&c, len, 12);
    exhaust_credit(&c);
    c.start_send_buffer(&b, len).unwrap();
    assert!(b.is_busy());
    let t0 = Instant::now();
    let _ = c.close();
    assert!(t0.elapsed() < Duration::from_secs(5), "close hung");
    assert!(!b.is_busy(), "released after the teardown's flush");
    s.close().ok();
}

#[test]
fn zerocopy_stream_reads_get_rendezvous_messages_whole() {
    use std::io::Read;
    let (c, s) = pair(zc(Establish::Tcp), zc(Establish::Tcp));
    let msg = pattern(5 * T + 3, 9);
    let t = thread::spawn(move || {
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).unwrap();
        got
    });
    c.send_msg(&msg).unwrap();
    c.close().unwrap();
    assert_eq!(hash(&t.join().unwrap()), hash(&msg));
}

#[test]
fn zerocopy_timings_1_mib() {
    const N: usize = 8;
    let len = 1 << 20;
    let run = |o: ConnOptions, buffer: bool| {
        let (c, s) = pair(o.clone(), o);
        let b = filled(&c, len, 1);
        let m = pattern(len, 1);
        let mut rb = s.alloc_buffer(len).unwrap();
        let mut rs = vec![0u8; len];
        let t0 = Instant::now();
        thread::scope(|sc| {
            let rx = sc.spawn(|| {
                for _ in 0..N {
                    if buffer {
                        s.recv_buffer(&mut rb).unwrap().unwrap();
                    } else {
                        s.recv_msg_into(&mut rs).unwrap().unwrap();
                    }
                }
            });
            for _ in 0..N {
                if buffer {
                    c.send_buffer(&b, len).unwrap();
                } else {
                    c.send_msg(&m).unwrap();
                }
            }
            rx.join().unwrap();
        });
        t0.elapsed() / N as u32
    };
    let zero = run(zc(Establish::Cm), true);
    let rdv = run(zc(Establish::Cm), false);
    let eager = run(opts(Establish::Cm).rendezvous(None), false);
    eprintln!(
        "1 MiB per message (VM, {N} each): send_buffer→recv_buffer {zero:?}, \
         send_msg→recv_msg_into by rendezvous {rdv:?}, eager send_msg→recv_msg_into {eager:?}"
    );
}

#[test]
fn zerocopy_buffer_misuse_is_an_error() {
    let (c, s) = pair(zc(Establish::Cm), zc(Establish::Cm));
    let len = 2 * T;
    let mut b = filled(&c, len, 3);
    // Too long.
    assert!(matches!(
        c.send_buffer(&b, len + 1),
        Err(NetError::BadBuffer { .. })
    ));
    // Another connection's (another protection domain's) buffer.
    let foreign = s.alloc_buffer(len).unwrap();
    let e = c.send_buffer(&foreign, 10).unwrap_err();
    assert!(matches!(e, NetError::BadBuffer { .. }), "{e}");
    // In flight until the peer reads: no access, no second send.
    c.start_send_buffer(&b, len).unwrap();
    assert!(b.is_busy());
    assert!(matches!(b.as_mut_slice(), Err(NetError::BufferBusy { .. })));
    assert!(matches!(b.as_slice(), Err(NetError::BufferBusy { .. })));
    assert!(matches!(
        c.start_send_buffer(&b, len),
        Err(NetError::BufferBusy { .. })
    ));
    // A short receive buffer leaves the message queued.
    let mut small = s.alloc_buffer(len - 1).unwrap();
    match s.recv_buffer(&mut small) {
        Err(NetError::ShortBuffer { needed }) => assert_eq!(needed, len),
        other => panic!("{other:?}"),
    }
    let mut short_slice = vec![0u8; 100];
    assert!(matches!(
        s.recv_msg_into(&mut short_slice),
        Err(NetError::ShortBuffer { needed }) if needed == len
    ));
    // Dropping the buffer in flight frees nothing under the NIC: the peer still reads it.
    drop(b);
    let mut big = s.alloc_buffer(len).unwrap();
    let n = s.recv_buffer(&mut big).unwrap().unwrap();
    assert_eq!(hash(&big.as_slice().unwrap()[..n]), hash(&pattern(len, 3)));
    // An eager message into a short buffer stays queued too.
    c.send_msg(&pattern(1000, 4)).unwrap();
    let mut tiny = s.alloc_buffer(10).unwrap();
    assert!(matches!(
        s.recv_buffer(&mut tiny),
        Err(NetError::ShortBuffer { needed: 1000 })
    ));
    let n = s.recv_buffer(&mut big).unwrap().unwrap();
    assert_eq!(&big.as_slice().unwrap()[..n], &pattern(1000, 4)[..]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.counters().unwrap().rendezvous_unreleased > 0 {
        assert!(Instant::now() < deadline, "DONE never released the buffer");
        thread::sleep(Duration::from_millis(5));
    }
    c.close().unwrap();
    s.close().unwrap();
}

#[test]
fn zerocopy_pool_shared_by_connections_on_one_pd() {
    let ctx = rsrdma::open(&device()).unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let pool = BufferPool::new(&pd, 4 * T, 4).unwrap();
    let o = zc(Establish::Tcp).pd(Some(pd.clone()));
    let (c1, s1) = pair(o.clone(), zc(Establish::Tcp));
    let (c2, s2) = pair(o, zc(Establish::Tcp));
    let mut taken: Vec<Buffer> = (0..4).map(|_| pool.take().unwrap()).collect();
    assert!(pool.take().is_none(), "four buffers only");
    for (i, b) in taken.iter_mut().enumerate() {
        b.as_mut_slice()
            .unwrap()
            .copy_from_slice(&pattern(4 * T, i as u64));
    }
    for (i, b) in taken.iter().enumerate() {
        let (c, s) = if i % 2 == 0 { (&c1, &s1) } else { (&c2, &s2) };
        thread::scope(|sc| {
            let rx = sc.spawn(|| s.recv_msg().unwrap().unwrap());
            c.send_buffer(b, 4 * T).unwrap();
            assert_eq!(hash(&rx.join().unwrap()), hash(&pattern(4 * T, i as u64)));
        });
    }
    drop(taken);
    assert_eq!(pool.available(), 4, "buffers go back to the pool");
    for x in [c1, s1, c2, s2] {
        x.close().unwrap();
    }
}

#[test]
fn zerocopy_peer_without_rendezvous_gets_everything_eagerly() {
    let (c, s) = pair(zc(Establish::Cm), opts(Establish::Cm).rendezvous(None));
    assert_eq!(c.info().settled.rendezvous(), None);
    for len in [T - 1, T, 4 * T] {
        let b = filled(&c, len, 5);
        let before = frames_sent(&c);
        thread::scope(|sc| {
            let rx = sc.spawn(|| s.recv_msg().unwrap().unwrap());
            c.send_buffer(&b, len).unwrap();
            assert_eq!(hash(&rx.join().unwrap()), hash(&pattern(len, 5)));
        });
        assert!(frames_sent(&c) - before >= 2, "eager frames, not an RTS");
    }
    c.close().unwrap();
    s.close().unwrap();
}

#[test]
fn zerocopy_close_with_a_rendezvous_in_flight_neither_hangs_nor_frees_early() {
    // The reader never reads: the sender's close lingers, then tears down after the flush,
    // and only then gives the buffer back.
    let (c, s) = pair(
        zc(Establish::Cm).linger(Duration::from_millis(300)),
        zc(Establish::Cm),
    );
    let b = filled(&c, 4 * T, 6);
    c.start_send_buffer(&b, 4 * T).unwrap();
    assert!(b.is_busy());
    let t0 = Instant::now();
    let _ = c.close();
    assert!(t0.elapsed() < Duration::from_secs(5), "close hung");
    assert!(!b.is_busy(), "released after the teardown's flush");
    // The reader then finds a dead peer, promptly.
    let t0 = Instant::now();
    let r = s.recv_msg();
    assert!(r.is_err(), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(15), "the reader hung");
    s.close().ok();

    // The sender's QP breaks while the peer may be reading: both ends fail, neither hangs.
    let (c, s) = pair(zc(Establish::Tcp), zc(Establish::Tcp));
    let b = filled(&c, 3 << 20, 7);
    c.start_send_buffer(&b, 3 << 20).unwrap();
    let reader = thread::spawn(move || {
        let r = s.recv_msg();
        (r.map(|m| m.map(|v| v.len())), s)
    });
    thread::sleep(Duration::from_millis(5));
    c.inject_qp_error().unwrap();
    let t0 = Instant::now();
    let w = c.wait_buffer(&b);
    assert!(t0.elapsed() < Duration::from_secs(15), "wait_buffer hung");
    let (r, s) = reader.join().unwrap();
    // Either the READ made it before the error (and the message is whole) or both fail.
    if let Ok(Some(n)) = r {
        assert_eq!(n, 3 << 20);
    }
    eprintln!("after the QP error: wait_buffer {w:?}, reader {r:?}");
    let t0 = Instant::now();
    c.close().ok();
    assert!(t0.elapsed() < Duration::from_secs(5), "close hung");
    // Released after the teardown's flush, or kept (leaked) if the flush of a QP that was
    // already in ERROR could not be confirmed: never freed under the NIC either way.
    eprintln!("after close: buffer busy {}", b.is_busy());
    s.close().ok();
}

#[test]
fn zerocopy_a_large_send_that_times_out_before_its_rts_goes_out_is_withdrawn_whole() {
    // The reader does not read: small messages take every credit, so the RTS of a large
    // slice cannot go out. Its send times out and withdraws it (dropping its registration,
    // and its window, before returning), and the stream stays whole.
    let (c, s) = pair(zc(Establish::Cm), zc(Establish::Cm));
    c.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut small = 0u64;
    loop {
        match c.send_msg(&[7u8; 16]) {
            Ok(()) => small += 1,
            Err(NetError::Timeout { .. }) => break,
            Err(e) => panic!("small send: {e}"),
        }
        assert!(small < 10_000, "the credits never ran out");
    }
    let big = pattern(4 * T, 9);
    let r = c.send_msg(&big);
    assert!(matches!(r, Err(NetError::Timeout { .. })), "{r:?}");
    assert_eq!(c.counters().unwrap().rendezvous_unreleased, 0);
    for _ in 0..small {
        assert_eq!(s.recv_msg().unwrap().unwrap(), [7u8; 16]);
    }
    c.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    thread::scope(|sc| {
        let rx = sc.spawn(|| s.recv_msg().unwrap().unwrap());
        c.send_msg(&big).unwrap();
        assert_eq!(
            hash(&rx.join().unwrap()),
            hash(&big),
            "the withdrawn message was not sent"
        );
    });
    c.close().unwrap();
    s.close().unwrap();
}

#[test]
fn zerocopy_close_while_a_large_send_msg_waits_for_its_done() {
    // The reader does not read: the sender's `send_msg` of a large slice waits for the DONE
    // while another thread closes. The send returns an error, close does not hang, and the
    // slice's bytes after the call returned (overwritten) never reach the reader.
    let (c, s) = pair(
        zc(Establish::Cm).linger(Duration::from_millis(300)),
        zc(Establish::Cm),
    );
    let want = pattern(4 * T, 11);
    thread::scope(|sc| {
        let sender = sc.spawn(|| {
            let mut data = want.clone();
            let r = c.send_msg(&data);
            data.fill(0xee);
            (r, data)
        });
        thread::sleep(Duration::from_millis(500));
        let t0 = Instant::now();
        let _ = c.close();
        assert!(t0.elapsed() < Duration::from_secs(5), "close hung");
        let (r, _data) = sender.join().unwrap();
        assert!(r.is_err(), "{r:?}");
    });
    let t0 = Instant::now();
    match s.recv_msg() {
        Ok(Some(m)) => assert_eq!(hash(&m), hash(&want), "bytes from after the call"),
        r => eprintln!("the reader after the sender's close: {r:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(15), "the reader hung");
    s.close().ok();
}

/// F3: a `recv_buffer` whose read timeout hits while its RDMA READ is in flight neither
/// loses the message nor wedges the connection: the READ goes on with the driver (which keeps
/// the buffer until it lands and then moves the message into the core), and a later call gets
/// the message whole. Before the fix it returned `Timeout` with the core still reading, and
/// every later read timed out (the buffer stayed busy).
#[test]
fn zerocopy_a_recv_buffer_that_times_out_mid_read_still_gets_the_message() {
    let (c, s) = pair(zc(Establish::Cm), zc(Establish::Cm));
    const LEN: usize = 8 << 20;
    let want = pattern(LEN, 21);
    let mut buf = s.alloc_buffer(LEN).unwrap();
    thread::scope(|sc| {
        let sender = sc.spawn(|| c.send_msg(&want));
        // The RTS is there before the read starts: the whole read timeout goes to the READ,
        // which takes far longer than 2 ms for 8 MiB under emulation.
        thread::sleep(Duration::from_millis(500));
        s.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
        let t0 = Instant::now();
        let mut timeouts = 0;
        let n = loop {
            match s.recv_buffer(&mut buf) {
                Ok(n) => break n.unwrap(),
                Err(NetError::Timeout { .. }) => timeouts += 1,
                Err(e) => panic!("recv_buffer: {e}"),
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "wedged after {timeouts} timeouts"
            );
        };
        eprintln!(
            "recv_buffer got {n} B after {timeouts} timeouts in {:?}",
            t0.elapsed()
        );
        assert_eq!(n, LEN);
        assert_eq!(hash(&buf.as_slice().unwrap()[..n]), hash(&want));
        sender.join().unwrap().unwrap();
    });
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.send_msg(b"after").unwrap();
    assert_eq!(s.recv_msg().unwrap().unwrap(), b"after", "still usable");
    c.close().unwrap();
    s.close().unwrap();
}

/// Pages this process has pinned for the NIC (`VmPin`, in kB): every registration counts.
fn pinned_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmPin in /proc/self/status")
}

/// F9: a `send_msg` of a large slice that a concurrent close ends returns only once nothing
/// refers to the slice any more: its window and registration are gone (the pinned pages show
/// it) before the call returns, not at the end of the teardown's flush.
#[test]
fn zerocopy_a_send_msg_ended_by_close_returns_with_its_slice_unregistered() {
    let (c, s) = pair(
        zc(Establish::Cm).linger(Duration::from_millis(300)),
        zc(Establish::Cm),
    );
    const LEN: usize = 64 * T;
    let data = pattern(LEN, 13);
    thread::scope(|sc| {
        let sender = sc.spawn(|| {
            let before = pinned_kb();
            let r = c.send_msg(&data);
            (r, before, pinned_kb())
        });
        thread::sleep(Duration::from_millis(500));
        let _ = c.close();
        let (r, before, after) = sender.join().unwrap();
        assert!(r.is_err(), "{r:?}");
        eprintln!("pinned: {before} kB before the send, {after} kB when it returned");
        assert!(
            after < before + (LEN as u64 / 1024) / 2,
            "the slice was still registered when send_msg returned ({before} -> {after} kB)"
        );
    });
    s.close().ok();
}

/// `send_buffer` whose write timeout hits while the reader reads nothing takes its message
/// back: a large one the peer was offered is asked back (withdrawal), an eager one that could
/// not begin is withdrawn. Either way the call says `Timeout` promptly with the buffer free,
/// and the reader never gets the message: after the ones that returned `Ok`, it reads the
/// next one sent.
#[test]
fn zerocopy_a_send_buffer_that_times_out_is_taken_back_and_never_arrives() {
    let (c, s) = pair(zc(Establish::Tcp), zc(Establish::Tcp));
    c.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let large = filled(&c, 4 * T, 21);
    let t0 = Instant::now();
    let r = c.send_buffer(&large, 4 * T);
    assert!(matches!(r, Err(NetError::Timeout { .. })), "large: {r:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(
        !large.is_busy(),
        "the large buffer is free after its Timeout"
    );
    c.send_msg(b"after the large one").unwrap();
    let small = exhaust_credit(&c);
    let len = 2 * c.info().settled.frame_payload() as usize + 3;
    let eager = filled(&c, len, 22);
    let r = c.send_buffer(&eager, len);
    assert!(matches!(r, Err(NetError::Timeout { .. })), "eager: {r:?}");
    assert!(
        !eager.is_busy(),
        "the eager buffer is free after its Timeout"
    );
    assert_eq!(c.counters().unwrap().lent_unreleased, 0);
    assert_eq!(s.recv_msg().unwrap().unwrap(), b"after the large one");
    for i in 0..small {
        assert_eq!(s.recv_msg().unwrap().unwrap(), [i as u8]);
    }
    c.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    c.send_msg(b"the next one").unwrap();
    assert_eq!(s.recv_msg().unwrap().unwrap(), b"the next one");
    // The buffers work again, and their messages arrive whole.
    thread::scope(|sc| {
        let rx = sc.spawn(|| {
            (
                s.recv_msg().unwrap().unwrap(),
                s.recv_msg().unwrap().unwrap(),
            )
        });
        c.send_buffer(&large, 4 * T).unwrap();
        c.send_buffer(&eager, len).unwrap();
        let (a, b) = rx.join().unwrap();
        assert_eq!(hash(&a), hash(&pattern(4 * T, 21)));
        assert_eq!(hash(&b), hash(&pattern(len, 22)));
    });
    c.close().unwrap();
    s.close().unwrap();
}

/// As conn_device's `a_large_send_ended_by_close_says_ok_exactly_when_the_peer_got_it`, for
/// `send_buffer`: a close on another thread ends it while the reader is just starting, and
/// its answer matches what the peer got, every round (the close may detach the driver
/// between the peer's DONE and the call's look at it).
#[test]
fn zerocopy_a_send_buffer_ended_by_close_says_ok_exactly_when_the_peer_got_it() {
    for round in 0..32u64 {
        let (c, s) = pair(zc(Establish::Tcp), zc(Establish::Tcp));
        let len = 4 * T;
        let reader = thread::spawn(move || {
            thread::sleep(Duration::from_millis(10 + round));
            let mut got = 0;
            while let Some(m) = s.recv_msg().unwrap() {
                assert_eq!(hash(&m), hash(&pattern(len, round)), "round {round}");
                got += 1;
            }
            got
        });
        let buf = filled(&c, len, round);
        let c = std::sync::Arc::new(c);
        let (sent, closed) = thread::scope(|sc| {
            let sender = sc.spawn(|| c.send_buffer(&buf, len));
            thread::sleep(Duration::from_millis(20));
            let closed = c.close();
            (sender.join().unwrap(), closed)
        });
        let got = reader.join().unwrap();
        assert_close_told_the_truth(round, closed, sent, got);
    }
}
