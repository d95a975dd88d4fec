//! One reliable-connected queue pair: its state machine, its requester (what it asked of the
//! peer, completed in order as answers come) and its responder (what the peer asks of it,
//! executed in order after the key and access checks).

use crate::access::Access;
use crate::direct::Direct;
use crate::memory::Memory;
use crate::mr::MrTable;
use crate::srq::Srq;
use crate::wire::{Nak, Packet, PacketKind, Payload, INLINE_PAYLOAD};
use crate::wr::{Completion, RecvWr, SendOp, SendWr, Sge, Status, WcOpcode};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A queue pair's settings (what `ibv_create_qp` and `ibv_modify_qp` give it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Its number.
    pub qp_num: u32,
    /// Its protection domain: its requests reach only regions of this domain.
    pub pd: u32,
    /// What its peer may do to its memory (remote write, read, atomic).
    pub access: Access,
    /// Send requests it holds at most.
    pub max_send_wr: u32,
    /// Receive requests it holds at most.
    pub max_recv_wr: u32,
    /// The largest inline payload.
    pub max_inline: u32,
    /// How often a request the peer answered with an RNR NAK is tried again (7: for ever).
    pub rnr_retry: u8,
    /// How long the peer should wait before it tries again, when this QP has no receive.
    pub min_rnr_timer: Duration,
    /// How often a request the responder dropped unexecuted (see [`Nak::Dropped`]) is sent
    /// again before it fails with `RETRY_EXC_ERR` (`retry_cnt`, 0 to 7: 7 is seven times,
    /// not for ever).
    pub retry_cnt: u8,
    /// How long an unanswered request waits before it is sent again (`timeout`: 4.096 µs ×
    /// 2^code); `None` (code 0) waits for ever, as a NIC's transport timer then does.
    pub ack_timeout: Option<Duration>,
    /// Every send request completes, signalled or not.
    pub sq_sig_all: bool,
    /// It takes its receives from a shared receive queue (passed to
    /// [`RcQp::handle_packet`]), not from its own.
    pub uses_srq: bool,
    /// Unreliable connected (UC) rather than reliable (RC): SENDs and WRITEs only, completed
    /// as they leave; the responder answers nothing and drops what it cannot execute.
    pub unreliable: bool,
}

/// A queue pair's state (`enum ibv_qp_state`, without the ones a soft device never uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Created.
    Reset,
    /// Receives may be posted.
    Init,
    /// Ready to receive: it answers its peer.
    Rtr,
    /// Ready to send.
    Rts,
    /// Failed: everything posted completes with a flush error.
    Error,
}

/// Why a post was refused (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The QP is not in a state that takes this request.
    State(QpState),
    /// The queue is full.
    Full,
    /// The request is malformed (inline data too long, or on a READ or atomic; an atomic
    /// whose local SGE is not one of 8 bytes).
    Invalid(&'static str),
}

/// An asynchronous event of a queue pair (what `ibv_get_async_event` reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpEvent {
    /// The QP, attached to an SRQ, is in ERROR and takes no more receives from it.
    LastWqeReached,
}

/// Why a queue pair will send its requests again from a PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// The responder had no receive: after its RNR timer.
    Rnr,
    /// The responder dropped the request (see [`Nak::Dropped`]): after the transport timer
    /// (`timeout`), if retries are left.
    Unanswered,
}

/// What became of a packet handed to [`RcQp::handle_packet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Handled {
    /// Executed, answered, or (an answer, a request of UC) taken or dropped as it should be.
    Taken,
    /// A request of RC dropped unexecuted: the queue pair is not in RTR or RTS.
    Dropped,
}

/// A send request in flight: its PSN, and its packet (kept until it is answered, for an
/// RNR retry); a local operation (a bind, an invalidation) has none: it was done when it was
/// posted and waits only to complete in order.
#[derive(Debug)]
struct Pending {
    wr: SendWr,
    psn: u32,
    packet: Option<Packet>,
    signaled: bool,
    /// A request that failed here (its local checks, a window bind): it completes with this
    /// status when it reaches the head, after every request before it, and the QP fails
    /// then, as rxe's requester stops at the bad request and its completer reports it in
    /// order. What is posted after it waits to be flushed.
    failure: Option<Status>,
    /// A fenced request (or one behind it) that waits for the READs and atomics before it:
    /// its bytes are gathered, and its packet made, when they have completed.
    held: bool,
}

/// The longest message (`max_msg_sz`, as rxe's): a packet's length field holds it, and a
/// peer device takes no longer payload.
pub const MAX_MESSAGE: u64 = 1 << 31;

/// A queue pair.
#[derive(Debug)]
pub struct RcQp {
    cfg: QpConfig,
    state: QpState,
    dest_qpn: u32,
    /// The next request's PSN.
    next_psn: u32,
    /// The PSN of the next request the peer's packets must carry.
    expected_psn: u32,
    sq: VecDeque<Pending>,
    rq: VecDeque<RecvWr>,
    out: VecDeque<Packet>,
    cq: VecDeque<Completion>,
    /// After an RNR NAK or a dropped request: the PSN to send again from, when, and why.
    resend: Option<(u32, Instant, Resend)>,
    rnr_left: u8,
    /// Sends again left for a request the responder dropped (see [`Nak::Dropped`]).
    retry_left: u8,
    events: VecDeque<QpEvent>,
    /// Requests that need a receive which the responder refuses (RNR) as if none were
    /// posted (fault injection: [`RcQp::refuse_receives`]).
    refuse_recv: u32,
    /// The link to the peer broke while nothing waited for an answer: the QP stays as it
    /// is, and its next request ends with `RETRY_EXC_ERR` (rxe learns of a dead peer only
    /// from a request that goes unanswered).
    link_lost: bool,
    /// Acknowledgements are held back ([`RcQp::set_hold_acks`]).
    hold_acks: bool,
    /// The executed requests whose acknowledgement is held back: the first and the last PSN.
    held_ack: Option<(u32, u32)>,
}

impl RcQp {
    /// A queue pair in RESET.
    pub fn new(cfg: QpConfig) -> RcQp {
        RcQp {
            cfg,
            state: QpState::Reset,
            dest_qpn: 0,
            next_psn: 0,
            expected_psn: 0,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            out: VecDeque::new(),
            cq: VecDeque::new(),
            resend: None,
            rnr_left: cfg.rnr_retry,
            retry_left: cfg.retry_cnt,
            events: VecDeque::new(),
            refuse_recv: 0,
            link_lost: false,
            hold_acks: false,
            held_ack: None,
        }
    }

    /// Its number.
    pub fn qp_num(&self) -> u32 {
        self.cfg.qp_num
    }

