//! rdma_cm for the soft device: event channels, ids, address and route resolution,
//! listen/connect/accept/reject/disconnect, with librdmacm's C signatures and its event
//! semantics, so rsrdma's `cm` module (and so `Establish::Cm`, the default establishment)
//! runs on `soft0` unchanged.
//!
//! # When it is used
//! A process uses the soft CM instead of librdmacm when `RSRDMA_SOFT_CM=1`, or when
//! librdmacm has no RDMA stack to open (`rdma_create_event_channel` fails with ENODEV or
//! ENOENT: no `/dev/infiniband/rdma_cm`) and `RSRDMA_SOFT_DEVICE=1` asks for the soft
//! device. Every id of a soft channel is soft, and its device is `soft0`.
//!
//! # How it connects
//! As the kernel's CM does over its management datagrams, two soft CMs exchange REQ, REP, REJ, RTU,
//! DREQ and HEARD ([`wire`]), here over one TCP connection per connection, to the address the
//! listener is bound to (so the usual rules apply: `EADDRINUSE`, `EADDRNOTAVAIL`, a port nobody
//! listens on gives REJECTED with status 8, as rxe does; so does a port where something else took
//! the connection and said nothing for 1 s: the listener's CM answers every REQ at once with
//! [`wire::HEARD`], before its application takes the request). A REQ and a REP carry the queue
//! pair's number, the device's LID and the first PSN, the depths and RNR retry count, and the
//! private data. One thread per process reads every connection ([`connections`]); the calls write
//! to them. A connection that ends is the peer's disconnect (DISCONNECTED, then TIMEWAIT_EXIT once
//! this side disconnected too); an id destroyed before it answered a request rejects it, as the
//! kernel's CM does. As librdmacm does, the queue-pair transitions happen in the calls and in
//! `rdma_get_cm_event` (the active side's RTR/RTS when it takes ESTABLISHED; ERROR when an id takes
//! DISCONNECTED), never on a thread of ours, so rsrdma's guard around the id's QP covers them. A
//! REQ and a REP carry the device's GID too: a soft device that listens on an address of its host
//! (`RSRDMA_SOFT_ADDR`) is reached from other hosts by it, and their CMs connect to any address a
//! route leads to (the unspecified address does not resolve: `ENETUNREACH`).

mod connections;
mod wire;

use super::verbs::{self, own_gid, own_lid, set_errno, zeroed};
use crate::ffi;
use connections::{watch, Conn};
use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::raw::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use wire::{write_frame, Endpoint, DREQ, REJ, REJ_INVALID_SERVICE_ID, REP, REQ, RTU};

/// How long a connect waits for the listener's TCP socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether this process uses the soft CM; decided once, by the first event channel.
static SELECTED: OnceLock<bool> = OnceLock::new();

/// The live soft channels, ids and events (by address), so the facade knows which calls
/// are ours.
#[derive(Default)]
struct Registry {
    channels: HashSet<usize>,
    ids: HashSet<usize>,
    events: HashSet<usize>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The soft device's context that soft ids hand out: opened once, never closed (contexts
/// made from a CM id belong to the CM, as librdmacm's do).
fn context() -> *mut ffi::ibv_context {
    struct Ctx(*mut ffi::ibv_context);
    // SAFETY: the pointer names a context that lives for the whole process.
    unsafe impl Send for Ctx {}
    // SAFETY: as above.
    unsafe impl Sync for Ctx {}
    static CTX: OnceLock<Ctx> = OnceLock::new();
    CTX.get_or_init(|| Ctx(verbs::open_device())).0
}

// ----- which CM ---------------------------------------------------------------------------

/// Whether `RSRDMA_SOFT_CM=1` forces the soft CM.
pub(crate) fn forced() -> bool {
    std::env::var_os("RSRDMA_SOFT_CM").is_some_and(|v| v == "1")
}

/// Whether a failure of librdmacm's `rdma_create_event_channel` with `errno` (no RDMA stack)
/// hands the process to the soft CM: only when the soft device was asked for.
pub(crate) fn takes_over(errno: c_int) -> bool {
    *SELECTED.get_or_init(|| {
        matches!(errno, libc::ENODEV | libc::ENOENT | libc::ENOSYS) && super::listed() || forced()
    })
}

pub(crate) fn is_channel(ch: *mut ffi::rdma_event_channel) -> bool {
    !ch.is_null() && registry().channels.contains(&(ch as usize))
}

pub(crate) fn is_id(id: *mut ffi::rdma_cm_id) -> bool {
    !id.is_null() && registry().ids.contains(&(id as usize))
}

pub(crate) fn is_event(ev: *mut ffi::rdma_cm_event) -> bool {
    !ev.is_null() && registry().events.contains(&(ev as usize))
}

// ----- objects ----------------------------------------------------------------------------

#[repr(C)]
struct Channel {
    raw: ffi::rdma_event_channel,
    /// Events, each also counted on `raw.fd` (a semaphore eventfd).
    queue: Mutex<VecDeque<*mut Event>>,
}

/// What `rdma_get_cm_event` does to the id's QP as it hands the event out.
enum Action {
    None,
    /// The acceptor's REP came: RTR and RTS towards it, then RTU.
    Established(Endpoint),
    /// The connection ended, or was rejected (as librdmacm's `rdma_get_cm_event` moves the
    /// QP on a REJECTED): the QP goes to ERROR, so the receives posted before the connect
    /// come back flushed.
    Disconnected,
}

#[repr(C)]
struct Event {
    raw: ffi::rdma_cm_event,
    private: Vec<u8>,
    action: Action,
}

#[repr(C)]
struct Id {
    raw: ffi::rdma_cm_id,
    shared: Arc<Shared>,
}

/// What an id shares with the threads that read its connection.
struct Shared {
    state: Mutex<IdState>,
}

struct IdState {
    /// The id (for the events), until it is destroyed.
    id: *mut ffi::rdma_cm_id,
    channel: *mut Channel,
    dead: bool,
    listener: Option<TcpListener>,
    /// The connection to the peer's CM (a write half; a thread reads a clone).
    stream: Option<TcpStream>,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    psn: u32,
    /// The requester, on an id from a connect request.
    peer: Option<Endpoint>,
    /// What this side sent in its REQ (the active side's RTR/RTS need its depths).
    mine: Option<Endpoint>,
    established: bool,
    /// The passive side answered the request (`rdma_accept` or `rdma_reject`): a reject comes
    /// too late now, as on the kernel's CM.
    answered: bool,
    /// DISCONNECTED was reported (or the exchange failed).
    disconnected: bool,
    /// This side called `rdma_disconnect`.
    local_disconnect: bool,
    /// TIMEWAIT_EXIT was reported: after both of the above, as the kernel's CM reports it
    /// once the QP's time-wait ends.
    timewait: bool,
}

impl IdState {
    /// Reports TIMEWAIT_EXIT once the connection ended on both counts.
    fn time_wait_exit(&mut self) {
        if self.disconnected && self.local_disconnect && !self.timewait {
            self.timewait = true;
            push(
                self,
                ffi::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT,
                0,
                Vec::new(),
                Action::None,
            );
        }
    }
}

// SAFETY: the raw pointers name objects of this module, used under the state's lock, and
// only while the id lives (`dead` says when it no longer does).
unsafe impl Send for IdState {}

/// A PSN to start from (24 bits), different per connection.
fn new_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() as u32) & 0xff_ffff
}

