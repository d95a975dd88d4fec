//! RawConn: a connection for the data plane at line rate.
//!
//! The handshake ([`crate::handshake`]) connects one RC (or UC) queue pair per side; the TCP
//! connection stays open as a control channel for memory descriptors, barriers, liveness and
//! the close. After that, the user registers memory, posts work requests (one at a time or a
//! batch per call), and busy-polls the completion queues (or, with [`Completion::Event`],
//! sleeps on their channels); nothing is copied, framed, or handed to another thread.
//!
//! # Sharing memory between connections
//! With [`RawOptions::pd`] every connection is created in one protection domain, so memory
//! registered once ([`rsrdma::Mr::new`] on that domain) serves all of them: its `lkey` is
//! valid on each connection's QP, and its descriptor can be shared with each peer.
//!
//! # What is `unsafe`
//! Posting ([`RawConn::post_send`], [`RawConn::post_recv`], their batch forms and the
//! [`RawConn::pipeline`] family) is `unsafe` for the reason `rsrdma`'s posting is: the NIC
//! reads and writes the named memory after the call returns, until the completion is reaped.
//! Memory registered through [`RawConn::register_memory`] is never freed while registered, so
//! the contract is about not touching in-flight buffers from the CPU.

use crate::conn::{take_tcp_peer, AcceptQueue, Admission, ListenerCounters};
use crate::error::{NetError, Result};
use crate::handshake::{Channel, Endpoint, Regions, Role, Settled, Standing};
use crate::options::{Completion, RawOptions};
use crate::pipeline::{probe_enabled, Pipeline, RunStats};
use rsrdma::{
    AccessFlags, CompChannel, ConnectOptions, Context, Cq, Mr, Mtu, Pd, Qp, QpCaps, QpEndpoint,
    QpType, RecvWr, RemoteMemory, SendOps, SendWr, Wc,
};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a pipeline waits without any completion before it gives up on the peer, at
/// most: a shorter [`RawOptions::timeout`] shortens it.
const STALL_LIMIT: Duration = Duration::from_secs(5);

/// A listener for [`RawConn`]s.
///
/// As [`crate::Listener`]: handshakes run concurrently, each on a thread of its own, bounded
/// in all and per source ([`RawOptions::max_handshakes`],
/// [`RawOptions::max_handshakes_per_source`]); a new peer past a bound sheds the oldest
/// handshake that has not opened yet (else, without a secret, one stalled after opening);
/// a peer has [`RawOptions::opening_timeout`] to send its
/// hello and proof (without a secret, its hello and its endpoint). A peer that fails is
/// logged and counted ([`RawListener::counters`]), never returned, so one silent or garbage
/// socket delays no good client. Handshakes start only from `accept` (each call starts every
/// peer already queued, while there is room, before it returns one), and a connection grants
/// its peer [`RawOptions::remote_access`] only once `accept` returns it.
pub struct RawListener {
    tcp: TcpListener,
    opts: RawOptions,
    hs: Arc<AcceptQueue<RawConn>>,
}

impl std::fmt::Debug for RawListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawListener")
            .field("tcp", &self.tcp)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl RawListener {
    /// Listens on `addr` (port 0 picks one; see [`RawListener::local_addr`]).
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for options that cannot work (a UD queue pair, a device
    /// other than the shared protection domain's, a short secret, zero limits, depths the
    /// device's queues cannot hold); the device's error for a device, port or GID index it
    /// does not have (checked here, not by every handshake after its peer was accepted);
    /// [`NetError::Io`] naming `bind`.
    pub fn bind(addr: impl ToSocketAddrs, opts: RawOptions) -> Result<RawListener> {
        check_options(&opts)?;
        crate::domain::check_fits_device(
            opts.device.as_deref(),
            opts.pd.as_ref(),
            opts.port,
            opts.gid_index,
            &raw_fits(&opts).as_fits(),
        )?;
        let tcp = TcpListener::bind(addr).map_err(|e| NetError::io("bind", e))?;
        tcp.set_nonblocking(true)
            .map_err(|e| NetError::io("set_nonblocking", e))?;
        let hs = AcceptQueue::new(Admission::with_limits(
            opts.max_handshakes,
            opts.max_handshakes_per_source,
            opts.opening_timeout,
        ))?;
        Ok(RawListener { tcp, opts, hs })
    }

    /// The address it listens on.
    ///
    /// # Errors
    /// [`NetError::Io`].
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.tcp
            .local_addr()
            .map_err(|e| NetError::io("local_addr", e))
    }

    /// What this listener has done with its peers: accepted, failed, shed.
    pub fn counters(&self) -> ListenerCounters {
        self.hs.admission.counters()
    }

    /// Waits for the next good connection (handshakes run concurrently; peers that fail are
    /// skipped, see [`RawListener`]).
    ///
    /// # Errors
    /// The listener's own errors only (the socket, a thread that cannot start).
    pub fn accept(&self) -> Result<RawConn> {
        self.accept_until(None, Duration::ZERO)
    }

    /// Takes the next peer and runs its handshake on this thread, returning its outcome,
    /// failure included: for a tool that serves exactly one known peer and should stop with
    /// that peer's error (as perftest's tools do), not wait for another. A service uses
    /// [`RawListener::accept`].
    ///
    /// # Errors
    /// The peer's handshake errors; the listener's own.
    pub fn accept_first(&self) -> Result<RawConn> {
        let (stream, from) = loop {
            if let Some(peer) = take_tcp_peer(&self.tcp)? {
                break peer;
            }
            crate::conn::wait_listener(self.tcp.as_raw_fd())
                .map_err(|e| NetError::io("poll", e))?;
        };
        tracing::debug!(%from, "raw connection accepted");
        let r = RawConn::establish(stream, Role::Server, &self.opts, None)
            .and_then(RawConn::grant_remote_access);
        match &r {
            Ok(_) => self.hs.admission.accepted(),
            Err(e) => self.hs.admission.failed(Some(from), e),
        }
        r
    }

    /// As [`RawListener::accept`], waiting at most `timeout`.
    ///
    /// # Errors
    /// [`NetError::Timeout`] when no connection was ready in time; as [`RawListener::accept`].
    pub fn accept_timeout(&self, timeout: Duration) -> Result<RawConn> {
        self.accept_until(Some(crate::deadline::deadline_after(timeout)), timeout)
    }

    fn accept_until(&self, deadline: Option<Instant>, timeout: Duration) -> Result<RawConn> {
        loop {
            let c = self
                .hs
                .accept_until(self.tcp.as_raw_fd(), deadline, timeout, |waiting| {
                    let Some((stream, from)) = take_tcp_peer(&self.tcp)? else {
                        return Ok(false);
                    };
                    self.start(stream, from, waiting)?;
                    Ok(true)
                })?;
            // A peer whose queue pair failed while it waited in the queue (say, it sent a
            // request the QP, granting nothing yet, refused) is that peer's failure: the
            // next one is taken, as for a handshake that failed.
            match c.grant_remote_access() {
                Ok(c) => return Ok(c),
                Err(e) => self.hs.admission.accepted_then_failed(&e),
            }
        }
    }

    /// Runs one peer's handshake on a thread of its own, when admission gives it a place.
    fn start(&self, stream: TcpStream, from: SocketAddr, waiting: usize) -> Result<()> {
        tracing::debug!(%from, "raw connection accepted");
        // The accepted socket inherits nothing: the channel makes it non-blocking itself.
        let Some(ticket) = self.hs.admission.start(Some(from), Some(&stream), waiting) else {
            return Ok(());
        };
        let (hs, opts) = (self.hs.clone(), self.opts.clone());
        std::thread::Builder::new()
            .name("rsrdma-raw-handshake".into())
            .spawn(move || {
                let r = RawConn::establish(stream, Role::Server, &opts, Some(ticket.standing()));
                hs.finish(ticket, r);
            })
            .map(drop)
            .map_err(|e| NetError::io("spawn a handshake thread", e))
    }
}

