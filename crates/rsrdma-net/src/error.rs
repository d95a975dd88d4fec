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

    /// Nothing listens at `addr` on this establishment path; the hint names the other path,
    /// where a listener may be (the two paths do not see each other's dialers).
    #[error("nobody is listening at {addr} over {path}: {hint}")]
    NotListening {
        /// The address dialed.
        addr: std::net::SocketAddr,
        /// The establishment path tried.
        path: &'static str,
        /// What to check.
        hint: &'static str,
    },

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

    /// etcd (behind [`crate::registry::EtcdDirectory`]) answered with something this crate
    /// cannot read: not HTTP, not JSON, or a field missing or out of shape.
    #[error("etcd's reply cannot be read: {0}")]
    EtcdReply(String),

    // ----- Conn and Listener (conn/) -----
    /// The connection failed and stays failed: a protocol violation by the peer, a dead peer,
    /// a broken queue pair or a disconnect. Every later call returns the same error.
    #[error("connection failed: {0}")]
    ConnFailed(rsrdma_proto::ProtoError),

    /// A receive into the caller's buffer (`recv_msg_into`, `recv_buffer`,
    /// `recv_batch_into`): the buffer is too short; the message stays queued.
    #[error("the receive buffer is too short: the message needs {needed} bytes (it stays queued)")]
    ShortBuffer {
        /// The bytes the message needs.
        needed: usize,
    },

    /// A message over the negotiated maximum (nothing was sent).
    #[error("a message of {len} bytes is over the negotiated maximum of {max}")]
    MessageTooLarge {
        /// The message length.
        len: usize,
        /// The negotiated maximum.
        max: u32,
    },

    /// This side closed the connection (or shut down writing, for a send).
    #[error("{op}: the connection is closed on this side")]
    Closed {
        /// The refused call.
        op: &'static str,
    },

    /// The peer closed (or went away) after its FIN: there is nobody to send to.
    #[error("{op}: the peer has closed the connection")]
    PeerGone {
        /// The refused call.
        op: &'static str,
    },

    /// A registered [`crate::Buffer`] is in flight (a send or receive has the NIC on it): its
    /// bytes cannot be touched and it cannot be sent or received into again until it is done.
    #[error("{op}: the buffer is in flight")]
    BufferBusy {
        /// The refused call.
        op: &'static str,
    },

    /// A [`crate::Buffer`] used with a connection on another protection domain, or a length
    /// beyond the buffer.
    #[error("{op}: {reason}")]
    BadBuffer {
        /// The refused call.
        op: &'static str,
        /// Which rule failed.
        reason: &'static str,
    },

    /// One peer's handshake failed on a listener. Listeners no longer return it from
    /// `accept` (a bad peer is logged, counted in `Listener::counters`, and skipped); the
    /// variant stays so that code matching it still compiles.
    #[deprecated(note = "accept skips bad peers now; see Listener::counters")]
    #[error("handshake with {peer} failed: {source}")]
    Handshake {
        /// The peer's address, as far as it is known.
        peer: String,
        /// Why.
        #[source]
        source: Box<NetError>,
    },
}

impl NetError {
    /// The [`io::ErrorKind`] this error maps to (the `Read`/`Write` impls of `Conn`, and
    /// `From<NetError> for io::Error`): `TimedOut` for a timeout, `NotConnected` after a local
    /// close, `BrokenPipe` when the peer is gone, `ConnectionReset` when it aborted (a
    /// refusal of a dial with its reason too), `ConnectionAborted` for a failed connection,
    /// `InvalidInput` for a bad argument, a short buffer or an oversized message or datagram,
    /// `PermissionDenied` for a failed authentication, `NotFound` for a name the registry does
    /// not know; a verbs call's error, the system's kind for its errno.
    pub fn io_kind(&self) -> io::ErrorKind {
        use crate::registry::ErrorCode;
        use io::ErrorKind as K;
        match self {
            NetError::Timeout { .. } => K::TimedOut,
            NetError::Io { source, .. } => source.kind(),
            NetError::Verbs(v) => match v {
                rsrdma::Error::Timeout { .. } => K::TimedOut,
                rsrdma::Error::InvalidArgument(_) | rsrdma::Error::Limit { .. } => K::InvalidInput,
                // The system's kind for a failed call's errno ("address in use" is
                // `AddrInUse` on either establishment path).
                other => other
                    .errno()
                    .map_or(K::Other, |e| io::Error::from_raw_os_error(e).kind()),
            },
            NetError::Closed { .. } => K::NotConnected,
            NetError::NotListening { .. } => K::ConnectionRefused,
            NetError::PeerGone { .. } => K::BrokenPipe,
            NetError::PeerAborted(_) => K::ConnectionReset,
            NetError::PeerClosed(_) => K::UnexpectedEof,
            NetError::ConnFailed(rsrdma_proto::ProtoError::PeerAborted { .. }) => {
                K::ConnectionReset
            }
            NetError::ConnFailed(_) => K::ConnectionAborted,
            NetError::BufferBusy { .. } => K::WouldBlock,
            NetError::InvalidArgument(_)
            | NetError::BadBuffer { .. }
            | NetError::DatagramTooLarge { .. }
            | NetError::BufferTooSmall { .. }
            | NetError::ShortBuffer { .. }
            | NetError::MessageTooLarge { .. }
            | NetError::Encode(_) => K::InvalidInput,
            NetError::Auth(_) => K::PermissionDenied,
            NetError::Malformed(_) | NetError::RegistryMalformed(_) | NetError::EtcdReply(_) => {
                K::InvalidData
            }
            NetError::Registry { code, .. } => match code {
                ErrorCode::NotFound => K::NotFound,
                ErrorCode::AuthFailed => K::PermissionDenied,
                _ => K::Other,
            },
            _ => K::Other,
        }
    }

