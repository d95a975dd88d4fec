//! The semantics core of rsrdma's software RDMA device (`soft0`): what a reliable-connected
//! queue pair does, as a state machine with no I/O, modelled on Linux's soft-RoCE (rxe).
//!
//! # Why a core with no I/O
//! The device built around this core moves packets over shared-memory rings on one host and
//! over one TCP stream per queue pair between hosts, and plays the NIC from a progress
//! thread. Both pipes are reliable and ordered, so what is left of RDMA's transport is its
//! *semantics*: which work request completes when and with which status, which key reaches
//! which memory with which access, what an RNR NAK does, how an error flushes the queues.
//! Those rules live here once, tested on their own (as quinn-proto and rsrdma-proto are),
//! and the pipes and the memory stay outside:
//! - a [`RcQp`] takes work requests ([`RcQp::post_send`], [`RcQp::post_recv`]), packets from
//!   its peer ([`RcQp::handle_packet`]) and the time ([`RcQp::handle_timeout`]); it gives
//!   packets to send ([`RcQp::poll_transmit`]) and completions ([`RcQp::poll_completion`]);
//! - memory is reached through [`Memory`], after the keys and access rights were checked
//!   against the device's [`MrTable`]: the device implements it over the process's own
//!   registered memory, the tests over a vector;
//! - where the device reaches the responder's memory itself ([`Direct`]), a one-sided request
//!   with nothing ahead of it is done at once by the requester
//!   ([`RcQp::post_send_direct`]), after the responder's checks ([`ResponderQp::allows`]).
//!
//! # What it does (and where it differs from rxe)
//! SEND, SEND with immediate, RDMA WRITE (with immediate, which consumes a receive), RDMA
//! READ, compare-and-swap and fetch-and-add; inline data; selective signalling and
//! `sq_sig_all`; solicited events (a receive consumed by a request that asks for one
//! completes [`Completion::solicited`], as does a failed receive); completions in send-queue order, SENDs and WRITEs on their ACK, READs and
//! atomics on their response; RNR NAK with `rnr_retry` (7: retry for ever) and the peer's
//! `min_rnr_timer`; key, bounds and access checks with rxe's statuses (a bad remote key or
//! range: `REM_ACCESS_ERR`, and the responder's QP goes to ERROR; an access right missing on
//! the responder's QP, a misaligned atomic that arrives anyway or a receive buffer too
//! short: `REM_INV_REQ_ERR`; an atomic whose remote word is misaligned, or whose local
//! memory holds less than 8 bytes, is refused at the post, as rxe's provider does; a bad local key or range: `LOC_PROT_ERR`; an answer of the wrong kind
//! from the peer, such as a READ response to a SEND or an ACK past a READ: `FATAL_ERR`, with
//! nothing of it written); an error completes the
//! failing request even when unsignalled, moves the QP to ERROR and flushes every other
//! request of both queues with `WR_FLUSH_ERR`; a link that breaks ends what is outstanding
//! with `RETRY_EXC_ERR`; a request the responder drops because its queue pair is not in
//! RTR or RTS (or is gone) is sent again after the requester's timeout, `retry_cnt` times,
//! then ends with `RETRY_EXC_ERR` (the responder's device says it dropped it, [`Nak::Dropped`],
//! where a fabric leaves the requester to its transport timer). Receives come from the QP's own queue or from a shared receive
//! queue ([`Srq`], with its limit event); a QP on an SRQ reports LAST_WQE_REACHED when it
//! goes to ERROR ([`QpEvent`]).
//!
//! Type-2 memory windows, in the same key space as the regions ([`MrTable`], whose docs
//! restate rxe's rules): allocated free, bound by a bind request on a QP's send queue (done as
//! it is posted, completed as `BIND_MW` after the requests before it; a bind that breaks a rule
//! completes with `MW_BIND_ERR` and fails the QP), invalidated by a local invalidation
//! (`LOCAL_INV`; a key that names no bound window: `LOC_QP_OP_ERR`, the QP fails) or by the
//! peer's SEND with invalidate (RC; the receive's completion names the key). A window's key
//! works only for requests arriving on the QP it was bound on, inside the window, for the rights
//! it grants (else `REM_ACCESS_ERR` and the responder's QP goes to ERROR, as for a bad region
//! key); a region with a bound window is not deregistered.
//!
//! An [`RcQp`] made with [`QpConfig::unreliable`] is unreliable-connected (UC): SENDs and
//! WRITEs only, completed as they leave, with a responder that answers nothing and drops
//! what it cannot execute. Unreliable-datagram queue pairs ([`UdQp`]) send SENDs to any QP whose Q_Key they carry,
//! complete them as the wire takes them, and drop what cannot be delivered (wrong Q_Key, no
//! receive, a receive too short, longer than the MTU), as rxe does; every receive gets a
//! 40-byte GRH ([`grh`]) in front of the payload.
//!
//! Differences, on purpose: a message is one packet (the pipes carry any length, so there is
//! no MTU to cut at and no PSN per MTU); a queue pair may hold back its acknowledgements
//! ([`RcQp::set_hold_acks`]: the device asks it to while the application busy-polls), and then
//! its next request carries the latest ([`Packet::ack`]) or one ACK packet covers them all;
//! there is no go-back-N except after an RNR NAK or a dropped request (the pipes lose
//! nothing); `max_rd_atomic` is not enforced yet (requests execute in order at the
//! responder). A fenced request starts only once the READs and atomics before it have
//! completed (its bytes are gathered then), and what is posted after it waits behind it.
//!
//! Windows, where soft0 differs from rxe: type 1 and zero-based windows are not there (their
//! allocation fails with `EOPNOTSUPP`; a zero-based bind with `MW_BIND_ERR`); a request
//! through a window must lie inside the window (rxe checks only that it lies inside the
//! window's region); a bind needs the region to be of the QP's protection domain, a local
//! invalidation the window to be, and a SEND with invalidate the window to be bound to the QP
//! it arrives on (rxe checks none of these); a SEND with invalidate whose key names no such
//! window gets an invalid-request NAK (the receive fails with `REM_INV_REQ_ERR` and the QP
//! goes to ERROR, as on rxe, which however acknowledges the SEND); a bind is done when it is posted, not when
//! the requester reaches it (the same, as requests before it are already on their way).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod access;
mod direct;
mod memory;
mod mr;
mod qp;
mod srq;
mod ud;
mod wire;
mod wr;

pub use access::Access;
pub use direct::{Direct, ResponderQp};
pub use memory::{Memory, VecMemory};
pub use mr::{DeregError, MrEntry, MrTable, MwBinding, MwEntry};
pub use qp::{Handled, PostError, QpConfig, QpEvent, QpState, RcQp, MAX_MESSAGE};
pub use srq::Srq;
pub use ud::{grh, UdDest, UdQp, UdSource, GRH_LEN};
pub use wire::{
    Nak, Packet, PacketKind, Payload, PayloadBuf, WireError, HEADER_LEN, INLINE_PAYLOAD,
};
pub use wr::{Bind, Completion, RecvWr, SendOp, SendWr, Sge, Sges, Status, WcOpcode};