// ----- events -----------------------------------------------------------------------------

/// Queues an event for the id `st` describes, on its channel (nothing once it is dead).
fn push(
    st: &IdState,
    kind: ffi::rdma_cm_event_type,
    status: c_int,
    private: Vec<u8>,
    action: Action,
) {
    if st.dead {
        return;
    }
    let mut raw: ffi::rdma_cm_event = zeroed();
    raw.id = st.id;
    raw.event = kind;
    raw.status = status;
    queue(st.channel, raw, private, action);
}

/// Queues `raw` (its private data pointing at `private`) on `channel` and counts it.
fn queue(channel: *mut Channel, raw: ffi::rdma_cm_event, private: Vec<u8>, action: Action) {
    let ev = Box::into_raw(Box::new(Event {
        raw,
        private,
        action,
    }));
    // SAFETY: just made; the private data lives in the box, which does not move.
    unsafe {
        let e = &mut *ev;
        e.raw.param.conn.private_data = e.private.as_ptr().cast();
        e.raw.param.conn.private_data_len = e.private.len().min(255) as u8;
    }
    // Under the registry's lock, which a channel's destruction takes first: an id outlives
    // its channel when a listener went with requests nobody took (their ids are destroyed
    // with the channel, but a connection's thread may be about to push an event for one).
    let mut reg = registry();
    if !reg.channels.contains(&(channel as usize)) {
        drop(reg);
        // SAFETY: just made above, never queued.
        drop(unsafe { Box::from_raw(ev) });
        return;
    }
    reg.events.insert(ev as usize);
    // SAFETY: a live channel (registered, and its destruction waits for this lock).
    let ch = unsafe { &*channel };
    lock(&ch.queue).push_back(ev);
    verbs::signal(ch.raw.fd);
}

// ----- the verbs --------------------------------------------------------------------------

pub(crate) fn create_event_channel() -> *mut ffi::rdma_event_channel {
    let fd = verbs::new_eventfd();
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let ch = Box::into_raw(Box::new(Channel {
        raw: ffi::rdma_event_channel { fd },
        queue: Mutex::new(VecDeque::new()),
    }));
    registry().channels.insert(ch as usize);
    ch.cast()
}

/// # Safety
/// `ch` is a soft channel with no id left on it.
pub(crate) unsafe fn destroy_event_channel(ch: *mut ffi::rdma_event_channel) {
    registry().channels.remove(&(ch as usize));
    // SAFETY: made by `create_event_channel`, freed once (the caller's contract).
    let ch = unsafe { Box::from_raw(ch.cast::<Channel>()) };
    let queued: Vec<*mut Event> = lock(&ch.queue).drain(..).collect();
    for ev in queued {
        registry().events.remove(&(ev as usize));
        // SAFETY: queued events are ours and unacknowledged.
        let ev = unsafe { Box::from_raw(ev) };
        // A request nobody took: its id (which only the event named) is refused and
        // destroyed, as the kernel's CM refuses a request whose listener went.
        if ev.raw.event == ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            // SAFETY: the request's own id, handed to nobody: destroyed once, here.
            unsafe { destroy_id(ev.raw.id) };
        }
    }
    // SAFETY: the channel's own descriptor.
    unsafe { libc::close(ch.raw.fd) };
}

