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

mod domain;
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
pub use conn::{Buffer, BufferPool, Conn, ConnInfo, ConnOptions, Establish, Listener};

// The async layer on tokio (feature `tokio`): AsyncConn, AsyncListener, AsyncPacketConn.
#[cfg(feature = "tokio")]
pub mod asyncio;
#[cfg(feature = "tokio")]
pub use asyncio::{AsyncConn, AsyncListener, AsyncPacketConn};

/// The README's code blocks, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
