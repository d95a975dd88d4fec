//! The driver: owns the queue pair, its one completion queue, the slot memory (inside the
//! protocol core) and the liveness signal of the establishment path, and turns completions
//! into core inputs and core work into posts.
//!
//! One step is [`Driver::progress`] (poll the CQ, up to 32 completions a call, feed each to
//! the core, fire due timers), the caller's operation, then [`Driver::post_work`]: everything
//! the core queued goes out as one batch post of receives and one of sends. A receive's
//! credit counts only from when the driver takes its `PostRecv` (`Conn::poll_work`), so no
//! frame announces a receive before the driver posts it; receives go first in a batch,
//! because a CREDIT frame built once they were taken may be in it. What a small message's
//! round trip queues is posted directly instead ([`Driver::post_work`]): a receive loop's
//! repost waits for the next send (`Conn::reposts_may_wait`), which was built before the
//! repost was taken and so goes first, the repost after its doorbell, off the round trip's
//! path. A blocking send of one inline frame skips the core's queue altogether
//! ([`Driver::send_inline_now`]): the core builds the frame, the driver posts it at once,
//! then whatever was queued. No allocation and no formatting on this path.
//!
//! # Failures, and a peer that leaves after its FIN
//! A failed completion, a post error, a DISCONNECTED event or a closed TCP channel *before*
//! the peer's FIN is fatal (the core makes it sticky). The same signals *after* the peer's
//! FIN are the peer's normal teardown: everything it sent already sits in our slots (its FIN
//! completed, so every earlier frame was delivered), so reads go on to EOF and only sends
//! fail ([`Driver::peer_gone`]). A transport that ends without a FIN moves the QP to ERROR
//! and posts a marker send: what landed (the FIN, if the peer sent one) completes before the
//! flush, so the first flushed completion, not a clock, says the FIN never came
//! ([`Driver::check_end`]; only a QP that cannot be moved to ERROR gives the FIN a short
//! grace, [`END_GRACE`]).
//!
//! # Rendezvous memory
//! A rendezvous send from a [`super::Buffer`] leaves the buffer's allocation with the driver
//! ([`Driver::hold_send`]), with what exposes it: a memory window of the driver's (where the
//! device has type-2 windows; the core binds it before the RTS and invalidates it after the
//! DONE, see [`rsrdma_proto::Conn::send_rendezvous_window`]) or a per-message registration
//! (remote read only). Each step releases those whose DONE arrived (and whose window's
//! invalidation completed); a released window goes back to the driver's free windows, so a
//! stream of messages allocates none after the first few. An eager send from a `Buffer` is lent to the
//! core (no copy: each fragment's SEND names the buffer's range as its second SGE) and leaves
//! the allocation here ([`Driver::hold_send`]) until the completion covering its last
//! fragment is reaped (the core signals that fragment). A READ into a `Buffer` leaves the buffer's
//! allocation here until the core hands the message over. Teardown releases what is left
//! only after the QP's flush (or leaks it with the rest).
//!
//! # Teardown
//! [`Driver::teardown`] moves the QP to ERROR (rdma_cm: disconnects), then reaps completions
//! until every posted receive and send is accounted for; only then are the QP, CQ and
//! memory released. If the flush cannot be confirmed in time, the memory is leaked (with a
//! `tracing::error`) rather than freed while the NIC might still touch it.

mod liveness;
mod post;
mod progress;
mod rdv_memory;
mod teardown;

pub(crate) use teardown::drain_pool_completions;

use super::buffer::InFlight;
use super::device_events::{DeviceFacts, LOOK_EVERY};
use super::read_hold::ReadHold;
use super::sides::Owners;
use super::slots::{Repost, Slots};
use super::wr_id::{recv_wr_id, RECV_TAG};
use crate::error::{from_core, NetError, Result};
use crate::handshake::Channel;
use post::Staging;
use rdv_memory::{rdv_entry, rdv_index, OwnedRead, RdvSend};
use rsrdma::cm::{CmEventType, CmId};
use rsrdma::{AccessFlags, Cq, Mr, Mw, Pd, Qp, RecvWr, SendWr, Sge, Wc};
use rsrdma_proto::{Conn as Core, Fatal, Step, Work, WrId};
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

