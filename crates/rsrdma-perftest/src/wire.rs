//! The bytes of perftest's TCP exchange (spec section 1.3): encoding and parsing only, no I/O.

use crate::args::{AtomicType, Params, VERSION};
use crate::error::{Error, Result};
use crate::{Kind, Verb};

/// Length of the VER message.
pub const VER_LEN: usize = 16;
/// DEST without a GID.
pub const DEST_LEN_NO_GID: usize = 59;
/// DEST with a GID.
pub const DEST_LEN_GID: usize = 108;
/// DEST over rdma_cm (`-R`): perftest's `struct pingpong_dest` as its x86-64 build lays it
/// out, every integer big-endian.
pub const DEST_LEN_CM: usize = 56;
/// The closing "done\0".
pub const DONE: &[u8; 5] = b"done\0";

/// The lowest peer version perftest accepts.
pub const MIN_VERSION: f64 = 5.70;

/// What rs tools add to VER after the NUL that ends the version string. perftest reads the
/// version with `atof`, which stops at the NUL, so the trailer is invisible to it; two rs tools
/// use it to compare options perftest never exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Verb and bw/lat.
    pub tool: u8,
    /// Connection type and mode flags.
    pub flags: u8,
    /// Message size (0 with `-a`).
    pub size: u32,
    /// Number of QPs.
    pub num_qps: u16,
    /// `-D`'s seconds, at most 255 (0: not in duration mode, or a peer whose trailer did
    /// not carry them).
    pub duration_secs: u8,
}

const TRAILER_MAGIC: [u8; 2] = *b"rs";
const FLAG_ALL: u8 = 1 << 2;
const FLAG_BIDIR: u8 = 1 << 3;
const FLAG_DURATION: u8 = 1 << 4;
const FLAG_MTU: u8 = 1 << 5;
const FLAG_CAS: u8 = 1 << 6;

impl Trailer {
    /// The trailer describing `p`.
    pub fn of(p: &Params) -> Trailer {
        let tool = match p.tool.verb {
            Verb::Send => 0,
            Verb::Write => 2,
            Verb::Read => 4,
            Verb::Atomic => 6,
        } | u8::from(p.tool.kind == Kind::Lat);
        let mut flags = p.conn.code();
        if p.all {
            flags |= FLAG_ALL;
        }
        if p.bidir {
            flags |= FLAG_BIDIR;
        }
        if p.duration.is_some() {
            flags |= FLAG_DURATION;
        }
        if p.mtu.is_some() {
            flags |= FLAG_MTU;
        }
        if p.tool.verb == Verb::Atomic && p.atomic_type == AtomicType::CmpAndSwap {
            flags |= FLAG_CAS;
        }
        Trailer {
            tool,
            flags,
            size: if p.all { 0 } else { p.size as u32 },
            num_qps: p.num_qps.min(u16::MAX as u32) as u16,
            duration_secs: p.duration.map_or(0, |d| d.clamp(1, 255) as u8),
        }
    }

    /// True when the peer asked for an exact MTU with `-m`.
    pub fn mtu_explicit(&self) -> bool {
        self.flags & FLAG_MTU != 0
    }

