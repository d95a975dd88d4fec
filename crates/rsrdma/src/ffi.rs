//! The C API rsrdma calls: rsrdma-sys's bindings, with the control-path verbs that can meet
//! an object of the software device `soft0` routed to it. The software device's
//! objects are C structs of the same layout (an `ibv_context` whose `device` is the soft
//! device, and objects pointing at such a context), so the data path, which calls through
//! the context's operation table (`data_path`), reaches it with no branch at all; a
//! control-path call looks once at the object's context. Everything else passes through.

pub use rsrdma_sys::*;

use crate::soft;
use std::os::raw::{c_char, c_int, c_uint, c_void};

/// `ibv_get_device_name`, or the soft device's.
///
/// # Safety
/// As the C function: `device` comes from a live device list (or is the soft device).
pub unsafe fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    if soft::is_device(device) {
        return soft::DEVICE_NAME.as_ptr();
    }
    // SAFETY: the caller's contract.
    unsafe { rsrdma_sys::ibv_get_device_name(device) }
}

/// `ibv_get_device_guid`, or the soft device's.
///
/// # Safety
/// As [`ibv_get_device_name`].
pub unsafe fn ibv_get_device_guid(device: *mut ibv_device) -> __be64 {
    if soft::is_device(device) {
        return soft::DEVICE_GUID.to_be();
    }
    // SAFETY: the caller's contract.
    unsafe { rsrdma_sys::ibv_get_device_guid(device) }
}

/// `ibv_open_device`, or the soft device's.
///
/// # Safety
/// As [`ibv_get_device_name`].
pub unsafe fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    if soft::is_device(device) {
        return soft::verbs::open_device();
    }
    // SAFETY: the caller's contract.
    unsafe { rsrdma_sys::ibv_open_device(device) }
}

/// Routes `$call` to the soft device when `$ctx` (an `ibv_context` pointer, valid by the
/// caller's contract) is one of its contexts, else to libibverbs.
macro_rules! route {
    ($ctx:expr, safe $soft:expr, $c:expr) => {
        // SAFETY: the caller vouches for the object, so its context pointer is readable.
        if unsafe { soft::is_context($ctx) } {
            $soft
        } else {
            // SAFETY: the caller's contract, unchanged.
            unsafe { $c }
        }
    };
    ($ctx:expr, $soft:expr, $c:expr) => {
        // SAFETY: the caller vouches for the object, so its context pointer is readable.
        if unsafe { soft::is_context($ctx) } {
            // SAFETY: a soft object, handed to the soft device's implementation of the verb,
            // with the arguments the caller vouches for.
            unsafe { $soft }
        } else {
            // SAFETY: the caller's contract, unchanged.
            unsafe { $c }
        }
    };
}

/// `ibv_close_device`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_close_device(context: *mut ibv_context) -> c_int {
    route!(
        context,
        soft::verbs::close_device(context),
        rsrdma_sys::ibv_close_device(context)
    )
}

/// `ibv_query_device`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    route!(
        context,
        soft::verbs::query_device(attr),
        rsrdma_sys::ibv_query_device(context, attr)
    )
}

/// `ibv_query_port` (the inline that fills the extended fields).
///
/// # Safety
/// As the C function.
pub unsafe fn ___ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    route!(
        context,
        soft::verbs::query_port(port_num, port_attr),
        rsrdma_sys::___ibv_query_port(context, port_num, port_attr)
    )
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
    route!(
        context,
        soft::verbs::query_gid(port_num, gid_index, entry),
        rsrdma_sys::ibv_query_gid_ex(context, port_num, gid_index, entry, flags)
    )
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
    route!(
        context,
        soft::verbs::query_gid_table(entries, max_entries),
        rsrdma_sys::ibv_query_gid_table(context, entries, max_entries, flags)
    )
}

/// `ibv_alloc_pd`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    route!(
        context,
        soft::verbs::alloc_pd(context),
        rsrdma_sys::ibv_alloc_pd(context)
    )
}

/// `ibv_dealloc_pd`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    route!(
        (*pd).context,
        soft::verbs::dealloc_pd(pd),
        rsrdma_sys::ibv_dealloc_pd(pd)
    )
}

