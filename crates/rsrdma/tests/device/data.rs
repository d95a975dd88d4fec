//! RC data path: send/receive at the edge sizes, immediate data, RDMA write and read, remote
//! access errors, atomics, batches, selective signaling, inline sends, flush on error.

use crate::common::{assert_quiet, fill, poll_n, poll_ok, rc_pair, snap};
use rsrdma::{AccessFlags, Error, Mr, QpCaps, RecvWr, SendWr, WcOpcode, WcStatus};

const SIZES: [usize; 6] = [0, 1, 4095, 4096, 4097, 1 << 20];

#[test]
fn rc_send_recv_at_edge_sizes() {
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    let max = *SIZES.iter().max().unwrap();
    let mut src = Mr::new(&p.pd, max, AccessFlags::NONE).unwrap();
    let mut dst = Mr::new(&p.pd, max, AccessFlags::LOCAL_WRITE).unwrap();
    for (round, &size) in SIZES.iter().enumerate() {
        fill(&mut src, round as u8);
        dst.write_at(0, &vec![0xee; max]).unwrap();
        let rsge = [dst.sge(0, max).unwrap()];
        let ssge = [src.sge(0, size).unwrap()];
        // SAFETY: both MRs outlive the completions polled below; neither is touched meanwhile.
        unsafe {
            p.b.post_recv(&RecvWr::new(100 + round as u64, &rsge))
                .unwrap();
            p.a.post_send(&SendWr::send(round as u64, &ssge)).unwrap();
        }
        let s = poll_ok(&p.cq_a);
        assert_eq!((s.wr_id(), s.opcode()), (round as u64, WcOpcode::SEND));
        let r = poll_ok(&p.cq_b);
        assert_eq!(r.wr_id(), 100 + round as u64);
        assert_eq!(r.opcode(), WcOpcode::RECV);
        assert_eq!(r.byte_len() as usize, size, "byte_len at size {size}");
        assert_eq!(r.imm_data(), None);
        assert_eq!(
            &snap(&dst)[..size],
            &snap(&src)[..size],
            "payload at size {size}"
        );
        assert!(
            snap(&dst)[size..].iter().all(|&b| b == 0xee),
            "bytes past {size} untouched"
        );
    }
}

#[test]
fn immediate_data_reaches_the_receiver() {
    let p = rc_pair(
        QpCaps::default(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    let mut src = Mr::new(&p.pd, 64, AccessFlags::NONE).unwrap();
    let dst = Mr::new(
        &p.pd,
        64,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )
    .unwrap();
    fill(&mut src, 3);
    let rsge = [dst.sge(0, 64).unwrap()];
    let ssge = [src.sge(0, 16).unwrap()];
    // SAFETY: the MRs outlive the completions; untouched meanwhile.
    unsafe {
        p.b.post_recv(&RecvWr::new(1, &rsge)).unwrap();
        p.a.post_send(&SendWr::send_with_imm(2, &ssge, 0xdead_beef))
            .unwrap();
    }
    poll_ok(&p.cq_a);
    let r = poll_ok(&p.cq_b);
    assert_eq!(r.imm_data(), Some(0xdead_beef));
    assert_eq!(r.byte_len(), 16);
    assert_eq!(&snap(&dst)[..16], &snap(&src)[..16]);

    // Write with immediate: the payload lands by RDMA, the immediate in a receive completion
    // that consumes a (payload-less) receive request.
    let remote = dst.remote();
    let wsge = [src.sge(16, 32).unwrap()];
    // SAFETY: as above.
    unsafe {
        p.b.post_recv(&RecvWr::new(3, &[])).unwrap();
        p.a.post_send(&SendWr::rdma_write_with_imm(
            4,
            &wsge,
            remote.addr_at(32, 32).unwrap(),
            remote.rkey,
            77,
        ))
        .unwrap();
    }
    let s = poll_ok(&p.cq_a);
    assert_eq!(s.opcode(), WcOpcode::RDMA_WRITE);
    let r = poll_ok(&p.cq_b);
    assert_eq!(r.opcode(), WcOpcode::RECV_RDMA_WITH_IMM);
    assert_eq!(r.imm_data(), Some(77));
    assert_eq!(&snap(&dst)[32..64], &snap(&src)[16..48]);
}

#[test]
fn rdma_write_and_read_move_bytes_exactly() {
    let remote_access =
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let p = rc_pair(QpCaps::default(), remote_access);
    let len = 1 << 20;
    let mut local = Mr::new(&p.pd, len, AccessFlags::LOCAL_WRITE).unwrap();
    let mut target = Mr::new(&p.pd, len, remote_access).unwrap();
    fill(&mut local, 9);
    fill(&mut target, 200);
    let t = target.remote();
    // Write 1 MiB, then read a different region back into the first half of `local`'s copy.
    let sge = [local.sge(0, len).unwrap()];
    // SAFETY: MRs outlive the completion; untouched until it is polled.
    unsafe {
        p.a.post_send(&SendWr::rdma_write(1, &sge, t.addr, t.rkey))
            .unwrap()
    };
    let wc = poll_ok(&p.cq_a);
    assert_eq!(wc.opcode(), WcOpcode::RDMA_WRITE);
    assert_eq!(snap(&target), snap(&local), "write copied every byte");
    assert_quiet(&p.cq_b);

    fill(&mut target, 77);
    let expect = snap(&target)[4096..4096 + 10000].to_vec();
    let sge = [local.sge(100, 10000).unwrap()];
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::rdma_read(
            2,
            &sge,
            t.addr_at(4096, 10000).unwrap(),
            t.rkey,
        ))
        .unwrap()
    };
    let wc = poll_ok(&p.cq_a);
    assert_eq!(wc.opcode(), WcOpcode::RDMA_READ);
    assert_eq!(&snap(&local)[100..10100], &expect[..]);
}

