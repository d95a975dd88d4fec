//! Establishment: both paths build the same things in the same order.
//!
//! 1. The device, domain, one completion channel and one CQ (room for every receive and
//!    every send-queue entry), the RC queue pair, and the slot memory.
//! 2. Every receive slot is posted before the peer can send (rdma_cm: before
//!    `rdma_connect`/`rdma_accept`; TCP: before the closing barrier).
//! 3. Each side announces its versioned [`rsrdma_proto::Params`] (rdma_cm private data, or
//!    the TCP endpoint message) and both run [`rsrdma_proto::settle`]: a mismatch or an
//!    incompatible version is a clear error on both ends, not a later LOCAL_LENGTH error.
//! 4. The protocol core and the driver take over.
//!
//! A listener with a shared receive pool ([`super::pool`]) creates its QPs on the pool's
//! domain, attached to the pool's SRQ, posts nothing in step 2 (the pool's slots are on the
//! SRQ already), and has its peers retry an RNR without limit.

pub(crate) mod cm;
mod cm_auth;
pub(crate) mod tcp;

use super::driver::{Driver, Liveness};
use super::info::ConnInfo;
use super::options::{ConnOptions, Establish};
use super::pool::{RecvAccount, RecvPool};
use super::slots::Slots;
use crate::error::{NetError, Result};
use rsrdma::{CompChannel, Context, Cq, Pd, Qp, QpBuilder, QpCaps, QpType, RecvWr};
use rsrdma_proto::{settle, Config, Params, PARAMS_LEN};
use std::net::SocketAddr;
use std::sync::Arc;

/// RNR retries on both paths: with credits there is never an RNR, so a few retries turn a bug
/// into an error instead of a silent stall. (A listener with a shared pool, whose pool may
/// run empty for a moment, has its peers retry without limit instead.)
const RNR_RETRY: u8 = 3;
use std::time::Instant;

/// An established connection, before it gets its threads.
pub(crate) struct Established {
    pub(crate) driver: Driver,
    pub(crate) cq: Cq,
    pub(crate) info: ConnInfo,
    pub(crate) local_addr: SocketAddr,
    pub(crate) peer_addr: SocketAddr,
}

/// Where an accepted connection's receives come from, and whose account they count in.
#[derive(Default)]
pub(crate) struct RecvFrom {
    /// The listener's shared pool, if it has one.
    pub(crate) pool: Option<Arc<RecvPool>>,
    /// The listener's receive-memory account (`None` for a dialed connection).
    pub(crate) account: Option<Arc<RecvAccount>>,
}

/// Refuses [`ConnOptions::shared_recv`] on the dialing side.
pub(crate) fn refuse_shared_recv_on_dial(opts: &ConnOptions) -> Result<()> {
    if opts.shared_recv.is_some() {
        return Err(NetError::InvalidArgument(
            "ConnOptions::shared_recv is a Listener option; Conn::dial does not take it".into(),
        ));
    }
    Ok(())
}

use super::info::{
    RendezvousMode, RENDEZVOUS_NOT_REQUESTED, RENDEZVOUS_PEER_OFF, RENDEZVOUS_SHARED_PD,
};

/// How this side may expose messages for rendezvous (F7): never through a registration on a
/// shared protection domain, whose rkey other connections' QPs could use.
fn rendezvous_mode(requested: bool, windows: bool, shared_pd: bool) -> RendezvousMode {
    match (requested, windows, shared_pd) {
        (false, ..) => RendezvousMode::Off(RENDEZVOUS_NOT_REQUESTED),
        (true, true, _) => RendezvousMode::Windows,
        (true, false, false) => RendezvousMode::Registrations,
        (true, false, true) => RendezvousMode::Off(RENDEZVOUS_SHARED_PD),
    }
}

#[cfg(test)]
mod rendezvous_tests {
    use super::*;

    /// F7: on a shared PD without windows, rendezvous is not offered (before: it was, through
    /// a registration any QP of the PD could READ by guessing its key).
    #[test]
    fn a_shared_pd_without_windows_never_offers_rendezvous() {
        assert_eq!(
            rendezvous_mode(true, false, true),
            RendezvousMode::Off(RENDEZVOUS_SHARED_PD)
        );
        assert_eq!(
            rendezvous_mode(true, false, false),
            RendezvousMode::Registrations
        );
        assert_eq!(rendezvous_mode(true, true, true), RendezvousMode::Windows);
        assert!(matches!(
            rendezvous_mode(false, true, false),
            RendezvousMode::Off(_)
        ));
    }
}

/// Send SGEs a connection asks for (a lent frame's header and payload).
pub(crate) const SEND_SGES: u32 = 2;

/// Step 1: what exists before the exchange.
pub(crate) struct Local {
    pub(crate) pd: Pd,
    pub(crate) cq: Cq,
    pub(crate) slots: Slots,
    pub(crate) config: Config,
    pub(crate) builder: QpBuilder,
    /// How this side exposes messages it sends by rendezvous (or why it does not offer it).
    pub(crate) rendezvous: RendezvousMode,
}

