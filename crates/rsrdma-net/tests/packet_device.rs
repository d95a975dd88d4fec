//! PacketConn on a real device (rxe0 in the VM): ping-pong with replies to the sender in
//! every poll mode, 10,000 datagrams in flight both ways, many threads at once, oversized
//! datagrams and short buffers, timeouts, per-socket Q_Keys, and discovery through the
//! Registry (one sender to three receivers, an expiring lease, a wrong secret).

use rsrdma::qp::DEFAULT_QKEY;
use rsrdma_net::packet::{Addr, PacketConn, PacketOptions};
use rsrdma_net::registry::{ClientOptions, ErrorCode, RegistryClient};
use rsrdma_net::{NetError, PollMode, Registry, RegistryOptions};
use std::collections::HashSet;
use std::time::{Duration, Instant};

mod support;

fn opts() -> PacketOptions {
    PacketOptions::default()
        .device(std::env::var("RSRDMA_TEST_DEVICE").unwrap_or_else(|_| "rxe0".into()))
        .gid_index(
            std::env::var("RSRDMA_TEST_GID_INDEX")
                .ok()
                .and_then(|v| v.parse().ok()),
        )
        .read_timeout(Duration::from_secs(10))
}

fn bind(o: PacketOptions) -> PacketConn {
    PacketConn::bind(o).unwrap()
}

fn ping_pong(mode: PollMode, rounds: u32) {
    let a = bind(opts().poll_mode(mode));
    let b = bind(opts().poll_mode(mode));
    let mut buf = [0u8; 64];
    for i in 0..rounds {
        let ping = format!("ping {i}");
        a.send_to(ping.as_bytes(), &b.local_addr()).unwrap();
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], ping.as_bytes());
        assert_eq!(from, a.local_addr(), "the sender's address, GID included");
        let pong = format!("pong {i}");
        b.send_to(pong.as_bytes(), &from).unwrap();
        let (n, from) = a.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], pong.as_bytes());
        assert_eq!(from, b.local_addr());
    }
    let s = a.stats();
    assert_eq!(
        (s.sent, s.received, s.send_errors, s.recv_errors),
        (rounds.into(), rounds.into(), 0, 0)
    );
    assert_eq!(
        s.ah_created, 1,
        "one address handle for the one destination GID"
    );
}

#[test]
fn ping_pong_replies_to_the_sender_in_every_poll_mode() {
    let t0 = Instant::now();
    for mode in [PollMode::Busy, PollMode::Event, PollMode::default()] {
        ping_pong(mode, 200);
    }
    eprintln!("[packet] 3 x 200 round trips in {:?}", t0.elapsed());
}

/// Datagram `seq` from side `side`: the sequence number, the side, a checksum byte.
fn datagram(side: u8, seq: u32) -> [u8; 48] {
    let mut d = [0u8; 48];
    d[..4].copy_from_slice(&seq.to_be_bytes());
    d[4] = side;
    for (i, b) in d[5..].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_add(i as u8).wrapping_mul(side | 1);
    }
    d
}

fn check(side: u8, d: &[u8]) -> u32 {
    assert_eq!(d.len(), 48);
    let seq = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
    assert_eq!(&datagram(side, seq)[..], d, "payload of datagram {seq}");
    seq
}