// Work-request ids are decoded in one place (`wr_id` module): receives carry `RECV_TAG` and
// their slot, sends the core's sequence numbers.
//
// Concerns, a file each: `post` (the core's work to the QP), `progress` (completions and
// timers to the core), `rdv_memory` (memory the NIC may touch for rendezvous), `liveness`
// (the transport's end), `teardown` (flush, then release).

/// How long a transport that ended without the peer's FIN waits for that FIN to surface,
/// where the QP's flush cannot tell (the QP could not be moved to ERROR).
const END_GRACE: Duration = Duration::from_millis(200);
/// How long a transport that ended without the peer's FIN waits for the QP's flush
/// ([`Driver::flushing_after_end`]): it comes at once from any working device; only a
/// device that never completes anything again waits this long.
const END_FLUSH_LIMIT: Duration = Duration::from_secs(10);
/// Completions per poll call.
const POLL_BATCH: usize = 32;
/// How long a pooled connection's teardown waits for its CQ to stay empty after the flush.
const POOL_QUIET: Duration = Duration::from_millis(10);
/// Work requests per batch post (receives and sends each).
const POST_BATCH: usize = 32;

/// What tells us the peer is gone besides the data path.
pub(crate) enum Liveness {
    /// The rdma_cm id: DISCONNECTED or DEVICE_REMOVAL end the transport.
    Cm(CmId),
    /// The TCP channel of the handshake: end of stream, a close notice or an abort.
    Tcp(Box<Channel>),
}

/// The data path of one connection. Lives behind the connection's mutex.
pub(crate) struct Driver {
    /// First field, so it drops first when a driver is dropped without [`Driver::teardown`]
    /// (a failed start): a destroyed QP no longer names the memory below.
    qp: Qp,
    core: Core<Slots>,
    cq: Cq,
    liveness: Liveness,
    wcs: [Wc; POLL_BATCH],
    stage: Staging,
    recvs_posted: u64,
    sends_posted: u64,
    sends_done: u64,
    /// The transport ended (liveness signal), at this time; see [`END_GRACE`].
    ended_at: Option<Instant>,
    /// The transport ended before the peer's FIN surfaced, and the QP was moved to ERROR:
    /// everything of the peer's that landed (its FIN, if it sent one) completes before the
    /// flush, so the first flushed completion ends the connection (see
    /// [`Driver::check_end`]).
    flushing_after_end: bool,
    /// The transport ended after the peer's FIN: reads go on, sends fail.
    peer_gone: bool,
    /// A post failed or the transport broke: post nothing more.
    broken: bool,
    /// What the device's event queue says (shared by its connections), and when this driver
    /// looks next.
    facts: std::sync::Arc<DeviceFacts>,
    /// A rail of a striped connection (the rails feature settled): its port, whose going
    /// down fails it at once ([`Driver::set_rail_port`]).
    rail_port: Option<u8>,
    next_look: Option<Instant>,
    /// Which calls own the send side and the direct receive.
    owners: Owners,
    /// Rendezvous sends waiting for the peer's DONE and lent sends waiting for their last
    /// completion, in message order.
    rdv_sends: VecDeque<RdvSend>,
    /// Unbound windows for the next rendezvous sends, `None` where the device has no type-2
    /// windows.
    free_windows: Option<Vec<Mw>>,
    /// The buffer a READ is landing in.
    read_hold: ReadHold<InFlight>,
    /// A rendezvous message being read into memory of the driver's own
    /// ([`Driver::start_owned_read`]): its registration, then the vector (drop order).
    owned_read: Option<OwnedRead>,
}

