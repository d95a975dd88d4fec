//! Zero-copy transfers: registered [`Buffer`]s and rendezvous (RDMA READ) of large messages.
//!
//! # Rendezvous
//! When both ends offer it ([`super::ConnOptions::rendezvous`], settled to the larger
//! threshold), a message of at least the threshold is not copied through the slots: the
//! sender exposes the message's memory for **remote read only**, for that message only, and
//! sends an RTS with the address and key. The receiver's read call registers its destination
//! (or uses a [`Buffer`]'s registration), pulls the bytes with one RDMA READ straight into
//! it, and sends DONE. How the sender exposes the message:
//!
//! - where the device has type-2 memory windows (rxe, mlx5): through a window of the
//!   driver's, bound over the message by a work request posted right before the RTS and
//!   invalidated by one posted when the DONE arrives; the memory is released once that
//!   invalidation completed ([`rsrdma_proto::Conn::send_rendezvous_window`]). The key works
//!   only through this connection's QP, so a peer of another connection on a shared
//!   [`super::ConnOptions::pd`] (or [`super::ConnOptions::shared_recv`]) cannot use it,
//!   however it learned it; nor can this peer once the DONE came. A [`Buffer`] is registered
//!   for window binding already, so its message costs no system call and no page pinning; a
//!   caller's slice (`send_msg`) is registered for the call, for binding only (no remote
//!   access of its own).
//! - on a device without windows: through a registration made for that message
//!   (`ibv_reg_mr`, remote read only) and dropped after the DONE. Its key names only that
//!   range, but while it lives any QP of the protection domain could use it.
//!
//! On close or abort, memory the NIC may touch is released only after the QP's flush (windows
//! are deallocated before the QP, which a bound window references), or is first cut off from
//! the NIC (QP to ERROR, then deregistration) when a caller's own slice must be handed back.
//!
//! - `send_msg` of a large slice registers the slice for the call and returns after the
//!   peer's DONE (and its window's invalidation), so it waits until the peer reads the
//!   message. When its write timeout (or a close) ends the wait after the RTS went out, it
//!   asks the message back (WITHDRAW, where both ends settled withdrawal): the peer drops it
//!   unread and answers WITHDRAWN (the call says `Timeout`, nothing was delivered, the
//!   connection goes on), or finishes a READ it began and answers DONE (the call succeeds).
//!   An answer that does not come within [`RDV_GRACE`] (a peer without withdrawal, or one
//!   whose process stopped) fails the connection rather than return memory the peer may
//!   still read.
//! - `recv_buffer`, and `recv_msg_into` without a read timeout, receive rendezvous messages
//!   with no copy; `recv_msg_into` with a read timeout reads them into the connection's
//!   memory and copies (so its timeout holds and leaves the connection usable);
//!   `recv_msg` allocates the message's vector and reads into it; `read` (byte stream) reads
//!   into a vector the core then serves from. Eager messages (below the threshold, or from a
//!   peer without rendezvous) are necessarily copied out of the receive slots.
//! - `send_buffer` sends a [`Buffer`] with no copy of any size: at or above the threshold by
//!   rendezvous (in flight until the peer's DONE), below it eagerly as a *lent* message
//!   ([`rsrdma_proto::Conn::send_msg_lent`]): each fragment is one SEND of two SGEs, its
//!   16-byte header from a send slot and its payload straight from the buffer (the wire is
//!   the same as a copied message's), and the buffer is in flight until the completion
//!   covering its last fragment (always signalled) is reaped. Only a device with a single
//!   send SGE makes the eager path copy through the slots.
//!   [`Conn::start_send_buffer`] returns once the message is queued; [`Conn::wait_buffer`]
//!   waits for the buffer.
//!
//! A READ in flight always completes or fails before the destination is given back: a call
//! whose READ writes the caller's slice (`recv_msg_into` without a read timeout) and fails
//! mid-READ keeps waiting (up to [`RDV_GRACE`]), and then fails the connection and
//! deregisters the destination before returning.

