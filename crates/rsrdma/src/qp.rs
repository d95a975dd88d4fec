//! Queue pairs: creation with checked capabilities, the RESET→INIT→RTR→RTS state machine,
//! and posting.
//!
//! Each transition takes a typed attribute struct ([`InitAttr`], [`RtrAttr`], [`RtsAttr`])
//! whose every field is settable; rsrdma fills in the attribute mask the QP type needs and
//! checks values against the device's limits before calling `ibv_modify_qp`.
//! [`Qp::connect`] walks the whole path for the common case.

use crate::ah::{AhAttr, GlobalRoute};
use crate::context::{Gid, LinkLayer, Mtu};
use crate::cq::Cq;
use crate::error::{check_post, check_rc, Error, Result};
use crate::ffi;
use crate::mr::AccessFlags;
use crate::pd::Pd;
use crate::setters::setters;
use crate::srq::Srq;
use crate::wr::{self, RecvWr, SendWr};
use std::fmt;
use std::sync::Arc;

/// Transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected: acknowledged, ordered; sends, RDMA read/write, atomics.
    Rc,
    /// Unreliable connected: sends and RDMA writes, no acknowledgements.
    Uc,
    /// Unreliable datagram: sends of up to one MTU to any UD QP, each with an address handle.
    Ud,
}

impl QpType {
    fn to_raw(self) -> ffi::ibv_qp_type {
        match self {
            QpType::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
            QpType::Uc => ffi::ibv_qp_type::IBV_QPT_UC,
            QpType::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        })
    }
}

/// A queue pair's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Freshly created or reset.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error (UD/UC).
    Sqe,
    /// Error: every outstanding request is flushed with `WR_FLUSH_ERR`.
    Error,
    /// Not known.
    Unknown,
}

impl QpState {
    fn from_raw(s: ffi::ibv_qp_state) -> Self {
        match s.0 {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Error,
            _ => QpState::Unknown,
        }
    }

    fn to_raw(self) -> ffi::ibv_qp_state {
        ffi::ibv_qp_state(match self {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            QpState::Rts => 3,
            QpState::Sqd => 4,
            QpState::Sqe => 5,
            QpState::Error => 6,
            QpState::Unknown => 7,
        })
    }

    /// Whether the verbs state machine allows `self → to` through the transitions rsrdma
    /// drives (INIT→INIT and RTS→RTS modify attributes in place; any state may go to RESET or
    /// ERROR).
    pub fn can_move_to(self, to: QpState) -> bool {
        use QpState::*;
        matches!(
            (self, to),
            (_, Reset)
                | (_, Error)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Sqd, Rts)
                | (Sqe, Rts)
        )
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Error => "ERROR",
            QpState::Unknown => "UNKNOWN",
        })
    }
}

/// Queue sizes of a QP. The provider may round them up; [`Qp::caps`] gives what it granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpCaps {
    /// Outstanding send-queue work requests.
    pub max_send_wr: u32,
    /// Outstanding receive-queue work requests (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

setters!(QpCaps {
    /// Sets [`QpCaps::max_send_wr`].
    max_send_wr: u32,
    /// Sets [`QpCaps::max_recv_wr`].
    max_recv_wr: u32,
    /// Sets [`QpCaps::max_send_sge`].
    max_send_sge: u32,
    /// Sets [`QpCaps::max_recv_sge`].
    max_recv_sge: u32,
    /// Sets [`QpCaps::max_inline_data`].
    max_inline_data: u32,
});

/// How to create a queue pair; see [`Qp::builder`].
#[derive(Debug, Clone)]
pub struct QpBuilder {
    qp_type: QpType,
    caps: QpCaps,
    sq_sig_all: bool,
    srq: Option<Srq>,
}

