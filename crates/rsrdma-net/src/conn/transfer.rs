//! Blocking transfers that lend the caller's memory to the protocol core for the whole call.
//!
//! A blocking `send_msg` holds the caller's slice until it returns, so the core sends
//! fragments straight from it as credits come back ([`rsrdma_proto::Conn::send_msg_borrowed`])
//! instead of copying the unsent rest of a large message; `recv_msg_into` holds the caller's
//! buffer, so fragments go from their receive slots straight into it
//! ([`rsrdma_proto::Conn::recv_msg_direct`]) instead of through a reassembly buffer. A
//! connection thus needs no memory beyond its slots for a message of any size.
//!
//! While the core holds a borrowed slice only its owner may continue the transfer, so each
//! direction has one owner at a time ([`Side`]): other senders (or `recv_msg_into` callers)
//! wait for it like for any other resource, within their own timeouts. The send owner holds
//! the side for a whole batch, which keeps a batch contiguous. A call that gives up (timeout,
//! close) hands its transfer back: a message already partly sent has its rest copied into
//! the core (it is then sent whole, and the call reports success), one not begun is
//! withdrawn; the part of a message already received into the caller's buffer is copied
//! back into the core, so the message stays whole for the next read. Each transfer is an
//! operation value ([`super::op`]: `SendMsg`, `RecvInto`), run by `Conn::run`, which takes
//! and frees the side and calls its `abandon` once when it gives up.

use super::driver::Driver;
use super::op::{Link, Op};
use super::rendezvous::{Dest, Pulled, RecvStep, RDV_GRACE};
use super::shared::OfferEnd;
use super::sides::Side;
use super::Conn;
use crate::error::{from_core, NetError, Result};
use rsrdma::{AccessFlags, Mr};
use rsrdma_proto::{Recv, Step};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// A rendezvous send of a caller's slice: once the core took it, the message number; and its
/// registration (remote read only), unless a window exposes it (then the registration, for
/// window binding only, is with the driver, which the call asks to drop it before it
/// returns).
pub(crate) struct SliceRdv {
    msg: Option<u64>,
    mr: Option<Mr>,
}

#[cfg(test)]
impl SliceRdv {
    /// Message `msg` queued by a link that registers nothing (the host simulation).
    pub(crate) fn queued(msg: u64) -> SliceRdv {
        SliceRdv {
            msg: Some(msg),
            mr: None,
        }
    }

    /// The message number, once the core took it.
    pub(crate) fn msg(&self) -> Option<u64> {
        self.msg
    }
}

impl Conn {
    /// The fast path of a blocking send: one locked step that sends a message of one frame
    /// (below the rendezvous threshold) when nobody owns the send side and a credit and a
    /// send slot are free. `Ok(false)`: nothing was sent; take the owned way
    /// ([`Conn::send_lent`]), which waits. Skips the owned way's set-up (its operation, the
    /// side's flag and a second lock for a give-up), and polls the CQ only when the send
    /// cannot go at once (the owned way's first step then does): completions free credits
    /// and slots, which a send that fits does not need, and the core bounds what is in
    /// flight, so the CQ cannot overflow meanwhile. A message of one inline frame skips the
    /// core's work queue too ([`Driver::send_inline_now`]). What each saves is measured in the
    /// guide's performance chapter.
    pub(super) fn send_at_once(&self, op: &'static str, msg: &[u8]) -> Result<bool> {
        let one_frame = msg.len() <= self.info.settled.frame_payload() as usize;
        if !one_frame || self.by_rendezvous(msg.len()) {
            return Ok(false);
        }
        let sent = self.step_once(op, &Cell::new(0), None, &mut |d| {
            if d.owners().owned(Side::Send) || d.peer_gone() {
                return Ok(None);
            }
            if d.send_inline_now(msg) {
                return Ok(Some(()));
            }
            match d.core().send_msg_borrowed(msg) {
                Ok(Step::Done(true)) => Ok(Some(())),
                // No credit or slot: a message of one frame went nowhere, so this withdraws
                // it (`false`); were it kept, it would be sent whole from a copy.
                Ok(Step::Done(false)) => Ok(d.core().send_unborrow(msg).then_some(())),
                Ok(Step::Blocked) => Ok(None),
                Err(e) => Err(from_core(e)),
            }
        })?;
        Ok(sent.is_some())
    }