/// Posts one RDMA write that must fail with a remote access error, then checks the error
/// names the status and WR id, and that the QP is in ERROR (no hang).
fn expect_remote_access_error(wr_id: u64, f: impl FnOnce(&rsrdma::Qp, &Mr) -> Mr) {
    let p = rc_pair(
        QpCaps::default(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    let src = Mr::new(&p.pd, 4096, AccessFlags::NONE).unwrap();
    // The target region stays registered until the error has been seen.
    let _target = f(&p.a, &src);
    let wc = poll_n(&p.cq_a, 1)[0];
    assert_eq!(wc.wr_id(), wr_id);
    assert_eq!(wc.status(), WcStatus::REM_ACCESS_ERR, "{wc:?}");
    let e = wc.ok().unwrap_err();
    assert!(
        matches!(e, Error::WorkCompletion { status: WcStatus::REM_ACCESS_ERR, wr_id: w, .. } if w == wr_id)
    );
    assert!(e.to_string().contains("IBV_WC_REM_ACCESS_ERR"), "{e}");
    assert_eq!(p.a.query().unwrap().state, rsrdma::QpState::Error);
    // The device moved the QP to ERROR behind the handle's back: `state()` must see it
    // (reading libibverbs' cached field said RTS).
    assert_eq!(p.a.state(), rsrdma::QpState::Error);
}

#[test]
fn wrong_rkey_ends_in_remote_access_error() {
    expect_remote_access_error(5, |qp, src| {
        let target = Mr::new(
            qp.pd(),
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
        let sge = [src.sge(0, 64).unwrap()];
        let bad_rkey = target.rkey() ^ 0x5a5a_0000;
        // SAFETY: `src` outlives the completion polled by the caller.
        unsafe {
            qp.post_send(&SendWr::rdma_write(5, &sge, target.addr(), bad_rkey))
                .unwrap()
        };
        target
    });
}

#[test]
fn out_of_bounds_remote_address_ends_in_remote_access_error() {
    expect_remote_access_error(6, |qp, src| {
        let target = Mr::new(
            qp.pd(),
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
        let t = target.remote();
        assert!(
            t.addr_at(4090, 64).is_err(),
            "the checked helper refuses it"
        );
        let sge = [src.sge(0, 64).unwrap()];
        // SAFETY: as above. The raw address runs past the region on purpose.
        unsafe {
            qp.post_send(&SendWr::rdma_write(6, &sge, t.addr + 4090, t.rkey))
                .unwrap()
        };
        target
    });
}

#[test]
fn memory_without_remote_write_refuses_writes() {
    // Least privilege: a region registered without REMOTE_WRITE cannot be written by a peer,
    // even through a QP that allows remote writes.
    expect_remote_access_error(7, |qp, src| {
        let target = Mr::new(qp.pd(), 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = [src.sge(0, 64).unwrap()];
        // SAFETY: as above.
        unsafe {
            qp.post_send(&SendWr::rdma_write(7, &sge, target.addr(), target.rkey()))
                .unwrap()
        };
        target
    });
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let p = rc_pair(QpCaps::default(), access);
    assert_ne!(
        p.ctx.attr().atomic_cap,
        rsrdma::AtomicCap::None,
        "rxe supports atomics"
    );
    let mut target = Mr::new(&p.pd, 64, access).unwrap();
    target.write_at(0, &100u64.to_ne_bytes()).unwrap();
    let t = target.remote();
    let result = Mr::new(&p.pd, 16, AccessFlags::LOCAL_WRITE).unwrap();
    let old = |mr: &Mr, at: usize| u64::from_ne_bytes(snap(mr)[at..at + 8].try_into().unwrap());

    let sge = [result.sge(0, 8).unwrap()];
    // SAFETY: MRs outlive the completions; untouched until polled.
    unsafe {
        p.a.post_send(&SendWr::atomic_fetch_add(1, &sge, t.addr, t.rkey, 23))
            .unwrap()
    };
    assert_eq!(poll_ok(&p.cq_a).opcode(), WcOpcode::FETCH_ADD);
    assert_eq!(old(&result, 0), 100);
    assert_eq!(old(&target, 0), 123);

    let sge = [result.sge(8, 8).unwrap()];
    // A compare that does not match leaves the value alone…
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::atomic_cmp_swap(2, &sge, t.addr, t.rkey, 5, 999))
            .unwrap()
    };
    assert_eq!(poll_ok(&p.cq_a).opcode(), WcOpcode::COMP_SWAP);
    assert_eq!((old(&result, 8), old(&target, 0)), (123, 123));
    // …one that matches swaps.
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::atomic_cmp_swap(3, &sge, t.addr, t.rkey, 123, 999))
            .unwrap()
    };
    poll_ok(&p.cq_a);
    assert_eq!((old(&result, 8), old(&target, 0)), (123, 999));
}

#[test]
fn batch_of_64_in_one_post_with_every_16th_signaled() {
    let caps = QpCaps::default().max_send_wr(64).max_recv_wr(64);
    let p = rc_pair(caps, AccessFlags::NONE);
    let slot = 256;
    let mut src = Mr::new(&p.pd, 64 * slot, AccessFlags::NONE).unwrap();
    let dst = Mr::new(&p.pd, 64 * slot, AccessFlags::LOCAL_WRITE).unwrap();
    fill(&mut src, 42);
    let rsges: Vec<_> = (0..64)
        .map(|i| [dst.sge(i * slot, slot).unwrap()])
        .collect();
    let ssges: Vec<_> = (0..64)
        .map(|i| [src.sge(i * slot, slot).unwrap()])
        .collect();
    let mut recvs: Vec<_> = rsges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr::new(i as u64, s))
        .collect();
    let mut sends: Vec<_> = ssges
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr::send(i as u64, s).signaled((i + 1) % 16 == 0))
        .collect();
    // SAFETY: the MRs outlive every completion polled below; untouched meanwhile.
    unsafe {
        p.b.post_recv_batch(&mut recvs).unwrap();
        p.a.post_send_batch(&mut sends).unwrap();
    }
    let r = poll_n(&p.cq_b, 64);
    assert!(r.iter().all(|w| w.is_ok()));
    let ids: Vec<u64> = r.iter().map(|w| w.wr_id()).collect();
    assert_eq!(
        ids,
        (0..64).collect::<Vec<_>>(),
        "receives complete in order"
    );
    let s = poll_n(&p.cq_a, 4);
    assert_eq!(
        s.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        vec![15, 31, 47, 63]
    );
    assert_quiet(&p.cq_a);
    assert_eq!(snap(&dst), snap(&src));
}