    /// Its state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Its settings.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Changes the settings a state transition carries (`ibv_modify_qp`: the access rights
    /// at INIT, the RNR timer at RTR, the retry counts and the timeout at RTS).
    pub fn set_config(&mut self, f: impl FnOnce(&mut QpConfig)) {
        f(&mut self.cfg);
        self.rnr_left = self.cfg.rnr_retry;
        self.retry_left = self.cfg.retry_cnt;
    }

    /// Any state → RESET: forgets everything queued, without completions.
    pub fn reset(&mut self) {
        let hold = self.hold_acks;
        *self = RcQp::new(self.cfg);
        self.hold_acks = hold;
    }

    /// RESET → INIT.
    ///
    /// # Errors
    /// [`PostError::State`] from any other state.
    pub fn to_init(&mut self) -> Result<(), PostError> {
        self.transition(QpState::Reset, QpState::Init)
    }

    /// INIT → RTR: answers `dest_qpn`, whose first request carries `rq_psn`.
    ///
    /// # Errors
    /// [`PostError::State`] from any other state.
    pub fn to_rtr(&mut self, dest_qpn: u32, rq_psn: u32) -> Result<(), PostError> {
        self.transition(QpState::Init, QpState::Rtr)?;
        self.dest_qpn = dest_qpn;
        self.expected_psn = rq_psn;
        Ok(())
    }

    /// RTR → RTS: its first request carries `sq_psn`.
    ///
    /// # Errors
    /// [`PostError::State`] from any other state.
    pub fn to_rts(&mut self, sq_psn: u32) -> Result<(), PostError> {
        self.transition(QpState::Rtr, QpState::Rts)?;
        self.next_psn = sq_psn;
        Ok(())
    }

    fn transition(&mut self, from: QpState, to: QpState) -> Result<(), PostError> {
        if self.state != from {
            return Err(PostError::State(self.state));
        }
        self.state = to;
        Ok(())
    }

    /// Any state → ERROR: every request still queued completes with `WR_FLUSH_ERR`, sends
    /// first, in order; nothing more is sent or answered.
    pub fn to_error(&mut self) {
        if self.state != QpState::Error && self.cfg.uses_srq {
            // Receives complete as they are taken, so none of the SRQ's is left with it.
            self.events.push_back(QpEvent::LastWqeReached);
        }
        self.state = QpState::Error;
        // What it executed before it failed was as good as answered (rxe sends each answer
        // as it executes): the answers queued (READ and atomic responses, acknowledgements)
        // still go, and the acknowledgement held back after them. Its own requests do not.
        // (It cleared them all and sent the held ACK: a READ of the peer's executed in the
        // same batch as the answer that failed this queue pair then failed with FATAL_ERR,
        // passed by the ACK, or, with nothing held, went unanswered: an outside reviewer's
        // find.)
        self.out.retain(|q| !q.kind.is_request());
        self.flush_ack();
        self.resend = None;
        while let Some(p) = self.sq.pop_front() {
            self.complete_send(&p.wr, Status::WrFlushErr, 0);
        }
        while let Some(r) = self.rq.pop_front() {
            self.complete_recv(r.wr_id, Status::WrFlushErr, WcOpcode::Recv, 0, None);
        }
    }

    /// The link to the peer broke (its process died, its stream reset): the oldest request
    /// still waiting for an answer completes with `RETRY_EXC_ERR`, then the QP fails.
    pub fn handle_link_down(&mut self) {
        // A UC QP waits for nothing, so it never learns of it (as on a fabric).
        if self.state == QpState::Error || self.cfg.unreliable {
            return;
        }
        if self.sq.is_empty() {
            // Nothing waits for the peer: the next request finds it gone.
            self.link_lost = true;
        } else {
            self.fail_head(Status::RetryExcErr);
        }
    }

    /// Fault injection: the next `count` requests that need a receive here (SEND, WRITE with
    /// immediate) find none, as if the application had not posted one yet: an RC responder
    /// answers RNR (the requester retries after the timer), a UC one drops the message.
    pub fn refuse_receives(&mut self, count: u32) {
        self.refuse_recv = count;
    }

