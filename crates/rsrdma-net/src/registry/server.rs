//! The registry server: an accept thread and one thread per client, up to a cap.

use super::codec::Message;
use super::stream::FrameStream;
use super::table::Table;
use super::ErrorCode;
use crate::error::{NetError, Result};
use crate::handshake::{auth, Role};
use rsrdma::option_setters as setters;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the accept loop sleeps when no client is waiting.
const ACCEPT_TICK: Duration = Duration::from_millis(10);

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
    /// Clients served at once; one more gets a `Busy` error and is closed.
    pub max_clients: usize,
    /// A client silent this long is disconnected.
    pub idle_timeout: Duration,
    /// Limit of each step of the opening exchange and of each reply.
    pub io_timeout: Duration,
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
        if opts.max_entries == 0 || opts.max_clients == 0 || opts.lease.is_zero() {
            return Err(NetError::InvalidArgument(
                "RegistryOptions: max_entries, max_clients and lease must be above 0".into(),
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
    while !shared.stop.load(Ordering::Relaxed) {
        workers.retain(|w| !w.is_finished());
        match listener.accept() {
            Ok((stream, peer)) => admit(stream, peer, shared, &mut workers),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_TICK),
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "registry accept failed");
                std::thread::sleep(ACCEPT_TICK * 10);
            }
        }
    }
    for w in workers {
        if w.join().is_err() {
            tracing::error!("a registry client thread panicked");
        }
    }
}

/// Starts a thread for `stream`, or turns it away when the registry serves its maximum.
fn admit(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    workers: &mut Vec<JoinHandle<()>>,
) {
    let turn_away = |stream: TcpStream, why: String| {
        if let Ok(mut fs) = FrameStream::new(stream) {
            let msg = Message::Error {
                code: ErrorCode::Busy,
                text: why,
            };
            let _ = fs.send(&msg, Duration::from_millis(100));
        }
    };
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let max = shared.opts.max_clients;
    if shared.clients.fetch_add(1, Ordering::AcqRel) >= max {
        shared.clients.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%peer, max, "registry busy: client turned away");
        turn_away(
            stream,
            format!("the registry serves its maximum of {max} clients"),
        );
        return;
    }
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("rs-registry-client".into())
        .spawn(move || {
            if let Err(e) = serve_client(stream, &s) {
                tracing::debug!(%peer, error = %e, "registry client done");
            }
            s.clients.fetch_sub(1, Ordering::AcqRel);
        });
    match spawned {
        Ok(w) => workers.push(w),
        Err(e) => {
            shared.clients.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(error = %e, "cannot start a registry client thread");
        }
    }
}

fn error(code: ErrorCode, text: impl Into<String>) -> Message {
    Message::Error {
        code,
        text: text.into(),
    }
}

fn serve_client(stream: TcpStream, shared: &Shared) -> Result<()> {
    let opts = &shared.opts;
    let mut fs = FrameStream::new(stream)?;
    let stop = Some(&shared.stop);
    match open(&mut fs, shared) {
        Ok(true) => {}
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
            Ok(Ok(msg)) => answer(msg, shared),
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
    let deadline = crate::deadline::deadline_after(opts.io_timeout);
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
    let deadline = crate::deadline::deadline_after(opts.io_timeout);
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
        } => {
            let max = shared.opts.lease;
            let lease = match lease_ms {
                0 => max,
                ms => Duration::from_millis(ms.into()).min(max),
            };
            match table.register(&name, addr, lease, now) {
                Ok(()) => Message::Registered {
                    lease_ms: lease.as_millis().min(u32::MAX.into()) as u32,
                },
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
            None => error(ErrorCode::NotFound, format!("no live entry named {name:?}")),
        },
        Message::Unregister { name } => match table.unregister(&name, now) {
            true => Message::Done,
            false => error(ErrorCode::NotFound, format!("no live entry named {name:?}")),
        },
        Message::Ping => Message::Done,
        other => error(
            ErrorCode::BadRequest,
            format!("{other} is not a request here"),
        ),
    }
}
