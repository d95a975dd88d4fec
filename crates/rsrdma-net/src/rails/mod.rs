//! Striped connections: one message stream over several [`Conn`]s ("rails": queue pairs on
//! one device, or on several devices), that goes on when rails fail.
//!
//! [`RailConn::dial`] opens `rails` connections to a [`RailListener`], each with its own
//! options (so each may name its device: one rail per NIC), and says on each which connection
//! and which rail it is; the listener groups them and answers once every rail joined. Messages
//! then go as stripes ([`rsrdma_proto::rails`], the protocol core): a message larger than a
//! stripe is cut and its stripes go on whichever rail takes them first, small messages spread
//! over the rails, and the receiver puts them back in order. Each end keeps what it sent until
//! the other confirms it read it, so when a rail fails (its queue pair errors, its peer stops
//! answering) what it carried goes again on the others and nothing is lost or duplicated; the
//! connection fails only when every rail failed. [`RailConn::counters`] and `tracing` report
//! lost rails.
//!
//! This first form runs over whole `Conn`s: each rail has its own credits, keepalive and
//! failure detection, a thread reads each rail, and one thread sends every stripe (a rail's
//! send may wait for its peer's credits: no caller waits for that past its own timeout, as
//! `send_msg` only hands its message to the core, which keeps it until the peer confirms
//! it). Each rail's handshake offers the rails
//! feature: a plain `Conn` at the other end does not, and the striped end then talks to it
//! over that one connection, as a plain connection ([`RailConn::is_striped`] says false). The
//! wire format is section 9 of `docs/conn-protocol.md`.

mod hello;

use crate::conn::{Conn, ConnOptions, Listener};
use crate::error::{NetError, Result};
use hello::Hello;
use rsrdma_proto::rails::{RailCounters, Rails, RailsConfig, STRIPE_HEADER_LEN};
use rsrdma_proto::{ProtoError, Step};
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a striped connection is made and what it proposes.
#[derive(Debug, Clone)]
pub struct RailOptions {
    /// One entry per rail: its connection's options (its device, establishment path, poll
    /// mode...). At least 1, at most 16.
    pub rails: Vec<ConnOptions>,
    /// The most bytes of a message one stripe carries. Default 64 KiB. Keep it below the
    /// rails' rendezvous threshold: a stripe is one message on its rail.
    pub stripe_size: u32,
    /// The most bytes sent and not confirmed read by the peer (a message larger than the
    /// window goes alone). The peer holds at most `window + max_message` bytes of messages
    /// that arrived ahead of its reader. Default 8 MiB.
    pub window: usize,
    /// The largest message. Default 16 MiB.
    pub max_message: u32,
    /// How long a rail's hello, and the whole set of rails, may take. Default 10 s.
    pub join_timeout: Duration,
    /// Where each rail dials, by rail: an address of the listener's host on the network of
    /// that rail's NIC (on the rdma_cm path the address picks the device, so rails on
    /// several NICs name one address each, and the listener binds the unspecified
    /// address). Rails past its end (all of them, when it is empty) dial the address given
    /// to [`RailConn::dial`]. Default empty.
    pub addrs: Vec<SocketAddr>,
}

impl RailOptions {
    /// `rails` rails, each with `conn`'s options.
    pub fn new(conn: ConnOptions, rails: usize) -> RailOptions {
        RailOptions {
            rails: vec![conn; rails],
            stripe_size: 64 * 1024,
            window: 8 << 20,
            max_message: 16 << 20,
            join_timeout: Duration::from_secs(10),
            addrs: Vec::new(),
        }
    }

    /// One rail per device named, each with `conn`'s other options.
    pub fn on_devices<S: Into<String>>(
        conn: ConnOptions,
        devices: impl IntoIterator<Item = S>,
    ) -> RailOptions {
        let rails: Vec<ConnOptions> = devices
            .into_iter()
            .map(|d| ConnOptions {
                device: Some(d.into()),
                ..conn.clone()
            })
            .collect();
        RailOptions {
            rails,
            ..RailOptions::new(conn, 0)
        }
    }

    fn config(&self) -> Result<RailsConfig> {
        let cfg = RailsConfig {
            rails: self.rails.len(),
            stripe_size: self.stripe_size,
            window: self.window,
            max_message: self.max_message,
        };
        cfg.check().map_err(|e| {
            NetError::InvalidArgument(format!("RailOptions, {} rails: {e}", self.rails.len()))
        })?;
        // The hello carries the window in 32 bits.
        if self.window > u32::MAX as usize {
            return Err(NetError::InvalidArgument(
                "RailOptions: a window of at most 4 GiB".into(),
            ));
        }
        if self.join_timeout.is_zero() {
            return Err(NetError::InvalidArgument(
                "RailOptions: join_timeout must not be zero".into(),
            ));
        }
        // A stripe is one message on its rail.
        if let Some((i, o)) = self
            .rails
            .iter()
            .enumerate()
            .find(|(_, o)| !fits_rail(self.stripe_size, o.max_message))
        {
            return Err(NetError::InvalidArgument(format!(
                "RailOptions: a stripe of {} bytes and its {STRIPE_HEADER_LEN}-byte header do not \
                 fit rail {i}'s max_message ({})",
                self.stripe_size, o.max_message
            )));
        }
        Ok(cfg)
    }
}

