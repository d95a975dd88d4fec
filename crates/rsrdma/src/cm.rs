//! rdma_cm: connection setup by IP address and port, as TCP does it.
//!
//! Every [`CmId`] gets an event channel of its own (an accepted id is migrated off the
//! listener's), so waiting for one id's event never consumes another's. Every wait has a
//! timeout, and every event is copied and acknowledged at once, so destroying an id never
//! blocks on an unacknowledged event.
//!
//! ```no_run
//! # fn f() -> rsrdma::Result<()> {
//! use rsrdma::{cm::{CmId, ConnParam}, Cq, Pd, Qp, QpType};
//! use std::time::Duration;
//! let t = Duration::from_secs(5);
//! let id = CmId::new()?;
//! id.resolve_addr(None, "10.0.0.2:7471".parse().unwrap(), t)?;
//! id.resolve_route(t)?;
//! let ctx = id.context()?;
//! let pd = Pd::new(&ctx)?;
//! let cq = Cq::new(&ctx, 64, None)?;
//! let qp = id.create_qp(&pd, &Qp::builder(QpType::Rc), &cq, &cq)?;
//! let reply = id.connect(&ConnParam::default(), t)?; // the acceptor's private data
//! # let _ = (qp, reply); Ok(()) }
//! ```

use crate::context::Context;
use crate::cq::Cq;
use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::Pd;
use crate::qp::{Qp, QpBuilder, QpType};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Most private data a connect request carries on IB/RoCE (the CM REQ's 92 bytes less
/// rdma_cm's 36-byte header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept carries on IB/RoCE (the CM REP).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;

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

/// Connection parameters of [`CmId::connect`] and [`CmId::accept`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Bytes for the peer (at most [`MAX_CONNECT_PRIVATE_DATA`] / [`MAX_ACCEPT_PRIVATE_DATA`]).
    /// On IB and RoCE the CM carries them in fixed-size fields, so the peer receives them
    /// zero-padded to that size: put a length in the data if the receiver needs it.
    pub private_data: Vec<u8>,
    /// Incoming RDMA reads/atomics served; `None` uses the device's maximum.
    pub responder_resources: Option<u8>,
    /// Outgoing RDMA reads/atomics in flight; `None` uses the device's maximum.
    pub initiator_depth: Option<u8>,
    /// Transport retries, 0..=7.
    pub retry_count: u8,
    /// RNR retries, 0..=7 (7: forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: None,
            initiator_depth: None,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

struct ChannelInner {
    raw: *mut ffi::rdma_event_channel,
}

// SAFETY: the channel is a kernel fd; librdmacm serialises access to it.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: created by us; every id on it holds an Arc to this, so none is left.
        unsafe { ffi::rdma_destroy_event_channel(self.raw) }
    }
}

impl ChannelInner {
    fn new() -> Result<Arc<ChannelInner>> {
        // SAFETY: no preconditions.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(Error::last_os("rdma_create_event_channel"));
        }
        let ch = Arc::new(ChannelInner { raw });
        // SAFETY: `fd` is the channel's open descriptor; only O_NONBLOCK is added, so waits
        // below can honour their timeouts.
        let fd = unsafe { (*raw).fd };
        // SAFETY: as above.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::last_os("fcntl"));
        }
        Ok(ch)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: live channel; plain field.
        unsafe { (*self.raw).fd }
    }

    /// Takes the next event, waiting until `deadline`. The event is copied and acknowledged.
    fn next_event(&self, op: &'static str, deadline: Instant, timeout: Duration) -> Result<Event> {
        loop {
            let mut ev = std::ptr::null_mut();
            // SAFETY: live channel; valid out-pointer.
            let rc = unsafe { ffi::rdma_get_cm_event(self.raw, &mut ev) };
            if rc == 0 {
                // SAFETY: `ev` is a valid event until acknowledged just below.
                let event = unsafe { Event::copy_from(&*ev) };
                // SAFETY: acknowledged once; nothing keeps a pointer into it.
                unsafe { ffi::rdma_ack_cm_event(ev) };
                tracing::debug!(event = %event.kind, status = event.status, "rdma_cm event");
                return Ok(event);
            }
            let e = Error::last_os("rdma_get_cm_event");
            if e.errno() != Some(libc::EAGAIN) {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    op,
                    millis: timeout.as_millis() as u64,
                });
            }
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
        }
    }
}