/// A reader's buffer offered to [`Driver::progress_taking`]: a whole message that arrives as
/// the next one to read may go from its receive completion straight into it, with no trip
/// through the core's read queue.
pub(crate) struct Take<'a> {
    buf: Option<&'a mut [u8]>,
    /// Whether the buffer may be filled now (no other call owns the receive side).
    pub(crate) open: bool,
    /// The length of the message taken into the buffer, once one was.
    pub(crate) got: Option<usize>,
    /// Whether the reader has looked at the connection's state once (its attempt ran).
    pub(crate) looked: bool,
}

impl<'a> Take<'a> {
    pub(crate) fn new(buf: Option<&'a mut [u8]>) -> Take<'a> {
        Take {
            buf,
            open: true,
            got: None,
            looked: false,
        }
    }

    /// Whether a buffer is offered at all.
    pub(crate) fn offered(&self) -> bool {
        self.buf.is_some()
    }

    /// The buffer, for a read of the caller's own (empty when none is offered).
    pub(crate) fn buf(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or_default()
    }

    /// The buffer while it may still take a message.
    fn wants(&mut self) -> Option<&mut [u8]> {
        if !self.open || self.got.is_some() {
            return None;
        }
        self.buf.as_deref_mut()
    }
}

impl Driver {
    /// Makes this connection a rail of a striped connection on port `port`: the port going
    /// down fails it at once, so that its stripes go on the other rails (a plain
    /// connection waits for its requests' retries instead, and survives a short flap).
    pub(crate) fn set_rail_port(&mut self, port: u8) {
        self.rail_port = Some(port);
    }

    /// Takes over an established connection. `recvs_posted` receives (slots
    /// `0..recvs_posted`) were posted before the peer could send; the core queued a
    /// `PostRecv` for each of them, which are dropped here.
    pub(crate) fn new(
        mut core: Core<Slots>,
        qp: Qp,
        cq: Cq,
        liveness: Liveness,
        recvs_posted: u16,
    ) -> Driver {
        for _ in 0..recvs_posted {
            let _already_posted = core.poll_work();
        }
        // A LAST_WQE_REACHED recorded for an earlier QP of this number is stale; one for this
        // QP may come at any time from now on (a disconnect, the peer's death, a QP error all
        // move it to ERROR before its teardown), and the teardown waits for it.
        if let Some(pool) = core.memory_mut().pool() {
            pool.events().forget(qp.qp_num());
        }
        let windows = qp.pd().context().attr().has_type2_windows();
        let facts = DeviceFacts::of(qp.pd().context());
        Driver {
            core,
            qp,
            cq,
            liveness,
            wcs: [Wc::default(); POLL_BATCH],
            stage: Staging::new(),
            recvs_posted: u64::from(recvs_posted),
            sends_posted: 0,
            sends_done: 0,
            ended_at: None,
            flushing_after_end: false,
            peer_gone: false,
            broken: false,
            facts,
            rail_port: None,
            next_look: None,
            owners: Owners::default(),
            free_windows: windows.then(Vec::new),
            rdv_sends: VecDeque::new(),
            read_hold: ReadHold::default(),
            owned_read: None,
        }
    }

    /// The protection domain of the queue pair.
    pub(crate) fn pd(&self) -> &Pd {
        self.qp.pd()
    }

    /// The protocol core.
    pub(crate) fn core(&mut self) -> &mut Core<Slots> {
        &mut self.core
    }

    /// The protocol core, read-only.
    pub(crate) fn core_ref(&self) -> &Core<Slots> {
        &self.core
    }

    /// Which calls own a side of the connection.
    pub(crate) fn owners(&mut self) -> &mut Owners {
        &mut self.owners
    }

    /// The queue pair.
    pub(crate) fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The peer left after its FIN: nothing can be sent any more.
    /// `Err(ConnFailed)` once the connection failed: the core keeps its fatal error, and
    /// every operation that waits asks here.
    pub(crate) fn check_failed(&self) -> Result<()> {
        match self.core.error() {
            Some(e) => Err(NetError::ConnFailed(e.clone())),
            None => Ok(()),
        }
    }

    pub(crate) fn peer_gone(&self) -> bool {
        self.peer_gone
    }
}
