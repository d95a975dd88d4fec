//! The registry's wire format: length-prefixed, versioned frames, many per TCP connection.
//!
//! ```text
//! frame   = length:u32be  body            (2 ≤ length ≤ MAX_FRAME)
//! body    = version:u8  kind:u8  fields
//! name    = len:u16be  UTF-8 bytes        (1 ≤ len ≤ MAX_NAME)
//! addr    = gid:16  qpn:u32be  qkey:u32be
//! text    = len:u16be  UTF-8 bytes        (len ≤ MAX_TEXT)
//!
//! client → registry                       registry → client
//! 0x01 Hello      magic:"RSRG" nonce:32    0x81 Welcome  magic:"RSRG" auth:u8 nonce:32
//! 0x02 Proof      tag:32                   0x02 Proof    tag:32 (the same both ways)
//! 0x03 Register   name addr lease_ms:u32   0x83 Registered lease_ms:u32
//!                 owner:16
//! 0x04 Lookup     name                     0x84 Found    addr lease_left_ms:u32
//! 0x05 Unregister name owner:16            0x85 Done
//! 0x06 Ping                                0xff Error    code:u8 text
//! ```
//!
//! A connection opens with Hello/Welcome; when the registry has a secret, both sides then
//! prove it (the client first, [`crate::handshake::auth`]) before any request, and from then
//! on every frame either way is followed by a 32-byte tag (HMAC-SHA-256 under the session key
//! over the direction, a sequence number and the frame), outside the length prefix.
//!
//! Version 2 added the owner: a name belongs to the owner that registered it until its lease
//! runs out or that owner unregisters it; others get `NotOwner`.

use super::ErrorCode;
use crate::packet::{Addr, MAX_QPN};
use rsrdma::Gid;
use std::fmt;

/// The protocol version this side speaks.
pub const VERSION: u8 = 2;
/// The magic of Hello and Welcome.
pub const MAGIC: [u8; 4] = *b"RSRG";
/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;
/// The largest frame body.
pub const MAX_FRAME: usize = 1024;
/// The longest name, in bytes.
pub const MAX_NAME: usize = 255;
/// The longest error text, in bytes.
pub const MAX_TEXT: usize = 512;
/// Bytes of a nonce and of a proof.
pub const NONCE_LEN: usize = 32;
/// Bytes of an owner: who registered a name (random per client unless set).
pub const OWNER_LEN: usize = 16;

/// One registry message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Client: opens the connection.
    Hello {
        /// The client's nonce for the challenge–response.
        nonce: [u8; NONCE_LEN],
    },
    /// Registry: answers Hello.
    Welcome {
        /// Whether the client must prove the secret.
        auth_required: bool,
        /// The registry's nonce.
        nonce: [u8; NONCE_LEN],
    },
    /// Either side: proof of the shared secret.
    Proof {
        /// HMAC-SHA-256 over the role and both nonces.
        tag: [u8; NONCE_LEN],
    },
    /// Client: registers (or renews) `name`.
    Register {
        /// The name.
        name: String,
        /// Its address.
        addr: Addr,
        /// The lease asked for (0: the registry's default).
        lease_ms: u32,
        /// Who registers it: a live name of another owner is refused with `NotOwner`.
        owner: [u8; OWNER_LEN],
    },
    /// Client: asks for `name`.
    Lookup {
        /// The name.
        name: String,
    },
    /// Client: removes `name`.
    Unregister {
        /// The name.
        name: String,
        /// Who asks: only the owner may remove a live name.
        owner: [u8; OWNER_LEN],
    },
    /// Client: checks the connection.
    Ping,
    /// Registry: the lease granted.
    Registered {
        /// Milliseconds until the entry expires unless renewed.
        lease_ms: u32,
    },
    /// Registry: the address of a looked-up name.
    Found {
        /// The address.
        addr: Addr,
        /// Milliseconds left on its lease.
        lease_left_ms: u32,
    },
    /// Registry: done (Unregister, Ping).
    Done,
    /// Registry: a refusal.
    Error {
        /// What kind.
        code: ErrorCode,
        /// Why, for people.
        text: String,
    },
}

const HELLO: u8 = 0x01;
const PROOF: u8 = 0x02;
const REGISTER: u8 = 0x03;
const LOOKUP: u8 = 0x04;
const UNREGISTER: u8 = 0x05;
const PING: u8 = 0x06;
const WELCOME: u8 = 0x81;
const REGISTERED: u8 = 0x83;
const FOUND: u8 = 0x84;
const DONE: u8 = 0x85;
const ERROR: u8 = 0xff;

