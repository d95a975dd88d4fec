//! The registry server: an accept thread and one thread per client, up to a cap.
//!
//! A full registry makes room for a new client rather than turning it away: it first sheds
//! the oldest client that has not finished its opening (hello, and proof with a secret;
//! [`RegistryOptions::opening_timeout`] bounds it anyway) once that client had its chance to
//! ([`OPENING_GRACE`]), then the client idle longest (silent for at least
//! [`MIN_IDLE_TO_SHED`]). So silent sockets cannot lock lookups out, idle clients keep their
//! slots only while nobody else needs them, and a burst of good clients is not shed for one
//! another: while nobody can be shed yet, each newcomer waits for a place, in the order it
//! came, up to [`BUSY_GRACE`]; past it, it hears `Busy`. A newcomer that has sent its whole
//! hello (a good client does as it connects) goes before those that have not: a steady flood
//! of silent (or stalled) sockets, each admitted for its grace in turn, kept good clients
//! waiting behind hundreds of them until they heard `Busy` (outside testers' finds). A flood
//! of whole hellos from the good clients' own hosts is not told from them: the secret, and
//! the network's own limits, are the defence there.

use super::codec::{self, Message};
use super::stream::FrameStream;
use super::table::Table;
use super::ErrorCode;
use crate::error::{NetError, Result};
use crate::handshake::{auth, Role};
use rsrdma::option_setters as setters;
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the accept loop sleeps when no client is waiting.
const ACCEPT_TICK: Duration = Duration::from_millis(10);
/// An opened client silent this long may lose its slot to a new client when the registry is
/// full.
pub const MIN_IDLE_TO_SHED: Duration = Duration::from_secs(1);
/// An unopened client younger than this (or than an eighth of
/// [`RegistryOptions::opening_timeout`], when that is shorter) is not shed for a newcomer. A
/// good client opens within a round trip, but a burst of them (threads started at once on a
/// busy host) needs milliseconds to be scheduled: shedding them for one another turned half
/// of an outside tester's good lookups away (8 threads on a registry of 4 places).
pub const OPENING_GRACE: Duration = Duration::from_millis(50);
/// How long each newcomer waits for a place when the registry is full and nobody can be shed
/// yet; past it, it hears `Busy`.
pub const BUSY_GRACE: Duration = Duration::from_millis(200);
/// How often the accept loop looks again for a place while newcomers wait.
const FULL_TICK: Duration = Duration::from_millis(2);
/// Newcomers that wait for a place at most; one more hears `Busy` at once.
const MAX_WAITING: usize = 1024;

/// Options of [`Registry::serve_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RegistryOptions {
    /// Shared secret: when set, clients must prove it before any request.
    pub secret: Option<crate::Secret>,
    /// The longest lease granted, and the one given to a registration that asks for none.
    pub lease: Duration,
    /// Entries held at most; a registration of a new name beyond it is refused.
    pub max_entries: usize,
    /// Clients served at once. One more waits (in the order it came) until one leaves or can
    /// be shed (an unopened one past its [`OPENING_GRACE`], an idle one past
    /// [`MIN_IDLE_TO_SHED`]), for at most [`BUSY_GRACE`]; then it gets a `Busy` error and is
    /// closed.
    pub max_clients: usize,
    /// A client silent this long is disconnected.
    pub idle_timeout: Duration,
    /// Limit of each reply.
    pub io_timeout: Duration,
    /// Limit of a client's whole opening (its hello, and its proof with a secret). Default 2 s.
    pub opening_timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            secret: None,
            lease: Duration::from_secs(30),
            max_entries: 4096,
            max_clients: 64,
            idle_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(5),
            opening_timeout: Duration::from_secs(2),
        }
    }
}

setters!(RegistryOptions {
    /// Sets [`RegistryOptions::secret`].
    secret: Option<crate::Secret>,
    /// Sets [`RegistryOptions::lease`].
    lease: Duration,
    /// Sets [`RegistryOptions::max_entries`].
    max_entries: usize,
    /// Sets [`RegistryOptions::max_clients`].
    max_clients: usize,
    /// Sets [`RegistryOptions::idle_timeout`].
    idle_timeout: Duration,
    /// Sets [`RegistryOptions::io_timeout`].
    io_timeout: Duration,
    /// Sets [`RegistryOptions::opening_timeout`].
    opening_timeout: Duration,
});

