//! [`AsyncListener`]: accepts [`AsyncConn`]s on either establishment path.
//!
//! Waiting for a peer is on the reactor: the rdma_cm listener's event channel, or a tokio
//! `TcpListener`. The establishment of each accepted peer (creating the QP, posting the
//! receives, `rdma_accept` and its ESTABLISHED event, or the TCP handshake) runs on tokio's
//! blocking pool, because those rsrdma calls are synchronous; it is bounded by
//! [`ConnOptions::connect_timeout`]. A peer that fails it gives [`NetError::Handshake`] for
//! that peer only: call `accept` again.

use super::conn::AsyncConn;
use super::watch::Watch;
use crate::conn::{RecvMemory, RecvPools};
use crate::error::{NetError, Result};
use crate::{Conn, ConnOptions, Establish};
use rsrdma::cm::{CmEventType, CmId, ConnectRequest};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, PoisonError};

/// Pending connect requests the kernel queues.
const BACKLOG: i32 = 128;

#[derive(Debug)]
enum Inner {
    /// Field order is drop order: the watch deregisters before the id closes its fd.
    Cm {
        watch: Watch,
        // `CmId` is `Send` but not `Sync`: one task at a time takes its events.
        id: Mutex<CmId>,
    },
    Tcp(tokio::net::TcpListener),
}

/// A listener for [`AsyncConn`]s. Accepts peers dialing with [`AsyncConn::dial`] or the
/// blocking [`Conn::dial`].
#[derive(Debug)]
pub struct AsyncListener {
    inner: Inner,
    opts: ConnOptions,
    local: SocketAddr,
    /// The shared receive pool ([`ConnOptions::shared_recv`]), made when the first peer
    /// arrives, and the account of the connections' receive memory.
    recv: Arc<RecvPools>,
}

impl AsyncListener {
    /// Listens on `addr` (port 0 picks a free one), as [`crate::Listener::bind`]. Call it
    /// inside a tokio runtime with IO enabled.
    ///
    /// # Errors
    /// As [`crate::Listener::bind`]; [`NetError::Io`] when the reactor refuses the fd;
    /// [`NetError::InvalidArgument`] for [`ConnOptions::shared_recv`] (blocking listeners only).
    pub fn bind(addr: impl ToSocketAddrs, opts: ConnOptions) -> Result<AsyncListener> {
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
                // SAFETY: the id owns the fd and lives in the same variant, declared after
                // the watch, so the watch is dropped (deregistered) first.
                let watch = unsafe { Watch::new(id.as_raw_fd()) }
                    .map_err(|e| NetError::io("register with the tokio reactor", e))?;
                let id = Mutex::new(id);
                (Inner::Cm { watch, id }, local)
            }
            Establish::Tcp => {
                let l = std::net::TcpListener::bind(addr).map_err(|e| NetError::io("bind", e))?;
                l.set_nonblocking(true)
                    .map_err(|e| NetError::io("set_nonblocking", e))?;
                let l = tokio::net::TcpListener::from_std(l)
                    .map_err(|e| NetError::io("register with the tokio reactor", e))?;
                let local = l.local_addr().map_err(|e| NetError::io("local_addr", e))?;
                (Inner::Tcp(l), local)
            }
        };
        let recv = Arc::new(RecvPools::new(opts.shared_recv));
        Ok(AsyncListener {
            inner,
            opts,
            local,
            recv,
        })
    }

    /// The address it listens on, with the real port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Registered receive memory of this listener's connections now, as
    /// [`Listener::recv_memory`](crate::Listener::recv_memory): the shared pool
    /// ([`ConnOptions::shared_recv`]) and what each accepted connection alive holds itself.
    pub fn recv_memory(&self) -> RecvMemory {
        self.recv.memory()
    }

    /// Waits for the next peer and establishes the connection. Several tasks may call it at
    /// once (share the listener in an `Arc`): their establishments then overlap, where one
    /// task's accept loop establishes one peer at a time.
    ///
    /// Cancel-safe while it waits for a peer (no request is taken). Once a request is taken,
    /// dropping the future lets the establishment finish on the blocking pool and closes
    /// that connection (the peer sees it end).
    ///
    /// # Errors
    /// [`NetError::Handshake`] for a peer that failed (the listener stays usable); the
    /// listener's own errors.
    pub async fn accept(&self) -> Result<AsyncConn> {
        let opts = self.opts.clone();
        let (peer, built) = match &self.inner {
            Inner::Cm { watch, id } => {
                let req = next_request(watch, id).await?;
                let peer = req.id.peer_addr();
                let pools = self.recv.clone();
                let built =
                    blocking(move || Conn::accept_cm_threadless(req, &opts, &pools)).await?;
                (peer, built)
            }
            Inner::Tcp(l) => {
                let (stream, peer) = l.accept().await.map_err(|e| NetError::io("accept", e))?;
                let stream = stream
                    .into_std()
                    .map_err(|e| NetError::io("deregister the accepted socket", e))?;
                let pools = self.recv.clone();
                let built =
                    blocking(move || Conn::accept_tcp_threadless(stream, &opts, &pools)).await?;
                (Some(peer), built)
            }
        };
        built
            .and_then(|c| AsyncConn::start(c, &self.opts))
            .map_err(|e| handshake_failed(peer, e))
    }
}

/// Takes the next connect request off the listener's channel, waiting on the reactor.
async fn next_request(watch: &Watch, id: &Mutex<CmId>) -> Result<ConnectRequest> {
    loop {
        let ev = id
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .try_next_event()?;
        let Some(ev) = ev else {
            watch
                .readable()
                .await
                .map_err(|e| NetError::io("wait for a connect request", e))?;
            continue;
        };
        match (ev.kind, ev.request) {
            (CmEventType::CONNECT_REQUEST, Some(req)) => return Ok(req),
            (CmEventType::DEVICE_REMOVAL, _) => {
                return Err(NetError::io(
                    "wait for a connect request",
                    io::Error::new(io::ErrorKind::NotFound, "the RDMA device was removed"),
                ))
            }
            // No other event carries a new id, so skipping one leaks nothing.
            (kind, _) => tracing::debug!(event = %kind, "async listener skipped an event"),
        }
    }
}

/// Runs a blocking establishment on tokio's blocking pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NetError::io("establish on the blocking pool", e.into()))
}

fn handshake_failed(peer: Option<SocketAddr>, e: NetError) -> NetError {
    let peer = peer.map_or_else(|| "an unknown peer".to_string(), |p| p.to_string());
    tracing::debug!(%peer, error = %e, "rsrdma-net async listener: a handshake failed");
    NetError::Handshake {
        peer,
        source: Box::new(e),
    }
}
