//! The handshake driver over loopback TCP: authentication, mismatches, garbage and silent
//! peers. No RDMA device is involved.

use rsrdma::Gid;
use rsrdma_net::handshake::{Channel, Endpoint, FrameReader, Hello, Message, Proof, Regions, Role};
use rsrdma_net::NetError;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(5);
/// A secret of the accepted length (at least 16 bytes).
const KEY: &[u8] = b"a shared secret of 32 bytes ....";

fn pair() -> (Channel, Channel) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    (
        Channel::new(c, Role::Client, T).unwrap(),
        Channel::new(s, Role::Server, T).unwrap(),
    )
}

fn endpoint(size: u64) -> Endpoint {
    Endpoint {
        qp_num: 5,
        psn: 6,
        lid: 0,
        gid: Gid([2; 16]),
        gid_index: 1,
        mtu: 1024,
        qp_type: 0,
        send_depth: 64,
        recv_depth: 64,
        max_inline: 0,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        params: vec![(1, size)],
    }
}

#[test]
fn full_exchange_with_a_shared_secret() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || {
        s.authenticate(Some(KEY)).unwrap();
        let (peer, settled) = s
            .exchange_endpoints(&endpoint(64), |_| "size".into())
            .unwrap();
        let regions = s.exchange_regions(&Regions::default()).unwrap();
        s.barrier(1).unwrap();
        (peer, settled, regions)
    });
    c.authenticate(Some(KEY)).unwrap();
    let (peer, _) = c
        .exchange_endpoints(&endpoint(64), |_| "size".into())
        .unwrap();
    let mine = Regions(vec![rsrdma::RemoteMemory {
        addr: 0x1000,
        len: 64,
        rkey: 9,
    }]);
    let theirs = c.exchange_regions(&mine).unwrap();
    c.barrier(1).unwrap();
    let (speer, settled, sregions) = server.join().unwrap();
    assert_eq!(peer.qp_num, 5);
    assert_eq!(speer.gid, Gid([2; 16]));
    assert_eq!(settled.mtu, 1024);
    assert_eq!(sregions, mine);
    assert!(theirs.0.is_empty());
}

#[test]
fn a_stranger_without_the_secret_learns_nothing() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || s.authenticate(Some(KEY)).unwrap_err());
    let e = c.authenticate(None).unwrap_err();
    assert!(matches!(e, NetError::Auth(_)), "{e}");
    // The server hears the client's refusal as its own authentication failure, worded from
    // its side (before: `PeerAborted` saying "the peer requires a shared secret").
    let se = server.join().unwrap();
    assert!(matches!(se, NetError::Auth(_)), "{se}");
    assert!(
        se.to_string()
            .contains("this side requires a shared secret and the peer has none"),
        "{se}"
    );
    assert_eq!(
        std::io::Error::from(se).kind(),
        std::io::ErrorKind::PermissionDenied
    );
    drop(c);
}

/// A dialer with a secret at a listener without one reads an authentication failure that
/// says which side lacks it.
#[test]
fn a_secret_the_peer_lacks_is_named_as_such() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || s.authenticate(None).unwrap_err());
    let e = c.authenticate(Some(KEY)).unwrap_err();
    assert!(matches!(e, NetError::Auth(_)), "{e}");
    assert!(
        e.to_string()
            .contains("this side requires a shared secret and the peer has none"),
        "{e}"
    );
    assert!(matches!(server.join().unwrap(), NetError::Auth(_)));
}

#[test]
fn a_wrong_secret_is_refused_on_both_sides() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || s.authenticate(Some(KEY)).unwrap_err());
    let e = c
        .authenticate(Some(b"another 16+ byte secret"))
        .unwrap_err();
    // The server refuses the client's proof; the client reads that as its own failure
    // (before: `PeerAborted`, "the peer's proof does not match", the peer being itself).
    assert!(matches!(e, NetError::Auth(_)), "{e}");
    assert!(e.to_string().contains("shared secrets differ"), "{e}");
    let se = server.join().unwrap();
    assert!(matches!(se, NetError::Auth(_)), "{se}");
}

#[test]
fn differing_options_are_reported_on_both_ends() {
    let (mut c, mut s) = pair();
    let server = thread::spawn(move || {
        s.authenticate(None).unwrap();
        s.exchange_endpoints(&endpoint(4096), |_| "size".into())
            .unwrap_err()
    });
    c.authenticate(None).unwrap();
    let e = c
        .exchange_endpoints(&endpoint(65536), |_| "size".into())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("size") && e.contains("65536") && e.contains("4096"),
        "{e}"
    );
    let se = server.join().unwrap().to_string();
    assert!(
        se.contains("size") && se.contains("4096") && se.contains("65536"),
        "{se}"
    );
}

