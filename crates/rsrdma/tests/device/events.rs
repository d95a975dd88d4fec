//! Event mode: a thread blocked on the completion channel wakes when a completion arrives.

use crate::common::{ctx, gid_index, WAIT};
use rsrdma::{AccessFlags, CompChannel, Cq, Error, Mr, Pd, Qp, QpType, RecvWr, SendWr, Wc};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Two RC queue pairs connected to each other: `a` completes on `a_send`/`a_recv`, `b` on
/// `b_cq`.
fn connected(pd: &Pd, a_send: &Cq, a_recv: &Cq, b_cq: &Cq) -> (Qp, Qp) {
    let a = Qp::builder(QpType::Rc).build(pd, a_send, a_recv).unwrap();
    let b = Qp::builder(QpType::Rc).build(pd, b_cq, b_cq).unwrap();
    let opts = crate::common::connect_opts(AccessFlags::NONE);
    let (ea, eb) = (
        a.endpoint(1, Some(gid_index()), 1).unwrap(),
        b.endpoint(1, Some(gid_index()), 2).unwrap(),
    );
    a.connect(&opts, ea.psn, &eb).unwrap();
    b.connect(&opts, eb.psn, &ea).unwrap();
    (a, b)
}

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
    let tx_cq = Cq::new(&ctx, 16, None).unwrap();
    let (rx, tx) = connected(&pd, &cq_send, &cq_recv, &tx_cq);

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

/// One channel, two CQs (a QP's send and receive CQs), a waiter on each. The event for one
/// CQ must reach its own waiter, whichever thread reads it off the fd. Before events were
/// routed, the send-CQ waiter swallowed the receive CQ's event and the receive waiter slept
/// until its timeout.
#[test]
fn a_shared_channel_routes_each_event_to_its_cq() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let channel = CompChannel::new(&ctx).unwrap();
    let send_cq = Cq::new(&ctx, 16, Some(&channel)).unwrap();
    let recv_cq = Cq::new(&ctx, 16, Some(&channel)).unwrap();
    let b_cq = Cq::new(&ctx, 16, None).unwrap();
    let (a, b) = connected(&pd, &send_cq, &recv_cq, &b_cq);
    let buf = Mr::new(&pd, 256, AccessFlags::LOCAL_WRITE).unwrap();
    let (a_rsge, b_rsge, ssge) = (
        [buf.sge(0, 64).unwrap()],
        [buf.sge(64, 64).unwrap()],
        [buf.sge(128, 8).unwrap()],
    );
    // SAFETY: `buf` outlives every completion polled below; the CPU does not touch it.
    unsafe {
        a.post_recv(&RecvWr::new(10, &a_rsge)).unwrap();
        b.post_recv(&RecvWr::new(20, &b_rsge)).unwrap();
    }
    send_cq.arm(false).unwrap();
    recv_cq.arm(false).unwrap();

    // The send-CQ waiter blocks first, alone on the fd.
    let send_waiter = {
        let cq = send_cq.clone();
        std::thread::spawn(move || {
            cq.wait(Some(WAIT)).unwrap();
            let mut wc = [Wc::default(); 1];
            assert_eq!(cq.poll(&mut wc).unwrap(), 1, "woken for its own CQ");
            wc[0]
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // A receive completes on `recv_cq`: its event is read by the send waiter.
    // SAFETY: as above.
    unsafe { b.post_send(&SendWr::send(21, &ssge)).unwrap() };
    crate::common::poll_ok(&b_cq);
    let t0 = Instant::now();
    recv_cq.wait(Some(Duration::from_secs(5))).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    let mut wc = [Wc::default(); 1];
    assert_eq!(recv_cq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].wr_id(), 10);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !send_waiter.is_finished(),
        "the send waiter returned for an event that was not its CQ's"
    );

    // Now an event for the send CQ: that waiter wakes with it.
    // SAFETY: as above.
    unsafe { a.post_send(&SendWr::send(11, &ssge)).unwrap() };
    let wc = send_waiter.join().unwrap();
    wc.ok().unwrap();
    assert_eq!(wc.wr_id(), 11);
    crate::common::poll_ok(&b_cq);
}

