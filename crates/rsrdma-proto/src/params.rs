//! Negotiation: the `Params` each side announces, their 32-byte encoding, and `settle`.
//!
//! ```text
//! offset size field
//!  0     4    magic           "RSCP"
//!  4     1    major version   1 (a peer with another major is refused)
//!  5     1    minor version   0 (the settled minor is the smaller one)
//!  6     2    reserved        sent 0, ignored (room for minor versions)
//!  8     4    slot_size       bytes of each receive slot, header included
//! 12     2    recv_slots      receive slots posted = initial credits for the peer
//! 14     2    inline_size     the sender's inline limit (informational: inline is invisible
//!                             on the wire)
//! 16     4    max_message     largest message this side accepts
//! 20     4    features        bit set; the settled set is the intersection (bit 2 only
//!                             with bit 0); bit 3 announces a shared receive pool and is
//!                             read from the peer's set, not intersected
//! 24     4    rdv_threshold   with FEATURE_RENDEZVOUS: messages of at least this many bytes
//!                             may go by rendezvous (≥ 1); the settled one is the larger
//!                             (sent 0 and ignored without the feature)
//! 28     4    reserved        sent 0, ignored
//! ```
//! All fields little-endian. 32 bytes fit in rdma_cm private data as well as in the TCP
//! handshake.

use crate::error::ProtoError;
use crate::frame::HEADER_LEN;
use std::time::Duration;

/// Bytes of an encoded `Params`.
pub const PARAMS_LEN: usize = 32;
/// The magic at the start of an encoded `Params`.
pub const MAGIC: [u8; 4] = *b"RSCP";
/// The protocol's major version.
pub const VERSION_MAJOR: u8 = 1;
/// The protocol's minor version (1.1: rendezvous; 1.2: withdrawal of an offered message).
pub const VERSION_MINOR: u8 = 2;
/// Feature bit of rendezvous: RTS/DONE frames, the receiver pulling large messages with
/// RDMA READ. Settled only when both sides offer it.
pub const FEATURE_RENDEZVOUS: u32 = 1 << 0;
/// Feature bit of striped connections: this connection may be a rail of one (section 9 of
/// the protocol; `rails`). The core does nothing with it: the layer above reads the settled
/// bit to know whether the peer speaks stripes, and talks to a peer without it as one plain
/// connection.
pub const FEATURE_RAILS: u32 = 1 << 1;
/// Feature bit of withdrawal (with rendezvous only): a sender whose call gave up after its
/// RTS went out asks the receiver to drop the message (WITHDRAW); the receiver answers
/// WITHDRAWN when it had not begun to read it (the sender's memory is free, nothing of the
/// message was delivered), or lets its read finish and sends DONE as usual. So a sender's
/// timeout can mean "not sent" even for a message the peer was told about.
pub const FEATURE_WITHDRAW: u32 = 1 << 2;
/// Announcement bit (not negotiated: [`Settled::peer_pooled`] reads the peer's): this side
/// receives from a pool shared with other connections (a listener's shared receive queue),
/// so the peer's frames may wait in RNR retries while the pool is empty. The peer then does
/// not count its own silence against this side while its sends make no progress
/// (`Conn::handle_timeout`): its PINGs wait behind those sends, so this side cannot answer
/// them. A peer that does not know the bit ignores it.
pub const FEATURE_SHARED_POOL: u32 = 1 << 3;
/// Features this version implements.
pub const FEATURES_KNOWN: u32 = FEATURE_RENDEZVOUS | FEATURE_RAILS | FEATURE_WITHDRAW;
/// Default rendezvous threshold (256 KiB): below it a copy through the slots is cheaper than
/// registering the message and a round trip for RTS/READ/DONE.
pub const DEFAULT_RDV_THRESHOLD: u32 = 256 * 1024;
/// Receive slots kept for control frames: data may spend a credit only while more remain.
pub const CONTROL_RESERVE: u16 = 3;
/// Smallest slot: a header plus a useful payload.
pub const MIN_SLOT_SIZE: u32 = 64;
/// Largest slot (16 MiB); larger messages are fragmented anyway.
pub const MAX_SLOT_SIZE: u32 = 1 << 24;
/// Fewest receive slots: the control reserve plus room for data and credit batching.
pub const MIN_RECV_SLOTS: u16 = 8;
/// Most receive slots.
pub const MAX_RECV_SLOTS: u16 = 32768;
/// Largest inline limit the core stages (bytes per send-queue entry).
pub const MAX_INLINE: u16 = 1024;