/// The registry server; see the [module docs](super).
#[derive(Debug)]
pub struct Registry;

/// A running registry: its address, and a way to stop it. Dropping it stops it too.
#[derive(Debug)]
pub struct RegistryHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    opts: RegistryOptions,
    table: Mutex<Table>,
    stop: AtomicBool,
    clients: AtomicUsize,
    /// The clients served now, oldest first, for shedding.
    slots: Mutex<Vec<Slot>>,
    next_slot: AtomicUsize,
    /// Clients shed to make room.
    shed: AtomicUsize,
}

/// A served client, as the accept loop sees it.
#[derive(Debug)]
struct Slot {
    id: usize,
    /// A second handle on its socket: shutting it down ends the client's thread.
    socket: TcpStream,
    opened: Arc<AtomicBool>,
    last_active: Arc<Mutex<Instant>>,
    /// When it was let in: an unopened client is shed only after its [`OPENING_GRACE`].
    since: Instant,
}

/// A client thread's hold on its slot: dropped (even by a panic), it frees the slot.
struct SlotGuard {
    shared: Arc<Shared>,
    id: usize,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        lock(&self.shared.slots).retain(|s| s.id != self.id);
        self.shared.clients.fetch_sub(1, Ordering::AcqRel);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Registry {
    /// Serves a registry with default options on `addr` (port 0 picks one).
    ///
    /// # Errors
    /// As [`Registry::serve_with`].
    pub fn serve(addr: impl ToSocketAddrs) -> Result<RegistryHandle> {
        Registry::serve_with(addr, RegistryOptions::default())
    }

    /// Serves a registry on `addr` in background threads.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a zero cap or lease; [`NetError::Io`] naming `bind`.
    pub fn serve_with(addr: impl ToSocketAddrs, opts: RegistryOptions) -> Result<RegistryHandle> {
        if opts.max_entries == 0
            || opts.max_clients == 0
            || opts.lease.is_zero()
            || opts.opening_timeout.is_zero()
            || opts.idle_timeout.is_zero()
            || opts.io_timeout.is_zero()
        {
            return Err(NetError::InvalidArgument(
                "RegistryOptions: max_entries, max_clients, lease, opening_timeout, idle_timeout \
                 and io_timeout must be above 0"
                    .into(),
            ));
        }
        crate::secret::check_secret(opts.secret.as_ref(), "RegistryOptions::secret")?;
        let listener = TcpListener::bind(addr).map_err(|e| NetError::io("bind", e))?;
        let local = listener
            .local_addr()
            .map_err(|e| NetError::io("local_addr", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| NetError::io("set_nonblocking", e))?;
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::new(opts.max_entries)),
            opts,
            stop: AtomicBool::new(false),
            clients: AtomicUsize::new(0),
            slots: Mutex::new(Vec::new()),
            next_slot: AtomicUsize::new(0),
            shed: AtomicUsize::new(0),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("rs-registry".into())
            .spawn(move || accept_loop(&listener, &s))
            .map_err(|e| NetError::io("spawn", e))?;
        tracing::info!(%local, "registry serving");
        Ok(RegistryHandle {
            addr: local,
            shared,
            acceptor: Some(acceptor),
        })
    }
}

impl RegistryHandle {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Entries held now (expired ones count until they are looked up or purged).
    pub fn entries(&self) -> usize {
        lock(&self.shared.table).len()
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.shared.clients.load(Ordering::Relaxed)
    }

    /// Clients shed so far to make room for new ones (unopened or idle ones).
    pub fn shed(&self) -> usize {
        self.shared.shed.load(Ordering::Relaxed)
    }

    /// Stops accepting, disconnects every client and waits for all threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.acceptor.take() {
            if t.join().is_err() {
                tracing::error!("the registry's accept thread panicked");
            }
        }
    }
}

