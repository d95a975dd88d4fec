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
}

impl ConnInfo {
    /// Reads the queue pair's attributes; the rest comes from the establishment.
    pub(crate) fn gather(
        qp: &Qp,
        establish: Establish,
        settled: Settled,
        config: Config,
        registered_bytes: usize,
        poll_mode: PollMode,
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
        })
    }
}
