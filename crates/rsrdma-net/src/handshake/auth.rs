//! Shared-secret authentication: an ordered challenge–response, then a sealed channel.
//!
//! # What it guarantees, and why it is built this way
//! - **The listener reveals nothing to a stranger.** Anyone can open a TCP connection to a
//!   listener, so the client proves first: HMAC-SHA-256(secret, label ‖ transcript) over
//!   both hellos (both nonces, both roles, both versions). The server checks it in constant
//!   time and, if it is wrong, aborts having sent nothing derived from the secret. Only then
//!   does the server prove itself, over the same transcript and the client's proof.
//! - **A client that dials an impostor reveals one proof.** Someone must go first; the
//!   client is the side that chose its peer. That proof is safe to reveal only because the
//!   secret cannot be guessed offline: secrets shorter than [`MIN_SECRET_LEN`] (128 bits)
//!   are refused with a clear error, rather than hidden behind a password-authenticated key
//!   exchange (PAKE). We chose the length rule because the secrets here are keys that
//!   orchestration hands to processes, not passwords people type, and because it keeps the
//!   handshake to one well-understood primitive (HMAC-SHA-256) with no elliptic-curve
//!   dependency. [`crate::Secret::generate`] makes a good one.
//! - **Nothing after the proofs can be rewritten.** Both sides derive a session key from
//!   the secret and the whole opening (hellos and both proofs). From then on every frame
//!   either side sends is followed by a [`Message::Tag`](super::Message::Tag): HMAC(session
//!   key, direction ‖ sequence number ‖ frame bytes). A frame that arrives without its tag,
//!   with a wrong one, out of order or replayed ends the connection. Endpoints (queue pair,
//!   GID, PSN), memory descriptors (addresses, rkeys), barriers and the close are all
//!   covered, so an on-path attacker cannot redirect a queue pair or an rkey.
//! - **Not secrecy.** Nothing is encrypted: keys and addresses cross the network in the
//!   clear, and the RDMA traffic itself is not protected (see the guide's security chapter).

use super::codec::{Role, NONCE_LEN, PROOF_LEN, TAG_LEN};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::io::Read;

type HmacSha256 = Hmac<Sha256>;

/// The shortest secret accepted: 16 bytes (128 bits), so that a proof seen by an impostor
/// cannot be turned back into the secret by guessing.
pub const MIN_SECRET_LEN: usize = 16;

/// Refuses a secret too short to resist offline guessing.
///
/// # Errors
/// A sentence for the user, naming the limit and how to make a good secret.
pub fn check_secret(secret: &[u8]) -> Result<(), String> {
    if secret.len() < MIN_SECRET_LEN {
        return Err(format!(
            "a shared secret must be at least {MIN_SECRET_LEN} bytes (128 bits); this one has \
             {}. A short secret can be recovered offline from one proof: use random bytes \
             (rsrdma_net::Secret::generate) or a longer phrase",
            secret.len()
        ));
    }
    Ok(())
}

/// The transcript of an opening: a hash of both hellos' frames, client first, each with its
/// length (so no two openings share a transcript).
pub fn transcript(client_hello: &[u8], server_hello: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"rsrdma handshake v3 transcript");
    for frame in [client_hello, server_hello] {
        h.update((frame.len() as u64).to_be_bytes());
        h.update(frame);
    }
    h.finalize().into()
}

/// The registry's transcript: both nonces and whether authentication was asked for (the
/// registry's opening has no hello frames of this codec).
pub fn registry_transcript(
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    auth_required: bool,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"rsrdma registry v2 transcript");
    h.update(client_nonce);
    h.update(server_nonce);
    h.update([u8::from(auth_required)]);
    h.finalize().into()
}

fn keyed(secret: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length")
}

fn proof_mac(secret: &[u8], role: Role, transcript: &[u8; 32], client_proof: &[u8]) -> HmacSha256 {
    let mut mac = keyed(secret);
    mac.update(match role {
        Role::Client => b"rsrdma handshake v3: client proof",
        Role::Server => b"rsrdma handshake v3: server proof",
    });
    mac.update(transcript);
    // The server's proof also covers the client's, so it answers this very exchange.
    mac.update(client_proof);
    mac
}

/// The client's proof: it goes first.
pub fn client_proof(secret: &[u8], transcript: &[u8; 32]) -> [u8; PROOF_LEN] {
    proof_mac(secret, Role::Client, transcript, &[])
        .finalize()
        .into_bytes()
        .into()
}