/// What one side announces to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Major protocol version.
    pub major: u8,
    /// Minor protocol version.
    pub minor: u8,
    /// Bytes of each receive slot (header included).
    pub slot_size: u32,
    /// Receive slots this side posts: the peer's initial credits.
    pub recv_slots: u16,
    /// This side's inline limit (informational).
    pub inline_size: u16,
    /// Largest message this side accepts.
    pub max_message: u32,
    /// Feature bits.
    pub features: u32,
    /// With [`FEATURE_RENDEZVOUS`]: the smallest message this side wants sent by rendezvous
    /// (0 without the feature).
    pub rdv_threshold: u32,
}

impl Params {
    /// The 32 wire bytes.
    pub fn encode(&self) -> [u8; PARAMS_LEN] {
        let mut b = [0u8; PARAMS_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = self.major;
        b[5] = self.minor;
        b[8..12].copy_from_slice(&self.slot_size.to_le_bytes());
        b[12..14].copy_from_slice(&self.recv_slots.to_le_bytes());
        b[14..16].copy_from_slice(&self.inline_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.max_message.to_le_bytes());
        b[20..24].copy_from_slice(&self.features.to_le_bytes());
        b[24..28].copy_from_slice(&self.rdv_threshold.to_le_bytes());
        b
    }

    /// Decodes and range-checks; any malformed input is an error, never a panic.
    ///
    /// Only the structure is checked here; a different major version decodes (so that
    /// `settle` can say which version the peer speaks) as long as the magic matches.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        if bytes.len() != PARAMS_LEN {
            return Err(ProtoError::BadParams {
                reason: "not 32 bytes long",
            });
        }
        if bytes[0..4] != MAGIC {
            return Err(ProtoError::BadParams {
                reason: "bad magic",
            });
        }
        let le16 = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let le32 =
            |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let p = Self {
            major: bytes[4],
            minor: bytes[5],
            slot_size: le32(8),
            recv_slots: le16(12),
            inline_size: le16(14),
            max_message: le32(16),
            features: le32(20),
            rdv_threshold: le32(24),
        };
        if p.major == VERSION_MAJOR {
            p.check()?;
        }
        Ok(p)
    }

    /// The range rules of this major version.
    pub fn check(&self) -> Result<(), ProtoError> {
        let bad = |reason| Err(ProtoError::BadParams { reason });
        if !(MIN_SLOT_SIZE..=MAX_SLOT_SIZE).contains(&self.slot_size) {
            return bad("slot_size outside 64 B ..= 16 MiB");
        }
        if !(MIN_RECV_SLOTS..=MAX_RECV_SLOTS).contains(&self.recv_slots) {
            return bad("recv_slots outside 8 ..= 32768");
        }
        if self.max_message == 0 {
            return bad("max_message is 0");
        }
        if self.features & FEATURE_RENDEZVOUS != 0 && self.rdv_threshold == 0 {
            return bad("rendezvous offered with a threshold of 0");
        }
        Ok(())
    }
}

