//! [`AsyncListener`]: accepts [`AsyncConn`]s on either establishment path.
//!
//! Waiting for a peer is on the reactor: the rdma_cm listener's event channel, or a tokio
//! `TcpListener`. The establishment of each accepted peer (creating the QP, posting the
//! receives, `rdma_accept` and its ESTABLISHED event, or the TCP handshake) runs on tokio's
//! blocking pool, because those rsrdma calls are synchronous; it is bounded by
//! [`ConnOptions::connect_timeout`]. Establishments run concurrently, under the same
//! admission rules as the blocking listener (bounds in all and per source, shedding of
//! unopened handshakes, [`ConnOptions::opening_timeout`]), so one `accept` loop serves good
//! clients while silent or garbage sockets come and go. A peer that fails is logged and
//! counted ([`AsyncListener::counters`]), never returned.

use super::conn::AsyncConn;
use super::watch::Watch;
use crate::conn::{
    AcceptError, Admission, Incoming, ListenerCounters, RecvMemory, RecvPools, Ticket,
    STARVED_PAUSE,
};
use crate::error::{NetError, Result};
use crate::{Conn, ConnOptions, Establish};
use rsrdma::cm::{CmEventType, CmId, ConnectRequest};
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Instant;
use tokio::sync::mpsc;

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
    admission: Arc<Admission>,
    /// Where establishments on the blocking pool report; one `accept` at a time takes them
    /// (the lock is held across its waits, so concurrent callers queue instead of losing
    /// wake-ups).
    finished: tokio::sync::Mutex<Accepting>,
    report: mpsc::UnboundedSender<Finished>,
    /// A full listener's wait for a handshake to become sheddable: one blocking-pool thread
    /// sleeps it at a time (an `accept` cancelled meanwhile leaves no sleeper behind it to
    /// pile up), and wakes whoever accepts then.
    stall_sleeper: Arc<std::sync::atomic::AtomicBool>,
    stall_wake: Arc<tokio::sync::Notify>,
}

/// What `accept` callers take turns on.
#[derive(Debug)]
struct Accepting {
    finished: mpsc::UnboundedReceiver<Finished>,
    /// A peer taken off the socket while every place was held by opened handshakes: it
    /// waits here for a place (one ending, or one stalling past its grace), not dropped.
    parked: Option<Incoming>,
}

/// An establishment's outcome, with its place in the admission table.
#[derive(Debug)]
struct Finished {
    ticket: Ticket,
    /// Started already: its keeper answers the peer's keepalives while it waits here.
    result: Result<AsyncConn>,
}