impl QpBuilder {
    /// Queue sizes.
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }

    /// Signal every send request regardless of its own flag.
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }

    /// Take receives from a shared receive queue instead of a receive queue of its own.
    pub fn srq(mut self, srq: &Srq) -> Self {
        self.srq = Some(srq.clone());
        self
    }

    /// Checks the capabilities against the device's limits; no verb is called.
    ///
    /// # Errors
    /// [`Error::Limit`] naming the first option beyond its limit.
    pub fn validate(&self, pd: &Pd) -> Result<()> {
        let a = pd.context().attr();
        let c = &self.caps;
        let checks: [(&'static str, u32, u32, &'static str); 4] = [
            (
                "max_send_wr",
                c.max_send_wr,
                a.max_qp_wr,
                "device max_qp_wr",
            ),
            (
                "max_recv_wr",
                if self.srq.is_some() { 0 } else { c.max_recv_wr },
                a.max_qp_wr,
                "device max_qp_wr",
            ),
            ("max_send_sge", c.max_send_sge, a.max_sge, "device max_sge"),
            (
                "max_recv_sge",
                if self.srq.is_some() {
                    0
                } else {
                    c.max_recv_sge
                },
                a.max_sge,
                "device max_sge",
            ),
        ];
        for (what, requested, limit, source_of_limit) in checks {
            if requested > limit {
                return Err(Error::Limit {
                    what,
                    requested: requested.into(),
                    limit: limit.into(),
                    source_of_limit,
                });
            }
        }
        if c.max_inline_data > 0 {
            let limit = max_inline_data(pd, self.qp_type)?;
            if c.max_inline_data > limit {
                return Err(Error::Limit {
                    what: "max_inline_data",
                    requested: c.max_inline_data.into(),
                    limit: limit.into(),
                    source_of_limit: "the device's inline size (probed)",
                });
            }
        }
        if c.max_send_wr == 0 && c.max_recv_wr == 0 {
            return Err(Error::InvalidArgument(
                "a queue pair needs a send or a receive queue".into(),
            ));
        }
        Ok(())
    }

    /// Creates the queue pair in `pd`, completing sends on `send_cq` and receives on `recv_cq`
    /// (they may be the same CQ).
    ///
    /// # Errors
    /// [`Error::Limit`] from [`QpBuilder::validate`], or when the provider grants less inline
    /// room than asked; [`Error::Verbs`] naming `ibv_create_qp`.
    pub fn build(&self, pd: &Pd, send_cq: &Cq, recv_cq: &Cq) -> Result<Qp> {
        self.check_one_context(pd, send_cq, recv_cq)?;
        self.validate(pd)?;
        let mut init = self.init_attr(send_cq, recv_cq);
        // SAFETY: live PD and CQs of the same device (the QP keeps them alive); `init` is valid.
        let raw = unsafe { ffi::ibv_create_qp(pd.inner.raw, &mut init) };
        if raw.is_null() {
            let e = Error::last_os("ibv_create_qp");
            if e.errno() == Some(libc::EINVAL) && self.caps.max_inline_data > 0 {
                tracing::debug!(
                    max_inline = self.caps.max_inline_data,
                    "ibv_create_qp refused; the inline size may exceed the device's"
                );
            }
            return Err(e);
        }
        // SAFETY: `raw` is a new QP this call owns; Qp destroys it.
        let qp = unsafe { Qp::from_parts(raw, self, init.cap, pd, send_cq, recv_cq, None) };
        qp.check_inline_granted(self.requested_inline())?;
        Ok(qp)
    }

    /// Refuses CQs or an SRQ of another context than the PD's: the verbs call picks the
    /// provider by the PD's context, and would hand it another context's objects (another
    /// provider's, where a machine has soft0 beside a NIC).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the object.
    pub(crate) fn check_one_context(&self, pd: &Pd, send_cq: &Cq, recv_cq: &Cq) -> Result<()> {
        let ctx = pd.context();
        let srq = self.srq.as_ref().map(|s| s.inner.pd.context());
        for (what, other) in [
            ("send CQ", Some(send_cq.context())),
            ("receive CQ", Some(recv_cq.context())),
            ("shared receive queue", srq),
        ] {
            if other.is_some_and(|o| !o.is(ctx)) {
                return Err(Error::InvalidArgument(format!(
                    "the queue pair's {what} belongs to another device context than its \
                     protection domain (open the device once and make every object from it)"
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn init_attr(&self, send_cq: &Cq, recv_cq: &Cq) -> ffi::ibv_qp_init_attr {
        ffi::ibv_qp_init_attr {
            send_cq: send_cq.inner.raw,
            recv_cq: recv_cq.inner.raw,
            srq: self
                .srq
                .as_ref()
                .map_or(std::ptr::null_mut(), |s| s.inner.raw),
            cap: ffi::ibv_qp_cap {
                max_send_wr: self.caps.max_send_wr,
                max_recv_wr: if self.srq.is_some() {
                    0
                } else {
                    self.caps.max_recv_wr
                },
                max_send_sge: self.caps.max_send_sge,
                max_recv_sge: if self.srq.is_some() {
                    0
                } else {
                    self.caps.max_recv_sge
                },
                max_inline_data: self.caps.max_inline_data,
            },
            qp_type: self.qp_type.to_raw(),
            sq_sig_all: self.sq_sig_all as i32,
            ..Default::default()
        }
    }

    pub(crate) fn qp_type(&self) -> QpType {
        self.qp_type
    }

    pub(crate) fn requested_inline(&self) -> u32 {
        self.caps.max_inline_data
    }
}

/// Attributes of RESET→INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct InitAttr {
    /// Physical port, from 1.
    pub port: u8,
    /// Partition key index.
    pub pkey_index: u16,
    /// What the peer may do to this side's memory through this QP (RC/UC): only the remote
    /// flags matter here (the regions carry their own). Least privilege: grant only what the
    /// protocol needs.
    pub access: AccessFlags,
    /// Q_Key (UD only).
    pub qkey: u32,
}

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr {
            port: 1,
            pkey_index: 0,
            access: AccessFlags::NONE,
            qkey: DEFAULT_QKEY,
        }
    }
}

setters!(InitAttr {
    /// Sets [`InitAttr::port`].
    port: u8,
    /// Sets [`InitAttr::pkey_index`].
    pkey_index: u16,
    /// Sets [`InitAttr::access`].
    access: AccessFlags,
    /// Sets [`InitAttr::qkey`].
    qkey: u32,
});

/// The Q_Key rsrdma uses for UD unless told otherwise (perftest's).
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

/// Attributes of INIT→RTR: the path to the peer and what this side accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RtrAttr {
    /// Path MTU.
    pub path_mtu: Mtu,
    /// The peer's QP number.
    pub dest_qp_num: u32,
    /// The peer's first packet sequence number (24 bits).
    pub rq_psn: u32,
    /// Incoming RDMA reads/atomics this QP serves at once (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code, 0..=31 (RC; 12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// The path to the peer.
    pub ah: AhAttr,
}

impl Default for RtrAttr {
    /// MTU 1024, one incoming read, RNR timer 12 (0.64 ms); the peer's fields are zero.
    fn default() -> Self {
        RtrAttr {
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: 0,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah: AhAttr::default(),
        }
    }
}

setters!(RtrAttr {
    /// Sets [`RtrAttr::path_mtu`].
    path_mtu: Mtu,
    /// Sets [`RtrAttr::dest_qp_num`].
    dest_qp_num: u32,
    /// Sets [`RtrAttr::rq_psn`].
    rq_psn: u32,
    /// Sets [`RtrAttr::max_dest_rd_atomic`].
    max_dest_rd_atomic: u8,
    /// Sets [`RtrAttr::min_rnr_timer`].
    min_rnr_timer: u8,
    /// Sets [`RtrAttr::ah`].
    ah: AhAttr,
});

/// Attributes of RTR→RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RtsAttr {
    /// This side's first packet sequence number (24 bits).
    pub sq_psn: u32,
    /// Local ACK timeout code, 0..=31: 4.096 µs × 2^timeout (RC; 14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries, 0..=7 (RC).
    pub retry_cnt: u8,
    /// RNR retries, 0..=7 where 7 means forever (RC).
    pub rnr_retry: u8,
    /// Outgoing RDMA reads/atomics in flight at once (RC).
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    /// perftest's values: timeout 14 (67 ms), 7 retries, RNR retry forever, one read in flight.
    fn default() -> Self {
        RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

setters!(RtsAttr {
    /// Sets [`RtsAttr::sq_psn`].
    sq_psn: u32,
    /// Sets [`RtsAttr::timeout`].
    timeout: u8,
    /// Sets [`RtsAttr::retry_cnt`].
    retry_cnt: u8,
    /// Sets [`RtsAttr::rnr_retry`].
    rnr_retry: u8,
    /// Sets [`RtsAttr::max_rd_atomic`].
    max_rd_atomic: u8,
});

/// What a peer needs to connect to a QP: a plain value for an out-of-band exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpEndpoint {
    /// QP number.
    pub qp_num: u32,
    /// First packet sequence number the QP will send with.
    pub psn: u32,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID (RoCE, or across subnets).
    pub gid: Gid,
}

/// Options of [`Qp::connect`]: perftest's defaults unless changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Local port.
    pub port: u8,
    /// Local GID index; required on RoCE (perftest's `-x`).
    pub gid_index: Option<u8>,
    /// Path MTU; `None` uses the port's active MTU.
    pub mtu: Option<Mtu>,
    /// What the peer may do to local memory.
    pub access: AccessFlags,
    /// See [`RtsAttr::timeout`].
    pub timeout: u8,
    /// See [`RtsAttr::retry_cnt`].
    pub retry_cnt: u8,
    /// See [`RtsAttr::rnr_retry`].
    pub rnr_retry: u8,
    /// See [`RtrAttr::min_rnr_timer`].
    pub min_rnr_timer: u8,
    /// Outgoing reads/atomics in flight; `None` uses the device's maximum.
    pub max_rd_atomic: Option<u8>,
    /// Incoming reads/atomics served; `None` uses the device's maximum.
    pub max_dest_rd_atomic: Option<u8>,
    /// Service level.
    pub sl: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// Partition key index.
    pub pkey_index: u16,
    /// Move on to RTS. False stops at RTR: a QP that only receives and serves one-sided
    /// operations (perftest's write and read servers), and never sends.
    pub ready_to_send: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            port: 1,
            gid_index: None,
            mtu: None,
            access: AccessFlags::NONE,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: None,
            max_dest_rd_atomic: None,
            sl: 0,
            hop_limit: 0xff,
            traffic_class: 0,
            pkey_index: 0,
            ready_to_send: true,
        }
    }
}

