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
    _pd: Pd,
    _cq: Cq,
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
    End {
        id,
        _pd: pd,
        _cq: cq,
        qp,
    }
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

#[test]
fn cm_requests_nobody_takes_are_refused() {
    let (l, addr) = listener();
    let c = client(addr);
    let connecting = thread::spawn(move || {
        let r = c.id.connect(&ConnParam::default(), WAIT);
        (c, r)
    });
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
