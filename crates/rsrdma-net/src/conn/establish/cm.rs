//! The rdma_cm path. The client's [`rsrdma_proto::Params`] travel in the connect private
//! data (32 of 56 bytes), the server's in the accept private data (32 of 196); the 4-byte
//! magic and the version bytes at their start identify an rsrdma Conn peer. A request whose
//! announcement is malformed or incompatible is rejected with the reason as reject private
//! data, so the client's error says why. Receives are posted between `rdma_create_qp` (which
//! leaves the QP in INIT) and `rdma_connect`/`rdma_accept`.

use super::{
    cm_auth, decode_params, refuse_shared_recv_on_dial, Established, Local, RecvFrom, RNR_RETRY,
};
use crate::conn::driver::Liveness;
use crate::conn::options::{ConnOptions, Establish};
use crate::conn::pool::{RecvPools, MIN_RNR_TIMER, RNR_RETRY_FOREVER};
use crate::error::{NetError, Result};
use crate::handshake::{Role, Standing};
use rsrdma::cm::{CmEventType, CmId, ConnParam, ConnectRequest};
use rsrdma_proto::settle;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

/// The IB CM reject reason for a connect request nobody listens for (invalid service ID).
const NO_LISTENER: i32 = 8;
/// The REJ status of a consumer's reject (`IB_CM_REJ_CONSUMER_DEFINED`).
const CONSUMER_REJECT: i32 = 28;
/// Prefix of the reject private data that carries a reason.
const REJECT_PREFIX: &[u8] = b"RSCP reject: ";

/// Connects to `addr`, all within `opts.connect_timeout`.
pub(crate) fn dial(addr: SocketAddr, opts: &ConnOptions) -> Result<Established> {
    refuse_shared_recv_on_dial(opts)?;
    // A listener bound to the unspecified address reports it as its own: dialled as such,
    // rdma_cm said only "Network is unreachable" (an outside tester, following the guide,
    // could not tell what to dial instead).
    if addr.ip().is_unspecified() {
        return Err(NetError::InvalidArgument(format!(
            "cannot dial the unspecified address {addr} over rdma_cm (a listener bound to it \
             reports it as its address): dial an address of the listener's RDMA device \
             (127.0.0.1 on the software device soft0)"
        )));
    }
    let deadline = crate::deadline::deadline_after(opts.connect_timeout);
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    // rdma_cm's own timeouts ("rdma_connect timed out after …") become the dial's, naming
    // the option that set them, as on the TCP path.
    let timed_out = |e: rsrdma::Error| match e {
        rsrdma::Error::Timeout { .. } => NetError::Timeout {
            op: "the rdma_cm dial (ConnOptions::connect_timeout)",
            millis: crate::deadline::whole_millis(opts.connect_timeout),
        },
        e => NetError::from(e),
    };
    let id = CmId::new()?;
    id.resolve_addr(None, addr, left()).map_err(timed_out)?;
    id.resolve_route(left()).map_err(timed_out)?;
    let ctx = id.context()?;
    let mut local = Local::new(opts.domain_on(&ctx)?, opts, RecvFrom::default())?;
    let qp = id.create_qp(&local.pd, &local.builder, &local.cq, &local.cq)?;
    local.post_receives(&qp)?;
    let secret = opts.secret.as_deref();
    let mine = cm_auth::offer(&local.config.params().encode(), secret.is_some())?;
    let announce = ConnParam::default()
        .with_private_data(mine.clone())
        .with_rnr_retry_count(RNR_RETRY);
    // The QP grants what a Conn's peer needs (READ, for rendezvous) from the start, and
    // nothing at all to a listener that has yet to prove the secret (rdma_cm's own connect
    // would grant REMOTE_WRITE to whoever answers: to every region of a shared protection
    // domain).
    let grant = granted(opts);
    let first = match secret {
        Some(_) => rsrdma::AccessFlags::NONE,
        None => grant,
    };
    let reply = id
        .connect_granting(&qp, &announce, first, left())
        .map_err(|e| match e {
            e @ rsrdma::Error::Timeout { .. } => timed_out(e),
            e => rejected(e, addr),
        })?;
    let peer = decode_params(&reply)?;
    match (secret, cm_auth::demands(&reply)) {
        (Some(s), true) => cm_auth::prove(
            Role::Client,
            s,
            (&mine, &reply),
            &mut local,
            &qp,
            &id,
            deadline,
        )?,
        (Some(_), false) => {
            return Err(NetError::Auth(
                "the listener does not prove the shared secret (it has none, or is an older \
                 version): refusing the connection"
                    .into(),
            ))
        }
        // A listener that demands a secret rejects a request without one, so it never
        // accepts this one; refuse anyway rather than talk to it unauthenticated.
        (None, true) => return Err(NetError::Auth(crate::handshake::NO_SECRET_HERE.into())),
        (None, false) => {}
    }
    if secret.is_some() {
        qp.set_access(grant)?;
    }
    let addrs = addrs_of(&id, addr);
    local.finish(qp, &peer, Liveness::Cm(id), (Establish::Cm, opts), addrs)
}

