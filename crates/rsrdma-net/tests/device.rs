//! RawConn on a real device (rxe0 in the VM): pipelines, one-sided Write and Read checked byte
//! for byte, batching, authentication, bad peers, a peer that dies mid-transfer, connections
//! sharing one protection domain and memory region, and event-mode completions.

use rsrdma::{AccessFlags, Mr, Pd, RecvWr, SendWr, Wc};
use rsrdma_net::{Completion, NetError, RawConn, RawListener, RawOptions};
use std::thread;
use std::time::{Duration, Instant};

mod support;

fn device() -> String {
    std::env::var("RSRDMA_TEST_DEVICE").unwrap_or_else(|_| "rxe0".into())
}

fn opts() -> RawOptions {
    RawOptions::default()
        .device(device())
        .gid_index(
            std::env::var("RSRDMA_TEST_GID_INDEX")
                .ok()
                .and_then(|v| v.parse().ok()),
        )
        .timeout(Duration::from_secs(20))
}

/// A connected pair: (the dialing side, the accepting side).
fn connected(client: RawOptions, server: RawOptions) -> (RawConn, RawConn) {
    let l = RawListener::bind("127.0.0.1:0", server).unwrap();
    let addr = l.local_addr().unwrap();
    let t = thread::spawn(move || l.accept().unwrap());
    let c = RawConn::dial(addr, client).unwrap();
    (c, t.join().unwrap())
}

/// Fills `mr` through `write_at`, which is sound for remotely writable regions too.
fn pattern(mr: &mut Mr, seed: u8) {
    let bytes = pattern_bytes(mr.len(), seed);
    mr.write_at(0, &bytes).unwrap();
}

/// A copy of the region's bytes (`read_at`: no reference to memory a peer may write).
fn snap(mr: &Mr) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read_at(0, &mut v).unwrap();
    v
}

fn pattern_bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn one_sided_write_and_read_byte_for_byte() {
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let server_opts = opts().remote_access(remote);
    let (mut c, mut s) = connected(opts(), server_opts);
    let len = 256 * 1024;
    let mut exposed = s
        .register_memory(len, AccessFlags::LOCAL_WRITE | remote)
        .unwrap();
    pattern(&mut exposed, 1);
    let mut local = c.register_memory(len, AccessFlags::LOCAL_WRITE).unwrap();
    pattern(&mut local, 77);
    let st = thread::spawn(move || {
        s.exchange_memory(&[&exposed]).unwrap();
        s.sync().unwrap(); // the client wrote
        let after_write = snap(&exposed);
        pattern(&mut exposed, 200);
        s.sync().unwrap(); // the client may read now
        s.sync().unwrap(); // the client read
        (after_write, snap(&exposed), s)
    });
    let peer = c.exchange_memory(&[]).unwrap()[0];
    assert_eq!(peer.len, len as u64);
    // Write all of `local` into the peer's region, in 16 KiB pieces, 8 in flight.
    let piece = 16 * 1024;
    let sges: Vec<_> = (0..len / piece)
        .map(|i| [local.sge(i * piece, piece).unwrap()])
        .collect();
    // SAFETY: `local` outlives the pipeline, which reaps every completion before returning.
    let stats = unsafe {
        c.pipeline(sges.len() as u64, 8, |id| {
            let i = id as usize;
            SendWr::rdma_write(
                id,
                &sges[i],
                peer.addr_at((i * piece) as u64, piece as u64).unwrap(),
                peer.rkey,
            )
        })
    }
    .unwrap();
    assert_eq!(stats.completed, 16);
    assert_eq!(stats.bytes, len as u64);
    c.sync().unwrap();
    c.sync().unwrap();
    // Read it all back into a fresh buffer.
    let back = c.register_memory(len, AccessFlags::LOCAL_WRITE).unwrap();
    let rsges: Vec<_> = (0..len / piece)
        .map(|i| [back.sge(i * piece, piece).unwrap()])
        .collect();
    // SAFETY: as above.
    unsafe {
        c.pipeline_batch(rsges.len() as u64, 8, 4, |id| {
            let i = id as usize;
            SendWr::rdma_read(
                id,
                &rsges[i],
                peer.addr_at((i * piece) as u64, piece as u64).unwrap(),
                peer.rkey,
            )
        })
    }
    .unwrap();
    c.sync().unwrap();
    let (after_write, server_now, s) = st.join().unwrap();
    assert!(
        after_write == snap(&local),
        "the server's region holds exactly what was written"
    );
    assert!(
        snap(&back) == server_now[..],
        "the read brought back exactly the server's bytes"
    );
    let t = thread::spawn(move || s.close().unwrap());
    c.close().unwrap();
    t.join().unwrap();
}

