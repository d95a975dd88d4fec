//! The soft CM's one thread: it reads every connection of the process (a thread per
//! connection would cost a program with many connections a thread each, which rdma_cm does
//! not), takes new connections off listening ids, waits for their REQ, and turns what the
//! peer's CM sends into the ids' events.

use super::wire::{
    not_a_frame, padded, take_frame, write_frame, Endpoint, DREQ, HEARD, REJ, REJ_CONSUMER,
    REJ_INVALID_SERVICE_ID, REJ_PRIVATE, REP, REP_PRIVATE, REQ, REQ_PRIVATE, RTU, UNREACHABLE,
};
use super::{attach, lock, new_id, push, queue, set_addr, zeroed, Action, Channel, Shared};
use crate::ffi;
use crate::soft::verbs;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a new connection has to send its REQ.
const REQ_WAIT: Duration = Duration::from_secs(3);

/// How long a REQ's sender waits for the listener's CM to say it has the request
/// ([`HEARD`]): what takes a connection and says nothing for this long is no soft CM. The
/// listener's CM thread answers as it reads the REQ, so a second is ample even between
/// hosts, and short of a dial's usual timeouts (3 s here made a dial with a 3 s
/// `connect_timeout` read a bare timeout instead of the reason: an outside tester's find).
pub(super) const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// A socket the soft CM's thread reads.
pub(super) enum Conn {
    /// A listening id's socket: new connections become `Pending`.
    Listener { l: TcpListener, id: Arc<Shared> },
    /// A connection whose REQ has not come yet (dropped at `deadline`).
    Pending {
        s: TcpStream,
        buf: Vec<u8>,
        deadline: Instant,
        from: SocketAddr,
        listener: Arc<Shared>,
    },
    /// A connection of an id (`active`: the side that sent the REQ, which waits until
    /// `answer_by` for the first word of the listener's CM).
    Open {
        s: TcpStream,
        buf: Vec<u8>,
        id: Arc<Shared>,
        active: bool,
        answer_by: Option<Instant>,
    },
}

impl Conn {
    fn fd(&self) -> c_int {
        match self {
            Conn::Listener { l, .. } => l.as_raw_fd(),
            Conn::Pending { s, .. } | Conn::Open { s, .. } => s.as_raw_fd(),
        }
    }

    fn deadline(&self) -> Option<Instant> {
        match self {
            Conn::Pending { deadline, .. } => Some(*deadline),
            Conn::Open { answer_by, .. } => *answer_by,
            Conn::Listener { .. } => None,
        }
    }
}

/// The one thread that reads every soft CM connection of the process (a thread per
/// connection would cost a program with many connections a thread each, which rdma_cm does
/// not), and the sockets it watches.
struct Poller {
    conns: Mutex<Vec<Conn>>,
    /// Wakes the thread when a socket is added.
    wake: c_int,
}

fn poller() -> &'static Poller {
    static P: OnceLock<Poller> = OnceLock::new();
    P.get_or_init(|| {
        // SAFETY: eventfd with constant flags.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        let _ = std::thread::Builder::new()
            .name("rsrdma-soft-cm".into())
            .spawn(run_poller);
        Poller {
            conns: Mutex::new(Vec::new()),
            wake,
        }
    })
}

/// Hands a socket to the CM's thread.
pub(super) fn watch(c: Conn) {
    let p = poller();
    lock(&p.conns).push(c);
    verbs::signal(p.wake);
}

