//! The frame header: 16 bytes, little-endian, at the start of every SEND.
//!
//! ```text
//! offset size field
//!  0     1    type          1 DATA, 2 CREDIT, 3 FIN, 4 PING, 5 PONG, 6 ABORT, 7 RTS, 8 DONE,
//!                           9 WITHDRAW, 10 WITHDRAWN
//!  1     1    flags         DATA only: bit 0 FIRST, bit 1 LAST; other bits and other types: 0
//!  2     2    msg_id        DATA, RTS, DONE, WITHDRAW, WITHDRAWN: message number mod 2^16;
//!                           FIN: messages sent
//!                           mod 2^16; else 0
//!  4     4    credit_limit  cumulative receive limit granted to the peer, mod 2^32
//!  8     4    payload_len   bytes after the header in this frame (RTS: 16; 0 for every
//!                           other control frame)
//! 12     4    aux           DATA+FIRST and RTS: total message length; PING/PONG: token;
//!                           ABORT: code
//! ```
//!
//! An RTS's 16 payload bytes: the address (8, little-endian) and the remote key (4) of the
//! message in the sender's memory, then 4 reserved bytes (sent 0, ignored).
//!
//! `decode` checks everything that one header can show alone; the connection checks the rest
//! (sequence, credits, sizes against the negotiated limits).

use crate::error::ProtoError;

/// Bytes of the fixed frame header.
pub const HEADER_LEN: usize = 16;
/// Payload bytes of an RTS frame: address (8), remote key (4), reserved (4).
pub const RTS_PAYLOAD_LEN: usize = 16;

/// DATA flag: the first fragment of a message (`aux` holds the message length).
pub const FLAG_FIRST: u8 = 0x01;
/// DATA flag: the last fragment of a message.
pub const FLAG_LAST: u8 = 0x02;

/// Frame types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// A message fragment.
    Data = 1,
    /// Credits only (the header's `credit_limit`).
    Credit = 2,
    /// The sender will send no more data: end of its byte stream.
    Fin = 3,
    /// Liveness probe; the peer answers with PONG.
    Ping = 4,
    /// Answer to PING, echoing its token.
    Pong = 5,
    /// The sender gives up; `aux` says why.
    Abort = 6,
    /// Rendezvous request-to-send: a message the receiver pulls with RDMA READ (behind
    /// `FEATURE_RENDEZVOUS`).
    Rts = 7,
    /// Rendezvous completion: the receiver has read the message; the sender may release it.
    Done = 8,
    /// The sender asks for an RTS's message back: its call gave up (behind
    /// `FEATURE_WITHDRAW`).
    Withdraw = 9,
    /// Answer to WITHDRAW: the receiver dropped the message unread; the sender may release
    /// it, and nothing of it was delivered. (A receiver already reading it sends DONE.)
    Withdrawn = 10,
}

impl FrameType {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Data,
            2 => Self::Credit,
            3 => Self::Fin,
            4 => Self::Ping,
            5 => Self::Pong,
            6 => Self::Abort,
            7 => Self::Rts,
            8 => Self::Done,
            9 => Self::Withdraw,
            10 => Self::Withdrawn,
            _ => return None,
        })
    }

    /// A short name for logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "DATA",
            Self::Credit => "CREDIT",
            Self::Fin => "FIN",
            Self::Ping => "PING",
            Self::Pong => "PONG",
            Self::Abort => "ABORT",
            Self::Rts => "RTS",
            Self::Done => "DONE",
            Self::Withdraw => "WITHDRAW",
            Self::Withdrawn => "WITHDRAWN",
        }
    }
}

/// One decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The frame type.
    pub kind: FrameType,
    /// `FLAG_FIRST` / `FLAG_LAST` (DATA only).
    pub flags: u8,
    /// See the table in the module docs.
    pub msg_id: u16,
    /// Cumulative credit limit, mod 2^32.
    pub credit_limit: u32,
    /// Payload bytes after the header.
    pub payload_len: u32,
    /// See the table in the module docs.
    pub aux: u32,
}

impl Header {
    /// A control frame (no payload, no flags).
    pub fn control(kind: FrameType, msg_id: u16, credit_limit: u32, aux: u32) -> Self {
        Self {
            kind,
            flags: 0,
            msg_id,
            credit_limit,
            payload_len: 0,
            aux,
        }
    }