/// Sends `count` datagrams of `side` to `to` from `threads` threads in batches, while
/// `receivers` threads on `rx` take them all; checks none is lost or duplicated.
fn stream(tx: &PacketConn, rx: &PacketConn, side: u8, count: u32, threads: u32, receivers: u32) {
    let to = rx.local_addr();
    let seen = std::sync::Mutex::new(HashSet::new());
    let got = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mine: Vec<[u8; 48]> = (0..count)
                    .filter(|i| i % threads == t)
                    .map(|i| datagram(side, i))
                    .collect();
                for chunk in mine.chunks(64) {
                    let msgs: Vec<(&[u8], Addr)> = chunk.iter().map(|d| (&d[..], to)).collect();
                    assert_eq!(tx.send_batch(&msgs).unwrap(), msgs.len());
                }
            });
        }
        for _ in 0..receivers {
            s.spawn(|| {
                let mut store = vec![[0u8; 64]; 16];
                let mut meta = [(0usize, to); 16];
                while got.load(std::sync::atomic::Ordering::SeqCst) < count {
                    let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
                    let n = match rx.recv_batch(&mut bufs, &mut meta) {
                        Ok(n) => n,
                        Err(NetError::Timeout { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    };
                    let mut seen = seen.lock().unwrap();
                    for (i, (len, from)) in meta[..n].iter().enumerate() {
                        assert_eq!(*from, tx.local_addr());
                        let seq = check(side, &bufs[i][..*len]);
                        assert!(seen.insert(seq), "datagram {seq} arrived twice");
                    }
                    got.fetch_add(n as u32, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), count as usize, "none lost");
    assert_eq!(got.into_inner(), count, "none duplicated");
}

#[test]
fn ten_thousand_datagrams_in_flight_both_ways() {
    const N: u32 = 10_000;
    // Every datagram finds a receive posted even if the reader falls behind: UD drops
    // datagrams that find none.
    let o = opts()
        .max_datagram(64)
        .recv_depth(N + 240)
        .send_depth(512)
        .read_timeout(Duration::from_millis(500))
        .poll_mode(PollMode::Busy);
    let a = bind(o.clone());
    let b = bind(o);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| stream(&a, &b, 1, N, 1, 1));
        s.spawn(|| stream(&b, &a, 2, N, 1, 1));
    });
    let took = t0.elapsed();
    eprintln!(
        "[packet] 2 x {N} datagrams both ways in {took:?} ({:.0} datagrams/s)",
        2.0 * f64::from(N) / took.as_secs_f64()
    );
    for c in [&a, &b] {
        let s = c.stats();
        assert_eq!(
            (s.sent, s.received, s.send_errors, s.recv_errors),
            (N.into(), N.into(), 0, 0)
        );
    }
}

#[test]
fn many_threads_share_one_endpoint_in_event_mode() {
    // A small send ring makes senders wait for buffers, several at once, on one CQ.
    let o = opts()
        .max_datagram(64)
        .send_depth(16)
        .recv_depth(4096)
        .read_timeout(Duration::from_millis(500))
        .poll_mode(PollMode::Event);
    let a = bind(o.clone());
    let b = bind(o);
    let t0 = Instant::now();
    stream(&a, &b, 3, 4000, 4, 3);
    eprintln!(
        "[packet] 4 senders, 3 receivers, 4000 datagrams in {:?}",
        t0.elapsed()
    );
}

#[test]
fn oversized_datagrams_and_short_buffers_are_clear_errors() {
    let a = bind(opts());
    let b = bind(opts().max_datagram(1 << 20));
    let mtu = a.max_datagram();
    assert!(mtu >= 256, "{mtu}");
    assert_eq!(
        b.max_datagram(),
        mtu,
        "a limit above the path MTU is cut to it"
    );
    let big = vec![7u8; mtu + 1];
    let e = a.send_to(&big, &b.local_addr()).unwrap_err();
    match &e {
        NetError::DatagramTooLarge { len, limit } => assert_eq!((*len, *limit), (mtu + 1, mtu)),
        other => panic!("{other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains(&format!("{}", mtu + 1)) && text.contains(&format!("{mtu}")),
        "{text}"
    );
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::InvalidInput
    );
    // A batch with one oversized datagram sends nothing.
    let ok = [1u8; 8];
    let e = a
        .send_batch(&[(&ok[..], b.local_addr()), (&big[..], b.local_addr())])
        .unwrap_err();
    assert!(matches!(e, NetError::DatagramTooLarge { .. }));
    // A queue pair number over 24 bits (the fields are public) is refused, not cut by the
    // NIC into another one while the send says Ok (an outside tester's find), alone or in
    // a batch.
    let mut wide = b.local_addr();
    wide.qpn |= 1 << 24;
    let e = a.send_to(&ok, &wide).unwrap_err();
    assert!(
        matches!(&e, NetError::InvalidArgument(m) if m.contains("24 bits")),
        "{e:?}"
    );
    let e = a
        .send_batch(&[(&ok[..], b.local_addr()), (&ok[..], wide)])
        .unwrap_err();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e:?}");
    // Exactly the MTU goes through, and a short buffer leaves it queued.
    let full: Vec<u8> = (0..mtu).map(|i| i as u8).collect();
    a.send_to(&full, &b.local_addr()).unwrap();
    let mut small = [0u8; 100];
    let e = b.recv_from(&mut small).unwrap_err();
    assert!(
        matches!(e, NetError::BufferTooSmall { needed, got: 100 } if needed == mtu),
        "{e:?}"
    );
    let mut buf = vec![0u8; mtu];
    let (n, from) = b.recv_from(&mut buf).unwrap();
    assert_eq!((n, from), (mtu, a.local_addr()));
    assert_eq!(buf, full);
    assert_eq!(a.stats().sent, 1, "nothing of the refused sends went out");
}