fn run_poller() {
    let p = poller();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let (n, timeout_ms) = {
            let conns = lock(&p.conns);
            fds.clear();
            fds.push(libc::pollfd {
                fd: p.wake,
                events: libc::POLLIN,
                revents: 0,
            });
            fds.extend(conns.iter().map(|c| libc::pollfd {
                fd: c.fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let now = Instant::now();
            let next = conns.iter().filter_map(Conn::deadline).min();
            let ms = next.map_or(-1, |d| {
                d.saturating_duration_since(now).as_millis().min(60_000) as c_int + 1
            });
            (conns.len(), ms)
        };
        // SAFETY: `fds` is a valid array of its length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if fds[0].revents != 0 {
            let mut v = 0u64;
            // SAFETY: an 8-byte read into a valid u64 from our eventfd (non-blocking).
            unsafe { libc::read(p.wake, (&mut v as *mut u64).cast(), 8) };
        }
        let now = Instant::now();
        let mut conns = lock(&p.conns);
        let old = std::mem::take(&mut *conns);
        let mut added = Vec::new();
        for (i, c) in old.into_iter().enumerate() {
            // Sockets added after the poll began wait for the next round.
            let c = if i < n {
                step(c, fds[i + 1].revents != 0, now, &mut added)
            } else {
                Some(c)
            };
            conns.extend(c);
        }
        conns.extend(added);
    }
}

/// Reads what a readable socket has (once: after POLLIN a read does not block). Ok(false)
/// at the end of the stream.
fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut chunk = [0u8; 4096];
    match s.read(&mut chunk) {
        Ok(0) => Ok(false),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(true)
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) =>
        {
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// Serves one socket after a poll; `None` drops it.
fn step(c: Conn, ready: bool, now: Instant, added: &mut Vec<Conn>) -> Option<Conn> {
    match c {
        Conn::Listener { l, id } => {
            if !ready {
                return Some(Conn::Listener { l, id });
            }
            loop {
                match l.accept() {
                    Ok((s, from)) => {
                        let _ = s.set_nodelay(true);
                        added.push(Conn::Pending {
                            s,
                            buf: Vec::new(),
                            deadline: now + REQ_WAIT,
                            from,
                            listener: id.clone(),
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        return Some(Conn::Listener { l, id });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // Out of descriptors or memory: a condition that passes. The request waits
                    // in the backlog (the listener was closed, resetting every later one);
                    // a short pause keeps the still-readable socket from spinning this thread.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                        ) =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        return Some(Conn::Listener { l, id });
                    }
                    // Shut down: the listening id is gone.
                    Err(_) => return None,
                }
            }
        }
        Conn::Pending {
            mut s,
            mut buf,
            deadline,
            from,
            listener,
        } => {
            if ready && !matches!(fill(&mut s, &mut buf), Ok(true)) {
                return None;
            }
            // Not a CM's request (a TCP-path dialer's hello, say): dropped at once, so that
            // its dialer hears the end now rather than after REQ_WAIT.
            if buf.first().is_some_and(|&tag| tag != REQ) || not_a_frame(&buf) {
                tracing::debug!(%from, "soft0 rdma_cm: a connection that is no CM's request, closed");
                return None;
            }
            match take_frame(&mut buf) {
                Some((REQ, body)) => {
                    let req = Endpoint::decode(&body)?;
                    let id = open_request(&s, from, &listener, req)?;
                    Some(Conn::Open {
                        s,
                        buf,
                        id,
                        active: false,
                        answer_by: None,
                    })
                }
                // Not a soft CM, or too slow: dropped.
                Some(_) => None,
                None if now >= deadline => None,
                None => Some(Conn::Pending {
                    s,
                    buf,
                    deadline,
                    from,
                    listener,
                }),
            }
        }
        Conn::Open {
            mut s,
            mut buf,
            id,
            active,
            mut answer_by,
        } => {
            if ready {
                let alive = fill(&mut s, &mut buf);
                loop {
                    // Another protocol's bytes (the dialer reached some other service, which
                    // spoke first): as if the connection had ended, now, rather than at the
                    // dialer's timeout.
                    if not_a_frame(&buf) {
                        on_end(&id, active);
                        return None;
                    }
                    let Some((tag, body)) = take_frame(&mut buf) else {
                        break;
                    };
                    answer_by = None;
                    if !on_frame(&id, active, tag, &body) {
                        return None;
                    }
                }
                if !matches!(alive, Ok(true)) {
                    on_end(&id, active);
                    return None;
                }
            }
            if answer_by.is_some_and(|d| now >= d) {
                on_silence(&id);
                return None;
            }
            Some(Conn::Open {
                s,
                buf,
                id,
                active,
                answer_by,
            })
        }
    }
}

/// What took a REQ's connection said nothing for [`ANSWER_WAIT`]: no soft CM listens there
/// (a TCP-path Listener that is not accepting, another service). As rxe's CM answers a
/// request for a service nobody listens on: REJECTED, status 8.
fn on_silence(shared: &Arc<Shared>) {
    use ffi::rdma_cm_event_type as E;
    let mut st = lock(&shared.state);
    if st.disconnected || st.established {
        return;
    }
    tracing::debug!("soft0 rdma_cm: the listener's port took the connection and said nothing");
    st.disconnected = true;
    push(
        &st,
        E::RDMA_CM_EVENT_REJECTED,
        REJ_INVALID_SERVICE_ID,
        Vec::new(),
        Action::Disconnected,
    );
}

/// A REQ on a listener's connection: a new id (on the listener's channel, writing to a clone
/// of the socket) and its CONNECT_REQUEST. `None` when the listener is gone (the requester
/// is refused).
fn open_request(
    s: &TcpStream,
    from: SocketAddr,
    listener: &Arc<Shared>,
    req: Endpoint,
) -> Option<Arc<Shared>> {
    let mut writer = s.try_clone().ok()?;
    let local = s.local_addr().ok();
    if !super::reaches(from.ip()) {
        tracing::warn!(
            %from,
            "soft0 rdma_cm: a request from another host, refused: this soft0 is on loopback \
             ({}), which that host cannot reach; set RSRDMA_SOFT_ADDR to this host's address",
            verbs::own_addr()
        );
        let _ = write_frame(&mut writer, UNREACHABLE, &[]);
        return None;
    }
    let lst = lock(&listener.state);
    if lst.dead {
        let _ = write_frame(&mut writer, REJ, &[]);
        return None;
    }
    // SAFETY: the listener is alive (not dead, under its lock), so its id is.
    let (context, ps) = unsafe { ((*lst.id).context, (*lst.id).ps) };
    let child = new_id(lst.channel, context, ps);
    // SAFETY: just made, not handed out yet.
    unsafe {
        attach(child.cast());
        if let Some(a) = local {
            set_addr(child.cast(), true, a);
        }
        set_addr(child.cast(), false, from);
    }
    // SAFETY: as above.
    let shared = unsafe { (*child).shared.clone() };
    let mut param: ffi::rdma_conn_param = zeroed();
    // The kernel reports a request's depths from the acceptor's side.
    param.responder_resources = req.initiator_depth;
    param.initiator_depth = req.responder_resources;
    param.rnr_retry_count = req.rnr_retry;
    let private = padded(&req.private, REQ_PRIVATE);
    // Before anything the application may write (its REP or REJ): the request is here.
    if write_frame(&mut writer, HEARD, &[]).is_err() {
        return None;
    }
    {
        let mut cst = lock(&shared.state);
        cst.stream = Some(writer);
        cst.local = local;
        cst.remote = Some(from);
        cst.peer = Some(req);
    }
    push_request(lst.channel, child.cast(), lst.id, private, param);
    Some(shared)
}

/// Queues a CONNECT_REQUEST for `child` with the requester's depths.
fn push_request(
    channel: *mut Channel,
    child: *mut ffi::rdma_cm_id,
    listen_id: *mut ffi::rdma_cm_id,
    private: Vec<u8>,
    param: ffi::rdma_conn_param,
) {
    let mut raw: ffi::rdma_cm_event = zeroed();
    raw.id = child;
    raw.listen_id = listen_id;
    raw.event = ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST;
    raw.param.conn = param;
    queue(channel, raw, private, Action::None);
}

/// A frame from the peer's CM; false ends the connection. `active`: the side that sent the
/// REQ (it waits for REP or REJ; the other side for RTU).
fn on_frame(shared: &Arc<Shared>, active: bool, tag: u8, body: &[u8]) -> bool {
    use ffi::rdma_cm_event_type as E;
    let mut st = lock(&shared.state);
    match tag {
        REP if active && !st.established => match Endpoint::decode(body) {
            Some(rep) => {
                let private = padded(&rep.private, REP_PRIVATE);
                push(
                    &st,
                    E::RDMA_CM_EVENT_ESTABLISHED,
                    0,
                    private,
                    Action::Established(rep),
                );
                st.established = true;
                true
            }
            None => {
                st.disconnected = true;
                push(
                    &st,
                    E::RDMA_CM_EVENT_CONNECT_ERROR,
                    -libc::EPROTO,
                    Vec::new(),
                    Action::None,
                );
                false
            }
        },
        REJ if !st.established => {
            st.disconnected = true;
            let private = padded(body, REJ_PRIVATE);
            push(
                &st,
                E::RDMA_CM_EVENT_REJECTED,
                REJ_CONSUMER,
                private,
                Action::Disconnected,
            );
            false
        }
        RTU if !active && !st.established => {
            st.established = true;
            push(
                &st,
                E::RDMA_CM_EVENT_ESTABLISHED,
                0,
                Vec::new(),
                Action::None,
            );
            true
        }
        DREQ => {
            drop(st);
            on_end(shared, active);
            false
        }
        UNREACHABLE if active && !st.established => {
            st.disconnected = true;
            push(
                &st,
                E::RDMA_CM_EVENT_UNREACHABLE,
                -libc::EHOSTUNREACH,
                Vec::new(),
                Action::Disconnected,
            );
            false
        }
        // Anything else is out of place: ignored.
        _ => true,
    }
}

/// The peer's CM disconnected, or its connection ended.
fn on_end(shared: &Arc<Shared>, active: bool) {
    use ffi::rdma_cm_event_type as E;
    let mut st = lock(&shared.state);
    if st.disconnected {
        return;
    }
    st.disconnected = true;
    if st.established {
        push(
            &st,
            E::RDMA_CM_EVENT_DISCONNECTED,
            0,
            Vec::new(),
            Action::Disconnected,
        );
        st.time_wait_exit();
    } else {
        // The peer went away during the exchange.
        let kind = if active {
            E::RDMA_CM_EVENT_UNREACHABLE
        } else {
            E::RDMA_CM_EVENT_CONNECT_ERROR
        };
        push(&st, kind, -libc::ECONNRESET, Vec::new(), Action::None);
    }
}