    /// The first option (perftest's flag and a description) in which `peer` differs, with both
    /// values as text.
    pub fn first_difference(&self, peer: &Trailer) -> Option<(&'static str, String, String)> {
        let tool_name = |t: u8| {
            let verb = ["send", "write", "read", "atomic", "?"][usize::from((t >> 1).min(4))];
            let kind = if t & 1 == 1 { "lat" } else { "bw" };
            format!("rs_{verb}_{kind}")
        };
        let conn = |f: u8| ["RC", "UC", "UD", "?"][usize::from(f & 3)].to_string();
        let on = |f: u8, bit: u8| if f & bit != 0 { "on" } else { "off" }.to_string();
        if self.tool != peer.tool {
            return Some(("test (tool)", tool_name(self.tool), tool_name(peer.tool)));
        }
        if self.flags & 3 != peer.flags & 3 {
            return Some(("-c (connection type)", conn(self.flags), conn(peer.flags)));
        }
        if (self.flags ^ peer.flags) & FLAG_ALL != 0 {
            return Some((
                "-a (all sizes)",
                on(self.flags, FLAG_ALL),
                on(peer.flags, FLAG_ALL),
            ));
        }
        if (self.flags ^ peer.flags) & FLAG_BIDIR != 0 {
            return Some((
                "-b (bidirectional)",
                on(self.flags, FLAG_BIDIR),
                on(peer.flags, FLAG_BIDIR),
            ));
        }
        if (self.flags ^ peer.flags) & FLAG_DURATION != 0 {
            return Some((
                "-D (duration mode)",
                on(self.flags, FLAG_DURATION),
                on(peer.flags, FLAG_DURATION),
            ));
        }
        // Both in duration mode, for different times (0: a peer that did not say): the one
        // that stops first leaves the other waiting, which blamed -n or the connection type.
        if self.duration_secs != peer.duration_secs
            && self.duration_secs != 0
            && peer.duration_secs != 0
        {
            let secs = |d: u8| {
                if d == u8::MAX {
                    "255 s or more".to_string()
                } else {
                    format!("{d} s")
                }
            };
            return Some((
                "-D (duration)",
                secs(self.duration_secs),
                secs(peer.duration_secs),
            ));
        }
        if (self.flags ^ peer.flags) & FLAG_CAS != 0 {
            let name = |f: u8| {
                if f & FLAG_CAS != 0 {
                    AtomicType::CmpAndSwap
                } else {
                    AtomicType::FetchAndAdd
                }
                .name()
                .to_string()
            };
            return Some(("-A (atomic type)", name(self.flags), name(peer.flags)));
        }
        if self.size != peer.size {
            return Some((
                "-s (message size)",
                self.size.to_string(),
                peer.size.to_string(),
            ));
        }
        if self.num_qps != peer.num_qps {
            return Some((
                "-q (number of QPs)",
                self.num_qps.to_string(),
                peer.num_qps.to_string(),
            ));
        }
        None
    }
}

/// Encodes VER: "6.06", NUL padded to 16 bytes, with the rs trailer after the NUL.
pub fn encode_version(trailer: Option<&Trailer>) -> [u8; VER_LEN] {
    let mut b = [0u8; VER_LEN];
    b[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    if let Some(t) = trailer {
        b[5..7].copy_from_slice(&TRAILER_MAGIC);
        b[7] = t.tool;
        b[8] = t.flags;
        b[9..13].copy_from_slice(&t.size.to_be_bytes());
        b[13..15].copy_from_slice(&t.num_qps.to_be_bytes());
        b[15] = t.duration_secs;
    }
    b
}

/// The peer's VER: its version number (as C's `atof` reads it) and the rs trailer, if any.
pub fn parse_version(b: &[u8; VER_LEN]) -> (f64, Option<Trailer>) {
    let end = b.iter().position(|&c| c == 0).unwrap_or(VER_LEN);
    let version = atof(&b[..end]);
    let trailer = (end == 4 && b[5..7] == TRAILER_MAGIC).then(|| Trailer {
        tool: b[7],
        flags: b[8],
        size: u32::from_be_bytes([b[9], b[10], b[11], b[12]]),
        num_qps: u16::from_be_bytes([b[13], b[14]]),
        duration_secs: b[15],
    });
    (version, trailer)
}

/// C's `atof` on a byte string: the longest numeric prefix after leading blanks, else 0.
pub fn atof(b: &[u8]) -> f64 {
    let s: String = b
        .iter()
        .map(|&c| c as char)
        .skip_while(|c| c.is_ascii_whitespace())
        .collect();
    let mut end = 0;
    let mut seen_dot = false;
    let mut seen_digit = false;
    for (i, c) in s.char_indices() {
        match c {
            '+' | '-' if i == 0 => {}
            '0'..='9' => seen_digit = true,
            '.' if !seen_dot => seen_dot = true,
            _ => break,
        }
        end = i + 1;
    }
    if !seen_digit {
        return 0.0;
    }
    s[..end].parse::<f64>().unwrap_or(0.0)
}

/// A 4-byte SYS message (page size or cache line), big-endian.
pub fn encode_sys(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// The peer's SYS value.
pub fn parse_sys(b: &[u8; 4]) -> u32 {
    u32::from_be_bytes(*b)
}

/// The MTU message: the enum value as one ASCII digit and a NUL.
pub fn encode_mtu(mtu: rsrdma::Mtu) -> [u8; 2] {
    [b'0' + mtu as u8, 0]
}

/// The peer's MTU, if it names a valid MTU (perftest ignores anything else).
pub fn parse_mtu(b: &[u8; 2]) -> Option<rsrdma::Mtu> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(2);
    let text = std::str::from_utf8(&b[..end]).ok()?;
    let n: u32 = text.trim().parse().ok()?;
    match n {
        1..=5 => rsrdma::Mtu::from_bytes(128 << n),
        _ => None,
    }
}

/// One QP's endpoint as perftest exchanges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dest {
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA reads (READ tests), else 1.
    pub out_reads: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// rkey of the data region.
    pub rkey: u32,
    /// Address of this QP's target area.
    pub vaddr: u64,
    /// SRQ number (unused by RC/UC/UD: 0).
    pub srqn: u32,
    /// The port GID (only in the 108-byte form).
    pub gid: [u8; 16],
}

