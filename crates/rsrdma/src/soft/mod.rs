//! `soft0`: the software RDMA device, in this process. Its objects are C structs with the
//! layout libibverbs gives them (an `ibv_context` whose `device` is [`device_ptr`], and
//! objects that point at such a context), made and used by the verbs in [`verbs`]; the
//! control-path calls reach them through [`crate::ffi`], the data path through the context's
//! operation table. Its semantics are `rsrdma-soft`'s queue pairs, fed by one device state
//! under one lock:
//!
//! - a post runs the queue pair's core and then *pumps*: every packet any soft QP has to send
//!   is handed to its destination QP (in this process), until none is left, and the
//!   completions go to the QPs' CQs, which wake their completion channels when armed;
//! - a timer thread does the same when an RNR retry is due, and a thread per peer device
//!   when its packets arrive;
//! - a packet for a QP that no longer exists breaks its sender's link (`RETRY_EXC_ERR`), as a
//!   peer that died would.
//!
//! A QP whose peer lives in another process (its LID names another soft device's port) gets
//! its packets there over a link between the two devices ([`link`]): a pair of shared-memory
//! rings when the peer is on this host ([`shm_link`], [`ring`]; the application's polls read
//! them), a TCP connection otherwise.
//!
//! Queue pairs are connected (RC or UC) or unreliable-datagram ([`qp_core`]); a UD send goes
//! where its address handle ([`ah`]) says, by LID or by GID.
//!
//! A peer device of this host that runs as the same user does one-sided requests in this
//! process's regions itself: `Mr::new` puts a region with a remote right in shared memory
//! ([`shared_mem`]) and the device publishes it, with its queue pairs, in a directory
//! ([`directory`]).
//!
//! Its connection manager ([`cm`]) plays librdmacm for soft ids.
//!
//! Type-2 memory windows are allocated and deallocated through the context's `alloc_mw` and
//! `dealloc_mw` (as libibverbs' inline `ibv_alloc_mw` calls them), bound and invalidated by
//! work requests; their rules are `rsrdma_soft::MrTable`'s.
//!
//! Peers on other hosts: with `RSRDMA_SOFT_ADDR` the device listens on that address of its
//! host and names itself by it (its GID); see `link`.
//!
//! What it does not do yet (and says so with `EOPNOTSUPP`): type-1 memory windows.

pub(crate) mod ah;
pub(crate) mod cm;
mod directory;
mod fast_hash;
pub mod faults;
mod link;
mod memfd;
mod qp_core;
mod recycle;
mod ring;
mod shared_mem;
mod shm_link;
pub(crate) mod verbs;

use crate::ffi;
pub(crate) use shared_mem::SharedAlloc;
use std::ffi::CStr;

/// Whether soft0 shares memory with the processes of its host (its shared-memory links are
/// on: unless `RSRDMA_SOFT_SHM=0`).
pub(crate) fn shares_memory() -> bool {
    shm_link::enabled()
}

/// The soft device's name.
pub(crate) const DEVICE_NAME: &CStr = c"soft0";
/// Its node GUID.
pub(crate) const DEVICE_GUID: u64 = 0x50f7_0000_0000_0001;

/// The soft device's `ibv_device`: plain data, made once, never freed.
struct DeviceCell(std::cell::UnsafeCell<ffi::ibv_device>);

// SAFETY: the struct is never written after it is made; only its address is used.
unsafe impl Sync for DeviceCell {}

static DEVICE: std::sync::OnceLock<Box<DeviceCell>> = std::sync::OnceLock::new();

/// The soft device's `ibv_device`, as a device list names it.
pub(crate) fn device_ptr() -> *mut ffi::ibv_device {
    DEVICE
        .get_or_init(|| {
            // SAFETY: `ibv_device` is plain data for which all-zero is valid (null function
            // pointers, zero enums, empty strings).
            let mut d: ffi::ibv_device = unsafe { std::mem::zeroed() };
            for (i, b) in DEVICE_NAME.to_bytes().iter().enumerate() {
                d.name[i] = *b as std::os::raw::c_char;
                d.dev_name[i] = *b as std::os::raw::c_char;
            }
            Box::new(DeviceCell(std::cell::UnsafeCell::new(d)))
        })
        .0
        .get()
}

/// Whether `device` is the soft device.
pub(crate) fn is_device(device: *mut ffi::ibv_device) -> bool {
    DEVICE
        .get()
        .is_some_and(|d| std::ptr::eq(d.0.get(), device))
}

/// Whether `ctx` is a context of the soft device.
///
/// # Safety
/// `ctx` is null or a live context (of any provider).
pub(crate) unsafe fn is_context(ctx: *mut ffi::ibv_context) -> bool {
    // SAFETY: a live context's `device` field is readable (the caller's contract).
    !ctx.is_null() && is_device(unsafe { (*ctx).device })
}

/// Whether an event from `ibv_get_async_event` came from the soft device (it raises QP, SRQ
/// and CQ events only).
///
/// # Safety
/// `event` is an event `ibv_get_async_event` returned and that was not acknowledged yet.
pub(crate) unsafe fn is_soft_event(event: *mut ffi::ibv_async_event) -> bool {
    // SAFETY: the caller's contract.
    unsafe { event_context(&*event) }.is_some_and(|ctx| {
        // SAFETY: the context of a live object is live.
        unsafe { is_context(ctx) }
    })
}

/// The context of the object an event names (`None` for other events than QP, SRQ and CQ
/// ones).
///
/// # Safety
/// `e` was returned by `ibv_get_async_event` and not acknowledged yet: the union member its
/// type names points at a live object (unacknowledged events keep their objects alive).
pub(crate) unsafe fn event_context(e: &ffi::ibv_async_event) -> Option<*mut ffi::ibv_context> {
    use crate::async_event::{AsyncEventKind, Target};
    // SAFETY: the caller's contract.
    unsafe {
        match AsyncEventKind::from_raw(e.event_type).target() {
            Target::Qp => Some((*e.element.qp).context),
            Target::Srq => Some((*e.element.srq).context),
            Target::Cq => Some((*e.element.cq).context),
            Target::Wq | Target::Port | Target::Device => None,
        }
    }
}

static OPENED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process opened the soft device.
pub(crate) fn opened() -> bool {
    OPENED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Records that the soft device was opened.
pub(crate) fn mark_opened() {
    OPENED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the soft device is listed by [`crate::devices`]: with `RSRDMA_SOFT_DEVICE=1`.
/// [`crate::open`]`("soft0")` opens it either way. Not listed by default: a program that
/// takes the first device should not land on a software device unasked.
pub(crate) fn listed() -> bool {
    std::env::var_os("RSRDMA_SOFT_DEVICE").is_some_and(|v| v == "1")
}
