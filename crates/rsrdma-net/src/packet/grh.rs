//! The sender's GID from the 40 bytes in front of every UD receive.
//!
//! On InfiniBand and RoCE v1/v2 over IPv6 the 40 bytes are a GRH (an IPv6 header) whose
//! source GID is at bytes 8..24. On RoCE v2 over IPv4 the NIC puts the 20-byte IPv4 header in
//! the last 20 bytes, and the sender's GID is the IPv4-mapped source address. The two are
//! told apart as libibverbs does: an IPv4 header with a valid checksum wins.

use rsrdma::Gid;
use std::net::Ipv4Addr;

/// Bytes of the GRH area in front of a UD payload.
pub(crate) const GRH_LEN: usize = 40;

/// Where an IPv4 header starts inside the GRH area.
const IPV4_AT: usize = 20;

/// The source GID recorded in `grh`, or `None` when the bytes are neither form.
pub(crate) fn source_gid(grh: &[u8; GRH_LEN]) -> Option<Gid> {
    let ipv4 = &grh[IPV4_AT..];
    let ipv6_version = grh[0] >> 4;
    let looks_ipv4 = ipv4[0] == 0x45 && ipv4_checksum_ok(ipv4);
    if looks_ipv4 || (ipv6_version != 6 && ipv4[0] >> 4 == 4) {
        let src = Ipv4Addr::new(ipv4[12], ipv4[13], ipv4[14], ipv4[15]);
        return Some(Gid::from(src.to_ipv6_mapped()));
    }
    if ipv6_version == 6 {
        let mut g = [0u8; 16];
        g.copy_from_slice(&grh[8..24]);
        return Some(Gid(g));
    }
    None
}

/// The one's-complement sum over a 20-byte IPv4 header, checksum included, is all ones.
fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum: u32 = h[..20]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn ipv4_grh(src: [u8; 4], dst: [u8; 4]) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        let h = &mut g[IPV4_AT..];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[8] = 64; // TTL
        h[9] = 17; // UDP
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum: u32 = h
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        g
    }

    #[test]
    fn roce_v2_ipv4_gives_the_mapped_source() {
        let g = ipv4_grh([10, 77, 0, 1], [10, 77, 0, 2]);
        let want: Ipv6Addr = "::ffff:10.77.0.1".parse().unwrap();
        assert_eq!(source_gid(&g), Some(Gid::from(want)));
    }

    #[test]
    fn an_ipv6_grh_gives_its_sgid() {
        let mut g = [0u8; GRH_LEN];
        g[0] = 0x60;
        let sgid: Ipv6Addr = "fe80::1234:5678".parse().unwrap();
        g[8..24].copy_from_slice(&sgid.octets());
        g[24..40].copy_from_slice(&[9; 16]);
        assert_eq!(source_gid(&g), Some(Gid::from(sgid)));
    }

    #[test]
    fn a_bad_ipv4_checksum_under_an_ipv6_version_is_ipv6() {
        let mut g = ipv4_grh([1, 2, 3, 4], [5, 6, 7, 8]);
        g[30] ^= 0xff; // break the checksum
        g[0] = 0x60;
        let mut sgid = [0u8; 16];
        sgid.copy_from_slice(&g[8..24]);
        assert_eq!(source_gid(&g), Some(Gid(sgid)));
    }

    #[test]
    fn garbage_is_none() {
        assert_eq!(source_gid(&[0u8; GRH_LEN]), None);
    }
}
