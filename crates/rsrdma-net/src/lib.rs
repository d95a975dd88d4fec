//! rsrdma-net: connections over rsrdma.
//!
//! - [`handshake`]: the out-of-band TCP exchange (versioned, optionally authenticated) that
//!   connects two queue pairs and swaps memory descriptors.
//! - [`RawConn`]: a connection for the data plane at line rate: register memory, post work
//!   requests (singly or in batches), busy-poll (or sleep on completion channels), and do
//!   one-sided RDMA Write/Read with the peer's exchanged descriptors. Connections can share
//!   one protection domain, and so memory registered once.
//! - [`PacketConn`]: UD datagrams (`send_to`/`recv_from` an [`Addr`]), shared by threads.
//! - [`registry`]: a name → [`Addr`] directory over TCP, as a library type or the
//!   `rs_registry` binary.
//! - [`Conn`] and [`Listener`]: the net-style connection (rdma_cm or the TCP handshake):
//!   messages of any size, a byte stream (`Read`/`Write`), credit flow control, keepalive,
//!   clean close, busy/event/adaptive progress ([`PollMode`]).

#![deny(missing_docs)]

mod deadline;
mod domain;
mod secret;
pub use secret::Secret;
pub mod error;
pub mod handshake;

pub use error::{NetError, Result};
mod options;
pub mod pipeline;
pub mod progress;
mod raw_conn;

pub use options::{Completion, RawOptions};
pub use pipeline::RunStats;
pub use progress::PollMode;
pub use raw_conn::{RawConn, RawListener};

// UD datagrams and the name registry.
pub mod packet;
pub mod registry;
pub use packet::{Addr, PacketConn, PacketOptions};
pub use registry::{Registry, RegistryClient, RegistryHandle, RegistryOptions};

// Conn and Listener: the net-style RDMA connection (conn/).
pub mod conn;
pub use conn::{
    Buffer, BufferPool, Conn, ConnInfo, ConnOptions, Establish, Listener, ListenerCounters,
    RecvMemory, RendezvousMode, SharedRecv,
};
pub mod rails;
pub use rails::{RailConn, RailListener, RailOptions};
/// Types of the crates below that this crate's public signatures name, so that a user can
/// name them without depending on those crates: the protocol core's counters, negotiated
/// parameters and errors ([`ConnInfo::settled`], [`Conn::counters`], [`NetError::ConnFailed`]),
/// and the verbs types the options and RawConn take.
pub use rsrdma::{AccessFlags, Mtu, Pd, QpType, RemoteMemory};
pub use rsrdma_proto::rails::RailCounters;
pub use rsrdma_proto::{Counters, ProtoError, Settled};

// The async layer on tokio (feature `tokio`): AsyncConn, AsyncListener, AsyncPacketConn.
#[cfg(feature = "tokio")]
pub mod asyncio;
#[cfg(feature = "tokio")]
pub use asyncio::{AsyncConn, AsyncListener, AsyncPacketConn};

/// The README's code blocks, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The user's guide (`docs/guide`, an mdBook): each chapter's code blocks compiled as
/// doctests, so the guide cannot drift from the API. `cargo xtask docs` builds the book.
#[cfg(doctest)]
mod guide {
    /// Getting started.
    #[doc = include_str!("../../../docs/guide/src/getting-started.md")]
    pub struct GettingStarted;
    /// The object model.
    #[doc = include_str!("../../../docs/guide/src/object-model.md")]
    pub struct ObjectModel;
    /// RawConn.
    #[doc = include_str!("../../../docs/guide/src/rawconn.md")]
    pub struct RawConn;
    /// Conn and Listener.
    #[doc = include_str!("../../../docs/guide/src/conn.md")]
    pub struct Conn;
    /// Zero-copy, rendezvous and shared receive.
    #[doc = include_str!("../../../docs/guide/src/zero-copy.md")]
    pub struct ZeroCopy;
    /// PacketConn and the Registry.
    #[doc = include_str!("../../../docs/guide/src/packet-registry.md")]
    pub struct PacketRegistry;
    /// Async on tokio (its blocks need the feature).
    #[cfg(feature = "tokio")]
    #[doc = include_str!("../../../docs/guide/src/async.md")]
    pub struct Async;
    /// The tools.
    #[doc = include_str!("../../../docs/guide/src/tools.md")]
    pub struct Tools;
    /// Performance.
    #[doc = include_str!("../../../docs/guide/src/performance.md")]
    pub struct Performance;
    /// Troubleshooting.
    #[doc = include_str!("../../../docs/guide/src/troubleshooting.md")]
    pub struct Troubleshooting;
    /// The establishment wire formats.
    #[doc = include_str!("../../../docs/guide/src/establishment.md")]
    pub struct Establishment;
    /// Several NICs: where the devices are, and which to take.
    #[doc = include_str!("../../../docs/guide/src/many-nics.md")]
    pub struct ManyNics;
    /// GPU memory: DMA-BUF regions.
    #[doc = include_str!("../../../docs/guide/src/gpu-memory.md")]
    pub struct GpuMemory;
}
