//! The soundness rules, on a real device: remotely writable memory hands out no references,
//! impossible sizes are errors, deregistered memory is never written, and one QP/CQ pair may
//! be driven from two threads.

use crate::common::{poll_n, poll_ok, rc_pair, snap, WAIT};
use rsrdma::{AccessFlags, Error, Mr, QpCaps, RecvWr, SendWr, Wc, WcStatus};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[test]
fn remotely_writable_regions_give_copies_not_references() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let p = rc_pair(QpCaps::default(), access);
    let mut exposed = Mr::new(&p.pd, 4096, access).unwrap();
    assert!(exposed.remotely_writable());
    // A `&[u8]` the peer's DMA can change under is undefined behaviour: refused.
    for e in [
        exposed.as_slice().map(drop).unwrap_err(),
        exposed.as_mut_slice().map(drop).unwrap_err(),
    ] {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("remotely writable"), "{e}");
    }
    let atomic = Mr::new(
        &p.pd,
        64,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    )
    .unwrap();
    assert!(atomic.as_slice().is_err());

    // The copies work while the peer writes.
    exposed.write_at(4000, b"local").unwrap();
    let mut src = Mr::new(&p.pd, 100, AccessFlags::NONE).unwrap();
    assert!(!src.remotely_writable());
    src.as_mut_slice().unwrap().copy_from_slice(&[7u8; 100]);
    let sge = [src.sge(0, 100).unwrap()];
    let t = exposed.remote();
    // SAFETY: `src` outlives the completion polled below and is not written meanwhile.
    unsafe {
        p.b.post_send(&SendWr::rdma_write(
            1,
            &sge,
            t.addr_at(10, 100).unwrap(),
            t.rkey,
        ))
        .unwrap()
    };
    poll_ok(&p.cq_b);
    let mut got = [0u8; 110];
    exposed.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..10], &[0u8; 10]);
    assert_eq!(&got[10..], &[7u8; 100]);
    let mut tail = [0u8; 5];
    exposed.read_at(4000, &mut tail).unwrap();
    assert_eq!(&tail, b"local");
    assert!(exposed.read_at(4095, &mut [0u8; 2]).is_err());
    assert!(exposed.write_at(usize::MAX, b"x").is_err());
}

#[test]
fn impossible_region_sizes_are_errors() {
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    for len in [usize::MAX, usize::MAX - 4094] {
        match Mr::new(&p.pd, len, AccessFlags::LOCAL_WRITE) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(&len.to_string()), "{m}"),
            // A device whose max_mr_size is below the address space refuses it earlier.
            Err(Error::Limit { what, .. }) => assert_eq!(what, "memory region length"),
            other => panic!("{len} bytes: {other:?}"),
        }
    }
}

#[test]
fn a_deregistered_region_is_never_written() {
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    // The caller's own memory, so it outlives the registration and can be inspected after.
    let mut landing = vec![0u8; 8192];
    // SAFETY: `landing` outlives the Mr (dropped below) and every request naming it.
    let mr = unsafe {
        Mr::register(
            &p.pd,
            landing.as_mut_ptr(),
            landing.len(),
            AccessFlags::LOCAL_WRITE,
        )
    }
    .unwrap();
    let rsge = [mr.sge(0, 4096).unwrap()];
    // SAFETY: `landing` stays allocated until after the completion below; the CPU does not
    // touch it meanwhile.
    unsafe { p.b.post_recv(&RecvWr::new(5, &rsge)).unwrap() };
    // Deregistered with the receive still queued: the NIC loses its translation.
    drop(mr);

    let mut src = Mr::new(&p.pd, 4096, AccessFlags::NONE).unwrap();
    src.as_mut_slice().unwrap().fill(0x5a);
    let ssge = [src.sge(0, 4096).unwrap()];
    // SAFETY: `src` outlives the completion polled below.
    unsafe { p.a.post_send(&SendWr::send(6, &ssge)).unwrap() };
    let recv = poll_n(&p.cq_b, 1)[0];
    assert_eq!(recv.wr_id(), 5);
    assert_ne!(recv.status(), WcStatus::SUCCESS, "{recv:?}");
    let send = poll_n(&p.cq_a, 1)[0];
    assert_ne!(send.status(), WcStatus::SUCCESS, "{send:?}");
    assert!(
        landing.iter().all(|&b| b == 0),
        "deregistered memory was written"
    );
}