setters!(ConnectOptions {
    /// Sets [`ConnectOptions::port`].
    port: u8,
    /// Sets [`ConnectOptions::gid_index`].
    gid_index: Option<u8>,
    /// Sets [`ConnectOptions::mtu`].
    mtu: Option<Mtu>,
    /// Sets [`ConnectOptions::access`].
    access: AccessFlags,
    /// Sets [`ConnectOptions::timeout`].
    timeout: u8,
    /// Sets [`ConnectOptions::retry_cnt`].
    retry_cnt: u8,
    /// Sets [`ConnectOptions::rnr_retry`].
    rnr_retry: u8,
    /// Sets [`ConnectOptions::min_rnr_timer`].
    min_rnr_timer: u8,
    /// Sets [`ConnectOptions::max_rd_atomic`].
    max_rd_atomic: Option<u8>,
    /// Sets [`ConnectOptions::max_dest_rd_atomic`].
    max_dest_rd_atomic: Option<u8>,
    /// Sets [`ConnectOptions::sl`].
    sl: u8,
    /// Sets [`ConnectOptions::hop_limit`].
    hop_limit: u8,
    /// Sets [`ConnectOptions::traffic_class`].
    traffic_class: u8,
    /// Sets [`ConnectOptions::pkey_index`].
    pkey_index: u16,
    /// Sets [`ConnectOptions::ready_to_send`].
    ready_to_send: bool,
});

/// Details of a queue pair, from `ibv_query_qp`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpInfo {
    /// Current state.
    pub state: QpState,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// The peer's QP number.
    pub dest_qp_num: u32,
    /// Access granted to the peer.
    pub access: AccessFlags,
    /// Queue sizes.
    pub caps: QpCaps,
    /// The path to the peer.
    pub ah: AhAttr,
    /// Outgoing reads/atomics.
    pub max_rd_atomic: u8,
    /// Incoming reads/atomics.
    pub max_dest_rd_atomic: u8,
    /// RNR timer code.
    pub min_rnr_timer: u8,
    /// Port.
    pub port: u8,
    /// ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
}

/// A queue pair (`ibv_qp`). Keeps its PD, CQs and SRQ alive. Cheap to clone.
#[derive(Clone)]
pub struct Qp {
    inner: Arc<QpInner>,
}

struct QpInner {
    raw: *mut ffi::ibv_qp,
    qp_type: QpType,
    caps: QpCaps,
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    srq: Option<Srq>,
    /// Set when rdma_cm created the QP on a connection id: destroyed through it, and the id
    /// is kept alive until then.
    cm_id: Option<Arc<crate::cm::CmIdInner>>,
    /// The extended QP (`ibv_qp_to_qp_ex`) of one made by [`QpBuilder::build_ex`]; null
    /// otherwise.
    pub(crate) ex: *mut ffi::ibv_qp_ex,
    /// A [`crate::qp_ex::WrBatch`] is open on the QP (on any thread, through any clone): the
    /// provider's batch state is one per QP, and a second `ibv_wr_start` on the thread that
    /// holds the first spins on its lock for ever (rxe, mlx5), or aborts (mlx5 without locks).
    pub(crate) batch_open: std::sync::atomic::AtomicBool,
}

// SAFETY: libibverbs serialises posting and modifying a QP internally (unless a provider is
// told to drop its locks, `MLX5_SINGLE_THREADED=1`: then the caller serialises, see `Srq`);
// our fields are immutable.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        let rc = match &self.cm_id {
            Some(id) => {
                id.destroy_qp();
                0
            }
            // SAFETY: created by us, destroyed once; CQs and PD outlive it (fields below).
            None => unsafe { ffi::ibv_destroy_qp(self.raw) },
        };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_qp failed");
        }
    }
}