impl Drop for RegistryHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    // Newcomers taken from the kernel's queue while the registry was full, oldest first:
    // each waits for a place up to BUSY_GRACE.
    let mut waiting: VecDeque<Newcomer> = VecDeque::new();
    let max = shared.opts.max_clients;
    while !shared.stop.load(Ordering::Relaxed) {
        workers.retain(|w| !w.is_finished());
        loop {
            match listener.accept() {
                Ok((stream, peer)) if waiting.len() < MAX_WAITING => {
                    // Looked at without blocking while it waits (`admit` and `turn_away`
                    // make it blocking again).
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    waiting.push_back(Newcomer {
                        stream,
                        peer,
                        came: Instant::now(),
                        spoke: false,
                    });
                }
                Ok((stream, peer)) => turn_away(stream, peer, max),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "registry accept failed");
                    std::thread::sleep(ACCEPT_TICK * 10);
                    break;
                }
            }
        }
        // A place (or someone to shed) goes to the oldest newcomer that has spoken, else to
        // the oldest; while there is none, those past their grace hear Busy.
        let now = Instant::now();
        note_who_spoke(&mut waiting);
        while !waiting.is_empty() {
            if has_room(&lock(&shared.slots), shared, now) {
                let first = waiting.iter().position(|n| n.spoke).unwrap_or(0);
                if let Some(n) = waiting.remove(first) {
                    admit(n.stream, n.peer, shared, &mut workers);
                }
                continue;
            }
            while waiting
                .front()
                .is_some_and(|n| now.saturating_duration_since(n.came) >= BUSY_GRACE)
            {
                if let Some(n) = waiting.pop_front() {
                    turn_away(n.stream, n.peer, max);
                }
            }
            break;
        }
        std::thread::sleep(if waiting.is_empty() {
            ACCEPT_TICK
        } else {
            FULL_TICK
        });
    }
    for w in workers {
        if w.join().is_err() {
            tracing::error!("a registry client thread panicked");
        }
    }
}

/// A connection waiting for a place.
struct Newcomer {
    stream: TcpStream,
    peer: SocketAddr,
    came: Instant,
    /// It has sent its whole hello: a client, not a silent or stalled socket.
    spoke: bool,
}

/// A Hello frame's bytes: the length prefix, the version and kind, the magic, the nonce.
const HELLO_FRAME: usize = codec::LEN_PREFIX + 2 + codec::MAGIC.len() + codec::NONCE_LEN;

/// Whether `s` holds a whole Hello, unread (a peek): a client's first step. Two bytes and a
/// stall is not one (an outside tester's flood of those took the places a whole hello
/// gets, and locked lookups out again).
fn sent_a_hello(s: &TcpStream) -> bool {
    let mut frame = [0u8; HELLO_FRAME];
    if !s.peek(&mut frame).is_ok_and(|n| n == HELLO_FRAME) {
        return false;
    }
    let body = (HELLO_FRAME - codec::LEN_PREFIX) as u32;
    frame[..codec::LEN_PREFIX] == body.to_be_bytes()
        && matches!(
            codec::decode_body(&frame[codec::LEN_PREFIX..]),
            Ok(Message::Hello { .. })
        )
}

/// Marks the newcomers that have sent their whole hello since they came: one `poll` of
/// those that had not, and a peek at those with something to read.
fn note_who_spoke(waiting: &mut VecDeque<Newcomer>) {
    use std::os::fd::AsRawFd;
    let mut fds: Vec<libc::pollfd> = waiting
        .iter()
        .filter(|n| !n.spoke)
        .map(|n| libc::pollfd {
            fd: n.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if fds.is_empty() {
        return;
    }
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries naming open sockets the
    // queue owns; a zero timeout only looks.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    if n <= 0 {
        return;
    }
    let mut ready = fds.iter().map(|p| p.revents & libc::POLLIN != 0);
    for w in waiting.iter_mut().filter(|n| !n.spoke) {
        w.spoke = ready.next().unwrap_or(false) && sent_a_hello(&w.stream);
    }
}

/// Starts a thread for `stream`, or turns it away when the registry serves its maximum.
fn admit(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    workers: &mut Vec<JoinHandle<()>>,
) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let max = shared.opts.max_clients;
    let Ok(socket) = stream.try_clone() else {
        return;
    };
    let opened = Arc::new(AtomicBool::new(false));
    let since = Instant::now();
    let last_active = Arc::new(Mutex::new(since));
    let id = shared.next_slot.fetch_add(1, Ordering::Relaxed);
    {
        let mut slots = lock(&shared.slots);
        if slots.len() >= max && !shed_one(&mut slots, shared, since) {
            drop(slots);
            turn_away(stream, peer, max);
            return;
        }
        slots.push(Slot {
            id,
            socket,
            opened: opened.clone(),
            last_active: last_active.clone(),
            since,
        });
        shared.clients.fetch_add(1, Ordering::AcqRel);
    }
    let guard = SlotGuard {
        shared: shared.clone(),
        id,
    };
    let spawned = std::thread::Builder::new()
        .name("rs-registry-client".into())
        .spawn(move || {
            let me = Client {
                opened,
                last_active,
            };
            if let Err(e) = serve_client(stream, &guard.shared, &me) {
                tracing::debug!(%peer, error = %e, "registry client done");
            }
            drop(guard);
        });
    match spawned {
        Ok(w) => workers.push(w),
        // The closure, and the guard in it, are dropped: the slot is free again.
        Err(e) => tracing::warn!(error = %e, "cannot start a registry client thread"),
    }
}