    /// Queues a receive.
    ///
    /// # Errors
    /// [`PostError::State`] in RESET; [`PostError::Full`]; [`PostError::Invalid`] on a QP
    /// that receives from an SRQ.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        match admit_recv(&self.cfg, self.state, self.rq.len())? {
            RecvAdmission::Queue => self.rq.push_back(wr),
            RecvAdmission::Flush => {
                self.complete_recv(wr.wr_id, Status::WrFlushErr, WcOpcode::Recv, 0, None);
            }
        }
        Ok(())
    }

    /// Queues a send request and its packet. The local memory is checked and a SEND's or
    /// WRITE's bytes are gathered now (a bad local key completes the request with
    /// `LOC_PROT_ERR` and fails the QP, as the NIC would when it executes it). A window bind
    /// or a local invalidation is done now, in `mrs` (later requests, and the peer's requests
    /// that arrive after it, see it), and completes after the requests before it; one that
    /// breaks a rule completes with `MW_BIND_ERR` or `LOC_QP_OP_ERR` and fails the QP, as
    /// rxe's.
    ///
    /// # Errors
    /// [`PostError::State`] before RTS; [`PostError::Full`]; [`PostError::Invalid`].
    pub fn post_send(
        &mut self,
        wr: SendWr,
        mrs: &mut MrTable,
        mem: &dyn Memory,
    ) -> Result<(), PostError> {
        match self.state {
            QpState::Rts => {}
            QpState::Error => {
                self.complete_send(&wr, Status::WrFlushErr, 0);
                return Ok(());
            }
            s => return Err(PostError::State(s)),
        }
        if self.sq.len() >= self.cfg.max_send_wr as usize {
            return Err(PostError::Full);
        }
        let moves_data = wr.moves_data();
        if let Some(data) = &wr.inline {
            if !moves_data {
                return Err(PostError::Invalid(
                    "inline data on a READ, an atomic or a local operation",
                ));
            }
            if data.len() > self.cfg.max_inline as usize {
                return Err(PostError::Invalid("inline data over the QP's max_inline"));
            }
        }
        if wr.sge_len() > MAX_MESSAGE {
            return Err(PostError::Invalid("a message over max_msg_sz (2 GiB)"));
        }
        let local_op = matches!(wr.op, SendOp::BindMw(_) | SendOp::LocalInv { .. });
        if self.cfg.unreliable && !(moves_data || local_op) {
            return Err(PostError::Invalid(
                "a UC queue pair has no READ and no atomics",
            ));
        }
        if self.cfg.unreliable && matches!(wr.op, SendOp::SendWithInv { .. }) {
            return Err(PostError::Invalid(
                "a UC queue pair has no SEND with invalidate",
            ));
        }
        if self.halted() {
            // Behind a request that failed here: flushed when the QP fails.
            self.queue_local(wr, Some(Status::WrFlushErr));
            return Ok(());
        }
        if self.link_lost && !matches!(wr.op, SendOp::BindMw(_) | SendOp::LocalInv { .. }) {
            // The peer went while this QP was idle: the request goes unanswered.
            self.queue_local(wr, Some(Status::RetryExcErr));
            return Ok(());
        }
        if local_op {
            if self.must_wait(&wr) {
                // Done when its turn comes ([`RcQp::release_held`]); no PSN of its own.
                self.hold(wr, self.next_psn);
                return Ok(());
            }
            self.local_op(wr, mrs);
            return Ok(());
        }
        // Checked where rxe's provider checks them, at the post: the local memory holds the
        // word (at least 8 bytes; the first 8 get it) and the remote word is aligned.
        match wr.op {
            SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } => {
                if wr.sge_len() < 8 {
                    return Err(PostError::Invalid(
                        "an atomic needs at least 8 bytes of local memory",
                    ));
                }
                if remote_addr % 8 != 0 {
                    return Err(PostError::Invalid(
                        "an atomic's remote address must be 8-byte aligned",
                    ));
                }
            }
            _ => {}
        }
        let signaled = wr.signaled || self.cfg.sq_sig_all;
        // Local checks: gathered memory is read, READ and atomic destinations written.
        let local_ok = wr.inline.is_some()
            || wr
                .sges
                .iter()
                .all(|s| mrs.check_local(self.cfg.pd, s, !moves_data).is_ok());
        if !local_ok {
            self.queue_local(wr, Some(Status::LocProtErr));
            return Ok(());
        }
        let psn = self.next_psn;
        self.next_psn = self.next_psn.wrapping_add(1);
        if self.must_wait(&wr) {
            self.hold(wr, psn);
            return Ok(());
        }
        let packet = request_packet(&wr, self.dest_qpn, psn, mem);
        if self.cfg.unreliable {
            // Nothing comes back: the request is done once it leaves.
            self.out.push_back(packet);
            if signaled {
                self.complete_send(&wr, Status::Success, 0);
            }
            return Ok(());
        }
        if self.resend.is_none() {
            self.out.push_back(packet.clone());
        }
        self.sq.push_back(Pending {
            wr,
            psn,
            packet: Some(packet),
            signaled,
            failure: None,
            held: false,
        });
        Ok(())
    }

    /// Starts the held requests whose fence is passed (no READ or atomic before them is
    /// unanswered), in order: their bytes are gathered now.
    fn release_held(&mut self, mrs: &mut MrTable, mem: &dyn Memory) {
        let mut reads_ahead = false;
        for i in 0..self.sq.len() {
            let p = &self.sq[i];
            if !p.held {
                reads_ahead |= p.wr.wants_response();
                continue;
            }
            if p.wr.fence && reads_ahead {
                break;
            }
            reads_ahead |= p.wr.wants_response();
            if matches!(p.wr.op, SendOp::BindMw(_) | SendOp::LocalInv { .. }) {
                // A local operation: done now, completed in order with the others.
                let failed = self.local_effect(&self.sq[i].wr, mrs);
                let p = &mut self.sq[i];
                p.failure = failed;
                p.held = false;
                continue;
            }
            let packet = request_packet(&p.wr, self.dest_qpn, p.psn, mem);
            if self.resend.is_none() {
                self.out.push_back(packet.clone());
            }
            let p = &mut self.sq[i];
            p.packet = Some(packet);
            p.held = false;
        }
    }

    /// Does a window bind or a local invalidation now; it completes in send-queue order.
    fn local_op(&mut self, wr: SendWr, mrs: &mut MrTable) {
        let failed = self.local_effect(&wr, mrs);
        self.queue_local(wr, failed);
    }

    /// Binds or invalidates as `wr` says, in `mrs`; the status it fails with, if it does.
    fn local_effect(&self, wr: &SendWr, mrs: &mut MrTable) -> Option<Status> {
        let (pd, qp_num) = (self.cfg.pd, self.cfg.qp_num);
        match wr.op {
            SendOp::BindMw(b) => mrs.bind(pd, qp_num, &b).err().map(|_| Status::MwBindErr),
            SendOp::LocalInv { rkey } => {
                (!mrs.invalidate(pd, None, rkey)).then_some(Status::LocQpOpErr)
            }
            _ => None,
        }
    }

    /// Queues `wr` (PSN `psn`) to start once [`RcQp::release_held`] lets it.
    fn hold(&mut self, wr: SendWr, psn: u32) {
        let signaled = wr.signaled || self.cfg.sq_sig_all;
        self.sq.push_back(Pending {
            wr,
            psn,
            packet: None,
            signaled,
            failure: None,
            held: true,
        });
    }

    /// Whether `wr` must wait before it starts: a fence with a READ or atomic unanswered
    /// before it (their data may be what it sends, their rights what it takes away), or a
    /// request before it that waits (nothing overtakes one).
    fn must_wait(&self, wr: &SendWr) -> bool {
        self.sq.iter().any(|p| p.held)
            || (wr.fence && self.sq.iter().any(|p| p.wr.wants_response()))
    }

    /// Queues a request that sends nothing to the peer (a local operation, or one that
    /// failed here with `failure`) behind those in the send queue, and completes what is at
    /// the head.
    fn queue_local(&mut self, wr: SendWr, failure: Option<Status>) {
        let signaled = wr.signaled || self.cfg.sq_sig_all;
        // No PSN: nothing goes to the peer.
        let psn = self.next_psn;
        self.sq.push_back(Pending {
            wr,
            psn,
            packet: None,
            signaled,
            failure,
            held: false,
        });
        self.complete_local_ops();
    }

    /// Whether a request that failed here waits in the send queue: nothing posted after it
    /// goes out (the QP fails when it reaches the head).
    fn halted(&self) -> bool {
        self.sq.back().is_some_and(|p| p.failure.is_some())
    }

    /// Completes the local operations at the head of the send queue: every request before
    /// them has completed. (So the head is always a request waiting for the peer.) A failed
    /// one completes with its status and fails the QP, flushing what follows it.
    fn complete_local_ops(&mut self) {
        while self
            .sq
            .front()
            .is_some_and(|h| h.packet.is_none() && !h.held)
        {
            let Some(h) = self.sq.pop_front() else {
                return;
            };
            match h.failure {
                Some(status) => {
                    self.complete_send(&h.wr, status, 0);
                    self.to_error();
                    return;
                }
                None => self.succeed(&h, 0),
            }
        }
    }

    /// [`RcQp::post_send`], but a WRITE (without immediate), READ or atomic that nothing of
    /// this queue pair is ahead of is done at once through `direct`, if it says yes (see
    /// [`crate::Direct`]'s module): it completes now, takes no PSN and sends no packet.
    /// Anything else, or a refusal, takes the packet path. `mem` is written for a READ's or
    /// an atomic's local result.
    ///
    /// # Errors
    /// As [`RcQp::post_send`].
    pub fn post_send_direct(
        &mut self,
        wr: SendWr,
        mrs: &mut MrTable,
        mem: &mut dyn Memory,
        direct: &mut dyn Direct,
    ) -> Result<(), PostError> {
        if !self.may_go_direct(&wr, mrs) {
            return self.post_send(wr, mrs, mem);
        }
        let signaled = wr.signaled || self.cfg.sq_sig_all;
        let len = match wr.op {
            SendOp::Write {
                remote_addr, rkey, ..
            } => {
                let done = match &wr.inline {
                    Some(d) => direct.write(rkey, remote_addr, d),
                    None => direct.write_gather(rkey, remote_addr, &wr.sges, mem),
                };
                if !done {
                    return self.post_send(wr, mrs, mem);
                }
                0
            }
            SendOp::Read { remote_addr, rkey } => {
                if !direct.read_scatter(rkey, remote_addr, &wr.sges, mem) {
                    return self.post_send(wr, mrs, mem);
                }
                wr.sge_len() as u32
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                let mut f = |w: u64| if w == compare { swap } else { w };
                let Some(old) = direct.atomic(rkey, remote_addr, &mut f) else {
                    return self.post_send(wr, mrs, mem);
                };
                scatter(&wr.sges, &old.to_le_bytes(), mem);
                // As rxe: the completion's length is the local memory's, not the word's.
                wr.sge_len() as u32
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                let mut f = |w: u64| w.wrapping_add(add);
                let Some(old) = direct.atomic(rkey, remote_addr, &mut f) else {
                    return self.post_send(wr, mrs, mem);
                };
                scatter(&wr.sges, &old.to_le_bytes(), mem);
                // As rxe: the completion's length is the local memory's, not the word's.
                wr.sge_len() as u32
            }
            _ => return self.post_send(wr, mrs, mem),
        };
        if signaled {
            self.complete_send(&wr, Status::Success, len);
        }
        Ok(())
    }

    /// Whether `wr` may be done directly: a one-sided request that [`RcQp::post_send`] would
    /// accept and send now, with its local checks passed, and nothing of this queue pair
    /// ahead of it (so the responder would execute it next).
    fn may_go_direct(&self, wr: &SendWr, mrs: &MrTable) -> bool {
        let (one_sided, writes_local) = match wr.op {
            SendOp::Write { imm: None, .. } => (true, false),
            SendOp::Read { .. } => (wr.inline.is_none(), true),
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => (
                wr.inline.is_none() && wr.sges.len() == 1 && wr.sges[0].len == 8,
                true,
            ),
            _ => (false, false),
        };
        // Not on UC: its requests complete as they leave, so an earlier one may still be on
        // its way (in the device's link) when nothing of the queue pair is left here.
        one_sided
            && !self.cfg.unreliable
            && !self.link_lost
            && self.state == QpState::Rts
            && self.sq.is_empty()
            && self.resend.is_none()
            && !self.out.iter().any(|p| p.kind.is_request())
            && wr
                .inline
                .as_ref()
                .map_or(true, |d| d.len() <= self.cfg.max_inline as usize)
            && (wr.inline.is_some()
                || wr
                    .sges
                    .iter()
                    .all(|s| mrs.check_local(self.cfg.pd, s, writes_local).is_ok()))
    }

    /// Requests the send queue still takes before [`PostError::Full`].
    pub fn send_room(&self) -> u32 {
        self.cfg
            .max_send_wr
            .saturating_sub(u32::try_from(self.sq.len()).unwrap_or(u32::MAX))
    }

    /// The queue pair this one is connected to (set at RTR).
    pub fn dest_qpn(&self) -> u32 {
        self.dest_qpn
    }

    /// The next packet to send to the peer: the last one queued, when it is a request with
    /// room for it, carries the acknowledgement held back ([`RcQp::set_hold_acks`]). Only the
    /// last: the acknowledgement is newer than every answer queued (any answer queued while
    /// it was held went after it), so it must not pass one (a test found an ACK that passed
    /// a READ's response fail the READ).
    pub fn poll_transmit(&mut self) -> Option<Packet> {
        let mut p = self.out.pop_front()?;
        if self.held_ack.is_some() && self.out.is_empty() && p.kind.may_carry_ack() {
            p.ack = self.held_ack.take().map(|(_, last)| last);
        }
        Some(p)
    }

    /// The next completion.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Whether it has completions or events to give ([`RcQp::poll_completion`],
    /// [`RcQp::poll_event`]): a device that serves many queue pairs asks before it asks
    /// for them.
    #[inline]
    pub fn has_output(&self) -> bool {
        !self.cq.is_empty() || !self.events.is_empty()
    }

    /// Whether it has packets to send ([`RcQp::poll_transmit`]).
    #[inline]
    pub fn has_packets(&self) -> bool {
        !self.out.is_empty()
    }

    /// When [`RcQp::handle_timeout`] is due (a retry after an RNR NAK or a dropped request).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.resend.map(|(_, at, _)| at)
    }

    /// Time passed: a retry that is due sends again every request from the refused one.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some((from, at, why)) = self.resend else {
            return;
        };
        if now < at {
            return;
        }
        self.resend = None;
        if why == Resend::Unanswered {
            // The transport timer ran out: once more, or, with no retry left, the end.
            if self.retry_left == 0 {
                self.fail_head(Status::RetryExcErr);
                return;
            }
            self.retry_left -= 1;
        }
        for p in self.sq.iter().filter(|p| not_after(from, p.psn)) {
            self.out.extend(p.packet.clone());
        }
    }

    /// A packet from the peer: a request to execute (its answer is queued), or an answer to
    /// one of ours (its request completes, in order). `srq`: the shared receive queue of a QP
    /// that uses one (`None` otherwise: its own queue is used). `now` is read only when a
    /// timer starts (an RNR NAK): a device pays for no clock on the common path.
    ///
    /// Returns [`Handled::Dropped`] for a request this QP dropped unexecuted (it is not in
    /// RTR or RTS): its device tells the requester ([`Nak::Dropped`]).
    pub fn handle_packet(
        &mut self,
        p: Packet,
        mrs: &mut MrTable,
        mem: &mut dyn Memory,
        srq: Option<&mut Srq>,
        now: impl FnOnce() -> Instant,
    ) -> Handled {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Error) {
            return match p.kind.is_request() && !self.cfg.unreliable {
                true => Handled::Dropped,
                false => Handled::Taken,
            };
        }
        if let Some(psn) = p.ack {
            // Carried by a request: the answer it stands for comes first, as an ACK packet
            // sent before the request would. One that failed this queue pair (it passed a
            // READ: the peer's bug) leaves the request unexecuted, as any request that finds
            // the queue pair in ERROR.
            if !self.cfg.unreliable {
                self.on_ack(psn);
                if self.state == QpState::Error {
                    return Handled::Dropped;
                }
            }
        }
        match p.kind {
            PacketKind::Ack
            | PacketKind::Nak(_)
            | PacketKind::ReadResponse
            | PacketKind::AtomicResponse { .. } => self.on_answer(p, mrs, mem, now),
            _ => {
                if p.psn != self.expected_psn {
                    if self.cfg.unreliable {
                        // UC has no retries, and soft0's pipes neither lose nor repeat: a
                        // PSN that is not the one expected follows a message lost (dropped
                        // before this QP was up) or a sender brought up again from another
                        // PSN. Take it, as rxe's UC takes any first packet of a message, or
                        // the connection is wedged for good.
                        self.expected_psn = p.psn;
                    } else {
                        // Not the request this QP expects: after an RNR NAK the requester
                        // sends again from the refused PSN, and what it had sent after it is
                        // dropped here (it comes again); a PSN that never fits (the peers
                        // disagree on it, or this QP now talks to another) is dropped each
                        // time. Either way the requester hears of it: only a notice naming
                        // its oldest request moves it, to its timeout and retries.
                        return Handled::Dropped;
                    }
                }
                let consumes = matches!(
                    p.kind,
                    PacketKind::Send { .. }
                        | PacketKind::SendInv { .. }
                        | PacketKind::Write { imm: Some(_), .. }
                );
                if consumes && self.refuse_recv > 0 {
                    self.refuse_recv -= 1;
                    self.on_request(p.psn, Answer::Rnr);
                    return Handled::Taken;
                }
                let before = self.cq.len();
                let mut responder = Responder {
                    cfg: &self.cfg,
                    own: &mut self.rq,
                    srq,
                    cq: &mut self.cq,
                };
                let answer = responder.execute(&p, mrs, mem);
                if p.solicited {
                    // The receive it consumed completes solicited (it wakes a CQ armed for
                    // solicited completions only).
                    self.cq
                        .iter_mut()
                        .skip(before)
                        .for_each(|c| c.solicited = true);
                }
                self.on_request(p.psn, answer);
            }
        }
        Handled::Taken
    }

    // ----- responder ---------------------------------------------------------------------

    fn on_request(&mut self, psn: u32, answer: Answer) {
        if self.cfg.unreliable {
            // UC answers nothing: what could not be executed (no receive, a bad key, a
            // receive too short) is dropped, and the next message is taken.
            self.expected_psn = self.expected_psn.wrapping_add(1);
            return;
        }
        match answer {
            Answer::Rnr => {
                let timer_us =
                    u32::try_from(self.cfg.min_rnr_timer.as_micros()).unwrap_or(u32::MAX);
                self.reply(
                    psn,
                    PacketKind::Nak(Nak::Rnr { timer_us }),
                    Payload::default(),
                );
                // The PSN stays expected: the request comes again.
            }
            Answer::Nak(n) => {
                self.reply(psn, PacketKind::Nak(n), Payload::default());
                // rxe moves the responder to ERROR on these (class A and C errors); the
                // answers queued before the NAK go, before it (`to_error`).
                self.to_error();
            }
            Answer::Reply(kind, payload) => {
                self.expected_psn = self.expected_psn.wrapping_add(1);
                self.reply(psn, kind, payload);
            }
        }
    }

    fn reply(&mut self, psn: u32, kind: PacketKind, payload: Payload) {
        if kind == PacketKind::Ack && self.hold_acks {
            // Held: it covers the requests from the first one held.
            let first = self.held_ack.map_or(psn, |(first, _)| first);
            self.held_ack = Some((first, psn));
            return;
        }
        // Any other answer goes after the acknowledgement held (answers keep their order).
        self.flush_ack();
        self.out.push_back(Packet {
            solicited: false,
            dest_qpn: self.dest_qpn,
            psn,
            kind,
            payload,
            ack: None,
        });
    }

    /// Holds back the acknowledgements of the requests it executes from now on (`hold`):
    /// its next request that has room carries the latest ([`Packet::ack`]), or
    /// [`RcQp::flush_ack`] sends it as an ACK packet. A ping-pong's answer then acknowledges
    /// the request it answers, with no packet of its own; a stream's receiver acknowledges a
    /// batch at once. Whoever holds them must flush them soon: the requester waits.
    pub fn set_hold_acks(&mut self, hold: bool) {
        self.hold_acks = hold;
        if !hold {
            self.flush_ack();
        }
    }

    /// How many executed requests the acknowledgement held back covers (0: none held).
    pub fn held_acks(&self) -> u32 {
        self.held_ack
            .map_or(0, |(first, last)| last.wrapping_sub(first).wrapping_add(1))
    }

    /// Queues the acknowledgement held back, if any, as an ACK packet; returns whether there
    /// was one.
    pub fn flush_ack(&mut self) -> bool {
        let Some((_, last)) = self.held_ack.take() else {
            return false;
        };
        self.out.push_back(Packet {
            solicited: false,
            dest_qpn: self.dest_qpn,
            psn: last,
            kind: PacketKind::Ack,
            payload: Payload::default(),
            ack: None,
        });
        true
    }

    /// Forgets the acknowledgement held back (the queue pair failed before it went); returns
    /// the first request it covered, which its requester still waits for.
    pub fn drop_held_ack(&mut self) -> Option<u32> {
        self.held_ack.take().map(|(first, _)| first)
    }

    // ----- requester ---------------------------------------------------------------------

    fn on_answer(
        &mut self,
        p: Packet,
        mrs: &mut MrTable,
        mem: &mut dyn Memory,
        now: impl FnOnce() -> Instant,
    ) {
        let Some(head) = self.sq.front() else {
            return;
        };
        // Answers come in order: the head is the oldest request not yet answered. An answer
        // of the wrong kind (the peer's bug or malice) fails the request, as rxe does: a READ
        // response scattered into a SEND's buffers would write memory the peer has no right to.
        match p.kind {
            PacketKind::Ack => self.on_ack(p.psn),
            PacketKind::ReadResponse | PacketKind::AtomicResponse { .. } => {
                if head.psn != p.psn {
                    return;
                }
                let fits = match (&head.wr.op, &p.kind) {
                    (SendOp::Read { .. }, PacketKind::ReadResponse) => {
                        p.payload.len() as u64 == head.wr.sge_len()
                    }
                    (
                        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. },
                        PacketKind::AtomicResponse { .. },
                    ) => true,
                    _ => false,
                };
                if !fits {
                    self.fail_head(Status::FatalErr);
                    return;
                }
                // The destination is checked again as the answer lands, as rxe looks its key
                // up then: a region deregistered since the post (its memory maybe freed) is
                // written by nobody.
                let pd = self.cfg.pd;
                if !head
                    .wr
                    .sges
                    .iter()
                    .all(|s| mrs.check_local(pd, s, true).is_ok())
                {
                    self.fail_head(Status::LocProtErr);
                    return;
                }
                let Some(h) = self.sq.pop_front() else {
                    return;
                };
                let len = match p.kind {
                    PacketKind::AtomicResponse { old } => {
                        scatter(&h.wr.sges, &old.to_le_bytes(), mem);
                        h.wr.sge_len() as u32
                    }
                    _ => {
                        scatter(&h.wr.sges, &p.payload, mem);
                        p.payload.len() as u32
                    }
                };
                self.succeed(&h, len);
                // The fences it held are passed (those behind no other READ or atomic).
                self.release_held(mrs, mem);
                self.complete_local_ops();
                self.rnr_left = self.cfg.rnr_retry;
                self.retry_left = self.cfg.retry_cnt;
            }
            PacketKind::Nak(Nak::Rnr { timer_us }) => {
                if head.psn != p.psn {
                    return;
                }
                if self.rnr_left == 0 {
                    self.fail_head(Status::RnrRetryExcErr);
                    return;
                }
                // 7 means for ever (rxe never counts it down either).
                if self.rnr_left != 7 {
                    self.rnr_left -= 1;
                }
                let at = now() + Duration::from_micros(u64::from(timer_us));
                self.resend_from(p.psn, at, Resend::Rnr);
            }
            PacketKind::Nak(Nak::Dropped) => {
                // Every request after the head was dropped too (each says so): the head's
                // notice alone counts, once per time it was sent.
                if head.psn != p.psn || self.resend.is_some() {
                    return;
                }
                // Timeout code 0: the transport timer never runs out (as on a NIC). Else it
                // runs out after `wait`, as rxe's would have for a request nobody answers:
                // then it is sent again, or fails with no retry left ((retry_cnt + 1) waits).
                let Some(wait) = self.cfg.ack_timeout else {
                    return;
                };
                self.resend_from(p.psn, now() + wait, Resend::Unanswered);
            }
            PacketKind::Nak(n) => {
                // A NAK acknowledges the SENDs and WRITEs before the request it refuses, as
                // an ACK of the PSN before it would (as rxe completes them).
                while self.sq.front().is_some_and(|h| {
                    h.psn != p.psn && not_after(h.psn, p.psn) && !h.wr.wants_response()
                }) {
                    if let Some(h) = self.sq.pop_front() {
                        self.succeed(&h, 0);
                    }
                    self.complete_local_ops();
                }
                if self.sq.front().map_or(true, |h| h.psn != p.psn) {
                    return;
                }
                let status = match n {
                    Nak::InvalidRequest => Status::RemInvReqErr,
                    Nak::RemoteAccess => Status::RemAccessErr,
                    _ => Status::RemOpErr,
                };
                self.fail_head(status);
            }
            _ => {}
        }
    }

    /// An acknowledgement of PSN `psn` (a packet, or carried by a request): completes SENDs
    /// and WRITEs up to it (READs and atomics before it were answered first, on the ordered
    /// pipe: an ACK past one is no answer of it).
    fn on_ack(&mut self, psn: u32) {
        if self.sq.is_empty() {
            return;
        }
        while self.sq.front().is_some_and(|h| not_after(h.psn, psn)) {
            if self.sq.front().is_some_and(|h| h.wr.wants_response()) {
                self.fail_head(Status::FatalErr);
                return;
            }
            if let Some(h) = self.sq.pop_front() {
                self.succeed(&h, 0);
            }
            self.complete_local_ops();
        }
        self.rnr_left = self.cfg.rnr_retry;
        self.retry_left = self.cfg.retry_cnt;
    }

    /// Sends every request from PSN `psn` again at `at` ([`RcQp::handle_timeout`]): those
    /// queued after it wait until then (answers to the peer's requests still go now).
    fn resend_from(&mut self, psn: u32, at: Instant, why: Resend) {
        self.out.retain(|q| !q.kind.is_request());
        self.resend = Some((psn, at, why));
    }

    /// The oldest request fails with `status`, and the QP with it (what follows is flushed).
    fn fail_head(&mut self, status: Status) {
        if let Some(h) = self.sq.pop_front() {
            self.complete_send(&h.wr, status, 0);
        }
        self.to_error();
    }

    fn succeed(&mut self, h: &Pending, len: u32) {
        if h.signaled {
            self.cq.push_back(Completion {
                wr_id: h.wr.wr_id,
                status: Status::Success,
                opcode: h.wr.wc_opcode(),
                byte_len: len,
                imm: None,
                invalidated_rkey: None,
                qp_num: self.cfg.qp_num,
                src_qp: 0,
                slid: 0,
                grh: false,
                solicited: false,
            });
        }
    }

    /// A send request that ended in `status` (an error or a flush: always completes).
    fn complete_send(&mut self, wr: &SendWr, status: Status, len: u32) {
        self.cq.push_back(Completion {
            wr_id: wr.wr_id,
            status,
            opcode: wr.wc_opcode(),
            byte_len: len,
            imm: None,
            invalidated_rkey: None,
            qp_num: self.cfg.qp_num,
            src_qp: 0,
            slid: 0,
            grh: false,
            // A send's completion is never solicited (rxe posts them so, errors too).
            solicited: false,
        });
    }

    fn complete_recv(
        &mut self,
        wr_id: u64,
        status: Status,
        opcode: WcOpcode,
        len: u32,
        imm: Option<u32>,
    ) {
        push_recv(
            &mut self.cq,
            self.cfg.qp_num,
            wr_id,
            status,
            opcode,
            len,
            imm,
        );
    }
}

