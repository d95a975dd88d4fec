//! The handshake's wire format: a pure codec, with no I/O and no verbs calls.
//!
//! Every message is a frame:
//!
//! ```text
//! offset  size  field
//! 0       4     magic "RSRD"
//! 4       1     protocol version: the version that introduced the kind (1 to 3)
//! 5       1     message kind
//! 6       2     reserved, zero
//! 8       4     body length, big-endian (at most MAX_BODY)
//! 12      n     body
//! ```
//!
//! All integers are big-endian. A decoder given too few bytes asks for more; given bytes that
//! cannot be a frame (wrong magic, unknown version or kind, oversized or malformed body) it
//! returns a [`DecodeError`] that says what was wrong, and never panics.
//!
//! # Versions
//! Version 1 has hello, proof, endpoint, regions, sync and abort; version 2 adds keepalive and
//! close; version 3 adds the tag that seals each frame after authentication (see `auth`), and
//! changes what the proofs cover and who proves first. Each frame carries the version that
//! introduced its kind, so an older peer still decodes every message it knows, and older
//! frames decode here (an older peer cannot authenticate with this one: see `auth`).
//!
//! # Limits
//! The limits hold on both sides: [`Message::encode`] refuses a message over a limit (it never
//! truncates) and the decoder refuses a frame over it. The largest region list,
//! [`MAX_REGIONS`] descriptors, is exactly [`MAX_BODY`] bytes of body.

use rsrdma::{Gid, RemoteMemory};
use std::fmt;

/// The frame magic.
pub const MAGIC: [u8; 4] = *b"RSRD";
/// The newest protocol version this build speaks (it decodes every version from 1).
pub const VERSION: u8 = 3;
/// The oldest protocol version this build decodes.
pub const MIN_VERSION: u8 = 1;
/// Frame header length.
pub const HEADER_LEN: usize = 12;
/// Most memory descriptors in one message.
pub const MAX_REGIONS: usize = 4096;
/// Bytes of one memory descriptor on the wire (address, length, rkey).
pub const REGION_LEN: usize = 20;
/// Largest body accepted: exactly a list of [`MAX_REGIONS`] descriptors (the largest
/// message), small enough that a stranger cannot make us allocate much.
pub const MAX_BODY: usize = 2 + MAX_REGIONS * REGION_LEN;
/// Most application parameters in one endpoint.
pub const MAX_PARAMS: usize = u8::MAX as usize;
/// Most bytes of an abort's reason.
pub const MAX_REASON: usize = 1024;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of an authentication proof (HMAC-SHA-256).
pub const PROOF_LEN: usize = 32;
/// Bytes of the tag that seals a frame after authentication (HMAC-SHA-256).
pub const TAG_LEN: usize = 32;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The first four bytes are not "RSRD": the peer is not speaking this protocol.
    #[error("bad magic {0:02x?}: the peer does not speak the rsrdma handshake")]
    BadMagic([u8; 4]),
    /// A protocol version this build does not speak.
    #[error("protocol version {0} is not supported (this side speaks {MIN_VERSION} to {VERSION})")]
    Version(u8),
    /// A message kind unknown in the frame's version.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// The reserved field is not zero.
    #[error("reserved header bits are set ({0:#06x})")]
    Reserved(u16),
    /// A body longer than [`MAX_BODY`].
    #[error("body of {0} bytes exceeds the {MAX_BODY}-byte limit (MAX_BODY)")]
    TooLong(usize),
    /// The body ended before a field.
    #[error("{kind} body truncated: {field} needs {need} more bytes")]
    Truncated {
        /// Message kind.
        kind: &'static str,
        /// The field being read.
        field: &'static str,
        /// Bytes missing.
        need: usize,
    },
    /// Bytes left over after the last field.
    #[error("{kind} body has {extra} trailing bytes")]
    Trailing {
        /// Message kind.
        kind: &'static str,
        /// Bytes left.
        extra: usize,
    },
    /// A field with a value it can never have.
    #[error("{kind}: invalid {field}: {why}")]
    Invalid {
        /// Message kind.
        kind: &'static str,
        /// The field.
        field: &'static str,
        /// Why.
        why: String,
    },
}

