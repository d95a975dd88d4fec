//! The packets two queue pairs exchange over a reliable, ordered pipe: one per message, with a
//! fixed 48-byte header, little-endian.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | kind: 1 SEND, 2 WRITE, 3 READ request, 4 READ response, 5 compare-and-swap, 6 fetch-and-add, 7 atomic response, 8 ACK, 9 NAK, 10 UD datagram, 11 SEND with invalidate |
//! | 1 | 1 | flags: bit 0 immediate data present, bit 1 solicited event, bit 2 an acknowledgement carried (SEND, SEND with invalidate, WRITE, READ request) |
//! | 2 | 2 | NAK code (1 RNR, 2 invalid request, 3 remote access, 4 remote operation, 5 dropped) |
//! | 4 | 4 | destination QP number (a dropped-request NAK: the QP that dropped it) |
//! | 8 | 4 | PSN: the request's (a response or ACK names the request it answers) |
//! | 12 | 4 | payload length |
//! | 16 | 4 | immediate data; a READ request's length; an RNR NAK's timer in µs |
//! | 20 | 4 | remote key (the key to invalidate, for a SEND with invalidate); a datagram's Q_Key |
//! | 24 | 8 | remote address; an atomic response's old value; a datagram's source QP |
//! | 32 | 8 | compare (compare-and-swap) or add (fetch-and-add); the PSN a carried acknowledgement names (its low 4 bytes) |
//! | 40 | 8 | swap (compare-and-swap) |
//!
//! then the payload (SEND, WRITE, READ response, datagram).
//!
//! A request may carry an acknowledgement of the requests its receiver sent the other way
//! ([`Packet::ack`]): the same as an ACK packet of that PSN just before it, with one packet
//! fewer (a ping-pong's answers carry their ACKs).

/// The header's length.
pub const HEADER_LEN: usize = 48;

/// Why an RDMA request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nak {
    /// No receive posted: retry after `timer_us`.
    Rnr {
        /// The responder's minimum RNR timer.
        timer_us: u32,
    },
    /// The request is not allowed on the responder's QP, or malformed for it.
    InvalidRequest,
    /// The remote key or range was refused.
    RemoteAccess,
    /// The responder could not execute it.
    RemoteOperation,
    /// Not an IB NAK: the responder dropped the request unexecuted (its queue pair is not in
    /// RTR or RTS, or is gone), as a NIC drops it. A fabric tells the requester nothing and
    /// its transport timer runs out; soft0's pipes lose nothing, so the responder's device
    /// says so, and the requester acts as its timer would: it sends again after its timeout,
    /// at most `retry_cnt` times. The packet's `dest_qpn` names the queue pair that dropped
    /// the request (a queue pair in RESET or INIT may not know its requester's number): the
    /// requester's device finds the queue pair connected to it.
    Dropped,
}

/// What a packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    /// A SEND (its bytes are the payload).
    Send {
        /// Immediate data.
        imm: Option<u32>,
    },
    /// A SEND with invalidate (its bytes are the payload): the responder invalidates its
    /// window `rkey` once the bytes landed.
    SendInv {
        /// The key to invalidate.
        rkey: u32,
    },
    /// An RDMA WRITE (its bytes are the payload).
    Write {
        /// Where.
        addr: u64,
        /// With which key.
        rkey: u32,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// An RDMA READ request.
    ReadRequest {
        /// Where.
        addr: u64,
        /// With which key.
        rkey: u32,
        /// How many bytes.
        len: u32,
    },
    /// A READ's data (the payload).
    ReadResponse,
    /// A compare-and-swap request.
    CompareSwap {
        /// The word.
        addr: u64,
        /// With which key.
        rkey: u32,
        /// Compared with the word.
        compare: u64,
        /// Stored if equal.
        swap: u64,
    },
    /// A fetch-and-add request.
    FetchAdd {
        /// The word.
        addr: u64,
        /// With which key.
        rkey: u32,
        /// Added.
        add: u64,
    },
    /// An atomic's answer: the word before.
    AtomicResponse {
        /// The old value.
        old: u64,
    },
    /// The request (and every one before it) was executed.
    Ack,
    /// The request was refused.
    Nak(Nak),
    /// A UD datagram (its bytes are the payload): unacknowledged, dropped when it cannot be
    /// delivered.
    Datagram {
        /// The sending QP.
        src_qpn: u32,
        /// The Q_Key it carries: the receiving QP takes it only if it equals its own.
        qkey: u32,
        /// Immediate data.
        imm: Option<u32>,
    },
}