use super::buffer::Buffer;
use super::driver::Driver;
use super::op::{Link, Op};
use super::shared::OfferEnd;
use super::sides::Side;
use super::Conn;
use crate::error::{from_core, NetError, Result};
use rsrdma::{AccessFlags, Mr, Pd};
use rsrdma_proto::{Recv, Step};
use std::time::Duration;

/// How long a call whose memory is still exposed to (or being written by) the NIC waits past
/// its own timeout before it fails the connection to get the memory back.
pub const RDV_GRACE: Duration = Duration::from_secs(10);

/// What a read says ([`NetError::PeerClosed`]) when the peer closed before a large message
/// it offered (its RTS came) could be read: its memory went with it.
pub(crate) const UNREAD_OFFER: &str = "the read of a large message it had offered";

/// How [`Conn::start_send_buffer`] queues a buffer in the core.
#[derive(Clone, Copy)]
enum BufferSend {
    /// Eager fragments that read the buffer in place.
    Lent { addr: u64, lkey: u32 },
    /// An RTS exposing the buffer through a per-message registration.
    Rendezvous { addr: u64, rkey: u32 },
    /// An RTS exposing the buffer through a window the core binds first.
    Window { addr: u64 },
}

/// The wait until a buffer is no longer in flight (its send released, or the READ a call
/// gave up landed), for either face; a failed connection ends it (the buffer is released at
/// the teardown, after the QP's flush).
pub(crate) struct BufferIdle<'a> {
    pub(crate) name: &'static str,
    pub(crate) buf: &'a Buffer,
}

impl Op for BufferIdle<'_> {
    type Out = ();

    fn name(&self) -> &'static str {
        self.name
    }

    fn side(&self) -> Option<Side> {
        None
    }

    fn poll(&mut self, d: &mut Driver) -> Result<Option<()>> {
        if !self.buf.is_busy() {
            return Ok(Some(()));
        }
        // The peer left after its FIN with the buffer's message unread (one it read is
        // released by then: `Driver::release_rendezvous`) or a READ into it unfinished:
        // nothing will release it through the ended transport. The buffer stays in flight
        // until the teardown's flush, as after a failure.
        if d.peer_gone() {
            return Err(NetError::PeerGone { op: self.name });
        }
        d.check_failed().map(|()| None)
    }
}

/// How [`Conn::prepare_send_buffer`] sends a buffer's message.
pub(crate) enum PreparedSend {
    /// Queued with no copy by this operation.
    Op(SendBuffer),
    /// Copied through the slots (a device with one send SGE): send its bytes as a message
    /// lent for the call; the buffer is in flight until this is dropped.
    Copy(super::buffer::InFlight),
}

/// A buffer's message queued in the core (`Conn::start_send_buffer`), as the owner of the
/// send side. Once queued, the driver keeps what exposes the buffer until the core releases
/// it; not queued, the op's drop releases it (the registration, then the hold).
pub(crate) struct SendBuffer {
    queue: BufferSend,
    len: usize,
    parts: Option<(Option<Mr>, super::buffer::InFlight)>,
}

/// A buffer's message as [`SendBuffer`] queued it.
#[derive(Clone, Copy)]
pub(crate) struct Queued {
    /// Its number.
    pub(crate) msg: u64,
    /// It goes by rendezvous (else lent, eagerly).
    pub(crate) rendezvous: bool,
}

impl Op for SendBuffer {
    type Out = Queued;