/// Whether a stripe of `stripe_size` bytes, with its header, is one message of at most
/// `max_message` bytes.
fn fits_rail(stripe_size: u32, max_message: u32) -> bool {
    u64::from(stripe_size) + STRIPE_HEADER_LEN as u64 <= u64::from(max_message)
}

/// The largest stripe every rail of `rails` carries as one message (each rail's settled
/// `max_message`, less the header).
fn stripe_limit(rails: &[Conn]) -> u32 {
    rails
        .iter()
        .map(|c| c.info().settled.max_message)
        .min()
        .unwrap_or(0)
        .saturating_sub(STRIPE_HEADER_LEN as u32)
}

/// When a wait ends (clamped: `Duration::MAX` means no practical limit), and the limit the
/// caller gave, for its time-out error.
#[derive(Clone, Copy)]
struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    fn within(limit: Option<Duration>) -> Option<Deadline> {
        limit.map(|limit| Deadline {
            at: crate::deadline::deadline_after(limit),
            limit,
        })
    }

    /// The caller's limit, for a time-out's message.
    fn millis(&self) -> u64 {
        u64::try_from(self.limit.as_millis()).unwrap_or(u64::MAX)
    }
}

/// The least linger a rail's close gets once the striped connection's own is spent: a
/// healthy peer's FIN is through in far less.
const RAIL_CLOSE_FLOOR: Duration = Duration::from_millis(50);

/// How long a read of a failed striped connection waits for the readers of its failed rails
/// to hand over what their rails had received whole, before it reports the failure.
const FATAL_READ_GRACE: Duration = Duration::from_secs(1);

/// What both ends share of a striped connection.
struct Shared {
    rails: Vec<Conn>,
    /// How long `close` waits for the peer to confirm what was sent (the first rail's
    /// `linger`).
    linger: Duration,
    state: Mutex<State>,
    changed: Condvar,
    /// Wakes the writer thread: the core may have a stripe to send, or the connection ends.
    to_send: Condvar,
}

struct State {
    core: Rails,
    /// Per rail: the peer closed it, or it failed.
    over: Vec<bool>,
    /// Per rail: a send found the peer gone (its FIN came and it left). Nothing more is sent
    /// on it, but it is over only once its reader read the end of it: the stripes that came
    /// before the FIN (a confirmation above all) are handed over first.
    send_gone: Vec<bool>,
    /// The connection failed (every rail failed, or the peer broke the protocol).
    fatal: Option<ProtoError>,
    /// A read returned `fatal`: every later read returns it too (no message after the
    /// error).
    fatal_reported: bool,
    /// Rails whose reader still runs: a failed rail's reader may still hand over stripes
    /// its rail had received whole, which may complete a message.
    readers: usize,
    /// Every rail is over and the last one ended with the peer's close: what arrived whole
    /// is still read, but nothing sent from now on reaches anyone.
    peer_closed: bool,
    /// `close` ran (rail failures from then on are its own doing).
    closing: bool,
    /// A rail ended with the peer's close (the peer closes its rails only in its `close`).
    peer_closed_a_rail: bool,
    /// Where the next stripe goes first (round robin over the rails).
    next_rail: usize,
    /// The writer is sending a stripe.
    sending: bool,
    /// The writer waits for a stripe to send (a busy writer needs no wake-up: it looks at
    /// the core again after each send).
    writer_waits: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

/// A striped connection (see the module docs).
pub struct RailConn {
    inner: Inner,
    peer: SocketAddr,
}

enum Inner {
    /// The peer is a plain `Conn`: one connection, no stripes.
    Plain(Box<Conn>),
    Striped {
        shared: Arc<Shared>,
        /// The rails' readers and the writer, joined by `close` (or the drop).
        threads: Vec<JoinHandle<()>>,
    },
}

impl std::fmt::Debug for RailConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RailConn")
            .field("rails", &self.rails())
            .field("striped", &self.is_striped())
            .field("peer", &self.peer)
            .finish()
    }
}

/// Whether the two ends of `c` settled the rails feature (the peer is a striped end too).
fn speaks_rails(c: &Conn) -> bool {
    c.info().settled.features & rsrdma_proto::FEATURE_RAILS != 0
}

/// `o` offering the rails feature.
fn offering(o: &ConnOptions) -> ConnOptions {
    ConnOptions {
        offer_rails: true,
        ..o.clone()
    }
}

