//! The TCP path: the project's handshake ([`crate::handshake::Channel`]): optional
//! authentication, then endpoints. The [`rsrdma_proto::Params`] ride in the endpoint's
//! `params` as four 64-bit words under keys of the sender's role (client `0xC100..`, server
//! `0xC200..`), so the handshake's "equal keys must match" rule never compares the two
//! announcements: [`rsrdma_proto::settle`] combines them instead. Receives are posted after
//! the QP is brought up and before the closing barrier. The TCP connection then stays open as
//! the liveness signal: its end means the peer is gone.

use super::{decode_params, refuse_shared_recv_on_dial, Established, Local, RecvFrom, RNR_RETRY};
use crate::conn::driver::Liveness;
use crate::conn::options::{ConnOptions, Establish};
use crate::conn::pool::{RecvPools, MIN_RNR_TIMER, RNR_RETRY_FOREVER};
use crate::deadline::{deadline_after, whole_millis};
use crate::error::{NetError, Result};
use crate::handshake::{Channel, Endpoint, Role, Standing};
use rsrdma::{ConnectOptions, Mtu, Qp, QpEndpoint};
use rsrdma_proto::{settle, Params, PARAMS_LEN};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The key, under the server's role, of the RNR retry count the server asks the client's QP
/// to use (a listener with a shared pool asks for 7, without limit); absent: [`RNR_RETRY`].
const KEY_RNR_RETRY: u16 = 0xC200 + (PARAMS_LEN / 8) as u16;

/// Runs the server's handshake over an accepted stream, receiving from `pools`' pool if the
/// listener has one.
///
/// It gives the peer [`ConnOptions::opening_timeout`] to open (hello and proof; without a
/// secret, hello and its endpoint after it), then moves `standing` on (so its listener sheds
/// it only if it is unproven and stalls).
pub(crate) fn accept(
    stream: TcpStream,
    opts: &ConnOptions,
    pools: Option<&RecvPools>,
    standing: Option<Arc<Standing>>,
) -> Result<Established> {
    let limits = (opts.connect_timeout, opts.opening_timeout);
    let until = (deadline_after(opts.connect_timeout), opts.connect_timeout);
    let (local_addr, peer_addr) = addrs(&stream)?;
    let mut ch = Channel::open_until(
        stream,
        Role::Server,
        limits,
        Some(until),
        opts.secret.as_deref(),
        standing,
    )?;
    let set_up = serve(&mut ch, opts, pools);
    finish(ch, set_up, opts, (local_addr, peer_addr))
}

/// The server's side after the opening: the client's endpoint first, and only then this
/// side's queue pair and memory. So a peer that sent a hello alone holds none of them, and a
/// burst of clients from one host ends each one's opening (which a listener sheds beyond
/// `max_handshakes_per_source`) as soon as its endpoint arrives, not after the server made
/// a queue pair for each of those before it.
fn serve(
    ch: &mut Channel,
    opts: &ConnOptions,
    pools: Option<&RecvPools>,
) -> Result<(Local, Qp, Params)> {
    let peer_ep = ch.recv_endpoint()?;
    let p = prepare(opts, pools, Role::Server)?;
    let agreed = ch.answer_endpoint(&p.endpoint, &peer_ep, |k| format!("parameter {k:#x}"))?;
    bring_up(ch, opts, p, peer_ep, agreed)
}

/// The client's side, for one address: its queue pair and memory are made before the TCP
/// connection, so the listener's opening deadline (`opening_timeout`, from its accept to the
/// client's endpoint) counts only the network: a client whose set-up takes long (a large
/// registration, a loaded machine, a burst of dials from one host) is neither cut off nor
/// shed as a silent socket.
pub(crate) fn dial(addr: std::net::SocketAddr, opts: &ConnOptions) -> Result<Established> {
    refuse_shared_recv_on_dial(opts)?;
    // One deadline for the whole establishment, as on rdma_cm: a listener that answers each
    // step just in time cannot stretch a dial to a multiple of the limit.
    let until = (deadline_after(opts.connect_timeout), opts.connect_timeout);
    dial_until(addr, opts, until).map_err(|e| naming_connect_timeout(e, until))
}

/// A dial's failure for want of time names the option whose limit ran out, as the rdma_cm
/// dial's does (it named the step it was at: "handshake hello timed out after 1500 ms", or,
/// in the TCP connect, "connect: connection timed out"; an outside tester's note). The step
/// goes to the log.
fn naming_connect_timeout(e: NetError, (deadline, limit): (Instant, Duration)) -> NetError {
    let ran_out = match &e {
        NetError::Timeout { .. } => true,
        NetError::Io { source, .. } => source.kind() == std::io::ErrorKind::TimedOut,
        _ => false,
    };
    if !ran_out || Instant::now() < deadline {
        return e;
    }
    tracing::debug!(step = %e, "the TCP dial's connect_timeout ran out");
    NetError::Timeout {
        op: "the TCP dial (ConnOptions::connect_timeout)",
        millis: whole_millis(limit),
    }
}