/// The server's proof, sent only after the client's checked out.
pub fn server_proof(
    secret: &[u8],
    transcript: &[u8; 32],
    client_proof: &[u8; PROOF_LEN],
) -> [u8; PROOF_LEN] {
    proof_mac(secret, Role::Server, transcript, client_proof)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks, in constant time, a proof from a peer of `peer_role` (`client_proof` is the
/// client's proof when checking the server's, empty otherwise).
pub fn verify_proof(
    secret: &[u8],
    peer_role: Role,
    transcript: &[u8; 32],
    client_proof: &[u8],
    tag: &[u8; PROOF_LEN],
) -> bool {
    proof_mac(secret, peer_role, transcript, client_proof)
        .verify_slice(tag)
        .is_ok()
}

/// The sealing state of an authenticated channel: the session key and a sequence number
/// per direction.
#[derive(Clone)]
pub struct Seal {
    key: HmacSha256,
    role: Role,
    sent: u64,
    received: u64,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("role", &self.role)
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl Seal {
    /// The seal both sides derive once the proofs are checked. `role` is this side's.
    pub fn new(
        secret: &[u8],
        role: Role,
        transcript: &[u8; 32],
        client_proof: &[u8; PROOF_LEN],
        server_proof: &[u8; PROOF_LEN],
    ) -> Seal {
        let mut kdf = keyed(secret);
        kdf.update(b"rsrdma handshake v3: session key");
        kdf.update(transcript);
        kdf.update(client_proof);
        kdf.update(server_proof);
        let key = kdf.finalize().into_bytes();
        Seal {
            key: keyed(&key),
            role,
            sent: 0,
            received: 0,
        }
    }

    fn mac(&self, from: Role, seq: u64, frame: &[u8]) -> HmacSha256 {
        let mut mac = self.key.clone();
        mac.update(match from {
            Role::Client => b"client to server",
            Role::Server => b"server to client",
        });
        mac.update(&seq.to_be_bytes());
        mac.update(frame);
        mac
    }

    /// The tag for the next frame this side sends.
    pub fn seal(&mut self, frame: &[u8]) -> [u8; TAG_LEN] {
        let mac = self.mac(self.role, self.sent, frame);
        self.sent += 1;
        mac.finalize().into_bytes().into()
    }

    /// What the tag of the next frame from the peer must match: check it with
    /// [`Expected::matches`] when the tag arrives.
    pub fn expect(&mut self, frame: &[u8]) -> Expected {
        let peer = match self.role {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        };
        let mac = self.mac(peer, self.received, frame);
        self.received += 1;
        Expected(mac)
    }
}

/// The tag a received frame must be followed by.
#[derive(Clone)]
pub struct Expected(HmacSha256);

impl Expected {
    /// Whether `tag` is the one expected, compared in constant time.
    pub fn matches(&self, tag: &[u8; TAG_LEN]) -> bool {
        self.0.clone().verify_slice(tag).is_ok()
    }
}

impl std::fmt::Debug for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Expected(..)")
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

    const KEY: &[u8] = b"0123456789abcdef0123";

    #[test]
    fn proofs_verify_only_with_the_same_secret_role_and_transcript() {
        let t = transcript(b"client hello", b"server hello");
        let c = client_proof(KEY, &t);
        assert!(verify_proof(KEY, Role::Client, &t, &[], &c));
        assert!(!verify_proof(
            b"another secret!!",
            Role::Client,
            &t,
            &[],
            &c
        ));
        let other = transcript(b"client hello", b"server hellp");
        assert!(
            !verify_proof(KEY, Role::Client, &other, &[], &c),
            "other hellos"
        );
        let s = server_proof(KEY, &t, &c);
        assert!(verify_proof(KEY, Role::Server, &t, &c, &s));
        assert!(
            !verify_proof(KEY, Role::Server, &t, &[], &s),
            "bound to the client's"
        );
        assert_ne!(s, c, "a client proof is never a server proof");
        assert!(
            !verify_proof(KEY, Role::Client, &t, &[], &s),
            "no reflection"
        );
        let mut bad = c;
        bad[31] ^= 1;
        assert!(!verify_proof(KEY, Role::Client, &t, &[], &bad));
        // Moving bytes between the hellos changes the transcript.
        assert_ne!(transcript(b"ab", b"c"), transcript(b"a", b"bc"));
    }

    #[test]
    fn a_seal_checks_direction_order_and_bytes() {
        let t = transcript(b"c", b"s");
        let (cp, sp) = (client_proof(KEY, &t), [7u8; 32]);
        let mut client = Seal::new(KEY, Role::Client, &t, &cp, &sp);
        let mut server = Seal::new(KEY, Role::Server, &t, &cp, &sp);
        let t0 = client.seal(b"frame 0");
        let t1 = client.seal(b"frame 1");
        // In order, whole: accepted.
        assert!(server.clone().expect(b"frame 0").matches(&t0));
        // Reordered, altered or reflected: refused.
        assert!(
            !server.clone().expect(b"frame 1").matches(&t1),
            "out of order"
        );
        assert!(!server.clone().expect(b"frame 0!").matches(&t0), "altered");
        assert!(server.expect(b"frame 0").matches(&t0));
        assert!(server.expect(b"frame 1").matches(&t1));
        let back = server.seal(b"frame 0");
        assert_ne!(back, t0, "the two directions never share a tag");
        assert!(!client.clone().expect(b"frame 0").matches(&t0), "reflected");
        assert!(client.expect(b"frame 0").matches(&back));
        // Another session (another transcript) shares nothing.
        let mut other = Seal::new(KEY, Role::Server, &transcript(b"c", b"t"), &cp, &sp);
        assert!(!other.expect(b"frame 0").matches(&t0));
    }

    #[test]
    fn short_secrets_are_refused_with_the_limit_named() {
        let e = check_secret(b"hunter2").unwrap_err();
        assert!(e.contains("at least 16 bytes"), "{e}");
        assert!(check_secret(&[0u8; 16]).is_ok());
    }
}