/// The longest RDMA READ `ctx`'s device takes: the least `max_msg_sz` of its ports (the
/// connection's port is not known yet on rdma_cm's path; a device's ports report the same).
/// A rendezvous message longer than this is read in pieces: past it a READ fails, and the
/// connection with it (mlx5 devices report 1 GiB; a message may be up to 4 GiB).
fn max_read(ctx: &rsrdma::Context) -> u32 {
    (1..=ctx.attr().phys_port_cnt)
        .filter_map(|port| ctx.query_port(port).ok())
        .map(|p| p.max_msg_sz)
        .filter(|&m| m > 0)
        .min()
        .unwrap_or(rsrdma_proto::DEFAULT_MAX_READ)
}

impl Local {
    /// A set-up that fails once `qp` could receive (a peer that sends and then breaks off
    /// the handshake): with a shared pool, the SENDs that landed took pool slots whose
    /// completions sit in the CQ, and a completion destroyed with its CQ takes its slot with
    /// it. So the QP goes to ERROR and the CQ is drained as a teardown drains it (at most a
    /// second), each pool slot given back, before the QP, then the memory, go.
    pub(crate) fn abandon(mut self, qp: Qp) {
        if self.slots.pooled() {
            if let Err(e) = qp.to_error() {
                tracing::debug!(error = %e, "moving an abandoned QP to ERROR failed");
            }
            let deadline = Instant::now() + std::time::Duration::from_secs(1);
            crate::conn::driver::drain_pool_completions(
                &self.cq,
                &mut self.slots,
                qp.qp_num(),
                deadline,
            );
        }
        drop(qp);
    }

    /// The CQ, the queue pair's builder and the slot memory on `pd` (with a pool, `pd` must
    /// be the pool's).
    pub(crate) fn new(pd: Pd, opts: &ConnOptions, from: RecvFrom) -> Result<Local> {
        let ctx = pd.context().clone();
        // Named by option, before a verb names its own field (max_recv_wr, cqe).
        opts.check_fits(&ctx)?;
        let max_inline = pd.max_inline_data(QpType::Rc)?;
        let mut config = opts.proto_config(max_inline).with_max_read(max_read(&ctx));
        // F7: without windows, a message is exposed through a registration whose rkey works
        // from every QP of its PD; on a shared PD those QPs belong to other connections.
        let windows = ctx.attr().has_type2_windows();
        let shared_pd = opts.pd.is_some() || from.pool.is_some();
        let rendezvous = rendezvous_mode(opts.rendezvous.is_some(), windows, shared_pd);
        if rendezvous == RendezvousMode::Off(RENDEZVOUS_SHARED_PD) {
            config.features &= !(rsrdma_proto::FEATURE_RENDEZVOUS | rsrdma_proto::FEATURE_WITHDRAW);
            tracing::info!(
                "rendezvous not offered: a shared protection domain on a device without \
                 memory windows would expose messages to other connections' QPs"
            );
        }
        if from.pool.is_some() {
            // The peer's frames may wait for room in the pool: it is told, so that its
            // liveness check allows for it (`FEATURE_SHARED_POOL`).
            config.features |= rsrdma_proto::FEATURE_SHARED_POOL;
        }
        config
            .check()
            .map_err(|e| NetError::InvalidArgument(format!("ConnOptions: {e}")))?;
        // A pooled connection's receives come from the shared pool, which has no limit per
        // QP: a peer that sends past its credits can make all of it complete on this CQ, and
        // an overrun CQ loses completions (and their pool slots) for good. Room for the whole
        // pool lets the driver see the overrun (a credit breach, which fails the connection)
        // and give every slot back.
        let recv_entries = match &from.pool {
            Some(pool) => pool.slots().max(u32::from(config.recv_slots)).min(
                ctx.attr()
                    .max_cqe
                    .saturating_sub(u32::from(config.sq_depth) + 1),
            ),
            None => u32::from(config.recv_slots),
        };
        let cq = make_cq(&ctx, &config, recv_entries)?;
        // Two SGEs per send where the device allows: a lent (zero-copy) frame is a header
        // from a send slot plus the payload in the caller's `Buffer`. With one, `send_buffer`
        // copies below the rendezvous threshold.
        let send_sge = ctx.attr().max_sge.clamp(1, SEND_SGES);
        // rdma_cm authentication sends one inline proof outside the core (`cm_auth`).
        let cm_auth = opts.secret.is_some() && opts.establish == crate::Establish::Cm;
        let (extra_wr, inline) = match cm_auth {
            true => (1, u32::from(config.inline_size).max(cm_auth::INLINE_NEEDED)),
            false => (0, u32::from(config.inline_size)),
        };
        let caps = QpCaps::default()
            .max_send_wr(u32::from(config.sq_depth) + extra_wr)
            .max_recv_wr(u32::from(config.recv_slots))
            .max_send_sge(send_sge)
            .max_recv_sge(1u32)
            .max_inline_data(inline);
        let mut builder = Qp::builder(QpType::Rc).caps(caps);
        if let Some(pool) = &from.pool {
            builder = builder.srq(pool.srq());
        }
        let slots = Slots::new(
            &pd,
            config.send_slots,
            config.recv_slots,
            config.slot_size,
            from.pool,
            from.account,
        )?;
        Ok(Local {
            pd,
            cq,
            slots,
            config,
            builder,
            rendezvous,
        })
    }