impl RailConn {
    /// Opens the rails to the [`RailListener`] at `addr`, one per entry of `opts.rails`, and
    /// waits for the listener's answer.
    ///
    /// # Errors
    /// A rail's [`Conn::dial`] error; [`NetError::Unexpected`] when the other end is no
    /// striped connection; [`NetError::Timeout`] when it does not answer in time.
    pub fn dial(addr: impl ToSocketAddrs, opts: RailOptions) -> Result<RailConn> {
        let cfg = opts.config()?;
        let addr = addr
            .to_socket_addrs()
            .map_err(|e| NetError::io("resolve the listener's address", e))?
            .next()
            .ok_or_else(|| NetError::InvalidArgument("no address to dial".into()))?;
        let id = random_id()?;
        let mut rails = Vec::with_capacity(cfg.rails);
        for (i, o) in opts.rails.iter().enumerate() {
            let c = Conn::dial(opts.addrs.get(i).copied().unwrap_or(addr), offering(o))?;
            if i == 0 && !speaks_rails(&c) {
                // A plain listener: one plain connection.
                return Ok(RailConn {
                    inner: Inner::Plain(Box::new(c)),
                    peer: addr,
                });
            }
            // A later rail that reached a plain listener (`RailOptions::addrs`): refused at
            // once, its application sent nothing (an outside tester's find: it got the
            // rail's hello as a message, and the dial waited out `join_timeout`).
            if !speaks_rails(&c) {
                return Err(NetError::Unexpected {
                    expected: "a striped listener at every rail's address",
                    got: "a plain listener at a later rail's",
                });
            }
            let hello = Hello {
                id,
                rail: i as u8,
                cfg,
            };
            c.send_msg(&hello.encode(false))?;
            rails.push(c);
        }
        rails[0].set_read_timeout(Some(opts.join_timeout))?;
        let answer = rails[0].recv_msg().map_err(|e| match e {
            NetError::Timeout { millis, .. } => NetError::Timeout {
                op: "the listener's answer to a striped connection",
                millis,
            },
            e => e,
        })?;
        rails[0].set_read_timeout(None)?;
        // The listener closes a connection whose rails it refused (no hello within its
        // `join_timeout`, one that does not fit) or that did not all join in time: said so
        // (an outside tester saw only "closed during the striped connection's set-up").
        let answer = answer.ok_or(NetError::PeerClosed(
            "the striped connection's set-up (a listener closes one whose rails it refused or \
             that did not all join within its RailOptions::join_timeout; its log says which)",
        ))?;
        let settled = Hello::decode(&answer, true).map_err(|why| NetError::Unexpected {
            expected: "a striped connection's answer",
            got: why,
        })?;
        if settled.id != id || settled.cfg.rails != cfg.rails {
            return Err(NetError::Unexpected {
                expected: "an answer for this connection and its rails",
                got: "an answer for another connection or rail count",
            });
        }
        if settled.cfg.stripe_size > stripe_limit(&rails) {
            return Err(NetError::Unexpected {
                expected: "a stripe size every rail carries as one message",
                got: "a larger one",
            });
        }
        RailConn::start(rails, settled.cfg, addr, opts.rails[0].linger)
    }

