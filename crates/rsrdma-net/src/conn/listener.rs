//! [`Listener`]: accepts [`Conn`]s on either establishment path.
//!
//! Handshakes run concurrently, each on a thread of its own, at most [`HANDSHAKE_LIMIT`] at a
//! time (counting finished ones not yet taken by `accept`): `accept` takes peers off the
//! kernel's queue while there is room, starts their handshakes, and returns the first one that
//! finishes. So a peer that goes silent half-way delays nobody; it only holds its own thread
//! until [`ConnOptions::connect_timeout`]. A peer that fails its handshake (garbage, silence,
//! an incompatible version, a wrong secret) gives [`NetError::Handshake`] for that peer only:
//! the listener keeps serving, so call `accept` again. Handshakes are started only from
//! `accept`, so a listener nobody accepts on does no work, and the limit bounds the threads
//! and connections a flood of peers can hold.

use super::establish;
use super::fdwait::{wait_readable, Wake};
use super::options::{ConnOptions, Establish};
use super::pool::{RecvMemory, RecvPools};
use super::Conn;
use crate::error::{NetError, Result};
use crate::handshake::Role;
use rsrdma::cm::{CmEventType, CmId, ConnectRequest};
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Pending connect requests the kernel queues.
const BACKLOG: i32 = 128;
/// Longest single wait inside an `accept` without a deadline.
const WAIT_SLICE: Duration = Duration::from_secs(3600);
/// Handshakes in progress plus finished ones not yet accepted, at most.
const HANDSHAKE_LIMIT: usize = 32;
/// A handshake thread's stack.
const HANDSHAKE_STACK: usize = 512 * 1024;

enum Inner {
    // `CmId` is not `Sync`; the mutex makes one thread at a time take its events.
    Cm(Mutex<CmId>),
    Tcp(TcpListener),
}

/// A peer taken off the kernel's queue, before its handshake.
enum Incoming {
    Cm(ConnectRequest),
    Tcp(TcpStream, SocketAddr),
}

/// What handshake threads and `accept` share.
struct Handshakes {
    state: Mutex<Queue>,
    /// Made readable when a handshake finishes.
    done: Wake,
}

#[derive(Default)]
struct Queue {
    running: usize,
    finished: VecDeque<Result<Conn>>,
    /// The listener is gone: drop what finishes.
    closed: bool,
}

impl Handshakes {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, r: Result<Conn>) {
        let mut q = self.lock();
        q.running -= 1;
        if !q.closed {
            q.finished.push_back(r);
        }
        drop(q);
        self.done.wake();
    }
}