fn new_id(channel: *mut Channel, context: *mut c_void, ps: ffi::rdma_port_space) -> *mut Id {
    let mut raw: ffi::rdma_cm_id = zeroed();
    raw.channel = channel.cast();
    raw.context = context;
    raw.ps = ps;
    raw.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
    let id = Box::into_raw(Box::new(Id {
        raw,
        shared: Arc::new(Shared {
            state: Mutex::new(IdState {
                id: std::ptr::null_mut(),
                channel,
                dead: false,
                listener: None,
                stream: None,
                local: None,
                remote: None,
                psn: new_psn(),
                peer: None,
                mine: None,
                established: false,
                answered: false,
                disconnected: false,
                local_disconnect: false,
                timewait: false,
            }),
        }),
    }));
    // SAFETY: just made, not shared yet.
    let made = unsafe { &*id };
    lock(&made.shared.state).id = id.cast();
    registry().ids.insert(id as usize);
    id
}

/// # Safety
/// `id` is a live soft id.
unsafe fn soft<'a>(id: *mut ffi::rdma_cm_id) -> &'a Id {
    // SAFETY: the caller's contract; the raw id is the first field of its `Id`.
    unsafe { &*id.cast::<Id>() }
}

/// # Safety
/// `ch` is a soft channel; `out` is writable.
pub(crate) unsafe fn create_id(
    ch: *mut ffi::rdma_event_channel,
    out: *mut *mut ffi::rdma_cm_id,
    context: *mut c_void,
    ps: ffi::rdma_port_space,
) -> c_int {
    if ps != ffi::rdma_port_space::RDMA_PS_TCP {
        set_errno(libc::EOPNOTSUPP);
        return -1;
    }
    let id = new_id(ch.cast(), context, ps);
    // SAFETY: the caller's contract.
    unsafe { *out = id.cast() };
    0
}

/// # Safety
/// `id` is a live soft id whose events were all acknowledged; it is not used again.
pub(crate) unsafe fn destroy_id(id: *mut ffi::rdma_cm_id) -> c_int {
    registry().ids.remove(&(id as usize));
    // SAFETY: made by `new_id`, freed once (the caller's contract).
    let id = unsafe { Box::from_raw(id.cast::<Id>()) };
    let mut st = lock(&id.shared.state);
    st.dead = true;
    if let Some(mut s) = st.stream.take() {
        // A request destroyed unanswered is refused, as the kernel's CM does.
        if st.peer.is_some() && !st.established && !st.disconnected {
            let _ = write_frame(&mut s, REJ, &[]);
        }
        let _ = s.shutdown(Shutdown::Both);
    }
    if let Some(l) = st.listener.take() {
        // Wakes the accepting thread (accept fails on a shut-down listener).
        // SAFETY: the listener's own descriptor, still open.
        unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
    }
    0
}

/// # Safety
/// `id` is a live soft id; `ch` a soft channel.
pub(crate) unsafe fn migrate_id(
    id: *mut ffi::rdma_cm_id,
    ch: *mut ffi::rdma_event_channel,
) -> c_int {
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    let mut st = lock(&s.shared.state);
    let (from, to) = (st.channel, ch.cast::<Channel>());
    st.channel = to;
    // SAFETY: the caller's contract; the field is the id's own.
    unsafe { (*id).channel = ch };
    // The id's events not taken yet go with it, as the kernel's migrate moves them: a
    // request whose requester left before it was taken carries its CONNECT_ERROR, and
    // left behind on the listener's channel it was skipped there while the accept waited
    // out its timeout.
    let reg = registry();
    let live = |c: *mut Channel| reg.channels.contains(&(c as usize));
    if from != to && live(from) && live(to) {
        // SAFETY: both channels are live (registered; their destruction waits for the
        // registry's lock, held here).
        let (from, to) = unsafe { (&*from, &*to) };
        let mut moved = Vec::new();
        lock(&from.queue).retain(|&ev| {
            // SAFETY: queued events are live until taken.
            let mine = unsafe { (*ev).raw.id } == id;
            if mine {
                moved.push(ev);
            }
            !mine
        });
        for ev in moved {
            // Its count on the old channel goes too (a reader that took it first finds the
            // queue shorter and says EAGAIN, as for any event taken by another reader).
            verbs::take_signal(from.raw.fd);
            lock(&to.queue).push_back(ev);
            verbs::signal(to.raw.fd);
        }
    }
    drop(st);
    0
}

/// Reads a C socket address.
///
/// # Safety
/// `sa` is null or a valid sockaddr of the family it names.
unsafe fn std_addr(sa: *const ffi::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller's contract.
    unsafe { crate::cm::sockaddr_to_std(sa) }
}