    fn name(&self) -> &'static str {
        "send_buffer"
    }

    fn side(&self) -> Option<Side> {
        Some(Side::Send)
    }

    fn poll(&mut self, d: &mut Driver) -> Result<Option<Queued>> {
        let (name, len) = (self.name(), self.len);
        if d.peer_gone() {
            return Err(NetError::PeerGone { op: name });
        }
        let mut window = None;
        let queued = match self.queue {
            BufferSend::Lent { addr, lkey } => d.core().send_msg_lent(len, addr, lkey),
            BufferSend::Rendezvous { addr, rkey } => d.core().send_rendezvous(len, addr, rkey),
            BufferSend::Window { addr } => match d.queue_through_window(name, len, addr)? {
                Some((msg, w)) => {
                    window = Some(w);
                    Ok(Step::Done(msg))
                }
                None => Ok(Step::Blocked),
            },
        };
        match queued {
            Ok(Step::Done(msg)) => {
                if let Some((mr, hold)) = self.parts.take() {
                    d.hold_send(msg, window, mr, Some(hold));
                }
                let rendezvous = !matches!(self.queue, BufferSend::Lent { .. });
                Ok(Some(Queued { msg, rendezvous }))
            }
            Ok(Step::Blocked) => Ok(None),
            Err(e) => Err(from_core(e)),
        }
    }
}

/// What one owned receive attempt found.
pub(crate) enum RecvStep {
    /// A message (its length) or the end of the stream.
    Got(Option<usize>),
    /// The head message comes by rendezvous: pull it (this many bytes).
    Rendezvous(usize),
}