#[test]
fn send_pipelines_per_wr_and_batched_against_recv_drain() {
    let (mut c, mut s) = connected(opts(), opts());
    let size = 4096;
    let depth = 32u32;
    let iters = 2000u64;
    for batch in [1u32, 16] {
        let recv = s
            .register_memory(size * depth as usize, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let mut send = c
            .register_memory(size * depth as usize, AccessFlags::NONE)
            .unwrap();
        pattern(&mut send, batch as u8);
        let expect: Vec<u8> = snap(&send);
        let rx = thread::spawn(move || {
            let sges: Vec<_> = (0..depth as usize)
                .map(|i| [recv.sge(i * size, size).unwrap()])
                .collect();
            // SAFETY: `recv` outlives the drain; slots are read only after it returns.
            let st = unsafe {
                s.recv_drain(iters, depth, |id| {
                    RecvWr::new(id, &sges[(id % depth as u64) as usize])
                })
            }
            .unwrap();
            s.sync().unwrap();
            (st, recv, s)
        });
        // No barrier first: receives the server has not posted yet are covered by RNR retries.
        let sges: Vec<_> = (0..depth as usize)
            .map(|i| [send.sge(i * size, size).unwrap()])
            .collect();
        // SAFETY: `send` outlives the pipeline and is not written during it.
        let st = unsafe {
            if batch == 1 {
                c.pipeline(iters, depth, |id| {
                    SendWr::send(id, &sges[(id % depth as u64) as usize])
                })
            } else {
                c.pipeline_batch(iters, depth, batch, |id| {
                    SendWr::send(id, &sges[(id % depth as u64) as usize])
                })
            }
        }
        .unwrap();
        assert_eq!(st.completed, iters);
        assert_eq!(st.bytes, iters * size as u64);
        if batch > 1 {
            assert!(
                st.post_calls < iters / 4,
                "batched: {} post calls for {iters} WRs",
                st.post_calls
            );
        } else {
            assert_eq!(st.post_calls, iters);
        }
        c.sync().unwrap(); // pairs with the server's sync after its drain
        let (rst, recv, s2) = rx.join().unwrap();
        s = s2;
        assert_eq!(rst.completed, iters);
        assert_eq!(rst.bytes, iters * size as u64);
        assert!(
            snap(&recv) == expect[..],
            "every slot holds the last message sent into it"
        );
    }
}

/// Depths settle on what the peer can take, and a barrier returns on both sides.
#[test]
fn barriers_and_settled_options() {
    let small = opts().send_depth(16u32).recv_depth(8u32);
    let (mut c, s) = connected(opts(), small);
    assert_eq!(
        c.settled().send_depth,
        8,
        "the client may send no more than the server can receive"
    );
    let t = thread::spawn(move || {
        let mut s = s;
        s.sync().unwrap();
        s
    });
    c.sync().unwrap();
    t.join().unwrap();
}

/// Posts `wr` (signaled) on `c` and returns its one completion, waiting at most 10 s.
///
/// # Safety
/// As [`RawConn::post_send`]: the memory `wr` names stays alive until this returns.
unsafe fn send_and_reap(c: &RawConn, wr: &SendWr<'_>) -> Wc {
    // SAFETY: the caller's contract.
    unsafe { c.post_send(wr) }.unwrap();
    let mut wcs = [Wc::default(); 4];
    let n = c
        .send_cq()
        .poll_blocking(&mut wcs, Duration::from_secs(10))
        .unwrap();
    assert_eq!(n, 1);
    wcs[0]
}

/// A listener whose options cannot work on its device is refused at its bind, with the
/// reason: it bound and then failed every peer's handshake on its own side, its `accept`
/// never returning (only the dialers heard why).
#[test]
fn a_listener_whose_options_cannot_work_is_refused_at_bind() {
    let e = RawListener::bind("127.0.0.1:0", opts().device("nope0")).unwrap_err();
    assert!(e.to_string().contains("nope0"), "{e}");
    let e = RawListener::bind("127.0.0.1:0", opts().send_depth(1 << 24)).unwrap_err();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("send_depth"), "{e}");
    assert!(RawListener::bind("127.0.0.1:0", opts().port(2)).is_err());
    assert!(RawListener::bind("127.0.0.1:0", opts().gid_index(Some(200))).is_err());
    let conn = rsrdma_net::ConnOptions::default()
        .establish(rsrdma_net::Establish::Tcp)
        .device("nope0");
    let e = rsrdma_net::Listener::bind("127.0.0.1:0", conn).unwrap_err();
    assert!(e.to_string().contains("nope0"), "{e}");
    // Found by an outside tester (each bound fine, then every peer failed its handshake,
    // the dialer with an unclear error): a CQ or a shared pool past the device's queues,
    // parameters the handshake cannot carry or never match, a device other than the one
    // a bound rdma_cm address is on.
    let tcp = rsrdma_net::ConnOptions::default().establish(rsrdma_net::Establish::Tcp);
    for (what, o) in [
        // Past max_qp_wr (soft0, 16384) or, where that is larger (rxe), past max_cqe.
        ("recv_slots", tcp.clone().slot_size(64).recv_slots(32768)),
        (
            "completion queue",
            tcp.clone().slot_size(64).recv_slots(16384).sq_depth(16384),
        ),
        (
            "SharedRecv",
            tcp.clone()
                .shared_recv(Some(rsrdma_net::SharedRecv::new(u32::MAX))),
        ),
    ] {
        let e = rsrdma_net::Listener::bind("127.0.0.1:0", o).unwrap_err();
        assert!(matches!(e, NetError::InvalidArgument(_)), "{what}: {e}");
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
    let many: Vec<(u16, u64)> = (0..300).map(|k| (k, 0)).collect();
    let e = RawListener::bind("127.0.0.1:0", opts().params(many)).unwrap_err();
    assert!(e.to_string().contains("params"), "{e}");
    let twice = vec![(1, 2), (1, 3)];
    let e = RawListener::bind("127.0.0.1:0", opts().params(twice)).unwrap_err();
    assert!(e.to_string().contains("twice"), "{e}");
    let cm = rsrdma_net::ConnOptions::default()
        .establish(rsrdma_net::Establish::Cm)
        .device("nope0");
    let e = rsrdma_net::Listener::bind(format!("{}:0", support::ip()), cm).unwrap_err();
    assert!(e.to_string().contains("nope0"), "{e}");
    // What fits binds, as before.
    drop(RawListener::bind("127.0.0.1:0", opts()).unwrap());
}

/// A client (`client`'s options) connected to a server (`server`'s, granting remote WRITE)
/// that exposes a 4 KiB region: the client, the server's region as the client sees it, a
/// 4 KiB region of the client's, and the server's thread (join it last: it returns the
/// exposed region and the server).
fn writing_to_an_exposed_region(
    client: RawOptions,
    server: RawOptions,
) -> (
    RawConn,
    rsrdma_net::RemoteMemory,
    Mr,
    thread::JoinHandle<(Mr, RawConn)>,
) {
    let remote = AccessFlags::REMOTE_WRITE;
    let (mut c, mut s) = connected(client, server.remote_access(remote));
    let exposed = s
        .register_memory(4096, AccessFlags::LOCAL_WRITE | remote)
        .unwrap();
    let server = thread::spawn(move || {
        s.exchange_memory(&[&exposed]).unwrap();
        (exposed, s)
    });
    let peer = c.exchange_memory(&[]).unwrap()[0];
    let local = c.register_memory(4096, AccessFlags::LOCAL_WRITE).unwrap();
    (c, peer, local, server)
}

/// A run takes the send CQ's completions as its own: one of the caller's own requests, not
/// reaped before the run (its `wr_id` the largest there is), is refused with a clear error,
/// not counted as the run's (which could end the run with its own requests in flight) nor
/// overflowing its count.
#[test]
fn a_run_refuses_a_completion_it_did_not_post() {
    let (mut c, peer, local, server) = writing_to_an_exposed_region(opts(), opts());
    let sge = [local.sge(0, 64).unwrap()];
    let at = peer.addr_at(0, 64).unwrap();
    let mine = SendWr::rdma_write(u64::MAX, &sge, at, peer.rkey).signaled(true);
    // SAFETY: `local` and the peer's region outlive every request here (the run reaps its
    // own, or stops the queue pair and reaps everything when it fails).
    unsafe { c.post_send(&mine) }.unwrap();
    thread::sleep(Duration::from_millis(200));
    // SAFETY: as above.
    let r = unsafe { c.pipeline_batch(4, 4, 2, |id| SendWr::rdma_write(id, &sge, at, peer.rkey)) };
    assert!(
        matches!(r, Err(NetError::InvalidArgument(_))),
        "a run that met a completion it did not post: {r:?}"
    );
    drop(server.join().unwrap());
}

/// Posting without reaping: a provider may free a send queue slot when it makes the
/// completion (rxe, soft0), so nothing stopped a caller's posts before the send CQ overran,
/// losing completions and failing the queue pair (an outside tester's find: 129 signaled
/// WRITEs posted `Ok`, 128 completions, the 129th's never). Now a post past what the send CQ
/// holds is refused with ENOMEM, as a full send queue is, singly and in a batch (those before
/// the refused one posted); every accepted request completes, and after reaping, posts go on.
#[test]
fn posts_past_the_send_cqs_room_are_refused_and_none_is_lost() {
    let (c, peer, local, server) = writing_to_an_exposed_region(opts(), opts());
    let sge = [local.sge(0, 64).unwrap()];
    let at = peer.addr_at(0, 64).unwrap();
    let write = |id| SendWr::rdma_write(id, &sge, at, peer.rkey).signaled(true);
    let refused = |r: Result<(), NetError>| match r {
        Err(NetError::Verbs(rsrdma::Error::Post { errno, index, .. })) => {
            assert_eq!(errno, libc::ENOMEM);
            index
        }
        other => panic!("expected ENOMEM: {other:?}"),
    };
    let reap_all = |want: u64| {
        let mut wcs = [Wc::default(); 32];
        let (mut got, t0) = (0u64, Instant::now());
        while got < want {
            assert!(t0.elapsed() < Duration::from_secs(20), "{got} of {want}");
            let n = c.poll_send(&mut wcs).unwrap();
            for wc in &wcs[..n] {
                wc.ok().unwrap();
            }
            got += n as u64;
        }
        thread::sleep(Duration::from_millis(100));
        assert_eq!(
            c.poll_send(&mut wcs).unwrap(),
            0,
            "no completion beyond those posted"
        );
    };
    // One at a time, without polling, until refused (give every request time to complete,
    // which frees its send queue slot on these providers).
    let mut posted = 0u64;
    let first_refusal = loop {
        assert!(posted < 4096, "4096 posts without reaping were all taken");
        // SAFETY: `local` and the peer's region outlive every request here.
        match unsafe { c.post_send(&write(posted)) } {
            Ok(()) => posted += 1,
            r => break r,
        }
        if posted % 16 == 0 {
            thread::sleep(Duration::from_millis(5));
        }
    };
    refused(first_refusal);
    assert!(posted >= 1);
    reap_all(posted);
    // A batch past the room: the part that fits is posted, the rest refused from its first.
    let mut batch: Vec<_> = (0..posted + 4).map(write).collect();
    // SAFETY: as above.
    let index = refused(unsafe { c.post_send_batch(&mut batch) });
    assert!(
        (1..batch.len()).contains(&index),
        "the batch was cut where the room ended: {index} of {}",
        batch.len()
    );
    reap_all(index as u64);
    // SAFETY: as above.
    unsafe { c.post_send(&write(0)) }.unwrap();
    reap_all(1);
    drop(server.join().unwrap());
}

/// The guide's way of reaping (`send_cq().poll_blocking`, not `poll_send`) makes room too:
/// only `poll_send` was counted, so the send depth's worth of posts later every post was
/// refused with ENOMEM, although every completion had been reaped (an outside tester's
/// find), and a pipeline after it failed at once. Many times the send depth, one post and
/// one poll of the CQ each, then a pipeline; and a direct poll of a full room makes room.
#[test]
fn completions_reaped_through_the_send_cq_make_room_for_posts() {
    let (mut c, peer, local, server) = writing_to_an_exposed_region(opts(), opts());
    let sge = [local.sge(0, 64).unwrap()];
    let at = peer.addr_at(0, 64).unwrap();
    let depth = u64::from(c.qp().caps().max_send_wr);
    let mut wcs = [Wc::default(); 16];
    for id in 0..depth * 3 + 5 {
        let write = SendWr::rdma_write(id, &sge, at, peer.rkey).signaled(true);
        // SAFETY: `local` and the peer's region outlive every request here.
        unsafe { c.post_send(&write) }.unwrap_or_else(|e| panic!("post {id}: {e}"));
        let n = c
            .send_cq()
            .poll_blocking(&mut wcs[..1], Duration::from_secs(10))
            .unwrap();
        assert_eq!((n, wcs[0].wr_id()), (1, id));
        wcs[0].ok().unwrap();
    }
    // Posts until refused, then reaped through the CQ alone: posts go on.
    let mut posted = 0u64;
    loop {
        assert!(posted < 4096, "4096 posts without reaping were all taken");
        let write = SendWr::rdma_write(posted, &sge, at, peer.rkey).signaled(true);
        // SAFETY: as above.
        if unsafe { c.post_send(&write) }.is_err() {
            break;
        }
        posted += 1;
        if posted % 16 == 0 {
            thread::sleep(Duration::from_millis(5));
        }
    }
    let mut got = 0u64;
    while got < posted {
        got += c
            .send_cq()
            .poll_blocking(&mut wcs, Duration::from_secs(10))
            .unwrap() as u64;
    }
    // SAFETY: as above.
    let stats =
        unsafe { c.pipeline(1000, 64, |id| SendWr::rdma_write(id, &sge, at, peer.rkey)) }.unwrap();
    assert_eq!(stats.completed, 1000);
    drop(server.join().unwrap());
}

/// A pipeline's depth of 0 is refused, and a batch over the depth names each bound the depth
/// was cut to (it once named the caller's own depth as "the settled send depth", and took a
/// depth of 0 as 1). Neither stops the connection: a good run follows.
#[test]
fn a_pipelines_bad_depth_or_batch_names_its_bounds() {
    let (mut c, peer, local, server) =
        writing_to_an_exposed_region(opts().send_depth(256), opts().recv_depth(512));
    let sge = [local.sge(0, 64).unwrap()];
    let at = peer.addr_at(0, 64).unwrap();
    let write = |id| SendWr::rdma_write(id, &sge, at, peer.rkey);
    // SAFETY: `local` and the peer's region outlive every request here.
    let r = unsafe { c.pipeline(4, 0, write) };
    match r {
        Err(NetError::InvalidArgument(m)) => assert!(m.contains("at least 1"), "{m}"),
        other => panic!("a depth of 0: {other:?}"),
    }
    // SAFETY: as above.
    let r = unsafe { c.pipeline_batch(4, 64, 100, write) };
    match r {
        Err(NetError::InvalidArgument(m)) => {
            assert!(m.contains("depth 64"), "{m}");
            assert!(m.contains("asked for, 64"), "{m}");
            assert!(m.contains("settled send depth, 256"), "{m}");
        }
        other => panic!("a batch over the depth: {other:?}"),
    }
    // SAFETY: as above.
    let done = unsafe { c.pipeline_batch(16, 8, 4, write) }.unwrap();
    assert_eq!(done.completed, 16);
    drop(server.join().unwrap());
}

/// Waits until `l` counted `n` failed peers: a bad peer the listener has not finished with
/// yet has not opened, so the flood of silent sockets after it could shed it instead.
fn wait_failed(l: &RawListener, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while l.counters().failed < n {
        assert!(std::time::Instant::now() < deadline, "{:?}", l.counters());
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn authentication_and_bad_peers() {
    let secret = opts().secret(b"open sesame, 16+ bytes".to_vec());
    let l = std::sync::Arc::new(RawListener::bind("127.0.0.1:0", secret.clone()).unwrap());
    let addr = l.local_addr().unwrap();
    // One accept, as a user writes it: the bad peers before the good one never reach it.
    let server = {
        let l = l.clone();
        thread::spawn(move || l.accept().map(|_| ()).map_err(|e| e.to_string()))
    };
    // 1. garbage, 2. no secret, 3. wrong secret, 4. 100 silent sockets, 5. the right secret.
    {
        use std::io::Write;
        let mut t = std::net::TcpStream::connect(addr).unwrap();
        t.write_all(&[0xde; 64]).unwrap();
        wait_failed(&l, 1);
    }
    let e = RawConn::dial(addr, opts()).unwrap_err();
    assert!(
        matches!(e, NetError::Auth(_) | NetError::PeerAborted(_)),
        "{e}"
    );
    if matches!(e, NetError::PeerAborted(_)) {
        // The listener told it why: it counted the failure before it did.
        assert_eq!(l.counters().failed, 2, "{:?}", l.counters());
    }
    let e = RawConn::dial(addr, opts().secret(b"a guess of 16+ bytes".to_vec())).unwrap_err();
    // The listener's refusal of its proof is this dialer's authentication failure.
    assert!(matches!(e, NetError::Auth(_)), "{e}");
    wait_failed(&l, 3);
    let silent: Vec<_> = (0..100)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let t0 = std::time::Instant::now();
    let c = RawConn::dial(addr, secret).unwrap();
    let took = t0.elapsed();
    server.join().unwrap().unwrap();
    let n = l.counters();
    eprintln!("raw listener: good client behind 100 silent sockets in {took:?}; {n:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(n.accepted, 1);
    assert!(
        n.failed >= 3,
        "garbage, no secret and a wrong one counted: {n:?}"
    );
    drop((c, silent));
}

/// Without a secret, peers that send a valid hello and then nothing cannot hold a listener:
/// until their first step after the hello they have not opened, so a new peer sheds them and
/// the opening timeout ends them. (Before: a hello "opened" the peer, so eight of them held a
/// listener of eight places for the whole handshake timeout, 20 s here, and a good client
/// behind them waited that long.)
#[test]
fn peers_that_send_a_hello_and_then_nothing_do_not_hold_a_listener() {
    use std::io::Read;
    let l =
        std::sync::Arc::new(RawListener::bind("127.0.0.1:0", opts().max_handshakes(8)).unwrap());
    let addr = l.local_addr().unwrap();
    let server = {
        let l = l.clone();
        thread::spawn(move || l.accept().map(|_| ()).map_err(|e| e.to_string()))
    };
    let mut silent = support::hello_then_silent(addr, 8);
    // Let the listener take them all and run their handshakes up to the wait after the hello.
    let t = Instant::now();
    while l.counters().failed + l.counters().shed == 0 && t.elapsed() < Duration::from_millis(500) {
        thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    let c = RawConn::dial(addr, opts()).unwrap();
    let took = t0.elapsed();
    server.join().unwrap().unwrap();
    support::assert_good_client_in_time(took, l.counters());
    // Every silent peer's socket ends within the opening timeout (3 s), not the 20 s one.
    let t1 = Instant::now();
    for s in &mut silent {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 4096];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    }
    let ended = t1.elapsed();
    assert!(
        ended < Duration::from_secs(6),
        "silent peers held on for {ended:?}"
    );
    let n = l.counters();
    assert_eq!((n.accepted, n.failed + n.shed), (1, 8), "{n:?}");
    drop(c);
}

#[test]
fn mismatched_parameters_fail_on_both_ends() {
    let l = RawListener::bind("127.0.0.1:0", opts().params(vec![(1, 4096)])).unwrap();
    let addr = l.local_addr().unwrap();
    let l = std::sync::Arc::new(l);
    let t = {
        let l = l.clone();
        thread::spawn(move || l.accept_timeout(Duration::from_secs(3)).map(drop))
    };
    let e = RawConn::dial(addr, opts().params(vec![(1, 65536)]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("65536") && e.contains("4096"), "{e}");
    // The listener's side failed too: logged and counted, never handed out.
    let se = t.join().unwrap().unwrap_err();
    assert!(matches!(se, NetError::Timeout { .. }), "{se}");
    assert_eq!(l.counters().failed, 1, "{:?}", l.counters());
}

#[test]
fn a_receiver_notices_a_dead_sender_within_seconds() {
    // The peer vanishes (its QP and TCP socket gone), or gives up and says why: the drain
    // ends within seconds with PeerClosed, or with PeerAborted and the peer's reason.
    // (Before: an abort was also reported as PeerClosed, its reason lost.)
    for abort in [false, true] {
        let (mut c, mut s) = connected(opts(), opts());
        let recv = s.register_memory(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = [recv.sge(0, 4096).unwrap()];
        let (drained, wait_drained) = std::sync::mpsc::channel::<()>();
        let killer = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            if abort {
                let why = NetError::InvalidArgument("the sender's disk is full".into());
                c.channel_mut().abort(why);
                // Its socket stays open: only the abort can end the drain.
                let _ = wait_drained.recv();
            }
            drop(c);
        });
        let t0 = Instant::now();
        // SAFETY: `recv` outlives the drain.
        let e = unsafe { s.recv_drain(1 << 40, 16, |id| RecvWr::new(id, &sge)) }.unwrap_err();
        match abort {
            false => assert!(matches!(e, NetError::PeerClosed(_)), "{e}"),
            true => assert!(
                matches!(&e, NetError::PeerAborted(why) if why.contains("disk is full")),
                "{e}"
            ),
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "noticed after {:?}",
            t0.elapsed()
        );
        drop((s, drained));
        killer.join().unwrap();
    }
}

/// A sender whose peer goes in the middle of a run hears that the peer left (as a receiver
/// does), not only the status its requests failed with (`RETRY_EXC_ERR` or a flush).
#[test]
fn a_sender_whose_peer_goes_mid_run_hears_that_it_left() {
    let remote = AccessFlags::REMOTE_WRITE;
    let (mut c, mut s) = connected(opts(), opts().remote_access(remote));
    let exposed = s
        .register_memory(64 * 1024, AccessFlags::LOCAL_WRITE | remote)
        .unwrap();
    let server = thread::spawn(move || {
        s.exchange_memory(&[&exposed]).unwrap();
        thread::sleep(Duration::from_millis(300));
        drop(s);
        drop(exposed);
    });
    let peer = c.exchange_memory(&[]).unwrap()[0];
    let local = c.register_memory(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [local.sge(0, 4096).unwrap()];
    let at = peer.addr_at(0, 4096).unwrap();
    let t0 = Instant::now();
    // SAFETY: `local` outlives the run, which reaps (or flushes) every request it posted.
    let e = unsafe { c.pipeline(1 << 40, 8, |id| SendWr::rdma_write(id, &sge, at, peer.rkey)) }
        .unwrap_err();
    assert!(matches!(e, NetError::PeerClosed(_)), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    server.join().unwrap();
}

/// Two accepted connections live in one protection domain and serve one memory region: each
/// peer writes its half with RDMA Write, and each connection sends the other half from the
/// same region (its lkey is valid on both queue pairs).
#[test]
fn shared_pd_two_connections_one_mr() {
    let ctx = rsrdma::open(&device()).unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let half = 64 * 1024;
    let remote = AccessFlags::REMOTE_WRITE;
    let hub_mr = Mr::new(&pd, 2 * half, AccessFlags::LOCAL_WRITE | remote).unwrap();
    let e = RawListener::bind(
        "127.0.0.1:0",
        opts()
            .pd(pd.clone())
            .device("not-the-pd-device".to_string()),
    )
    .unwrap_err();
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e}");
    let l = RawListener::bind("127.0.0.1:0", opts().pd(pd.clone()).remote_access(remote)).unwrap();
    let addr = l.local_addr().unwrap();
    let clients: Vec<_> = (0..2u64)
        .map(|i| thread::spawn(move || shared_pd_client(addr, i, half)))
        .collect();
    let mut hubs = Vec::new();
    for _ in 0..2 {
        let mut hub = l.accept().unwrap();
        assert_eq!(
            hub.pd().as_raw(),
            pd.as_raw(),
            "the connection uses the given PD"
        );
        let i = hub.peer_endpoint().params[0].1 as usize;
        hub.exchange_memory(&[&hub_mr]).unwrap();
        hub.sync().unwrap(); // the client wrote its half
        hubs.push((i, hub));
    }
    for i in 0..2 {
        assert!(
            snap(&hub_mr)[i * half..(i + 1) * half] == pattern_bytes(half, i as u8 + 1)[..],
            "half {i} holds exactly what client {i} wrote"
        );
    }
    for (i, hub) in &mut hubs {
        let other = 1 - *i;
        let sge = [hub_mr.sge(other * half, half).unwrap()];
        // SAFETY: `hub_mr` outlives the send, whose completion is reaped in the call.
        unsafe { send_and_reap(hub, &SendWr::send(7, &sge).signaled(true)) }
            .ok()
            .unwrap();
        hub.sync().unwrap(); // the client checked what it received
    }
    let closers: Vec<_> = hubs
        .into_iter()
        .map(|(_, hub)| thread::spawn(move || hub.close().unwrap()))
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    for c in closers {
        c.join().unwrap();
    }
}

/// A listener's connection grants its peer remote access only once `accept` hands it out:
/// a peer whose connection waits in the accept queue cannot write into a region of the
/// listener's shared protection domain even with its address and rkey (guessed, or learnt
/// elsewhere); the accepted one can. (Before: every connection came up with
/// `remote_access`, so a queued peer, never accepted, wrote into the shared region.)
#[test]
fn a_connection_in_the_accept_queue_reaches_no_memory() {
    let ctx = rsrdma::open(&device()).unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let remote = AccessFlags::REMOTE_WRITE;
    let hub_mr = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE | remote).unwrap();
    let l = RawListener::bind("127.0.0.1:0", opts().pd(pd.clone()).remote_access(remote)).unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..2u64 {
        let tx = tx.clone();
        thread::spawn(move || {
            let _ = tx.send((i, RawConn::dial(addr, opts().params(vec![(1, i)]))));
        });
    }
    drop(tx);
    // A handshake starts only from an `accept`: both peers wait in the kernel's queue before
    // the first one, which starts both handshakes before it returns the first to finish.
    // (Before: a finished one was returned before the other was taken, whose dial then
    // timed out, and the test hung in CI on a channel that never closed.)
    support::await_backlog(addr, 2);
    let accepted = l.accept_timeout(Duration::from_secs(20)).unwrap();
    let accepted_id = accepted.peer_endpoint().params[0].1;
    // Both dials returned: the other connection's handshake is done, and it waits, queued.
    let mut clients: Vec<(u64, RawConn)> = (0..2)
        .map(|_| {
            let (i, c) = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("a dial returns");
            (i, c.unwrap())
        })
        .collect();
    clients.sort_by_key(|(i, _)| (*i != accepted_id) as u8);
    let target = hub_mr.remote();
    let write = |c: &RawConn, seed: u8| {
        let mut src = c.register_memory(64, AccessFlags::LOCAL_WRITE).unwrap();
        src.write_at(0, &[seed; 64]).unwrap();
        let sge = [src.sge(0, 64).unwrap()];
        let wr = SendWr::rdma_write(1, &sge, target.addr, target.rkey).signaled(true);
        // SAFETY: `src` outlives the write, whose completion is reaped in the call.
        unsafe { send_and_reap(c, &wr) }
    };
    let queued = write(&clients[1].1, 0xbb);
    assert!(queued.ok().is_err(), "a queued peer wrote: {queued:?}");
    assert_eq!(snap(&hub_mr), vec![0u8; 4096], "the region is untouched");
    write(&clients[0].1, 0xaa).ok().unwrap();
    assert_eq!(
        &snap(&hub_mr)[..64],
        &[0xaa; 64][..],
        "the accepted peer wrote"
    );
    // The queued peer's refused request failed its queue pair: that is its failure, not the
    // listener's. An accept skips it (it returned the grant's EINVAL, which ends a
    // `loop { accept()? }` service: an outside tester's find). Its dial returned once this
    // side's last message was in, so this side's handshake thread may still be finishing:
    // accept until the queued peer was taken, each accept ending by its timeout.
    let t0 = Instant::now();
    while l.counters().failed == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the queued peer was never taken"
        );
        let e = l.accept_timeout(Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, NetError::Timeout { .. }), "{e}");
    }
    // The next accept hands out the next peer.
    let next = thread::spawn(move || RawConn::dial(addr, opts().params(vec![(1, 9)])));
    let c = l.accept_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(c.peer_endpoint().params[0].1, 9, "the next peer");
    let _dialer = next.join().unwrap().unwrap();
    let n = l.counters();
    assert_eq!((n.accepted, n.failed), (2, 1), "{n:?}");
    drop((accepted, clients, c, l));
}

/// Client `i` of [`shared_pd_two_connections_one_mr`].
fn shared_pd_client(addr: std::net::SocketAddr, i: u64, half: usize) {
    let mut c = RawConn::dial(addr, opts().params(vec![(1, i)])).unwrap();
    let mut local = c.register_memory(half, AccessFlags::LOCAL_WRITE).unwrap();
    pattern(&mut local, i as u8 + 1);
    let inbox = c.register_memory(half, AccessFlags::LOCAL_WRITE).unwrap();
    let rsge = [inbox.sge(0, half).unwrap()];
    // SAFETY: `inbox` outlives the receive, which is reaped below before it is read.
    unsafe { c.post_recv(&RecvWr::new(1, &rsge)) }.unwrap();
    let peer = c.exchange_memory(&[]).unwrap()[0];
    let piece = 16 * 1024;
    let sges: Vec<_> = (0..half / piece)
        .map(|k| [local.sge(k * piece, piece).unwrap()])
        .collect();
    let base = i * half as u64;
    // SAFETY: `local` outlives the pipeline, which reaps every completion before returning.
    unsafe {
        c.pipeline(sges.len() as u64, 4, |id| {
            let k = id as usize;
            let at = base + (k * piece) as u64;
            SendWr::rdma_write(
                id,
                &sges[k],
                peer.addr_at(at, piece as u64).unwrap(),
                peer.rkey,
            )
        })
    }
    .unwrap();
    c.sync().unwrap();
    let mut wcs = [Wc::default(); 4];
    let n = c
        .recv_cq()
        .poll_blocking(&mut wcs, Duration::from_secs(15))
        .unwrap();
    assert_eq!(n, 1);
    wcs[0].ok().unwrap();
    assert_eq!(wcs[0].byte_len() as usize, half);
    assert!(
        snap(&inbox) == pattern_bytes(half, (1 - i) as u8 + 1)[..],
        "client {i} received the other client's half from the shared region"
    );
    c.sync().unwrap();
    c.close().unwrap();
}

/// An event-mode connection sleeps on its receive CQ's channel and wakes for the message.
#[test]
fn event_mode_receive_wakes_through_the_channel() {
    let (mut c, mut s) = connected(opts(), opts().completion(Completion::Event));
    assert!(s.recv_channel().is_some() && s.send_channel().is_some());
    assert!(c.recv_channel().is_none(), "busy mode has no channel");
    let len = 4096;
    let inbox = s.register_memory(len, AccessFlags::LOCAL_WRITE).unwrap();
    let rsge = [inbox.sge(0, len).unwrap()];
    // SAFETY: `inbox` outlives the receive, which is reaped below before it is read.
    unsafe { s.post_recv(&RecvWr::new(1, &rsge)) }.unwrap();
    s.recv_cq().arm(false).unwrap();
    let mut wcs = [Wc::default(); 4];
    assert_eq!(s.poll_recv(&mut wcs).unwrap(), 0);
    // Nothing was sent: the wait ends by its timeout.
    let e = s
        .recv_cq()
        .wait(Some(Duration::from_millis(200)))
        .unwrap_err();
    assert!(matches!(e, rsrdma::Error::Timeout { .. }), "{e}");
    let sender = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        let mut out = c.register_memory(len, AccessFlags::NONE).unwrap();
        pattern(&mut out, 42);
        let sge = [out.sge(0, len).unwrap()];
        // SAFETY: `out` outlives the send, whose completion is reaped in the call.
        unsafe { send_and_reap(&c, &SendWr::send(9, &sge).signaled(true)) }
            .ok()
            .unwrap();
        c.sync().unwrap();
        c.close().unwrap();
    });
    let t0 = Instant::now();
    s.recv_cq().wait(Some(Duration::from_secs(10))).unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "woke before the send: {:?}",
        t0.elapsed()
    );
    let n = s
        .recv_cq()
        .poll_blocking(&mut wcs, Duration::from_secs(1))
        .unwrap();
    assert_eq!(n, 1);
    wcs[0].ok().unwrap();
    assert_eq!(wcs[0].byte_len() as usize, len);
    assert!(snap(&inbox) == pattern_bytes(len, 42)[..]);
    s.sync().unwrap();
    s.close().unwrap();
    sender.join().unwrap();
}