/// Why a message cannot be encoded: it breaks a limit the peer's decoder would enforce.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A list or text longer than the wire format allows.
    #[error("{kind}: {len} {what} exceed the limit of {limit} ({limit_name})")]
    TooLarge {
        /// Message kind.
        kind: &'static str,
        /// What is counted (`regions`, `parameters`, `reason bytes`).
        what: &'static str,
        /// How many there are.
        len: usize,
        /// The most allowed.
        limit: usize,
        /// The constant that sets the limit.
        limit_name: &'static str,
    },
}

/// Which end of the handshake a message comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that connected.
    Client,
    /// The side that accepted.
    Server,
}

/// The opening message of each side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Who sends it.
    pub role: Role,
    /// The sender requires the peer to prove knowledge of the shared secret.
    pub auth_required: bool,
    /// A fresh random nonce, for the challenge–response.
    pub nonce: [u8; NONCE_LEN],
}

/// Proof of knowing the shared secret: HMAC over both nonces (see `auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// The HMAC-SHA-256 tag.
    pub tag: [u8; PROOF_LEN],
}

/// A queue pair and what it can do: each side's offer; both then settle on the minimum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number.
    pub qp_num: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID (RoCE, or across subnets).
    pub gid: Gid,
    /// The sender's local GID index (informational).
    pub gid_index: u8,
    /// Path MTU in bytes (256..=4096, a power of two).
    pub mtu: u16,
    /// Transport: 0 RC, 1 UC, 2 UD.
    pub qp_type: u8,
    /// Send-queue depth.
    pub send_depth: u32,
    /// Receive-queue depth.
    pub recv_depth: u32,
    /// Inline bytes per send.
    pub max_inline: u32,
    /// RDMA reads/atomics the sender initiates at once.
    pub max_rd_atomic: u8,
    /// RDMA reads/atomics the sender serves at once.
    pub max_dest_rd_atomic: u8,
    /// Application parameters both sides must agree on (message size, iterations…), as
    /// opaque `(key, value)` pairs compared by the layer above.
    pub params: Vec<(u16, u64)>,
}

impl From<&Endpoint> for rsrdma::QpEndpoint {
    /// What `Qp::connect` needs of a peer's endpoint.
    fn from(e: &Endpoint) -> Self {
        rsrdma::QpEndpoint {
            qp_num: e.qp_num,
            psn: e.psn,
            lid: e.lid,
            gid: e.gid,
        }
    }
}

/// Memory the sender exposes to the peer, in the order it registered it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Regions(pub Vec<RemoteMemory>);

/// A message of the handshake and of the control channel that stays open after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Opening message.
    Hello(Hello),
    /// Authentication proof.
    Proof(Proof),
    /// Queue-pair endpoint and capabilities.
    Endpoint(Endpoint),
    /// Memory descriptors.
    Regions(Regions),
    /// A barrier or close step: both sides send it and wait for the other's.
    Sync(u32),
    /// The sender gives up, and says why (UTF-8, at most [`MAX_REASON`] bytes; see
    /// [`Message::abort`]).
    Abort(String),
    /// The sender is alive (version 2). Carries nothing; any message proves liveness.
    Keepalive,
    /// The sender is closing the connection and will send nothing more (version 2).
    Close,
    /// After authentication, every frame is followed by this one: HMAC-SHA-256 under the
    /// session key over the direction, the frame's sequence number and its bytes (version 3).
    /// The channel adds and checks it; users never send it.
    Tag([u8; TAG_LEN]),
}

/// The kind of a [`Message`], as its frame header names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageKind {
    /// [`Message::Hello`].
    Hello = 1,
    /// [`Message::Proof`].
    Proof = 2,
    /// [`Message::Endpoint`].
    Endpoint = 3,
    /// [`Message::Regions`].
    Regions = 4,
    /// [`Message::Sync`].
    Sync = 5,
    /// [`Message::Abort`].
    Abort = 6,
    /// [`Message::Keepalive`].
    Keepalive = 7,
    /// [`Message::Close`].
    Close = 8,
    /// [`Message::Tag`].
    Tag = 9,
}

impl MessageKind {
    /// The kind with header code `code` in a frame of protocol `version`.
    pub fn from_code(code: u8, version: u8) -> Option<MessageKind> {
        let kind = match code {
            1 => MessageKind::Hello,
            2 => MessageKind::Proof,
            3 => MessageKind::Endpoint,
            4 => MessageKind::Regions,
            5 => MessageKind::Sync,
            6 => MessageKind::Abort,
            7 => MessageKind::Keepalive,
            8 => MessageKind::Close,
            9 => MessageKind::Tag,
            _ => return None,
        };
        (kind.since_version() <= version).then_some(kind)
    }