    fn start(
        rails: Vec<Conn>,
        cfg: RailsConfig,
        peer: SocketAddr,
        linger: Duration,
    ) -> Result<RailConn> {
        let n = rails.len();
        let shared = Arc::new(Shared {
            rails,
            linger,
            state: Mutex::new(State {
                core: Rails::new(cfg).map_err(NetError::ConnFailed)?,
                over: vec![false; n],
                send_gone: vec![false; n],
                fatal: None,
                fatal_reported: false,
                readers: n,
                peer_closed: false,
                closing: false,
                next_rail: 0,
                sending: false,
                writer_waits: false,
                peer_closed_a_rail: false,
                read_timeout: None,
                write_timeout: None,
            }),
            changed: Condvar::new(),
            to_send: Condvar::new(),
        });
        let mut threads = Vec::with_capacity(n + 1);
        for thread in 0..=n {
            let s = shared.clone();
            let spawned = if thread < n {
                std::thread::Builder::new()
                    .name(format!("rsrdma-rail{thread}"))
                    .spawn(move || s.read_rail(thread))
            } else {
                std::thread::Builder::new()
                    .name("rsrdma-rails-out".into())
                    .spawn(move || s.write_loop())
            };
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // The threads started end with their rails.
                    shared.lock().closing = true;
                    shared.to_send.notify_all();
                    for c in &shared.rails {
                        let _ = c.close();
                    }
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(NetError::io("start a striped connection's thread", e));
                }
            }
        }
        Ok(RailConn {
            inner: Inner::Striped { shared, threads },
            peer,
        })
    }

    /// Whether the peer is a striped end too (else this is one plain connection).
    pub fn is_striped(&self) -> bool {
        matches!(self.inner, Inner::Striped { .. })
    }

    fn striped(&self) -> std::result::Result<&Arc<Shared>, &Conn> {
        match &self.inner {
            Inner::Striped { shared, .. } => Ok(shared),
            Inner::Plain(c) => Err(c),
        }
    }

    /// Sends one message (copied: kept until the peer confirms it read it). Blocks while the
    /// window is full, up to the write timeout.
    ///
    /// # Errors
    /// [`NetError::MessageTooLarge`]; [`NetError::Timeout`]; [`NetError::ConnFailed`] once
    /// every rail failed; [`NetError::PeerGone`] once the peer closed; [`NetError::Closed`]
    /// after `close`.
    pub fn send_msg(&self, msg: &[u8]) -> Result<()> {
        let sh = match self.striped() {
            Ok(sh) => sh,
            Err(c) => return c.send_msg(msg),
        };
        let mut st = sh.lock();
        let deadline = Deadline::within(st.write_timeout);
        loop {
            if st.closing {
                return Err(NetError::Closed { op: "send_msg" });
            }
            if let Some(e) = &st.fatal {
                return Err(NetError::ConnFailed(e.clone()));
            }
            if st.peer_closed {
                return Err(NetError::PeerGone { op: "send_msg" });
            }
            match st.core.send(msg) {
                Ok(Step::Done(_)) => break,
                Ok(Step::Blocked) => st = sh.wait(st, deadline, "send_msg")?,
                Err(ProtoError::TooLarge { len, max }) => {
                    return Err(NetError::MessageTooLarge { len, max })
                }
                Err(e) => return Err(NetError::ConnFailed(e)),
            }
        }
        let wake = st.writer_waits;
        drop(st);
        if wake {
            sh.to_send.notify_one();
        }
        Ok(())
    }

    /// The next message, in the order sent; `None` once the peer closed and everything it
    /// sent was read. Blocks up to the read timeout.
    ///
    /// # Errors
    /// [`NetError::Timeout`]; [`NetError::ConnFailed`] once every rail failed (or the peer
    /// broke the protocol); [`NetError::PeerClosed`] when the peer closed with a message
    /// only partly delivered; [`NetError::Closed`] after `close`.
    pub fn recv_msg(&self) -> Result<Option<Vec<u8>>> {
        match self.striped() {
            Ok(sh) => sh.recv("recv_msg", |core| Ok(core.recv())),
            Err(c) => c.recv_msg(),
        }
    }

    /// Copies the next message into `buf` (its memory then serves later messages: no
    /// allocation per message); its length, or `None` at the end of the stream.
    ///
    /// # Errors
    /// [`NetError::ShortBuffer`] when `buf` is too short (the message stays); as `recv_msg`.
    pub fn recv_msg_into(&self, buf: &mut [u8]) -> Result<Option<usize>> {
        match self.striped() {
            Ok(sh) => sh.recv("recv_msg_into", |core| core.recv_into(buf)),
            Err(c) => c.recv_msg_into(buf),
        }
    }

    /// Limits how long `recv_msg` waits (`None`: for ever).
    ///
    /// # Errors
    /// As [`Conn::set_read_timeout`]: [`NetError::InvalidArgument`] for a zero duration.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> Result<()> {
        crate::conn::check_timeout(t)?;
        match self.striped() {
            Ok(sh) => sh.lock().read_timeout = t,
            Err(c) => c.set_read_timeout(t)?,
        }
        Ok(())
    }

    /// Limits how long `send_msg` waits for the window (`None`: for ever).
    ///
    /// # Errors
    /// As [`Conn::set_write_timeout`]: [`NetError::InvalidArgument`] for a zero duration.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> Result<()> {
        crate::conn::check_timeout(t)?;
        match self.striped() {
            Ok(sh) => sh.lock().write_timeout = t,
            Err(c) => c.set_write_timeout(t)?,
        }
        Ok(())
    }

    /// Rails still up (a plain connection counts as one).
    pub fn live_rails(&self) -> usize {
        match self.striped() {
            Ok(sh) => sh.lock().core.live_rails(),
            Err(_) => 1,
        }
    }

    /// Rails it was made with (1 with a plain peer).
    pub fn rails(&self) -> usize {
        match self.striped() {
            Ok(sh) => sh.rails.len(),
            Err(_) => 1,
        }
    }

    /// What the striping did: rails lost, stripes sent again, duplicates dropped (all zero
    /// with a plain peer).
    pub fn counters(&self) -> RailCounters {
        match self.striped() {
            Ok(sh) => sh.lock().core.counters(),
            Err(_) => RailCounters::default(),
        }
    }

    /// Rail `rail`'s connection (its info and counters; fault injection in tests).
    pub fn rail(&self, rail: usize) -> Option<&Conn> {
        match self.striped() {
            Ok(sh) => sh.rails.get(rail),
            Err(c) => (rail == 0).then_some(c),
        }
    }

    /// The peer's address (the listener's, on the dialing side).
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Waits until the peer confirmed every message sent (up to `linger`, the first rail's
    /// option), then closes every rail (within what is left of that linger, at least 50 ms
    /// a rail) and joins their readers: against a peer that stopped answering, about the
    /// linger in all.
    ///
    /// # Errors
    /// Only when messages were still unconfirmed (the rails are closed all the same):
    /// [`NetError::Timeout`] after the linger; [`NetError::ConnFailed`] when every rail had
    /// failed; [`NetError::PeerGone`] when the peer had closed.
    pub fn close(mut self) -> Result<()> {
        match &self.inner {
            Inner::Plain(c) => c.close(),
            Inner::Striped { .. } => self.shutdown(),
        }
    }

    fn shutdown(&mut self) -> Result<()> {
        let Inner::Striped { shared, threads } = &mut self.inner else {
            return Ok(());
        };
        let sh = shared.clone();
        let threads = std::mem::take(threads);
        let deadline = Deadline::within(Some(sh.linger));
        let mut result = Ok(());
        {
            let mut st = sh.lock();
            // Until the peer confirmed what this end sent, and the writer sent what this end
            // owes (its confirmations of what it read: the peer's close waits for them).
            while (st.core.unconfirmed() > 0 || st.core.wants_to_send() || st.sending)
                && st.fatal.is_none()
                && !st.peer_closed
                && !st.closing
            {
                match sh.wait(st, deadline, "close (messages not confirmed by the peer)") {
                    Ok(next) => st = next,
                    Err(e) => {
                        st = sh.lock();
                        // Only what the peer did not confirm makes the close fail.
                        if st.core.unconfirmed() > 0 {
                            result = Err(e);
                        }
                        break;
                    }
                }
            }
            if result.is_ok() && st.core.unconfirmed() > 0 {
                if let Some(e) = &st.fatal {
                    result = Err(NetError::ConnFailed(e.clone()));
                } else if st.peer_closed {
                    result = Err(NetError::PeerGone { op: "close" });
                }
            }
        }
        // A rail's close also ends the writer's send on it, if one waits for credits. The
        // rails close within what is left of the linger (at least RAIL_CLOSE_FLOOR each), not
        // a linger each: against a peer that stopped answering, 16 rails took 20 s to close
        // with a linger of 2 s (an outside tester's find).
        stop(&sh, threads, |c| {
            let left = deadline.map_or(sh.linger, |d| {
                d.at.saturating_duration_since(Instant::now())
            });
            let _ = c.close_lingering(left.max(RAIL_CLOSE_FLOOR));
        });
        result
    }
}