/// Where a call's rendezvous READ lands (a read into memory of the driver's own is
/// [`Driver::start_owned_read`]).
pub(crate) enum Dest<'a> {
    /// The caller's slice, registered for the call.
    Slice(&'a mut [u8]),
    /// A registered buffer.
    Buffer(&'a Buffer),
}

/// What [`Conn::pull`] did.
pub(crate) enum Pulled {
    /// The message is in the destination: its length.
    Done(usize),
    /// The head changed (another reader took it): read again.
    Retry,
}

impl Conn {
    /// Whether a message of `len` bytes goes by rendezvous (an RTS the peer READs from):
    /// at or above the settled threshold, when both ends offered one.
    pub(super) fn by_rendezvous(&self, len: usize) -> bool {
        self.info
            .settled
            .rendezvous()
            .is_some_and(|t| len >= t as usize)
    }

    /// A new registered buffer of `len` bytes on this connection's protection domain (local
    /// access only).
    ///
    /// # Errors
    /// [`NetError::Closed`] after close; the registration's error.
    pub fn alloc_buffer(&self, len: usize) -> Result<Buffer> {
        Buffer::new(&self.pd("alloc_buffer")?, len)
    }

    /// Sends the first `len` bytes of `buf` as one message and returns when `buf` may be
    /// reused, with no copy of the payload: at or above the rendezvous threshold the peer
    /// reads it with RDMA READ (this waits for its DONE); below it each fragment's SEND takes
    /// its payload straight from `buf` (this waits for the last fragment's completion).
    ///
    /// When the write timeout ends the wait, the message is taken back where it can be: one
    /// the peer was offered (rendezvous) is asked back, and one of which no fragment went
    /// out is withdrawn; the call then says `Timeout` with `buf` free and nothing of the
    /// message delivered (as `send_msg`), or succeeds when the peer had begun to read it
    /// (a round trip late). Only a message below the threshold that had begun to go out
    /// (or one a peer without withdrawal was offered) goes on: `Timeout` with `buf` still
    /// in flight ([`Buffer::is_busy`]) until it went whole.
    ///
    /// # Errors
    /// [`NetError::BufferBusy`] when `buf` is in flight; [`NetError::BadBuffer`] for a buffer
    /// of another protection domain or `len` beyond it; otherwise as [`Conn::send_msg`]
    /// (with [`Conn::wait_buffer`]'s errors).
    pub fn send_buffer(&self, buf: &Buffer, len: usize) -> Result<()> {
        let queued = match self.prepare_send_buffer(buf, len)? {
            PreparedSend::Op(mut op) => self.run(&mut op, self.shared.write_timeout.get())?,
            PreparedSend::Copy(hold) => {
                return self.send_lent("send_buffer", &[hold.bytes(len)]);
            }
        };
        match self.wait_idle("send_buffer", buf, self.shared.write_timeout.get()) {
            Err(e @ NetError::Timeout { .. }) => self.take_back(buf, queued, e),
            Err(e @ NetError::Closed { .. }) => self.closed_under(queued.msg, e),
            r => r,
        }
    }

    /// A wait for buffer message `msg` that found the driver detached (`closed`): `Ok` when
    /// the message was done with before the detach (the close may have come between its
    /// end and the wait's look at it), else `closed`.
    pub(crate) fn closed_under(&self, msg: u64, closed: NetError) -> Result<()> {
        match self.end_at_detach(msg) {
            Some(OfferEnd::Read) => Ok(()),
            _ => Err(closed),
        }
    }

    /// A `send_buffer` whose wait timed out (`timeout`) takes its message `q` back where it
    /// can: withdrawn before it went (`timeout`, `buf` free), asked back from the peer and
    /// dropped unread (`timeout`, `buf` free), or read by the peer meanwhile (`Ok`).
    /// Otherwise `timeout`, with `buf` in flight until the message went whole.
    fn take_back(&self, buf: &Buffer, q: Queued, timeout: NetError) -> Result<()> {
        let Queued { msg, rendezvous } = q;
        let mut first = true;
        let asked = self.block("send_buffer", Some(RDV_GRACE), |d| {
            if std::mem::take(&mut first) {
                let withdrawn = if rendezvous {
                    d.core().withdraw_rendezvous(msg)
                } else {
                    d.core().withdraw_lent(msg)
                };
                if withdrawn {
                    // Never exposed: the registration (or the unbound window) and the hold go.
                    d.drop_send(msg, true);
                    return Ok(Some(true));
                }
                if !(rendezvous && d.core().ask_withdraw(msg)) {
                    return Ok(Some(false));
                }
            }
            if !buf.is_busy() {
                return Ok(Some(d.core().take_withdrawn(msg)));
            }
            d.check_failed().map(|()| None)
        });
        match asked {
            Ok(false) if !buf.is_busy() => Ok(()),
            // A close detached the driver before this looked.
            Err(NetError::Closed { .. }) if self.end_at_detach(msg) == Some(OfferEnd::Read) => {
                Ok(())
            }
            _ => Err(timeout),
        }
    }

    /// Starts sending the first `len` bytes of `buf`: returns once the message is queued.
    /// `buf` stays in flight until the peer's DONE (rendezvous) or the completion of its
    /// last fragment (eager) ([`Buffer::is_busy`], [`Conn::wait_buffer`]); dropping `buf`
    /// meanwhile is safe (the connection keeps the memory until then, or until its
    /// teardown's flush).
    ///
    /// # Errors
    /// As [`Conn::send_buffer`].
    pub fn start_send_buffer(&self, buf: &Buffer, len: usize) -> Result<()> {
        match self.prepare_send_buffer(buf, len)? {
            PreparedSend::Op(mut op) => {
                self.run(&mut op, self.shared.write_timeout.get()).map(drop)
            }
            // Not queued: `op.parts` drops the registration, then the hold (the buffer is idle).
            PreparedSend::Copy(hold) => self.send_lent("send_buffer", &[hold.bytes(len)]),
        }
    }

    /// What [`Conn::start_send_buffer`] does before it waits, for either face: checks the
    /// buffer and the length, marks the buffer in flight, and chooses how its message goes.
    pub(crate) fn prepare_send_buffer(&self, buf: &Buffer, len: usize) -> Result<PreparedSend> {
        const OP: &str = "send_buffer";
        buf.check_for(OP, &self.pd(OP)?, len)?;
        let max = self.info.settled.max_message;
        if len > max as usize {
            return Err(NetError::MessageTooLarge { len, max });
        }
        let hold = buf.start(OP)?;
        let rendezvous = self.by_rendezvous(len);
        if !rendezvous && self.send_sges() < 2 {
            return Ok(PreparedSend::Copy(hold));
        }
        // Eager: the core lends the buffer's range to each fragment's SEND (second SGE).
        // Rendezvous: the peer READs it through a window of the driver's bound for this
        // message (the buffer's registration allows binding where the device has type-2
        // windows), else through a registration made for this message only.
        let windowed = rendezvous && buf.mr_allows_windows();
        let (queue, mr) = if windowed {
            (BufferSend::Window { addr: hold.addr() }, None)
        } else if rendezvous {
            let pd = self.pd(OP)?;
            // SAFETY: the buffer's allocation stays alive and unmoved while `hold` (kept by
            // the driver until the DONE or the flush) lives, and the registration is dropped
            // before `hold`; remote read only: the NIC never writes it.
            let mr = unsafe {
                Mr::register(&pd, hold.addr() as *mut u8, len, AccessFlags::REMOTE_READ)
            }?;
            (
                BufferSend::Rendezvous {
                    addr: mr.addr(),
                    rkey: mr.rkey(),
                },
                Some(mr),
            )
        } else {
            (
                BufferSend::Lent {
                    addr: hold.addr(),
                    lkey: hold.lkey(),
                },
                None,
            )
        };
        Ok(PreparedSend::Op(SendBuffer {
            queue,
            len,
            parts: Some((mr, hold)),
        }))
    }

    /// Waits (up to the write timeout) until `buf` is no longer in flight.
    ///
    /// # Errors
    /// [`NetError::Timeout`]; [`NetError::ConnFailed`] (a buffer in flight on a failed
    /// connection is released at its teardown, after the QP's flush); [`NetError::Closed`].
    pub fn wait_buffer(&self, buf: &Buffer) -> Result<()> {
        self.wait_idle("wait_buffer", buf, self.shared.write_timeout.get())
    }

    /// Waits up to `timeout` until `buf` is no longer in flight.
    fn wait_idle(&self, name: &'static str, buf: &Buffer, timeout: Option<Duration>) -> Result<()> {
        if !buf.is_busy() {
            return Ok(());
        }
        self.run(&mut BufferIdle { name, buf }, timeout)
    }

    /// Receives the next message into `buf`: `Ok(Some(len))`, or `Ok(None)` at the end of
    /// the stream. A rendezvous message lands in `buf` straight from the peer's memory (no
    /// copy); an eager one is copied out of the receive slots. A call that times out while
    /// the READ lands leaves `buf` in flight until it landed, and the message goes to the next
    /// read; a call on a buffer in flight waits for it (within the read timeout).
    ///
    /// # Errors
    /// [`NetError::ShortBuffer`] when the message is longer than `buf` (it stays queued);
    /// [`NetError::BadBuffer`] for another protection domain; otherwise as
    /// [`Conn::recv_msg`].
    pub fn recv_buffer(&self, buf: &mut Buffer) -> Result<Option<usize>> {
        const OP: &str = "recv_buffer";
        buf.check_for(OP, &self.pd(OP)?, 0)?;
        self.wait_idle(OP, buf, self.shared.read_timeout.get())?;
        loop {
            let step =
                self.recv_lent_step(OP, buf.as_mut_slice()?, self.shared.read_timeout.get())?;
            match step {
                RecvStep::Got(n) => return Ok(n),
                RecvStep::Rendezvous(len) => match self.pull(OP, len, Dest::Buffer(buf))? {
                    Pulled::Done(n) => return Ok(Some(n)),
                    Pulled::Retry => continue,
                },
            }
        }
    }

    /// `recv_msg`: a rendezvous message is read into the driver's own vector first
    /// ([`Driver::start_owned_read`]), which then becomes the message with no copy.
    pub(super) fn recv_msg_pulling(&self) -> Result<Option<Vec<u8>>> {
        let timeout = self.shared.read_timeout.get();
        self.block("recv_msg", timeout, recv_msg_attempt)
    }

    /// Send SGEs the queue pair has (2 for lent frames; 0 after close).
    fn send_sges(&self) -> u32 {
        let st = self.shared.lock();
        st.driver.as_ref().map_or(0, |d| d.qp().caps().max_send_sge)
    }

    /// The connection's protection domain.
    pub(crate) fn pd(&self, op: &'static str) -> Result<Pd> {
        let st = self.shared.lock();
        let d = st.driver.as_ref().ok_or(NetError::Closed { op })?;
        Ok(d.pd().clone())
    }

    /// Reads the head rendezvous message (of `len` bytes, as `Recv::NeedsRead` said) straight
    /// into `dest`, the caller's memory (zero copy). A call that gives up while the READ writes a
    /// `Buffer` hands the READ to the driver (the message then reaches the core, and the next
    /// read); one that writes a slice waits for it (bounded), else fails the connection, as
    /// the slice goes back to the caller when the call returns.
    pub(super) fn pull(&self, name: &'static str, len: usize, dest: Dest<'_>) -> Result<Pulled> {
        let timeout = self.shared.read_timeout.get();
        let mut op = Pull::new(name, len, dest, &self.pd(name)?)?;
        let mut r = self.run(&mut op, timeout);
        if op.writes_caller_memory() && r.is_err() {
            if matches!(r, Err(NetError::Timeout { .. })) {
                r = self.run(&mut op, Some(RDV_GRACE));
            }
            if r.is_err() {
                let mut st = self.shared.lock();
                if let Some(d) = st.driver.as_mut() {
                    d.abort_transfer();
                }
                self.shared.changed(&mut st);
            }
        }
        // The registration goes before the memory it covers (the caller's slice).
        drop(op);
        r
    }
}

/// What a rendezvous READ into a caller's buffer needs of the connection beyond [`Link`]:
/// the driver keeps the buffer while the READ writes it, and takes over a READ whose call
/// gave up. The simulated link of the host tests (`op_sim`) is the other implementation.
pub(crate) trait ReadLink: Link {
    /// What keeps a buffer's allocation while a READ writes it.
    type Hold;
    /// Keeps the buffer a READ lands in until [`ReadLink::end_read`].
    fn hold_read(&mut self, hold: Self::Hold);
    /// The READ's message was taken: its buffer is free.
    fn end_read(&mut self);
    /// The call reading into the held buffer gave up: when the READ lands, the message goes
    /// into the core (as the head, for the next read) and the buffer is freed.
    fn orphan_buffer_read(&mut self, len: usize);
    /// The connection's failure, if it failed.
    fn check_failed(&mut self) -> Result<()> {
        match self.core().error() {
            Some(e) => Err(NetError::ConnFailed(e.clone())),
            None => Ok(()),
        }
    }
}

impl ReadLink for Driver {
    type Hold = super::buffer::InFlight;

    fn hold_read(&mut self, hold: Self::Hold) {
        Driver::hold_read(self, hold);
    }

    fn end_read(&mut self) {
        Driver::end_read(self);
    }

    fn orphan_buffer_read(&mut self, len: usize) {
        Driver::orphan_buffer_read(self, len);
    }
}

/// A rendezvous READ of the head message straight into the caller's memory (`H`: what holds
/// a buffer's allocation, [`ReadLink::Hold`]).
pub(crate) struct Pull<'a, H = super::buffer::InFlight> {
    name: &'static str,
    len: usize,
    /// Where it lands: `addr`, `lkey`, capacity.
    at: (u64, u32, usize),
    /// The slice's registration, dropped once the READ landed (or with the op).
    reg: Option<Mr>,
    /// The buffer's allocation, with the driver once the READ started.
    hold: Option<H>,
    /// The READ was started (into `at`).
    started: bool,
    /// The slice the READ writes, borrowed for the op's life.
    _slice: std::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> Pull<'a> {
    /// Prepares the destination: registers a slice (local write), or marks a buffer in
    /// flight.
    ///
    /// # Errors
    /// [`NetError::ShortBuffer`] when `dest` is shorter than `len`; the registration's error;
    /// [`NetError::BufferBusy`].
    pub(crate) fn new(name: &'static str, len: usize, dest: Dest<'a>, pd: &Pd) -> Result<Pull<'a>> {
        let (at, reg, hold) = match dest {
            Dest::Slice(b) => {
                if b.len() < len {
                    return Err(NetError::ShortBuffer { needed: len });
                }
                // SAFETY: the slice is borrowed for the op's life (`_slice`); the
                // registration is dropped before the op, and only after the READ completed or
                // the QP was moved to ERROR (after which deregistering cuts the NIC off): the
                // blocking `pull` never returns before either.
                let mr =
                    unsafe { Mr::register(pd, b.as_mut_ptr(), len, AccessFlags::LOCAL_WRITE) }?;
                ((mr.addr(), mr.lkey(), len), Some(mr), None)
            }
            Dest::Buffer(b) => {
                if b.len() < len {
                    return Err(NetError::ShortBuffer { needed: len });
                }
                let h = b.start(name)?;
                ((h.addr(), h.lkey(), b.len()), None, Some(h))
            }
        };
        Ok(Pull {
            name,
            len,
            at,
            reg,
            hold,
            started: false,
            _slice: std::marker::PhantomData,
        })
    }

    /// The READ may be writing memory the call must give back (a slice's), not yet landed.
    fn writes_caller_memory(&self) -> bool {
        self.started && self.reg.is_some()
    }
}

