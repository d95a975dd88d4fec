//! The control channel: framed messages over a non-blocking TCP socket.
//!
//! The socket stays non-blocking for the channel's life; every wait is a poll(2) with a
//! deadline. Bytes are read as they come into a [`FrameReader`], and whole messages go to a
//! queue, so a message that arrives before anyone asks for it (memory descriptors, a barrier
//! step) is kept for the receive that wants its kind. Keepalives only refresh
//! [`Channel::last_heard`]; a close notice, an abort or the end of the stream end the peer's
//! side, and every later wait for a message that is not already queued fails at once.
//!
//! With a shared secret the opening authenticates both sides (the client proves first, see
//! [`auth`]) and every frame after it carries a tag: a frame that is missing its tag, altered,
//! reordered or replayed ends the peer's side with [`NetError::Auth`].

use super::codec::{DecodeError, Endpoint, Hello, Message, MessageKind, Proof, Regions, Role};
use super::frames::FrameReader;
use super::readiness;
use super::{auth, settle, Settled, Standing};
use crate::deadline::deadline_after;
use crate::error::{NetError, Result};
use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most messages queued unread; a peer that sends more is broken or hostile.
pub const MAX_QUEUED: usize = 256;

/// Reads per [`Channel::read_available`], so a peer that sends without pause cannot keep a
/// "never blocks" call busy.
const MAX_READS_PER_PUMP: usize = 16;

/// How the peer's side ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PeerEnd {
    /// End of stream or a reset.
    Eof,
    /// A close notice.
    Closed,
    /// An abort, with the peer's reason.
    Aborted(String),
    /// Bytes that are not a frame: the stream is out of step, nothing after them is read.
    Malformed(DecodeError),
    /// More unread messages than [`MAX_QUEUED`]: one was dropped.
    Overrun,
    /// A frame of an authenticated channel without its tag, or with a wrong one.
    Forged(&'static str),
}

impl PeerEnd {
    fn error(&self, op: &'static str) -> NetError {
        match self {
            PeerEnd::Aborted(why) => NetError::PeerAborted(why.clone()),
            PeerEnd::Malformed(e) => NetError::Malformed(e.clone()),
            PeerEnd::Eof | PeerEnd::Closed => NetError::PeerClosed(op),
            PeerEnd::Overrun => NetError::QueueFull { limit: MAX_QUEUED },
            PeerEnd::Forged(why) => NetError::Auth(format!(
                "the control channel was tampered with: {why}; the connection is not trusted"
            )),
        }
    }
}

/// The TCP control channel: the handshake, then memory descriptors, barriers, liveness and
/// the close. [`AsFd`] gives its socket to an event loop: when it is readable, call
/// [`Channel::read_available`] and take messages with [`Channel::try_recv_kind`].
#[derive(Debug)]
pub struct Channel {
    stream: TcpStream,
    timeout: Duration,
    role: Role,
    frames: FrameReader,
    inbox: VecDeque<Message>,
    peer_end: Option<PeerEnd>,
    last_heard: Instant,
    /// A close notice or abort went out, or a write stopped mid-frame: send nothing more.
    done_sending: bool,
    /// The write that stopped found the peer gone: later sends say so.
    peer_gone_on_send: bool,
    /// After authentication: the session key and sequence numbers that seal every frame.
    seal: Option<Box<auth::Seal>>,
    /// A sealed frame received and waiting for its tag (the next frame).
    unsealed: Option<Box<(Message, auth::Expected)>>,
    /// The peer's hello as it arrived: the transcript the proofs cover.
    peer_hello: Option<Vec<u8>>,
    /// Taking frames stopped after an opening message (hello or proof): what follows waits
    /// in the frame reader until the opening has decided whether frames are sealed.
    held: bool,
    /// The limit of the whole opening (hello and proof), when shorter than `timeout`.
    opening: Option<Duration>,
    /// A server whose peer opened without a secret: a hello proves nothing (anyone can send
    /// one), so the opening's deadline still bounds every wait until the peer's first message
    /// after its hello, which a real peer sends as soon as it has made its queue pair.
    opening_until: Option<Instant>,
    /// A server's peer's standing, for its listener (see [`Channel::open`]).
    standing: Option<Arc<Standing>>,
    /// The whole handshake's deadline and its limit, when one bounds every wait
    /// ([`Channel::open_until`]): a Conn's `connect_timeout` is one limit for the whole
    /// establishment, not one per step.
    until: Option<(Instant, Duration)>,
}