#[test]
fn garbage_gives_a_clear_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let writer = thread::spawn(move || {
        let mut t = TcpStream::connect(addr).unwrap();
        t.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        thread::sleep(Duration::from_millis(200));
    });
    let (s, _) = l.accept().unwrap();
    let mut s = Channel::new(s, Role::Server, T).unwrap();
    let e = s.authenticate(None).unwrap_err();
    assert!(matches!(e, NetError::Malformed(_)), "{e}");
    assert!(e.to_string().contains("magic"), "{e}");
    writer.join().unwrap();
}

#[test]
fn a_silent_peer_times_out_and_a_vanished_one_is_named() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let silent = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    let mut s = Channel::new(s, Role::Server, Duration::from_millis(300)).unwrap();
    let t0 = Instant::now();
    let e = s.authenticate(None).unwrap_err();
    assert!(matches!(e, NetError::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3));
    drop(silent);

    let gone = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    drop(gone);
    let mut s = Channel::new(s, Role::Server, T).unwrap();
    let e = s.authenticate(None).unwrap_err();
    assert!(
        matches!(e, NetError::PeerClosed(_) | NetError::Io { .. }),
        "{e}"
    );
}

/// Without a secret a hello proves nothing: a listener's opening limit still bounds the wait
/// for the peer's first step after it, and only that. (Before: a peer that sent a hello and
/// then nothing was waited for the channel's whole timeout, holding a listener's place that
/// was never shed, as it had "opened".)
#[test]
fn without_a_secret_the_opening_lasts_until_the_peers_first_step_after_its_hello() {
    let opening = Duration::from_millis(300);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = |l: &TcpListener| {
        let (s, _) = l.accept().unwrap();
        let mut s = Channel::new(s, Role::Server, T).unwrap();
        s.set_opening_timeout(opening);
        s.authenticate(None).unwrap();
        s
    };
    // A hello, then nothing: the wait for the next step ends at the opening's limit.
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.write_all(&hello(Role::Client, false)).unwrap();
    let mut s = server(&l);
    let t0 = Instant::now();
    let e = s.recv("endpoint exchange").unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, NetError::Timeout { .. }), "{e}");
    assert!(took < T / 2, "a hello alone held the server for {took:?}");
    drop(silent);

    // A hello and then a step: the opening is over, and later waits get the whole timeout.
    let mut good = TcpStream::connect(addr).unwrap();
    good.write_all(&hello(Role::Client, false)).unwrap();
    let mut s = server(&l);
    let step = Message::Endpoint(endpoint(0)).to_bytes().unwrap();
    good.write_all(&step).unwrap();
    assert!(matches!(
        s.recv("endpoint exchange"),
        Ok(Message::Endpoint(_))
    ));
    let late = thread::spawn(move || {
        thread::sleep(opening * 2);
        good.write_all(&Message::Sync(1).to_bytes().unwrap())
            .unwrap();
        good
    });
    assert!(matches!(s.recv("barrier"), Ok(Message::Sync(1))));
    drop(late.join().unwrap());
}

/// Reads frames from `s` until the end of the stream (or `limit`), as a stranger would.
fn frames_until_eof(s: &mut TcpStream, limit: Duration) -> Vec<Message> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut r = FrameReader::new();
    let mut got = Vec::new();
    loop {
        while let Ok(Some(m)) = r.next_frame() {
            got.push(m);
        }
        match r.read_from(s) {
            Ok(0) | Err(_) => return got,
            Ok(_) => {}
        }
    }
}

fn hello(role: Role, auth_required: bool) -> Vec<u8> {
    Message::Hello(Hello {
        role,
        auth_required,
        nonce: [7; 32],
    })
    .to_bytes()
    .unwrap()
}

