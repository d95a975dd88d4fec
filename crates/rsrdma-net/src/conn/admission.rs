//! Admission: how a listener keeps serving while some peers misbehave.
//!
//! Every peer taken off the kernel's queue gets a [`Ticket`] before its handshake starts.
//! The table of running handshakes is bounded in all ([`ConnOptions::max_handshakes`]).
//! When a new peer finds it full, a handshake that has not yet *opened* (proven the secret
//! when there is one; without one, sent a valid hello and then its first step of the
//! handshake) and has had its chance to (an eighth of the opening timeout,
//! [`YOUNG_DIVISOR`]) is shed: its socket is shut down, which ends its handshake at once.
//! Younger ones are left alone, so a burst of good dials past the bound waits in the
//! kernel's queue rather than shedding its own members. The
//! victim is the oldest unopened handshake of a source that holds at least
//! [`ConnOptions::max_handshakes_per_source`] unopened ones (the greediest such source),
//! else the oldest unopened one of all. Below the total nothing is shed: a host that opens
//! many good connections at once (a client's pool) is never turned away for its address.
//! Peers that opened are not shed for unopened ones, so a flood of silent or garbage sockets
//! cannot push out a good client that has started, and it cannot hold the listener for
//! longer than [`ConnOptions::opening_timeout`] either.
//!
//! A peer that proved the secret is never shed. Without a secret, though, a well-formed
//! endpoint proves nothing: anyone can send one and then stop, holding a place, a queue pair
//! and memory until the handshake's timeout. So when no unopened handshake is left to shed,
//! an unproven one that has kept the server waiting for its next step longer than
//! [`STALL_GRACE_DIVISOR`]'s share of the opening timeout goes (the one stalled longest). A
//! real peer answers within a round trip and its queue pair's bring-up, so a burst of good
//! clients is not shed for one another; the accept loops wake when a stall's grace ends.
//!
//! A handshake that fails is reported through `tracing` and counted
//! ([`ListenerCounters::failed`]); `accept` only ever hands out good connections.

use super::options::ConnOptions;
use crate::error::{NetError, Result};
use crate::handshake::Standing;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An unproven peer (no secret) that keeps the server waiting longer than the opening
/// timeout divided by this may be shed for a new peer when the listener is full.
pub(crate) const STALL_GRACE_DIVISOR: u32 = 4;

/// An unopened handshake younger than the opening timeout divided by this is not shed: a
/// good client needs a round trip or two to open, and a burst of them past the listener's
/// bound would otherwise shed its own members (they wait in the kernel's queue instead). A
/// client whose round trip is longer than that (375 ms by default: an RDMA fabric's are
/// micro- to milliseconds) may still be shed in a burst: give such links a longer opening
/// timeout. Longer youth would let floods of silent sockets hold places longer.
pub(crate) const YOUNG_DIVISOR: u32 = 8;

/// What a listener has done with its peers so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerCounters {
    /// Connections handed out by `accept`.
    pub accepted: u64,
    /// Peers whose handshake failed (garbage, silence past the opening timeout, a wrong
    /// secret, options that do not match): each is also logged with `tracing` at WARN.
    pub failed: u64,
    /// Peers dropped before their handshake opened, to make room for newer ones.
    pub shed: u64,
}

/// A peer taken off a listener's queue (either path), before its handshake.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// An rdma_cm connect request.
    Cm(rsrdma::cm::ConnectRequest),
    /// A TCP connection and where it comes from.
    Tcp(TcpStream, SocketAddr),
}

/// Why a peer is refused when every running handshake has opened and none may be shed.
const NO_ROOM: &str = "too many handshakes at once (max_handshakes), every one of them opened: \
                       no room for this one; try again";

impl Incoming {
    /// Tells a peer refused for want of room why (best effort, never waiting), so that its
    /// dial fails with the reason rather than with "peer closed during hello": a TCP peer
    /// gets an abort frame (into a fresh socket's empty send buffer, then the end of the
    /// stream), an rdma_cm peer a reject that carries the reason.
    fn refuse_for_want_of_room(&self) {
        match self {
            Incoming::Cm(req) => {
                let _ = req.id.reject(&super::establish::cm::reject_data(NO_ROOM));
            }
            Incoming::Tcp(s, _) => {
                let Ok(frame) = crate::handshake::codec::Message::abort(NO_ROOM).to_bytes() else {
                    return;
                };
                if s.set_nonblocking(true).is_ok() {
                    let mut w: &TcpStream = s;
                    let _ = std::io::Write::write_all(&mut w, &frame);
                    let _ = s.shutdown(Shutdown::Write);
                }
            }
        }
    }

