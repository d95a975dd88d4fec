//! The crate's one error type, and the reasons a driver gives for a fatal failure.

use std::fmt;

/// Everything that can go wrong in the protocol core.
///
/// `ShortBuffer`, `Closed`, `NotNegotiated` and `TooLarge` answer one call and change
/// nothing. Every other variant is sticky (as in rustls): once the connection has failed,
/// every call returns the same error. "Not now" and "read it by rendezvous" are no errors:
/// the calls give them as values ([`Step`](crate::Step), [`Recv`](crate::Recv)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// A receive into the caller's buffer: the buffer is too short for the next message,
    /// which stays queued.
    #[error("the receive buffer is too short: the message needs {needed} bytes")]
    ShortBuffer {
        /// The bytes the message (or its unread rest) needs.
        needed: usize,
    },

    /// The local side was shut down for this direction (`send_msg` after `shutdown_write`,
    /// or a read after `close`).
    #[error("{op}: the local side is closed")]
    Closed {
        /// The call that was refused.
        op: &'static str,
    },

    /// A call that needs a feature the two sides did not settle (rendezvous).
    #[error("{op}: {feature} was not negotiated with the peer")]
    NotNegotiated {
        /// The call that was refused.
        op: &'static str,
        /// The missing feature.
        feature: &'static str,
    },

    /// `send_msg`: the message is larger than the negotiated maximum.
    #[error("a message of {len} bytes is over the negotiated maximum of {max}")]
    TooLarge {
        /// The message length.
        len: usize,
        /// The negotiated maximum.
        max: u32,
    },

    /// A `Params` value or a `Config` is out of range, or its bytes are malformed.
    #[error("params: {reason}")]
    BadParams {
        /// Which rule failed.
        reason: &'static str,
    },

    /// The peer speaks a major protocol version this side does not.
    #[error("the peer speaks protocol version {peer}, this side version {local}")]
    IncompatibleVersion {
        /// This side's major version.
        local: u8,
        /// The peer's major version.
        peer: u8,
    },

    /// The peer sent a frame that breaks the format.
    #[error("malformed frame from the peer: {reason}")]
    BadFrame {
        /// Which rule failed.
        reason: &'static str,
    },

    /// The peer sent more frames than it had credits for, or announced more credit than it
    /// has receive slots.
    #[error("credit overrun by the peer: {reason}")]
    CreditOverrun {
        /// Which limit was crossed.
        reason: &'static str,
    },

    /// The peer spent a credit of the control reserve on data.
    #[error("the peer sent data with only the control reserve left")]
    ReserveViolated,

    /// A fragment is larger than the negotiated frame size.
    #[error("a fragment of {len} bytes is over the frame payload limit of {max}")]
    OversizeFragment {
        /// The fragment's payload length.
        len: u32,
        /// The limit.
        max: u32,
    },

    /// A message announces more bytes than the negotiated maximum.
    #[error("a message of {len} bytes is over the negotiated maximum of {max}")]
    MessageTooLarge {
        /// The announced length.
        len: u32,
        /// The negotiated maximum.
        max: u32,
    },

    /// The peer sent data (or a second FIN) after its FIN.
    #[error("the peer sent {what} after its FIN")]
    DataAfterFin {
        /// The frame type.
        what: &'static str,
    },

    /// Fragments out of order: a continuation without a start, a start inside a message, a
    /// wrong message id, or lengths that do not add up.
    #[error("fragment sequence broken: {reason}")]
    Sequence {
        /// Which rule failed.
        reason: &'static str,
    },

    /// The peer used a frame type whose feature was not negotiated (rendezvous).
    #[error("the peer sent frame type {frame}, whose feature was not negotiated")]
    Unsupported {
        /// The frame type byte.
        frame: u8,
    },

    /// The peer sent a stripe of a striped connection that breaks the format or the
    /// agreement (`rails`).
    #[error("malformed stripe from the peer: {reason}")]
    BadStripe {
        /// Which rule failed.
        reason: &'static str,
    },

    /// Every rail of a striped connection failed.
    #[error("every rail of the connection failed")]
    AllRailsFailed,

    /// The peer aborted the connection.
    #[error("the peer aborted the connection (code {code}{})", describe_abort(*code))]
    PeerAborted {
        /// The peer's abort code (see `frame::abort_code`).
        code: u32,
    },

    /// Nothing arrived from the peer within the configured timeout.
    #[error("the peer is dead: nothing arrived for {silent_ms} ms")]
    PeerDead {
        /// How long the peer was silent.
        silent_ms: u64,
    },

    /// The driver reported a failed work completion or a broken queue pair.
    #[error("fatal transport failure: {0}")]
    Fatal(Fatal),

    /// This side refused the connection: its listener closed before anyone accepted it
    /// (`Conn::refuse`; the peer is told with an ABORT).
    #[error("the listener closed before anyone accepted the connection")]
    Refused,

    /// The driver broke the core's contract (a completion for a work request never posted).
    #[error("driver misuse: {reason}")]
    Misuse {
        /// Which rule failed.
        reason: &'static str,
    },
}

