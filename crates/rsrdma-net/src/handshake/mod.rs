//! The out-of-band handshake: a TCP exchange that authenticates the peer (optionally), swaps
//! queue-pair endpoints, settles on what both sides can do, and then swaps memory
//! descriptors. The same connection stays open afterwards as the control channel (memory
//! descriptors, barriers, keepalives, liveness and a close that waits for the peer).
//!
//! [`codec`] is the pure wire format; [`FrameReader`] reassembles frames from a byte stream;
//! [`auth`] the challenge–response; [`Channel`] the message-driven driver over a non-blocking
//! `TcpStream`, where every wait is a poll with a deadline.

pub mod auth;
mod channel;
pub mod codec;
mod frames;
mod readiness;
mod settle;
mod standing;

pub(crate) use channel::{refused_by_peer, CLOSE_STEP, NO_SECRET_HERE, WRONG_PROOF};
pub use channel::{Channel, MAX_QUEUED};
pub use codec::{
    DecodeError, EncodeError, Endpoint, Hello, Message, MessageKind, Proof, Regions, Role,
};
pub use frames::FrameReader;
pub use settle::{settle, Settled};
pub(crate) use standing::Standing;