#[test]
fn a_read_timeout_is_clear_and_the_endpoint_stays_usable() {
    let a = bind(opts());
    let b = bind(
        opts()
            .read_timeout(Duration::from_millis(100))
            .poll_mode(PollMode::Event),
    );
    let mut buf = [0u8; 16];
    let t0 = Instant::now();
    let e = b.recv_from(&mut buf).unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, NetError::Timeout { .. }), "{e:?}");
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::TimedOut);
    assert!(
        matches!(
            b.set_read_timeout(Some(Duration::ZERO)),
            Err(NetError::InvalidArgument(_))
        ),
        "zero is refused, as on Conn and std's sockets"
    );
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    a.send_to(b"after", &b.local_addr()).unwrap();
    let (n, _) = b.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"after");
    a.flush(Duration::from_secs(5)).unwrap();
}

#[test]
fn qkeys_default_and_per_socket() {
    const QKEY: u32 = 0x1234;
    let a = bind(opts().qkey(QKEY));
    let b = bind(opts().qkey(QKEY).read_timeout(Duration::from_millis(300)));
    let c = bind(opts());
    assert_eq!(c.local_addr().qkey, DEFAULT_QKEY);
    assert_eq!(b.local_addr().qkey, QKEY);
    assert!(b.local_addr().to_string().ends_with("#0x1234"));
    let b_addr: Addr = b.local_addr().to_string().parse().unwrap();
    let mut buf = [0u8; 16];
    // Text address, right Q_Key: delivered, and the reply reaches a (same Q_Key).
    a.send_to(b"hi", &b_addr).unwrap();
    let (n, from) = b.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"hi"[..], a.local_addr()));
    b.send_to(b"yo", &from).unwrap();
    assert_eq!(a.recv_from(&mut buf).unwrap().1, b.local_addr());
    // The wrong Q_Key: the NIC drops it.
    c.send_to(b"no", &b.local_addr().with_qkey(DEFAULT_QKEY))
        .unwrap();
    assert!(matches!(
        b.recv_from(&mut buf),
        Err(NetError::Timeout { .. })
    ));
    // The right one from the same socket gets through.
    c.send_to(b"ok", &b.local_addr()).unwrap();
    let (n, from) = b.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from.qpn), (&b"ok"[..], c.local_addr().qpn));
}