impl crate::conn::Unaccepted for RawConn {
    /// Dropped: its control channel tells the peer it closed, and the peer's waits on it
    /// (`sync`, `exchange_memory`) fail (a RawConn has no end-of-stream to mistake).
    fn refuse(self) {}
}

impl Drop for RawListener {
    fn drop(&mut self) {
        // Connections nobody accepted close now; running handshakes drop theirs.
        self.hs.close();
    }
}

/// A connected queue pair plus its control channel. See the module docs.
pub struct RawConn {
    // Field order is drop order: the QP goes before the CQs and PD it uses.
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    pd: Pd,
    ctrl: Channel,
    peer: Endpoint,
    settled: Settled,
    peer_regions: Vec<RemoteMemory>,
    sync_step: u32,
    /// A `sync` timed out after sending its step: the next one waits for the peer's side of
    /// that step (sent again, it would be a step the peer never takes).
    sync_waiting: Option<u32>,
    /// A run's limit without any completion: [`RawOptions::timeout`], at most
    /// [`STALL_LIMIT`].
    stall_limit: Duration,
    /// What the queue pair lets the peer do ([`RawOptions::remote_access`]).
    remote_access: AccessFlags,
    probe: bool,
    /// Sends go through the extended work-request API ([`RawOptions::new_post_send`]).
    new_post_send: bool,
    /// A pipeline or drain failed: its queue pair was moved to ERROR and what it had in
    /// flight reaped (see [`RawConn::stop_after_failed_run`]); no run starts again.
    stopped: bool,
    /// Signaled send requests posted and not yet reaped. A provider may free a send queue
    /// slot when it makes the completion, before anyone polls it (rxe and soft0 do): a
    /// caller who posts without polling would then overrun the send CQ, whose overrun loses
    /// completions and fails the queue pair (an outside tester's find: 129 WRITEs posted
    /// `Ok`, 128 completions). Posts are refused (`ENOMEM`, as a full send queue) past
    /// [`RawConn::signal_limit`]. What was reaped comes off when the room runs short, from
    /// the send CQ's own count ([`rsrdma::Cq::count_polled`]): the caller may poll it through
    /// [`RawConn::send_cq`] as well as [`RawConn::poll_send`] (counting only the latter
    /// refused every post after the send depth's worth to a caller who polled the CQ, as
    /// the guide teaches: another outside tester's find).
    unreaped: AtomicU32,
    /// The send CQ's count of polled completions already taken off `unreaped`.
    reaped_seen: AtomicU64,
    /// How many signaled requests may wait unreaped: what the send CQ holds beyond a flush
    /// of the whole send queue.
    signal_limit: u32,
}

impl std::fmt::Debug for RawConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawConn")
            .field("qp", &self.qp)
            .field("peer_qp", &self.peer.qp_num)
            .field("settled", &self.settled)
            .finish()
    }
}