    /// The lean way of a blocking receive: steps (waiting as the poll mode says, up to
    /// `timeout`) until a whole message is at the head (or the stream ended), and takes it.
    /// `Ok(None)`: take the owned way ([`Conn::recv_lent`]) instead, because another call
    /// owns the receive side, the head message comes by rendezvous, or it has begun arriving
    /// in several fragments (too large for `buf`, which is at most a frame: the owned way
    /// reports that with the length it needs). Each step costs less than an owned one (no
    /// side flag, nothing to hand back): in a ping-pong the waiting step and the one that
    /// finds the message are on the round trip's path. `buf` is offered to the completions
    /// each step reaps (`Driver::progress_taking`): a whole message that arrives as the next
    /// one to read goes from its slot into `buf` at once, not through the core's read queue
    /// and a second call into the core.
    pub(super) fn recv_unowned(
        &self,
        op: &'static str,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<Option<usize>>> {
        self.block_taking(op, timeout, Some(buf), |d, take| {
            if let Some(n) = take.got {
                return Ok(Some(Some(Some(n))));
            }
            if d.owners().owned(Side::Recv) {
                return Ok(Some(None));
            }
            match d.core().recv_msg_into(take.buf()) {
                Ok(Recv::Data(n)) => Ok(Some(Some(Some(n)))),
                Ok(Recv::Eof) => Ok(Some(Some(None))),
                Ok(Recv::NeedsRead { .. }) => Ok(Some(None)),
                Ok(Recv::Blocked) if d.core_ref().recv_incomplete() => Ok(Some(None)),
                Ok(Recv::Blocked) => Ok(None),
                Err(e) => Err(from_core(e)),
            }
        })
    }

    /// Sends `msgs` in order, each from the caller's memory, as one owner of the send side.
    /// On an error the messages before the failing one are sent, and that one too when it
    /// had begun; a single message that had begun when the timeout hit is sent whole and the
    /// call succeeds.
    pub(super) fn send_lent(&self, name: &'static str, msgs: &[&[u8]]) -> Result<()> {
        let mut op = SendMsg {
            name,
            msgs,
            next: 0,
            rdv: None,
            threshold: self.info.settled.rendezvous().map(|t| t as usize),
        };
        let r = self.run(&mut op, self.shared.write_timeout.get());
        let Some(SliceRdv { msg: Some(msg), mr }) = op.rdv.take() else {
            return r;
        };
        // The RTS is out: the peer may read the caller's memory until its DONE. A call that
        // gave up asks the message back (a peer that speaks withdrawal drops it unread and
        // says so, or finishes the read it began); either way wait for the answer (bounded),
        // else cut the NIC off before the registration goes.
        let mut ask = r.is_err();
        let mut withdrawn = false;
        // The peer left after its FIN before its answer: whether it had read the message.
        let mut gone_having_read = None;
        let mut done = self.block(name, Some(RDV_GRACE), |d| {
            if std::mem::take(&mut ask) {
                d.core().ask_withdraw(msg);
            }
            if d.core_ref().rendezvous_released(msg) {
                withdrawn = d.core().take_withdrawn(msg);
                d.drop_send(msg, true);
                return Ok(Some(()));
            }
            // Nothing more comes through the ended transport: the memory is cut off now
            // (see `Driver::release_offer_of_gone_peer`); delivered if its DONE came.
            if d.peer_gone() {
                gone_having_read = Some(d.release_offer_of_gone_peer(msg));
                return Ok(Some(()));
            }
            d.check_failed().map(|()| None)
        });
        if let Some(read) = gone_having_read {
            drop(mr);
            return match (read, r) {
                (true, _) => Ok(()),
                (false, Err(e)) => Err(e),
                (false, Ok(())) => Err(NetError::PeerGone { op: name }),
            };
        }
        // A close that detached the driver before this looked says what the answer was.
        if let (Err(NetError::Closed { .. }), Some(end)) = (&done, self.end_at_detach(msg)) {
            if end != OfferEnd::Unanswered {
                withdrawn = end == OfferEnd::Withdrawn;
                done = Ok(());
            }
        }
        let mut failed = None;
        if done.is_err() {
            let mut st = self.shared.lock();
            if let Some(d) = st.driver.as_mut() {
                d.abort_transfer();
                d.drop_send(msg, false);
                failed = d.core_ref().error().cloned();
            }
            self.shared.changed(&mut st);
        }
        drop(mr);
        // The connection was failed to get the caller's memory back: whatever ended the run
        // (a timeout among them), the connection is not usable any more.
        if let Some(e) = failed {
            return Err(NetError::ConnFailed(e));
        }
        match (r, done) {
            // Released unread at our request: nothing of it was delivered, as the run's
            // error (a timeout, a close) says.
            (r @ Err(_), Ok(())) if withdrawn => r,
            // Released: the peer read it whole, whatever ended the run meanwhile.
            (Err(_), Ok(())) if msgs.len() == 1 => Ok(()),
            (Ok(()), Err(e)) => Err(e),
            (r, _) => r,
        }
    }