impl PacketKind {
    /// Whether a packet of this kind may carry an acknowledgement ([`Packet::ack`]): the
    /// requests whose header leaves the room for it.
    pub fn may_carry_ack(&self) -> bool {
        // An atomic's header is full (compare and swap, or add, at offsets 32 and 40).
        self.is_request()
            && !matches!(
                self,
                PacketKind::CompareSwap { .. } | PacketKind::FetchAdd { .. }
            )
    }

    /// Whether packets of this kind carry bytes.
    pub fn carries_payload(&self) -> bool {
        matches!(
            self,
            PacketKind::Send { .. }
                | PacketKind::SendInv { .. }
                | PacketKind::Write { .. }
                | PacketKind::ReadResponse
                | PacketKind::Datagram { .. }
        )
    }

    /// Whether it asks something of the peer (rather than answering).
    pub fn is_request(&self) -> bool {
        matches!(
            self,
            PacketKind::Send { .. }
                | PacketKind::SendInv { .. }
                | PacketKind::Write { .. }
                | PacketKind::ReadRequest { .. }
                | PacketKind::CompareSwap { .. }
                | PacketKind::FetchAdd { .. }
        )
    }
}

/// One packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The QP it is for.
    pub dest_qpn: u32,
    /// The request's PSN (answers carry the request's).
    pub psn: u32,
    /// What it is.
    pub kind: PacketKind,
    /// Its bytes (SEND, WRITE, READ response).
    pub payload: Payload,
    /// The sender asked for a solicited event (a SEND, a WRITE with immediate data, a
    /// datagram): the receive's completion wakes a CQ armed for solicited completions only.
    pub solicited: bool,
    /// An acknowledgement carried by a request ([`PacketKind::may_carry_ack`]): every request
    /// its receiver sent up to this PSN was executed, as an ACK packet of it would say.
    pub ack: Option<u32>,
}

/// The longest payload a packet holds in itself (an acknowledgement's none, a small
/// message's few bytes): no allocation for the packets that make up a latency test.
pub const INLINE_PAYLOAD: usize = 40;

/// A packet's bytes: a short payload in the packet itself, a longer one shared rather than
/// copied: a request kept for a retransmission after an RNR NAK and the copy on its way to
/// the wire are one buffer (a clone costs a reference count, not the payload's length).
#[derive(Clone)]
pub struct Payload(Repr);

#[derive(Clone)]
enum Repr {
    /// At most [`INLINE_PAYLOAD`] bytes, in place.
    Inline {
        len: u8,
        bytes: [u8; INLINE_PAYLOAD],
    },
    Shared(std::sync::Arc<Vec<u8>>),
}

impl Payload {
    /// A payload of a copy of `bytes` (kept in place when short enough).
    pub fn from_slice(bytes: &[u8]) -> Payload {
        if bytes.len() <= INLINE_PAYLOAD {
            Payload::from_fn(bytes.len(), |to| to.copy_from_slice(bytes))
        } else {
            Payload(Repr::Shared(std::sync::Arc::new(bytes.to_vec())))
        }
    }

    /// A payload of `len` bytes that `fill` writes, in place when short enough (no copy
    /// through another buffer). `fill` gets exactly `len` bytes.
    #[inline]
    pub fn from_fn(len: usize, fill: impl FnOnce(&mut [u8])) -> Payload {
        if len <= INLINE_PAYLOAD {
            let mut p = Payload(Repr::Inline {
                len: len as u8,
                bytes: [0u8; INLINE_PAYLOAD],
            });
            if let Repr::Inline { bytes, .. } = &mut p.0 {
                fill(&mut bytes[..len]);
            }
            p
        } else {
            let mut v = vec![0u8; len];
            fill(&mut v);
            Payload(Repr::Shared(std::sync::Arc::new(v)))
        }
    }

