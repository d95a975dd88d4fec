//! rdma_cm with both ends in this process (the server on a thread): the event API, the
//! acceptor's default depths, refused requests, and contexts that outlive their ids.

use crate::cm::device_ip;
use crate::common::{device_name, WAIT};
use rsrdma::cm::{CmEventType, CmId, ConnParam, ConnectRequest};
use rsrdma::{AccessFlags, Cq, Error, Mr, Pd, Qp, QpType, Wc};
use std::any::Any;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// One end of a connection: the id and what its QP needs.
struct End {
    id: CmId,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

/// Builds the QP of `id` (resolved, or from a request) on its own context.
fn end(id: CmId) -> End {
    let ctx = id.context().unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 8, None).unwrap();
    let qp = id
        .create_qp(&pd, &Qp::builder(QpType::Rc), &cq, &cq)
        .unwrap();
    End { id, pd, cq, qp }
}

/// A client id with its QP, resolved to `server` but not connected.
fn client(server: SocketAddr) -> End {
    let id = CmId::new().unwrap();
    id.resolve_addr(None, server, WAIT).unwrap();
    id.resolve_route(WAIT).unwrap();
    end(id)
}

/// A listener on the device's address, on a free port.
fn listener() -> (CmId, SocketAddr) {
    let l = CmId::listener(SocketAddr::new(device_ip(), 0), 4).unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

/// Connects `c` on a thread (the listener answers on this one); joined, it gives the end
/// back with the connect's result.
fn connect_in_background(c: End) -> thread::JoinHandle<(End, rsrdma::Result<Vec<u8>>)> {
    thread::spawn(move || {
        let r = c.id.connect(&ConnParam::default(), WAIT);
        (c, r)
    })
}

/// Waits until `id`'s fd is readable, failing after [`WAIT`].
fn wait_readable(id: &CmId) {
    let mut pfd = libc::pollfd {
        fd: id.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, WAIT.as_millis() as i32) };
    assert_eq!(n, 1, "the id's fd did not become readable within {WAIT:?}");
}

#[test]
fn cm_event_loop_sees_disconnected_without_blocking() {
    let (l, addr) = listener();
    let (go, wait_go) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let req = l.get_request(WAIT).unwrap();
        let s = end(req.id);
        s.id.accept(&ConnParam::default(), WAIT).unwrap();
        wait_go.recv().unwrap();
        s.id.disconnect().unwrap();
        s.id.wait_disconnected(WAIT).unwrap();
    });
    let c = client(addr);
    c.id.connect(&ConnParam::default(), WAIT).unwrap();
    // Nothing is queued: the call answers at once instead of waiting.
    let started = Instant::now();
    assert!(c.id.try_next_event().unwrap().is_none());
    assert!(started.elapsed() < Duration::from_secs(1));
    go.send(()).unwrap();

    wait_readable(&c.id);
    let ev =
        c.id.try_next_event()
            .unwrap()
            .expect("an event once readable");
    assert_eq!(ev.kind, CmEventType::DISCONNECTED, "{ev:?}");
    assert_eq!(ev.status, 0, "{ev:?}");
    assert!(ev.request.is_none());
    // Answering the peer's disconnect completes its own.
    c.id.disconnect().unwrap();
    server.join().unwrap();

    // The QP's time-wait ends later, reported the same way.
    wait_readable(&c.id);
    let ev =
        c.id.try_next_event()
            .unwrap()
            .expect("an event once readable");
    assert_eq!(ev.kind, CmEventType::TIMEWAIT_EXIT, "{ev:?}");
    assert!(c.id.try_next_event().unwrap().is_none());
}

#[test]
fn cm_accept_serves_what_the_requester_asked() {
    let (l, addr) = listener();
    let server = thread::spawn(move || {
        let req: ConnectRequest = l.get_request(WAIT).unwrap();
        let asked = (
            req.requester_initiator_depth,
            req.requester_responder_resources,
        );
        let s = end(req.id);
        s.id.accept(&ConnParam::default(), WAIT).unwrap();
        let info = s.qp.query().unwrap();
        let dev = s.id.context().unwrap().attr().clone();
        s.id.wait_disconnected(WAIT).unwrap();
        (asked, info.max_dest_rd_atomic, info.max_rd_atomic, dev)
    });
    let c = client(addr);
    c.id.connect(&ConnParam::default().with_initiator_depth(1), WAIT)
        .unwrap();
    let client_info = c.qp.query().unwrap();
    c.id.disconnect().unwrap();
    c.id.wait_disconnected(WAIT).unwrap();
    let (asked, served, issued, dev) = server.join().unwrap();
    let dev_resp = dev.max_qp_rd_atom.min(255) as u8;
    let dev_init = dev.max_qp_init_rd_atom.min(255) as u8;
    // The client issues one read at a time and serves the device's maximum.
    assert_eq!(asked, (1, dev_resp));
    assert_eq!(
        served, 1,
        "the acceptor serves the one read the client issues"
    );
    assert_eq!(issued, dev_resp.min(dev_init));
    assert_eq!(client_info.max_rd_atomic, 1);
}

