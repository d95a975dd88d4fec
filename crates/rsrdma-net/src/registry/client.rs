//! The registry client: one connection, many requests, a time limit on each.

use super::codec::{Message, OWNER_LEN};
use super::stream::FrameStream;
use super::{check_name, ErrorCode};
use crate::error::{NetError, Result};
use crate::handshake::{auth, Role};
use crate::packet::Addr;
use rsrdma::option_setters as setters;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Options of [`RegistryClient::connect`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The registry's shared secret, if it has one. A client with a secret refuses a
    /// registry that cannot prove it too.
    pub secret: Option<crate::Secret>,
    /// Limit of the connect and of each request.
    pub timeout: Duration,
    /// Who this client registers names as: a live name belongs to its owner, and only that
    /// owner renews, moves or removes it. `None` (the default) picks a random owner per
    /// client; set the same value on several clients (a process that reconnects) for them to
    /// act as one owner. It travels in the clear: against someone who can watch the
    /// network, use a secret and a trusted network (see the guide's security chapter).
    pub owner: Option<[u8; OWNER_LEN]>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            secret: None,
            timeout: Duration::from_secs(5),
            owner: None,
        }
    }
}

setters!(ClientOptions {
    /// Sets [`ClientOptions::secret`].
    secret: Option<crate::Secret>,
    /// Sets [`ClientOptions::timeout`].
    timeout: Duration,
    /// Sets [`ClientOptions::owner`].
    owner: Option<[u8; OWNER_LEN]>,
});

/// A connection to a registry.
pub struct RegistryClient {
    fs: FrameStream,
    timeout: Duration,
    peer: SocketAddr,
    owner: [u8; OWNER_LEN],
    /// A call's request or reply did not go through whole (a timeout, a socket error): its
    /// reply may still come, and would be taken for the next call's. Every later call fails.
    out_of_step: bool,
}

impl std::fmt::Debug for RegistryClient {
    /// The registry, the timeout and whether the client is in step; not its buffers or its
    /// owner token (which names its registrations to the registry).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("peer", &self.peer)
            .field("timeout", &self.timeout)
            .field("out_of_step", &self.out_of_step)
            .finish_non_exhaustive()
    }
}