#[test]
fn batch_post_reports_which_request_failed() {
    let caps = QpCaps::default()
        .max_send_wr(16)
        .max_recv_wr(16)
        .max_send_sge(1);
    let p = rc_pair(caps, AccessFlags::NONE);
    let src = Mr::new(&p.pd, 4096, AccessFlags::NONE).unwrap();
    let dst = Mr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let one = [src.sge(0, 8).unwrap()];
    let two = [src.sge(0, 8).unwrap(), src.sge(8, 8).unwrap()];
    let rsges: Vec<_> = (0..3).map(|i| [dst.sge(i * 64, 64).unwrap()]).collect();
    let mut recvs: Vec<_> = rsges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr::new(i as u64, s))
        .collect();
    // The third request has more SGEs than the QP allows.
    let mut sends = [
        SendWr::send(0, &one),
        SendWr::send(1, &one),
        SendWr::send(2, &two),
        SendWr::send(3, &one),
    ];
    // SAFETY: the MRs outlive the completions; untouched meanwhile.
    let err = unsafe {
        p.b.post_recv_batch(&mut recvs).unwrap();
        p.a.post_send_batch(&mut sends).unwrap_err()
    };
    match err {
        Error::Post {
            op: "ibv_post_send",
            index: 2,
            count: 4,
            ..
        } => {}
        other => panic!("expected the failure at index 2, got {other}"),
    }
    // The two before it were posted and complete.
    let done = poll_n(&p.cq_a, 2);
    assert_eq!(
        done.iter().map(|w| w.wr_id()).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(poll_n(&p.cq_b, 2).len(), 2);
    assert_quiet(&p.cq_a);
}

