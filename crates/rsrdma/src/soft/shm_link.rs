//! Links between soft devices of one host over shared memory ([`super::ring`]) instead of
//! loopback TCP: the dialer makes a ring and two eventfds and hands them over a Unix socket
//! (in the abstract namespace, named by the device's address and port); the acceptor maps
//! the ring and reads it. The Unix socket stays open as the link's life line: its end (the
//! peer process died, or closed the link) breaks the link, as a TCP connection's end does.
//!
//! # Who reads
//! A NIC executes what arrives with no work from the application; soft0 has no NIC, so
//! something must run. Each accepted ring has a reader thread, which sleeps on the ring's
//! "data" eventfd when it finds nothing. But a wake-up per packet (a system call by the
//! sender, a context switch at the receiver) costs more than the packet, and on a machine
//! with few cores a thread that spins beside an application that busy-polls takes turns
//! with it (measured: a reader that spun 50 µs before sleeping halved Conn's message rate
//! with adaptive polling, so it does not spin). So the application's own `ibv_poll_cq`
//! drains the rings too ([`Inbound::drain`], under a `try_lock`: the reader and the poller
//! never wait for each other), and while the application busy-polls (it polled since the
//! reader last looked, and no CQ is armed), the reader naps without telling the sender it
//! sleeps: the sender then makes no system call, and the packets are taken by the polls.
//! A CQ armed for an event ([`cq_armed`], [`poller_stopped`]) wakes a napping reader, which
//! then says it sleeps and is woken by the sender: an application that polls and then
//! sleeps (as Conn's blocking calls do, while its progress thread waits on the armed CQ)
//! gets its packets at once. A reader never naps longer than [`NAP`].

use super::directory::{Directory, DirectoryView, PeerDirect, PeerMemory};
use super::link::{hello, hello_device, Deliver, HELLO_LEN, MAX_PAYLOAD};
use super::recycle::Recycler;
use super::ring::{Consumer, Peek, Producer, LINE};
use super::verbs::signal;
use rsrdma_soft::{Packet, Payload, PayloadBuf, HEADER_LEN, INLINE_PAYLOAD};
use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Each ring's capacity: large enough for a few 64 KiB messages in flight, small enough to
/// stay in a core's cache.
pub(super) const RING_CAPACITY: usize = 1 << 20;
/// The environment variable that turns the shared-memory links off (`0`): soft devices of
/// one host then talk over loopback TCP, as devices of two hosts do.
pub const SHM_ENV: &str = "RSRDMA_SOFT_SHM";
/// The longest a reader naps while the application polls.
pub(super) const NAP: Duration = Duration::from_millis(1);
/// How long a waiting side sleeps at most before it looks again (the fds wake it sooner).
const WAIT: Duration = Duration::from_millis(100);

/// Counts the application's polls (`ibv_poll_cq` calls): a reader that sees it move knows
/// someone polls, and naps.
static POLLS: AtomicU64 = AtomicU64::new(0);
/// How many soft CQs are armed ([`cq_armed`], [`cq_fired`]): a thread waits, or is about to
/// wait, for an event, so whatever polls now may stop at any moment: readers do not nap.
/// (A poll is no promise of more polls: Conn's blocking call polls and then sleeps on a
/// condition variable, while its progress thread sleeps on the armed CQ's channel.) A reader
/// about to nap looks at it after saying it naps, so an arm is never missed.
static ARMED: AtomicU64 = AtomicU64::new(0);

/// Whether the shared-memory links are on (they are unless `RSRDMA_SOFT_SHM=0`).
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(SHM_ENV).map_or(true, |v| v != "0"))
}

/// The Unix socket name of the device at `addr`.
fn socket_name(addr: SocketAddrV4) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("rsrdma-soft0-{addr}"))
}

/// Whether a device at `peer` lives on this host, as seen from the device at `me`.
pub(super) fn same_host(me: SocketAddrV4, peer: SocketAddrV4) -> bool {
    peer.ip().is_loopback() || peer.ip() == me.ip()
}

