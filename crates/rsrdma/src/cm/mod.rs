//! rdma_cm: connection setup by IP address and port, as TCP does it.
//!
//! Every [`CmId`] gets an event channel of its own (an accepted id is migrated off the
//! listener's), so waiting for one id's event never consumes another's. Every wait has a
//! timeout, and every event is copied and acknowledged at once, so destroying an id never
//! blocks on an unacknowledged event. A connect request that is not handed to the caller is
//! rejected and its id destroyed, never leaked.
//!
//! A client resolves the server's address and route, creates its QP, and connects:
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
//!
//! A server listens, takes a request, builds the connection's QP on the request's device, and
//! posts its receives *before* accepting, since the client may send the moment it is
//! connected:
//!
//! ```no_run
//! # fn f() -> rsrdma::Result<()> {
//! use rsrdma::cm::{CmId, ConnParam};
//! use rsrdma::{AccessFlags, Cq, Mr, Pd, Qp, QpType, RecvWr};
//! use std::time::Duration;
//! let t = Duration::from_secs(5);
//! let listener = CmId::listener("10.0.0.1:7471".parse().unwrap(), 16)?;
//! let req = listener.get_request(t)?; // req.private_data: what the client sent
//! let ctx = req.id.context()?;
//! let pd = Pd::new(&ctx)?;
//! let cq = Cq::new(&ctx, 64, None)?;
//! let qp = req.id.create_qp(&pd, &Qp::builder(QpType::Rc), &cq, &cq)?;
//! let buf = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE)?;
//! let sge = [buf.sge(0, 4096)?];
//! // SAFETY: `buf` lives until the receive completes (or the QP is gone).
//! unsafe { qp.post_recv(&RecvWr::new(1, &sge))? };
//! req.id.accept(&ConnParam::default().with_private_data(*b"welcome"), t)?;
//! # let _ = qp; Ok(()) }
//! ```
//!
//! An event loop watches the id's fd ([`AsFd`], non-blocking) and takes events with
//! [`CmId::try_next_event`]; see there.

mod addr;
mod devices;
mod event;
mod param;
mod status;

