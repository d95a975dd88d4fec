//! Shared-secret authentication: a mutual challenge–response.
//!
//! Each side sends a fresh random nonce in its hello. Each then proves knowledge of the
//! secret with HMAC-SHA-256 over a role label and both nonces, in an order that differs per
//! role (so a proof cannot be reflected back). A stranger without the secret gets an abort
//! before any queue-pair number, rkey or address is sent.

use super::codec::{Role, NONCE_LEN, PROOF_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;

type HmacSha256 = Hmac<Sha256>;

/// The proof `role` sends: HMAC(secret, label(role) ‖ peer's nonce ‖ own nonce).
pub fn proof(
    secret: &[u8],
    role: Role,
    own_nonce: &[u8; NONCE_LEN],
    peer_nonce: &[u8; NONCE_LEN],
) -> [u8; PROOF_LEN] {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(label(role));
    mac.update(peer_nonce);
    mac.update(own_nonce);
    mac.finalize().into_bytes().into()
}

/// Checks, in constant time, the proof a peer of `peer_role` sent.
pub fn verify(
    secret: &[u8],
    peer_role: Role,
    peer_nonce: &[u8; NONCE_LEN],
    own_nonce: &[u8; NONCE_LEN],
    tag: &[u8; PROOF_LEN],
) -> bool {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(label(peer_role));
    mac.update(own_nonce);
    mac.update(peer_nonce);
    mac.verify_slice(tag).is_ok()
}

fn label(role: Role) -> &'static [u8] {
    match role {
        Role::Client => b"rsrdma handshake v1: client proof",
        Role::Server => b"rsrdma handshake v1: server proof",
    }
}

/// A fresh nonce from the kernel's random source.
///
/// # Errors
/// The I/O error of reading `/dev/urandom`.
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_and_role() {
        let (c, s) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(c, s);
        let p = proof(b"secret", Role::Client, &c, &s);
        assert!(verify(b"secret", Role::Client, &c, &s, &p));
        assert!(!verify(b"other", Role::Client, &c, &s, &p), "wrong secret");
        assert!(
            !verify(b"secret", Role::Server, &c, &s, &p),
            "a client proof is not a server proof"
        );
        // Reflection: the server's own proof over the same nonces differs from the client's.
        assert_ne!(proof(b"secret", Role::Server, &s, &c), p);
        let mut bad = p;
        bad[0] ^= 1;
        assert!(!verify(b"secret", Role::Client, &c, &s, &bad));
    }
}
