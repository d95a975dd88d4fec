//! Queue pairs in other processes, on this host or another: the soft device listens on a TCP
//! port of its address (the loopback address, or the one `RSRDMA_SOFT_ADDR` names; the port
//! is its LID and the address is in its GID, so a [`crate::QpEndpoint`] says where a QP
//! lives), and carries packets to another soft device over a connection it dials, one per
//! peer device (named by its address and port, which the dialer says first):
//! each packet's header then its payload (the header says the payload's length), written
//! with one vectored write per batch so that no payload is copied into a frame first, and
//! read into a buffer of the payload's own size, which the packet then owns. The connection a device dials
//! is only written; the ones it accepts are only read, each by its own thread, which hands
//! the packets to the destination QPs under the device lock, as a NIC executes what arrives
//! with no work from the application. Writes go through a queue and a writer thread, never
//! under the device lock: two devices that write to each other cannot block each other.
//!
//! A connection whose hello names an address other than the one it comes from is refused
//! (the dialer connects from its own device's address): a host cannot speak for another's
//! device, though, as on a RoCE fabric, it can for its own (trust is the fabric's; keys and
//! sequence numbers decide what a packet may do).
//!
//! A connection that ends (its process died, its socket reset) breaks the link of every QP
//! that talks to that device: their oldest request completes with `RETRY_EXC_ERR`. A writer
//! whose connection fails leaves that to the reader of the same peer while one lives (for a
//! second at most): the peer may have sent its last packets (a FIN) before it went, and they
//! are delivered before its QPs break.
//! Reliable, ordered streams need no retransmission, as `rsrdma-soft`'s packets assume.
//!
//! A peer device on the same host gets a shared-memory link instead ([`super::shm_link`]),
//! unless `RSRDMA_SOFT_SHM=0`: the same packets, queues and writer thread, but a packet that
//! fits into the ring's room goes there at once from the thread that sent it (no hand-off),
//! and the peer's polls take it.

use super::directory::{Directory, PeerDirect};
use super::fast_hash::FastMap;
use super::recycle::Recycler;
use super::shm_link::{self, Inbound, ShmOut};
use rsrdma_soft::{Packet, Payload, HEADER_LEN, INLINE_PAYLOAD};
use std::collections::VecDeque;
use std::io::{BufReader, ErrorKind, IoSlice, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

/// The largest payload a peer may send: a message of up to 2 GiB.
pub(super) const MAX_PAYLOAD: usize = rsrdma_soft::MAX_MESSAGE as usize;
/// How long a writer whose connection failed waits for the reader of the same peer to end.
const READER_GRACE: Duration = Duration::from_secs(1);
/// How often an idle shared-memory writer looks whether its reader is gone.
const IDLE_CHECK: Duration = Duration::from_millis(100);
/// The most packets one vectored write carries (two slices each).
const MAX_BATCH: usize = 256;
/// How long a TCP link's peer host may go without acknowledging anything while data sent
/// to it waits for an acknowledgement (then TCP's next send must go unanswered too:
/// [`SilenceWatch::look`]), or without answering keepalive probes while the link is idle
/// ([`watch_peer_host`]), before the link ends and its queue pairs' requests end with
/// `RETRY_EXC_ERR`.
pub(super) const PEER_HOST_SILENCE: Duration = Duration::from_secs(5);
/// How long the writer's blocked write waits before it looks whether the peer host went
/// silent.
const WRITE_LOOK: Duration = Duration::from_secs(1);
/// How long what TCP sent again after [`PEER_HOST_SILENCE`] may go unanswered before the
/// peer host counts as gone: far past a round trip of any network soft0 runs on.
const RETRANSMIT_ANSWER: Duration = Duration::from_secs(1);

/// What the links hand to the device.
pub(super) trait Deliver: Send + Sync + 'static {
    /// A packet from the device listening on `from`.
    fn packet(&self, from: SocketAddrV4, packet: Packet);
    /// Packets from the device listening on `from`, in order (the batch is left empty).
    fn packets(&self, from: SocketAddrV4, batch: &mut Vec<Packet>) {
        for p in batch.drain(..) {
            self.packet(from, p);
        }
    }
    /// The device listening on `peer` cannot be reached any more over link `link` (an
    /// [`Outbound`]'s number, [`Route::link`]): the queue pairs that took that link fail;
    /// `None`: every queue pair connected to `peer`.
    fn link_down(&self, peer: SocketAddrV4, link: Option<u64>);
    /// The link from the device listening on `from` ended (its reader read its end): process
    /// `pid` there, when the kernel said which (a shared-memory link).
    fn inbound_ended(&self, from: SocketAddrV4, pid: Option<u32>) {
        let _ = pid;
        self.link_down(from, None);
    }
    /// A link's reader found nothing to read: the acknowledgements the device holds back
    /// while the application polls go now (at the latest).
    fn flush_acks(&self) {}
}

/// The device's listener and its connections to other devices.
pub(super) struct Links {
    addr: SocketAddrV4,
    out: Arc<OutMap>,
    /// The shared-memory links other devices dialled, for the polls to drain.
    inbound: Arc<RwLock<Vec<Arc<Inbound>>>>,
    readers: Arc<Readers>,
    /// Peers on this host are dialled over shared memory.
    shm: bool,
}

/// The links to peer devices, by the address each listens on. A link whose peer is gone
/// leaves it (its writer removes it), so a long-lived device that served many short-lived
/// peer processes does not keep a ring, two eventfds and a socket for each (an outside
/// tester's find: a server ran out of descriptors after about 250 client processes).
type OutMap = Mutex<FastMap<SocketAddrV4, Arc<Outbound>>>;

