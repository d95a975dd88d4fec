//! The control-path verbs that `verbs.h` and `rdma_cma.h` define `static inline`, written in
//! Rust with the headers' bodies (rdma-core 44): a call through the context's operation
//! table, or a call of the exported function the inline wraps. Nothing here needs a C
//! compiler or rdma-core's headers. The data-path ones are in [`crate::data_path`].

use crate::dynamic_fns::{
    _ibv_query_gid_ex, _ibv_query_gid_table, ibv_query_port, ibv_reg_mr, ibv_reg_mr_iova2,
};
use crate::{
    _compat_ibv_port_attr, ibv_context, ibv_cq, ibv_gid_entry, ibv_mr, ibv_mw, ibv_mw_type, ibv_pd,
    ibv_port_attr, rdma_cm_id, sockaddr, verbs_context,
};
use std::os::raw::{c_int, c_uint, c_void};

/// `IBV_ACCESS_OPTIONAL_RANGE` (the kernel's `IB_UVERBS_ACCESS_OPTIONAL_RANGE`, bits 20 to
/// 29: flags a device may ignore; bindgen does not carry the header's macro over).
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = ((1 << 29) << 1) - 1 & !((1 << 20) - 1);

/// `verbs_get_ctx`: the extended context around `ctx`, when the provider has one.
///
/// # Safety
/// `ctx` is a live context.
unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> Option<*mut verbs_context> {
    // SAFETY: the caller's live context.
    if unsafe { (*ctx).abi_compat } != usize::MAX as *mut c_void {
        return None;
    }
    // The header's container_of: `context` is the extended context's last field.
    Some(
        ctx.cast::<u8>()
            .wrapping_sub(std::mem::offset_of!(verbs_context, context))
            .cast(),
    )
}

/// The header's `verbs_get_ctx_op`: entry `$op` of the extended context around `$ctx`, when
/// the provider has one large enough to hold it (`sz` counts from the entry's offset to the
/// end). `$ctx` must be a live context.
macro_rules! verbs_ctx_op {
    ($ctx:expr, $op:ident) => {{
        // SAFETY: the caller's live context.
        let vctx = unsafe { verbs_get_ctx($ctx) };
        vctx.and_then(|v| {
            // SAFETY: an extended context is readable up to its `context` field.
            let (sz, op) = unsafe { ((*v).sz, (*v).$op) };
            let needed =
                std::mem::size_of::<verbs_context>() - std::mem::offset_of!(verbs_context, $op);
            (sz >= needed).then_some(op).flatten()
        })
    }};
}

/// Sets this thread's errno (what the header's bodies do before returning a failure).
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// `___ibv_query_port` (what `ibv_query_port` means in C): the provider's extended query
/// when it has one, else the exported compat call over a zeroed attribute.
///
/// # Safety
/// As the C function: `context` is live, `port_attr` writable.
pub unsafe fn ___ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    match verbs_ctx_op!(context, query_port) {
        // SAFETY: the provider's entry, with the caller's arguments and the struct's size.
        Some(f) => unsafe {
            f(
                context,
                port_num,
                port_attr,
                std::mem::size_of::<ibv_port_attr>(),
            )
        },
        None => {
            // SAFETY: `port_attr` is writable; the compat struct is its prefix.
            unsafe {
                port_attr.write_bytes(0, 1);
                ibv_query_port(context, port_num, port_attr.cast::<_compat_ibv_port_attr>())
            }
        }
    }
}

/// `ibv_query_gid_ex`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        _ibv_query_gid_ex(
            context,
            port_num,
            gid_index,
            entry,
            flags,
            std::mem::size_of::<ibv_gid_entry>(),
        )
    }
}

/// `ibv_query_gid_table`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
) -> isize {
    // SAFETY: the caller's contract.
    unsafe {
        _ibv_query_gid_table(
            context,
            entries,
            max_entries,
            flags,
            std::mem::size_of::<ibv_gid_entry>(),
        )
    }
}

/// `__ibv_reg_mr` (what the `ibv_reg_mr` macro calls): the old entry when the flags are
/// known at compile time and need no optional range, else `ibv_reg_mr_iova2` with the
/// address as the IOVA.
///
/// # Safety
/// As the C function.
pub unsafe fn __ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_uint,
    is_access_const: c_int,
) -> *mut ibv_mr {
    if is_access_const != 0 && access & IBV_ACCESS_OPTIONAL_RANGE == 0 {
        // SAFETY: the caller's contract.
        unsafe { ibv_reg_mr(pd, addr, length, access as c_int) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access) }
    }
}

