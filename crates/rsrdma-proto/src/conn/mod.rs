//! `Conn`: the connection state machine. Inputs are `handle_*` calls and application
//! commands; outputs are drained with `poll_work`, `poll_timeout` and `poll_event`, in that
//! order, after every input.

mod recv;
mod send;

use crate::credit::{RxCredit, TxCredit};
use crate::error::{Fatal, ProtoError};
use crate::frame::{abort_code, FrameType, Header, HEADER_LEN};
use crate::memory::SlotMemory;
use crate::params::{Config, Settled, CONTROL_RESERVE};
use crate::seq::RxSequence;
use crate::sq::SendQueue;
use crate::timer::{later, Timer, Timers};
use crate::work::{Counters, Event, Work, WrId};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Numbers fixed at creation.
#[derive(Debug)]
struct Limits {
    frame_payload: usize,
    inline_size: usize,
    slot_size: u32,
    max_message: u32,
    credit_threshold: u64,
    keepalive: Option<Duration>,
    peer_timeout: Duration,
    /// The settled rendezvous threshold, when rendezvous was settled.
    rendezvous: Option<u32>,
    /// Withdrawal was settled (WITHDRAW/WITHDRAWN frames).
    withdraw: bool,
    /// The longest READ to post ([`Config::max_read`]).
    max_read: u32,
}

/// The message being fragmented: frames go straight from the caller's slice into send slots
/// while resources last; the rest is copied once into `pending`.
#[derive(Debug, Default)]
struct TxState {
    active: bool,
    id: u16,
    total: usize,
    offset: usize,
    pending: Vec<u8>,
    pending_base: usize,
    messages: u64,
    write_closed: bool,
    want_writable: bool,
    /// The current message's rest is in the caller's slice (`send_msg_borrowed`), not in
    /// `pending`: only the caller's next call moves it.
    borrowed: bool,
    /// The current message goes by rendezvous: its RTS (address, key, and whether the key is
    /// a window's the core binds first) is not sent yet.
    rts: Option<Rts>,
    /// Rendezvous messages whose RTS went out and whose DONE has not come: their numbers, and
    /// their window's key where they expose a window.
    unreleased: VecDeque<(u64, Option<u32>)>,
    /// Window messages whose DONE came, and the WR of their window's invalidation: their
    /// memory stays exposed until that WR completes.
    invalidating: VecDeque<(u64, WrId)>,
    /// Unreleased rendezvous messages the driver asked back (a WITHDRAW queued or sent),
    /// whose answer has not come.
    withdrawing: VecDeque<u64>,
    /// Messages the peer answered WITHDRAWN (dropped unread), until the driver takes the
    /// news ([`Conn::take_withdrawn`]).
    withdrawn: VecDeque<u64>,
    /// The current message's payload is lent memory (address, lkey): `send_msg_lent`.
    lent: Option<(u64, u32)>,
    /// Lent messages with every fragment posted, and the WR of their last (signalled)
    /// fragment, in posting order: their memory is the NIC's until that WR completes.
    lent_out: VecDeque<(u64, WrId)>,
    /// Payload bytes copied into send slots or inline staging (`Counters::send_copied_bytes`).
    copied: u64,
}

/// The RTS of the message being sent, not sent yet.
#[derive(Debug, Clone, Copy)]
struct Rts {
    addr: u64,
    rkey: u32,
    /// `rkey` is the new key of the driver's memory window for this message: a
    /// [`Work::BindWindow`] goes right before the RTS, a [`Work::InvalidateWindow`] after the
    /// DONE.
    window: bool,
}

/// A DATA frame waiting in its receive slot.
#[derive(Debug, Clone, Copy)]
struct RxFrame {
    slot: u16,
    len: u32,
    first: bool,
    last: bool,
    total: u32,
    /// An RTS: the message is pulled with RDMA READ (`len` is 0, `total` the message).
    rts: bool,
    msg_id: u16,
}

/// The rendezvous read of the head message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ReadState {
    #[default]
    Idle,
    /// A READ (of the message, or of its next piece) is posted as this WR.
    Reading(WrId),
    /// A piece of a message longer than `max_read` landed; the next waits for room in the
    /// send queue.
    NextPiece,
    /// The READ completed (its RTS slot is reposted, DONE queued): the driver takes it.
    Landed,
}

