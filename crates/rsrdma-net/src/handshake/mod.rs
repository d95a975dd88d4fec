//! The out-of-band handshake: a TCP exchange that authenticates the peer (optionally), swaps
//! queue-pair endpoints, settles on what both sides can do, and then swaps memory
//! descriptors. The same connection stays open afterwards as the control channel (barriers
//! and a close that waits for the peer).
//!
//! [`codec`] is the pure wire format; [`auth`] the challenge–response; [`Channel`] the
//! blocking driver over a `TcpStream` with a timeout on every read.

pub mod auth;
mod channel;
pub mod codec;
mod settle;

pub use channel::Channel;
pub use codec::{DecodeError, Endpoint, Hello, Message, Proof, Regions, Role};
pub use settle::{settle, Settled};