/// A listener for [`Conn`]s. `Send + Sync`.
///
/// Handshakes run concurrently, each on a thread of its own, at most 32 at a time (counting
/// finished ones not yet taken by [`Listener::accept`]): `accept` takes peers off the kernel's
/// queue while there is room, starts their handshakes, and returns the first one that
/// finishes. A peer that fails its handshake (garbage, silence, an incompatible version, a
/// wrong secret) gives [`NetError::Handshake`] for that peer only: the listener keeps
/// serving, so call `accept` again. Handshakes start only from `accept`, so a listener nobody
/// accepts on does no work.
pub struct Listener {
    inner: Inner,
    opts: ConnOptions,
    local: SocketAddr,
    fd: RawFd,
    hs: Arc<Handshakes>,
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

impl Listener {
    /// Listens on `addr` (port 0 picks a free one: see [`Listener::local_addr`]). rdma_cm
    /// needs an address of an RDMA device (or the unspecified address).
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for options that cannot work; [`NetError::Verbs`]
    /// naming `rdma_bind_addr`/`rdma_listen`; [`NetError::Io`] naming `bind` or `eventfd`.
    pub fn bind(addr: impl ToSocketAddrs, opts: ConnOptions) -> Result<Listener> {
        opts.check()?;
        let addr = addr
            .to_socket_addrs()
            .map_err(|e| NetError::io("resolve address", e))?
            .next()
            .ok_or_else(|| NetError::InvalidArgument("the address resolved to nothing".into()))?;
        let (inner, local, fd) = match opts.establish {
            Establish::Cm => {
                let id = CmId::listener(addr, BACKLOG)?;
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
        let hs = Arc::new(Handshakes {
            state: Mutex::new(Queue::default()),
            done: Wake::new().map_err(|e| NetError::io("eventfd", e))?,
        });
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

    /// Waits for the next established connection (handshakes run concurrently: see
    /// [`Listener`]).
    ///
    /// # Errors
    /// [`NetError::Handshake`] for a peer that failed (the listener stays usable); the
    /// listener's own errors.
    pub fn accept(&self) -> Result<Conn> {
        self.accept_until(None, Duration::ZERO)
    }

    /// As [`Listener::accept`], waiting at most `timeout` for a connection. Handshakes still
    /// running at the timeout go on, and the next `accept` can return them.
    ///
    /// # Errors
    /// [`NetError::Timeout`] when no connection was ready in time; as [`Listener::accept`].
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Conn> {
        self.accept_until(Some(crate::deadline::deadline_after(timeout)), timeout)
    }

    /// `timeout` is what the caller asked for, for the error's text.
    fn accept_until(&self, deadline: Option<Instant>, timeout: Duration) -> Result<Conn> {
        loop {
            // Clear before looking, so a handshake that finishes after the look wakes the poll.
            self.hs.done.clear();
            let room = {
                let mut q = self.hs.lock();
                if let Some(r) = q.finished.pop_front() {
                    if !q.finished.is_empty() {
                        // Another caller may sleep on the wake just cleared.
                        self.hs.done.wake();
                    }
                    return r;
                }
                q.running + q.finished.len() < HANDSHAKE_LIMIT
            };
            if room {
                if let Some(peer) = self.take_peer()? {
                    self.start_handshake(peer)?;
                    continue;
                }
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => WAIT_SLICE,
            };
            if left.is_zero() {
                return Err(NetError::Timeout {
                    op: "accept",
                    millis: timeout.as_millis().try_into().unwrap_or(u64::MAX),
                });
            }
            let listen = room.then_some(self.fd);
            wait_readable([listen, Some(self.hs.done.raw())], Some(left))
                .map_err(|e| NetError::io("poll", e))?;
        }
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
            Inner::Tcp(l) => loop {
                match l.accept() {
                    Ok((s, peer)) => return Ok(Some(Incoming::Tcp(s, peer))),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    // The peer left before we took it: nothing to hand out.
                    Err(e) if e.kind() == ErrorKind::ConnectionAborted => {}
                    Err(e) => return Err(NetError::io("accept", e)),
                }
            },
        }
    }

    /// Runs `peer`'s handshake on a thread of its own; its result joins the finished queue.
    fn start_handshake(&self, peer: Incoming) -> Result<()> {
        self.hs.lock().running += 1;
        let hs = self.hs.clone();
        let opts = self.opts.clone();
        let recv = self.recv.clone();
        let spawned = std::thread::Builder::new()
            .name("rsrdma-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || hs.finish(handshake(peer, &opts, &recv)));
        spawned.map(drop).map_err(|e| {
            self.hs.lock().running -= 1;
            NetError::io("spawn a handshake thread", e)
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Connections accepted by nobody close now; running handshakes drop theirs.
        let finished = {
            let mut q = self.hs.lock();
            q.closed = true;
            std::mem::take(&mut q.finished)
        };
        drop(finished);
    }
}

/// One peer's whole establishment, bounded by `opts.connect_timeout`.
fn handshake(peer: Incoming, opts: &ConnOptions, recv: &RecvPools) -> Result<Conn> {
    match peer {
        Incoming::Cm(req) => {
            let addr = req.id.peer_addr();
            establish::cm::accept(req, opts, recv)
                .and_then(|est| Conn::start(est, opts))
                .map_err(|e| handshake_failed(addr, e))
        }
        Incoming::Tcp(stream, addr) => {
            establish::tcp::establish(stream, Role::Server, opts, Some(recv))
                .and_then(|est| Conn::start(est, opts))
                .map_err(|e| handshake_failed(Some(addr), e))
        }
    }
}

fn handshake_failed(peer: Option<SocketAddr>, e: NetError) -> NetError {
    let peer = peer.map_or_else(|| "an unknown peer".to_string(), |p| p.to_string());
    tracing::debug!(%peer, error = %e, "rsrdma-net listener: a handshake failed");
    NetError::Handshake {
        peer,
        source: Box::new(e),
    }
}