impl RawConn {
    /// Connects to a [`RawListener`] at `addr` and runs the handshake.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] as [`RawListener::bind`];
    /// [`NetError::Io`]/[`NetError::Timeout`] for the TCP connect; the handshake's errors;
    /// verbs errors.
    pub fn dial(addr: impl ToSocketAddrs, opts: RawOptions) -> Result<RawConn> {
        check_options(&opts)?;
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| NetError::io("resolve address", e))?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, opts.timeout) {
                Ok(s) => {
                    // A Listener of Conns takes the connection on soft0 (its rdma_cm on
                    // the port); on a NIC the connect is refused.
                    return RawConn::establish(s, Role::Client, &opts, None).map_err(|e| {
                        e.closed_without_a_hello(
                            *a,
                            "the TCP handshake of a RawConn",
                            "something there took the connection and closed it without a \
                             hello: a Listener of Conns (on rdma_cm or the TCP handshake: dial \
                             it with Conn), or another service",
                        )
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => NetError::io("connect", e),
            None => NetError::InvalidArgument("the address resolved to nothing".into()),
        })
    }

    fn establish(
        stream: TcpStream,
        role: Role,
        opts: &RawOptions,
        standing: Option<Arc<Standing>>,
    ) -> Result<RawConn> {
        // Authenticate before creating anything or sending any queue-pair detail.
        let limits = (opts.timeout, opts.opening_timeout);
        let mut ctrl = Channel::open(stream, role, limits, opts.secret.as_deref(), standing)?;
        let p = match Self::setup(&mut ctrl, opts, role) {
            Ok(p) => p,
            // Tell the peer why, so it does not wait for an endpoint that will never come.
            Err(e @ (NetError::Verbs(_) | NetError::InvalidArgument(_))) => {
                return Err(ctrl.abort(e))
            }
            Err(e) => return Err(e),
        };
        // Both queue pairs are ready to receive before either side may send.
        ctrl.closing_barrier(0)?;
        let signal_limit = p
            .send_cq
            .capacity()
            .saturating_sub(p.qp.caps().max_send_wr)
            .max(1);
        Ok(RawConn {
            qp: p.qp,
            send_cq: p.send_cq,
            recv_cq: p.recv_cq,
            pd: p.pd,
            ctrl,
            peer: p.peer,
            settled: p.settled,
            peer_regions: Vec::new(),
            sync_step: 1,
            sync_waiting: None,
            stall_limit: opts.timeout.min(STALL_LIMIT),
            remote_access: opts.remote_access,
            probe: probe_enabled(),
            new_post_send: opts.new_post_send,
            stopped: false,
            unreaped: AtomicU32::new(0),
            reaped_seen: AtomicU64::new(0),
            signal_limit,
        })
    }

    fn setup(ctrl: &mut Channel, opts: &RawOptions, role: Role) -> Result<Parts> {
        let (ctx, pd) = crate::domain::open_domain(opts.device.as_deref(), opts.pd.as_ref())?;
        let port = ctx.query_port(opts.port)?;
        let gid_index = ctx.resolve_gid_index(opts.port, opts.gid_index)?;
        let (send_cq, recv_cq) = create_cqs(&ctx, opts)?;
        let caps = QpCaps::default()
            .max_send_wr(opts.send_depth)
            .max_recv_wr(opts.recv_depth)
            .max_send_sge(1u32)
            .max_recv_sge(1u32)
            .max_inline_data(opts.max_inline);
        let builder = Qp::builder(opts.qp_type).caps(caps);
        let qp = if opts.new_post_send {
            // What an RC (or UC) QP may post; UC has no READ or atomics.
            let ops = match opts.qp_type {
                QpType::Rc => SendOps::ALL,
                _ => {
                    SendOps::SEND
                        | SendOps::SEND_WITH_IMM
                        | SendOps::RDMA_WRITE
                        | SendOps::RDMA_WRITE_WITH_IMM
                }
            };
            builder.build_ex(&pd, &send_cq, &recv_cq, ops)?
        } else {
            builder.build(&pd, &send_cq, &recv_cq)?
        };
        let psn = random_psn()?;
        let me = qp.endpoint(opts.port, gid_index, psn)?;
        let mtu = opts.mtu.or(port.active_mtu).unwrap_or(Mtu::Mtu1024);
        let dev = ctx.attr();
        let local = Endpoint {
            qp_num: me.qp_num,
            psn: me.psn,
            lid: me.lid,
            gid: me.gid,
            gid_index: gid_index.unwrap_or(0),
            mtu: mtu.bytes() as u16,
            qp_type: match opts.qp_type {
                QpType::Rc => 0,
                QpType::Uc => 1,
                QpType::Ud => 2,
            },
            send_depth: qp.caps().max_send_wr,
            recv_depth: qp.caps().max_recv_wr,
            max_inline: qp.caps().max_inline_data,
            max_rd_atomic: dev.max_qp_init_rd_atom.min(255) as u8,
            max_dest_rd_atomic: dev.max_qp_rd_atom.min(255) as u8,
            params: opts.params.clone(),
        };
        let (peer, settled) = ctrl.exchange_endpoints(&local, |k| format!("parameter {k}"))?;
        let bring_up = ConnectOptions::default()
            .port(opts.port)
            .gid_index(gid_index)
            .mtu(Mtu::from_bytes(settled.mtu.into()).unwrap_or(Mtu::Mtu1024))
            // A listener's connection grants nothing until the application accepts it
            // (`RawConn::grant_remote_access`): a peer in the accept queue, or one whose
            // handshake has not finished, reaches no memory of a shared protection domain.
            .access(match role {
                Role::Client => opts.remote_access,
                Role::Server => AccessFlags::NONE,
            })
            // Timeouts and retries: ConnectOptions' defaults (perftest's 14/7/7, RNR timer 12).
            .max_rd_atomic(settled.max_rd_atomic)
            .max_dest_rd_atomic(settled.max_dest_rd_atomic);
        qp.connect(&bring_up, me.psn, &QpEndpoint::from(&peer))?;
        Ok(Parts {
            qp,
            send_cq,
            recv_cq,
            pd,
            peer,
            settled,
        })
    }
}

/// Refuses options that cannot work, before any socket or verb.
fn check_options(opts: &RawOptions) -> Result<()> {
    if opts.qp_type == QpType::Ud {
        return Err(NetError::InvalidArgument(
            "RawConn is connected: use RC or UC".into(),
        ));
    }
    crate::secret::check_secret(opts.secret.as_ref(), "RawOptions::secret")?;
    if opts.opening_timeout.is_zero()
        || opts.timeout.is_zero()
        || opts.send_depth == 0
        || opts.recv_depth == 0
        || opts.max_handshakes == 0
        || opts.max_handshakes_per_source == 0
    {
        return Err(NetError::InvalidArgument(
            "RawOptions: timeout, opening_timeout, send_depth, recv_depth, max_handshakes and \
             max_handshakes_per_source must be above 0"
                .into(),
        ));
    }
    // What the handshake could not carry, or could never match: refused here, not by every
    // peer's handshake with an unclear end.
    let max = crate::handshake::codec::MAX_PARAMS;
    if opts.params.len() > max {
        return Err(NetError::InvalidArgument(format!(
            "RawOptions::params: {} parameters, the handshake carries at most {max}",
            opts.params.len()
        )));
    }
    let mut keys: Vec<u16> = opts.params.iter().map(|&(k, _)| k).collect();
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(NetError::InvalidArgument(format!(
            "RawOptions::params: key {:#x} twice",
            w[0]
        )));
    }
    crate::domain::check_device(opts.device.as_deref(), opts.pd.as_ref())
}