#[test]
fn unsignaled_sends_with_every_nth_signaled() {
    let n = 200u64;
    let every = 10;
    let caps = QpCaps::default().max_send_wr(32).max_recv_wr(256);
    let p = rc_pair(caps, AccessFlags::NONE);
    let src = Mr::new(&p.pd, 64, AccessFlags::NONE).unwrap();
    let dst = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let ssge = [src.sge(0, 64).unwrap()];
    let rsge = [dst.sge(0, 64).unwrap()];
    for i in 0..n {
        // SAFETY: the MRs outlive every completion (all polled below).
        unsafe { p.b.post_recv(&RecvWr::new(i, &rsge)).unwrap() };
    }
    let mut signaled = Vec::new();
    for i in 0..n {
        let sig = (i + 1) % every == 0;
        // SAFETY: as above.
        unsafe {
            p.a.post_send(&SendWr::send(i, &ssge).signaled(sig))
                .unwrap()
        };
        if sig {
            // Reaping the signaled one frees the send-queue slots of the unsignaled before it.
            signaled.push(poll_ok(&p.cq_a).wr_id());
        }
    }
    let expect: Vec<u64> = (0..n).filter(|i| (i + 1) % every == 0).collect();
    assert_eq!(signaled, expect);
    assert_eq!(poll_n(&p.cq_b, n as usize).len(), n as usize);
    assert_quiet(&p.cq_a);
}

