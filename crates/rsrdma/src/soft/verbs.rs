//! The soft device's verbs, with libibverbs' C signatures and conventions (a null pointer
//! with `errno`, or an errno value, or a negative count), on C structs of libibverbs' layout
//! that are the first field of this module's `#[repr(C)]` objects.

use super::device_ptr;
use super::directory::{Directory, PeerDirect, SharedQp, SharedRegion};
use super::fast_hash::FastMap;
use super::link::{Deliver, Links, Route};
use super::qp_core::QpCore;
use super::recycle::{Spare, DEVICE_FREE, DEVICE_FREE_BYTES};
use crate::ffi;
use rsrdma_soft::{
    Access, Bind, Completion, DeregError, Handled, Memory, MrTable, Nak, Packet, PacketKind,
    Payload, PayloadBuf, PostError, QpConfig, QpEvent, QpState, RcQp, RecvWr, SendOp, SendWr, Sge,
    Sges, Srq, UdQp, UdSource,
};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::raw::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

// ----- limits (rxe's, from its rxe_param.h, where the core has no reason to differ) -------

const MAX_QP_WR: u32 = 0x4000;
const MAX_SGE: u32 = 32;
const MAX_INLINE: u32 = 400;
const MAX_CQE: c_int = 0x8000;
const MAX_SRQ_SGE: u32 = 27;
const FIRST_QPN: u32 = 17;
/// The largest UD payload: the port's MTU.
const UD_MTU: u32 = 4096;

// ----- the objects ------------------------------------------------------------------------

#[repr(C)]
struct SoftContext {
    raw: ffi::ibv_context,
    /// Asynchronous events, each also counted on `raw.async_fd` (a semaphore eventfd).
    events: Mutex<VecDeque<ffi::ibv_async_event>>,
    /// The objects named by events the application took and has not acknowledged yet (one
    /// entry per event): their destroy waits for the acknowledgement, as libibverbs' does,
    /// since reading the event reads the object.
    handed: Mutex<Vec<usize>>,
    /// Signalled on each acknowledgement.
    acked: Condvar,
}

#[repr(C)]
struct SoftPd {
    raw: ffi::ibv_pd,
}

#[repr(C)]
struct SoftMr {
    raw: ffi::ibv_mr,
}

/// A type-2 memory window: `raw.handle` is the key it was allocated with, which names it in
/// the device's key table; `raw.rkey` is the application's (its last bind's key).
#[repr(C)]
struct SoftMw {
    raw: ffi::ibv_mw,
}

#[repr(C)]
struct SoftCq {
    raw: ffi::ibv_cq,
    state: Mutex<CqState>,
    /// It holds completions (set and cleared under `state`'s lock): a poll that finds it
    /// clear takes no lock (most polls of a busy-polling thread find nothing).
    pending: AtomicBool,
    /// A thread is polling it (checked in single-threaded mode: [`Exclusive`]).
    busy: AtomicBool,
}

struct CqState {
    wcs: VecDeque<ffi::ibv_wc>,
    capacity: usize,
    /// Armed for the next completion (`Some(false)`), or for the next solicited one only
    /// (`Some(true)`).
    armed: Option<bool>,
}

#[repr(C)]
struct SoftChannel {
    raw: ffi::ibv_comp_channel,
    /// CQs with an event, each also counted on `raw.fd` (a semaphore eventfd).
    events: Mutex<VecDeque<*mut ffi::ibv_cq>>,
}

#[repr(C)]
struct SoftQp {
    raw: ffi::ibv_qp,
    /// A thread is posting to its send queue, or to its receive queue ([`Exclusive`]).
    sq_busy: AtomicBool,
    rq_busy: AtomicBool,
}

#[repr(C)]
struct SoftSrq {
    raw: ffi::ibv_srq,
    /// A thread is posting to it ([`Exclusive`]).
    busy: AtomicBool,
}

/// Whether soft0 plays a provider without locks (`RSRDMA_SOFT_SINGLE_THREADED=1`, as
/// `MLX5_SINGLE_THREADED=1` makes mlx5): it then checks that no two threads ever use one
/// send queue, receive queue, SRQ or CQ at once, and aborts the process when they do, since
/// such a provider would corrupt the queue. Each use holds the queue for [`WINDOW`], so that
/// overlapping uses are caught, not only exactly simultaneous ones.
#[inline]
fn single_threaded() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RSRDMA_SOFT_SINGLE_THREADED").is_some_and(|v| v == "1"))
}

/// How long a checked use holds its queue in single-threaded mode.
const WINDOW: Duration = Duration::from_micros(50);

/// One thread's use of a queue, in single-threaded mode (nothing otherwise).
struct Exclusive<'a>(Option<&'a AtomicBool>);

impl<'a> Exclusive<'a> {
    /// Every post and poll enters: without the check (almost always), that costs a look at
    /// one flag, here in the caller.
    #[inline]
    fn enter(busy: &'a AtomicBool, what: &str, num: u32) -> Exclusive<'a> {
        if !single_threaded() {
            return Exclusive(None);
        }
        Exclusive::enter_checked(busy, what, num)
    }

    #[cold]
    fn enter_checked(busy: &'a AtomicBool, what: &str, num: u32) -> Exclusive<'a> {
        if busy.swap(true, Ordering::AcqRel) {
            // Straight to the stderr stream (a test harness's capture would die with the
            // process).
            let msg = format!(
                "soft0 (single-threaded provider): two threads used {what} {num} at once; a \
                 provider without locks would corrupt it\n"
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
            std::process::abort();
        }
        let until = Instant::now() + WINDOW;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Exclusive(Some(busy))
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.0 {
            b.store(false, Ordering::Release);
        }
    }
}

/// A queue pair's core and where its completions and events go.
struct QpEntry {
    core: QpCore,
    raw: *mut ffi::ibv_qp,
    ctx: *mut SoftContext,
    send_cq: *mut SoftCq,
    recv_cq: *mut SoftCq,
    srq: Option<u32>,
    caps: ffi::ibv_qp_cap,
    /// What `ibv_modify_qp` set, for `ibv_query_qp`.
    attr: ffi::ibv_qp_attr,
    /// Where the peer's device listens: [`QpEntry::peer_of`] the address vector in `attr`.
    remote: SocketAddrV4,
    /// The link to that device, taken as it is connected and again when it died
    /// ([`route_to`]): the end of that link fails it ([`QpEntry::took`]), not the end of an
    /// older link to a process that had the address.
    route: Option<Route>,
    /// Fault injection: completions reach the CQs only this long after they happened
    /// (`faults::delay_completions`); those held meanwhile, in order, with their time.
    delay: Duration,
    held: VecDeque<(Instant, Completion)>,
    /// What the device's directory says of it (connected queue pairs only).
    published: Option<SharedQp>,
    /// It waits in [`State::dirty`] for the next pump.
    dirty: bool,
    /// It holds back an acknowledgement, and is in [`State::owing`].
    owing: bool,
}

struct SrqEntry {
    core: Srq,
    raw: *mut ffi::ibv_srq,
    ctx: *mut SoftContext,
    /// The SGEs a receive may have (`max_sge` as created).
    max_sge: u32,
}

/// Everything the device's queue pairs share, under one lock.
struct State {
    mrs: MrTable,
    qps: FastMap<u32, QpEntry>,
    /// The queue pairs the next pump serves, each once ([`QpEntry::dirty`]): those posted
    /// to, delivered to, changed or timed out since the last one ([`State::touch`]). A pump
    /// serves only these, so its cost does not grow with idle queue pairs. (It served every
    /// one, on every post and poll: with 1024 queue pairs in a process, a send and its
    /// receive took about 100 µs against 1 µs with two.)
    dirty: Vec<u32>,
    /// The queue pairs that hold back an acknowledgement ([`hold_acks`] says when and why),
    /// each once ([`QpEntry::owing`]); [`ACKS_HELD`] says whether there is any.
    owing: Vec<u32>,
    srqs: FastMap<u32, SrqEntry>,
    next_qpn: u32,
    next_handle: u32,
    /// Payloads with a buffer of their own (longer than `INLINE_PAYLOAD`) sent by its queue
    /// pairs, oldest first: once nothing else holds one (its request was acknowledged and
    /// the link wrote it, or its receiver took it), its buffer goes to `spare` for the
    /// next request ([`crate::soft::recycle`] says why).
    lent: VecDeque<Payload>,
    /// Payload memory for the next requests' gathers ([`ProcessMemory::payload_buffer`]):
    /// a `RefCell` because the core asks through `&self`; under the device lock, as all
    /// of the state, so nothing else is locked for it.
    spare: RefCell<Spare>,
}

/// The most payloads waiting to be reused: past that, the oldest is let go.
const MAX_LENT: usize = 1024;

/// Puts `e` (QP `qpn`) in `dirty` for the next pump, once.
fn mark(dirty: &mut Vec<u32>, e: &mut QpEntry, qpn: u32) {
    if !e.dirty {
        e.dirty = true;
        dirty.push(qpn);
    }
}

impl State {
    /// QP `qpn` may have something to send, complete or report: the next pump serves it.
    fn touch(&mut self, qpn: u32) {
        if let Some(e) = self.qps.get_mut(&qpn) {
            mark(&mut self.dirty, e, qpn);
        }
    }

    /// Takes back the memory of the oldest lent payloads that nothing holds any more. One
    /// still held at the front goes to the back, once a pump: a payload held long (its
    /// request waits for an answer, or its link is slow) does not keep those after it from
    /// being reused, and a pump that finds every payload still held looks at two.
    fn reclaim_payloads(&mut self) {
        let spare = self.spare.get_mut();
        let mut passed = false;
        while let Some(front) = self.lent.front() {
            if front.is_shared() && self.lent.len() <= MAX_LENT {
                if passed {
                    break;
                }
                passed = true;
                self.lent.rotate_left(1);
                continue;
            }
            if let Some(p) = self.lent.pop_front() {
                spare.give(p);
            }
        }
    }
}

// SAFETY: the raw pointers in the state name objects of this module that live until their
// destroy verb, which removes them from the state first, under the lock; they are only
// dereferenced under the lock.
unsafe impl Send for State {}

struct Device {
    state: Mutex<State>,
    /// Wakes the timer thread when a pump may have changed what is due.
    timer: Condvar,
    /// Other processes' soft devices (`None` if this one could not listen: then its QPs
    /// reach only this process).
    links: Option<Links>,
    deliver: Arc<dyn Deliver>,
    /// What peers of this host that share memory with it read of its queue pairs and
    /// regions (with shared-memory links only).
    directory: Option<Arc<Directory>>,
}

fn device() -> &'static Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("rsrdma-soft0".into())
            .spawn(timer_thread);
        let deliver: Arc<dyn Deliver> = Arc::new(FromPeers);
        // `open_device` refused a bad address before the device was made.
        let at = configured_addr().unwrap_or(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));
        let shm = super::shm_link::enabled();
        let directory = shm
            .then(|| {
                Directory::create()
                    .inspect_err(|e| {
                        tracing::debug!(error = %e, "soft0: no directory; no direct requests");
                    })
                    .ok()
                    .map(Arc::new)
            })
            .flatten();
        let links = match Links::start(at, deliver.clone(), shm, directory.clone()) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "soft0: no listener; QPs reach this process only");
                None
            }
        };
        Device {
            state: Mutex::new(State {
                mrs: MrTable::new(),
                qps: FastMap::default(),
                dirty: Vec::new(),
                owing: Vec::new(),
                srqs: FastMap::default(),
                next_qpn: FIRST_QPN,
                next_handle: 1,
                lent: VecDeque::new(),
                spare: RefCell::new(Spare::new(DEVICE_FREE, DEVICE_FREE_BYTES)),
            }),
            timer: Condvar::new(),
            links,
            deliver,
            directory,
        }
    })
}

/// The environment variable naming the IPv4 address (and optionally the port) soft0
/// listens on and names itself by (its GID), so that soft devices on other hosts reach it;
/// unset: the loopback address, and only this host's processes.
pub const SOFT_ADDR_ENV: &str = "RSRDMA_SOFT_ADDR";

/// The port a soft device listens on at an address of its host when `RSRDMA_SOFT_ADDR` names
/// none: RoCE v2's UDP port number. A GID alone (an address handle without a LID, as a UD
/// address is) then names the device, as it names a RoCE port.
pub const SOFT_PORT: u16 = 4791;

/// Where `RSRDMA_SOFT_ADDR` says to listen: `ip` (at [`SOFT_PORT`]; at any port on the
/// loopback address) or `ip:port`; the loopback address at any port when unset.
///
/// # Errors
/// A text naming the variable when it is not such an address (unspecified, multicast and
/// broadcast addresses are refused).
pub(crate) fn configured_addr() -> Result<SocketAddrV4, String> {
    let Some(v) = std::env::var_os(SOFT_ADDR_ENV) else {
        return Ok(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));
    };
    let text = v.to_string_lossy();
    let t = text.trim();
    let parsed = t.parse::<SocketAddrV4>().ok().or_else(|| {
        let ip = t.parse::<Ipv4Addr>().ok()?;
        Some(SocketAddrV4::new(
            ip,
            if ip.is_loopback() { 0 } else { SOFT_PORT },
        ))
    });
    match parsed {
        Some(a) if !a.ip().is_unspecified() && !a.ip().is_multicast() && !a.ip().is_broadcast() => {
            Ok(a)
        }
        _ => Err(format!(
            "{SOFT_ADDR_ENV}={text:?} is not an IPv4 address (or address:port) soft0 can \
             listen on"
        )),
    }
}

/// This device's LID: the port it listens on (0 without a listener).
pub(super) fn own_lid() -> u16 {
    own_addr().port()
}

/// Where this device listens (port 0 without a listener: it then reaches this process only).
pub(super) fn own_addr() -> SocketAddrV4 {
    device()
        .links
        .as_ref()
        .map_or(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), Links::addr)
}

/// What arrives from other processes' soft devices.
struct FromPeers;

impl Deliver for FromPeers {
    fn packet(&self, from: SocketAddrV4, p: rsrdma_soft::Packet) {
        let mut st = lock();
        let mut now = LazyNow::default();
        from_peer(&mut st, p, from, &mut now);
        pump(&mut st, &mut now);
    }

    fn packets(&self, from: SocketAddrV4, batch: &mut Vec<rsrdma_soft::Packet>) {
        let mut st = lock();
        let mut now = LazyNow::default();
        for p in batch.drain(..) {
            from_peer(&mut st, p, from, &mut now);
        }
        pump(&mut st, &mut now);
    }

    fn flush_acks(&self) {
        send_held_acks();
    }

    fn inbound_ended(&self, from: SocketAddrV4, pid: Option<u32>) {
        match &device().links {
            Some(l) => l.inbound_ended(from, pid),
            None => self.link_down(from, None),
        }
    }

    fn link_down(&self, peer: SocketAddrV4, link: Option<u64>) {
        let mut st = lock();
        let State { qps, dirty, .. } = &mut *st;
        for (&qpn, e) in qps.iter_mut() {
            let took_it = link.map_or(true, |l| e.took(l));
            if e.remote() == peer && took_it && e.core.state() != QpState::Error {
                e.core.handle_link_down();
                mark(dirty, e, qpn);
            }
        }
        pump(&mut st, &mut LazyNow::default());
    }
}

/// Delivers a packet from the device listening on `from`; a request that no queue pair here
/// executes (none has its number, or the one that has is not in RTR or RTS) is dropped, and
/// that device hears of it (as its transport timer would tell it on a fabric).
fn from_peer(st: &mut State, p: Packet, from: SocketAddrV4, now: &mut LazyNow) {
    let (qpn, psn, request) = (p.dest_qpn, p.psn, p.kind.is_request());
    match deliver(st, p, from, now) {
        Delivery::Taken => {}
        Delivery::NoQp | Delivery::Dropped if request => tell_dropped(from, qpn, psn),
        Delivery::NoQp | Delivery::Dropped => {}
    }
}

