//! The receive side: holding DATA frames in their slots, reassembly, and the read calls.
//!
//! A one-fragment message stays in its receive slot until it is read (copied once, straight
//! into the caller's buffer), so credit returns only as fast as the reader reads. A message
//! of several fragments is appended into one reassembly buffer as its fragments arrive, and
//! each slot is reposted at once: a message larger than the whole ring still gets through.
//! While a reassembled message waits unread, later fragments stay in their slots, so the core
//! holds at most one reassembled message (at most `max_message` bytes).
//!
//! Message reads and stream reads mix: `read` consumes the head message from its current
//! offset and may stop inside it; `recv_msg*` then returns the unread rest of that message.
//! `read` consumes a message as soon as nothing of it is left, and skips the empty messages
//! it meets while it still needs bytes (a byte stream has nothing to show for them); once it
//! has what it asked for it stops, so an empty message after that is left for `recv_msg`.

use super::send::release_if_large;
use super::{Conn, ReadPlan, ReadState, RxFrame};
use crate::error::ProtoError;
use crate::frame::{Header, HEADER_LEN, RTS_PAYLOAD_LEN};
use crate::memory::SlotMemory;
use crate::step::{Recv, Step};
use crate::work::Work;

/// The message at the head of the read order.
#[derive(Debug, Clone, Copy)]
enum Head {
    Reassembled,
    Slot(RxFrame),
    /// A rendezvous message: only [`Conn::start_read`] and [`Conn::take_read`] take it.
    Rendezvous(RxFrame),
}

impl<M: SlotMemory> Conn<M> {
    /// Receives the next whole message (or its unread rest) into `buf`: `Data(len)`, `Eof`
    /// (the peer's FIN after all its data), `Blocked`, `NeedsRead`, or
    /// `Err(ShortBuffer { needed })`, which leaves the message queued.
    pub fn recv_msg_into(&mut self, buf: &mut [u8]) -> Result<Recv<usize>, ProtoError> {
        self.check_read("recv_msg_into")?;
        let Some((head, len)) = self.head() else {
            return Ok(self.no_message());
        };
        if let Head::Rendezvous(_) = head {
            return Ok(self.needs_read(len));
        }
        let needed = len - self.rx.read_off;
        if buf.len() < needed {
            return Err(ProtoError::ShortBuffer { needed });
        }
        self.copy_head(head, self.rx.read_off, &mut buf[..needed]);
        self.consume_head(head);
        self.flush();
        Ok(Recv::Data(needed))
    }

    /// As [`Conn::recv_msg_into`], but a message of several fragments goes straight from its
    /// receive slots into `buf`, with no reassembly buffer: for a blocking caller whose `buf`
    /// stays borrowed for the whole call. `Blocked` while the message is incomplete:
    /// call again with the same `buf` when something changed, or end the attempt with
    /// [`Conn::recv_direct_abort`]. Meanwhile fragments wait in their slots for the caller (so
    /// credit returns as fast as it copies), and other reads see no message. A message that
    /// began arriving before the call is taken over from the reassembly buffer.
    /// `Err(ShortBuffer)` as soon as the message's length is known.
    pub fn recv_msg_direct(&mut self, buf: &mut [u8]) -> Result<Recv<usize>, ProtoError> {
        self.check_read("recv_msg_into")?;
        let got = match self.rx.direct {
            Some(got) => got,
            None => {
                if self.head().is_some() {
                    return self.recv_msg_into(buf);
                }
                let Some(total) = self.incomplete_total() else {
                    return Ok(self.no_message());
                };
                if buf.len() < total {
                    return Err(ProtoError::ShortBuffer { needed: total });
                }
                // Take over what was reassembled so far; later fragments stay in slots.
                let have = self.rx.asm.len();
                buf[..have].copy_from_slice(&self.rx.asm);
                release_if_large(&mut self.rx.asm);
                self.rx.asm_active = false;
                self.rx.asm_total = total;
                have
            }
        };
        let total = self.rx.asm_total;
        let mut got = got;
        if buf.len() < total {
            return Err(ProtoError::Misuse {
                reason: "recv_msg_direct continued with a shorter buffer",
            });
        }
        let mut done = false;
        while let Some(f) = self.rx.queue.front().copied() {
            let len = f.len as usize;
            if got + len > total {
                // The sequence checks make this impossible; refuse rather than overrun.
                break;
            }
            self.mem
                .read_recv(f.slot, HEADER_LEN, &mut buf[got..got + len]);
            got += len;
            self.rx.queue.pop_front();
            self.repost(f.slot);
            if f.last {
                done = true;
                break;
            }
        }
        if done {
            self.rx.direct = None;
            self.rx.asm_total = 0;
            self.reassemble();
            self.flush();
            return Ok(Recv::Data(got));
        }
        self.rx.direct = Some(got);
        self.flush();
        Ok(Recv::Blocked)
    }