/// What a RawConn's queues need of its device, by option.
struct RawFits {
    queues: [(&'static str, u32); 2],
    cqs: [(&'static str, u32); 2],
}

impl RawFits {
    fn as_fits(&self) -> crate::domain::Fits<'_> {
        crate::domain::Fits {
            queues: &self.queues,
            cqs: &self.cqs,
            srq: None,
        }
    }
}

/// The queues of [`create_cqs`] and the queue pair, by option.
fn raw_fits(opts: &RawOptions) -> RawFits {
    RawFits {
        queues: [
            ("RawOptions::send_depth", opts.send_depth),
            ("RawOptions::recv_depth", opts.recv_depth),
        ],
        cqs: [
            (
                "the send completion queue (twice RawOptions::send_depth)",
                opts.send_depth.max(1).saturating_mul(2),
            ),
            (
                "the receive completion queue (RawOptions::recv_depth)",
                opts.recv_depth.max(1),
            ),
        ],
    }
}

/// The send and receive CQs, each with its own completion channel in event mode (so each can
/// be waited on alone). Options the device cannot hold are refused first, by name.
fn create_cqs(ctx: &Context, opts: &RawOptions) -> Result<(Cq, Cq)> {
    crate::domain::check_fits(ctx, &raw_fits(opts).as_fits())?;
    let channel = || -> Result<Option<CompChannel>> {
        Ok(match opts.completion {
            Completion::Busy => None,
            Completion::Event => Some(CompChannel::new(ctx)?),
        })
    };
    // Room for every signaled request the caller may leave unreaped (the send depth, see
    // `RawConn::unreaped`) besides a flush of the whole send queue.
    let send_cq = Cq::new(
        ctx,
        opts.send_depth.max(1).saturating_mul(2),
        channel()?.as_ref(),
    )?;
    // The caller may poll it itself (`RawConn::send_cq`): see `RawConn::unreaped`.
    send_cq.count_polled();
    let recv_cq = Cq::new(ctx, opts.recv_depth.max(1), channel()?.as_ref())?;
    Ok((send_cq, recv_cq))
}

/// How many of `wrs` are signaled (each makes a completion).
fn signaled_in(wrs: &[SendWr<'_>]) -> u32 {
    wrs.iter().filter(|w| w.is_signaled()).count() as u32
}

/// What the handshake set up, before it becomes a [`RawConn`].
struct Parts {
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    pd: Pd,
    peer: Endpoint,
    settled: Settled,
}

impl RawConn {
    /// Grants the peer of an accepted connection what [`RawOptions::remote_access`] allows:
    /// a listener's connections come up granting nothing, and get it when `accept` hands
    /// them out.
    fn grant_remote_access(self) -> Result<RawConn> {
        if self.remote_access != AccessFlags::NONE {
            self.qp.set_access(self.remote_access)?;
        }
        Ok(self)
    }

    /// Registers `len` bytes of page-aligned memory with `access`. Grant remote flags only to
    /// memory the peer must reach; then share it with [`RawConn::exchange_memory`].
    ///
    /// # Errors
    /// rsrdma's registration errors.
    pub fn register_memory(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        Ok(Mr::new(&self.pd, len, access)?)
    }

    /// Sends the descriptors of `regions` to the peer and receives the peer's (both sides
    /// call it; either may pass none). Afterwards [`RawConn::peer_regions`] and
    /// [`RawConn::peer_region`] name the peer's memory for one-sided Write and Read.
    ///
    /// A region is shared only if the peer can use it through this connection: it is on
    /// the connection's protection domain, and it allows a remote operation the queue pair
    /// grants ([`RawOptions::remote_access`]). Otherwise the peer's one-sided requests would
    /// fail on its side with a remote access error, and nothing here would say why.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] naming the region that cannot be used, and why (nothing
    /// is sent then); the control channel's errors.
    pub fn exchange_memory(&mut self, regions: &[&Mr]) -> Result<&[RemoteMemory]> {
        for (i, m) in regions.iter().enumerate() {
            self.check_shareable(i, m)?;
        }
        let mine = Regions(regions.iter().map(|m| m.remote()).collect());
        self.peer_regions = self.ctrl.exchange_regions(&mine)?.0;
        Ok(&self.peer_regions)
    }

    /// Whether region `i` can serve the peer through this connection (see
    /// [`RawConn::exchange_memory`]).
    fn check_shareable(&self, i: usize, m: &Mr) -> Result<()> {
        if m.pd().as_raw() != self.pd.as_raw() {
            return Err(NetError::InvalidArgument(format!(
                "exchange_memory: region {i} is registered on another protection domain than \
                 the connection's"
            )));
        }
        let usable = [
            AccessFlags::REMOTE_WRITE,
            AccessFlags::REMOTE_READ,
            AccessFlags::REMOTE_ATOMIC,
        ]
        .into_iter()
        .any(|f| m.access().contains(f) && self.remote_access.contains(f));
        if !usable {
            return Err(NetError::InvalidArgument(format!(
                "exchange_memory: region {i} (access {:?}) allows no remote operation that \
                 the connection grants (RawOptions::remote_access {:?}): the peer's one-sided \
                 requests to it would fail on the peer's side",
                m.access(),
                self.remote_access
            )));
        }
        Ok(())
    }

    /// The peer's memory descriptors, in the order the peer shared them.
    pub fn peer_regions(&self) -> &[RemoteMemory] {
        &self.peer_regions
    }

    /// The peer's first shared region.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] when the peer shared none.
    pub fn peer_region(&self) -> Result<RemoteMemory> {
        self.peer_regions
            .first()
            .copied()
            .ok_or_else(|| NetError::InvalidArgument("the peer shared no memory".into()))
    }

    /// A barrier over the control channel: returns once the peer has called `sync` as often.
    /// A `sync` that timed out may be called again: it goes on waiting for the same step
    /// (it sent its side already), so both ends stay in step.
    ///
    /// # Errors
    /// The control channel's errors (a dead peer gives [`NetError::PeerClosed`];
    /// [`NetError::Timeout`] after [`RawOptions::timeout`]).
    pub fn sync(&mut self) -> Result<()> {
        let step = match self.sync_waiting.take() {
            Some(step) => step,
            None => {
                let step = self.sync_step;
                self.sync_step += 1;
                self.ctrl.barrier_send(step)?;
                step
            }
        };
        match self.ctrl.barrier_wait(step) {
            Err(e @ NetError::Timeout { .. }) => {
                self.sync_waiting = Some(step);
                Err(e)
            }
            r => r,
        }
    }

    /// Posts one send-queue request.
    ///
    /// Reap completions ([`RawConn::poll_send`]) as you post: at most the send depth of
    /// signaled requests may wait unreaped (the send CQ's room), past which a post is refused
    /// as a full send queue refuses it, so that no completion is ever lost to an overrun CQ.
    ///
    /// # Safety
    /// As [`rsrdma::Qp::post_send`].
    ///
    /// # Errors
    /// As [`rsrdma::Qp::post_send`]: [`rsrdma::Error::Post`] with `ENOMEM` when the send
    /// queue, or the room for unreaped signaled completions, is full.
    #[inline]
    pub unsafe fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        let signaled = u32::from(wr.is_signaled());
        // (An unsignaled request makes no completion: no room to take, no atomic.)
        if signaled == 1 && self.take_batch_room(std::slice::from_ref(wr)) == 0 {
            return Err(self.no_signal_room(0, 1));
        }
        let r = if self.new_post_send {
            // SAFETY: the caller's contract is the QP's.
            unsafe { self.post_new(std::slice::from_ref(wr)) }
        } else {
            // SAFETY: the caller's contract is the QP's.
            unsafe { self.qp.post_send(wr) }.map_err(NetError::from)
        };
        if r.is_err() {
            self.unreaped.fetch_sub(signaled, Ordering::Relaxed);
        }
        r
    }

    /// The refusal of request `index` of `count` for want of room for its completion.
    fn no_signal_room(&self, index: usize, count: usize) -> NetError {
        NetError::Verbs(rsrdma::Error::Post {
            op: "ibv_post_send (RawConn: reap the send completions first)",
            index,
            count,
            errno: libc::ENOMEM,
        })
    }

    /// Takes what the send CQ handed out since the last look (through any handle) off
    /// [`RawConn::unreaped`]; whether there was any.
    fn take_reaped(&self) -> bool {
        let polled = self.send_cq.polled();
        // The largest count seen wins: two threads that read the count in either order take
        // off exactly what came between, once.
        let seen = self.reaped_seen.fetch_max(polled, Ordering::Relaxed);
        let n = polled.saturating_sub(seen);
        if n == 0 {
            return false;
        }
        // Flushes of unsignaled requests come back too: never below zero.
        let _ = self
            .unreaped
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(u32::try_from(n).unwrap_or(u32::MAX)))
            });
        true
    }

