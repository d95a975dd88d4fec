//! Type-2 memory windows: bound by a work request, usable only through their queue pair,
//! dead once invalidated.

use crate::common::{connect_opts, fill, gid_index, poll_n, poll_ok, rc_pair, snap};
use rsrdma::{AccessFlags, Cq, Mr, Mw, Qp, QpCaps, QpType, SendWr, WcOpcode, WcStatus};

/// Posts an RDMA READ of `len` bytes at `addr`/`rkey` on `qp` into `dst` and returns the
/// completion's status.
fn read(qp: &Qp, cq: &Cq, dst: &Mr, addr: u64, rkey: u32, len: usize) -> WcStatus {
    let sge = [dst.sge(0, len).unwrap()];
    // SAFETY: `dst` outlives the completion polled just below.
    unsafe {
        qp.post_send(&SendWr::rdma_read(7, &sge, addr, rkey))
            .unwrap()
    };
    poll_n(cq, 1)[0].status()
}

#[test]
fn a_window_serves_reads_through_its_qp_only_and_not_after_its_invalidation() {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let p = rc_pair(QpCaps::default(), access);
    if !p.ctx.attr().has_type2_windows() {
        // A device without them refuses the allocation; it does not pretend.
        assert!(Mw::alloc_type2(&p.pd).is_err());
        return;
    }
    // `b` exposes 8 KiB in the middle of its region to `a`; the region itself grants no
    // remote access.
    let mut mr = Mr::new(
        &p.pd,
        64 << 10,
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
    )
    .unwrap();
    fill(&mut mr, 3);
    let (at, len) = (mr.addr() + 4096, 8192usize);
    let mut mw = Mw::alloc_type2(&p.pd).unwrap();
    let rkey = mw.next_rkey();
    assert_ne!(rkey, mw.rkey(), "each bind gets a new key");
    let wr = SendWr::bind_mw(1, &mw, rkey, &mr, at, len as u64, AccessFlags::REMOTE_READ);
    // SAFETY: `mr` and `mw` outlive every request naming them (dropped at the end, after
    // the completions).
    unsafe { p.b.post_send(&wr).unwrap() };
    assert_eq!(poll_ok(&p.cq_b).opcode(), WcOpcode::BIND_MW);
    mw.set_rkey(rkey);

    let dst = Mr::new(&p.pd, len, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(read(&p.a, &p.cq_a, &dst, at, rkey, len), WcStatus::SUCCESS);
    assert_eq!(snap(&dst), snap(&mr)[4096..4096 + len]);

    // Another connection on the same protection domain: the key does not work through it.
    let cq_c = Cq::new(&p.ctx, 16, None).unwrap();
    let cq_d = Cq::new(&p.ctx, 16, None).unwrap();
    let c = Qp::builder(QpType::Rc).build(&p.pd, &cq_c, &cq_c).unwrap();
    let d = Qp::builder(QpType::Rc).build(&p.pd, &cq_d, &cq_d).unwrap();
    let ec = c.endpoint(1, Some(gid_index()), 0x3000).unwrap();
    let ed = d.endpoint(1, Some(gid_index()), 0x4000).unwrap();
    c.connect(&connect_opts(access), ec.psn, &ed).unwrap();
    d.connect(&connect_opts(access), ed.psn, &ec).unwrap();
    let other = Mr::new(&p.pd, len, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(
        read(&d, &cq_d, &other, at, rkey, len),
        WcStatus::REM_ACCESS_ERR,
        "a type-2 window works only through the QP it was bound on"
    );

    // Invalidated: the key is dead for its own QP too.
    // SAFETY: names no memory.
    unsafe { p.b.post_send(&SendWr::local_inv(2, rkey)).unwrap() };
    assert_eq!(poll_ok(&p.cq_b).opcode(), WcOpcode::LOCAL_INV);
    assert_eq!(
        read(&p.a, &p.cq_a, &dst, at, rkey, 64),
        WcStatus::REM_ACCESS_ERR,
        "no read after the invalidation"
    );
    drop(mw);
}
