//! rdma_cm between two processes: listen, accept and connect with private data, a message
//! each way, disconnect. The server half runs as a child process of this test binary.

use crate::common::{ctx, gid_index, poll_ok, WAIT};
use rsrdma::cm::{CmEventType, CmId, ConnParam};
use rsrdma::{AccessFlags, Cq, Error, Mr, Pd, Qp, QpCaps, QpType, RecvWr, SendWr};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "RSRDMA_CM_CHILD_ADDR";

/// The IPv4 address behind the test GID: what rdma_cm resolves to the device under test.
pub fn device_ip() -> IpAddr {
    let g = ctx().query_gid(1, gid_index().into()).unwrap().gid;
    IpAddr::V4(g.to_ipv4().expect("the test GID is IPv4-mapped RoCE v2"))
}

/// An id resolved towards `server`, with an RC queue pair (on a CQ of `cq_depth`) ready to
/// connect.
fn client_id(server: SocketAddr, cq_depth: u32) -> (CmId, Pd, Cq, Qp) {
    let id = CmId::new().unwrap();
    id.resolve_addr(None, server, WAIT).unwrap();
    id.resolve_route(WAIT).unwrap();
    let ctx = id.context().unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, cq_depth, None).unwrap();
    let qp = id
        .create_qp(&pd, &Qp::builder(QpType::Rc), &cq, &cq)
        .unwrap();
    (id, pd, cq, qp)
}

/// The server side, run only as the child of `rdma_cm_connect_accept_between_processes`.
#[test]
#[ignore = "runs as the child process of rdma_cm_connect_accept_between_processes"]
fn cm_server_child() {
    let addr: SocketAddr = std::env::var(CHILD_ENV)
        .expect("run by the parent test")
        .parse()
        .unwrap();
    let listener = CmId::listener(addr, 4).unwrap();
    println!("LISTENING {}", listener.local_addr().unwrap());
    let req = listener.get_request(WAIT).unwrap();
    // The IB CM carries private data in fixed-size fields: it arrives zero-padded.
    let hello = b"hello from the client";
    assert_eq!(&req.private_data[..hello.len()], hello);
    assert!(req.private_data[hello.len()..].iter().all(|&b| b == 0));
    let id = req.id;
    assert!(id.peer_addr().is_some());
    let ctx = id.context().unwrap();
    // The client named no depths, so it offered its device's maximum.
    let dev = ctx.attr();
    assert_eq!(
        u32::from(req.requester_initiator_depth),
        dev.max_qp_init_rd_atom.min(255)
    );
    assert_eq!(
        u32::from(req.requester_responder_resources),
        dev.max_qp_rd_atom.min(255)
    );
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 16, None).unwrap();
    let qp = id
        .create_qp(
            &pd,
            &Qp::builder(QpType::Rc).caps(QpCaps::default()),
            &cq,
            &cq,
        )
        .unwrap();
    let mut buf = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [buf.sge(0, 4096).unwrap()];
    // Post the receive before accepting, so the client's first send finds it.
    // SAFETY: `buf` outlives the completion polled below.
    unsafe { qp.post_recv(&RecvWr::new(1, &sge)).unwrap() };
    id.accept(&ConnParam::default().with_private_data(*b"welcome"), WAIT)
        .unwrap();
    let wc = poll_ok(&cq);
    let n = wc.byte_len() as usize;
    // Echo the message back, reversed.
    buf.as_mut_slice().unwrap()[..n].reverse();
    let sge = [buf.sge(0, n).unwrap()];
    // SAFETY: as above.
    unsafe { qp.post_send(&SendWr::send(2, &sge)).unwrap() };
    poll_ok(&cq);
    id.wait_disconnected(WAIT).unwrap();
    drop(qp);
    println!("SERVER DONE");
}

#[test]
fn rdma_cm_connect_accept_between_processes() {
    let ip = device_ip();
    // Any free port: the child binds port 0 and reports the one it got.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "cm::cm_server_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, SocketAddr::new(ip, 0).to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let server: SocketAddr = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child exited before listening"
        );
        // libtest prints "test NAME ... " without a newline before the test's own output.
        if let Some(at) = line.find("LISTENING ") {
            break line[at + "LISTENING ".len()..].trim().parse().unwrap();
        }
    };
    assert_eq!(server.ip(), ip);
    assert_ne!(server.port(), 0);

    let (id, pd, cq, qp) = client_id(server, 16);
    let mut buf = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let rsge = [buf.sge(2048, 2048).unwrap()];
    // SAFETY: `buf` outlives the completion polled below.
    unsafe { qp.post_recv(&RecvWr::new(10, &rsge)).unwrap() };
    let reply = id
        .connect(
            &ConnParam::default().with_private_data(*b"hello from the client"),
            WAIT,
        )
        .unwrap();
    assert_eq!(&reply[..7], b"welcome");
    assert!(reply[7..].iter().all(|&b| b == 0), "padded with zeros");
    assert_eq!(
        qp.query().unwrap().state,
        rsrdma::QpState::Rts,
        "rdma_cm drove the QP to RTS"
    );
    assert_eq!(id.peer_addr(), Some(server));

    let msg = b"a message over an rdma_cm connection";
    buf.as_mut_slice().unwrap()[..msg.len()].copy_from_slice(msg);
    let ssge = [buf.sge(0, msg.len()).unwrap()];
    // SAFETY: as above.
    unsafe { qp.post_send(&SendWr::send(11, &ssge)).unwrap() };
    poll_ok(&cq);
    let r = poll_ok(&cq);
    let n = r.byte_len() as usize;
    let mut expect = msg.to_vec();
    expect.reverse();
    assert_eq!(&buf.as_slice().unwrap()[2048..2048 + n], &expect[..]);
    id.disconnect().unwrap();
    id.wait_disconnected(WAIT).unwrap();

    let mut rest = String::new();
    for l in out.lines() {
        rest.push_str(&l.unwrap());
        rest.push('\n');
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "server child failed: {status}\n{rest}");
    assert!(rest.contains("SERVER DONE"), "{rest}");
}