    /// The error naming `op` where it names the call that failed: for a call made through
    /// another's steps (`write` and `send_batch` through `send_msg`'s: they said `send_msg`,
    /// an outside tester's note).
    pub(crate) fn naming(self, op: &'static str) -> NetError {
        match self {
            NetError::Closed { .. } => NetError::Closed { op },
            NetError::PeerGone { .. } => NetError::PeerGone { op },
            NetError::Timeout { millis, .. } => NetError::Timeout { op, millis },
            e => e,
        }
    }

    /// As an [`io::Error`] of [`NetError::io_kind`].
    pub fn into_io(self) -> io::Error {
        io::Error::new(self.io_kind(), self)
    }
}

impl From<NetError> for io::Error {
    fn from(e: NetError) -> Self {
        e.into_io()
    }
}

impl NetError {
    pub(crate) fn io(op: &'static str, source: io::Error) -> Self {
        NetError::Io { op, source }
    }

    /// A dial to `addr` over `path` whose TCP connection something took and closed without a
    /// hello ("the peer closed the connection during handshake hello", which gave no clue):
    /// nothing of `path` listens there, and `hint` says what may (on soft0, an rdma_cm
    /// listener takes TCP connections on its port). Any other error is returned as it is.
    pub(crate) fn closed_without_a_hello(
        self,
        addr: std::net::SocketAddr,
        path: &'static str,
        hint: &'static str,
    ) -> Self {
        match self {
            NetError::PeerClosed("handshake hello") => NetError::NotListening { addr, path, hint },
            e => e,
        }
    }
}

/// Result alias of rsrdma-net.
pub type Result<T, E = NetError> = std::result::Result<T, E>;

/// A protocol core error as this crate's error: the ones a caller acts on get their own
/// variants, anything else fails the connection.
pub(crate) fn from_core(e: rsrdma_proto::ProtoError) -> NetError {
    use rsrdma_proto::ProtoError;
    match e {
        ProtoError::ShortBuffer { needed } => NetError::ShortBuffer { needed },
        ProtoError::TooLarge { len, max } => NetError::MessageTooLarge { len, max },
        ProtoError::Closed { op } => NetError::Closed { op },
        other => NetError::ConnFailed(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short buffer is said the same for every receive into one (it named `recv_msg_into`
    /// for a `recv_buffer` too: an outside tester's find).
    #[test]
    fn a_short_buffer_names_no_one_call() {
        let e = NetError::ShortBuffer { needed: 1 << 20 };
        assert_eq!(
            e.to_string(),
            "the receive buffer is too short: the message needs 1048576 bytes (it stays queued)"
        );
    }

    /// The kinds the docs give (outside testers' notes: a refusal with its reason was
    /// `Other`, not `ConnectionReset`; an address in use was `AddrInUse` on one path and
    /// `Other` on the other); a call made through another's steps names itself.
    #[test]
    fn errors_map_to_the_kinds_their_docs_give() {
        use io::ErrorKind as K;
        assert_eq!(
            NetError::PeerAborted("no".into()).io_kind(),
            K::ConnectionReset
        );
        let in_use = rsrdma::Error::from_errno("rdma_bind_addr", libc::EADDRINUSE);
        assert_eq!(NetError::Verbs(in_use).io_kind(), K::AddrInUse);
        let named = NetError::Closed { op: "send_msg" }.naming("write");
        assert_eq!(
            named.to_string(),
            "write: the connection is closed on this side"
        );
        let t = NetError::Timeout {
            op: "send_msg",
            millis: 5,
        };
        assert_eq!(t.naming("write").to_string(), "write timed out after 5 ms");
        let too_large = NetError::MessageTooLarge { len: 2, max: 1 };
        assert!(!too_large.to_string().contains("send_msg"), "{too_large}");
    }
}