#[derive(Debug, Default)]
struct RxState {
    queue: VecDeque<RxFrame>,
    asm: Vec<u8>,
    asm_active: bool,
    asm_complete: bool,
    asm_total: usize,
    read_off: usize,
    read_closed: bool,
    /// `shutdown_read`: arriving data is discarded and reads report EOF.
    read_shut: bool,
    /// A direct receive (`recv_msg_direct`) is filling the caller's buffer with the head
    /// message: this many bytes are there already. Fragments then wait in their slots for the
    /// caller instead of being reassembled here.
    direct: Option<usize>,
    /// The rendezvous read of the head message.
    read: ReadState,
    /// Where that read goes and how much of it was posted.
    read_plan: ReadPlan,
}

/// A rendezvous read, posted in pieces of at most `max_read` bytes.
#[derive(Debug, Clone, Copy, Default)]
struct ReadPlan {
    local_addr: u64,
    lkey: u32,
    remote_addr: u64,
    rkey: u32,
    len: u32,
    /// Bytes posted so far.
    posted: u32,
}

impl ReadState {
    /// A read started and has not landed (a piece in flight, or the next one waiting).
    fn in_progress(self) -> bool {
        matches!(self, ReadState::Reading(_) | ReadState::NextPiece)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FinState {
    Open,
    Pending,
    Sent(WrId),
    Done,
}

#[derive(Debug)]
struct Control {
    pong: Option<u32>,
    ping: bool,
    ping_token: u32,
    fin: FinState,
    abort: Option<u32>,
    /// DONE frames to send (the message ids of RTSs whose read completed or was dropped).
    done: VecDeque<u16>,
    /// WITHDRAW frames to send (the ids of RTSs this side asks back).
    withdraw: VecDeque<u16>,
    /// WITHDRAWN frames to send (the ids of the peer's RTSs dropped unread at its request).
    withdrawn: VecDeque<u16>,
    /// Windows to invalidate (message number, key): their message's DONE arrived.
    invalidate: VecDeque<(u64, u32)>,
}

#[derive(Debug, Default)]
struct EventFlags {
    failed: bool,
    peer_closed: bool,
    readable: bool,
    writable: bool,
}

/// The protocol core of one connection. `M` is the slot memory the driver lends.
#[derive(Debug)]
pub struct Conn<M: SlotMemory> {
    mem: M,
    lim: Limits,
    settled: Settled,
    sq: SendQueue,
    txc: TxCredit,
    rxc: RxCredit,
    tx: TxState,
    rx: RxState,
    seq: RxSequence,
    recv_posted: Vec<bool>,
    ctl: Control,
    timers: Timers,
    last_heard: Instant,
    /// The latest time the driver gave the core (a timer tick or a receive): a driver that
    /// runs ticks at least once a keepalive interval, so a much longer gap before a tick
    /// means this side did not run (see [`Conn::handle_timeout`]).
    last_tick: Instant,
    /// At the latest keepalive tick, the number of the next send WR, when sends were
    /// outstanding: if any WR below it is still outstanding at the peer-dead deadline, a
    /// keepalive interval later, this side's frames are not getting through
    /// ([`Conn::handle_timeout`]).
    stall_mark: Option<u64>,
    failed: Option<ProtoError>,
    out: VecDeque<Work>,
    ev: EventFlags,
    inline: Box<[u8]>,
    /// Initial `PostRecv`s not taken yet: they are in the first grant already.
    initial_recvs: u16,
    /// A repost was taken since the last flush: its credit may make a CREDIT frame due.
    granted: bool,
}

/// How many times `peer_timeout` of silence a peer is allowed while this side's receive pool
/// runs low ([`Conn::excuse_silence`]).
pub const EXCUSED_SILENCE: u32 = 4;

impl<M: SlotMemory> Conn<M> {
    /// A connection over `memory` (laid out as `memory` module docs say). Queues a
    /// `PostRecv` for every receive slot: the driver posts them before the peer may send.
    pub fn new(
        config: &Config,
        settled: &Settled,
        memory: M,
        now: Instant,
    ) -> Result<Self, ProtoError> {
        config.check()?;
        if settled.local_recv_slots != config.recv_slots || settled.frame_size > config.slot_size {
            return Err(ProtoError::BadParams {
                reason: "the settled parameters do not come from this config",
            });
        }
        let slots = config.recv_slots;
        let sq_depth = usize::from(config.sq_depth);
        let mut out = VecDeque::with_capacity(usize::from(slots) + sq_depth);
        out.extend((0..slots).map(|slot| Work::PostRecv { slot }));
        let sq = SendQueue::new(config.sq_depth, config.signal_interval, config.send_slots);
        let inline = vec![0; sq.entries() * usize::from(config.inline_size)].into_boxed_slice();
        let mut conn = Self {
            mem: memory,
            lim: Limits {
                frame_payload: settled.frame_payload() as usize,
                inline_size: usize::from(config.inline_size),
                slot_size: config.slot_size,
                max_message: settled.max_message,
                credit_threshold: (u64::from(slots) / 4).max(2),
                keepalive: config.keepalive,
                peer_timeout: config.peer_timeout,
                rendezvous: settled.rendezvous(),
                withdraw: settled.withdraw(),
                max_read: config.max_read,
            },
            settled: *settled,
            sq,
            txc: TxCredit::new(settled.peer_recv_slots),
            rxc: RxCredit::new(slots),
            tx: TxState::default(),
            rx: RxState {
                queue: VecDeque::with_capacity(usize::from(slots)),
                ..RxState::default()
            },
            seq: RxSequence::default(),
            recv_posted: vec![true; usize::from(slots)],
            initial_recvs: slots,
            granted: false,
            ctl: Control {
                pong: None,
                ping: false,
                ping_token: 0,
                fin: FinState::Open,
                abort: None,
                done: VecDeque::new(),
                withdraw: VecDeque::new(),
                withdrawn: VecDeque::new(),
                invalidate: VecDeque::new(),
            },
            timers: Timers::default(),
            last_heard: now,
            last_tick: now,
            stall_mark: None,
            failed: None,
            out,
            ev: EventFlags::default(),
            inline,
        };
        conn.arm_liveness_timers_from(now);
        Ok(conn)
    }

    // ----- (A) getters -------------------------------------------------------------------

    /// The negotiated parameters.
    pub fn settled(&self) -> &Settled {
        &self.settled
    }

    /// The slot memory (the driver maps slots to its registered regions through it).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The slot memory, mutably: for a driver or a simulation that writes receive slots.
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.mem
    }

    /// The bytes of an inline send (`Work::PostSend { slot: None, .. }`), valid until the WR
    /// completes; `None` if `wr_id` is not an outstanding inline WR.
    pub fn inline_frame(&self, wr_id: WrId) -> Option<&[u8]> {
        match self.sq.record_len(wr_id)? {
            (None, len) => {
                let at = self.sq.entry(wr_id) * self.lim.inline_size;
                Some(&self.inline[at..at + len as usize])
            }
            (Some(_), _) => None,
        }
    }

    /// The settled rendezvous threshold: messages of at least this many bytes should go by
    /// [`Conn::send_rendezvous`]; `None` when the peer did not offer rendezvous.
    pub fn rendezvous_threshold(&self) -> Option<u32> {
        self.lim.rendezvous
    }

    /// The sticky error, once the connection failed.
    pub fn error(&self) -> Option<&ProtoError> {
        self.failed.as_ref()
    }

    /// Whether the peer's FIN arrived.
    pub fn peer_closed(&self) -> bool {
        self.seq.fin
    }

    /// Nothing is in flight: no send WR outstanding or queued, and either our FIN completed or
    /// the connection failed. The driver may then destroy the QP and free the memory (after a
    /// failure, once it has flushed the QP and called `handle_flushed`).
    pub fn is_drained(&self) -> bool {
        let quiet = self.out.iter().all(|w| matches!(w, Work::PostRecv { .. }))
            && self.sq.outstanding() == 0;
        let released = self.tx.unreleased.is_empty() && self.ctl.invalidate.is_empty();
        quiet && (self.failed.is_some() || (self.ctl.fin == FinState::Done && released))
    }

    /// Counters for tests and diagnostics.
    pub fn counters(&self) -> Counters {
        Counters {
            frames_sent: self.txc.sent,
            peer_limit: self.txc.limit,
            peer_slots: self.txc.peer_slots,
            frames_received: self.rxc.received,
            grant: self.rxc.grant,
            announced: self.rxc.announced,
            held_slots: self.rx.queue.len() as u64,
            sq_outstanding: self.sq.outstanding(),
            free_send_slots: self.sq.free_slots() as u64,
            reassembly_bytes: self.rx.asm.len() as u64,
            queued_send_bytes: self.tx.pending.len() as u64,
            messages_sent: self.tx.messages,
            messages_received: self.seq.messages,
            rendezvous_unreleased: (self.tx.unreleased.len()
                + self.ctl.invalidate.len()
                + self.tx.invalidating.len()) as u64,
            send_copied_bytes: self.tx.copied,
            lent_unreleased: self.tx.lent_out.len() as u64
                + u64::from(self.tx.active && self.tx.lent.is_some()),
        }
    }

    // ----- (B) inputs --------------------------------------------------------------------

    /// A send completion (`status`: `Err(ibv_wc_status)` when it failed). A successful one
    /// must be for a signalled WR; it completes every earlier WR too.
    pub fn handle_send_completion(&mut self, wr_id: WrId, status: Result<(), u32>) {
        if let Err(reason) = self.sq.complete(wr_id, status.is_ok()) {
            self.fail(ProtoError::Misuse { reason });
            return;
        }
        pop_completed(&mut self.tx.lent_out, &self.sq);
        pop_completed(&mut self.tx.invalidating, &self.sq);
        if let FinState::Sent(fin) = self.ctl.fin {
            if self.sq.is_done(fin) {
                self.ctl.fin = FinState::Done;
                self.stop_timers_if_closed();
            }
        }
        match status {
            Err(status) => self.fail(ProtoError::Fatal(Fatal::SendCompletion { status })),
            Ok(()) => {
                if let ReadState::Reading(wr) = self.rx.read {
                    if self.sq.is_done(wr) {
                        self.on_read_piece_done();
                    }
                }
                self.flush()
            }
        }
    }

    /// A receive completion of `len` bytes into `slot`.
    pub fn handle_recv_completion(
        &mut self,
        slot: u16,
        len: u32,
        status: Result<(), u32>,
        now: Instant,
    ) {
        self.recv_completion(slot, len, status, now, None);
    }

    /// A receive completion into `slot` that carried immediate data (a SEND or an RDMA
    /// WRITE with immediate): the protocol sends none, so the peer broke it, as with any
    /// malformed frame (ABORT code 1). An outside tester's hostile peer had its SEND with
    /// immediate delivered as an ordinary message.
    pub fn handle_recv_with_immediate(&mut self, slot: u16, now: Instant) {
        let Some(posted) = self.recv_posted.get_mut(usize::from(slot)).filter(|p| **p) else {
            self.fail(ProtoError::Misuse {
                reason: "receive completion for a slot that is not posted",
            });
            return;
        };
        *posted = false;
        if self.failed.is_some() {
            return;
        }
        self.heard(now);
        self.fail(ProtoError::BadFrame {
            reason: "a frame with immediate data (the protocol sends none)",
        });
    }

    /// As [`Conn::handle_recv_completion`], for a driver whose caller waits in
    /// [`Conn::recv_msg_into`] with `buf`: when the frame is a whole message that would be
    /// the next one read and fits `buf`, it goes from its slot straight into `buf` and is
    /// consumed (its slot's repost queued), as `recv_msg_into(buf)` right after would do, and
    /// its length is returned. `None`: handled as by `handle_recv_completion` (a message it
    /// carries is queued for the read calls).
    ///
    /// A small message's receive is then one call into the core, not two, and never enters
    /// the read queue: the round trip of a ping-pong is its path.
    pub fn handle_recv_completion_into(
        &mut self,
        slot: u16,
        len: u32,
        status: Result<(), u32>,
        now: Instant,
        buf: &mut [u8],
    ) -> Option<usize> {
        self.recv_completion(slot, len, status, now, Some(buf))
    }

    fn recv_completion(
        &mut self,
        slot: u16,
        len: u32,
        status: Result<(), u32>,
        now: Instant,
        into: Option<&mut [u8]>,
    ) -> Option<usize> {
        let Some(posted) = self.recv_posted.get_mut(usize::from(slot)).filter(|p| **p) else {
            self.fail(ProtoError::Misuse {
                reason: "receive completion for a slot that is not posted",
            });
            return None;
        };
        *posted = false;
        if let Err(status) = status {
            self.fail(ProtoError::Fatal(Fatal::RecvCompletion { status }));
            return None;
        }
        if self.failed.is_some() {
            return None;
        }
        self.heard(now);
        let taken = match self.on_frame(slot, len, into) {
            Ok(taken) => taken,
            Err(e) => {
                self.fail(e);
                return None;
            }
        };
        self.flush();
        taken
    }

    /// Timers: a no-op unless a deadline from `poll_timeout` has passed.
    ///
    /// The peer is declared dead after `peer_timeout` of silence *while this side listened*.
    /// A tick that comes more than two keepalive intervals after the previous one means this
    /// side did not run meanwhile (a blocked thread, a runtime busy with something else, a
    /// suspended machine): it could not have heard the peer, nor answered its PINGs, so the
    /// silence is not held against the peer. The peer gets a PING at once and a whole
    /// `peer_timeout` from now to answer it.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.failed.is_some() {
            return;
        }
        let stalled = self
            .lim
            .keepalive
            .is_some_and(|every| now.saturating_duration_since(self.last_tick) > 2 * every);
        self.tick(now);
        if stalled && self.timers.get(Timer::PeerDead).is_some() {
            tracing::debug!(
                gap_ms = now.saturating_duration_since(self.last_heard).as_millis() as u64,
                "rsrdma-proto: this side did not run; probing the peer before any verdict"
            );
            self.ctl.ping = true;
            self.arm_liveness_timers_from(now);
            self.flush();
            return;
        }
        if self.timers.expired(Timer::PeerDead, now) {
            // A peer that receives from a shared pool may be refusing this side's frames
            // for want of room (RNR), PINGs included: this side's sends then make no
            // progress, and the peer never got a PING to answer (an outside tester's find:
            // dialers of a listener with a small pool declared it dead while it served
            // them). And a peer whose memory this side is READing (a large rendezvous
            // message) sends its answers behind the READ's data on a slow link: 512 MiB
            // through soft0's ring took longer than `peer_timeout`, and a live peer was
            // declared dead (another tester's find). The silence is excused in both cases
            // as the listener excuses its peers' (`excuse_silence`) while this side's work
            // requests make no progress. A dead peer is still found: its NIC fails those
            // requests, or the excuse runs out.
            let reading = self.rx.read.in_progress();
            if (self.settled.peer_pooled || reading) && self.sends_stalled() && self.excuse(now) {
                return;
            }
            let silent_ms = now.saturating_duration_since(self.last_heard).as_millis() as u64;
            self.fail(ProtoError::PeerDead { silent_ms });
            return;
        }
        if let (true, Some(every)) = (
            self.timers.expired(Timer::KeepAlive, now),
            self.lim.keepalive,
        ) {
            self.ctl.ping = true;
            self.timers.set(Timer::KeepAlive, Some(later(now, every)));
            self.flush();
            self.stall_mark = (self.sq.outstanding() > 0).then(|| self.sq.next_index());
        }
    }

    /// Whether a send posted before the latest keepalive tick (a keepalive interval ago at
    /// least) is still outstanding: the PING posted then is signalled, so a peer that takes
    /// this side's frames would have completed it.
    fn sends_stalled(&self) -> bool {
        self.stall_mark.is_some_and(|m| !self.sq.done_below(m))
    }

    /// This side's receive queue ran low at `low_at` (a listener's shared pool: the peer's
    /// frames then wait in RNR retries, and they may be its keepalive answers): when the
    /// peer-dead deadline has come and that was since the peer was last heard, the silence
    /// is not held against the peer yet. The peer gets a PING and another `peer_timeout`,
    /// up to [`EXCUSED_SILENCE`] times `peer_timeout` of silence in all, after which it is
    /// declared dead as usual (a dead peer on a pool that stays crowded is still found).
    /// Returns whether the silence was excused; the driver calls it before
    /// [`Conn::handle_timeout`].
    pub fn excuse_silence(&mut self, now: Instant, low_at: Instant) -> bool {
        if self.failed.is_some()
            || !self.timers.expired(Timer::PeerDead, now)
            || low_at < self.last_heard
        {
            return false;
        }
        self.excuse(now)
    }

    /// Excuses the peer's silence until now, unless it has lasted [`EXCUSED_SILENCE`] times
    /// `peer_timeout`: sends a PING and gives the peer another `peer_timeout`.
    fn excuse(&mut self, now: Instant) -> bool {
        let silent = now.saturating_duration_since(self.last_heard);
        if silent >= self.lim.peer_timeout.saturating_mul(EXCUSED_SILENCE) {
            return false;
        }
        tracing::debug!(
            silent_ms = silent.as_millis() as u64,
            "rsrdma-proto: a shared receive pool (this side's or the peer's) may hold frames up; probing the peer before any verdict"
        );
        self.ctl.ping = true;
        if let Some(every) = self.lim.keepalive {
            self.timers.set(Timer::KeepAlive, Some(later(now, every)));
        }
        self.timers
            .set(Timer::PeerDead, Some(later(now, self.lim.peer_timeout)));
        self.flush();
        true
    }

    /// The transport broke (a failed completion the driver saw first, the QP in ERROR, a
    /// disconnect). Nothing more is posted; the driver moves the QP to ERROR, reaps the
    /// flushed completions and calls `handle_flushed`.
    pub fn handle_fatal(&mut self, reason: Fatal) {
        self.fail(ProtoError::Fatal(reason));
    }

    /// The driver flushed the QP (in ERROR, completion queue drained): no WR is outstanding.
    pub fn handle_flushed(&mut self) {
        self.sq.complete_all();
        self.recv_posted.iter_mut().for_each(|p| *p = false);
        if let FinState::Sent(_) = self.ctl.fin {
            self.ctl.fin = FinState::Done;
        }
        // The peer can no longer read what our RTSs expose, nor we what theirs do; and the
        // NIC reads no lent memory any more (a lent message cut short stays unsent).
        self.tx.unreleased.clear();
        self.tx.invalidating.clear();
        self.ctl.invalidate.clear();
        self.tx.lent_out.clear();
        if self.tx.active && self.tx.lent.is_some() {
            self.tx.active = false;
            self.tx.lent = None;
        }
        if self.rx.read.in_progress() {
            self.rx.read = ReadState::Idle;
        }
    }

    // ----- (D) outputs -------------------------------------------------------------------

    /// The next work request to post. The driver posts what it takes before it gives the core
    /// any other input, and drains this until `None` after posting.
    ///
    /// A receive's credit counts from the moment the driver takes its `PostRecv` here, not
    /// from the repost: so every frame built before the driver took a receive leaves that
    /// receive unannounced, and the driver may post a round's sends before its receives (a
    /// small message's send then goes before the repost of the receive it answers). Once the
    /// queue is empty, the credit of the receives taken may make a CREDIT frame due: it is
    /// built then, after them, and announces them.
    pub fn poll_work(&mut self) -> Option<Work> {
        match self.out.pop_front() {
            Some(w) => {
                if let Work::PostRecv { .. } = w {
                    self.take_recv_credit();
                }
                Some(w)
            }
            None if self.granted => {
                self.granted = false;
                self.flush();
                self.out.pop_front()
            }
            None => None,
        }
    }

    /// A `PostRecv` was taken: its credit counts from now (the initial receives' is counted
    /// in the first grant).
    fn take_recv_credit(&mut self) {
        if self.initial_recvs > 0 {
            self.initial_recvs -= 1;
        } else {
            self.rxc.grant += 1;
            self.granted = true;
        }
    }

    /// Whether the driver may leave what is queued for a later round: only receives are
    /// queued, and their credit is not needed soon (the peer can still send at least two
    /// frames, each of which brings a step that takes them, and taking them would not make a
    /// CREDIT frame due). A receive loop then posts its reposts together with its next send,
    /// after that send's doorbell.
    pub fn reposts_may_wait(&self) -> bool {
        if self.failed.is_some() || self.rxc.peer_view() <= 1 {
            return false;
        }
        let queued = self.out.len() as u64;
        // The newest first: a send queued after the reposts is the usual reason to post now.
        self.out.back().is_some_and(is_repost)
            && self.rxc.unannounced() + queued < self.lim.credit_threshold
            && self.only_reposts_queued()
    }

    /// Whether the work queue holds nothing but reposts (also when it is empty).
    pub(super) fn only_reposts_queued(&self) -> bool {
        self.out.iter().all(is_repost)
    }

    /// How many work requests are queued (what `poll_work` would still return).
    pub fn work_queued(&self) -> usize {
        self.out.len()
    }

    /// The work request `poll_work` would return next, left queued.
    pub fn peek_work(&self) -> Option<Work> {
        self.out.front().copied()
    }

    /// When `handle_timeout` is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// The next event, in the order Failed, PeerClosed, Readable, Writable.
    pub fn poll_event(&mut self) -> Option<Event> {
        let ev = &mut self.ev;
        if std::mem::take(&mut ev.failed) {
            return self.failed.clone().map(Event::Failed);
        }
        if std::mem::take(&mut ev.peer_closed) {
            return Some(Event::PeerClosed);
        }
        if std::mem::take(&mut ev.readable) {
            return Some(Event::Readable);
        }
        if std::mem::take(&mut ev.writable) {
            return Some(Event::Writable);
        }
        None
    }

    // ----- internals ---------------------------------------------------------------------

    /// Records the driver's latest time (never moving it back).
    fn tick(&mut self, now: Instant) {
        if now > self.last_tick {
            self.last_tick = now;
        }
    }

    fn heard(&mut self, now: Instant) {
        self.tick(now);
        self.ctl.ping = false;
        // Drivers pass a coarse clock (a tick of milliseconds): most frames arrive within the
        // tick of the one before, and then the deadlines would not move.
        if now > self.last_heard {
            self.last_heard = now;
            self.arm_liveness_timers_from(now);
        }
        self.stop_timers_if_closed();
    }

    /// The keepalive and peer-dead deadlines, counted from `from`: the last time the peer was
    /// heard, or the end of a stall of this side's own.
    fn arm_liveness_timers_from(&mut self, from: Instant) {
        if let Some(every) = self.lim.keepalive {
            self.timers.set(Timer::KeepAlive, Some(later(from, every)));
            self.timers
                .set(Timer::PeerDead, Some(later(from, self.lim.peer_timeout)));
        }
    }

    fn stop_timers_if_closed(&mut self) {
        if self.seq.fin && self.ctl.fin == FinState::Done {
            self.timers.clear();
        }
    }

    /// One arrived frame: checks, credits, then its effect; a whole message that `into` takes
    /// at once ([`Conn::handle_recv_completion_into`]) returns its length.
    fn on_frame(
        &mut self,
        slot: u16,
        len: u32,
        into: Option<&mut [u8]>,
    ) -> Result<Option<usize>, ProtoError> {
        if (len as usize) < HEADER_LEN || len > self.lim.slot_size {
            return Err(ProtoError::BadFrame {
                reason: "completion length outside header ..= slot size",
            });
        }
        let mut raw = [0u8; HEADER_LEN];
        self.mem.read_recv(slot, 0, &mut raw);
        let h = Header::decode(&raw)?;
        if HEADER_LEN as u64 + u64::from(h.payload_len) != u64::from(len) {
            return Err(ProtoError::BadFrame {
                reason: "payload length differs from the received length",
            });
        }
        let view_before = self.rxc.arrive()?;
        self.txc.update(h.credit_limit)?;
        match h.kind {
            FrameType::Data => {
                if view_before <= u64::from(CONTROL_RESERVE) {
                    return Err(ProtoError::ReserveViolated);
                }
                self.seq
                    .on_data(&h, self.lim.max_message, self.lim.frame_payload as u32)?;
                if let Some(buf) = into {
                    if let Some(n) = self.take_at_once(slot, &h, buf) {
                        return Ok(Some(n));
                    }
                }
                self.on_data(slot, &h);
            }
            FrameType::Credit | FrameType::Pong => self.repost(slot),
            FrameType::Ping => {
                self.ctl.pong = Some(h.aux);
                self.repost(slot);
            }
            FrameType::Fin => {
                self.seq.on_fin(&h)?;
                self.repost(slot);
                self.ev.peer_closed = true;
                self.ev.readable = true;
                self.stop_timers_if_closed();
            }
            FrameType::Abort => return Err(ProtoError::PeerAborted { code: h.aux }),
            FrameType::Rts | FrameType::Done if self.lim.rendezvous.is_none() => {
                return Err(ProtoError::Unsupported {
                    frame: h.kind as u8,
                })
            }
            FrameType::Withdraw | FrameType::Withdrawn if !self.lim.withdraw => {
                return Err(ProtoError::Unsupported {
                    frame: h.kind as u8,
                })
            }
            FrameType::Withdraw => {
                self.on_withdraw(h.msg_id);
                self.repost(slot);
            }
            FrameType::Withdrawn => {
                self.on_withdrawn(h.msg_id)?;
                self.ev.writable = true;
                self.repost(slot);
            }
            FrameType::Rts => {
                if view_before <= u64::from(CONTROL_RESERVE) {
                    return Err(ProtoError::ReserveViolated);
                }
                self.seq.on_rts(&h, self.lim.max_message)?;
                self.on_rts(slot, &h);
            }
            FrameType::Done => {
                match self.tx.unreleased.front() {
                    Some(&(m, window)) if m as u16 == h.msg_id => {
                        self.tx.unreleased.pop_front();
                        // Asked back too late: the peer was reading it, and read it whole.
                        self.tx.withdrawing.retain(|&w| w != m);
                        // The peer read it: end the window's grant before the memory goes.
                        if let Some(rkey) = window {
                            self.ctl.invalidate.push_back((m, rkey));
                        }
                    }
                    _ => {
                        return Err(ProtoError::Sequence {
                            reason: "a DONE that answers no outstanding RTS",
                        })
                    }
                }
                self.ev.writable = true;
                self.repost(slot);
            }
        }
        Ok(None)
    }

    fn repost(&mut self, slot: u16) {
        // A failed connection posts nothing more: its QP is in ERROR (or going there), and a
        // slot released late (a rendezvous message given up after the failure) stays idle.
        if self.failed.is_some() {
            return;
        }
        self.recv_posted[usize::from(slot)] = true;
        // Its credit counts once the driver takes it (`poll_work`).
        self.out.push_back(Work::PostRecv { slot });
    }

    /// Makes the error sticky, drops work the driver has not taken, and queues one ABORT when
    /// the error is ours to report and the QP still works.
    fn fail(&mut self, err: ProtoError) {
        if self.failed.is_some() {
            return;
        }
        tracing::debug!(error = %err, "rsrdma-proto: connection failed");
        self.ctl.abort = abort_for(&err);
        self.failed = Some(err);
        self.ev.failed = true;
        self.timers.clear();
        while let Some(w) = self.out.pop_back() {
            match w {
                // A READ that never went is not in progress: its WR id goes to the next post
                // (an ABORT), whose completion must not count as the READ's.
                Work::PostRead { wr_id, .. } => {
                    self.sq.unpost_last(wr_id);
                    if self.rx.read == ReadState::Reading(wr_id) {
                        self.rx.read = ReadState::Idle;
                    }
                }
                Work::PostSend { wr_id, .. }
                | Work::BindWindow { wr_id, .. }
                | Work::InvalidateWindow { wr_id, .. } => self.sq.unpost_last(wr_id),
                Work::PostRecv { slot } => self.recv_posted[usize::from(slot)] = false,
            }
        }
        self.flush();
    }
}

