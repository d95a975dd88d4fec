//! What the Conn device tests (blocking and async) share: the device under test as the VM
//! names it, options on it, where listeners bind, and a test payload.

// Each test binary uses its own subset.
#![allow(dead_code)]

use rsrdma_net::{ConnOptions, Establish};

/// The device's IPv4 address (rdma_cm cannot use 127.0.0.1 over rxe).
pub fn ip() -> String {
    std::env::var("RSRDMA_TEST_IP").unwrap_or_else(|_| "10.77.0.1".into())
}

pub fn device() -> String {
    std::env::var("RSRDMA_TEST_DEVICE").unwrap_or_else(|_| "rxe0".into())
}

pub fn gid_index() -> Option<u8> {
    std::env::var("RSRDMA_TEST_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// Options for the device under test on `path`.
pub fn opts(path: Establish) -> ConnOptions {
    ConnOptions::default()
        .establish(path)
        .device(device())
        .gid_index(gid_index())
}

/// Where a listener for `o` binds (port 0): loopback for the TCP handshake, the device's
/// address for rdma_cm.
pub fn listen_addr(o: &ConnOptions) -> String {
    let host = match o.establish {
        Establish::Tcp => "127.0.0.1".to_string(),
        _ => ip(),
    };
    format!("{host}:0")
}

/// `len` pseudo-random bytes that differ per `seed` (xorshift).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What a death test's child peer reads from `env` (set by its parent as `"cm ADDR"` or
/// `"tcp ADDR"`): the establishment path and the listener's address.
pub fn child_peer_spec(env: &str) -> (Establish, std::net::SocketAddr) {
    let spec = std::env::var(env).unwrap();
    let (path, addr) = spec.split_once(' ').unwrap();
    let path = if path == "cm" {
        Establish::Cm
    } else {
        Establish::Tcp
    };
    (path, addr.parse().unwrap())
}