/// Writes `a` into the id's source (`src`) or destination address.
///
/// # Safety
/// `id` is a live soft id.
unsafe fn set_addr(id: *mut ffi::rdma_cm_id, src: bool, a: SocketAddr) {
    let mut storage: libc::sockaddr_storage = zeroed();
    crate::cm::write_sockaddr(a, &mut storage);
    // SAFETY: the caller's contract; both union members are a sockaddr_storage, written as
    // plain bytes.
    unsafe {
        let addr = &mut (*id).route.addr;
        let dst: *mut u8 = if src {
            std::ptr::addr_of_mut!(addr.__bindgen_anon_1).cast()
        } else {
            std::ptr::addr_of_mut!(addr.__bindgen_anon_2).cast()
        };
        let n = std::mem::size_of::<libc::sockaddr_storage>()
            .min(std::mem::size_of_val(&addr.__bindgen_anon_1));
        std::ptr::copy_nonoverlapping((&storage as *const libc::sockaddr_storage).cast(), dst, n);
    }
}

/// Binds the id to the device: `verbs` and port 1.
///
/// # Safety
/// `id` is a live soft id.
unsafe fn attach(id: *mut ffi::rdma_cm_id) {
    let ctx = context();
    // SAFETY: the caller's contract.
    unsafe {
        (*id).verbs = ctx;
        (*id).port_num = 1;
    }
}

/// Whether `ip` is an address of the soft device: the unspecified address, its own, or on a
/// device on loopback (without `RSRDMA_SOFT_ADDR`) any loopback address.
fn device_has(ip: IpAddr) -> bool {
    let own = *verbs::own_addr().ip();
    ip.is_unspecified() || ip == IpAddr::V4(own) || own.is_loopback() && ip.is_loopback()
}

/// Whether a requester at `ip` can reach this device's queue pairs: always, but for a device
/// on loopback, which only this host reaches (a requester at one of its addresses).
pub(super) fn reaches(ip: IpAddr) -> bool {
    let own = *verbs::own_addr().ip();
    !own.is_loopback() || ip.is_loopback() || UdpSocket::bind((ip, 0)).is_ok()
}

/// # Safety
/// `id` is a live soft id; `addr` a valid sockaddr.
pub(crate) unsafe fn bind_addr(id: *mut ffi::rdma_cm_id, addr: *mut ffi::sockaddr) -> c_int {
    // SAFETY: the caller's contract.
    let Some(a) = (unsafe { std_addr(addr) }) else {
        set_errno(libc::EAFNOSUPPORT);
        return -1;
    };
    if context().is_null() {
        // The device did not open (its log says why: another process holds the port
        // `RSRDMA_SOFT_ADDR` names, say): no address is its, and nothing could be accepted
        // here (an outside tester's listener bound, and its accept never returned).
        set_errno(libc::EADDRNOTAVAIL);
        return -1;
    }
    if !device_has(a.ip()) {
        // As the kernel's: an address no RDMA device has. (A listener on the host's address
        // with soft0 on loopback was accepted, and its queue pairs told a peer on another
        // host to send to that host's own loopback.)
        set_errno(libc::EADDRNOTAVAIL);
        return -1;
    }
    let l = match TcpListener::bind(a) {
        Ok(l) => l,
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EINVAL));
            return -1;
        }
    };
    let local = l.local_addr().unwrap_or(a);
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    {
        let mut st = lock(&s.shared.state);
        st.listener = Some(l);
        st.local = Some(local);
    }
    // SAFETY: as above.
    unsafe {
        set_addr(id, true, local);
        attach(id);
    }
    0
}

/// # Safety
/// `id` is a live, bound soft id.
pub(crate) unsafe fn listen(id: *mut ffi::rdma_cm_id, _backlog: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    let l = match lock(&s.shared.state)
        .listener
        .as_ref()
        .map(TcpListener::try_clone)
    {
        Some(Ok(l)) => l,
        Some(Err(e)) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EINVAL));
            return -1;
        }
        None => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    if let Err(e) = l.set_nonblocking(true) {
        set_errno(e.raw_os_error().unwrap_or(libc::EINVAL));
        return -1;
    }
    watch(Conn::Listener {
        l,
        id: s.shared.clone(),
    });
    0
}

/// # Safety
/// `id` is a live soft id; `src` null or a valid sockaddr; `dst` a valid sockaddr.
pub(crate) unsafe fn resolve_addr(
    id: *mut ffi::rdma_cm_id,
    src: *mut ffi::sockaddr,
    dst: *mut ffi::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    use ffi::rdma_cm_event_type as E;
    // SAFETY: the caller's contract.
    let (src, dst) = unsafe { (std_addr(src), std_addr(dst)) };
    let Some(dst) = dst else {
        set_errno(libc::EAFNOSUPPORT);
        return -1;
    };
    if dst.ip().is_unspecified() {
        set_errno(libc::ENETUNREACH);
        return -1;
    }
    // The local address is the one the route to `dst` leaves from (a UDP socket connected
    // to it says, sending nothing): `dst` itself on this host.
    let routed = UdpSocket::bind((if dst.is_ipv4() { "0.0.0.0" } else { "::" }, 0))
        .and_then(|u| u.connect(dst).and_then(|()| u.local_addr()));
    let local = match (src, routed) {
        (Some(s), _) => s,
        (None, Ok(r)) => SocketAddr::new(r.ip(), 0),
        (None, Err(_)) => {
            set_errno(libc::ENETUNREACH);
            return -1;
        }
    };
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    let mut st = lock(&s.shared.state);
    st.remote = Some(dst);
    st.local.get_or_insert(local);
    // SAFETY: as above.
    unsafe {
        set_addr(id, false, dst);
        set_addr(id, true, local);
        attach(id);
    }
    push(
        &st,
        E::RDMA_CM_EVENT_ADDR_RESOLVED,
        0,
        Vec::new(),
        Action::None,
    );
    0
}