impl RegistryClient {
    /// Connects, and authenticates when either side has a secret.
    ///
    /// # Errors
    /// [`NetError::Io`]/[`NetError::Timeout`] for the connect; [`NetError::Auth`] when the
    /// registry requires a secret this side lacks, refuses this side's, or cannot prove the
    /// one this side has; [`NetError::Registry`] when it refuses the client (`Busy`);
    /// [`NetError::InvalidArgument`] for a zero timeout.
    pub fn connect(registry: impl ToSocketAddrs, opts: ClientOptions) -> Result<RegistryClient> {
        crate::secret::check_secret(opts.secret.as_ref(), "ClientOptions::secret")?;
        if opts.timeout.is_zero() {
            return Err(NetError::InvalidArgument(
                "ClientOptions::timeout must be above 0".into(),
            ));
        }
        let owner = match opts.owner {
            Some(o) => o,
            None => random_owner()?,
        };
        let addrs: Vec<SocketAddr> = registry
            .to_socket_addrs()
            .map_err(|e| NetError::io("resolve registry address", e))?
            .collect();
        let started = Instant::now();
        let mut cut = 0;
        loop {
            let left = opts.timeout.saturating_sub(started.elapsed());
            let (stream, peer) = dial(&addrs, left.max(Duration::from_millis(1)))?;
            let mut c = RegistryClient {
                fs: FrameStream::new(stream)?,
                timeout: left.max(Duration::from_millis(1)),
                out_of_step: false,
                peer,
                owner,
            };
            match c.open(opts.secret.as_deref()) {
                Ok(()) => {
                    c.timeout = opts.timeout;
                    return Ok(c);
                }
                // A full registry sheds a client that has not opened in time for a newcomer
                // (a thread of a busy host scheduled late): the opening starts again, a few
                // times, within the timeout. Nothing was asked yet, so nothing is repeated.
                Err(e) if cut_short(&e) && cut < OPENING_RETRIES => {
                    cut += 1;
                    let pause = Duration::from_millis(5 << cut);
                    if started.elapsed() + pause >= opts.timeout {
                        return Err(e);
                    }
                    tracing::debug!(error = %e, "the registry cut the opening short; again");
                    std::thread::sleep(pause);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The registry's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Who this client registers names as ([`ClientOptions::owner`]).
    pub fn owner(&self) -> [u8; OWNER_LEN] {
        self.owner
    }

    fn open(&mut self, secret: Option<&[u8]>) -> Result<()> {
        let own = auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
        let (auth_required, theirs) = match self.call(&Message::Hello { nonce: own })? {
            Message::Welcome {
                auth_required,
                nonce,
            } => (auth_required, nonce),
            other => return Err(unexpected("Welcome", &other)),
        };
        match (auth_required, secret) {
            (false, None) => Ok(()),
            (false, Some(_)) => Err(NetError::Auth(
                "a secret was given, but the registry does not authenticate".into(),
            )),
            (true, None) => Err(NetError::Auth(
                "the registry requires a shared secret, and none was given".into(),
            )),
            (true, Some(secret)) => {
                let transcript = auth::registry_transcript(&own, &theirs, true);
                let mine = auth::client_proof(secret, &transcript);
                match self.call(&Message::Proof { tag: mine }) {
                    Ok(Message::Proof { tag }) => {
                        match auth::verify_proof(secret, Role::Server, &transcript, &mine, &tag) {
                            true => {
                                self.fs.seal(auth::Seal::new(
                                    secret,
                                    Role::Client,
                                    &transcript,
                                    &mine,
                                    &tag,
                                ));
                                Ok(())
                            }
                            false => Err(NetError::Auth(
                                "the registry's proof is wrong: it does not know the secret".into(),
                            )),
                        }
                    }
                    Ok(other) => Err(unexpected("Proof", &other)),
                    Err(NetError::Registry {
                        code: ErrorCode::AuthFailed,
                        ..
                    }) => Err(NetError::Auth(
                        "the registry refused this side's proof: a wrong secret, or an opening \
                         altered on the way"
                            .into(),
                    )),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Sends `req` and reads the reply; an Error reply becomes [`NetError::Registry`].
    ///
    /// A call whose request or reply did not go through whole leaves the client out of step
    /// (the late reply would answer the next call: a lookup of one name could return
    /// another's address); every later call then fails with [`NetError::Closed`], and the
    /// caller connects again.
    fn call(&mut self, req: &Message) -> Result<Message> {
        if self.out_of_step {
            return Err(NetError::Closed {
                op: "registry call after one that timed out or failed part-way (connect again)",
            });
        }
        let deadline = crate::deadline::deadline_after(self.timeout);
        let reply = self
            .fs
            .send(req, self.timeout)
            .and_then(|()| self.fs.recv("registry reply", deadline, None))
            .inspect_err(|_| self.out_of_step = true)?;
        match reply? {
            Message::Error { code, text } => Err(NetError::Registry {
                code,
                message: text,
            }),
            reply => Ok(reply),
        }
    }

    /// Registers `name` → `addr` with the registry's default (and longest) lease; returns
    /// the lease granted. Call again before it runs out to renew it.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a name of 0 or more than [`MAX_NAME`](super::codec::MAX_NAME) bytes;
    /// [`NetError::Registry`] (`Full`, …); connection errors and timeouts.
    pub fn register(&mut self, name: &str, addr: &Addr) -> Result<Duration> {
        self.register_for(name, addr, Duration::ZERO)
    }

    /// As [`RegistryClient::register`]: renews the lease (and updates the address).
    ///
    /// # Errors
    /// As [`RegistryClient::register`].
    pub fn renew(&mut self, name: &str, addr: &Addr) -> Result<Duration> {
        self.register(name, addr)
    }

    /// Registers with a lease of `lease` (rounded up to whole milliseconds, cut to the
    /// registry's longest; zero asks for its default); returns the lease granted.
    ///
    /// # Errors
    /// As [`RegistryClient::register`].
    pub fn register_for(&mut self, name: &str, addr: &Addr, lease: Duration) -> Result<Duration> {
        check_name(name)?;
        let req = Message::Register {
            name: name.to_owned(),
            addr: *addr,
            // Rounded up: a lease under a millisecond is the shortest one, not zero (which
            // asks for the registry's default, its longest).
            lease_ms: lease.as_nanos().div_ceil(1_000_000).min(u32::MAX.into()) as u32,
            owner: self.owner,
        };
        match self.call(&req)? {
            Message::Registered { lease_ms } => Ok(Duration::from_millis(lease_ms.into())),
            other => Err(unexpected("Registered", &other)),
        }
    }

    /// The address registered under `name`.
    ///
    /// # Errors
    /// [`NetError::Registry`] with [`ErrorCode::NotFound`] when no live entry has it; as
    /// [`RegistryClient::register`].
    pub fn lookup(&mut self, name: &str) -> Result<Addr> {
        check_name(name)?;
        match self.call(&Message::Lookup {
            name: name.to_owned(),
        })? {
            Message::Found { addr, .. } => Ok(addr),
            other => Err(unexpected("Found", &other)),
        }
    }

    /// Removes `name`.
    ///
    /// # Errors
    /// As [`RegistryClient::lookup`].
    pub fn unregister(&mut self, name: &str) -> Result<()> {
        check_name(name)?;
        match self.call(&Message::Unregister {
            name: name.to_owned(),
            owner: self.owner,
        })? {
            Message::Done => Ok(()),
            other => Err(unexpected("Done", &other)),
        }
    }

    /// Checks that the registry answers.
    ///
    /// # Errors
    /// Connection errors and timeouts.
    pub fn ping(&mut self) -> Result<()> {
        match self.call(&Message::Ping)? {
            Message::Done => Ok(()),
            other => Err(unexpected("Done", &other)),
        }
    }
}

/// Registers `name` → `addr` at `registry` over a new connection (no secret, 5 s limit),
/// as one owner for the whole process: calling it again before the lease runs out renews
/// the name (or moves it to a new address), and another process cannot take it meanwhile.
///
/// # Errors
/// As [`RegistryClient::connect`] and [`RegistryClient::register`].
pub fn register(registry: impl ToSocketAddrs, name: &str, addr: &Addr) -> Result<Duration> {
    static PROCESS_OWNER: OnceLock<[u8; OWNER_LEN]> = OnceLock::new();
    let owner = match PROCESS_OWNER.get() {
        Some(o) => *o,
        // Threads racing here each draw one; all use the one kept.
        None => {
            let drawn = random_owner()?;
            *PROCESS_OWNER.get_or_init(|| drawn)
        }
    };
    RegistryClient::connect(registry, ClientOptions::default().owner(Some(owner)))?
        .register(name, addr)
}

/// A fresh random owner (of a client, or of an etcd directory that was given none).
pub(super) fn random_owner() -> Result<[u8; OWNER_LEN]> {
    let n = auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
    let mut o = [0u8; OWNER_LEN];
    o.copy_from_slice(&n[..OWNER_LEN]);
    Ok(o)
}

/// Looks `name` up at `registry` over a new connection (no secret, 5 s limit).
///
/// # Errors
/// As [`RegistryClient::connect`] and [`RegistryClient::lookup`].
pub fn lookup(registry: impl ToSocketAddrs, name: &str) -> Result<Addr> {
    RegistryClient::connect(registry, ClientOptions::default())?.lookup(name)
}

fn unexpected(expected: &'static str, got: &Message) -> NetError {
    NetError::Unexpected {
        expected,
        got: got.name(),
    }
}

/// How many times [`RegistryClient::connect`] opens again after the registry cut its
/// opening short.
const OPENING_RETRIES: u32 = 3;

/// Whether the registry ended the connection in the middle of the opening (as it sheds an
/// unopened client when full), rather than answering it.
fn cut_short(e: &NetError) -> bool {
    match e {
        NetError::PeerClosed(_) => true,
        NetError::Io { source, .. } => matches!(
            source.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        _ => false,
    }
}

fn dial(addrs: &[SocketAddr], timeout: Duration) -> Result<(TcpStream, SocketAddr)> {
    let mut last = None;
    for &a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok((s, a)),
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) if e.kind() == std::io::ErrorKind::TimedOut => NetError::Timeout {
            op: "connect to the registry",
            millis: crate::deadline::whole_millis(timeout),
        },
        Some(e) => NetError::io("connect to the registry", e),
        None => NetError::InvalidArgument("the registry address resolved to nothing".into()),
    })
}