impl Qp {
    /// Starts describing a queue pair of `qp_type`.
    pub fn builder(qp_type: QpType) -> QpBuilder {
        QpBuilder {
            qp_type,
            caps: QpCaps::default(),
            sq_sig_all: false,
            srq: None,
        }
    }

    /// Wraps a QP made by libibverbs or rdma_cm.
    ///
    /// # Safety
    /// `raw` must be a live QP in `pd` on those CQs that nothing else destroys; with
    /// `cm_id`, it must have been made by `rdma_create_qp` on that id.
    pub(crate) unsafe fn from_parts(
        raw: *mut ffi::ibv_qp,
        b: &QpBuilder,
        granted: ffi::ibv_qp_cap,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cm_id: Option<Arc<crate::cm::CmIdInner>>,
    ) -> Qp {
        Qp {
            inner: Arc::new(QpInner {
                raw,
                qp_type: b.qp_type,
                caps: QpCaps {
                    max_send_wr: granted.max_send_wr,
                    max_recv_wr: granted.max_recv_wr,
                    max_send_sge: granted.max_send_sge,
                    max_recv_sge: granted.max_recv_sge,
                    max_inline_data: granted.max_inline_data,
                },
                pd: pd.clone(),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                srq: b.srq.clone(),
                cm_id,
                ex: std::ptr::null_mut(),
                batch_open: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Records the extended QP of a QP just made (`self` not yet shared).
    pub(crate) fn set_ex(&mut self, ex: *mut ffi::ibv_qp_ex) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.ex = ex;
        }
    }

    /// The extended QP, where it was made as one.
    pub(crate) fn ex(&self) -> *mut ffi::ibv_qp_ex {
        self.inner.ex
    }

    /// The flag of an open [`crate::qp_ex::WrBatch`] (see `QpInner::batch_open`).
    pub(crate) fn batch_flag(&self) -> &std::sync::atomic::AtomicBool {
        &self.inner.batch_open
    }

    pub(crate) fn check_inline_granted(&self, asked: u32) -> Result<()> {
        if self.inner.caps.max_inline_data < asked {
            return Err(Error::Limit {
                what: "max_inline_data",
                requested: asked.into(),
                limit: self.inner.caps.max_inline_data.into(),
                source_of_limit: "what the provider granted",
            });
        }
        Ok(())
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP; a plain field set at creation.
        unsafe { (*self.inner.raw).qp_num }
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// The queue sizes the provider granted.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The QP's current state, asked of the provider (`ibv_query_qp`): libibverbs writes the
    /// `state` field of `ibv_qp` under its own lock, so reading it from here would race, and
    /// rdma_cm and the device (an asynchronous move to ERROR) change the state behind this
    /// handle. [`QpState::Unknown`] when the query fails.
    pub fn state(&self) -> QpState {
        let mut attr = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE;
        // SAFETY: live QP; both out-structs are valid for the call.
        let rc = unsafe { ffi::ibv_query_qp(self.inner.raw, &mut attr, mask.0 as i32, &mut init) };
        if rc != 0 {
            tracing::debug!(rc, qp = self.qp_num(), "ibv_query_qp(STATE) failed");
            return QpState::Unknown;
        }
        QpState::from_raw(attr.qp_state)
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// The send completion queue.
    pub fn send_cq(&self) -> &Cq {
        &self.inner.send_cq
    }

    /// The receive completion queue.
    pub fn recv_cq(&self) -> &Cq {
        &self.inner.recv_cq
    }

    /// The shared receive queue, if any.
    pub fn srq(&self) -> Option<&Srq> {
        self.inner.srq.as_ref()
    }

    /// The raw `ibv_qp`; `None` for a provider that is not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_qp> {
        Some(self.inner.raw)
    }

    fn check_transition(&self, to: QpState) -> Result<()> {
        let from = self.state();
        // RTS → RTS changes only what `set_access` and `set_min_rnr_timer` change: the
        // attributes `to_rts` sets (the send PSN, the timeouts, the retry counts) are fixed
        // from RTR on, and a provider refuses them (`EINVAL`).
        if !from.can_move_to(to) || (from, to) == (QpState::Rts, QpState::Rts) {
            return Err(Error::InvalidTransition {
                qp_num: self.qp_num(),
                from,
                to,
            });
        }
        Ok(())
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> Result<()> {
        // SAFETY: live QP; `attr` is initialised for every bit in `mask`.
        let rc = unsafe { ffi::ibv_modify_qp(self.inner.raw, attr, mask.0 as i32) };
        check_rc("ibv_modify_qp", rc)
    }

    /// RESET→INIT.
    ///
    /// # Errors
    /// [`Error::InvalidTransition`] from a state other than RESET/INIT; [`Error::Verbs`]
    /// naming `ibv_modify_qp`.
    pub fn to_init(&self, a: &InitAttr) -> Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        self.check_transition(QpState::Init)?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: QpState::Init.to_raw(),
            pkey_index: a.pkey_index,
            port_num: a.port,
            ..Default::default()
        };
        let mut mask = M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT;
        match self.qp_type() {
            QpType::Ud => {
                attr.qkey = a.qkey;
                mask |= M::IBV_QP_QKEY;
            }
            QpType::Rc | QpType::Uc => {
                attr.qp_access_flags = a.access.bits();
                mask |= M::IBV_QP_ACCESS_FLAGS;
            }
        }
        self.modify(&mut attr, mask)
    }

    /// INIT→RTR. For UD only the state changes; the other fields are ignored.
    ///
    /// # Errors
    /// [`Error::Limit`] when `max_dest_rd_atomic` exceeds the device's `max_qp_rd_atom` or a
    /// field is out of its range; [`Error::InvalidTransition`]; [`Error::Verbs`].
    pub fn to_rtr(&self, a: &RtrAttr) -> Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        self.check_transition(QpState::Rtr)?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: QpState::Rtr.to_raw(),
            ..Default::default()
        };
        let mut mask = M::IBV_QP_STATE;
        self.check_rtr_values(a)?;
        if self.qp_type() != QpType::Ud {
            attr.path_mtu = a.path_mtu.to_raw();
            attr.dest_qp_num = a.dest_qp_num;
            attr.rq_psn = a.rq_psn;
            attr.ah_attr = a.ah.to_raw();
            mask |= M::IBV_QP_AV | M::IBV_QP_PATH_MTU | M::IBV_QP_DEST_QPN | M::IBV_QP_RQ_PSN;
        }
        if self.qp_type() == QpType::Rc {
            attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
            attr.min_rnr_timer = a.min_rnr_timer;
            mask |= M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_MIN_RNR_TIMER;
        }
        self.modify(&mut attr, mask)
    }