/// `ibv_reg_mr`.
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
    route!(
        (*pd).context,
        soft::verbs::reg_mr(pd, addr, length, access),
        rsrdma_sys::__ibv_reg_mr(pd, addr, length, access, is_access_const)
    )
}

/// `ibv_reg_dmabuf_mr`: the soft device has no DMA-BUF import (EOPNOTSUPP).
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    route!(
        (*pd).context,
        safe soft::verbs::unsupported_ptr(),
        rsrdma_sys::ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)
    )
}

/// `ibv_dereg_mr`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    route!(
        (*mr).context,
        soft::verbs::dereg_mr(mr),
        rsrdma_sys::ibv_dereg_mr(mr)
    )
}

/// `ibv_create_cq`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    route!(
        context,
        soft::verbs::create_cq(context, cqe, cq_context, channel),
        rsrdma_sys::ibv_create_cq(context, cqe, cq_context, channel, comp_vector)
    )
}

/// `ibv_destroy_cq`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    route!(
        (*cq).context,
        soft::verbs::destroy_cq(cq),
        rsrdma_sys::ibv_destroy_cq(cq)
    )
}

/// `ibv_create_comp_channel`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    route!(
        context,
        soft::verbs::create_comp_channel(context),
        rsrdma_sys::ibv_create_comp_channel(context)
    )
}

/// `ibv_destroy_comp_channel`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    route!(
        (*channel).context,
        soft::verbs::destroy_comp_channel(channel),
        rsrdma_sys::ibv_destroy_comp_channel(channel)
    )
}

/// `ibv_get_cq_event`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    route!(
        (*channel).context,
        soft::verbs::get_cq_event(channel, cq, cq_context),
        rsrdma_sys::ibv_get_cq_event(channel, cq, cq_context)
    )
}

/// `ibv_ack_cq_events`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    route!(
        (*cq).context,
        safe soft::verbs::ack_cq_events(),
        rsrdma_sys::ibv_ack_cq_events(cq, nevents)
    )
}

/// `ibv_req_notify_cq`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    route!(
        (*cq).context,
        soft::verbs::req_notify_cq(cq, solicited_only != 0),
        rsrdma_sys::ibv_req_notify_cq(cq, solicited_only)
    )
}

/// `ibv_create_qp`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    route!(
        (*pd).context,
        soft::verbs::create_qp(pd, attr),
        rsrdma_sys::ibv_create_qp(pd, attr)
    )
}

/// `ibv_create_qp_ex`: the soft device has no extended QPs (EOPNOTSUPP).
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    route!(
        context,
        safe soft::verbs::unsupported_ptr(),
        rsrdma_sys::ibv_create_qp_ex(context, attr)
    )
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    route!(
        (*qp).context,
        soft::verbs::destroy_qp(qp),
        rsrdma_sys::ibv_destroy_qp(qp)
    )
}

/// `ibv_modify_qp`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    route!(
        (*qp).context,
        soft::verbs::modify_qp(qp, attr, mask),
        rsrdma_sys::ibv_modify_qp(qp, attr, mask)
    )
}

/// `ibv_query_qp`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    route!(
        (*qp).context,
        soft::verbs::query_qp(qp, attr, init_attr),
        rsrdma_sys::ibv_query_qp(qp, attr, mask, init_attr)
    )
}

/// `ibv_create_srq`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    route!(
        (*pd).context,
        soft::verbs::create_srq(pd, attr),
        rsrdma_sys::ibv_create_srq(pd, attr)
    )
}

/// `ibv_destroy_srq`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    route!(
        (*srq).context,
        soft::verbs::destroy_srq(srq),
        rsrdma_sys::ibv_destroy_srq(srq)
    )
}

/// `ibv_modify_srq`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    route!(
        (*srq).context,
        soft::verbs::modify_srq(srq, attr, mask),
        rsrdma_sys::ibv_modify_srq(srq, attr, mask)
    )
}