impl QpEntry {
    /// Says in the device's directory what a peer reaching this queue pair's memory directly
    /// must check, when that changed (its state, rights, domain, peer).
    fn publish(&mut self) {
        let (Some(dir), QpCore::Rc(q)) = (&device().directory, &self.core) else {
            return;
        };
        let cfg = q.config();
        let now = SharedQp {
            responder: rsrdma_soft::ResponderQp {
                qp_num: cfg.qp_num,
                ready: self.ready(),
                access: cfg.access,
                pd: cfg.pd,
                dest_qpn: q.dest_qpn(),
                unreliable: cfg.unreliable,
            },
            peer: self.remote(),
        };
        if self.published != Some(now) {
            dir.publish_qp(cfg.qp_num, Some(&now));
            self.published = Some(now);
        }
    }

    /// Whether it executes what arrives (RTR or RTS).
    fn ready(&self) -> bool {
        matches!(self.core.state(), QpState::Rtr | QpState::Rts)
    }

    /// After a pump: its state is all that changes outside `ibv_modify_qp` (an error, a
    /// broken link), so only a change of readiness is published again (a pump runs on every
    /// post and poll: it computes nothing else).
    fn republish_state(&mut self) {
        if self.readiness_changed() {
            self.publish();
        }
    }

    /// Whether it took link `link` ([`Route::link`]), the one it keeps now.
    fn took(&self, link: u64) -> bool {
        self.route.as_ref().is_some_and(|r| r.link() == link)
    }

    /// Whether its readiness changed since it was published.
    fn readiness_changed(&self) -> bool {
        self.published
            .is_some_and(|p| p.responder.ready != self.ready())
    }

    /// Where the device its peer QP lives on listens (set at RTR: the LID, and the GID's
    /// address).
    fn remote(&self) -> SocketAddrV4 {
        self.remote
    }

    /// The peer's device address, from the address vector `ibv_modify_qp` set (computed once
    /// there: every packet looks it up).
    fn peer_of(attr: &ffi::ibv_qp_attr) -> SocketAddrV4 {
        let a = &attr.ah_attr;
        // SAFETY: `raw` is the GID's plain bytes.
        let gid = (a.is_global != 0).then_some(unsafe { a.grh.dgid.raw });
        peer_addr(gid.as_ref(), a.dlid)
    }
}

fn lock() -> MutexGuard<'static, State> {
    device().state.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn handle(&mut self) -> u32 {
        let h = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1).max(1);
        h
    }
}

/// The process's memory, at the addresses of registered regions. The core calls it only for
/// ranges its region table checked (inside a region of the right domain, with the right
/// access), and a region's memory stays valid while it is registered (the contract of
/// `ibv_reg_mr`, which [`crate::Mr`] keeps); every access happens under the device lock,
/// during a verb whose caller's contract covers the memory it names. Payload memory comes from
/// the device's spare buffers.
struct ProcessMemory<'a> {
    spare: &'a RefCell<Spare>,
}

impl Memory for ProcessMemory<'_> {
    fn read(&self, addr: u64, out: &mut [u8]) {
        // SAFETY: see the type's docs: a checked range of a live registration.
        unsafe { std::ptr::copy(addr as *const u8, out.as_mut_ptr(), out.len()) }
    }

    fn payload_buffer(&self, capacity: usize) -> PayloadBuf {
        self.spare.borrow_mut().take(capacity)
    }

    fn read_append(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        out.reserve(len);
        // SAFETY: as in `read`; the spare capacity holds at least `len` bytes, which the
        // copy initialises before the length covers them.
        unsafe {
            std::ptr::copy(addr as *const u8, out.as_mut_ptr().add(out.len()), len);
            out.set_len(out.len() + len);
        }
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy(data.as_ptr(), addr as *mut u8, data.len()) }
    }

    fn atomic(&mut self, addr: u64, f: &mut dyn FnMut(u64) -> u64) -> u64 {
        // SAFETY: as in `read`; the core checked that the word is 8-byte aligned. Atomic
        // operations, since the application's own threads may touch the word.
        let word = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
        let mut old = word.load(Ordering::SeqCst);
        loop {
            match word.compare_exchange(old, f(old), Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) => return v,
                Err(v) => old = v,
            }
        }
    }
}

// ----- requests done in a peer's memory ------------------------------------------------------

/// The link a connected queue pair keeps to its peer's device at `remote` (another
/// process's), made again when it died; `None` for a peer of this process or when no link
/// can be started.
fn route_to<'a>(
    route: &'a mut Option<Route>,
    remote: SocketAddrV4,
    links: &Links,
    deliver: &Arc<dyn Deliver>,
) -> Option<&'a Route> {
    if is_own(remote) {
        return None;
    }
    let live = route.as_ref().is_some_and(|r| !r.is_dead());
    if !live {
        *route = links.route_fresh(remote, deliver);
    }
    route.as_ref()
}

/// A peer device's memory, reached directly by queue pair `from`, connected to `dest_qpn`
/// there: the responder's checks are made on what the peer's directory says.
struct Reach<'a> {
    peer: &'a PeerDirect,
    from: u32,
    dest_qpn: u32,
}

impl Reach<'_> {
    /// Runs `f` on where `len` bytes at `addr` through `rkey` are in this process, if the
    /// responder would allow `right` on them now; `None` else. The peer's mappings are held
    /// while `f` runs (a mapping dropped from the cache meanwhile would be unmapped).
    fn with<T>(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        right: Access,
        f: impl FnOnce(*mut u8) -> T,
    ) -> Option<T> {
        let qp = self.peer.view.qp(self.dest_qpn)?;
        // The responder is connected to this very queue pair, on this device (port 0 would
        // be the peer's own process).
        if qp.peer.port() == 0 || !is_own(qp.peer) {
            return None;
        }
        let r = self.peer.view.region(rkey)?;
        if !qp
            .responder
            .allows(self.from, &r.mr, rkey, addr, len, right)
        {
            return None;
        }
        let mut memory = self.peer.memory.lock().unwrap_or_else(|p| p.into_inner());
        let at = memory.at(&r, addr, len)?;
        Some(f(at))
    }
}

impl rsrdma_soft::Direct for Reach<'_> {
    fn write(&mut self, rkey: u32, addr: u64, data: &[u8]) -> bool {
        self.with(rkey, addr, data.len() as u64, Access::REMOTE_WRITE, |to| {
            // SAFETY: `to..to + len` lies in a shared mapping of the peer's region, held
            // while this runs and checked against its file's size; it cannot overlap `data`
            // (this process's own memory, no mapping of a peer's file); the peer's CPU may
            // touch it meanwhile, as it may while a NIC writes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
        })
        .is_some()
    }

    fn write_gather(&mut self, rkey: u32, addr: u64, sges: &[Sge], _local: &dyn Memory) -> bool {
        let len: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        self.with(rkey, addr, len, Access::REMOTE_WRITE, |mut to| {
            for s in sges {
                // SAFETY: the SGE lies in a registered region of this process (the core
                // checked its key and range: `ProcessMemory`'s contract); `to..to + len` as in
                // `write`. One copy, as a NIC's DMA.
                unsafe {
                    std::ptr::copy_nonoverlapping(s.addr as *const u8, to, s.len as usize);
                    to = to.add(s.len as usize);
                }
            }
        })
        .is_some()
    }

    fn read_scatter(
        &mut self,
        rkey: u32,
        addr: u64,
        sges: &[Sge],
        _local: &mut dyn Memory,
    ) -> bool {
        let len: u64 = sges.iter().map(|s| u64::from(s.len)).sum();
        self.with(rkey, addr, len, Access::REMOTE_READ, |mut from| {
            for s in sges {
                // SAFETY: as in `write_gather`, the other way (the core checked the SGE for
                // local write).
                unsafe {
                    std::ptr::copy_nonoverlapping(from, s.addr as *mut u8, s.len as usize);
                    from = from.add(s.len as usize);
                }
            }
        })
        .is_some()
    }

    fn read(&mut self, rkey: u32, addr: u64, len: usize, out: &mut Vec<u8>) -> bool {
        self.with(rkey, addr, len as u64, Access::REMOTE_READ, |from| {
            out.reserve(len);
            // SAFETY: as in `write`, the other way; the spare capacity holds `len` bytes,
            // which the copy initialises before the length covers them.
            unsafe {
                std::ptr::copy_nonoverlapping(from, out.as_mut_ptr().add(out.len()), len);
                out.set_len(out.len() + len);
            }
        })
        .is_some()
    }

    fn atomic(&mut self, rkey: u32, addr: u64, f: &mut dyn FnMut(u64) -> u64) -> Option<u64> {
        self.with(rkey, addr, 8, Access::REMOTE_ATOMIC, |at| {
            // A directory that lies about a region's offset could make the word misaligned
            // here even where the peer's address is aligned: refuse it (the packet path then
            // lets the responder judge).
            if at as usize % 8 != 0 {
                return None;
            }
            // SAFETY: an 8-byte aligned word (checked above) in a held shared mapping, which
            // both processes touch only atomically as atomics.
            let word = unsafe { AtomicU64::from_ptr(at.cast::<u64>()) };
            let mut old = word.load(Ordering::SeqCst);
            loop {
                match word.compare_exchange(old, f(old), Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) => return Some(v),
                    Err(v) => old = v,
                }
            }
        })
        .flatten()
    }
}

// ----- progress -----------------------------------------------------------------------------

/// The time, read once at most and only when something needs it (a held completion, an RNR
/// timer): a clock read in every post and every delivery was a twentieth of a latency
/// test's time.
#[derive(Default)]
struct LazyNow(Option<Instant>);

impl LazyNow {
    fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// What became of a packet handed to this device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// A queue pair took it (or dropped it as it should, unheard of).
    Taken,
    /// No queue pair has its number.
    NoQp,
    /// A request dropped by a queue pair that is not in RTR or RTS: its requester must hear
    /// of it ([`Nak::Dropped`]).
    Dropped,
}

/// Hands a packet that came from the device listening on `from` to its QP: a connected QP
/// takes only its peer device's packets of its own transport, a UD QP only datagrams. A
/// notice that a request was dropped goes to the queue pair connected to the one that
/// dropped it. Under the lock.
fn deliver(st: &mut State, p: Packet, from: SocketAddrV4, now: &mut LazyNow) -> Delivery {
    if p.kind == PacketKind::Nak(Nak::Dropped) {
        requests_dropped(st, p, from, now);
        return Delivery::Taken;
    }
    let State {
        qps,
        srqs,
        mrs,
        dirty,
        spare,
        ..
    } = st;
    let Some(d) = qps.get_mut(&p.dest_qpn) else {
        return Delivery::NoQp;
    };
    mark(dirty, d, p.dest_qpn);
    let remote = d.remote();
    let srq = d.srq.and_then(|h| srqs.get_mut(&h)).map(|s| &mut s.core);
    let datagram = matches!(p.kind, PacketKind::Datagram { .. });
    match &mut d.core {
        QpCore::Rc(q) if !datagram && same_device(remote, from) => {
            // Inside the application's poll, its acknowledgement may wait for an answer to
            // carry it ([`hold_acks`]); elsewhere it goes at once (and one held before, too).
            q.set_hold_acks(hold_acks());
            let handled = q.handle_packet(p, mrs, &mut ProcessMemory { spare }, srq, || now.get());
            if handled == Handled::Dropped {
                return Delivery::Dropped;
            }
        }
        // Not (or no longer) connected to the device it came from (not up yet, failed, or
        // reset and connected elsewhere): a request is dropped here, as by a NIC, and its
        // requester hears of it.
        QpCore::Rc(q) if !datagram && p.kind.is_request() && !q.config().unreliable => {
            return Delivery::Dropped;
        }
        QpCore::Ud(q) if datagram => {
            let src = UdSource {
                lid: from.port(),
                gid: gid_of_addr(from),
            };
            q.handle_datagram(p, src, own_gid(), mrs, &mut ProcessMemory { spare }, srq);
        }
        _ => {}
    }
    Delivery::Taken
}

/// The device listening on `from` says that its queue pair `p.dest_qpn` dropped our request
/// `p.psn` unexecuted: the queue pair connected to that one hears of it (and sends again
/// after its timeout, or fails the request).
fn requests_dropped(st: &mut State, p: Packet, from: SocketAddrV4, now: &mut LazyNow) {
    let State {
        qps,
        mrs,
        dirty,
        spare,
        ..
    } = st;
    for (&qpn, e) in qps.iter_mut() {
        let remote = e.remote();
        let QpCore::Rc(q) = &mut e.core else {
            continue;
        };
        if q.dest_qpn() == p.dest_qpn && same_device(remote, from) {
            let notice = p.clone();
            let _ = q.handle_packet(notice, mrs, &mut ProcessMemory { spare }, None, || {
                now.get()
            });
            mark(dirty, e, qpn);
        }
    }
}

/// Tells the device listening on `to` that queue pair `qpn` here dropped its request `psn`.
fn tell_dropped(to: SocketAddrV4, qpn: u32, psn: u32) {
    let dev = device();
    if let Some(l) = &dev.links {
        let notice = Packet::dropped(qpn, psn);
        // A link that cannot be started: that device's requester learns of it as of a dead
        // peer, from the link.
        let _ = l.send(to, notice, &dev.deliver);
    }
}

/// Whether two device addresses name the same device (this one, however named).
fn same_device(a: SocketAddrV4, b: SocketAddrV4) -> bool {
    a == b || is_own(a) && is_own(b)
}

/// Whether a device address names this device (port 0: "this process", as a QP connected
/// without a LID).
fn is_own(addr: SocketAddrV4) -> bool {
    let own = own_addr();
    addr.port() == 0
        || addr.port() == own.port()
            && (addr.ip() == own.ip() || addr.ip().is_loopback() && own.ip().is_loopback())
}

/// The next packet QP `qpn` has to send, and where the device it goes to listens.
fn transmit(st: &mut State, qpn: u32) -> Option<(SocketAddrV4, Packet)> {
    let e = st.qps.get_mut(&qpn)?;
    let remote = e.remote();
    match &mut e.core {
        QpCore::Rc(q) => q.poll_transmit().map(|p| (remote, p)),
        // A datagram to a GID no soft device has goes nowhere (as into a fabric without that
        // port); it must not reach this device's QP of that number.
        QpCore::Ud(q) => loop {
            let (to, p) = q.poll_transmit()?;
            if names_a_soft_device(&to.gid) {
                return Some((peer_addr(Some(&to.gid), to.lid), p));
            }
        },
    }
}

/// Whether a UD destination's GID can name a soft device: an IPv4-mapped address (any host's
/// device) or a soft device's link-local GID (an address handle always has a GRH: the port is
/// RoCE-like).
pub(super) fn names_a_soft_device(gid: &[u8; 16]) -> bool {
    gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] || gid[..14] == link_local_gid(0)[..14]
}

/// Serves the queue pairs touched since the last pump ([`State::dirty`]): hands each one's
/// packets to their destinations (a queue pair of this process delivered to is touched in
/// turn, and served in this pump), then its completions and events. Under the lock.
fn pump(st: &mut State, now: &mut LazyNow) {
    st.reclaim_payloads();
    serve_dirty(st, now, false);
}

