//! A name → [`Addr`] directory for UD endpoints, over TCP.
//!
//! Run it in a process ([`Registry::serve`], which returns a [`RegistryHandle`] that tells
//! its bound address and stops it) or as the `rs_registry` binary. Endpoints register their
//! [`Addr`] under a name with a lease, and renew it before it runs out ([`Registration`]
//! does it for as long as it lives); others look names up. A live name belongs to the owner
//! that registered it ([`ClientOptions::owner`]): others get [`ErrorCode::NotOwner`]. A
//! [`RegistryClient`] keeps one connection for many requests; [`register`] and [`lookup`]
//! are one-shot helpers.
//!
//! The protocol ([`codec`]) is versioned and length-prefixed. With a shared secret
//! ([`RegistryOptions::secret`], [`ClientOptions::secret`]) both sides prove it with the
//! handshake's challenge–response ([`crate::handshake::auth`]) before any request. The
//! server bounds everything a client can make it hold: clients (one thread each, up to
//! [`RegistryOptions::max_clients`]), entries ([`RegistryOptions::max_entries`]), name
//! length ([`codec::MAX_NAME`]) and frame size ([`codec::MAX_FRAME`]); a bad request gets an
//! [`ErrorCode`] and the server carries on.
//!
//! [`Addr`]: crate::packet::Addr

mod client;
pub mod codec;
mod directory;
mod etcd;
mod kept;
mod server;
mod stream;
mod table;

pub use client::{lookup, register, ClientOptions, RegistryClient};
pub use codec::{DecodeError, EncodeError};
pub use directory::{Directory, WATCH_POLL};
pub use etcd::{EtcdDirectory, EtcdOptions};
pub use kept::Registration;
pub use server::{
    Registry, RegistryHandle, RegistryOptions, BUSY_GRACE, MIN_IDLE_TO_SHED, OPENING_GRACE,
};

use std::fmt;

/// Why the registry refused a request (the code of an Error frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// A malformed or out-of-place request.
    BadRequest,
    /// An operation the registry does not know.
    UnknownOp,
    /// A name over [`codec::MAX_NAME`] bytes.
    NameTooLong,
    /// No live entry has the name.
    NotFound,
    /// The client did not prove the shared secret.
    AuthFailed,
    /// The registry holds its maximum of entries.
    Full,
    /// Another protocol version.
    Version,
    /// A frame over [`codec::MAX_FRAME`] bytes.
    TooLarge,
    /// The registry serves its maximum of clients.
    Busy,
    /// The name is registered, live, by another owner.
    NotOwner,
    /// A code this version does not know.
    Other(u8),
}

impl ErrorCode {
    /// The code on the wire.
    pub fn to_u8(self) -> u8 {
        match self {
            ErrorCode::BadRequest => 1,
            ErrorCode::UnknownOp => 2,
            ErrorCode::NameTooLong => 3,
            ErrorCode::NotFound => 4,
            ErrorCode::AuthFailed => 5,
            ErrorCode::Full => 6,
            ErrorCode::Version => 7,
            ErrorCode::TooLarge => 8,
            ErrorCode::Busy => 9,
            ErrorCode::NotOwner => 10,
            ErrorCode::Other(v) => v,
        }
    }

    /// The code of a wire value.
    pub fn from_u8(v: u8) -> ErrorCode {
        match v {
            1 => ErrorCode::BadRequest,
            2 => ErrorCode::UnknownOp,
            3 => ErrorCode::NameTooLong,
            4 => ErrorCode::NotFound,
            5 => ErrorCode::AuthFailed,
            6 => ErrorCode::Full,
            7 => ErrorCode::Version,
            8 => ErrorCode::TooLarge,
            9 => ErrorCode::Busy,
            10 => ErrorCode::NotOwner,
            v => ErrorCode::Other(v),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::BadRequest => f.write_str("bad request"),
            ErrorCode::UnknownOp => f.write_str("unknown operation"),
            ErrorCode::NameTooLong => f.write_str("name too long"),
            ErrorCode::NotFound => f.write_str("not found"),
            ErrorCode::AuthFailed => f.write_str("authentication failed"),
            ErrorCode::Full => f.write_str("registry full"),
            ErrorCode::Version => f.write_str("protocol version mismatch"),
            ErrorCode::TooLarge => f.write_str("frame too large"),
            ErrorCode::Busy => f.write_str("too many clients"),
            ErrorCode::NotOwner => f.write_str("the name belongs to another owner"),
            ErrorCode::Other(v) => write!(f, "error code {v}"),
        }
    }
}

/// Refuses a name the registry protocol cannot carry (empty, or over [`codec::MAX_NAME`]
/// bytes), on every backend.
pub(crate) fn check_name(name: &str) -> crate::Result<()> {
    if name.is_empty() || name.len() > codec::MAX_NAME {
        return Err(crate::NetError::InvalidArgument(format!(
            "a registry name must be 1 to {} bytes, this one is {}",
            codec::MAX_NAME,
            name.len()
        )));
    }
    Ok(())
}

/// The text of a `NotOwner` refusal, on every backend.
pub(crate) fn not_owner_text(name: &str) -> String {
    format!("{name:?} is registered by another owner until its lease runs out")
}

/// The text of a `NotFound` refusal, on every backend.
pub(crate) fn not_found_text(name: &str) -> String {
    format!("no live entry named {name:?}")
}