/// Tells a newcomer the registry is full (`Busy`), and closes its connection.
fn turn_away(stream: TcpStream, peer: SocketAddr, max: usize) {
    tracing::warn!(%peer, max, "registry busy: client turned away");
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    if let Ok(mut fs) = FrameStream::new(stream) {
        let msg = Message::Error {
            code: ErrorCode::Busy,
            text: format!("the registry serves its maximum of {max} clients"),
        };
        let _ = fs.send(&msg, Duration::from_millis(100));
    }
}

/// What a client thread tells the accept loop about itself.
struct Client {
    opened: Arc<AtomicBool>,
    last_active: Arc<Mutex<Instant>>,
}

/// Whether a newcomer can be served now: a place is free, or a client can be shed for it.
fn has_room(slots: &[Slot], shared: &Shared, now: Instant) -> bool {
    slots.len() < shared.opts.max_clients || victim(slots, shared, now).is_some()
}

/// The client to shed for a newcomer: the oldest unopened one that had its
/// [`OPENING_GRACE`], else the one idle longest (at least [`MIN_IDLE_TO_SHED`]).
fn victim(slots: &[Slot], shared: &Shared, now: Instant) -> Option<usize> {
    let grace = OPENING_GRACE.min(shared.opts.opening_timeout / 8);
    slots
        .iter()
        .position(|s| {
            !s.opened.load(Ordering::Acquire) && now.saturating_duration_since(s.since) >= grace
        })
        .or_else(|| {
            slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.opened.load(Ordering::Acquire))
                .map(|(i, s)| (i, now.saturating_duration_since(*lock(&s.last_active))))
                .filter(|(_, idle)| *idle >= MIN_IDLE_TO_SHED)
                .max_by_key(|(_, idle)| *idle)
                .map(|(i, _)| i)
        })
}

/// Sheds one client to make room (see [`victim`]). False when nobody can be shed.
fn shed_one(slots: &mut Vec<Slot>, shared: &Shared, now: Instant) -> bool {
    let Some(i) = victim(slots, shared, now) else {
        return false;
    };
    let s = slots.remove(i);
    // Its thread sees the end of the stream and returns; its guard finds the slot gone.
    let _ = s.socket.shutdown(std::net::Shutdown::Both);
    shared.shed.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        opened = s.opened.load(Ordering::Acquire),
        "registry shed a client"
    );
    true
}

fn not_owner(name: &str) -> Message {
    error(ErrorCode::NotOwner, super::not_owner_text(name))
}

fn error(code: ErrorCode, text: impl Into<String>) -> Message {
    Message::Error {
        code,
        text: text.into(),
    }
}

fn serve_client(stream: TcpStream, shared: &Shared, me: &Client) -> Result<()> {
    let opts = &shared.opts;
    let mut fs = FrameStream::new(stream)?;
    let stop = Some(&shared.stop);
    match open(&mut fs, shared) {
        Ok(true) => me.opened.store(true, Ordering::Release),
        Ok(false) => return Ok(()),
        Err(NetError::RegistryMalformed(e)) => {
            // Not a registry client (or out of step): say why, then hang up.
            let _ = fs.send(&error(e.code(), e.to_string()), opts.io_timeout);
            return Err(e.into());
        }
        Err(e) => return Err(e),
    }
    loop {
        let deadline = crate::deadline::deadline_after(opts.idle_timeout);
        let reply = match fs.recv("registry request", deadline, stop) {
            Ok(Ok(msg)) => {
                *lock(&me.last_active) = Instant::now();
                answer(msg, shared)
            }
            Ok(Err(e)) => error(e.code(), e.to_string()),
            Err(NetError::RegistryMalformed(e)) => {
                // The stream is out of step: say why, then hang up.
                let _ = fs.send(&error(e.code(), e.to_string()), opts.io_timeout);
                return Err(e.into());
            }
            Err(e) => return Err(e),
        };
        fs.send(&reply, opts.io_timeout)?;
    }
}