    /// The header code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The protocol version that introduced this kind; its frames carry that version.
    pub fn since_version(self) -> u8 {
        match self {
            MessageKind::Keepalive | MessageKind::Close => 2,
            MessageKind::Tag => 3,
            _ => 1,
        }
    }

    /// A short name, for errors and logs.
    pub fn name(self) -> &'static str {
        match self {
            MessageKind::Hello => "hello",
            MessageKind::Proof => "proof",
            MessageKind::Endpoint => "endpoint",
            MessageKind::Regions => "regions",
            MessageKind::Sync => "sync",
            MessageKind::Abort => "abort",
            MessageKind::Keepalive => "keepalive",
            MessageKind::Close => "close",
            MessageKind::Tag => "tag",
        }
    }
}

impl Message {
    /// This message's kind.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::Hello(_) => MessageKind::Hello,
            Message::Proof(_) => MessageKind::Proof,
            Message::Endpoint(_) => MessageKind::Endpoint,
            Message::Regions(_) => MessageKind::Regions,
            Message::Sync(_) => MessageKind::Sync,
            Message::Abort(_) => MessageKind::Abort,
            Message::Keepalive => MessageKind::Keepalive,
            Message::Close => MessageKind::Close,
            Message::Tag(_) => MessageKind::Tag,
        }
    }

    /// A short name, for errors and logs.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// An abort with `reason` cut to [`MAX_REASON`] bytes (at a character boundary): a reason
    /// is for people, so a long one is shortened rather than refused.
    pub fn abort(reason: &str) -> Message {
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        Message::Abort(reason[..end].to_owned())
    }

    /// Checks the limits the peer's decoder enforces.
    fn check_limits(&self) -> Result<(), EncodeError> {
        let (len, limit, what, limit_name) = match self {
            Message::Endpoint(e) => (e.params.len(), MAX_PARAMS, "parameters", "MAX_PARAMS"),
            Message::Regions(r) => (r.0.len(), MAX_REGIONS, "regions", "MAX_REGIONS"),
            Message::Abort(t) => (t.len(), MAX_REASON, "reason bytes", "MAX_REASON"),
            _ => return Ok(()),
        };
        if len > limit {
            return Err(EncodeError::TooLarge {
                kind: self.name(),
                what,
                len,
                limit,
                limit_name,
            });
        }
        Ok(())
    }

    /// Appends this message's frame to `out`.
    ///
    /// # Errors
    /// [`EncodeError::TooLarge`] for more than [`MAX_REGIONS`] regions, more than
    /// [`MAX_PARAMS`] parameters or an abort reason over [`MAX_REASON`] bytes; `out` is then
    /// unchanged.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.check_limits()?;
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        // The hello announces the version this side speaks, so a version-1 peer stops at the
        // first frame with a clear "version 2 is not supported" instead of misreading the
        // keepalive and close frames later. Other frames carry the version of their kind.
        out.push(match self {
            Message::Hello(_) => VERSION,
            _ => self.kind().since_version(),
        });
        out.push(self.kind().code());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes()); // length, patched below
        match self {
            Message::Hello(h) => {
                out.push(match h.role {
                    Role::Client => 0,
                    Role::Server => 1,
                });
                out.push(h.auth_required as u8);
                out.extend_from_slice(&h.nonce);
            }
            Message::Proof(p) => out.extend_from_slice(&p.tag),
            Message::Endpoint(e) => {
                out.extend_from_slice(&e.qp_num.to_be_bytes());
                out.extend_from_slice(&e.psn.to_be_bytes());
                out.extend_from_slice(&e.lid.to_be_bytes());
                out.extend_from_slice(&e.gid.0);
                out.push(e.gid_index);
                out.extend_from_slice(&e.mtu.to_be_bytes());
                out.push(e.qp_type);
                out.extend_from_slice(&e.send_depth.to_be_bytes());
                out.extend_from_slice(&e.recv_depth.to_be_bytes());
                out.extend_from_slice(&e.max_inline.to_be_bytes());
                out.push(e.max_rd_atomic);
                out.push(e.max_dest_rd_atomic);
                out.push(e.params.len() as u8);
                for (k, v) in &e.params {
                    out.extend_from_slice(&k.to_be_bytes());
                    out.extend_from_slice(&v.to_be_bytes());
                }
            }
            Message::Regions(r) => {
                out.extend_from_slice(&(r.0.len() as u16).to_be_bytes());
                for m in &r.0 {
                    out.extend_from_slice(&m.addr.to_be_bytes());
                    out.extend_from_slice(&m.len.to_be_bytes());
                    out.extend_from_slice(&m.rkey.to_be_bytes());
                }
            }
            Message::Sync(step) => out.extend_from_slice(&step.to_be_bytes()),
            Message::Abort(text) => out.extend_from_slice(text.as_bytes()),
            Message::Keepalive | Message::Close => {}
            Message::Tag(t) => out.extend_from_slice(t),
        }
        let body = (out.len() - start - HEADER_LEN) as u32;
        out[start + 8..start + 12].copy_from_slice(&body.to_be_bytes());
        Ok(())
    }

    /// The frame as a new buffer.
    ///
    /// # Errors
    /// As [`Message::encode`].
    pub fn to_bytes(&self) -> Result<Vec<u8>, EncodeError> {
        let mut v = Vec::new();
        self.encode(&mut v)?;
        Ok(v)
    }
}

