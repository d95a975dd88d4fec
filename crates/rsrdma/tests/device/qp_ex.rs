//! Issue 23: the extended work-request API (`ibv_create_qp_ex`, `ibv_wr_*`) through
//! `QpBuilder::build_ex` and `Qp::wr_batch`. rxe has it; soft0 refuses it clearly. Inline
//! data is not tested on this path: the VM's rxe (rdma-core 44) delivers an inline request
//! posted through `ibv_wr_set_inline_data_list` with no bytes (byte_len 0), its provider's
//! `resid` bug discussed on linux-rdma.

use crate::common::{
    assert_quiet, connect_opts, ctx, device_name, fill, gid_index, poll_n, poll_ok, snap,
};
use rsrdma::{
    AccessFlags, Cq, Error, Mr, Pd, Qp, QpCaps, QpType, RecvWr, SendOps, SendWr, WcOpcode,
};

#[test]
fn an_extended_qp_posts_a_batch_of_every_operation_and_an_aborted_batch_posts_nothing() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let (cq_a, cq_b) = (
        Cq::new(&ctx, 64, None).unwrap(),
        Cq::new(&ctx, 64, None).unwrap(),
    );
    let mut caps = QpCaps::default();
    caps.max_inline_data = 64;
    let built = Qp::builder(QpType::Rc)
        .caps(caps)
        .build_ex(&pd, &cq_a, &cq_a, SendOps::ALL);
    if device_name() == "soft0" {
        // No extended QPs on the software device: a clear refusal, naming the call.
        match built {
            Err(Error::Unsupported { op, .. }) => assert_eq!(op, "ibv_create_qp_ex"),
            other => panic!("soft0 made an extended QP: {other:?}"),
        }
        return;
    }
    let a = built.unwrap();
    let b = Qp::builder(QpType::Rc).build(&pd, &cq_b, &cq_b).unwrap();
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let opts = connect_opts(access);
    let ea = a.endpoint(1, Some(gid_index()), 0x100).unwrap();
    let eb = b.endpoint(1, Some(gid_index()), 0x200).unwrap();
    a.connect(&opts, ea.psn, &eb).unwrap();
    b.connect(&opts, eb.psn, &ea).unwrap();

    let mut src = Mr::new(&pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
    let target = Mr::new(&pd, 8192, access).unwrap();
    let inbox = Mr::new(&pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
    fill(&mut src, 5);
    let t = target.remote();
    let send_sge = [src.sge(0, 1000).unwrap()];
    let write_sge = [src.sge(1000, 3000).unwrap()];
    let read_sge = [src.sge(6000, 512).unwrap()];
    let atomic_sge = [src.sge(7000, 8).unwrap()];
    let recv = [inbox.sge(0, 4096).unwrap()];
    let recv2 = [inbox.sge(4096, 4096).unwrap()];
    // SAFETY: every region outlives the completions polled below, and nothing reads or
    // writes them meanwhile.
    unsafe {
        b.post_recv(&RecvWr::new(90, &recv)).unwrap();
        b.post_recv(&RecvWr::new(91, &recv2)).unwrap();
        // An aborted batch: dropped before `complete`, nothing of it is posted.
        let mut aborted = a.wr_batch().unwrap();
        aborted.post(&SendWr::send(66, &send_sge)).unwrap();
        drop(aborted);

        let mut batch = a.wr_batch().unwrap();
        // A second open batch of the same QP is refused: the provider's batch state is one
        // per QP, and its lock is held (a second ibv_wr_start on this thread spun for ever).
        assert!(matches!(a.wr_batch(), Err(Error::InvalidArgument(_))));
        batch
            .post(&SendWr::send_with_imm(1, &send_sge, 0xabcd))
            .unwrap();
        batch
            .post(&SendWr::rdma_write(2, &write_sge, t.addr, t.rkey))
            .unwrap();
        batch
            .post(&SendWr::atomic_fetch_add(
                3,
                &atomic_sge,
                t.addr_at(4096, 8).unwrap(),
                t.rkey,
                7,
            ))
            .unwrap();
        batch
            .post(&SendWr::rdma_read(
                4,
                &read_sge,
                t.addr_at(100, 512).unwrap(),
                t.rkey,
            ))
            .unwrap();
        batch.post(&SendWr::send(5, &send_sge[..])).unwrap();
        assert_eq!(batch.len(), 5);
        batch.complete().unwrap();
    }
    let done = poll_n(&cq_a, 5);
    let ids: Vec<u64> = done.iter().map(|w| w.wr_id()).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5], "in order, the aborted one absent");
    for w in &done {
        w.ok().unwrap();
    }
    let got = [poll_ok(&cq_b), poll_ok(&cq_b)];
    assert_quiet(&cq_a);
    assert_eq!((got[0].wr_id(), got[0].byte_len()), (90, 1000));
    assert_eq!(got[0].imm_data(), Some(0xabcd));
    assert_eq!(got[1].opcode(), WcOpcode::RECV);
    assert_eq!((got[1].wr_id(), got[1].byte_len()), (91, 1000));
    let inbox_bytes = snap(&inbox);
    assert_eq!(&inbox_bytes[..1000], &snap(&src)[..1000]);
    assert_eq!(&inbox_bytes[4096..5096], &snap(&src)[..1000]);
    let mut t_bytes = vec![0u8; 8192];
    target.read_at(0, &mut t_bytes).unwrap();
    assert_eq!(
        &t_bytes[..3000],
        &snap(&src)[1000..4000],
        "the WRITE landed"
    );
    assert_eq!(
        u64::from_ne_bytes(t_bytes[4096..4104].try_into().unwrap()),
        7,
        "the fetch-and-add added"
    );
    let s = snap(&src);
    assert_eq!(
        &s[6000..6512],
        &t_bytes[100..612],
        "the READ brought the target's bytes"
    );
    assert_eq!(
        &s[7000..7008],
        &[0u8; 8],
        "the fetch-and-add returned the old value"
    );
    // A QP made the classic way has no batches.
    assert!(matches!(b.wr_batch(), Err(Error::InvalidArgument(_))));
}