#[cfg(test)]
impl<H> Pull<'static, H> {
    /// A READ of `len` bytes into a buffer at `addr`/`lkey` of `cap` bytes, `hold` keeping it
    /// (the host simulation's buffers).
    pub(crate) fn into_buffer(
        name: &'static str,
        len: usize,
        (addr, lkey, cap): (u64, u32, usize),
        hold: H,
    ) -> Pull<'static, H> {
        Pull {
            name,
            len,
            at: (addr, lkey, cap),
            reg: None,
            hold: Some(hold),
            started: false,
            _slice: std::marker::PhantomData,
        }
    }
}

impl<L: ReadLink> Op<L> for Pull<'_, L::Hold> {
    type Out = Pulled;

    fn name(&self) -> &'static str {
        self.name
    }

    fn side(&self) -> Option<Side> {
        None
    }

    fn poll(&mut self, d: &mut L) -> Result<Option<Pulled>> {
        if d.peer_gone() && !d.core().read_landed() {
            // The peer left after its FIN: its memory went with it (and nothing is posted
            // any more), so a rendezvous message it left behind cannot be read.
            return Err(NetError::PeerClosed(UNREAD_OFFER));
        }
        if !self.started {
            if d.core().pending_read() != Some(self.len) {
                d.check_failed()?;
                return Ok(Some(Pulled::Retry));
            }
            let (addr, lkey, cap) = self.at;
            return match d.core().start_read(addr, lkey, cap) {
                Ok(Step::Done(())) => {
                    self.started = true;
                    if let Some(h) = self.hold.take() {
                        d.hold_read(h);
                    }
                    Ok(None)
                }
                Ok(Step::Blocked) => Ok(None),
                Err(e) => Err(from_core(e)),
            };
        }
        d.check_failed()?;
        if !d.core().read_landed() {
            return Ok(None);
        }
        // Landed: the NIC is done with the destination.
        self.reg = None;
        self.started = false;
        let n = d.core().take_read().unwrap_or(self.len);
        d.end_read();
        Ok(Some(Pulled::Done(n)))
    }

    /// A READ into a buffer goes on without the call: the driver keeps the buffer and moves
    /// the message into the core when it lands (F3: nothing wedges, nothing is lost). A READ
    /// into a slice is the blocking `pull`'s to wait for.
    fn abandon(&mut self, d: &mut L, r: Result<Pulled>) -> Result<Pulled> {
        if self.started && self.reg.is_none() {
            self.started = false;
            d.orphan_buffer_read(self.len);
        }
        r
    }
}