/// A REJECTED moves the client's QP to ERROR, as librdmacm does as it hands the event over
/// (`ucma_modify_qp_err`): the receives posted before the connect come back flushed, so a
/// program that waits for them before freeing their buffers is not left waiting (soft0 left
/// the QP in INIT: an outside tester's find). Both a reject by the listener and a connect to
/// a port nobody listens on.
#[test]
fn a_rejected_connect_fails_the_qp_and_flushes_its_receives() {
    let (l, addr) = listener();
    let mut nobody = addr;
    let probe = CmId::listener(SocketAddr::new(device_ip(), 0), 1).unwrap();
    nobody.set_port(probe.local_addr().unwrap().port());
    drop(probe);
    for (to, rejecting) in [(addr, true), (nobody, false)] {
        let c = client(to);
        let mr = Mr::new(&c.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = [mr.sge(0, 64).unwrap()];
        // SAFETY: `mr` outlives the receive's completion, polled below.
        unsafe { c.qp.post_recv(&rsrdma::RecvWr::new(7, &sge)).unwrap() };
        let connecting = connect_in_background(c);
        if rejecting {
            l.get_request(WAIT).unwrap().id.reject(b"no").unwrap();
        }
        let (c, r) = connecting.join().unwrap();
        let e = r.unwrap_err();
        assert!(
            matches!(
                e,
                Error::CmEvent {
                    got: CmEventType::REJECTED,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(c.qp.query().unwrap().state, rsrdma::QpState::Error, "{e}");
        let wc = crate::common::poll_n(&c.cq, 1)[0];
        assert_eq!(
            (wc.wr_id(), wc.status()),
            (7, rsrdma::WcStatus::WR_FLUSH_ERR),
            "{e}"
        );
        drop(mr);
    }
}

#[test]
fn cm_requests_nobody_takes_are_refused() {
    let (l, addr) = listener();
    let c = client(addr);
    let connecting = connect_in_background(c);
    // The listener waits for something else: the request that comes instead is refused.
    let e = l.wait_disconnected(WAIT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CmEvent {
                got: CmEventType::CONNECT_REQUEST,
                ..
            }
        ),
        "{e}"
    );
    let (_c, r) = connecting.join().unwrap();
    let e = r.unwrap_err();
    assert!(
        matches!(
            e,
            Error::CmEvent {
                got: CmEventType::REJECTED,
                status: 28,
                ..
            }
        ),
        "the refused request is rejected, not left to time out: {e}"
    );

    // A request taken and dropped is refused the same way, and the listener still serves.
    let c = client(addr);
    let connecting = thread::spawn(move || c.id.connect(&ConnParam::default(), WAIT));
    let ev = l.next_event(WAIT).unwrap();
    assert_eq!(ev.kind, CmEventType::CONNECT_REQUEST);
    assert!(ev.request.is_some());
    drop(ev);
    let e = connecting.join().unwrap().unwrap_err();
    assert!(matches!(e, Error::CmEvent { status: 28, .. }), "{e}");

    // An explicit reject carries the server's private data to the client, shown in hex.
    let c = client(addr);
    let connecting = thread::spawn(move || c.id.connect(&ConnParam::default(), WAIT));
    let req = l.get_request(WAIT).unwrap();
    req.id.reject(b"busy").unwrap();
    let e = connecting.join().unwrap().unwrap_err();
    let Error::CmEvent {
        got, private_data, ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(*got, CmEventType::REJECTED);
    assert_eq!(&private_data[..4], b"busy");
    let text = e.to_string();
    assert!(text.contains("status 28: consumer reject"), "{text}");
    assert!(text.contains("62757379"), "{text}");

    // A reject carries at most 148 bytes (the IB CM's REJ): more is refused, not cut short
    // (the soft CM cut it to 148 and said Ok; the kernel refuses it), and 148 arrive whole.
    let c = client(addr);
    let connecting = thread::spawn(move || c.id.connect(&ConnParam::default(), WAIT));
    let req = l.get_request(WAIT).unwrap();
    let e = req.id.reject(&[9; 149]).unwrap_err();
    assert!(matches!(e, Error::Limit { limit: 148, .. }), "{e}");
    req.id.reject(&[9; 148]).unwrap();
    let e = connecting.join().unwrap().unwrap_err();
    let Error::CmEvent { private_data, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(private_data[..], [9; 148], "{e}");
}

/// Every order of `0..n`.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut o = rest.clone();
            o.insert(at, n - 1);
            out.push(o);
        }
    }
    out
}

#[test]
fn cm_context_outlives_its_id_and_listener() {
    // Resolving needs no listener at the address.
    let addr = SocketAddr::new(device_ip(), 7471);
    for (round, order) in orders(4).into_iter().enumerate() {
        let (l, _) = listener();
        let id = CmId::new().unwrap();
        id.resolve_addr(None, addr, WAIT).unwrap();
        let ctx = if round % 2 == 0 {
            id.context().unwrap()
        } else {
            l.context().unwrap()
        };
        assert_eq!(ctx.name(), device_name());
        let pd = Pd::new(&ctx).unwrap();
        let cq = Cq::new(&ctx, 4, None).unwrap();
        let mr = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        if round % 3 == 0 {
            drop(l);
            drop(id);
        } else {
            drop(id);
            drop(l);
        }
        // Still usable without the ids: register memory, make a CQ, poll.
        let mr2 = Mr::new(&pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
        assert_eq!(mr2.sge(0, 8192).unwrap().length(), 8192);
        let cq2 = Cq::new(&ctx, 4, None).unwrap();
        let mut wcs = [Wc::default(); 2];
        assert_eq!(cq.poll(&mut wcs).unwrap(), 0);
        assert_eq!(cq2.poll(&mut wcs).unwrap(), 0);
        drop((mr2, cq2));
        let mut held: Vec<Option<Box<dyn Any>>> = vec![
            Some(Box::new(ctx)),
            Some(Box::new(pd)),
            Some(Box::new(cq)),
            Some(Box::new(mr)),
        ];
        for i in order {
            drop(held[i].take());
        }
    }
    // librdmacm still works afterwards.
    let c = CmId::new().unwrap();
    c.resolve_addr(None, addr, WAIT).unwrap();
    Pd::new(&c.context().unwrap()).unwrap();
}

/// `connect_granting` brings the dialer's QP up granting the acceptor exactly the flags it
/// names, where rdma_cm's connect grants REMOTE_WRITE (and READ) to whoever answers: an
/// acceptor's WRITE into a region of the dialer's domain fails with nothing granted, lands
/// when WRITE is granted, and the QP carries the depths the CM negotiated. (A fake server
/// of an outside tester wrote into a Conn dialer's shared domain in 1 of 5 tries, in the
/// moment between librdmacm's bring-up and the dialer taking the flags back; connecting and
/// then taking the flags back loses some of the eight tries here.)
#[test]
fn connect_granting_gives_the_acceptor_exactly_what_it_names() {
    use rsrdma::SendWr;
    let tries = std::iter::repeat_n(AccessFlags::NONE, 8);
    for access in tries.chain([AccessFlags::REMOTE_WRITE]) {
        let (l, addr) = listener();
        let (to_server, from_client) = mpsc::channel::<(u64, u32)>();
        let (done, wait_done) = mpsc::channel::<()>();
        let server = thread::spawn(move || {
            let req = l.get_request(WAIT).unwrap();
            let s = end(req.id);
            s.id.accept(&ConnParam::default(), WAIT).unwrap();
            let (raddr, rkey) = from_client.recv().unwrap();
            let mut src = Mr::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
            src.write_at(0, b"ACCEPTOR").unwrap();
            // SAFETY: `src` outlives the completion polled below.
            unsafe {
                s.qp.post_send(&SendWr::rdma_write(
                    1,
                    &[src.sge(0, 8).unwrap()],
                    raddr,
                    rkey,
                ))
                .unwrap();
            }
            let wc = poll_one(&s.cq);
            wait_done.recv().unwrap();
            wc
        });
        let c = client(addr);
        let writable = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let target = Mr::new(&c.pd, 64, writable).unwrap();
        to_server
            .send((target.remote().addr, target.remote().rkey))
            .unwrap();
        c.id.connect_granting(
            &c.qp,
            &ConnParam::default().with_initiator_depth(1),
            access,
            WAIT,
        )
        .unwrap();
        // The acceptor writes as soon as its accept returns, maybe before this side is back.
        done.send(()).unwrap();
        let wc = server.join().unwrap();
        let info = c.qp.query().unwrap();
        let mut now = [0u8; 8];
        target.read_at(0, &mut now).unwrap();
        if access.contains(AccessFlags::REMOTE_WRITE) {
            assert!(wc.is_ok(), "the granted WRITE failed: {wc:?}");
            assert_eq!(&now, b"ACCEPTOR");
            assert_eq!(info.state, rsrdma::QpState::Rts);
        } else {
            // A QP without the flag refuses the opcode itself (rxe's NAK: invalid request).
            assert_eq!(wc.status(), rsrdma::WcStatus::REM_INV_REQ_ERR, "{wc:?}");
            assert_eq!(now, [0u8; 8], "the acceptor wrote the dialer's region");
        }
        assert_eq!(info.access, access, "the QP's remote flags");
        assert_eq!(info.max_rd_atomic, 1, "the depth the dialer asked for");
    }
}

/// The first completion on `cq`, whatever its status, within [`WAIT`].
fn poll_one(cq: &Cq) -> Wc {
    poll_within(cq, WAIT).unwrap_or_else(|| panic!("no completion within {WAIT:?}"))
}

/// The first completion on `cq` within `limit`, if one comes.
fn poll_within(cq: &Cq, limit: Duration) -> Option<Wc> {
    let mut wc = [Wc::default()];
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cq.poll(&mut wc).unwrap() == 1 {
            return Some(wc[0]);
        }
    }
    None
}

/// A `connect_granting` that failed leaves nothing for an acceptor that answers late, and an
/// id connects once (outside tester's findings): the timed-out connect's queue pair went on to
/// be brought up by rdma_cm itself when the late acceptance was read (with REMOTE_WRITE, READ
/// and ATOMIC: the acceptor wrote the dialer's region), and a second connect on the same id
/// (soft CM) opened a second connection and left the two sides disagreeing. The connect also
/// returns within its own timeout when the listener's host drops the connect (the soft CM
/// waited its own 3 s).
#[test]
fn a_failed_connect_granting_leaves_nothing_for_a_late_acceptor() {
    use rsrdma::{QpState, SendWr};
    let (l, addr) = listener();
    let (timed_out, wait_timed_out) = mpsc::channel::<(u64, u32)>();
    let server = thread::spawn(move || {
        let req = l.get_request(WAIT).unwrap();
        let s = end(req.id);
        let (raddr, rkey) = wait_timed_out.recv().unwrap();
        // The acceptance comes after the dialer gave up; the dialer never completes it.
        let _ =
            s.id.accept(&ConnParam::default(), Duration::from_millis(500));
        let mut src = Mr::new(&s.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
        src.write_at(0, b"LATECOME").unwrap();
        // SAFETY: `src` outlives the completion polled below.
        let posted = unsafe {
            s.qp.post_send(&SendWr::rdma_write(
                1,
                &[src.sge(0, 8).unwrap()],
                raddr,
                rkey,
            ))
        };
        // rxe drops what reaches a queue pair in ERROR and retries for seconds; soft0 says so
        // at once: either way nothing may land, and a completion, if any, is not a success.
        let wc = posted
            .ok()
            .and_then(|()| poll_within(&s.cq, Duration::from_secs(2)));
        (wc, s)
    });
    let c = client(addr);
    let writable = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let target = Mr::new(&c.pd, 64, writable).unwrap();
    let t0 = Instant::now();
    let e =
        c.id.connect_granting(
            &c.qp,
            &ConnParam::default(),
            AccessFlags::NONE,
            Duration::from_millis(300),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    timed_out
        .send((target.remote().addr, target.remote().rkey))
        .unwrap();
    // The late acceptance is read as an event loop would read it.
    let late = c.id.next_event(WAIT);
    assert!(
        late.as_ref()
            .map_or(true, |ev| ev.kind != CmEventType::ESTABLISHED),
        "{late:?}"
    );
    let (wc, _s) = server.join().unwrap();
    assert!(
        wc.map_or(true, |wc| !wc.is_ok()),
        "the late acceptor's WRITE landed"
    );
    let mut now = [0u8; 8];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(now, [0u8; 8], "the late acceptor wrote the dialer's region");
    let info = c.qp.query().unwrap();
    assert_eq!(info.state, QpState::Error);
    // The id connected once: a second connect is refused.
    let again = c.id.connect_granting(
        &c.qp,
        &ConnParam::default(),
        AccessFlags::NONE,
        Duration::from_millis(300),
    );
    assert!(again.is_err(), "{again:?}");
}

/// A connect whose listener never answers at the transport (its host drops the connect)
/// returns within the caller's timeout, not the CM's own.
#[test]
fn connect_granting_returns_within_its_timeout() {
    // A TCP listener with a full queue on the port: on soft0 the CM's connect gets no
    // answer; on rxe an rdma_cm connect to that port finds no rdma_cm listener.
    let l = std::net::TcpListener::bind(SocketAddr::new(device_ip(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    // SAFETY: a listening socket of ours; a backlog of 0 keeps at most one connection queued.
    unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&l), 0) };
    let fillers: Vec<_> = (0..4)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
        })
        .collect();
    let c = client(addr);
    let t0 = Instant::now();
    let r = c.id.connect_granting(
        &c.qp,
        &ConnParam::default(),
        AccessFlags::NONE,
        Duration::from_millis(400),
    );
    let took = t0.elapsed();
    assert!(r.is_err(), "{r:?}");
    assert!(took < Duration::from_millis(1500), "took {took:?}: {r:?}");
    drop(fillers);
}

/// A request whose requester gave up (its id dropped) before the listener took it fails
/// the accept at once: the end of the request, reported before it was taken, moves with the
/// request to its own channel. The soft CM left it on the listener's channel, where
/// `get_request` skipped it, and the accept waited out its whole timeout (an outside tester:
/// 10 s, and a server behind on its backlog paid a full timeout per dead request).
#[test]
fn an_accept_of_a_request_whose_requester_left_fails_at_once() {
    let (l, addr) = listener();
    {
        let c = client(addr);
        let gave_up =
            c.id.connect(&ConnParam::default(), Duration::from_millis(50));
        assert!(gave_up.is_err(), "nobody accepted yet: {gave_up:?}");
    }
    // The requester's end reaches the listener before the request is taken.
    thread::sleep(Duration::from_millis(300));
    let req = l.get_request(WAIT).unwrap();
    let t0 = Instant::now();
    // rxe's CM knows at once (making the queue pair fails); soft0's hears it in the accept.
    let ctx = req.id.context().unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 8, None).unwrap();
    let r = req
        .id
        .create_qp(&pd, &Qp::builder(QpType::Rc), &cq, &cq)
        .and_then(|qp| {
            req.id
                .accept(&ConnParam::default(), Duration::from_secs(10))
                .map(|()| qp)
        });
    assert!(r.is_err(), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the accept waited {:?}: {r:?}",
        t0.elapsed()
    );
}

/// `reject` and `disconnect` on an id that never connected, and `reject` after `accept`, are
/// errors naming their call (EINVAL, as from the kernel's CM), and a late reject leaves the
/// connection as it is: the peer's disconnect still reaches this side. soft0's CM answered
/// each with Ok, and its late reject lost the peer's disconnect (an outside tester).
#[test]
fn reject_and_disconnect_out_of_turn_are_refused() {
    let fresh = CmId::new().unwrap();
    let e = fresh.reject(b"no").unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    assert!(e.to_string().contains("rdma_reject"), "{e}");
    let e = fresh.disconnect().unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    assert!(e.to_string().contains("rdma_disconnect"), "{e}");

    let (l, addr) = listener();
    let server = thread::spawn(move || {
        let req = l.get_request(WAIT).unwrap();
        let s = end(req.id);
        s.id.accept(&ConnParam::default(), WAIT).unwrap();
        let e = s.id.reject(b"too late").unwrap_err();
        assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
        s.id.wait_disconnected(WAIT).unwrap();
        // Answering the peer's disconnect completes its own.
        s.id.disconnect().unwrap();
        s
    });
    let c = client(addr);
    c.id.connect(&ConnParam::default(), WAIT).unwrap();
    // The server's reject came and went: the connection is up until this side ends it.
    thread::sleep(Duration::from_millis(100));
    c.id.disconnect().unwrap();
    c.id.wait_disconnected(WAIT).unwrap();
    drop(server.join().unwrap());
}