#[test]
fn two_threads_post_and_poll_one_queue_pair() {
    const PER_THREAD: u64 = 150;
    const WINDOW: i64 = 24;
    let caps = QpCaps::default().max_send_wr(64).max_recv_wr(512);
    let p = rc_pair(caps, AccessFlags::NONE);
    let total = 2 * PER_THREAD as usize;
    let landing = Mr::new(&p.pd, total * 8, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..total {
        let sge = [landing.sge(i * 8, 8).unwrap()];
        // SAFETY: `landing` outlives every completion polled below; read only after them.
        unsafe { p.b.post_recv(&RecvWr::new(i as u64, &sge)).unwrap() };
    }
    let mut src = Mr::new(&p.pd, total * 8, AccessFlags::NONE).unwrap();
    for (i, chunk) in src.as_mut_slice().unwrap().chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(i as u64).to_le_bytes());
    }
    let src = Arc::new(src);
    let outstanding = Arc::new(AtomicI64::new(0));
    let workers: Vec<_> = (0..2u64)
        .map(|t| {
            let (qp, cq, src, outstanding) = (
                p.a.clone(),
                p.cq_a.clone(),
                src.clone(),
                outstanding.clone(),
            );
            std::thread::spawn(move || {
                let mut reaped = Vec::new();
                let mut wcs = [Wc::default(); 8];
                let ids = t * PER_THREAD..(t + 1) * PER_THREAD;
                let start = Instant::now();
                for id in ids {
                    while outstanding.load(Ordering::Acquire) >= WINDOW {
                        let n = cq.poll(&mut wcs).unwrap();
                        outstanding.fetch_sub(n as i64, Ordering::AcqRel);
                        reaped.extend(wcs[..n].iter().map(|w| (w.wr_id(), w.status())));
                        assert!(start.elapsed() < WAIT, "send queue never drained");
                    }
                    outstanding.fetch_add(1, Ordering::AcqRel);
                    let sge = [src.sge(id as usize * 8, 8).unwrap()];
                    // SAFETY: `src` (an Arc) outlives the completions; it is never written.
                    unsafe { qp.post_send(&SendWr::send(id, &sge)).unwrap() };
                }
                reaped
            })
        })
        .collect();
    let mut sent: Vec<(u64, WcStatus)> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let rest = outstanding.load(Ordering::Acquire) as usize;
    sent.extend(
        poll_n(&p.cq_a, rest)
            .iter()
            .map(|w| (w.wr_id(), w.status())),
    );
    assert!(
        sent.iter().all(|(_, s)| *s == WcStatus::SUCCESS),
        "{sent:?}"
    );
    let mut ids: Vec<u64> = sent.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..total as u64).collect::<Vec<_>>(),
        "each send completes once"
    );

    let recvs = poll_n(&p.cq_b, total);
    assert!(recvs.iter().all(|w| w.ok().is_ok()), "{recvs:?}");
    let bytes = snap(&landing);
    let mut payloads: Vec<u64> = bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    payloads.sort_unstable();
    assert_eq!(
        payloads,
        (0..total as u64).collect::<Vec<_>>(),
        "no message lost or doubled"
    );
}

/// A refused state change changes nothing: RTS to RTR is no transition, and the access
/// flags that came with it are not taken (soft0 took them, as if the change had half
/// happened; rxe checks everything first).
#[test]
fn a_refused_state_change_changes_no_attribute() {
    use rsrdma::ffi;
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    let before = p.a.query().unwrap();
    let mut attr = ffi::ibv_qp_attr {
        qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
        qp_access_flags: (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ).bits(),
        ..Default::default()
    };
    let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
    // SAFETY: a live QP of this test; `attr` is initialised for both bits of the mask.
    let rc = unsafe { ffi::ibv_modify_qp(p.a.as_raw().unwrap(), &mut attr, mask as i32) };
    assert_ne!(rc, 0, "RTS to RTR was taken");
    let after = p.a.query().unwrap();
    assert_eq!(
        after.access, before.access,
        "the refused change's access flags"
    );
    assert_eq!(after.state, before.state);
}