    /// Posts a list of send requests with one FFI call; on failure the error names the first
    /// request not posted. With [`RawOptions::new_post_send`], one batch of the extended API
    /// (one `ibv_wr_complete`): a request it refuses leaves the whole list unposted.
    ///
    /// # Safety
    /// As [`rsrdma::Qp::post_send_batch`].
    ///
    /// # Errors
    /// As [`rsrdma::Qp::post_send_batch`] ([`rsrdma::WrBatch::post`] and
    /// [`rsrdma::WrBatch::complete`] on the extended path).
    #[inline]
    pub unsafe fn post_send_batch(&self, wrs: &mut [SendWr<'_>]) -> Result<()> {
        let count = wrs.len();
        // As many as the room for unreaped completions takes, from the first: the rest are
        // refused from the first that does not fit, as a full send queue refuses them.
        let fit = self.take_batch_room(wrs);
        let r = if fit == 0 {
            Ok(())
        } else if self.new_post_send {
            // SAFETY: the caller's contract is the QP's.
            unsafe { self.post_new(&wrs[..fit]) }
        } else {
            // SAFETY: the caller's contract is the QP's.
            unsafe { self.qp.post_send_batch(&mut wrs[..fit]) }.map_err(NetError::from)
        };
        if let Err(e) = r {
            // The provider posted those before the one it refused (the extended path all or
            // none; none for another error): the rest never will complete.
            let posted = match &e {
                NetError::Verbs(rsrdma::Error::Post { index, .. }) if !self.new_post_send => {
                    (*index).min(fit)
                }
                _ => 0,
            };
            self.unreaped
                .fetch_sub(signaled_in(&wrs[posted..fit]), Ordering::Relaxed);
            return Err(e);
        }
        if fit < count {
            return Err(self.no_signal_room(fit, count));
        }
        Ok(())
    }

    /// Counts the signaled requests of the longest prefix of `wrs` that the room for
    /// unreaped completions takes, and returns its length. Short of room, it first takes off
    /// what was reaped since the last look ([`RawConn::take_reaped`]: not on every post, so
    /// a post that has room costs no look at the CQ's count).
    fn take_batch_room(&self, wrs: &[SendWr<'_>]) -> usize {
        let fit = self.take_room(wrs);
        if fit == wrs.len() || !self.take_reaped() {
            return fit;
        }
        fit + self.take_room(&wrs[fit..])
    }

    /// [`RawConn::take_batch_room`] against the count as it stands.
    fn take_room(&self, wrs: &[SendWr<'_>]) -> usize {
        let mut fit = 0;
        let _ = self
            .unreaped
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                let mut taken = n;
                fit = wrs
                    .iter()
                    .position(|w| {
                        taken += u32::from(w.is_signaled());
                        taken > self.signal_limit
                    })
                    .unwrap_or(wrs.len());
                Some(n + signaled_in(&wrs[..fit]))
            });
        fit
    }

    /// Posts `wrs` as one batch of the extended API.
    ///
    /// # Safety
    /// As [`rsrdma::WrBatch::post`], for each request.
    unsafe fn post_new(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        let mut batch = self.qp.wr_batch()?;
        for wr in wrs {
            // SAFETY: the caller's contract.
            unsafe { batch.post(wr) }?;
        }
        Ok(batch.complete()?)
    }

    /// Posts one receive request.
    ///
    /// # Safety
    /// As [`rsrdma::Qp::post_recv`].
    ///
    /// # Errors
    /// As [`rsrdma::Qp::post_recv`].
    #[inline]
    pub unsafe fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        // SAFETY: the caller's contract is the QP's.
        Ok(unsafe { self.qp.post_recv(wr) }?)
    }

    /// Polls the send completion queue into `wcs`, returning how many arrived.
    ///
    /// # Errors
    /// As [`rsrdma::Cq::poll`].
    #[inline]
    pub fn poll_send(&self, wcs: &mut [Wc]) -> Result<usize> {
        Ok(self.send_cq.poll(wcs)?)
    }