/// The responder's view of a queue pair while it executes one request: its settings, where
/// its receives come from, and its completion queue.
struct Responder<'a> {
    cfg: &'a QpConfig,
    own: &'a mut VecDeque<RecvWr>,
    srq: Option<&'a mut Srq>,
    cq: &'a mut VecDeque<Completion>,
}

impl Responder<'_> {
    fn has_recv(&self) -> bool {
        match &self.srq {
            Some(srq) => !srq.is_empty(),
            None => !self.own.is_empty(),
        }
    }

    fn take_recv(&mut self) -> Option<RecvWr> {
        match &mut self.srq {
            Some(srq) => srq.take(),
            None => self.own.pop_front(),
        }
    }

    fn peek_recv(&self) -> Option<&RecvWr> {
        match &self.srq {
            Some(srq) => srq.front(),
            None => self.own.front(),
        }
    }

    fn complete_recv(
        &mut self,
        wr_id: u64,
        status: Status,
        opcode: WcOpcode,
        len: u32,
        imm: Option<u32>,
    ) {
        push_recv(self.cq, self.cfg.qp_num, wr_id, status, opcode, len, imm);
    }

    /// Whether a message this responder cannot execute (a bad key, a receive too short) is
    /// dropped leaving its receive posted: UC without an SRQ, as rxe (class E); RC and an
    /// SRQ's receives complete with the error. (soft0 consumed the receive on UC too: an
    /// outside reviewer's find.)
    fn drops_unconsumed(&self) -> bool {
        self.cfg.unreliable && !self.cfg.uses_srq
    }

    fn execute(&mut self, p: &Packet, mrs: &mut MrTable, mem: &mut dyn Memory) -> Answer {
        let (pd, qp_num) = (self.cfg.pd, self.cfg.qp_num);
        let remote =
            |rkey, addr, len, need| match mrs.check_remote(pd, qp_num, rkey, addr, len, need) {
                Ok(()) => Ok(()),
                Err(_) => Err(Answer::Nak(Nak::RemoteAccess)),
            };
        match p.kind {
            PacketKind::Send { imm } => self.land_send(&p.payload, imm, None, mrs, mem),
            PacketKind::SendInv { rkey } => self.land_send(&p.payload, None, Some(rkey), mrs, mem),
            PacketKind::Write { addr, rkey, imm } => {
                if !self.cfg.access.contains(Access::REMOTE_WRITE) {
                    return Answer::Nak(Nak::InvalidRequest);
                }
                if imm.is_some() && !self.has_recv() {
                    return Answer::Rnr;
                }
                // A zero-length WRITE checks no key (IBA C9-88).
                if !p.payload.is_empty() {
                    if let Err(a) = remote(rkey, addr, p.payload.len() as u64, Access::REMOTE_WRITE)
                    {
                        return self.fail_consuming(imm.is_some(), a);
                    }
                    mem.write(addr, &p.payload);
                }
                if imm.is_some() {
                    if let Some(r) = self.take_recv() {
                        self.complete_recv(
                            r.wr_id,
                            Status::Success,
                            WcOpcode::RecvRdmaWithImm,
                            p.payload.len() as u32,
                            imm,
                        );
                    }
                }
                Answer::Reply(PacketKind::Ack, Payload::default())
            }
            PacketKind::ReadRequest { addr, rkey, len } => {
                if !self.cfg.access.contains(Access::REMOTE_READ) {
                    return Answer::Nak(Nak::InvalidRequest);
                }
                // Checked before anything is allocated: the length is the peer's.
                if len > 0 {
                    if let Err(a) = remote(rkey, addr, u64::from(len), Access::REMOTE_READ) {
                        return a;
                    }
                }
                Answer::Reply(PacketKind::ReadResponse, read_payload(addr, len, mem))
            }
            PacketKind::CompareSwap { addr, rkey, .. }
            | PacketKind::FetchAdd { addr, rkey, .. } => {
                if !self.cfg.access.contains(Access::REMOTE_ATOMIC) || addr % 8 != 0 {
                    return Answer::Nak(Nak::InvalidRequest);
                }
                if let Err(a) = remote(rkey, addr, 8, Access::REMOTE_ATOMIC) {
                    return a;
                }
                let old = match p.kind {
                    PacketKind::CompareSwap { compare, swap, .. } => {
                        mem.atomic(addr, &mut |v| if v == compare { swap } else { v })
                    }
                    PacketKind::FetchAdd { add, .. } => {
                        mem.atomic(addr, &mut |v| v.wrapping_add(add))
                    }
                    _ => unreachable!("matched above"),
                };
                Answer::Reply(PacketKind::AtomicResponse { old }, Payload::default())
            }
            // Answers never reach here (`handle_packet` routes them).
            _ => Answer::Nak(Nak::InvalidRequest),
        }
    }

    /// A SEND takes the oldest receive; a SEND with invalidate then invalidates window `inv`,
    /// which must be bound to this QP.
    fn land_send(
        &mut self,
        data: &[u8],
        imm: Option<u32>,
        inv: Option<u32>,
        mrs: &mut MrTable,
        mem: &mut dyn Memory,
    ) -> Answer {
        let opcode = WcOpcode::Recv;
        let Some(r) = self.peek_recv() else {
            return Answer::Rnr;
        };
        let room: u64 = r.sges.iter().map(|s| u64::from(s.len)).sum();
        let pd = self.cfg.pd;
        let writable = r.sges.iter().all(|s| mrs.check_local(pd, s, true).is_ok());
        if (data.len() as u64) > room && self.drops_unconsumed() {
            return Answer::Nak(Nak::InvalidRequest);
        }
        let Some(r) = self.take_recv() else {
            return Answer::Rnr;
        };
        if (data.len() as u64) > room {
            // rxe: a NAK (invalid request), and the receive completes with its status.
            self.complete_recv(r.wr_id, Status::RemInvReqErr, opcode, 0, None);
            return Answer::Nak(Nak::InvalidRequest);
        }
        if !writable {
            // rxe: a malformed receive (its memory refuses the write), LOC_QP_OP_ERR.
            self.complete_recv(r.wr_id, Status::LocQpOpErr, opcode, 0, None);
            return Answer::Nak(Nak::RemoteOperation);
        }
        scatter(&r.sges, data, mem);
        if let Some(rkey) = inv {
            if !mrs.invalidate(pd, Some(self.cfg.qp_num), rkey) {
                // rxe completes the receive with this status and fails the QP but still
                // acknowledges the SEND; soft0 answers with a NAK, so the sender learns of it
                // (soft0 has no retransmission timer to end its next request otherwise).
                self.complete_recv(r.wr_id, Status::RemInvReqErr, opcode, 0, None);
                return Answer::Nak(Nak::InvalidRequest);
            }
        }
        self.complete_recv(r.wr_id, Status::Success, opcode, data.len() as u32, imm);
        if let Some(c) = self.cq.back_mut() {
            c.invalidated_rkey = inv;
        }
        Answer::Reply(PacketKind::Ack, Payload::default())
    }

    /// A refused WRITE with immediate still consumes (and fails) its receive.
    fn fail_consuming(&mut self, consumes: bool, a: Answer) -> Answer {
        if consumes && !self.drops_unconsumed() {
            if let Some(r) = self.take_recv() {
                self.complete_recv(
                    r.wr_id,
                    Status::RemAccessErr,
                    WcOpcode::RecvRdmaWithImm,
                    0,
                    None,
                );
            }
        }
        a
    }
}