/// # Safety
/// `id` is a live soft id.
pub(crate) unsafe fn resolve_route(id: *mut ffi::rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    let st = lock(&s.shared.state);
    if st.remote.is_none() {
        set_errno(libc::EINVAL);
        return -1;
    }
    push(
        &st,
        ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
        0,
        Vec::new(),
        Action::None,
    );
    0
}

/// `rdma_create_qp`: an RC QP on the id's device, moved to INIT, stored in the id.
///
/// # Safety
/// `id` is a live soft id with a device; `pd` a live soft PD; `attr` valid.
pub(crate) unsafe fn create_qp(
    id: *mut ffi::rdma_cm_id,
    pd: *mut ffi::ibv_pd,
    attr: *mut ffi::ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    if pd.is_null() || unsafe { (*id).verbs.is_null() || !(*id).qp.is_null() } {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: as above.
    let qp = unsafe { verbs::create_qp(pd, attr) };
    if qp.is_null() {
        return -1;
    }
    let mut a: ffi::ibv_qp_attr = zeroed();
    a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = 0;
    a.qp_access_flags = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    use ffi::ibv_qp_attr_mask as M;
    let mask =
        M::IBV_QP_STATE.0 | M::IBV_QP_PORT.0 | M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_ACCESS_FLAGS.0;
    // SAFETY: a QP just made; a valid attribute struct.
    let rc = unsafe { verbs::modify_qp(qp, &mut a, mask as c_int) };
    if rc != 0 {
        // SAFETY: as above, never handed out.
        unsafe { verbs::destroy_qp(qp) };
        set_errno(rc);
        return -1;
    }
    // SAFETY: the caller's contract.
    unsafe { (*id).qp = qp };
    0
}

/// # Safety
/// `id` is a live soft id whose QP nothing uses any more.
pub(crate) unsafe fn destroy_qp(id: *mut ffi::rdma_cm_id) {
    // SAFETY: the caller's contract.
    unsafe {
        let qp = std::mem::replace(&mut (*id).qp, std::ptr::null_mut());
        if !qp.is_null() {
            verbs::destroy_qp(qp);
        }
    }
}

/// The attributes that bring a connected QP to RTR towards `peer` (`mine`: this side's part
/// of the exchange), and their mask, as the kernel's CM gives them.
fn rtr_attr(mine: &Endpoint, peer: &Endpoint) -> (ffi::ibv_qp_attr, c_int) {
    use ffi::ibv_access_flags as A;
    use ffi::ibv_qp_attr_mask as M;
    let mut a: ffi::ibv_qp_attr = zeroed();
    a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
    a.path_mtu = ffi::ibv_mtu::IBV_MTU_4096;
    a.dest_qp_num = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = mine.responder_resources;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = peer.lid;
    a.ah_attr.port_num = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid.raw = peer.gid;
    a.ah_attr.grh.sgid_index = 1;
    a.ah_attr.grh.hop_limit = 1;
    // Reads and atomics only where this side serves them (as the kernel's CM sets).
    a.qp_access_flags = A::IBV_ACCESS_REMOTE_WRITE.0
        | if mine.responder_resources > 0 {
            A::IBV_ACCESS_REMOTE_READ.0 | A::IBV_ACCESS_REMOTE_ATOMIC.0
        } else {
            0
        };
    let mask = M::IBV_QP_STATE.0
        | M::IBV_QP_AV.0
        | M::IBV_QP_PATH_MTU.0
        | M::IBV_QP_DEST_QPN.0
        | M::IBV_QP_RQ_PSN.0
        | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
        | M::IBV_QP_MIN_RNR_TIMER.0
        | M::IBV_QP_ACCESS_FLAGS.0;
    (a, mask as c_int)
}

/// The attributes that bring a connected QP from RTR to RTS, and their mask.
fn rts_attr(mine: &Endpoint, peer: &Endpoint) -> (ffi::ibv_qp_attr, c_int) {
    use ffi::ibv_qp_attr_mask as M;
    let mut a: ffi::ibv_qp_attr = zeroed();
    a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
    a.sq_psn = mine.psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    // Each side's RNR retry count is the one its peer asked for (as in IB CM's REQ/REP).
    a.rnr_retry = peer.rnr_retry;
    a.max_rd_atomic = mine.initiator_depth;
    let mask = M::IBV_QP_STATE.0
        | M::IBV_QP_SQ_PSN.0
        | M::IBV_QP_TIMEOUT.0
        | M::IBV_QP_RETRY_CNT.0
        | M::IBV_QP_RNR_RETRY.0
        | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
    (a, mask as c_int)
}

/// Moves `qp` to RTR and RTS towards `peer`; `mine` is this side's part of the exchange.
///
/// # Safety
/// `qp` is a live soft QP in INIT.
unsafe fn connect_qp(qp: *mut ffi::ibv_qp, mine: &Endpoint, peer: &Endpoint) -> c_int {
    for (mut a, mask) in [rtr_attr(mine, peer), rts_attr(mine, peer)] {
        // SAFETY: the caller's contract.
        let rc = unsafe { verbs::modify_qp(qp, &mut a, mask) };
        if rc != 0 {
            return rc;
        }
    }
    0
}

/// `rdma_init_qp_attr` for an id from a connect request (the passive side, before or after
/// its accept): the attributes for `attr.qp_state` (INIT, RTR or RTS) as the kernel's CM
/// gives them, with no read depths (the caller sets those of its `rdma_conn_param`, as
/// librdmacm does). An application that brings its QP up itself (to grant other access
/// flags than the CM's) uses them, then accepts with the QP's number in its parameters.
///
/// # Safety
/// `id` is a live soft id; `attr` and `mask` are writable.
pub(crate) unsafe fn init_qp_attr(
    id: *mut ffi::rdma_cm_id,
    attr: *mut ffi::ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    use ffi::ibv_qp_attr_mask as M;
    use ffi::ibv_qp_state as S;
    // SAFETY: the caller's contract.
    let (s, want) = unsafe { (soft(id), (*attr).qp_state) };
    let st = lock(&s.shared.state);
    let Some(peer) = st.peer.clone() else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // The active side's part is its REQ (with the depths it asked for, as the kernel's CM
    // gives them after the REP); the passive side's, no depths.
    let mine = st.mine.clone().unwrap_or_else(|| Endpoint {
        qpn: 0,
        lid: own_lid(),
        gid: own_gid(),
        psn: st.psn,
        responder_resources: 0,
        initiator_depth: 0,
        rnr_retry: 0,
        private: Vec::new(),
    });
    drop(st);
    let (a, m) = match want {
        S::IBV_QPS_INIT => {
            let mut a: ffi::ibv_qp_attr = zeroed();
            a.qp_state = S::IBV_QPS_INIT;
            a.port_num = 1;
            a.qp_access_flags = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
            let m = M::IBV_QP_STATE.0
                | M::IBV_QP_PORT.0
                | M::IBV_QP_PKEY_INDEX.0
                | M::IBV_QP_ACCESS_FLAGS.0;
            (a, m as c_int)
        }
        S::IBV_QPS_RTR => rtr_attr(&mine, &peer),
        S::IBV_QPS_RTS => rts_attr(&mine, &peer),
        _ => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    // SAFETY: the caller's contract.
    unsafe {
        *attr = a;
        *mask = m;
    }
    0
}

/// This side's part of the exchange, from the id's QP and the caller's parameters.
///
/// # Safety
/// `id` is a live soft id; `param` is null or valid, with its private data readable.
unsafe fn endpoint(
    id: *mut ffi::rdma_cm_id,
    psn: u32,
    param: *const ffi::rdma_conn_param,
) -> Endpoint {
    // SAFETY: the caller's contract.
    let (qpn, p) = unsafe {
        let qp = (*id).qp;
        let p: ffi::rdma_conn_param = if param.is_null() { zeroed() } else { *param };
        // Without a QP on the id, its parameters name one (as librdmacm's accept takes it).
        (if qp.is_null() { p.qp_num } else { (*qp).qp_num }, p)
    };
    let private = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: `private_data_len` readable bytes (the caller's contract).
        unsafe {
            std::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len))
        }
        .to_vec()
    };
    Endpoint {
        qpn,
        lid: own_lid(),
        gid: own_gid(),
        psn,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        rnr_retry: p.rnr_retry_count.min(7),
        private,
    }
}