#[test]
fn inline_sends_need_no_registration_and_respect_the_limit() {
    let caps = QpCaps::default().max_inline_data(64);
    let p = rc_pair(caps, AccessFlags::NONE);
    assert!(p.a.caps().max_inline_data >= 64);
    let dst = Mr::new(&p.pd, 256, AccessFlags::LOCAL_WRITE).unwrap();
    let rsge = [dst.sge(0, 256).unwrap()];
    let payload = *b"inline payload, from plain stack memory";
    let sge = [rsrdma::Sge::inline(&payload)];
    // SAFETY: inline data is copied at post time; `dst` outlives the completion.
    unsafe {
        p.b.post_recv(&RecvWr::new(1, &rsge)).unwrap();
        p.a.post_send(&SendWr::send(1, &sge).inline()).unwrap();
    }
    poll_ok(&p.cq_a);
    let r = poll_ok(&p.cq_b);
    assert_eq!(&snap(&dst)[..r.byte_len() as usize], &payload[..]);
    let big = vec![0u8; p.a.caps().max_inline_data as usize + 1];
    let sge = [rsrdma::Sge::inline(&big)];
    // SAFETY: refused before reaching the provider.
    let e = unsafe { p.a.post_send(&SendWr::send(2, &sge).inline()) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                what: "inline payload",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn qp_moved_to_error_flushes_its_requests() {
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    let dst = Mr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let rsges: Vec<_> = (0..8).map(|i| [dst.sge(i * 512, 512).unwrap()]).collect();
    for (i, s) in rsges.iter().enumerate() {
        // SAFETY: `dst` outlives the flush completions polled below.
        unsafe { p.b.post_recv(&RecvWr::new(i as u64, s)).unwrap() };
    }
    p.b.to_error().unwrap();
    assert_eq!(p.b.query().unwrap().state, rsrdma::QpState::Error);
    let flushed = poll_n(&p.cq_b, 8);
    for (i, w) in flushed.iter().enumerate() {
        assert_eq!(w.status(), WcStatus::WR_FLUSH_ERR);
        assert_eq!(w.wr_id(), i as u64);
    }
    // Sends posted after the move flush too. (Receives posted later are flushed only when the
    // provider next looks at the queue: rxe's user-space receive path never enters the kernel.)
    let src = Mr::new(&p.pd, 64, AccessFlags::NONE).unwrap();
    let ssge = [src.sge(0, 64).unwrap()];
    // SAFETY: `src` outlives the completion polled below.
    unsafe { p.b.post_send(&SendWr::send(99, &ssge)).unwrap() };
    let w = poll_n(&p.cq_b, 1)[0];
    assert_eq!((w.wr_id(), w.status()), (99, WcStatus::WR_FLUSH_ERR));
}

#[test]
fn transitions_are_checked_and_queryable() {
    use rsrdma::{InitAttr, Qp, QpState, QpType, RtsAttr};
    let ctx = crate::common::ctx();
    let pd = rsrdma::Pd::new(&ctx).unwrap();
    let cq = rsrdma::Cq::new(&ctx, 8, None).unwrap();
    let qp = Qp::builder(QpType::Rc).build(&pd, &cq, &cq).unwrap();
    assert_eq!(qp.state(), QpState::Reset);
    let rts = RtsAttr::default().sq_psn(1);
    let e = qp.to_rts(&rts).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rts,
                ..
            }
        ),
        "{e}"
    );
    qp.to_init(&InitAttr::default().access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ))
        .unwrap();
    let info = qp.query().unwrap();
    assert_eq!(info.state, QpState::Init);
    assert_eq!(info.port, 1);
    assert!(info.access.contains(AccessFlags::REMOTE_READ));
    assert!(!info.access.contains(AccessFlags::REMOTE_WRITE));

    // Fully connected: every attribute set is what query reports.
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    let info = p.a.query().unwrap();
    assert_eq!(info.state, QpState::Rts);
    assert_eq!(info.dest_qp_num, p.b.qp_num());
    assert_eq!(
        (
            info.timeout,
            info.retry_cnt,
            info.rnr_retry,
            info.min_rnr_timer
        ),
        (14, 7, 7, 12)
    );
    assert_eq!(info.sq_psn, 0x1000);
    assert_eq!(info.rq_psn, 0x2000);
    let grh = info.ah.grh.expect("RoCE paths are global");
    // We ask for 0xff (perftest's choice, routable); on RoCE the kernel substitutes the route's
    // TTL (64 on Linux). Either way it is not the reference's 1, which breaks at the first router.
    assert!(grh.hop_limit >= 64, "hop limit {}", grh.hop_limit);
    // Beyond the device's read/atomic depth: refused before the verb.
    let too_deep = rts.max_rd_atomic(255);
    let max = ctx.attr().max_qp_init_rd_atom;
    if max < 255 {
        let e = p.a.to_rts(&too_deep).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Limit {
                    what: "max_rd_atomic",
                    ..
                }
            ),
            "{e}"
        );
    }
}