/// How many reader threads each peer device has (TCP and shared memory), so that a writer
/// whose connection failed can wait for them to deliver what they still hold.
#[derive(Default)]
struct Readers {
    live: Mutex<FastMap<SocketAddrV4, usize>>,
    changed: Condvar,
}

impl Readers {
    fn reading(&self, peer: SocketAddrV4, starts: bool) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let n = live.entry(peer).or_insert(0);
        if starts {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                live.remove(&peer);
            }
        }
        self.changed.notify_all();
    }

    /// Waits, up to `limit`, until no reader of `peer` lives.
    fn wait_gone(&self, peer: SocketAddrV4, limit: Duration) {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .changed
            .wait_timeout_while(live, limit, |l| l.contains_key(&peer));
    }
}

/// How many shared-memory links have frames waiting for the polls to move them.
static QUEUED_LINKS: AtomicUsize = AtomicUsize::new(0);

/// Packets queued for one peer device, and its writer thread's state.
struct Outbound {
    queue: Mutex<OutQueue>,
    ready: Condvar,
    /// The shared-memory link, once the writer set it up (`shm_ready` then says so).
    shm: Mutex<Option<ShmOut>>,
    shm_ready: AtomicBool,
    /// Frames wait in the queue of a shared-memory link (for the polls to move them):
    /// counted in [`QUEUED_LINKS`] while set ([`Outbound::set_queued`]).
    queued: AtomicBool,
    /// The connection failed (what `OutQueue::dead` says, readable without the lock: every
    /// packet and one-sided request looks).
    dead: AtomicBool,
    /// The peer's directory, once a shared-memory link with it is set up and it shares its
    /// memory: one-sided requests to it are then done directly.
    direct: std::sync::OnceLock<Arc<PeerDirect>>,
    /// Its number, one per link this process ever made ([`NEXT_LINK`]): the queue pairs that
    /// took it know it, so that its end fails those and not the ones that took a newer link
    /// to a new process at the same address ([`Links::route_fresh`]).
    number: u64,
    /// The peer's process, once a shared-memory link is set up (0 until then, and over TCP).
    peer_pid: AtomicU32,
    /// Over TCP, a second handle of the connection, once it is up: the peer never writes on
    /// it, so its end (the peer's process gone) makes it readable ([`Outbound::peer_gone`]).
    tcp_life_line: std::sync::OnceLock<TcpStream>,
    /// Over TCP, what the writer last saw of TCP's retransmissions ([`SilenceWatch`]).
    silence: Mutex<SilenceWatch>,
}

/// What a TCP link's writer saw of its connection's retransmissions, to tell a peer host
/// that went silent from a link whose TCP waits out a backed-off timer ([`SilenceWatch::look`]).
#[derive(Default)]
struct SilenceWatch {
    /// TCP's count of retransmissions since the last acknowledgement, as last seen.
    retransmits: u8,
    /// When that count was seen to change, and how long nothing had been acknowledged then.
    changed: Option<(Instant, u32)>,
}

impl SilenceWatch {
    /// Whether the peer host of `s` went silent: data waits for an acknowledgement, and a
    /// retransmission TCP made after [`PEER_HOST_SILENCE`] without one went unanswered for
    /// [`RETRANSMIT_ANSWER`] (the kernel's `tcp_info`, looked at now and then: a change of its
    /// retransmission count is when TCP sent again). The silence alone is not enough: after a
    /// 3.5 s outage TCP's backed-off timer sends again about 6 s after the loss, so a link
    /// that worked again was ended (an outside tester's find). A stopped peer process is not
    /// silent: its kernel acknowledges.
    fn look(&mut self, s: &TcpStream) -> bool {
        let mut info: libc::tcp_info = super::verbs::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `s` is an open TCP socket; `info` is writable for `len` bytes, which the
        // kernel lowers to what it wrote.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                std::ptr::from_mut(&mut info).cast(),
                &mut len,
            )
        };
        if rc != 0 || info.tcpi_unacked == 0 || info.tcpi_retransmits == 0 {
            *self = SilenceWatch::default();
            return false;
        }
        if info.tcpi_retransmits != self.retransmits {
            self.retransmits = info.tcpi_retransmits;
            self.changed = Some((Instant::now(), info.tcpi_last_ack_recv));
            return false;
        }
        self.changed.is_some_and(|(at, silent_then)| {
            u128::from(silent_then) >= PEER_HOST_SILENCE.as_millis()
                && at.elapsed() >= RETRANSMIT_ANSWER
        })
    }
}

/// The next link's [`Outbound::number`] (0 is none).
static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

#[derive(Default)]
struct OutQueue {
    frames: VecDeque<Packet>,
    /// Frames the writer took and has not finished writing.
    writing: usize,
    /// The connection failed: what is queued is dropped.
    dead: bool,
    /// Threads in [`Links::flush`], waiting for the queue to empty.
    flushing: usize,
    /// Frames that left the queue for the peer, ever (its progress).
    moved: u64,
    /// A flush gave up on this link when it had moved this many: a later flush does not
    /// wait again while nothing moved since (a peer that stopped reading would otherwise
    /// hold every `destroy_qp` for the whole limit: 16 queue pairs, 16 s).
    stuck_at: Option<u64>,
}

/// How long [`Links::flush`] waits on a link that moves nothing before it gives that link up.
const FLUSH_STALL: std::time::Duration = std::time::Duration::from_millis(100);