    /// Receives the next message into `buf`, its fragments straight from their slots, as the
    /// one owner of the direct receive; a rendezvous message is read straight into `buf`.
    pub(super) fn recv_lent(
        &self,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<Option<usize>> {
        const OP: &str = "recv_msg_into";
        let start = Instant::now();
        loop {
            match self.recv_lent_step(OP, &mut *buf, timeout)? {
                RecvStep::Got(n) => return Ok(n),
                // With a read timeout, a rendezvous message is read into the connection's
                // memory and then copied: a call that times out leaves that READ landing
                // (the message goes to the next read) and the connection usable. A READ
                // straight into `buf` must end before `buf` is handed back, so such a call
                // waited past its timeout (up to RDV_GRACE) and then failed the connection
                // (an outside tester's find: a 20 ms read waited 10 s, then the connection
                // was gone).
                RecvStep::Rendezvous(_) if timeout.is_some() => {
                    let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
                    let r = self.block(OP, left, |d| {
                        super::rendezvous::recv_msg_into_attempt(d, &mut *buf)
                    });
                    return reported_as(r, timeout);
                }
                RecvStep::Rendezvous(len) => match self.pull(OP, len, Dest::Slice(&mut *buf))? {
                    Pulled::Done(n) => return Ok(Some(n)),
                    Pulled::Retry => continue,
                },
            }
        }
    }

    /// One owned receive into `buf` (waiting up to `timeout`): a message, the end, or a
    /// rendezvous message to pull.
    pub(super) fn recv_lent_step(
        &self,
        name: &'static str,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<RecvStep> {
        self.run(&mut RecvInto { name, buf }, timeout)
    }
}

/// A send of messages straight from the caller's memory (`send_msg`, `send_batch`): each is
/// lent to the core while the call waits (`Conn::send_msg_borrowed`), or sent by rendezvous
/// from a registration of the caller's slice.
pub(crate) struct SendMsg<'a> {
    name: &'static str,
    msgs: &'a [&'a [u8]],
    /// The first message not yet wholly queued.
    next: usize,
    /// The rendezvous send of `msgs[next]` in progress.
    rdv: Option<SliceRdv>,
    /// The settled rendezvous threshold.
    threshold: Option<usize>,
}

/// A link's part in a rendezvous send of a caller's slice: the driver registers the slice
/// and exposes it ([`send_slice_rdv`]); the host simulation (`op_sim`) exposes a copy.
pub(crate) trait SliceRendezvous {
    /// One step of the rendezvous send of `m`: `Ok(true)` once released.
    fn send_slice_rdv(&mut self, m: &[u8], slot: &mut Option<SliceRdv>) -> Result<bool>;
    /// Drops what the link keeps for message `msg` (see [`Driver::drop_send`]).
    fn drop_send(&mut self, msg: u64, unbound: bool);
}

impl SliceRendezvous for Driver {
    fn send_slice_rdv(&mut self, m: &[u8], slot: &mut Option<SliceRdv>) -> Result<bool> {
        send_slice_rdv(self, m, slot)
    }