/// State changes follow the verbs table (the kernel's `ib_modify_qp_is_ok`) on both
/// devices: a change without the attributes it requires, or with ones it does not take, is
/// refused, and so is a port the device has not; INIT → INIT changes attributes; the typed calls say so before the provider does.
/// soft0 took all of these (an outside tester's list).
#[test]
fn state_changes_follow_the_verbs_table() {
    use ffi::ibv_qp_attr_mask as M;
    use rsrdma::{ffi, InitAttr, Pd, Qp, QpState, QpType, RtsAttr};
    let modify = |q: &Qp, attr: ffi::ibv_qp_attr, mask: u32| {
        let mut attr = attr;
        // SAFETY: a live QP of this test; `attr` is initialised for every bit of the mask.
        unsafe { ffi::ibv_modify_qp(q.as_raw().unwrap(), &mut attr, mask as i32) }
    };
    let ctx = crate::common::ctx();
    let pd = Pd::new(&ctx).unwrap();
    let cq = rsrdma::Cq::new(&ctx, 16, None).unwrap();
    let fresh = || Qp::builder(QpType::Rc).build(&pd, &cq, &cq).unwrap();
    let to = |s: ffi::ibv_qp_state| ffi::ibv_qp_attr {
        qp_state: s,
        port_num: 1,
        ..Default::default()
    };
    // RESET → INIT without its required attributes (P_Key index, port, access flags).
    let q = fresh();
    assert_ne!(
        modify(&q, to(ffi::ibv_qp_state::IBV_QPS_INIT), M::IBV_QP_STATE.0),
        0
    );
    assert_eq!(q.state(), QpState::Reset);
    // A port the device has not (rxe, as the test VM's kernel has it, takes any P_Key index:
    // so does soft0).
    for a in [InitAttr::default().port(0), InitAttr::default().port(2)] {
        assert!(fresh().to_init(&a).is_err(), "{a:?}");
    }
    // Attributes a QP in RESET does not take; INIT → INIT does.
    assert!(q.set_access(AccessFlags::REMOTE_READ).is_err(), "in RESET");
    assert!(q.set_min_rnr_timer(3).is_err(), "in RESET");
    q.to_init(&InitAttr::default()).unwrap();
    q.to_init(&InitAttr::default().access(AccessFlags::REMOTE_READ))
        .unwrap();
    assert_eq!(q.query().unwrap().access, AccessFlags::REMOTE_READ);
    // INIT → RTR without the path, the peer's QP number and PSN; then with a path that has
    // no GRH (a RoCE path must be routed).
    assert_ne!(
        modify(&q, to(ffi::ibv_qp_state::IBV_QPS_RTR), M::IBV_QP_STATE.0),
        0
    );
    let flat = rsrdma::RtrAttr::default().dest_qp_num(q.qp_num());
    assert!(q.to_rtr(&flat).is_err(), "a path without a GRH");
    assert_eq!(q.state(), QpState::Init);
    // In RTS: what may change there changes; the rest is refused, and `to_rts` says so.
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    p.a.set_access(AccessFlags::REMOTE_READ).unwrap();
    p.a.set_min_rnr_timer(3).unwrap();
    let before = p.a.query().unwrap();
    let rnr = ffi::ibv_qp_attr {
        rnr_retry: 0,
        dest_qp_num: 12345,
        ..Default::default()
    };
    assert_ne!(
        modify(&p.a, rnr, M::IBV_QP_RNR_RETRY.0),
        0,
        "RNR_RETRY in RTS"
    );
    assert_ne!(
        modify(&p.a, rnr, M::IBV_QP_DEST_QPN.0),
        0,
        "DEST_QPN in RTS"
    );
    let after = p.a.query().unwrap();
    assert_eq!(
        (after.rnr_retry, after.dest_qp_num),
        (before.rnr_retry, before.dest_qp_num)
    );
    assert!(matches!(
        p.a.to_rts(&RtsAttr::default()),
        Err(Error::InvalidTransition { .. })
    ));
    // In ERROR nothing but a state change is taken.
    p.a.to_error().unwrap();
    assert!(p.a.set_access(AccessFlags::NONE).is_err(), "in ERROR");
}