impl Links {
    /// Listens on `at` (port 0: any free port) and starts accepting peers; with `shm`, also
    /// on this device's Unix socket, and dials peers of this host over shared memory.
    ///
    /// # Errors
    /// The listener's.
    pub(super) fn start(
        at: SocketAddrV4,
        deliver: Arc<dyn Deliver>,
        shm: bool,
        directory: Option<Arc<Directory>>,
    ) -> std::io::Result<Links> {
        let listener = TcpListener::bind(at)?;
        let port = listener.local_addr()?.port();
        let addr = SocketAddrV4::new(*at.ip(), port);
        let readers = Arc::new(Readers::default());
        let inbound = Arc::new(RwLock::new(Vec::new()));
        if shm {
            let r = readers.clone();
            let reading = Arc::new(move |peer, starts| r.reading(peer, starts));
            let listened =
                shm_link::listen(addr, inbound.clone(), deliver.clone(), reading, directory);
            if let Err(e) = listened {
                tracing::debug!(error = %e, "soft0: no shared-memory links; TCP only");
            }
        }
        let r = readers.clone();
        std::thread::Builder::new()
            .name("rsrdma-soft0-accept".into())
            .spawn(move || accept_loop(&listener, &deliver, &r))?;
        Ok(Links {
            addr,
            out: Arc::new(Mutex::new(FastMap::default())),
            inbound,
            readers,
            shm,
        })
    }

    /// For a poll of the application's: moves what waits for room in the shared rings to
    /// peers, and reads what the rings from peers carry now, never waiting for a thread
    /// that is at either; returns whether it read anything.
    pub(super) fn progress(&self, deliver: &dyn Deliver) -> bool {
        shm_link::polled();
        // Most polls find no frame waiting for room: they take no lock for it.
        if QUEUED_LINKS.load(Ordering::Relaxed) > 0 {
            if let Ok(map) = self.out.try_lock() {
                for o in map.values() {
                    if o.queued.load(Ordering::Relaxed) {
                        o.move_to_ring(&mut o.queue.lock().unwrap_or_else(|p| p.into_inner()));
                    }
                }
            }
        }
        let inbound = self.inbound.read().unwrap_or_else(|p| p.into_inner());
        let mut read = false;
        for i in inbound.iter() {
            read |= i.drain(deliver);
        }
        read
    }

    /// The application stopped polling: the readers of the shared-memory links go back to
    /// being woken by their senders.
    pub(super) fn poller_stopped(&self) {
        shm_link::poller_stopped(&self.inbound.read().unwrap_or_else(|p| p.into_inner()));
    }

    /// Where this device listens: its address, and its port (its LID).
    pub(super) fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// Queues `frame` for the device listening on `peer`, dialling it first if needed.
    /// Never blocks on the network.
    /// Returns false when no link can be started (no thread): the caller breaks its QP's
    /// link itself (it holds the device lock, which `Deliver::link_down` takes).
    pub(super) fn send(
        &self,
        peer: SocketAddrV4,
        frame: Packet,
        deliver: &Arc<dyn Deliver>,
    ) -> bool {
        match self.route(peer, deliver) {
            Some(r) => Links::send_on(&r, frame),
            None => false,
        }
    }

    /// Queues `frame` on `route` (as [`Links::send`], for a sender that keeps its route).
    pub(super) fn send_on(route: &Route, frame: Packet) -> bool {
        let out = &route.0;
        let mut q = out.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.dead {
            return true;
        }
        // Straight into a shared ring with room, when nothing waits before it.
        if out.move_to_ring(&mut q) {
            if let Ok(mut shm) = out.shm.try_lock() {
                if let Some(s) = shm.as_mut() {
                    if s.try_push(&frame.header(), &frame.payload) {
                        return true;
                    }
                }
            }
        }
        let was_empty = q.frames.is_empty();
        q.frames.push_back(frame);
        if out.shm_ready.load(Ordering::Relaxed) {
            out.set_queued(true);
        }
        // The writer waits only while the queue is empty.
        if was_empty {
            out.ready.notify_all();
        }
        true
    }

    /// The link to the device listening on `peer`, started if needed (`None` when no thread
    /// can be started for it).
    pub(super) fn route(&self, peer: SocketAddrV4, deliver: &Arc<dyn Deliver>) -> Option<Route> {
        self.outbound(peer, deliver, false).map(Route)
    }

    /// [`Links::route`] for a queue pair that takes a link (as it is connected, or when its
    /// link died): a link whose peer process has gone (its socket ended, over shared memory
    /// or TCP) is not taken but ended, and a new one dialled. The kernel gives a freed port
    /// to the next process that asks, often at once: a link kept to the process that had it
    /// would carry the new queue pair's packets into a ring nobody reads (an outside tester's
    /// churn of client processes saw a good client fail so). One look at the link's socket
    /// per queue pair connected, none per packet.
    pub(super) fn route_fresh(
        &self,
        peer: SocketAddrV4,
        deliver: &Arc<dyn Deliver>,
    ) -> Option<Route> {
        self.outbound(peer, deliver, true).map(Route)
    }

    /// The link from the device listening on `from` ended, from process `pid` when known:
    /// the link to it goes too when it leads to the same process (it left, or broke the
    /// link), and its writer fails the queue pairs that took it. A link to another process
    /// now at that address is left alone; one whose process is not known (TCP, or still
    /// being set up) looks at its own peer now.
    pub(super) fn inbound_ended(&self, from: SocketAddrV4, pid: Option<u32>) {
        let map = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let Some(o) = map.get(&from) else {
            return;
        };
        match (pid, o.peer_pid.load(Ordering::Acquire)) {
            (Some(p), q) if q == p => o.kill(),
            _ => o.ready.notify_all(),
        }
    }
}