/// What a receive posted on a QP's own queue becomes (the rule every transport shares).
pub(crate) enum RecvAdmission {
    /// Queued.
    Queue,
    /// Completed at once with `WR_FLUSH_ERR`: the QP is in ERROR.
    Flush,
}

/// Admits a receive to the own queue of a QP in `state` holding `queued` receives.
///
/// # Errors
/// [`PostError::State`] in RESET; [`PostError::Full`]; [`PostError::Invalid`] on a QP that
/// receives from an SRQ.
pub(crate) fn admit_recv(
    cfg: &QpConfig,
    state: QpState,
    queued: usize,
) -> Result<RecvAdmission, PostError> {
    if cfg.uses_srq {
        return Err(PostError::Invalid("the QP receives from an SRQ"));
    }
    match state {
        QpState::Reset => Err(PostError::State(state)),
        QpState::Error => Ok(RecvAdmission::Flush),
        _ if queued >= cfg.max_recv_wr as usize => Err(PostError::Full),
        _ => Ok(RecvAdmission::Queue),
    }
}

/// A receive's completion, onto `cq`.
fn push_recv(
    cq: &mut VecDeque<Completion>,
    qp_num: u32,
    wr_id: u64,
    status: Status,
    opcode: WcOpcode,
    len: u32,
    imm: Option<u32>,
) {
    cq.push_back(Completion {
        wr_id,
        status,
        opcode,
        byte_len: len,
        imm,
        invalidated_rkey: None,
        qp_num,
        src_qp: 0,
        slid: 0,
        grh: false,
        // Marked after a solicited request landed ([`RcQp::handle_packet`]); a failed
        // receive wakes a solicited-only arm, as rxe's do.
        solicited: status != Status::Success,
    });
}