/// F4: a client that has not proven the secret gets nothing derived from it: the listener
/// waits for the client's proof, checks it, and aborts without a proof of its own. (Before:
/// both sides sent their proof first, so a stranger who sent a hello collected the server's
/// HMAC over a nonce it chose, and guessed the secret offline.)
#[test]
fn a_listener_reveals_no_proof_to_a_client_that_has_not_proven_the_secret() {
    for bogus_proof in [false, true] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut s = Channel::new(s, Role::Server, Duration::from_millis(500)).unwrap();
            s.authenticate(Some(KEY)).unwrap_err()
        });
        let mut stranger = TcpStream::connect(addr).unwrap();
        stranger.write_all(&hello(Role::Client, false)).unwrap();
        if bogus_proof {
            let guess = Message::Proof(Proof { tag: [1; 32] });
            stranger.write_all(&guess.to_bytes().unwrap()).unwrap();
        }
        let seen = frames_until_eof(&mut stranger, Duration::from_secs(5));
        let e = server.join().unwrap();
        assert!(
            matches!(e, NetError::Auth(_) | NetError::Timeout { .. }),
            "{e}"
        );
        assert!(
            matches!(seen.first(), Some(Message::Hello(_))),
            "the listener's hello first: {seen:?}"
        );
        assert!(
            !seen
                .iter()
                .any(|m| matches!(m, Message::Proof(_) | Message::Tag(_))),
            "the listener sent something derived from the secret to a stranger: {seen:?}"
        );
    }
}

/// F4: secrets shorter than 128 bits are refused before anything is sent (a proof over a
/// short secret can be guessed offline).
#[test]
fn a_short_secret_is_refused_before_anything_is_sent() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = TcpStream::connect(addr).unwrap();
    let (mut s, _) = l.accept().unwrap();
    let mut c = Channel::new(c, Role::Client, T).unwrap();
    let e = c.authenticate(Some(b"hunter2")).unwrap_err();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("at least 16 bytes"), "{e}");
    drop(c);
    let mut rest = Vec::new();
    s.set_read_timeout(Some(T)).unwrap();
    s.read_to_end(&mut rest).unwrap();
    // Only the best-effort close notice of the dropped channel, no hello.
    let mut r = FrameReader::new();
    r.read_from(&mut &rest[..]).unwrap();
    let first = r.next_frame().unwrap();
    assert!(matches!(first, None | Some(Message::Close)), "{first:?}");
}

/// What an on-path attacker does to each frame going one way: the frames it sends on.
type Rewrite = Box<dyn FnMut(Message) -> Vec<Message> + Send>;

/// An on-path attacker between a client and the server at `server`: forwards frames both
/// ways through `c2s` and `s2c`. Returns its address.
fn on_path(server: std::net::SocketAddr, c2s: Rewrite, s2c: Rewrite) -> std::net::SocketAddr {
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = proxy.local_addr().unwrap();
    thread::spawn(move || {
        let (client, _) = proxy.accept().unwrap();
        let server = TcpStream::connect(server).unwrap();
        let pump = |mut from: TcpStream, mut to: TcpStream, mut f: Rewrite| {
            thread::spawn(move || {
                let mut r = FrameReader::new();
                'outer: loop {
                    while let Ok(Some(m)) = r.next_frame() {
                        for out in f(m) {
                            if to.write_all(&out.to_bytes().unwrap()).is_err() {
                                break 'outer;
                            }
                        }
                    }
                    match r.read_from(&mut from) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Both);
            })
        };
        let a = pump(
            client.try_clone().unwrap(),
            server.try_clone().unwrap(),
            c2s,
        );
        let b = pump(server, client, s2c);
        let _ = (a.join(), b.join());
    });
    addr
}

fn as_is() -> Rewrite {
    Box::new(|m| vec![m])
}

/// An on-path attacker that rewrites a frame after the proofs (here: the queue-pair number
/// of an endpoint, which would connect our QP to the attacker's) is caught on the side that
/// receives it, before the endpoint is used. (Before: nothing after the proofs was bound to
/// the secret, so the rewritten endpoint was taken.)
#[test]
fn a_frame_rewritten_after_the_proofs_ends_the_connection() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let rewrite: Rewrite = Box::new(|m| match m {
        Message::Endpoint(mut e) => {
            e.qp_num = 0x666;
            vec![Message::Endpoint(e)]
        }
        m => vec![m],
    });
    let addr = on_path(l.local_addr().unwrap(), rewrite, as_is());
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut s = Channel::new(s, Role::Server, T).unwrap();
        s.authenticate(Some(KEY)).unwrap();
        assert!(s.authenticated());
        s.exchange_endpoints(&endpoint(64), |_| "size".into())
    });
    let mut c = Channel::new(TcpStream::connect(addr).unwrap(), Role::Client, T).unwrap();
    c.authenticate(Some(KEY)).unwrap();
    let _ = c.exchange_endpoints(&endpoint(64), |_| "size".into());
    drop(c);
    match server.join().unwrap() {
        Ok((peer, _)) => panic!("the rewritten endpoint was taken: qp {:#x}", peer.qp_num),
        Err(e) => {
            assert!(matches!(e, NetError::Auth(_)), "{e}");
            assert!(e.to_string().contains("tampered"), "{e}");
        }
    }
}