/// A non-blocking eventfd, as a counter.
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd with constant flags.
    let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn clear(fd: BorrowedFd<'_>) {
    let mut v: u64 = 0;
    // SAFETY: an 8-byte read into a valid u64 from a non-blocking eventfd.
    let _ = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// What [`wait`] saw.
#[derive(Debug, PartialEq)]
enum Woke {
    /// One of the eventfds (or nothing, at the timeout).
    Maybe,
    /// The life line ended.
    Hangup,
}

/// Sleeps until one of `fds` is readable, the life line `sock` ends, or `limit` passes.
fn wait(fds: &[BorrowedFd<'_>], sock: BorrowedFd<'_>, limit: Duration) -> Woke {
    let mut p = [libc::pollfd {
        fd: 0,
        events: 0,
        revents: 0,
    }; 4];
    p[0] = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    for (i, f) in fds.iter().enumerate().take(3) {
        p[i + 1] = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let n = 1 + fds.len().min(3);
    let ms = limit.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `p` holds `n` initialised pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, ms) };
    // The peer never writes on the life line: anything readable there is its end.
    if r > 0 && p[0].revents != 0 {
        Woke::Hangup
    } else {
        Woke::Maybe
    }
}

/// Whether the life line `sock` ended (without waiting): a socket the peer never writes on.
pub(super) fn hung_up(sock: BorrowedFd<'_>) -> bool {
    wait(&[], sock, Duration::ZERO) == Woke::Hangup
}

// ----- the writing end ----------------------------------------------------------------------

/// The dialer's end of a link: the ring it writes and the fds that wake its reader.
pub(super) struct ShmOut {
    ring: Producer,
    /// Signalled when the reader sleeps and something was written.
    data: OwnedFd,
    /// Signalled by the reader when the writer waits for room.
    room: OwnedFd,
    sock: UnixStream,
    /// The peer's directory, when it shares its memory with this process.
    direct: Option<Arc<PeerDirect>>,
    /// The peer broke the ring's positions: the link is over.
    broken: bool,
    /// The peer's process, as the kernel said when the link was dialled.
    pid: u32,
}

/// The acceptor's answer: it took the link.
const ACCEPTED: u8 = 1;

impl ShmOut {
    /// Dials the device at `peer` on this host as the device at `me`.
    ///
    /// # Errors
    /// When the peer has no shared-memory listener (then TCP it is), refuses the link, or
    /// the set-up fails.
    pub(super) fn dial(me: SocketAddrV4, peer: SocketAddrV4) -> io::Result<ShmOut> {
        let sock = UnixStream::connect_addr(&socket_name(peer)?)?;
        // Whoever holds the name gets the ring and all that goes through it: a process of
        // this user only (the kernel says who it is); others are reached over TCP.
        if !peer_cred(&sock).is_some_and(|(_, uid)| uid == own_uid()) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the device's socket belongs to another user",
            ));
        }
        let ring = Producer::create(RING_CAPACITY)?;
        let (data, room) = (eventfd()?, eventfd()?);
        send_with_fds(
            &sock,
            &hello(me),
            &[ring.fd().as_fd(), data.as_fd(), room.as_fd()],
        )?;
        let mut answer = [0u8; 1];
        // A peer that never answers must not hold the link's writer for ever.
        sock.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut fds = recv_with_fds(&sock, &mut answer)?;
        sock.set_read_timeout(None)?;
        if answer[0] != ACCEPTED {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the peer device refused the shared-memory link",
            ));
        }
        // The peer's directory, if it gave one: its regions are then reached through its
        // /proc/<pid>/fd (the kernel says which process it is).
        let cred = peer_cred(&sock);
        let direct = match (fds.pop(), cred) {
            (Some(fd), Some((pid, _))) => DirectoryView::open(fd)
                .inspect_err(|e| tracing::debug!(error = %e, "soft0: a peer's directory"))
                .ok()
                .map(|view| {
                    Arc::new(PeerDirect {
                        view,
                        memory: Mutex::new(PeerMemory::new(pid)),
                    })
                }),
            _ => None,
        };
        Ok(ShmOut {
            ring,
            data,
            room,
            sock,
            direct,
            broken: false,
            pid: cred.map_or(0, |(pid, _)| pid),
        })
    }

    /// The peer's process (0 when the kernel did not say).
    pub(super) fn peer_pid(&self) -> u32 {
        self.pid
    }

    /// The peer's directory, when it shares its memory with this process (taken once, by
    /// whoever keeps the link).
    pub(super) fn take_direct(&mut self) -> Option<Arc<PeerDirect>> {
        self.direct.take()
    }

    /// Writes one packet whole if the ring has room for it now; never waits.
    pub(super) fn try_push(&mut self, header: &[u8], payload: &[u8]) -> bool {
        match self.ring.try_push(&[header, payload]) {
            Ok(true) => {
                if self.ring.consumer_sleeping() {
                    signal(self.data.as_raw_fd());
                }
                true
            }
            Ok(false) => false,
            // A broken ring: the writer thread sees it (`is_over`) and ends the link.
            Err(_) => {
                self.broken = true;
                false
            }
        }
    }

    /// Writes all of `data`, waiting for room as long as the reader lives.
    ///
    /// # Errors
    /// The link ended (the peer went, or broke the ring).
    pub(super) fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        let mut done = 0;
        while done < data.len() {
            let n = self.ring.push_some(&data[done..])?;
            if n > 0 {
                done += n;
                if self.ring.consumer_sleeping() {
                    signal(self.data.as_raw_fd());
                }
                continue;
            }
            self.ring.set_waiting(true);
            let woke = if self.ring.has_room(1)? {
                Woke::Maybe
            } else {
                wait(&[self.room.as_fd()], self.sock.as_fd(), WAIT)
            };
            self.ring.set_waiting(false);
            clear(self.room.as_fd());
            if woke == Woke::Hangup {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
        }
        Ok(())
    }

    /// Ends a packet written with [`ShmOut::write_all`]: the next one starts on a cache line
    /// ([`super::ring`]), waiting for room as `write_all` does.
    ///
    /// # Errors
    /// The link ended (the peer went, or broke the ring).
    pub(super) fn end_packet(&mut self) -> io::Result<()> {
        const PAD: [u8; LINE] = [0; LINE];
        let n = self.ring.pad_len();
        self.write_all(&PAD[..n])
    }

    /// The ring's capacity: a frame larger than it goes only in pieces.
    pub(super) fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Writes a position past what the ring holds, as a faulty peer might.
    #[cfg(test)]
    pub(super) fn break_ring(&self) {
        self.ring.break_head();
        signal(self.data.as_raw_fd());
    }

    /// Publishes a consumer's position past what was written, as a faulty reader might.
    #[cfg(test)]
    pub(super) fn break_tail(&mut self) {
        self.ring.break_tail();
    }

    /// Whether the link is over: the reader's end is gone, or the peer broke the ring.
    pub(super) fn is_over(&self) -> bool {
        self.broken || hung_up(self.sock.as_fd())
    }
}

