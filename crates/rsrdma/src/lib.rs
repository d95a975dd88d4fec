//! rsrdma: safe, owning bindings to RDMA verbs (libibverbs) and rdma_cm (librdmacm).
//!
//! # The object model
//!
//! ```text
//! Context ─┬─ Pd ─┬─ Mr            every handle holds its parents (Arc), so any drop order is
//!          │      ├─ Qp ──┬─ Cq    safe: a parent is destroyed only after its last child.
//!          │      ├─ Srq  └─ Srq
//!          │      └─ Ah
//!          ├─ CompChannel ── Cq
//!          └─ (cm) CmId ── Qp
//! ```
//!
//! - [`devices`]/[`open`] find and open a device; no RDMA stack gives [`Error::Unsupported`]
//!   with a hint to the VM testbed (`cargo xtask vm`).
//! - [`Context`] answers device, port and GID-table queries.
//! - [`Pd`], [`Mr`] (least-privilege [`AccessFlags`] by default; [`RemoteMemory`] is the plain
//!   value a peer needs), [`Cq`] and [`CompChannel`] (event mode, non-blocking, `AsFd`).
//! - [`Qp`] (RC, UC, UD) with capabilities checked against the device, typed transitions
//!   RESET→INIT→RTR→RTS, query, move to ERROR; [`Srq`]; [`Ah`].
//! - [`SendWr`]/[`RecvWr`] are the C structs themselves, so a batch is posted with one call
//!   ([`Qp::post_send_batch`]) and reports which request failed.
//! - [`Wc`] names every status; [`Wc::ok`] turns a failure into an [`Error`].
//! - [`cm`]: rdma_cm listen/accept/connect with timeouts and private data.
//!
//! # Soundness: what is `unsafe` and why
//!
//! Safe code cannot cause undefined behaviour through rsrdma. Three operations are `unsafe`,
//! because their correctness depends on things the compiler cannot see:
//!
//! 1. **Posting** ([`Qp::post_send`], [`Qp::post_recv`], their batch forms, and
//!    [`Srq::post_recv`]). A posted request lets the NIC read or write memory *after the call
//!    returns*, until its completion is reaped. The caller promises that the memory stays
//!    valid that long and that the CPU does not touch it in a conflicting way meanwhile
//!    (reading a receive buffer before its completion, or rewriting a send buffer in flight,
//!    would race with DMA). Memory owned by an [`Mr`] can never be freed while registered:
//!    dropping the `Mr` deregisters first, after which the NIC has no translation for it; an
//!    in-flight request then fails with a protection error instead of touching freed memory.
//! 2. **Registering caller memory** ([`Mr::register`]): rsrdma cannot see how long that
//!    memory lives, so the caller promises it outlives the registration.
//! 3. **Raw escape hatches** (`as_raw()`): the pointers are safe to obtain; using them with
//!    the raw `ffi` functions is the caller's responsibility.
//!
//! **Remotely writable memory.** A region registered with `REMOTE_WRITE` or `REMOTE_ATOMIC`
//! can change at any moment once its key is with a peer, with no call on this side: a Rust
//! reference to its bytes would be undefined behaviour, not a "snapshot". So safe code gets no
//! reference to such a region: [`Mr::as_slice`]/[`Mr::as_mut_slice`] refuse it, and
//! [`Mr::read_at`]/[`Mr::write_at`] copy with volatile accesses that hold no reference. The
//! `unsafe` [`Mr::as_slice_unchecked`] is for code whose protocol says the peer is done.
//!
//! **Threads and events.** `Qp`, `Cq` and `Mr` are `Send + Sync`: libibverbs serialises
//! posting and polling. [`Qp::state`] asks the provider rather than reading a field libibverbs
//! writes under its own lock. A [`CompChannel`] shared by several CQs routes each event to its
//! CQ, so no waiter misses its wake-up. [`cm::CmId`] is `Send` but not `Sync`: librdmacm does
//! not serialise calls on one id.
//!
//! # The software device
//!
//! `soft0` is an RDMA device in this library (`open("soft0")`; listed by [`devices`] with
//! `RSRDMA_SOFT_DEVICE=1`): RC, UC and UD queue pairs, SRQs, address handles and rdma_cm
//! between processes of one host, behind the same types, with no kernel support. Its objects
//! are C structs of libibverbs' layout, so the data path reaches them through the context's
//! operation table as a hardware provider's; [`soft_faults`] breaks its queue pairs on
//! purpose for tests. See the guide's software-device chapter.

#![deny(missing_docs)]

pub mod ah;
pub mod async_event;
#[cfg(feature = "bench-support")]
#[doc(hidden)]
pub mod bench_support;
pub mod cm;
pub mod context;
pub mod cq;
pub mod cq_ex;
pub mod device;
pub mod dmabuf;
pub mod error;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod qp_ex;
pub mod srq;
pub mod topology;
pub mod wc;
pub mod wr;

mod flags;
mod gid_select;
mod setters;

/// The raw bindings, for what rsrdma does not wrap.
pub mod ffi;
mod soft;
pub use setters::IntoOption;
pub use soft::faults as soft_faults;

pub use ah::{Ah, AhAttr, GlobalRoute};
pub use async_event::{AsyncElement, AsyncEvent, AsyncEventKind};
pub use context::{
    AtomicCap, Context, DeviceAttr, Gid, GidEntry, GidType, LinkLayer, Mtu, PortAttr, PortState,
};
pub use cq::{CompChannel, Cq};
pub use cq_ex::{WcEx, WcFields};
pub use device::{devices, open, Device, DeviceList};
pub use dmabuf::DmabufMr;
pub use error::{Error, PrivateData, Result};
pub use mr::{AccessFlags, DeregFailed, Mr, RemoteMemory};
pub use mw::Mw;
pub use pd::Pd;
pub use qp::{
    ConnectOptions, InitAttr, Qp, QpBuilder, QpCaps, QpEndpoint, QpInfo, QpState, QpType, RtrAttr,
    RtsAttr,
};
pub use qp_ex::{SendOps, WrBatch};
pub use srq::Srq;
pub use wc::{Wc, WcOpcode, WcStatus};
pub use wr::{RecvWr, SendWr, Sge};