/// The link to one peer device, kept by a connected queue pair so that its packets and
/// one-sided requests look up no map (the map's lock and an `Arc` count per packet were a
/// fifth of a small message's cost). Once its link died it is stale: ask [`Links::route`]
/// again (which dials anew).
#[derive(Clone)]
pub(super) struct Route(Arc<Outbound>);

impl Route {
    pub(super) fn is_dead(&self) -> bool {
        self.0.is_dead()
    }

    /// The link's number ([`Deliver::link_down`] names it when it ends).
    pub(super) fn link(&self) -> u64 {
        self.0.number
    }

    /// The peer's directory, once the link shares memory with it.
    pub(super) fn direct(&self) -> Option<&Arc<PeerDirect>> {
        self.0.direct.get()
    }
}

impl Links {
    /// The link to the device listening on `peer`, started if needed (`None` when its writer
    /// thread cannot be started); with `fresh`, not one whose peer process is gone
    /// ([`Links::route_fresh`]).
    fn outbound(
        &self,
        peer: SocketAddrV4,
        deliver: &Arc<dyn Deliver>,
        fresh: bool,
    ) -> Option<Arc<Outbound>> {
        let mut map = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(o) = map.get(&peer).filter(|o| !o.is_dead()) {
            if !(fresh && o.peer_gone()) {
                return Some(o.clone());
            }
            o.kill();
        }
        let o = Arc::new(Outbound {
            queue: Mutex::new(OutQueue::default()),
            ready: Condvar::new(),
            shm: Mutex::new(None),
            shm_ready: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            direct: std::sync::OnceLock::new(),
            number: NEXT_LINK.fetch_add(1, Ordering::Relaxed),
            peer_pid: AtomicU32::new(0),
            tcp_life_line: std::sync::OnceLock::new(),
            silence: Mutex::default(),
        });
        let (w, d, me) = (o.clone(), deliver.clone(), self.addr);
        let (r, shm, links) = (self.readers.clone(), self.shm, Arc::downgrade(&self.out));
        let spawned = std::thread::Builder::new()
            .name("rsrdma-soft0-link".into())
            .spawn(move || {
                write_loop(me, peer, shm, &w, &d, &r);
                // Gone: out of the map, so that nothing keeps it but the queue pairs that
                // still name it (their next request dials anew).
                if let Some(links) = links.upgrade() {
                    let mut map = links.lock().unwrap_or_else(|p| p.into_inner());
                    if map.get(&peer).is_some_and(|o| Arc::ptr_eq(o, &w)) {
                        map.remove(&peer);
                    }
                }
            });
        if spawned.is_err() {
            return None;
        }
        map.insert(peer, o.clone());
        Some(o)
    }

    /// Waits (up to `limit` in all) until every packet queued so far has been written to
    /// its peer's socket or its link has died. A datagram or an acknowledgement completes,
    /// on a NIC, once it is on the wire; here once it is queued, so a process that destroys
    /// its queue pair and exits right after would lose what its writer threads had not
    /// written yet: a UD reply, the last datagrams to a second peer. `destroy_qp` calls
    /// this, without the device lock (a writer whose link fails takes it).
    ///
    /// A link whose peer reads nothing for [`FLUSH_STALL`] (a process stopped by `SIGSTOP`
    /// or a debugger, its ring full) is given up then, not at `limit`: two outside testers
    /// saw every close against a stopped peer take a second more than its linger.
    pub(super) fn flush(&self, limit: std::time::Duration) {
        let deadline = Instant::now() + limit;
        let outs: Vec<Arc<Outbound>> = self
            .out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for o in outs {
            let mut q = o.queue.lock().unwrap_or_else(|p| p.into_inner());
            let pending = |q: &OutQueue| !q.dead && (!q.frames.is_empty() || q.writing > 0);
            if q.stuck_at == Some(q.moved) && pending(&q) {
                continue;
            }
            q.flushing += 1;
            // Waits while the link moves frames, in slices: a slice in which nothing moved
            // ends the wait.
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let before = q.moved;
                q = o
                    .ready
                    .wait_timeout_while(q, left.min(FLUSH_STALL), |q| pending(q))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                if !pending(&q) || left <= FLUSH_STALL || q.moved == before {
                    break;
                }
            }
            q.stuck_at = pending(&q).then_some(q.moved);
            q.flushing -= 1;
        }
    }
}

