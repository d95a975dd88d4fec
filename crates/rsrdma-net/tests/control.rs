//! The control channel as a message-driven channel over loopback TCP: frames split across
//! reads, several frames per read, unsolicited messages around barriers and exchanges, close
//! notices, a peer that closes mid-frame, garbage, and liveness checks that leave the socket
//! non-blocking. No RDMA device is involved.

use rsrdma::RemoteMemory;
use rsrdma_net::handshake::codec::MAX_REGIONS;
use rsrdma_net::handshake::{Channel, Message, MessageKind, Regions, Role, MAX_QUEUED};
use rsrdma_net::NetError;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::thread;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(5);

/// A channel and the raw socket of its peer, for writing exact bytes.
fn channel_and_raw_peer() -> (Channel, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let raw = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    raw.set_nodelay(true).unwrap();
    let (s, _) = l.accept().unwrap();
    (Channel::new(s, Role::Server, T).unwrap(), raw)
}

fn channel_pair() -> (Channel, Channel) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (
        Channel::new(c, Role::Client, T).unwrap(),
        Channel::new(s, Role::Server, T).unwrap(),
    )
}

fn frames(msgs: &[Message]) -> Vec<u8> {
    let mut v = Vec::new();
    for m in msgs {
        m.encode(&mut v).unwrap();
    }
    v
}

fn region(n: u64) -> Regions {
    Regions(vec![RemoteMemory {
        addr: 0x10_0000 * n,
        len: 4096,
        rkey: n as u32,
    }])
}