/// `ibv_alloc_mw`: null with errno EOPNOTSUPP for a provider without memory windows.
///
/// # Safety
/// As the C function: `pd` is live.
pub unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    // SAFETY: the caller's live PD, so its context and op table are readable.
    match unsafe { (*(*pd).context).ops.alloc_mw } {
        // SAFETY: the provider's entry with the caller's arguments.
        Some(f) => unsafe { f(pd, type_) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_dealloc_mw` (EOPNOTSUPP where the header would call a null entry).
///
/// # Safety
/// As the C function: `mw` is live.
pub unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: as in `ibv_alloc_mw`.
    match unsafe { (*(*mw).context).ops.dealloc_mw } {
        // SAFETY: as in `ibv_alloc_mw`.
        Some(f) => unsafe { f(mw) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_inc_rkey`: the key with its low 8 bits (the tag) incremented.
pub fn ibv_inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// `ibv_req_notify_cq` (EOPNOTSUPP where the header would call a null entry).
///
/// # Safety
/// As the C function: `cq` is live.
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: as in `ibv_alloc_mw`.
    match unsafe { (*(*cq).context).ops.req_notify_cq } {
        // SAFETY: as in `ibv_alloc_mw`.
        Some(f) => unsafe { f(cq, solicited_only) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_create_qp_ex`: the provider's extended create (`verbs_get_ctx_op`), or plain
/// `ibv_create_qp` when only a PD is asked for; null with errno EOPNOTSUPP where the
/// provider has none.
///
/// # Safety
/// As the C function: `context` is live, `attr` valid and writable.
pub unsafe fn ibv_create_qp_ex(
    context: *mut ibv_context,
    attr: *mut crate::ibv_qp_init_attr_ex,
) -> *mut crate::ibv_qp {
    // SAFETY: the caller's valid attribute.
    let mask = unsafe { (*attr).comp_mask };
    if mask == crate::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 {
        // SAFETY: the extended attribute starts with the plain one (the header's cast).
        return unsafe { crate::ibv_create_qp((*attr).pd, attr.cast()) };
    }
    match verbs_ctx_op!(context, create_qp_ex) {
        // SAFETY: the provider's entry with the caller's arguments.
        Some(f) => unsafe { f(context, attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// Defines `ibv_wr_*` as a call of the `ibv_qp_ex` entry of the same name (the header's
/// body); an entry the provider left null does nothing (the header would call null): the
/// safe layer checks the entries it needs when it makes the QP.
macro_rules! wr_ops {
    ($($(#[$m:meta])* fn $name:ident => $field:ident($($arg:ident: $ty:ty),*);)*) => {$(
        $(#[$m])*
        ///
        /// # Safety
        /// As the C function: `qp` is a live extended QP between `ibv_wr_start` and
        /// `ibv_wr_complete`/`ibv_wr_abort`.
        #[inline]
        pub unsafe fn $name(qp: *mut crate::ibv_qp_ex, $($arg: $ty),*) {
            // SAFETY: the caller's live extended QP.
            if let Some(f) = unsafe { (*qp).$field } {
                // SAFETY: the provider's entry with the caller's arguments.
                unsafe { f(qp, $($arg),*) }
            }
        }
    )*};
}

wr_ops! {
    /// `ibv_wr_start`: opens a batch.
    fn ibv_wr_start => wr_start();
    /// `ibv_wr_abort`: drops the batch's requests.
    fn ibv_wr_abort => wr_abort();
    /// `ibv_wr_send`.
    fn ibv_wr_send => wr_send();
    /// `ibv_wr_send_imm`.
    fn ibv_wr_send_imm => wr_send_imm(imm_data: crate::__be32);
    /// `ibv_wr_rdma_write`.
    fn ibv_wr_rdma_write => wr_rdma_write(rkey: u32, remote_addr: u64);
    /// `ibv_wr_rdma_write_imm`.
    fn ibv_wr_rdma_write_imm => wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm_data: crate::__be32);
    /// `ibv_wr_rdma_read`.
    fn ibv_wr_rdma_read => wr_rdma_read(rkey: u32, remote_addr: u64);
    /// `ibv_wr_atomic_cmp_swp`.
    fn ibv_wr_atomic_cmp_swp => wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64);
    /// `ibv_wr_atomic_fetch_add`.
    fn ibv_wr_atomic_fetch_add => wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64);
    /// `ibv_wr_set_ud_addr`.
    fn ibv_wr_set_ud_addr => wr_set_ud_addr(ah: *mut crate::ibv_ah, remote_qpn: u32, remote_qkey: u32);
    /// `ibv_wr_set_sge_list`.
    fn ibv_wr_set_sge_list => wr_set_sge_list(num_sge: usize, sg_list: *const crate::ibv_sge);
    /// `ibv_wr_set_inline_data_list`.
    fn ibv_wr_set_inline_data_list => wr_set_inline_data_list(num_buf: usize, buf_list: *const crate::ibv_data_buf);
}

/// `ibv_wr_complete`: posts the batch (0), or drops it and returns an errno value; EOPNOTSUPP
/// where the provider has no entry.
///
/// # Safety
/// As the C function: `qp` is a live extended QP after `ibv_wr_start`.
#[inline]
pub unsafe fn ibv_wr_complete(qp: *mut crate::ibv_qp_ex) -> c_int {
    // SAFETY: the caller's live extended QP.
    match unsafe { (*qp).wr_complete } {
        // SAFETY: the provider's entry.
        Some(f) => unsafe { f(qp) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_create_cq_ex`: the provider's extended create (`verbs_get_ctx_op`); null with errno
/// EOPNOTSUPP where it has none, EINVAL for an unknown `comp_mask` bit.
///
/// # Safety
/// As the C function: `context` is live, `attr` valid.
pub unsafe fn ibv_create_cq_ex(
    context: *mut ibv_context,
    attr: *mut crate::ibv_cq_init_attr_ex,
) -> *mut crate::ibv_cq_ex {
    // SAFETY: the caller's valid attribute.
    if unsafe { (*attr).comp_mask }
        & !(crate::IBV_CQ_INIT_ATTR_MASK_FLAGS | crate::IBV_CQ_INIT_ATTR_MASK_PD)
        != 0
    {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    match verbs_ctx_op!(context, create_cq_ex) {
        // SAFETY: the provider's entry with the caller's arguments.
        Some(f) => unsafe { f(context, attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_cq_ex_to_cq`: the extended CQ as a plain one (it starts with the same fields).
pub fn ibv_cq_ex_to_cq(cq: *mut crate::ibv_cq_ex) -> *mut crate::ibv_cq {
    cq.cast()
}

/// Defines the extended CQ's poll calls: the `ibv_cq_ex` entry of the same name (the
/// header's body), or `$missing` where the provider left it null.
macro_rules! cq_ops {
    ($($(#[$m:meta])* fn $name:ident => $field:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $missing:expr;)*) => {$(
        $(#[$m])*
        ///
        /// # Safety
        /// As the C function: `cq` is a live extended CQ (the `read_*` calls between a
        /// successful `ibv_start_poll` and `ibv_end_poll`).
        #[inline]
        pub unsafe fn $name(cq: *mut crate::ibv_cq_ex, $($arg: $ty),*) -> $ret {
            // SAFETY: the caller's live extended CQ.
            match unsafe { (*cq).$field } {
                // SAFETY: the provider's entry with the caller's arguments.
                Some(f) => unsafe { f(cq, $($arg),*) },
                None => $missing,
            }
        }
    )*};
}

cq_ops! {
    /// `ibv_start_poll`: 0 with the first completion current, ENOENT when there is none.
    fn ibv_start_poll => start_poll(attr: *mut crate::ibv_poll_cq_attr) -> c_int = libc::EOPNOTSUPP;
    /// `ibv_next_poll`: 0 with the next completion current, ENOENT at the end.
    fn ibv_next_poll => next_poll() -> c_int = libc::ENOENT;
    /// `ibv_end_poll`.
    fn ibv_end_poll => end_poll() -> () = ();
    /// `ibv_wc_read_opcode`.
    fn ibv_wc_read_opcode => read_opcode() -> crate::ibv_wc_opcode = crate::ibv_wc_opcode(0);
    /// `ibv_wc_read_vendor_err`.
    fn ibv_wc_read_vendor_err => read_vendor_err() -> u32 = 0;
    /// `ibv_wc_read_byte_len`.
    fn ibv_wc_read_byte_len => read_byte_len() -> u32 = 0;
    /// `ibv_wc_read_imm_data`.
    fn ibv_wc_read_imm_data => read_imm_data() -> crate::__be32 = 0;
    /// `ibv_wc_read_qp_num`.
    fn ibv_wc_read_qp_num => read_qp_num() -> u32 = 0;
    /// `ibv_wc_read_src_qp`.
    fn ibv_wc_read_src_qp => read_src_qp() -> u32 = 0;
    /// `ibv_wc_read_wc_flags`.
    fn ibv_wc_read_wc_flags => read_wc_flags() -> std::os::raw::c_uint = 0;
    /// `ibv_wc_read_completion_ts`.
    fn ibv_wc_read_completion_ts => read_completion_ts() -> u64 = 0;
}

/// `rdma_get_local_addr`: the id's source address.
///
/// # Safety
/// `id` is a live id.
pub unsafe fn rdma_get_local_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: the caller's live id; the union's members all start at its address.
    unsafe { std::ptr::addr_of_mut!((*id).route.addr.__bindgen_anon_1).cast() }
}

/// `rdma_get_peer_addr`: the id's destination address.
///
/// # Safety
/// `id` is a live id.
pub unsafe fn rdma_get_peer_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    // SAFETY: as in `rdma_get_local_addr`.
    unsafe { std::ptr::addr_of_mut!((*id).route.addr.__bindgen_anon_2).cast() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_wraps_the_tag_only() {
        assert_eq!(ibv_inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(ibv_inc_rkey(0x1234_5601), 0x1234_5602);
        assert_eq!(ibv_inc_rkey(u32::MAX), 0xffff_ff00);
    }
}