/// [`pump`] after a post to QP `qpn`, which alone has something new: it is served at once,
/// without going through [`State::dirty`] (a post to a queue pair whose peer lives in another
/// process touches no other queue pair; one that does is served by the pump that follows).
fn pump_posted(st: &mut State, qpn: u32, now: &mut LazyNow) {
    if !st.dirty.is_empty() {
        st.touch(qpn);
        pump(st, now);
        return;
    }
    st.reclaim_payloads();
    let State { qps, owing, .. } = st;
    if let Some(e) = qps.get_mut(&qpn) {
        if e.quiet_after_post() {
            // Its requests left, and the post gave nothing to complete, report or time:
            // a turn would find nothing to do (a third of a post's instructions went to that
            // turn when a request to another process carried nothing else).
            note_owing(owing, e, qpn);
            note_acks_held(owing);
            return;
        }
    }
    let timer = serve(st, qpn, now);
    serve_dirty(st, now, timer);
}

/// Says without the lock whether any queue pair holds back an acknowledgement
/// ([`ACKS_HELD`]).
fn note_acks_held(owing: &[u32]) {
    let held = !owing.is_empty();
    if ACKS_HELD.load(Ordering::Relaxed) != held {
        ACKS_HELD.store(held, Ordering::Relaxed);
    }
}

/// Serves every queue pair in [`State::dirty`] (those that serving one touches too), then
/// what the device as a whole reports; `timer`: the timer thread must look again.
fn serve_dirty(st: &mut State, now: &mut LazyNow, mut timer: bool) {
    let mut i = 0;
    while i < st.dirty.len() {
        let qpn = st.dirty[i];
        i += 1;
        timer |= serve(st, qpn, now);
    }
    st.dirty.clear();
    note_acks_held(&st.owing);
    for s in st.srqs.values_mut() {
        if s.core.poll_limit_event() {
            let mut a: ffi::ibv_async_event = zeroed();
            a.event_type = ffi::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED;
            a.element.srq = s.raw;
            // SAFETY: the SRQ's context outlives it.
            unsafe { push_event(s.ctx, a) };
        }
    }
    // The timer thread only needs to hear of a retry or a held completion now due.
    if timer {
        device().timer.notify_one();
    }
}

/// QP `qpn`'s turn in a pump: its packets to their destinations, its completions and events
/// to its CQs and context. Returns whether the timer thread must look again (a retry or a
/// held completion is now due).
fn serve(st: &mut State, qpn: u32, now: &mut LazyNow) -> bool {
    let State {
        qps, lent, owing, ..
    } = st;
    // A queue pair destroyed since it was touched is simply not there.
    let Some(e) = qps.get_mut(&qpn) else {
        return false;
    };
    e.dirty = false;
    if e.core.held_acks() >= ACK_EVERY {
        e.core.flush_ack();
    }
    // Its completions reach their CQs before its packets leave, as rxe's responder
    // completes before it acknowledges: a receive completion its CQ has no room for fails
    // the queue pair, which drops the acknowledgement of that SEND, so its sender does
    // not count delivered what the application never saw (an outside tester's find:
    // SUCCESS at the sender, the receive completion lost). Then once more, for what
    // sending completed (a datagram completes once it is queued).
    let unanswered = e.finish_turn(now);
    if unanswered.is_none() && e.send_to_peer_process(lent) {
        // Its packets went to another process: the rest of its turn is its own (the
        // general way below looks it up twice more).
        let (timer, unanswered) = e.end_turn(owing, qpn, now);
        answer_dropped(st, qpn, unanswered, now);
        return timer;
    }
    answer_dropped(st, qpn, unanswered, now);
    send_packets(st, qpn, now);
    let State { qps, owing, .. } = st;
    let Some(e) = qps.get_mut(&qpn) else {
        return false;
    };
    let (timer, unanswered) = e.end_turn(owing, qpn, now);
    answer_dropped(st, qpn, unanswered, now);
    timer
}

// ----- held acknowledgements ---------------------------------------------------------------

/// A request that the application's poll takes from a shared ring while the ring's reader
/// naps (the application busy-polls: `shm_link::Inbound::drain`) is acknowledged late: the
/// acknowledgement is held back (`RcQp::set_hold_acks`), and the queue pair's next request
/// carries it, or it goes as an ACK packet when the application's poll finds nothing to do
/// (a poll that read nothing from the links and found its CQ empty), when a CQ is armed, when
/// it covers [`ACK_EVERY`] requests, when the queue pair changes state or is destroyed, at
/// exit, and at the latest when the napping reader wakes (`shm_link::NAP`, 1 ms). A
/// ping-pong's answer then acknowledges the request it answers: one packet each way instead
/// of two (a fifth of soft0's round trip was its ACKs), and a stream's receiver acknowledges
/// a batch at once. Whatever else delivers (a link's thread, a poll while the reader
/// sleeps, this process's own queue pairs) acknowledges at once, as before.
fn hold_acks() -> bool {
    super::shm_link::delivering_for_a_busy_poll()
}

/// Whether any queue pair holds back an acknowledgement (`State::owing` is not empty): read
/// without the lock by the polls that would flush them.
static ACKS_HELD: AtomicBool = AtomicBool::new(false);

/// A held-back acknowledgement goes once it covers this many requests: a stream's requester
/// does not wait for a whole send queue's worth.
const ACK_EVERY: u32 = 16;

/// Notes (after QP `qpn`'s turn in a pump) whether it holds back an acknowledgement.
fn note_owing(owing: &mut Vec<u32>, e: &mut QpEntry, qpn: u32) {
    let holds = e.core.held_acks() > 0;
    if holds != e.owing {
        e.owing = holds;
        if holds {
            owing.push(qpn);
        } else {
            owing.retain(|&q| q != qpn);
        }
    }
}

/// Queues every held-back acknowledgement as an ACK packet (the next pump sends them).
fn flush_held_acks(st: &mut State) {
    let State {
        qps, dirty, owing, ..
    } = st;
    for qpn in owing.drain(..) {
        if let Some(e) = qps.get_mut(&qpn) {
            e.owing = false;
            if e.core.flush_ack() {
                mark(dirty, e, qpn);
            }
        }
    }
}

/// Sends the held-back acknowledgements now, if there are any.
pub(super) fn send_held_acks() {
    if ACKS_HELD.load(Ordering::Relaxed) {
        let mut st = lock();
        flush_held_acks(&mut st);
        pump(&mut st, &mut LazyNow::default());
    }
}

/// Tells the requester connected to QP `qpn` that its request `psn` was dropped (`qpn` failed
/// before it answered: see [`QpEntry::finish_turn`]), so that it sends it again after its
/// transport timer and, finding `qpn` failed, ends with `RETRY_EXC_ERR`, as a requester
/// whose answer never came does on a NIC.
#[inline]
fn answer_dropped(st: &mut State, qpn: u32, psn: Option<u32>, now: &mut LazyNow) {
    // Almost every turn leaves nothing unanswered: no look-up then.
    if let Some(psn) = psn {
        tell_unanswered(st, qpn, psn, now);
    }
}

/// [`answer_dropped`]'s notice, for a request `psn` that is unanswered.
#[cold]
fn tell_unanswered(st: &mut State, qpn: u32, psn: u32, now: &mut LazyNow) {
    let Some(e) = st.qps.get(&qpn) else {
        return;
    };
    let to = e.remote();
    if is_own(to) {
        requests_dropped(st, Packet::dropped(qpn, psn), own_addr(), now);
    } else {
        tell_dropped(to, qpn, psn);
    }
}

/// Hands every packet QP `qpn` has to send to its destination: another process's device
/// through a link, or a queue pair of this one (delivered now).
fn send_packets(st: &mut State, qpn: u32, now: &mut LazyNow) {
    if send_to_peer_process(st, qpn) {
        return;
    }
    while let Some((to, pkt)) = transmit(st, qpn) {
        let request = pkt.kind.is_request();
        if pkt.payload.has_buffer() {
            st.lent.push_back(pkt.payload.clone());
        }
        if !is_own(to) {
            // The destination lives in another process.
            let dev = device();
            match &dev.links {
                Some(l) => {
                    // A connected QP's packets take the link it keeps.
                    let sent = match st.qps.get_mut(&qpn) {
                        Some(e) if e.remote == to => route_to(&mut e.route, to, l, &dev.deliver)
                            .is_some_and(|r| Links::send_on(r, pkt)),
                        _ => l.send(to, pkt, &dev.deliver),
                    };
                    if !sent {
                        if let Some(e) = st.qps.get_mut(&qpn) {
                            e.core.handle_link_down();
                        }
                    }
                }
                // A datagram is simply lost; a connection breaks.
                None => {
                    if let Some(e) = st.qps.get_mut(&qpn) {
                        e.core.handle_link_down();
                    }
                }
            }
            continue;
        }
        let (psn, to_qpn) = (pkt.psn, pkt.dest_qpn);
        match deliver(st, pkt, own_addr(), now) {
            // The peer QP is gone: as a peer that died, its sender's link breaks.
            Delivery::NoQp if request => {
                if let Some(e) = st.qps.get_mut(&qpn) {
                    e.core.handle_link_down();
                }
            }
            // The peer QP dropped it (not in RTR or RTS): its sender hears of it.
            Delivery::Dropped => {
                let notice = Packet::dropped(to_qpn, psn);
                requests_dropped(st, notice, own_addr(), now);
            }
            _ => {}
        }
    }
}

/// [`send_packets`] for a connected queue pair whose peer lives in another process, over the
/// link it keeps: every packet with one look-up of the queue pair (the general way looks it up
/// two or three times a packet, and once more to find nothing left). Returns false, having
/// sent nothing, for any other queue pair.
fn send_to_peer_process(st: &mut State, qpn: u32) -> bool {
    let State { qps, lent, .. } = st;
    qps.get_mut(&qpn)
        .is_some_and(|e| e.send_to_peer_process(lent))
}

impl QpEntry {
    /// [`send_to_peer_process`] for this queue pair; `lent`: [`State::lent`].
    fn send_to_peer_process(&mut self, lent: &mut VecDeque<Payload>) -> bool {
        let (QpCore::Rc(q), Some(links)) = (&mut self.core, &device().links) else {
            return false;
        };
        if is_own(self.remote) {
            return false;
        }
        let dev = device();
        while let Some(pkt) = q.poll_transmit() {
            if pkt.payload.has_buffer() {
                lent.push_back(pkt.payload.clone());
            }
            let sent = route_to(&mut self.route, self.remote, links, &dev.deliver)
                .is_some_and(|r| Links::send_on(r, pkt));
            if !sent {
                q.handle_link_down();
            }
        }
        true
    }

    /// The end of its turn in a pump: its state republished if that changed, its
    /// completions to its CQs (or held, under an injected delay), its events to its
    /// context. When a completion found no room, the queue pair fails before its answers
    /// leave, and this returns the PSN of the first request left unanswered (its requester
    /// must hear of it: [`answer_dropped`]).
    fn finish_turn(&mut self, now: &mut LazyNow) -> Option<u32> {
        // Most turns have nothing to finish (a pump runs it twice per queue pair, on every
        // post and delivery): they pay for the look only.
        if !self.core.has_output() && self.held.is_empty() && !self.readiness_changed() {
            return None;
        }
        self.republish_state();
        // A completion its CQ had no room for (the CQ overran): as rxe, the QP fails.
        let mut lost = false;
        while let Some(c) = self.core.poll_completion() {
            if self.delay.is_zero() && self.held.is_empty() {
                lost |= !self.complete(&c);
            } else {
                // Behind those already held: a QP's completions keep their order.
                self.held.push_back((now.get() + self.delay, c));
            }
        }
        while self.held.front().is_some_and(|(t, _)| *t <= now.get()) {
            if let Some((_, c)) = self.held.pop_front() {
                lost |= !self.complete(&c);
            }
        }
        let mut unanswered = None;
        if lost && self.core.state() != QpState::Error {
            // The answers not yet sent go with the failure; the first of them names the
            // request its requester now waits for.
            if let QpCore::Rc(q) = &mut self.core {
                // An acknowledgement held back is newer than every answer queued: the first
                // request it covers is unanswered only when no answer is queued.
                let held = q.drop_held_ack();
                while let Some(p) = q.poll_transmit() {
                    if !p.kind.is_request() && unanswered.is_none() && !q.config().unreliable {
                        unanswered = Some(p.psn);
                    }
                }
                unanswered = unanswered.or(held);
            }
            self.core.move_to_error();
            while let Some(c) = self.core.poll_completion() {
                self.complete(&c);
            }
            self.republish_state();
        }
        while let Some(ev) = self.core.poll_event() {
            if ev != QpEvent::LastWqeReached {
                continue;
            }
            let mut a: ffi::ibv_async_event = zeroed();
            a.event_type = ffi::ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED;
            a.element.qp = self.raw;
            // SAFETY: the QP's context outlives it.
            unsafe { push_event(self.ctx, a) };
        }
        unanswered
    }

    /// Hands a completion to the QP's send or receive CQ; false when that CQ overran (the
    /// completion is lost with it).
    fn complete(&self, c: &Completion) -> bool {
        let cq = if (c.opcode as u32) >= 128 {
            self.recv_cq
        } else {
            self.send_cq
        };
        // SAFETY: a QP's CQs outlive it (rsrdma's `Qp` holds them; destroy_qp removes the
        // entry first).
        unsafe { push_completion(cq, c) }
    }

    /// The end of its turn in a pump, after its packets left ([`serve`]): what sending
    /// completed to its CQs, its held-back acknowledgement noted in `owing`. Returns whether
    /// the timer thread must look again, and the request a failure left unanswered, if any.
    fn end_turn(
        &mut self,
        owing: &mut Vec<u32>,
        qpn: u32,
        now: &mut LazyNow,
    ) -> (bool, Option<u32>) {
        let unanswered = self.finish_turn(now);
        let timer = self.next_due().is_some();
        note_owing(owing, self, qpn);
        (timer, unanswered)
    }

    /// After a post to it: whether its turn in a pump would do nothing but note a held-back
    /// acknowledgement. An RC queue pair whose packets all left (to another process: see
    /// [`QpEntry::send_to_peer_process`]), with no completion, event or held completion,
    /// no change of readiness to publish, no acknowledgement due and no retry to time; its
    /// post touched no SRQ and no other queue pair.
    fn quiet_after_post(&self) -> bool {
        let QpCore::Rc(q) = &self.core else {
            return false;
        };
        !q.has_packets()
            && !q.has_output()
            && q.held_acks() < ACK_EVERY
            && q.poll_timeout().is_none()
            && self.held.is_empty()
            && !self.readiness_changed()
    }