impl Channel {
    /// Wraps a connected stream and makes it non-blocking; every wait lasts at most `timeout`.
    ///
    /// # Errors
    /// [`NetError::Io`] when the socket cannot be set up.
    pub fn new(stream: TcpStream, role: Role, timeout: Duration) -> Result<Channel> {
        stream
            .set_nonblocking(true)
            .map_err(|e| NetError::io("set_nonblocking", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| NetError::io("set_nodelay", e))?;
        Ok(Channel {
            stream,
            timeout,
            role,
            frames: FrameReader::new(),
            inbox: VecDeque::new(),
            peer_end: None,
            last_heard: Instant::now(),
            done_sending: false,
            peer_gone_on_send: false,
            seal: None,
            unsealed: None,
            peer_hello: None,
            held: false,
            opening: None,
            opening_until: None,
            standing: None,
            until: None,
        })
    }

    /// A channel over `stream` whose opening is done: [`Channel::new`], then
    /// [`Channel::authenticate`], a server giving the peer `opening` for its hello and proof;
    /// moves `standing` on once the peer has opened: with a secret, when its proof checks
    /// (a listener then never sheds it); without one, when its first message after the
    /// hello arrives, still within `opening` (so a peer that sends a hello and then nothing
    /// holds a listener's place for the opening timeout, not the whole handshake's). An
    /// unproven peer's later waits are recorded in `standing`, so a listener that is full
    /// can shed one that stalls.
    ///
    /// # Errors
    /// As [`Channel::new`] and [`Channel::authenticate`].
    pub(crate) fn open(
        stream: TcpStream,
        role: Role,
        (timeout, opening): (Duration, Duration),
        secret: Option<&[u8]>,
        standing: Option<Arc<Standing>>,
    ) -> Result<Channel> {
        Channel::open_until(stream, role, (timeout, opening), None, secret, standing)
    }

    /// [`Channel::open`], every wait also bounded by `until` (a deadline and the limit it
    /// ends, which a timeout error names) until [`Channel::unbound`].
    ///
    /// # Errors
    /// As [`Channel::open`].
    pub(crate) fn open_until(
        stream: TcpStream,
        role: Role,
        (timeout, opening): (Duration, Duration),
        until: Option<(Instant, Duration)>,
        secret: Option<&[u8]>,
        standing: Option<Arc<Standing>>,
    ) -> Result<Channel> {
        let mut ch = Channel::new(stream, role, timeout)?;
        ch.until = until;
        if role == Role::Server {
            ch.set_opening_timeout(opening);
        }
        // Before the opening: a peer shed while it opens is told why.
        ch.standing = standing;
        match ch.authenticate(secret) {
            Ok(()) => {}
            Err(e @ NetError::Timeout { .. }) => return Err(ch.abort_timed_out(e)),
            Err(e) => return Err(e),
        }
        if ch.opening_until.is_none() {
            ch.mark_opened();
        }
        Ok(ch)
    }

    /// The peer has opened: its waits are bounded by the channel's timeout alone.
    fn mark_opened(&mut self) {
        self.opening_until = None;
        if let Some(s) = &self.standing {
            s.open(self.authenticated());
        }
    }

    /// Limits the whole opening of [`Channel::authenticate`] (the peer's hello and proof) to
    /// `limit`: a listener gives strangers much less time than the rest of the handshake.
    /// For a server whose peer opens without a secret, the limit also bounds the wait for the
    /// peer's first message after its hello (a hello alone proves nothing).
    pub fn set_opening_timeout(&mut self, limit: Duration) {
        self.opening = Some(limit);
    }

    /// Ends the bound of [`Channel::open_until`]: the handshake is over, and the channel's
    /// later waits (its close) are bounded by its timeout alone.
    pub(crate) fn unbound(&mut self) {
        self.until = None;
    }

    /// The deadline of a wait of at most `limit` that starts now, and the limit a timeout
    /// error names: the handshake's, when its deadline comes first.
    fn bounded(&self, deadline: Instant, limit: Duration) -> (Instant, Duration) {
        match self.until {
            Some((until, whole)) if until <= deadline => (until, whole),
            _ => (deadline, limit),
        }
    }

    /// This side's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The limit of each wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The socket. It is non-blocking and must stay so; read from it only through the channel.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// When the last message (of any kind, keepalives included) arrived, or the channel was
    /// created.
    pub fn last_heard(&self) -> Instant {
        self.last_heard
    }

    /// Messages received and not yet taken.
    pub fn queued(&self) -> usize {
        self.inbox.len()
    }

    /// Sends one message, waiting at most the channel's timeout for room in the socket (and
    /// reading meanwhile, so two ends sending large messages at once cannot deadlock).
    ///
    /// # Errors
    /// [`NetError::Encode`] for a message over a codec limit (nothing is sent);
    /// [`NetError::PeerClosed`], [`NetError::Io`] or [`NetError::Timeout`].
    pub fn send(&mut self, msg: &Message) -> Result<()> {
        const OP: &str = "send control message";
        if self.done_sending {
            // A send that found the peer gone says so again (an outside tester's find: the
            // calls after it said this side had sent its close).
            if self.peer_gone_on_send {
                return Err(NetError::PeerClosed(OP));
            }
            if let Some(end @ PeerEnd::Forged(_)) = &self.peer_end {
                return Err(end.error(OP));
            }
            return Err(NetError::InvalidArgument(
                "the control channel already sent its close (or stopped mid-frame)".into(),
            ));
        }
        let bytes = self.frame(msg)?;
        let r = self.write_all(&bytes, OP);
        if let Err(e) = &r {
            // Whatever part went out leaves the peer's decoder mid-frame.
            self.done_sending = true;
            self.peer_gone_on_send = matches!(e, NetError::PeerClosed(_));
        }
        r
    }

    /// After a forged frame: tells the peer (an abort, sealed as every frame, best effort and
    /// never waiting) and sends nothing more. A side that went on sending would complete the
    /// peer's barriers, so the peer's `sync` and `close` said `Ok` while this side knew the
    /// channel was tampered with (an outside tester's find).
    fn refuse_forged(&mut self, why: &'static str) {
        if self.done_sending {
            return;
        }
        self.done_sending = true;
        let reason = format!("the control channel was tampered with: {why}");
        if let Ok(bytes) = self.frame(&Message::abort(&reason)) {
            let _ = (&self.stream).write(&bytes);
        }
    }

    /// `msg`'s frame, followed by its tag once the channel is sealed.
    fn frame(&mut self, msg: &Message) -> Result<Vec<u8>> {
        let mut bytes = msg.to_bytes()?;
        if let Some(seal) = &mut self.seal {
            let tag = seal.seal(&bytes);
            Message::Tag(tag).encode(&mut bytes)?;
        }
        Ok(bytes)
    }

    /// Whether the opening authenticated the peer (every frame since is sealed).
    pub fn authenticated(&self) -> bool {
        self.seal.is_some()
    }

    fn write_all(&mut self, bytes: &[u8], op: &'static str) -> Result<()> {
        let (deadline, limit) = self.bounded(deadline_after(self.timeout), self.timeout);
        let mut off = 0;
        while off < bytes.len() {
            match (&self.stream).write(&bytes[off..]) {
                Ok(0) => return Err(NetError::PeerClosed(op)),
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // A peer that sends without end keeps us readable: the deadline is
                    // checked here, not left to poll(2).
                    if Instant::now() >= deadline {
                        return Err(self.timed_out(op, limit));
                    }
                    let read = self.peer_end.is_none();
                    match readiness::wait(self.stream.as_fd(), read, true, deadline)
                        .map_err(|e| NetError::io("poll", e))?
                    {
                        None => return Err(self.timed_out(op, limit)),
                        Some(r) if r.readable && read => self.pump()?,
                        Some(_) => {}
                    }
                }
                Err(e) if is_reset(e.kind()) => return Err(NetError::PeerClosed(op)),
                Err(e) => return Err(NetError::io(op, e)),
            }
        }
        Ok(())
    }