/// Issue 23: `RawOptions::new_post_send` posts through the extended work-request API
/// (`ibv_wr_*`): a pipeline of WRITEs (batched: one `ibv_wr_complete` per list) and one of
/// READs (one request per batch) move a region byte for byte, and SENDs arrive. A device
/// without extended QPs (soft0) refuses the connection clearly on both sides.
#[test]
fn the_extended_post_path_writes_reads_and_sends_byte_for_byte() {
    use rsrdma::{Cq, Qp, QpType, SendOps};
    let has_ex = {
        let ctx = rsrdma::open(&device()).unwrap();
        let pd = Pd::new(&ctx).unwrap();
        let cq = Cq::new(&ctx, 4, None).unwrap();
        let r = Qp::builder(QpType::Rc).build_ex(&pd, &cq, &cq, SendOps::SEND);
        r.is_ok()
    };
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let server_opts = opts().remote_access(remote).new_post_send(true);
    if !has_ex {
        let l = RawListener::bind("127.0.0.1:0", server_opts).unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            assert!(l.accept_timeout(Duration::from_secs(3)).is_err());
            l.counters().failed
        });
        let e = RawConn::dial(addr, opts().new_post_send(true)).unwrap_err();
        assert!(e.to_string().contains("ibv_create_qp_ex"), "{e}");
        assert_eq!(t.join().unwrap(), 1, "the listener's side failed too");
        return;
    }
    let (mut c, mut s) = connected(opts().new_post_send(true), server_opts);
    let len = 64 * 1024;
    let piece = 4096;
    let mut exposed = s
        .register_memory(len, AccessFlags::LOCAL_WRITE | remote)
        .unwrap();
    pattern(&mut exposed, 3);
    let mut local = c.register_memory(len, AccessFlags::LOCAL_WRITE).unwrap();
    pattern(&mut local, 91);
    let inbox = s.register_memory(piece, AccessFlags::LOCAL_WRITE).unwrap();
    let st = thread::spawn(move || {
        s.exchange_memory(&[&exposed]).unwrap();
        let sge = [inbox.sge(0, piece).unwrap()];
        // SAFETY: `inbox` outlives the drain.
        unsafe { s.recv_drain(4, 4, |id| RecvWr::new(id, &sge)) }.unwrap();
        s.sync().unwrap(); // the client wrote and sent
                           // The region stays registered (returned) for the client's READs.
        (snap(&exposed), snap(&inbox), exposed, s)
    });
    let peer = c.exchange_memory(&[]).unwrap()[0];
    let sges: Vec<_> = (0..len / piece)
        .map(|i| [local.sge(i * piece, piece).unwrap()])
        .collect();
    let at = |i: usize| peer.addr_at((i * piece) as u64, piece as u64).unwrap();
    // SAFETY: `local` outlives the pipelines, which reap every completion before returning.
    let w = unsafe {
        c.pipeline_batch(sges.len() as u64, 8, 4, |id| {
            SendWr::rdma_write(id, &sges[id as usize], at(id as usize), peer.rkey)
        })
    }
    .unwrap();
    assert_eq!((w.completed, w.bytes), (16, len as u64));
    // SENDs, one batch of the extended API.
    let mut wrs: Vec<SendWr<'_>> = (0..4u64)
        .map(|id| SendWr::send(100 + id, &sges[id as usize]).signaled(id == 3))
        .collect();
    // SAFETY: `local` outlives the completion reaped below.
    unsafe { c.post_send_batch(&mut wrs) }.unwrap();
    let mut wcs = [Wc::default(); 4];
    let t0 = Instant::now();
    let mut n = 0;
    while n == 0 {
        n = c.poll_send(&mut wcs).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(20), "no send completion");
    }
    assert!(wcs[0].is_ok() && wcs[0].wr_id() == 103, "{:?}", wcs[0]);
    c.sync().unwrap();
    let (server_bytes, inbox_bytes, exposed, s) = st.join().unwrap();
    assert!(
        server_bytes == snap(&local),
        "the region holds what was written"
    );
    assert!(
        inbox_bytes == snap(&local)[3 * piece..4 * piece],
        "the last SEND landed whole"
    );
    // READ it back, one request per batch.
    let back = c.register_memory(len, AccessFlags::LOCAL_WRITE).unwrap();
    let rsges: Vec<_> = (0..len / piece)
        .map(|i| [back.sge(i * piece, piece).unwrap()])
        .collect();
    // SAFETY: as above.
    unsafe {
        c.pipeline(rsges.len() as u64, 8, |id| {
            SendWr::rdma_read(id, &rsges[id as usize], at(id as usize), peer.rkey)
        })
    }
    .unwrap();
    assert!(
        snap(&back) == server_bytes,
        "the READs brought the region back"
    );
    drop(exposed);
    let t = thread::spawn(move || s.close().unwrap());
    c.close().unwrap();
    t.join().unwrap();
}