fn nonblocking(ch: &Channel) -> bool {
    // SAFETY: F_GETFL on the channel's open descriptor only reads its flags.
    let flags = unsafe { libc::fcntl(ch.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0);
    flags & libc::O_NONBLOCK != 0
}

#[test]
fn frames_split_at_every_byte_boundary_across_reads() {
    let msgs = [
        Message::Sync(1),
        Message::Regions(region(2)),
        Message::Sync(3),
    ];
    let bytes = frames(&msgs);
    let (mut ch, mut raw) = channel_and_raw_peer();
    for cut in 1..bytes.len() {
        raw.write_all(&bytes[..cut]).unwrap();
        // Take in the first piece on its own, so the frame is reassembled across reads.
        thread::sleep(Duration::from_micros(200));
        ch.read_available().unwrap();
        raw.write_all(&bytes[cut..]).unwrap();
        assert_eq!(ch.recv("split").unwrap(), msgs[0], "cut at {cut}");
        assert_eq!(ch.recv("split").unwrap(), msgs[1], "cut at {cut}");
        assert_eq!(ch.recv("split").unwrap(), msgs[2], "cut at {cut}");
        assert_eq!(ch.queued(), 0);
    }
}

#[test]
fn one_byte_per_write_still_gives_whole_frames() {
    let msgs = [
        Message::Regions(region(9)),
        Message::Keepalive,
        Message::Sync(4),
    ];
    let bytes = frames(&msgs);
    let (mut ch, mut raw) = channel_and_raw_peer();
    let writer = thread::spawn(move || {
        for b in bytes {
            raw.write_all(&[b]).unwrap();
            thread::sleep(Duration::from_micros(50));
        }
        raw
    });
    assert_eq!(ch.recv("bytes").unwrap(), msgs[0]);
    // The keepalive is not a message to take: the sync comes next.
    assert_eq!(ch.recv("bytes").unwrap(), msgs[2]);
    drop(writer.join().unwrap());
}

#[test]
fn several_frames_in_one_read_come_out_in_order() {
    let mut msgs: Vec<Message> = (0..100).map(Message::Sync).collect();
    msgs.insert(50, Message::Regions(region(1)));
    let (mut ch, mut raw) = channel_and_raw_peer();
    raw.write_all(&frames(&msgs)).unwrap();
    for m in &msgs {
        assert_eq!(&ch.recv("batch").unwrap(), m);
    }
}

#[test]
fn unsolicited_messages_around_a_barrier_are_kept() {
    let (mut ch, mut raw) = channel_and_raw_peer();
    raw.write_all(&frames(&[
        Message::Keepalive,
        Message::Regions(region(7)),
        Message::Keepalive,
        Message::Sync(1),
        Message::Regions(region(8)),
    ]))
    .unwrap();
    let heard_before = ch.last_heard();
    // The barrier takes its sync past the descriptors in front of it.
    ch.barrier(1).unwrap();
    assert!(ch.last_heard() > heard_before, "keepalives count as heard");
    let deadline = Instant::now() + T;
    while ch.queued() < 2 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
        ch.read_available().unwrap();
    }
    assert_eq!(ch.queued(), 2, "both region lists stay queued");
    // The exchange takes the first queued list without waiting for the peer's reply...
    assert_eq!(ch.exchange_regions(&region(1)).unwrap(), region(7));
    // ...and sent this side's list, which the peer reads as a frame.
    let mut buf = vec![0u8; 256];
    raw.set_read_timeout(Some(T)).unwrap();
    let mut got = Vec::new();
    while !got.ends_with(&frames(&[Message::Regions(region(1))])) {
        let n = std::io::Read::read(&mut raw, &mut buf).unwrap();
        assert!(n > 0, "the channel closed");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(
        ch.try_recv_kind(MessageKind::Regions).unwrap(),
        Some(Message::Regions(region(8)))
    );
    assert_eq!(ch.try_recv_kind(MessageKind::Regions).unwrap(), None);
}

#[test]
fn unsolicited_descriptors_between_two_channels() {
    let (mut c, mut s) = channel_pair();
    let server = thread::spawn(move || {
        s.authenticate(None).unwrap();
        // Sent unasked, before the barrier the client waits in.
        s.send(&Message::Regions(region(3))).unwrap();
        s.send_keepalive().unwrap();
        s.barrier(1).unwrap();
        let theirs = s.recv_kind(MessageKind::Regions, "regions").unwrap();
        s.barrier(2).unwrap();
        theirs
    });
    c.authenticate(None).unwrap();
    c.barrier(1).unwrap();
    c.send(&Message::Regions(region(4))).unwrap();
    assert_eq!(
        c.recv_kind(MessageKind::Regions, "regions").unwrap(),
        Message::Regions(region(3))
    );
    c.barrier(2).unwrap();
    assert_eq!(server.join().unwrap(), Message::Regions(region(4)));
}

#[test]
fn the_largest_region_lists_cross_both_ways_at_once() {
    let big = |seed: u64| {
        Regions(
            (0..MAX_REGIONS as u64)
                .map(|i| RemoteMemory {
                    addr: (seed << 40) + (i << 12),
                    len: 4096,
                    rkey: i as u32,
                })
                .collect(),
        )
    };
    let (mut c, mut s) = channel_pair();
    let server = thread::spawn(move || s.exchange_regions(&big(2)).unwrap());
    assert_eq!(c.exchange_regions(&big(1)).unwrap(), big(2));
    assert_eq!(server.join().unwrap(), big(1));
    // One more descriptor is refused before anything is sent.
    let mut over = big(3);
    over.0.push(over.0[0]);
    let e = c.send(&Message::Regions(over)).unwrap_err();
    assert!(matches!(e, NetError::Encode(_)), "{e}");
    assert!(e.to_string().contains("MAX_REGIONS"), "{e}");
}

#[test]
fn a_close_notice_ends_waits_at_once_but_keeps_what_came_before() {
    let (mut c, mut s) = channel_pair();
    s.send(&Message::Sync(1)).unwrap();
    s.send_close().unwrap();
    assert!(
        s.send(&Message::Sync(2)).is_err(),
        "nothing goes out after the close"
    );
    c.barrier(1).unwrap();
    let t0 = Instant::now();
    let e = c.barrier(2).unwrap_err();
    assert!(matches!(e, NetError::PeerClosed("barrier")), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "no wait for the timeout"
    );
    assert!(!c.peer_open().unwrap());
    drop(s);
}

#[test]
fn dropping_a_channel_sends_a_close_notice() {
    let (mut c, s) = channel_pair();
    assert!(c.peer_open().unwrap());
    // A duplicate of the socket keeps the TCP connection open: only the notice can end it.
    let keep = s.stream().try_clone().unwrap();
    drop(s);
    let t0 = Instant::now();
    let e = c.recv_kind(MessageKind::Sync, "barrier").unwrap_err();
    assert!(matches!(e, NetError::PeerClosed(_)), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "no wait for the timeout"
    );
    drop(keep);
}

#[test]
fn a_peer_closing_mid_frame_is_named_not_waited_for() {
    let (mut ch, mut raw) = channel_and_raw_peer();
    let bytes = frames(&[Message::Sync(1), Message::Regions(region(5))]);
    raw.write_all(&bytes[..bytes.len() - 7]).unwrap();
    drop(raw);
    assert_eq!(ch.recv("first").unwrap(), Message::Sync(1));
    let t0 = Instant::now();
    let e = ch.recv("second").unwrap_err();
    assert!(matches!(e, NetError::PeerClosed("second")), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(!ch.peer_open().unwrap());
}

#[test]
fn garbage_after_a_good_frame_is_malformed() {
    let (mut ch, mut raw) = channel_and_raw_peer();
    let mut bytes = frames(&[Message::Sync(1)]);
    bytes.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
    raw.write_all(&bytes).unwrap();
    // The good frame comes out even though garbage follows it in the same read.
    assert_eq!(ch.recv("good").unwrap(), Message::Sync(1));
    let e = ch.recv("bad").unwrap_err();
    assert!(matches!(e, NetError::Malformed(_)), "{e}");
    assert!(e.to_string().contains("magic"), "{e}");
    assert!(matches!(ch.peer_open(), Err(NetError::Malformed(_))));
}

#[test]
fn a_wait_for_one_kind_times_out_and_keeps_the_others() {
    let (mut ch, mut raw) = channel_and_raw_peer();
    raw.write_all(&frames(&[Message::Sync(1), Message::Sync(2)]))
        .unwrap();
    let t0 = Instant::now();
    let e = ch
        .recv_kind_until(
            MessageKind::Regions,
            "regions",
            Instant::now() + Duration::from_millis(200),
        )
        .unwrap_err();
    assert!(matches!(e, NetError::Timeout { op: "regions", .. }), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(200));
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(ch.queued(), 2);
    assert_eq!(ch.recv("sync").unwrap(), Message::Sync(1));
}

#[test]
fn liveness_checks_leave_the_socket_non_blocking() {
    let (mut ch, mut raw) = channel_and_raw_peer();
    assert!(nonblocking(&ch));
    assert!(ch.peer_open().unwrap());
    assert!(nonblocking(&ch));
    raw.write_all(&frames(&[Message::Sync(9)])).unwrap();
    // The fd polls readable for an event loop; the check queues what came.
    let mut pfd = libc::pollfd {
        fd: ch.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 5000) }, 1);
    assert!(ch.peer_open().unwrap());
    assert_eq!(ch.queued(), 1);
    drop(raw);
    let deadline = Instant::now() + T;
    while ch.peer_open().unwrap() {
        assert!(
            Instant::now() < deadline,
            "the end of the stream was never seen"
        );
        thread::sleep(Duration::from_millis(10));
    }
    assert!(nonblocking(&ch));
    assert_eq!(ch.recv("sync").unwrap(), Message::Sync(9));
}