/// What both sides agreed on. `settle(a, b)` and `settle(b, a)` give the same symmetric
/// fields (`minor`, `frame_size`, `max_message`, `features`) and mirrored slot counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The smaller minor version.
    pub minor: u8,
    /// Largest frame (header included) either side sends: the smaller slot size, so a frame
    /// always fits the receiver's slot and the sender's.
    pub frame_size: u32,
    /// Receive slots this side posts (the peer's initial credits).
    pub local_recv_slots: u16,
    /// Receive slots the peer posts: this side's initial credits.
    pub peer_recv_slots: u16,
    /// The smaller maximum message.
    pub max_message: u32,
    /// The intersection of both feature sets (and of what this version implements).
    pub features: u32,
    /// With rendezvous settled: the larger of both thresholds; messages of at least this
    /// many bytes may go by rendezvous. The larger, because either side may judge a copy
    /// cheaper than a registration below its own threshold (say, a slow `ibv_reg_mr`);
    /// rendezvous is used only where both agree it pays. 0 when rendezvous is not settled.
    pub rdv_threshold: u32,
    /// The peer announced [`FEATURE_SHARED_POOL`]: its receives come from a shared pool.
    pub peer_pooled: bool,
}

impl Settled {
    /// Payload bytes per frame.
    pub fn frame_payload(&self) -> u32 {
        self.frame_size - HEADER_LEN as u32
    }

    /// The rendezvous threshold, when both sides offered rendezvous.
    pub fn rendezvous(&self) -> Option<u32> {
        (self.features & FEATURE_RENDEZVOUS != 0).then_some(self.rdv_threshold)
    }

    /// Whether a sender may ask for an offered message back ([`FEATURE_WITHDRAW`]).
    pub fn withdraw(&self) -> bool {
        self.features & FEATURE_WITHDRAW != 0
    }
}

/// Combines the local announcement with the peer's. Both sides compute the same agreement,
/// so no option has to match by luck.
pub fn settle(local: &Params, peer: &Params) -> Result<Settled, ProtoError> {
    if peer.major != VERSION_MAJOR || local.major != VERSION_MAJOR {
        return Err(ProtoError::IncompatibleVersion {
            local: local.major,
            peer: peer.major,
        });
    }
    local.check()?;
    peer.check()?;
    let mut features = local.features & peer.features & FEATURES_KNOWN;
    if features & FEATURE_RENDEZVOUS == 0 {
        // Withdrawal answers RTSs: nothing to withdraw without them.
        features &= !FEATURE_WITHDRAW;
    }
    let rdv_threshold = if features & FEATURE_RENDEZVOUS != 0 {
        local.rdv_threshold.max(peer.rdv_threshold)
    } else {
        0
    };
    Ok(Settled {
        minor: local.minor.min(peer.minor),
        frame_size: local.slot_size.min(peer.slot_size),
        local_recv_slots: local.recv_slots,
        peer_recv_slots: peer.recv_slots,
        max_message: local.max_message.min(peer.max_message),
        features,
        rdv_threshold,
        peer_pooled: peer.features & FEATURE_SHARED_POOL != 0,
    })
}

/// Local options of one connection. The driver fills `inline_size` and `sq_depth` from what
/// the queue pair actually granted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Bytes per slot (send and receive), header included. Default [`DEFAULT_SLOT_SIZE`]
    /// (32 KiB of payload).
    pub slot_size: u32,
    /// Receive slots. Default 32.
    pub recv_slots: u16,
    /// Send slots. Default 32.
    pub send_slots: u16,
    /// Send queue depth (`max_send_wr`). Default 64.
    pub sq_depth: u16,
    /// Signal at least every this many send WRs (capped at `sq_depth / 2`). Default 16.
    pub signal_interval: u16,
    /// Frames up to this many bytes (header included) are sent inline. Default 128: a
    /// 64-byte message and its 16-byte header go as one inline post.
    pub inline_size: u16,
    /// Largest message accepted and sent. Default 16 MiB.
    pub max_message: u32,
    /// Send a PING after this long without hearing from the peer; `None` turns keepalive and
    /// dead-peer detection off. Default 1 s.
    pub keepalive: Option<Duration>,
    /// Declare the peer dead after this long without hearing from it. Default 5 s.
    pub peer_timeout: Duration,
    /// Feature bits to offer. Default none.
    pub features: u32,
    /// With [`FEATURE_RENDEZVOUS`] offered: the smallest message to send by rendezvous.
    /// Default 256 KiB.
    pub rdv_threshold: u32,
    /// The longest RDMA READ to post (the device's `max_msg_sz`): a rendezvous message
    /// longer than this is read in pieces of at most this many bytes, one after another.
    /// Default [`DEFAULT_MAX_READ`].
    pub max_read: u32,
}