    /// Reads whatever has arrived, without blocking, and queues the whole messages. For event
    /// loops: call it when the fd is readable.
    ///
    /// # Errors
    /// [`NetError::Malformed`] when the peer sent bytes that are not a frame (the whole
    /// messages before them stay queued); [`NetError::QueueFull`] past [`MAX_QUEUED`] unread
    /// messages; [`NetError::Io`].
    pub fn read_available(&mut self) -> Result<()> {
        self.pump()?;
        match &self.peer_end {
            Some(PeerEnd::Malformed(e)) => Err(NetError::Malformed(e.clone())),
            _ => Ok(()),
        }
    }

    /// As [`Channel::read_available`], but garbage only ends the peer's side, so that the
    /// messages queued before it can still be taken.
    fn pump(&mut self) -> Result<()> {
        for _ in 0..MAX_READS_PER_PUMP {
            self.take_frames()?;
            // Held frames are taken once the opening moves on; reading more now would only
            // let a peer that floods the opening grow the buffer.
            if self.peer_end.is_some() || self.held {
                return Ok(());
            }
            match self.frames.read_from(&mut &self.stream) {
                Ok(0) => {
                    if self.frames.buffered() > 0 {
                        tracing::debug!(
                            bytes = self.frames.buffered(),
                            "the peer closed the control channel mid-frame"
                        );
                    }
                    self.peer_end = Some(PeerEnd::Eof);
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if is_reset(e.kind()) => {
                    self.peer_end = Some(PeerEnd::Eof);
                    return Ok(());
                }
                Err(e) => return Err(NetError::io("read control channel", e)),
            }
        }
        self.take_frames()
    }

    fn take_frames(&mut self) -> Result<()> {
        self.held = false;
        while self.peer_end.is_none() {
            let (msg, raw) = match self.frames.next_frame_raw() {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(e) => {
                    self.peer_end = Some(PeerEnd::Malformed(e));
                    return Ok(());
                }
            };
            let msg = match (&mut self.seal, msg) {
                (None, Message::Tag(_)) => Err("a tag before any authentication"),
                (None, m @ (Message::Hello(_) | Message::Proof(_))) => {
                    if matches!(m, Message::Hello(_)) && self.peer_hello.is_none() {
                        self.peer_hello = Some(raw.to_vec());
                    }
                    self.held = true;
                    Ok(Some(m))
                }
                (None, m) => Ok(Some(m)),
                (Some(_), Message::Tag(tag)) => match self.unsealed.take() {
                    None => Err("a tag with no frame before it"),
                    Some(pending) if pending.1.matches(&tag) => Ok(Some(pending.0)),
                    Some(_) => Err("a frame altered, reordered, replayed or forged"),
                },
                (Some(_), _) if self.unsealed.is_some() => Err("a frame without its tag"),
                (Some(seal), m) => {
                    let expected = seal.expect(raw);
                    self.unsealed = Some(Box::new((m, expected)));
                    Ok(None)
                }
            };
            let msg = match msg {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(why) => {
                    tracing::warn!(why, "control channel frame refused");
                    self.peer_end = Some(PeerEnd::Forged(why));
                    self.refuse_forged(why);
                    return Ok(());
                }
            };
            self.last_heard = Instant::now();
            match msg {
                Message::Keepalive => {}
                Message::Close => self.peer_end = Some(PeerEnd::Closed),
                Message::Abort(why) => self.peer_end = Some(PeerEnd::Aborted(why)),
                m if self.inbox.len() >= MAX_QUEUED => {
                    tracing::warn!(kind = m.name(), "control channel queue full");
                    // The message is lost: the stream is out of step from here on, so every
                    // later wait fails instead of silently missing it.
                    self.peer_end = Some(PeerEnd::Overrun);
                    return Err(NetError::QueueFull { limit: MAX_QUEUED });
                }
                m => self.inbox.push_back(m),
            }
            if self.held {
                return Ok(());
            }
        }
        Ok(())
    }

    /// How the peer's side ended, if it has, as the error a wait for `op` would return
    /// ([`NetError::PeerAborted`] with its reason, [`NetError::PeerClosed`], a tampered
    /// channel's [`NetError::Auth`]…): reads what has arrived, never blocks.
    ///
    /// # Errors
    /// The errors of [`Channel::read_available`].
    pub fn peer_ended(&mut self, op: &'static str) -> Result<Option<NetError>> {
        self.read_available()?;
        Ok(self.peer_end.as_ref().map(|end| end.error(op)))
    }

    /// Whether the peer's side is still open: reads what has arrived (never blocks) and says
    /// false after the end of the stream, a close notice or an abort. The socket's blocking
    /// mode is not touched (it stays non-blocking).
    ///
    /// # Errors
    /// The errors of [`Channel::read_available`].
    pub fn peer_open(&mut self) -> Result<bool> {
        self.read_available()?;
        Ok(self.peer_end.is_none())
    }

    /// Receives the next message in arrival order (queued ones first), waiting at most the
    /// channel's timeout. The handshake uses it: its order is fixed.
    ///
    /// # Errors
    /// [`NetError::Timeout`]; [`NetError::PeerClosed`] or [`NetError::PeerAborted`] once the
    /// peer's side ended; the errors of [`Channel::read_available`].
    pub fn recv(&mut self, op: &'static str) -> Result<Message> {
        let deadline = deadline_after(self.timeout);
        self.wait_for(op, deadline, VecDeque::pop_front)
    }

    /// Receives the first message of `kind`, from the queue or, waiting at most the channel's
    /// timeout, from the socket; messages of other kinds stay queued in order.
    ///
    /// # Errors
    /// As [`Channel::recv`].
    pub fn recv_kind(&mut self, kind: MessageKind, op: &'static str) -> Result<Message> {
        self.recv_kind_until(kind, op, deadline_after(self.timeout))
    }

    /// As [`Channel::recv_kind`], waiting until `deadline`.
    ///
    /// # Errors
    /// As [`Channel::recv`].
    pub fn recv_kind_until(
        &mut self,
        kind: MessageKind,
        op: &'static str,
        deadline: Instant,
    ) -> Result<Message> {
        self.wait_for(op, deadline, |q| take_kind(q, kind))
    }

    /// Takes the first queued message of `kind` after reading what has arrived; never blocks.
    ///
    /// # Errors
    /// The errors of [`Channel::read_available`] (an ended peer is not an error here: see
    /// [`Channel::peer_open`]).
    pub fn try_recv_kind(&mut self, kind: MessageKind) -> Result<Option<Message>> {
        self.read_available()?;
        let m = take_kind(&mut self.inbox, kind);
        if m.is_some() && self.opening_until.is_some() {
            self.mark_opened();
        }
        Ok(m)
    }

    fn wait_for(
        &mut self,
        op: &'static str,
        deadline: Instant,
        mut take: impl FnMut(&mut VecDeque<Message>) -> Option<Message>,
    ) -> Result<Message> {
        // Until a peer without a secret has sent more than its hello, the opening bounds it.
        let (op, deadline) = match self.opening_until {
            Some(o) if o < deadline => ("the peer's first step after its hello", o),
            _ => (op, deadline),
        };
        let (deadline, limit) =
            self.bounded(deadline, deadline.saturating_duration_since(Instant::now()));
        // An opened, unproven peer keeps its place only while it does not stall us.
        let _waiting = self.standing.clone().map(Waiting::start);
        let mut polled = false;
        loop {
            if let Some(m) = take(&mut self.inbox) {
                if self.opening_until.is_some() {
                    self.mark_opened();
                }
                return Ok(m);
            }
            // Frames held behind an opening message are taken once it has been consumed.
            if self.held {
                self.take_frames()?;
                continue;
            }
            // Shed by the listener (which shut the socket's reading end): say why, so the
            // peer's error tells overload from an attack, and end.
            if let Some(s) = self.standing.as_ref().filter(|s| s.is_shed()) {
                let why = std::io::Error::other(if s.closing() {
                    "the listener closed before this connection was accepted"
                } else {
                    "too many handshakes at once (max_handshakes): this one was dropped to \
                     make room; try again"
                });
                return Err(self.abort(NetError::io("the listener", why)));
            }
            if let Some(end) = &self.peer_end {
                return Err(end.error(op));
            }
            // Checked here too, not only by poll(2): a peer that never stops sending keeps
            // the socket readable, and poll would never report the deadline.
            if polled && Instant::now() >= deadline {
                return Err(self.timed_out(op, limit));
            }
            polled = true;
            match readiness::wait(self.stream.as_fd(), true, false, deadline)
                .map_err(|e| NetError::io("poll", e))?
            {
                None => return Err(self.timed_out(op, limit)),
                Some(_) => self.pump()?,
            }
        }
    }

    fn timed_out(&self, op: &'static str, limit: Duration) -> NetError {
        NetError::Timeout {
            op,
            millis: crate::deadline::whole_millis(limit),
        }
    }

    /// Sends a keepalive: the peer's [`Channel::last_heard`] moves on.
    ///
    /// # Errors
    /// As [`Channel::send`].
    pub fn send_keepalive(&mut self) -> Result<()> {
        self.send(&Message::Keepalive)
    }

    /// Tells the peer this side is closing and will send nothing more. The peer's waits for
    /// messages it has not yet received then fail at once with [`NetError::PeerClosed`].
    /// [`Drop`] sends it too (best effort, never waiting) unless it or an abort went out.
    ///
    /// # Errors
    /// As [`Channel::send`].
    pub fn send_close(&mut self) -> Result<()> {
        let r = self.send(&Message::Close);
        self.done_sending = true;
        r
    }

    /// Tells the peer why this side gives up (best effort), and returns `err`. A listener's
    /// handshake counts its failure first (its standing's `count_failure`).
    pub fn abort(&mut self, err: NetError) -> NetError {
        let why = err.to_string();
        self.abort_saying(&why);
        err
    }

    /// [`Channel::abort`] for this side's own time limit running out (`err`, a
    /// [`NetError::Timeout`]): the peer is told which option ended it. Without a word, a
    /// listener whose `connect_timeout` ran out only hung up, and its dialer read "the peer
    /// closed the connection during handshake endpoint" (an outside tester's find).
    pub fn abort_timed_out(&mut self, err: NetError) -> NetError {
        let whose = match self.role {
            Role::Server => {
                "the listener's ConnOptions::connect_timeout (a new peer's opening: its \
                 opening_timeout)"
            }
            Role::Client => "the dialer's ConnOptions::connect_timeout",
        };
        self.abort_saying(&format!("{err}: {whose} ran out"));
        err
    }

    fn abort_saying(&mut self, why: &str) {
        if let Some(s) = &self.standing {
            s.count_failure();
        }
        let _ = self.send(&Message::abort(why));
        self.done_sending = true;
    }

    /// The opening: hellos, then, when either side demands authentication, the client's
    /// proof, checked by the server before it sends its own (see [`auth`]). Nothing about
    /// queue pairs or memory has been sent when this returns an error, and a server has sent
    /// nothing derived from the secret to a client that failed to prove it. After a success
    /// with a secret, every frame either side sends is sealed.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a secret shorter than [`auth::MIN_SECRET_LEN`]
    /// (before anything is sent); [`NetError::Auth`] when a proof is missing or wrong; the
    /// errors of [`Channel::recv`].
    pub fn authenticate(&mut self, secret: Option<&[u8]>) -> Result<()> {
        self.open_with(secret).map_err(refused_by_peer)
    }

    fn open_with(&mut self, secret: Option<&[u8]>) -> Result<()> {
        if let Some(secret) = secret {
            auth::check_secret(secret).map_err(NetError::InvalidArgument)?;
        }
        let nonce = auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
        let hello = Message::Hello(Hello {
            role: self.role,
            auth_required: secret.is_some(),
            nonce,
        });
        let own_hello = hello.to_bytes()?;
        let opening = deadline_after(self.opening.unwrap_or(self.timeout).min(self.timeout));
        // A peer gone before the hello went out (a listener that closed with the dial in its
        // backlog resets it) closed "during the hello", as one that closes without its own.
        self.send(&hello).map_err(|e| match e {
            NetError::PeerClosed(_) => NetError::PeerClosed("handshake hello"),
            e => e,
        })?;
        let peer = match self.wait_for("handshake hello", opening, VecDeque::pop_front)? {
            Message::Hello(h) => h,
            other => return Err(self.unexpected("hello", &other)),
        };
        if peer.role == self.role {
            return Err(self.abort(NetError::Auth(format!(
                "both ends claim to be the {}",
                self.role
            ))));
        }
        if !(peer.auth_required || secret.is_some()) {
            // A listener's opening goes on until the peer's next message (see `opening_until`).
            if self.role == Role::Server && self.opening.is_some() {
                self.opening_until = Some(opening);
            }
            return Ok(());
        }
        let Some(secret) = secret else {
            return Err(self.abort(NetError::Auth(NO_SECRET_HERE.into())));
        };
        let peer_hello = self.peer_hello.take().unwrap_or_default();
        let version = peer_hello.get(4).copied().unwrap_or(0);
        if version < 3 {
            return Err(self.abort(NetError::Auth(format!(
                "the peer speaks handshake version {version}, whose authentication is no longer \
                 accepted (its proofs could be harvested): upgrade the peer"
            ))));
        }
        let transcript = match self.role {
            Role::Client => auth::transcript(&own_hello, &peer_hello),
            Role::Server => auth::transcript(&peer_hello, &own_hello),
        };
        let (client_proof, server_proof) = match self.role {
            Role::Client => {
                let mine = auth::client_proof(secret, &transcript);
                self.send(&Message::Proof(Proof { tag: mine }))?;
                let theirs = self.recv_proof(opening)?;
                if !auth::verify_proof(secret, Role::Server, &transcript, &mine, &theirs) {
                    return Err(self.abort(NetError::Auth(WRONG_PROOF.into())));
                }
                (mine, theirs)
            }
            Role::Server => {
                let theirs = self.recv_proof(opening)?;
                if !auth::verify_proof(secret, Role::Client, &transcript, &[], &theirs) {
                    // Nothing derived from the secret has gone to this peer, and nothing will.
                    return Err(self.abort(NetError::Auth(WRONG_PROOF.into())));
                }
                let mine = auth::server_proof(secret, &transcript, &theirs);
                self.send(&Message::Proof(Proof { tag: mine }))?;
                (theirs, mine)
            }
        };
        self.seal = Some(Box::new(auth::Seal::new(
            secret,
            self.role,
            &transcript,
            &client_proof,
            &server_proof,
        )));
        // Frames that came with the peer's proof are taken now, under the seal.
        self.take_frames()
    }

    fn recv_proof(
        &mut self,
        deadline: Instant,
    ) -> Result<[u8; crate::handshake::codec::PROOF_LEN]> {
        match self.wait_for("handshake proof", deadline, VecDeque::pop_front)? {
            Message::Proof(p) => Ok(p.tag),
            other => Err(self.unexpected("proof", &other)),
        }
    }

    fn unexpected(&mut self, expected: &'static str, got: &Message) -> NetError {
        self.abort(NetError::Unexpected {
            expected,
            got: got.name(),
        })
    }

    /// Swaps endpoints and settles on what both can do. On a mismatch both sides learn which
    /// option differs (each computes it from the same two endpoints).
    ///
    /// # Errors
    /// [`NetError::Mismatch`]; the errors of [`Channel::recv`].
    pub fn exchange_endpoints(
        &mut self,
        local: &Endpoint,
        param_name: impl Fn(u16) -> String,
    ) -> Result<(Endpoint, Settled)> {
        self.send(&Message::Endpoint(local.clone()))?;
        let peer = self.recv_endpoint()?;
        let settled = settle(local, &peer, param_name)?;
        Ok((peer, settled))
    }

    /// Takes the peer's endpoint before sending this side's: a server that makes its queue
    /// pair and memory only for a peer that got this far (its opening ends with this
    /// message), then answers with [`Channel::answer_endpoint`]. A peer that sends its
    /// endpoint first ([`Channel::exchange_endpoints`]) is served either way.
    ///
    /// # Errors
    /// [`NetError::Unexpected`] for another message; the errors of [`Channel::recv`].
    pub fn recv_endpoint(&mut self) -> Result<Endpoint> {
        match self.recv("handshake endpoint")? {
            Message::Endpoint(e) => Ok(e),
            other => Err(self.unexpected("endpoint", &other)),
        }
    }

    /// Sends this side's endpoint after taking the peer's ([`Channel::recv_endpoint`]), and
    /// settles the two as [`Channel::exchange_endpoints`] does.
    ///
    /// # Errors
    /// [`NetError::Mismatch`]; the errors of [`Channel::send`].
    pub fn answer_endpoint(
        &mut self,
        local: &Endpoint,
        peer: &Endpoint,
        param_name: impl Fn(u16) -> String,
    ) -> Result<Settled> {
        self.send(&Message::Endpoint(local.clone()))?;
        settle(local, peer, param_name)
    }

    /// Swaps memory descriptors: sends `local`, then takes the peer's (which may have arrived
    /// earlier, or after other messages, which stay queued).
    ///
    /// # Errors
    /// The errors of [`Channel::send`] and [`Channel::recv_kind`].
    pub fn exchange_regions(&mut self, local: &Regions) -> Result<Regions> {
        self.send(&Message::Regions(local.clone()))?;
        match self.recv_kind(MessageKind::Regions, "memory descriptors")? {
            Message::Regions(r) => Ok(r),
            other => Err(self.unexpected("regions", &other)),
        }
    }

    /// A barrier: both sides send `step` and wait for the other's (other messages that arrive
    /// meanwhile stay queued).
    ///
    /// # Errors
    /// [`NetError::Unexpected`] when the peer is at another step; the errors of
    /// [`Channel::send`] and [`Channel::recv_kind`].
    pub fn barrier(&mut self, step: u32) -> Result<()> {
        self.barrier_send(step)?;
        self.barrier_wait(step)
    }

    /// A handshake's last step: a barrier ordered so that the client's success means the
    /// server's. The client sends `step` and waits; the server waits for the client's, then
    /// sends its own and is done. (With [`Channel::barrier`] the client returned as soon as
    /// the server's step came, while the server still waited for the client's: a server
    /// shed meanwhile, under load, or one whose listener closed, left the client a
    /// connection that failed at its first use.) Each side's queue pair is up before it
    /// sends, so neither sends a request before the other can receive it.
    ///
    /// # Errors
    /// As [`Channel::barrier`].
    pub(crate) fn closing_barrier(&mut self, step: u32) -> Result<()> {
        match self.role {
            Role::Client => self.barrier(step),
            Role::Server => {
                self.barrier_wait(step)?;
                self.barrier_send(step)
            }
        }
    }

    /// The first half of [`Channel::barrier`]: sends this side's `step` ([`CLOSE_STEP`] is a
    /// close's).
    pub(crate) fn barrier_send(&mut self, step: u32) -> Result<()> {
        self.send(&Message::Sync(step))
    }

    /// The second half of [`Channel::barrier`]: waits for the peer's `step`. After a
    /// timeout it may be called again for the same step.
    pub(crate) fn barrier_wait(&mut self, step: u32) -> Result<()> {
        match self.recv_kind(MessageKind::Sync, "barrier")? {
            Message::Sync(s) if s == step => Ok(()),
            // The close's step on one side only: say which side closed (an outside tester
            // read "another step" when its peer closed during its sync).
            Message::Sync(CLOSE_STEP) => Err(self.abort(NetError::Unexpected {
                expected: "the same barrier step",
                got: "the peer's close (it closed while this side waited in sync: call sync \
                      as often on both ends before closing)",
            })),
            Message::Sync(_) if step == CLOSE_STEP => Err(self.abort(NetError::Unexpected {
                expected: "the peer's close",
                got: "a sync step (the peer waits in sync while this side closes: call sync \
                      as often on both ends before closing)",
            })),
            Message::Sync(_) => Err(self.abort(NetError::Unexpected {
                expected: "the same barrier step",
                got: "another step",
            })),
            other => Err(self.unexpected("sync", &other)),
        }
    }
}

/// The barrier step of a close ([`crate::RawConn::close`]): a peer at another step is told
/// that this side closes.
pub(crate) const CLOSE_STEP: u32 = u32::MAX;

impl Drop for Channel {
    fn drop(&mut self) {
        if self.done_sending || self.peer_end.is_some() {
            return;
        }
        // Best effort and never waiting: a full socket buffer drops the notice, and the end
        // of the stream tells the peer the same thing a moment later.
        if let Ok(bytes) = self.frame(&Message::Close) {
            let _ = (&self.stream).write(&bytes);
        }
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl AsRawFd for Channel {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

/// A side's refusal of a proof that does not check (both paths).
pub(crate) const WRONG_PROOF: &str = "the peer's proof does not match the shared secret";
/// A side's refusal of a peer that demands a secret it lacks (both paths).
pub(crate) const NO_SECRET_HERE: &str =
    "the peer requires a shared secret and none is configured here";

/// The reasons a peer's opening gives when it refuses this side's authentication, as
/// [`Channel::open_with`] words them, each with what it means seen from here.
const REFUSALS: &[(&str, &str)] = &[
    (
        WRONG_PROOF,
        "the peer refused this side's proof: the two sides' shared secrets differ",
    ),
    (
        NO_SECRET_HERE,
        "this side requires a shared secret and the peer has none configured",
    ),
];

/// A peer's abort during the opening that refused the authentication is this side's
/// authentication failure ([`NetError::Auth`], `PermissionDenied`), worded from this side
/// (an outside tester's find: a dialer with a wrong secret read `PeerAborted` saying "the
/// peer's proof does not match", the peer being itself). Other errors pass unchanged.
pub(crate) fn refused_by_peer(e: NetError) -> NetError {
    let NetError::PeerAborted(why) = &e else {
        return e;
    };
    // The peer's abort carries its `Auth` error as displayed: that display's own prefix.
    let prefix = NetError::Auth(String::new()).to_string();
    let Some(reason) = why.strip_prefix(prefix.as_str()) else {
        return e;
    };
    let here = REFUSALS
        .iter()
        .find(|(theirs, _)| *theirs == reason)
        .map_or_else(
            || format!("the peer refused it: {reason}"),
            |(_, ours)| (*ours).to_string(),
        );
    NetError::Auth(here)
}

fn take_kind(q: &mut VecDeque<Message>, kind: MessageKind) -> Option<Message> {
    let i = q.iter().position(|m| m.kind() == kind)?;
    q.remove(i)
}

fn is_reset(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
    )
}

/// A server's wait for its peer, recorded in the peer's [`Standing`] while it lasts.
struct Waiting(Arc<Standing>);

impl Waiting {
    fn start(s: Arc<Standing>) -> Waiting {
        s.set_waiting(Some(Instant::now()));
        Waiting(s)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.set_waiting(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// Two ends of a loopback TCP connection: (client, server).
    fn sockets() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// The handshake's last barrier: the server sends its step only once the client's came,
    /// so a client that has the server's step knows the server is done (before, both sent
    /// first, and a server shed while it still waited left its client a dead connection).
    #[test]
    fn the_closing_barrier_answers_only_after_the_clients_step() {
        let limit = Duration::from_secs(10);
        let (c, s) = sockets();
        let mut client = Channel::new(c, Role::Client, limit).unwrap();
        let mut server = Channel::new(s, Role::Server, limit).unwrap();
        let server = std::thread::spawn(move || server.closing_barrier(0));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            client.try_recv_kind(MessageKind::Sync).unwrap().is_none(),
            "the server sent its step before the client's came"
        );
        client.closing_barrier(0).unwrap();
        server.join().unwrap().unwrap();
    }

    /// A sync on one side met by a close on the other says which side closed (an outside
    /// tester read "got another step" on both ends of a RawConn).
    #[test]
    fn a_sync_met_by_a_close_says_the_peer_closed() {
        let limit = Duration::from_secs(10);
        let (c, s) = sockets();
        let mut client = Channel::new(c, Role::Client, limit).unwrap();
        let mut server = Channel::new(s, Role::Server, limit).unwrap();
        let closing = std::thread::spawn(move || server.barrier(CLOSE_STEP));
        let syncing = client.barrier(3).unwrap_err().to_string();
        let closing = closing.join().unwrap().unwrap_err().to_string();
        assert!(syncing.contains("the peer's close"), "{syncing}");
        assert!(closing.contains("the peer waits in sync"), "{closing}");
    }

    /// A send that found the peer gone says so, and so does every send after it (an outside
    /// tester's find: they said this side had already sent its close).
    #[test]
    fn sends_after_the_peer_left_say_it_left() {
        let limit = Duration::from_secs(5);
        let (c, s) = sockets();
        let mut server = Channel::new(s, Role::Server, limit).unwrap();
        drop(c);
        // The first write may still be taken by the kernel; a later one meets the reset.
        let first_failure = (0..100)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(5));
                server.send_keepalive().err()
            })
            .expect("a send to a closed peer failed");
        assert!(
            matches!(first_failure, NetError::PeerClosed(_)),
            "{first_failure:?}"
        );
        for _ in 0..2 {
            let e = server.send_keepalive().unwrap_err();
            assert!(matches!(e, NetError::PeerClosed(_)), "{e:?}");
        }
    }
}