/// An event's contents, copied before it is acknowledged.
struct Event {
    kind: CmEventType,
    status: i32,
    id: *mut ffi::rdma_cm_id,
    private_data: Vec<u8>,
}

impl Event {
    /// # Safety
    /// `ev` must be a live, unacknowledged event.
    unsafe fn copy_from(ev: &ffi::rdma_cm_event) -> Event {
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
        Event {
            kind,
            status: ev.status,
            id: ev.id,
            private_data,
        }
    }
}

pub(crate) struct CmIdInner {
    pub(crate) raw: *mut ffi::rdma_cm_id,
    channel: Arc<ChannelInner>,
    context: OnceLock<Context>,
}

// SAFETY: librdmacm ids may be used from any thread; calls on one id are serialised by &self
// methods that only read our own immutable fields.
unsafe impl Send for CmIdInner {}
// SAFETY: as above.
unsafe impl Sync for CmIdInner {}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        // SAFETY: created or accepted by us; its QP (if any) holds an Arc to this inner and so
        // was destroyed first; every event was acknowledged when it was taken.
        let rc = unsafe { ffi::rdma_destroy_id(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "rdma_destroy_id failed");
        }
    }
}

/// An rdma_cm identifier (`rdma_cm_id`): one side of a connection, or a listener. Each has an
/// event channel of its own.
pub struct CmId {
    inner: Arc<CmIdInner>,
}

/// A connection request taken off a listener.
pub struct ConnectRequest {
    /// The new id for this connection, on its own event channel. Create its QP with
    /// [`CmId::create_qp`], then [`CmId::accept`] (or [`CmId::reject`]).
    pub id: CmId,
    /// The private data the connecting side sent, zero-padded to the transport's field size
    /// (see [`ConnParam::private_data`]).
    pub private_data: Vec<u8>,
}

impl CmId {
    /// A new id (TCP port space, for RC QPs) on a new event channel.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when there is no RDMA stack; [`Error::Verbs`] naming
    /// `rdma_create_event_channel` or `rdma_create_id`.
    pub fn new() -> Result<CmId> {
        let channel = ChannelInner::new()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live channel; valid out-pointer; no context pointer.
        let rc = unsafe {
            ffi::rdma_create_id(
                channel.raw,
                &mut raw,
                std::ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::last_os("rdma_create_id"));
        }
        Ok(CmId {
            inner: Arc::new(CmIdInner {
                raw,
                channel,
                context: OnceLock::new(),
            }),
        })
    }

