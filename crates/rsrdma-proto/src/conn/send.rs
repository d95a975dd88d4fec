//! The send side: accepting messages, building frames, control frames and close.

use super::{Conn, Control, FinState, ReadState, Rts};
use crate::error::ProtoError;
use crate::error::ProtoError as E;
use crate::frame::{FrameType, Header, FLAG_FIRST, FLAG_LAST, HEADER_LEN, RTS_PAYLOAD_LEN};
use crate::memory::SlotMemory;
use crate::params::CONTROL_RESERVE;
use crate::step::Step;
use crate::work::{LentPayload, Work, WrId};
use std::collections::VecDeque;

/// `send_inline_now` scans the queue for a send it must not overtake; past this many queued
/// reposts it leaves the message to the queued way rather than scan on.
const MAX_QUEUED_BEHIND: usize = 8;

impl<M: SlotMemory> Conn<M> {
    /// Queues one message. Fragments go straight into free send slots (the one copy) as far as
    /// credits, SQ entries and slots allow; the rest is copied into the core and sent as
    /// resources free up. While a message is still partly unsent, the next `send_msg` gives
    /// `Step::Blocked` (and `Event::Writable` follows once it would succeed), so the core
    /// never holds more than one unsent message.
    pub fn send_msg(&mut self, data: &[u8]) -> Result<Step<()>, ProtoError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.start_message(data.len())?.is_blocked() {
            return Ok(Step::Blocked);
        }
        self.push_data(Some(data));
        if self.tx.active {
            self.keep_rest(data);
        }
        self.flush();
        Ok(Step::Done(()))
    }

    /// Queues one message of `len` bytes by rendezvous: the driver has registered it for
    /// remote read at `addr`/`rkey` (and nothing else: no remote write), and keeps it
    /// registered, unchanged and alive until [`Conn::rendezvous_released`] says so for the
    /// returned message number, or until the QP's flush after a failure or close. The RTS goes
    /// in the message order, when a data credit allows. `Step::Blocked` while another message
    /// is being sent; `NotNegotiated` without settled rendezvous; `TooLarge` above the cap.
    pub fn send_rendezvous(&mut self, len: usize, addr: u64, rkey: u32) -> Result<Step<u64>, E> {
        self.rendezvous(len, addr, rkey, false)
    }

    /// [`Conn::send_rendezvous`] through a memory window the driver binds for this message
    /// only: `addr` is registered for window binding (no remote access of its own) and
    /// `rkey` is the key the driver's window gets. The core queues a [`Work::BindWindow`]
    /// (granting remote read of the message's `len` bytes at `addr`) right before the RTS, so
    /// the peer sees the key only once it works, and a [`Work::InvalidateWindow`] once the
    /// DONE arrives; the message is released when that invalidation completes, so the peer
    /// can read nothing after the release (whatever it sends). A type-2 window also works
    /// only through this connection's QP, unlike a registration's key, which any QP of the
    /// protection domain may use.
    pub fn send_rendezvous_window(
        &mut self,
        len: usize,
        addr: u64,
        rkey: u32,
    ) -> Result<Step<u64>, E> {
        self.rendezvous(len, addr, rkey, true)
    }

    fn rendezvous(
        &mut self,
        len: usize,
        addr: u64,
        rkey: u32,
        window: bool,
    ) -> Result<Step<u64>, E> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.lim.rendezvous.is_none() {
            return Err(E::NotNegotiated {
                op: "send_rendezvous",
                feature: "rendezvous",
            });
        }
        if len == 0 {
            return Err(E::Misuse {
                reason: "rendezvous of an empty message",
            });
        }
        if self.start_message(len)?.is_blocked() {
            return Ok(Step::Blocked);
        }
        self.tx.rts = Some(Rts { addr, rkey, window });
        let msg = self.tx.messages - 1;
        self.push_data(None);
        self.flush();
        Ok(Step::Done(msg))
    }

    /// Queues one message of `len` bytes whose payload stays in memory the driver lent: it is
    /// registered at `addr` under `lkey` (local access suffices) and the driver keeps it
    /// registered, unchanged and alive until [`Conn::lent_released`] says so for the returned
    /// message number (or until the QP's flush after a failure or close). Nothing is copied:
    /// each fragment is one SEND of two SGEs, its header from a send slot and its payload
    /// from the lent range ([`Work::PostSend`]'s `lent`). Credits, order with other messages
    /// and fragment sizes are those of `send_msg`; the last fragment is always signalled, so
    /// the release never waits for later traffic. `Step::Blocked` while another message is
    /// being sent; `TooLarge` above the cap.
    pub fn send_msg_lent(&mut self, len: usize, addr: u64, lkey: u32) -> Result<Step<u64>, E> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.start_message(len)?.is_blocked() {
            return Ok(Step::Blocked);
        }
        self.tx.lent = Some((addr, lkey));
        let msg = self.tx.messages - 1;
        self.push_data(None);
        self.flush();
        Ok(Step::Done(msg))
    }

    /// Withdraws lent message `msg` if none of its fragments went out yet (the caller gives
    /// up): `true` when withdrawn (as if never sent; its memory is free at once). A message
    /// that has begun goes whole.
    pub fn withdraw_lent(&mut self, msg: u64) -> bool {
        if !(self.is_current(msg) && self.tx.lent.is_some() && self.tx.offset == 0) {
            return false;
        }
        self.unsend_current();
        true
    }

    /// Whether `msg` is the message being sent.
    fn is_current(&self, msg: u64) -> bool {
        self.tx.active && msg + 1 == self.tx.messages
    }

    /// Takes back the message being sent, nothing of which went out: as if never sent.
    fn unsend_current(&mut self) {
        self.tx.active = false;
        self.tx.rts = None;
        self.tx.lent = None;
        self.tx.borrowed = false;
        self.tx.messages -= 1;
        self.flush();
    }

    /// Whether lent message `msg` (from [`Conn::send_msg_lent`]) is done with: every
    /// fragment was posted and the completion covering the last one was reaped. After a
    /// failure, only the QP's flush ([`Conn::handle_flushed`]) releases what is in flight.
    pub fn lent_released(&self, msg: u64) -> bool {
        let posting = self.is_current(msg) && self.tx.lent.is_some();
        !posting && !self.tx.lent_out.iter().any(|&(m, _)| m == msg)
    }

    /// Whether rendezvous message `msg` (from [`Conn::send_rendezvous`] or
    /// [`Conn::send_rendezvous_window`]) is done with: the peer's DONE arrived (and its
    /// window's invalidation completed), or it was withdrawn. After a failure, only the QP's
    /// flush ([`Conn::handle_flushed`]) releases it.
    pub fn rendezvous_released(&self, msg: u64) -> bool {
        let waiting_rts = self.is_current(msg) && self.tx.rts.is_some();
        !waiting_rts
            && !self.tx.unreleased.iter().any(|&(m, _)| m == msg)
            && !self.ctl.invalidate.iter().any(|&(m, _)| m == msg)
            && !self.tx.invalidating.iter().any(|&(m, _)| m == msg)
    }

    /// Whether the peer read rendezvous message `msg` whole: its DONE arrived (its window's
    /// invalidation may still be pending, so [`Conn::rendezvous_released`] may not say so
    /// yet). False while its RTS waits, until the DONE, and for a message withdrawn unread.
    pub fn rendezvous_read(&self, msg: u64) -> bool {
        let waiting_rts = self.is_current(msg) && self.tx.rts.is_some();
        !waiting_rts
            && !self.tx.unreleased.iter().any(|&(m, _)| m == msg)
            && !self.tx.withdrawn.contains(&msg)
    }

    /// Withdraws rendezvous message `msg` if its RTS has not gone out yet (the caller gives
    /// up): `true` when withdrawn (as if never sent; its memory is free at once).
    pub fn withdraw_rendezvous(&mut self, msg: u64) -> bool {
        if !(self.is_current(msg) && self.tx.rts.is_some()) {
            return false;
        }
        self.unsend_current();
        true
    }

    /// Asks the peer for rendezvous message `msg` back, its RTS being out (the caller gave
    /// up): queues a WITHDRAW. The peer drops the message if it has not begun to read it and
    /// answers WITHDRAWN, or lets its read finish and answers DONE; either answer releases
    /// the message ([`Conn::rendezvous_released`]), and [`Conn::take_withdrawn`] then says
    /// which. `false` (nothing queued) when withdrawal was not settled, the connection
    /// failed, or `msg` is not a message whose RTS is out and unanswered; asking twice
    /// queues one WITHDRAW.
    pub fn ask_withdraw(&mut self, msg: u64) -> bool {
        if !self.lim.withdraw
            || self.failed.is_some()
            || !self.tx.unreleased.iter().any(|&(m, _)| m == msg)
        {
            return false;
        }
        if !self.tx.withdrawing.contains(&msg) {
            self.tx.withdrawing.push_back(msg);
            self.ctl.withdraw.push_back(msg as u16);
            self.flush();
        }
        true
    }

    /// Messages whose memory is not released yet for want of the peer or the NIC: rendezvous
    /// messages without their answer (DONE or WITHDRAWN; the RTS out, or waiting to go) and
    /// lent messages with fragments unsent or unconfirmed by their last completion.
    pub fn sends_unanswered(&self) -> impl Iterator<Item = u64> + '_ {
        let current = (self.tx.active && (self.tx.rts.is_some() || self.tx.lent.is_some()))
            .then(|| self.tx.messages - 1);
        let rendezvous = self.tx.unreleased.iter().map(|&(m, _)| m);
        let lent = self.tx.lent_out.iter().map(|&(m, _)| m);
        rendezvous.chain(lent).chain(current)
    }

    /// Messages the peer dropped unread at this side's request whose news
    /// [`Conn::take_withdrawn`] has not taken.
    pub fn withdrawn_untaken(&self) -> impl Iterator<Item = u64> + '_ {
        self.tx.withdrawn.iter().copied()
    }

    /// Whether the peer dropped rendezvous message `msg` unread at this side's request
    /// (WITHDRAWN): nothing of it was delivered. Taken once: a second call says `false`.
    pub fn take_withdrawn(&mut self, msg: u64) -> bool {
        match self.tx.withdrawn.iter().position(|&m| m == msg) {
            Some(at) => {
                self.tx.withdrawn.remove(at);
                true
            }
            None => false,
        }
    }

    /// The peer's WITHDRAWN for message id `msg_id`: it must answer a WITHDRAW of this side
    /// whose message is unreleased. It may overtake the DONEs of older messages (the peer
    /// drops a queued RTS at once, while older ones wait for their reads).
    pub(super) fn on_withdrawn(&mut self, msg_id: u16) -> Result<(), ProtoError> {
        let asked = self.tx.withdrawing.iter().position(|&m| m as u16 == msg_id);
        let out = self
            .tx
            .unreleased
            .iter()
            .position(|&(m, _)| m as u16 == msg_id);
        let (Some(asked), Some(out)) = (asked, out) else {
            return Err(ProtoError::Sequence {
                reason: "a WITHDRAWN for a message not asked back",
            });
        };
        self.tx.withdrawing.remove(asked);
        if let Some((m, window)) = self.tx.unreleased.remove(out) {
            // Nobody read it, but the window's grant still ends before the memory goes.
            if let Some(rkey) = window {
                self.ctl.invalidate.push_back((m, rkey));
            }
            self.tx.withdrawn.push_back(m);
        }
        Ok(())
    }

    /// Sends one message straight from the caller's memory, without ever copying its unsent
    /// rest: fragments go into send slots as credits, SQ entries and slots allow, and the
    /// rest waits in `data` itself. `Done(true)`: every frame is queued. `Done(false)`: call
    /// again with the same `data` once something changed (a completion, a credit), or end the
    /// attempt with [`Conn::send_unborrow`]; until then nothing else sends DATA. For a blocking
    /// caller, whose slice stays borrowed for the whole call: the memory the core holds for a
    /// message stays at its slots. `Blocked` while another message is being sent (nothing of
    /// `data` was taken).
    pub fn send_msg_borrowed(&mut self, data: &[u8]) -> Result<Step<bool>, ProtoError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.tx.active && self.tx.borrowed {
            if data.len() != self.tx.total {
                return Err(ProtoError::Misuse {
                    reason: "send_msg_borrowed continued with another message",
                });
            }
        } else {
            if self.start_message(data.len())?.is_blocked() {
                return Ok(Step::Blocked);
            }
            self.tx.borrowed = true;
        }
        self.push_data(Some(data));
        let done = !self.tx.active;
        if done {
            self.tx.borrowed = false;
        }
        self.flush();
        Ok(Step::Done(done))
    }

    /// A message that fits one inline frame, built now for the driver to post at once, ahead
    /// of anything queued: the lean way of a small send (a round trip's message), which skips
    /// the fragmenting loop and the work queue. Returns the frame's `PostSend`, which the core
    /// did **not** queue: the caller posts it before it takes anything from
    /// [`Conn::poll_work`] (its WR id precedes whatever is queued after it). `None` when the
    /// message cannot go this way (too large for one inline frame, a message in progress, no
    /// credit or SQ entry, a send already queued, the connection closed or failed): take
    /// [`Conn::send_msg_borrowed`], which waits, queues, or reports the error.
    ///
    /// Only reposts may be queued, so posting this first keeps every send in WR order; they
    /// were not taken yet, so its header does not announce them (credit counts from the take).
    pub fn send_inline_now(&mut self, data: &[u8]) -> Option<Work> {
        let n = data.len();
        let fits = HEADER_LEN + n <= self.lim.inline_size
            && n <= self.lim.frame_payload
            && n <= self.lim.max_message as usize;
        if !fits
            || self.failed.is_some()
            || self.tx.active
            || self.tx.write_closed
            || !self.may_send(FrameType::Data)
            || !self.sq.has_room(false)
            || self.out.len() > MAX_QUEUED_BEHIND
            || !self.only_reposts_queued()
        {
            return None;
        }
        self.number_message();
        let h = Header {
            kind: FrameType::Data,
            flags: FLAG_FIRST | FLAG_LAST,
            msg_id: self.tx.id,
            credit_limit: 0,
            payload_len: n as u32,
            aux: n as u32,
        };
        let (_, work) = self.build_frame(h, data, None, false);
        self.flush();
        Some(work)
    }

    /// Ends a borrowed send that is not finished (the caller gives up waiting): a message of
    /// which nothing went out is withdrawn (`false`: as if never sent); otherwise its rest is
    /// copied into the core and sent as resources allow (`true`: the message will be sent
    /// whole). `data` is the slice given to `send_msg_borrowed`. `false` when no borrowed
    /// send of `data` is in progress: a message the core never started (its
    /// `send_msg_borrowed` said `Blocked` behind another message) holds nothing of `data`,
    /// and nothing of it will be sent.
    pub fn send_unborrow(&mut self, data: &[u8]) -> bool {
        if !(self.tx.active && self.tx.borrowed) || data.len() != self.tx.total {
            return false;
        }
        if self.tx.offset == 0 {
            self.unsend_current();
            return false;
        }
        self.tx.borrowed = false;
        self.keep_rest(data);
        self.flush();
        true
    }

    /// Checks a new message against the state and the cap, and makes it the current one;
    /// `Blocked` (and nothing changes but the promise of `Event::Writable`) while another
    /// message is being sent.
    fn start_message(&mut self, len: usize) -> Result<Step<()>, ProtoError> {
        if self.tx.write_closed {
            return Err(ProtoError::Closed { op: "send_msg" });
        }
        if len > self.lim.max_message as usize {
            return Err(ProtoError::TooLarge {
                len,
                max: self.lim.max_message,
            });
        }
        if self.tx.active {
            self.tx.want_writable = true;
            return Ok(Step::Blocked);
        }
        self.tx.active = true;
        self.number_message();
        self.tx.total = len;
        self.tx.offset = 0;
        Ok(Step::Done(()))
    }

    /// Gives the next message its number (`tx.messages`, counted from 0) and frame id.
    fn number_message(&mut self) {
        self.tx.id = self.tx.messages as u16;
        self.tx.messages += 1;
    }

    /// Copies the current message's unsent rest into the core (the one copy of that rest).
    fn keep_rest(&mut self, data: &[u8]) {
        self.tx.pending.clear();
        self.tx.pending.extend_from_slice(&data[self.tx.offset..]);
        self.tx.pending_base = self.tx.offset;
    }

    /// Whether the write side is shut (`shutdown_write` or `close` ran): no new message is
    /// accepted, and a lender whose message has not begun should withdraw it
    /// ([`Conn::send_unborrow`]) so that the FIN, queued behind it, can go.
    pub fn write_closed(&self) -> bool {
        self.tx.write_closed
    }

    /// Whether `send_msg` would accept a message now.
    pub fn can_send(&self) -> bool {
        self.failed.is_none() && !self.tx.write_closed && !self.tx.active
    }

    /// Whether a message would begin to go now: `send_msg` accepts one and a data credit is
    /// there (as of the last frame from the peer). A sender with several connections to
    /// choose from (the rails of a striped one) prefers those, as a send elsewhere waits for
    /// a peer that may be returning no credit at all.
    pub fn can_send_now(&self) -> bool {
        self.can_send() && self.may_send(FrameType::Data)
    }

    /// Half-close: FIN goes after every queued message. Reading goes on. Idempotent.
    pub fn shutdown_write(&mut self) -> Result<(), ProtoError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if !self.tx.write_closed {
            self.tx.write_closed = true;
            self.ctl.fin = FinState::Pending;
            self.flush();
        }
        Ok(())
    }

    /// Read side shut down: what is held and whatever data still arrives is discarded (slots
    /// reposted, credit returned, so the peer never stalls on us), and reads report EOF.
    /// Sending goes on. Idempotent.
    pub fn shutdown_read(&mut self) -> Result<(), ProtoError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if !self.rx.read_shut {
            self.rx.read_shut = true;
            self.discard_received();
            self.ev.readable = true;
            self.flush();
        }
        Ok(())
    }

    /// Refuses the connection (its listener closed before anyone accepted it): it fails
    /// with [`ProtoError::Refused`], and one ABORT with
    /// [`abort_code::LISTENER_CLOSED`](crate::frame::abort_code::LISTENER_CLOSED) tells the
    /// peer, whose calls then fail with [`ProtoError::PeerAborted`] saying so. Nothing is
    /// delivered after it.
    pub fn refuse(&mut self) {
        self.fail(ProtoError::Refused);
    }

    /// Full close: `shutdown_write`, and from now on arriving data is discarded at once (its
    /// slots reposted, its credit returned), so a peer that is still sending never stalls on
    /// us. Control frames (credits, PONG) keep flowing until the driver tears down.
    pub fn close(&mut self) -> Result<(), ProtoError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if !self.rx.read_closed {
            // Before the FIN is built, so that it returns the discarded slots' credit.
            self.rx.read_closed = true;
            self.discard_received();
        }
        self.shutdown_write()?;
        self.flush();
        Ok(())
    }

    /// Builds every frame that may go now, in priority order. Called after every input (three
    /// times in a small message's round trip), so the common case, nothing due, is a few
    /// field tests here and no call.
    pub(super) fn flush(&mut self) {
        if self.failed.is_some() || self.sends_waiting() {
            self.flush_due();
        }
    }

    /// Whether frames wait to go out as credit and room allow: the rest of a message the
    /// core holds (not one a caller lends), a control frame, or a CREDIT frame due. A driver
    /// steps on completions while this holds even when no caller waits on the connection:
    /// nothing else would send them.
    pub fn sends_waiting(&self) -> bool {
        let data_waits = self.tx.active && !self.tx.borrowed;
        let control_waits = self.ctl.pong.is_some()
            || !self.ctl.done.is_empty()
            || !self.ctl.withdraw.is_empty()
            || !self.ctl.withdrawn.is_empty()
            || !self.ctl.invalidate.is_empty()
            || self.ctl.fin == FinState::Pending
            || self.ctl.ping
            || self.rx.read == ReadState::NextPiece;
        data_waits || control_waits || self.credit_due()
    }

    fn flush_due(&mut self) {
        if self.failed.is_some() {
            if let Some(code) = self.ctl.abort {
                if self.may_send(FrameType::Abort) && self.sq.has_room(self.control_needs_slot()) {
                    self.ctl.abort = None;
                    self.emit(Header::control(FrameType::Abort, 0, 0, code), &[], true);
                }
            }
            return;
        }
        if let Some(token) = self.ctl.pong {
            if self.try_control(FrameType::Pong, 0, token).is_some() {
                self.ctl.pong = None;
            }
        }
        self.post_waiting_read_piece();
        self.send_ids(FrameType::Done, |c| &mut c.done);
        self.send_ids(FrameType::Withdrawn, |c| &mut c.withdrawn);
        self.send_ids(FrameType::Withdraw, |c| &mut c.withdraw);
        // No credit needed: an invalidation is local. Signalled, so the release it gates
        // never waits for later traffic.
        while let Some(&(msg, rkey)) = self.ctl.invalidate.front() {
            if !self.sq.has_room(false) {
                break;
            }
            let (wr_id, _, _) = self.sq.post(false, 0, true);
            self.out
                .push_back(Work::InvalidateWindow { wr_id, msg, rkey });
            self.tx.invalidating.push_back((msg, wr_id));
            self.ctl.invalidate.pop_front();
        }
        if self.tx.active && !self.tx.borrowed {
            self.push_data(None);
        }
        if self.ctl.fin == FinState::Pending && !self.tx.active {
            if let Some(wr) = self.try_control(FrameType::Fin, self.tx.messages as u16, 0) {
                self.ctl.fin = FinState::Sent(wr);
                self.sq.signal_all = true;
            }
        }
        if self.ctl.ping
            && self
                .try_control(FrameType::Ping, 0, self.ctl.ping_token)
                .is_some()
        {
            self.ctl.ping = false;
            self.ctl.ping_token = self.ctl.ping_token.wrapping_add(1);
        }
        if self.credit_due() {
            self.try_control(FrameType::Credit, 0, 0);
        }
    }

    /// A credit-only frame pays off: it returns at least 2 credits (so credit frames alone can
    /// never ping-pong forever), and either a quarter of the ring is unannounced or the peer
    /// is down to its last credit (so its control frames never wait for our data).
    fn credit_due(&self) -> bool {
        let unannounced = self.rxc.unannounced();
        unannounced >= 2 && (unannounced >= self.lim.credit_threshold || self.rxc.peer_view() <= 1)
    }

    /// The credit rules. Data keeps `CONTROL_RESERVE` credits back; a control frame may take
    /// the last credit only if it carries new credit (so both sides can never sit at zero
    /// credit with nothing in flight); ABORT may take any credit.
    fn may_send(&self, kind: FrameType) -> bool {
        let credit = self.txc.available();
        match kind {
            FrameType::Data => credit > u64::from(CONTROL_RESERVE),
            FrameType::Abort => credit >= 1,
            _ => credit >= 2 || (credit == 1 && self.rxc.unannounced() >= 1),
        }
    }

    fn control_needs_slot(&self) -> bool {
        HEADER_LEN > self.lim.inline_size
    }

    /// Sends a control frame of `kind` for each message id `queue` holds, oldest first, while
    /// credit and room allow.
    fn send_ids(&mut self, kind: FrameType, queue: fn(&mut Control) -> &mut VecDeque<u16>) {
        while let Some(&id) = queue(&mut self.ctl).front() {
            if self.try_control(kind, id, 0).is_none() {
                break;
            }
            queue(&mut self.ctl).pop_front();
        }
    }

    fn try_control(&mut self, kind: FrameType, msg_id: u16, aux: u32) -> Option<WrId> {
        if !self.may_send(kind) || !self.sq.has_room(self.control_needs_slot()) {
            return None;
        }
        // A PING is signalled so that its completion says whether this side's frames get
        // through (see `Conn::handle_timeout`); there is one per keepalive interval at most.
        let force = matches!(kind, FrameType::Fin | FrameType::Ping);
        Some(self.emit(Header::control(kind, msg_id, 0, aux), &[], force))
    }

    /// Sends fragments of the current message while resources allow; `src` is the caller's
    /// message (inside `send_msg`) or `None` for the core's pending copy.
    fn push_data(&mut self, src: Option<&[u8]>) {
        if let (true, Some(rts)) = (self.tx.active, self.tx.rts) {
            self.push_rts(rts);
            return;
        }
        while self.tx.active {
            let (offset, total) = (self.tx.offset, self.tx.total);
            let n = self.lim.frame_payload.min(total - offset);
            // A lent payload is a second SGE after a header in a slot (never inline, which
            // would copy it); an empty one is just its header.
            let needs_slot =
                HEADER_LEN + n > self.lim.inline_size || (self.tx.lent.is_some() && n > 0);
            if !self.may_send(FrameType::Data) || !self.sq.has_room(needs_slot) {
                return;
            }
            let first = offset == 0;
            let last = offset + n == total;
            let h = Header {
                kind: FrameType::Data,
                flags: if first { FLAG_FIRST } else { 0 } | if last { FLAG_LAST } else { 0 },
                msg_id: self.tx.id,
                credit_limit: 0,
                payload_len: n as u32,
                aux: if first { total as u32 } else { 0 },
            };
            match (self.tx.lent, src) {
                (Some((addr, lkey)), _) if n > 0 => {
                    let lent = LentPayload {
                        addr: addr + offset as u64,
                        lkey,
                        len: n as u32,
                    };
                    let wr = self.emit_frame(h, &[], Some(lent), last);
                    if last {
                        self.tx.lent_out.push_back((self.tx.messages - 1, wr));
                    }
                }
                (Some(_), _) => {
                    // The empty message: a header, signalled so its release follows soon.
                    let wr = self.emit(h, &[], true);
                    self.tx.lent_out.push_back((self.tx.messages - 1, wr));
                }
                (None, Some(data)) => {
                    self.emit(h, &data[offset..offset + n], false);
                }
                (None, None) => {
                    let pending = std::mem::take(&mut self.tx.pending);
                    let at = offset - self.tx.pending_base;
                    self.emit(h, &pending[at..at + n], false);
                    self.tx.pending = pending;
                }
            }
            self.tx.offset += n;
            if last {
                self.tx.active = false;
                self.tx.lent = None;
                release_if_large(&mut self.tx.pending);
                if std::mem::take(&mut self.tx.want_writable) {
                    self.ev.writable = true;
                }
            }
        }
    }

    /// Sends the current message's RTS when a data credit and room allow; a window's bind
    /// goes right before it (two SQ entries, taken together).
    fn push_rts(&mut self, rts: Rts) {
        let Rts { addr, rkey, window } = rts;
        let needs_slot = HEADER_LEN + RTS_PAYLOAD_LEN > self.lim.inline_size;
        let entries = if window { 2 } else { 1 };
        if !self.may_send(FrameType::Data) || !self.sq.has_room_for(entries, needs_slot) {
            return;
        }
        let msg = self.tx.messages - 1;
        if window {
            let (wr_id, _, signaled) = self.sq.post(false, 0, false);
            self.out.push_back(Work::BindWindow {
                wr_id,
                msg,
                addr,
                len: self.tx.total as u32,
                rkey,
                signaled,
            });
        }
        let h = Header {
            kind: FrameType::Rts,
            flags: 0,
            msg_id: self.tx.id,
            credit_limit: 0,
            payload_len: RTS_PAYLOAD_LEN as u32,
            aux: self.tx.total as u32,
        };
        let mut payload = [0u8; RTS_PAYLOAD_LEN];
        payload[..8].copy_from_slice(&addr.to_le_bytes());
        payload[8..12].copy_from_slice(&rkey.to_le_bytes());
        self.emit(h, &payload, false);
        self.tx.unreleased.push_back((msg, window.then_some(rkey)));
        self.tx.rts = None;
        self.tx.active = false;
        if std::mem::take(&mut self.tx.want_writable) {
            self.ev.writable = true;
        }
    }

    /// Writes one frame (header with the latest credit, then payload) into a send slot or the
    /// inline staging entry, and queues its `PostSend`. The caller checked credit and room.
    fn emit(&mut self, h: Header, payload: &[u8], force_signal: bool) -> WrId {
        self.emit_frame(h, payload, None, force_signal)
    }

    /// [`Self::emit`], with the payload either copied (`payload`) or lent (`lent`, with an
    /// empty `payload`): a lent frame's header goes into a slot (the caller checked for one).
    fn emit_frame(
        &mut self,
        h: Header,
        payload: &[u8],
        lent: Option<LentPayload>,
        force_signal: bool,
    ) -> WrId {
        let (wr_id, work) = self.build_frame(h, payload, lent, force_signal);
        self.out.push_back(work);
        wr_id
    }

    /// [`Self::emit_frame`] without queuing: the frame's `PostSend`, for the caller to queue
    /// or hand to the driver, and its WR id.
    fn build_frame(
        &mut self,
        mut h: Header,
        payload: &[u8],
        lent: Option<LentPayload>,
        force_signal: bool,
    ) -> (WrId, Work) {
        h.credit_limit = self.rxc.announce();
        let lent_len = lent.map_or(0, |l| l.len as usize);
        let len = HEADER_LEN + payload.len() + lent_len;
        let needs_slot = len > self.lim.inline_size || lent.is_some();
        let (wr_id, slot, signaled) = self.sq.post(needs_slot, len as u32, force_signal);
        debug_assert!(
            lent.is_none() || slot.is_some(),
            "a lent frame without a slot"
        );
        let header = h.encode();
        // Only message bytes count: an RTS's descriptor is protocol, not payload.
        if h.kind == FrameType::Data {
            self.tx.copied += payload.len() as u64;
        }
        match slot {
            Some(s) => {
                self.mem.write_send(s, 0, &header);
                self.mem.write_send(s, HEADER_LEN, payload);
            }
            None => {
                let at = self.sq.entry(wr_id) * self.lim.inline_size;
                let staging = &mut self.inline[at..at + len];
                staging[..HEADER_LEN].copy_from_slice(&header);
                crate::memory::copy_small(&mut staging[HEADER_LEN..], payload);
            }
        }
        self.txc.sent += 1;
        let work = Work::PostSend {
            wr_id,
            slot,
            len: len as u32,
            signaled,
            lent,
        };
        (wr_id, work)
    }
}

/// Buffers above this keep no capacity once their message is done, so a connection at rest
/// holds its slots and not the largest message it ever sent or received.
pub(super) const KEEP_BUFFER: usize = 256 * 1024;

/// Empties `buf`, and frees it when it grew past [`KEEP_BUFFER`].
pub(super) fn release_if_large(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_BUFFER {
        *buf = Vec::new();
    } else {
        buf.clear();
    }
}