#[test]
fn an_extended_cq_hands_each_completion_with_the_fields_it_was_made_with() {
    use rsrdma::WcFields;
    let ctx = ctx();
    let made = Cq::new_ex(&ctx, 64, None, WcFields::STANDARD);
    if device_name() == "soft0" {
        match made {
            Err(Error::Unsupported { op, .. }) => assert_eq!(op, "ibv_create_cq_ex"),
            other => panic!("soft0 made an extended CQ: {other:?}"),
        }
        return;
    }
    let (cq_a, cq_b) = (
        made.unwrap(),
        Cq::new_ex(&ctx, 64, None, WcFields::STANDARD).unwrap(),
    );
    let pd = Pd::new(&ctx).unwrap();
    let a = Qp::builder(QpType::Rc).build(&pd, &cq_a, &cq_a).unwrap();
    let b = Qp::builder(QpType::Rc).build(&pd, &cq_b, &cq_b).unwrap();
    let opts = connect_opts(AccessFlags::LOCAL_WRITE);
    let ea = a.endpoint(1, Some(gid_index()), 0x300).unwrap();
    let eb = b.endpoint(1, Some(gid_index()), 0x400).unwrap();
    a.connect(&opts, ea.psn, &eb).unwrap();
    b.connect(&opts, eb.psn, &ea).unwrap();
    let mut src = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    fill(&mut src, 3);
    let s1 = [src.sge(0, 700).unwrap()];
    let s2 = [src.sge(1000, 300).unwrap()];
    let r1 = [dst.sge(0, 2048).unwrap()];
    let r2 = [dst.sge(2048, 2048).unwrap()];
    // SAFETY: the regions outlive the completions polled below.
    unsafe {
        b.post_recv(&RecvWr::new(10, &r1)).unwrap();
        b.post_recv(&RecvWr::new(11, &r2)).unwrap();
        a.post_send(&SendWr::send_with_imm(1, &s1, 0x1234)).unwrap();
        a.post_send(&SendWr::send(2, &s2)).unwrap();
    }
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while got.len() < 2 && std::time::Instant::now() < deadline {
        cq_b.poll_ex(8, |w| {
            got.push((
                w.wr_id(),
                w.status().0,
                w.opcode(),
                w.byte_len(),
                w.imm_data(),
                w.qp_num(),
            ))
        })
        .unwrap();
    }
    assert_eq!(
        got,
        [
            (10, 0, WcOpcode::RECV, 700, Some(0x1234), b.qp_num()),
            (11, 0, WcOpcode::RECV, 300, None, b.qp_num()),
        ]
    );
    let mut sent = Vec::new();
    while sent.len() < 2 && std::time::Instant::now() < deadline {
        cq_a.poll_ex(1, |w| sent.push((w.wr_id(), w.status().0)))
            .unwrap();
    }
    assert_eq!(sent, [(1, 0), (2, 0)], "one at a time with max 1, in order");
    assert_eq!(cq_a.poll_ex(8, |_| panic!("nothing left")).unwrap(), 0);
    assert_eq!(&snap(&dst)[..700], &snap(&src)[..700]);
    // A CQ made the classic way has no extended poll.
    let plain = Cq::new(&ctx, 4, None).unwrap();
    assert!(matches!(
        plain.poll_ex(1, |_| ()),
        Err(Error::InvalidArgument(_))
    ));
}
