//! rdma_cm events: the event channel, the copy taken of each event, and [`CmEvent`], the
//! public form of one.
//!
//! Every event is copied and acknowledged as soon as it is taken, so destroying an id never
//! blocks on an unacknowledged event. A CONNECT_REQUEST's new id is owned from that moment:
//! handed to the caller, or else rejected and destroyed, never leaked.

use super::param::Depths;
use super::status;
use super::{CmId, ConnectRequest};
use crate::error::{Error, Result};
use crate::ffi;
use std::fmt;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An rdma_cm event type (`rdma_cm_event_type`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmEventType(pub u32);

macro_rules! cm_events {
    ($($name:ident = $v:expr, $c:literal;)*) => {
        impl CmEventType {
            $(
                #[doc = $c]
                pub const $name: CmEventType = CmEventType($v);
            )*

            /// The C name, or `None` for an unknown value.
            pub fn name(self) -> Option<&'static str> {
                match self.0 { $($v => Some($c),)* _ => None }
            }
        }
    };
}

cm_events! {
    ADDR_RESOLVED = 0, "RDMA_CM_EVENT_ADDR_RESOLVED";
    ADDR_ERROR = 1, "RDMA_CM_EVENT_ADDR_ERROR";
    ROUTE_RESOLVED = 2, "RDMA_CM_EVENT_ROUTE_RESOLVED";
    ROUTE_ERROR = 3, "RDMA_CM_EVENT_ROUTE_ERROR";
    CONNECT_REQUEST = 4, "RDMA_CM_EVENT_CONNECT_REQUEST";
    CONNECT_RESPONSE = 5, "RDMA_CM_EVENT_CONNECT_RESPONSE";
    CONNECT_ERROR = 6, "RDMA_CM_EVENT_CONNECT_ERROR";
    UNREACHABLE = 7, "RDMA_CM_EVENT_UNREACHABLE";
    REJECTED = 8, "RDMA_CM_EVENT_REJECTED";
    ESTABLISHED = 9, "RDMA_CM_EVENT_ESTABLISHED";
    DISCONNECTED = 10, "RDMA_CM_EVENT_DISCONNECTED";
    DEVICE_REMOVAL = 11, "RDMA_CM_EVENT_DEVICE_REMOVAL";
    MULTICAST_JOIN = 12, "RDMA_CM_EVENT_MULTICAST_JOIN";
    MULTICAST_ERROR = 13, "RDMA_CM_EVENT_MULTICAST_ERROR";
    ADDR_CHANGE = 14, "RDMA_CM_EVENT_ADDR_CHANGE";
    TIMEWAIT_EXIT = 15, "RDMA_CM_EVENT_TIMEWAIT_EXIT";
}

impl fmt::Display for CmEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "cm event {}", self.0),
        }
    }
}

impl fmt::Debug for CmEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One rdma_cm event, copied out of librdmacm (and acknowledged there) by
/// [`CmId::next_event`] or [`CmId::try_next_event`].
#[non_exhaustive]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventType,
    /// 0 on success; a negative errno, or for REJECTED the transport's reject reason:
    /// [`CmEvent::status_text`] says which, in words.
    pub status: i32,
    /// The private data that came with a CONNECT_REQUEST, CONNECT_RESPONSE, ESTABLISHED or
    /// REJECTED event (zero-padded to the transport's field size); empty for the others.
    pub private_data: Vec<u8>,
    /// For CONNECT_REQUEST: the new connection, already on an event channel of its own.
    /// Dropping it (or the event) refuses the connection.
    pub request: Option<ConnectRequest>,
}

impl CmEvent {
    /// The status in words (see [`describe_status`](super::describe_status)); `None` for 0.
    pub fn status_text(&self) -> Option<String> {
        status::describe_status(self.kind, self.status)
    }
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("private_data_len", &self.private_data.len())
            .field("request", &self.request)
            .finish()
    }
}

/// An event channel (`rdma_event_channel`), non-blocking.
pub(super) struct Channel {
    pub(super) raw: *mut ffi::rdma_event_channel,
    /// Serialises what touches the id's QP: librdmacm modifies it while processing events
    /// (RTR/RTS on CONNECT_RESPONSE), in connect/accept/disconnect, and `rdma_destroy_qp`
    /// frees it. A `Qp` may be dropped on another thread than the one using the `CmId`.
    pub(super) qp_guard: std::sync::Mutex<()>,
}

// SAFETY: the channel is a kernel fd; librdmacm serialises access to it.
unsafe impl Send for Channel {}
// SAFETY: as above.
unsafe impl Sync for Channel {}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by us; every id on it holds an Arc to this, so none is left.
        unsafe { ffi::rdma_destroy_event_channel(self.raw) }
    }
}