    /// Polls the receive completion queue into `wcs`.
    ///
    /// # Errors
    /// As [`rsrdma::Cq::poll`].
    #[inline]
    pub fn poll_recv(&self, wcs: &mut [Wc]) -> Result<usize> {
        Ok(self.recv_cq.poll(wcs)?)
    }

    /// Sends `iters` requests built by `make_wr(id)`, keeping `depth` signaled requests in
    /// flight and posting one more per completion (one FFI call per request). `depth` is cut
    /// to what the peer can receive (the settled send depth), the queue pair's send queue and
    /// the send CQ's capacity.
    ///
    /// # Safety
    /// Every request `make_wr` returns must satisfy [`rsrdma::Qp::post_send`]'s contract; a
    /// buffer may be reused once the completion with its id (or a later one) was reaped. The
    /// run takes the send CQ's completions as its own: reap the signaled requests you posted
    /// yourself first (one it can tell is not its own fails the run, as below).
    ///
    /// A run that fails leaves nothing in flight: before it returns its error, the queue pair
    /// is moved to ERROR and every request still posted (this run's and any other) is reaped
    /// as flushed, so every buffer is free again. The connection's data plane is then over:
    /// a later run returns [`NetError::Closed`] (a run that counted an earlier run's late
    /// completions as its own could return while its own requests were still in flight).
    ///
    /// # Errors
    /// A failed completion ([`rsrdma::Error::WorkCompletion`]; when the peer's control channel
    /// has ended by then, the peer's leaving instead, as below); [`NetError::Timeout`] when
    /// nothing completes for [`RawOptions::timeout`] (at most 5 s); [`NetError::PeerClosed`]
    /// when the peer is gone ([`NetError::PeerAborted`] with its reason when it aborted);
    /// [`NetError::Closed`] after an earlier run failed; [`NetError::InvalidArgument`] for a
    /// depth of 0, a batch over the depth as cut above (naming each bound), or a completion
    /// the run did not post.
    pub unsafe fn pipeline<'a>(
        &mut self,
        iters: u64,
        depth: u32,
        make_wr: impl FnMut(u64) -> SendWr<'a>,
    ) -> Result<RunStats> {
        // SAFETY: forwarded contract.
        unsafe { self.run_pipeline(iters, depth, 1, make_wr) }
    }

    /// As [`RawConn::pipeline`], but refills in batches of at least `batch` requests, each
    /// list posted with one FFI call (one doorbell where the provider batches), and signals
    /// only the last request of each list (selective signaling, as perftest's CQ moderation):
    /// its completion accounts for the whole list. The pipeline sets each request's `wr_id` to
    /// its sequence number.
    ///
    /// # Safety
    /// As [`RawConn::pipeline`].
    ///
    /// # Errors
    /// As [`RawConn::pipeline`].
    pub unsafe fn pipeline_batch<'a>(
        &mut self,
        iters: u64,
        depth: u32,
        batch: u32,
        make_wr: impl FnMut(u64) -> SendWr<'a>,
    ) -> Result<RunStats> {
        // SAFETY: forwarded contract.
        unsafe { self.run_pipeline(iters, depth, batch.max(1), make_wr) }
    }

    unsafe fn run_pipeline<'a>(
        &mut self,
        iters: u64,
        depth: u32,
        batch: u32,
        make_wr: impl FnMut(u64) -> SendWr<'a>,
    ) -> Result<RunStats> {
        self.check_not_stopped("pipeline")?;
        // Every request in flight may come back as a completion before the next poll, so
        // the depth also stays within the send CQ (a provider may round the queue pair's
        // depth up past the CQ's; an overrun CQ breaks the queue pair).
        if depth == 0 {
            return Err(NetError::InvalidArgument(
                "a pipeline's depth must be at least 1".into(),
            ));
        }
        let asked = depth;
        let depth = depth
            .min(self.settled.send_depth)
            .min(self.qp.caps().max_send_wr)
            .min(self.send_cq.capacity())
            .min(self.signal_limit);
        if batch > depth {
            return Err(NetError::InvalidArgument(format!(
                "batch {batch} exceeds the pipeline's depth {depth} (the least of the depth \
                 asked for, {asked}, the settled send depth, {}, the send queue's, {}, and the \
                 send CQ's, {})",
                self.settled.send_depth,
                self.qp.caps().max_send_wr,
                self.send_cq.capacity()
            )));
        }
        // SAFETY: forwarded contract.
        let r = unsafe { self.run_pipeline_posting(iters, depth, batch, make_wr) };
        if r.is_err() {
            self.stop_after_failed_run();
        }
        r.map_err(|e| self.explain_failed_run(e))
    }

    /// A run's error as the caller should see it: a failed completion (`RETRY_EXC_ERR`, a
    /// flush) while the peer's control channel has ended says that the peer is gone, with
    /// its own reason when it gave one, rather than the completion's status.
    fn explain_failed_run(&mut self, e: NetError) -> NetError {
        if !matches!(e, NetError::Verbs(rsrdma::Error::WorkCompletion { .. })) {
            return e;
        }
        match self.ctrl.peer_ended("the data transfer") {
            Ok(Some(ended)) => {
                tracing::debug!(completion = %e, "raw connection: a run failed as its peer left");
                ended
            }
            _ => e,
        }
    }

    /// Refuses a run once an earlier one failed (see [`RawConn::pipeline`]).
    fn check_not_stopped(&self, op: &'static str) -> Result<()> {
        if self.stopped {
            return Err(NetError::Closed { op });
        }
        Ok(())
    }

    /// After a failed run: moves the queue pair to ERROR and reaps both CQs until every
    /// request still posted has come back flushed (quiet for 50 ms after the last one),
    /// within 2 s. The caller's buffers are then free, whatever the run left in flight.
    fn stop_after_failed_run(&mut self) {
        self.stopped = true;
        if let Err(e) = self.qp.to_error() {
            tracing::warn!(error = %e, "raw connection: moving the QP to ERROR after a failed run");
        }
        let mut wcs = [Wc::default(); 32];
        let limit = Instant::now() + Duration::from_secs(2);
        let mut last = Instant::now();
        loop {
            let got =
                self.send_cq.poll(&mut wcs).unwrap_or(0) + self.recv_cq.poll(&mut wcs).unwrap_or(0);
            let now = Instant::now();
            if got > 0 {
                last = now;
            } else if now.duration_since(last) >= Duration::from_millis(50) || now >= limit {
                return;
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The pipeline's loop (see [`RawConn::run_pipeline`]).
    ///
    /// # Safety
    /// As [`RawConn::pipeline`].
    unsafe fn run_pipeline_posting<'a>(
        &mut self,
        iters: u64,
        depth: u32,
        batch: u32,
        mut make_wr: impl FnMut(u64) -> SendWr<'a>,
    ) -> Result<RunStats> {
        const BATCH_MAX: usize = 64;
        let mut p = Pipeline::new(iters, depth, batch.min(BATCH_MAX as u32));
        let mut stats = RunStats::default();
        let mut wcs = [Wc::default(); 32];
        // Built in place and posted with one call per chunk: no allocation on the hot path.
        let mut list: [SendWr<'a>; BATCH_MAX] = [SendWr::send(0, &[]); BATCH_MAX];
        let probe = self.probe;
        let (mut post_t, mut poll_t) = (Duration::ZERO, Duration::ZERO);
        let start = Instant::now();
        let mut watch = StallWatch::new(start, self.stall_limit);
        while !p.done() {
            let ids = p.next_ids();
            if !ids.is_empty() {
                let t = probe.then(Instant::now);
                if batch == 1 {
                    for id in ids.clone() {
                        let wr = make_wr(id).signaled(true);
                        stats.bytes += wr.payload_len();
                        // SAFETY: the caller vouches for every request make_wr builds.
                        unsafe { self.post_send(&wr) }?;
                        stats.post_calls += 1;
                    }
                } else {
                    for chunk_start in ids.clone().step_by(BATCH_MAX) {
                        let chunk_end = (chunk_start + BATCH_MAX as u64).min(ids.end);
                        let n = (chunk_end - chunk_start) as usize;
                        // Selective signaling: only the list's last request asks for a
                        // completion, which (send queues complete in order) accounts for
                        // the whole list.
                        for (slot, id) in list.iter_mut().zip(chunk_start..chunk_end) {
                            let mut wr = make_wr(id).signaled(id + 1 == chunk_end);
                            wr.set_wr_id(id);
                            *slot = wr;
                            stats.bytes += slot.payload_len();
                        }
                        // SAFETY: as above.
                        unsafe { self.post_send_batch(&mut list[..n]) }?;
                        stats.post_calls += 1;
                    }
                }
                p.posted(ids.end - ids.start);
                if let Some(t) = t {
                    post_t += t.elapsed();
                }
            }
            let t = probe.then(Instant::now);
            let n = self.send_cq.poll(&mut wcs)?;
            if let Some(t) = t {
                poll_t += t.elapsed();
            }
            stats.poll_calls += 1;
            for wc in &wcs[..n] {
                wc.ok()?;
                // Per-WR mode: each completion is one request. Batch mode: a completion
                // covers every request up to its id.
                let done = if batch == 1 {
                    1
                } else if (p.completed_count()..p.posted_count()).contains(&wc.wr_id()) {
                    wc.wr_id() + 1 - p.completed_count()
                } else {
                    0
                };
                // A completion the run did not post (one of the caller's own, not reaped
                // before the run): counted as the run's, it would end the run while its own
                // requests are still in flight, with their buffers in use.
                if done == 0 || p.in_flight() < done {
                    return Err(NetError::InvalidArgument(format!(
                        "a send completion this run did not post (wr_id {}): reap your own \
                         requests before a run",
                        wc.wr_id()
                    )));
                }
                p.completed(done);
            }
            watch.polled(n, self)?;
        }
        stats.elapsed = start.elapsed();
        stats.completed = p.completed_count();
        if probe {
            stats.post_time = Some(post_t);
            stats.poll_time = Some(poll_t);
        }
        Ok(stats)
    }

    /// The receiving side of a send pipeline: keeps `depth` receives posted (built by
    /// `make_wr(id)`), reposting one per completion, until `iters` have arrived.
    ///
    /// # Safety
    /// Every request `make_wr` returns must satisfy [`rsrdma::Qp::post_recv`]'s contract; a
    /// receive buffer may be read once the completion with its id was reaped. The drain takes
    /// the receive CQ's completions as its own: reap the receives you posted yourself first.
    ///
    /// A drain that fails leaves nothing in flight, as a failed [`RawConn::pipeline`]: the
    /// queue pair is stopped and its requests reaped before the error returns.
    ///
    /// # Errors
    /// A failed completion; [`NetError::PeerClosed`] when the peer is gone (checked while
    /// idle, so a dead sender is noticed within seconds, not never; [`NetError::PeerAborted`]
    /// with its reason when it aborted); [`NetError::Timeout`]
    /// when nothing arrives for [`RawOptions::timeout`] (at most 5 s); [`NetError::Closed`]
    /// after an earlier run failed; [`NetError::InvalidArgument`] for more completions than
    /// the drain has receives posted.
    pub unsafe fn recv_drain<'a>(
        &mut self,
        iters: u64,
        depth: u32,
        make_wr: impl FnMut(u64) -> RecvWr<'a>,
    ) -> Result<RunStats> {
        self.check_not_stopped("recv_drain")?;
        // SAFETY: forwarded contract.
        let r = unsafe { self.recv_drain_posting(iters, depth, make_wr) };
        if r.is_err() {
            self.stop_after_failed_run();
        }
        r.map_err(|e| self.explain_failed_run(e))
    }

    /// The drain's loop (see [`RawConn::recv_drain`]).
    ///
    /// # Safety
    /// As [`RawConn::recv_drain`].
    unsafe fn recv_drain_posting<'a>(
        &mut self,
        iters: u64,
        depth: u32,
        mut make_wr: impl FnMut(u64) -> RecvWr<'a>,
    ) -> Result<RunStats> {
        // Within the receive CQ too, as the pipeline's depth is within the send CQ.
        let depth = depth
            .min(self.qp.caps().max_recv_wr)
            .min(self.recv_cq.capacity())
            .max(1);
        let mut p = Pipeline::new(iters, depth, 1);
        let mut stats = RunStats::default();
        let mut wcs = [Wc::default(); 32];
        let start = Instant::now();
        let mut first = None;
        let mut watch = StallWatch::new(start, self.stall_limit);
        while !p.done() {
            let ids = p.next_ids();
            for id in ids.clone() {
                // SAFETY: the caller vouches for every request make_wr builds.
                unsafe { self.qp.post_recv(&make_wr(id)) }?;
                stats.post_calls += 1;
            }
            p.posted(ids.end - ids.start);
            let n = self.recv_cq.poll(&mut wcs)?;
            stats.poll_calls += 1;
            for wc in &wcs[..n] {
                wc.ok()?;
                stats.bytes += u64::from(wc.byte_len());
            }
            if n > 0 {
                // Receives the run did not post (the caller's own, posted before it): as for
                // sends, they would end the run with its own receives still posted.
                if p.in_flight() < n as u64 {
                    return Err(NetError::InvalidArgument(
                        "receive completions this run did not post: reap your own receives \
                         before a drain"
                            .into(),
                    ));
                }
                first.get_or_insert_with(Instant::now);
                p.completed(n as u64);
            }
            watch.polled(n, self)?;
        }
        stats.elapsed = first.map_or(Duration::ZERO, |f| f.elapsed());
        stats.completed = p.completed_count();
        Ok(stats)
    }

    /// Whether the peer's end of the control channel is still open: false once it closed the
    /// socket, sent a close notice or aborted. Never blocks; messages that arrived meanwhile
    /// are queued for the calls that want them.
    ///
    /// # Errors
    /// The errors of [`Channel::read_available`] (garbage from the peer, a socket error).
    pub fn peer_alive(&mut self) -> Result<bool> {
        self.ctrl.peer_open()
    }

    /// Closes in step with the peer: a barrier (so neither side tears down while the other
    /// still has work in flight toward it), then the QP moves to ERROR, the completions
    /// already there are reaped, and everything is destroyed (the QP first: once it is gone
    /// the NIC touches none of its requests' memory, flushed or not).
    ///
    /// # Errors
    /// The barrier's errors (the resources are released either way).
    pub fn close(mut self) -> Result<()> {
        // A sync that timed out: the peer's side of its step comes first.
        let r = match self.sync_waiting.take() {
            Some(step) => self.ctrl.barrier_wait(step),
            None => Ok(()),
        };
        let r = r.and_then(|()| self.ctrl.barrier(crate::handshake::CLOSE_STEP));
        let _ = self.qp.to_error();
        let mut wcs = [Wc::default(); 32];
        while matches!(self.send_cq.poll(&mut wcs), Ok(n) if n > 0) {}
        while matches!(self.recv_cq.poll(&mut wcs), Ok(n) if n > 0) {}
        r
    }

    /// The queue pair.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The send completion queue. Poll it directly (`poll`, `poll_blocking`, `wait`) or
    /// through [`RawConn::poll_send`]: either way what is reaped makes room for new
    /// signaled requests ([`RawConn::post_send`]).
    pub fn send_cq(&self) -> &Cq {
        &self.send_cq
    }

    /// The receive completion queue.
    pub fn recv_cq(&self) -> &Cq {
        &self.recv_cq
    }

    /// The protection domain (the shared one of [`RawOptions::pd`], if given).
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The send CQ's completion channel ([`Completion::Event`] only).
    pub fn send_channel(&self) -> Option<&CompChannel> {
        self.send_cq.comp_channel()
    }

    /// The receive CQ's completion channel ([`Completion::Event`] only).
    pub fn recv_channel(&self) -> Option<&CompChannel> {
        self.recv_cq.comp_channel()
    }

    /// The control channel; its fd ([`std::os::fd::AsFd`]) can join an event loop.
    pub fn channel(&self) -> &Channel {
        &self.ctrl
    }

    /// The control channel, to read what arrived ([`Channel::read_available`]), send
    /// keepalives or take queued messages. Barriers sent through it directly do not advance
    /// the step [`RawConn::sync`] uses.
    pub fn channel_mut(&mut self) -> &mut Channel {
        &mut self.ctrl
    }

    /// The peer's endpoint as it sent it.
    pub fn peer_endpoint(&self) -> &Endpoint {
        &self.peer
    }

    /// What both sides settled on.
    pub fn settled(&self) -> &Settled {
        &self.settled
    }
}

