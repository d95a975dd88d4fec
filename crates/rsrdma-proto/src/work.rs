//! The core's outputs: work to post and events for the application.

use crate::error::ProtoError;

/// The id of a send work request: its sequence number on this connection's send queue. A
/// signalled completion of `WrId(n)` also completes every earlier WR (RC order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WrId(pub u64);

/// One thing for the driver to post. Drain `poll_work` in order; post each batch's receives
/// before its sends (a send may announce the credit of a receive taken before it), except
/// sends that were queued already when a batch's receives were taken: those announce none of
/// them and may go first (`Conn::work_queued` tells which are queued). A `PostSend` from
/// `Conn::send_inline_now` was never queued: post it before taking anything queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Post receive slot `slot` (whole slot; the driver may use `slot` as the receive WR id).
    PostRecv {
        /// The receive slot.
        slot: u16,
    },
    /// Post one SEND of `len` bytes.
    PostSend {
        /// The WR id to post with; completions come back through `handle_send_completion`.
        wr_id: WrId,
        /// `Some(slot)`: the bytes are send slot `slot`'s first `len` bytes (with `lent`: its
        /// first `len - lent.len` bytes, the header). `None`: an inline send of
        /// `Conn::inline_frame(wr_id)` (no slot is used; post with IBV_SEND_INLINE).
        slot: Option<u16>,
        /// Bytes to send (header included).
        len: u32,
        /// Request a completion (IBV_SEND_SIGNALED).
        signaled: bool,
        /// `Some`: the frame's payload is not in the slot but in memory the driver lent
        /// ([`crate::Conn::send_msg_lent`]): post two SGEs, the slot's header bytes, then
        /// this range. Never inline.
        lent: Option<LentPayload>,
    },
    /// Post one RDMA READ (rendezvous) on the send queue, signalled, of `len` bytes from the
    /// peer's `remote_addr`/`rkey` into `local_addr`/`lkey` (the destination the driver gave
    /// to `Conn::start_read`). Its completion comes back through `handle_send_completion`.
    PostRead {
        /// The WR id to post with.
        wr_id: WrId,
        /// Destination address (registered with local write).
        local_addr: u64,
        /// Destination key.
        lkey: u32,
        /// Source address in the peer's memory (from its RTS).
        remote_addr: u64,
        /// The peer's remote key (from its RTS).
        rkey: u32,
        /// Bytes to read.
        len: u32,
    },
    /// Bind the driver's memory window for rendezvous message `msg`
    /// ([`crate::Conn::send_rendezvous_window`]) to the message's `len` bytes at `addr`,
    /// granting remote read only, under the new key `rkey` (IBV_WR_BIND_MW). Comes right
    /// before the message's RTS.
    BindWindow {
        /// The WR id to post with.
        wr_id: WrId,
        /// The message the window is for.
        msg: u64,
        /// Start of the message (in memory registered for window binding).
        addr: u64,
        /// The message's length.
        len: u32,
        /// The window's new key (the one the RTS names).
        rkey: u32,
        /// Request a completion (IBV_SEND_SIGNALED).
        signaled: bool,
    },
    /// Invalidate the window of rendezvous message `msg`, whose key is `rkey`
    /// (IBV_WR_LOCAL_INV), signalled: the peer's DONE came. The message is released when
    /// the completion covering it is reaped; the window may then be bound again.
    InvalidateWindow {
        /// The WR id to post with.
        wr_id: WrId,
        /// The message the window was bound for.
        msg: u64,
        /// The window's key.
        rkey: u32,
    },
}

/// A frame's payload in memory the driver lent for a message ([`crate::Conn::send_msg_lent`]):
/// the second SGE of its SEND. Plain numbers: the core never touches this memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LentPayload {
    /// Start address (the message's address plus the fragment's offset).
    pub addr: u64,
    /// The local key of the lent memory's registration.
    pub lkey: u32,
    /// Payload bytes (at least 1).
    pub len: u32,
}

/// What the application may want to hear about (coalesced: each kind is reported once per
/// change, drained by `poll_event` in the order Failed, PeerClosed, Readable, Writable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message (or EOF) became ready to read.
    Readable,
    /// `send_msg` would now accept a message after it reported [`crate::Step::Blocked`].
    Writable,
    /// The peer sent FIN: reads reach EOF after the data already sent.
    PeerClosed,
    /// The connection failed; every call now returns this error.
    Failed(ProtoError),
}

/// Counters for tests and diagnostics (cheap to read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Frames sent (each spent one peer credit).
    pub frames_sent: u64,
    /// Cumulative limit the peer granted: `peer_limit - frames_sent` is the spendable credit.
    pub peer_limit: u64,
    /// The peer's receive slots (the most credit it can grant at once).
    pub peer_slots: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Cumulative limit this side can grant (its slots plus every repost the driver took).
    pub grant: u64,
    /// The limit last announced to the peer.
    pub announced: u64,
    /// Receive slots held with unread data.
    pub held_slots: u64,
    /// Send WRs posted and not yet completed.
    pub sq_outstanding: u64,
    /// Free send slots.
    pub free_send_slots: u64,
    /// Bytes in the reassembly buffer.
    pub reassembly_bytes: u64,
    /// Bytes of the message being sent that are not in a slot yet (the core's copy).
    pub queued_send_bytes: u64,
    /// Messages accepted by `send_msg`.
    pub messages_sent: u64,
    /// Messages whose last fragment arrived.
    pub messages_received: u64,
    /// Rendezvous messages sent whose DONE has not arrived (their memory stays exposed).
    pub rendezvous_unreleased: u64,
    /// Payload bytes the core copied into send slots or inline staging (eager sends of the
    /// caller's bytes in DATA frames). Lent messages ([`crate::Conn::send_msg_lent`]) and the
    /// descriptors of rendezvous RTS frames add nothing.
    pub send_copied_bytes: u64,
    /// Lent messages whose memory the NIC may still read (not all fragments posted, or
    /// their last completion not reaped).
    pub lent_unreleased: u64,
}