    /// Where the peer comes from, when known.
    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Incoming::Cm(req) => req.id.peer_addr(),
            Incoming::Tcp(_, addr) => Some(*addr),
        }
    }
}

/// The running handshakes of one listener, and its counters.
#[derive(Debug)]
pub(crate) struct Admission {
    table: Mutex<Table>,
    max: usize,
    per_source: usize,
    /// How long an opened, unproven peer may keep the server waiting before it may be shed.
    stall_grace: Duration,
    /// How long an unopened handshake has to open before it may be shed.
    young: Duration,
    accepted: AtomicU64,
    /// Shared with each handshake's [`Standing`], which counts its own failure before it
    /// tells its peer.
    failed: Arc<AtomicU64>,
    shed: AtomicU64,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// Oldest first.
    running: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    source: Option<IpAddr>,
    /// A second handle on a TCP peer's socket, to shut it down when it is shed.
    socket: Option<TcpStream>,
    standing: Arc<Standing>,
    shed: Arc<AtomicBool>,
    /// When it started: an unopened handshake is shed only once it had its chance.
    started: Instant,
}

/// One running handshake's place in the table; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Ticket {
    id: u64,
    peer: Option<SocketAddr>,
    admission: Arc<Admission>,
    standing: Arc<Standing>,
    shed: Arc<AtomicBool>,
}

impl Ticket {
    /// Moved on by the handshake (see [`Standing`]): once the peer has opened, it is shed
    /// only if unproven and stalled.
    pub(crate) fn standing(&self) -> Arc<Standing> {
        self.standing.clone()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admission.lock().running.retain(|e| e.id != self.id);
    }
}

impl Admission {
    pub(crate) fn new(opts: &ConnOptions) -> Arc<Admission> {
        Admission::with_limits(
            opts.max_handshakes,
            opts.max_handshakes_per_source,
            opts.opening_timeout,
        )
    }