/// The ABORT code to send for a local failure, or `None` when no ABORT should go (the QP is
/// broken, or the peer aborted first).
fn abort_for(err: &ProtoError) -> Option<u32> {
    use ProtoError as E;
    Some(match err {
        E::BadFrame { .. } => abort_code::BAD_FRAME,
        E::CreditOverrun { .. } | E::ReserveViolated => abort_code::CREDIT,
        E::OversizeFragment { .. } | E::MessageTooLarge { .. } => abort_code::TOO_LARGE,
        E::Sequence { .. } | E::DataAfterFin { .. } => abort_code::SEQUENCE,
        E::Unsupported { .. } => abort_code::UNSUPPORTED,
        E::PeerDead { .. } => abort_code::TIMEOUT,
        E::Refused => abort_code::LISTENER_CLOSED,
        E::PeerAborted { .. } | E::Fatal(_) => return None,
        _ => abort_code::OTHER,
    })
}

/// Drops the front entries of `q` (message number, WR) whose WR has completed.
fn pop_completed(q: &mut VecDeque<(u64, WrId)>, sq: &SendQueue) {
    while q.front().is_some_and(|&(_, wr)| sq.is_done(wr)) {
        q.pop_front();
    }
}

/// Whether `w` is a receive's repost.
fn is_repost(w: &Work) -> bool {
    matches!(w, Work::PostRecv { .. })
}
