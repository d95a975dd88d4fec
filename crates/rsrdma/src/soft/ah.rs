//! The soft device's address handles: where a UD send goes. An AH names a device by its LID
//! and GID (the GID's address names another host; on this host a GID alone names the LID:
//! see `verbs::gid_of_lid`); a UD request's AH, QP number and Q_Key become the core's
//! [`UdDest`].

use super::verbs::{lid_of_gid, own_gid, set_errno, zeroed};
use crate::ffi;
use rsrdma_soft::UdDest;
use std::os::raw::c_int;

#[repr(C)]
struct SoftAh {
    raw: ffi::ibv_ah,
    /// The device the AH leads to: its LID and GID.
    lid: u16,
    gid: [u8; 16],
}

/// `ibv_create_ah`.
///
/// # Safety
/// `pd` is a live soft PD; `attr` is readable.
pub(crate) unsafe fn create_ah(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_ah_attr,
) -> *mut ffi::ibv_ah {
    // SAFETY: the caller's contract.
    let (a, ctx, handle) = unsafe { (&*attr, (*pd).context, (*pd).handle) };
    // The port is RoCE-like (its link layer is Ethernet): an address handle needs a GRH there,
    // as the kernel's `rdma_check_ah_attr` requires of rxe's (an outside tester's handle
    // without one was taken and its datagrams went by LID: a program that works so on soft0
    // fails on rxe). Queue pairs' paths are refused without one already.
    if a.port_num != 1 || a.is_global == 0 || a.grh.sgid_index > 1 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: `raw` is the GID's plain bytes.
    let gid = match unsafe { a.grh.dgid.raw } {
        // A GRH to `::` names no device.
        g if g == [0; 16] => NO_DEVICE_GID,
        g => g,
    };
    let lid = match a.dlid {
        0 => lid_of_gid(&gid),
        dlid => dlid,
    };
    let ah = SoftAh {
        raw: ffi::ibv_ah {
            context: ctx,
            pd,
            handle,
        },
        lid,
        gid,
    };
    Box::into_raw(Box::new(ah)).cast()
}

/// A GID that no soft device has (and the form `names_a_soft_device` refuses): where a
/// GRH to `::` goes.
const NO_DEVICE_GID: [u8; 16] = [0xff; 16];

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` is a live soft AH, not used by a request still to be posted.
pub(crate) unsafe fn destroy_ah(ah: *mut ffi::ibv_ah) -> c_int {
    // SAFETY: made by `create_ah`, freed once (the caller's contract).
    drop(unsafe { Box::from_raw(ah.cast::<SoftAh>()) });
    0
}

/// `ibv_create_ah_from_wc`: an AH back to the sender of a UD receive, from its completion
/// (the sender's LID) and the GRH in front of its payload (the sender's GID), as
/// libibverbs' `ibv_init_ah_from_wc` builds it.
///
/// # Safety
/// `pd` is a live soft PD; `wc` is readable; `grh` is null or 40 readable bytes.
pub(crate) unsafe fn create_ah_from_wc(
    pd: *mut ffi::ibv_pd,
    wc: *mut ffi::ibv_wc,
    grh: *mut ffi::ibv_grh,
    port_num: u8,
) -> *mut ffi::ibv_ah {
    // SAFETY: the caller's contract.
    let wc = unsafe { &*wc };
    let mut a: ffi::ibv_ah_attr = zeroed();
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.port_num = port_num;
    if wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0 {
        if grh.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: 40 readable bytes (the caller's contract).
        let g = unsafe { &*grh.cast::<[u8; 40]>() };
        let Some(sgid) = source_gid(g) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let mut dgid = [0u8; 16];
        dgid.copy_from_slice(&g[24..40]);
        a.is_global = 1;
        a.grh.dgid.raw = sgid;
        a.grh.sgid_index = if dgid == own_gid() { 1 } else { 0 };
        a.grh.hop_limit = 0xff;
    }
    // SAFETY: `pd` is a live soft PD; `a` is a valid attribute struct.
    unsafe { create_ah(pd, &mut a) }
}

/// The sender's GID from a GRH in IPv6 form (the form the soft device writes); an IPv4-form
/// header (RoCE v2 over IPv4) gives its IPv4-mapped source address.
fn source_gid(g: &[u8; 40]) -> Option<[u8; 16]> {
    if g[0] >> 4 == 6 {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&g[8..24]);
        return Some(gid);
    }
    if g[20] == 0x45 {
        let mut gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0];
        gid[12..].copy_from_slice(&g[32..36]);
        return Some(gid);
    }
    None
}

/// Where a UD send request goes. A Q_Key with its high bit set means the sending QP's own
/// (`own_qkey`), as the InfiniBand specification says.
///
/// # Safety
/// `w` is a UD send request whose `ah` is null or a live soft AH.
pub(super) unsafe fn ud_dest(w: &ffi::ibv_send_wr, own_qkey: u32) -> Result<UdDest, c_int> {
    // SAFETY: a UD request's union member is `ud` (the caller's contract).
    let ud = unsafe { w.wr.ud };
    if ud.ah.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live soft AH (the caller's contract), the first field of its `SoftAh`.
    let (lid, gid) = unsafe {
        let ah = &*ud.ah.cast::<SoftAh>();
        (ah.lid, ah.gid)
    };
    let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
        own_qkey
    } else {
        ud.remote_qkey
    };
    Ok(UdDest {
        lid,
        gid,
        qpn: ud.remote_qpn,
        qkey,
    })
}
