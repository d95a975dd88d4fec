//! The hash of the device's maps that a packet or a post looks up (queue pairs by number,
//! links by device address): the standard library's SipHash resists crafted keys, which
//! these maps need not (the device numbers its queue pairs itself, and a link is keyed by an
//! address a peer had to connect from), and it cost a tenth of a small request's time. This
//! is the multiply-rotate hash rustc uses for its own tables.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by small integers or addresses, hashed by [`FastHasher`].
pub(super) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// The multiply-rotate hash (FxHash) over the key's words.
#[derive(Default, Clone, Copy)]
pub(super) struct FastHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    #[test]
    fn keys_that_differ_hash_apart_and_maps_find_them() {
        let mut m: FastMap<SocketAddrV4, u32> = FastMap::default();
        for port in 0..2000u16 {
            m.insert(
                SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
                u32::from(port),
            );
        }
        for port in 0..2000u16 {
            assert_eq!(
                m[&SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)],
                u32::from(port)
            );
        }
        let h = |n: u32| {
            let mut h = FastHasher::default();
            h.write_u32(n);
            h.finish()
        };
        let distinct: std::collections::HashSet<u64> = (0..10_000).map(h).collect();
        assert_eq!(distinct.len(), 10_000);
    }
}
