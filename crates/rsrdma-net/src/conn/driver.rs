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
//! fail ([`Driver::peer_gone`]). A transport that ends without a FIN gets a short grace
//! ([`END_GRACE`]) for the FIN's completion to surface before it counts as fatal.
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

use super::buffer::InFlight;
use super::sides::Owners;
use super::slots::{Repost, Slots};
use super::wr_id::{recv_wr_id, RECV_TAG};
use crate::error::{from_core, NetError, Result};
use crate::handshake::Channel;
use rsrdma::cm::{CmEventType, CmId};
use rsrdma::{AccessFlags, Cq, Mr, Mw, Pd, Qp, RecvWr, SendWr, Sge, Wc};
use rsrdma_proto::{Conn as Core, Fatal, ProtoError, Work, WrId};
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

// Receive WR ids carry `RECV_TAG` (and which slot: `slots` module); send WR ids are the
// core's sequence numbers. The kind must be in the id: a failed completion has no opcode.

/// How long a transport that ended without the peer's FIN waits for that FIN to surface.
const END_GRACE: Duration = Duration::from_millis(200);
/// Completions per poll call.
const POLL_BATCH: usize = 32;
/// How long a pooled connection's teardown waits for its CQ to stay empty after the flush.
const POOL_QUIET: Duration = Duration::from_millis(10);
/// Work requests per batch post (receives and sends each).
const POST_BATCH: usize = 32;

/// How to post one send-queue request the core queued.
#[derive(Clone, Copy, Default)]
struct SendMeta {
    wr_id: u64,
    signaled: bool,
    inline: bool,
    /// Scatter-gather entries used (2 for a lent frame: header, then payload).
    sges: usize,
    op: SendOp,
}

/// What a staged send-queue request is.
#[derive(Clone, Copy, Default)]
enum SendOp {
    /// A SEND of the SGEs.
    #[default]
    Send,
    /// An RDMA READ from this remote address and key (rendezvous).
    Read { remote_addr: u64, rkey: u32 },
    /// A bind of message `msg`'s window (in `rdv_sends`) to `len` bytes at `addr`, key `rkey`.
    Bind {
        msg: u64,
        addr: u64,
        len: u32,
        rkey: u32,
    },
    /// A local invalidation of window key `rkey`.
    Invalidate { rkey: u32 },
}

/// What one posting round gathers before its two post calls. Kept in the driver and
/// overwritten in place: set up on the stack, its ~3 KiB were zeroed at every posting step
/// (about a tenth of a 64-byte round trip's instructions, measured with callgrind).
struct Staging {
    recvs: [Sge; POST_BATCH],
    recv_ids: [u64; POST_BATCH],
    sends: [[Sge; 2]; POST_BATCH],
    send_meta: [SendMeta; POST_BATCH],
}

impl Staging {
    fn new() -> Staging {
        Staging {
            recvs: [Sge::default(); POST_BATCH],
            recv_ids: [0; POST_BATCH],
            sends: [[Sge::default(); 2]; POST_BATCH],
            send_meta: [SendMeta::default(); POST_BATCH],
        }
    }
}

/// How many requests of a list of `n` a post call's result says were posted.
fn posted(r: &rsrdma::Result<()>, n: usize) -> usize {
    match r {
        Ok(()) => n,
        Err(rsrdma::Error::Post { index, .. }) => (*index).min(n),
        Err(_) => 0,
    }
}

/// What tells us the peer is gone besides the data path.
pub(crate) enum Liveness {
    /// The rdma_cm id: DISCONNECTED or DEVICE_REMOVAL end the transport.
    Cm(CmId),
    /// The TCP channel of the handshake: end of stream, a close notice or an abort.
    Tcp(Channel),
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
    /// The transport ended after the peer's FIN: reads go on, sends fail.
    peer_gone: bool,
    /// A post failed or the transport broke: post nothing more.
    broken: bool,
    /// Which calls own the send side and the direct receive.
    owners: Owners,
    /// Rendezvous sends waiting for the peer's DONE and lent sends waiting for their last
    /// completion, in message order.
    rdv_sends: VecDeque<RdvSend>,
    /// Unbound windows for the next rendezvous sends, `None` where the device has no type-2
    /// windows.
    free_windows: Option<Vec<Mw>>,
    /// The buffer a READ is landing in.
    read_hold: Option<InFlight>,
    /// A rendezvous message being read into memory of the driver's own
    /// ([`Driver::start_owned_read`]): its registration, then the vector (drop order).
    owned_read: Option<OwnedRead>,
}

/// A READ's destination that the driver owns: the message lands in the core as the head's
/// reassembled bytes, so any read call serves it, and no call holds memory the NIC writes.
struct OwnedRead {
    mr: Mr,
    vec: Vec<u8>,
}

/// What a rendezvous send keeps alive until its DONE (its window or registration, and its
/// buffer), or a lent send until its last completion (its buffer alone). Fields drop in order:
/// the window (deallocating it unbinds it) and the registration go before the allocation they
/// cover.
pub(crate) struct RdvSend {
    msg: u64,
    window: Option<Mw>,
    mr: Option<Mr>,
    /// The buffer (`None` for a caller's slice, whose call waits for the release).
    hold: Option<InFlight>,
}