    /// The bytes, as a vector (copied if another packet shares them, or if they are short).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Repr::Inline { len, bytes } => bytes[..usize::from(len)].to_vec(),
            Repr::Shared(v) => {
                std::sync::Arc::try_unwrap(v).unwrap_or_else(|shared| (*shared).clone())
            }
        }
    }

    /// Whether its bytes live in a buffer of their own (a long payload, or one made from a
    /// [`PayloadBuf`]) that a device may take back once it is done with the packet
    /// ([`Payload::try_into_buf`]).
    pub fn has_buffer(&self) -> bool {
        matches!(self.0, Repr::Shared(_))
    }

    /// Whether another packet (or anything else) shares these bytes.
    pub fn is_shared(&self) -> bool {
        match &self.0 {
            Repr::Inline { .. } => false,
            Repr::Shared(v) => std::sync::Arc::strong_count(v) > 1,
        }
    }

    /// Its buffer, emptied, for the next payload, if it has one ([`Payload::has_buffer`])
    /// and nothing else shares it: the bytes' memory and the shared box around them, so a
    /// device that reuses it allocates nothing per packet.
    ///
    /// # Errors
    /// The payload itself, when it is short (its bytes live in the packet) or shared.
    pub fn try_into_buf(self) -> Result<PayloadBuf, Payload> {
        match self.0 {
            Repr::Shared(mut v) => match std::sync::Arc::get_mut(&mut v) {
                Some(bytes) => {
                    bytes.clear();
                    Ok(PayloadBuf(v))
                }
                None => Err(Payload(Repr::Shared(v))),
            },
            inline => Err(Payload(inline)),
        }
    }
}

/// The memory of a payload being filled: a buffer no packet holds yet. A device keeps those
/// of the payloads it is done with ([`Payload::try_into_buf`]) and fills them again, so that
/// neither the bytes' buffer nor the shared box around it is allocated per packet.
pub struct PayloadBuf(std::sync::Arc<Vec<u8>>);

impl PayloadBuf {
    /// An empty buffer with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> PayloadBuf {
        PayloadBuf(std::sync::Arc::new(Vec::with_capacity(capacity)))
    }

    /// The bytes, to fill. Nothing else holds them (a `PayloadBuf` is made only whole), so
    /// this never copies.
    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        std::sync::Arc::make_mut(&mut self.0)
    }

    /// The bytes written so far.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many bytes it holds without growing.
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }
}

impl std::fmt::Debug for PayloadBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PayloadBuf")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl From<PayloadBuf> for Payload {
    /// The buffer's bytes, where they are (even a short one's: its buffer is kept for reuse).
    fn from(b: PayloadBuf) -> Payload {
        Payload(Repr::Shared(b.0))
    }
}

impl Default for Payload {
    fn default() -> Payload {
        Payload::from_slice(&[])
    }
}

impl From<Vec<u8>> for Payload {
    /// Takes the vector's memory, or copies a short one's bytes into place.
    fn from(v: Vec<u8>) -> Payload {
        if v.len() <= INLINE_PAYLOAD {
            Payload::from_slice(&v)
        } else {
            Payload(Repr::Shared(std::sync::Arc::new(v)))
        }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Shared(v) => v,
        }
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Payload").field(&&**self).finish()
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        **self == **other
    }
}

impl Eq for Payload {}

impl PartialEq<Vec<u8>> for Payload {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == **other
    }
}

impl PartialEq<[u8]> for Payload {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

/// A packet that breaks the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed soft-RDMA packet: {}", self.0)
    }
}

impl std::error::Error for WireError {}

impl Packet {
    /// The notice that queue pair `by_qpn` dropped request `psn` unexecuted
    /// ([`Nak::Dropped`]: its `dest_qpn` names the queue pair that dropped it).
    pub fn dropped(by_qpn: u32, psn: u32) -> Packet {
        Packet {
            solicited: false,
            dest_qpn: by_qpn,
            psn,
            kind: PacketKind::Nak(Nak::Dropped),
            payload: Payload::default(),
            ack: None,
        }
    }

    /// The packet's bytes: header, then payload.
    pub fn encode(&self) -> Vec<u8> {
        let h = self.header();
        let mut v = Vec::with_capacity(HEADER_LEN + self.payload.len());
        v.extend_from_slice(&h);
        v.extend_from_slice(&self.payload);
        v
    }