/// The longest READ when the device does not say ([`Config::max_read`]): 1 GiB, what mlx5
/// devices report as `max_msg_sz` (the InfiniBand specification allows 2 GiB).
pub const DEFAULT_MAX_READ: u32 = 1 << 30;

/// The default slot: a 16-byte header and exactly 32 KiB of payload, so that a message of a
/// power of two from 32 KiB up fills whole frames (a 64 KiB message is 2 frames; with 32 KiB
/// slots it spilled a third of 32 bytes).
pub const DEFAULT_SLOT_SIZE: u32 = 32 * 1024 + crate::frame::HEADER_LEN as u32;

impl Default for Config {
    fn default() -> Self {
        Self {
            slot_size: DEFAULT_SLOT_SIZE,
            recv_slots: 32,
            send_slots: 32,
            sq_depth: 64,
            signal_interval: 16,
            inline_size: 128,
            max_message: 16 << 20,
            keepalive: Some(Duration::from_secs(1)),
            peer_timeout: Duration::from_secs(5),
            features: 0,
            rdv_threshold: DEFAULT_RDV_THRESHOLD,
            max_read: DEFAULT_MAX_READ,
        }
    }
}

macro_rules! setter {
    ($name:ident, $field:ident, $ty:ty) => {
        #[doc = concat!("Sets `", stringify!($field), "`.")]
        pub fn $name(mut self, v: $ty) -> Self {
            self.$field = v;
            self
        }
    };
}

impl Config {
    setter!(with_slot_size, slot_size, u32);
    setter!(with_recv_slots, recv_slots, u16);
    setter!(with_send_slots, send_slots, u16);
    setter!(with_sq_depth, sq_depth, u16);
    setter!(with_signal_interval, signal_interval, u16);
    setter!(with_inline_size, inline_size, u16);
    setter!(with_max_message, max_message, u32);
    setter!(with_keepalive, keepalive, Option<Duration>);
    setter!(with_peer_timeout, peer_timeout, Duration);
    setter!(with_features, features, u32);
    setter!(with_rdv_threshold, rdv_threshold, u32);
    setter!(with_max_read, max_read, u32);

    /// The announcement for the handshake.
    pub fn params(&self) -> Params {
        Params {
            major: VERSION_MAJOR,
            minor: VERSION_MINOR,
            slot_size: self.slot_size,
            recv_slots: self.recv_slots,
            inline_size: self.inline_size,
            max_message: self.max_message,
            features: self.features,
            rdv_threshold: if self.features & FEATURE_RENDEZVOUS != 0 {
                self.rdv_threshold
            } else {
                0
            },
        }
    }

    /// Checks the ranges (those of `Params` plus the local-only fields).
    pub fn check(&self) -> Result<(), ProtoError> {
        self.params().check()?;
        let bad = |reason| Err(ProtoError::BadParams { reason });
        if self.send_slots < 2 {
            return bad("send_slots below 2");
        }
        if self.sq_depth < 2 {
            return bad("sq_depth below 2");
        }
        if self.signal_interval == 0 {
            return bad("signal_interval is 0");
        }
        if self.inline_size > MAX_INLINE {
            return bad("inline_size over 1024");
        }
        if self.max_read == 0 {
            return bad("max_read is 0");
        }
        if let Some(k) = self.keepalive {
            if k.is_zero() || self.peer_timeout <= k {
                return bad("keepalive must be non-zero and shorter than peer_timeout");
            }
        }
        Ok(())
    }

    /// Bytes of slot memory one connection needs (send plus receive slots).
    pub fn slot_memory(&self) -> usize {
        (self.send_slots as usize + self.recv_slots as usize) * self.slot_size as usize
    }
}