/// Why bytes are not a registry frame or message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The length prefix announces more than [`MAX_FRAME`] bytes (or fewer than 2).
    #[error("a frame of {len} bytes (the limit is {MAX_FRAME})")]
    FrameSize {
        /// The announced length.
        len: u32,
    },
    /// The body speaks another protocol version.
    #[error("protocol version {got}, this side speaks {VERSION}")]
    Version {
        /// The version in the frame.
        got: u8,
    },
    /// An operation this version does not know.
    #[error("unknown operation {0:#04x}")]
    UnknownOp(u8),
    /// The body ends before its fields do.
    #[error("{what} is cut short")]
    Short {
        /// The field.
        what: &'static str,
    },
    /// Bytes after the last field.
    #[error("{0} bytes after the message")]
    Trailing(usize),
    /// A name over [`MAX_NAME`] bytes.
    #[error("a name of {len} bytes (the limit is {MAX_NAME})")]
    NameTooLong {
        /// Its length.
        len: usize,
    },
    /// An empty name.
    #[error("an empty name")]
    EmptyName,
    /// Text that is not UTF-8, or error text over [`MAX_TEXT`] bytes.
    #[error("{0} is not valid UTF-8 text within its limit")]
    BadText(&'static str),
    /// Hello or Welcome without the magic.
    #[error("no RSRG magic: not a registry peer")]
    BadMagic,
    /// A QPN over 24 bits.
    #[error("QPN {0:#x} is over 24 bits")]
    BadQpn(u32),
    /// A boolean that is neither 0 nor 1.
    #[error("a flag of {0}")]
    BadFlag(u8),
}

impl DecodeError {
    /// The error code a registry answers this with.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::FrameSize { .. } => ErrorCode::TooLarge,
            DecodeError::Version { .. } => ErrorCode::Version,
            DecodeError::UnknownOp(_) => ErrorCode::UnknownOp,
            DecodeError::NameTooLong { .. } => ErrorCode::NameTooLong,
            _ => ErrorCode::BadRequest,
        }
    }
}

/// Splits the first frame off `buf`: `Ok(None)` until a whole frame is there, else its body
/// and the bytes used. An oversized length is refused before its body arrives.
///
/// # Errors
/// [`DecodeError::FrameSize`].
pub fn split_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, DecodeError> {
    let Some(prefix) = buf.get(..LEN_PREFIX) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if !(2..=MAX_FRAME as u32).contains(&len) {
        return Err(DecodeError::FrameSize { len });
    }
    let end = LEN_PREFIX + len as usize;
    Ok(buf.get(LEN_PREFIX..end).map(|body| (body, end)))
}

/// Decodes one frame body.
///
/// # Errors
/// Every way the body can be wrong; never panics.
pub fn decode_body(body: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader(body);
    let version = r.u8("version")?;
    let kind = r.u8("operation")?;
    if version != VERSION {
        return Err(DecodeError::Version { got: version });
    }
    let msg = match kind {
        HELLO => {
            r.magic()?;
            Message::Hello {
                nonce: r.array("nonce")?,
            }
        }
        WELCOME => {
            r.magic()?;
            let auth_required = match r.u8("auth flag")? {
                0 => false,
                1 => true,
                v => return Err(DecodeError::BadFlag(v)),
            };
            Message::Welcome {
                auth_required,
                nonce: r.array("nonce")?,
            }
        }
        PROOF => Message::Proof {
            tag: r.array("proof")?,
        },
        REGISTER => Message::Register {
            name: r.name()?,
            addr: r.addr()?,
            lease_ms: r.u32("lease")?,
            owner: r.array("owner")?,
        },
        LOOKUP => Message::Lookup { name: r.name()? },
        UNREGISTER => Message::Unregister {
            name: r.name()?,
            owner: r.array("owner")?,
        },
        PING => Message::Ping,
        REGISTERED => Message::Registered {
            lease_ms: r.u32("lease")?,
        },
        FOUND => Message::Found {
            addr: r.addr()?,
            lease_left_ms: r.u32("lease")?,
        },
        DONE => Message::Done,
        ERROR => Message::Error {
            code: ErrorCode::from_u8(r.u8("error code")?),
            text: r.text()?,
        },
        k => return Err(DecodeError::UnknownOp(k)),
    };
    match r.0.len() {
        0 => Ok(msg),
        n => Err(DecodeError::Trailing(n)),
    }
}

/// Why a message cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A name of 0 or more than [`MAX_NAME`] bytes.
    #[error("a name must be 1 to {MAX_NAME} bytes, this one is {len}")]
    Name {
        /// Its length.
        len: usize,
    },
}