/// A parsed frame header: what kind of body follows, and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind (its header code; see [`MessageKind::code`]).
    pub kind: u8,
    /// Body length.
    pub body_len: usize,
}

/// Parses a frame header.
///
/// # Errors
/// [`DecodeError`] for a wrong magic, version, kind, reserved bits or length.
pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<Header, DecodeError> {
    let magic: [u8; 4] = h[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = h[4];
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(DecodeError::Version(version));
    }
    let kind = h[5];
    if MessageKind::from_code(kind, version).is_none() {
        return Err(DecodeError::Kind(kind));
    }
    let reserved = u16::from_be_bytes([h[6], h[7]]);
    if reserved != 0 {
        return Err(DecodeError::Reserved(reserved));
    }
    let body_len = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
    if body_len > MAX_BODY {
        return Err(DecodeError::TooLong(body_len));
    }
    Ok(Header { kind, body_len })
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// otherwise the message and how many bytes it took.
///
/// # Errors
/// [`DecodeError`] when the bytes cannot be a valid frame.
pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, DecodeError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        // Reject garbage as early as its first bytes show it.
        let n = buf.len().min(4);
        if buf[..n] != MAGIC[..n] {
            let mut m = [0u8; 4];
            m[..n].copy_from_slice(&buf[..n]);
            return Err(DecodeError::BadMagic(m));
        }
        return Ok(None);
    };
    let header = decode_header(h.try_into().expect("header length"))?;
    let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + header.body_len) else {
        return Ok(None);
    };
    Ok(Some((
        decode_body(header.kind, body)?,
        HEADER_LEN + header.body_len,
    )))
}