/// The non-blocking form for event loops: watch the fd, then take the event.
#[test]
fn try_event_takes_a_ready_event_without_blocking() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let channel = CompChannel::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 16, Some(&channel)).unwrap();
    let other = Cq::new(&ctx, 16, Some(&channel)).unwrap();
    let p_cq = Cq::new(&ctx, 16, None).unwrap();
    let (a, b) = connected(&pd, &p_cq, &cq, &p_cq);
    cq.arm(false).unwrap();
    other.arm(false).unwrap();
    let t0 = Instant::now();
    assert!(!cq.try_event().unwrap(), "nothing is ready yet");
    assert!(
        t0.elapsed() < Duration::from_millis(100),
        "it did not block"
    );

    let buf = Mr::new(&pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let (rsge, ssge) = ([buf.sge(0, 32).unwrap()], [buf.sge(32, 8).unwrap()]);
    // SAFETY: `buf` outlives the completions polled below.
    unsafe {
        a.post_recv(&RecvWr::new(1, &rsge)).unwrap();
        b.post_send(&SendWr::send(2, &ssge)).unwrap();
    }
    let mut pfd = libc::pollfd {
        fd: channel.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, WAIT.as_millis() as i32) };
    assert_eq!(n, 1, "the channel fd became readable");
    assert!(
        !other.try_event().unwrap(),
        "the event is not the other CQ's"
    );
    assert!(cq.try_event().unwrap(), "the event was routed to its CQ");
    assert!(!cq.try_event().unwrap(), "and taken once");
    let mut wc = [Wc::default(); 1];
    assert_eq!(cq.poll(&mut wc).unwrap(), 1);
    wc[0].ok().unwrap();
}

/// Waits for `want` among the context's asynchronous events, up to `limit`; the others seen
/// meanwhile are returned.
fn wait_for_event(
    ctx: &rsrdma::Context,
    want: rsrdma::AsyncEvent,
    limit: Duration,
) -> Result<(), Vec<rsrdma::AsyncEvent>> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match ctx.wait_async_event(Duration::from_millis(100)).unwrap() {
            Some(ev) if ev == want => return Ok(()),
            Some(ev) => seen.push(ev),
            None => {}
        }
    }
    Err(seen)
}

/// Asynchronous events: an SRQ whose limit is armed raises SRQ_LIMIT_REACHED, named by its
/// handle, once fewer receives than the limit are left; the event is read without blocking
/// and acknowledged as it is read (the SRQ's destroy does not wait for it); a context with no
/// event waiting answers `None` at once and a wait ends at its timeout. Then the QP that took
/// the receives goes to ERROR: a device that raises LAST_WQE_REACHED (mlx5, and rxe from
/// Linux 6.3 on; not the 6.1 kernel of the test VM) names the QP with it.
#[test]
fn srq_limit_and_last_wqe_events_name_their_objects() {
    use rsrdma::{AsyncElement, AsyncEvent, AsyncEventKind, Srq};
    let ctx = ctx();
    // Each test opens its own context: events of earlier tests are not seen here.
    assert_eq!(ctx.read_async_event().unwrap(), None);
    let t = Instant::now();
    assert_eq!(
        ctx.wait_async_event(Duration::from_millis(50)).unwrap(),
        None
    );
    assert!(t.elapsed() >= Duration::from_millis(50));
    // SAFETY: F_GETFL on the context's open event fd.
    let flags = unsafe { libc::fcntl(ctx.async_fd(), libc::F_GETFL) };
    assert!(
        flags & libc::O_NONBLOCK != 0,
        "the event fd is non-blocking"
    );

    let pd = Pd::new(&ctx).unwrap();
    let srq = Srq::new(&pd, 16, 1).unwrap();
    assert!(srq.arm_limit(0).is_err() && srq.arm_limit(srq.max_wr()).is_err());
    let cq_srv = Cq::new(&ctx, 32, None).unwrap();
    let cq_cli = Cq::new(&ctx, 32, None).unwrap();
    let (srv, cli) = crate::common::srq_pair(&pd, &srq, &cq_srv, &cq_cli, (1, 2));
    let dst = Mr::new(&pd, 8 * 64, AccessFlags::LOCAL_WRITE).unwrap();
    let sges: Vec<_> = (0..8).map(|i| [dst.sge(i * 64, 64).unwrap()]).collect();
    for (i, s) in sges.iter().enumerate() {
        // SAFETY: `dst` outlives the SRQ, which is dropped after the QP below.
        unsafe { srq.post_recv(&RecvWr::new(i as u64, s)).unwrap() };
    }
    srq.arm_limit(6).unwrap();
    let limit = AsyncEvent {
        kind: AsyncEventKind::SrqLimitReached,
        element: AsyncElement::Srq(srq.handle()),
    };
    // One message leaves 7 of 8: above the limit, no event.
    let send = |id| {
        // SAFETY: an empty send names no memory.
        unsafe {
            cli.post_send(&SendWr::send(id, &[]).signaled(true))
                .unwrap()
        };
        crate::common::poll_ok(&cq_srv);
    };
    send(1);
    assert_eq!(
        ctx.wait_async_event(Duration::from_millis(200)).unwrap(),
        None
    );
    // Two more leave 5: below 6, the event, once.
    send(2);
    send(3);
    if let Err(seen) = wait_for_event(&ctx, limit, WAIT) {
        panic!(
            "no SRQ_LIMIT_REACHED for SRQ {} (saw {seen:?})",
            srq.handle()
        );
    }
    send(4);
    assert_eq!(
        ctx.wait_async_event(Duration::from_millis(200)).unwrap(),
        None,
        "disarmed"
    );

    srv.to_error().unwrap();
    let last_wqe = AsyncEvent {
        kind: AsyncEventKind::QpLastWqeReached,
        element: AsyncElement::Qp(srv.qp_num()),
    };
    match wait_for_event(&ctx, last_wqe, Duration::from_secs(2)) {
        Ok(()) => eprintln!("LAST_WQE_REACHED for QP {}", srv.qp_num()),
        Err(seen) if seen.is_empty() => eprintln!("this device raises no LAST_WQE_REACHED"),
        Err(seen) => panic!("unexpected events {seen:?}"),
    }
    // Acknowledged as read: the destroys do not wait for them.
    let t = Instant::now();
    drop(srv);
    drop(srq);
    assert!(t.elapsed() < Duration::from_secs(2));
}