/// The reject private data that says `why`: the prefix and as much of the reason as the
/// IB CM's REJ carries (cut at a character boundary: the kernel refuses longer data, and the
/// dialer would then wait out its timeout instead of reading the reason).
pub(crate) fn reject_data(why: &str) -> Vec<u8> {
    let room = rsrdma::cm::MAX_REJECT_PRIVATE_DATA - REJECT_PREFIX.len();
    let mut end = why.len().min(room);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    let mut data = REJECT_PREFIX.to_vec();
    data.extend_from_slice(&why.as_bytes()[..end]);
    data
}

/// Refuses, with the reason, the connect requests waiting on a listener's id that nobody
/// took (the listener is being dropped): their dialers read "the peer aborted: the listener
/// closed before …" instead of a bare consumer reject (an outside tester's find).
pub(crate) fn refuse_waiting_requests(id: &rsrdma::cm::CmId) {
    const WHY: &str = "the listener closed before anyone accepted this connection";
    while let Ok(Some(ev)) = id.try_next_event() {
        if let Some(req) = ev.request {
            let _ = req.id.reject(&reject_data(WHY));
        }
    }
}

/// Accepts one connect request, receiving from the listener's pool if it has one. A
/// failure is counted in `standing` before the peer can hear of it (a refusal, or the
/// disconnect when the id drops).
pub(crate) fn accept(
    req: ConnectRequest,
    opts: &ConnOptions,
    pools: &RecvPools,
    standing: &Standing,
) -> Result<Established> {
    let id = req.id;
    let peer_seen = id.peer_addr();
    // Refuse a bad announcement before building anything, and say why.
    let refuse = |id: &CmId, e: NetError| {
        standing.count_failure();
        let _ = id.reject(&reject_data(&e.to_string()));
        e
    };
    let peer = match decode_params(&req.private_data) {
        Ok(p) => p,
        Err(e) => return Err(refuse(&id, e)),
    };
    // The opening, as on the TCP path: a peer has `opening_timeout` from its request until
    // the connection is up and, with a secret, its proof checked. A stranger that never
    // proves (or never answers the accept) holds the listener's place, a queue pair and its
    // memory that long, not for the whole handshake's limit (rdma_cm requests are never shed).
    let opening = opts.opening_timeout.min(opts.connect_timeout);
    let deadline = crate::deadline::deadline_after(opening);
    match (opts.secret.is_some(), cm_auth::demands(&req.private_data)) {
        (true, false) => {
            return Err(refuse(
                &id,
                NetError::Auth(
                    "this listener requires a shared secret: set the same ConnOptions::secret \
                     on the dialer"
                        .into(),
                ),
            ))
        }
        (false, true) => {
            return Err(refuse(
                &id,
                NetError::Auth(
                    "the dialer requires a shared secret and this listener has none".into(),
                ),
            ))
        }
        _ => {}
    }
    if let Err(e) = settle(&opts.proto_config(0).params(), &peer) {
        return Err(refuse(&id, NetError::ConnFailed(e)));
    }
    let ctx = id.context()?;
    let pool = pools.pool_on(&ctx, opts).map_err(|e| refuse(&id, e))?;
    let pd = match &pool {
        Some(p) => p.pd().clone(),
        None => opts.domain_on(&ctx).map_err(|e| refuse(&id, e))?,
    };
    let from = RecvFrom {
        pool,
        account: Some(pools.account.clone()),
    };
    let mut local = Local::new(pd, opts, from).map_err(|e| refuse(&id, e))?;
    // (A domain of another context of the device than rdma_cm's is refused here.)
    let qp = id
        .create_qp(&local.pd, &local.builder, &local.cq, &local.cq)
        .map_err(|e| refuse(&id, e.into()))?;
    // Refused with the reason, as every failure before the accept is: a dropped id rejects
    // without one ("a reject that gives no reason: not an rsrdma listener…", read by a
    // dialer of a live listener whose queue pair had failed: an outside tester's find).
    local.post_receives(&qp).map_err(|e| refuse(&id, e))?;
    // The accept's RNR retry count is the one the *peer's* QP uses: with a pool that may run
    // empty for a moment, it retries without limit.
    let rnr_retry = if local.pooled() {
        RNR_RETRY_FOREVER
    } else {
        RNR_RETRY
    };
    let offer = cm_auth::offer(&local.config.params().encode(), opts.secret.is_some())
        .map_err(|e| refuse(&id, e))?;
    let reply = ConnParam::default()
        .with_private_data(offer.clone())
        .with_rnr_retry_count(rnr_retry);
    // The QP grants what a Conn's peer needs (READ, for rendezvous) from the start, and
    // nothing at all to a peer that has yet to prove the secret (rdma_cm's own accept would
    // grant REMOTE_WRITE to anyone: to every region of a shared protection domain).
    let grant = granted(opts);
    let first = match opts.secret {
        Some(_) => rsrdma::AccessFlags::NONE,
        None => grant,
    };
    // From the accept the QP may receive: a failure gives back what the peer's SENDs took.
    let accepted = id
        .accept_granting(
            &reply,
            first,
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        )
        .map_err(NetError::from)
        .and_then(|()| match opts.secret.as_deref() {
            // Before any core exists: nothing is delivered, and nothing exposed, until the
            // client has proven the secret. A failure drops the id, which disconnects.
            Some(secret) => cm_auth::prove(
                Role::Server,
                secret,
                (&req.private_data, &offer),
                &mut local,
                &qp,
                &id,
                deadline,
            )
            .and_then(|()| qp.set_access(grant).map_err(NetError::from)),
            None => Ok(()),
        });
    if let Err(e) = accepted {
        standing.count_failure();
        // An accept that failed before its answer went (bringing the queue pair up) can
        // still say why; after it (the proof), the reject is refused and the id's drop
        // disconnects.
        let _ = id.reject(&reject_data(&e.to_string()));
        local.abandon(qp);
        return Err(e);
    }
    if local.pooled() {
        // rdma_cm brings the QP up with a 655 ms RNR timer; an empty pool should cost less.
        if let Err(e) = qp.set_min_rnr_timer(MIN_RNR_TIMER) {
            tracing::debug!(error = %e, "rsrdma-net: keeping rdma_cm's RNR timer");
        }
    }
    let fallback = peer_seen.unwrap_or_else(|| SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    let addrs = addrs_of(&id, fallback);
    local.finish(qp, &peer, Liveness::Cm(id), (Establish::Cm, opts), addrs)
}

/// What a connection's peer may do to this side's memory through its queue pair: READ the
/// messages it is offered, when rendezvous is on (as the TCP path grants); nothing else.
fn granted(opts: &ConnOptions) -> rsrdma::AccessFlags {
    match opts.rendezvous {
        Some(_) => rsrdma::AccessFlags::REMOTE_READ,
        None => rsrdma::AccessFlags::NONE,
    }
}

fn addrs_of(id: &CmId, peer_fallback: SocketAddr) -> (SocketAddr, SocketAddr) {
    let unspecified = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    (
        id.local_addr().unwrap_or(unspecified),
        id.peer_addr().unwrap_or(peer_fallback),
    )
}

/// A rejection that carries our reason becomes [`NetError::PeerAborted`] with it; one for
/// want of a listener (reject reason 8, invalid service ID) becomes
/// [`NetError::NotListening`], which names the other path.
fn rejected(e: rsrdma::Error, addr: SocketAddr) -> NetError {
    if let rsrdma::Error::CmEvent {
        got: CmEventType::REJECTED,
        private_data,
        status,
        ..
    } = &e
    {
        if *status == NO_LISTENER {
            return NetError::NotListening {
                addr,
                path: "rdma_cm (Establish::Cm)",
                hint: "is the server running, on this port? A Listener bound with \
                       Establish::Tcp takes no rdma_cm connections: if that is what listens \
                       there, dial it with Establish::Tcp",
            };
        }
        if let Some(rest) = private_data.strip_prefix(REJECT_PREFIX) {
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            let why = String::from_utf8_lossy(&rest[..end]).into_owned();
            // A listener that refused this side's authentication: an `Auth` failure here.
            return crate::handshake::refused_by_peer(NetError::PeerAborted(why));
        }
        if *status == CONSUMER_REJECT {
            // Refused by the application at that address, giving no reason of ours (not an
            // rsrdma listener, or one whose id went away): say that, not the event's dump.
            return NetError::PeerAborted(format!(
                "the peer at {addr} refused the connection (an rdma_cm reject that gives no \
                 reason: not an rsrdma listener, or one that went away)"
            ));
        }
    }
    // soft0's CM reaches the port and finds no CM there (a TCP-path Listener reads its
    // request as garbage and resets it).
    if let rsrdma::Error::CmEvent {
        got: CmEventType::UNREACHABLE,
        status,
        ..
    } = &e
    {
        if *status == -libc::ECONNRESET {
            return NetError::NotListening {
                addr,
                path: "rdma_cm (Establish::Cm)",
                hint: "something answered there but not rdma_cm: a Listener bound with \
                       Establish::Tcp takes no rdma_cm connections: dial it with Establish::Tcp \
                       (or an rdma_cm Listener was closing as the request came)",
            };
        }
    }
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reject_reason_fits_the_rej_and_is_cut_at_a_character_boundary() {
        let short = reject_data("too many handshakes");
        assert_eq!(&short[..REJECT_PREFIX.len()], REJECT_PREFIX);
        assert_eq!(&short[REJECT_PREFIX.len()..], b"too many handshakes");
        // A long reason of two-byte characters: cut to fit, never inside a character.
        let long = "é".repeat(200);
        let data = reject_data(&long);
        assert!(data.len() <= rsrdma::cm::MAX_REJECT_PRIVATE_DATA);
        assert!(data.len() >= rsrdma::cm::MAX_REJECT_PRIVATE_DATA - 1);
        assert!(std::str::from_utf8(&data[REJECT_PREFIX.len()..]).is_ok());
    }
}
