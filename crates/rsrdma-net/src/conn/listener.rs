//! [`Listener`]: accepts [`Conn`]s on either establishment path.
//!
//! A peer that fails its handshake (garbage, a half handshake that goes silent, an
//! incompatible version, a wrong secret) gives [`NetError::Handshake`] for that peer only:
//! the listener keeps serving, so call `accept` again. Handshakes run one at a time inside
//! `accept`, each bounded by [`ConnOptions::connect_timeout`]; a silent peer therefore delays
//! the next one by at most that long.

use super::establish;
use super::fdwait::wait_readable;
use super::options::{ConnOptions, Establish};
use super::Conn;
use crate::error::{NetError, Result};
use crate::handshake::Role;
use rsrdma::cm::CmId;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Pending connect requests the kernel queues.
const BACKLOG: i32 = 128;
/// Longest single wait inside an `accept` without a deadline.
const WAIT_SLICE: Duration = Duration::from_secs(3600);

enum Inner {
    // `CmId` is not `Sync`; the mutex makes one thread at a time take its events.
    Cm(Mutex<CmId>),
    Tcp(TcpListener),
}

/// A listener for [`Conn`]s. `Send + Sync`.
pub struct Listener {
    inner: Inner,
    opts: ConnOptions,
    local: SocketAddr,
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
    /// naming `rdma_bind_addr`/`rdma_listen`; [`NetError::Io`] naming `bind`.
    pub fn bind(addr: impl ToSocketAddrs, opts: ConnOptions) -> Result<Listener> {
        opts.check()?;
        let addr = addr
            .to_socket_addrs()
            .map_err(|e| NetError::io("resolve address", e))?
            .next()
            .ok_or_else(|| NetError::InvalidArgument("the address resolved to nothing".into()))?;
        let (inner, local) = match opts.establish {
            Establish::Cm => {
                let id = CmId::listener(addr, BACKLOG)?;
                let local = id.local_addr().unwrap_or(addr);
                (Inner::Cm(Mutex::new(id)), local)
            }
            Establish::Tcp => {
                let l = TcpListener::bind(addr).map_err(|e| NetError::io("bind", e))?;
                l.set_nonblocking(true)
                    .map_err(|e| NetError::io("set_nonblocking", e))?;
                let local = l.local_addr().map_err(|e| NetError::io("local_addr", e))?;
                (Inner::Tcp(l), local)
            }
        };
        Ok(Listener { inner, opts, local })
    }

    /// The address it listens on, with the real port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits for the next peer and establishes the connection.
    ///
    /// # Errors
    /// [`NetError::Handshake`] for a peer that failed (the listener stays usable); the
    /// listener's own errors.
    pub fn accept(&self) -> Result<Conn> {
        self.accept_until(None)
    }

    /// As [`Listener::accept`], waiting at most `timeout` for a peer to arrive.
    ///
    /// # Errors
    /// [`NetError::Timeout`] when no peer came; as [`Listener::accept`].
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Conn> {
        self.accept_until(Some(Instant::now() + timeout))
    }

    fn accept_until(&self, deadline: Option<Instant>) -> Result<Conn> {
        let left = || match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => WAIT_SLICE,
        };
        let timed_out = || NetError::Timeout {
            op: "accept",
            millis: 0,
        };
        match &self.inner {
            Inner::Cm(id) => {
                let req = loop {
                    let id = id.lock().unwrap_or_else(|p| p.into_inner());
                    if left().is_zero() {
                        return Err(timed_out());
                    }
                    match id.get_request(left()) {
                        Ok(r) => break r,
                        Err(rsrdma::Error::Timeout { .. }) => continue,
                        Err(e) => return Err(e.into()),
                    }
                };
                let peer = req.id.peer_addr();
                establish::cm::accept(req, &self.opts)
                    .and_then(|est| Conn::start(est, &self.opts))
                    .map_err(|e| handshake_failed(peer, e))
            }
            Inner::Tcp(l) => {
                let (stream, peer) = loop {
                    match l.accept() {
                        Ok(s) => break s,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            if left().is_zero() {
                                return Err(timed_out());
                            }
                            wait_readable([Some(l.as_raw_fd())], Some(left()))
                                .map_err(|e| NetError::io("poll", e))?;
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(NetError::io("accept", e)),
                    }
                };
                establish::tcp::establish(stream, Role::Server, &self.opts)
                    .and_then(|est| Conn::start(est, &self.opts))
                    .map_err(|e| handshake_failed(Some(peer), e))
            }
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
