//! A soft queue pair's core, of either kind the device offers: connected (`RcQp`, for RC and,
//! with `QpConfig::unreliable`, UC) or unreliable-datagram (`UdQp`). The device drives both through this one type;
//! what only one of them does (answers, timers, a peer's link; Q_Keys, datagrams) is asked
//! of the one that has it.

use rsrdma_soft::{Completion, PostError, QpConfig, QpEvent, QpState, RcQp, RecvWr, UdQp};
use std::time::Instant;

pub(super) enum QpCore {
    Rc(RcQp),
    Ud(UdQp),
}

impl QpCore {
    pub(super) fn state(&self) -> QpState {
        match self {
            QpCore::Rc(q) => q.state(),
            QpCore::Ud(q) => q.state(),
        }
    }

    pub(super) fn config(&self) -> &QpConfig {
        match self {
            QpCore::Rc(q) => q.config(),
            QpCore::Ud(q) => q.config(),
        }
    }

    pub(super) fn set_config(&mut self, f: impl FnOnce(&mut QpConfig)) {
        match self {
            QpCore::Rc(q) => q.set_config(f),
            QpCore::Ud(q) => q.set_config(f),
        }
    }

    pub(super) fn reset(&mut self) {
        match self {
            QpCore::Rc(q) => q.reset(),
            QpCore::Ud(q) => q.reset(),
        }
    }

    pub(super) fn move_to_init(&mut self) -> Result<(), PostError> {
        match self {
            QpCore::Rc(q) => q.to_init(),
            QpCore::Ud(q) => q.to_init(),
        }
    }

    /// INIT → RTR; a UD QP has no peer, so it ignores both.
    pub(super) fn move_to_rtr(&mut self, dest_qpn: u32, rq_psn: u32) -> Result<(), PostError> {
        match self {
            QpCore::Rc(q) => q.to_rtr(dest_qpn, rq_psn),
            QpCore::Ud(q) => q.to_rtr(),
        }
    }

    pub(super) fn move_to_rts(&mut self, sq_psn: u32) -> Result<(), PostError> {
        match self {
            QpCore::Rc(q) => q.to_rts(sq_psn),
            QpCore::Ud(q) => q.to_rts(),
        }
    }

    pub(super) fn move_to_error(&mut self) {
        match self {
            QpCore::Rc(q) => q.to_error(),
            QpCore::Ud(q) => q.to_error(),
        }
    }

    /// The link to its peer's device broke: only a connected QP has one.
    pub(super) fn handle_link_down(&mut self) {
        if let QpCore::Rc(q) = self {
            q.handle_link_down();
        }
    }

    pub(super) fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        match self {
            QpCore::Rc(q) => q.post_recv(wr),
            QpCore::Ud(q) => q.post_recv(wr),
        }
    }

    pub(super) fn poll_completion(&mut self) -> Option<Completion> {
        match self {
            QpCore::Rc(q) => q.poll_completion(),
            QpCore::Ud(q) => q.poll_completion(),
        }
    }

    /// Whether it has completions or events to give.
    pub(super) fn has_output(&self) -> bool {
        match self {
            QpCore::Rc(q) => q.has_output(),
            QpCore::Ud(q) => q.has_output(),
        }
    }

    pub(super) fn poll_event(&mut self) -> Option<QpEvent> {
        match self {
            QpCore::Rc(q) => q.poll_event(),
            QpCore::Ud(q) => q.poll_event(),
        }
    }

    /// When an RNR retry is due (UD never retries).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            QpCore::Rc(q) => q.poll_timeout(),
            QpCore::Ud(_) => None,
        }
    }

    pub(super) fn handle_timeout(&mut self, now: Instant) {
        if let QpCore::Rc(q) = self {
            q.handle_timeout(now);
        }
    }

    /// How many executed requests its held-back acknowledgement covers (0: none; UD never
    /// holds one).
    pub(super) fn held_acks(&self) -> u32 {
        match self {
            QpCore::Rc(q) => q.held_acks(),
            QpCore::Ud(_) => 0,
        }
    }

    /// Queues its held-back acknowledgement as an ACK packet; whether there was one.
    pub(super) fn flush_ack(&mut self) -> bool {
        match self {
            QpCore::Rc(q) => q.flush_ack(),
            QpCore::Ud(_) => false,
        }
    }
}