    /// An admission table of at most `max` handshakes, `per_source` from one address, whose
    /// peers have `opening` to open.
    pub(crate) fn with_limits(max: usize, per_source: usize, opening: Duration) -> Arc<Admission> {
        Arc::new(Admission {
            table: Mutex::new(Table::default()),
            max: max.max(1),
            per_source: per_source.max(1),
            stall_grace: opening / STALL_GRACE_DIVISOR,
            young: opening / YOUNG_DIVISOR,
            accepted: AtomicU64::new(0),
            failed: Arc::new(AtomicU64::new(0)),
            shed: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a new peer could start now, with `waiting` finished connections not yet
    /// accepted counting against the bound: there is room, or a handshake to shed.
    pub(crate) fn has_room(&self, waiting: usize) -> bool {
        let t = self.lock();
        let now = Instant::now();
        t.running.len() + waiting < self.max
            || t.running
                .iter()
                .any(|e| self.sheddable_at(e, now).is_some_and(|at| at <= now))
    }

    /// When a running handshake becomes one a new peer may shed (an unopened one once it
    /// is no longer young, an opened and unproven one once it stalls past its grace): a full
    /// listener's accept loop wakes then.
    pub(crate) fn next_stall(&self) -> Option<Instant> {
        let t = self.lock();
        let now = Instant::now();
        t.running
            .iter()
            .filter_map(|e| self.sheddable_at(e, now))
            .min()
    }

    /// From when `e` may be shed, if ever (as it stands now); for an opened, unproven peer
    /// whose server is busy with its own part (not yet waiting for the peer), a time to look
    /// again: it waits soon, and may stall then (nothing else would wake a full listener's
    /// accept loop for it).
    fn sheddable_at(&self, e: &Entry, now: Instant) -> Option<Instant> {
        if e.unopened() {
            return Some(e.started + self.young);
        }
        match e.standing.stalls_at(self.stall_grace) {
            Some(at) => Some(at),
            None if e.standing.unproven() => Some(now + self.stall_grace),
            None => None,
        }
    }

    /// A place for `peer`'s handshake, shedding the oldest unopened handshake (of the same
    /// source first) when a bound is reached; `None` when every running handshake has
    /// opened and there is no room (counted as shed: the caller drops the peer).
    pub(crate) fn start(
        self: &Arc<Self>,
        peer: Option<SocketAddr>,
        socket: Option<&TcpStream>,
        waiting: usize,
    ) -> Option<Ticket> {
        let t = self.start_entry(peer, socket, waiting, false);
        if t.is_none() {
            self.count_shed(peer, "no room: every running handshake has opened");
        }
        t
    }

    /// [`Admission::start`], for a peer that opened already (`opened`) or not yet.
    fn start_entry(
        self: &Arc<Self>,
        peer: Option<SocketAddr>,
        socket: Option<&TcpStream>,
        waiting: usize,
        opened: bool,
    ) -> Option<Ticket> {
        let source = peer.map(|p| p.ip());
        let mut t = self.lock();
        loop {
            if t.running.len() + waiting < self.max {
                break;
            }
            let i = self.victim(&t.running)?;
            let old = t.running.remove(i);
            // Counted before the peer can hear of it: whoever it tells may read the counters
            // at once (a test did, under CI's load, and read 0).
            self.shed.fetch_add(1, Ordering::Relaxed);
            old.shed();
            tracing::debug!(source = ?old.source, opened = old.standing.opened(), "listener shed a handshake");
        }
        let id = t.next_id;
        t.next_id += 1;
        let failures = self.failed.clone();
        let standing = Arc::new(match opened {
            true => Standing::proven(failures),
            false => Standing::counting_into(failures),
        });
        let shed = Arc::new(AtomicBool::new(false));
        t.running.push(Entry {
            id,
            source,
            socket: socket.and_then(|s| s.try_clone().ok()),
            standing: standing.clone(),
            shed: shed.clone(),
            started: Instant::now(),
        });
        Some(Ticket {
            id,
            peer,
            admission: self.clone(),
            standing,
            shed,
        })
    }

    /// Which running handshake a full table sheds, if any: the greediest source past its
    /// bound of unopened handshakes (what silent or garbage sockets hold) loses its oldest
    /// one, else the oldest unopened one goes, else the unproven one stalled longest past
    /// its grace. Peers that proved a secret, and rdma_cm requests, are never shed.
    fn victim(&self, running: &[Entry]) -> Option<usize> {
        let now = Instant::now();
        let due = |e: &Entry| self.sheddable_at(e, now).is_some_and(|at| at <= now);
        let old_enough = |e: &Entry| e.unopened() && due(e);
        let greedy = running
            .iter()
            .filter(|e| e.unopened())
            .map(|e| {
                let n = running
                    .iter()
                    .filter(|o| o.source == e.source && o.unopened())
                    .count();
                (n, e.source)
            })
            .filter(|&(n, _)| n >= self.per_source)
            .max_by_key(|&(n, _)| n)
            .map(|(_, s)| s);
        greedy
            .and_then(|s| running.iter().position(|e| e.source == s && old_enough(e)))
            .or_else(|| running.iter().position(old_enough))
            .or_else(|| {
                // The opened one stalled longest.
                running
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| !e.unopened())
                    .filter_map(|(i, e)| Some((self.sheddable_at(e, now)?, i)))
                    .filter(|&(at, _)| at <= now)
                    .min()
                    .map(|(_, i)| i)
            })
    }

    /// The listener is gone: every handshake still running ends at once (its socket is shut
    /// down, as a shed one's is) rather than holding its thread, socket and device resources
    /// until its own timeout (for ever with an unbounded one), for a result nobody takes.
    /// rdma_cm handshakes have no socket: they end at their own timeout.
    pub(crate) fn close_all(&self) {
        let t = self.lock();
        for e in &t.running {
            // Told as a close, not as a want of room (marked before the shed is seen).
            e.standing.close();
            e.shed();
        }
    }

    /// [`Admission::start`] for an incoming peer: its source, and its socket to shut down if
    /// it is shed (an rdma_cm request has none). A peer refused for want of room is counted
    /// as shed (the caller drops it).
    pub(crate) fn start_incoming(
        self: &Arc<Self>,
        peer: &Incoming,
        waiting: usize,
    ) -> Option<Ticket> {
        let t = self.place_for(peer, waiting);
        if t.is_none() {
            // Counted before the peer can hear of it (see `start_entry`).
            self.count_shed(
                peer.peer_addr(),
                "no room: every running handshake has opened",
            );
            peer.refuse_for_want_of_room();
        }
        t
    }

    /// [`Admission::start_incoming`], except that a refused peer is not counted: the caller
    /// keeps it until there is room.
    pub(crate) fn place_for(self: &Arc<Self>, peer: &Incoming, waiting: usize) -> Option<Ticket> {
        match peer {
            // The connect request carried the peer's announcement: it opened, from the start
            // (and it has no socket that shedding could shut down).
            // (Marked later, on the handshake's thread, it could be shed meanwhile: shedding
            // stops nothing of an rdma_cm handshake, which then went past the bounds.)
            Incoming::Cm(req) => self.start_entry(req.id.peer_addr(), None, waiting, true),
            Incoming::Tcp(s, addr) => self.start_entry(Some(*addr), Some(s), waiting, false),
        }
    }

    fn count_shed(&self, peer: Option<SocketAddr>, why: &str) {
        self.shed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(?peer, why, "listener shed a peer");
    }

    /// Takes a finished handshake's outcome: a good connection comes back; a failure is
    /// logged and counted (a shed one only counted, when it was shed).
    pub(crate) fn outcome<T>(&self, ticket: Ticket, r: Result<T>) -> Option<T> {
        match r {
            Ok(c) => Some(c),
            Err(_) if ticket.shed.load(Ordering::Acquire) => None,
            Err(e) => {
                self.ticket_failed(&ticket, &e);
                None
            }
        }
    }

    /// Counts (unless its handshake counted itself before telling the peer) and logs a
    /// ticket's failed handshake.
    pub(crate) fn ticket_failed(&self, ticket: &Ticket, e: &NetError) {
        if ticket.standing.failure_counted() {
            log_failure(ticket.peer, e);
        } else {
            self.failed(ticket.peer, e);
        }
    }

    /// Counts and logs a peer that failed after its handshake (say, the async start).
    pub(crate) fn failed(&self, peer: Option<SocketAddr>, e: &NetError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        log_failure(peer, e);
    }

    /// Counts a connection handed out.
    pub(crate) fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection counted as handed out failed its last step before the caller got it
    /// (the grant of its remote access): counted and logged as a failed peer instead.
    pub(crate) fn accepted_then_failed(&self, e: &NetError) {
        self.accepted.fetch_sub(1, Ordering::Relaxed);
        self.failed(None, e);
    }

    pub(crate) fn counters(&self) -> ListenerCounters {
        ListenerCounters {
            accepted: self.accepted.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            shed: self.shed.load(Ordering::Relaxed),
        }
    }
}

fn log_failure(peer: Option<SocketAddr>, e: &NetError) {
    let peer = peer.map_or_else(|| "an unknown peer".to_string(), |p| p.to_string());
    tracing::warn!(%peer, error = %e, "rsrdma-net listener: a peer failed its handshake");
}

impl Entry {
    fn unopened(&self) -> bool {
        !self.standing.opened()
    }

    /// Marks the handshake shed (its failure is then no one's news) and shuts its socket
    /// down, which ends its waits at once (it reads the end of the stream).
    fn shed(&self) {
        self.shed.store(true, Ordering::Release);
        self.standing.shed();
        // The reading end only: the handshake's wait wakes (it reads the end of the stream),
        // tells the peer why, and ends; its socket then closes.
        if let Some(s) = &self.socket {
            let _ = s.shutdown(Shutdown::Read);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn addr(ip: [u8; 4], port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from((ip, port)))
    }

    #[test]
    fn the_oldest_unopened_handshake_of_a_source_is_shed_never_an_opened_one() {
        // No youth: an unopened handshake may be shed at once.
        let a = Admission::with_limits(4, 2, Duration::ZERO);
        let t1 = a.start(addr([10, 0, 0, 1], 1), None, 0).unwrap();
        t1.standing().open(true);
        let t2 = a.start(addr([10, 0, 0, 1], 2), None, 0).unwrap();
        let t3 = a.start(addr([10, 0, 0, 1], 3), None, 0).unwrap();
        // Below the total, a source may have more unopened ones than its bound: nobody goes.
        let t4 = a.start(addr([10, 0, 0, 1], 4), None, 0).unwrap();
        assert_eq!(a.counters().shed, 0);
        // Full (t1 to t4): the source past its bound (three unopened) loses its oldest
        // unopened one (t2); t1 (opened) stays.
        let t5 = a.start(addr([10, 0, 0, 2], 5), None, 0).unwrap();
        assert!(t2.shed.load(Ordering::Acquire));
        assert!(!t1.shed.load(Ordering::Acquire));
        // Full again: that source still holds two unopened (its bound): t3 goes, not t5 of
        // the other source, though t5 is unopened too.
        let t6 = a.start(addr([10, 0, 0, 3], 6), None, 0).unwrap();
        assert!(t3.shed.load(Ordering::Acquire));
        assert!(!t5.shed.load(Ordering::Acquire));
        // Everything running has opened and the total is reached: no room, the peer is
        // refused.
        for t in [&t4, &t5, &t6] {
            t.standing().open(true);
        }
        assert!(!a.has_room(0));
        assert!(a.start(addr([10, 0, 0, 4], 7), None, 0).is_none());
        assert_eq!(a.counters().shed, 3);
        drop((t1, t2, t3));
        assert!(a.has_room(0));
    }

    /// Peers that opened do not count against their source's bound: one host opening many
    /// good connections at once (64 rdma_cm clients of a test, a client pool) is not refused.
    #[test]
    fn opened_handshakes_count_only_against_the_total() {
        let a = Admission::with_limits(8, 1, Duration::ZERO);
        let held: Vec<_> = (0..8)
            .map(|i| {
                let t = a.start(addr([10, 0, 0, 1], i), None, 0).unwrap();
                t.standing().open(true);
                t
            })
            .collect();
        assert!(held.iter().all(|t| !t.shed.load(Ordering::Acquire)));
        assert_eq!(a.counters().shed, 0);
        assert!(!a.has_room(0), "the total still bounds them");
    }

    #[test]
    fn a_peer_that_opened_from_the_start_is_never_shed() {
        let a = Admission::with_limits(2, 16, Duration::ZERO);
        let peer: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let _cm = a.start_entry(Some(peer), None, 0, true).unwrap();
        let _tcp = a.start(Some(peer), None, 0).unwrap();
        // Full: the unopened one goes, the opened one stays.
        let _next = a.start(Some(peer), None, 0).unwrap();
        assert!(!_cm.shed.load(Ordering::Acquire));
        assert!(_tcp.shed.load(Ordering::Acquire));
        assert_eq!(a.counters().shed, 1);
    }

    /// Without a secret, an opened peer is shed only after the unopened ones, and only while
    /// it has kept the server waiting past its grace (the one stalled longest first); one that
    /// proved a secret never is.
    #[test]
    fn an_unproven_peer_is_shed_only_when_it_stalls_past_its_grace() {
        let opening = Duration::from_millis(800);
        let grace = opening / STALL_GRACE_DIVISOR;
        let a = Admission::with_limits(4, 16, opening);
        let peer = addr([10, 0, 0, 1], 1);
        let proven = a.start(peer, None, 0).unwrap();
        proven.standing().open(true);
        let (older, newer) = (
            a.start(peer, None, 0).unwrap(),
            a.start(peer, None, 0).unwrap(),
        );
        let unopened = a.start(peer, None, 0).unwrap();
        for t in [&older, &newer] {
            t.standing().open(false);
        }
        // The unopened one is young: nothing to shed yet, and a wake-up when it no longer is.
        let t0 = Instant::now();
        assert!(!a.has_room(0));
        assert!(
            a.next_stall().is_some_and(|t| t > t0),
            "{:?}",
            a.next_stall()
        );
        std::thread::sleep(opening / YOUNG_DIVISOR);
        let now = Instant::now();
        // Waiting, within the grace.
        older.standing().set_waiting(Some(now - grace / 2));
        newer.standing().set_waiting(Some(now - grace / 4));
        proven.standing().set_waiting(Some(now - grace * 10));
        // Once it had its chance, the unopened one goes first.
        let _t5 = a.start(peer, None, 0).unwrap();
        assert!(unopened.shed.load(Ordering::Acquire));
        _t5.standing().open(true);
        assert!(!a.has_room(0));
        assert!(a.start(peer, None, 0).is_none(), "nobody stalled yet");
        // Both past the grace: the one stalled longest goes (newer started waiting first).
        newer.standing().set_waiting(Some(now - grace * 3));
        older.standing().set_waiting(Some(now - grace * 2));
        assert!(a.has_room(0));
        let _t6 = a.start(peer, None, 0).unwrap();
        assert!(newer.shed.load(Ordering::Acquire));
        assert!(!older.shed.load(Ordering::Acquire));
        // The peer's step came: it is no longer stalled.
        older.standing().set_waiting(None);
        _t6.standing().open(true);
        assert!(a.start(peer, None, 0).is_none());
        assert!(!proven.shed.load(Ordering::Acquire));
        assert_eq!(a.counters().shed, 4);
    }

    /// An opened, unproven peer whose server is still busy with its own part (not waiting
    /// for it) cannot be shed yet, but a full listener's accept loop is told to look again
    /// within the grace, so that it sees the peer stall once it waits (an outside tester
    /// timed its endpoint to just before its youth ended: nothing woke the accept loop then,
    /// and the listener stayed full for the handshake's whole limit).
    #[test]
    fn a_full_listener_looks_again_at_an_opened_peer_it_does_not_wait_for_yet() {
        let opening = Duration::from_secs(4);
        let a = Admission::with_limits(1, 16, opening);
        let t = a.start(addr([10, 0, 0, 1], 1), None, 0).unwrap();
        t.standing().open(false);
        let now = Instant::now();
        assert!(!a.has_room(0));
        let again = a.next_stall().expect("a time to look again");
        assert!(again > now && again <= Instant::now() + opening / STALL_GRACE_DIVISOR);
        // Once it waits for its peer, it stalls at the end of its grace.
        let since = Instant::now() - opening;
        t.standing().set_waiting(Some(since));
        assert!(a.has_room(0));
        assert!(a.start(addr([10, 0, 0, 2], 1), None, 0).is_some());
        assert!(t.shed.load(Ordering::Acquire));
    }

    #[test]
    fn shedding_ends_the_handshakes_reading_and_marks_it() {
        use std::io::{Read, Write};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, peer) = l.accept().unwrap();
        let a = Admission::with_limits(1, 16, Duration::ZERO);
        let old = a.start(Some(peer), Some(&s), 0).unwrap();
        let _new = a.start(Some(peer), None, 0).unwrap();
        // The handshake's next wait finds the end of the stream, and the mark that says why
        // (it then tells the peer, which still reads what it is sent).
        let mut buf = [0u8; 1];
        assert_eq!(
            s.read(&mut buf).unwrap(),
            0,
            "the shed handshake reads the end"
        );
        assert!(old.standing().is_shed());
        s.write_all(b"x").unwrap();
        assert_eq!(c.read(&mut buf).unwrap(), 1);
    }

    /// A TCP peer refused because every running handshake has opened (none may be shed)
    /// reads why before the end of the stream, even with its own hello unread.
    #[test]
    fn a_peer_refused_for_want_of_room_reads_the_reason() {
        use crate::handshake::codec::{decode, Message};
        use std::io::{Read, Write};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.write_all(b"a hello the listener never reads").unwrap();
        let (s, peer) = l.accept().unwrap();
        let a = Admission::with_limits(1, 16, Duration::ZERO);
        let held = a.start(addr([10, 0, 0, 1], 1), None, 0).unwrap();
        held.standing().open(true);
        let incoming = Incoming::Tcp(s, peer);
        assert!(a.start_incoming(&incoming, 0).is_none());
        assert_eq!(a.counters().shed, 1, "counted before the peer hears");
        drop(incoming);
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        let reason = loop {
            if let Some((m, _)) = decode(&got).unwrap() {
                break m;
            }
            match c.read(&mut buf) {
                Ok(0) | Err(_) => panic!("the stream ended before a whole frame: {got:?}"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        };
        match reason {
            Message::Abort(why) => assert!(why.contains("max_handshakes"), "{why}"),
            other => panic!("expected an abort, got {other:?}"),
        }
    }

    /// A handshake that counts its failure before telling the peer is counted once, however
    /// its outcome is taken; a shed one is not a failure.
    #[test]
    fn a_failure_counted_before_the_peer_hears_is_counted_once() {
        let a = Admission::with_limits(4, 4, Duration::ZERO);
        let t = a.start(addr([10, 0, 0, 1], 1), None, 0).unwrap();
        t.standing().count_failure();
        assert_eq!(a.counters().failed, 1, "at once, before the outcome");
        t.standing().count_failure();
        let r: Result<()> = Err(NetError::Auth("wrong secret".into()));
        assert!(a.outcome(t, r).is_none());
        assert_eq!(a.counters().failed, 1);
        // A failure not counted early is counted with its outcome.
        let t = a.start(addr([10, 0, 0, 1], 2), None, 0).unwrap();
        assert!(a
            .outcome(t, Err::<(), _>(NetError::Auth("x".into())))
            .is_none());
        assert_eq!(a.counters().failed, 2);
        // Shed: told as such, never counted as failed.
        let t = a.start(addr([10, 0, 0, 1], 3), None, 0).unwrap();
        t.standing().shed();
        t.standing().count_failure();
        assert_eq!(a.counters().failed, 2);
    }
}