/// Marks a striped connection closing, wakes its writer and waiters, ends every rail with
/// `end`, and joins the rails' readers and the writer.
fn stop(sh: &Shared, threads: Vec<JoinHandle<()>>, end: impl Fn(&Conn) + Sync) {
    sh.lock().closing = true;
    sh.changed.notify_all();
    sh.to_send.notify_all();
    // The rails end at once, each on a thread of its own: a rail's close waits for its FIN's
    // delivery and its flush, and one rail after another those waits added up (16 rails
    // whose completions came 300 ms late took 6.7 s to close, against a 2 s linger: an
    // outside tester's find). A thread that cannot be had ends its rail here.
    let end = &end;
    std::thread::scope(|scope| {
        for rail in &sh.rails {
            let spawned = std::thread::Builder::new()
                .name("rsrdma-rail-close".into())
                .spawn_scoped(scope, move || end(rail));
            if spawned.is_err() {
                end(rail);
            }
        }
    });
    for t in threads {
        let _ = t.join();
    }
}

impl RailConn {
    /// Ends a connection no accept handed out (its listener is gone): every rail aborted,
    /// with no FIN and no linger, so its dialer reads an error, not an end-of-stream.
    fn refuse(mut self) {
        match &mut self.inner {
            Inner::Plain(c) => c.abort_unaccepted(),
            Inner::Striped { shared, threads } => {
                stop(shared, std::mem::take(threads), Conn::abort_unaccepted);
            }
        }
    }
}

