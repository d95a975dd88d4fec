//! Options of [`crate::RawConn`]: what to open, how big, how to wait for completions.
//!
//! Option structs are `#[non_exhaustive]`, so a new field is not a breaking change; outside
//! this crate they are built from `Default` with chained setters of the fields' names:
//! `RawOptions::default().device("mlx5_0".to_string()).send_depth(256)`.

use rsrdma::{AccessFlags, Mtu, Pd, QpType};
use std::time::Duration;

use rsrdma::option_setters as setters;

/// How a [`crate::RawConn`]'s completion queues report completions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// Busy polling only: the CQs have no completion channel. The lowest latency, and what
    /// the pipelines do in either mode.
    #[default]
    Busy,
    /// Each CQ gets its own [`rsrdma::CompChannel`] ([`crate::RawConn::send_channel`],
    /// [`crate::RawConn::recv_channel`]), so a caller can sleep until a completion: arm the
    /// CQ ([`rsrdma::Cq::arm`]), poll it empty, then wait ([`rsrdma::Cq::wait`] with a
    /// timeout, or the channel's fd in an event loop) and poll again. Polling works as in
    /// busy mode.
    Event,
}

/// Options of [`crate::RawConn::dial`] and [`crate::RawListener::bind`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RawOptions {
    /// Device name; `None` takes the first device, or the device of [`RawOptions::pd`].
    pub device: Option<String>,
    /// An existing protection domain to create the connection in, so that many connections
    /// share memory registered once (every connection of a listener uses it). The device is
    /// then the domain's; naming another one in [`RawOptions::device`] is an error.
    pub pd: Option<Pd>,
    /// Port, from 1.
    pub port: u8,
    /// GID index; `None` lets [`rsrdma::Context::resolve_gid_index`] choose (none on IB).
    pub gid_index: Option<u8>,
    /// RC or UC.
    pub qp_type: QpType,
    /// Send-queue depth.
    pub send_depth: u32,
    /// Receive-queue depth.
    pub recv_depth: u32,
    /// Inline bytes per send.
    pub max_inline: u32,
    /// Path MTU; `None` uses the port's active MTU. Both sides settle on the smaller.
    pub mtu: Option<Mtu>,
    /// What the peer may do to this side's memory through the QP (regions need their own
    /// flags too). Least privilege: nothing unless asked. A listener's connection grants it
    /// only when `accept` hands the connection out: until then (handshake, accept queue) its
    /// peer reaches no memory, also not the regions of a shared [`RawOptions::pd`].
    pub remote_access: AccessFlags,
    /// Busy polling, or completion channels for sleeping waits.
    pub completion: Completion,
    /// Shared secret: when set, the peer must prove it knows it before anything else is sent.
    pub secret: Option<crate::Secret>,
    /// Time limit for the TCP connect and every wait on the control channel.
    pub timeout: Duration,
    /// Application parameters that must be equal on both sides, as `(key, value)`.
    pub params: Vec<(u16, u64)>,
    /// Listener only: how long a new peer has to open its handshake (its hello, and its
    /// proof with a secret; without a secret, its hello and its endpoint, since anyone can
    /// send a hello) before it is dropped. Default 3 s.
    pub opening_timeout: Duration,
    /// Listener only: handshakes running at once (plus connections not yet accepted); a new
    /// peer past it sheds the oldest handshake that has not opened, else (without a secret,
    /// when a well-formed endpoint proves nothing) one that has kept the listener waiting for
    /// its next step longer than a quarter of [`RawOptions::opening_timeout`]. Default 64.
    pub max_handshakes: usize,
    /// Listener only: handshakes from one address that have not opened yet (peers that
    /// opened count only against [`RawOptions::max_handshakes`]). Default 16.
    pub max_handshakes_per_source: usize,
    /// Post sends through the extended work-request API (`ibv_create_qp_ex`, `ibv_wr_*`,
    /// [`rsrdma::Qp::wr_batch`]): each request written straight into the provider's queue,
    /// as perftest does where it can. A device without it (soft0) fails the connection with
    /// a clear `Unsupported` error, on both sides. Default off.
    pub new_post_send: bool,
}

impl Default for RawOptions {
    fn default() -> Self {
        RawOptions {
            device: None,
            pd: None,
            port: 1,
            gid_index: None,
            qp_type: QpType::Rc,
            send_depth: 128,
            recv_depth: 128,
            max_inline: 0,
            mtu: None,
            remote_access: AccessFlags::NONE,
            completion: Completion::Busy,
            secret: None,
            timeout: Duration::from_secs(10),
            params: Vec::new(),
            opening_timeout: Duration::from_secs(3),
            max_handshakes: 64,
            max_handshakes_per_source: 16,
            new_post_send: false,
        }
    }
}

setters!(RawOptions {
    /// Sets [`RawOptions::device`].
    device: Option<String>,
    /// Sets [`RawOptions::pd`].
    pd: Option<Pd>,
    /// Sets [`RawOptions::port`].
    port: u8,
    /// Sets [`RawOptions::gid_index`].
    gid_index: Option<u8>,
    /// Sets [`RawOptions::qp_type`].
    qp_type: QpType,
    /// Sets [`RawOptions::send_depth`].
    send_depth: u32,
    /// Sets [`RawOptions::recv_depth`].
    recv_depth: u32,
    /// Sets [`RawOptions::max_inline`].
    max_inline: u32,
    /// Sets [`RawOptions::mtu`].
    mtu: Option<Mtu>,
    /// Sets [`RawOptions::remote_access`].
    remote_access: AccessFlags,
    /// Sets [`RawOptions::completion`].
    completion: Completion,
    /// Sets [`RawOptions::secret`].
    secret: Option<crate::Secret>,
    /// Sets [`RawOptions::timeout`].
    timeout: Duration,
    /// Sets [`RawOptions::params`].
    params: Vec<(u16, u64)>,
    /// Sets [`RawOptions::opening_timeout`].
    opening_timeout: Duration,
    /// Sets [`RawOptions::max_handshakes`].
    max_handshakes: usize,
    /// Sets [`RawOptions::max_handshakes_per_source`].
    max_handshakes_per_source: usize,
    /// Sets [`RawOptions::new_post_send`].
    new_post_send: bool,
});
