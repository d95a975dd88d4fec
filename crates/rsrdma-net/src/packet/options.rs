//! Options of [`super::PacketConn::bind`].

use crate::progress::PollMode;
use rsrdma::option_setters as setters;
use rsrdma::qp::DEFAULT_QKEY;
use rsrdma::Pd;
use std::time::Duration;

/// Options of [`super::PacketConn::bind`]: build from `Default` with the setters,
/// `PacketOptions::default().device("rxe0".to_string()).recv_depth(4096)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PacketOptions {
    /// Device name; `None` takes the first device, or the device of [`PacketOptions::pd`].
    pub device: Option<String>,
    /// An existing protection domain to create the endpoint in.
    pub pd: Option<Pd>,
    /// Port, from 1.
    pub port: u8,
    /// GID index; `None` lets [`rsrdma::Context::resolve_gid_index`] choose.
    pub gid_index: Option<u8>,
    /// The Q_Key this endpoint accepts: datagrams carrying another are dropped by the NIC.
    pub qkey: u32,
    /// Datagrams in flight on the send side (send-queue depth and send buffers).
    pub send_depth: u32,
    /// Receive buffers posted at all times. UD drops a datagram that finds none, so size it
    /// for the largest burst the application does not read in time.
    pub recv_depth: u32,
    /// Largest datagram; `None` (and anything larger) means the port's active MTU, the
    /// most one UD packet carries. Smaller values save buffer memory.
    pub max_datagram: Option<u32>,
    /// How blocking calls wait for completions.
    pub poll_mode: PollMode,
    /// Limit of a blocking receive; `None` (the default) waits as long as it takes. Zero is
    /// refused, as on std's sockets.
    pub read_timeout: Option<Duration>,
    /// Limit of a send waiting for a free send buffer; `None` (the default) waits as long as
    /// it takes (a UD send completes without the peer, so only a failing device holds one).
    /// Zero is refused.
    pub write_timeout: Option<Duration>,
    /// Address handles kept (least recently used ones are destroyed past this). At least
    /// one is kept, whatever this says: the handle a send just used.
    pub ah_cache: usize,
    /// GRH hop limit of sends (routable RoCE v2 needs more than 1).
    pub hop_limit: u8,
    /// GRH traffic class of sends.
    pub traffic_class: u8,
}

impl Default for PacketOptions {
    fn default() -> Self {
        PacketOptions {
            device: None,
            pd: None,
            port: 1,
            gid_index: None,
            qkey: DEFAULT_QKEY,
            send_depth: 256,
            recv_depth: 1024,
            max_datagram: None,
            poll_mode: PollMode::default(),
            read_timeout: None,
            write_timeout: None,
            ah_cache: 64,
            hop_limit: 0xff,
            traffic_class: 0,
        }
    }
}

setters!(PacketOptions {
    /// Sets [`PacketOptions::device`].
    device: Option<String>,
    /// Sets [`PacketOptions::pd`].
    pd: Option<Pd>,
    /// Sets [`PacketOptions::port`].
    port: u8,
    /// Sets [`PacketOptions::gid_index`].
    gid_index: Option<u8>,
    /// Sets [`PacketOptions::qkey`].
    qkey: u32,
    /// Sets [`PacketOptions::send_depth`].
    send_depth: u32,
    /// Sets [`PacketOptions::recv_depth`].
    recv_depth: u32,
    /// Sets [`PacketOptions::max_datagram`].
    max_datagram: Option<u32>,
    /// Sets [`PacketOptions::poll_mode`].
    poll_mode: PollMode,
    /// Sets [`PacketOptions::read_timeout`].
    read_timeout: Option<Duration>,
    /// Sets [`PacketOptions::write_timeout`].
    write_timeout: Option<Duration>,
    /// Sets [`PacketOptions::ah_cache`].
    ah_cache: usize,
    /// Sets [`PacketOptions::hop_limit`].
    hop_limit: u8,
    /// Sets [`PacketOptions::traffic_class`].
    traffic_class: u8,
});