/// One attempt of `recv_msg`, for either face: a rendezvous message at the head is read into
/// the driver's own vector first, and is then taken as any message.
pub(super) fn recv_msg_attempt(d: &mut Driver) -> Result<Option<Option<Vec<u8>>>> {
    match d.core().recv_msg() {
        Ok(Recv::Data(m)) => Ok(Some(Some(m))),
        Ok(Recv::Eof) => Ok(Some(None)),
        Ok(Recv::NeedsRead { len }) => start_owned_read(d, len),
        Ok(Recv::Blocked) => reading_from_gone_peer(d),
        Err(e) => Err(from_core(e)),
    }
}

/// One attempt of `recv_msg_into`'s copying form (the async face, and the blocking one with a
/// read timeout): as [`recv_msg_attempt`], then copied into `buf`; a message longer than
/// `buf` stays queued (`ShortBuffer`).
pub(super) fn recv_msg_into_attempt(
    d: &mut Driver,
    buf: &mut [u8],
) -> Result<Option<Option<usize>>> {
    match d.core().recv_msg_into(buf) {
        Ok(Recv::Data(n)) => Ok(Some(Some(n))),
        Ok(Recv::Eof) => Ok(Some(None)),
        Ok(Recv::NeedsRead { len }) if len > buf.len() => {
            Err(NetError::ShortBuffer { needed: len })
        }
        Ok(Recv::NeedsRead { len }) => start_owned_read(d, len),
        Ok(Recv::Blocked) => reading_from_gone_peer(d),
        Err(e) => Err(from_core(e)),
    }
}

