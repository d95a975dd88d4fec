//! The buffer a rendezvous READ lands in, held by the connection while the NIC may write it:
//! from the READ's start until its call takes the message, or, when the call gave up, until
//! the READ lands (the message then moves into the core, for the next read) or, when the peer
//! left after its FIN, until the READ's work request completed without landing (the peer's
//! memory went with it: the message is lost, and reads say so instead of waiting for it).
//!
//! One piece for the driver and for the host simulation of the operations (`op_sim`), so that
//! what the simulation checks (nothing wedges, nothing is lost) is this code's behaviour.

use rsrdma_proto::{Conn as Core, Fatal, SlotMemory};

/// A held READ destination (`H`: what keeps the buffer's allocation in flight).
#[derive(Debug)]
pub(crate) struct ReadHold<H> {
    hold: Option<H>,
    /// The READ's work request: once the send queue completed it (in order, so once any
    /// later request completed), the NIC no longer writes the buffer.
    wr: Option<u64>,
    /// The call reading into the buffer gave up: the message's length.
    orphaned: Option<usize>,
    /// A READ the peer's leaving stranded was given up: the head message cannot be read.
    stranded: bool,
}

impl<H> Default for ReadHold<H> {
    fn default() -> Self {
        ReadHold {
            hold: None,
            wr: None,
            orphaned: None,
            stranded: false,
        }
    }
}

impl<H> ReadHold<H> {
    /// A READ into the buffer `hold` keeps was started.
    pub(crate) fn hold(&mut self, hold: H) {
        *self = ReadHold {
            hold: Some(hold),
            ..ReadHold::default()
        };
    }

    /// The READ's message was taken by its call: the buffer is free.
    pub(crate) fn end(&mut self) {
        self.hold = None;
        self.wr = None;
        self.orphaned = None;
    }

    /// Whether a buffer is held.
    pub(crate) fn is_held(&self) -> bool {
        self.hold.is_some()
    }

    /// A READ was posted as `wr_id` (the held buffer's, when one is held: the core reads one
    /// message at a time).
    pub(crate) fn posted(&mut self, wr_id: u64) {
        if self.hold.is_some() {
            self.wr = Some(wr_id);
        }
    }

    /// The call reading into the held buffer gave up with the READ in flight.
    pub(crate) fn orphan(&mut self, len: usize) {
        if self.hold.is_some() {
            self.orphaned = Some(len);
        }
    }

    /// Whether the head message can no longer be read: its READ was stranded by the peer's
    /// leaving.
    pub(crate) fn stranded(&self) -> bool {
        self.stranded
    }

    /// After completions were reaped (`sends_done`: one past the last send-queue request
    /// completed, failed ones included): a READ whose call gave up and that landed becomes
    /// the core's head message (`landed` copies it out of the buffer) and frees the buffer; a
    /// READ that completed without landing once the peer left after its FIN frees the buffer
    /// and marks the message lost. Returns whether anything changed.
    pub(crate) fn settle<M: SlotMemory>(
        &mut self,
        core: &mut Core<M>,
        peer_gone: bool,
        sends_done: u64,
        landed: impl FnOnce(&H, usize) -> Vec<u8>,
    ) -> bool {
        let Some(hold) = self.hold.as_ref() else {
            return false;
        };
        if core.read_landed() {
            // A call still running takes the message itself.
            let Some(len) = self.orphaned else {
                return false;
            };
            let msg = landed(hold, len);
            self.end();
            if !core.take_read_into_core(msg) {
                tracing::error!("rsrdma-net conn: a landed read did not match its message");
                core.handle_fatal(Fatal::QpError);
            }
            return true;
        }
        if peer_gone && self.wr.map_or(true, |wr| sends_done > wr) {
            // The peer's failed completions are its teardown (it left after its FIN): the
            // READ failed, so the NIC is done with the buffer. Nothing is posted once the
            // peer left, so a READ (or the next piece of one) not posted by then never will
            // be: with none in flight, the buffer is free.
            self.end();
            self.stranded = true;
            return true;
        }
        false
    }
}