impl Outbound {
    /// Moves queued frames into the shared ring while each fits whole, from the thread that
    /// sends or polls (no hand-off to the writer); returns whether nothing waits any more,
    /// so that a new frame may go straight into the ring. False on a TCP link.
    fn move_to_ring(&self, q: &mut OutQueue) -> bool {
        if q.writing > 0 || q.dead || !self.shm_ready.load(Ordering::Acquire) {
            return false;
        }
        if q.frames.is_empty() {
            return true;
        }
        let Ok(mut shm) = self.shm.try_lock() else {
            return false;
        };
        let Some(s) = shm.as_mut() else {
            return false;
        };
        while let Some(f) = q.frames.front() {
            if !s.try_push(&f.header(), &f.payload) {
                return false;
            }
            q.frames.pop_front();
            q.moved += 1;
        }
        self.set_queued(false);
        if q.flushing > 0 {
            self.ready.notify_all();
        }
        true
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Whether the peer process of the link is gone (its end of the socket closed); before
    /// the link is up, or while its writer holds the ring (it is writing: it finds a peer
    /// that went by itself), it says no. Never waits for the writer, which may wait for room
    /// in the ring while the caller holds the map of links.
    fn peer_gone(&self) -> bool {
        let shm_over = || {
            self.shm
                .try_lock()
                .is_ok_and(|s| s.as_ref().is_some_and(ShmOut::is_over))
        };
        shm_over() || self.tcp_peer_gone()
    }

    /// Whether the peer of a TCP link hung up: its end of the connection makes the life line
    /// readable (false before the link is up, and over shared memory).
    fn tcp_peer_gone(&self) -> bool {
        self.tcp_life_line
            .get()
            .is_some_and(|s| shm_link::hung_up(s.as_fd()) || self.peer_host_silent(s))
    }

    /// Whether the peer host of this TCP link went silent ([`SilenceWatch::look`]).
    fn peer_host_silent(&self, s: &TcpStream) -> bool {
        self.silence
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .look(s)
    }

    /// Says whether frames wait for the polls, keeping [`QUEUED_LINKS`] the count of links
    /// where they do.
    fn set_queued(&self, queued: bool) {
        if self.queued.load(Ordering::Relaxed) != queued
            && self.queued.swap(queued, Ordering::Relaxed) != queued
        {
            if queued {
                QUEUED_LINKS.fetch_add(1, Ordering::Relaxed);
            } else {
                QUEUED_LINKS.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn kill(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.dead = true;
        self.dead.store(true, Ordering::Release);
        self.set_queued(false);
        q.frames.clear();
        q.writing = 0;
        self.ready.notify_all();
    }
}

/// The dialer's first bytes: the address and port it listens on (which name it).
pub(super) const HELLO_LEN: usize = 6;

/// The hello of the device at `me`: its address, then its port (little-endian).
pub(super) fn hello(me: SocketAddrV4) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..4].copy_from_slice(&me.ip().octets());
    h[4..].copy_from_slice(&me.port().to_le_bytes());
    h
}

/// The device a hello names.
pub(super) fn hello_device(h: &[u8; HELLO_LEN]) -> SocketAddrV4 {
    let ip = Ipv4Addr::new(h[0], h[1], h[2], h[3]);
    SocketAddrV4::new(ip, u16::from_le_bytes([h[4], h[5]]))
}

/// Dials the peer device (over shared memory when it is on this host and takes it, else
/// TCP), says which device this is, then writes what is queued.
fn write_loop(
    me: SocketAddrV4,
    peer: SocketAddrV4,
    shm: bool,
    out: &Outbound,
    deliver: &Arc<dyn Deliver>,
    readers: &Readers,
) {
    let shm = (shm && shm_link::same_host(me, peer))
        .then(|| {
            ShmOut::dial(me, peer)
                .inspect_err(|e| {
                    tracing::debug!(%peer, error = %e, "soft0: no shared-memory link; TCP it is");
                })
                .ok()
        })
        .flatten();
    let ended = match shm {
        Some(mut s) => {
            if let Some(d) = s.take_direct() {
                let _ = out.direct.set(d);
            }
            out.peer_pid.store(s.peer_pid(), Ordering::Release);
            *out.shm.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
            {
                // Under the queue's lock: what was queued while the link was being set up
                // is from now on the polls' to move, as what `send` queues after.
                let q = out.queue.lock().unwrap_or_else(|p| p.into_inner());
                out.shm_ready.store(true, Ordering::Release);
                out.set_queued(!q.frames.is_empty());
            }
            shm_write_loop(out)
        }
        None => tcp_write_loop(me, peer, out),
    };
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "soft0: the link to a peer device ended");
    }
    out.kill();
    // Its ring, eventfds and life line go now (queue pairs may hold the link a while).
    out.shm_ready.store(false, Ordering::Release);
    drop(out.shm.lock().unwrap_or_else(|p| p.into_inner()).take());
    // What the peer sent before it went (its reader still holds it) goes first.
    readers.wait_gone(peer, READER_GRACE);
    deliver.link_down(peer, Some(out.number));
}

/// Takes the next frames to write (waiting for them), or `None` once `gone` says the link
/// is over (looked at every [`IDLE_CHECK`] while nothing is queued). While `leave` says so
/// of what is queued, leaves it there and looks again a [`shm_link::NAP`] later.
fn next_batch(
    out: &Outbound,
    gone: &dyn Fn() -> bool,
    leave: &mut dyn FnMut(&OutQueue) -> bool,
) -> Option<Vec<Packet>> {
    let mut q = out.queue.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        // Ended from outside ([`Links::inbound_ended`], [`Links::route_fresh`]).
        if q.dead {
            return None;
        }
        if q.frames.is_empty() {
            q = out
                .ready
                .wait_timeout(q, IDLE_CHECK)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if q.frames.is_empty() && gone() {
                return None;
            }
        } else if leave(&q) {
            q = out
                .ready
                .wait_timeout(q, shm_link::NAP)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            // Polls cannot move frames into the ring of a peer that is gone.
            if gone() {
                return None;
            }
        } else {
            break;
        }
    }
    let n = q.frames.len().min(MAX_BATCH);
    q.writing = n;
    q.moved += n as u64;
    Some(q.frames.drain(..n).collect())
}

/// Marks the frames [`next_batch`] took as written: a flush waiting for them may go on.
fn written(out: &Outbound) {
    out.queue.lock().unwrap_or_else(|p| p.into_inner()).writing = 0;
    out.ready.notify_all();
}

