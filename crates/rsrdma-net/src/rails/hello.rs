//! The first message on each rail of a striped connection: which connection and which rail it
//! is, and what the dialer proposes (`docs/conn-protocol.md`, section 9).

use rsrdma_proto::rails::RailsConfig;
use rsrdma_proto::ProtoError;

/// Bytes of a hello.
pub(super) const HELLO_LEN: usize = 32;
/// A dialer's hello, and the acceptor's answer on rail 0 once every rail joined.
const MAGIC_HELLO: &[u8; 4] = b"RSRL";
const MAGIC_ANSWER: &[u8; 4] = b"RSRA";
const VERSION: u8 = 1;

/// What a hello says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hello {
    /// The dialer's random number for the connection: its rails carry the same one.
    pub(super) id: u64,
    /// Which rail this is.
    pub(super) rail: u8,
    /// What the dialer proposes (the answer: what was settled).
    pub(super) cfg: RailsConfig,
}

impl Hello {
    pub(super) fn encode(&self, answer: bool) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(if answer { MAGIC_ANSWER } else { MAGIC_HELLO });
        b[4] = VERSION;
        b[5] = self.rail;
        b[6] = self.cfg.rails as u8;
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.cfg.stripe_size.to_le_bytes());
        b[20..24].copy_from_slice(&(self.cfg.window.min(u32::MAX as usize) as u32).to_le_bytes());
        b[24..28].copy_from_slice(&self.cfg.max_message.to_le_bytes());
        b
    }

    /// Reads a hello (`answer`: the acceptor's answer); `Err` names the broken rule.
    pub(super) fn decode(b: &[u8], answer: bool) -> Result<Hello, &'static str> {
        if b.len() != HELLO_LEN {
            return Err("a hello is 32 bytes");
        }
        if &b[..4] != if answer { MAGIC_ANSWER } else { MAGIC_HELLO } {
            return Err("not a striped connection's hello (a plain Conn at the other end?)");
        }
        if b[4] != VERSION {
            return Err("another version of striped connections");
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&b[8..16]);
        let h = Hello {
            id: u64::from_le_bytes(id),
            rail: b[5],
            cfg: RailsConfig {
                rails: usize::from(b[6]),
                stripe_size: u32_at(16),
                window: u32_at(20) as usize,
                max_message: u32_at(24),
            },
        };
        if let Err(ProtoError::BadParams { reason }) = h.cfg.check() {
            return Err(reason);
        }
        if usize::from(h.rail) >= h.cfg.rails {
            return Err("a rail index past the rail count");
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_reads_back_and_bad_ones_are_refused() {
        let h = Hello {
            id: 0x1122_3344_5566_7788,
            rail: 1,
            cfg: RailsConfig {
                rails: 2,
                stripe_size: 65536,
                window: 8 << 20,
                max_message: 16 << 20,
            },
        };
        assert_eq!(Hello::decode(&h.encode(false), false), Ok(h));
        assert_eq!(Hello::decode(&h.encode(true), true), Ok(h));
        assert!(Hello::decode(&h.encode(true), false).is_err());
        assert!(Hello::decode(b"hello", false).is_err());
        let mut b = h.encode(false);
        b[5] = 2;
        assert!(
            Hello::decode(&b, false).is_err(),
            "rail index past the count"
        );
        b[5] = 0;
        b[6] = 17;
        assert!(Hello::decode(&b, false).is_err(), "too many rails");
    }
}