    /// Whether `FLAG_FIRST` is set.
    pub fn first(&self) -> bool {
        self.flags & FLAG_FIRST != 0
    }

    /// Whether `FLAG_LAST` is set.
    pub fn last(&self) -> bool {
        self.flags & FLAG_LAST != 0
    }

    /// The 16 wire bytes.
    #[inline]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.kind as u8;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.msg_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.credit_limit.to_le_bytes());
        b[8..12].copy_from_slice(&self.payload_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    /// Decodes and checks a header; `bytes` may be longer (the payload follows).
    #[inline]
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let bad = |reason| Err(ProtoError::BadFrame { reason });
        if bytes.len() < HEADER_LEN {
            return bad("shorter than the 16-byte header");
        }
        let Some(kind) = FrameType::from_byte(bytes[0]) else {
            return bad("unknown frame type");
        };
        let h = Self {
            kind,
            flags: bytes[1],
            msg_id: u16::from_le_bytes([bytes[2], bytes[3]]),
            credit_limit: le32(&bytes[4..8]),
            payload_len: le32(&bytes[8..12]),
            aux: le32(&bytes[12..16]),
        };
        h.check_shape()?;
        Ok(h)
    }

    #[inline]
    fn check_shape(&self) -> Result<(), ProtoError> {
        let bad = |reason| Err(ProtoError::BadFrame { reason });
        if self.kind == FrameType::Rts {
            if self.flags != 0 {
                return bad("flags on an RTS");
            }
            if self.payload_len as usize != RTS_PAYLOAD_LEN {
                return bad("an RTS whose payload is not 16 bytes");
            }
            if self.aux == 0 {
                return bad("an RTS for an empty message");
            }
            return Ok(());
        }
        if self.kind != FrameType::Data {
            if self.flags != 0 {
                return bad("flags on a control frame");
            }
            if self.payload_len != 0 {
                return bad("payload on a control frame");
            }
            let msg_id_ok = self.msg_id == 0
                || matches!(
                    self.kind,
                    FrameType::Fin | FrameType::Done | FrameType::Withdraw | FrameType::Withdrawn
                );
            if !msg_id_ok {
                return bad("message id on a control frame");
            }
            let aux_ok = self.aux == 0
                || matches!(
                    self.kind,
                    FrameType::Ping | FrameType::Pong | FrameType::Abort
                );
            if !aux_ok {
                return bad("aux set on a frame type that has none");
            }
            return Ok(());
        }
        if self.flags & !(FLAG_FIRST | FLAG_LAST) != 0 {
            return bad("unknown flag bits");
        }
        if !self.first() && self.aux != 0 {
            return bad("message length on a continuation fragment");
        }
        if self.first() && self.payload_len > self.aux {
            return bad("first fragment longer than its message");
        }
        if self.first() && self.last() && self.payload_len != self.aux {
            return bad("single-fragment message whose length differs from its fragment");
        }
        if !self.last() && self.payload_len == 0 {
            return bad("empty fragment that is not the last");
        }
        Ok(())
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// ABORT codes (the `aux` of an ABORT frame).
pub mod abort_code {
    /// Unspecified.
    pub const OTHER: u32 = 0;
    /// A malformed frame.
    pub const BAD_FRAME: u32 = 1;
    /// Credit overrun or a spent control reserve.
    pub const CREDIT: u32 = 2;
    /// A fragment or message over the negotiated limits.
    pub const TOO_LARGE: u32 = 3;
    /// Fragments out of order, or data after FIN.
    pub const SEQUENCE: u32 = 4;
    /// A frame type whose feature was not negotiated.
    pub const UNSUPPORTED: u32 = 5;
    /// The peer was silent for longer than the timeout.
    pub const TIMEOUT: u32 = 6;
    /// The sender's listener closed before anyone accepted this connection.
    pub const LISTENER_CLOSED: u32 = 7;

    /// What `code` says, for errors and logs (`""` for a code this version does not know).
    pub fn describe(code: u32) -> &'static str {
        match code {
            BAD_FRAME => "a malformed frame",
            CREDIT => "a credit overrun",
            TOO_LARGE => "a fragment or message over the limits",
            SEQUENCE => "fragments out of order, or data after FIN",
            UNSUPPORTED => "a frame of a feature not negotiated",
            TIMEOUT => "this side was silent past the peer's timeout",
            LISTENER_CLOSED => "its listener closed before anyone accepted this connection",
            _ => "",
        }
    }
}