/// Writes what is queued into the shared ring, waiting for room as needed. While the
/// application polls, its polls move the frames (a hand-off to this thread would cost a
/// wake-up per frame): this thread steps in when the polls stop, and for a frame larger
/// than the ring, which goes in pieces.
fn shm_write_loop(out: &Outbound) -> std::io::Result<()> {
    let gone = || {
        out.shm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(true, ShmOut::is_over)
    };
    let capacity = out
        .shm
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map_or(0, ShmOut::capacity);
    let mut watch = shm_link::PollWatch::new();
    loop {
        let Some(batch) = next_batch(out, &gone, &mut |q| {
            let fits = q
                .frames
                .front()
                .is_some_and(|f| HEADER_LEN + f.payload.len() <= capacity);
            watch.busy_polling() && fits
        }) else {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        };
        {
            let mut shm = out.shm.lock().unwrap_or_else(|p| p.into_inner());
            let s = shm.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
            for p in &batch {
                s.write_all(&p.header())?;
                s.write_all(&p.payload)?;
                s.end_packet()?;
            }
        }
        written(out);
    }
}

/// Dials the peer device over TCP and writes what is queued.
fn tcp_write_loop(me: SocketAddrV4, peer: SocketAddrV4, out: &Outbound) -> std::io::Result<()> {
    {
        let mut s = dial_from(me, peer)?;
        s.set_nodelay(true)?;
        watch_peer_host(&s);
        // A write blocked for want of room comes back now and then to look at the peer
        // host ([`write_all_vectored`]).
        s.set_write_timeout(Some(WRITE_LOOK))?;
        s.write_all(&hello(me))?;
        // The peer never writes on this connection: its end (the peer's process gone) makes
        // it readable. Looked at while nothing is queued, so that the link ends then rather
        // than at the next write (the writer held its thread and socket until then).
        let _ = out.tcp_life_line.set(s.try_clone()?);
        let gone = || out.tcp_peer_gone();
        loop {
            let Some(batch) = next_batch(out, &gone, &mut |_| false) else {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            };
            let headers: Vec<[u8; HEADER_LEN]> = batch.iter().map(Packet::header).collect();
            let mut bufs: Vec<&[u8]> = Vec::with_capacity(2 * batch.len());
            for (h, p) in headers.iter().zip(&batch) {
                bufs.push(h);
                if !p.payload.is_empty() {
                    bufs.push(&p.payload);
                }
            }
            write_all_vectored(&mut s, &bufs, &|s| out.peer_host_silent(s))?;
            written(out);
        }
    }
}

/// Connects to `peer` from `me`'s address, so that the peer sees the connection come from
/// the address the hello names (a host with several addresses would otherwise pick the
/// route's).
fn dial_from(me: SocketAddrV4, peer: SocketAddrV4) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddrV4::new(*me.ip(), 0).into())?;
    s.connect(&peer.into())?;
    Ok(s.into())
}

/// A TCP link to a host that stops answering (its link down, the host gone) ends a little
/// after [`PEER_HOST_SILENCE`] (6 to 8 s), as a NIC's requester gives up after its retries:
/// data waiting that long for an acknowledgement, and TCP's next retransmission unanswered
/// ([`SilenceWatch::look`], by the writer), or, on an idle link, keepalive probes unanswered
/// for about as long (set here). Without it a request waited for TCP's own
/// give-up, about 15 minutes (an outside tester's find: a RawConn's WRITE had no completion
/// for minutes while the peer host was unreachable). A peer process that is stopped is not
/// silent: its kernel still acknowledges (with a full window, its probes), so its requests
/// wait, as on a NIC. (`TCP_USER_TIMEOUT` would not wait for it: Linux applies it to a
/// window that stays full, and a stop of 10 s failed a stream of WRITEs, another tester
/// found.)
fn watch_peer_host(s: &TcpStream) {
    let fd = s.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is the open socket `s` owns; the option is a plain int, passed by
        // pointer with its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                std::ptr::from_ref(&value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!(
                name,
                error = %std::io::Error::last_os_error(),
                "soft0: a TCP link's option was not set"
            );
        }
    };
    let secs = PEER_HOST_SILENCE.as_secs() as libc::c_int;
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1);
    // A probe a second from the first second of silence, the link ended when five went
    // unanswered (about 6 s): a probe goes out at the fifth second, so an outage shorter
    // than that ends with an answered probe (with four, a 4.5 s outage ended the link as it
    // came back: an outside tester's find).
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, secs);
}

fn accept_loop(listener: &TcpListener, deliver: &Arc<dyn Deliver>, readers: &Arc<Readers>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            continue;
        };
        let (d, r) = (deliver.clone(), readers.clone());
        let _ = std::thread::Builder::new()
            .name("rsrdma-soft0-recv".into())
            .spawn(move || read_loop(stream, &d, &r));
    }
}

/// Writes every buffer, in order, with vectored writes (what the unstable
/// `Write::write_all_vectored` does).
fn write_all_vectored(
    s: &mut TcpStream,
    bufs: &[&[u8]],
    silent: &dyn Fn(&TcpStream) -> bool,
) -> std::io::Result<()> {
    let (mut first, mut skip) = (0, 0);
    while first < bufs.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(IoSlice::new(&bufs[first][skip..]))
            .chain(bufs[first + 1..].iter().map(|b| IoSlice::new(b)))
            .collect();
        let mut n = match s.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // No room for a while: a peer host that acknowledges nothing ends the link; a
            // peer process that is stopped (its kernel acknowledges, with a full window) is
            // waited for.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if silent(s) {
                    return Err(ErrorKind::TimedOut.into());
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        // Past what went: whole buffers, then into the next one.
        while first < bufs.len() {
            let left = bufs[first].len() - skip;
            if n < left {
                skip += n;
                break;
            }
            n -= left;
            first += 1;
            skip = 0;
        }
    }
    Ok(())
}