/// `rdma_connect`. As the kernel's CM, it only starts the connection: the TCP connect and
/// the REQ go on in a thread of their own, so the caller's wait for the answer is bounded by
/// its own timeout, not by the connect's. An id connects once (`EINVAL` after that, as the
/// kernel answers an id that is not in its route-resolved state).
///
/// # Safety
/// `id` is a live soft id with a resolved route; `param` valid (naming the QP when the id
/// has none).
pub(crate) unsafe fn connect(id: *mut ffi::rdma_cm_id, param: *mut ffi::rdma_conn_param) -> c_int {
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    let mut st = lock(&s.shared.state);
    let connected_before = st.mine.is_some() || st.stream.is_some() || st.listener.is_some();
    // Without a QP on the id, the parameters name one (the caller brings it up when the
    // response comes, then calls `establish`).
    // SAFETY: as above.
    let no_qp = unsafe { (*id).qp.is_null() } && param.is_null();
    let Some(remote) = st.remote.filter(|_| !connected_before && !no_qp) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: as above.
    let mine = unsafe { endpoint(id, st.psn, param) };
    let req = mine.encode();
    st.mine = Some(mine);
    drop(st);
    let shared = s.shared.clone();
    let started = std::thread::Builder::new()
        .name("rsrdma-soft-cm-connect".into())
        .spawn(move || send_request(&shared, remote, &req));
    if started.is_err() {
        lock(&s.shared.state).mine = None;
        set_errno(libc::EAGAIN);
        return -1;
    }
    0
}