/// What the responder answers a request with.
enum Answer {
    Reply(PacketKind, Payload),
    Nak(Nak),
    Rnr,
}

/// The packet of request `wr` (not a local operation), PSN `psn`, for queue pair `dest_qpn`:
/// a SEND's or WRITE's bytes gathered from `mem` now.
fn request_packet(wr: &SendWr, dest_qpn: u32, psn: u32, mem: &dyn Memory) -> Packet {
    let payload = match (&wr.inline, wr.moves_data()) {
        (Some(d), _) => d.clone(),
        (None, true) => gather_payload(&wr.sges, mem),
        (None, false) => Payload::default(),
    };
    let kind = match wr.op {
        SendOp::Send { imm } => PacketKind::Send { imm },
        SendOp::SendWithInv { rkey } => PacketKind::SendInv { rkey },
        SendOp::Write {
            remote_addr,
            rkey,
            imm,
        } => PacketKind::Write {
            addr: remote_addr,
            rkey,
            imm,
        },
        SendOp::Read { remote_addr, rkey } => PacketKind::ReadRequest {
            addr: remote_addr,
            rkey,
            len: u32::try_from(wr.sge_len()).unwrap_or(u32::MAX),
        },
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => PacketKind::CompareSwap {
            addr: remote_addr,
            rkey,
            compare,
            swap,
        },
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => PacketKind::FetchAdd {
            addr: remote_addr,
            rkey,
            add,
        },
        SendOp::BindMw(_) | SendOp::LocalInv { .. } => {
            unreachable!("local operations are done where they are posted")
        }
    };
    Packet {
        ack: None,
        // What consumes a receive at the peer carries the request's wish for an event.
        solicited: wr.solicited
            && matches!(
                kind,
                PacketKind::Send { .. }
                    | PacketKind::SendInv { .. }
                    | PacketKind::Write { imm: Some(_), .. }
            ),
        dest_qpn,
        psn,
        kind,
        payload,
    }
}