/// Appends `msg` as one frame to `out`. Error text longer than [`MAX_TEXT`] is cut.
///
/// # Errors
/// [`EncodeError::Name`].
pub fn encode(msg: &Message, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let start = out.len();
    out.extend_from_slice(&[0; LEN_PREFIX]);
    out.push(VERSION);
    let r = encode_fields(msg, out);
    if r.is_err() {
        out.truncate(start);
        return r;
    }
    let len = (out.len() - start - LEN_PREFIX) as u32;
    out[start..start + LEN_PREFIX].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

fn encode_fields(msg: &Message, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match msg {
        Message::Hello { nonce } => {
            out.push(HELLO);
            out.extend_from_slice(&MAGIC);
            out.extend_from_slice(nonce);
        }
        Message::Welcome {
            auth_required,
            nonce,
        } => {
            out.push(WELCOME);
            out.extend_from_slice(&MAGIC);
            out.push(u8::from(*auth_required));
            out.extend_from_slice(nonce);
        }
        Message::Proof { tag } => {
            out.push(PROOF);
            out.extend_from_slice(tag);
        }
        Message::Register {
            name,
            addr,
            lease_ms,
            owner,
        } => {
            out.push(REGISTER);
            put_name(out, name)?;
            put_addr(out, addr);
            out.extend_from_slice(&lease_ms.to_be_bytes());
            out.extend_from_slice(owner);
        }
        Message::Lookup { name } => {
            out.push(LOOKUP);
            put_name(out, name)?;
        }
        Message::Unregister { name, owner } => {
            out.push(UNREGISTER);
            put_name(out, name)?;
            out.extend_from_slice(owner);
        }
        Message::Ping => out.push(PING),
        Message::Registered { lease_ms } => {
            out.push(REGISTERED);
            out.extend_from_slice(&lease_ms.to_be_bytes());
        }
        Message::Found {
            addr,
            lease_left_ms,
        } => {
            out.push(FOUND);
            put_addr(out, addr);
            out.extend_from_slice(&lease_left_ms.to_be_bytes());
        }
        Message::Done => out.push(DONE),
        Message::Error { code, text } => {
            out.push(ERROR);
            out.push(code.to_u8());
            let mut end = text.len().min(MAX_TEXT);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            out.extend_from_slice(&(end as u16).to_be_bytes());
            out.extend_from_slice(&text.as_bytes()[..end]);
        }
    }
    Ok(())
}

fn put_name(out: &mut Vec<u8>, name: &str) -> Result<(), EncodeError> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(EncodeError::Name { len: name.len() });
    }
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    Ok(())
}

fn put_addr(out: &mut Vec<u8>, a: &Addr) {
    out.extend_from_slice(a.gid.as_bytes());
    out.extend_from_slice(&a.qpn.to_be_bytes());
    out.extend_from_slice(&a.qkey.to_be_bytes());
}

/// A cursor over a body.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Short { what });
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn magic(&mut self) -> Result<(), DecodeError> {
        match self.array::<4>("magic")? == MAGIC {
            true => Ok(()),
            false => Err(DecodeError::BadMagic),
        }
    }

    fn name(&mut self) -> Result<String, DecodeError> {
        let len = self.u16("name length")? as usize;
        if len == 0 {
            return Err(DecodeError::EmptyName);
        }
        if len > MAX_NAME {
            return Err(DecodeError::NameTooLong { len });
        }
        let bytes = self.take(len, "name")?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::BadText("the name"))
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        let len = self.u16("text length")? as usize;
        if len > MAX_TEXT {
            return Err(DecodeError::BadText("the error text"));
        }
        let bytes = self.take(len, "error text")?;
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::BadText("the error text"))
    }

    fn addr(&mut self) -> Result<Addr, DecodeError> {
        let gid = Gid(self.array("GID")?);
        let qpn = self.u32("QPN")?;
        if qpn > MAX_QPN {
            return Err(DecodeError::BadQpn(qpn));
        }
        Ok(Addr {
            gid,
            qpn,
            qkey: self.u32("Q_Key")?,
        })
    }
}

impl Message {
    /// The message's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Welcome { .. } => "Welcome",
            Message::Proof { .. } => "Proof",
            Message::Register { .. } => "Register",
            Message::Lookup { .. } => "Lookup",
            Message::Unregister { .. } => "Unregister",
            Message::Ping => "Ping",
            Message::Registered { .. } => "Registered",
            Message::Found { .. } => "Found",
            Message::Done => "Done",
            Message::Error { .. } => "Error",
        }
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
