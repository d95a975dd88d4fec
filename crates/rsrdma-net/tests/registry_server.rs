//! The registry server end to end over loopback TCP (no device): many requests per
//! connection, leases, authentication, bad input of every kind, caps, and concurrent clients.

use rsrdma::Gid;
use rsrdma_net::packet::Addr;
use rsrdma_net::registry::codec::{self, Message, LEN_PREFIX, MAX_FRAME, MAX_NAME, VERSION};
use rsrdma_net::registry::{lookup, register, ClientOptions, ErrorCode, RegistryClient};
use rsrdma_net::{NetError, Registry, RegistryHandle, RegistryOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn addr(n: u32) -> Addr {
    Addr::new(Gid([n as u8; 16]), n)
}

fn serve(opts: RegistryOptions) -> RegistryHandle {
    Registry::serve_with("127.0.0.1:0", opts).unwrap()
}

fn client(h: &RegistryHandle) -> RegistryClient {
    RegistryClient::connect(h.local_addr(), ClientOptions::default()).unwrap()
}

fn code_of(e: &NetError) -> ErrorCode {
    match e {
        NetError::Registry { code, .. } => *code,
        other => panic!("expected a registry error, got {other:?}"),
    }
}

/// A raw connection that has done the opening exchange without a secret.
fn raw(h: &RegistryHandle) -> TcpStream {
    let mut s = TcpStream::connect(h.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    send(&mut s, &Message::Hello { nonce: [5; 32] });
    assert!(matches!(
        reply(&mut s),
        Some(Message::Welcome {
            auth_required: false,
            ..
        })
    ));
    s
}

fn send(s: &mut TcpStream, m: &Message) {
    let mut out = Vec::new();
    codec::encode(m, &mut out).unwrap();
    s.write_all(&out).unwrap();
}

/// The next reply, or `None` when the server closed the connection.
fn reply(s: &mut TcpStream) -> Option<Message> {
    let mut len = [0u8; LEN_PREFIX];
    if s.read_exact(&mut len).is_err() {
        return None;
    }
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(codec::decode_body(&body).unwrap())
}

fn error_code(m: Option<Message>) -> ErrorCode {
    match m {
        Some(Message::Error { code, .. }) => code,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn register_lookup_unregister_on_one_connection() {
    let h = serve(RegistryOptions::default());
    let mut c = client(&h);
    assert_eq!(c.register("a", &addr(1)).unwrap(), Duration::from_secs(30));
    assert_eq!(
        c.register_for("b", &addr(2), Duration::from_secs(5))
            .unwrap(),
        Duration::from_secs(5)
    );
    // Asking for more than the registry grants gets its longest.
    assert_eq!(
        c.register_for("c", &addr(3), Duration::from_secs(3600))
            .unwrap(),
        Duration::from_secs(30)
    );
    for _ in 0..100 {
        assert_eq!(c.lookup("a").unwrap(), addr(1));
        assert_eq!(c.lookup("b").unwrap(), addr(2));
    }
    c.ping().unwrap();
    // Last registration wins.
    c.renew("a", &addr(7)).unwrap();
    assert_eq!(lookup(h.local_addr(), "a").unwrap(), addr(7));
    c.unregister("a").unwrap();
    let e = c.lookup("a").unwrap_err();
    assert_eq!(code_of(&e), ErrorCode::NotFound);
    assert!(e.to_string().contains("\"a\""), "{e}");
    assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::NotFound);
    assert_eq!(
        code_of(&c.unregister("a").unwrap_err()),
        ErrorCode::NotFound
    );
    // The one-shot helpers. Calling `register` again renews the name or moves it: every
    // call of one process is one owner. (Before: each call drew a new owner, so the second
    // was refused with NotOwner and the name could not be kept alive.) Another client,
    // another owner, is refused.
    register(h.local_addr(), "d", &addr(4)).unwrap();
    assert_eq!(c.lookup("d").unwrap(), addr(4));
    register(h.local_addr(), "d", &addr(5)).unwrap();
    assert_eq!(c.lookup("d").unwrap(), addr(5));
    assert_eq!(
        code_of(&c.register("d", &addr(6)).unwrap_err()),
        ErrorCode::NotOwner
    );
    assert_eq!(h.entries(), 3);
}

#[test]
fn leases_expire_unless_renewed() {
    let h = serve(RegistryOptions::default().lease(Duration::from_millis(300)));
    let mut c = client(&h);
    assert_eq!(
        c.register("short", &addr(1)).unwrap(),
        Duration::from_millis(300)
    );
    c.register("renewed", &addr(2)).unwrap();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(150));
        c.renew("renewed", &addr(2)).unwrap();
    }
    // 600 ms later: "short" is gone, "renewed" lives.
    assert_eq!(
        code_of(&c.lookup("short").unwrap_err()),
        ErrorCode::NotFound
    );
    assert_eq!(c.lookup("renewed").unwrap(), addr(2));
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        code_of(&c.lookup("renewed").unwrap_err()),
        ErrorCode::NotFound
    );
}