// ----- the reading end ----------------------------------------------------------------------

/// The acceptor's end of a link.
pub(super) struct Inbound {
    from: SocketAddrV4,
    /// The dialer's process, as the kernel says.
    pid: u32,
    state: Mutex<Reading>,
    data: OwnedFd,
    room: OwnedFd,
    /// Wakes the reader from a nap ([`poller_stopped`]).
    wake: OwnedFd,
    /// The reader naps (so a poller that stops should wake it).
    napping: AtomicBool,
    /// The link ended: nothing more is read.
    over: AtomicBool,
    sock: UnixStream,
    /// A look at the ring for the polls, without the reader's lock.
    peek: Peek,
}

/// A reader's progress through the stream.
struct Reading {
    ring: Consumer,
    header: [u8; HEADER_LEN],
    /// Bytes of `header` read.
    header_got: usize,
    /// The payload being read: a short one here (copied into its packet), a long one in
    /// `long` (which becomes its packet's); and its length.
    payload: Vec<u8>,
    long: Option<PayloadBuf>,
    payload_len: usize,
    /// Packets read and not handed over yet (kept to reuse its memory).
    batch: Vec<Packet>,
    /// Payload memory taken back from the packets handed over.
    recycle: Recycler,
    /// The peer broke the link (a position out of range, a packet soft0 does not read): every
    /// later drain says so again, so that whoever drains next (the reader thread, after a
    /// poller found it) ends the link instead of finding a header half-handled.
    broken: bool,
}