/// `ibv_get_async_event`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    route!(
        context,
        soft::verbs::get_async_event(context, event),
        rsrdma_sys::ibv_get_async_event(context, event)
    )
}

/// `ibv_ack_async_event`. The soft device raises events of QPs, SRQs and CQs only, so the
/// object says whose event it is.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_ack_async_event(event: *mut ibv_async_event) {
    // SAFETY: the caller passes an event `ibv_get_async_event` returned, not yet
    // acknowledged: the union member its type names points at a live object.
    let soft_event = unsafe { soft::is_soft_event(event) };
    if soft_event {
        // SAFETY: as above.
        unsafe { soft::verbs::ack_async_event(event) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rsrdma_sys::ibv_ack_async_event(event) }
    }
}

/// `ibv_create_ah`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    route!(
        (*pd).context,
        soft::ah::create_ah(pd, attr),
        rsrdma_sys::ibv_create_ah(pd, attr)
    )
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    route!(
        (*ah).context,
        soft::ah::destroy_ah(ah),
        rsrdma_sys::ibv_destroy_ah(ah)
    )
}

/// `ibv_create_ah_from_wc` (the soft device reads its own GRH; libibverbs' would query a
/// context it does not know).
///
/// # Safety
/// As the C function.
pub unsafe fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    route!(
        (*pd).context,
        soft::ah::create_ah_from_wc(pd, wc, grh, port_num),
        rsrdma_sys::ibv_create_ah_from_wc(pd, wc, grh, port_num)
    )
}

/// Routes an rdma_cm call on `$id` (an `rdma_cm_id` pointer) to the soft CM when the id is
/// one of its ids, else to librdmacm.
macro_rules! route_cm {
    ($id:expr, $soft:expr, $c:expr) => {
        if soft::cm::is_id($id) {
            // SAFETY: a soft id, handed to the soft CM's implementation of the call, with the
            // arguments the caller vouches for.
            unsafe { $soft }
        } else {
            // SAFETY: the caller's contract, unchanged.
            unsafe { $c }
        }
    };
}

/// `rdma_create_event_channel`: librdmacm's, or the soft CM's when it is forced
/// (`RSRDMA_SOFT_CM=1`) or when librdmacm has no RDMA stack and the soft device is asked for
/// (`RSRDMA_SOFT_DEVICE=1`; see `soft::cm`).
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_create_event_channel() -> *mut rdma_event_channel {
    if soft::cm::forced() {
        return soft::cm::create_event_channel();
    }
    // SAFETY: no preconditions.
    let ch = unsafe { rsrdma_sys::rdma_create_event_channel() };
    if ch.is_null() {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if soft::cm::takes_over(errno) {
            return soft::cm::create_event_channel();
        }
        // SAFETY: restoring errno for the caller.
        unsafe { *libc::__errno_location() = errno };
    }
    ch
}

/// `rdma_destroy_event_channel`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    if soft::cm::is_channel(channel) {
        // SAFETY: a soft channel (the caller's contract covers the rest).
        unsafe { soft::cm::destroy_event_channel(channel) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rsrdma_sys::rdma_destroy_event_channel(channel) }
    }
}

/// `rdma_create_id`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    if soft::cm::is_channel(channel) {
        // SAFETY: a soft channel (the caller's contract covers the rest).
        unsafe { soft::cm::create_id(channel, id, context, ps) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rsrdma_sys::rdma_create_id(channel, id, context, ps) }
    }
}

/// `rdma_destroy_id`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    route_cm!(
        id,
        soft::cm::destroy_id(id),
        rsrdma_sys::rdma_destroy_id(id)
    )
}

/// `rdma_migrate_id`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    route_cm!(
        id,
        soft::cm::migrate_id(id, channel),
        rsrdma_sys::rdma_migrate_id(id, channel)
    )
}

/// `rdma_bind_addr`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    route_cm!(
        id,
        soft::cm::bind_addr(id, addr),
        rsrdma_sys::rdma_bind_addr(id, addr)
    )
}

/// `rdma_listen`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    route_cm!(
        id,
        soft::cm::listen(id, backlog),
        rsrdma_sys::rdma_listen(id, backlog)
    )
}

