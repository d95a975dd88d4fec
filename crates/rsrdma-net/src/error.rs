//! The connection layer's one error type.

use crate::handshake::{DecodeError, EncodeError};
use std::io;

/// Everything that can go wrong in rsrdma-net.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// A verb failed (from the rsrdma layer).
    #[error(transparent)]
    Verbs(#[from] rsrdma::Error),

    /// A socket call failed.
    #[error("{op}: {source}")]
    Io {
        /// The call (`connect`, `accept`, `read handshake`, …).
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The peer sent bytes that are not a valid handshake message.
    #[error("malformed handshake message from the peer: {0}")]
    Malformed(#[from] DecodeError),

    /// A message breaks a limit of the wire format (this side refuses to send it).
    #[error("cannot send the message: {0}")]
    Encode(#[from] EncodeError),

    /// The peer sent more messages than the control channel keeps unread.
    #[error("the peer sent more than {limit} control messages that nobody has read")]
    QueueFull {
        /// The limit ([`crate::handshake::MAX_QUEUED`]).
        limit: usize,
    },

    /// The peer sent a valid message, but not the one the protocol expects now.
    #[error("handshake: expected {expected}, got {got}")]
    Unexpected {
        /// What was expected.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },

    /// Authentication failed: the peer lacks the secret, or demanded one this side lacks.
    #[error("authentication failed: {0}")]
    Auth(String),

    /// The peer gave up and said why.
    #[error("the peer aborted: {0}")]
    PeerAborted(String),

    /// The peer closed the connection.
    #[error("the peer closed the connection during {0}")]
    PeerClosed(&'static str),

    /// A wait ran out of time.
    #[error("{op} timed out after {millis} ms")]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// The limit.
        millis: u64,
    },

    /// An option differs between the two ends.
    #[error("option {option} differs: this side {local}, the peer {peer}")]
    Mismatch {
        /// The option.
        option: String,
        /// This side's value.
        local: String,
        /// The peer's value.
        peer: String,
    },

    /// An option or argument that cannot work.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    // --- PacketConn and the registry (crate::packet, crate::registry) ---
    /// A datagram larger than one UD packet may carry.
    #[error(
        "datagram of {len} bytes is over the limit of {limit} bytes \
         (the path MTU, or PacketOptions::max_datagram)"
    )]
    DatagramTooLarge {
        /// The datagram's length.
        len: usize,
        /// The endpoint's limit.
        limit: usize,
    },

    /// The caller's buffer cannot hold the next datagram, which stays queued.
    #[error(
        "a buffer of {got} bytes cannot hold the next datagram of {needed} bytes (it stays queued)"
    )]
    BufferTooSmall {
        /// The datagram's length.
        needed: usize,
        /// The buffer's length.
        got: usize,
    },

    /// The registry refused a request and said why.
    #[error("registry: {code}: {message}")]
    Registry {
        /// What kind of refusal.
        code: crate::registry::ErrorCode,
        /// The registry's explanation.
        message: String,
    },

    /// Bytes that are not a registry message.
    #[error("malformed registry message: {0}")]
    RegistryMalformed(#[from] crate::registry::DecodeError),
}

impl From<NetError> for io::Error {
    /// Keeps the kind callers test for: a timeout is `TimedOut`, a bad argument
    /// `InvalidInput`, a failed authentication `PermissionDenied`, a missing registry name
    /// `NotFound`.
    fn from(e: NetError) -> Self {
        use crate::registry::ErrorCode;
        let kind = match &e {
            NetError::Timeout { .. } => io::ErrorKind::TimedOut,
            NetError::Io { source, .. } => source.kind(),
            NetError::Verbs(v) => match v {
                rsrdma::Error::Timeout { .. } => io::ErrorKind::TimedOut,
                rsrdma::Error::InvalidArgument(_) | rsrdma::Error::Limit { .. } => {
                    io::ErrorKind::InvalidInput
                }
                _ => io::ErrorKind::Other,
            },
            NetError::InvalidArgument(_)
            | NetError::DatagramTooLarge { .. }
            | NetError::BufferTooSmall { .. }
            | NetError::Encode(_) => io::ErrorKind::InvalidInput,
            NetError::Auth(_) => io::ErrorKind::PermissionDenied,
            NetError::PeerClosed(_) => io::ErrorKind::UnexpectedEof,
            NetError::Malformed(_) | NetError::RegistryMalformed(_) => io::ErrorKind::InvalidData,
            NetError::Registry { code, .. } => match code {
                ErrorCode::NotFound => io::ErrorKind::NotFound,
                ErrorCode::AuthFailed => io::ErrorKind::PermissionDenied,
                _ => io::ErrorKind::Other,
            },
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

impl NetError {
    pub(crate) fn io(op: &'static str, source: io::Error) -> Self {
        NetError::Io { op, source }
    }
}

/// Result alias of rsrdma-net.
pub type Result<T, E = NetError> = std::result::Result<T, E>;