/// A drain that fails leaves nothing in flight and ends the connection's data plane: its
/// receives came back flushed before the error returned, and a later drain refuses at once.
/// (Before: the first drain's receives stayed posted, the sender's next messages landed in
/// them, and a second drain counted those completions as its own and returned `Ok` while
/// its own receives were still posted, into memory the caller then read.)
#[test]
fn a_failed_recv_drain_leaves_nothing_in_flight_and_ends_the_data_plane() {
    // A run's stall limit is the connection's timeout (at most 5 s).
    let o = || opts().timeout(Duration::from_secs(1));
    let (c, mut s) = connected(o(), o());
    let (size, depth) = (64usize, 4u32);
    let recv = s
        .register_memory(size * depth as usize, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let recv_sges: Vec<_> = (0..depth as usize)
        .map(|i| [recv.sge(i * size, size).unwrap()])
        .collect();
    let send = c.register_memory(size, AccessFlags::NONE).unwrap();
    let send_sge = [send.sge(0, size).unwrap()];
    // The sender sends nothing yet: the drain stalls, and fails after its 1 s.
    // SAFETY: `recv` outlives the connection's runs; it is read only after they returned.
    let first = unsafe {
        s.recv_drain(u64::from(depth), depth, |id| {
            RecvWr::new(id, &recv_sges[(id % u64::from(depth)) as usize])
        })
    };
    assert!(
        matches!(first, Err(NetError::Timeout { millis: 1000, .. })),
        "{first:?}"
    );
    // Nothing of it is left: no completion comes later.
    thread::sleep(Duration::from_millis(100));
    let mut wcs = [Wc::default(); 8];
    assert_eq!(s.poll_recv(&mut wcs).unwrap(), 0);
    // A message from the sender finds the receiver stopped (before, it landed in one of the
    // first drain's receives); a second drain of one message refuses instead of taking it
    // for its own.
    // SAFETY: `send` outlives the request: `c`, whose QP holds it, is dropped first below.
    unsafe { c.post_send(&SendWr::send(0, &send_sge).signaled(true)) }.unwrap();
    thread::sleep(Duration::from_millis(300));
    // SAFETY: as above.
    let second = unsafe { s.recv_drain(1, 1, |id| RecvWr::new(id, &recv_sges[0])) };
    assert!(matches!(second, Err(NetError::Closed { .. })), "{second:?}");
    drop(c);
}

/// Dropping a listener ends the handshakes still running at once: a peer that sent a valid
/// hello and then nothing sees its socket end within moments (its handshake held a thread,
/// the socket and a queue pair until its own timeout, for ever with an unbounded one).
#[test]
fn dropping_a_listener_ends_its_running_handshakes() {
    use rsrdma_net::handshake::{Hello, Message, Role};
    use std::io::{Read, Write};
    let l = RawListener::bind("127.0.0.1:0", opts().timeout(Duration::MAX)).unwrap();
    let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let hello = Message::Hello(Hello {
        role: Role::Client,
        auth_required: false,
        nonce: [7; 32],
    });
    peer.write_all(&hello.to_bytes().unwrap()).unwrap();
    // The listener takes the peer and starts its handshake; no connection comes of it.
    let e = l.accept_timeout(Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, NetError::Timeout { .. }), "{e:?}");
    drop(l);
    peer.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 4096];
    let mut told = Vec::new();
    loop {
        match peer.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => told.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "the handshake still holds the socket after {:?}: {e}",
                t0.elapsed()
            ),
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(3));
    // The abort says the listener closed (it said "too many handshakes … or the listener is
    // closing": an outside tester found the first clause misleading).
    let told = String::from_utf8_lossy(&told);
    assert!(
        told.contains("the listener closed before this connection was accepted"),
        "{told:?}"
    );
}