/// A CQ armed for solicited completions only: an unsolicited SEND's receive raises no event,
/// a solicited one's does. (soft0 took such an arm as one for the next completion, a
/// written-down difference from rxe until the solicited bit went through its core, its
/// packets and its completions.)
#[test]
fn a_solicited_only_arm_wakes_for_a_solicited_send() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let channel = CompChannel::new(&ctx).unwrap();
    let cq_recv = Cq::new(&ctx, 16, Some(&channel)).unwrap();
    let cq_send = Cq::new(&ctx, 16, None).unwrap();
    let tx_cq = Cq::new(&ctx, 16, None).unwrap();
    let (rx, tx) = connected(&pd, &cq_send, &cq_recv, &tx_cq);
    let dst = Mr::new(&pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let src = Mr::new(&pd, 64, AccessFlags::NONE).unwrap();
    for (id, solicited) in [(1u64, false), (2, true)] {
        // SAFETY: `dst` and `src` outlive the completions polled below.
        unsafe {
            rx.post_recv(&RecvWr::new(id, &[dst.sge(0, 64).unwrap()]))
                .unwrap()
        };
        cq_recv.arm(true).unwrap();
        let sge = [src.sge(0, 8).unwrap()];
        let wr = SendWr::send(id, &sge);
        let wr = if solicited { wr.solicited() } else { wr };
        // SAFETY: as above.
        unsafe { tx.post_send(&wr).unwrap() };
        let woke = cq_recv.wait(Some(Duration::from_millis(500))).is_ok();
        assert_eq!(woke, solicited, "solicited {solicited}");
        let got = crate::common::poll_n(&cq_recv, 1);
        assert_eq!(got[0].wr_id(), id);
        crate::common::poll_n(&tx_cq, 1);
    }
}

/// A queue pair whose receive CQ (`small`, of `cqe` entries) is sent four more SENDs than it
/// holds, each into a posted receive: the CQ overruns. Fields drop in order: the queue pairs
/// before the memory their work uses.
struct Overrun {
    rx: Qp,
    /// The sender, kept alive (and dropped before the memory).
    _tx: Qp,
    small: Cq,
    /// How many SENDs.
    n: usize,
    _keep: (Mr, Mr, Cq, Cq, Pd),
}

