//! rsrdma-proto: the protocol core of `Conn`, the net-style RDMA connection, with no I/O.
//!
//! The core is a state machine in the quinn-proto mould: it takes completions, timer ticks and
//! application calls, and returns work to post as plain data. It has no dependency on rsrdma
//! or rsrdma-sys (so it cannot name a verbs type or do I/O), no clock (every time-dependent
//! call takes `now`), no threads, and no allocation per frame (only reassembly and the copy
//! of a message's unsent rest allocate, and both buffers are reused). The wire format is in
//! `docs/conn-protocol.md`.
//!
//! # Shape
//!
//! - Inputs: [`Conn::handle_send_completion`], [`Conn::handle_recv_completion`],
//!   [`Conn::handle_timeout`], [`Conn::handle_fatal`], [`Conn::handle_flushed`]; application
//!   calls [`Conn::send_msg`], [`Conn::recv_msg_into`], [`Conn::recv_msg`], [`Conn::read`],
//!   [`Conn::shutdown_write`], [`Conn::close`].
//! - Outputs, drained after every input in this order: [`Conn::poll_work`] (post them, the
//!   receives of a batch before its sends, except sends queued before the batch's receives
//!   were taken; [`Conn::reposts_may_wait`] says when queued reposts may wait for a later
//!   round), [`Conn::poll_timeout`], [`Conn::poll_event`]. One output skips the queue:
//!   [`Conn::send_inline_now`] returns a small message's one inline frame for the driver to
//!   post at once, which the core allows only while nothing but reposts is queued. One input
//!   skips the read queue: [`Conn::handle_recv_completion_into`] hands a whole message that
//!   would be the next one read straight to a waiting reader's buffer (the property test
//!   takes completions both ways at random).
//! - Memory: the driver owns and registers the slots and lends them through [`SlotMemory`].
//!
//! # Design decisions, and why
//!
//! - **SEND/RECV into fixed-size receive slots over RC**, not a byte ring written with
//!   WRITE_WITH_IMM (rsockets). Slots work with a shared receive queue later (a Listener whose
//!   connections share one SRQ and one pool: a per-peer byte ring cannot), need no remotely
//!   writable memory for eager data, and keep message boundaries for free. Every frame is a
//!   16-byte header plus payload in one slot. Default: 32 receive and 32 send slots of
//!   32 KiB + 16 B (32 KiB of payload), 2 MiB + 1 KiB per connection (gordma used about
//!   16 MiB).
//! - **Negotiated, not assumed.** Each side announces versioned [`Params`]; [`settle`] gives
//!   both the same agreement: frames never exceed either side's slot, credits start at the
//!   peer's slot count, the message cap is the smaller one, features the intersection. A
//!   mismatch cannot surface later as a LOCAL_LENGTH error (gordma's failure).
//! - **Credits, one per peer receive slot, never an RNR.** Cumulative limits ride in every
//!   header. [`CONTROL_RESERVE`] (3) credits are kept from data so CREDIT, FIN, PING/PONG and
//!   ABORT never wait behind data, and a control frame may take the last credit only if it
//!   returns credit: both sides can never sit at zero credit with nothing in flight. A
//!   credit-only frame goes when a quarter of the ring is unannounced or the peer is down to
//!   one credit, and always returns at least 2, so credit frames cannot ping-pong forever.
//!   Three reserved slots are what makes "the peer is down to one credit" imply "we hold at
//!   least two unannounced credits" (see the docs for the argument). A receive's credit
//!   counts once the driver takes its `PostRecv`: no frame announces a receive before it
//!   is posted, whatever order the driver posts a round in.
//! - **Credit returns as fast as the reader reads.** A one-fragment message waits in its slot
//!   until read; a reader that stops reading stops the sender, whose `send_msg` then says
//!   [`Step::Blocked`]. Messages larger than a slot are reassembled as they arrive (the slots go
//!   back at once), one reassembled message at a time.
//! - **Lent memory for blocking callers.** [`Conn::send_msg_borrowed`] sends from the
//!   caller's slice as credits allow, never copying the rest, and [`Conn::recv_msg_direct`]
//!   copies fragments from their slots straight into the caller's buffer: a caller that waits
//!   in the call (the caller's memory stays borrowed anyway) needs no core buffer beyond the
//!   slots for a message of any size. Giving up hands the transfer back to the core
//!   ([`Conn::send_unborrow`], [`Conn::recv_direct_abort`]) without breaking the message.
//! - **Lent messages, no copy at all.** [`Conn::send_msg_lent`] takes a message in registered
//!   memory the driver owns (address and lkey, plain numbers): each fragment is one SEND of
//!   two SGEs, its 16-byte header from a send slot and its payload straight from that memory
//!   ([`Work::PostSend`]'s `lent`), so the wire is the same as a copied message's. The last
//!   fragment is always signalled, and [`Conn::lent_released`] tells the driver when the NIC
//!   is done with the memory (after a failure: only after the flush). Fragments, credits
//!   and message order are `send_msg`'s; [`Counters::send_copied_bytes`] shows the copies.
//! - **Selective signalling.** Every k-th WR (k ≤ SQ depth / 2), any WR after which fewer than
//!   k SQ entries or send slots are free, and FIN and ABORT are signalled; a completion frees
//!   every earlier WR's slot. Frames up to the inline size go inline and use no slot.
//! - **Control flow is not an error.** A call that cannot make progress now gives
//!   [`Step::Blocked`] or [`Recv::Blocked`], a read that meets a rendezvous message
//!   [`Recv::NeedsRead`], and the end of the stream is [`Recv::Eof`]: values beside the
//!   call's result, so [`ProtoError`] holds only failures and a driver's `?` passes on
//!   nothing it should have handled.
//! - **Sticky errors** (rustls): a bad frame, a credit overrun, an oversize fragment, a message
//!   over the cap or data after FIN fails the connection and queues one ABORT if a credit
//!   allows; after that the core posts nothing else.
//! - **Liveness**: PING after an idle interval, `PeerDead` after a silent timeout (5 s).
//! - **Rendezvous** (feature [`FEATURE_RENDEZVOUS`], negotiated with a threshold): the
//!   driver registers a large message's memory for remote read and calls
//!   [`Conn::send_rendezvous`]; the core sends an RTS frame (address, key, length) in the
//!   message sequence, so rendezvous and eager messages keep one order. The receiver's read
//!   calls answer [`Recv::NeedsRead`] for such a message; its driver registers the
//!   destination and calls [`Conn::start_read`], which yields [`Work::PostRead`] (an RDMA
//!   READ on the send queue, always signalled); when it completes the core sends DONE and
//!   the driver takes the message ([`Conn::take_read`]). The sender releases the memory once
//!   [`Conn::rendezvous_released`] says so. The RTS holds its receive slot until the read
//!   completes, so rendezvous messages are flow-controlled like eager ones. With
//!   [`Conn::send_rendezvous_window`] the driver exposes the message through a type-2 memory
//!   window instead of a registration: the core queues [`Work::BindWindow`] right before the
//!   RTS and [`Work::InvalidateWindow`] when the DONE arrives, and releases the message only
//!   once that invalidation completed. The core never sees memory beyond its slots: addresses
//!   and keys are plain numbers.
//! - **Withdrawal** (feature [`FEATURE_WITHDRAW`], with rendezvous): a sender whose call gives
//!   up after the RTS went out asks for the message back ([`Conn::ask_withdraw`], a WITHDRAW
//!   frame); the receiver's core drops it if no read of it began and answers WITHDRAWN, or
//!   else lets the read finish (DONE). The message is released either way, and
//!   [`Conn::take_withdrawn`] tells the driver which: "not sent" or "read whole".

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod conn;
mod credit;
pub mod error;
pub mod frame;
pub mod memory;
pub mod params;
pub mod rails;
mod seq;
mod sq;
pub mod step;
mod timer;
pub mod work;

pub use conn::Conn;
pub use error::{Fatal, ProtoError};
pub use frame::{FrameType, Header, HEADER_LEN};
pub use memory::{SlotMemory, VecSlots};
pub use params::{
    settle, Config, Params, Settled, CONTROL_RESERVE, DEFAULT_MAX_READ, DEFAULT_RDV_THRESHOLD,
    DEFAULT_SLOT_SIZE, FEATURE_RAILS, FEATURE_RENDEZVOUS, FEATURE_SHARED_POOL, FEATURE_WITHDRAW,
    PARAMS_LEN,
};
pub use step::{Recv, Step};
pub use work::{Counters, Event, LentPayload, Work, WrId};