    /// [`Qp::to_rtr`]'s checks of the values alone (no device call, in any state).
    fn check_rtr_values(&self, a: &RtrAttr) -> Result<()> {
        if self.qp_type() != QpType::Ud {
            check_psn("rq_psn", a.rq_psn)?;
            check_limit("sl", a.ah.sl.into(), 15, "the 4-bit service level")?;
        }
        if self.qp_type() == QpType::Rc {
            let dev = self.inner.pd.context().attr();
            check_limit(
                "max_dest_rd_atomic",
                a.max_dest_rd_atomic.into(),
                dev.max_qp_rd_atom.into(),
                "device max_qp_rd_atom",
            )?;
            check_limit(
                "min_rnr_timer",
                a.min_rnr_timer.into(),
                31,
                "the 5-bit RNR timer code",
            )?;
        }
        Ok(())
    }

    /// RTR→RTS.
    ///
    /// # Errors
    /// [`Error::Limit`] when `max_rd_atomic` exceeds the device's `max_qp_init_rd_atom` or a
    /// field is out of its range; [`Error::InvalidTransition`] from any state but RTR (RTS
    /// included: its attributes cannot change there); [`Error::Verbs`].
    pub fn to_rts(&self, a: &RtsAttr) -> Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        self.check_rts_values(a)?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: QpState::Rts.to_raw(),
            sq_psn: a.sq_psn,
            ..Default::default()
        };
        let mut mask = M::IBV_QP_STATE | M::IBV_QP_SQ_PSN;
        if self.qp_type() == QpType::Rc {
            attr.timeout = a.timeout;
            attr.retry_cnt = a.retry_cnt;
            attr.rnr_retry = a.rnr_retry;
            attr.max_rd_atomic = a.max_rd_atomic;
            mask |= M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC;
        }
        // After the values' checks: a value out of range is that, in any state.
        self.check_transition(QpState::Rts)?;
        self.modify(&mut attr, mask)
    }

    /// [`Qp::to_rts`]'s checks of the values alone (no device call, in any state).
    fn check_rts_values(&self, a: &RtsAttr) -> Result<()> {
        check_psn("sq_psn", a.sq_psn)?;
        if self.qp_type() == QpType::Rc {
            let dev = self.inner.pd.context().attr();
            check_limit(
                "max_rd_atomic",
                a.max_rd_atomic.into(),
                dev.max_qp_init_rd_atom.into(),
                "device max_qp_init_rd_atom",
            )?;
            check_limit("timeout", a.timeout.into(), 31, "the 5-bit timeout code")?;
            check_limit("retry_cnt", a.retry_cnt.into(), 7, "the 3-bit retry count")?;
            check_limit(
                "rnr_retry",
                a.rnr_retry.into(),
                7,
                "the 3-bit RNR retry count",
            )?;
        }
        Ok(())
    }

    /// Sets what the peer may do to this side's memory through an RC or UC queue pair that
    /// is already up (an INIT→INIT or RTS→RTS modify of its access flags; the verbs' table has
    /// no RTR→RTR change, so a queue pair left in RTR is refused: bring it to RTS first): a
    /// server brings a connection up granting nothing and grants its remote access only once
    /// the application has accepted the peer. Requests already under way keep the rights they
    /// started with.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a UD queue pair; [`Error::Verbs`] naming
    /// `ibv_modify_qp` (e.g. in RESET or ERROR).
    pub fn set_access(&self, access: AccessFlags) -> Result<()> {
        if self.qp_type() == QpType::Ud {
            return Err(Error::InvalidArgument(
                "access flags apply to RC and UC queue pairs".into(),
            ));
        }
        let mut attr = ffi::ibv_qp_attr {
            qp_access_flags: access.bits(),
            ..Default::default()
        };
        self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)
    }

    /// Sets the RNR NAK timer code of an RC queue pair that is already in RTS (an RTS→RTS
    /// modify): how long a peer waits before it retries a send this QP had no receive for.
    /// rdma_cm brings QPs up with code 0 (655 ms); a QP behind a shared receive queue that
    /// may run empty for a moment wants a short one.
    ///
    /// # Errors
    /// [`Error::Limit`] above the 5-bit code; [`Error::InvalidArgument`] for a QP that is not
    /// RC; [`Error::Verbs`] naming `ibv_modify_qp` (e.g. not in RTS).
    pub fn set_min_rnr_timer(&self, code: u8) -> Result<()> {
        use ffi::ibv_qp_attr_mask as M;
        if self.qp_type() != QpType::Rc {
            return Err(Error::InvalidArgument(
                "min_rnr_timer applies to RC queue pairs".into(),
            ));
        }
        check_limit("min_rnr_timer", code.into(), 31, "the 5-bit RNR timer code")?;
        let mut attr = ffi::ibv_qp_attr {
            min_rnr_timer: code,
            ..Default::default()
        };
        self.modify(&mut attr, M::IBV_QP_MIN_RNR_TIMER)
    }

    /// Moves to ERROR: outstanding and later work requests complete with `WR_FLUSH_ERR`.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_modify_qp`.
    pub fn to_error(&self) -> Result<()> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: QpState::Error.to_raw(),
            ..Default::default()
        };
        self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Moves to RESET, dropping every queued work request without a completion.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_modify_qp`.
    pub fn reset(&self) -> Result<()> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: QpState::Reset.to_raw(),
            ..Default::default()
        };
        self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Queries the QP's current attributes.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_query_qp`.
    pub fn query(&self) -> Result<QpInfo> {
        use ffi::ibv_qp_attr_mask as M;
        let mut attr = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        let mask = M::IBV_QP_STATE
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_QKEY
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_SQ_PSN
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_ACCESS_FLAGS
            | M::IBV_QP_CAP
            | M::IBV_QP_AV
            | M::IBV_QP_MAX_QP_RD_ATOMIC
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER
            | M::IBV_QP_PORT
            | M::IBV_QP_TIMEOUT
            | M::IBV_QP_RETRY_CNT
            | M::IBV_QP_RNR_RETRY;
        // SAFETY: live QP; both out-structs are valid.
        let rc = unsafe { ffi::ibv_query_qp(self.inner.raw, &mut attr, mask.0 as i32, &mut init) };
        check_rc("ibv_query_qp", rc)?;
        Ok(QpInfo {
            state: QpState::from_raw(attr.qp_state),
            path_mtu: Mtu::from_raw(attr.path_mtu),
            qkey: attr.qkey,
            rq_psn: attr.rq_psn,
            sq_psn: attr.sq_psn,
            dest_qp_num: attr.dest_qp_num,
            access: access_from_bits(attr.qp_access_flags),
            caps: QpCaps {
                max_send_wr: attr.cap.max_send_wr,
                max_recv_wr: attr.cap.max_recv_wr,
                max_send_sge: attr.cap.max_send_sge,
                max_recv_sge: attr.cap.max_recv_sge,
                max_inline_data: attr.cap.max_inline_data,
            },
            ah: AhAttr::from_raw(&attr.ah_attr),
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            port: attr.port_num,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
        })
    }

    /// What a peer needs to connect to this QP: its number, `psn`, and the LID and GID of
    /// `port` (GID from `gid_index`, or zero without one).
    ///
    /// # Errors
    /// The errors of [`crate::Context::query_port`] and [`crate::Context::query_gid`].
    pub fn endpoint(&self, port: u8, gid_index: Option<u8>, psn: u32) -> Result<QpEndpoint> {
        let ctx = self.inner.pd.context();
        let lid = ctx.query_port(port)?.lid;
        let gid = match gid_index {
            Some(i) => ctx.query_gid(port, i.into())?.gid,
            None => Gid::default(),
        };
        Ok(QpEndpoint {
            qp_num: self.qp_num(),
            psn: psn & 0xff_ffff,
            lid,
            gid,
        })
    }

    /// Brings a QP in RESET up to talk to `remote`: INIT, RTR and (unless
    /// [`ConnectOptions::ready_to_send`] is false) RTS, with `local_psn` as this side's first
    /// sequence number. This is the one place rsrdma and its tools do it: the timeouts, retry
    /// counts, MTU and read-depth rules live here.
    ///
    /// - MTU: [`ConnectOptions::mtu`], else the port's active MTU.
    /// - GID: [`ConnectOptions::gid_index`]; a RoCE port needs one (see
    ///   [`crate::Context::resolve_gid_index`] for the default choice).
    /// - Read/atomic depths: the options, else the device's maxima.
    /// - UD: INIT (with [`crate::qp::DEFAULT_QKEY`]), RTR, RTS; `remote` is unused, since each
    ///   send names its peer.
    ///
    /// The options' values (a GID index, needed on RoCE and within the port's GID table; the
    /// read depths; the timer and retry codes) are checked first, before any transition: one
    /// out of range leaves the QP as it was. A transition the device refuses leaves it in the last state reached ([`Qp::state`]
    /// says which step failed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a RoCE port is used without a GID index; the errors of
    /// the transitions.
    pub fn connect(
        &self,
        opts: &ConnectOptions,
        local_psn: u32,
        remote: &QpEndpoint,
    ) -> Result<()> {
        let ctx = self.inner.pd.context().clone();
        let port = ctx.query_port(opts.port)?;
        let dev = ctx.attr();
        if let Some(i) = opts.gid_index {
            check_limit(
                "gid_index",
                i.into(),
                port.gid_tbl_len.saturating_sub(1).into(),
                "the port's GID table",
            )?;
            // An empty entry of the table (rxe's has 1024, most of them empty).
            if ctx.query_gid(opts.port, i.into()).is_err() {
                return Err(Error::InvalidArgument(format!(
                    "GID index {i} of port {} of {} holds no GID",
                    opts.port,
                    ctx.name()
                )));
            }
        }
        let grh = match opts.gid_index {
            Some(i) => Some(GlobalRoute {
                dgid: remote.gid,
                sgid_index: i,
                hop_limit: opts.hop_limit,
                traffic_class: opts.traffic_class,
                flow_label: 0,
            }),
            None if port.link_layer == LinkLayer::Ethernet && self.qp_type() != QpType::Ud => {
                return Err(Error::InvalidArgument(format!(
                    "port {} of {} is RoCE (Ethernet): a GID index is required",
                    opts.port,
                    ctx.name()
                )))
            }
            None => None,
        };
        let mtu = opts.mtu.or(port.active_mtu).unwrap_or(Mtu::Mtu1024);
        let clamp = |v: u32| v.min(u8::MAX as u32) as u8;
        let rtr = RtrAttr {
            path_mtu: mtu,
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn & 0xff_ffff,
            max_dest_rd_atomic: opts.max_dest_rd_atomic.unwrap_or(clamp(dev.max_qp_rd_atom)),
            min_rnr_timer: opts.min_rnr_timer,
            ah: AhAttr {
                port_num: opts.port,
                dlid: remote.lid,
                sl: opts.sl,
                grh,
                ..Default::default()
            },
        };
        let rts = RtsAttr {
            sq_psn: local_psn & 0xff_ffff,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            max_rd_atomic: opts.max_rd_atomic.unwrap_or(clamp(dev.max_qp_init_rd_atom)),
        };
        // Every value is checked before the first transition: one out of range leaves the QP
        // where it was (in RESET, connect can be called again with better options).
        self.check_rtr_values(&rtr)?;
        if opts.ready_to_send {
            self.check_rts_values(&rts)?;
        }
        self.to_init(&InitAttr {
            port: opts.port,
            pkey_index: opts.pkey_index,
            access: opts.access,
            ..Default::default()
        })?;
        self.to_rtr(&rtr)?;
        if !opts.ready_to_send {
            return Ok(());
        }
        self.to_rts(&rts)
    }

    /// Posts one send-queue work request.
    ///
    /// # Safety
    /// Until the request's completion is reaped (for an unsignaled request: the completion of
    /// a later signaled one on this QP), or the QP is destroyed:
    /// - the memory its SGEs name must stay valid: registered memory whose [`crate::Mr`] is
    ///   alive, or, for inline sends, memory valid for the duration of this call;
    /// - the CPU must not write memory that the request reads, nor read or write memory that
    ///   it writes (RDMA read and atomic results);
    /// - for UD, the address handle must stay alive;
    /// - for a window bind ([`crate::SendWr::bind_mw`]): the window and its region must stay
    ///   alive until the window is invalidated (or destroyed), and while it is bound the
    ///   peer's requests through it read (and, with remote write, change) the region's bytes
    ///   as if it were registered with the window's access: the rules above apply to those
    ///   bytes for as long as the window is bound, not only until this completion.
    ///
    /// # Errors
    /// [`Error::Limit`] for an inline payload above the QP's inline size; [`Error::Post`]
    /// naming `ibv_post_send` (ENOMEM: the send queue is full).
    #[inline]
    pub unsafe fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        self.check_inline(wr)?;
        let mut bad = std::ptr::null_mut();
        // Posted in place, not copied: a `SendWr`'s `next` is always null outside a batch post
        // (`wr::post_list` unlinks what it linked), and the copy cost more than the rest of
        // the path together (`cargo xtask bench overhead`).
        // SAFETY: live QP; `wr` is a valid single request (its `next` is null); providers read
        // a request and never write it, so the `*mut` the C signature asks for is not used to
        // mutate; the caller vouches for the memory it names.
        let rc = unsafe {
            ffi::data_path::ibv_post_send(
                self.inner.raw,
                std::ptr::from_ref(wr.as_raw()).cast_mut(),
                &mut bad,
            )
        };
        check_post("ibv_post_send", rc, 0, 1)
    }

    /// Posts a list of send requests with one call into the provider (one doorbell where the
    /// provider batches). On failure, the requests before the reported index were posted and
    /// will complete; the rest were not.
    ///
    /// # Safety
    /// As [`Qp::post_send`], for every request.
    ///
    /// # Errors
    /// [`Error::Limit`] when the first request's inline payload is above the QP's inline size
    /// (nothing posted); [`Error::Post`] with the index of the first request not posted (errno
    /// EINVAL for a later request's inline payload, after those before it were posted).
    #[inline]
    pub unsafe fn post_send_batch(&self, wrs: &mut [SendWr<'_>]) -> Result<()> {
        let raw = self.inner.raw;
        wr::post_list(
            "ibv_post_send",
            wrs,
            |wr| self.check_inline(wr),
            |list, bad| {
                // SAFETY: live QP; `list` is the caller's requests, linked into one list that
                // ends in null and stays put during the call; the caller vouches for the
                // memory they name.
                unsafe { ffi::data_path::ibv_post_send(raw, list, bad) }
            },
        )
    }

    /// Posts one receive request.
    ///
    /// # Safety
    /// The memory its SGEs name must stay valid, and must not be read or written by the CPU,
    /// until the request's completion is reaped or the QP is destroyed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a QP on an SRQ; [`Error::Post`] naming `ibv_post_recv`.
    #[inline]
    pub unsafe fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        self.check_own_rq()?;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; a valid single request posted in place (see `post_send`: its `next`
        // is null and providers do not write it); the caller vouches for its memory.
        let rc = unsafe {
            ffi::data_path::ibv_post_recv(
                self.inner.raw,
                std::ptr::from_ref(wr.as_raw()).cast_mut(),
                &mut bad,
            )
        };
        check_post("ibv_post_recv", rc, 0, 1)
    }

    /// Posts a list of receive requests with one call.
    ///
    /// # Safety
    /// As [`Qp::post_recv`], for every request.
    ///
    /// # Errors
    /// [`Error::Post`] with the index of the first request not posted.
    #[inline]
    pub unsafe fn post_recv_batch(&self, wrs: &mut [RecvWr<'_>]) -> Result<()> {
        self.check_own_rq()?;
        let raw = self.inner.raw;
        wr::post_list(
            "ibv_post_recv",
            wrs,
            |_| Ok(()),
            // SAFETY: as in `post_send_batch`.
            |list, bad| unsafe { ffi::data_path::ibv_post_recv(raw, list, bad) },
        )
    }

    #[inline]
    pub(crate) fn check_inline(&self, wr: &SendWr<'_>) -> Result<()> {
        if wr.is_inline() {
            let len = wr.payload_len();
            let max = self.inner.caps.max_inline_data;
            if len > u64::from(max) {
                return Err(Error::Limit {
                    what: "inline payload",
                    requested: len,
                    limit: max.into(),
                    source_of_limit: "the QP's max_inline_data",
                });
            }
        }
        Ok(())
    }

    #[inline]
    fn check_own_rq(&self) -> Result<()> {
        if self.inner.srq.is_some() {
            return Err(on_srq());
        }
        Ok(())
    }
}

/// The error of a receive posted to a QP that takes its receives from an SRQ (off the path).
#[cold]
fn on_srq() -> Error {
    Error::InvalidArgument("this QP takes receives from its SRQ; post there".into())
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num())
            .field("type", &self.qp_type())
            .field("state", &self.state())
            .field("caps", &self.inner.caps)
            .finish()
    }
}