/// [`dial`] within `until` (its deadline, and the limit that set it).
fn dial_until(
    addr: std::net::SocketAddr,
    opts: &ConnOptions,
    until: (Instant, Duration),
) -> Result<Established> {
    let prepared = prepare(opts, None, Role::Client)?;
    let left = until.0.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(NetError::Timeout {
            op: "setting up the dialer's queue pair and memory",
            millis: whole_millis(opts.connect_timeout),
        });
    }
    let stream = TcpStream::connect_timeout(&addr, left)
        .map_err(|e| super::super::tcp_connect_error(addr, e))?;
    let limits = (opts.connect_timeout, opts.opening_timeout);
    let (local_addr, peer_addr) = addrs(&stream)?;
    let secret = opts.secret.as_deref();
    let mut ch = Channel::open_until(stream, Role::Client, limits, Some(until), secret, None)
        .map_err(|e| {
            e.closed_without_a_hello(
                addr,
                "the TCP handshake (Establish::Tcp)",
                "something there took the connection and closed it without a hello: a \
                 Listener bound with Establish::Cm (dial it with Establish::Cm), a Listener \
                 closing as the dial came, or another service",
            )
        })?;
    let set_up = exchange(&mut ch, opts, prepared);
    finish(ch, set_up, opts, (local_addr, peer_addr))
}

/// The stream's two ends.
fn addrs(stream: &TcpStream) -> Result<(std::net::SocketAddr, std::net::SocketAddr)> {
    let local = stream
        .local_addr()
        .map_err(|e| NetError::io("local_addr", e))?;
    let peer = stream
        .peer_addr()
        .map_err(|e| NetError::io("peer_addr", e))?;
    Ok((local, peer))
}

/// Hands the set-up connection its driver, or tells the peer why it failed, so it does not
/// wait for a step that will never come.
fn finish(
    mut ch: Channel,
    set_up: Result<(Local, Qp, Params)>,
    opts: &ConnOptions,
    addrs: (std::net::SocketAddr, std::net::SocketAddr),
) -> Result<Established> {
    let (local, qp, peer) = match set_up {
        Ok(p) => p,
        Err(e @ (NetError::Verbs(_) | NetError::InvalidArgument(_) | NetError::ConnFailed(_))) => {
            return Err(ch.abort(e))
        }
        Err(e @ NetError::Timeout { .. }) => return Err(ch.abort_timed_out(e)),
        Err(e) => return Err(e),
    };
    // Established: the channel's later waits (the close) have their own limits.
    ch.unbound();
    local.finish(
        qp,
        &peer,
        Liveness::Tcp(Box::new(ch)),
        (Establish::Tcp, opts),
        addrs,
    )
}

/// This side's queue pair and memory, and the endpoint that announces them.
struct Prepared {
    local: Local,
    qp: Qp,
    me: QpEndpoint,
    gid_index: Option<u8>,
    pooled: bool,
    endpoint: Endpoint,
}

/// Makes this side's queue pair and memory (receiving from `pools`' pool, if the listener
/// has one) and its endpoint, for `role`.
fn prepare(opts: &ConnOptions, pools: Option<&RecvPools>, role: Role) -> Result<Prepared> {
    let (ctx, pd) = crate::domain::open_domain(opts.device.as_deref(), opts.pd.as_ref())?;
    let port = ctx.query_port(opts.port)?;
    let gid_index = ctx.resolve_gid_index(opts.port, opts.gid_index)?;
    let mut from = RecvFrom::default();
    let mut pd = pd;
    if let Some(pools) = pools {
        from.pool = pools.pool_on(&ctx, opts)?;
        from.account = Some(pools.account.clone());
        if let Some(pool) = &from.pool {
            pd = pool.pd().clone();
        }
    }
    let local = Local::new(pd, opts, from)?;
    let pooled = local.pooled();
    let qp = local.builder.build(&local.pd, &local.cq, &local.cq)?;
    let psn = random_psn()?;
    let me = qp.endpoint(opts.port, gid_index, psn)?;
    let mtu = port.active_mtu.unwrap_or(Mtu::Mtu1024);
    let endpoint = Endpoint {
        qp_num: me.qp_num,
        psn: me.psn,
        lid: me.lid,
        gid: me.gid,
        gid_index: gid_index.unwrap_or(0),
        mtu: mtu.bytes() as u16,
        qp_type: 0,
        send_depth: qp.caps().max_send_wr,
        recv_depth: qp.caps().max_recv_wr,
        max_inline: qp.caps().max_inline_data,
        max_rd_atomic: 0,
        max_dest_rd_atomic: 0,
        params: {
            let mut words = params_to_words(&local.config.params(), role);
            if pooled {
                words.push((KEY_RNR_RETRY, u64::from(RNR_RETRY_FOREVER)));
            }
            words
        },
    };
    Ok(Prepared {
        local,
        qp,
        me,
        gid_index,
        pooled,
        endpoint,
    })
}