impl Channel {
    pub(super) fn new() -> Result<Arc<Channel>> {
        // SAFETY: no preconditions.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(Error::last_os("rdma_create_event_channel"));
        }
        let ch = Arc::new(Channel {
            raw,
            qp_guard: std::sync::Mutex::new(()),
        });
        // SAFETY: `fd` is the channel's open descriptor; only O_NONBLOCK is added, so waits
        // can honour their timeouts and event loops never block on it.
        let fd = unsafe { (*raw).fd };
        // SAFETY: as above.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::last_os("fcntl"));
        }
        Ok(ch)
    }

    /// Holds off every other use of the id's QP (see `qp_guard`); poisoning is ignored, the
    /// guard protects no data.
    pub(super) fn guard_qp(&self) -> std::sync::MutexGuard<'_, ()> {
        self.qp_guard.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn fd(&self) -> RawFd {
        // SAFETY: live channel; plain field.
        unsafe { (*self.raw).fd }
    }

    /// The next event if one is queued, copied and acknowledged; never blocks.
    pub(super) fn try_take(self: &Arc<Self>) -> Result<Option<RawEvent>> {
        self.try_take_holding(None)
    }

    /// As [`Channel::try_take`]; with `held`, librdmacm reads the event with no QP on that
    /// id, so it leaves the QP alone (a connect response is then handed over as it came,
    /// not acted on: see `CmId::connect_granting`). The id has its QP back before the
    /// guard is released, so nobody else ever sees it without.
    pub(super) fn try_take_holding(
        self: &Arc<Self>,
        held: Option<*mut ffi::rdma_cm_id>,
    ) -> Result<Option<RawEvent>> {
        let mut ev = std::ptr::null_mut();
        let _qp = self.guard_qp();
        // SAFETY: `held` is a live id on this channel (the caller's); its `qp` field is
        // touched only under the guard, and restored below.
        let qp = held.map(|id| unsafe { std::mem::replace(&mut (*id).qp, std::ptr::null_mut()) });
        // SAFETY: live channel; valid out-pointer. The fd is non-blocking, so an empty queue
        // gives EAGAIN instead of a wait.
        let rc = unsafe { ffi::rdma_get_cm_event(self.raw, &mut ev) };
        if let (Some(id), Some(qp)) = (held, qp) {
            // SAFETY: as above.
            unsafe { (*id).qp = qp };
        }
        if rc != 0 {
            let e = Error::last_os("rdma_get_cm_event");
            return match e.errno() {
                Some(libc::EAGAIN) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: `ev` is a valid event until acknowledged just below.
        let event = unsafe { RawEvent::copy_from(&*ev, self) };
        // SAFETY: acknowledged once; nothing keeps a pointer into it.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        tracing::debug!(event = %event.kind, status = event.status, "rdma_cm event");
        Ok(Some(event))
    }

    /// Takes the next event, waiting until `deadline`; `op` and `timeout` name the wait in the
    /// timeout error.
    pub(super) fn take(
        self: &Arc<Self>,
        op: &'static str,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<RawEvent> {
        self.take_holding(op, deadline, timeout, None)
    }

    /// As [`Channel::take`], holding `held`'s QP back as [`Channel::try_take_holding`] does.
    pub(super) fn take_holding(
        self: &Arc<Self>,
        op: &'static str,
        deadline: Instant,
        timeout: Duration,
        held: Option<*mut ffi::rdma_cm_id>,
    ) -> Result<RawEvent> {
        loop {
            if let Some(ev) = self.try_take_holding(held)? {
                return Ok(ev);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    op,
                    millis: timeout.as_millis() as u64,
                });
            }
            self.wait_readable(left)?;
        }
    }

    /// Waits up to `left` for the fd to become readable (an interrupted wait just returns).
    fn wait_readable(&self, left: Duration) -> Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = Error::last_os("poll");
            if e.errno() != Some(libc::EINTR) {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// An event's contents, copied before it was acknowledged.
pub(super) struct RawEvent {
    pub(super) kind: CmEventType,
    pub(super) status: i32,
    pub(super) private_data: Vec<u8>,
    /// For CONNECT_REQUEST: the new id, refused when dropped untaken.
    pub(super) request: Option<PendingRequest>,
}

impl RawEvent {
    /// # Safety
    /// `ev` must be a live, unacknowledged event taken from `channel`.
    unsafe fn copy_from(ev: &ffi::rdma_cm_event, channel: &Arc<Channel>) -> RawEvent {
        let kind = CmEventType(ev.event.0);
        // SAFETY: for connection events the `conn` view is the one filled; for others
        // private_data is null or its length 0, both handled.
        let conn = unsafe { ev.param.conn };
        let carries_conn = matches!(
            kind,
            CmEventType::CONNECT_REQUEST
                | CmEventType::CONNECT_RESPONSE
                | CmEventType::ESTABLISHED
                | CmEventType::REJECTED
        );
        let private_data =
            if carries_conn && !conn.private_data.is_null() && conn.private_data_len > 0 {
                // SAFETY: librdmacm guarantees private_data_len readable bytes while unacked.
                unsafe {
                    std::slice::from_raw_parts(
                        conn.private_data as *const u8,
                        conn.private_data_len as usize,
                    )
                }
                .to_vec()
            } else {
                Vec::new()
            };
        let request = (kind == CmEventType::CONNECT_REQUEST && !ev.id.is_null()).then(|| {
            PendingRequest {
                raw: ev.id,
                _listener_channel: channel.clone(),
                // The kernel reports the request's depths from the acceptor's side:
                // `responder_resources` is what the requester will initiate, and so on.
                requester: Depths {
                    initiator_depth: conn.responder_resources,
                    responder_resources: conn.initiator_depth,
                },
            }
        });
        RawEvent {
            kind,
            status: ev.status,
            private_data,
            request,
        }
    }

    /// The public form: a request's new id moves to a channel of its own.
    ///
    /// # Errors
    /// As [`PendingRequest::migrate`]; the request is refused then.
    pub(super) fn publish(self) -> Result<CmEvent> {
        let request = match self.request {
            Some(pending) => Some(pending.migrate(self.private_data.clone())?),
            None => None,
        };
        Ok(CmEvent {
            kind: self.kind,
            status: self.status,
            private_data: self.private_data,
            request,
        })
    }

    /// The error for a wait that wanted another event (or a success).
    pub(super) fn unexpected(self, op: &'static str, expected: CmEventType) -> Error {
        Error::CmEvent {
            op,
            expected,
            got: self.kind,
            status: self.status,
            private_data: crate::error::PrivateData(self.private_data),
        }
        // A request in `self` is refused here, as it drops.
    }
}

/// A connect request's new id, still on the listener's channel. Unless [`migrate`] hands it
/// over, dropping it rejects the request and destroys the id.
///
/// [`migrate`]: PendingRequest::migrate
pub(super) struct PendingRequest {
    raw: *mut ffi::rdma_cm_id,
    /// The id's channel until migrated: rdma_reject and rdma_destroy_id write to it.
    _listener_channel: Arc<Channel>,
    requester: Depths,
}

impl PendingRequest {
    /// Moves the new id to an event channel of its own, so its events (ESTABLISHED,
    /// DISCONNECTED) never mix with other connections', and hands it over.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `rdma_create_event_channel` or `rdma_migrate_id`; the request
    /// is rejected and its id destroyed.
    fn migrate(mut self, private_data: Vec<u8>) -> Result<ConnectRequest> {
        let channel = Channel::new()?;
        // SAFETY: `raw` is the new id, ours alone; its only event was acknowledged, as
        // rdma_migrate_id requires.
        let rc = unsafe { ffi::rdma_migrate_id(self.raw, channel.raw) };
        if rc != 0 {
            return Err(Error::last_os("rdma_migrate_id"));
        }
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        // SAFETY: `raw` is now on `channel`, and owned by nothing else (ours was cleared).
        let id = unsafe { CmId::from_raw(raw, channel, Some(self.requester)) };
        Ok(ConnectRequest {
            id,
            private_data,
            requester_initiator_depth: self.requester.initiator_depth,
            requester_responder_resources: self.requester.responder_resources,
        })
    }
}

impl Drop for PendingRequest {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        tracing::warn!("refusing a connect request that was not taken");
        // SAFETY: the id is live and ours; its channel lives through `_listener_channel`.
        let rc = unsafe { ffi::rdma_reject(self.raw, std::ptr::null(), 0) };
        if rc != 0 {
            tracing::warn!(errno = ?std::io::Error::last_os_error(), "rdma_reject failed");
        }
        // SAFETY: as above; destroyed once, and its event was acknowledged.
        let rc = unsafe { ffi::rdma_destroy_id(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "rdma_destroy_id failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names() {
        assert_eq!(
            CmEventType::ESTABLISHED.to_string(),
            "RDMA_CM_EVENT_ESTABLISHED"
        );
        assert_eq!(CmEventType(99).to_string(), "cm event 99");
        assert_eq!(
            CmEventType::TIMEWAIT_EXIT.0,
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT.0
        );
    }
}