    /// Ends a direct receive that is not complete (the caller gives up waiting): the part
    /// already in `buf` is copied into the reassembly buffer, so the message stays whole for
    /// the next read. A no-op when no direct receive is in progress.
    pub fn recv_direct_abort(&mut self, buf: &[u8]) {
        let Some(got) = self.rx.direct.take() else {
            return;
        };
        self.rx.asm.clear();
        self.rx.asm.reserve_exact(self.rx.asm_total);
        self.rx.asm.extend_from_slice(&buf[..got.min(buf.len())]);
        self.rx.asm_active = true;
        self.reassemble();
        self.flush();
    }

    /// Whether the head message has begun arriving but is not whole yet (a blocking caller
    /// should take it over with [`Conn::recv_msg_direct`] rather than wait for reassembly).
    pub fn recv_incomplete(&self) -> bool {
        self.incomplete_total().is_some()
    }

    /// The length of the head message while it is still arriving (partly reassembled, or its
    /// first fragment waiting in a slot).
    fn incomplete_total(&self) -> Option<usize> {
        if self.rx.asm_active && !self.rx.asm_complete {
            return Some(self.rx.asm_total);
        }
        match self.rx.queue.front() {
            Some(f) if f.first && !f.last => Some(f.total as usize),
            _ => None,
        }
    }

    /// Receives the next whole message (or its unread rest) as a new vector; the other
    /// outcomes as [`Conn::recv_msg_into`]'s. A reassembled message is handed over without a
    /// copy.
    pub fn recv_msg(&mut self) -> Result<Recv<Vec<u8>>, ProtoError> {
        self.check_read("recv_msg")?;
        let Some((head, len)) = self.head() else {
            return Ok(self.no_message());
        };
        if let Head::Rendezvous(_) = head {
            return Ok(self.needs_read(len));
        }
        let msg = match head {
            Head::Reassembled if self.rx.read_off == 0 => std::mem::take(&mut self.rx.asm),
            _ => {
                let mut v = vec![0; len - self.rx.read_off];
                self.copy_head(head, self.rx.read_off, &mut v);
                v
            }
        };
        self.consume_head(head);
        self.flush();
        Ok(Recv::Data(msg))
    }

