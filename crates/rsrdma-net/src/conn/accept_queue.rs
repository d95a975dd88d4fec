//! [`AcceptQueue`]: what a listener's handshake threads and its `accept` share, and the
//! accept loop itself, for both listeners (`Listener`'s `Conn`s, `RawListener`'s `RawConn`s).
//!
//! `accept` takes peers off the kernel's queue while [`Admission`] has room (or an unopened
//! handshake to shed), starts their handshakes, and returns the first good connection a
//! handshake thread finished; it sleeps in poll(2) on the listening socket (only while there
//! is room) and on a wake-up that every finished handshake rings.

use super::fdwait::{wait_readable, Wake};
use super::{Admission, Ticket};
use crate::error::{NetError, Result};
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What an error of accept(2) means for a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcceptError {
    /// One peer's own trouble (it left before it was taken, a firewall rule, a network error
    /// Linux passes on from the new socket, an interrupted call): look past it.
    Peer,
    /// The process or the system is out of descriptors or memory: the peer stays queued
    /// and the listening socket readable, so try again after a pause (a connection that
    /// closes meanwhile frees what the next one needs). Returning it would end a server's
    /// `loop { listener.accept()? }` for a condition that passes.
    Starved,
    /// The listening socket itself is broken: the caller's error.
    Listener,
}

impl AcceptError {
    /// Classifies `e` (accept(2)'s manual: the network errors are to be treated like EAGAIN).
    pub(crate) fn of(e: &std::io::Error) -> AcceptError {
        if e.kind() == ErrorKind::Interrupted {
            return AcceptError::Peer;
        }
        match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                AcceptError::Starved
            }
            Some(
                libc::ECONNABORTED
                | libc::EPERM
                | libc::EPROTO
                | libc::ENOPROTOOPT
                | libc::ENETDOWN
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::EHOSTUNREACH
                | libc::ENONET
                | libc::EOPNOTSUPP,
            ) => AcceptError::Peer,
            _ => AcceptError::Listener,
        }
    }
}

/// How long an `accept` out of descriptors or memory waits before it tries again (sooner
/// when one of its handshakes ends).
pub(crate) const STARVED_PAUSE: Duration = Duration::from_millis(100);

