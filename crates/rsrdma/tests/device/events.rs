//! Event mode: a thread blocked on the completion channel wakes when a completion arrives.

use crate::common::{ctx, gid_index, WAIT};
use rsrdma::{AccessFlags, CompChannel, Cq, Error, Mr, Pd, Qp, QpType, RecvWr, SendWr, Wc};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

#[test]
fn completion_channel_wakes_a_blocked_waiter() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let channel = CompChannel::new(&ctx).unwrap();
    // SAFETY: F_GETFL on the channel's open fd.
    let flags = unsafe { libc::fcntl(channel.as_raw_fd(), libc::F_GETFL) };
    assert!(
        flags & libc::O_NONBLOCK != 0,
        "the channel fd is non-blocking"
    );
    let cq_recv = Cq::new(&ctx, 16, Some(&channel)).unwrap();
    let cq_send = Cq::new(&ctx, 16, None).unwrap();
    let rx = Qp::builder(QpType::Rc)
        .build(&pd, &cq_send, &cq_recv)
        .unwrap();
    let tx_cq = Cq::new(&ctx, 16, None).unwrap();
    let tx = Qp::builder(QpType::Rc).build(&pd, &tx_cq, &tx_cq).unwrap();
    let opts = crate::common::connect_opts(AccessFlags::NONE);
    let (er, et) = (
        rx.endpoint(1, Some(gid_index()), 1).unwrap(),
        tx.endpoint(1, Some(gid_index()), 2).unwrap(),
    );
    rx.connect(&opts, er.psn, &et).unwrap();
    tx.connect(&opts, et.psn, &er).unwrap();

    // Nothing posted: a wait with a timeout ends with Timeout, not a hang.
    cq_recv.arm(false).unwrap();
    let t0 = Instant::now();
    let e = cq_recv.wait(Some(Duration::from_millis(300))).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(250));

    let dst = Mr::new(&pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let rsge = [dst.sge(0, 64).unwrap()];
    let src = Mr::new(&pd, 64, AccessFlags::NONE).unwrap();
    for round in 0..3u64 {
        // SAFETY: `dst` outlives the completion polled below.
        unsafe { rx.post_recv(&RecvWr::new(round, &rsge)).unwrap() };
        let waiter = {
            let cq = cq_recv.clone();
            std::thread::spawn(move || {
                cq.arm(false).unwrap();
                // Poll after arming: a completion that came before the arm raises no event.
                let mut wc = [Wc::default(); 1];
                if cq.poll(&mut wc).unwrap() == 1 {
                    return wc[0];
                }
                cq.wait(Some(WAIT)).unwrap();
                assert_eq!(
                    cq.poll(&mut wc).unwrap(),
                    1,
                    "the event came with a completion"
                );
                wc[0]
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        let ssge = [src.sge(0, 8).unwrap()];
        // SAFETY: `src` outlives the completion polled below.
        unsafe { tx.post_send(&SendWr::send(round, &ssge)).unwrap() };
        crate::common::poll_ok(&tx_cq);
        let wc = waiter.join().unwrap();
        wc.ok().unwrap();
        assert_eq!(wc.wr_id(), round);
    }
    // Dropping the CQ with events taken but not yet acknowledged must not block.
    drop(rx);
    drop(cq_recv);
}

#[test]
fn waiting_without_a_channel_is_an_error() {
    let ctx = ctx();
    let cq = Cq::new(&ctx, 4, None).unwrap();
    assert!(matches!(cq.arm(false), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        cq.wait(Some(Duration::from_millis(1))),
        Err(Error::InvalidArgument(_))
    ));
}