#[test]
fn uc_send_and_rdma_write() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let p = crate::common::pair(
        rsrdma::QpType::Uc,
        QpCaps::default(),
        AccessFlags::REMOTE_WRITE,
    );
    assert_eq!(p.a.query().unwrap().state, rsrdma::QpState::Rts);
    let mut src = Mr::new(&p.pd, 8192, AccessFlags::NONE).unwrap();
    fill(&mut src, 5);
    let dst = Mr::new(&p.pd, 8192, access).unwrap();
    let rsge = [dst.sge(0, 4096).unwrap()];
    let ssge = [src.sge(0, 3000).unwrap()];
    // SAFETY: the MRs outlive the completions polled below; untouched meanwhile.
    unsafe {
        p.b.post_recv(&RecvWr::new(1, &rsge)).unwrap();
        p.a.post_send(&SendWr::send(2, &ssge)).unwrap();
    }
    poll_ok(&p.cq_a);
    let r = poll_ok(&p.cq_b);
    assert_eq!(r.byte_len(), 3000);
    assert_eq!(&snap(&dst)[..3000], &snap(&src)[..3000]);
    let t = dst.remote();
    let wsge = [src.sge(4096, 4096).unwrap()];
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::rdma_write(
            3,
            &wsge,
            t.addr_at(4096, 4096).unwrap(),
            t.rkey,
        ))
        .unwrap()
    };
    poll_ok(&p.cq_a);
    // UC writes are unacknowledged: the sender's completion says the data left, so wait for it
    // to land before comparing.
    let deadline = std::time::Instant::now() + crate::common::WAIT;
    while snap(&dst)[4096..] != snap(&src)[4096..] {
        assert!(
            std::time::Instant::now() < deadline,
            "the UC write never landed"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A SEND into a receive whose memory lacks LOCAL_WRITE: the receive fails on the
/// responder (`LOC_QP_OP_ERR`, a malformed receive; soft0 said `LOC_PROT_ERR`), the sender
/// hears of it (`REM_OP_ERR`), as on rxe.
#[test]
fn a_receive_into_memory_without_local_write_fails_both_ends() {
    let p = rc_pair(QpCaps::default(), AccessFlags::NONE);
    let ro = Mr::new(&p.pd, 64, AccessFlags::NONE).unwrap();
    let src = Mr::new(&p.pd, 64, AccessFlags::NONE).unwrap();
    // SAFETY: both regions outlive the completions polled below.
    unsafe {
        p.b.post_recv(&RecvWr::new(7, &[ro.sge(0, 64).unwrap()]))
            .unwrap();
        p.a.post_send(&SendWr::send(8, &[src.sge(0, 8).unwrap()]))
            .unwrap();
    }
    let r = poll_n(&p.cq_b, 1);
    let s = poll_n(&p.cq_a, 1);
    assert_eq!(r[0].status(), WcStatus::LOC_QP_OP_ERR, "the receive");
    assert_eq!(s[0].status(), WcStatus::REM_OP_ERR, "the send");
}

/// Two queue pairs of `kind` (RC or UC) on the device under test, `a` connected to `b` with
/// `opts` (a short transport timer), `b` left in RESET: the caller brings it up when it likes.
fn a_before_b(
    kind: rsrdma::QpType,
    opts: &rsrdma::ConnectOptions,
) -> (crate::common::Pair, rsrdma::QpEndpoint) {
    use crate::common::{ctx, gid_index};
    use rsrdma::{Cq, Pd, Qp};
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let (cq_a, cq_b) = (
        Cq::new(&ctx, 64, None).unwrap(),
        Cq::new(&ctx, 64, None).unwrap(),
    );
    let a = Qp::builder(kind).build(&pd, &cq_a, &cq_a).unwrap();
    let b = Qp::builder(kind).build(&pd, &cq_b, &cq_b).unwrap();
    let ea = a.endpoint(1, Some(gid_index()), 0x1000).unwrap();
    let eb = b.endpoint(1, Some(gid_index()), 0x2000).unwrap();
    a.connect(opts, ea.psn, &eb).unwrap();
    let p = crate::common::Pair {
        ctx,
        pd,
        cq_a,
        cq_b,
        a,
        b,
    };
    (p, ea)
}

/// A peer queue pair that is not in RTR or RTS (failed, or reset) drops what arrives, as a
/// NIC does: the requester sends again after its timeout, `retry_cnt` times, then ends the
/// request with `RETRY_EXC_ERR` and flushes the rest. (soft0 let them wait for ever.)
#[test]
fn requests_to_a_peer_that_failed_or_was_reset_end_in_retry_exceeded() {
    let mut opts = crate::common::connect_opts(AccessFlags::NONE);
    (opts.timeout, opts.retry_cnt) = (10, 2);
    for reset in [false, true] {
        let (p, ea) = a_before_b(rsrdma::QpType::Rc, &opts);
        let eb =
            p.b.endpoint(1, Some(crate::common::gid_index()), 0x2000)
                .unwrap();
        p.b.connect(&opts, eb.psn, &ea).unwrap();
        match reset {
            false => p.b.to_error().unwrap(),
            true => p.b.reset().unwrap(),
        }
        let src = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = [src.sge(0, 8).unwrap()];
        // SAFETY: `src` outlives the completions polled below.
        unsafe {
            p.a.post_send(&SendWr::send(1, &sge)).unwrap();
            p.a.post_send(&SendWr::send(2, &sge)).unwrap();
        }
        let wcs = poll_n(&p.cq_a, 2);
        let got: Vec<_> = wcs.iter().map(|w| (w.wr_id(), w.status())).collect();
        assert_eq!(
            got,
            [(1, WcStatus::RETRY_EXC_ERR), (2, WcStatus::WR_FLUSH_ERR)],
            "peer reset: {reset}"
        );
    }
}

/// A SEND that reaches its peer before the peer is ready (still in INIT: two sides of a
/// connection come up one after the other) is delivered once it is, by the requester's
/// retry after its timeout, exactly once.
#[test]
fn a_send_that_arrives_before_its_peer_is_ready_is_delivered_once_it_is() {
    let mut opts = crate::common::connect_opts(AccessFlags::NONE);
    (opts.timeout, opts.retry_cnt) = (12, 7);
    let (p, ea) = a_before_b(rsrdma::QpType::Rc, &opts);
    let mut init = rsrdma::InitAttr::default();
    init.port = 1;
    p.b.to_init(&init).unwrap();
    let dst = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut src = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, b"too early").unwrap();
    // SAFETY: `dst` and `src` outlive the completions polled below.
    unsafe {
        p.b.post_recv(&RecvWr::new(9, &[dst.sge(0, 64).unwrap()]))
            .unwrap();
        p.a.post_send(&SendWr::send(1, &[src.sge(0, 9).unwrap()]))
            .unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    let eb =
        p.b.endpoint(1, Some(crate::common::gid_index()), 0x2000)
            .unwrap();
    p.b.connect(&opts, eb.psn, &ea).unwrap();
    assert_eq!(poll_ok(&p.cq_a).wr_id(), 1);
    let wc = poll_ok(&p.cq_b);
    assert_eq!((wc.wr_id(), wc.byte_len()), (9, 9));
    let mut got = [0u8; 9];
    dst.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"too early");
    assert_quiet(&p.cq_b);
}

/// A fenced SEND waits for the READ before it, so it carries what the READ brought into its
/// buffer. (soft0 accepted the fence and ignored it: the SEND carried the buffer's old bytes.)
#[test]
fn a_fenced_send_carries_what_the_read_before_it_brought() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let p = rc_pair(QpCaps::default(), access);
    let mut theirs = Mr::new(&p.pd, 64, access).unwrap();
    theirs.write_at(0, b"fresh!!!").unwrap();
    let mut mine = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    mine.write_at(0, &[0xee; 8]).unwrap();
    let inbox = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let r = theirs.remote();
    let x = [mine.sge(0, 8).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe {
        p.b.post_recv(&RecvWr::new(9, &[inbox.sge(0, 8).unwrap()]))
            .unwrap();
        // One post, so that nothing of the READ is done before the SEND is taken.
        p.a.post_send_batch(&mut [
            SendWr::rdma_read(1, &x, r.addr, r.rkey),
            SendWr::send(2, &x).fence(),
        ])
        .unwrap();
    }
    let got: Vec<_> = poll_n(&p.cq_a, 2)
        .iter()
        .map(|w| (w.wr_id(), w.status()))
        .collect();
    assert_eq!(got, [(1, WcStatus::SUCCESS), (2, WcStatus::SUCCESS)]);
    assert_eq!(poll_ok(&p.cq_b).wr_id(), 9);
    let mut sent = [0u8; 8];
    inbox.read_at(0, &mut sent).unwrap();
    assert_eq!(
        &sent, b"fresh!!!",
        "the SEND carried the buffer before the READ landed"
    );
}

/// Atomics checked where rxe's provider checks them, at the post: a remote address that is
/// not 8-byte aligned is refused (`EINVAL`), and nothing fails (soft0 posted it, then
/// failed both queue pairs with `REM_INV_REQ_ERR`).
#[test]
fn a_misaligned_atomic_is_refused_at_the_post() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let p = rc_pair(QpCaps::default(), access);
    let target = Mr::new(&p.pd, 64, access).unwrap();
    let t = target.remote();
    let result = Mr::new(&p.pd, 16, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [result.sge(0, 8).unwrap()];
    // SAFETY: MRs outlive the completions; untouched until polled.
    let r = unsafe {
        p.a.post_send(&SendWr::atomic_fetch_add(1, &sge, t.addr + 4, t.rkey, 1))
    };
    let e = r.expect_err("a misaligned fetch-and-add was posted");
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    // SAFETY: as above.
    let r = unsafe {
        p.a.post_send(&SendWr::atomic_cmp_swap(2, &sge, t.addr + 1, t.rkey, 0, 1))
    };
    assert_eq!(
        r.expect_err("a misaligned compare-and-swap was posted")
            .errno(),
        Some(libc::EINVAL)
    );
    // Both queue pairs are fine: an aligned one works, and a local SGE longer than the word
    // takes the old value in its first 8 bytes (rxe's provider asks for at least 8; soft0
    // refused anything but 8).
    let wide = [result.sge(0, 16).unwrap()];
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::atomic_fetch_add(3, &wide, t.addr, t.rkey, 5))
            .unwrap()
    };
    assert_eq!(poll_ok(&p.cq_a).wr_id(), 3);
    // SAFETY: as above.
    unsafe {
        p.a.post_send(&SendWr::atomic_fetch_add(4, &wide, t.addr, t.rkey, 1))
            .unwrap()
    };
    // (Its completion's length is the local memory's, as rxe reports it.)
    let wc = poll_ok(&p.cq_a);
    assert_eq!((wc.wr_id(), wc.byte_len()), (4, 16));
    assert_eq!(snap(&result)[..8], 5u64.to_ne_bytes());
}