impl Dest {
    /// The message: 59 bytes without a GID, 108 with one, NUL-terminated.
    pub fn encode(&self, with_gid: bool) -> Vec<u8> {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        if with_gid {
            for b in self.gid {
                s.push_str(&format!("{b:02x}:"));
            }
            s.push_str(&format!("{:08x}:", self.srqn));
        } else {
            s.push_str(&format!("{:08x}", self.srqn));
        }
        let mut v = s.into_bytes();
        v.push(0);
        v
    }

    /// Parses a DEST of the form `with_gid` selects.
    ///
    /// # Errors
    /// [`Error::Protocol`] when the bytes are not a DEST message.
    pub fn parse(b: &[u8], with_gid: bool) -> Result<Dest> {
        let bad = || {
            Error::Protocol(format!(
                "Couldn't parse line <{}>: not a perftest endpoint message (is the peer perftest, and run with the same -x/GID setting?)",
                printable(b)
            ))
        };
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let text = std::str::from_utf8(&b[..end]).map_err(|_| bad())?;
        let fields: Vec<&str> = text.split(':').collect();
        let want = if with_gid { 6 + 16 + 1 } else { 7 };
        if fields.len() < want || (!with_gid && fields.len() != 7) {
            return Err(bad());
        }
        let hex = |s: &str, max_len: usize| -> Result<u64> {
            if s.is_empty() || s.len() > max_len {
                return Err(bad());
            }
            u64::from_str_radix(s, 16).map_err(|_| bad())
        };
        let mut d = Dest {
            lid: hex(fields[0], 4)? as u16,
            out_reads: hex(fields[1], 4)? as u32,
            qpn: hex(fields[2], 6)? as u32,
            psn: hex(fields[3], 6)? as u32,
            rkey: hex(fields[4], 8)? as u32,
            vaddr: hex(fields[5], 16)?,
            ..Default::default()
        };
        if with_gid {
            for i in 0..16 {
                d.gid[i] = hex(fields[6 + i], 2)? as u8;
            }
            d.srqn = hex(fields[22], 8)? as u32;
        } else {
            d.srqn = hex(fields[6], 8)? as u32;
        }
        Ok(d)
    }
}

impl Dest {
    /// The binary form perftest sends over rdma_cm (spec 2.7): `lid`, `out_reads`, `qpn`,
    /// `psn`, `rkey` as big-endian 32-bit integers at 0, 4, 8, 12, 16; 4 bytes of padding;
    /// `vaddr` big-endian at 24; the GID's 16 bytes at 32; `srqn` and the GID index at 48
    /// and 52 (this side sends 0 for the index; perftest does not read either).
    pub fn encode_cm(&self) -> [u8; DEST_LEN_CM] {
        let mut b = [0u8; DEST_LEN_CM];
        let words = [
            u32::from(self.lid),
            self.out_reads,
            self.qpn,
            self.psn,
            self.rkey,
        ];
        for (i, w) in words.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&w.to_be_bytes());
        }
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b
    }

    /// Parses the binary form (see [`Dest::encode_cm`]).
    ///
    /// # Errors
    /// [`Error::Protocol`] for a message of another length.
    pub fn parse_cm(b: &[u8]) -> Result<Dest> {
        if b.len() != DEST_LEN_CM {
            return Err(Error::Protocol(format!(
                "Couldn't parse the peer's endpoint: {} bytes instead of {DEST_LEN_CM}",
                b.len()
            )));
        }
        let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        Ok(Dest {
            lid: word(0) as u16,
            out_reads: word(4),
            qpn: word(8) & 0xff_ffff,
            psn: word(12) & 0xff_ffff,
            rkey: word(16),
            vaddr: u64::from_be_bytes(vaddr),
            srqn: word(48),
            gid,
        })
    }
}