/// A `sync` that timed out may be called again and both ends stay in step: the retry waits
/// for the peer's side of the same step. (Before: the retry sent the next step, the peer's
/// late side of the first one was taken for it, and the connection was aborted as out of
/// step, while the peer's own `sync` had succeeded.)
#[test]
fn a_timed_out_sync_can_be_retried_and_both_ends_stay_in_step() {
    let o = || opts().timeout(Duration::from_millis(300));
    let (mut c, mut s) = connected(o(), o());
    let e = c.sync().unwrap_err();
    assert!(matches!(e, NetError::Timeout { .. }), "{e:?}");
    // The peer reaches the barrier late: it finds this side's step and passes.
    s.sync().unwrap();
    // The retry takes the peer's side of the same step.
    c.sync().unwrap();
    // And the next barrier is the same step on both ends.
    let t = thread::spawn(move || {
        s.sync().unwrap();
        s
    });
    c.sync().unwrap();
    let s = t.join().unwrap();
    drop((c, s));
}

/// Memory the peer cannot use through the connection is not shared: a region allowing no
/// remote operation the queue pair grants (default options grant none), or one on another
/// protection domain, is refused with an error that says so, before anything is sent.
/// (Before: its descriptor went out, and the peer's WRITE failed on the peer's side with a
/// remote access error that nothing here explained.)
#[test]
fn sharing_memory_the_peer_cannot_use_is_refused() {
    let (_c, mut s) = connected(opts(), opts().remote_access(AccessFlags::REMOTE_READ));
    let writable = s
        .register_memory(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let e = s.exchange_memory(&[&writable]).unwrap_err();
    assert!(
        matches!(&e, NetError::InvalidArgument(m) if m.contains("remote_access")),
        "{e}"
    );
    let ctx = rsrdma::open(&device()).unwrap();
    let other_pd = Pd::new(&ctx).unwrap();
    let elsewhere = Mr::new(&other_pd, 4096, AccessFlags::REMOTE_READ).unwrap();
    let e = s.exchange_memory(&[&elsewhere]).unwrap_err();
    assert!(
        matches!(&e, NetError::InvalidArgument(m) if m.contains("protection domain")),
        "{e}"
    );
}