#[test]
fn a_flood_of_unread_messages_is_refused() {
    let (mut ch, mut raw) = channel_and_raw_peer();
    let msgs: Vec<Message> = (0..=MAX_QUEUED as u32).map(Message::Sync).collect();
    raw.write_all(&frames(&msgs)).unwrap();
    let deadline = Instant::now() + T;
    let e = loop {
        match ch.try_recv_kind(MessageKind::Regions) {
            Err(e) => break e,
            Ok(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Ok(_) => panic!("{} messages queued without complaint", ch.queued()),
        }
    };
    assert!(
        matches!(e, NetError::QueueFull { limit } if limit == MAX_QUEUED),
        "{e}"
    );
}

/// A peer that never stops sending keeps the socket readable; the deadline must still end the
/// wait (poll(2) alone never reports it).
#[test]
fn a_flooding_peer_cannot_hold_a_wait_past_its_deadline() {
    let (mut ch, mut raw) = channel_and_raw_peer();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        thread::spawn(move || {
            let ka = frames(&vec![Message::Keepalive; 64]);
            let t0 = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && t0.elapsed() < T {
                if raw.write_all(&ka).is_err() {
                    break;
                }
            }
        })
    };
    thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    let e = ch
        .recv_kind_until(
            MessageKind::Sync,
            "barrier",
            Instant::now() + Duration::from_millis(200),
        )
        .unwrap_err();
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Closing our end makes the flooder's blocked write fail, so it stops.
    drop(ch);
    flood.join().unwrap();
    assert!(matches!(e, NetError::Timeout { .. }), "{e}");
    assert!(took < Duration::from_secs(2), "the wait took {took:?}");
}