    /// Byte-stream read: fills `buf` from the head message and the ones after it, and may stop
    /// inside a message. `Data(n)` has `n > 0`, except for an empty `buf`: that gives
    /// `Data(0)` at once, whatever is queued and even at EOF (errors still come first). It
    /// stops before a rendezvous message once it copied bytes; with none copied it gives
    /// `NeedsRead` for it. `Eof` at the end of the stream, `Blocked` when nothing is ready.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<Recv<usize>, ProtoError> {
        self.check_read("read")?;
        let mut n = 0;
        loop {
            if n == buf.len() {
                // The message this read finished is taken; the ones after it wait, empty
                // ones too: a `recv_msg` after this read returns them (a read that needs
                // bytes skips them, below).
                self.take_if_read_to_end();
                break;
            }
            self.skip_finished();
            let Some((head, len)) = self.head() else {
                break;
            };
            if let Head::Rendezvous(_) = head {
                if n == 0 {
                    self.flush();
                    return Ok(self.needs_read(len));
                }
                break;
            }
            let k = (len - self.rx.read_off).min(buf.len() - n);
            self.copy_head(head, self.rx.read_off, &mut buf[n..n + k]);
            self.rx.read_off += k;
            n += k;
        }
        self.flush();
        if n > 0 || buf.is_empty() {
            return Ok(Recv::Data(n));
        }
        Ok(self.no_message())
    }

    /// Length of the next message's unread part, if one is ready.
    pub fn peek_len(&self) -> Option<usize> {
        self.head().map(|(_, len)| len - self.rx.read_off)
    }

    /// EOF: the peer's FIN arrived and every message before it was read, or reading was shut
    /// down.
    pub fn is_eof(&self) -> bool {
        self.rx.read_shut || (self.seq.fin && self.nothing_held())
    }

    /// Nothing received waits to be read: no frame queued, no message being reassembled or
    /// read directly.
    fn nothing_held(&self) -> bool {
        self.rx.queue.is_empty() && !self.rx.asm_active && self.rx.direct.is_none()
    }

    /// A rendezvous message at the head: the driver must read it (`NeedsRead`), or wait
    /// while a read of it is in progress (`Blocked`).
    fn needs_read<T>(&self, len: usize) -> Recv<T> {
        match self.rx.read {
            ReadState::Idle => Recv::NeedsRead { len },
            _ => Recv::Blocked,
        }
    }

    /// Starts the rendezvous read of the head message into `capacity` bytes at
    /// `local_addr`/`lkey`, which the driver registered with local write and keeps alive and
    /// untouched until [`Conn::take_read`] returns the message (or, after a failure, until
    /// the QP's flush). Queues a [`Work::PostRead`]. `ShortBuffer` when `capacity` is below
    /// the message (which stays queued); `Blocked` when no rendezvous message is at the
    /// head, one is already being read, or the send queue is full.
    pub fn start_read(
        &mut self,
        local_addr: u64,
        lkey: u32,
        capacity: usize,
    ) -> Result<Step<()>, ProtoError> {
        self.check_read("start_read")?;
        let Some((Head::Rendezvous(f), len)) = self.head() else {
            return Ok(Step::Blocked);
        };
        if self.rx.read != ReadState::Idle || !self.sq.has_room(false) {
            return Ok(Step::Blocked);
        }
        if capacity < len {
            return Err(ProtoError::ShortBuffer { needed: len });
        }
        let mut rts = [0u8; RTS_PAYLOAD_LEN];
        self.mem.read_recv(f.slot, HEADER_LEN, &mut rts);
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&rts[..8]);
        let rkey = u32::from_le_bytes([rts[8], rts[9], rts[10], rts[11]]);
        self.rx.read_plan = ReadPlan {
            local_addr,
            lkey,
            remote_addr: u64::from_le_bytes(addr),
            rkey,
            len: len as u32,
            posted: 0,
        };
        self.post_read_piece();
        Ok(Step::Done(()))
    }

    /// Posts the next piece of the read in progress (the send queue has room): the whole
    /// message when it fits in one READ, else `max_read` bytes of it. Past the device's
    /// `max_msg_sz` a READ fails (and its connection with it): mlx5 devices take 1 GiB, while
    /// a message may be up to 4 GiB.
    fn post_read_piece(&mut self) {
        let plan = &mut self.rx.read_plan;
        let len = (plan.len - plan.posted).min(self.lim.max_read);
        let at = u64::from(plan.posted);
        let (wr_id, _, _) = self.sq.post(false, 0, true);
        self.out.push_back(Work::PostRead {
            wr_id,
            local_addr: plan.local_addr + at,
            lkey: plan.lkey,
            remote_addr: plan.remote_addr + at,
            rkey: plan.rkey,
            len,
        });
        plan.posted += len;
        self.rx.read = ReadState::Reading(wr_id);
    }

    /// A READ of the read in progress completed: the next piece goes (now, or when the send
    /// queue has room), or the message landed. A message this side no longer reads (a close
    /// or `shutdown_read` came meanwhile) is not read further.
    pub(super) fn on_read_piece_done(&mut self) {
        let plan = self.rx.read_plan;
        if plan.posted == plan.len || self.rx.read_closed || self.rx.read_shut {
            self.on_read_done();
        } else if self.failed.is_some() {
            // Nothing is posted after a failure: the rest of the message is not read.
            self.rx.read = ReadState::Idle;
        } else if self.sq.has_room(false) {
            self.post_read_piece();
        } else {
            self.rx.read = ReadState::NextPiece;
        }
    }

    /// The next piece of a read waits for room in the send queue: it goes first once there
    /// is room (a driver steps while it waits: [`Conn::sends_waiting`]).
    pub(super) fn post_waiting_read_piece(&mut self) {
        if self.rx.read == ReadState::NextPiece && self.sq.has_room(false) {
            self.post_read_piece();
        }
    }

    /// The length of the head message when it is a rendezvous message that nobody reads
    /// yet (what a read call's `NeedsRead` said), on a connection that has not failed.
    pub fn pending_read(&self) -> Option<usize> {
        if self.failed.is_some() || self.rx.read != ReadState::Idle {
            return None;
        }
        match self.head() {
            Some((Head::Rendezvous(_), len)) => Some(len),
            _ => None,
        }
    }

    /// Whether the rendezvous read in progress has completed (the next [`Conn::take_read`]
    /// or [`Conn::take_read_into_core`] takes it).
    pub fn read_landed(&self) -> bool {
        self.rx.read == ReadState::Landed
    }

    /// Takes the head message once its rendezvous read completed: `Some(len)` (the bytes
    /// are in the destination given to [`Conn::start_read`]); `None` while it is in flight.
    pub fn take_read(&mut self) -> Option<usize> {
        if self.rx.read != ReadState::Landed {
            return None;
        }
        let f = self.rx.queue.pop_front()?;
        self.rx.read = ReadState::Idle;
        self.rx.read_off = 0;
        self.reassemble();
        self.flush();
        Some(f.total as usize)
    }

    /// As [`Conn::take_read`], for a driver that read the message into `msg` (its exact
    /// length) and wants the core to serve it to stream reads: the message becomes the
    /// reassembled head. `false` (and nothing changes) when no read has landed or the length
    /// differs.
    pub fn take_read_into_core(&mut self, msg: Vec<u8>) -> bool {
        let landed_len = match (self.rx.read, self.rx.queue.front()) {
            (ReadState::Landed, Some(f)) => f.total as usize,
            _ => return false,
        };
        if landed_len != msg.len() || self.rx.asm_active {
            return false;
        }
        self.rx.queue.pop_front();
        self.rx.read = ReadState::Idle;
        self.rx.read_off = 0;
        self.rx.asm = msg;
        self.rx.asm_total = landed_len;
        self.rx.asm_active = true;
        self.rx.asm_complete = true;
        self.ev.readable = true;
        self.flush();
        true
    }

    /// The READ of the head message completed: its RTS slot goes back and DONE is queued.
    pub(super) fn on_read_done(&mut self) {
        let Some(f) = self.rx.queue.front().copied() else {
            return;
        };
        self.repost(f.slot);
        self.ctl.done.push_back(f.msg_id);
        self.rx.read = ReadState::Landed;
        self.ev.readable = true;
        if self.rx.read_closed || self.rx.read_shut {
            self.rx.queue.pop_front();
            self.rx.read = ReadState::Idle;
        }
    }

    /// A checked RTS arrived in `slot`.
    pub(super) fn on_rts(&mut self, slot: u16, h: &Header) {
        if self.rx.read_closed || self.rx.read_shut {
            self.repost(slot);
            self.ctl.done.push_back(h.msg_id);
            return;
        }
        self.rx.queue.push_back(RxFrame {
            slot,
            len: 0,
            first: true,
            last: true,
            total: h.aux,
            rts: true,
            msg_id: h.msg_id,
        });
        self.ev.readable = true;
        self.reassemble();
    }

    /// The peer asks for rendezvous message `msg_id` back. Dropped, and WITHDRAWN queued, when
    /// its RTS waits unread; a message whose READ began (or landed) is left to finish, and its
    /// DONE answers. One not queued at all was read already (its DONE went or goes) or
    /// discarded by a close (answered DONE): nothing to do.
    pub(super) fn on_withdraw(&mut self, msg_id: u16) {
        let Some(at) = self
            .rx
            .queue
            .iter()
            .position(|f| f.rts && f.msg_id == msg_id)
        else {
            return;
        };
        if at == 0 && self.rx.read != ReadState::Idle {
            return;
        }
        let Some(f) = self.rx.queue.remove(at) else {
            return;
        };
        self.repost(f.slot);
        self.ctl.withdrawn.push_back(msg_id);
        // The head may have changed: a reader told `NeedsRead` looks again.
        self.ev.readable = true;
        self.reassemble();
    }

    /// No message at the head: the end of the stream, or nothing yet.
    fn no_message<T>(&self) -> Recv<T> {
        if self.is_eof() {
            Recv::Eof
        } else {
            Recv::Blocked
        }
    }

    fn check_read(&self, op: &'static str) -> Result<(), ProtoError> {
        if let Some(e) = &self.failed {
            // What arrived whole before the failure is still read, then the failure: its
            // slots' completions were reaped, so the NIC is done with them (a peer that went
            // after its linger ran out must not take back what we already had).
            if !matches!(self.head(), Some((Head::Slot(_) | Head::Reassembled, _))) {
                return Err(e.clone());
            }
        }
        if self.rx.read_closed {
            return Err(ProtoError::Closed { op });
        }
        Ok(())
    }

    fn head(&self) -> Option<(Head, usize)> {
        if self.rx.asm_complete {
            return Some((Head::Reassembled, self.rx.asm_total));
        }
        match self.rx.queue.front() {
            Some(f) if !self.rx.asm_active && f.rts => {
                Some((Head::Rendezvous(*f), f.total as usize))
            }
            Some(f) if !self.rx.asm_active && f.first && f.last => {
                Some((Head::Slot(*f), f.len as usize))
            }
            _ => None,
        }
    }

    fn copy_head(&self, head: Head, offset: usize, out: &mut [u8]) {
        match head {
            Head::Reassembled => out.copy_from_slice(&self.rx.asm[offset..offset + out.len()]),
            Head::Slot(f) => self.mem.read_recv(f.slot, HEADER_LEN + offset, out),
            // Never copied: the read calls answer `NeedsRead` first.
            Head::Rendezvous(_) => {}
        }
    }

    fn consume_head(&mut self, head: Head) {
        match head {
            Head::Reassembled => {
                release_if_large(&mut self.rx.asm);
                self.rx.asm_active = false;
                self.rx.asm_complete = false;
            }
            Head::Slot(f) => {
                self.rx.queue.pop_front();
                self.repost(f.slot);
            }
            // Taken only by `take_read`.
            Head::Rendezvous(_) => return,
        }
        self.rx.read_off = 0;
        self.reassemble();
    }

    /// Consumes head messages with nothing left to read (read to the end, or empty).
    /// Takes the head message when a read reached its end (nothing of it is left, and it had
    /// something to read).
    fn take_if_read_to_end(&mut self) {
        if let Some((head, len)) = self.head() {
            if self.rx.read_off > 0
                && self.rx.read_off == len
                && !matches!(head, Head::Rendezvous(_))
            {
                self.consume_head(head);
            }
        }
    }

    fn skip_finished(&mut self) {
        while let Some((head, len)) = self.head() {
            if len > self.rx.read_off || matches!(head, Head::Rendezvous(_)) {
                return;
            }
            self.consume_head(head);
        }
    }

    /// A checked DATA frame arrived in `slot` while a reader waits with `buf`: when it is a
    /// whole message, nothing is queued before it (so it is the next message read) and it
    /// fits, it is copied into `buf` and its slot reposted, which leaves the state
    /// [`Conn::on_data`] followed by [`Conn::recv_msg_into`] would; `None` otherwise
    /// (nothing done).
    pub(super) fn take_at_once(&mut self, slot: u16, h: &Header, buf: &mut [u8]) -> Option<usize> {
        let n = h.payload_len as usize;
        let next_read = self.nothing_held()
            && self.rx.read_off == 0
            && !self.rx.read_closed
            && !self.rx.read_shut;
        if !(next_read && h.first() && h.last() && n <= buf.len()) {
            return None;
        }
        self.mem.read_recv(slot, HEADER_LEN, &mut buf[..n]);
        self.repost(slot);
        Some(n)
    }

    /// A checked DATA frame arrived in `slot`.
    pub(super) fn on_data(&mut self, slot: u16, h: &Header) {
        if self.rx.read_closed || self.rx.read_shut {
            self.repost(slot);
            return;
        }
        self.rx.queue.push_back(RxFrame {
            slot,
            len: h.payload_len,
            first: h.first(),
            last: h.last(),
            total: h.aux,
            rts: false,
            msg_id: h.msg_id,
        });
        if h.last() {
            self.ev.readable = true;
        }
        self.reassemble();
    }

    /// Moves fragments of a multi-fragment message from their slots into the reassembly
    /// buffer, until a message is complete there or the head is a one-fragment message. Runs
    /// at every arrival and every read, so what is usual (nothing queued, or a one-fragment
    /// message at the head, which stays in its slot) is decided here without a call.
    fn reassemble(&mut self) {
        if self.rx.direct.is_some() || self.rx.asm_complete {
            return;
        }
        match self.rx.queue.front() {
            None => {}
            Some(f) if f.first && f.last && !self.rx.asm_active => {}
            Some(_) => self.reassemble_fragments(),
        }
    }

    fn reassemble_fragments(&mut self) {
        while !self.rx.asm_complete {
            let Some(f) = self.rx.queue.front().copied() else {
                return;
            };
            if !self.rx.asm_active {
                if f.first && f.last {
                    return;
                }
                self.rx.asm.clear();
                self.rx.asm.reserve_exact(f.total as usize);
                self.rx.asm_active = true;
                self.rx.asm_total = f.total as usize;
            }
            let at = self.rx.asm.len();
            self.rx.asm.resize(at + f.len as usize, 0);
            self.mem
                .read_recv(f.slot, HEADER_LEN, &mut self.rx.asm[at..]);
            self.rx.queue.pop_front();
            self.repost(f.slot);
            self.rx.asm_complete = f.last;
        }
    }

    /// After `close`: everything held is dropped and its slots reposted.
    pub(super) fn discard_received(&mut self) {
        // A message being read stays until its READ completes (`on_read_done` drops it then);
        // one whose READ landed has its slot back already.
        let reading = match self.rx.read {
            ReadState::Reading(_) => self.rx.queue.pop_front(),
            // Between two pieces: nothing in flight, so it ends here (DONE below).
            ReadState::NextPiece => {
                self.rx.read = ReadState::Idle;
                None
            }
            ReadState::Landed => {
                self.rx.queue.pop_front();
                self.rx.read = ReadState::Idle;
                None
            }
            ReadState::Idle => None,
        };
        while let Some(f) = self.rx.queue.pop_front() {
            if f.rts {
                // The sender waits for DONE to release its memory.
                self.ctl.done.push_back(f.msg_id);
            }
            self.repost(f.slot);
        }
        if let Some(f) = reading {
            self.rx.queue.push_front(f);
        }
        release_if_large(&mut self.rx.asm);
        self.rx.asm_active = false;
        self.rx.asm_complete = false;
        self.rx.read_off = 0;
        self.rx.direct = None;
    }
}