/// The next peer queued on the non-blocking `listener`, without waiting: `None` when none is.
/// A peer's own error ([`AcceptError::Peer`]) is looked past.
///
/// # Errors
/// [`NetError::Io`] naming `accept`: the listener's errors, and running out of descriptors
/// or memory ([`AcceptError::Starved`], which [`AcceptQueue::accept_until`] waits out).
pub(crate) fn take_tcp_peer(listener: &TcpListener) -> Result<Option<(TcpStream, SocketAddr)>> {
    loop {
        match listener.accept() {
            Ok(peer) => return Ok(Some(peer)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if AcceptError::of(&e) == AcceptError::Peer => {
                tracing::debug!(error = %e, "rsrdma-net listener: looked past a peer's accept error");
            }
            Err(e) => return Err(NetError::io("accept", e)),
        }
    }
}

/// Whether `e` is accept(2) running out of descriptors or memory.
fn out_of_resources(e: &NetError) -> bool {
    match e {
        NetError::Io {
            op: "accept",
            source,
        } => AcceptError::of(source) == AcceptError::Starved,
        // rdma_cm's path: a connect request's new event channel (or its events' read) needs
        // a descriptor too; out of them, it waits as the TCP path does.
        NetError::Verbs(v) => matches!(
            v.errno(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        ),
        _ => false,
    }
}

/// How many peers one look of `accept` takes off the kernel's queue at most before it hands
/// out a finished connection: a flood of dials cannot hold back one that is ready.
const TAKES_PER_LOOK: usize = 64;

/// What a listener does with a finished connection nobody will accept (the listener is
/// gone): the peer must hear an error, not a clean end.
pub(crate) trait Unaccepted {
    /// Ends it as refused.
    fn refuse(self);
}

/// Longest single wait inside an `accept` without a deadline.
const WAIT_SLICE: Duration = Duration::from_secs(3600);

/// Finished connections waiting for `accept`, and the admission of running handshakes.
pub(crate) struct AcceptQueue<T> {
    state: Mutex<Finished<T>>,
    /// Made readable when a handshake finishes.
    done: Wake,
    /// Held while an `accept` looks for room and takes peers: two accepts that both saw
    /// room for one more each took a peer, and the second peer, finding none left, was
    /// turned away (counted as shed) instead of waiting in the kernel's queue.
    taking: Mutex<()>,
    pub(crate) admission: Arc<Admission>,
}

struct Finished<T> {
    /// Good connections not yet accepted.
    ready: VecDeque<T>,
    /// The listener is gone: drop what finishes.
    closed: bool,
}

impl<T: Unaccepted> AcceptQueue<T> {
    /// An empty queue under `admission`.
    ///
    /// # Errors
    /// [`NetError::Io`] naming `eventfd`.
    pub(crate) fn new(admission: Arc<Admission>) -> Result<Arc<AcceptQueue<T>>> {
        Ok(Arc::new(AcceptQueue {
            state: Mutex::new(Finished {
                ready: VecDeque::new(),
                closed: false,
            }),
            done: Wake::new().map_err(|e| NetError::io("eventfd", e))?,
            taking: Mutex::new(()),
            admission,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Finished<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handshake thread's end: a good connection joins the queue (unless the listener is
    /// gone), a failure is logged and counted; `accept` wakes either way.
    pub(crate) fn finish(&self, ticket: Ticket, r: Result<T>) {
        let good = self.admission.outcome(ticket, r);
        let mut q = self.lock();
        let late = match good {
            Some(c) if !q.closed => {
                q.ready.push_back(c);
                None
            }
            // The listener is gone: the connection closes outside the lock (its close may
            // linger), so other handshakes' ends do not wait behind it.
            other => other,
        };
        drop(q);
        if let Some(c) = late {
            c.refuse();
        }
        self.done.wake();
    }

    /// The listener is gone: connections nobody accepted close now (outside the lock), and
    /// the handshakes still running end at once ([`Admission::close_all`]); what they
    /// finish with is dropped.
    pub(crate) fn close(&self) {
        let ready = {
            let mut q = self.lock();
            q.closed = true;
            std::mem::take(&mut q.ready)
        };
        self.admission.close_all();
        ready.into_iter().for_each(Unaccepted::refuse);
    }

    /// Waits for the next good connection until `deadline` (`timeout` is what the caller
    /// asked for, for the error's text). While admission has room, `take_one` is called to
    /// take one peer off `listen_fd` (without blocking) and start its handshake; it says
    /// whether it took one.
    ///
    /// When `take_one` finds the process out of descriptors or memory, `accept` waits
    /// [`STARVED_PAUSE`] (or until a handshake ends) and tries again, logging a warning once.
    ///
    /// # Errors
    /// [`NetError::Timeout`]; `take_one`'s errors; [`NetError::Io`] naming `poll`.
    pub(crate) fn accept_until(
        &self,
        listen_fd: RawFd,
        deadline: Option<Instant>,
        timeout: Duration,
        mut take_one: impl FnMut(usize) -> Result<bool>,
    ) -> Result<T> {
        let mut warned = false;
        loop {
            // Clear before looking, so a handshake that finishes after the look wakes the poll.
            self.done.clear();
            // Every peer already queued in the kernel starts its handshake (while there is
            // room) before a finished connection is handed out, so a burst of dials runs its
            // handshakes together. (Before: a finished handshake was returned first, and a
            // peer that arrived while it ran waited for the next call, its whole timeout
            // under a server that accepts rarely: a test hung on it under CI's load.)
            let mut room;
            let mut starved = false;
            let mut took = 0;
            let taking = self.taking.lock().unwrap_or_else(|p| p.into_inner());
            let failed_take = loop {
                let waiting = self.lock().ready.len();
                room = self.admission.has_room(waiting);
                if !room || took == TAKES_PER_LOOK {
                    break None;
                }
                match take_one(waiting) {
                    Ok(true) => took += 1,
                    Ok(false) => break None,
                    Err(e) if out_of_resources(&e) => {
                        if !warned {
                            tracing::warn!(error = %e, "rsrdma-net listener: accept waits for descriptors or memory");
                            warned = true;
                        }
                        starved = true;
                        break None;
                    }
                    Err(e) => break Some(e),
                }
            };
            drop(taking);
            {
                let mut q = self.lock();
                if let Some(c) = q.ready.pop_front() {
                    if !q.ready.is_empty() {
                        // Another caller may sleep on the wake just cleared.
                        self.done.wake();
                    }
                    drop(q);
                    self.admission.accepted();
                    // The listener's error, if any, comes again at the next call.
                    return Ok(c);
                }
            }
            if let Some(e) = failed_take {
                return Err(e);
            }
            let mut left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => WAIT_SLICE,
            };
            if left.is_zero() {
                return Err(NetError::Timeout {
                    op: "accept",
                    millis: crate::deadline::whole_millis(timeout),
                });
            }
            // Starved: the queued peer keeps the socket readable; wait on the handshakes
            // alone for a while.
            if starved {
                left = left.min(STARVED_PAUSE);
            }
            // Full: a handshake that stalls past its grace may make room.
            if !room {
                if let Some(at) = self.admission.next_stall() {
                    left = left.min(at.saturating_duration_since(Instant::now()));
                }
            }
            let listen = (room && !starved).then_some(listen_fd);
            wait_readable([listen, Some(self.done.raw())], Some(left))
                .map_err(|e| NetError::io("poll", e))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Unaccepted for u32 {
        fn refuse(self) {}
    }

    /// A queue with one finished connection (`7`).
    fn one_ready(max: usize) -> Arc<AcceptQueue<u32>> {
        let q = AcceptQueue::new(Admission::with_limits(max, max, Duration::from_secs(8))).unwrap();
        let ticket = q.admission.start(None, None, 0).unwrap();
        q.finish(ticket, Ok(7));
        q
    }

    /// A finished connection is handed out only once the peers already queued in the kernel
    /// started their handshakes (before: it was handed out first, and a peer queued behind
    /// it waited for the next `accept`).
    #[test]
    fn peers_already_queued_start_before_a_finished_connection_is_handed_out() {
        let q = one_ready(64);
        let mut queued = 3;
        let mut running = Vec::new();
        let c = q
            .accept_until(-1, None, Duration::ZERO, |waiting| {
                if queued == 0 {
                    return Ok(false);
                }
                queued -= 1;
                running.push(q.admission.start(None, None, waiting).unwrap());
                Ok(true)
            })
            .unwrap();
        assert_eq!((c, queued, running.len()), (7, 0, 3));
    }

    /// A flood of peers holds a finished connection back for one look at most.
    #[test]
    fn a_flood_of_peers_holds_a_finished_connection_back_for_one_look() {
        let q = one_ready(10 * TAKES_PER_LOOK);
        let mut running = Vec::new();
        let c = q
            .accept_until(-1, None, Duration::ZERO, |waiting| {
                running.push(q.admission.start(None, None, waiting).unwrap());
                Ok(true)
            })
            .unwrap();
        assert_eq!((c, running.len()), (7, TAKES_PER_LOOK));
    }

    /// Two accepts at once, one place: the second peer waits in the kernel's queue (before:
    /// both accepts saw room and took a peer, and the second was turned away).
    #[test]
    fn two_accepts_at_once_turn_no_peer_away() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let q =
            AcceptQueue::<u32>::new(Admission::with_limits(1, 1, Duration::from_secs(8))).unwrap();
        let queued = AtomicUsize::new(2);
        let turned_away = AtomicUsize::new(0);
        let running = Mutex::new(Vec::new());
        let accept = || {
            let limit = Duration::from_millis(300);
            let _ = q.accept_until(-1, Some(Instant::now() + limit), limit, |waiting| {
                if queued
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_err()
                {
                    return Ok(false);
                }
                // The other accept looks for room meanwhile.
                std::thread::sleep(Duration::from_millis(50));
                match q.admission.start(None, None, waiting) {
                    Some(t) => running.lock().unwrap().push(t),
                    None => _ = turned_away.fetch_add(1, Ordering::SeqCst),
                }
                Ok(true)
            });
        };
        std::thread::scope(|s| {
            s.spawn(accept);
            s.spawn(accept);
        });
        assert_eq!(turned_away.load(Ordering::SeqCst), 0);
        assert_eq!(queued.load(Ordering::SeqCst), 1, "one peer waits its turn");
    }

    /// A listener's error while a connection is ready hands the connection out first.
    #[test]
    fn a_ready_connection_comes_before_the_listeners_error() {
        let q = one_ready(64);
        let broken = || Err(NetError::InvalidArgument("the listener broke".into()));
        assert_eq!(
            q.accept_until(-1, None, Duration::ZERO, |_| broken())
                .unwrap(),
            7
        );
        let e = q
            .accept_until(-1, None, Duration::ZERO, |_| broken())
            .unwrap_err();
        assert!(e.to_string().contains("broke"), "{e}");
    }
}
