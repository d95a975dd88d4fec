//! [`Listener`]: accepts [`Conn`]s on either establishment path.
//!
//! Handshakes run concurrently, each on a thread of its own, bounded in all and per source
//! (see [`super::admission`]): `accept` takes peers off the kernel's queue while there is room
//! (or an unopened handshake to shed), starts their handshakes, and returns the first good
//! connection. A peer that fails (garbage, silence past [`ConnOptions::opening_timeout`], an
//! incompatible version, a wrong secret) is logged and counted ([`Listener::counters`]) and
//! never ends an accept loop. Handshakes are started only from `accept`, so a listener nobody
//! accepts on does no work.

use super::accept_queue::{take_tcp_peer, AcceptQueue};
use super::establish;
use super::options::{ConnOptions, Establish};
use super::pool::{RecvMemory, RecvPools};
use super::{Admission, Conn, Incoming, ListenerCounters, Ticket};
use crate::error::{NetError, Result};
use rsrdma::cm::{CmEventType, CmId};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pending connect requests the kernel queues.
const BACKLOG: i32 = 128;
/// A handshake thread's stack.
const HANDSHAKE_STACK: usize = 512 * 1024;

enum Inner {
    // `CmId` is not `Sync`; the mutex makes one thread at a time take its events.
    Cm(Mutex<CmId>),
    Tcp(TcpListener),
}

/// A listener for [`Conn`]s. `Send + Sync`.
///
/// Handshakes run concurrently, each on a thread of its own, at most
/// [`ConnOptions::max_handshakes`] at a time and [`ConnOptions::max_handshakes_per_source`]
/// from one address: `accept` takes peers off the kernel's queue, starts their handshakes,
/// and returns the first good connection. A new peer past a bound sheds the oldest handshake
/// that has not yet opened (proven the secret when there is one; without one, sent a valid
/// hello and then its first step of the handshake), and
/// a peer gets [`ConnOptions::opening_timeout`] to open: silent or garbage sockets cannot hold
/// the listener. A peer that fails its handshake is logged (`tracing`, WARN) and counted
/// ([`Listener::counters`]); `accept` never returns it, so `loop { listener.accept()? }`
/// keeps serving. Handshakes start only from `accept`, so a listener nobody accepts on does
/// no work; each call starts every peer already queued (while there is room) before it
/// returns a finished connection, so peers that dial together are served together.
pub struct Listener {
    inner: Inner,
    opts: ConnOptions,
    local: SocketAddr,
    fd: RawFd,
    hs: Arc<AcceptQueue<Conn>>,
    /// The shared receive pool (if [`ConnOptions::shared_recv`]) and the receive-memory
    /// account of the accepted connections.
    recv: Arc<RecvPools>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local", &self.local)
            .field("establish", &self.opts.establish)
            .finish()
    }
}

/// rdma_cm's bind refuses an address no RDMA device has (EADDRNOTAVAIL) with the system's
/// words only ("Cannot assign requested address"): said what it means and what to bind
/// instead (an outside tester, following the guide on soft0, had to guess).
fn not_a_device_address(e: rsrdma::Error, addr: SocketAddr) -> NetError {
    if e.errno() != Some(libc::EADDRNOTAVAIL) {
        return e.into();
    }
    NetError::InvalidArgument(format!(
        "{addr} is not an address of an RDMA device ({e}): rdma_cm listens on a device's \
         address or on 0.0.0.0 (the software device soft0: 127.0.0.1, or the address \
         RSRDMA_SOFT_ADDR names, where soft0 could open: if it did not, its log says why, \
         such as another process holding that port)"
    ))
}

/// The options checked for a listener (as [`Listener::bind`] says; `AsyncListener::bind`
/// too), and the address resolved.
pub(crate) fn checked_for_listening(
    addr: impl ToSocketAddrs,
    opts: &ConnOptions,
) -> Result<SocketAddr> {
    opts.check()?;
    // On the TCP path the options pick the device (on rdma_cm's, the address does).
    if opts.establish == Establish::Tcp {
        let ctx = crate::domain::open_device(opts.device.as_deref(), opts.pd.as_ref())?;
        ctx.query_port(opts.port)?;
        ctx.resolve_gid_index(opts.port, opts.gid_index)?;
        opts.check_fits(&ctx)?;
    }
    addr.to_socket_addrs()
        .map_err(|e| NetError::io("resolve address", e))?
        .next()
        .ok_or_else(|| NetError::InvalidArgument("the address resolved to nothing".into()))
}