/// The largest `max_inline_data` the device grants a QP of `qp_type`. The verbs API reports
/// no such limit, so it is found once per context by creating throwaway QPs (a binary search
/// over 0..=64 KiB, about 17 creations), then cached.
impl Pd {
    /// The most inline data a QP of `qp_type` can get on this device. The verbs API reports no
    /// such limit, so it is found once per context by creating throwaway QPs (a binary
    /// search) and cached. C programs ask for an inline size and fall back; this asks first.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_create_cq` when the probe's CQ cannot be made.
    pub fn max_inline_data(&self, qp_type: QpType) -> Result<u32> {
        max_inline_data(self, qp_type)
    }
}

/// Inline limits already probed, keyed by device (node GUID and name) and QP type.
type InlineLimits = std::sync::Mutex<std::collections::HashMap<(u64, String, QpType), u32>>;

/// The process-wide [`InlineLimits`]: rdma_cm hands every connection a context of its own,
/// and probing costs ~17 throwaway QPs.
fn probed_inline_limits() -> &'static InlineLimits {
    static LIMITS: std::sync::OnceLock<InlineLimits> = std::sync::OnceLock::new();
    LIMITS.get_or_init(Default::default)
}

fn max_inline_data(pd: &Pd, qp_type: QpType) -> Result<u32> {
    let slot = &pd.context().inner.inline_limits[qp_type as usize];
    if let Some(v) = slot.get() {
        return Ok(*v);
    }
    let ctx = pd.context();
    let key = (ctx.attr().node_guid, ctx.name().to_owned(), qp_type);
    let known = probed_inline_limits()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .copied();
    if let Some(v) = known {
        return Ok(*slot.get_or_init(|| v));
    }
    let cq = Cq::new(pd.context(), 2, None)?;
    let fits = |inline: u32| -> bool {
        let b = QpBuilder {
            qp_type,
            caps: QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            },
            sq_sig_all: false,
            srq: None,
        };
        let mut init = b.init_attr(&cq, &cq);
        // SAFETY: live PD and CQ; `init` is valid. The QP is destroyed at once.
        let raw = unsafe { ffi::ibv_create_qp(pd.inner.raw, &mut init) };
        if raw.is_null() {
            return false;
        }
        // SAFETY: created just above, destroyed once.
        unsafe { ffi::ibv_destroy_qp(raw) };
        init.cap.max_inline_data >= inline
    };
    let (mut lo, mut hi) = (0u32, 64 * 1024);
    if fits(hi) {
        lo = hi;
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    tracing::debug!(device = pd.context().name(), %qp_type, max_inline = lo, "probed the inline limit");
    probed_inline_limits()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, lo);
    Ok(*slot.get_or_init(|| lo))
}