#[test]
fn one_sender_reaches_three_receivers_found_through_the_registry() {
    let reg = Registry::serve("127.0.0.1:0").unwrap();
    let receivers: Vec<PacketConn> = (0..3).map(|_| bind(opts())).collect();
    for (i, r) in receivers.iter().enumerate() {
        let mut c = RegistryClient::connect(reg.local_addr(), ClientOptions::default()).unwrap();
        c.register(&format!("rx-{i}"), &r.local_addr()).unwrap();
    }
    let tx = bind(opts());
    let mut dir = RegistryClient::connect(reg.local_addr(), ClientOptions::default()).unwrap();
    let targets: Vec<Addr> = (0..3)
        .map(|i| dir.lookup(&format!("rx-{i}")).unwrap())
        .collect();
    for (t, r) in targets.iter().zip(&receivers) {
        assert_eq!(*t, r.local_addr());
    }
    let payloads: Vec<Vec<u8>> = (0..150u32)
        .map(|i| format!("to {} #{i}", i % 3).into_bytes())
        .collect();
    let msgs: Vec<(&[u8], Addr)> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| (&p[..], targets[i % 3]))
        .collect();
    assert_eq!(tx.send_batch(&msgs).unwrap(), 150);
    let mut buf = [0u8; 64];
    for (k, r) in receivers.iter().enumerate() {
        for j in 0..50 {
            let (n, from) = r.recv_from(&mut buf).unwrap();
            assert_eq!(from, tx.local_addr());
            assert_eq!(
                &buf[..n],
                format!("to {k} #{}", j * 3 + k).as_bytes(),
                "in order per receiver"
            );
            if j == 0 {
                r.send_to(format!("ack {k}").as_bytes(), &from).unwrap();
            }
        }
    }
    let mut acks = HashSet::new();
    for _ in 0..3 {
        let (n, from) = tx.recv_from(&mut buf).unwrap();
        let k: usize = std::str::from_utf8(&buf[4..n]).unwrap().parse().unwrap();
        assert_eq!(from, receivers[k].local_addr());
        acks.insert(k);
    }
    assert_eq!(acks.len(), 3);
    assert_eq!(
        tx.stats().ah_created,
        1,
        "three receivers behind one GID share one handle"
    );
}

#[test]
fn a_registered_endpoint_disappears_when_its_lease_runs_out() {
    let reg = Registry::serve_with(
        "127.0.0.1:0",
        RegistryOptions::default().lease(Duration::from_millis(300)),
    )
    .unwrap();
    let pc = bind(opts());
    let mut c = RegistryClient::connect(reg.local_addr(), ClientOptions::default()).unwrap();
    assert_eq!(
        c.register("ud", &pc.local_addr()).unwrap(),
        Duration::from_millis(300)
    );
    assert_eq!(c.lookup("ud").unwrap(), pc.local_addr());
    std::thread::sleep(Duration::from_millis(450));
    let e = c.lookup("ud").unwrap_err();
    assert!(
        matches!(
            e,
            NetError::Registry {
                code: ErrorCode::NotFound,
                ..
            }
        ),
        "{e:?}"
    );
    c.renew("ud", &pc.local_addr()).unwrap();
    assert_eq!(c.lookup("ud").unwrap(), pc.local_addr());
}

#[test]
fn a_wrong_secret_is_refused_and_the_right_one_works() {
    let secret = b"cluster secret, 16+ bytes".to_vec();
    let reg = Registry::serve_with(
        "127.0.0.1:0",
        RegistryOptions::default().secret(secret.clone()),
    )
    .unwrap();
    let rx = bind(opts());
    let good = ClientOptions::default().secret(secret);
    RegistryClient::connect(reg.local_addr(), good.clone())
        .unwrap()
        .register("rx", &rx.local_addr())
        .unwrap();
    let e = RegistryClient::connect(
        reg.local_addr(),
        ClientOptions::default().secret(b"nope, not this one".to_vec()),
    )
    .unwrap_err();
    assert!(matches!(e, NetError::Auth(_)), "{e:?}");
    assert!(e.to_string().contains("wrong secret"), "{e}");
    let to = RegistryClient::connect(reg.local_addr(), good)
        .unwrap()
        .lookup("rx")
        .unwrap();
    let tx = bind(opts());
    tx.send_to(b"authenticated", &to).unwrap();
    let mut buf = [0u8; 32];
    let (n, from) = rx.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"authenticated"[..], tx.local_addr()));
}