/// The most packets handed over at once (the device lock is held meanwhile).
const MAX_BATCH: usize = 64;

impl Inbound {
    /// Reads what waits and hands it over; returns whether anything was read.
    ///
    /// # Errors
    /// The peer broke the ring or sent a packet soft0 does not read: the link is over.
    fn drain_locked(&self, r: &mut Reading, deliver: &dyn Deliver) -> io::Result<bool> {
        if r.broken {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer broke the link",
            ));
        }
        let read = self.read_packets(r, deliver);
        r.broken = read.is_err();
        read
    }

    /// [`Inbound::drain_locked`]'s reading.
    fn read_packets(&self, r: &mut Reading, deliver: &dyn Deliver) -> io::Result<bool> {
        let mut any = false;
        loop {
            // A packet starts on a cache line (the padding after the last one was skipped as
            // it ended, when it had been written with it).
            if r.header_got == 0 && !r.ring.skip_pad()? {
                break;
            }
            if r.header_got < HEADER_LEN {
                let n = r.ring.read(&mut r.header[r.header_got..])?;
                r.header_got += n;
                any |= n > 0;
                if r.header_got < HEADER_LEN {
                    break;
                }
                r.payload_len = Packet::payload_len(&r.header);
                if r.payload_len > MAX_PAYLOAD {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "an oversized packet",
                    ));
                }
                // A short payload is read into the buffer kept from the last one and copied
                // into its packet: no allocation per packet.
                // A long one's buffer grows as its bytes arrive (a ring's worth at a time):
                // a header alone never makes this process reserve what it announces.
                if r.payload_len > INLINE_PAYLOAD {
                    r.long = Some(r.recycle.buffer(r.payload_len.min(RING_CAPACITY)));
                } else {
                    r.payload.reserve(INLINE_PAYLOAD);
                }
            }
            let into = match r.long.as_mut() {
                Some(b) => b.bytes_mut(),
                None => &mut r.payload,
            };
            let want = r.payload_len - into.len();
            let room = want.min(r.ring.available()?);
            into.reserve(room);
            let n = r.ring.read_into_vec(into, want)?;
            any |= n > 0;
            if into.len() < r.payload_len {
                break;
            }
            let payload = match r.long.take() {
                Some(b) => Payload::from(b),
                None => {
                    let p = Payload::from_slice(&r.payload);
                    r.payload.clear();
                    p
                }
            };
            let p = Packet::decode_parts(&r.header, payload)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            r.header_got = 0;
            // Its padding now, when it came with it: a poll that finds only padding left
            // would look at the ring for nothing.
            r.ring.skip_pad()?;
            r.batch.push(p);
            if r.batch.len() == MAX_BATCH {
                self.hand_over(r, deliver);
            }
        }
        self.hand_over(r, deliver);
        Ok(any)
    }

    fn hand_over(&self, r: &mut Reading, deliver: &dyn Deliver) {
        // Read out of the ring: the writer may use that room again.
        if r.ring.release() {
            signal(self.room.as_raw_fd());
        }
        if !r.batch.is_empty() {
            for p in &r.batch {
                r.recycle.lend(&p.payload);
            }
            deliver.packets(self.from, &mut r.batch);
            r.batch.clear();
            r.recycle.reclaim();
        }
    }

    /// The peer went: what it wrote before is still in the ring, handed over first.
    fn last_drain(&self, deliver: &dyn Deliver) -> io::Result<()> {
        let mut r = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.drain_locked(&mut r, deliver).map(|_| ())
    }

    /// For a poller: reads what waits, unless the reader is at it; returns whether anything
    /// was read (or the reader was at it).
    pub(super) fn drain(&self, deliver: &dyn Deliver) -> bool {
        if self.over.load(Ordering::Relaxed) || !self.peek.maybe_ready() {
            return false;
        }
        let Ok(mut r) = self.state.try_lock() else {
            return true;
        };
        if r.ring.available().is_ok_and(|n| n == 0) {
            return false;
        }
        // The reader naps: it looks again within a nap, after this drain (it takes the same
        // lock), and sends what the device held back meanwhile (`flush_acks`).
        let napping = self.napping.load(Ordering::SeqCst);
        BUSY_POLL_DRAIN.with(|d| d.set(napping));
        let drained = self.drain_locked(&mut r, deliver);
        BUSY_POLL_DRAIN.with(|d| d.set(false));
        match drained {
            Ok(read) => read,
            Err(_) => {
                // The reader thread finds the same and ends the link.
                signal(self.wake.as_raw_fd());
                false
            }
        }
    }
}