/// The bytes of `sges`, in order.
/// The bytes `sges` name, as a packet's payload: a short one gathered in place, with no
/// allocation (the acknowledged small messages of a latency test allocate nothing).
pub(crate) fn gather_payload(sges: &[Sge], mem: &dyn Memory) -> Payload {
    let total: usize = sges.iter().map(|s| s.len as usize).sum();
    if total > INLINE_PAYLOAD {
        let mut buf = mem.payload_buffer(total);
        let bytes = buf.bytes_mut();
        for s in sges {
            mem.read_append(s.addr, s.len as usize, bytes);
        }
        return buf.into();
    }
    Payload::from_fn(total, |bytes| {
        let mut at = 0;
        for s in sges {
            let n = s.len as usize;
            mem.read(s.addr, &mut bytes[at..at + n]);
            at += n;
        }
    })
}

/// The `len` bytes at `addr`, as a packet's payload (a READ's response): gathered as a
/// request's one SGE would be.
fn read_payload(addr: u64, len: u32, mem: &dyn Memory) -> Payload {
    // An empty READ names no memory (its address was not checked).
    if len == 0 {
        return Payload::default();
    }
    gather_payload(&[Sge { addr, len, lkey: 0 }], mem)
}

pub(crate) fn gather(sges: &[Sge], mem: &dyn Memory) -> Vec<u8> {
    let total: usize = sges.iter().map(|s| s.len as usize).sum();
    let mut v = Vec::with_capacity(total);
    for s in sges {
        mem.read_append(s.addr, s.len as usize, &mut v);
    }
    v
}

/// Spreads `data` over `sges`, in order (they hold at least `data.len()` bytes).
pub(crate) fn scatter(sges: &[Sge], data: &[u8], mem: &mut dyn Memory) {
    let mut at = 0;
    for s in sges {
        if at == data.len() {
            break;
        }
        let n = (s.len as usize).min(data.len() - at);
        mem.write(s.addr, &data[at..at + n]);
        at += n;
    }
}

/// Whether PSN `a` comes at or before `b` (PSNs wrap).
fn not_after(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) < 1 << 31
}
