//! A device's asynchronous events (`ibv_get_async_event`): what happens to a QP, SRQ, CQ,
//! port or the device outside any work request, such as a QP that reached its last WQE after
//! an error, a fatal QP error, a port going down.
//!
//! An event is copied out and acknowledged at once, as it is read. libibverbs makes
//! `ibv_destroy_qp` (and the CQ and SRQ destroys) wait until every event of the object was
//! acknowledged: an event that a caller could hold would let a drop block for ever in the
//! same thread. The copy names its object by number (a QP's `qp_num`, the kernel handle of a
//! CQ or SRQ), which stays meaningful after the object is gone.
//!
//! The context's event fd is made non-blocking on first use, so reading never blocks;
//! [`Context::wait_async_event`] waits with `poll(2)`. Several threads may read the same
//! context's events: each event goes to exactly one of them.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::ffi;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// What happened (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// A CQ overran or failed.
    CqErr,
    /// A QP hit an error that is not tied to one work request; it is in ERROR.
    QpFatal,
    /// The responder saw an invalid request (a transport error); the QP is in ERROR.
    QpReqErr,
    /// A remote access violation on the responder side; the QP is in ERROR.
    QpAccessErr,
    /// The first packet arrived on a QP in RTR.
    CommEst,
    /// The send queue of a QP in SQD drained.
    SqDrained,
    /// Path migration to the alternate path succeeded.
    PathMig,
    /// Path migration failed.
    PathMigErr,
    /// The device failed: every object on it is unusable.
    DeviceFatal,
    /// A port became active.
    PortActive,
    /// A port went down (or lost its link).
    PortErr,
    /// A port's LID changed.
    LidChange,
    /// A port's P_Key table changed.
    PkeyChange,
    /// The subnet manager changed.
    SmChange,
    /// An SRQ failed: its QPs get errors.
    SrqErr,
    /// An SRQ fell below the limit armed with `ibv_modify_srq`.
    SrqLimitReached,
    /// A QP attached to an SRQ is in ERROR and will take no more receives from it: once its
    /// CQ is empty, every receive it took has completed.
    QpLastWqeReached,
    /// The subnet manager asks clients to register again.
    ClientReregister,
    /// A port's GID table changed.
    GidChange,
    /// A work queue failed.
    WqFatal,
    /// A value this version does not know.
    Other(u32),
}

impl AsyncEventKind {
    pub(crate) fn from_raw(t: ffi::ibv_event_type) -> AsyncEventKind {
        use AsyncEventKind as K;
        match t {
            ffi::ibv_event_type::IBV_EVENT_CQ_ERR => K::CqErr,
            ffi::ibv_event_type::IBV_EVENT_QP_FATAL => K::QpFatal,
            ffi::ibv_event_type::IBV_EVENT_QP_REQ_ERR => K::QpReqErr,
            ffi::ibv_event_type::IBV_EVENT_QP_ACCESS_ERR => K::QpAccessErr,
            ffi::ibv_event_type::IBV_EVENT_COMM_EST => K::CommEst,
            ffi::ibv_event_type::IBV_EVENT_SQ_DRAINED => K::SqDrained,
            ffi::ibv_event_type::IBV_EVENT_PATH_MIG => K::PathMig,
            ffi::ibv_event_type::IBV_EVENT_PATH_MIG_ERR => K::PathMigErr,
            ffi::ibv_event_type::IBV_EVENT_DEVICE_FATAL => K::DeviceFatal,
            ffi::ibv_event_type::IBV_EVENT_PORT_ACTIVE => K::PortActive,
            ffi::ibv_event_type::IBV_EVENT_PORT_ERR => K::PortErr,
            ffi::ibv_event_type::IBV_EVENT_LID_CHANGE => K::LidChange,
            ffi::ibv_event_type::IBV_EVENT_PKEY_CHANGE => K::PkeyChange,
            ffi::ibv_event_type::IBV_EVENT_SM_CHANGE => K::SmChange,
            ffi::ibv_event_type::IBV_EVENT_SRQ_ERR => K::SrqErr,
            ffi::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED => K::SrqLimitReached,
            ffi::ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED => K::QpLastWqeReached,
            ffi::ibv_event_type::IBV_EVENT_CLIENT_REREGISTER => K::ClientReregister,
            ffi::ibv_event_type::IBV_EVENT_GID_CHANGE => K::GidChange,
            ffi::ibv_event_type::IBV_EVENT_WQ_FATAL => K::WqFatal,
            other => K::Other(other.0),
        }
    }