/// `rdma_resolve_addr`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    route_cm!(
        id,
        soft::cm::resolve_addr(id, src, dst, timeout_ms),
        rsrdma_sys::rdma_resolve_addr(id, src, dst, timeout_ms)
    )
}

/// `rdma_resolve_route`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    route_cm!(
        id,
        soft::cm::resolve_route(id, timeout_ms),
        rsrdma_sys::rdma_resolve_route(id, timeout_ms)
    )
}

/// `rdma_create_qp`. A soft PD goes with a soft id only.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if soft::cm::is_id(id) {
        // SAFETY: a soft id; a PD of another device is refused by the soft CM (it checks
        // the PD is the soft device's below).
        if pd.is_null() || !unsafe { soft::is_context((*pd).context) } {
            // SAFETY: setting errno is always sound.
            unsafe { *libc::__errno_location() = libc::EINVAL };
            return -1;
        }
        // SAFETY: a soft id and a soft PD; the caller vouches for `attr`.
        return unsafe { soft::cm::create_qp(id, pd, attr) };
    }
    // SAFETY: a null `pd` means the id's own; otherwise the caller vouches for it.
    if !pd.is_null() && unsafe { soft::is_context((*pd).context) } {
        // SAFETY: setting errno is always sound.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return -1;
    }
    // SAFETY: the caller's contract.
    unsafe { rsrdma_sys::rdma_create_qp(id, pd, attr) }
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    route_cm!(
        id,
        soft::cm::destroy_qp(id),
        rsrdma_sys::rdma_destroy_qp(id)
    )
}

/// `rdma_connect`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    route_cm!(
        id,
        soft::cm::connect(id, param),
        rsrdma_sys::rdma_connect(id, param)
    )
}

/// `rdma_accept`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    route_cm!(
        id,
        soft::cm::accept(id, param),
        rsrdma_sys::rdma_accept(id, param)
    )
}

/// `rdma_establish`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    route_cm!(id, soft::cm::establish(id), rsrdma_sys::rdma_establish(id))
}

/// Whether `rdma_establish` can complete a connect made with no QP on `id`: always on a soft
/// id; with librdmacm, from rdma-core 23 (before, its connect response brings up the QP the
/// id does not have, and fails).
pub fn establish_supported(id: *mut rdma_cm_id) -> bool {
    soft::cm::is_id(id) || rsrdma_sys::dynamic::rdmacm_exports(c"rdma_establish")
}

/// `rdma_init_qp_attr`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    route_cm!(
        id,
        soft::cm::init_qp_attr(id, attr, mask),
        rsrdma_sys::rdma_init_qp_attr(id, attr, mask)
    )
}

/// `rdma_reject`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    route_cm!(
        id,
        soft::cm::reject(id, data, len),
        rsrdma_sys::rdma_reject(id, data, len)
    )
}

/// `rdma_disconnect`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    route_cm!(
        id,
        soft::cm::disconnect(id),
        rsrdma_sys::rdma_disconnect(id)
    )
}

/// `rdma_get_cm_event`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if soft::cm::is_channel(channel) {
        // SAFETY: a soft channel (the caller's contract covers the rest).
        unsafe { soft::cm::get_cm_event(channel, event) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rsrdma_sys::rdma_get_cm_event(channel, event) }
    }
}

/// `rdma_ack_cm_event`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if soft::cm::is_event(event) {
        // SAFETY: a soft event (the caller's contract covers the rest).
        unsafe { soft::cm::ack_cm_event(event) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { rsrdma_sys::rdma_ack_cm_event(event) }
    }
}

/// `rdma_get_local_addr`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_get_local_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    route_cm!(
        id,
        soft::cm::addr(id, false),
        rsrdma_sys::rdma_get_local_addr(id)
    )
}

/// `rdma_get_peer_addr`.
///
/// # Safety
/// As the C function.
pub unsafe fn rdma_get_peer_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    route_cm!(
        id,
        soft::cm::addr(id, true),
        rsrdma_sys::rdma_get_peer_addr(id)
    )
}
