//! [`ConnInfo`]: what a connection runs on and what both ends settled, on either path.

use super::options::Establish;
use crate::progress::PollMode;
use rsrdma::{Gid, Mtu, Qp};
use rsrdma_proto::{Config, Settled};

/// A connection's device, addresses on the fabric, and negotiated parameters
/// ([`crate::Conn::info`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ConnInfo {
    /// How the connection was established.
    pub establish: Establish,
    /// The RDMA device.
    pub device: String,
    /// The device port.
    pub port: u8,
    /// The local GID index (`None` on InfiniBand without global routing).
    pub gid_index: Option<u8>,
    /// The local GID (zero without a GID index).
    pub local_gid: Gid,
    /// The peer's GID (zero without global routing).
    pub peer_gid: Gid,
    /// The local queue pair number.
    pub local_qpn: u32,
    /// The peer's queue pair number.
    pub peer_qpn: u32,
    /// The path MTU.
    pub mtu: Option<Mtu>,
    /// The protocol's minor version both ends speak (the major is 1).
    pub protocol_minor: u8,
    /// What both ends settled: frame size, credits, message cap, features.
    pub settled: Settled,
    /// This side's protocol configuration (slots, depths, inline size as granted).
    pub config: Config,
    /// Bytes of registered slot memory this connection holds.
    pub registered_bytes: usize,
    /// How blocking calls wait.
    pub poll_mode: PollMode,
    /// How large messages this side sends are exposed to the peer's READ, or why they go
    /// eagerly instead.
    pub rendezvous: RendezvousMode,
}

/// How a connection exposes a message it sends by rendezvous ([`ConnInfo::rendezvous`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RendezvousMode {
    /// Through a type-2 memory window bound to this connection's queue pair only, remote
    /// read only, invalidated when the READ is done.
    Windows,
    /// Through a registration made for the message alone (remote read only) on this
    /// connection's own protection domain, deregistered when the READ is done.
    Registrations,
    /// Not used: large messages go eagerly through the slots. Says why.
    Off(&'static str),
}

/// [`RendezvousMode::Off`]: `ConnOptions::rendezvous` is `None`.
pub(crate) const RENDEZVOUS_NOT_REQUESTED: &str = "not requested (ConnOptions::rendezvous is None)";
/// [`RendezvousMode::Off`]: the peer did not offer it.
pub(crate) const RENDEZVOUS_PEER_OFF: &str = "the peer does not offer rendezvous";
/// [`RendezvousMode::Off`]: F7.
pub(crate) const RENDEZVOUS_SHARED_PD: &str = "a shared protection domain (ConnOptions::pd or a \
     shared receive pool) on a device without memory windows: a per-message registration's \
     rkey would work from other connections' queue pairs";

impl ConnInfo {
    /// Reads the queue pair's attributes; the rest comes from the establishment.
    pub(crate) fn gather(
        qp: &Qp,
        establish: Establish,
        settled: Settled,
        config: Config,
        registered_bytes: usize,
        poll_mode: PollMode,
        rendezvous: RendezvousMode,
    ) -> crate::Result<ConnInfo> {
        let q = qp.query()?;
        let ctx = qp.pd().context();
        let grh = q.ah.grh;
        let gid_index = grh.map(|g| g.sgid_index);
        let local_gid = match gid_index {
            Some(i) => ctx.query_gid(q.port, i.into())?.gid,
            None => Gid::default(),
        };
        Ok(ConnInfo {
            establish,
            device: ctx.name().to_string(),
            port: q.port,
            gid_index,
            local_gid,
            peer_gid: grh.map(|g| g.dgid).unwrap_or_default(),
            local_qpn: qp.qp_num(),
            peer_qpn: q.dest_qp_num,
            mtu: q.path_mtu,
            protocol_minor: settled.minor,
            settled,
            config,
            registered_bytes,
            poll_mode,
            rendezvous,
        })
    }
}