/// UC: a message sent before the peer was up is lost (UC never retries), and the messages
/// after it arrive all the same. (soft0 then dropped every later one for good, each sender
/// completing with success.)
#[test]
fn uc_messages_after_one_lost_before_the_peer_was_up_arrive() {
    let opts = crate::common::connect_opts(AccessFlags::NONE);
    let (p, ea) = a_before_b(rsrdma::QpType::Uc, &opts);
    let mut src = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, b"lost....arrives.").unwrap();
    // SAFETY: the regions outlive the completions polled below.
    unsafe {
        p.a.post_send(&SendWr::send(1, &[src.sge(0, 8).unwrap()]))
            .unwrap()
    };
    poll_ok(&p.cq_a);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let eb =
        p.b.endpoint(1, Some(crate::common::gid_index()), 0x2000)
            .unwrap();
    p.b.connect(&opts, eb.psn, &ea).unwrap();
    let dst = Mr::new(&p.pd, 64 * 4, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..3u64 {
        // SAFETY: as above.
        unsafe {
            p.b.post_recv(&RecvWr::new(
                10 + i,
                &[dst.sge(i as usize * 64, 64).unwrap()],
            ))
            .unwrap();
            p.a.post_send(&SendWr::send(2 + i, &[src.sge(8, 8).unwrap()]))
                .unwrap();
        }
        poll_ok(&p.cq_a);
    }
    let got: Vec<u64> = poll_n(&p.cq_b, 3).iter().map(|w| w.wr_id()).collect();
    assert_eq!(got, [10, 11, 12]);
    assert_eq!(&snap(&dst)[128..136], b"arrives.");
}