/// The five 8-byte report exchanges of the BW tests.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Report {
    /// Message size.
    pub size: u64,
    /// Iterations (× QPs).
    pub iters: u64,
    /// Peak bandwidth in the printed unit.
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
}

impl Report {
    /// The five fields, each as its own 8-byte message.
    pub fn encode(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// Decodes the five fields.
    pub fn decode(m: &[[u8; 8]; 5]) -> Report {
        Report {
            size: u64::from_be_bytes(m[0]),
            iters: u64::from_be_bytes(m[1]),
            bw_peak: f64::from_bits(u64::from_be_bytes(m[2])),
            bw_avg: f64::from_bits(u64::from_be_bytes(m[3])),
            msg_rate: f64::from_bits(u64::from_be_bytes(m[4])),
        }
    }
}

/// Bytes as text for an error message: printable ASCII kept, the rest as `\xNN`.
pub fn printable(b: &[u8]) -> String {
    let mut s = String::new();
    for &c in b.iter().take(64) {
        if (0x20..0x7f).contains(&c) {
            s.push(c as char);
        } else {
            s.push_str(&format!("\\x{c:02x}"));
        }
    }
    if b.len() > 64 {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_6_06_nul_padded_and_trailer_invisible_to_atof() {
        let plain = encode_version(None);
        assert_eq!(&plain[..], b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(parse_version(&plain), (6.06, None));
        let t = Trailer {
            tool: 3,
            flags: 2 | FLAG_ALL,
            size: 65536,
            num_qps: 2,
            duration_secs: 4,
        };
        let b = encode_version(Some(&t));
        assert_eq!(&b[..5], b"6.06\0");
        assert_eq!(atof(&b), 6.06, "atof stops at the NUL");
        assert_eq!(parse_version(&b), (6.06, Some(t)));
    }

    #[test]
    fn atof_like_c() {
        assert_eq!(atof(b"5.60"), 5.6);
        assert_eq!(atof(b"  7.00xyz"), 7.0);
        assert_eq!(atof(b"GET / HTTP"), 0.0);
        assert_eq!(atof(b""), 0.0);
        assert_eq!(atof(b"-1.5"), -1.5);
    }

    #[test]
    fn trailer_names_the_first_difference() {
        let a = Trailer {
            tool: 0,
            flags: 0,
            size: 65536,
            num_qps: 1,
            duration_secs: 0,
        };
        assert_eq!(a.first_difference(&a), None);
        let b = Trailer { size: 1024, ..a };
        let (opt, mine, theirs) = a.first_difference(&b).unwrap();
        assert!(opt.starts_with("-s"));
        assert_eq!((mine.as_str(), theirs.as_str()), ("65536", "1024"));
        let c = Trailer { flags: 2, ..a };
        assert_eq!(a.first_difference(&c).unwrap().2, "UD");
        let d = Trailer { tool: 2, ..a };
        assert_eq!(a.first_difference(&d).unwrap().2, "rs_write_bw");
        // Durations: compared only when both ends said theirs.
        let timed = |secs| Trailer {
            flags: FLAG_DURATION,
            duration_secs: secs,
            ..a
        };
        let (opt, mine, theirs) = timed(4).first_difference(&timed(2)).unwrap();
        assert_eq!(
            (opt, mine.as_str(), theirs.as_str()),
            ("-D (duration)", "4 s", "2 s")
        );
        assert_eq!(
            timed(4).first_difference(&timed(0)),
            None,
            "an older rs tool"
        );
    }

    #[test]
    fn sys_and_mtu() {
        assert_eq!(encode_sys(4096), [0, 0, 0x10, 0]);
        assert_eq!(encode_sys(64), [0, 0, 0, 0x40]);
        assert_eq!(parse_sys(&[0, 0, 0x10, 0]), 4096);
        assert_eq!(encode_mtu(rsrdma::Mtu::Mtu4096), [0x35, 0]);
        assert_eq!(encode_mtu(rsrdma::Mtu::Mtu1024), [0x33, 0]);
        assert_eq!(parse_mtu(b"3\0"), Some(rsrdma::Mtu::Mtu1024));
        assert_eq!(parse_mtu(b"9\0"), None);
        assert_eq!(parse_mtu(b"x\0"), None);
    }

    #[test]
    fn dest_matches_the_observed_bytes() {
        let d = Dest {
            lid: 3,
            out_reads: 1,
            qpn: 0x093a00,
            psn: 0x349aef,
            rkey: 0x493a,
            vaddr: 0x7f2987cd6000,
            srqn: 0,
            gid: [0; 16],
        };
        let b = d.encode(false);
        assert_eq!(b.len(), DEST_LEN_NO_GID);
        assert_eq!(
            &b[..],
            b"0003:0001:093a00:349aef:0000493a:00007f2987cd6000:00000000\0"
        );
        assert_eq!(Dest::parse(&b, false).unwrap(), d);

        let mut g = Dest {
            lid: 0,
            out_reads: 1,
            qpn: 0x018900,
            psn: 0x91fa93,
            rkey: 0x5189,
            vaddr: 0x7f10daec6000,
            ..Default::default()
        };
        g.gid[10] = 0xff;
        g.gid[11] = 0xff;
        g.gid[12..].copy_from_slice(&[192, 168, 7, 2]);
        let b = g.encode(true);
        assert_eq!(b.len(), DEST_LEN_GID);
        assert_eq!(
            &b[..],
            &b"0000:0001:018900:91fa93:00005189:00007f10daec6000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:07:02:00000000:\0"[..]
        );
        assert_eq!(Dest::parse(&b, true).unwrap(), g);
    }

    #[test]
    fn binary_dest_layout() {
        let mut d = Dest {
            lid: 0x1234,
            out_reads: 16,
            qpn: 0x0a0b0c,
            psn: 0x112233,
            rkey: 0xdeadbeef,
            vaddr: 0x0000_7f10_daec_6000,
            srqn: 0,
            gid: [0; 16],
        };
        d.gid[10] = 0xff;
        d.gid[11] = 0xff;
        d.gid[12..].copy_from_slice(&[10, 77, 0, 1]);
        let b = d.encode_cm();
        assert_eq!(&b[..4], &[0, 0, 0x12, 0x34]);
        assert_eq!(&b[4..8], &[0, 0, 0, 16]);
        assert_eq!(&b[8..12], &[0, 0x0a, 0x0b, 0x0c]);
        assert_eq!(&b[16..20], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&b[20..24], &[0; 4], "padding before the 8-byte vaddr");
        assert_eq!(&b[24..32], &[0, 0, 0x7f, 0x10, 0xda, 0xec, 0x60, 0]);
        assert_eq!(&b[44..48], &[10, 77, 0, 1]);
        assert_eq!(Dest::parse_cm(&b).unwrap(), d);
        assert_eq!(Dest::default().encode_cm(), [0u8; DEST_LEN_CM]);
        assert!(Dest::parse_cm(&b[..55]).is_err());
    }

    #[test]
    fn garbage_dest_is_an_error_not_a_panic() {
        for junk in [
            &b"hello world"[..],
            &[0xffu8; 59][..],
            &b"0003:0001:093a00:349aef:0000493a:00007f2987cd6000\0"[..],
            &b"zzzz:0001:093a00:349aef:0000493a:00007f2987cd6000:00000000\0"[..],
        ] {
            assert!(Dest::parse(junk, false).is_err());
            assert!(Dest::parse(junk, true).is_err());
        }
    }

    #[test]
    fn report_encodes_the_observed_bytes() {
        let r = Report {
            size: 65536,
            iters: 5000,
            bw_peak: 1490.68,
            bw_avg: 424.02,
            msg_rate: 0.006784,
        };
        let m = r.encode();
        assert_eq!(m[0], [0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(m[1], [0, 0, 0, 0, 0, 0, 0x13, 0x88]);
        assert_eq!(m[2][..3], [0x40, 0x97, 0x4a]);
        assert_eq!(m[3][..3], [0x40, 0x7a, 0x80]);
        assert_eq!(m[4][..3], [0x3f, 0x7b, 0xc9]);
        assert_eq!(Report::decode(&m), r);
    }
}