    /// When the timer thread must next act for this QP: an RNR retry, or a held completion.
    fn next_due(&self) -> Option<Instant> {
        let held = self.held.front().map(|(t, _)| *t);
        match (self.core.poll_timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

// ----- fault injection (`super::faults`) ----------------------------------------------------

/// Runs `f` on QP `qp_num` under the device lock, then pumps; false when there is no such QP
/// or `f` refuses.
fn with_qp(qp_num: u32, f: impl FnOnce(&mut QpEntry) -> bool) -> bool {
    let mut st = lock();
    let Some(e) = st.qps.get_mut(&qp_num) else {
        return false;
    };
    let done = f(e);
    st.touch(qp_num);
    pump(&mut st, &mut LazyNow::default());
    done
}

/// The context of QP `qp_num` reports IBV_EVENT_DEVICE_FATAL; nothing else changes. False
/// when there is no such QP.
pub(super) fn raise_device_fatal(qp_num: u32) -> bool {
    raise_event(qp_num, ffi::ibv_event_type::IBV_EVENT_DEVICE_FATAL, None)
}

/// The context of QP `qp_num` reports its port (1) going down (`up`: active again); nothing
/// else changes. False when there is no such QP.
pub(super) fn raise_port_event(qp_num: u32, up: bool) -> bool {
    raise_event(
        qp_num,
        if up {
            ffi::ibv_event_type::IBV_EVENT_PORT_ACTIVE
        } else {
            ffi::ibv_event_type::IBV_EVENT_PORT_ERR
        },
        Some(1),
    )
}

/// The context of QP `qp_num` reports `event_type` (of `port`, for a port's event). False
/// when there is no such QP.
fn raise_event(qp_num: u32, event_type: ffi::ibv_event_type, port: Option<c_int>) -> bool {
    let st = lock();
    let Some(e) = st.qps.get(&qp_num) else {
        return false;
    };
    let mut a: ffi::ibv_async_event = zeroed();
    a.event_type = event_type;
    if let Some(p) = port {
        a.element.port_num = p;
    }
    // SAFETY: a QP's context outlives it.
    unsafe { push_event(e.ctx, a) };
    true
}

/// QP `qp_num` fails as on a fatal error: ERROR, everything it holds flushes, and the
/// context reports IBV_EVENT_QP_FATAL.
pub(super) fn fail_qp(qp_num: u32) -> bool {
    with_qp(qp_num, |e| {
        e.core.move_to_error();
        let mut a: ffi::ibv_async_event = zeroed();
        a.event_type = ffi::ibv_event_type::IBV_EVENT_QP_FATAL;
        a.element.qp = e.raw;
        // SAFETY: the QP's context outlives it.
        unsafe { push_event(e.ctx, a) };
        true
    })
}

/// QP `qp_num` loses its peer, as when the peer's host dies: its oldest request still
/// waiting for an answer ends with RETRY_EXC_ERR, then it fails (a UC or UD QP never
/// notices).
pub(super) fn cut_link(qp_num: u32) -> bool {
    with_qp(qp_num, |e| {
        e.core.handle_link_down();
        true
    })
}

/// The next `count` requests that need a receive at QP `qp_num` find none (RC: RNR NAK).
pub(super) fn refuse_receives(qp_num: u32, count: u32) -> bool {
    with_qp(qp_num, |e| match &mut e.core {
        QpCore::Rc(q) => {
            q.refuse_receives(count);
            true
        }
        QpCore::Ud(_) => false,
    })
}

/// QP `qp_num`'s completions reach its CQs `delay` after they happen.
pub(super) fn delay_completions(qp_num: u32, delay: Duration) -> bool {
    with_qp(qp_num, |e| {
        e.delay = delay;
        true
    })
}

/// The PSN's bits on the wire (BTH_PSN_MASK).
const PSN_MASK: u32 = 0x00ff_ffff;

/// All-zero C data.
pub(super) fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for the plain C structs of the bindings and libc's
    // `sockaddr_storage` and `tcp_info`, for which all-zero is valid (null pointers, `None`
    // function pointers, zero integers and enum newtypes).
    unsafe { std::mem::zeroed() }
}

/// # Safety
/// `cq` is a live soft CQ.
unsafe fn push_completion(cq: *mut SoftCq, c: &Completion) -> bool {
    let mut wc: ffi::ibv_wc = zeroed();
    wc.wr_id = c.wr_id;
    wc.status = ffi::ibv_wc_status(c.status as u32);
    wc.opcode = ffi::ibv_wc_opcode(c.opcode as u32);
    wc.byte_len = c.byte_len;
    wc.qp_num = c.qp_num;
    wc.src_qp = c.src_qp;
    wc.slid = c.slid;
    if let Some(imm) = c.imm {
        wc.__bindgen_anon_1.imm_data = imm;
        wc.wc_flags |= ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
    }
    if let Some(rkey) = c.invalidated_rkey {
        wc.__bindgen_anon_1.invalidated_rkey = rkey;
        wc.wc_flags |= ffi::ibv_wc_flags::IBV_WC_WITH_INV.0;
    }
    if c.grh {
        wc.wc_flags |= ffi::ibv_wc_flags::IBV_WC_GRH.0;
    }
    // SAFETY: the caller's contract.
    let cq = unsafe { &*cq };
    let mut st = cq.state.lock().unwrap_or_else(|p| p.into_inner());
    if st.wcs.len() >= st.capacity {
        // As rxe: the completion is lost, the context hears of it (CQ_ERR, each time), and
        // what the CQ holds stays there to be polled.
        let mut a: ffi::ibv_async_event = zeroed();
        a.event_type = ffi::ibv_event_type::IBV_EVENT_CQ_ERR;
        a.element.cq = std::ptr::from_ref(&cq.raw).cast_mut();
        // SAFETY: a CQ's context outlives it; soft CQs are made on soft contexts.
        unsafe { push_event(cq.raw.context.cast::<SoftContext>(), a) };
        return false;
    }
    st.wcs.push_back(wc);
    cq.pending.store(true, Ordering::Release);
    // As rxe: an arm for any completion fires on this one; an arm for solicited ones only,
    // on a solicited receive (or a failed receive: those are solicited).
    if st.armed.is_some_and(|only| !only || c.solicited) {
        st.armed = None;
        super::shm_link::cq_fired();
        let channel = cq.raw.channel.cast::<SoftChannel>();
        if !channel.is_null() {
            // SAFETY: a CQ's channel outlives it (rsrdma's `Cq` holds it).
            let ch = unsafe { &*channel };
            ch.events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(std::ptr::from_ref(&cq.raw).cast_mut());
            signal(ch.raw.fd);
        }
    }
    true
}

/// # Safety
/// `ctx` is a live soft context.
unsafe fn push_event(ctx: *mut SoftContext, e: ffi::ibv_async_event) {
    // SAFETY: the caller's contract.
    let ctx = unsafe { &*ctx };
    ctx.events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(e);
    signal(ctx.raw.async_fd);
}

/// Drops the queued events of a QP, SRQ or CQ that is being destroyed, then waits until the
/// application has acknowledged those of its events it already took: an event must not name
/// a freed object (reading an event reads its object; libibverbs' destroy verbs wait the
/// same way). Not under the device lock.
///
/// # Safety
/// `ctx` is a live soft context.
unsafe fn forget_events(ctx: *mut SoftContext, of: *mut c_void) {
    // SAFETY: the caller's contract.
    let ctx = unsafe { &*ctx };
    let mut q = ctx.events.lock().unwrap_or_else(|p| p.into_inner());
    let before = q.len();
    // SAFETY: reading the pointer member of events this module made (QP, SRQ or CQ events;
    // a port's number never equals an object's address).
    q.retain(|e| unsafe { e.element.qp.cast::<c_void>() } != of);
    for _ in q.len()..before {
        take_signal(ctx.raw.async_fd);
    }
    drop(q);
    let mut handed = ctx.handed.lock().unwrap_or_else(|p| p.into_inner());
    while handed.contains(&(of as usize)) {
        handed = ctx.acked.wait(handed).unwrap_or_else(|p| p.into_inner());
    }
}

/// Whether an event of this type names an object (a QP, SRQ or CQ) rather than a port or
/// the device.
fn names_object(t: ffi::ibv_event_type) -> bool {
    use crate::async_event::{AsyncEventKind, Target};
    matches!(
        AsyncEventKind::from_raw(t).target(),
        Target::Qp | Target::Srq | Target::Cq
    )
}

/// `ibv_ack_async_event` of a soft event: its object may now be destroyed.
///
/// # Safety
/// `event` came from [`get_async_event`] and is acknowledged once; its object is alive (its
/// destroy waits for this).
pub(crate) unsafe fn ack_async_event(event: *mut ffi::ibv_async_event) {
    // SAFETY: the caller's contract; every soft event's object starts with its verbs struct,
    // and QP, SRQ and CQ structs hold their context at the same place as the event type says.
    let (of, ctx) = unsafe {
        let e = &*event;
        let of = e.element.qp.cast::<c_void>();
        let ctx = match super::event_context(e) {
            Some(c) => c.cast::<SoftContext>(),
            None => return,
        };
        (of, &*ctx)
    };
    let mut handed = ctx.handed.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = handed.iter().position(|&o| o == of as usize) {
        handed.swap_remove(i);
        ctx.acked.notify_all();
    }
}

/// Counts one on a semaphore eventfd.
pub(super) fn signal(fd: c_int) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write from a valid u64 (to an eventfd of this module's or of a
    // shared-memory link's).
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Takes one count off a semaphore eventfd (non-blocking); false when it is zero.
pub(super) fn take_signal(fd: c_int) -> bool {
    let mut v: u64 = 0;
    // SAFETY: an 8-byte read into a valid u64; the fd is non-blocking (rsrdma sets it, and
    // the module opens it so).
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) == 8 }
}

pub(super) fn new_eventfd() -> c_int {
    // SAFETY: eventfd with constant flags.
    unsafe {
        libc::eventfd(
            0,
            libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
        )
    }
}

pub(super) fn set_errno(e: c_int) {
    // SAFETY: writing the calling thread's errno is always sound.
    unsafe { *libc::__errno_location() = e };
}

/// RNR retries that are due run on this thread, with nobody calling in.
/// The least time the timer thread leaves the device to others between two turns that have
/// due work (a retry after an RNR NAK, a held completion): such waits are this much longer
/// at most, when many are due at once.
const TIMER_GAP: Duration = Duration::from_micros(50);

fn timer_thread() {
    let dev = device();
    let mut st = dev.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let now = Instant::now();
        let due = st.qps.values().filter_map(QpEntry::next_due).min();
        match due {
            Some(t) if t <= now => {
                let State { qps, dirty, .. } = &mut *st;
                for (&qpn, e) in qps.iter_mut() {
                    if e.next_due().is_some_and(|t| t <= now) {
                        e.core.handle_timeout(now);
                        mark(dirty, e, qpn);
                    }
                }
                pump(&mut st, &mut LazyNow(Some(now)));
                // Let go of the device between turns: with a short RNR timer and many
                // requests, a turn can outlast the timer, and a thread that never lets go
                // starves the application's posts (the receive that would end the retries
                // among them) for good.
                st = dev
                    .timer
                    .wait_timeout(st, TIMER_GAP)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            Some(t) => {
                st = dev
                    .timer
                    .wait_timeout(st, t - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            None => st = dev.timer.wait(st).unwrap_or_else(|p| p.into_inner()),
        }
    }
}

/// `ibv_qp_attr::min_rnr_timer` codes (IBA table 45), in microseconds.
fn rnr_timer(code: u8) -> Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(u64::from(US[usize::from(code & 31)]))
}

/// `ibv_qp_attr::timeout` codes: 4.096 µs × 2^code; 0 waits for ever.
fn ack_timeout(code: u8) -> Option<Duration> {
    (code != 0).then(|| Duration::from_nanos(4096u64 << (code & 31)))
}

// ----- the data path (the context's operation table) ----------------------------------------

/// Reads a send request of the C list into the core's form.
///
/// # Safety
/// `w` is a valid request whose SGEs (and, inline, their memory) the caller vouches for.
unsafe fn send_wr(w: &ffi::ibv_send_wr) -> Result<SendWr, c_int> {
    use ffi::ibv_wr_opcode as Op;
    // SAFETY: `sg_list` has `num_sge` entries (the caller's contract).
    let list = unsafe { sges(w.sg_list, w.num_sge) };
    // SAFETY: the union members are read as the opcode says they were written; a bind names
    // a live window and, if any, a live region (the caller's contract).
    let op = unsafe {
        match w.opcode {
            Op::IBV_WR_SEND => SendOp::Send { imm: None },
            Op::IBV_WR_SEND_WITH_IMM => SendOp::Send {
                imm: Some(w.__bindgen_anon_1.imm_data),
            },
            Op::IBV_WR_RDMA_WRITE | Op::IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::Write {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
                imm: (w.opcode == Op::IBV_WR_RDMA_WRITE_WITH_IMM)
                    .then_some(w.__bindgen_anon_1.imm_data),
            },
            Op::IBV_WR_RDMA_READ => SendOp::Read {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            Op::IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                compare: w.wr.atomic.compare_add,
                swap: w.wr.atomic.swap,
            },
            Op::IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                add: w.wr.atomic.compare_add,
            },
            Op::IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
                rkey: w.__bindgen_anon_1.invalidate_rkey,
            },
            Op::IBV_WR_LOCAL_INV => SendOp::LocalInv {
                rkey: w.__bindgen_anon_1.invalidate_rkey,
            },
            Op::IBV_WR_BIND_MW => {
                let b = &w.__bindgen_anon_2.bind_mw;
                if b.mw.is_null() {
                    return Err(libc::EINVAL);
                }
                let info = &b.bind_info;
                SendOp::BindMw(Bind {
                    // As rxe's provider: the window's present key is what `ibv_mw.rkey` says
                    // (the application records each bind's key there).
                    mw_key: (*b.mw).rkey,
                    new_key: b.rkey,
                    // No region: the bind fails (MW_BIND_ERR), as a type-2 bind must name one.
                    mr_key: if info.mr.is_null() {
                        0
                    } else {
                        (*info.mr).lkey
                    },
                    addr: info.addr,
                    len: info.length,
                    access: Access(info.mw_access_flags),
                })
            }
            _ => return Err(libc::EOPNOTSUPP),
        }
    };
    let inline = if w.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
        // SAFETY: inline memory is valid for this call (the caller's contract).
        Some(unsafe { inline_payload(&list) })
    } else {
        None
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        sges: if inline.is_some() {
            Sges::default()
        } else {
            list
        },
        inline,
        signaled: w.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0,
        fence: w.send_flags & ffi::ibv_send_flags::IBV_SEND_FENCE.0 != 0,
        solicited: w.send_flags & ffi::ibv_send_flags::IBV_SEND_SOLICITED.0 != 0,
    })
}

/// A copy from memory that is not registered (inline data).
///
/// # Safety
/// `addr..addr + out.len()` is valid for reads.
unsafe fn read_unchecked(addr: u64, out: &mut [u8]) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy(addr as *const u8, out.as_mut_ptr(), out.len()) }
}

/// # Safety
/// `list` has `n` valid entries (or `n` <= 0).
unsafe fn sges(list: *const ffi::ibv_sge, n: c_int) -> Sges {
    if n <= 0 || list.is_null() {
        return Sges::default();
    }
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(list, n as usize) };
    // A short list (almost every request) lives in the request itself: no allocation.
    Sges::from_fn(s.len(), |i| Sge {
        addr: s[i].addr,
        len: s[i].length,
        lkey: s[i].lkey,
    })
}

/// The bytes that `list` names, copied into a payload (in place when short: an inline send
/// of a few bytes allocates nothing).
///
/// # Safety
/// Every entry of `list` is valid for reads (inline memory: the caller's contract).
unsafe fn inline_payload(list: &[Sge]) -> Payload {
    let len = list.iter().map(|s| s.len as usize).sum();
    Payload::from_fn(len, |out| {
        let mut at = 0;
        for s in list {
            let n = s.len as usize;
            // SAFETY: valid for reads (the caller's contract).
            unsafe { read_unchecked(s.addr, &mut out[at..at + n]) };
            at += n;
        }
    })
}

fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::Full => libc::ENOMEM,
        PostError::State(_) | PostError::Invalid(_) => libc::EINVAL,
    }
}

