//! [`Addr`]: where a UD datagram goes, in gordma's text form `<gid>%0x<qpn>[#0x<qkey>]`.

use rsrdma::qp::DEFAULT_QKEY;
use rsrdma::Gid;
use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

/// The largest queue-pair number: QPNs are 24 bits on the wire.
pub const MAX_QPN: u32 = 0xff_ffff;

/// The address of a UD endpoint: the port's GID, the queue-pair number and the Q_Key that
/// datagrams to it must carry.
///
/// Text form (gordma's): the GID as eight colon-separated groups of four hex digits, `%`, the
/// QPN in hex with `0x`, and `#0x<qkey>` unless the Q_Key is [`DEFAULT_QKEY`]:
/// `0000:0000:0000:0000:0000:ffff:0a4d:0001%0x11#0x2a`. Parsing also takes any IPv6 text
/// form of the GID (`::ffff:10.77.0.1`) and decimal QPN and Q_Key values.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Addr {
    /// The GID of the endpoint's port (RoCE: its IP address, IPv4-mapped for IPv4).
    pub gid: Gid,
    /// The queue-pair number (24 bits).
    pub qpn: u32,
    /// The Q_Key the endpoint accepts.
    pub qkey: u32,
}

impl Addr {
    /// An address with the default Q_Key.
    pub fn new(gid: Gid, qpn: u32) -> Addr {
        Addr {
            gid,
            qpn,
            qkey: DEFAULT_QKEY,
        }
    }

    /// The same address with Q_Key `qkey`.
    #[must_use]
    pub fn with_qkey(self, qkey: u32) -> Addr {
        Addr { qkey, ..self }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%{:#x}", self.gid, self.qpn)?;
        if self.qkey != DEFAULT_QKEY {
            write!(f, "#{:#x}", self.qkey)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Addr({self})")
    }
}

/// Why a string is not an [`Addr`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid UD address {text:?}: {reason} (expected <gid>%0x<qpn>[#0x<qkey>])")]
pub struct AddrParseError {
    text: String,
    reason: &'static str,
}

impl AddrParseError {
    fn new(text: &str, reason: &'static str) -> Self {
        // Keep the error small whatever the input.
        let text: String = text.chars().take(96).collect();
        AddrParseError { text, reason }
    }

    /// What was wrong.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl FromStr for Addr {
    type Err = AddrParseError;

    fn from_str(s: &str) -> Result<Addr, AddrParseError> {
        let err = |reason| AddrParseError::new(s, reason);
        let (gid, rest) = s
            .split_once('%')
            .ok_or_else(|| err("no '%' after the GID"))?;
        let (qpn, qkey) = match rest.split_once('#') {
            Some((q, k)) => (q, Some(k)),
            None => (rest, None),
        };
        let gid = Ipv6Addr::from_str(gid).map_err(|_| err("the GID is not 8 hex groups"))?;
        let qpn = parse_number(qpn).ok_or_else(|| err("the QPN is not a number"))?;
        if qpn > MAX_QPN {
            return Err(err("the QPN is over 24 bits"));
        }
        let qkey = match qkey {
            Some(k) => parse_number(k).ok_or_else(|| err("the Q_Key is not a 32-bit number"))?,
            None => DEFAULT_QKEY,
        };
        Ok(Addr {
            gid: Gid::from(gid),
            qpn,
            qkey,
        })
    }
}

/// `0x`-prefixed hex or decimal, as gordma's `ResolveAddr` accepts.
fn parse_number(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && !hex.starts_with('+') => u32::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        None => None,
    }
}