/// Decodes a body of `kind` (as a header announced it).
///
/// # Errors
/// [`DecodeError`] for a truncated, overlong or invalid body.
pub fn decode_body(kind: u8, body: &[u8]) -> Result<Message, DecodeError> {
    let Some(kind) = MessageKind::from_code(kind, VERSION) else {
        return Err(DecodeError::Kind(kind));
    };
    if body.len() > MAX_BODY {
        return Err(DecodeError::TooLong(body.len()));
    }
    let name = kind.name();
    let mut r = Reader {
        buf: body,
        kind: name,
    };
    let msg = match kind {
        MessageKind::Hello => {
            let role = match r.u8("role")? {
                0 => Role::Client,
                1 => Role::Server,
                v => {
                    return Err(
                        r.invalid("role", format!("{v} is neither client (0) nor server (1)"))
                    )
                }
            };
            let auth_required = match r.u8("auth_required")? {
                0 => false,
                1 => true,
                v => return Err(r.invalid("auth_required", format!("{v} is not a boolean"))),
            };
            Message::Hello(Hello {
                role,
                auth_required,
                nonce: r.array("nonce")?,
            })
        }
        MessageKind::Proof => Message::Proof(Proof {
            tag: r.array("tag")?,
        }),
        MessageKind::Endpoint => {
            let qp_num = r.u32("qp_num")?;
            if qp_num > 0xff_ffff {
                return Err(r.invalid("qp_num", format!("{qp_num:#x} is wider than 24 bits")));
            }
            let psn = r.u32("psn")?;
            if psn > 0xff_ffff {
                return Err(r.invalid("psn", format!("{psn:#x} is wider than 24 bits")));
            }
            let lid = r.u16("lid")?;
            let gid = Gid(r.array("gid")?);
            let gid_index = r.u8("gid_index")?;
            let mtu = r.u16("mtu")?;
            if !matches!(mtu, 256 | 512 | 1024 | 2048 | 4096) {
                return Err(r.invalid("mtu", format!("{mtu} is not 256, 512, 1024, 2048 or 4096")));
            }
            let qp_type = r.u8("qp_type")?;
            if qp_type > 2 {
                return Err(r.invalid(
                    "qp_type",
                    format!("{qp_type} is not RC (0), UC (1) or UD (2)"),
                ));
            }
            let send_depth = r.u32("send_depth")?;
            let recv_depth = r.u32("recv_depth")?;
            let max_inline = r.u32("max_inline")?;
            let max_rd_atomic = r.u8("max_rd_atomic")?;
            let max_dest_rd_atomic = r.u8("max_dest_rd_atomic")?;
            let n = r.u8("param count")? as usize;
            let mut params = Vec::with_capacity(n);
            for _ in 0..n {
                params.push((r.u16("param key")?, r.u64("param value")?));
            }
            Message::Endpoint(Endpoint {
                qp_num,
                psn,
                lid,
                gid,
                gid_index,
                mtu,
                qp_type,
                send_depth,
                recv_depth,
                max_inline,
                max_rd_atomic,
                max_dest_rd_atomic,
                params,
            })
        }
        MessageKind::Regions => {
            let n = r.u16("region count")? as usize;
            if n > MAX_REGIONS {
                return Err(r.invalid(
                    "region count",
                    format!("{n} regions exceed the limit of {MAX_REGIONS} (MAX_REGIONS)"),
                ));
            }
            // The count is checked against the bytes present before allocating for it.
            let need = n * REGION_LEN;
            if r.buf.len() < need {
                return Err(DecodeError::Truncated {
                    kind: name,
                    field: "regions",
                    need: need - r.buf.len(),
                });
            }
            let mut regions = Vec::with_capacity(n);
            for _ in 0..n {
                let addr = r.u64("region addr")?;
                let len = r.u64("region len")?;
                if addr.checked_add(len).is_none() {
                    return Err(
                        r.invalid("region", format!("{addr:#x}+{len} wraps the address space"))
                    );
                }
                regions.push(RemoteMemory {
                    addr,
                    len,
                    rkey: r.u32("region rkey")?,
                });
            }
            Message::Regions(Regions(regions))
        }
        MessageKind::Sync => Message::Sync(r.u32("step")?),
        MessageKind::Abort => {
            let text = std::str::from_utf8(r.rest()).map_err(|e| DecodeError::Invalid {
                kind: name,
                field: "reason",
                why: e.to_string(),
            })?;
            if text.len() > MAX_REASON {
                return Err(DecodeError::Invalid {
                    kind: name,
                    field: "reason",
                    why: format!(
                        "{} bytes exceed the limit of {MAX_REASON} (MAX_REASON)",
                        text.len()
                    ),
                });
            }
            Message::Abort(text.to_owned())
        }
        MessageKind::Keepalive => Message::Keepalive,
        MessageKind::Close => Message::Close,
        MessageKind::Tag => Message::Tag(r.array("tag")?),
    };
    if !r.buf.is_empty() {
        return Err(DecodeError::Trailing {
            kind: name,
            extra: r.buf.len(),
        });
    }
    Ok(msg)
}

struct Reader<'a> {
    buf: &'a [u8],
    kind: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated {
                kind: self.kind,
                field,
                need: n - self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        Ok(self.take(field, N)?.try_into().expect("length checked"))
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(field, 1)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    fn invalid(&self, field: &'static str, why: String) -> DecodeError {
        DecodeError::Invalid {
            kind: self.kind,
            field,
            why,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Client => "client",
            Role::Server => "server",
        })
    }
}
