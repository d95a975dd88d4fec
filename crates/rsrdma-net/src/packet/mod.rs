//! UD datagrams: [`PacketConn`], its [`Addr`] and [`PacketOptions`].
//!
//! A `PacketConn` is one unreliable-datagram queue pair: `send_to` a peer's [`Addr`],
//! `recv_from` anyone. It is `Send + Sync`, and any number of threads may send and receive
//! at once:
//!
//! - **No completion is lost.** Sends and receives complete on separate CQs. Every receive
//!   completion is moved into a FIFO by whichever thread polls it; every send completion
//!   frees send buffers, whoever reaps it. (gordma's shared CQ let a sender throw receives
//!   away and a receiver throw sends away.)
//! - **Many sends in flight.** A ring of `send_depth` buffers, batches of up to 32 requests
//!   per call into the provider, selective signaling; `send_to` returns once its datagram is
//!   posted.
//! - **Replies work.** The [`Addr`] a receive returns carries the sender's GID, read from
//!   the 40-byte GRH in front of every UD receive.
//! - **Bounded.** Datagrams are limited to the port's active MTU ([`NetError::DatagramTooLarge`]
//!   names the limit); address handles are cached per destination GID in a bounded LRU.
//! - **Waiting** follows [`crate::PollMode`] (busy, event, adaptive), with read and write
//!   timeouts ([`NetError::Timeout`], `io::ErrorKind::TimedOut` as an `io::Error`) after
//!   which the endpoint stays usable.
//!
//! UD drops a datagram that finds no receive posted: size [`PacketOptions::recv_depth`] for
//! the bursts the application does not read in time, or pace the sender.
//!
//! Addresses need a GID: RoCE, or InfiniBand with GIDs routed by the GRH (an Addr carries no
//! LID).
//!
//! [`NetError::DatagramTooLarge`]: crate::NetError::DatagramTooLarge
//! [`NetError::Timeout`]: crate::NetError::Timeout

mod addr;
mod ah_cache;
mod conn;
mod gate;
mod grh;
mod options;
mod recv;
mod send;

pub use addr::{Addr, AddrParseError, MAX_QPN};
#[cfg(feature = "tokio")]
pub(crate) use conn::SendAttempt;
pub use conn::{PacketConn, PacketStats};
pub use options::PacketOptions;