impl AsyncListener {
    /// Listens on `addr` (port 0 picks a free one), as [`crate::Listener::bind`], a shared
    /// receive pool ([`ConnOptions::shared_recv`]) included. Call it inside a tokio runtime
    /// with IO enabled.
    ///
    /// # Errors
    /// As [`crate::Listener::bind`]; [`NetError::Io`] when the reactor refuses the fd, and
    /// outside a tokio runtime or in one built without IO.
    ///
    /// # Panics
    /// In a runtime built without IO, when the program is built with `panic = "abort"`
    /// (tokio's own panic, which the error above is caught from otherwise).
    pub fn bind(addr: impl ToSocketAddrs, opts: ConnOptions) -> Result<AsyncListener> {
        // The blocking listener's checks (they were left out here: a listener whose options
        // its device refuses bound, and its accept never returned: an outside tester's find).
        let addr = crate::conn::checked_for_listening(addr, &opts)?;
        let (inner, local) = match opts.establish {
            Establish::Cm => {
                let id = crate::conn::cm_listener(addr, &opts)?;
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
                let l = super::watch::with_reactor(|| tokio::net::TcpListener::from_std(l))
                    .map_err(|e| NetError::io("register with the tokio reactor", e))?;
                let local = l.local_addr().map_err(|e| NetError::io("local_addr", e))?;
                (Inner::Tcp(l), local)
            }
        };
        let recv = Arc::new(RecvPools::new(opts.shared_recv));
        let (report, finished) = mpsc::unbounded_channel();
        Ok(AsyncListener {
            inner,
            admission: Admission::new(&opts),
            opts,
            local,
            recv,
            finished: tokio::sync::Mutex::new(Accepting {
                finished,
                parked: None,
            }),
            report,
            stall_sleeper: Arc::default(),
            stall_wake: Arc::default(),
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

    /// What this listener has done with its peers, as [`crate::Listener::counters`].
    pub fn counters(&self) -> ListenerCounters {
        self.admission.counters()
    }

    /// Waits for the next good connection. Establishments run concurrently on the blocking
    /// pool (see the module docs); peers that fail are skipped, so
    /// `loop { let c = listener.accept().await?; tokio::spawn(serve(c)); }` keeps serving.
    /// Several tasks may call it at once (share the listener in an `Arc`); they take turns.
    ///
    /// Cancel-safe: establishments started go on, and a later `accept` returns them.
    ///
    /// # Errors
    /// The listener's own errors only (the socket, the rdma_cm id); never a peer's.
    pub async fn accept(&self) -> Result<AsyncConn> {
        let mut accepting = self.finished.lock().await;
        loop {
            if let Some(peer) = accepting.parked.take() {
                accepting.parked = self.start(peer);
            }
            let room = accepting.parked.is_none() && self.admission.has_room(0);
            let next = {
                let done = pin!(accepting.finished.recv());
                let peer = pin!(async {
                    match room {
                        true => Some(self.next_peer().await),
                        // Full of opened handshakes: wait for one to finish, or to stall
                        // past its grace (it may then be shed; look again). A blocking-pool
                        // thread sleeps, as the runtime may have no timer.
                        false => match self.admission.next_stall() {
                            Some(at) => {
                                self.sleep_until_stall(at);
                                self.stall_wake.notified().await;
                                None
                            }
                            None => std::future::pending().await,
                        },
                    }
                });
                first(done, peer).await
            };
            match next {
                Either::Left(Some(Finished { ticket, result })) => {
                    let Some(c) = self.admission.outcome(ticket, result) else {
                        continue;
                    };
                    self.admission.accepted();
                    return Ok(c);
                }
                // The sender lives in `self`.
                Either::Left(None) => unreachable!("the listener holds a sender"),
                Either::Right(Some(peer)) => accepting.parked = self.start(peer?),
                Either::Right(None) => {}
            }
        }
    }

    /// Starts the one sleeper that wakes `stall_wake` at `at` (or a little
    /// later, when one already sleeps to a later time: the wait is bounded by a grace).
    fn sleep_until_stall(&self, at: Instant) {
        use std::sync::atomic::Ordering;
        if self.stall_sleeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let (sleeping, wake) = (self.stall_sleeper.clone(), self.stall_wake.clone());
        let pause = at.saturating_duration_since(Instant::now());
        drop(tokio::task::spawn_blocking(move || {
            std::thread::sleep(pause);
            sleeping.store(false, Ordering::Release);
            wake.notify_one();
        }));
    }

    /// The next peer off the listener, waiting on the reactor.
    async fn next_peer(&self) -> Result<Incoming> {
        match &self.inner {
            Inner::Cm { watch, id } => Ok(Incoming::Cm(next_request(watch, id).await?)),
            Inner::Tcp(l) => {
                let mut warned = false;
                loop {
                    // As the blocking listener: a peer's own error is looked past, and running
                    // out of descriptors or memory is waited out (see `AcceptError`).
                    let e = match l.accept().await {
                        Ok((stream, peer)) => match stream.into_std() {
                            Ok(stream) => return Ok(Incoming::Tcp(stream, peer)),
                            Err(e) => {
                                tracing::debug!(error = %e, "rsrdma-net async listener: a peer's socket could not leave the reactor");
                                continue;
                            }
                        },
                        Err(e) => e,
                    };
                    match AcceptError::of(&e) {
                        AcceptError::Peer => {
                            tracing::debug!(error = %e, "rsrdma-net async listener: looked past a peer's accept error");
                        }
                        AcceptError::Starved => {
                            if !std::mem::replace(&mut warned, true) {
                                tracing::warn!(error = %e, "rsrdma-net async listener: accept waits for descriptors or memory");
                            }
                            // A pause with no timer (the runtime may have none, or a paused
                            // clock): a blocking-pool thread sleeps it. `accept` races this
                            // with its handshakes' ends, which free descriptors sooner.
                            let _ =
                                tokio::task::spawn_blocking(|| std::thread::sleep(STARVED_PAUSE))
                                    .await;
                        }
                        AcceptError::Listener => return Err(NetError::io("accept", e)),
                    }
                }
            }
        }
    }

    /// Starts `peer`'s establishment on the blocking pool, when admission gives it a place;
    /// else hands it back, to wait for one.
    fn start(&self, peer: Incoming) -> Option<Incoming> {
        let Some(ticket) = self.admission.place_for(&peer, 0) else {
            return Some(peer);
        };
        let (opts, pools, report) = (self.opts.clone(), self.recv.clone(), self.report.clone());
        let runtime = tokio::runtime::Handle::current();
        // The task is not awaited: its report wakes `accept`, and a listener dropped
        // meanwhile drops the connection on the blocking pool.
        drop(tokio::task::spawn_blocking(move || {
            let result = match peer {
                // Its ticket says it opened from the start (`Admission::start_incoming`).
                Incoming::Cm(req) => {
                    Conn::accept_cm_threadless(req, &opts, &pools, &ticket.standing())
                }
                Incoming::Tcp(stream, _) => {
                    Conn::accept_tcp_threadless(stream, &opts, &pools, ticket.standing())
                }
            };
            // Started at once, not when an `accept` takes it: a connection waiting for its
            // accept (behind an earlier one, or a timed-out accept) answers its peer's
            // keepalives, where one left idle was declared dead after `peer_timeout`. A
            // start that fails drops the connection here, on the blocking pool.
            let result = result.and_then(|c| {
                let _in_runtime = runtime.enter();
                AsyncConn::start(c, &opts)
            });
            // A listener dropped meanwhile has closed its end: what it never handed out is
            // refused, as the blocking listener refuses it.
            if let Err(mpsc::error::SendError(late)) = report.send(Finished { ticket, result }) {
                late.refuse();
            }
        }));
        None
    }
}

impl Drop for AsyncListener {
    fn drop(&mut self) {
        // Handshakes still running on the blocking pool end at once (their sockets shut
        // down) instead of holding their threads until their own timeouts.
        self.admission.close_all();
        // Connections nobody accepted are refused (their dialers' reads fail), not closed
        // cleanly: an end-of-stream would say this side read what it was sent. Closed first,
        // so that an establishment finishing meanwhile finds the channel gone and refuses
        // its connection itself.
        let finished = &mut self.finished.get_mut().finished;
        finished.close();
        while let Ok(f) = finished.try_recv() {
            f.refuse();
        }
        // Requests nobody took are refused with the reason.
        if let Inner::Cm { id, .. } = &self.inner {
            crate::conn::refuse_waiting_requests(
                &id.lock().unwrap_or_else(PoisonError::into_inner),
            );
        }
    }
}

impl Finished {
    /// The listener is gone: a connection it never handed out is refused.
    fn refuse(self) {
        if let Ok(c) = self.result {
            crate::conn::Unaccepted::refuse(c);
        }
    }
}

impl crate::conn::Unaccepted for AsyncConn {
    fn refuse(self) {
        self.d.refuse();
    }
}

enum Either<A, B> {
    Left(A),
    Right(B),
}

/// Whichever of two futures is ready first (the other is dropped; both used here are
/// cancel-safe).
async fn first<A: Future, B: Future>(
    mut a: std::pin::Pin<&mut A>,
    mut b: std::pin::Pin<&mut B>,
) -> Either<A::Output, B::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(x) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::Left(x));
        }
        if let Poll::Ready(y) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Right(y));
        }
        Poll::Pending
    })
    .await
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