thread_local! {
    /// This thread delivers what an application's poll drained while the ring's reader naps.
    static BUSY_POLL_DRAIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread delivers what the application's poll drained from a ring whose
/// reader naps (so the reader looks again within [`NAP`]).
pub(super) fn delivering_for_a_busy_poll() -> bool {
    BUSY_POLL_DRAIN.with(std::cell::Cell::get)
}

/// Counts one poll of the application's (an `ibv_poll_cq` call). Not an atomic increment
/// (a locked instruction on every poll): pollers racing may count one poll for two, and a
/// watcher only asks whether the count moved.
pub(super) fn polled() {
    POLLS.store(
        POLLS.load(Ordering::Relaxed).wrapping_add(1),
        Ordering::Relaxed,
    );
}

/// Whether the application busy-polls, as a thread that looks now and then sees it: it
/// polled since the last look, and no CQ is armed (nobody waits for an event).
pub(super) struct PollWatch {
    polls: u64,
}

impl PollWatch {
    pub(super) fn new() -> PollWatch {
        PollWatch {
            polls: POLLS.load(Ordering::Relaxed),
        }
    }

    /// Whether the application polled since the last call, with no CQ armed now.
    pub(super) fn busy_polling(&mut self) -> bool {
        let polls = POLLS.load(Ordering::Relaxed);
        let moved = polls != self.polls;
        self.polls = polls;
        moved && ARMED.load(Ordering::SeqCst) == 0
    }
}

/// A soft CQ was armed (it was not).
pub(super) fn cq_armed() {
    ARMED.fetch_add(1, Ordering::SeqCst);
}

/// An armed soft CQ fired its event, or was destroyed.
pub(super) fn cq_fired() {
    ARMED.fetch_sub(1, Ordering::SeqCst);
}

/// A CQ was armed ([`cq_armed`] first): the napping readers of `inbound` go back to
/// sleeping where the sender wakes them.
pub(super) fn poller_stopped(inbound: &[Arc<Inbound>]) {
    for i in inbound {
        if i.napping.load(Ordering::SeqCst) {
            signal(i.wake.as_raw_fd());
        }
    }
}

/// Reads the link until it ends, then breaks it (after handing over all it carried).
fn read_loop(i: &Inbound, deliver: &dyn Deliver) {
    let mut watch = PollWatch::new();
    // The ring's read position when the last nap began (it was empty then), and how many
    // naps in a row ended with data nobody had read meanwhile: the application polls, but
    // its polls do not drain this ring (it waits on memory, as a UC write_lat does, between
    // polls of its own sends). Napping then costs each packet a nap (about 0.5 ms): after
    // two such naps the reader sleeps where the sender wakes it instead, until a wake-up
    // finds the ring drained by the polls again.
    let mut nap_from: Option<(u64, std::time::Instant)> = None;
    let mut unread_naps = 0u32;
    // Where a sleep began: a wake-up that finds the ring read meanwhile (the polls drained
    // it) lets the reader nap again.
    let mut slept_from: Option<u64> = None;
    let ended: io::Result<()> = (|| loop {
        let (read, from) = {
            let mut r = i.state.lock().unwrap_or_else(|p| p.into_inner());
            let from = r.ring.position();
            (i.drain_locked(&mut r, deliver)?, from)
        };
        if let Some((start, began)) = nap_from.take() {
            // A whole nap (not one cut short) through which nobody read, ending with data.
            unread_naps = match read && from == start && began.elapsed() >= NAP / 2 {
                true => unread_naps + 1,
                false => 0,
            };
        }
        if slept_from.take().is_some_and(|start| from != start) {
            unread_naps = 0;
        }
        if read {
            continue;
        }
        deliver.flush_acks();
        if unread_naps < 2 && watch.busy_polling() {
            // The application polls (and drains): nap, unannounced, unless a CQ was armed
            // meanwhile (looked at after `napping` is said, so that either the arm sees the
            // nap and wakes it, or the nap sees the arm).
            i.napping.store(true, Ordering::SeqCst);
            nap_from = Some((from, std::time::Instant::now()));
            let woke = if ARMED.load(Ordering::SeqCst) == 0 {
                wait(&[i.wake.as_fd()], i.sock.as_fd(), NAP)
            } else {
                Woke::Maybe
            };
            i.napping.store(false, Ordering::Relaxed);
            clear(i.wake.as_fd());
            if woke == Woke::Hangup {
                return i.last_drain(deliver);
            }
            continue;
        }
        let waiting = {
            let r = i.state.lock().unwrap_or_else(|p| p.into_inner());
            r.ring.set_sleeping(true);
            slept_from = Some(r.ring.position());
            r.ring.available()?
        };
        let woke = if waiting > 0 {
            Woke::Maybe
        } else {
            wait(&[i.data.as_fd(), i.wake.as_fd()], i.sock.as_fd(), WAIT)
        };
        i.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ring
            .set_sleeping(false);
        clear(i.data.as_fd());
        clear(i.wake.as_fd());
        if woke == Woke::Hangup {
            return i.last_drain(deliver);
        }
    })();
    if let Err(e) = ended {
        tracing::warn!(from = %i.from, error = %e, "soft0: a peer device broke its shared ring");
    }
    i.over.store(true, Ordering::Relaxed);
}

// ----- accepting ----------------------------------------------------------------------------

/// Listens for shared-memory links to the device at `me`; each accepted one is added to
/// `inbound` while it lives, read by its own thread, and handed to `deliver`.
/// `reading(from, true/false)` brackets each reader's life.
///
/// # Errors
/// When the Unix socket cannot be bound (the device then takes TCP links only).
pub(super) fn listen(
    me: SocketAddrV4,
    inbound: Arc<RwLock<Vec<Arc<Inbound>>>>,
    deliver: Arc<dyn Deliver>,
    reading: Arc<dyn Fn(SocketAddrV4, bool) + Send + Sync>,
    directory: Option<Arc<Directory>>,
) -> io::Result<()> {
    let listener = UnixListener::bind_addr(&socket_name(me)?)?;
    std::thread::Builder::new()
        .name("rsrdma-soft0-shm".into())
        .spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else {
                    continue;
                };
                let (inbound, deliver, reading) =
                    (inbound.clone(), deliver.clone(), reading.clone());
                let directory = directory.clone();
                let _ = std::thread::Builder::new()
                    .name("rsrdma-soft0-shmrecv".into())
                    .spawn(move || {
                        serve(me, s, &inbound, &*deliver, &*reading, directory.as_deref());
                    });
            }
        })?;
    Ok(())
}