unsafe extern "C" fn post_send(
    qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_send_wr,
    bad: *mut *mut ffi::ibv_send_wr,
) -> c_int {
    // SAFETY: `qp` is a live soft QP, the first field of its `SoftQp` (the caller's
    // contract).
    let soft = unsafe { &*qp.cast::<SoftQp>() };
    let qpn = soft.raw.qp_num;
    let _one = Exclusive::enter(&soft.sq_busy, "the send queue of QP", qpn);
    let mut st = lock();
    // A call's requests take the room its send queue had when the call began, as on a NIC
    // (and rxe), which sees none of them before the call's one doorbell: a request done at
    // once (the direct path, a datagram) still takes a slot until the call ends, so a list
    // longer than the room is refused where a NIC refuses it (over shared memory soft0 took
    // 300 unsignaled WRITEs on a 128-deep queue in one call: an outside tester's find).
    // (Read at the first request, from the entry it looks up anyway.)
    let mut room: Option<u32> = None;
    let mut w = wr;
    let mut rc = 0;
    while !w.is_null() {
        let State {
            qps,
            mrs,
            spare,
            lent,
            ..
        } = &mut *st;
        let mut mem = ProcessMemory { spare };
        // SAFETY: a valid request list (the caller's contract).
        let r = qps.get_mut(&qpn).ok_or(libc::EINVAL).and_then(|e| {
            let left = room.get_or_insert_with(|| match &e.core {
                QpCore::Rc(q) => q.send_room(),
                QpCore::Ud(_) => e.caps.max_send_wr,
            });
            if *left == 0 {
                return Err(libc::ENOMEM);
            }
            *left -= 1;
            // SAFETY: as above.
            let num_sge = unsafe { (*w).num_sge };
            if num_sge < 0 || num_sge as u32 > e.caps.max_send_sge {
                return Err(libc::EINVAL);
            }
            // SAFETY: as above.
            let s = unsafe { send_wr(&*w) }?;
            // Only a one-sided request may be done directly: the others need no look-up of
            // the peer's device.
            let one_sided = matches!(
                s.op,
                SendOp::Write { imm: None, .. }
                    | SendOp::Read { .. }
                    | SendOp::CompareSwap { .. }
                    | SendOp::FetchAdd { .. }
            );
            let dev = device();
            let peer = match (&dev.links, one_sided) {
                (Some(l), true) => {
                    route_to(&mut e.route, e.remote, l, &dev.deliver).and_then(Route::direct)
                }
                _ => None,
            };
            match &mut e.core {
                QpCore::Rc(q) => match peer {
                    Some(peer) => {
                        let mut reach = Reach {
                            peer,
                            from: q.qp_num(),
                            dest_qpn: q.dest_qpn(),
                        };
                        q.post_send_direct(s, mrs, &mut mem, &mut reach)
                            .map_err(post_errno)
                    }
                    None => {
                        q.post_send(s, mrs, &mem).map_err(post_errno)?;
                        // A request to another process leaves now, before the pump's
                        // bookkeeping: the peer's work starts as early as it can (its
                        // completions, if any, were made by the post and go in the pump).
                        e.send_to_peer_process(lent);
                        Ok(())
                    }
                },
                QpCore::Ud(q) => {
                    // SAFETY: as above; a UD request names a live AH (the caller's contract).
                    let dest = unsafe { super::ah::ud_dest(&*w, q.qkey()) }?;
                    q.post_send(s, dest, mrs, &mem).map_err(post_errno)
                }
            }
        });
        if let Err(e) = r {
            // SAFETY: `bad` is writable (the caller's contract).
            unsafe { *bad = w };
            rc = e;
            break;
        }
        // SAFETY: as above.
        w = unsafe { (*w).next };
    }
    pump_posted(&mut st, qpn, &mut LazyNow::default());
    rc
}