/// The background half of [`connect`]: the TCP connection to the listener's CM and the REQ;
/// its failure is the connect's event (rxe's answers: nobody listening is a reject by the
/// remote CM, status 8; anything else, unreachable).
fn send_request(shared: &Arc<Shared>, remote: SocketAddr, req: &[u8]) {
    use ffi::rdma_cm_event_type as E;
    let stream = TcpStream::connect_timeout(&remote, CONNECT_TIMEOUT).and_then(|mut t| {
        t.set_nodelay(true)?;
        write_frame(&mut t, REQ, req)?;
        Ok(t)
    });
    let mut st = lock(&shared.state);
    if st.dead {
        if let Ok(t) = stream {
            let _ = t.shutdown(Shutdown::Both);
        }
        return;
    }
    let t = match stream.and_then(|t| t.try_clone().map(|reader| (t, reader))) {
        Ok(t) => t,
        Err(e) => {
            let (kind, status, action) = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => (
                    E::RDMA_CM_EVENT_REJECTED,
                    REJ_INVALID_SERVICE_ID,
                    Action::Disconnected,
                ),
                _ => (
                    E::RDMA_CM_EVENT_UNREACHABLE,
                    -e.raw_os_error().unwrap_or(libc::ETIMEDOUT),
                    Action::None,
                ),
            };
            push(&st, kind, status, Vec::new(), action);
            return;
        }
    };
    let (t, reader) = t;
    // Written into the id when its answer is handed over (`get_cm_event`), on the thread
    // that reads its events, not from here while the caller may be reading the id.
    st.local = t.local_addr().ok();
    st.stream = Some(t);
    drop(st);
    watch(Conn::Open {
        s: reader,
        buf: Vec::new(),
        id: shared.clone(),
        active: true,
        answer_by: Some(std::time::Instant::now() + connections::ANSWER_WAIT),
    });
}