/// The opening exchange: Hello, Welcome, and the proofs when there is a secret. False when
/// the client was refused (and told why).
fn open(fs: &mut FrameStream, shared: &Shared) -> Result<bool> {
    let opts = &shared.opts;
    let stop = Some(&shared.stop);
    let deadline = crate::deadline::deadline_after(opts.opening_timeout);
    let client_nonce = match fs.recv("registry hello", deadline, stop)? {
        Ok(Message::Hello { nonce }) => nonce,
        Ok(other) => {
            fs.send(
                &error(
                    ErrorCode::BadRequest,
                    format!("expected Hello, got {other}"),
                ),
                opts.io_timeout,
            )?;
            return Ok(false);
        }
        Err(e) => {
            fs.send(&error(e.code(), e.to_string()), opts.io_timeout)?;
            return Ok(false);
        }
    };
    let own = auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
    let welcome = Message::Welcome {
        auth_required: opts.secret.is_some(),
        nonce: own,
    };
    fs.send(&welcome, opts.io_timeout)?;
    let Some(secret) = &opts.secret else {
        return Ok(true);
    };
    // The proof shares the opening's deadline: a client gets opening_timeout for both.
    let transcript = auth::registry_transcript(&client_nonce, &own, true);
    // The client proves first; a client that fails gets nothing derived from the secret.
    let client_proof = match fs.recv("registry proof", deadline, stop)? {
        Ok(Message::Proof { tag }) => Some(tag),
        _ => None,
    };
    let proven = client_proof
        .is_some_and(|tag| auth::verify_proof(secret, Role::Client, &transcript, &[], &tag));
    if !proven {
        tracing::warn!(peer = ?fs.peer_addr(), "registry client failed authentication");
        fs.send(
            &error(
                ErrorCode::AuthFailed,
                "the client did not prove the shared secret",
            ),
            opts.io_timeout,
        )?;
        return Ok(false);
    }
    let client_proof = client_proof.expect("checked above");
    let tag = auth::server_proof(secret, &transcript, &client_proof);
    fs.send(&Message::Proof { tag }, opts.io_timeout)?;
    fs.seal(auth::Seal::new(
        secret,
        Role::Server,
        &transcript,
        &client_proof,
        &tag,
    ));
    Ok(true)
}

/// The reply to one request.
fn answer(msg: Message, shared: &Shared) -> Message {
    let now = Instant::now();
    let mut table = lock(&shared.table);
    match msg {
        Message::Register {
            name,
            addr,
            lease_ms,
            owner,
        } => {
            let max = shared.opts.lease;
            let lease = match lease_ms {
                0 => max,
                ms => Duration::from_millis(ms.into()).min(max),
            };
            match table.register(&name, addr, lease, owner, now) {
                Ok(()) => Message::Registered {
                    lease_ms: lease.as_millis().min(u32::MAX.into()) as u32,
                },
                Err(ErrorCode::NotOwner) => not_owner(&name),
                Err(code) => error(
                    code,
                    format!(
                        "the registry holds its maximum of {} entries",
                        shared.opts.max_entries
                    ),
                ),
            }
        }
        Message::Lookup { name } => match table.lookup(&name, now) {
            Some((addr, left)) => Message::Found {
                addr,
                lease_left_ms: left.as_millis().min(u32::MAX.into()) as u32,
            },
            None => error(ErrorCode::NotFound, super::not_found_text(&name)),
        },
        Message::Unregister { name, owner } => match table.unregister(&name, owner, now) {
            Ok(()) => Message::Done,
            Err(ErrorCode::NotOwner) => not_owner(&name),
            Err(code) => error(code, super::not_found_text(&name)),
        },
        Message::Ping => Message::Done,
        other => error(
            ErrorCode::BadRequest,
            format!("{other} is not a request here"),
        ),
    }
}