/// Reads a peer device's packets and hands them over; its end breaks that peer's links.
fn read_loop(s: TcpStream, deliver: &Arc<dyn Deliver>, readers: &Readers) {
    let came_from = s.peer_addr().ok();
    watch_peer_host(&s);
    // Small packets (acknowledgements, requests) come out of the buffer; a large payload is
    // read past it, straight into the packet's own buffer.
    let mut s = BufReader::with_capacity(64 * 1024, s);
    let mut hello = [0u8; HELLO_LEN];
    if s.read_exact(&mut hello).is_err() {
        return;
    }
    let from = hello_device(&hello);
    let genuine = match came_from {
        Some(std::net::SocketAddr::V4(a)) => {
            a.ip() == from.ip() || a.ip().is_loopback() && from.ip().is_loopback()
        }
        _ => false,
    };
    if !genuine {
        tracing::warn!(
            %from,
            came_from = ?came_from,
            "soft0: a peer named a device at an address it does not come from; refused"
        );
        return;
    }
    readers.reading(from, true);
    let mut recycle = Recycler::default();
    // The link ended because keepalive gave up on the peer's host ([`watch_peer_host`]).
    let mut host_silent = false;
    loop {
        let mut header = [0u8; HEADER_LEN];
        if let Err(e) = s.read_exact(&mut header) {
            host_silent = e.kind() == ErrorKind::TimedOut;
            break;
        }
        let len = Packet::payload_len(&header);
        if len > MAX_PAYLOAD {
            tracing::warn!(%from, len, "soft0: a peer device sent an oversized packet");
            break;
        }
        // Read into the vector's spare capacity: no zeroing of what the read overwrites.
        // A short payload goes into the packet itself (no buffer of the recycler's).
        let payload = if len > INLINE_PAYLOAD {
            // Grown as the bytes come (read_to_end reserves as it goes): a header alone
            // never makes this process reserve what it announces.
            let mut payload = recycle.buffer(len.min(1 << 20));
            match (&mut s).take(len as u64).read_to_end(payload.bytes_mut()) {
                Ok(n) if n == len => {}
                _ => break,
            }
            Payload::from(payload)
        } else {
            let mut short = [0u8; INLINE_PAYLOAD];
            if s.read_exact(&mut short[..len]).is_err() {
                break;
            }
            Payload::from_slice(&short[..len])
        };
        match Packet::decode_parts(&header, payload) {
            Ok(p) => {
                recycle.lend(&p.payload);
                deliver.packet(from, p);
                recycle.reclaim();
            }
            Err(e) => {
                tracing::warn!(%from, error = %e, "soft0: a malformed packet from a peer device");
                break;
            }
        }
    }
    readers.reading(from, false);
    if host_silent {
        // Every queue pair connected there fails, as its requester would: this side may
        // owe that host nothing (its writer idle, everything it sent acknowledged) and wait
        // only for answers on this link (a test saw such a requester wait for ever).
        tracing::warn!(%from, "soft0: a peer host went silent; its queue pairs fail");
        deliver.link_down(from, None);
    }
    deliver.inbound_ended(from, None);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsrdma_soft::PacketKind;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Hands what arrives to a channel (a link that goes down as a packet with no kind's
    /// payload and `dest_qpn` `u32::MAX`).
    struct Collect(Mutex<mpsc::Sender<(SocketAddrV4, Packet)>>);

    const DOWN: u32 = u32::MAX;

    impl Deliver for Collect {
        fn packet(&self, from: SocketAddrV4, packet: Packet) {
            let _ = self.0.lock().unwrap().send((from, packet));
        }

        fn link_down(&self, peer: SocketAddrV4, _: Option<u64>) {
            let _ = self
                .0
                .lock()
                .unwrap()
                .send((peer, packet(DOWN, Vec::new())));
        }
    }

    fn packet(dest_qpn: u32, payload: Vec<u8>) -> Packet {
        Packet {
            solicited: false,
            ack: None,
            dest_qpn,
            psn: 1,
            kind: PacketKind::Send { imm: None },
            payload: payload.into(),
        }
    }

    fn device(
        shm: bool,
    ) -> (
        Links,
        mpsc::Receiver<(SocketAddrV4, Packet)>,
        Arc<dyn Deliver>,
    ) {
        let (tx, rx) = mpsc::channel();
        let deliver: Arc<dyn Deliver> = Arc::new(Collect(Mutex::new(tx)));
        let at = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        (
            Links::start(at, deliver.clone(), shm, None).unwrap(),
            rx,
            deliver,
        )
    }

    /// Sizes from empty to three times a shared ring (which then goes in pieces).
    fn sizes() -> Vec<usize> {
        let cap = shm_link::RING_CAPACITY;
        vec![
            0,
            1,
            47,
            4096,
            65536,
            70001,
            cap - HEADER_LEN,
            cap,
            3 * cap + 5,
            8,
            0,
        ]
    }

    fn bytes(i: usize, len: usize) -> Vec<u8> {
        (0..len).map(|k| (k * 31 + i * 7) as u8).collect()
    }

    #[test]
    fn packets_cross_between_two_devices_of_one_host_whole_and_in_order_over_either_pipe() {
        for shm in [true, false] {
            let (a, _, a_deliver) = device(shm);
            let (b, b_rx, _) = device(shm);
            for round in 0..3 {
                for (i, len) in sizes().into_iter().enumerate() {
                    a.send(
                        b.addr(),
                        packet(i as u32, bytes(i + round, len)),
                        &a_deliver,
                    );
                }
            }
            for round in 0..3 {
                for (i, len) in sizes().into_iter().enumerate() {
                    let (from, p) = b_rx.recv_timeout(Duration::from_secs(20)).unwrap();
                    assert_eq!((from, p.dest_qpn), (a.addr(), i as u32), "shm {shm}");
                    assert!(p.payload == bytes(i + round, len), "packet {i}, shm {shm}");
                }
            }
            // The pipe was the one asked for: a shared ring read by B, or none.
            let rings = b.inbound.read().unwrap().len();
            assert_eq!(rings, usize::from(shm), "shm {shm}");
        }
    }

    #[test]
    fn frames_queued_while_a_shared_link_is_set_up_reach_the_peer_while_the_sender_polls() {
        let (a, _, a_deliver) = device(true);
        let (b, b_rx, _) = device(true);
        let a = Arc::new(a);
        let stop = Arc::new(AtomicBool::new(false));
        // The application polls all along, so the writer leaves queued frames to the polls.
        let poller = {
            let (a, d, stop) = (a.clone(), a_deliver.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    a.progress(&*d);
                    std::thread::yield_now();
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        // The frames queue before the link exists (the writer thread dials it), and no later
        // send moves them.
        for i in 0..3u32 {
            a.send(b.addr(), packet(i, bytes(i as usize, 100)), &a_deliver);
        }
        for i in 0..3u32 {
            let got = b_rx.recv_timeout(Duration::from_secs(5));
            let (_, p) = got.unwrap_or_else(|_| panic!("frame {i} never arrived"));
            assert_eq!(p.dest_qpn, i);
        }
        stop.store(true, Ordering::Relaxed);
        poller.join().unwrap();
    }

    #[test]
    fn a_peer_that_goes_breaks_its_shared_link_after_what_it_sent_arrives() {
        let (b, b_rx, _) = device(true);
        let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7);
        let mut out = ShmOut::dial(me, b.addr()).unwrap();
        assert!(out.try_push(&packet(5, vec![9; 100]).header(), &[9; 100]));
        drop(out);
        let (from, p) = b_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((from, p.dest_qpn, p.payload.len()), (me, 5, 100));
        let (from, p) = b_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((from, p.dest_qpn), (me, DOWN), "the link goes down");
    }

    #[test]
    fn a_peer_that_breaks_the_ring_loses_its_link_and_nothing_else() {
        let (b, b_rx, _) = device(true);
        let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8);
        let out = ShmOut::dial(me, b.addr()).unwrap();
        out.break_ring();
        let (from, p) = b_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((from, p.dest_qpn), (me, DOWN));
        // The device still takes links from others.
        let other = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9);
        let mut out = ShmOut::dial(other, b.addr()).unwrap();
        assert!(out.try_push(&packet(6, Vec::new()).header(), &[]));
        let (from, p) = b_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((from, p.dest_qpn), (other, 6));
    }

    #[test]
    fn a_reader_that_breaks_the_ring_ends_the_link_even_while_the_sender_polls() {
        let (b, _, _) = device(true);
        let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 10);
        let mut out = ShmOut::dial(me, b.addr()).unwrap();
        assert!(!out.is_over());
        // A push finds the bad position: nothing goes, and the link says it is over (the
        // writer thread ends it, whoever moves the frames). The real reader (b's) may
        // publish its good position again between the break and the push (it releases
        // after every look at the ring, and polls elsewhere in this process make it look
        // often): then the push goes through, and the break is tried again.
        for _ in 0..1000 {
            out.break_tail();
            if !out.try_push(&packet(1, Vec::new()).header(), &[]) {
                assert!(out.is_over());
                return;
            }
        }
        panic!("a broken position was never seen by a push");
    }

    #[test]
    fn over_a_unix_socket_a_peer_speaks_only_for_a_device_of_this_host() {
        let (b, b_rx, _) = device(true);
        let elsewhere = SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 4791);
        // The set-up is refused, and nothing arrives.
        assert!(ShmOut::dial(elsewhere, b.addr()).is_err());
        assert!(b_rx.recv_timeout(Duration::from_millis(500)).is_err());
    }

    /// Connects to `links` from the loopback address, says `hello_from` is the device, and
    /// sends one packet.
    fn speak(links: &Links, hello_from: SocketAddrV4) {
        let mut s = TcpStream::connect(links.addr()).unwrap();
        s.write_all(&hello(hello_from)).unwrap();
        s.write_all(&packet(7, vec![1, 2, 3]).encode()).unwrap();
    }

    #[test]
    fn a_peer_speaks_only_for_a_device_at_the_address_it_comes_from() {
        let (tx, rx) = mpsc::channel();
        let deliver: Arc<dyn Deliver> = Arc::new(Collect(Mutex::new(tx)));
        let links = Links::start(
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
            deliver,
            false,
            None,
        )
        .unwrap();
        // From the loopback address, naming another host's device: refused, nothing arrives.
        speak(&links, SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 4791));
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
        // Naming a device on this host (any loopback address): its packet arrives.
        let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 5000);
        speak(&links, me);
        let (from, p) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (from, p.dest_qpn, &p.payload[..]),
            (me, 7, &[1u8, 2, 3][..])
        );
    }
}