    fn drop_send(&mut self, msg: u64, unbound: bool) {
        Driver::drop_send(self, msg, unbound);
    }
}

impl<L: Link + SliceRendezvous> Op<L> for SendMsg<'_> {
    type Out = ();

    fn name(&self) -> &'static str {
        self.name
    }

    fn side(&self) -> Option<Side> {
        Some(Side::Send)
    }

    fn poll(&mut self, d: &mut L) -> Result<Option<()>> {
        while let Some(m) = self.msgs.get(self.next) {
            // The write side was shut (a close, or shutdown(Write), on another thread): the
            // FIN waits behind this message, so one that has not begun is withdrawn (by
            // `abandon`, with `Closed`) rather than wait for credit, and one that has is
            // finished from a copy, the FIN after it. Looked at first: a peer that leaves
            // after our FIN left because of our close.
            if d.core().write_closed() {
                return Err(NetError::Closed { op: self.name });
            }
            // A rendezvous message the peer read before it left was delivered whole: it
            // completes (its window's invalidation may never complete through the ended
            // transport: see `Driver::release_offer_of_gone_peer`), and only what would still
            // have to go fails.
            if d.peer_gone() {
                let offered = self.rdv.as_ref().and_then(|r| r.msg);
                if !offered.is_some_and(|msg| d.core().rendezvous_read(msg)) {
                    return Err(NetError::PeerGone { op: self.name });
                }
            }
            if self.threshold.is_some_and(|t| m.len() >= t) {
                if !d.send_slice_rdv(m, &mut self.rdv)? {
                    return Ok(None);
                }
                self.next += 1;
                continue;
            }
            match d.core().send_msg_borrowed(m) {
                Ok(Step::Done(true)) => self.next += 1,
                Ok(Step::Done(false) | Step::Blocked) => return Ok(None),
                Err(e) => return Err(from_core(e)),
            }
        }
        Ok(Some(()))
    }

    /// A rendezvous message whose RTS has not gone out is withdrawn; a lent one is withdrawn
    /// if nothing of it went, else its rest is copied into the core and it is sent whole (a
    /// lone message that timed out then succeeds).
    fn abandon(&mut self, d: &mut L, r: Result<()>) -> Result<()> {
        let Some(m) = self.msgs.get(self.next) else {
            return r;
        };
        if let Some(msg) = self.rdv.as_ref().and_then(|s| s.msg) {
            if d.core().withdraw_rendezvous(msg) {
                d.drop_send(msg, true);
                self.rdv = None;
            }
            return r;
        }
        let kept = d.core().send_unborrow(m);
        match r {
            // A lone message that had begun goes whole from the copy.
            Err(NetError::Timeout { .. } | NetError::Closed { .. })
                if kept && self.msgs.len() == 1 =>
            {
                Ok(())
            }
            r => r,
        }
    }
}

/// A receive into the caller's buffer, fragments straight from their slots
/// (`Conn::recv_msg_direct`), as the owner of the receive side.
pub(crate) struct RecvInto<'a> {
    name: &'static str,
    buf: &'a mut [u8],
}

#[cfg(any(feature = "tokio", test))]
impl<'a> RecvInto<'a> {
    /// A receive of the next message into `buf` (the async face's `recv_buffer`).
    pub(crate) fn new(name: &'static str, buf: &'a mut [u8]) -> RecvInto<'a> {
        RecvInto { name, buf }
    }
}

#[cfg(test)]
impl<'a> SendMsg<'a> {
    /// The message whose RTS is out when the run ended (the blocking `send_lent` then waits
    /// for its DONE before the caller gets the slice back), taken.
    pub(crate) fn take_rts_out(&mut self) -> Option<u64> {
        self.rdv.take().and_then(|r| r.msg)
    }

    /// A send of `msgs` as the blocking face sends them: by rendezvous at and above
    /// `threshold` (the host simulation).
    pub(crate) fn with_threshold(
        name: &'static str,
        msgs: &'a [&'a [u8]],
        threshold: usize,
    ) -> SendMsg<'a> {
        SendMsg {
            name,
            msgs,
            next: 0,
            rdv: None,
            threshold: Some(threshold),
        }
    }
}