/// Many requests meeting a peer with no receive, behind a short RNR timer (10 µs) and
/// endless RNR retries: they all complete once the receives come, and the program can post
/// those receives meanwhile. (soft0's timer thread, resending them all each turn, kept the
/// device for itself once a turn outlasted the timer: the receive was never posted, and the
/// process hung.)
#[test]
fn many_requests_behind_a_short_rnr_timer_complete_once_receives_come() {
    let mut opts = crate::common::connect_opts(AccessFlags::NONE);
    (opts.rnr_retry, opts.min_rnr_timer) = (7, 1);
    let (p, ea) = a_before_b(rsrdma::QpType::Rc, &opts);
    let eb =
        p.b.endpoint(1, Some(crate::common::gid_index()), 0x2000)
            .unwrap();
    p.b.connect(&opts, eb.psn, &ea).unwrap();
    let n = 40;
    let src = Mr::new(&p.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = Mr::new(&p.pd, 64 * n, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..n as u64 {
        // SAFETY: the regions outlive the completions polled below.
        unsafe {
            p.a.post_send(&SendWr::send(i, &[src.sge(0, 8).unwrap()]))
                .unwrap()
        };
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    for i in 0..n {
        // SAFETY: as above.
        unsafe {
            p.b.post_recv(&RecvWr::new(i as u64, &[dst.sge(64 * i, 64).unwrap()]))
                .unwrap()
        };
    }
    let sent: Vec<u64> = poll_n(&p.cq_a, n)
        .iter()
        .map(|w| w.ok().unwrap().wr_id())
        .collect();
    assert_eq!(sent, (0..n as u64).collect::<Vec<_>>());
    let got: Vec<u64> = poll_n(&p.cq_b, n)
        .iter()
        .map(|w| w.ok().unwrap().wr_id())
        .collect();
    assert_eq!(got, (0..n as u64).collect::<Vec<_>>());
}