fn access_from_bits(bits: u32) -> AccessFlags {
    [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_READ,
        AccessFlags::REMOTE_ATOMIC,
    ]
    .into_iter()
    .filter(|f| bits & f.bits() != 0)
    .fold(AccessFlags::NONE, |acc, f| acc | f)
}

fn check_limit(
    what: &'static str,
    requested: u64,
    limit: u64,
    source_of_limit: &'static str,
) -> Result<()> {
    if requested > limit {
        return Err(Error::Limit {
            what,
            requested,
            limit,
            source_of_limit,
        });
    }
    Ok(())
}

fn check_psn(what: &'static str, psn: u32) -> Result<()> {
    check_limit(
        what,
        psn.into(),
        0xff_ffff,
        "the 24-bit packet sequence number",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_machine_allows_the_verbs_path_only() {
        use QpState::*;
        assert!(Reset.can_move_to(Init));
        assert!(Init.can_move_to(Rtr));
        assert!(Rtr.can_move_to(Rts));
        assert!(Rts.can_move_to(Rts));
        for s in [Reset, Init, Rtr, Rts, Sqd, Sqe, Error] {
            assert!(s.can_move_to(Error) && s.can_move_to(Reset));
        }
        assert!(!Reset.can_move_to(Rtr));
        assert!(!Reset.can_move_to(Rts));
        assert!(!Init.can_move_to(Rts));
        assert!(!Error.can_move_to(Rts));
        assert!(!Rts.can_move_to(Rtr));
    }

    #[test]
    fn states_round_trip() {
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Error,
        ] {
            assert_eq!(QpState::from_raw(s.to_raw()), s);
        }
        assert_eq!(QpState::from_raw(ffi::ibv_qp_state(42)), QpState::Unknown);
    }

    #[test]
    fn ranges() {
        assert!(check_psn("sq_psn", 0xff_ffff).is_ok());
        let e = check_psn("sq_psn", 0x100_0000).unwrap_err().to_string();
        assert!(e.contains("sq_psn") && e.contains("24-bit"), "{e}");
        assert!(check_limit("retry_cnt", 8, 7, "x").is_err());
    }

    #[cfg(feature = "bench-support")]
    #[test]
    fn batches_go_through_the_op_table_and_check_inline_sizes() {
        use crate::wr::Sge;
        let fake = crate::bench_support::FakeQp::new(64);
        let qp = fake.qp();
        // SAFETY: the do-nothing provider reads no memory.
        let send = |wrs: &mut [SendWr<'_>]| unsafe { qp.post_send_batch(wrs) };
        let sges = [Sge::new(0x1000, 8, 7)];
        // The fake QP has no inline room: the third request is refused.
        let mut wrs = [
            SendWr::send(0, &sges),
            SendWr::send(1, &sges),
            SendWr::send(2, &sges).inline(),
        ];
        send(&mut wrs[..2]).unwrap();
        let e = send(&mut wrs).unwrap_err();
        let einval = libc::EINVAL;
        assert!(
            matches!(e, Error::Post { index: 2, count: 3, errno, .. } if errno == einval),
            "{e:?}"
        );
        let e = send(&mut wrs[2..]).unwrap_err();
        assert!(matches!(e, Error::Limit { .. }), "{e:?}");
        assert!(wrs.iter().all(|w| w.as_raw().next.is_null()));
        // No `post_recv` in the fake's op table: the verb's EOPNOTSUPP, naming no request.
        let mut recvs = [RecvWr::new(0, &sges), RecvWr::new(1, &sges)];
        // SAFETY: as above.
        let e = unsafe { qp.post_recv_batch(&mut recvs) }.unwrap_err();
        let eopnotsupp = libc::EOPNOTSUPP;
        assert!(
            matches!(e, Error::Post { index: 2, count: 2, errno, .. } if errno == eopnotsupp),
            "{e:?}"
        );
    }

    #[test]
    fn access_bits_round_trip() {
        let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(access_from_bits(a.bits()), a);
    }
}