/// Takes one link's set-up, then reads it until it ends.
fn serve(
    me: SocketAddrV4,
    sock: UnixStream,
    inbound: &RwLock<Vec<Arc<Inbound>>>,
    deliver: &dyn Deliver,
    reading: &(dyn Fn(SocketAddrV4, bool) + Send + Sync),
    directory: Option<&Directory>,
) {
    let i = match accept_one(me, sock, directory) {
        Ok(i) => Arc::new(i),
        Err(e) => {
            tracing::warn!(error = %e, "soft0: a shared-memory link was refused");
            return;
        }
    };
    let from = i.from;
    reading(from, true);
    inbound
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .push(i.clone());
    read_loop(&i, deliver);
    inbound
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|x| !Arc::ptr_eq(x, &i));
    reading(from, false);
    deliver.inbound_ended(from, Some(i.pid).filter(|&p| p != 0));
}

fn accept_one(
    me: SocketAddrV4,
    sock: UnixStream,
    directory: Option<&Directory>,
) -> io::Result<Inbound> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    // Shared-memory links join processes of one user only (others talk over TCP).
    let Some((pid, _)) = peer_cred(&sock).filter(|&(_, uid)| uid == own_uid()) else {
        return Err(bad(
            "a process of another user dialled; it talks over TCP instead",
        ));
    };
    // A dialer that says nothing must not hold this thread for ever.
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut hello = [0u8; HELLO_LEN];
    let mut fds = recv_with_fds(&sock, &mut hello)?;
    sock.set_read_timeout(None)?;
    if fds.len() != 3 {
        return Err(bad("a set-up without its ring and eventfds"));
    }
    let from = hello_device(&hello);
    // Over a Unix socket, the peer is on this host: it may speak only for a device here.
    if !same_host(me, from) {
        return Err(bad("a peer on this host named a device of another host"));
    }
    let room = checked_eventfd(fds.pop().ok_or_else(|| bad("no eventfd"))?)?;
    let data = checked_eventfd(fds.pop().ok_or_else(|| bad("no eventfd"))?)?;
    let ring = Consumer::open(fds.pop().ok_or_else(|| bad("no ring"))?)?;
    let peek = ring.peek();
    // Taken: the directory goes with the answer (to a peer of this user, which may read
    // this process's /proc/<pid>/fd anyway).
    let dir: Vec<BorrowedFd<'_>> = directory.map(|d| d.fd().as_fd()).into_iter().collect();
    send_with_fds(&sock, &[ACCEPTED], &dir)?;
    Ok(Inbound {
        from,
        pid,
        state: Mutex::new(Reading {
            ring,
            header: [0; HEADER_LEN],
            header_got: 0,
            payload: Vec::new(),
            long: None,
            payload_len: 0,
            batch: Vec::with_capacity(MAX_BATCH),
            recycle: Recycler::default(),
            broken: false,
        }),
        data,
        room,
        wake: eventfd()?,
        napping: AtomicBool::new(false),
        over: AtomicBool::new(false),
        sock,
        peek,
    })
}