pub(crate) use addr::{sockaddr_to_std, write_sockaddr};
pub use event::{CmEvent, CmEventType};
pub use param::{
    ConnParam, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
pub(crate) use status::explain as explain_status;
pub use status::{describe_status, reject_reason};

use crate::context::{Context, Owner};
use crate::cq::Cq;
use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::Pd;
use crate::qp::{Qp, QpBuilder, QpType};
use addr::SockAddr;
use devices::DeviceListRef;
use event::Channel;
use param::Depths;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How much longer than the kernel's own timeout a resolve waits, so that the kernel's error
/// (with its reason) arrives instead of a bare timeout.
const RESOLVE_GRACE: Duration = Duration::from_millis(500);

pub(crate) struct CmIdInner {
    pub(crate) raw: *mut ffi::rdma_cm_id,
    channel: Arc<Channel>,
    context: OnceLock<Context>,
    /// On an id from a connect request: the depths the requester asked for, which
    /// [`CmId::accept`] offers by default.
    requester: Option<Depths>,
}

// SAFETY: the inner only reads its own immutable fields; the calls that change the id's
// state go through `CmId`, which is not `Sync`, so one thread makes them at a time. A `Qp`
// holds this inner only to destroy its QP through the id.
unsafe impl Send for CmIdInner {}
// SAFETY: as above.
unsafe impl Sync for CmIdInner {}

impl CmIdInner {
    /// Destroys the QP that `rdma_create_qp` made on this id, serialised with the id's other
    /// uses of it (events, connect, accept, disconnect), which may run on another thread.
    pub(crate) fn destroy_qp(&self) {
        let _qp = self.channel.guard_qp();
        // SAFETY: the id is live (we are borrowed from it) and has a QP made by
        // rdma_create_qp; rdma_destroy_qp clears the id's pointer, so it never names a
        // freed QP, and the guard keeps librdmacm from using it meanwhile.
        unsafe { ffi::rdma_destroy_qp(self.raw) }
    }
}

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
///
/// A `CmId` is [`Send`] but not [`Sync`]: librdmacm does not serialise calls such as
/// `rdma_connect` and `rdma_accept` on one id, and two threads waiting on its channel would
/// take each other's events.
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<rsrdma::cm::CmId>();
/// ```
///
/// ```
/// fn moved_between_threads<T: Send>() {}
/// moved_between_threads::<rsrdma::cm::CmId>();
/// ```
pub struct CmId {
    inner: Arc<CmIdInner>,
    _not_sync: PhantomData<Cell<()>>,
}

/// A connection request taken off a listener.
#[derive(Debug)]
#[non_exhaustive]
pub struct ConnectRequest {
    /// The new id for this connection, on its own event channel. Create its QP with
    /// [`CmId::create_qp`], then [`CmId::accept`] (or [`CmId::reject`]); dropping it refuses
    /// the connection.
    pub id: CmId,
    /// The private data the connecting side sent, zero-padded to the transport's field size
    /// (see [`ConnParam::private_data`]).
    pub private_data: Vec<u8>,
    /// RDMA reads/atomics the requester will have in flight towards this side (its
    /// `initiator_depth`). [`CmId::accept`] serves that many by default
    /// (`responder_resources`), capped at the device's `max_qp_rd_atom`.
    pub requester_initiator_depth: u8,
    /// RDMA reads/atomics the requester serves (its `responder_resources`). [`CmId::accept`]
    /// issues at most that many by default (`initiator_depth`), capped at the device's
    /// `max_qp_init_rd_atom`.
    pub requester_responder_resources: u8,
}

impl CmId {
    /// A new id (TCP port space, for RC QPs) on a new event channel.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when there is no RDMA stack; [`Error::Verbs`] naming
    /// `rdma_create_event_channel` or `rdma_create_id`.
    pub fn new() -> Result<CmId> {
        let channel = Channel::new()?;
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
        // SAFETY: just created on `channel`; nothing else owns it.
        Ok(unsafe { CmId::from_raw(raw, channel, None) })
    }

    /// Takes ownership of `raw`.
    ///
    /// # Safety
    /// `raw` must be a live id on `channel` that nothing else destroys.
    unsafe fn from_raw(
        raw: *mut ffi::rdma_cm_id,
        channel: Arc<Channel>,
        requester: Option<Depths>,
    ) -> CmId {
        CmId {
            inner: Arc::new(CmIdInner {
                raw,
                channel,
                context: OnceLock::new(),
                requester,
            }),
            _not_sync: PhantomData,
        }
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
    /// logged and skipped, except DEVICE_REMOVAL, after which no request can come.
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::CmEvent`] on DEVICE_REMOVAL; [`Error::Verbs`] naming
    /// `rdma_get_cm_event`, `rdma_create_event_channel` or `rdma_migrate_id` (the request is
    /// then rejected).
    pub fn get_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        const OP: &str = "wait for a connect request";
        let deadline = crate::error::deadline_after(timeout);
        loop {
            let ev = self.inner.channel.take(OP, deadline, timeout)?;
            match ev.kind {
                CmEventType::CONNECT_REQUEST if ev.request.is_some() => {
                    if let Some(request) = ev.publish()?.request {
                        return Ok(request);
                    }
                }
                CmEventType::DEVICE_REMOVAL => {
                    return Err(ev.unexpected(OP, CmEventType::CONNECT_REQUEST))
                }
                // No other event carries a new id, so skipping one leaks nothing.
                kind => tracing::debug!(event = %kind, "listener skipped an event"),
            }
        }
    }

    /// Takes the next event on this id's channel, waiting up to `timeout`. A CONNECT_REQUEST
    /// (on a listener) comes with its new id in [`CmEvent::request`].
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::Verbs`] naming `rdma_get_cm_event`, or for a request
    /// `rdma_create_event_channel` or `rdma_migrate_id` (the request is then rejected).
    pub fn next_event(&self, timeout: Duration) -> Result<CmEvent> {
        let deadline = crate::error::deadline_after(timeout);
        self.inner
            .channel
            .take("wait for an rdma_cm event", deadline, timeout)?
            .publish()
    }

    /// Takes the next event if one is queued, without blocking: for event loops, which wait
    /// for the id's fd ([`AsFd`]) to become readable and then call this until it gives
    /// `None`. DISCONNECTED, DEVICE_REMOVAL and TIMEWAIT_EXIT arrive this way like any other.
    ///
    /// ```no_run
    /// # fn f(id: &rsrdma::cm::CmId) -> rsrdma::Result<()> {
    /// use rsrdma::cm::CmEventType;
    /// use std::os::fd::{AsFd, AsRawFd};
    /// let mut pfd = libc::pollfd { fd: id.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
    /// // SAFETY: one valid pollfd.
    /// unsafe { libc::poll(&mut pfd, 1, 1000) };
    /// while let Some(ev) = id.try_next_event()? {
    ///     match ev.kind {
    ///         CmEventType::DISCONNECTED => println!("the peer went away"),
    ///         CmEventType::DEVICE_REMOVAL => println!("the device is gone"),
    ///         other => println!("{other}: {:?}", ev.status_text()),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`CmId::next_event`], less the timeout.
    pub fn try_next_event(&self) -> Result<Option<CmEvent>> {
        match self.inner.channel.try_take()? {
            Some(ev) => ev.publish().map(Some),
            None => Ok(None),
        }
    }

    /// Resolves `dst` (and optionally the local `src`) to an RDMA device and address. The
    /// kernel gives up after `timeout`; the wait allows it a moment more, to report why.
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
        self.expect(
            "rdma_resolve_addr",
            CmEventType::ADDR_RESOLVED,
            timeout.saturating_add(RESOLVE_GRACE),
        )
        .map(drop)
    }

    /// Resolves the route to the address resolved before. The kernel gives up after
    /// `timeout`; the wait allows it a moment more, to report why.
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
        self.expect(
            "rdma_resolve_route",
            CmEventType::ROUTE_RESOLVED,
            timeout.saturating_add(RESOLVE_GRACE),
        )
        .map(drop)
    }

    /// The device context this id is bound to (after address resolution, or on a request).
    /// It holds librdmacm's reference on the device, so objects made from it stay valid
    /// after this id (and its listener) are gone.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before the id has a device; [`Error::Verbs`] naming
    /// `rdma_get_devices` or `ibv_query_device`.
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
        let held = DeviceListRef::holding(verbs)?;
        // SAFETY: librdmacm opened `verbs` and keeps it open while `held` references it; the
        // context drops `held` only after everything made from it.
        let ctx = unsafe {
            Context::from_raw(
                verbs,
                Owner::Cm {
                    _guard: Box::new(held),
                },
            )
        }?;
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
        builder.check_one_context(pd, send_cq, recv_cq)?;
        // The id's device context, where it has one (else librdmacm refuses the call).
        if self.context().is_ok_and(|c| !c.is(pd.context())) {
            return Err(Error::InvalidArgument(
                "the protection domain belongs to another device context than the rdma_cm \
                 id (make the queue pair's objects from the id's context())"
                    .into(),
            ));
        }
        builder.validate(pd)?;
        let mut init = builder.init_attr(send_cq, recv_cq);
        // The id's `qp` field is written here and by rdma_destroy_qp of an earlier Qp that
        // may be dropping on another thread: under the guard.
        let guard = self.inner.channel.guard_qp();
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
        // SAFETY: live id; rdma_create_qp just stored the new QP in it.
        let raw = unsafe { (*self.inner.raw).qp };
        drop(guard);
        // SAFETY: the Qp takes the new QP over and destroys it through the id (whose Arc it
        // holds).
        let qp = unsafe {
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

    /// Connects (after [`CmId::resolve_route`] and [`CmId::create_qp`]) and waits until the
    /// connection is established. Returns the private data the acceptor sent. Depths left
    /// `None` in `p` offer the device's maximum.
    ///
    /// On REJECTED the QP is in ERROR (librdmacm moves it as it hands the event over): the
    /// receives posted before the connect come back flushed. After [`Error::Timeout`] the
    /// request is still outstanding, as with librdmacm: a late answer may still bring the QP
    /// up (ESTABLISHED, then read with [`CmId::try_next_event`]); destroy the id, or move the
    /// QP to ERROR, to end it.
    ///
    /// # Errors
    /// [`Error::CmEvent`] on REJECTED, UNREACHABLE or CONNECT_ERROR (its message says what the
    /// status means: REJECTED with status 8 is "no listener on that address and port");
    /// [`Error::Timeout`]; [`Error::Limit`] for oversized private data or depths beyond the
    /// device; [`Error::Verbs`].
    pub fn connect(&self, p: &ConnParam, timeout: Duration) -> Result<Vec<u8>> {
        let ctx = self.context()?;
        let dev = ctx.attr();
        let mut param = p.to_raw(MAX_CONNECT_PRIVATE_DATA, dev, Depths::device_max(dev))?;
        // SAFETY: live id with a resolved route; `param` and its private data outlive the call.
        let rc = {
            let _qp = self.inner.channel.guard_qp();
            // SAFETY: as above.
            unsafe { ffi::rdma_connect(self.inner.raw, &mut param) }
        };
        if rc != 0 {
            return Err(Error::last_os("rdma_connect"));
        }
        self.expect("rdma_connect", CmEventType::ESTABLISHED, timeout)
    }

    /// As [`CmId::connect`], but the queue pair grants the acceptor exactly `access` (its
    /// remote flags), not what rdma_cm grants (REMOTE_WRITE always, and READ and ATOMIC
    /// when it serves reads). The connect goes out with no QP on the id, naming the QP in
    /// its parameters; when the acceptance comes, the QP is brought up here (the attributes
    /// `rdma_init_qp_attr` gives, with these flags) and the connection is completed with
    /// `rdma_establish`. So the acceptor never has more than `access`, not even for a moment
    /// (librdmacm's connect would bring the QP up itself, with the CM's flags, as it reads
    /// the acceptance). A client that checks its peer after the connection is up (a proof of
    /// a shared secret) grants nothing here, and its rights once it has.
    ///
    /// `qp` is the id's queue pair ([`CmId::create_qp`]); it is borrowed for the call, so it
    /// stays alive while the connection is made. When the connect fails (a timeout, a
    /// rejection, a bring-up that fails), the queue pair is moved to ERROR: a response that
    /// comes late can then bring it up for nobody, with no rights. An id connects once. The
    /// call reads the id's events itself: an event loop that takes this id's events from
    /// another thread meanwhile would take the response, and librdmacm would bring the queue
    /// pair up with its own flags.
    ///
    /// A librdmacm older than rdma-core 23 has no `rdma_establish`: there the connection
    /// is made as by [`CmId::connect`] and the flags are set to `access` right after, so the
    /// acceptor holds rdma_cm's flags for that moment.
    ///
    /// # Errors
    /// As [`CmId::connect`]; [`Error::InvalidArgument`] when `qp` is not the id's queue
    /// pair; [`Error::Verbs`] naming `rdma_init_qp_attr`, `ibv_modify_qp` or
    /// `rdma_establish`.
    pub fn connect_granting(
        &self,
        qp: &Qp,
        p: &ConnParam,
        access: crate::AccessFlags,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let done = self.connect_granting_inner(qp, p, access, timeout);
        if done.is_err() {
            // Whatever answer comes later finds a queue pair that cannot come up.
            let _ = qp.to_error();
        }
        done
    }

    fn connect_granting_inner(
        &self,
        qp: &Qp,
        p: &ConnParam,
        access: crate::AccessFlags,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        const OP: &str = "rdma_connect";
        let deadline = crate::error::deadline_after(timeout);
        let ctx = self.context()?;
        let dev = ctx.attr();
        let mut param = p.to_raw(MAX_CONNECT_PRIVATE_DATA, dev, Depths::device_max(dev))?;
        let guard = self.inner.channel.guard_qp();
        // SAFETY: live id; its `qp` field is read under the guard.
        let on_id = unsafe { (*self.inner.raw).qp };
        // The caller's borrow keeps this QP alive, and so on the id, for the whole call.
        let raw = match qp.as_raw() {
            Some(raw) if !on_id.is_null() && raw == on_id => raw,
            _ => {
                return Err(Error::InvalidArgument(
                    "connect_granting brings up the id's queue pair: pass the one create_qp \
                     made"
                        .into(),
                ))
            }
        };
        if !ffi::establish_supported(self.inner.raw) {
            drop(guard);
            let reply = self.connect(p, timeout)?;
            qp.set_access(access)?;
            return Ok(reply);
        }
        // SAFETY: the id's live QP.
        (param.qp_num, param.srq) = unsafe { ((*raw).qp_num, u8::from(!(*raw).srq.is_null())) };
        // SAFETY: the guard is held and `raw` is the id's live QP; live id with a resolved
        // route; `param` outlives the call.
        let rc = unsafe { self.with_qp_held_back(raw, |id| ffi::rdma_connect(id, &mut param)) };
        drop(guard);
        if rc != 0 {
            return Err(Error::last_os("rdma_connect"));
        }
        let ev = self
            .inner
            .channel
            .take_holding(OP, deadline, timeout, Some(self.inner.raw))?;
        if ev.kind != CmEventType::CONNECT_RESPONSE || ev.status != 0 {
            return Err(ev.unexpected(OP, CmEventType::CONNECT_RESPONSE));
        }
        let guard = self.inner.channel.guard_qp();
        self.bring_up(&ctx, raw, access, None)?;
        // SAFETY: the guard is held and `raw` is the id's live QP; the id took its connect
        // response, and with no QP on it librdmacm only sends the RTU (the QP is up already).
        let rc = unsafe { self.with_qp_held_back(raw, |id| ffi::rdma_establish(id)) };
        drop(guard);
        if rc != 0 {
            return Err(Error::last_os("rdma_establish"));
        }
        Ok(ev.private_data)
    }

    /// Runs `call` on this id with no QP on it, so librdmacm leaves the QP alone (a connect
    /// or accept announces the QP its parameters name; a connect response is handed over,
    /// not acted on; an establish only sends the RTU); the id has `qp` back before this
    /// returns, so nobody else ever sees it without.
    ///
    /// # Safety
    /// The caller holds the QP guard (`guard_qp`), and `qp` is the id's live QP.
    unsafe fn with_qp_held_back(
        &self,
        qp: *mut ffi::ibv_qp,
        call: impl FnOnce(*mut ffi::rdma_cm_id) -> std::os::raw::c_int,
    ) -> std::os::raw::c_int {
        // SAFETY: live id; its `qp` field is the caller's to touch (the guard), and restored.
        unsafe {
            (*self.inner.raw).qp = std::ptr::null_mut();
            let rc = call(self.inner.raw);
            (*self.inner.raw).qp = qp;
            rc
        }
    }

    /// Brings the id's QP (`qp`, held under the caller's guard) from INIT to RTS with the
    /// attributes the CM gives and `access` as its remote flags. `depths` (responder
    /// resources, initiator depth) replace the CM's read depths, as an acceptor's
    /// parameters do in librdmacm.
    fn bring_up(
        &self,
        ctx: &Context,
        qp: *mut ffi::ibv_qp,
        access: crate::AccessFlags,
        depths: Option<(u8, u8)>,
    ) -> Result<()> {
        use ffi::ibv_qp_state as S;
        // SAFETY: live id.
        let port = unsafe { (*self.inner.raw).port_num };
        let infiniband = ctx
            .query_port(port)
            .is_ok_and(|a| a.link_layer == crate::LinkLayer::Infiniband);
        for state in [S::IBV_QPS_INIT, S::IBV_QPS_RTR, S::IBV_QPS_RTS] {
            let mut attr = ffi::ibv_qp_attr {
                qp_state: state,
                ..Default::default()
            };
            let mut mask: std::os::raw::c_int = 0;
            // SAFETY: live id with a peer (a request or a response); `attr` and `mask` are
            // writable.
            if unsafe { ffi::rdma_init_qp_attr(self.inner.raw, &mut attr, &mut mask) } != 0 {
                return Err(Error::last_os("rdma_init_qp_attr"));
            }
            // The CM names the flags at INIT (a soft CM, at RTR too): ours, wherever.
            let flags = ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0 as std::os::raw::c_int;
            if state == S::IBV_QPS_INIT || mask & flags != 0 {
                attr.qp_access_flags = access.bits();
                mask |= flags;
            }
            match state {
                S::IBV_QPS_INIT => {}
                S::IBV_QPS_RTR => {
                    if let Some((responder_resources, _)) = depths {
                        attr.max_dest_rd_atomic = responder_resources;
                    }
                    // As librdmacm: the kernel marks RoCE-only attributes (bits 21 to 24)
                    // that an InfiniBand port refuses.
                    if infiniband {
                        mask &= !0xe0_0000;
                    }
                }
                _ => {
                    if let Some((_, initiator_depth)) = depths {
                        attr.max_rd_atomic = initiator_depth;
                    }
                }
            }
            // SAFETY: the id's live QP (in INIT since create_qp, then RTR); valid attributes.
            let rc = unsafe { ffi::ibv_modify_qp(qp, &mut attr, mask) };
            if rc != 0 {
                return Err(Error::from_errno("ibv_modify_qp", rc));
            }
        }
        Ok(())
    }

    /// Accepts a connection request (after [`CmId::create_qp`]) and waits until it is
    /// established. Depths left `None` in `p` follow librdmacm's rule: serve as many RDMA
    /// reads/atomics as the requester issues and issue as many as it serves (see
    /// [`ConnectRequest`]), each capped at the device's maximum.
    ///
    /// # Errors
    /// As [`CmId::connect`], naming `rdma_accept`.
    pub fn accept(&self, p: &ConnParam, timeout: Duration) -> Result<()> {
        let (_, mut param) = self.accept_param(p)?;
        // SAFETY: live id from a connect request; `param` outlives the call.
        let rc = {
            let _qp = self.inner.channel.guard_qp();
            // SAFETY: as above.
            unsafe { ffi::rdma_accept(self.inner.raw, &mut param) }
        };
        if rc != 0 {
            return Err(Error::last_os("rdma_accept"));
        }
        self.expect("rdma_accept", CmEventType::ESTABLISHED, timeout)
            .map(drop)
    }

    /// As [`CmId::accept`], but the queue pair grants its peer exactly `access` (its remote
    /// flags), not what rdma_cm grants (REMOTE_WRITE always, and READ and ATOMIC when it
    /// serves reads). The QP is brought up here, with the attributes the CM gives
    /// (`rdma_init_qp_attr`) and these flags, before the acceptance goes out, so the peer
    /// never has more, not even for a moment (librdmacm's accept would bring the QP up itself
    /// and set the CM's flags again). A server that checks its peer after the connection is
    /// up (a proof of a shared secret) grants nothing here, and its rights once it has.
    ///
    /// # Errors
    /// As [`CmId::accept`]; [`Error::InvalidArgument`] without a QP made by
    /// [`CmId::create_qp`]; [`Error::Verbs`] naming `rdma_init_qp_attr` or `ibv_modify_qp`.
    pub fn accept_granting(
        &self,
        p: &ConnParam,
        access: crate::AccessFlags,
        timeout: Duration,
    ) -> Result<()> {
        let (ctx, mut param) = self.accept_param(p)?;
        let guard = self.inner.channel.guard_qp();
        // SAFETY: live id; its `qp` field is read under the guard.
        let qp = unsafe { (*self.inner.raw).qp };
        if qp.is_null() {
            return Err(Error::InvalidArgument(
                "accept_granting brings up the id's queue pair: make it with create_qp first"
                    .into(),
            ));
        }
        self.bring_up(
            &ctx,
            qp,
            access,
            Some((param.responder_resources, param.initiator_depth)),
        )?;
        // SAFETY: the id's live QP.
        (param.qp_num, param.srq) = unsafe { ((*qp).qp_num, u8::from(!(*qp).srq.is_null())) };
        // With no QP on the id, librdmacm's accept leaves the QP alone and announces the one
        // the parameters name; the id gets its QP back at once (under the guard, so nobody
        // sees it without).
        // SAFETY: the guard is held and `qp` is the id's live QP; `param` outlives the call.
        let rc = unsafe { self.with_qp_held_back(qp, |id| ffi::rdma_accept(id, &mut param)) };
        let accepted = if rc != 0 {
            Err(Error::last_os("rdma_accept"))
        } else {
            Ok(())
        };
        drop(guard);
        accepted?;
        self.expect("rdma_accept", CmEventType::ESTABLISHED, timeout)
            .map(drop)
    }

    /// The context and `p` for `rdma_accept`, with the depths left `None` filled in (see
    /// [`CmId::accept`]).
    fn accept_param(&self, p: &ConnParam) -> Result<(Context, ffi::rdma_conn_param)> {
        let ctx = self.context()?;
        let dev = ctx.attr();
        let defaults = match self.inner.requester {
            Some(asked) => Depths::accepting(asked, dev.max_qp_rd_atom, dev.max_qp_init_rd_atom),
            None => Depths::device_max(dev),
        };
        let param = p.to_raw(MAX_ACCEPT_PRIVATE_DATA, dev, defaults)?;
        Ok((ctx, param))
    }

    /// Rejects a connection request, with optional private data for the requester (who sees
    /// REJECTED with reason 28, "consumer reject"): at most [`MAX_REJECT_PRIVATE_DATA`] bytes,
    /// what the IB CM's REJ carries.
    ///
    /// # Errors
    /// [`Error::Limit`] for longer private data (nothing is sent); [`Error::Verbs`] naming
    /// `rdma_reject`.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len())
            .ok()
            .filter(|&n| usize::from(n) <= MAX_REJECT_PRIVATE_DATA)
            .ok_or(Error::Limit {
                what: "reject private data",
                requested: private_data.len() as u64,
                limit: MAX_REJECT_PRIVATE_DATA as u64,
                source_of_limit: "the IB CM's REJ",
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
        let _qp = self.inner.channel.guard_qp();
        // SAFETY: live id; the QP it may modify is not being destroyed (the guard).
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

    /// Waits for `want` with status 0 and returns its private data. Any other event is an
    /// error; a connect request among them is refused.
    fn expect(&self, op: &'static str, want: CmEventType, timeout: Duration) -> Result<Vec<u8>> {
        let deadline = crate::error::deadline_after(timeout);
        let ev = self.inner.channel.take(op, deadline, timeout)?;
        if ev.kind == want && ev.status == 0 {
            return Ok(ev.private_data);
        }
        Err(ev.unexpected(op, want))
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
    /// The id's event channel fd (non-blocking), for an event loop: readable when
    /// [`CmId::try_next_event`] has an event to give.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this machine has RDMA devices, as the kernel lists them.
    fn has_rdma_devices() -> bool {
        std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
    }

    #[test]
    fn no_stack_gives_unsupported_not_a_panic() {
        let made = CmId::new();
        if !has_rdma_devices() {
            // rdma_create_event_channel finds no device: ENODEV, i.e. Unsupported.
            let e = made.expect_err("an rdma_cm id without any RDMA device");
            assert!(e.is_unsupported(), "{e}");
            return;
        }
        let id = made.expect("an rdma_cm id where RDMA devices exist");
        // SAFETY: the id's fd is open while `id` lives.
        let flags = unsafe { libc::fcntl(id.as_raw_fd(), libc::F_GETFL) };
        assert!(flags >= 0 && flags & libc::O_NONBLOCK != 0, "{flags:#x}");
        assert!(
            id.try_next_event().unwrap().is_none(),
            "a fresh id has no event"
        );
    }
}