fn overrun(ctx: &rsrdma::Context, cqe: u32) -> Overrun {
    let pd = Pd::new(ctx).unwrap();
    let small = Cq::new(ctx, cqe, None).unwrap();
    let a_send = Cq::new(ctx, 256, None).unwrap();
    let b_cq = Cq::new(ctx, 256, None).unwrap();
    let (rx, tx) = connected(&pd, &a_send, &small, &b_cq);
    let n = small.capacity() as usize + 4;
    let dst = Mr::new(&pd, 64 * n, AccessFlags::LOCAL_WRITE).unwrap();
    let src = Mr::new(&pd, 64, AccessFlags::NONE).unwrap();
    for i in 0..n {
        // SAFETY: `dst` and `src` outlive the queue pairs' work (kept in `_keep`, dropped
        // after them).
        unsafe {
            rx.post_recv(&RecvWr::new(i as u64, &[dst.sge(64 * i, 64).unwrap()]))
                .unwrap();
            tx.post_send(&SendWr::send(i as u64, &[src.sge(0, 8).unwrap()]))
                .unwrap();
        }
    }
    Overrun {
        rx,
        _tx: tx,
        small,
        n,
        _keep: (dst, src, a_send, b_cq, pd),
    }
}

/// More receive completions than their CQ holds: the CQ overruns, the context hears of it
/// (`CQ_ERR`, naming the CQ), and the queue pair whose completion found no room fails, as
/// on rxe (before, soft0 raised nothing and left the queue pair in RTS, posting into a dead
/// CQ).
#[test]
fn a_cq_that_overruns_raises_cq_err_and_fails_the_queue_pair() {
    use rsrdma::{AsyncElement, AsyncEvent, AsyncEventKind, QpState};
    let ctx = ctx();
    let o = overrun(&ctx, 4);
    let want = AsyncEvent {
        kind: AsyncEventKind::CqErr,
        element: AsyncElement::Cq(o.small.handle()),
    };
    if let Err(seen) = wait_for_event(&ctx, want, WAIT) {
        panic!("no CQ_ERR for the overrun CQ; saw {seen:?}");
    }
    let t0 = Instant::now();
    while o.rx.query().unwrap().state != QpState::Error {
        assert!(
            t0.elapsed() < WAIT,
            "the QP whose completion was lost is still {:?}",
            o.rx.state()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // What the CQ took before it overran stays there to be polled, as on rxe (soft0 used to
    // answer every later poll with EOVERFLOW, losing them): successes, in order.
    let mut wcs = vec![Wc::default(); o.n];
    let got = o
        .small
        .poll(&mut wcs)
        .expect("an overrun CQ still gives what it holds");
    assert!(got >= 1, "nothing polled from the overrun CQ");
    for (i, wc) in wcs[..got].iter().enumerate() {
        assert!(wc.is_ok(), "{i}: {:?}", wc.status());
        assert_eq!(wc.wr_id(), i as u64);
    }
    assert_eq!(o.small.poll(&mut wcs).unwrap(), 0, "then nothing more");
    // The sender counts delivered only what reached the receiving application: the SEND
    // whose receive completion was lost was not acknowledged (as rxe's responder, which
    // completes before it acknowledges), so it and those after it fail (an outside tester's
    // find: soft0 acknowledged first, and the sender had one SUCCESS too many).
    // (soft0 then ends them with RETRY_EXC_ERR; rxe leaves them waiting: what came within a
    // few seconds is counted.)
    let sender = &o._keep.3;
    let (mut done, mut ok, t0) = (0, 0, Instant::now());
    while done < o.n && t0.elapsed() < Duration::from_secs(3) {
        let k = sender.poll(&mut wcs).unwrap();
        ok += wcs[..k].iter().filter(|wc| wc.is_ok()).count();
        done += k;
        if k == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert!(
        ok <= got,
        "{ok} SENDs completed SUCCESS at the sender, {got} receive completions arrived"
    );
    // The queue pairs first, then what their work used (the fields' order).
    drop(o);
}

/// A CQ that overran and is then dropped takes its `CQ_ERR` events with it: reading the
/// context's events afterwards is safe and names no dropped CQ. soft0 once kept them, and
/// reading one read the freed CQ (a crash from safe code, found by an outside tester).
#[test]
fn the_events_of_a_dropped_cq_go_with_it() {
    use rsrdma::{AsyncElement, QpState};
    let ctx = ctx();
    let o = overrun(&ctx, 1);
    let t0 = Instant::now();
    while o.rx.query().unwrap().state != QpState::Error {
        assert!(t0.elapsed() < WAIT, "the overrun did not fail the QP");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Whatever else the overrun raises has been raised by now.
    std::thread::sleep(Duration::from_millis(100));
    let gone = o.small.handle();
    drop(o);
    while let Some(ev) = ctx.read_async_event().unwrap() {
        assert_ne!(ev.element, AsyncElement::Cq(gone), "{ev:?}");
    }
}