unsafe extern "C" fn post_recv(
    qp: *mut ffi::ibv_qp,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: `qp` is a live soft QP, the first field of its `SoftQp` (the caller's
    // contract).
    let soft = unsafe { &*qp.cast::<SoftQp>() };
    let qpn = soft.raw.qp_num;
    let _one = Exclusive::enter(&soft.rq_busy, "the receive queue of QP", qpn);
    // SAFETY: the caller's contract.
    unsafe {
        post_recv_list(
            wr,
            bad,
            |st, recv| {
                let State { qps, dirty, .. } = st;
                match qps.get_mut(&qpn) {
                    Some(e) if recv.sges.len() as u32 > e.caps.max_recv_sge => Err(libc::EINVAL),
                    Some(e) => {
                        // A receive posted to a QP in ERROR completes at once (flushed): the
                        // pump hands that on. Otherwise the receive only waits in its queue,
                        // which no pump needs to see (a request that found none was refused
                        // with an RNR NAK, and its requester sends it again).
                        if e.core.state() == QpState::Error {
                            mark(dirty, e, qpn);
                        }
                        e.core.post_recv(recv).map_err(post_errno)
                    }
                    None => Err(libc::EINVAL),
                }
            },
            false,
        )
    }
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ffi::ibv_srq,
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is a live soft SRQ, the first field of its `SoftSrq` (the caller's
    // contract).
    let soft = unsafe { &*srq.cast::<SoftSrq>() };
    let handle = soft.raw.handle;
    let _one = Exclusive::enter(&soft.busy, "SRQ", handle);
    // SAFETY: the caller's contract.
    unsafe {
        post_recv_list(
            wr,
            bad,
            |st, recv| match st.srqs.get_mut(&handle) {
                Some(s) if recv.sges.len() as u32 > s.max_sge => Err(libc::EINVAL),
                Some(s) => s.core.post_recv(recv).map_err(post_errno),
                None => Err(libc::EINVAL),
            },
            true,
        )
    }
}

/// Posts a list of receive requests with `post`, under the device lock: stops at the first
/// refused one (named in `bad`), and pumps when a queue pair was touched or `always_pump`
/// (an SRQ's limit event is found by the pump).
///
/// # Safety
/// `wr` is a valid request list whose SGEs the caller vouches for; `bad` is writable.
unsafe fn post_recv_list(
    wr: *mut ffi::ibv_recv_wr,
    bad: *mut *mut ffi::ibv_recv_wr,
    mut post: impl FnMut(&mut State, RecvWr) -> Result<(), c_int>,
    always_pump: bool,
) -> c_int {
    let mut st = lock();
    let mut w = wr;
    let mut rc = 0;
    while !w.is_null() {
        // SAFETY: a valid request list (the caller's contract).
        let r = unsafe { &*w };
        let recv = RecvWr {
            wr_id: r.wr_id,
            // SAFETY: as above.
            sges: unsafe { sges(r.sg_list, r.num_sge) },
        };
        if let Err(e) = post(&mut st, recv) {
            // SAFETY: `bad` is writable (the caller's contract).
            unsafe { *bad = w };
            rc = e;
            break;
        }
        w = r.next;
    }
    if always_pump || !st.dirty.is_empty() {
        pump(&mut st, &mut LazyNow::default());
    }
    rc
}

unsafe extern "C" fn poll_cq(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
    // SAFETY: `cq` is a live soft CQ, the first field of its `SoftCq` (the caller's
    // contract).
    let cq = unsafe { &*cq.cast::<SoftCq>() };
    let _one = Exclusive::enter(&cq.busy, "CQ", cq.raw.handle);
    // What peers on this host put in the shared rings is taken by the polls that find the
    // CQ empty (before the CQ is locked: what it delivers may complete into this CQ). One that
    // finds completions hands them over first, as a NIC's CQ gives what it holds: a
    // ping-pong's poll of its receive CQ, after its send CQ's poll delivered both
    // completions, then costs no look at the links.
    let dev = device();
    let mut read = false;
    let mut pending = cq.pending.load(Ordering::Acquire);
    if let Some(l) = &dev.links {
        if pending {
            super::shm_link::polled();
        } else {
            read = l.progress(&*dev.deliver);
            pending = cq.pending.load(Ordering::Acquire);
        }
    }
    if !pending {
        // Nothing to do: the acknowledgements held back go now ([`hold_acks`]).
        if !read {
            send_held_acks();
        }
        empty_poll(true);
        return 0;
    }
    let mut st = cq.state.lock().unwrap_or_else(|p| p.into_inner());
    let mut k = 0;
    while k < n.max(0) {
        let Some(w) = st.wcs.pop_front() else {
            break;
        };
        // SAFETY: `wc` has room for `n` completions (the caller's contract).
        unsafe { *wc.add(k as usize) = w };
        k += 1;
    }
    if st.wcs.is_empty() {
        cq.pending.store(false, Ordering::Relaxed);
    }
    drop(st);
    if k == 0 && !read {
        send_held_acks();
    }
    empty_poll(k == 0);
    k
}

/// How many empty polls in a row a thread makes before it lets another thread of its core
/// run.
const EMPTY_POLLS_BEFORE_YIELD: u32 = 64;

/// Counts a poll of this thread (`empty`: it found nothing); after [`EMPTY_POLLS_BEFORE_YIELD`]
/// empty ones in a row, yields the
/// core. soft0's NIC is threads of this process (a link's writer and reader) that an
/// application busy-polling on a core they share would otherwise starve: on a 2-core machine,
/// two busy-polling `rs_send_bw`s left their link threads a fraction of the CPU (64 KiB over
/// TCP links: 1.29-1.35 GB/s without the yield, 2.5-2.9 with it; over the rings 4.2-4.8
/// against 14.9-19.0; latency and `rs_write_bw` unchanged).
fn empty_poll(empty: bool) {
    thread_local! {
        static EMPTY: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    let n = EMPTY.with(|c| {
        let n = if empty { c.get() + 1 } else { 0 };
        c.set(if n >= EMPTY_POLLS_BEFORE_YIELD { 0 } else { n });
        n
    });
    if n >= EMPTY_POLLS_BEFORE_YIELD {
        std::thread::yield_now();
    }
}

unsafe extern "C" fn req_notify_cq_op(cq: *mut ffi::ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { req_notify_cq(cq, solicited_only != 0) }
}

// ----- the control path (called through `crate::ffi`) ---------------------------------------

/// `ibv_open_device` of the soft device.
/// At the process's exit (from `main`, or `std::process::exit`), waits (up to a second) until
/// what the links still hold has been written: a datagram or an acknowledgement completes
/// once it is queued, where a NIC completes it once it is on the wire, so a program that
/// sends, sees the completion (or `PacketConn::flush` returns) and exits would otherwise
/// lose it, with the first packets to a new peer while its link is being set up. A process
/// that is killed loses them still (a NIC would have sent them).
fn flush_links_at_exit() {
    /// The process that registered [`at_exit`]: a child made by `fork` (without `exec`) runs
    /// the handler too, with a copy of the device but none of its threads, and the parent's
    /// rings mapped: it must neither write into them nor wait for writers it does not have
    /// (an outside reviewer's find).
    static OWNER: AtomicU32 = AtomicU32::new(0);
    extern "C" fn at_exit() {
        if OWNER.load(Ordering::Relaxed) != std::process::id() {
            return;
        }
        // The acknowledgements held back go too, unless the exiting thread holds the lock.
        if ACKS_HELD.load(Ordering::Relaxed) {
            if let Ok(mut st) = device().state.try_lock() {
                flush_held_acks(&mut st);
                pump(&mut st, &mut LazyNow::default());
            }
        }
        if let Some(l) = &device().links {
            l.flush(LINK_FLUSH_LIMIT);
        }
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        OWNER.store(std::process::id(), Ordering::Relaxed);
        // SAFETY: `at_exit` is a plain function that stays valid for the process's life; it
        // waits for no lock the exiting thread could hold (the device's it only tries; the
        // links' own are only theirs).
        if unsafe { libc::atexit(at_exit) } != 0 {
            tracing::debug!("soft0: no exit handler; links are flushed when their QPs go");
        }
    });
}

pub(crate) fn open_device() -> *mut ffi::ibv_context {
    if let Err(e) = super::faults::from_env() {
        tracing::error!("soft0 cannot open: {e}");
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if let Err(e) = configured_addr() {
        tracing::error!("soft0 cannot open: {e}");
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let dev = device();
    if dev.links.is_none() && std::env::var_os(SOFT_ADDR_ENV).is_some() {
        // Asked to be reachable there and cannot be (the port taken, an address not of this
        // host): not a device that quietly reaches this process only.
        tracing::error!(
            "soft0 cannot open: it cannot listen where {SOFT_ADDR_ENV} says (see the warning \
             before)"
        );
        set_errno(libc::EADDRNOTAVAIL);
        return std::ptr::null_mut();
    }
    super::mark_opened();
    flush_links_at_exit();
    let fd = new_eventfd();
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let mut raw: ffi::ibv_context = zeroed();
    raw.device = device_ptr();
    raw.ops.post_send = Some(post_send);
    raw.ops.post_recv = Some(post_recv);
    raw.ops.post_srq_recv = Some(post_srq_recv);
    raw.ops.poll_cq = Some(poll_cq);
    raw.ops.req_notify_cq = Some(req_notify_cq_op);
    raw.ops.alloc_mw = Some(alloc_mw);
    raw.ops.dealloc_mw = Some(dealloc_mw);
    raw.async_fd = fd;
    raw.cmd_fd = -1;
    raw.num_comp_vectors = 1;
    let ctx = Box::new(SoftContext {
        raw,
        events: Mutex::new(VecDeque::new()),
        handed: Mutex::new(Vec::new()),
        acked: Condvar::new(),
    });
    Box::into_raw(ctx).cast()
}

/// # Safety
/// `ctx` is a live soft context with no object left on it.
pub(crate) unsafe fn close_device(ctx: *mut ffi::ibv_context) -> c_int {
    // SAFETY: made by `open_device` (the caller's contract), freed once.
    let ctx = unsafe { Box::from_raw(ctx.cast::<SoftContext>()) };
    // SAFETY: the eventfd this context opened.
    unsafe { libc::close(ctx.raw.async_fd) };
    0
}

/// # Safety
/// `attr` is writable.
pub(crate) unsafe fn query_device(attr: *mut ffi::ibv_device_attr) -> c_int {
    let mut a: ffi::ibv_device_attr = zeroed();
    for (i, b) in b"soft 1".iter().enumerate() {
        a.fw_ver[i] = *b as std::os::raw::c_char;
    }
    a.node_guid = super::DEVICE_GUID.to_be();
    a.sys_image_guid = super::DEVICE_GUID.to_be();
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 0xffff_f000;
    a.max_qp = 0x1_0000;
    a.max_qp_wr = MAX_QP_WR as c_int;
    a.max_sge = MAX_SGE as c_int;
    a.max_sge_rd = MAX_SGE as c_int;
    a.max_cq = 0x1_0000;
    a.max_cqe = MAX_CQE;
    a.max_mr = 0x4_0000;
    a.max_pd = 0x1_0000;
    a.max_qp_rd_atom = 128;
    a.max_qp_init_rd_atom = 128;
    a.max_res_rd_atom = 0x2_0000;
    a.atomic_cap = ffi::ibv_atomic_cap::IBV_ATOMIC_HCA;
    // Type-2B windows, as rxe's (its type-1 windows soft0 does not have).
    a.device_cap_flags = ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0;
    a.max_mw = 0x4_0000;
    a.max_srq = 0x1_0000;
    // As rxe's (RXE_MAX_AH).
    a.max_ah = 0x3fff;
    a.max_srq_wr = MAX_QP_WR as c_int;
    a.max_srq_sge = MAX_SRQ_SGE as c_int;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    // SAFETY: the caller's contract.
    unsafe { *attr = a };
    0
}

/// The MTU of soft0's port (its largest and its active one).
const PORT_MTU: ffi::ibv_mtu = ffi::ibv_mtu::IBV_MTU_4096;

/// # Safety
/// `attr` is writable.
pub(crate) unsafe fn query_port(port: u8, attr: *mut ffi::ibv_port_attr) -> c_int {
    if port != 1 {
        return libc::EINVAL;
    }
    let mut p: ffi::ibv_port_attr = zeroed();
    p.state = ffi::ibv_port_state::IBV_PORT_ACTIVE;
    p.max_mtu = PORT_MTU;
    p.active_mtu = PORT_MTU;
    p.gid_tbl_len = 2;
    p.max_msg_sz = rsrdma_soft::MAX_MESSAGE as u32;
    p.pkey_tbl_len = 1;
    p.lid = own_lid();
    p.active_width = 1;
    p.active_speed = 1;
    p.phys_state = 5;
    p.link_layer = ffi::IBV_LINK_LAYER_ETHERNET as u8;
    // SAFETY: the caller's contract.
    unsafe { *attr = p };
    0
}

/// The RoCE v2 GID of the device whose LID is `lid`: an IPv4-mapped loopback address that
/// names the LID (`::ffff:127.0.<lid high>.<lid low>`, every one of them a loopback address),
/// so that a GID alone (a UD address, an AH without a LID) says which process's device it
/// is. A device without a listener (LID 0) is `::ffff:127.0.0.1`.
pub(super) fn gid_of_lid(lid: u16) -> [u8; 16] {
    let [hi, lo] = if lid == 0 { [0, 1] } else { lid.to_be_bytes() };
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, hi, lo]
}

/// The LID a GID of [`gid_of_lid`]'s form (or this device's link-local GID) names; 0 (this
/// device) for `::ffff:127.0.0.1` and for any other GID.
pub(super) fn lid_of_gid(gid: &[u8; 16]) -> u16 {
    let mapped = gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] && gid[12..14] == [127, 0];
    let link_local = gid[..14] == link_local_gid(0)[..14];
    match u16::from_be_bytes([gid[14], gid[15]]) {
        1 if mapped => 0,
        lid if mapped || link_local => lid,
        _ => 0,
    }
}

/// The link-local RoCE v1 GID of the device whose LID is `lid`.
fn link_local_gid(lid: u16) -> [u8; 16] {
    let [hi, lo] = lid.to_be_bytes();
    [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0xf7, 0, 0, 0, 0, hi, lo]
}

/// The RoCE v2 GID of the device listening on `addr`: on the loopback address, the form of
/// [`gid_of_lid`] (it names the LID); elsewhere the address itself, IPv4-mapped, as rxe's
/// GID of an interface's address is (the LID then says the port).
pub(super) fn gid_of_addr(addr: SocketAddrV4) -> [u8; 16] {
    if addr.ip().is_loopback() {
        return gid_of_lid(addr.port());
    }
    let mut g = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0];
    g[12..].copy_from_slice(&addr.ip().octets());
    g
}

/// Where the device named by `gid` (when the address has one) and `lid` listens: a GID that
/// maps an IPv4 address outside the loopback range names that host, any other (or none) this
/// host, at this device's own address when it has one there; the LID is the port (or, for a
/// GID of [`gid_of_lid`]'s form, the LID it names when `lid` is 0).
pub(super) fn peer_addr(gid: Option<&[u8; 16]>, lid: u16) -> SocketAddrV4 {
    let remote_ip = gid
        .filter(|g| g[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
        .map(|g| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    let port = match (lid, gid) {
        (0, Some(g)) if remote_ip.is_none() => lid_of_gid(g),
        // A GID of another host without a LID: the device at its address's usual port.
        (0, _) if remote_ip.is_some() => SOFT_PORT,
        _ => lid,
    };
    let own = *own_addr().ip();
    let ip = remote_ip.unwrap_or(if own.is_loopback() {
        Ipv4Addr::LOCALHOST
    } else {
        own
    });
    SocketAddrV4::new(ip, port)
}

/// This device's RoCE v2 GID (index 1).
pub(super) fn own_gid() -> [u8; 16] {
    gid_of_addr(own_addr())
}

/// The GID table: a link-local RoCE v1 entry, then the RoCE v2 entry of an IPv4-mapped
/// loopback address (the index rxe's own IPv4 address has in the test VM); both name the
/// device's LID.
fn gid_entry(index: u32) -> Option<ffi::ibv_gid_entry> {
    let mut e: ffi::ibv_gid_entry = zeroed();
    let bytes: [u8; 16] = match index {
        0 => link_local_gid(own_lid()),
        1 => own_gid(),
        _ => return None,
    };
    e.gid.raw = bytes;
    e.gid_index = index;
    e.port_num = 1;
    e.gid_type = if index == 0 {
        ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V1.0
    } else {
        ffi::ibv_gid_type::IBV_GID_TYPE_ROCE_V2.0
    };
    e.ndev_ifindex = 1;
    Some(e)
}

/// # Safety
/// `entry` is writable.
pub(crate) unsafe fn query_gid(port: u32, index: u32, entry: *mut ffi::ibv_gid_entry) -> c_int {
    match (port, gid_entry(index)) {
        (1, Some(e)) => {
            // SAFETY: the caller's contract.
            unsafe { *entry = e };
            0
        }
        _ => libc::ENODATA,
    }
}

/// # Safety
/// `entries` has room for `max` entries.
pub(crate) unsafe fn query_gid_table(entries: *mut ffi::ibv_gid_entry, max: usize) -> isize {
    let mut n = 0;
    while let Some(e) = gid_entry(n as u32) {
        if n == max {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: `n < max` (the caller's contract).
        unsafe { *entries.add(n) = e };
        n += 1;
    }
    n as isize
}

/// # Safety
/// `ctx` is a live soft context.
pub(crate) unsafe fn alloc_pd(ctx: *mut ffi::ibv_context) -> *mut ffi::ibv_pd {
    let handle = lock().handle();
    let pd = Box::new(SoftPd {
        raw: ffi::ibv_pd {
            context: ctx,
            handle,
        },
    });
    Box::into_raw(pd).cast()
}

/// # Safety
/// `pd` is a live soft PD with nothing left on it.
pub(crate) unsafe fn dealloc_pd(pd: *mut ffi::ibv_pd) -> c_int {
    // SAFETY: made by `alloc_pd`, freed once (the caller's contract).
    drop(unsafe { Box::from_raw(pd.cast::<SoftPd>()) });
    0
}

/// # Safety
/// `pd` is a live soft PD; `addr..addr + len` stays valid while registered.
pub(crate) unsafe fn reg_mr(
    pd: *mut ffi::ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_uint,
) -> *mut ffi::ibv_mr {
    // SAFETY: the caller's contract.
    let (ctx, pdh) = unsafe { ((*pd).context, (*pd).handle) };
    let basic = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let access = Access(access & (basic | Access::REMOTE_ATOMIC | Access::MW_BIND).0);
    // Registered and published under one hold of the device lock: a deregistration that
    // frees the same slot cannot withdraw this entry, nor write it half.
    let mut st = lock();
    let key = st.mrs.register(pdh, addr as u64, len as u64, access);
    // Memory peers of this host can map: they may do their requests in it themselves.
    let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    if let (Some(dir), true) = (&device().directory, access.0 & remote.0 != 0) {
        if let Some((fd_no, inode, offset)) = super::shared_mem::lookup(addr as u64, len as u64) {
            let mr = rsrdma_soft::MrEntry {
                pd: pdh,
                addr: addr as u64,
                len: len as u64,
                access,
                key,
            };
            dir.publish_region(&SharedRegion {
                mr,
                fd_no,
                inode,
                offset,
            });
        }
    }
    drop(st);
    let mr = Box::new(SoftMr {
        raw: ffi::ibv_mr {
            context: ctx,
            pd,
            addr,
            length: len,
            handle: key,
            lkey: key,
            rkey: key,
        },
    });
    Box::into_raw(mr).cast()
}

/// `ibv_dereg_mr`: `EINVAL` (the region stays registered) while a window is bound to it, as
/// rxe (IBA 10.6.7.2.6).
///
/// # Safety
/// `mr` is a live soft MR.
pub(crate) unsafe fn dereg_mr(mr: *mut ffi::ibv_mr) -> c_int {
    // SAFETY: a live soft MR (the caller's contract).
    let key = unsafe { (*mr).lkey };
    let mut st = lock();
    if let Err(DeregError::WindowsBound(n)) = st.mrs.deregister(key) {
        tracing::debug!(
            key,
            windows = n,
            "soft0: ibv_dereg_mr refused: windows are bound to the region"
        );
        return libc::EINVAL;
    }
    // Under the same hold of the lock as the deregistration (see `reg_mr`).
    if let Some(dir) = &device().directory {
        dir.withdraw_region(key);
    }
    drop(st);
    // SAFETY: made by `reg_mr`, freed once (the caller's contract); deregistered above.
    drop(unsafe { Box::from_raw(mr.cast::<SoftMr>()) });
    0
}

/// `ibv_alloc_mw` (the context's `alloc_mw`): a free type-2 window; type 1 is refused with
/// `EOPNOTSUPP`.
///
/// # Safety
/// `pd` is a live soft PD.
unsafe extern "C" fn alloc_mw(pd: *mut ffi::ibv_pd, type_: ffi::ibv_mw_type) -> *mut ffi::ibv_mw {
    if type_ != ffi::IBV_MW_TYPE_2 {
        tracing::debug!(type_, "soft0: ibv_alloc_mw refused: type-2 windows only");
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's contract.
    let (ctx, pdh) = unsafe { ((*pd).context, (*pd).handle) };
    let key = lock().mrs.alloc_window(pdh);
    let mw = Box::new(SoftMw {
        raw: ffi::ibv_mw {
            context: ctx,
            pd,
            rkey: key,
            handle: key,
            type_,
        },
    });
    Box::into_raw(mw).cast()
}

/// `ibv_dealloc_mw` (the context's `dealloc_mw`): unbinds the window if it is bound.
///
/// # Safety
/// `mw` is a live soft window.
unsafe extern "C" fn dealloc_mw(mw: *mut ffi::ibv_mw) -> c_int {
    // SAFETY: made by `alloc_mw`, freed once (the caller's contract).
    let mw = unsafe { Box::from_raw(mw.cast::<SoftMw>()) };
    lock().mrs.dealloc_window(mw.raw.handle);
    0
}

/// # Safety
/// `ctx` is a live soft context; `channel` is null or a live soft channel.
pub(crate) unsafe fn create_cq(
    ctx: *mut ffi::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ffi::ibv_comp_channel,
) -> *mut ffi::ibv_cq {
    if !(1..=MAX_CQE).contains(&cqe) {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let mut raw: ffi::ibv_cq = zeroed();
    raw.context = ctx;
    raw.channel = channel;
    raw.cq_context = cq_context;
    raw.handle = lock().handle();
    raw.cqe = cqe;
    let cq = Box::new(SoftCq {
        raw,
        state: Mutex::new(CqState {
            wcs: VecDeque::new(),
            capacity: cqe as usize,
            armed: None,
        }),
        pending: AtomicBool::new(false),
        busy: AtomicBool::new(false),
    });
    Box::into_raw(cq).cast()
}

/// # Safety
/// `cq` is a live soft CQ that no QP uses any more.
pub(crate) unsafe fn destroy_cq(cq: *mut ffi::ibv_cq) -> c_int {
    // SAFETY: made by `create_cq`, freed once (the caller's contract).
    let cq = unsafe { Box::from_raw(cq.cast::<SoftCq>()) };
    if cq
        .state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .armed
        .is_some()
    {
        super::shm_link::cq_fired();
    }
    // Its overrun events (CQ_ERR) go with it.
    // SAFETY: a CQ's context outlives it; soft CQs are made on soft contexts.
    unsafe {
        forget_events(
            cq.raw.context.cast::<SoftContext>(),
            std::ptr::from_ref(&cq.raw).cast_mut().cast(),
        )
    };
    let channel = cq.raw.channel.cast::<SoftChannel>();
    if !channel.is_null() {
        // SAFETY: the channel outlives its CQs.
        let ch = unsafe { &*channel };
        let me = std::ptr::from_ref(&cq.raw).cast_mut();
        let mut ev = ch.events.lock().unwrap_or_else(|p| p.into_inner());
        let before = ev.len();
        ev.retain(|&c| c != me);
        for _ in ev.len()..before {
            take_signal(ch.raw.fd);
        }
    }
    0
}

/// # Safety
/// `ctx` is a live soft context.
pub(crate) unsafe fn create_comp_channel(ctx: *mut ffi::ibv_context) -> *mut ffi::ibv_comp_channel {
    let fd = new_eventfd();
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let ch = Box::new(SoftChannel {
        raw: ffi::ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        },
        events: Mutex::new(VecDeque::new()),
    });
    Box::into_raw(ch).cast()
}

/// # Safety
/// `channel` is a live soft channel that no CQ uses any more.
pub(crate) unsafe fn destroy_comp_channel(channel: *mut ffi::ibv_comp_channel) -> c_int {
    // SAFETY: made by `create_comp_channel`, freed once (the caller's contract).
    let ch = unsafe { Box::from_raw(channel.cast::<SoftChannel>()) };
    // SAFETY: the eventfd this channel opened.
    unsafe { libc::close(ch.raw.fd) };
    0
}

/// # Safety
/// `channel` is a live soft channel; the out-pointers are writable.
pub(crate) unsafe fn get_cq_event(
    channel: *mut ffi::ibv_comp_channel,
    cq: *mut *mut ffi::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    let ch = unsafe { &*channel.cast::<SoftChannel>() };
    if !take_signal(ch.raw.fd) {
        set_errno(libc::EAGAIN);
        return -1;
    }
    let Some(c) = ch
        .events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop_front()
    else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    // SAFETY: the out-pointers are writable; `c` is a live CQ of this channel (a destroyed
    // CQ's events are removed with it).
    unsafe {
        *cq = c;
        *cq_context = (*c).cq_context;
    }
    0
}

/// `ibv_ack_cq_events`: nothing to count.
pub(crate) fn ack_cq_events() {}

/// # Safety
/// `cq` is a live soft CQ.
pub(crate) unsafe fn req_notify_cq(cq: *mut ffi::ibv_cq, solicited_only: bool) -> c_int {
    // The application stops polling: the acknowledgements held back go now.
    send_held_acks();
    // SAFETY: the caller's contract.
    let cq = unsafe { &*cq.cast::<SoftCq>() };
    {
        let mut st = cq.state.lock().unwrap_or_else(|p| p.into_inner());
        // An arm for any completion is not narrowed by a later solicited-only one (as a NIC
        // keeps the wider request until it fires).
        match st.armed {
            None => {
                st.armed = Some(solicited_only);
                super::shm_link::cq_armed();
            }
            Some(only) => st.armed = Some(only && solicited_only),
        }
    }
    // Someone is about to sleep rather than poll: the shared rings' readers must take what
    // arrives now.
    if let Some(l) = &device().links {
        l.poller_stopped();
    }
    0
}

/// # Safety
/// `pd` is a live soft PD; `attr` is a valid, writable attribute struct whose CQs (and SRQ)
/// are live soft objects.
pub(crate) unsafe fn create_qp(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_qp_init_attr,
) -> *mut ffi::ibv_qp {
    // SAFETY: the caller's contract.
    let a = unsafe { &mut *attr };
    use ffi::ibv_qp_type as T;
    let ud = a.qp_type == T::IBV_QPT_UD;
    if ![T::IBV_QPT_RC, T::IBV_QPT_UC, T::IBV_QPT_UD].contains(&a.qp_type) {
        set_errno(libc::EOPNOTSUPP);
        return std::ptr::null_mut();
    }
    let c = &mut a.cap;
    let srq = a.srq;
    let recv_ok = !srq.is_null() || (c.max_recv_wr <= MAX_QP_WR && c.max_recv_sge <= MAX_SGE);
    if c.max_send_wr > MAX_QP_WR
        || c.max_send_sge > MAX_SGE
        || c.max_inline_data > MAX_INLINE
        || !recv_ok
    {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    if !srq.is_null() {
        c.max_recv_wr = 0;
        c.max_recv_sge = 0;
    }
    let mut st = lock();
    let qpn = st.next_qpn;
    st.next_qpn += 1;
    let handle = st.handle();
    // SAFETY: the caller's contract.
    let (ctx, pdh) = unsafe { ((*pd).context, (*pd).handle) };
    let srq_handle = if srq.is_null() {
        None
    } else {
        // SAFETY: a live soft SRQ (the caller's contract).
        Some(unsafe { (*srq).handle })
    };
    let cfg = QpConfig {
        qp_num: qpn,
        pd: pdh,
        access: Access::NONE,
        max_send_wr: c.max_send_wr.max(1),
        max_recv_wr: c.max_recv_wr,
        max_inline: c.max_inline_data,
        rnr_retry: 7,
        min_rnr_timer: rnr_timer(12),
        // What a zeroed attribute says (RTS sets both: `check_modify` requires them).
        retry_cnt: 0,
        ack_timeout: None,
        sq_sig_all: a.sq_sig_all != 0,
        uses_srq: srq_handle.is_some(),
        unreliable: a.qp_type == ffi::ibv_qp_type::IBV_QPT_UC,
    };
    let mut raw: ffi::ibv_qp = zeroed();
    raw.context = ctx;
    raw.qp_context = a.qp_context;
    raw.pd = pd;
    raw.send_cq = a.send_cq;
    raw.recv_cq = a.recv_cq;
    raw.srq = srq;
    raw.handle = handle;
    raw.qp_num = qpn;
    raw.state = ffi::ibv_qp_state::IBV_QPS_RESET;
    raw.qp_type = a.qp_type;
    let qp = Box::into_raw(Box::new(SoftQp {
        raw,
        sq_busy: AtomicBool::new(false),
        rq_busy: AtomicBool::new(false),
    }))
    .cast::<ffi::ibv_qp>();
    let mut saved: ffi::ibv_qp_attr = zeroed();
    saved.cap = *c;
    st.qps.insert(
        qpn,
        QpEntry {
            core: if ud {
                QpCore::Ud(UdQp::new(cfg, UD_MTU))
            } else {
                QpCore::Rc(RcQp::new(cfg))
            },
            raw: qp,
            ctx: ctx.cast(),
            send_cq: a.send_cq.cast(),
            recv_cq: a.recv_cq.cast(),
            srq: srq_handle,
            caps: *c,
            attr: saved,
            remote: QpEntry::peer_of(&saved),
            route: None,
            delay: Duration::ZERO,
            held: VecDeque::new(),
            published: None,
            dirty: false,
            owing: false,
        },
    );
    drop(st);
    super::faults::on_create(qpn);
    qp
}

/// Sends QP `qpn`'s held-back acknowledgement now, if it holds one.
fn flush_ack_of(qpn: u32) {
    flush_ack_locked(&mut lock(), qpn);
}

/// [`flush_ack_of`] under the lock the caller holds.
fn flush_ack_locked(st: &mut State, qpn: u32) {
    if st.qps.get_mut(&qpn).is_some_and(|e| e.core.flush_ack()) {
        st.touch(qpn);
        pump(st, &mut LazyNow::default());
    }
}

/// The longest `destroy_qp` waits for the links to write what is queued.
const LINK_FLUSH_LIMIT: Duration = Duration::from_secs(1);

/// # Safety
/// `qp` is a live soft QP.
pub(crate) unsafe fn destroy_qp(qp: *mut ffi::ibv_qp) -> c_int {
    // SAFETY: made by `create_qp`, freed once (the caller's contract).
    let qp = unsafe { Box::from_raw(qp.cast::<SoftQp>()) };
    // The acknowledgement it holds back goes (rxe sent it as it executed the request).
    flush_ack_of(qp.raw.qp_num);
    // What this QP sent (a datagram, an acknowledgement) leaves the process first, as it
    // would have left a NIC when it completed (see `Links::flush`).
    if let Some(l) = &device().links {
        l.flush(LINK_FLUSH_LIMIT);
    }
    let mut st = lock();
    // One held since (another thread's poll delivered to it while the links flushed) goes
    // too, in the same lock as the removal: nothing can be held after it.
    flush_ack_locked(&mut st, qp.raw.qp_num);
    let gone = st.qps.remove(&qp.raw.qp_num);
    if let (Some(dir), Some(Some(_))) = (&device().directory, gone.as_ref().map(|e| e.published)) {
        dir.publish_qp(qp.raw.qp_num, None);
    }
    // Its events are forgotten outside the lock: that may wait for the application's
    // acknowledgement.
    drop(st);
    if let Some(e) = gone {
        // SAFETY: the QP's context outlives it.
        unsafe { forget_events(e.ctx, e.raw.cast()) };
    }
    0
}

/// # Safety
/// `qp` is a live soft QP; `attr` is readable.
pub(crate) unsafe fn modify_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    mask: c_int,
) -> c_int {
    use ffi::ibv_qp_attr_mask as M;
    use ffi::ibv_qp_state as S;
    // SAFETY: the caller's contract.
    let (a, qpn) = unsafe { (&*attr, (*qp).qp_num) };
    let has = |m: M| mask as u32 & m.0 != 0;
    let mut st = lock();
    // RESET forgets what is queued: the acknowledgement held back goes first (rxe sent it
    // as it executed the request), in the lock of the reset (an outside reviewer saw the
    // gap between two locks let a poll hold a new one, which the reset then dropped).
    if has(M::IBV_QP_STATE) && a.qp_state == S::IBV_QPS_RESET {
        flush_ack_locked(&mut st, qpn);
    }
    let Some(e) = st.qps.get_mut(&qpn) else {
        return libc::EINVAL;
    };
    let kind = match &e.core {
        QpCore::Ud(_) => QpKind::Ud,
        QpCore::Rc(q) if q.config().unreliable => QpKind::Uc,
        QpCore::Rc(_) => QpKind::Rc,
    };
    let to = has(M::IBV_QP_STATE).then_some(a.qp_state);
    if let Err(rc) = check_modify(kind, raw_state(e.core.state()), to, mask as u32, a) {
        return rc;
    }
    // A refused state change changes nothing (as rxe checks everything first): what the
    // attributes below set is put back then.
    let before = (e.attr, *e.core.config(), e.remote, e.route.clone());
    let before_qkey = match &e.core {
        QpCore::Ud(q) => Some(q.qkey()),
        QpCore::Rc(_) => None,
    };
    let undo = |e: &mut QpEntry| {
        (e.attr, e.remote, e.route) = (before.0, before.2, before.3.clone());
        e.core.set_config(|c| *c = before.1);
        if let (QpCore::Ud(q), Some(k)) = (&mut e.core, before_qkey) {
            q.set_qkey(k);
        }
    };
    let saved = &mut e.attr;
    if has(M::IBV_QP_ACCESS_FLAGS) {
        saved.qp_access_flags = a.qp_access_flags;
        let rights = Access(a.qp_access_flags & 0xe);
        e.core.set_config(|c| c.access = rights);
    }
    if has(M::IBV_QP_MIN_RNR_TIMER) {
        saved.min_rnr_timer = a.min_rnr_timer;
        e.core
            .set_config(|c| c.min_rnr_timer = rnr_timer(a.min_rnr_timer));
    }
    if has(M::IBV_QP_RNR_RETRY) {
        saved.rnr_retry = a.rnr_retry;
        e.core.set_config(|c| c.rnr_retry = a.rnr_retry.min(7));
    }
    if has(M::IBV_QP_PATH_MTU) {
        saved.path_mtu = a.path_mtu;
    }
    if has(M::IBV_QP_DEST_QPN) {
        saved.dest_qp_num = a.dest_qp_num;
    }
    // PSNs are 24 bits on the wire: rxe keeps only those of what it is given (and
    // `ibv_query_qp` reads them back so), and peers may exchange them masked. Kept whole, a
    // side set from a value of 2^24 or more and its peer from the masked copy disagreed on
    // every request's PSN (an outside reviewer's find).
    if has(M::IBV_QP_RQ_PSN) {
        saved.rq_psn = a.rq_psn & PSN_MASK;
    }
    if has(M::IBV_QP_SQ_PSN) {
        saved.sq_psn = a.sq_psn & PSN_MASK;
    }
    if has(M::IBV_QP_TIMEOUT) {
        saved.timeout = a.timeout;
        e.core
            .set_config(|c| c.ack_timeout = ack_timeout(a.timeout));
    }
    if has(M::IBV_QP_RETRY_CNT) {
        saved.retry_cnt = a.retry_cnt;
        e.core.set_config(|c| c.retry_cnt = a.retry_cnt.min(7));
    }
    if has(M::IBV_QP_MAX_QP_RD_ATOMIC) {
        saved.max_rd_atomic = a.max_rd_atomic;
    }
    if has(M::IBV_QP_MAX_DEST_RD_ATOMIC) {
        saved.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if has(M::IBV_QP_PORT) {
        saved.port_num = a.port_num;
    }
    if has(M::IBV_QP_PKEY_INDEX) {
        saved.pkey_index = a.pkey_index;
    }
    if has(M::IBV_QP_AV) {
        saved.ah_attr = a.ah_attr;
    }
    if has(M::IBV_QP_QKEY) {
        saved.qkey = a.qkey;
        if let QpCore::Ud(q) = &mut e.core {
            q.set_qkey(a.qkey);
        }
    }
    if has(M::IBV_QP_AV) {
        e.remote = QpEntry::peer_of(&e.attr);
        e.route = None;
    }
    if has(M::IBV_QP_STATE) {
        let to = a.qp_state;
        let r = match to {
            S::IBV_QPS_RESET => {
                e.core.reset();
                Ok(())
            }
            // INIT → INIT changes attributes only.
            S::IBV_QPS_INIT if e.core.state() == QpState::Init => Ok(()),
            S::IBV_QPS_INIT => e.core.move_to_init(),
            S::IBV_QPS_RTR => {
                // The queue pair takes its link to the peer's device now, not with the first
                // request: on this host it then shares memory before the first one-sided
                // request (a request behind one that went as a packet cannot go directly).
                // A link to a process that had the address before is not taken
                // (`Links::route_fresh`).
                let remote = e.remote();
                let dev = device();
                if let Some(l) = &dev.links {
                    e.route = None;
                    route_to(&mut e.route, remote, l, &dev.deliver);
                }
                e.core.move_to_rtr(e.attr.dest_qp_num, e.attr.rq_psn)
            }
            S::IBV_QPS_RTS if e.core.state() == QpState::Rts => Ok(()),
            S::IBV_QPS_RTS => e.core.move_to_rts(e.attr.sq_psn),
            S::IBV_QPS_ERR => {
                e.core.move_to_error();
                Ok(())
            }
            _ => Err(PostError::Invalid("a state soft0 has no transition to")),
        };
        if r.is_err() {
            undo(e);
            return libc::EINVAL;
        }
        // SAFETY: the caller's contract; the state field is the QP's own.
        unsafe { (*qp).state = to };
        st.touch(qpn);
        pump(&mut st, &mut LazyNow::default());
    }
    if let Some(e) = st.qps.get_mut(&qpn) {
        e.publish();
    }
    0
}

/// A queue pair's transport, for the rules of its state changes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QpKind {
    Rc,
    Uc,
    Ud,
}

/// The verbs state of a soft QP's state.
fn raw_state(s: QpState) -> ffi::ibv_qp_state {
    use ffi::ibv_qp_state as S;
    match s {
        QpState::Reset => S::IBV_QPS_RESET,
        QpState::Init => S::IBV_QPS_INIT,
        QpState::Rtr => S::IBV_QPS_RTR,
        QpState::Rts => S::IBV_QPS_RTS,
        QpState::Error => S::IBV_QPS_ERR,
    }
}

/// The attributes a state change `from` → `to` of a `kind` queue pair requires and those it
/// may also carry, as the kernel's table (`ib_modify_qp_is_ok`) says; `None`: no such
/// change. A modify without a state change is `from` → `from`.
fn modify_rule(kind: QpKind, from: ffi::ibv_qp_state, to: ffi::ibv_qp_state) -> Option<(u32, u32)> {
    use ffi::ibv_qp_attr_mask as M;
    use ffi::ibv_qp_state as S;
    let bits = |ms: &[M]| ms.iter().fold(0u32, |b, m| b | m.0);
    let any = M::IBV_QP_STATE.0;
    // As the kernel's table: only a change from RTR or RTS to RTS may name the state it
    // starts from (`check_modify` holds it to the real one).
    let cur = match (from, to) {
        (S::IBV_QPS_RTR | S::IBV_QPS_RTS, S::IBV_QPS_RTS) => M::IBV_QP_CUR_STATE.0,
        _ => 0,
    };
    let (req, opt): (&[M], &[M]) = match (from, to, kind) {
        (_, S::IBV_QPS_RESET | S::IBV_QPS_ERR, _) => (&[], &[]),
        (S::IBV_QPS_RESET | S::IBV_QPS_INIT, S::IBV_QPS_INIT, k) => {
            let third = if k == QpKind::Ud {
                M::IBV_QP_QKEY
            } else {
                M::IBV_QP_ACCESS_FLAGS
            };
            let all = bits(&[M::IBV_QP_PKEY_INDEX, M::IBV_QP_PORT, third]);
            return Some(if from == S::IBV_QPS_RESET {
                (all, any)
            } else {
                (0, all | any)
            });
        }
        (S::IBV_QPS_INIT, S::IBV_QPS_RTR, QpKind::Ud) => {
            (&[], &[M::IBV_QP_PKEY_INDEX, M::IBV_QP_QKEY])
        }
        (S::IBV_QPS_INIT, S::IBV_QPS_RTR, QpKind::Uc) => (
            &[
                M::IBV_QP_AV,
                M::IBV_QP_PATH_MTU,
                M::IBV_QP_DEST_QPN,
                M::IBV_QP_RQ_PSN,
            ],
            &[
                M::IBV_QP_ALT_PATH,
                M::IBV_QP_ACCESS_FLAGS,
                M::IBV_QP_PKEY_INDEX,
            ],
        ),
        (S::IBV_QPS_INIT, S::IBV_QPS_RTR, QpKind::Rc) => (
            &[
                M::IBV_QP_AV,
                M::IBV_QP_PATH_MTU,
                M::IBV_QP_DEST_QPN,
                M::IBV_QP_RQ_PSN,
                M::IBV_QP_MAX_DEST_RD_ATOMIC,
                M::IBV_QP_MIN_RNR_TIMER,
            ],
            &[
                M::IBV_QP_ALT_PATH,
                M::IBV_QP_ACCESS_FLAGS,
                M::IBV_QP_PKEY_INDEX,
            ],
        ),
        (S::IBV_QPS_RTR, S::IBV_QPS_RTS, QpKind::Ud) => (&[M::IBV_QP_SQ_PSN], &[M::IBV_QP_QKEY]),
        (S::IBV_QPS_RTR, S::IBV_QPS_RTS, QpKind::Uc) => (
            &[M::IBV_QP_SQ_PSN],
            &[
                M::IBV_QP_ALT_PATH,
                M::IBV_QP_ACCESS_FLAGS,
                M::IBV_QP_PATH_MIG_STATE,
            ],
        ),
        (S::IBV_QPS_RTR, S::IBV_QPS_RTS, QpKind::Rc) => (
            &[
                M::IBV_QP_SQ_PSN,
                M::IBV_QP_TIMEOUT,
                M::IBV_QP_RETRY_CNT,
                M::IBV_QP_RNR_RETRY,
                M::IBV_QP_MAX_QP_RD_ATOMIC,
            ],
            &[
                M::IBV_QP_ALT_PATH,
                M::IBV_QP_ACCESS_FLAGS,
                M::IBV_QP_MIN_RNR_TIMER,
                M::IBV_QP_PATH_MIG_STATE,
            ],
        ),
        (S::IBV_QPS_RTS, S::IBV_QPS_RTS, QpKind::Ud) => (&[], &[M::IBV_QP_QKEY]),
        (S::IBV_QPS_RTS, S::IBV_QPS_RTS, QpKind::Uc) => (
            &[],
            &[
                M::IBV_QP_ACCESS_FLAGS,
                M::IBV_QP_ALT_PATH,
                M::IBV_QP_PATH_MIG_STATE,
            ],
        ),
        (S::IBV_QPS_RTS, S::IBV_QPS_RTS, QpKind::Rc) => (
            &[],
            &[
                M::IBV_QP_ACCESS_FLAGS,
                M::IBV_QP_ALT_PATH,
                M::IBV_QP_PATH_MIG_STATE,
                M::IBV_QP_MIN_RNR_TIMER,
            ],
        ),
        _ => return None,
    };
    Some((bits(req), bits(opt) | any | cur))
}

/// Checks a modify as a provider does before it changes anything: the state change exists,
/// its required attributes are there and no other, and the values fit the device (one
/// port, two GIDs). `EINVAL` otherwise.
fn check_modify(
    kind: QpKind,
    from: ffi::ibv_qp_state,
    to: Option<ffi::ibv_qp_state>,
    mask: u32,
    a: &ffi::ibv_qp_attr,
) -> Result<(), c_int> {
    use ffi::ibv_qp_attr_mask as M;
    // Send-queue drain (SQD) is a state soft0 does not have: unsupported, not invalid.
    if to == Some(ffi::ibv_qp_state::IBV_QPS_SQD) {
        return Err(libc::EOPNOTSUPP);
    }
    let (req, opt) = modify_rule(kind, from, to.unwrap_or(from)).ok_or(libc::EINVAL)?;
    // A current state named is a claim about this queue pair: a wrong one is refused (rxe
    // would take it as the state to change from, and its table would refuse the change).
    if mask & M::IBV_QP_CUR_STATE.0 != 0 && a.cur_qp_state != from {
        return Err(libc::EINVAL);
    }
    let given = mask & !M::IBV_QP_STATE.0;
    if given & req != req || given & !(req | opt) != 0 {
        return Err(libc::EINVAL);
    }
    let has = |m: M| mask & m.0 != 0;
    // rxe (Linux 6.1) takes any P_Key index: so does soft0.
    let bad_port = has(M::IBV_QP_PORT) && a.port_num != 1;
    // A RoCE path is routed: its address vector needs a GRH (as rxe's, whose kernel resolves
    // the peer's MAC from it).
    let bad_av = has(M::IBV_QP_AV)
        && (a.ah_attr.port_num > 1 || a.ah_attr.is_global == 0 || a.ah_attr.grh.sgid_index >= 2);
    // An MTU of the verbs' table (256 to 4096), no larger than the port's (as rxe checks it
    // against its port's): 0 or 9 is no MTU (an outside tester's raw `ibv_modify_qp` had
    // them taken, and `ibv_query_qp` read back none).
    let bad_mtu = has(M::IBV_QP_PATH_MTU)
        && !(ffi::ibv_mtu::IBV_MTU_256.0..=PORT_MTU.0).contains(&a.path_mtu.0);
    if bad_port || bad_av || bad_mtu {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// # Safety
/// `qp` is a live soft QP; the out-pointers are writable.
pub(crate) unsafe fn query_qp(
    qp: *mut ffi::ibv_qp,
    attr: *mut ffi::ibv_qp_attr,
    init: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    let raw = unsafe { &*qp };
    let st = lock();
    let Some(e) = st.qps.get(&raw.qp_num) else {
        return libc::EINVAL;
    };
    let state = match e.core.state() {
        QpState::Reset => ffi::ibv_qp_state::IBV_QPS_RESET,
        QpState::Init => ffi::ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => ffi::ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => ffi::ibv_qp_state::IBV_QPS_RTS,
        QpState::Error => ffi::ibv_qp_state::IBV_QPS_ERR,
    };
    let mut a = e.attr;
    a.qp_state = state;
    a.cur_qp_state = state;
    a.cap = e.caps;
    let mut i: ffi::ibv_qp_init_attr = zeroed();
    i.qp_context = raw.qp_context;
    i.send_cq = raw.send_cq;
    i.recv_cq = raw.recv_cq;
    i.srq = raw.srq;
    i.cap = e.caps;
    i.qp_type = raw.qp_type;
    i.sq_sig_all = c_int::from(e.core.config().sq_sig_all);
    // SAFETY: the caller's contract.
    unsafe {
        *attr = a;
        *init = i;
    }
    0
}

/// # Safety
/// `pd` is a live soft PD; `attr` is a valid, writable attribute struct.
pub(crate) unsafe fn create_srq(
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_srq_init_attr,
) -> *mut ffi::ibv_srq {
    // SAFETY: the caller's contract.
    let a = unsafe { &mut *attr };
    if a.attr.max_wr == 0 || a.attr.max_wr > MAX_QP_WR || a.attr.max_sge > MAX_SRQ_SGE {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let mut st = lock();
    let handle = st.handle();
    let mut raw: ffi::ibv_srq = zeroed();
    // SAFETY: the caller's contract.
    raw.context = unsafe { (*pd).context };
    raw.srq_context = a.srq_context;
    raw.pd = pd;
    raw.handle = handle;
    let ctx = raw.context.cast();
    let srq = Box::into_raw(Box::new(SoftSrq {
        raw,
        busy: AtomicBool::new(false),
    }))
    .cast::<ffi::ibv_srq>();
    st.srqs.insert(
        handle,
        SrqEntry {
            core: Srq::new(handle, a.attr.max_wr),
            raw: srq,
            ctx,
            max_sge: a.attr.max_sge,
        },
    );
    srq
}

/// # Safety
/// `srq` is a live soft SRQ that no QP uses any more.
pub(crate) unsafe fn destroy_srq(srq: *mut ffi::ibv_srq) -> c_int {
    // SAFETY: made by `create_srq`, freed once (the caller's contract).
    let srq = unsafe { Box::from_raw(srq.cast::<SoftSrq>()) };
    let gone = lock().srqs.remove(&srq.raw.handle);
    if let Some(s) = gone {
        // SAFETY: the SRQ's context outlives it.
        unsafe { forget_events(s.ctx, s.raw.cast()) };
    }
    0
}

/// # Safety
/// `srq` is a live soft SRQ; `attr` is readable.
pub(crate) unsafe fn modify_srq(
    srq: *mut ffi::ibv_srq,
    attr: *mut ffi::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let (a, handle) = unsafe { (&*attr, (*srq).handle) };
    if mask as u32 & ffi::ibv_srq_attr_mask::IBV_SRQ_MAX_WR.0 != 0 {
        return libc::EOPNOTSUPP;
    }
    if mask as u32 & ffi::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 != 0 && a.srq_limit != 0 {
        let mut st = lock();
        let Some(s) = st.srqs.get_mut(&handle) else {
            return libc::EINVAL;
        };
        if s.core.arm_limit(a.srq_limit).is_err() {
            return libc::EINVAL;
        }
    }
    0
}

/// # Safety
/// `ctx` is a live soft context; `event` is writable.
pub(crate) unsafe fn get_async_event(
    ctx: *mut ffi::ibv_context,
    event: *mut ffi::ibv_async_event,
) -> c_int {
    // SAFETY: the caller's contract.
    let ctx = unsafe { &*ctx.cast::<SoftContext>() };
    if !take_signal(ctx.raw.async_fd) {
        set_errno(libc::EAGAIN);
        return -1;
    }
    let mut events = ctx.events.lock().unwrap_or_else(|p| p.into_inner());
    let Some(e) = events.pop_front() else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    // Its object (a QP, SRQ or CQ; port and device events name none) now waits for the
    // acknowledgement before it may be destroyed: noted before the queue's lock goes, so a
    // destroy finds the event either queued or handed.
    if names_object(e.event_type) {
        // SAFETY: reading the pointer member of an event this module made.
        let of = unsafe { e.element.qp } as usize;
        ctx.handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(of);
    }
    drop(events);
    // SAFETY: the caller's contract.
    unsafe { *event = e };
    0
}

/// A verb the soft device does not have: null, with `errno` EOPNOTSUPP.
pub(crate) fn unsupported_ptr<T>() -> *mut T {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What INIT → RTR of an RC queue pair takes (and needs).
    const RTR_ATTRS: u32 = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0
        | ffi::ibv_qp_attr_mask::IBV_QP_AV.0
        | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU.0
        | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN.0
        | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN.0
        | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC.0
        | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;

    /// What RTR → RTS of an RC queue pair takes (and needs).
    const RTS_ATTRS: u32 = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0
        | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN.0
        | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT.0
        | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT.0
        | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
        | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0;

    /// An RC queue pair of soft0 in RESET, with what it needs kept alive.
    fn rc_qp() -> (crate::Context, crate::Pd, crate::Cq, crate::Qp) {
        let ctx = crate::open("soft0").unwrap();
        let pd = crate::Pd::new(&ctx).unwrap();
        let cq = crate::Cq::new(&ctx, 4, None).unwrap();
        let qp = crate::Qp::builder(crate::QpType::Rc)
            .build(&pd, &cq, &cq)
            .unwrap();
        (ctx, pd, cq, qp)
    }

    /// How many taken events of `ctx` wait for their acknowledgement.
    fn handed(ctx: &crate::Context) -> usize {
        let raw = ctx.as_raw().expect("a libibverbs context");
        // SAFETY: a soft context, open while `ctx` lives.
        let soft = unsafe { &*raw.cast::<SoftContext>() };
        soft.handed.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// PSNs are 24 bits: what `ibv_modify_qp` is given past them is dropped, as rxe does
    /// (the safe API refuses such PSNs; a program calling the verbs itself may pass them).
    #[test]
    fn a_psn_keeps_its_24_bits() {
        use ffi::ibv_qp_attr_mask as M;
        use ffi::ibv_qp_state as S;
        let (_ctx, _pd, _cq, qp) = rc_qp();
        let raw = qp.as_raw().expect("a verbs QP");
        let mut a: ffi::ibv_qp_attr = zeroed();
        a.qp_state = S::IBV_QPS_INIT;
        a.port_num = 1;
        let init = M::IBV_QP_STATE.0
            | M::IBV_QP_PKEY_INDEX.0
            | M::IBV_QP_PORT.0
            | M::IBV_QP_ACCESS_FLAGS.0;
        let mut rtr = a;
        rtr.qp_state = S::IBV_QPS_RTR;
        rtr.path_mtu = ffi::ibv_mtu::IBV_MTU_1024;
        rtr.dest_qp_num = qp.qp_num();
        rtr.rq_psn = 0x0300_0007;
        rtr.max_dest_rd_atomic = 1;
        rtr.ah_attr.is_global = 1;
        rtr.ah_attr.port_num = 1;
        let rtr_mask = RTR_ATTRS;
        let mut rts = a;
        rts.qp_state = S::IBV_QPS_RTS;
        rts.sq_psn = 0x0100_0005;
        for (mut attr, mask) in [(a, init), (rtr, rtr_mask), (rts, RTS_ATTRS)] {
            // SAFETY: a live soft QP and a valid attribute struct.
            let rc = unsafe { modify_qp(raw, &mut attr, mask as c_int) };
            assert_eq!(rc, 0, "{:?}", attr.qp_state);
        }
        let info = qp.query().unwrap();
        assert_eq!((info.rq_psn, info.sq_psn), (7, 5));
    }

    /// Port events name no object, so taking one leaves nothing waiting for its
    /// acknowledgement: each once left an entry behind for good (an outside tester's loop of
    /// port events grew the process by 8 bytes an event, and every destroy scanned them).
    #[test]
    fn port_events_leave_nothing_waiting_for_an_acknowledgement() {
        let (ctx, _pd, _cq, qp) = rc_qp();
        for _ in 0..50 {
            crate::soft_faults::port_down(qp.qp_num()).unwrap();
            crate::soft_faults::port_up(qp.qp_num()).unwrap();
            while ctx.read_async_event().unwrap().is_some() {}
        }
        assert_eq!(handed(&ctx), 0);
    }

    /// A named current state is held to the real one, and only a change from RTR or RTS to
    /// RTS may name it, as in the kernel's table (an outside tester's find: soft0 took it on
    /// every change, whatever it said).
    #[test]
    fn a_named_current_state_must_be_the_real_one_and_allowed_there() {
        use ffi::ibv_qp_attr_mask as M;
        use ffi::ibv_qp_state as S;
        let rts_attrs = RTS_ATTRS;
        let mut a: ffi::ibv_qp_attr = zeroed();
        let to = Some(S::IBV_QPS_RTS);
        let with_cur = rts_attrs | M::IBV_QP_CUR_STATE.0;
        a.cur_qp_state = S::IBV_QPS_RTR;
        assert_eq!(
            check_modify(QpKind::Rc, S::IBV_QPS_RTR, to, with_cur, &a),
            Ok(())
        );
        assert_eq!(
            check_modify(QpKind::Rc, S::IBV_QPS_RTR, to, rts_attrs, &a),
            Ok(())
        );
        a.cur_qp_state = S::IBV_QPS_INIT;
        assert_eq!(
            check_modify(QpKind::Rc, S::IBV_QPS_RTR, to, with_cur, &a),
            Err(libc::EINVAL),
            "a wrong current state"
        );
        // RESET → INIT takes no current state.
        a.cur_qp_state = S::IBV_QPS_RESET;
        let init = M::IBV_QP_STATE.0
            | M::IBV_QP_PKEY_INDEX.0
            | M::IBV_QP_PORT.0
            | M::IBV_QP_ACCESS_FLAGS.0;
        a.port_num = 1;
        let init_to = Some(S::IBV_QPS_INIT);
        assert_eq!(
            check_modify(QpKind::Rc, S::IBV_QPS_RESET, init_to, init, &a),
            Ok(())
        );
        assert_eq!(
            check_modify(
                QpKind::Rc,
                S::IBV_QPS_RESET,
                init_to,
                init | M::IBV_QP_CUR_STATE.0,
                &a
            ),
            Err(libc::EINVAL)
        );
        // A drain of the send queue: a state soft0 does not have.
        a.cur_qp_state = S::IBV_QPS_RTS;
        let sqd = Some(S::IBV_QPS_SQD);
        assert_eq!(
            check_modify(QpKind::Rc, S::IBV_QPS_RTS, sqd, M::IBV_QP_STATE.0, &a),
            Err(libc::EOPNOTSUPP)
        );
    }

    /// A path MTU is one of the verbs' table up to the port's (4096): 0, or a value past it,
    /// is refused at RTR, as rxe refuses one over its port's (an outside tester's raw
    /// `ibv_modify_qp` had them taken).
    #[test]
    fn a_path_mtu_must_be_an_mtu_the_port_has() {
        use ffi::ibv_qp_state as S;
        let mut a: ffi::ibv_qp_attr = zeroed();
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        let rtr = RTR_ATTRS;
        let to = Some(S::IBV_QPS_RTR);
        for (mtu, ok) in [(0, false), (1, true), (5, true), (6, false), (9, false)] {
            a.path_mtu = ffi::ibv_mtu(mtu);
            let r = check_modify(QpKind::Rc, S::IBV_QPS_INIT, to, rtr, &a);
            assert_eq!(r.is_ok(), ok, "path_mtu {mtu}: {r:?}");
        }
    }

    /// soft0's port is RoCE-like: an address handle without a GRH is refused (`EINVAL`), as
    /// the kernel refuses one on rxe's port; one with a GRH is made (an outside tester's
    /// handle without one was taken, and its datagrams went by LID alone).
    #[test]
    fn an_address_handle_needs_a_grh() {
        let ctx = crate::open("soft0").unwrap();
        let pd = crate::Pd::new(&ctx).unwrap();
        let mut attr = crate::AhAttr {
            port_num: 1,
            dlid: own_lid(),
            ..Default::default()
        };
        let err = crate::Ah::new(&pd, &attr).expect_err("refused without a GRH");
        assert!(err.to_string().contains("Invalid argument"), "{err}");
        attr.grh = Some(crate::GlobalRoute::new(crate::Gid(own_gid()), 1));
        crate::Ah::new(&pd, &attr).unwrap();
    }
}