impl RdvSend {
    /// The window and the registration it is bound to: the message's own (a caller's slice,
    /// registered for binding), else the buffer's.
    fn window_parts(&self) -> Option<(&Mw, &Mr)> {
        let mr = match (&self.mr, &self.hold) {
            (Some(mr), _) => mr,
            (None, Some(hold)) => hold.mr(),
            (None, None) => return None,
        };
        Some((self.window.as_ref()?, mr))
    }
}

/// Where message `msg`'s entry is (the newest are at the back).
fn rdv_index(rdv: &VecDeque<RdvSend>, msg: u64) -> Option<usize> {
    rdv.iter().rposition(|r| r.msg == msg)
}

/// Message `msg`'s entry.
fn rdv_entry(rdv: &VecDeque<RdvSend>, msg: u64) -> Option<&RdvSend> {
    rdv.get(rdv_index(rdv, msg)?)
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
    #[inline]
    fn wants(&mut self) -> Option<&mut [u8]> {
        if !self.open || self.got.is_some() {
            return None;
        }
        self.buf.as_deref_mut()
    }
}

impl Driver {
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
        let windows = qp.pd().context().attr().has_type2_windows();
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
            peer_gone: false,
            broken: false,
            owners: Owners::default(),
            free_windows: windows.then(Vec::new),
            rdv_sends: VecDeque::new(),
            read_hold: None,
            owned_read: None,
        }
    }

    /// Starts the rendezvous READ of the head message (`len` bytes, as `NeedsRead` said)
    /// into a vector of the driver's own, registered for local write only: a read call that
    /// needs the message then waits as for any message, and when the READ lands the step
    /// moves the vector into the core as the head message
    /// ([`rsrdma_proto::Conn::take_read_into_core`]; `recv_msg` then takes it without a
    /// copy). No call holds the destination, so a call that gives up (a timeout, a dropped
    /// future) strands nothing: the message stays the next one to read. `Ok(false)`: not now
    /// (another READ in flight, no SQ room, the head changed); the caller steps again.
    ///
    /// # Errors
    /// The registration's error; the core's (a failed connection).
    pub(crate) fn start_owned_read(&mut self, len: usize) -> Result<bool> {
        if self.owned_read.is_some() || self.core.pending_read() != Some(len) {
            return Ok(false);
        }
        let mut vec = vec![0u8; len];
        // SAFETY: the vector is kept with its registration in `owned_read` until the READ
        // landed (or, after a failure, until the teardown's flush, or leaked with the rest);
        // the registration always drops first; nothing reads or writes the vector meanwhile.
        let mr = unsafe {
            Mr::register(
                self.qp.pd(),
                vec.as_mut_ptr(),
                len,
                AccessFlags::LOCAL_WRITE,
            )
        }?;
        match self.core.start_read(mr.addr(), mr.lkey(), len) {
            Ok(()) => {
                self.owned_read = Some(OwnedRead { mr, vec });
                Ok(true)
            }
            Err(ProtoError::WouldBlock) => Ok(false),
            Err(e) => Err(from_core(e)),
        }
    }

    /// A READ into the driver's own vector that cannot land: the peer left after its FIN
    /// (its failed completions are its normal teardown then, not the connection's failure).
    pub(crate) fn owned_read_stranded(&self) -> bool {
        self.peer_gone && self.owned_read.is_some() && !self.core.read_landed()
    }

    /// A READ into the driver's own vector landed: the message becomes the core's head.
    fn land_owned_read(&mut self) -> bool {
        if self.owned_read.is_none() || !self.core.read_landed() {
            return false;
        }
        let Some(OwnedRead { mr, vec }) = self.owned_read.take() else {
            return false;
        };
        drop(mr);
        if !self.core.take_read_into_core(vec) {
            tracing::error!("rsrdma-net conn: a landed read did not match its message");
            self.core.handle_fatal(Fatal::QpError);
        }
        true
    }

    /// The protection domain of the queue pair.
    pub(crate) fn pd(&self) -> &Pd {
        self.qp.pd()
    }

    /// Keeps buffer-send `msg`'s buffer (and, for rendezvous, its window or per-message
    /// registration) until the core releases it: a rendezvous message at its DONE (and its
    /// window's invalidation), a lent one when the completion covering its last fragment is
    /// reaped (its SENDs read the buffer in place).
    pub(crate) fn hold_send(
        &mut self,
        msg: u64,
        window: Option<Mw>,
        mr: Option<Mr>,
        hold: Option<InFlight>,
    ) {
        self.rdv_sends.push_back(RdvSend {
            msg,
            window,
            mr,
            hold,
        });
    }

    /// An unbound window for a rendezvous send (a free one, else a new one); `Ok(None)` where
    /// the device has no type-2 windows (the send registers its message instead).
    ///
    /// # Errors
    /// The allocation's error.
    fn take_window(&mut self) -> rsrdma::Result<Option<Mw>> {
        let Some(free) = self.free_windows.as_mut() else {
            return Ok(None);
        };
        match free.pop() {
            Some(w) => Ok(Some(w)),
            None => Mw::alloc_type2(self.qp.pd()).map(Some),
        }
    }

    /// Queues a rendezvous message of `len` bytes at `addr` (memory registered for window
    /// binding) through one of the driver's windows, which the core binds right before the
    /// RTS. `Ok(Some((msg, window)))`: queued, and the window is the message's (the caller
    /// keeps it with [`Driver::hold_send`]); `Ok(None)`: the core would block, and the window
    /// went back to the free ones.
    ///
    /// # Errors
    /// The window's allocation; the core's refusal; [`NetError::InvalidArgument`] on a device
    /// without windows (callers register for binding only where it has them).
    pub(crate) fn queue_through_window(
        &mut self,
        op: &'static str,
        len: usize,
        addr: u64,
    ) -> Result<Option<(u64, Mw)>> {
        let Some(w) = self.take_window()? else {
            return Err(NetError::InvalidArgument(format!(
                "{op}: rendezvous through a window on a device without windows"
            )));
        };
        match self.core.send_rendezvous_window(len, addr, w.next_rkey()) {
            Ok(msg) => Ok(Some((msg, w))),
            Err(e) => {
                self.put_window(w);
                match e {
                    ProtoError::WouldBlock => Ok(None),
                    e => Err(from_core(e)),
                }
            }
        }
    }

    /// Gives back a window taken by [`Driver::take_window`] and never bound (or invalidated).
    pub(crate) fn put_window(&mut self, w: Mw) {
        if let Some(free) = self.free_windows.as_mut() {
            free.push(w);
        }
    }

    /// Whether rendezvous sends go through windows (the device has type-2 windows).
    pub(crate) fn has_windows(&self) -> bool {
        self.free_windows.is_some()
    }

    /// Drops what [`Driver::hold_send`] keeps for `msg` now (nothing if it is gone already):
    /// for a caller's slice, whose memory must be unregistered before the call returns. Its
    /// window goes back to the free ones when `unbound` (released by the core, or withdrawn
    /// before its bind), else it is deallocated (which unbinds it; the caller moved the QP to
    /// ERROR first).
    pub(crate) fn drop_send(&mut self, msg: u64, unbound: bool) {
        let Some(mut r) = rdv_index(&self.rdv_sends, msg).and_then(|at| self.rdv_sends.remove(at))
        else {
            return;
        };
        if let (true, Some(w)) = (unbound, r.window.take()) {
            self.put_window(w);
        }
    }

    /// Keeps the buffer a READ lands in until [`Driver::end_read`].
    pub(crate) fn hold_read(&mut self, hold: InFlight) {
        self.read_hold = Some(hold);
    }

    /// The READ's message was taken: its buffer is free.
    pub(crate) fn end_read(&mut self) {
        self.read_hold = None;
    }

    /// Releases rendezvous sends whose DONE arrived and lent sends whose last completion was
    /// reaped (never after a failure: those wait for the flush at teardown).
    fn release_rendezvous(&mut self) {
        if self.core.error().is_some() {
            return;
        }
        let mut i = 0;
        while let Some(r) = self.rdv_sends.get(i) {
            let released = if r.mr.is_some() || r.window.is_some() {
                self.core.rendezvous_released(r.msg)
            } else {
                self.core.lent_released(r.msg)
            };
            if !released {
                i += 1;
                continue;
            }
            let Some(mut r) = self.rdv_sends.remove(i) else {
                break;
            };
            // Invalidated (the core released it after that completion): reusable.
            if let Some(w) = r.window.take() {
                self.put_window(w);
            }
        }
    }

    /// Before the driver leaves the connection for its teardown (close): a caller's slice
    /// exposed through a window is registered here while its call waits for the DONE, and
    /// that call returns as soon as the driver is gone, before the teardown's flush. So the
    /// QP goes to ERROR first, under the lock: the NIC then serves no READ of that memory;
    /// then the slice's window is deallocated (which unbinds it) and its registration dropped,
    /// still under the lock (F9): once its call returns, nothing of the driver's refers to the
    /// caller's memory, however long the teardown's flush takes.
    pub(crate) fn cut_off_lent_slices(&mut self) {
        if self.rdv_sends.iter().any(|r| r.hold.is_none()) {
            self.abort_transfer();
            // Fields drop in order: the window before the registration it is bound to.
            self.rdv_sends.retain(|r| r.hold.is_some());
        }
    }

    /// Moves the QP to ERROR and fails the core: for a caller that must give up memory the
    /// NIC may still touch (it deregisters it next, which the NIC then can no longer reach).
    pub(crate) fn abort_transfer(&mut self) {
        if let Err(e) = self.qp.to_error() {
            tracing::debug!(error = %e, "moving the QP to ERROR failed");
        }
        self.broken = true;
        if self.core.error().is_none() {
            self.core.handle_fatal(Fatal::QpError);
        }
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
    pub(crate) fn peer_gone(&self) -> bool {
        self.peer_gone
    }

    /// One step: reaps completions, fires due timers, drains events; returns whether anything
    /// happened (a completion, a timer, a state change). It posts nothing: the caller runs its
    /// operation next and then [`Driver::post_work`] once, so that what both queued goes out
    /// in one batch.
    pub(crate) fn progress(&mut self, now: Instant) -> bool {
        self.progress_taking(now, &mut Take::new(None))
    }

    /// [`Driver::progress`], offering `take`'s buffer to the receive completions it reaps: the
    /// first whole message that would be the next one read goes straight into it
    /// ([`rsrdma_proto::Conn::handle_recv_completion_into`]), and `take.got` says its length.
    #[inline]
    pub(crate) fn progress_taking(&mut self, now: Instant, take: &mut Take<'_>) -> bool {
        let mut changed = self.poll_cq(now, take);
        if changed && !self.rdv_sends.is_empty() {
            self.release_rendezvous();
        }
        if changed && self.owned_read.is_some() {
            self.land_owned_read();
        }
        changed |= self.check_end(now);
        if !self.peer_gone {
            if let Some(t) = self.core.poll_timeout() {
                if now >= t {
                    self.core.handle_timeout(now);
                    changed = true;
                }
            }
        }
        if self.core.memory().faulted() && self.core.error().is_none() {
            tracing::error!("rsrdma-net conn: the core addressed memory outside its slots");
            self.core.handle_fatal(Fatal::QpError);
            changed = true;
        }
        while self.core.poll_event().is_some() {
            changed = true;
        }
        changed
    }

    /// Posts whatever the core queued; `true` when there was anything. What a small round
    /// trip queues goes directly ([`Driver::post_from`]), the rest as batches
    /// ([`Driver::post_queued`]).
    #[inline]
    pub(crate) fn post_work(&mut self) -> bool {
        // Most of a busy caller's polling queues nothing: then this is one empty pop, no call.
        let Some(first) = self.core.poll_work() else {
            return false;
        };
        self.post_from(first);
        true
    }

    /// Posts `first` and everything the core queued after it. What a small message's round
    /// trip queues (a receive's repost, an inline send, or the two) is built on the stack and
    /// posted directly, without the batch's staging and bookkeeping (measured with callgrind:
    /// about 300 instructions a round trip); anything else goes as batches.
    #[inline(never)]
    fn post_from(&mut self, first: Work) {
        let mut work = first;
        loop {
            let direct = !self.broken && !self.peer_gone && !self.core.memory().pooled();
            let posted = direct
                && match (work, self.core.work_queued()) {
                    (Work::PostRecv { slot }, 0) => self.post_recv_alone(slot),
                    (Work::PostSend { .. }, 0) => self.post_send_alone(work),
                    (Work::PostRecv { slot }, 1) => self.post_send_then_recv(slot),
                    _ => false,
                };
            if !posted {
                self.post_queued(work);
                return;
            }
            // Taking receives may have made a CREDIT frame due: it comes now, after them.
            match self.core.poll_work() {
                Some(next) => work = next,
                None => return,
            }
        }
    }

    /// Sends `msg` as one inline frame posted at once, then posts whatever the core had
    /// queued (a receive loop's reposts, off the round trip's path after the doorbell):
    /// the lean way of a small send ([`rsrdma_proto::Conn::send_inline_now`]; measured with
    /// callgrind in the VM). `false`: it cannot go that way, nothing done.
    pub(crate) fn send_inline_now(&mut self, msg: &[u8]) -> bool {
        if self.broken || self.peer_gone {
            return false;
        }
        let Some(work) = self.core.send_inline_now(msg) else {
            return false;
        };
        // Not an inline send, or no staging for it: a core bug; the connection fails.
        if !self.post_send_alone(work) {
            self.fail_posting();
        }
        self.post_work();
        true
    }

    /// Posts the repost of own receive slot `slot` alone; `false`: not done (no SGE for the
    /// slot: the batch path fails the connection).
    #[inline]
    fn post_recv_alone(&mut self, slot: u16) -> bool {
        let Some(sge) = self.core.memory().recv_sge(slot) else {
            return false;
        };
        let list = [sge];
        let wr = RecvWr::new(recv_wr_id(slot), &list);
        // SAFETY: as in `post_recvs`.
        let r = unsafe { self.qp.post_recv(&wr) };
        self.recvs_posted += posted(&r, 1) as u64;
        self.check_post(&r);
        true
    }

    /// Posts `work` alone when it is an inline send; `false`: not one, nothing done.
    #[inline]
    fn post_send_alone(&mut self, work: Work) -> bool {
        let Work::PostSend {
            wr_id,
            slot: None,
            len: _,
            signaled,
            lent: None,
        } = work
        else {
            return false;
        };
        let Some(frame) = self.core.inline_frame(wr_id) else {
            return false;
        };
        let list = [Sge::inline(frame)];
        let wr = SendWr::send(wr_id.0, &list).signaled(signaled).inline();
        // SAFETY: an inline send's bytes are copied during the call (see `post_sends`).
        let r = unsafe { self.qp.post_send(&wr) };
        if r.is_ok() {
            self.sends_posted = self.sends_posted.max(wr_id.0 + 1);
        }
        self.check_post(&r);
        true
    }

    /// The core queued an inline send after the repost of own receive slot `slot` (just
    /// taken): a receive loop's repost, left for its next send (`Conn::reposts_may_wait`).
    /// The send was queued before the receive was taken, so it does not announce that
    /// receive: it goes first, and the repost after its doorbell, off the round trip's path.
    /// `false`: not that pair, nothing done.
    fn post_send_then_recv(&mut self, slot: u16) -> bool {
        let Some(
            send @ Work::PostSend {
                slot: None,
                lent: None,
                ..
            },
        ) = self.core.peek_work()
        else {
            return false;
        };
        let _queued_before = self.core.poll_work();
        // Either failing is a core bug (no inline frame for an outstanding send, no SGE for a
        // slot the core holds): the connection fails, as in the batch.
        if !self.post_send_alone(send) || (!self.broken && !self.post_recv_alone(slot)) {
            self.fail_posting();
        }
        true
    }

    /// Whether this step may leave the core's queue for a later one: it holds only reposts of
    /// own receive slots whose credit the peer does not need soon
    /// ([`rsrdma_proto::Conn::reposts_may_wait`]); a shared pool's slots go back at once.
    #[inline]
    pub(crate) fn reposts_may_wait(&self) -> bool {
        self.core.work_queued() > 0
            && !self.broken
            && !self.peer_gone
            && !self.core.memory().pooled()
            && self.core.reposts_may_wait()
    }

    /// After a post: a failure breaks the connection (nothing more is posted).
    #[inline]
    fn check_post(&mut self, r: &rsrdma::Result<()>) {
        if r.is_err() {
            self.fail_posting();
        }
    }

    /// A post failed (or the core named something unpostable): the connection breaks once.
    fn fail_posting(&mut self) {
        if !self.broken {
            self.broken = true;
            if self.core.error().is_none() {
                self.core.handle_fatal(Fatal::QpError);
            }
        }
    }

    /// Posts `first` and everything the core queued after it as batches: its receives as one
    /// post and its sends as another (per [`POST_BATCH`] works), so a round costs one
    /// doorbell however many frames it built. Receives go first: a CREDIT frame built once
    /// they were taken (`Conn::poll_work`) may be in the same round and announce them.
    #[inline(never)]
    fn post_queued(&mut self, first: Work) {
        let mut next = Some(first);
        while next.is_some() {
            let st = &mut self.stage;
            let (mut nr, mut ns) = (0, 0);
            let mut bad = false;
            while nr < POST_BATCH && ns < POST_BATCH {
                let Some(work) = next.take().or_else(|| self.core.poll_work()) else {
                    break;
                };
                if self.broken || self.peer_gone || bad {
                    continue;
                }
                match work {
                    // A pooled slot goes back to the shared pool; an own slot is posted here.
                    Work::PostRecv { slot } => match self.core.memory_mut().release_recv(slot) {
                        Some(Repost::Own(sge)) => {
                            st.recvs[nr] = sge;
                            st.recv_ids[nr] = recv_wr_id(slot);
                            nr += 1;
                        }
                        Some(Repost::Pooled) => {}
                        None => bad = true,
                    },
                    Work::PostSend {
                        wr_id,
                        slot,
                        len,
                        signaled,
                        lent,
                    } => {
                        // An inline frame's bytes stay in the core's staging entry, untouched
                        // until the post below copies them (draining the queue does not write
                        // them). A lent frame: the header from the slot, the payload from the
                        // lent buffer (never inline).
                        let head = len.checked_sub(lent.map_or(0, |l| l.len));
                        let first = match (slot, head) {
                            (Some(s), Some(head)) => self.core.memory().send_sge(s, head),
                            (None, Some(_)) if lent.is_none() => {
                                self.core.inline_frame(wr_id).map(Sge::inline)
                            }
                            _ => None,
                        };
                        match first {
                            Some(sge) => {
                                st.sends[ns] = [sge, sge];
                                let mut m = SendMeta {
                                    wr_id: wr_id.0,
                                    signaled,
                                    inline: slot.is_none(),
                                    sges: 1,
                                    op: SendOp::Send,
                                };
                                if let Some(l) = lent {
                                    st.sends[ns][1] = Sge::new(l.addr, l.len, l.lkey);
                                    m.sges = 2;
                                }
                                st.send_meta[ns] = m;
                                ns += 1;
                            }
                            None => bad = true,
                        }
                    }
                    Work::PostRead {
                        wr_id,
                        local_addr,
                        lkey,
                        remote_addr,
                        rkey,
                        len,
                    } => {
                        let sge = Sge::new(local_addr, len, lkey);
                        st.sends[ns] = [sge, sge];
                        st.send_meta[ns] = SendMeta {
                            wr_id: wr_id.0,
                            signaled: true,
                            inline: false,
                            sges: 1,
                            op: SendOp::Read { remote_addr, rkey },
                        };
                        ns += 1;
                    }
                    Work::BindWindow {
                        wr_id,
                        msg,
                        addr,
                        len,
                        rkey,
                        signaled,
                    } => {
                        // The window lives in the message's entry until its release.
                        let bound = rdv_entry(&self.rdv_sends, msg).and_then(|r| r.window_parts());
                        if bound.is_none() {
                            bad = true;
                            continue;
                        }
                        st.send_meta[ns] = SendMeta {
                            wr_id: wr_id.0,
                            signaled,
                            inline: false,
                            sges: 0,
                            op: SendOp::Bind {
                                msg,
                                addr,
                                len,
                                rkey,
                            },
                        };
                        ns += 1;
                    }
                    Work::InvalidateWindow { wr_id, rkey, .. } => {
                        st.send_meta[ns] = SendMeta {
                            wr_id: wr_id.0,
                            signaled: true,
                            inline: false,
                            sges: 0,
                            op: SendOp::Invalidate { rkey },
                        };
                        ns += 1;
                    }
                }
            }
            if !(!bad && self.post_recvs(nr) && self.post_sends(ns)) {
                self.fail_posting();
            }
            next = self.core.poll_work();
        }
    }

    /// Posts the first `n` staged receives (one SGE each) in one call; false on a failure
    /// (what was posted before it is counted).
    fn post_recvs(&mut self, n: usize) -> bool {
        let (sges, ids) = (&self.stage.recvs, &self.stage.recv_ids);
        if n == 0 {
            return true;
        }
        let r = if n == 1 {
            let wr = RecvWr::new(ids[0], &sges[..1]);
            // SAFETY: the slot lies in our registered receive region, which outlives every
            // posted request (teardown reaps the flush before releasing it), and the core does
            // not read the slot until its completion.
            unsafe { self.qp.post_recv(&wr) }
        } else {
            let mut wrs = [const { MaybeUninit::<RecvWr<'_>>::uninit() }; POST_BATCH];
            for (i, w) in wrs.iter_mut().take(n).enumerate() {
                w.write(RecvWr::new(ids[i], &sges[i..=i]));
            }
            // SAFETY: the first `n` elements were written just above; `MaybeUninit<T>` has
            // `T`'s layout.
            let wrs = unsafe { std::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast(), n) };
            // SAFETY: as the single post above, for every slot of the list.
            unsafe { self.qp.post_recv_batch(wrs) }
        };
        self.recvs_posted += posted(&r, n) as u64;
        r.is_ok()
    }

    /// Posts the first `n` staged sends (and READs, window binds and invalidations) as their
    /// metadata says, in one call; false on a failure (what was posted before it is counted).
    fn post_sends(&mut self, n: usize) -> bool {
        let (sges, meta) = (&self.stage.sends, &self.stage.send_meta);
        let rdv = &self.rdv_sends;
        if n == 0 {
            return true;
        }
        let wr = |i: usize| {
            let m = meta[i];
            let list = &sges[i][..m.sges];
            Some(match m.op {
                SendOp::Read { remote_addr, rkey } => {
                    SendWr::rdma_read(m.wr_id, list, remote_addr, rkey).signaled(true)
                }
                SendOp::Send => {
                    let wr = SendWr::send(m.wr_id, list).signaled(m.signaled);
                    if m.inline {
                        wr.inline()
                    } else {
                        wr
                    }
                }
                SendOp::Bind {
                    msg,
                    addr,
                    len,
                    rkey,
                } => {
                    let (mw, mr) = rdv_entry(rdv, msg)?.window_parts()?;
                    let read_only = AccessFlags::REMOTE_READ;
                    SendWr::bind_mw(m.wr_id, mw, rkey, mr, addr, u64::from(len), read_only)
                        .signaled(m.signaled)
                }
                SendOp::Invalidate { rkey } => SendWr::local_inv(m.wr_id, rkey).signaled(true),
            })
        };
        let r = if n == 1 {
            let Some(one) = wr(0) else {
                return false;
            };
            // SAFETY: a slot send names our registered send region, which outlives the
            // request (see `post_recvs`), and the core does not rewrite a slot in flight; an
            // inline send's bytes are copied during the call. A lent payload is a range of a
            // `Buffer` (registered, on this QP's domain) whose allocation `hold_send` keeps
            // until the core says the completion covering this WR was reaped, or until
            // teardown's flush; the buffer is in flight meanwhile, so nothing writes it. A
            // READ's destination is registered (local write) by the caller of `start_read`,
            // which keeps it registered and alive until the core hands the message over, or
            // deregisters it only after moving the QP to ERROR (`abort_transfer`); a `Buffer`
            // destination is held in `read_hold` until then or until teardown's flush. A window
            // is bound over a range of a held buffer (remote read only, through this QP alone)
            // and invalidated before the core releases the buffer; after a failure, the flush
            // ends its use and the window is deallocated before the buffer goes.
            unsafe { self.qp.post_send(&one) }
        } else {
            let mut wrs = [const { MaybeUninit::<SendWr<'_>>::uninit() }; POST_BATCH];
            for (i, w) in wrs.iter_mut().take(n).enumerate() {
                // The staging checked every bind's window: a miss is a bug, and nothing of
                // this batch is posted.
                let Some(one) = wr(i) else {
                    return false;
                };
                w.write(one);
            }
            // SAFETY: the first `n` elements were written just above; `MaybeUninit<T>` has
            // `T`'s layout.
            let wrs = unsafe { std::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast(), n) };
            // SAFETY: as the single post above, for every request of the list.
            unsafe { self.qp.post_send_batch(wrs) }
        };
        let done = posted(&r, n);
        if let Some(last) = meta[..done].last() {
            self.sends_posted = self.sends_posted.max(last.wr_id + 1);
        }
        // A posted bind gave its window a new key: the next bind names it as the present one.
        for m in &meta[..done] {
            if let SendOp::Bind { msg, rkey, .. } = m.op {
                let entry =
                    rdv_index(&self.rdv_sends, msg).and_then(|at| self.rdv_sends.get_mut(at));
                if let Some(w) = entry.and_then(|r| r.window.as_mut()) {
                    w.set_rkey(rkey);
                }
            }
        }
        r.is_ok()
    }

    #[inline]
    fn poll_cq(&mut self, now: Instant, take: &mut Take<'_>) -> bool {
        let mut any = false;
        loop {
            let n = match self.cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(_) => {
                    self.broken = true;
                    if self.core.error().is_none() {
                        self.core.handle_fatal(Fatal::QpError);
                    }
                    return true;
                }
            };
            for i in 0..n {
                let wc = self.wcs[i];
                self.on_completion(&wc, now, take);
            }
            any |= n > 0;
            if n < POLL_BATCH {
                return any;
            }
        }
    }

    #[inline]
    fn on_completion(&mut self, wc: &Wc, now: Instant, take: &mut Take<'_>) {
        let id = wc.wr_id();
        let status = if wc.is_ok() {
            Ok(())
        } else {
            Err(wc.status().0)
        };
        let is_recv = id & RECV_TAG != 0;
        // Before anything may return early: a pool slot must be bound (or given back).
        let mut recv_slot = None;
        if is_recv {
            self.recvs_posted = self.recvs_posted.saturating_sub(1);
            recv_slot = self.core.memory_mut().take_recv(id);
        } else {
            self.sends_done = self.sends_done.max(id + 1);
        }
        if self.peer_gone || (status.is_err() && self.core.error().is_some()) {
            return;
        }
        if status.is_err() {
            self.broken = true;
            if self.core.peer_closed() {
                // The peer tore down after its FIN (see the module docs).
                self.peer_gone = true;
                return;
            }
        }
        if is_recv {
            match (recv_slot, take.wants()) {
                (Some(slot), Some(buf)) => {
                    take.got = self.core.handle_recv_completion_into(
                        slot,
                        wc.byte_len(),
                        status,
                        now,
                        buf,
                    );
                }
                (Some(slot), None) => {
                    self.core
                        .handle_recv_completion(slot, wc.byte_len(), status, now);
                }
                // No free slot: the peer sent beyond its credits.
                (None, _) => self.core.handle_fatal(Fatal::QpError),
            }
        } else {
            self.core.handle_send_completion(WrId(id), status);
        }
    }

    /// The fd that signals the transport's end, while it has not ended.
    pub(crate) fn liveness_fd(&self) -> Option<RawFd> {
        if self.ended_at.is_some() {
            return None;
        }
        Some(match &self.liveness {
            Liveness::Cm(id) => id.as_raw_fd(),
            Liveness::Tcp(ch) => ch.as_raw_fd(),
        })
    }

    /// Reads the liveness signal (never blocks); called when its fd is readable.
    pub(crate) fn check_liveness(&mut self, now: Instant) {
        if self.ended_at.is_some() {
            return;
        }
        let ended = match &mut self.liveness {
            Liveness::Cm(id) => {
                let mut ended = false;
                loop {
                    match id.try_next_event() {
                        Ok(Some(ev)) => {
                            ended |= matches!(
                                ev.kind,
                                CmEventType::DISCONNECTED | CmEventType::DEVICE_REMOVAL
                            );
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "rdma_cm event channel failed");
                            ended = true;
                            break;
                        }
                    }
                }
                ended
            }
            Liveness::Tcp(ch) => !matches!(ch.peer_open(), Ok(true)),
        };
        if ended {
            tracing::debug!("rsrdma-net conn: the transport ended");
            self.ended_at = Some(now);
        }
    }

    /// After the transport ended: the peer's FIN makes it a normal end, its absence (after
    /// the grace) a fatal one.
    #[inline]
    fn check_end(&mut self, now: Instant) -> bool {
        let Some(at) = self.ended_at else {
            return false;
        };
        if self.peer_gone || self.core.error().is_some() {
            return false;
        }
        if self.core.peer_closed() {
            self.peer_gone = true;
            return true;
        }
        if now >= at + END_GRACE {
            self.broken = true;
            self.core.handle_fatal(Fatal::Disconnected);
            return true;
        }
        false
    }

    /// When [`Driver::progress`] is next due without any completion.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let grace = match self.ended_at {
            Some(at) if !self.peer_gone && self.core.error().is_none() => Some(at + END_GRACE),
            _ => None,
        };
        let timer = if self.peer_gone {
            None
        } else {
            self.core.poll_timeout()
        };
        match (grace, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Asks for a completion event (the progress thread, before it sleeps).
    pub(crate) fn arm(&self) -> bool {
        self.cq.arm(false).is_ok()
    }

    fn outstanding(&self) -> u64 {
        self.recvs_posted + self.sends_posted.saturating_sub(self.sends_done)
    }

    /// Unsignaled sends that already executed leave the send queue without a completion, so
    /// after the last signaled one nothing would ever confirm them: a signaled empty send
    /// posted on the QP in ERROR is flushed after every earlier request, and its completion
    /// accounts for them all.
    fn post_flush_marker(&mut self) {
        if self.sends_posted <= self.sends_done {
            return;
        }
        let wr = SendWr::send(self.sends_posted, &[]).signaled(true);
        // SAFETY: an empty send names no memory.
        if unsafe { self.qp.post_send(&wr) }.is_ok() {
            self.sends_posted += 1;
        }
    }

    /// With a shared receive pool (F6): the receives this QP took from the SRQ are not
    /// counted in [`Driver::outstanding`] (they were never posted on the QP), and a completion
    /// left in the CQ when it is destroyed takes its pool slot with it: every peer SEND that
    /// landed after the last step (a close while the peer streams), and the receive a flush
    /// ends mid-message. So the CQ is drained until it stays empty for [`POOL_QUIET`] (the
    /// flush of the QP's SRQ receive comes after the move to ERROR, from the device), each
    /// pool slot going back to the pool. Reading the device's LAST_WQE_REACHED event would
    /// say exactly when the last one came; nothing reads asynchronous events yet.
    fn drain_pool_completions(&mut self, deadline: Instant) {
        let mut wcs = [Wc::default(); POLL_BATCH];
        let mut quiet_since = Instant::now();
        loop {
            match self.cq.poll(&mut wcs) {
                Ok(0) => {
                    let now = Instant::now();
                    if now >= deadline || now.duration_since(quiet_since) >= POOL_QUIET {
                        return;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(n) => {
                    for wc in &wcs[..n] {
                        if wc.wr_id() & RECV_TAG != 0 {
                            self.core.memory_mut().reaped_recv(wc.wr_id());
                        }
                    }
                    quiet_since = Instant::now();
                }
                Err(_) => return,
            }
        }
    }

    /// Stops the QP, reaps its flushed requests, and releases everything; leaks the memory
    /// if the flush cannot be confirmed by `deadline`.
    pub(crate) fn teardown(mut self, deadline: Instant) {
        if let Liveness::Cm(id) = &self.liveness {
            let _ = id.disconnect();
        }
        if let Err(e) = self.qp.to_error() {
            tracing::debug!(error = %e, "moving the QP to ERROR failed");
        }
        self.post_flush_marker();
        let mut wcs = [Wc::default(); POLL_BATCH];
        while self.outstanding() > 0 {
            match self.cq.poll(&mut wcs) {
                Ok(0) if Instant::now() >= deadline => break,
                Ok(0) => std::thread::sleep(Duration::from_micros(200)),
                Ok(n) => {
                    for wc in &wcs[..n] {
                        let id = wc.wr_id();
                        if id & RECV_TAG != 0 {
                            self.recvs_posted = self.recvs_posted.saturating_sub(1);
                            self.core.memory_mut().reaped_recv(id);
                        } else {
                            self.sends_done = self.sends_done.max(id + 1);
                        }
                    }
                }
                Err(_) => break,
            }
        }
        if self.outstanding() > 0 {
            tracing::error!(
                outstanding = self.outstanding(),
                "rsrdma-net conn: the QP's flush was not confirmed; leaking its memory rather \
                 than freeing what the NIC may still touch"
            );
            let Driver {
                core,
                qp,
                liveness,
                rdv_sends,
                read_hold,
                owned_read,
                ..
            } = self;
            drop(qp);
            drop(liveness);
            std::mem::forget(core);
            std::mem::forget(rdv_sends);
            std::mem::forget(read_hold);
            std::mem::forget(owned_read);
            return;
        }
        if self.core.memory_mut().pooled() {
            self.drain_pool_completions(deadline);
        }
        self.core.handle_fatal(Fatal::Disconnected);
        self.core.handle_flushed();
        // Windows go first: a bound type-2 window holds a reference to its QP, whose
        // destruction would wait for it (rxe: a timeout per window). The QP is flushed, so
        // no request reaches the memory through them any more. Then the QP (it names the
        // memory), then the memory and the CQ.
        let Driver {
            core,
            qp,
            cq,
            liveness,
            mut rdv_sends,
            free_windows,
            read_hold,
            owned_read,
            ..
        } = self;
        for r in rdv_sends.iter_mut() {
            drop(r.window.take());
        }
        drop(free_windows);
        drop(qp);
        // Flushed: the peer can no longer read what our RTSs exposed, nor a READ land.
        drop(rdv_sends);
        drop(read_hold);
        drop(owned_read);
        drop(core);
        drop(cq);
        drop(liveness);
    }
}