#[test]
fn the_shared_secret_is_checked_both_ways() {
    let secret = b"registry secret, 16+ bytes".to_vec();
    let h = serve(RegistryOptions::default().secret(secret.clone()));
    let good = ClientOptions::default().secret(secret.clone());
    let mut c = RegistryClient::connect(h.local_addr(), good).unwrap();
    c.register("a", &addr(1)).unwrap();

    let wrong = ClientOptions::default().secret(b"a guess of 16+ bytes".to_vec());
    let e = RegistryClient::connect(h.local_addr(), wrong).unwrap_err();
    assert!(matches!(e, NetError::Auth(_)), "{e:?}");
    assert!(e.to_string().contains("wrong secret"), "{e}");
    assert_eq!(
        std::io::Error::from(e).kind(),
        std::io::ErrorKind::PermissionDenied
    );

    let none = RegistryClient::connect(h.local_addr(), ClientOptions::default()).unwrap_err();
    assert!(
        none.to_string().contains("requires a shared secret"),
        "{none}"
    );
    assert!(lookup(h.local_addr(), "a").is_err(), "no secret, no lookup");

    // A client with a secret refuses a registry that cannot prove one.
    let open = serve(RegistryOptions::default());
    let e = RegistryClient::connect(open.local_addr(), ClientOptions::default().secret(secret))
        .unwrap_err();
    assert!(matches!(e, NetError::Auth(_)), "{e:?}");

    // A raw client skipping the proof gets AuthFailed, not a served request.
    let mut s = TcpStream::connect(h.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    send(&mut s, &Message::Hello { nonce: [1; 32] });
    assert!(matches!(
        reply(&mut s),
        Some(Message::Welcome {
            auth_required: true,
            ..
        })
    ));
    send(&mut s, &Message::Lookup { name: "a".into() });
    assert_eq!(error_code(reply(&mut s)), ErrorCode::AuthFailed);
    assert_eq!(reply(&mut s), None, "then it hangs up");
    // The good client is still served.
    assert_eq!(c.lookup("a").unwrap(), addr(1));
}

#[test]
fn bad_requests_get_clear_errors_and_the_connection_goes_on() {
    let h = serve(RegistryOptions::default());
    let mut s = raw(&h);
    // Unknown operation.
    s.write_all(&[0, 0, 0, 2, VERSION, 0x42]).unwrap();
    assert_eq!(error_code(reply(&mut s)), ErrorCode::UnknownOp);
    // An oversized name (crafted: the client library refuses to send it).
    let long = vec![b'n'; MAX_NAME + 1];
    let mut body = vec![VERSION, 0x04];
    body.extend_from_slice(&(long.len() as u16).to_be_bytes());
    body.extend_from_slice(&long);
    s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    s.write_all(&body).unwrap();
    match reply(&mut s) {
        Some(Message::Error { code, text }) => {
            assert_eq!(code, ErrorCode::NameTooLong);
            assert!(text.contains("256") && text.contains("255"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // Garbage inside a well-formed frame.
    s.write_all(&[0, 0, 0, 5, VERSION, 0x03, 0x00, 0x05, b'a'])
        .unwrap();
    assert_eq!(error_code(reply(&mut s)), ErrorCode::BadRequest);
    // Another version.
    s.write_all(&[0, 0, 0, 2, VERSION + 1, 0x06]).unwrap();
    assert_eq!(error_code(reply(&mut s)), ErrorCode::Version);
    // A reply kind sent as a request.
    send(&mut s, &Message::Done);
    assert_eq!(error_code(reply(&mut s)), ErrorCode::BadRequest);
    // Still in step.
    send(&mut s, &Message::Ping);
    assert_eq!(reply(&mut s), Some(Message::Done));
    // An oversized frame: told why, then closed without reading it.
    s.write_all(&((MAX_FRAME as u32 + 1).to_be_bytes()))
        .unwrap();
    assert_eq!(error_code(reply(&mut s)), ErrorCode::TooLarge);
    assert_eq!(reply(&mut s), None);
    // Garbage instead of a Hello.
    let mut g = TcpStream::connect(h.local_addr()).unwrap();
    g.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    g.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(error_code(reply(&mut g)), ErrorCode::TooLarge);
    // The client library refuses bad names before sending.
    let mut c = client(&h);
    let e = c.lookup(&"x".repeat(MAX_NAME + 1)).unwrap_err();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e:?}");
    assert!(c.register("", &addr(1)).is_err());
    // And the server serves everyone still.
    c.register("ok", &addr(9)).unwrap();
    assert_eq!(c.lookup("ok").unwrap(), addr(9));
}

#[test]
fn silent_and_slow_clients_do_not_hold_the_server() {
    let h = serve(
        RegistryOptions::default()
            .io_timeout(Duration::from_millis(200))
            .opening_timeout(Duration::from_millis(200))
            .idle_timeout(Duration::from_millis(300)),
    );
    // Connects and says nothing: dropped after the io timeout.
    let mut silent = TcpStream::connect(h.local_addr()).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // Half a frame, then nothing.
    let mut half = raw(&h);
    half.write_all(&[0, 0, 0, 40, VERSION]).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(silent.read(&mut buf).unwrap_or(0), 0, "closed");
    assert_eq!(half.read(&mut buf).unwrap_or(0), 0, "closed");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let mut c = client(&h);
    c.ping().unwrap();
}

#[test]
fn caps_bound_clients_and_entries() {
    let h = serve(RegistryOptions::default().max_clients(2).max_entries(3));
    let mut a = client(&h);
    let mut _b = client(&h);
    // Both busy a moment ago: neither is idle enough to lose its slot.
    a.ping().unwrap();
    _b.ping().unwrap();
    let e = RegistryClient::connect(h.local_addr(), ClientOptions::default()).unwrap_err();
    assert_eq!(code_of(&e), ErrorCode::Busy);
    for i in 0..3 {
        a.register(&format!("n{i}"), &addr(i)).unwrap();
    }
    let e = a.register("n3", &addr(3)).unwrap_err();
    assert_eq!(code_of(&e), ErrorCode::Full);
    assert!(e.to_string().contains("maximum of 3"), "{e}");
    a.renew("n0", &addr(0)).unwrap();
    drop(_b);
    // The freed place is reusable.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match RegistryClient::connect(h.local_addr(), ClientOptions::default()) {
            Ok(mut c) => {
                c.ping().unwrap();
                break;
            }
            Err(e) if Instant::now() < deadline => {
                assert_eq!(code_of(&e), ErrorCode::Busy);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn concurrent_clients_each_see_their_own_entries() {
    let h = serve(RegistryOptions::default());
    let at = h.local_addr();
    let threads: Vec<_> = (0..16u32)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = RegistryClient::connect(at, ClientOptions::default()).unwrap();
                for i in 0..50u32 {
                    let name = format!("t{t}-{i}");
                    let a = addr(t * 1000 + i);
                    c.register(&name, &a).unwrap();
                    assert_eq!(c.lookup(&name).unwrap(), a);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(h.entries(), 16 * 50);
    let mut c = client(&h);
    assert_eq!(c.lookup("t15-49").unwrap(), addr(15_049));
}

#[test]
fn stop_disconnects_clients_and_frees_the_port() {
    let h = serve(RegistryOptions::default());
    let at = h.local_addr();
    let mut c = client(&h);
    c.ping().unwrap();
    let t0 = Instant::now();
    h.stop();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(c.ping().is_err());
    assert!(TcpStream::connect(at).is_err() || lookup(at, "x").is_err());
    // A client timeout is a clear error.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mute = l.local_addr().unwrap();
    let opts = ClientOptions::default().timeout(Duration::from_millis(200));
    let e = RegistryClient::connect(mute, opts).unwrap_err();
    assert!(matches!(e, NetError::Timeout { .. }), "{e:?}");
    assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::TimedOut);
}

/// F13: a live name belongs to whoever registered it. Another client can neither overwrite
/// nor remove it (`NotOwner`), lookups keep returning the owner's address, and the owner (or
/// a client that shares its `owner`, a process that reconnected) renews it. (Before: any
/// client could overwrite or unregister any name and redirect its traffic.)
#[test]
fn a_name_belongs_to_its_owner() {
    let h = serve(RegistryOptions::default());
    let mut owner = client(&h);
    owner.register("svc", &addr(1)).unwrap();
    let mut thief = client(&h);
    assert_ne!(thief.owner(), owner.owner(), "owners are random per client");
    let e = thief.register("svc", &addr(66)).unwrap_err();
    assert_eq!(code_of(&e), ErrorCode::NotOwner);
    assert!(e.to_string().contains("another owner"), "{e}");
    assert_eq!(
        code_of(&thief.unregister("svc").unwrap_err()),
        ErrorCode::NotOwner
    );
    assert_eq!(lookup(h.local_addr(), "svc").unwrap(), addr(1));
    // The same owner over a new connection renews and moves it.
    let mut again = RegistryClient::connect(
        h.local_addr(),
        ClientOptions::default().owner(Some(owner.owner())),
    )
    .unwrap();
    again.register("svc", &addr(2)).unwrap();
    assert_eq!(thief.lookup("svc").unwrap(), addr(2));
    again.unregister("svc").unwrap();
    // Free again: the other client may take it now.
    thief.register("svc", &addr(3)).unwrap();
}

/// Availability: 64 silent sockets on a registry of 8 client slots do not lock a good
/// client out (the unopened ones are shed), and neither do idle clients holding every slot.
/// (Before: "too many clients" for about 5 s.)
#[test]
fn silent_sockets_and_idle_clients_do_not_lock_lookups_out() {
    let h = serve(RegistryOptions::default().max_clients(8));
    let mut owner = client(&h);
    owner.register("svc", &addr(7)).unwrap();
    drop(owner);
    let silent: Vec<_> = (0..64)
        .map(|_| TcpStream::connect(h.local_addr()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    assert_eq!(lookup(h.local_addr(), "svc").unwrap(), addr(7));
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // The silent sockets that held the places were shed (those still waiting for one when
    // their grace ran out heard Busy).
    assert!(h.shed() >= 8, "shed {}", h.shed());
    drop(silent);

    // Eight idle clients hold every slot; after a second of silence a newcomer gets in.
    let idle: Vec<_> = (0..8).map(|_| client(&h)).collect();
    std::thread::sleep(Duration::from_millis(1100));
    let before = h.shed();
    let mut c = client(&h);
    c.ping().unwrap();
    assert_eq!(h.shed(), before + 1, "one idle client made room");
    drop(idle);
}

/// Availability under a steady flood: sockets that come faster than the places turn over
/// (one a millisecond, on a registry of 4 places) and send nothing, or the start of a frame
/// and stall, do not keep good clients out, as a newcomer that has sent its whole hello goes
/// first (before: 10 of 10 lookups heard `Busy`, each behind hundreds of such sockets, and
/// then again with two bytes sent: outside testers' finds).
#[test]
fn a_steady_flood_of_silent_or_stalled_sockets_does_not_lock_lookups_out() {
    for first_bytes in [&[][..], &[0, 0][..], &[0, 0, 0, 38, 2][..]] {
        flood_then_lookups(first_bytes);
    }
}

/// [`a_steady_flood_of_silent_or_stalled_sockets_does_not_lock_lookups_out`] with sockets
/// that send `first_bytes`.
fn flood_then_lookups(first_bytes: &'static [u8]) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let h = serve(RegistryOptions::default().max_clients(4));
    let at = h.local_addr();
    let mut owner = client(&h);
    owner.register("svc", &addr(7)).unwrap();
    drop(owner);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Each socket stays open 300 ms (the descriptors of both ends stay well below
            // the usual limit of 1024).
            let mut open = std::collections::VecDeque::new();
            let mut made = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut s) = TcpStream::connect(at) {
                    let _ = s.write_all(first_bytes);
                    open.push_back(s);
                    made += 1;
                }
                if open.len() > 300 {
                    open.pop_front();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            made
        })
    };
    std::thread::sleep(Duration::from_millis(400));
    for k in 0..10 {
        match lookup(at, "svc") {
            Ok(a) => assert_eq!(a, addr(7)),
            Err(e) => panic!("{first_bytes:?}: lookup {k} during the flood: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let made = flood.join().unwrap();
    assert!(made > 500, "the flood made only {made} sockets");
}

/// A client's `Debug` names its registry, not its buffers or its owner token (it dumped the
/// last request's bytes and the 16-byte owner: an outside tester's note).
#[test]
fn a_clients_debug_shows_no_bytes() {
    let h = serve(RegistryOptions::default());
    let mut c = client(&h);
    c.register("svc", &addr(7)).unwrap();
    let shown = format!("{c:?}");
    assert!(shown.starts_with("RegistryClient"), "{shown}");
    assert!(shown.contains(&h.local_addr().to_string()), "{shown}");
    assert!(!shown.contains("owner") && !shown.contains('['), "{shown}");
}

/// A lease of any length (`Duration::MAX` on either side) is clamped, never a panic that
/// would leak the client's slot.
#[test]
fn huge_leases_are_clamped() {
    let h = serve(
        RegistryOptions::default()
            .lease(Duration::MAX)
            .max_clients(1),
    );
    let mut c = client(&h);
    c.register_for("far", &addr(1), Duration::MAX).unwrap();
    c.register("far", &addr(2)).unwrap();
    assert_eq!(c.lookup("far").unwrap(), addr(2));
    drop(c);
    // The one slot came back.
    let t0 = Instant::now();
    loop {
        match RegistryClient::connect(h.local_addr(), ClientOptions::default()) {
            Ok(mut c) => break c.ping().unwrap(),
            Err(e) if t0.elapsed() < Duration::from_secs(5) => {
                assert_eq!(code_of(&e), ErrorCode::Busy);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A `Registration` keeps a name past its lease for as long as it lives, and removes it
/// when dropped. (Before: leases had to be renewed by hand; a name registered with a 2 s
/// lease was gone 3 s later.)
#[test]
fn a_registration_renews_itself_until_dropped() {
    let h = serve(RegistryOptions::default().lease(Duration::from_millis(300)));
    let kept = rsrdma_net::registry::Registration::keep(
        h.local_addr(),
        ClientOptions::default(),
        "kept",
        addr(5),
    )
    .unwrap();
    assert_eq!(kept.lease(), Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(lookup(h.local_addr(), "kept").unwrap(), addr(5), "renewed");
    drop(kept);
    let e = lookup(h.local_addr(), "kept").unwrap_err();
    assert_eq!(code_of(&e), ErrorCode::NotFound, "unregistered on drop");
}

/// With a secret, every request and reply after the opening is sealed: an on-path attacker
/// that flips one byte of a reply (here: the GID of a lookup's answer, which would redirect
/// the client's traffic) is caught, and the client gets an error instead of a wrong address.
/// (Before: the proofs covered only the opening, and the rewritten address was returned.)
#[test]
fn a_reply_rewritten_on_the_path_is_caught_with_a_secret() {
    use std::net::TcpListener;
    let secret = b"registry secret, 16+ bytes".to_vec();
    let h = serve(RegistryOptions::default().secret(secret.clone()));
    let mut owner = RegistryClient::connect(
        h.local_addr(),
        ClientOptions::default().secret(secret.clone()),
    )
    .unwrap();
    owner.register("svc", &addr(1)).unwrap();
    // The attacker: forwards both ways, flipping the first GID byte of the first reply after
    // the opening (Welcome is 43 bytes, the registry's Proof 38; then 4 + 2 into the Found).
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = proxy.local_addr().unwrap();
    let target = h.local_addr();
    std::thread::spawn(move || {
        let (client, _) = proxy.accept().unwrap();
        let server = TcpStream::connect(target).unwrap();
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut c_in, &mut s_out);
        });
        let (mut s_in, mut c_out) = (server, client);
        let mut seen = 0usize;
        let mut buf = [0u8; 4096];
        loop {
            let n = match s_in.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            const FLIP_AT: usize = 43 + 38 + 4 + 2;
            if (seen..seen + n).contains(&FLIP_AT) {
                buf[FLIP_AT - seen] ^= 0x80;
            }
            seen += n;
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut victim = RegistryClient::connect(at, ClientOptions::default().secret(secret)).unwrap();
    match victim.lookup("svc") {
        Ok(a) => panic!(
            "a rewritten address was returned: {a:?} (registered {:?})",
            addr(1)
        ),
        Err(e) => {
            assert!(matches!(e, NetError::Auth(_)), "{e:?}");
            assert!(e.to_string().contains("tampered"), "{e}");
        }
    }
}

/// A call that timed out leaves the client out of step: the late reply would answer the next
/// call (a lookup of "b" returned the address of "a"). Every later call now fails instead,
/// and a new connection works. A fake registry answers the first lookup late.
#[test]
fn a_timed_out_call_never_answers_the_next_one() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        for late in [true, false] {
            let (mut s, _) = listener.accept().unwrap();
            assert!(matches!(reply(&mut s), Some(Message::Hello { .. })));
            send(
                &mut s,
                &Message::Welcome {
                    auth_required: false,
                    nonce: [1; 32],
                },
            );
            let mut n = 1;
            while let Some(Message::Lookup { .. }) = reply(&mut s) {
                if late && n == 1 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                let found = Message::Found {
                    addr: addr(n),
                    lease_left_ms: 1000,
                };
                n += 1;
                if s.write_all(&{
                    let mut out = Vec::new();
                    codec::encode(&found, &mut out).unwrap();
                    out
                })
                .is_err()
                {
                    break;
                }
            }
        }
    });
    let opts = ClientOptions::default().timeout(Duration::from_millis(100));
    let mut c = RegistryClient::connect(at, opts.clone()).unwrap();
    let e = c.lookup("a").unwrap_err();
    assert!(matches!(e, NetError::Timeout { .. }), "{e:?}");
    std::thread::sleep(Duration::from_millis(400));
    let e = c.lookup("b").unwrap_err();
    assert!(matches!(e, NetError::Closed { .. }), "{e:?}");
    drop(c);
    let mut c = RegistryClient::connect(at, opts).unwrap();
    assert_eq!(c.lookup("b").unwrap(), addr(1));
    drop(c);
    fake.join().unwrap();
}

/// A registration whose registry went away retries sooner than it renews, but not without
/// bound: no sooner than a tenth of the lease (it settled at one connection and one warning
/// every 50 ms, for ever).
#[test]
fn a_registration_without_its_registry_retries_at_a_bounded_rate() {
    let h = serve(RegistryOptions::default().lease(Duration::from_secs(2)));
    let at = h.local_addr();
    let tries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = tries.clone();
    let kept = rsrdma_net::registry::Registration::keep_on(
        move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            RegistryClient::connect(at, ClientOptions::default())
        },
        "gone",
        addr(6),
    )
    .unwrap();
    h.stop();
    // The first renewal (at a third of the lease) fails; then 1.5 s of retries.
    std::thread::sleep(Duration::from_millis(800));
    let before = tries.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(1500));
    let during = tries.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert!(
        (1..=10).contains(&during),
        "{during} connects in 1.5 s with a 2 s lease"
    );
    drop(kept);
}

/// Options that cannot work are refused before anything is served or dialed (an idle
/// timeout of zero dropped every client right after its Welcome; a client timeout of zero
/// failed inside the connect with an I/O error).
#[test]
fn zero_timeouts_are_refused_up_front() {
    for opts in [
        RegistryOptions::default().idle_timeout(Duration::ZERO),
        RegistryOptions::default().io_timeout(Duration::ZERO),
    ] {
        let e = Registry::serve_with("127.0.0.1:0", opts).unwrap_err();
        assert!(matches!(e, NetError::InvalidArgument(_)), "{e:?}");
    }
    let h = serve(RegistryOptions::default());
    let e = RegistryClient::connect(
        h.local_addr(),
        ClientOptions::default().timeout(Duration::ZERO),
    )
    .unwrap_err();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e:?}");
}

/// A lease under a millisecond is the shortest lease, not the longest: it once became 0 ms,
/// which asks for the registry's default (an outside tester's 1 ns lease was granted 2 s).
#[test]
fn a_lease_under_a_millisecond_is_the_shortest() {
    let h = serve(RegistryOptions::default().lease(Duration::from_secs(30)));
    let mut c = client(&h);
    for (asked, granted) in [
        (Duration::from_nanos(1), 1),
        (Duration::from_micros(999), 1),
        (Duration::from_micros(1500), 2),
    ] {
        let name = format!("l{}", asked.as_nanos());
        assert_eq!(
            c.register_for(&name, &addr(1), asked).unwrap(),
            Duration::from_millis(granted),
            "{asked:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(code_of(&c.lookup("l1").unwrap_err()), ErrorCode::NotFound);
}

/// A burst of good one-shot clients, twice as many at once as the registry serves: every
/// lookup succeeds. A newcomer once shed the oldest client that had not opened yet, however
/// young, so the burst's clients cut one another off with an unclear `PeerClosed` (an outside
/// tester: 8 threads on a registry of 4 places got 408 of 800 lookups).
#[test]
fn a_burst_of_one_shot_clients_past_max_clients_is_served_whole() {
    let h = serve(RegistryOptions::default().max_clients(4));
    let mut owner = client(&h);
    owner.register("svc", &addr(9)).unwrap();
    drop(owner);
    let at = h.local_addr();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                (0..40)
                    .filter_map(|_| lookup(at, "svc").err())
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let failed: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 320 lookups failed, first: {:?} (shed {})",
        failed.len(),
        failed.first(),
        h.shed()
    );
}

/// Each newcomer to a full registry whose clients are all busy waits for a place (up to
/// `BUSY_GRACE`) before it hears `Busy`, however long the registry has been full: the wait
/// once counted from when the registry filled, so after 200 ms of it every newcomer heard
/// `Busy` at once (an outside tester's newcomers: 3 to 12 ms).
#[test]
fn each_newcomer_to_a_busy_registry_waits_its_grace() {
    use rsrdma_net::registry::BUSY_GRACE;
    let h = serve(RegistryOptions::default().max_clients(1));
    let at = h.local_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        let mut c = client(&h);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.ping().unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(BUSY_GRACE * 2);
    for _ in 0..3 {
        let t0 = Instant::now();
        let e = RegistryClient::connect(at, ClientOptions::default()).unwrap_err();
        let waited = t0.elapsed();
        assert_eq!(code_of(&e), ErrorCode::Busy);
        assert!(waited >= BUSY_GRACE / 2, "Busy after {waited:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.join().unwrap();
}

/// A `Registration` dropped after the registry shed its (idle) connection still unregisters
/// its name, on a new connection: the name once stayed, held by its owner, for the lease.
#[test]
fn a_registration_whose_connection_was_shed_still_unregisters() {
    use rsrdma_net::registry::Registration;
    let h = serve(RegistryOptions::default().max_clients(1));
    let kept =
        Registration::keep(h.local_addr(), ClientOptions::default(), "kept", addr(3)).unwrap();
    // Idle past MIN_IDLE_TO_SHED: a newcomer's lookup sheds the kept connection.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(lookup(h.local_addr(), "kept").unwrap(), addr(3));
    assert!(h.shed() >= 1, "the kept connection was not shed");
    drop(kept);
    let e = lookup(h.local_addr(), "kept").unwrap_err();
    assert_eq!(code_of(&e), ErrorCode::NotFound);
}