/// An rdma_cm id listening on `addr`, its device's fit for `opts` checked where it knows its
/// device.
pub(crate) fn cm_listener(addr: SocketAddr, opts: &ConnOptions) -> Result<CmId> {
    let id = CmId::listener(addr, BACKLOG).map_err(|e| not_a_device_address(e, addr))?;
    // Bound to a device's address, the id knows its device: one that the options name
    // otherwise (or a protection domain of another) is refused here, not by every peer's
    // handshake. (On the unspecified address each request brings its own.)
    if let Ok(ctx) = id.context() {
        opts.domain_on(&ctx)?;
        // Queues the device cannot hold fail every peer: refused here (an outside tester's
        // find: it bound, and accept never returned).
        opts.check_fits(&ctx)?;
    }
    Ok(id)
}

impl Listener {
    /// Listens on `addr` (port 0 picks a free one: see [`Listener::local_addr`]). rdma_cm
    /// needs an address of an RDMA device (or the unspecified address).
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for options that cannot work; on the TCP path, the
    /// device's error for a device, port or GID index it does not have (checked here, not by
    /// every handshake after its peer was accepted); [`NetError::Verbs`] naming
    /// `rdma_bind_addr`/`rdma_listen` ([`NetError::InvalidArgument`] for an address no RDMA
    /// device has); [`NetError::Io`] naming `bind` or `eventfd`.
    pub fn bind(addr: impl ToSocketAddrs, opts: ConnOptions) -> Result<Listener> {
        let addr = checked_for_listening(addr, &opts)?;
        let (inner, local, fd) = match opts.establish {
            Establish::Cm => {
                let id = cm_listener(addr, &opts)?;
                let local = id.local_addr().unwrap_or(addr);
                let fd = id.as_raw_fd();
                (Inner::Cm(Mutex::new(id)), local, fd)
            }
            Establish::Tcp => {
                let l = TcpListener::bind(addr).map_err(|e| NetError::io("bind", e))?;
                l.set_nonblocking(true)
                    .map_err(|e| NetError::io("set_nonblocking", e))?;
                let local = l.local_addr().map_err(|e| NetError::io("local_addr", e))?;
                let fd = l.as_raw_fd();
                (Inner::Tcp(l), local, fd)
            }
        };
        let hs = AcceptQueue::new(Admission::new(&opts))?;
        let recv = Arc::new(RecvPools::new(opts.shared_recv));
        Ok(Listener {
            inner,
            opts,
            local,
            fd,
            hs,
            recv,
        })
    }

    /// The address it listens on, with the real port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Registered receive memory of this listener's connections now: the shared pool (made
    /// when the first peer arrives; see [`crate::SharedRecv`]) and what each accepted
    /// connection alive holds itself (its receive region without a pool). Dialed
    /// connections and send memory are not counted.
    pub fn recv_memory(&self) -> RecvMemory {
        self.recv.memory()
    }

    /// What this listener has done with its peers: connections accepted, peers that failed
    /// their handshake, peers shed to make room.
    pub fn counters(&self) -> ListenerCounters {
        self.hs.admission.counters()
    }

    /// Waits for the next good connection (handshakes run concurrently, and peers that fail
    /// are skipped: see [`Listener`]).
    ///
    /// # Errors
    /// The listener's own errors only (the socket, the rdma_cm id, a thread that cannot be
    /// started); never a peer's.
    pub fn accept(&self) -> Result<Conn> {
        self.accept_until(None, Duration::ZERO)
    }