    /// The packet's header, which the payload follows on the wire: a writer can send the two
    /// without copying the payload into one buffer.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        let (kind, flags, code, imm_or_len, rkey, a, b, c) = match self.kind {
            PacketKind::Send { imm } => {
                (1u8, imm.is_some() as u8, 0u16, imm.unwrap_or(0), 0, 0, 0, 0)
            }
            PacketKind::SendInv { rkey } => (11, 0, 0, 0, rkey, 0, 0, 0),
            PacketKind::Write { addr, rkey, imm } => (
                2,
                imm.is_some() as u8,
                0,
                imm.unwrap_or(0),
                rkey,
                addr,
                0,
                0,
            ),
            PacketKind::ReadRequest { addr, rkey, len } => (3, 0, 0, len, rkey, addr, 0, 0),
            PacketKind::ReadResponse => (4, 0, 0, 0, 0, 0, 0, 0),
            PacketKind::CompareSwap {
                addr,
                rkey,
                compare,
                swap,
            } => (5, 0, 0, 0, rkey, addr, compare, swap),
            PacketKind::FetchAdd { addr, rkey, add } => (6, 0, 0, 0, rkey, addr, add, 0),
            PacketKind::AtomicResponse { old } => (7, 0, 0, 0, 0, old, 0, 0),
            PacketKind::Ack => (8, 0, 0, 0, 0, 0, 0, 0),
            PacketKind::Nak(n) => {
                let (code, timer) = match n {
                    Nak::Rnr { timer_us } => (1, timer_us),
                    Nak::InvalidRequest => (2, 0),
                    Nak::RemoteAccess => (3, 0),
                    Nak::RemoteOperation => (4, 0),
                    Nak::Dropped => (5, 0),
                };
                (9, 0, code, timer, 0, 0, 0, 0)
            }
            PacketKind::Datagram { src_qpn, qkey, imm } => (
                10,
                imm.is_some() as u8,
                0,
                imm.unwrap_or(0),
                qkey,
                u64::from(src_qpn),
                0,
                0,
            ),
        };
        // Only a kind that leaves offset 32 free carries an acknowledgement there (the queue
        // pair attaches one to no other).
        debug_assert!(self.ack.is_none() || self.kind.may_carry_ack());
        let (ack, b) = match self.ack {
            Some(psn) if self.kind.may_carry_ack() => (4, u64::from(psn)),
            _ => (0, b),
        };
        h[0] = kind;
        h[1] = flags | if self.solicited { 2 } else { 0 } | ack;
        h[2..4].copy_from_slice(&code.to_le_bytes());
        h[4..8].copy_from_slice(&self.dest_qpn.to_le_bytes());
        h[8..12].copy_from_slice(&self.psn.to_le_bytes());
        h[12..16].copy_from_slice(&(self.payload.len() as u32).to_le_bytes());
        h[16..20].copy_from_slice(&imm_or_len.to_le_bytes());
        h[20..24].copy_from_slice(&rkey.to_le_bytes());
        h[24..32].copy_from_slice(&a.to_le_bytes());
        h[32..40].copy_from_slice(&b.to_le_bytes());
        h[40..48].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// The payload length a header announces (to size the read of what follows it).
    pub fn payload_len(header: &[u8; HEADER_LEN]) -> usize {
        u32::from_le_bytes([header[12], header[13], header[14], header[15]]) as usize
    }

    /// Parses one packet (exactly `bytes`).
    ///
    /// # Errors
    /// [`WireError`] for a short header, a payload length that does not match, an unknown
    /// kind or NAK code, or a payload on a kind that carries none.
    pub fn decode(bytes: &[u8]) -> Result<Packet, WireError> {
        let h = bytes.get(..HEADER_LEN).ok_or(WireError("short header"))?;
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(h);
        Packet::decode_parts(&header, Payload::from_slice(&bytes[HEADER_LEN..]))
    }

    /// Parses a packet read as its header and its payload (which becomes the packet's).
    ///
    /// # Errors
    /// As [`Packet::decode`].
    pub fn decode_parts(h: &[u8; HEADER_LEN], payload: Payload) -> Result<Packet, WireError> {
        let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(b)
        };
        if payload.len() != u32_at(12) as usize {
            return Err(WireError("payload length"));
        }
        let imm = (h[1] & 1 != 0).then(|| u32_at(16));
        let solicited = h[1] & 2 != 0;
        let (rkey, a, b, c) = (u32_at(20), u64_at(24), u64_at(32), u64_at(40));
        let kind = match h[0] {
            1 => PacketKind::Send { imm },
            2 => PacketKind::Write { addr: a, rkey, imm },
            3 => PacketKind::ReadRequest {
                addr: a,
                rkey,
                len: u32_at(16),
            },
            4 => PacketKind::ReadResponse,
            5 => PacketKind::CompareSwap {
                addr: a,
                rkey,
                compare: b,
                swap: c,
            },
            6 => PacketKind::FetchAdd {
                addr: a,
                rkey,
                add: b,
            },
            7 => PacketKind::AtomicResponse { old: a },
            8 => PacketKind::Ack,
            9 => PacketKind::Nak(match u16_at(2) {
                1 => Nak::Rnr {
                    timer_us: u32_at(16),
                },
                2 => Nak::InvalidRequest,
                3 => Nak::RemoteAccess,
                4 => Nak::RemoteOperation,
                5 => Nak::Dropped,
                _ => return Err(WireError("NAK code")),
            }),
            10 => PacketKind::Datagram {
                src_qpn: u32::try_from(a).map_err(|_| WireError("source QP"))?,
                qkey: rkey,
                imm,
            },
            11 => PacketKind::SendInv { rkey },
            _ => return Err(WireError("kind")),
        };
        let carries = kind.carries_payload();
        if !carries && !payload.is_empty() {
            return Err(WireError("a payload on a kind that carries none"));
        }
        let ack = (h[1] & 4 != 0).then(|| u32_at(32));
        if ack.is_some() && (!kind.may_carry_ack() || b >> 32 != 0) {
            return Err(WireError("an acknowledgement on a kind that carries none"));
        }
        Ok(Packet {
            solicited,
            dest_qpn: u32_at(4),
            psn: u32_at(8),
            kind,
            payload,
            ack,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = PacketKind> {
        let imm = prop::option::of(any::<u32>());
        prop_oneof![
            imm.clone().prop_map(|imm| PacketKind::Send { imm }),
            any::<u32>().prop_map(|rkey| PacketKind::SendInv { rkey }),
            (any::<u64>(), any::<u32>(), imm.clone())
                .prop_map(|(addr, rkey, imm)| PacketKind::Write { addr, rkey, imm }),
            (any::<u64>(), any::<u32>(), any::<u32>())
                .prop_map(|(addr, rkey, len)| PacketKind::ReadRequest { addr, rkey, len }),
            Just(PacketKind::ReadResponse),
            (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
                |(addr, rkey, compare, swap)| PacketKind::CompareSwap {
                    addr,
                    rkey,
                    compare,
                    swap
                }
            ),
            (any::<u64>(), any::<u32>(), any::<u64>())
                .prop_map(|(addr, rkey, add)| PacketKind::FetchAdd { addr, rkey, add }),
            any::<u64>().prop_map(|old| PacketKind::AtomicResponse { old }),
            Just(PacketKind::Ack),
            any::<u32>().prop_map(|timer_us| PacketKind::Nak(Nak::Rnr { timer_us })),
            Just(PacketKind::Nak(Nak::InvalidRequest)),
            Just(PacketKind::Nak(Nak::RemoteAccess)),
            Just(PacketKind::Nak(Nak::RemoteOperation)),
            Just(PacketKind::Nak(Nak::Dropped)),
            (any::<u32>(), any::<u32>(), imm)
                .prop_map(|(src_qpn, qkey, imm)| { PacketKind::Datagram { src_qpn, qkey, imm } }),
        ]
    }

    proptest! {
        #[test]
        fn every_packet_decodes_to_itself(
            k in kind(),
            dest_qpn in any::<u32>(),
            psn in any::<u32>(),
            payload in prop::collection::vec(any::<u8>(), 0..64),
            ack in prop::option::of(any::<u32>()),
        ) {
            let carries = k.carries_payload();
            let ack = ack.filter(|_| k.may_carry_ack());
            let p = Packet { dest_qpn, psn, kind: k, payload: if carries { payload } else { Vec::new() }.into(), solicited: carries, ack };
            prop_assert_eq!(Packet::decode(&p.encode()), Ok(p));
        }

        #[test]
        fn garbage_is_refused_or_decodes_without_panicking(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
            let _ = Packet::decode(&bytes);
        }
    }

    #[test]
    fn short_payloads_live_in_the_packet_and_long_ones_are_shared() {
        for len in [0, 1, 8, INLINE_PAYLOAD, INLINE_PAYLOAD + 1, 4096] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let p = Payload::from(bytes.clone());
            assert_eq!(&p[..], &bytes[..], "{len} bytes");
            assert_eq!(Payload::from_slice(&bytes), p, "{len} bytes");
            // A clone shares a long payload's memory; a short one is copied.
            let q = p.clone();
            assert_eq!(p.is_shared(), len > INLINE_PAYLOAD, "{len} bytes");
            assert_eq!(q.clone().into_vec(), bytes, "{len} bytes");
            drop(q);
            assert!(!p.is_shared(), "{len} bytes");
            assert_eq!(p.into_vec(), bytes, "{len} bytes");
        }
        assert!(Payload::default().is_empty());
        assert_eq!(
            format!("{:?}", Payload::from(vec![1, 2])),
            "Payload([1, 2])"
        );
    }

    #[test]
    fn a_payloads_buffer_comes_back_only_when_it_has_one_and_nobody_shares_it() {
        assert!(Payload::from_slice(&[1; INLINE_PAYLOAD])
            .try_into_buf()
            .is_err());
        let mut b = PayloadBuf::with_capacity(8);
        b.bytes_mut().extend_from_slice(&[5; 8]);
        // Even a short one keeps its buffer, to give it back.
        let p = Payload::from(b);
        assert!(p.has_buffer() && p[..] == [5; 8]);
        let at = p.as_ptr();
        let shared = p.clone();
        let p = p.try_into_buf().unwrap_err();
        drop(shared);
        let b = p.try_into_buf().unwrap();
        assert!(b.is_empty() && b.capacity() >= 8);
        assert_eq!(Payload::from(b).as_ptr(), at);
    }

    #[test]
    fn malformed_packets_are_refused() {
        let p = Packet {
            solicited: false,
            dest_qpn: 1,
            psn: 2,
            kind: PacketKind::Send { imm: None },
            payload: vec![1, 2, 3].into(),
            ack: None,
        };
        let mut b = p.encode();
        assert_eq!(
            Packet::decode(&b[..HEADER_LEN - 1]),
            Err(WireError("short header"))
        );
        b.push(0);
        assert_eq!(Packet::decode(&b), Err(WireError("payload length")));
        let mut ack = Packet {
            solicited: false,
            kind: PacketKind::Ack,
            payload: Vec::new().into(),
            ..p
        }
        .encode();
        ack[12] = 1;
        ack.push(9);
        assert_eq!(
            Packet::decode(&ack),
            Err(WireError("a payload on a kind that carries none"))
        );
        ack[0] = 99;
        assert_eq!(Packet::decode(&ack), Err(WireError("kind")));
        // An acknowledgement carried by a kind that has no room for it (an ACK, an atomic),
        // or naming more than a PSN.
        let carried = |kind| {
            let mut b = Packet {
                kind,
                payload: Vec::new().into(),
                ..p.clone()
            }
            .encode();
            b[1] |= 4;
            Packet::decode(&b)
        };
        let refused = Err(WireError("an acknowledgement on a kind that carries none"));
        assert_eq!(carried(PacketKind::Ack), refused);
        let fetch_add = PacketKind::FetchAdd {
            addr: 0,
            rkey: 1,
            add: 1 << 32,
        };
        assert_eq!(carried(fetch_add), refused);
        let mut b = p.encode();
        b[1] |= 4;
        b[32..36].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(Packet::decode(&b).map(|q| q.ack), Ok(Some(7)));
        b[36] = 1;
        assert_eq!(Packet::decode(&b), refused);
    }
}