impl ProtoError {
    /// Whether the peer broke the protocol (a frame, a credit, a sequence or a size it must
    /// not send), as opposed to a transport failure, a silent or aborting peer, or a misuse
    /// here. Such an error is the connection's outcome even when it came after this side's
    /// close began (a close then says so instead of `Ok`).
    pub fn is_peers_violation(&self) -> bool {
        matches!(
            self,
            Self::BadFrame { .. }
                | Self::CreditOverrun { .. }
                | Self::ReserveViolated
                | Self::OversizeFragment { .. }
                | Self::MessageTooLarge { .. }
                | Self::DataAfterFin { .. }
                | Self::Sequence { .. }
                | Self::Unsupported { .. }
                | Self::BadStripe { .. }
        )
    }

    /// Whether this error ends the connection (it is then returned by every later call).
    pub fn is_sticky(&self) -> bool {
        !matches!(
            self,
            Self::ShortBuffer { .. }
                | Self::NotNegotiated { .. }
                | Self::Closed { .. }
                | Self::TooLarge { .. }
        )
    }
}

/// Why the driver declares the transport broken (`Conn::handle_fatal`).
///
/// Plain numbers, so the core names no verbs type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fatal {
    /// A send work completion failed with this `ibv_wc_status`.
    SendCompletion {
        /// The status code.
        status: u32,
    },
    /// A receive work completion failed with this `ibv_wc_status`.
    RecvCompletion {
        /// The status code.
        status: u32,
    },
    /// The queue pair entered the error state (an asynchronous event).
    QpError,
    /// The rdma_cm connection was torn down, or the device went away.
    Disconnected,
}

/// What a failed completion's `ibv_wc_status` says, for the statuses a connection meets
/// when its peer or its link goes (the others are named by number only).
fn meaning(status: u32) -> &'static str {
    match status {
        4 => ": local protection error",
        5 => {
            ": flushed, the queue pair had failed: the peer disconnected or died, or an \
              earlier error broke the connection"
        }
        9 => ": the peer refused an invalid request",
        10 => ": the peer refused a remote access",
        12 => ": transport retries exceeded, the peer does not answer (gone, or unreachable)",
        13 => ": RNR retries exceeded, the peer posted no receive in time",
        _ => "",
    }
}

/// What a failed receive completion's status says. A frame longer than the receive slot is
/// `LOC_LEN_ERR` (1) on a NIC and `REM_INV_REQ_ERR` (9) on rxe and soft0, whose general
/// meaning ("the peer refused an invalid request") reads the wrong way round on the side
/// that refused it (an outside tester's find).
fn recv_meaning(status: u32) -> &'static str {
    match status {
        1 | 9 => {
            ": the peer sent a frame longer than this side's receive slot, which the protocol \
              forbids (the peer is broken or hostile)"
        }
        other => meaning(other),
    }
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SendCompletion { status } => {
                write!(
                    f,
                    "send completion failed (status {status}{})",
                    meaning(*status)
                )
            }
            Self::RecvCompletion { status } => {
                write!(
                    f,
                    "receive completion failed (status {status}{})",
                    recv_meaning(*status)
                )
            }
            Self::QpError => f.write_str("the queue pair entered the error state"),
            Self::Disconnected => f.write_str("disconnected"),
        }
    }
}

/// `": <meaning>"` of an ABORT code, or nothing for one this version does not know.
fn describe_abort(code: u32) -> String {
    match crate::frame::abort_code::describe(code) {
        "" => String::new(),
        what => format!(": {what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed completion says what its status means where a peer's death or a broken
    /// link causes it (an outside tester read "status 5" after its peer was killed).
    #[test]
    fn failed_completions_say_what_their_status_means() {
        let flushed = Fatal::RecvCompletion { status: 5 }.to_string();
        assert!(
            flushed.contains("status 5: flushed") && flushed.contains("died"),
            "{flushed}"
        );
        let retry = Fatal::SendCompletion { status: 12 }.to_string();
        assert!(retry.contains("does not answer"), "{retry}");
        assert_eq!(
            Fatal::SendCompletion { status: 99 }.to_string(),
            "send completion failed (status 99)"
        );
    }
}