impl Drop for RailConn {
    fn drop(&mut self) {
        // A plain connection's own drop lingers; the rails' threads are joined here (a
        // second call after `close` finds none).
        if matches!(&self.inner, Inner::Striped { threads, .. } if !threads.is_empty()) {
            let _ = self.shutdown();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a change, up to `deadline` (`op` names the call in its time-out).
    fn wait<'a>(
        &self,
        st: MutexGuard<'a, State>,
        deadline: Option<Deadline>,
        op: &'static str,
    ) -> Result<MutexGuard<'a, State>> {
        match deadline {
            None => Ok(self.changed.wait(st).unwrap_or_else(|p| p.into_inner())),
            Some(d) => {
                let left = d.at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(NetError::Timeout {
                        op,
                        millis: d.millis(),
                    });
                }
                Ok(self
                    .changed
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0)
            }
        }
    }

    /// A read: the next message `take` gets from the core, waiting up to the read timeout;
    /// `None` once every rail ended and nothing whole is left.
    fn recv<T>(
        &self,
        op: &'static str,
        mut take: impl FnMut(&mut Rails) -> std::result::Result<Option<T>, ProtoError>,
    ) -> Result<Option<T>> {
        let mut st = self.lock();
        let deadline = Deadline::within(st.read_timeout);
        // How long a read waits, once the connection failed, for readers that may still
        // complete a message (their rails failed too, so they end within moments).
        let mut fatal_grace: Option<Instant> = None;
        loop {
            if let (true, Some(e)) = (st.fatal_reported, &st.fatal) {
                return Err(NetError::ConnFailed(e.clone()));
            }
            match take(&mut st.core) {
                Ok(Some(m)) => {
                    // Reading may make a confirmation due.
                    let wake = st.writer_waits && st.core.wants_to_send();
                    drop(st);
                    if wake {
                        self.to_send.notify_one();
                    }
                    return Ok(Some(m));
                }
                Ok(None) => {}
                Err(ProtoError::ShortBuffer { needed }) => {
                    return Err(NetError::ShortBuffer { needed })
                }
                Err(e) => return Err(NetError::ConnFailed(e)),
            }
            if st.closing {
                return Err(NetError::Closed { op });
            }
            if let Some(e) = st.fatal.clone() {
                // Every message that arrived whole comes before the error, and none after
                // (an outside tester's find: a read said ConnFailed, the next one returned a
                // message a failed rail's reader had still handed over).
                let now = Instant::now();
                let grace = *fatal_grace.get_or_insert(now + FATAL_READ_GRACE);
                if st.readers == 0 || now >= grace {
                    st.fatal_reported = true;
                    return Err(NetError::ConnFailed(e));
                }
                let until = match deadline {
                    Some(d) if now >= d.at => {
                        return Err(NetError::Timeout {
                            op,
                            millis: d.millis(),
                        })
                    }
                    Some(d) => d.at.min(grace),
                    None => grace,
                };
                st = self
                    .changed
                    .wait_timeout(st, until.saturating_duration_since(now))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            if st.over.iter().all(|o| *o) {
                // The peer closed: its stream ends here, unless it cut a message short.
                if st.core.receiving() {
                    return Err(NetError::PeerClosed("a striped message"));
                }
                return Ok(None);
            }
            st = self.wait(st, deadline, op)?;
        }
    }

    /// The writer thread: sends what the core has to send, a stripe at a time, on the rails
    /// in turn, until the connection ends. A rail's send may wait for its peer's credits
    /// for as long as that peer reads nothing, so no caller's call makes it: `send_msg`
    /// hands its message to the core (which keeps it until the peer confirms it) and
    /// returns, bounded by its write timeout alone.
    fn write_loop(&self) {
        let mut buf = Vec::new();
        let mut st = self.lock();
        loop {
            if st.closing || st.fatal.is_some() {
                return;
            }
            let Some(rail) = self.next_stripe(&mut st, &mut buf) else {
                st.writer_waits = true;
                st = self.to_send.wait(st).unwrap_or_else(|p| p.into_inner());
                st.writer_waits = false;
                continue;
            };
            // The state's lock is not held while the rail sends (this rail's peer may be
            // waiting for our readers, which need it).
            st.sending = true;
            drop(st);
            match self.rails[rail].send_msg(&buf) {
                Ok(()) => {}
                // The peer closed this rail: only its reader marks it over, once it read the
                // end of it, after what came before the FIN (marking it over here raced that
                // reader: the peer's last confirmation, not handed over yet, was lost with
                // the rail and `close` said PeerGone). What this stripe carried goes again
                // on the others then.
                Err(NetError::PeerGone { .. }) => self.lock().send_gone[rail] = true,
                Err(e) => self.rail_down(rail, Some(&e)),
            }
            st = self.lock();
            st.sending = false;
            // A close waits until what this end owes was sent.
            self.changed.notify_all();
        }
    }

    /// Copies the next stripe into `buf`, taken for the next live rail in turn that can send
    /// at once (has credit), else for the next live rail in turn; that rail. A rail that is
    /// dead on the peer's side only gets no credit back, and its sends wait until its
    /// keepalive gives up (seconds): the stripes, confirmations above all, go on the others
    /// meanwhile.
    fn next_stripe(&self, st: &mut State, buf: &mut Vec<u8>) -> Option<usize> {
        // A rail's lock inside the state's: nothing takes them the other way round (a rail's
        // calls never call back into this connection).
        Self::next_stripe_on(st, buf, |rail| self.rails[rail].can_send_now())
            .or_else(|| Self::next_stripe_on(st, buf, |_| true))
    }

    /// [`Shared::next_stripe`] among the live rails that `usable` allows.
    fn next_stripe_on(
        st: &mut State,
        buf: &mut Vec<u8>,
        usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let n = st.over.len();
        let start = st.next_rail;
        for k in 0..n {
            let rail = (start + k) % n;
            if st.over[rail] || st.send_gone[rail] || !usable(rail) {
                continue;
            }
            if let Some(s) = st.core.next_stripe(rail) {
                buf.clear();
                buf.extend_from_slice(s);
                st.next_rail = (rail + 1) % n;
                return Some(rail);
            }
        }
        None
    }

    /// Rail `rail` is over: it failed (`Some(why)`), or the peer closed it (`None`, its
    /// reader read the end of it, or a send found the peer gone). What it carried and is not
    /// confirmed goes again on the others (it may have arrived: the peer drops duplicates).
    /// Once every rail is over, a failure fails the connection, while the peer's close only
    /// ends it for sending: reads end after what arrived whole. The peer closes its rails only
    /// in its `close`, so once one rail ended so, a rail that fails afterwards (the peer's
    /// close raced our notice of an earlier failure) ends the connection as a close too.
    /// During `close` a rail's end is close's own doing, and only marked.
    fn rail_down(&self, rail: usize, failure: Option<&NetError>) {
        let mut st = self.lock();
        if st.over[rail] {
            return;
        }
        st.over[rail] = true;
        if st.closing {
            return;
        }
        let last = match failure {
            Some(why) => {
                tracing::warn!(rail, error = %why, "striped connection: a rail failed");
                st.core.rail_failed(rail)
            }
            None => {
                st.peer_closed_a_rail = true;
                st.core.rail_closed(rail)
            }
        };
        if let Err(e) = last {
            if !st.peer_closed_a_rail {
                tracing::warn!("striped connection: every rail failed");
                st.fatal = Some(e);
            } else {
                st.peer_closed = true;
            }
        }
        drop(st);
        self.changed.notify_all();
        // What the rail carried goes again on the others; or the writer ends.
        self.to_send.notify_all();
    }

    /// A rail's reader thread: hands every stripe to the core until the rail ends.
    fn read_rail(&self, rail: usize) {
        // One buffer for every stripe of the rail (it grows to the largest).
        let mut buf = vec![0u8; STRIPE_HEADER_LEN];
        loop {
            match self.rails[rail].recv_msg_into(&mut buf) {
                Err(NetError::ShortBuffer { needed }) => buf.resize(needed, 0),
                Ok(Some(n)) => {
                    let m = &buf[..n];
                    let mut st = self.lock();
                    if let Err(e) = st.core.handle_stripe(rail, m) {
                        tracing::warn!(rail, error = %e, "striped connection: a bad stripe");
                        st.fatal = Some(e);
                    }
                    // A confirmation may have opened the window, a message may be whole.
                    let fatal = st.fatal.is_some();
                    drop(st);
                    self.changed.notify_all();
                    if fatal {
                        self.to_send.notify_all();
                    }
                }
                Ok(None) => {
                    self.rail_down(rail, None);
                    return self.reader_ended();
                }
                Err(e) => {
                    self.rail_down(rail, Some(&e));
                    return self.reader_ended();
                }
            }
        }
    }

    /// A rail's reader handed over all its rail had: a read of a failed connection may now
    /// report the failure.
    fn reader_ended(&self) {
        self.lock().readers -= 1;
        self.changed.notify_all();
    }
}