    /// Whether the receives come from a shared pool.
    pub(crate) fn pooled(&self) -> bool {
        self.slots.pooled()
    }

    /// Step 2: posts every receive slot (the QP must be in INIT or later); nothing with a
    /// pool, whose slots are on the SRQ.
    pub(crate) fn post_receives(&self, qp: &Qp) -> Result<()> {
        if self.pooled() {
            return Ok(());
        }
        for slot in 0..self.config.recv_slots {
            let sge = [self.slots.recv_sge(slot).ok_or_else(|| {
                NetError::InvalidArgument("a receive slot outside its region".into())
            })?];
            let wr = RecvWr::new(super::wr_id::recv_wr_id(slot), &sge);
            // SAFETY: the slot is in registered memory that the driver keeps until the QP's
            // flush is reaped; nothing reads it before its completion.
            unsafe { qp.post_recv(&wr) }?;
        }
        Ok(())
    }

    /// Step 4: settles with the peer's announcement and hands everything to the driver.
    pub(crate) fn finish(
        self,
        qp: Qp,
        peer: &Params,
        liveness: Liveness,
        how: (Establish, &ConnOptions),
        addrs: (SocketAddr, SocketAddr),
    ) -> Result<Established> {
        let settled = settle(&self.config.params(), peer).map_err(NetError::ConnFailed)?;
        let registered = self.slots.registered();
        let pooled = self.slots.pooled();
        let recv_slots = self.config.recv_slots;
        let mut core = rsrdma_proto::Conn::new(&self.config, &settled, self.slots, Instant::now())
            .map_err(NetError::ConnFailed)?;
        // The core queued a `PostRecv` per slot. Own slots were posted in step 2 (the driver
        // drops those works and counts them outstanding); virtual slots need no post and are
        // never outstanding on the QP.
        let recvs_posted = if pooled {
            for _ in 0..recv_slots {
                let _virtual = core.poll_work();
            }
            0
        } else {
            recv_slots
        };
        let rendezvous = match (self.rendezvous, settled.rendezvous()) {
            (RendezvousMode::Off(why), _) => RendezvousMode::Off(why),
            (_, None) => RendezvousMode::Off(RENDEZVOUS_PEER_OFF),
            (mode, Some(_)) => mode,
        };
        let info = ConnInfo::gather(
            &qp,
            how.0,
            settled,
            self.config,
            registered,
            how.1.poll_mode,
            rendezvous,
        )?;
        let cq = self.cq.clone();
        drop(self.pd);
        let mut driver = Driver::new(core, qp, self.cq, liveness, recvs_posted);
        if settled.features & rsrdma_proto::FEATURE_RAILS != 0 {
            driver.set_rail_port(info.port);
        }
        Ok(Established {
            driver,
            cq,
            info,
            local_addr: addrs.0,
            peer_addr: addrs.1,
        })
    }
}

/// One CQ for sends and receives, on a completion channel of its own: the progress thread
/// sleeps on it in every poll mode (busy callers spin on the CQ themselves, but an idle
/// connection must still hear the peer's PING without burning a core).
fn make_cq(ctx: &Context, config: &Config, recv_entries: u32) -> Result<Cq> {
    let channel = CompChannel::new(ctx)?;
    Ok(Cq::new(
        ctx,
        cq_entries(recv_entries, config.sq_depth),
        Some(&channel),
    )?)
}

/// The entries of a connection's CQ for `recv` receive completions: those, its send queue's
/// and one.
pub(crate) fn cq_entries(recv: u32, sq_depth: u16) -> u32 {
    recv.saturating_add(u32::from(sq_depth) + 1)
}

/// Decodes the peer's announcement from the first [`PARAMS_LEN`] bytes (rdma_cm pads
/// private data with zeros).
pub(crate) fn decode_params(bytes: &[u8]) -> Result<Params> {
    let head = bytes.get(..PARAMS_LEN).ok_or(NetError::ConnFailed(
        rsrdma_proto::ProtoError::BadParams {
            reason: "shorter than 32 bytes (not an rsrdma Conn peer?)",
        },
    ))?;
    Params::decode(head).map_err(NetError::ConnFailed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_decode_from_padded_private_data_and_refuse_garbage() {
        let p = Config::default().params();
        let mut padded = p.encode().to_vec();
        padded.resize(56, 0);
        assert_eq!(decode_params(&padded).unwrap(), p);
        for bad in [&b"hello"[..], &[0u8; 56][..], &[0xffu8; 196][..]] {
            let e = decode_params(bad).unwrap_err().to_string();
            assert!(e.contains("params"), "{e}");
        }
    }
}