// ----- descriptors over a Unix socket -------------------------------------------------------

/// The process at the other end of `sock`, as the kernel knows it: (pid, uid).
fn peer_cred(sock: &UnixStream) -> Option<(u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its size.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some((cred.pid as u32, cred.uid))
}

/// `fd` if it is an eventfd, made non-blocking: what a peer hands over as one may be
/// anything (a pipe would block the thread that signals or clears it).
fn checked_eventfd(fd: OwnedFd) -> io::Result<OwnedFd> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a peer handed over something else than an eventfd",
        ));
    }
    // SAFETY: plain calls on a descriptor we own.
    let ok = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

fn own_uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// The most descriptors one message carries.
const MAX_FDS: usize = 3;

fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let raw: Vec<libc::c_int> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let fd_bytes = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `msg` names `control`, which has room for one header and the descriptors
    // (CMSG_SPACE of their size); the macros stay inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
        std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c).cast(), raw.len());
    }
    // SAFETY: `msg` and what it points at are valid for the call; the bytes are only read.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::ErrorKind::WriteZero.into());
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes (in one message) and the descriptors they carry.
fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `msg` names `buf` and `control`, valid for writes of their lengths.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to `msg_controllen`; the macros walk only the
    // headers it wrote, and each SCM_RIGHTS payload holds descriptors now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<libc::c_int>();
                for k in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(k))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n as usize != buf.len() || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a short or truncated set-up message",
        ));
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::os::fd::FromRawFd;

    struct Nothing;

    impl Deliver for Nothing {
        fn packet(&self, _: SocketAddrV4, _: Packet) {}
        fn link_down(&self, _: SocketAddrV4, _: Option<u64>) {}
    }

    /// A packet the link cannot take (here a header announcing 3 GiB) that the application's
    /// poll meets first: the poll cannot end the link itself, so the reader thread, which
    /// drains next, must find the same and end it. It found a header half-handled and
    /// nothing to read, for ever: the peer's QPs hung instead of failing.
    #[test]
    fn a_broken_packet_a_poller_met_first_ends_the_link_in_the_reader() {
        let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7002);
        let (a, b) = UnixStream::pair().unwrap();
        let mut ring = Producer::create(4096).unwrap();
        let (d, r) = (eventfd().unwrap(), eventfd().unwrap());
        send_with_fds(&a, &hello(me), &[ring.fd().as_fd(), d.as_fd(), r.as_fd()]).unwrap();
        let i = accept_one(me, b, None).unwrap();
        let mut h = [0u8; HEADER_LEN];
        h[0] = 4;
        h[12..16].copy_from_slice(&0xC000_0000u32.to_le_bytes());
        assert!(ring.try_push(&[&h]).unwrap());
        i.drain(&Nothing);
        let mut st = i.state.lock().unwrap();
        for _ in 0..3 {
            assert!(
                i.drain_locked(&mut st, &Nothing).is_err(),
                "the reader finds the link broken"
            );
        }
    }

    #[test]
    fn a_peer_that_hands_over_something_else_than_eventfds_is_refused() {
        let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7001);
        let reading: Arc<dyn Fn(SocketAddrV4, bool) + Send + Sync> = Arc::new(|_, _| {});
        listen(me, Arc::default(), Arc::new(Nothing), reading, None).unwrap();
        let sock = UnixStream::connect_addr(&socket_name(me).unwrap()).unwrap();
        let ring = Producer::create(4096).unwrap();
        let mut pipe = [0; 2];
        // SAFETY: `pipe` has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: descriptors just opened, owned by nothing else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let hello = [127, 0, 0, 1, 0x5a, 0x1b];
        send_with_fds(&sock, &hello, &[ring.fd().as_fd(), r.as_fd(), w.as_fd()]).unwrap();
        // A blocking pipe would hang the thread that clears or signals it: no answer, the
        // socket closes.
        let mut answer = [0u8; 1];
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(
            recv_with_fds(&sock, &mut answer).is_err(),
            "the set-up was refused"
        );
        // The same with real eventfds is taken.
        let sock = UnixStream::connect_addr(&socket_name(me).unwrap()).unwrap();
        let (d, e) = (eventfd().unwrap(), eventfd().unwrap());
        send_with_fds(&sock, &hello, &[ring.fd().as_fd(), d.as_fd(), e.as_fd()]).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        recv_with_fds(&sock, &mut answer).unwrap();
        assert_eq!(answer[0], ACCEPTED);
    }
}