#[test]
fn rdma_cm_errors_are_clean() {
    let ip = device_ip();
    // Nobody listens on this port: the peer's CM rejects the request at once.
    let id = CmId::new().unwrap();
    let nobody = SocketAddr::new(ip, 1);
    id.resolve_addr(None, nobody, WAIT).unwrap();
    id.resolve_route(WAIT).unwrap();
    let ctx = id.context().unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 4, None).unwrap();
    let _qp = id
        .create_qp(&pd, &Qp::builder(QpType::Rc), &cq, &cq)
        .unwrap();
    // Oversized private data is refused before the verb.
    let big = ConnParam::default().with_private_data(vec![0; 57]);
    assert!(matches!(
        id.connect(&big, WAIT),
        Err(Error::Limit {
            what: "private data bytes",
            ..
        })
    ));
    let started = Instant::now();
    let e = id.connect(&ConnParam::default(), WAIT).unwrap_err();
    assert!(
        matches!(
            e,
            Error::CmEvent {
                got: CmEventType::REJECTED,
                status: 8,
                ..
            }
        ),
        "{e}"
    );
    assert!(started.elapsed() < WAIT / 2, "took {:?}", started.elapsed());
    let text = e.to_string();
    assert!(
        text.contains("status 8: no listener on that address and port"),
        "{text}"
    );

    // A UC builder is refused: rdma_cm's TCP port space carries RC.
    let id2 = CmId::new().unwrap();
    id2.resolve_addr(None, nobody, WAIT).unwrap();
    let e = id2
        .create_qp(&pd, &Qp::builder(QpType::Uc), &cq, &cq)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Waiting for a request that never comes times out.
    let listener = CmId::listener(SocketAddr::new(ip, 0), 1).unwrap();
    let e = listener
        .get_request(Duration::from_millis(200))
        .err()
        .unwrap();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
}

/// A listener dropped with a request nobody took: the request is refused at once, as the
/// kernel's CM refuses a request whose listener went. (soft0's CM kept that request's id,
/// whose later events went to the listener's freed channel.)
#[test]
fn a_request_left_at_a_dropped_listener_is_refused() {
    let listener = CmId::listener(SocketAddr::new(device_ip(), 0), 4).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let (id, _pd, _cq, _qp) = client_id(addr, 4);
        let r = id.connect(&ConnParam::default(), WAIT);
        (r, Instant::now())
    });
    // The request reaches the listener, which never takes it.
    std::thread::sleep(Duration::from_secs(1));
    let dropped = Instant::now();
    drop(listener);
    let (r, answered) = client.join().unwrap();
    assert!(
        matches!(
            r,
            Err(Error::CmEvent {
                got: CmEventType::REJECTED,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(
        answered.saturating_duration_since(dropped) < WAIT / 2,
        "refused {:?} after the listener went",
        answered.saturating_duration_since(dropped)
    );
}

#[test]
fn rdma_cm_unreachable_addresses_say_why() {
    let short = Duration::from_secs(2);
    // On the device's subnet, but nobody there: neighbour resolution times out, and the
    // kernel's ADDR_ERROR (not a bare timeout of ours) says so.
    let id = CmId::new().unwrap();
    let started = Instant::now();
    let e = id
        .resolve_addr(None, "10.77.0.2:7471".parse().unwrap(), short)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::CmEvent {
                got: CmEventType::ADDR_ERROR,
                status,
                ..
            } if status == -libc::ETIMEDOUT
        ),
        "{e}"
    );
    assert!(started.elapsed() >= short, "{:?}", started.elapsed());
    assert!(
        e.to_string().contains("address resolution timed out"),
        "{e}"
    );
    // No route at all: refused at once by the call itself.
    let id = CmId::new().unwrap();
    let e = id
        .resolve_addr(None, "192.0.2.1:7471".parse().unwrap(), short)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verbs {
                op: "rdma_resolve_addr",
                errno: libc::ENETUNREACH
            }
        ),
        "{e}"
    );
}