/// # Safety
/// `id` is a live soft id from a connect request; `param` null or valid. Without a QP on
/// the id, `param` names the QP, which the caller brought to RTS itself
/// ([`init_qp_attr`]), as librdmacm's accept then does nothing to a QP either.
pub(crate) unsafe fn accept(id: *mut ffi::rdma_cm_id, param: *mut ffi::rdma_conn_param) -> c_int {
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    let mut st = lock(&s.shared.state);
    // SAFETY: as above.
    let qp = unsafe { (*id).qp };
    let Some(peer) = st.peer.clone() else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if (qp.is_null() && param.is_null()) || st.stream.is_none() || st.answered {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: as above.
    let mine = unsafe { endpoint(id, st.psn, param) };
    if !qp.is_null() {
        // SAFETY: the id's QP, in INIT since rdma_create_qp.
        let rc = unsafe { connect_qp(qp, &mine, &peer) };
        if rc != 0 {
            set_errno(rc);
            return -1;
        }
    }
    let sent = st
        .stream
        .as_mut()
        .map(|t| write_frame(t, REP, &mine.encode()));
    if let Some(Err(e)) = sent {
        set_errno(e.raw_os_error().unwrap_or(libc::ECONNRESET));
        return -1;
    }
    st.answered = true;
    0
}

/// `rdma_establish`: the active side, which connected with no QP on the id and brought the
/// QP up itself on CONNECT_RESPONSE, completes the connection (the RTU).
///
/// # Safety
/// `id` is a live soft id.
pub(crate) unsafe fn establish(id: *mut ffi::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let (s, qp) = unsafe { (soft(id), (*id).qp) };
    let mut st = lock(&s.shared.state);
    if !qp.is_null() || st.mine.is_none() || st.peer.is_none() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let sent = st.stream.as_mut().map(|t| write_frame(t, RTU, &[]));
    match sent {
        Some(Ok(())) => 0,
        Some(Err(e)) => {
            set_errno(e.raw_os_error().unwrap_or(libc::ECONNRESET));
            -1
        }
        None => {
            set_errno(libc::ENOTCONN);
            -1
        }
    }
}

/// # Safety
/// `id` is a live soft id from a connect request; `data` has `len` readable bytes.
pub(crate) unsafe fn reject(id: *mut ffi::rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // As the kernel's CM: more than a REJ carries is refused, not cut.
    if usize::from(len) > wire::REJ_PRIVATE {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    let body = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
    };
    let mut st = lock(&s.shared.state);
    // As the kernel's CM: only a request not yet answered (or, on the active side, a
    // response not yet completed) can be rejected; on any other id it is EINVAL, and the
    // connection is left as it is.
    if st.peer.is_none() || st.answered || st.established || st.stream.is_none() {
        set_errno(libc::EINVAL);
        return -1;
    }
    st.answered = true;
    st.disconnected = true;
    if let Some(t) = st.stream.as_mut() {
        let _ = write_frame(t, REJ, &body);
    }
    0
}

/// # Safety
/// `id` is a live soft id; its QP (if any) is not being destroyed.
pub(crate) unsafe fn disconnect(id: *mut ffi::rdma_cm_id) -> c_int {
    // SAFETY: the caller's contract.
    let s = unsafe { soft(id) };
    // As the kernel's CM: an id that never connected (nor had a request) has nothing to
    // disconnect.
    if lock(&s.shared.state).stream.is_none() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: as above.
    unsafe { error_qp((*id).qp) };
    let mut st = lock(&s.shared.state);
    if let Some(t) = st.stream.as_mut() {
        let _ = write_frame(t, DREQ, &[]);
    }
    st.local_disconnect = true;
    if st.established && !st.disconnected {
        st.disconnected = true;
        push(
            &st,
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED,
            0,
            Vec::new(),
            Action::None,
        );
    }
    st.time_wait_exit();
    0
}

/// Moves `qp` (if any) to ERROR: its requests flush.
///
/// # Safety
/// `qp` is null or a live soft QP.
unsafe fn error_qp(qp: *mut ffi::ibv_qp) {
    if qp.is_null() {
        return;
    }
    let mut a: ffi::ibv_qp_attr = zeroed();
    a.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
    // SAFETY: the caller's contract.
    unsafe { verbs::modify_qp(qp, &mut a, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int) };
}

/// # Safety
/// `ch` is a soft channel; `out` is writable.
pub(crate) unsafe fn get_cm_event(
    ch: *mut ffi::rdma_event_channel,
    out: *mut *mut ffi::rdma_cm_event,
) -> c_int {
    // SAFETY: the caller's contract.
    let chan = unsafe { &*ch.cast::<Channel>() };
    let fd = chan.raw.fd;
    loop {
        if verbs::take_signal(fd) {
            break;
        }
        // SAFETY: the channel's own descriptor.
        let nonblocking = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        if nonblocking {
            set_errno(libc::EAGAIN);
            return -1;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, -1) };
    }
    let Some(ev) = lock(&chan.queue).pop_front() else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    // SAFETY: queued events are ours and unacknowledged; their ids are alive (an id's events
    // are taken before it is destroyed).
    unsafe {
        let e = &mut *ev;
        let action = std::mem::replace(&mut e.action, Action::None);
        let id = e.raw.id;
        if matches!(action, Action::Established(_)) {
            // The connect's answer: the id's local address is the connection's now.
            if let Some(a) = lock(&soft(id).shared.state).local {
                set_addr(id, true, a);
            }
        }
        match action {
            Action::None => {}
            // With no QP on the id, the response is handed over as it came (librdmacm's
            // CONNECT_RESPONSE): the caller brings its QP up and calls `establish`.
            Action::Established(peer) if (*id).qp.is_null() => {
                e.raw.event = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE;
                lock(&soft(id).shared.state).peer = Some(peer);
            }
            Action::Established(peer) => {
                let s = soft(id);
                let mine = lock(&s.shared.state).mine.clone();
                let qp = (*id).qp;
                let rc = match mine {
                    Some(mine) if !qp.is_null() => connect_qp(qp, &mine, &peer),
                    _ => libc::EINVAL,
                };
                let mut st = lock(&s.shared.state);
                if rc == 0 {
                    if let Some(t) = st.stream.as_mut() {
                        let _ = write_frame(t, RTU, &[]);
                    }
                } else {
                    e.raw.event = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_ERROR;
                    e.raw.status = -rc;
                    st.established = false;
                }
            }
            Action::Disconnected => error_qp((*id).qp),
        }
        *out = ev.cast();
    }
    0
}

/// # Safety
/// `ev` is an event `get_cm_event` returned, acknowledged once.
pub(crate) unsafe fn ack_cm_event(ev: *mut ffi::rdma_cm_event) -> c_int {
    registry().events.remove(&(ev as usize));
    // SAFETY: the caller's contract; the raw event is the first field of its `Event`.
    drop(unsafe { Box::from_raw(ev.cast::<Event>()) });
    0
}

/// `rdma_get_local_addr` (`peer`: `rdma_get_peer_addr`).
///
/// # Safety
/// `id` is a live soft id.
pub(crate) unsafe fn addr(id: *mut ffi::rdma_cm_id, peer: bool) -> *mut ffi::sockaddr {
    // SAFETY: the caller's contract; the union members start with a sockaddr.
    unsafe {
        let a = &mut (*id).route.addr;
        if peer {
            std::ptr::addr_of_mut!(a.__bindgen_anon_2).cast()
        } else {
            std::ptr::addr_of_mut!(a.__bindgen_anon_1).cast()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device on loopback (these tests' soft0: no `RSRDMA_SOFT_ADDR`) has every loopback
    /// address and serves this host only; the unspecified address is every device's.
    #[test]
    fn a_device_on_loopback_has_loopback_addresses_and_serves_this_host_only() {
        assert!(verbs::own_addr().ip().is_loopback());
        for ip in ["127.0.0.1", "127.0.0.2", "0.0.0.0", "::"] {
            assert!(device_has(ip.parse().unwrap()), "{ip}");
        }
        // TEST-NET-1: no address of this host.
        let elsewhere: IpAddr = "192.0.2.1".parse().unwrap();
        assert!(!device_has(elsewhere));
        assert!(reaches("127.0.0.1".parse().unwrap()));
        assert!(!reaches(elsewhere), "a requester on another host");
    }
}