    /// Takes the next peer and runs its handshake on this thread, returning its outcome,
    /// failure included: for a tool that serves exactly one known peer and should stop with
    /// that peer's error (as perftest's tools do). A service uses [`Listener::accept`].
    ///
    /// # Errors
    /// The peer's handshake errors; the listener's own.
    pub fn accept_first(&self) -> Result<Conn> {
        let peer = loop {
            if let Some(p) = self.take_peer()? {
                break p;
            }
            super::wait_listener(self.fd).map_err(|e| NetError::io("poll", e))?;
        };
        let ticket = self.hs.admission.start_incoming(&peer, 0).ok_or_else(|| {
            NetError::InvalidArgument("accept_first: every handshake place is taken".into())
        })?;
        let r = handshake(peer, &self.opts, &self.recv, &ticket);
        match &r {
            Ok(_) => self.hs.admission.accepted(),
            Err(e) => self.hs.admission.ticket_failed(&ticket, e),
        }
        r
    }

    /// As [`Listener::accept`], waiting at most `timeout` for a connection. Handshakes still
    /// running at the timeout go on, and the next `accept` can return them.
    ///
    /// # Errors
    /// [`NetError::Timeout`] when no connection was ready in time; as [`Listener::accept`].
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Conn> {
        self.accept_until(Some(crate::deadline::deadline_after(timeout)), timeout)
    }

    fn accept_until(&self, deadline: Option<Instant>, timeout: Duration) -> Result<Conn> {
        self.hs.accept_until(self.fd, deadline, timeout, |waiting| {
            let Some(peer) = self.take_peer()? else {
                return Ok(false);
            };
            self.start_handshake(peer, waiting)?;
            Ok(true)
        })
    }

    /// The next peer the kernel has queued, without waiting.
    fn take_peer(&self) -> Result<Option<Incoming>> {
        match &self.inner {
            Inner::Cm(id) => {
                let id = id.lock().unwrap_or_else(|p| p.into_inner());
                while let Some(ev) = id.try_next_event()? {
                    if let Some(req) = ev.request {
                        return Ok(Some(Incoming::Cm(req)));
                    }
                    if ev.kind == CmEventType::DEVICE_REMOVAL {
                        return Err(NetError::Verbs(rsrdma::Error::CmEvent {
                            op: "wait for a connect request",
                            expected: CmEventType::CONNECT_REQUEST,
                            got: ev.kind,
                            status: ev.status,
                            private_data: rsrdma::error::PrivateData(ev.private_data),
                        }));
                    }
                    tracing::debug!(event = %ev.kind, "rsrdma-net listener skipped an event");
                }
                Ok(None)
            }
            Inner::Tcp(l) => Ok(take_tcp_peer(l)?.map(|(s, peer)| Incoming::Tcp(s, peer))),
        }
    }

    /// Runs `peer`'s handshake on a thread of its own, when admission gives it a place
    /// (else the peer is dropped and counted as shed); a good result joins the queue.
    fn start_handshake(&self, peer: Incoming, waiting: usize) -> Result<()> {
        let Some(ticket) = self.hs.admission.start_incoming(&peer, waiting) else {
            return Ok(());
        };
        let hs = self.hs.clone();
        let opts = self.opts.clone();
        let recv = self.recv.clone();
        let spawned = std::thread::Builder::new()
            .name("rsrdma-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                let r = handshake(peer, &opts, &recv, &ticket);
                hs.finish(ticket, r)
            });
        spawned
            .map(drop)
            .map_err(|e| NetError::io("spawn a handshake thread", e))
    }
}

impl super::Unaccepted for Conn {
    fn refuse(self) {
        self.abort_unaccepted();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Connections accepted by nobody close now; running handshakes drop theirs.
        self.hs.close();
        // Requests nobody took are refused with the reason.
        if let Inner::Cm(id) = &self.inner {
            establish::cm::refuse_waiting_requests(&id.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }
}

/// One peer's whole establishment, bounded by `opts.connect_timeout` (its opening by
/// `opts.opening_timeout`).
fn handshake(
    peer: Incoming,
    opts: &ConnOptions,
    recv: &RecvPools,
    ticket: &Ticket,
) -> Result<Conn> {
    match peer {
        // Its ticket says it opened from the start (`Admission::start_incoming`).
        Incoming::Cm(req) => establish::cm::accept(req, opts, recv, &ticket.standing())
            .and_then(|est| Conn::start(est, opts)),
        Incoming::Tcp(stream, _) => {
            establish::tcp::accept(stream, opts, Some(recv), Some(ticket.standing()))
                .and_then(|est| Conn::start(est, opts))
        }
    }
}