/// Accepts striped connections: groups the rails that join by the connection they name.
///
/// A rail's hello is read on a thread of its own (for at most `join_timeout`), so a silent
/// or slow peer never holds up the accept of others.
pub struct RailListener {
    listener: Listener,
    joins: Arc<Joins>,
    opts: RailOptions,
}

impl std::fmt::Debug for RailListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RailListener")
            .field("local_addr", &self.local_addr())
            .field("rails", &self.opts.rails.len())
            .finish()
    }
}

/// Rails joining, and connections ready to be accepted.
struct Joins {
    state: Mutex<JoinState>,
}

#[derive(Default)]
struct JoinState {
    /// Rails of connections not complete yet, by connection id.
    joining: HashMap<u64, Joining>,
    /// Connections complete (or plain), oldest first.
    ready: std::collections::VecDeque<RailConn>,
    /// The listener is gone: what joins or completes from now on is refused.
    closed: bool,
}

struct Joining {
    since: Instant,
    cfg: RailsConfig,
    rails: Vec<Option<Conn>>,
}

/// How often an accept waiting on the listener looks whether a hello thread finished a
/// connection.
const ACCEPT_SLICE: Duration = Duration::from_millis(50);

impl RailListener {
    /// Listens at `addr` with the first rail's connection options (every rail of every
    /// connection arrives at this one address, or at the address of its NIC when `addr` is
    /// the unspecified one). `opts` bounds what dialers may propose: the settled stripe
    /// size, window and message cap are the smaller of both. The number of rails is the
    /// dialer's: a listener takes a connection of any number (1 to 16) whatever its own.
    ///
    /// # Errors
    /// As [`Listener::bind`].
    pub fn bind(addr: impl ToSocketAddrs, opts: RailOptions) -> Result<RailListener> {
        opts.config()?;
        let listener = Listener::bind(addr, offering(&opts.rails[0]))?;
        Ok(RailListener {
            listener,
            joins: Arc::new(Joins {
                state: Mutex::new(JoinState::default()),
            }),
            opts,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// The next connection whose rails have all joined (answered, and returned), or the
    /// next plain `Conn` (one that does not offer rails), as one plain connection. A rail
    /// whose first message is no rail hello, or comes later than `join_timeout`, is closed
    /// and skipped.
    ///
    /// # Errors
    /// As [`Listener::accept`].
    pub fn accept(&self) -> Result<RailConn> {
        self.accept_until(None)
    }

    /// As `accept`, giving up after `timeout`.
    ///
    /// # Errors
    /// [`NetError::Timeout`]; as [`Listener::accept`].
    pub fn accept_timeout(&self, timeout: Duration) -> Result<RailConn> {
        self.accept_until(Deadline::within(Some(timeout)))
    }

    fn accept_until(&self, deadline: Option<Deadline>) -> Result<RailConn> {
        loop {
            if let Some(done) = self.joins.lock().ready.pop_front() {
                return Ok(done);
            }
            self.joins.expire(self.opts.join_timeout);
            // One look at the listener even when the time is up (a zero timeout takes the
            // peers already waiting, as `Listener::accept_timeout` does).
            let left = deadline.map(|d| d.at.saturating_duration_since(Instant::now()));
            match self
                .listener
                .accept_timeout(left.map_or(ACCEPT_SLICE, |l| l.min(ACCEPT_SLICE)))
            {
                Ok(c) => self.start_join(c),
                Err(NetError::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
            if let Some(d) = deadline {
                if Instant::now() >= d.at {
                    if let Some(done) = self.joins.lock().ready.pop_front() {
                        return Ok(done);
                    }
                    return Err(NetError::Timeout {
                        op: "accept a striped connection",
                        millis: d.millis(),
                    });
                }
            }
        }
    }

    /// Files a new connection: a plain one is ready at once; a rail's hello is read on a
    /// thread of its own.
    fn start_join(&self, c: Conn) {
        if !speaks_rails(&c) {
            let peer = c.peer_addr();
            self.joins.lock().ready.push_back(RailConn {
                inner: Inner::Plain(Box::new(c)),
                peer,
            });
            return;
        }
        let (joins, opts) = (self.joins.clone(), self.opts.clone());
        let spawned = std::thread::Builder::new()
            .name("rsrdma-rail-join".into())
            .spawn(move || joins.join(c, &opts));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "striped listener: no thread to read a rail's hello");
        }
    }
}

impl Joins {
    fn lock(&self) -> MutexGuard<'_, JoinState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the connections whose rails did not all join within `limit` (their rails are
    /// closed outside the lock: a close may linger).
    fn expire(&self, limit: Duration) {
        let expired: Vec<Joining> = {
            let mut st = self.lock();
            let ids: Vec<u64> = st
                .joining
                .iter()
                .filter(|(_, j)| j.since.elapsed() >= limit)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| st.joining.remove(id)).collect()
        };
        if !expired.is_empty() {
            tracing::warn!(
                count = expired.len(),
                "striped listener: connections whose rails did not all join in time"
            );
        }
    }

    /// Reads a new rail's hello and files it; once its connection's last rail joined,
    /// answers it and makes it ready.
    fn join(&self, c: Conn, opts: &RailOptions) {
        let peer = c.peer_addr();
        let hello = c
            .set_read_timeout(Some(opts.join_timeout))
            .and_then(|()| c.recv_msg());
        let hello = match hello {
            Ok(Some(m)) => Hello::decode(&m, false),
            Ok(None) => Err("the peer closed before its hello"),
            Err(_) => Err("no hello in time"),
        };
        let h = match hello {
            Ok(h) => h,
            Err(why) => {
                tracing::warn!(%peer, why, "striped listener: a rail refused");
                let _ = c.close();
                return;
            }
        };
        let _ = c.set_read_timeout(None);
        let Ok(mine) = opts.config() else {
            return;
        };
        let cfg = RailsConfig {
            rails: h.cfg.rails,
            stripe_size: h.cfg.stripe_size.min(mine.stripe_size),
            window: h.cfg.window.min(mine.window),
            max_message: h.cfg.max_message.min(mine.max_message),
        };
        self.expire(opts.join_timeout);
        let mut st = self.lock();
        if st.closed {
            drop(st);
            c.abort_unaccepted();
            return;
        }
        let j = st.joining.entry(h.id).or_insert_with(|| Joining {
            since: Instant::now(),
            cfg,
            rails: (0..h.cfg.rails).map(|_| None).collect(),
        });
        if j.cfg.rails != h.cfg.rails || j.rails[usize::from(h.rail)].is_some() {
            drop(st);
            tracing::warn!(%peer, "striped listener: a rail that does not fit its connection");
            let _ = c.close();
            return;
        }
        j.rails[usize::from(h.rail)] = Some(c);
        if j.rails.iter().any(Option::is_none) {
            return;
        }
        let Some(j) = st.joining.remove(&h.id) else {
            return;
        };
        drop(st);
        let rails: Vec<Conn> = j.rails.into_iter().flatten().collect();
        // A stripe is one message on every rail (each settled its own `max_message`).
        let cfg = RailsConfig {
            stripe_size: j.cfg.stripe_size.min(stripe_limit(&rails)),
            ..j.cfg
        };
        let answer = Hello {
            id: h.id,
            rail: 0,
            cfg,
        };
        // A client that fails here is its own trouble: logged, never an accept's error.
        let done = cfg
            .check()
            .map_err(NetError::ConnFailed)
            .and_then(|()| rails[0].send_msg(&answer.encode(true)))
            .and_then(|()| {
                let peer = rails[0].peer_addr();
                RailConn::start(rails, cfg, peer, opts.rails[0].linger)
            });
        match done {
            Ok(c) => {
                let mut st = self.lock();
                if st.closed {
                    drop(st);
                    c.refuse();
                } else {
                    st.ready.push_back(c);
                }
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "striped listener: a client's set-up failed")
            }
        }
    }
}

impl Drop for RailListener {
    /// Connections nobody accepted, and the rails of those still joining, are aborted: their
    /// dialers read an error, not an end-of-stream (they closed cleanly, and a dialer's
    /// messages were lost behind `Ok(None)`: an outside tester's find). The plain
    /// listener's own queue is refused by its drop, after this.
    fn drop(&mut self) {
        let (ready, joining) = {
            let mut st = self.joins.lock();
            st.closed = true;
            (
                std::mem::take(&mut st.ready),
                std::mem::take(&mut st.joining),
            )
        };
        ready.into_iter().for_each(RailConn::refuse);
        for j in joining.into_values() {
            j.rails.iter().flatten().for_each(Conn::abort_unaccepted);
        }
    }
}

/// 8 random bytes from the kernel: a connection's id among those joining a listener.
fn random_id() -> Result<u64> {
    use std::io::Read;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| NetError::io("read /dev/urandom", e))?;
    Ok(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options that cannot carry a message are refused before anything is dialed, each by
    /// its name (an outside tester's `max_message` 0 set a connection up that could send
    /// nothing).
    #[test]
    fn options_that_cannot_work_are_refused_by_name() {
        let base = || RailOptions::new(ConnOptions::default(), 2);
        assert!(base().config().is_ok());
        let cases: [(&str, RailOptions); 5] = [
            (
                "max_message",
                RailOptions {
                    max_message: 0,
                    ..base()
                },
            ),
            (
                "stripe size",
                RailOptions {
                    stripe_size: 0,
                    ..base()
                },
            ),
            (
                "window",
                RailOptions {
                    window: 0,
                    ..base()
                },
            ),
            (
                "join_timeout",
                RailOptions {
                    join_timeout: Duration::ZERO,
                    ..base()
                },
            ),
            ("rails", RailOptions::new(ConnOptions::default(), 17)),
        ];
        for (what, o) in cases {
            let e = o.config().unwrap_err();
            assert!(matches!(e, NetError::InvalidArgument(_)), "{what}: {e:?}");
            assert!(e.to_string().contains(what), "{what}: {e}");
        }
    }
}