    /// The object kind the event names, from the verbs rules for each event type.
    pub(crate) fn target(self) -> Target {
        use AsyncEventKind as K;
        match self {
            K::CqErr => Target::Cq,
            K::QpFatal
            | K::QpReqErr
            | K::QpAccessErr
            | K::CommEst
            | K::SqDrained
            | K::PathMig
            | K::PathMigErr
            | K::QpLastWqeReached => Target::Qp,
            K::SrqErr | K::SrqLimitReached => Target::Srq,
            K::PortActive
            | K::PortErr
            | K::LidChange
            | K::PkeyChange
            | K::SmChange
            | K::ClientReregister
            | K::GidChange => Target::Port,
            K::WqFatal => Target::Wq,
            K::DeviceFatal | K::Other(_) => Target::Device,
        }
    }
}

/// The kind of object an asynchronous event names.
pub(crate) enum Target {
    Cq,
    Qp,
    Srq,
    Wq,
    Port,
    Device,
}

/// The object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncElement {
    /// A QP, by its number ([`crate::Qp::qp_num`]).
    Qp(u32),
    /// A CQ, by its kernel handle ([`crate::Cq::handle`]).
    Cq(u32),
    /// An SRQ, by its kernel handle ([`crate::Srq::handle`]).
    Srq(u32),
    /// A work queue, by its number.
    Wq(u32),
    /// A port, by its number.
    Port(u8),
    /// The device itself (or an event type this version does not know).
    Device,
}

/// One asynchronous event, already acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// To which object.
    pub element: AsyncElement,
}

impl Context {
    /// The fd that becomes readable when an asynchronous event waits, for an event loop
    /// (`poll`, `epoll`, tokio's `AsyncFd`); read the events with
    /// [`Context::read_async_event`]. Valid while this context is open.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: `raw` is an open context for as long as `self` lives.
        unsafe { (*self.inner.raw).async_fd }
    }

    /// Takes the next asynchronous event of the device, if one waits: never blocks.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `fcntl` or `ibv_get_async_event` (other than "nothing waits").
    pub fn read_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.async_fd_nonblocking()?;
        let mut raw = std::mem::MaybeUninit::<ffi::ibv_async_event>::uninit();
        // SAFETY: `raw` is an open context; the event is written into `raw` on success.
        let rc = unsafe { ffi::ibv_get_async_event(self.inner.raw, raw.as_mut_ptr()) };
        if rc != 0 {
            let e = Error::last_os("ibv_get_async_event");
            return match e.errno() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: a zero return filled the event.
        let mut raw = unsafe { raw.assume_init() };
        let kind = AsyncEventKind::from_raw(raw.event_type);
        // SAFETY: the union member read is the one the event type names (verbs.h documents
        // which); the object it points to stays alive until the event is acknowledged below,
        // since its destroy waits for that.
        let element = unsafe {
            match kind.target() {
                Target::Qp => AsyncElement::Qp((*raw.element.qp).qp_num),
                Target::Cq => AsyncElement::Cq((*raw.element.cq).handle),
                Target::Srq => AsyncElement::Srq((*raw.element.srq).handle),
                Target::Wq => AsyncElement::Wq((*raw.element.wq).wq_num),
                Target::Port => AsyncElement::Port(raw.element.port_num as u8),
                Target::Device => AsyncElement::Device,
            }
        };
        // SAFETY: the event came from `ibv_get_async_event` and is acknowledged once.
        unsafe { ffi::ibv_ack_async_event(&mut raw) };
        Ok(Some(AsyncEvent { kind, element }))
    }

    /// Waits up to `timeout` for the next asynchronous event (`None`: none came).
    ///
    /// # Errors
    /// As [`Context::read_async_event`], and `poll`.
    pub fn wait_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Some(ev) = self.read_async_event()? {
                return Ok(Some(ev));
            }
            let Some(left_ms) = crate::error::poll_timeout_ms(deadline) else {
                return Ok(None);
            };
            let mut fd = libc::pollfd {
                fd: self.async_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut fd, 1, left_ms) } < 0 {
                let e = Error::last_os("poll");
                if e.errno() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }

    /// Makes the event fd non-blocking, once per context.
    fn async_fd_nonblocking(&self) -> Result<()> {
        let done = &self.inner.async_nonblocking;
        if done.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let fd = self.async_fd();
        // SAFETY: `fd` is the context's open event fd; only O_NONBLOCK is added.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::last_os("fcntl"));
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}
