//! Authentication on the rdma_cm path (F5): the handshake's rule, carried by rdma_cm.
//!
//! rdma_cm has two messages with private data before the connection is up (the connect
//! request and the accept's reply) and none after, while a proof that cannot be replayed
//! needs a challenge from the verifier first. So:
//!
//! 1. The connect request carries the client's announcement, a marker and a fresh nonce; the
//!    accept carries the server's announcement, the marker and its nonce. Neither carries
//!    anything derived from the secret.
//! 2. Once connected, before either side's protocol core exists (so before any message is
//!    delivered, and before any memory is exposed: rendezvous rkeys only travel in the
//!    core's frames), the client sends its proof as one SEND: HMAC-SHA-256 over a transcript
//!    of both private data. The server checks it in constant time; a wrong or missing proof
//!    makes it disconnect, having sent nothing derived from the secret.
//! 3. The server answers with its proof (which covers the client's), the client checks it,
//!    and both start their cores. The receive slot each proof consumed is posted again
//!    first, so the cores' credits are as if nothing had been exchanged. Completions are
//!    taken one at a time and only up to the peer's proof: anything after it (the peer's
//!    first messages) stays in the CQ for the driver, which also reaps (and ignores) the
//!    proof sends' own completions ([`crate::conn::wr_id::AUTH_WR_ID`]); the send queue has
//!    one extra entry for them.
//!
//! Unlike the TCP path, later frames are not sealed: rdma_cm has no channel beside the queue
//! pair, and RDMA traffic itself is not authenticated (see the guide's security chapter).

use super::Local;
use crate::conn::wr_id::{AUTH_WR_ID as PROOF_WR_ID, RECV_TAG};
use crate::error::{NetError, Result};
use crate::handshake::auth;
use crate::handshake::{Role, WRONG_PROOF};
use rsrdma::cm::{CmEventType, CmId};
use rsrdma::{Qp, RecvWr, SendWr, Wc};
use rsrdma_proto::{SlotMemory, PARAMS_LEN};
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

/// Inline bytes a QP needs for the exchange (its send queue also gets one extra entry).
pub(super) const INLINE_NEEDED: u32 = PROOF_LEN as u32;
/// Follows the announcement in the private data of a side that demands authentication.
const MARKER: u8 = b'A';
/// Bytes of each side's nonce in the private data.
const NONCE_LEN: usize = 16;
/// What the transcript covers of each side's private data: announcement, marker, nonce.
const OFFER_LEN: usize = PARAMS_LEN + 1 + NONCE_LEN;
/// Bytes of a proof on the wire.
const PROOF_LEN: usize = 32;

/// This side's private data: the announcement, then, with a secret, the marker and a nonce.
pub(super) fn offer(params: &[u8; PARAMS_LEN], secret: bool) -> Result<Vec<u8>> {
    let mut v = params.to_vec();
    if secret {
        let n = auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
        v.push(MARKER);
        v.extend_from_slice(&n[..NONCE_LEN]);
    }
    Ok(v)
}

/// Whether the peer's private data demands authentication (it carries the marker).
pub(super) fn demands(private: &[u8]) -> bool {
    private.get(PARAMS_LEN) == Some(&MARKER) && private.len() >= OFFER_LEN
}

/// The transcript of both offers (each padded or cut to what it carries).
fn transcript(client: &[u8], server: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"rsrdma rdma_cm auth v1 transcript");
    for side in [client, server] {
        let mut fixed = [0u8; OFFER_LEN];
        let n = side.len().min(OFFER_LEN);
        fixed[..n].copy_from_slice(&side[..n]);
        h.update(fixed);
    }
    h.finalize().into()
}

/// Runs step 2 and 3 for `role` over the connected `qp`, within `deadline`. `client` and
/// `server` are the two private data as sent and received.
pub(super) fn prove(
    role: Role,
    secret: &[u8],
    (client, server): (&[u8], &[u8]),
    local: &mut Local,
    qp: &Qp,
    id: &CmId,
    deadline: Instant,
) -> Result<()> {
    let t = transcript(client, server);
    match role {
        Role::Client => {
            let mine = auth::client_proof(secret, &t);
            send_proof(qp, &mine)?;
            let theirs = wait(local, qp, id, deadline)?;
            if !auth::verify_proof(secret, Role::Server, &t, &mine, &theirs) {
                return Err(NetError::Auth(WRONG_PROOF.into()));
            }
        }
        Role::Server => {
            let theirs = wait(local, qp, id, deadline)?;
            if !auth::verify_proof(secret, Role::Client, &t, &[], &theirs) {
                // Nothing derived from the secret has gone to this peer; the caller drops
                // the connection.
                return Err(NetError::Auth(WRONG_PROOF.into()));
            }
            let mine = auth::server_proof(secret, &t, &theirs);
            send_proof(qp, &mine)?;
        }
    }
    Ok(())
}