/// One attempt of a stream read, for either face (0 is the end of the stream).
pub(super) fn read_attempt(d: &mut Driver, buf: &mut [u8]) -> Result<Option<usize>> {
    match d.core().read(buf) {
        Ok(Recv::Data(n)) => Ok(Some(n)),
        Ok(Recv::Eof) => Ok(Some(0)),
        Ok(Recv::NeedsRead { len }) => start_owned_read(d, len),
        Ok(Recv::Blocked) => reading_from_gone_peer(d),
        Err(e) => Err(from_core(e)),
    }
}

/// Starts the READ of the head message into the driver's memory; the caller steps again.
fn start_owned_read<T>(d: &mut Driver, len: usize) -> Result<Option<T>> {
    if d.peer_gone() {
        // The peer left after its FIN: its memory went with it (and nothing is posted any
        // more), so a rendezvous message it left behind cannot be read.
        return Err(NetError::PeerClosed(UNREAD_OFFER));
    }
    d.start_owned_read(len)?;
    Ok(None)
}

/// A read that would block: the peer's leaving ends a READ that can no longer land.
fn reading_from_gone_peer<T>(d: &mut Driver) -> Result<Option<T>> {
    if d.read_stranded() {
        return Err(NetError::PeerClosed(UNREAD_OFFER));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::super::ConnOptions;
    use rsrdma_proto::FEATURE_RENDEZVOUS;

    #[test]
    fn rendezvous_is_offered_by_default_and_a_zero_threshold_is_refused() {
        let o = ConnOptions::default();
        assert_eq!(o.rendezvous, Some(256 * 1024));
        let p = o.proto_config(64).params();
        assert_eq!(p.features & FEATURE_RENDEZVOUS, FEATURE_RENDEZVOUS);
        assert_eq!(p.rdv_threshold, 256 * 1024);
        let off = ConnOptions::default()
            .rendezvous(None)
            .proto_config(64)
            .params();
        assert_eq!((off.features, off.rdv_threshold), (0, 0));
        let e = ConnOptions::default()
            .rendezvous(Some(0))
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("threshold"), "{e}");
    }
}