impl<L: Link> Op<L> for RecvInto<'_> {
    type Out = RecvStep;

    fn name(&self) -> &'static str {
        self.name
    }

    fn side(&self) -> Option<Side> {
        Some(Side::Recv)
    }

    fn poll(&mut self, d: &mut L) -> Result<Option<RecvStep>> {
        match d.core().recv_msg_direct(self.buf) {
            Ok(Recv::Data(n)) => Ok(Some(RecvStep::Got(Some(n)))),
            Ok(Recv::Eof) => Ok(Some(RecvStep::Got(None))),
            Ok(Recv::NeedsRead { len }) => Ok(Some(RecvStep::Rendezvous(len))),
            Ok(Recv::Blocked) if d.read_stranded() => {
                Err(NetError::PeerClosed(super::rendezvous::UNREAD_OFFER))
            }
            Ok(Recv::Blocked) => Ok(None),
            Err(e) => Err(from_core(e)),
        }
    }

    /// The part of a message already received into the buffer goes back into the core: the
    /// message stays whole for the next read.
    fn abandon(&mut self, d: &mut L, r: Result<RecvStep>) -> Result<RecvStep> {
        d.core().recv_direct_abort(self.buf);
        r
    }
}

/// One step of a rendezvous send from a caller's slice: registers it (once: for binding a
/// window over it where the device has type-2 windows, else for remote read), queues its RTS
/// (through a window of the driver's, which then keeps the registration), then waits for the
/// DONE. `Ok(true)` once released (the registration is dropped); `Ok(false)`: call again.
fn send_slice_rdv(d: &mut Driver, m: &[u8], slot: &mut Option<SliceRdv>) -> Result<bool> {
    if slot.is_none() {
        let access = if d.has_windows() {
            AccessFlags::MW_BIND
        } else {
            AccessFlags::REMOTE_READ
        };
        // SAFETY: the slice is borrowed by the blocked call, which drops this registration
        // (here or, once a window exposes it, with the driver's `drop_send`) before it
        // returns: after the peer's DONE (and the window's invalidation), after withdrawing
        // an RTS never sent, or after moving the QP to ERROR. Remote read at most: nothing
        // writes the slice.
        let mr = unsafe { Mr::register(d.pd(), m.as_ptr() as *mut u8, m.len(), access) }?;
        *slot = Some(SliceRdv {
            msg: None,
            mr: Some(mr),
        });
    }
    let Some(state) = slot.as_mut() else {
        return Ok(false);
    };
    match state.msg {
        None => {
            let Some(mr) = state.mr.as_ref() else {
                return Ok(false);
            };
            let (addr, len) = (mr.addr(), m.len());
            if !mr.access().contains(AccessFlags::MW_BIND) {
                match d.core().send_rendezvous(len, addr, mr.rkey()) {
                    Ok(Step::Done(msg)) => state.msg = Some(msg),
                    Ok(Step::Blocked) => {}
                    Err(e) => return Err(from_core(e)),
                }
                return Ok(false);
            }
            if let Some((msg, w)) = d.queue_through_window("send_msg", len, addr)? {
                state.msg = Some(msg);
                d.hold_send(msg, Some(w), state.mr.take(), None);
            }
            Ok(false)
        }
        Some(msg) if d.core_ref().rendezvous_released(msg) => {
            d.drop_send(msg, true);
            *slot = None;
            Ok(true)
        }
        // Read whole by a peer that left after its FIN: delivered, its memory cut off.
        Some(msg) if d.peer_gone() && d.core_ref().rendezvous_read(msg) => {
            d.release_offer_of_gone_peer(msg);
            *slot = None;
            Ok(true)
        }
        Some(_) => d.check_failed().map(|()| false),
    }
}

/// A timeout of a wait that got what was left of the caller's `timeout`, reported as the
/// caller's whole timeout (it said "after 0 ms" when the first wait had used it up).
pub(super) fn reported_as<T>(r: Result<T>, timeout: Option<Duration>) -> Result<T> {
    match r {
        Err(NetError::Timeout { op, .. }) => Err(NetError::Timeout {
            op,
            millis: timeout.map_or(0, crate::deadline::whole_millis),
        }),
        r => r,
    }
}