/// Two edges of receiving: `recv_batch` with fewer `meta` entries than buffers takes only as
/// many datagrams as it can describe (it took one per buffer, then indexed `meta` past its
/// end: a panic, with the datagrams taken and their buffers never reposted); and a datagram
/// over the receiver's `max_datagram` that still fits its rounded-up buffer is dropped and
/// counted, not delivered (a caller's buffer of `max_datagram` bytes stopped at it for ever).
#[test]
fn recv_batch_takes_what_meta_can_hold_and_oversized_datagrams_are_dropped() {
    let a = bind(opts());
    let b = bind(opts().recv_depth(8));
    for i in 0..3u8 {
        a.send_to(&[i; 16], &b.local_addr()).unwrap();
    }
    let (mut x, mut y, mut z) = ([0u8; 64], [0u8; 64], [0u8; 64]);
    let mut meta = [(0usize, b.local_addr())];
    let t0 = Instant::now();
    let mut got = Vec::new();
    while got.len() < 3 && t0.elapsed() < Duration::from_secs(10) {
        let n = b
            .recv_batch(&mut [&mut x[..], &mut y[..], &mut z[..]], &mut meta)
            .unwrap();
        assert_eq!(n, 1, "one entry of meta, one datagram");
        assert_eq!(meta[0].0, 16);
        got.push(x[0]);
    }
    assert_eq!(got, [0, 1, 2]);
    // Every buffer came back: a full ring's worth still arrives.
    for i in 0..8u8 {
        a.send_to(&[i; 8], &b.local_addr()).unwrap();
    }
    for i in 0..8u8 {
        let (n, _) = b.recv_from(&mut x).unwrap();
        assert_eq!((n, x[0]), (8, i));
    }

    let small = bind(opts().max_datagram(64));
    let over = small.max_datagram() + 16;
    a.send_to(&vec![7u8; over], &small.local_addr()).unwrap();
    a.send_to(b"small", &small.local_addr()).unwrap();
    let mut buf = vec![0u8; small.max_datagram()];
    let (n, _) = small.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"small");
    assert_eq!(small.stats().oversized, 1);
}

/// A batch that fails partway says how many were sent, as `sendmmsg(2)` does: a datagram to
/// an address no address handle can reach (an IPv6 address with no route in the VM) stops
/// it there; those before it were sent and arrive, and resending from the failed one gives
/// its error. (Before: the whole call returned the error, and the caller could not know that
/// the first two had gone.) Only on rxe: soft0 makes an address handle for any GID.
#[test]
fn a_batch_that_fails_partway_returns_how_many_were_sent() {
    let (a, b) = (bind(opts()), bind(opts()));
    // 2001:db8::1, the documentation prefix: the VM has no IPv6 route to it.
    let mut nowhere = Addr::new(rsrdma::Gid([0; 16]), b.local_addr().qpn);
    nowhere.gid.0[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    nowhere.gid.0[15] = 1;
    let to = b.local_addr();
    let batch: [(&[u8], Addr); 4] = [
        (b"first", to),
        (b"second", to),
        (b"to nowhere", nowhere),
        (b"fourth", to),
    ];
    assert_eq!(a.send_batch(&batch).unwrap(), 2);
    let mut buf = [0u8; 64];
    for want in [&b"first"[..], b"second"] {
        let (n, _) = b.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], want);
    }
    let e = a.send_batch(&batch[2..]).unwrap_err();
    assert!(e.to_string().contains("ibv_create_ah"), "{e}");
    assert_eq!(a.send_batch(&batch[3..]).unwrap(), 1);
    let (n, _) = b.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"fourth");
    assert_eq!(a.stats().sent, 3);
}

/// Address handles are made outside the send lock: while one thread's send waits on the
/// kernel for an address that does not answer (rxe resolves the path, and gives up after
/// about a second), another thread's sends to a known address go on. (Before: the handle
/// was made under the send lock, and every sender of the endpoint waited that second.)
/// Only on rxe: soft0 makes an address handle at once.
#[test]
fn a_slow_address_handle_does_not_hold_up_other_senders() {
    let (a, b) = (std::sync::Arc::new(bind(opts())), bind(opts()));
    let to = b.local_addr();
    a.send_to(b"warm", &to).unwrap(); // its address handle is cached now
    let nowhere = support::unanswered_addr(to.qpn);
    let slow = {
        let a = a.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = a.send_to(b"to nowhere", &nowhere);
            (r, t0.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    for _ in 0..100 {
        a.send_to(b"meanwhile", &to).unwrap();
    }
    let others = t0.elapsed();
    let (r, stuck) = slow.join().unwrap();
    eprintln!("100 sends in {others:?} while one address handle took {stuck:?}: {r:?}");
    support::assert_not_held_up(&r.unwrap_err(), stuck, others);
    let mut buf = [0u8; 64];
    for _ in 0..101 {
        b.recv_from(&mut buf).unwrap();
    }
}
