//! Address handles: where a UD send goes, and the path description RC/UC connections use.

use crate::context::Gid;
use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::Pd;
use crate::wc::Wc;
use std::sync::Arc;

/// The global routing header fields of a path: required on RoCE, and across IB subnets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalRoute {
    /// The destination GID.
    pub dgid: Gid,
    /// Index of the local GID to send from (perftest's `-x`).
    pub sgid_index: u8,
    /// IP hop limit / TTL. perftest uses 0xff; 1 breaks RoCE v2 across routers.
    pub hop_limit: u8,
    /// Traffic class (DSCP/ECN on RoCE v2).
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

impl GlobalRoute {
    /// A route to `dgid` from local GID `sgid_index`, with a routable hop limit.
    pub fn new(dgid: Gid, sgid_index: u8) -> Self {
        GlobalRoute {
            dgid,
            sgid_index,
            hop_limit: 0xff,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// A path to a peer (`ibv_ah_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// Local port, from 1.
    pub port_num: u8,
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate limit (0: none).
    pub static_rate: u8,
    /// Global routing; `Some` on RoCE.
    pub grh: Option<GlobalRoute>,
}

impl AhAttr {
    pub(crate) fn to_raw(self) -> ffi::ibv_ah_attr {
        let mut a = ffi::ibv_ah_attr {
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            port_num: self.port_num,
            ..Default::default()
        };
        if let Some(g) = self.grh {
            a.is_global = 1;
            a.grh = ffi::ibv_global_route {
                dgid: g.dgid.to_raw(),
                flow_label: g.flow_label,
                sgid_index: g.sgid_index,
                hop_limit: g.hop_limit,
                traffic_class: g.traffic_class,
            };
        }
        a
    }

    pub(crate) fn from_raw(a: &ffi::ibv_ah_attr) -> Self {
        AhAttr {
            port_num: a.port_num,
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            grh: (a.is_global != 0).then(|| GlobalRoute {
                dgid: Gid::from_raw(&a.grh.dgid),
                sgid_index: a.grh.sgid_index,
                hop_limit: a.grh.hop_limit,
                traffic_class: a.grh.traffic_class,
                flow_label: a.grh.flow_label,
            }),
        }
    }
}

/// An address handle (`ibv_ah`) for UD sends. Keeps its [`Pd`] alive.
pub struct Ah {
    inner: Arc<AhInner>,
}

struct AhInner {
    raw: *mut ffi::ibv_ah,
    _pd: Pd,
}

// SAFETY: an AH is immutable after creation.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once.
        let rc = unsafe { ffi::ibv_destroy_ah(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_ah failed");
        }
    }
}

impl Ah {
    /// Creates an address handle for `attr`.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_create_ah` (RoCE needs `grh`).
    pub fn new(pd: &Pd, attr: &AhAttr) -> Result<Ah> {
        let mut raw_attr = attr.to_raw();
        // SAFETY: the PD is live; the attribute is a valid, initialised struct.
        let raw = unsafe { ffi::ibv_create_ah(pd.inner.raw, &mut raw_attr) };
        if raw.is_null() {
            return Err(Error::last_os("ibv_create_ah"));
        }
        Ok(Ah {
            inner: Arc::new(AhInner {
                raw,
                _pd: pd.clone(),
            }),
        })
    }

    /// An address handle back to the sender of a UD receive: `grh` is the first 40 bytes of
    /// the receive buffer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `grh` is shorter than 40 bytes; [`Error::Verbs`] naming
    /// `ibv_create_ah_from_wc`.
    pub fn from_wc(pd: &Pd, port: u8, wc: &Wc, grh: &[u8]) -> Result<Ah> {
        if grh.len() < 40 {
            return Err(Error::InvalidArgument(format!(
                "a GRH is 40 bytes, got {}",
                grh.len()
            )));
        }
        let mut raw_wc = *wc.as_raw();
        // SAFETY: live PD; `raw_wc` is a copy the call may read; `grh` has the 40 bytes it reads.
        let raw = unsafe {
            ffi::ibv_create_ah_from_wc(
                pd.inner.raw,
                &mut raw_wc,
                grh.as_ptr() as *mut ffi::ibv_grh,
                port,
            )
        };
        if raw.is_null() {
            return Err(Error::last_os("ibv_create_ah_from_wc"));
        }
        Ok(Ah {
            inner: Arc::new(AhInner {
                raw,
                _pd: pd.clone(),
            }),
        })
    }

    pub(crate) fn raw_ptr(&self) -> *mut ffi::ibv_ah {
        self.inner.raw
    }

    /// The raw `ibv_ah`; `None` for a provider that is not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_ah> {
        Some(self.inner.raw)
    }
}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ah_attr_round_trips_through_c() {
        let attr = AhAttr {
            port_num: 1,
            dlid: 3,
            sl: 2,
            grh: Some(GlobalRoute {
                traffic_class: 106,
                ..GlobalRoute::new(Gid([7; 16]), 1)
            }),
            ..Default::default()
        };
        let raw = attr.to_raw();
        assert_eq!(raw.is_global, 1);
        assert_eq!(raw.grh.hop_limit, 0xff);
        assert_eq!(AhAttr::from_raw(&raw), attr);
        let local = AhAttr {
            port_num: 1,
            dlid: 9,
            ..Default::default()
        };
        assert_eq!(local.to_raw().is_global, 0);
        assert_eq!(AhAttr::from_raw(&local.to_raw()), local);
    }
}