    /// Binds to a local address; port 0 picks a free one (see [`CmId::local_addr`]).
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `rdma_bind_addr` (EADDRNOTAVAIL when no RDMA device has it).
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut sa = SockAddr::from(addr);
        // SAFETY: live id; `sa` is a valid sockaddr of the right family.
        let rc = unsafe { ffi::rdma_bind_addr(self.inner.raw, sa.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::last_os("rdma_bind_addr"));
        }
        Ok(())
    }

    /// Starts listening (after [`CmId::bind`]).
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `rdma_listen`.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: live, bound id.
        let rc = unsafe { ffi::rdma_listen(self.inner.raw, backlog) };
        if rc != 0 {
            return Err(Error::last_os("rdma_listen"));
        }
        Ok(())
    }

    /// Binds to `addr` and listens: a listener in one call.
    ///
    /// # Errors
    /// As [`CmId::new`], [`CmId::bind`] and [`CmId::listen`].
    pub fn listener(addr: SocketAddr, backlog: i32) -> Result<CmId> {
        let id = CmId::new()?;
        id.bind(addr)?;
        id.listen(backlog)?;
        Ok(id)
    }

    /// Waits for a connection request on this listener. Other events on the listener are
    /// logged and skipped.
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::Verbs`] naming `rdma_get_cm_event` or `rdma_migrate_id`.
    pub fn get_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev =
                self.inner
                    .channel
                    .next_event("wait for a connect request", deadline, timeout)?;
            if ev.kind != CmEventType::CONNECT_REQUEST {
                tracing::debug!(event = %ev.kind, "listener skipped an event");
                continue;
            }
            // The new id arrived on the listener's channel: give it one of its own, so its
            // events (ESTABLISHED, DISCONNECTED) never mix with other connections'.
            let channel = ChannelInner::new()?;
            // SAFETY: `ev.id` is the new id the request created, now ours; its only event
            // was acknowledged, as rdma_migrate_id requires.
            let rc = unsafe { ffi::rdma_migrate_id(ev.id, channel.raw) };
            let id = CmId {
                inner: Arc::new(CmIdInner {
                    raw: ev.id,
                    channel,
                    context: OnceLock::new(),
                }),
            };
            if rc != 0 {
                return Err(Error::last_os("rdma_migrate_id"));
            }
            return Ok(ConnectRequest {
                id,
                private_data: ev.private_data,
            });
        }
    }

    /// Resolves `dst` (and optionally the local `src`) to an RDMA device and address.
    ///
    /// # Errors
    /// [`Error::CmEvent`] on ADDR_ERROR; [`Error::Timeout`]; [`Error::Verbs`].
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src_sa = src.map(SockAddr::from);
        let mut dst_sa = SockAddr::from(dst);
        let src_ptr = src_sa
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: live id; both sockaddrs are valid for the call.
        let rc =
            unsafe { ffi::rdma_resolve_addr(self.inner.raw, src_ptr, dst_sa.as_mut_ptr(), ms) };
        if rc != 0 {
            return Err(Error::last_os("rdma_resolve_addr"));
        }
        self.expect("rdma_resolve_addr", CmEventType::ADDR_RESOLVED, timeout)
            .map(drop)
    }

    /// Resolves the route to the address resolved before.
    ///
    /// # Errors
    /// [`Error::CmEvent`] on ROUTE_ERROR; [`Error::Timeout`]; [`Error::Verbs`].
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: live id with a resolved address.
        let rc = unsafe { ffi::rdma_resolve_route(self.inner.raw, ms) };
        if rc != 0 {
            return Err(Error::last_os("rdma_resolve_route"));
        }
        self.expect("rdma_resolve_route", CmEventType::ROUTE_RESOLVED, timeout)
            .map(drop)
    }

    /// The device context this id is bound to (after address resolution, or on a request).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before the id has a device.
    pub fn context(&self) -> Result<Context> {
        if let Some(c) = self.inner.context.get() {
            return Ok(c.clone());
        }
        // SAFETY: live id; plain field.
        let verbs = unsafe { (*self.inner.raw).verbs };
        if verbs.is_null() {
            return Err(Error::InvalidArgument(
                "the id has no device yet: resolve an address or take a request first".into(),
            ));
        }
        // SAFETY: librdmacm opened this context and keeps it open for the process's life.
        let ctx = unsafe { Context::from_raw(verbs, false) }?;
        Ok(self.inner.context.get_or_init(|| ctx).clone())
    }

    /// Creates the id's queue pair (RC only): rdma_cm then drives its state transitions during
    /// connect and accept. The QP keeps this id alive.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a non-RC builder; the errors of
    /// [`QpBuilder::validate`]; [`Error::Verbs`] naming `rdma_create_qp`.
    pub fn create_qp(
        &self,
        pd: &Pd,
        builder: &QpBuilder,
        send_cq: &Cq,
        recv_cq: &Cq,
    ) -> Result<Qp> {
        if builder.qp_type() != QpType::Rc {
            return Err(Error::InvalidArgument(
                "rdma_cm ids in the TCP port space carry RC queue pairs".into(),
            ));
        }
        builder.validate(pd)?;
        let mut init = builder.init_attr(send_cq, recv_cq);
        // SAFETY: live id with a device; PD and CQs are live and of that device (the QP keeps
        // them alive); `init` is valid.
        let rc = unsafe {
            ffi::rdma_create_qp(
                self.inner.raw,
                pd.as_raw().unwrap_or(std::ptr::null_mut()),
                &mut init,
            )
        };
        if rc != 0 {
            return Err(Error::last_os("rdma_create_qp"));
        }
        // SAFETY: rdma_create_qp stored the new QP in the id; the Qp takes it over and is
        // destroyed through the id (whose Arc it holds).
        let qp = unsafe {
            let raw = (*self.inner.raw).qp;
            Qp::from_parts(
                raw,
                builder,
                init.cap,
                pd,
                send_cq,
                recv_cq,
                Some(self.inner.clone()),
            )
        };
        qp.check_inline_granted(builder.requested_inline())?;
        Ok(qp)
    }

    fn conn_param(&self, p: &ConnParam, max_private: usize) -> Result<ffi::rdma_conn_param> {
        if p.private_data.len() > max_private {
            return Err(Error::Limit {
                what: "private data bytes",
                requested: p.private_data.len() as u64,
                limit: max_private as u64,
                source_of_limit: "the IB CM message",
            });
        }
        for (what, v) in [
            ("retry_count", p.retry_count),
            ("rnr_retry_count", p.rnr_retry_count),
        ] {
            if v > 7 {
                return Err(Error::Limit {
                    what,
                    requested: v.into(),
                    limit: 7,
                    source_of_limit: "the 3-bit retry field",
                });
            }
        }
        let dev = self.context()?.attr().clone();
        let clamp = |v: u32| v.min(u8::MAX as u32) as u8;
        let responder = p.responder_resources.unwrap_or(clamp(dev.max_qp_rd_atom));
        let initiator = p.initiator_depth.unwrap_or(clamp(dev.max_qp_init_rd_atom));
        if u32::from(responder) > dev.max_qp_rd_atom {
            return Err(Error::Limit {
                what: "responder_resources",
                requested: responder.into(),
                limit: dev.max_qp_rd_atom.into(),
                source_of_limit: "device max_qp_rd_atom",
            });
        }
        if u32::from(initiator) > dev.max_qp_init_rd_atom {
            return Err(Error::Limit {
                what: "initiator_depth",
                requested: initiator.into(),
                limit: dev.max_qp_init_rd_atom.into(),
                source_of_limit: "device max_qp_init_rd_atom",
            });
        }
        Ok(ffi::rdma_conn_param {
            private_data: p.private_data.as_ptr().cast(),
            private_data_len: p.private_data.len() as u8,
            responder_resources: responder,
            initiator_depth: initiator,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            ..Default::default()
        })
    }

    /// Connects (after [`CmId::resolve_route`] and [`CmId::create_qp`]) and waits until the
    /// connection is established. Returns the private data the acceptor sent.
    ///
    /// # Errors
    /// [`Error::CmEvent`] on REJECTED, UNREACHABLE or CONNECT_ERROR; [`Error::Timeout`];
    /// [`Error::Limit`] for oversized private data; [`Error::Verbs`].
    pub fn connect(&self, p: &ConnParam, timeout: Duration) -> Result<Vec<u8>> {
        let mut param = self.conn_param(p, MAX_CONNECT_PRIVATE_DATA)?;
        // SAFETY: live id with a resolved route; `param` and its private data outlive the call.
        let rc = unsafe { ffi::rdma_connect(self.inner.raw, &mut param) };
        if rc != 0 {
            return Err(Error::last_os("rdma_connect"));
        }
        self.expect("rdma_connect", CmEventType::ESTABLISHED, timeout)
    }

    /// Accepts a connection request (after [`CmId::create_qp`]) and waits until it is
    /// established.
    ///
    /// # Errors
    /// As [`CmId::connect`], naming `rdma_accept`.
    pub fn accept(&self, p: &ConnParam, timeout: Duration) -> Result<()> {
        let mut param = self.conn_param(p, MAX_ACCEPT_PRIVATE_DATA)?;
        // SAFETY: live id from a connect request; `param` outlives the call.
        let rc = unsafe { ffi::rdma_accept(self.inner.raw, &mut param) };
        if rc != 0 {
            return Err(Error::last_os("rdma_accept"));
        }
        self.expect("rdma_accept", CmEventType::ESTABLISHED, timeout)
            .map(drop)
    }

    /// Rejects a connection request, with optional private data for the requester.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `rdma_reject`.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len()).map_err(|_| {
            Error::InvalidArgument("reject private data is at most 255 bytes".into())
        })?;
        // SAFETY: live id from a connect request; the data outlives the call.
        let rc = unsafe { ffi::rdma_reject(self.inner.raw, private_data.as_ptr().cast(), len) };
        if rc != 0 {
            return Err(Error::last_os("rdma_reject"));
        }
        Ok(())
    }

    /// Starts a disconnect; the QP moves to ERROR and outstanding requests flush.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `rdma_disconnect`.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: live id.
        let rc = unsafe { ffi::rdma_disconnect(self.inner.raw) };
        if rc != 0 {
            return Err(Error::last_os("rdma_disconnect"));
        }
        Ok(())
    }

    /// Waits for the peer's (or our own) disconnect to be reported.
    ///
    /// # Errors
    /// [`Error::CmEvent`] for another event; [`Error::Timeout`].
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<()> {
        self.expect("wait for disconnect", CmEventType::DISCONNECTED, timeout)
            .map(drop)
    }

    fn expect(&self, op: &'static str, want: CmEventType, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let ev = self.inner.channel.next_event(op, deadline, timeout)?;
        if ev.kind == want && ev.status == 0 {
            return Ok(ev.private_data);
        }
        Err(Error::CmEvent {
            op,
            expected: want,
            got: ev.kind,
            status: ev.status,
        })
    }

    /// The local address (after bind, resolve or accept).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; the returned pointer is into the id's route.
        unsafe { sockaddr_to_std(ffi::rdma_get_local_addr(self.inner.raw)) }
    }

    /// The peer's address (after resolve or on a request).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { sockaddr_to_std(ffi::rdma_get_peer_addr(self.inner.raw)) }
    }

    /// The raw `rdma_cm_id`; `None` for a provider that is not librdmacm.
    pub fn as_raw(&self) -> Option<*mut ffi::rdma_cm_id> {
        Some(self.inner.raw)
    }
}

impl AsFd for CmId {
    /// The id's event channel fd (non-blocking), for an event loop.
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd lives as long as the channel, which this id keeps alive.
        unsafe { BorrowedFd::borrow_raw(self.inner.channel.fd()) }
    }
}

impl AsRawFd for CmId {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.channel.fd()
    }
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

/// A socket address in C form.
enum SockAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl From<SocketAddr> for SockAddr {
    fn from(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V4(a) => SockAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => SockAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }
}

impl SockAddr {
    fn as_mut_ptr(&mut self) -> *mut ffi::sockaddr {
        match self {
            SockAddr::V4(s) => (s as *mut libc::sockaddr_in).cast(),
            SockAddr::V6(s) => (s as *mut libc::sockaddr_in6).cast(),
        }
    }
}

/// # Safety
/// `sa` must be null or point at a valid sockaddr of the family it names.
unsafe fn sockaddr_to_std(sa: *const ffi::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the family field is the first field of every sockaddr.
    let family = unsafe { (*(sa as *const libc::sockaddr)).sa_family } as i32;
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let s = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let s = unsafe { &*(sa as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
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

    #[test]
    fn socket_addresses_round_trip_through_c() {
        for text in ["10.77.0.1:7471", "[fe80::1%3]:18515", "0.0.0.0:0"] {
            let a: SocketAddr = text.parse().unwrap();
            let mut c = SockAddr::from(a);
            // SAFETY: `c` is a valid sockaddr of its family.
            let back = unsafe { sockaddr_to_std(c.as_mut_ptr()) };
            assert_eq!(back, Some(a));
        }
    }

    #[test]
    fn no_stack_gives_unsupported_not_a_panic() {
        // On a machine without RDMA, rdma_create_event_channel fails with ENODEV.
        if let Err(e) = CmId::new() {
            assert!(e.is_unsupported() || e.errno().is_some(), "{e}");
        }
    }
}