/// Notices, while a loop waits for completions, a peer that is gone or a wait that has gone
/// on too long. The checks cost a non-blocking socket read, so they run only every 4096 empty
/// polls.
struct StallWatch {
    last_progress: Instant,
    idle_polls: u32,
    limit: Duration,
}

impl StallWatch {
    fn new(start: Instant, limit: Duration) -> Self {
        StallWatch {
            last_progress: start,
            idle_polls: 0,
            limit,
        }
    }

    /// Records a poll that found `n` completions.
    fn polled(&mut self, n: usize, conn: &mut RawConn) -> Result<()> {
        if n > 0 {
            self.idle_polls = 0;
            self.last_progress = Instant::now();
            return Ok(());
        }
        self.idle_polls += 1;
        if self.idle_polls % 4096 != 0 {
            return Ok(());
        }
        // The peer's own reason when it gave one (an abort, a tampered channel), not only
        // that it is gone.
        if let Some(ended) = conn.ctrl.peer_ended("the data transfer")? {
            return Err(ended);
        }
        if self.last_progress.elapsed() > self.limit {
            return Err(NetError::Timeout {
                op: "waiting for a completion",
                millis: crate::deadline::whole_millis(self.limit),
            });
        }
        Ok(())
    }
}

fn random_psn() -> Result<u32> {
    let n = crate::handshake::auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
    Ok(u32::from_be_bytes([0, n[0], n[1], n[2]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options that cannot work are refused before any socket or verb: a zero timeout failed
    /// inside the connect with an I/O error and timed every listener handshake out at once;
    /// a zero send depth made a queue pair that could not send (ENOMEM at the first post).
    #[test]
    fn zero_timeouts_and_depths_are_refused() {
        for opts in [
            RawOptions::default().timeout(Duration::ZERO),
            RawOptions::default().send_depth(0),
            RawOptions::default().recv_depth(0),
        ] {
            let e = check_options(&opts).unwrap_err();
            assert!(matches!(e, NetError::InvalidArgument(_)), "{e:?}");
        }
        assert!(check_options(&RawOptions::default()).is_ok());
    }
}