fn send_proof(qp: &Qp, proof: &[u8; PROOF_LEN]) -> Result<()> {
    // Inline: the bytes are copied at the post, so no memory of ours stays in use (the core,
    // which may start right after, owns every slot). The QP allows at least PROOF_LEN
    // inline bytes when a secret is set (`Local::new`).
    let sge = [rsrdma::Sge::inline(proof)];
    let wr = SendWr::send(PROOF_WR_ID, &sge).signaled(true).inline();
    // SAFETY: an inline send's bytes are read during the call; nothing else is named.
    unsafe { qp.post_send(&wr) }?;
    Ok(())
}

/// Polls until the peer's proof arrived, reposting the receive slot it used. The peer's
/// disconnect, a failed completion or the deadline end it.
fn wait(local: &mut Local, qp: &Qp, id: &CmId, deadline: Instant) -> Result<[u8; PROOF_LEN]> {
    let mut got = None;
    poll_until(local, id, deadline, |local, wc| {
        if wc.wr_id() & RECV_TAG != 0 {
            let slot = (wc.wr_id() & 0xffff) as u16;
            if wc.byte_len() as usize != PROOF_LEN {
                return Err(NetError::Auth(
                    "the peer sent something other than a proof first".into(),
                ));
            }
            let mut proof = [0u8; PROOF_LEN];
            local.slots.read_recv(slot, 0, &mut proof);
            let sge = [local.slots.recv_sge(slot).ok_or_else(|| {
                NetError::InvalidArgument("the proof landed outside the receive slots".into())
            })?];
            let wr = RecvWr::new(wc.wr_id(), &sge);
            // SAFETY: as `Local::post_receives`: the slot is registered memory the driver
            // keeps until the QP's flush; its bytes were copied out just above.
            unsafe { qp.post_recv(&wr) }?;
            got = Some(proof);
        }
        Ok(got.is_some())
    })?;
    got.ok_or_else(|| NetError::Auth("no proof arrived".into()))
}

/// Polls the CQ (and the id's events) until `seen` says done.
fn poll_until(
    local: &mut Local,
    id: &CmId,
    deadline: Instant,
    mut seen: impl FnMut(&mut Local, &Wc) -> Result<bool>,
) -> Result<()> {
    // One at a time: what follows the peer's proof belongs to the driver.
    let mut wcs = [Wc::default(); 1];
    let started = Instant::now();
    loop {
        let n = local.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(NetError::Auth(format!(
                    "the connection failed during authentication ({}): the peer refused this \
                     side's proof, or left",
                    wc.status().description()
                )));
            }
            if seen(local, wc)? {
                return Ok(());
            }
        }
        if let Some(ev) = id.try_next_event()? {
            if matches!(
                ev.kind,
                CmEventType::DISCONNECTED | CmEventType::DEVICE_REMOVAL
            ) {
                return Err(NetError::Auth(
                    "the peer disconnected during authentication: it refused this side's \
                     proof (a different secret?)"
                        .into(),
                ));
            }
        }
        if Instant::now() >= deadline {
            return Err(NetError::Timeout {
                op: "rdma_cm authentication",
                millis: started.elapsed().as_millis().try_into().unwrap_or(u64::MAX),
            });
        }
        if n == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_carry_a_nonce_only_with_a_secret_and_fit_the_connect_request() {
        let p = [7u8; PARAMS_LEN];
        let plain = offer(&p, false).unwrap();
        assert_eq!(plain, p);
        assert!(!demands(&plain));
        let mut padded = plain.clone();
        padded.resize(56, 0);
        assert!(!demands(&padded), "zero padding is no marker");
        let with = offer(&p, true).unwrap();
        assert!(with.len() <= 56, "a connect request carries 56 bytes");
        assert!(demands(&with));
        assert_ne!(offer(&p, true).unwrap(), with, "fresh nonces");
        // Padding does not change the transcript; another nonce does.
        let mut padded = with.clone();
        padded.resize(56, 0);
        assert_eq!(transcript(&with, &plain), transcript(&padded, &plain));
        assert_ne!(
            transcript(&with, &plain),
            transcript(&offer(&p, true).unwrap(), &plain)
        );
    }
}
