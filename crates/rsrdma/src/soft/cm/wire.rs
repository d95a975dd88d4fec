//! What two soft CMs send each other over a connection's TCP stream: frames of a tag, a
//! 16-bit length and a body; a REQ and a REP carry an [`Endpoint`].

use std::io::Write;
use std::net::TcpStream;
use std::os::raw::c_int;

/// Private data sizes of the TCP port space over InfiniBand/RoCE CM messages (what
/// librdmacm delivers, zero-padded): a REQ's, a REP's, a REJ's.
pub(super) const REQ_PRIVATE: usize = 56;
pub(super) const REP_PRIVATE: usize = 196;
pub(super) const REJ_PRIVATE: usize = 148;
/// rxe's (the IB CM's) reject reasons: no listener on the service; the consumer refused.
pub(super) const REJ_INVALID_SERVICE_ID: c_int = 8;
pub(super) const REJ_CONSUMER: c_int = 28;
/// Identifies a soft CM's REQ.
pub(super) const MAGIC: &[u8; 4] = b"SCM2";

// Frame tags.
pub(super) const REQ: u8 = 1;
pub(super) const REP: u8 = 2;
pub(super) const REJ: u8 = 3;
pub(super) const RTU: u8 = 4;
pub(super) const DREQ: u8 = 5;
/// The listener's CM has the REQ: sent by its thread at once, whether or not the application
/// has taken the request yet (as the IB CM's MRA says "received, the answer will take a
/// while"). It tells a soft CM from another service that took the TCP connection and says
/// nothing (a TCP-path Listener that is not accepting): without it, such a dial waited for
/// the caller's whole timeout, where rxe's CM rejects at once (nobody listens on the
/// service).
pub(super) const HEARD: u8 = 6;
/// The listener's device cannot be reached from the requester's host (a soft0 on loopback,
/// without `RSRDMA_SOFT_ADDR`, heard a request from another host through a listener on the
/// unspecified address): its queue pair would send to the requester's own loopback. The
/// requester's connect fails with UNREACHABLE, as a connect to a host whose RDMA device is
/// not on the dialled address does.
pub(super) const UNREACHABLE: u8 = 7;

/// One side's part of a REQ or a REP.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) qpn: u32,
    pub(super) lid: u16,
    /// The device's GID (with the LID, where its device listens: another host's address).
    pub(super) gid: [u8; 16],
    pub(super) psn: u32,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) rnr_retry: u8,
    pub(super) private: Vec<u8>,
}

impl Endpoint {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(36 + self.private.len());
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&self.qpn.to_le_bytes());
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&self.psn.to_le_bytes());
        b.extend_from_slice(&[
            self.responder_resources,
            self.initiator_depth,
            self.rnr_retry,
        ]);
        b.extend_from_slice(&self.private);
        b
    }

    pub(super) fn decode(b: &[u8]) -> Option<Endpoint> {
        if b.len() < 33 || &b[..4] != MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        Some(Endpoint {
            qpn: u32_at(4),
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid,
            psn: u32_at(26),
            responder_resources: b[30],
            initiator_depth: b[31],
            rnr_retry: b[32],
            private: b[33..].to_vec(),
        })
    }
}

pub(super) fn write_frame(s: &mut TcpStream, tag: u8, body: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(body.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let mut f = Vec::with_capacity(3 + body.len());
    f.push(tag);
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(body);
    s.write_all(&f)
}

pub(super) fn padded(data: &[u8], size: usize) -> Vec<u8> {
    let mut v = data[..data.len().min(size)].to_vec();
    v.resize(size, 0);
    v
}

/// The longest body a soft CM sends (a REP: its endpoint and up to 196 bytes of private
/// data), with room to spare.
const MAX_BODY: usize = 512;

/// Whether `buf` begins with what no soft CM sends: an unknown tag, or a length past any
/// frame's (bytes of another protocol: "GET / HTTP/1.1" read as a frame waited for 21,573
/// bytes, and its dialer for its whole timeout).
pub(super) fn not_a_frame(buf: &[u8]) -> bool {
    match *buf {
        [] => false,
        [tag, ..] if !(REQ..=UNREACHABLE).contains(&tag) => true,
        [_, a, b, ..] => usize::from(u16::from_le_bytes([a, b])) > MAX_BODY,
        _ => false,
    }
}

/// Takes one whole frame off the front of `buf`.
pub(super) fn take_frame(buf: &mut Vec<u8>) -> Option<(u8, Vec<u8>)> {
    let len = usize::from(u16::from_le_bytes([*buf.get(1)?, *buf.get(2)?]));
    if buf.len() < 3 + len {
        return None;
    }
    let body = buf[3..3 + len].to_vec();
    let tag = buf[0];
    buf.drain(..3 + len);
    Some((tag, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_soft_cms_frames_pass_for_frames() {
        assert!(!not_a_frame(&[]));
        assert!(!not_a_frame(&[REQ]));
        assert!(!not_a_frame(&[REP, 229, 0]));
        assert!(!not_a_frame(&[DREQ, 0, 0]));
        assert!(not_a_frame(b"GET / HTTP/1.1\r\n"));
        assert!(not_a_frame(&[0]));
        assert!(
            not_a_frame(&[REJ, 0x45, 0x54]),
            "21,573 bytes: no soft CM's"
        );
    }
}
