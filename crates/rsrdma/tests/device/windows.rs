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
    let wr = SendWr::bind_mw(1, &mw, rkey, &mr, at, len as u64, AccessFlags::REMOTE_READ).unwrap();
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

/// F8: a window grants no more than its region could: remote write through a window over a
/// region that hands out safe slices (not registered remotely writable) is refused, as are a
/// region without MW_BIND and a range outside the region. (Before: the bind was built and a
/// peer could write bytes that safe code held `&[u8]`s to.)
#[test]
fn a_window_never_grants_write_to_a_region_that_hands_out_safe_slices() {
    let p = rc_pair(
        QpCaps::default(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    );
    if !p.ctx.attr().has_type2_windows() {
        return;
    }
    let mw = Mw::alloc_type2(&p.pd).unwrap();
    let rkey = mw.next_rkey();
    let local = Mr::new(&p.pd, 8192, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).unwrap();
    assert!(!local.remotely_writable());
    assert!(
        local.as_slice().is_ok(),
        "this region hands out safe slices"
    );
    let (at, len) = (local.addr(), 4096u64);
    for access in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
        let e = SendWr::bind_mw(1, &mw, rkey, &local, at, len, access).unwrap_err();
        assert!(e.to_string().contains("remotely writable"), "{e}");
    }
    // Read-only windows over it are fine.
    SendWr::bind_mw(1, &mw, rkey, &local, at, len, AccessFlags::REMOTE_READ).unwrap();
    // Outside the region, or a region without MW_BIND: refused.
    let e = SendWr::bind_mw(
        1,
        &mw,
        rkey,
        &local,
        at + 4096,
        8192,
        AccessFlags::REMOTE_READ,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not inside"), "{e}");
    let plain = Mr::new(&p.pd, 8192, AccessFlags::LOCAL_WRITE).unwrap();
    let e = SendWr::bind_mw(
        1,
        &mw,
        rkey,
        &plain,
        plain.addr(),
        64,
        AccessFlags::REMOTE_READ,
    )
    .unwrap_err();
    assert!(e.to_string().contains("MW_BIND"), "{e}");
    // A region registered remotely writable (copies only) may be written through a window.
    let shared = Mr::new(
        &p.pd,
        8192,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND,
    )
    .unwrap();
    assert!(shared.as_slice().is_err());
    SendWr::bind_mw(
        1,
        &mw,
        rkey,
        &shared,
        shared.addr(),
        64,
        AccessFlags::REMOTE_WRITE,
    )
    .unwrap();
}

/// F11: a deregistration the device refuses (here: a window is still bound to the region,
/// IBA 10.6.7.2.6) is reported, and the region comes back still registered, so its owner can
/// leak the memory instead of freeing what the NIC may reach. Once the window is gone it
/// deregisters. (Before: only `drop`, which logged the failure and let owners of caller
/// memory free it anyway.)
#[test]
fn a_refused_deregistration_hands_the_region_back() {
    let p = rc_pair(QpCaps::default(), AccessFlags::LOCAL_WRITE);
    if !p.ctx.attr().has_type2_windows() {
        return;
    }
    let mr = Mr::new(&p.pd, 8192, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).unwrap();
    let mut mw = Mw::alloc_type2(&p.pd).unwrap();
    let rkey = mw.next_rkey();
    let wr = SendWr::bind_mw(1, &mw, rkey, &mr, mr.addr(), 4096, AccessFlags::REMOTE_READ).unwrap();
    // SAFETY: `mr` and `mw` outlive every request naming them.
    unsafe { p.b.post_send(&wr).unwrap() };
    assert_eq!(poll_ok(&p.cq_b).opcode(), WcOpcode::BIND_MW);
    mw.set_rkey(rkey);
    let failed = mr
        .deregister()
        .expect_err("IBA 10.6.7.2.6: a region with a bound window is not deregistered");
    eprintln!("refused as expected: {failed}");
    assert!(failed.to_string().contains("ibv_dereg_mr"), "{failed}");
    let mr = failed.mr;
    assert_eq!(mr.len(), 8192, "the region came back whole");
    drop(mw); // deallocating the window unbinds it
    mr.deregister().unwrap();
}