/// Objects of two contexts (two opens of one device) are not mixed: a queue pair whose CQs or
/// SRQ, or a CQ whose channel, belong to another context than its own, is refused before any
/// verb. The verbs call picks the provider by the one context; where soft0 sits beside a NIC,
/// it would be handed the other provider's objects (an outside tester built each of these).
#[test]
fn objects_of_another_context_are_refused() {
    use crate::common::ctx;
    use rsrdma::{CompChannel, Cq, Pd, Qp, QpType, Srq};
    let (one, two) = (ctx(), ctx());
    let pd = Pd::new(&one).unwrap();
    let (cq_one, cq_two) = (
        Cq::new(&one, 8, None).unwrap(),
        Cq::new(&two, 8, None).unwrap(),
    );
    let refused = |r: rsrdma::Result<Qp>, what: &str| match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(what), "{m}"),
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: a queue pair of mixed contexts was made"),
    };
    let rc = Qp::builder(QpType::Rc);
    refused(rc.build(&pd, &cq_two, &cq_one), "send CQ");
    refused(rc.build(&pd, &cq_one, &cq_two), "receive CQ");
    let srq_two = Srq::new(&Pd::new(&two).unwrap(), 8, 1).unwrap();
    refused(
        Qp::builder(QpType::Rc)
            .srq(&srq_two)
            .build(&pd, &cq_one, &cq_one),
        "shared receive queue",
    );
    let channel_one = CompChannel::new(&one).unwrap();
    match Cq::new(&two, 8, Some(&channel_one)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("completion channel"), "{m}"),
        other => panic!("a CQ on another context's channel: {:?}", other.map(|_| ())),
    }
    // Of one context, all is well.
    rc.build(&pd, &cq_one, &cq_one).unwrap();
    Cq::new(&one, 8, Some(&channel_one)).unwrap();
}

/// `Qp::connect` checks its options' values before the first transition: one out of range
/// leaves the queue pair in RESET, and a second connect with good options succeeds. (It once
/// moved the QP to RTR first and then refused `max_rd_atomic`, leaving it stuck there.)
#[test]
fn connect_checks_its_values_before_any_transition() {
    use crate::common::{connect_opts, ctx, gid_index};
    use rsrdma::{Cq, Pd, Qp, QpState, QpType};
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 8, None).unwrap();
    let a = Qp::builder(QpType::Rc).build(&pd, &cq, &cq).unwrap();
    let b = Qp::builder(QpType::Rc).build(&pd, &cq, &cq).unwrap();
    let ea = a.endpoint(1, Some(gid_index()), 0x10).unwrap();
    let eb = b.endpoint(1, Some(gid_index()), 0x20).unwrap();
    let good = connect_opts(AccessFlags::NONE);
    let too_deep = connect_opts(AccessFlags::NONE).max_rd_atomic(Some(200));
    match a.connect(&too_deep, ea.psn, &eb) {
        Err(Error::Limit { what, .. }) => assert_eq!(what, "max_rd_atomic"),
        other => panic!("max_rd_atomic 200: {other:?}"),
    }
    assert_eq!(a.query().unwrap().state, QpState::Reset);
    // Past soft0's table of 2; an empty entry of rxe's 1024.
    let no_such_gid = connect_opts(AccessFlags::NONE).gid_index(Some(200));
    match a.connect(&no_such_gid, ea.psn, &eb) {
        Err(Error::Limit {
            what: "gid_index", ..
        }) => {}
        Err(Error::InvalidArgument(m)) if m.contains("holds no GID") => {}
        other => panic!("GID index 200: {other:?}"),
    }
    assert_eq!(a.query().unwrap().state, QpState::Reset);
    let no_such_sl = connect_opts(AccessFlags::NONE).sl(16);
    assert!(matches!(
        a.connect(&no_such_sl, ea.psn, &eb),
        Err(Error::Limit { what: "sl", .. })
    ));
    assert_eq!(a.query().unwrap().state, QpState::Reset);
    let late_code = connect_opts(AccessFlags::NONE).timeout(40);
    assert!(matches!(
        a.connect(&late_code, ea.psn, &eb),
        Err(Error::Limit {
            what: "timeout",
            ..
        })
    ));
    assert_eq!(a.query().unwrap().state, QpState::Reset);
    a.connect(&good, ea.psn, &eb).unwrap();
    b.connect(&good, eb.psn, &ea).unwrap();
    assert_eq!(a.query().unwrap().state, QpState::Rts);
}