/// Swaps endpoints over `ch`, settles, brings the queue pair up and posts the receives.
fn exchange(ch: &mut Channel, opts: &ConnOptions, p: Prepared) -> Result<(Local, Qp, Params)> {
    let (peer_ep, agreed) = ch.exchange_endpoints(&p.endpoint, |k| format!("parameter {k:#x}"))?;
    bring_up(ch, opts, p, peer_ep, agreed)
}

/// With both endpoints known and settled (`agreed`): checks the peer's parameters, brings
/// the queue pair up, posts the receives and meets the peer at the closing barrier.
fn bring_up(
    ch: &mut Channel,
    opts: &ConnOptions,
    p: Prepared,
    peer_ep: Endpoint,
    agreed: crate::handshake::Settled,
) -> Result<(Local, Qp, Params)> {
    let Prepared {
        local,
        qp,
        me,
        gid_index,
        pooled,
        endpoint: _,
    } = p;
    let peer_role = match ch.role() {
        Role::Client => Role::Server,
        Role::Server => Role::Client,
    };
    let peer = params_from_words(&peer_ep.params, peer_role)?;
    settle(&local.config.params(), &peer).map_err(NetError::ConnFailed)?;
    // A server with a shared pool asks for more RNR retries than the default, never fewer.
    let rnr_retry = peer_ep
        .params
        .iter()
        .find(|(k, _)| ch.role() == Role::Client && *k == KEY_RNR_RETRY)
        .map_or(RNR_RETRY, |(_, v)| {
            (*v).clamp(u64::from(RNR_RETRY), 7) as u8
        });
    let mut bring_up = ConnectOptions::default()
        .port(opts.port)
        .gid_index(gid_index)
        .mtu(Mtu::from_bytes(agreed.mtu.into()).unwrap_or(Mtu::Mtu1024))
        .rnr_retry(rnr_retry)
        // Rendezvous: the peer READs messages we expose (per-message regions, remote read
        // only); read depths are the device's maximum (≥ 1) by default.
        .access(if opts.rendezvous.is_some() {
            rsrdma::AccessFlags::REMOTE_READ
        } else {
            rsrdma::AccessFlags::NONE
        });
    if pooled {
        bring_up = bring_up.min_rnr_timer(MIN_RNR_TIMER);
    }
    // From here the QP may receive: a failure gives back what the peer's SENDs took.
    let ready = qp
        .connect(&bring_up, me.psn, &QpEndpoint::from(&peer_ep))
        .map_err(NetError::from)
        .and_then(|()| local.post_receives(&qp))
        // Both sides have every receive posted before either may send.
        .and_then(|()| ch.closing_barrier(0));
    if let Err(e) = ready {
        local.abandon(qp);
        return Err(e);
    }
    Ok((local, qp, peer))
}

fn key_base(role: Role) -> u16 {
    match role {
        Role::Client => 0xC100,
        Role::Server => 0xC200,
    }
}

/// The 32 announcement bytes as four little-endian words under `role`'s keys.
pub(crate) fn params_to_words(p: &Params, role: Role) -> Vec<(u16, u64)> {
    let bytes = p.encode();
    (0..PARAMS_LEN / 8)
        .map(|i| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            (key_base(role) + i as u16, u64::from_le_bytes(w))
        })
        .collect()
}

/// The peer's announcement from its words; missing words mean a peer that is no Conn.
pub(crate) fn params_from_words(words: &[(u16, u64)], role: Role) -> Result<Params> {
    let mut bytes = [0u8; PARAMS_LEN];
    for i in 0..PARAMS_LEN / 8 {
        let key = key_base(role) + i as u16;
        let Some((_, v)) = words.iter().find(|(k, _)| *k == key) else {
            return Err(NetError::InvalidArgument(
                "the peer announced no Conn protocol parameters (is it a RawConn?)".into(),
            ));
        };
        bytes[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    decode_params(&bytes)
}

fn random_psn() -> Result<u32> {
    let n = crate::handshake::auth::nonce().map_err(|e| NetError::io("read /dev/urandom", e))?;
    Ok(u32::from_be_bytes([0, n[0], n[1], n[2]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsrdma_proto::Config;

    #[test]
    fn params_round_trip_through_words_of_either_role() {
        let p = Config::default().with_recv_slots(64).params();
        for role in [Role::Client, Role::Server] {
            let words = params_to_words(&p, role);
            assert_eq!(words.len(), 4);
            assert_eq!(params_from_words(&words, role).unwrap(), p);
        }
        let client = params_to_words(&p, Role::Client);
        let e = params_from_words(&client, Role::Server).unwrap_err();
        assert!(e.to_string().contains("no Conn protocol"), "{e}");
    }
}