/// A frame injected without a tag after the proofs (a forged keepalive), a replayed sealed
/// frame and a dropped one are each refused by the side that receives them.
#[test]
fn an_injected_replayed_or_dropped_frame_is_refused() {
    for attack in ["inject", "replay", "drop"] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // Server to client, after the proofs: barrier 1 and its tag, then barrier 2 and its.
        let mut syncs = 0;
        let mut last: Option<Message> = None;
        let s2c: Rewrite = Box::new(move |m| {
            let sealed_sync = matches!(last, Some(Message::Sync(_)));
            let out = match (&m, attack) {
                (Message::Sync(_), "inject") => vec![Message::Keepalive, m.clone()],
                (Message::Tag(_), "replay") if sealed_sync && syncs == 1 => {
                    vec![m.clone(), last.clone().unwrap(), m.clone()]
                }
                (Message::Sync(2), "drop") => vec![],
                (Message::Tag(_), "drop") if matches!(last, Some(Message::Sync(2))) => vec![],
                _ => vec![m.clone()],
            };
            if let Message::Sync(_) = m {
                syncs += 1;
            }
            last = Some(m);
            out
        });
        let addr = on_path(l.local_addr().unwrap(), as_is(), s2c);
        let server = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut s = Channel::new(s, Role::Server, T).unwrap();
            s.authenticate(Some(KEY)).unwrap();
            (1..=3).map(|step| s.barrier(step)).collect::<Vec<_>>()
        });
        let mut c = Channel::new(TcpStream::connect(addr).unwrap(), Role::Client, T).unwrap();
        c.authenticate(Some(KEY)).unwrap();
        // The client goes on after the first failure, as a program that ignores it would.
        let r: Vec<_> = (1..=3).map(|step| c.barrier(step)).collect();
        let first = r.iter().position(|r| r.is_err()).expect(attack);
        for e in r[first..].iter().map(|r| r.as_ref().unwrap_err()) {
            assert!(matches!(e, NetError::Auth(_)), "{attack}: {e}");
            assert!(e.to_string().contains("tampered"), "{attack}: {e}");
        }
        // The server is told, while the client is still open: its last barrier fails (it
        // completed before the fix, since the client still sent its step), saying why.
        let s = server.join().unwrap();
        let e = s[2].as_ref().expect_err(attack);
        assert!(matches!(e, NetError::PeerAborted(_)), "{attack}: {e}");
        assert!(e.to_string().contains("tampered"), "{attack}: {e}");
        drop(c);
    }
}

/// An older peer (handshake version 2, both proofs at once) cannot authenticate with this
/// one, and is told why instead of seeing "wrong secret".
#[test]
fn an_older_peer_is_told_to_upgrade() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut s = Channel::new(s, Role::Server, T).unwrap();
        s.authenticate(Some(KEY)).unwrap_err()
    });
    let mut old = TcpStream::connect(addr).unwrap();
    let mut h = hello(Role::Client, true);
    h[4] = 2;
    old.write_all(&h).unwrap();
    let seen = frames_until_eof(&mut old, T);
    let e = server.join().unwrap();
    assert!(e.to_string().contains("version 2"), "{e}");
    assert!(
        seen.iter()
            .any(|m| matches!(m, Message::Abort(why) if why.contains("upgrade"))),
        "{seen:?}"
    );
}

/// A peer that resets the connection before this side's hello went out (a listener closing
/// with the dial still in its backlog): the error names the hello, the step that failed, as
/// when the peer closes without a hello of its own (before: "the peer closed the connection
/// during send control message", which a dial could not tell from a failure later on).
#[test]
fn a_reset_before_the_hello_goes_out_names_the_hello() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = TcpStream::connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    // SO_LINGER 0: the close resets.
    let s = resetting_on_close(s);
    drop(s);
    thread::sleep(Duration::from_millis(100));
    let mut c = Channel::new(c, Role::Client, T).unwrap();
    let e = c.authenticate(None).unwrap_err();
    assert!(
        matches!(e, NetError::PeerClosed("handshake hello")),
        "{e:?}"
    );
}

/// `s` set to reset its connection when closed (SO_LINGER on, 0 s).
fn resetting_on_close(s: TcpStream) -> TcpStream {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a valid option of its size.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    s
}
