//! Shared receive queues: one pool of receive requests for many queue pairs.

use crate::error::{check_post, Error, Result};
use crate::ffi;
use crate::pd::Pd;
use crate::wr::{self, RecvWr};
use std::sync::Arc;

/// A shared receive queue (`ibv_srq`). Cheap to clone; QPs attached to it keep it alive.
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

pub(crate) struct SrqInner {
    pub(crate) raw: *mut ffi::ibv_srq,
    max_wr: u32,
    max_sge: u32,
    pub(crate) pd: Pd,
}

// SAFETY: libibverbs providers serialise posting to an SRQ with their own lock. A provider
// may be told to drop its locks (`MLX5_SINGLE_THREADED=1`): then sharing an `Srq` between
// threads that post needs the caller's own lock (see `Context::open`'s warning and the
// guide's object-model chapter); rsrdma-net takes one where it shares an SRQ.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: created by us; every QP attached holds a clone, so none is left.
        let rc = unsafe { ffi::ibv_destroy_srq(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_srq failed");
        }
    }
}

impl Srq {
    /// Creates an SRQ holding up to `max_wr` receive requests of up to `max_sge` entries.
    ///
    /// # Errors
    /// [`Error::Limit`] beyond the device's `max_srq_wr`/`max_srq_sge` (checked before any
    /// verb); [`Error::Verbs`] naming `ibv_create_srq`.
    pub fn new(pd: &Pd, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let attr = pd.context().attr();
        if max_wr == 0 || max_sge == 0 {
            return Err(Error::InvalidArgument(
                "an SRQ needs max_wr and max_sge of at least 1".into(),
            ));
        }
        if max_wr > attr.max_srq_wr {
            return Err(Error::Limit {
                what: "srq max_wr",
                requested: max_wr.into(),
                limit: attr.max_srq_wr.into(),
                source_of_limit: "device max_srq_wr",
            });
        }
        if max_sge > attr.max_srq_sge {
            return Err(Error::Limit {
                what: "srq max_sge",
                requested: max_sge.into(),
                limit: attr.max_srq_sge.into(),
                source_of_limit: "device max_srq_sge",
            });
        }
        let mut init = ffi::ibv_srq_init_attr::default();
        init.attr.max_wr = max_wr;
        init.attr.max_sge = max_sge;
        // SAFETY: live PD; `init` is a valid attribute struct the call reads and updates.
        let raw = unsafe { ffi::ibv_create_srq(pd.inner.raw, &mut init) };
        if raw.is_null() {
            return Err(Error::last_os("ibv_create_srq"));
        }
        Ok(Srq {
            inner: Arc::new(SrqInner {
                raw,
                max_wr: init.attr.max_wr,
                max_sge: init.attr.max_sge,
                pd: pd.clone(),
            }),
        })
    }

    /// Receive requests it holds at most (as the provider granted).
    pub fn max_wr(&self) -> u32 {
        self.inner.max_wr
    }

    /// Scatter/gather entries per request.
    pub fn max_sge(&self) -> u32 {
        self.inner.max_sge
    }

    /// Arms the SRQ limit: once fewer than `limit` receive requests are left on the SRQ, the
    /// device raises one [`crate::AsyncEventKind::SrqLimitReached`] event
    /// ([`crate::Context::read_async_event`]) and disarms; arm again to hear of it again.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 (which would disarm) or a limit not below
    /// [`Srq::max_wr`]; [`Error::Verbs`] naming `ibv_modify_srq` (a device without SRQ
    /// limits: EINVAL or EOPNOTSUPP).
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit == 0 || limit >= self.inner.max_wr {
            return Err(Error::InvalidArgument(format!(
                "an SRQ limit must be between 1 and {} (max_wr − 1), not {limit}",
                self.inner.max_wr.saturating_sub(1)
            )));
        }
        let mut attr = ffi::ibv_srq_attr {
            srq_limit: limit,
            ..Default::default()
        };
        // SAFETY: live SRQ; `attr` is a valid attribute struct of which the call reads the
        // limit only (the mask says so).
        let rc = unsafe {
            ffi::ibv_modify_srq(
                self.inner.raw,
                &mut attr,
                ffi::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as _,
            )
        };
        crate::error::check_rc("ibv_modify_srq", rc)
    }

    /// Posts one receive request.
    ///
    /// # Safety
    /// The memory its SGEs name must stay valid, and must not be read or written by the CPU,
    /// until the request's completion has been reaped (or the SRQ is destroyed).
    ///
    /// # Errors
    /// [`Error::Post`] naming `ibv_post_srq_recv`.
    #[inline]
    pub unsafe fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: live SRQ; a valid single request posted in place (its `next` is null, and
        // providers do not write it); the caller vouches for its memory.
        let rc = unsafe {
            ffi::data_path::ibv_post_srq_recv(
                self.inner.raw,
                std::ptr::from_ref(wr.as_raw()).cast_mut(),
                &mut bad,
            )
        };
        check_post("ibv_post_srq_recv", rc, 0, 1)
    }

    /// Posts a list of receive requests with one call.
    ///
    /// # Safety
    /// As [`Srq::post_recv`], for every request.
    ///
    /// # Errors
    /// [`Error::Post`] with the index of the first request not posted.
    #[inline]
    pub unsafe fn post_recv_batch(&self, wrs: &mut [RecvWr<'_>]) -> Result<()> {
        let raw = self.inner.raw;
        wr::post_list(
            "ibv_post_srq_recv",
            wrs,
            |_| Ok(()),
            |list, bad| {
                // SAFETY: live SRQ; `list` is the caller's requests, linked into one list that
                // ends in null and stays put during the call; the caller vouches for their
                // memory.
                unsafe { ffi::data_path::ibv_post_srq_recv(raw, list, bad) }
            },
        )
    }

    /// The SRQ's kernel handle, unique among the SRQs of its context: how an
    /// [`crate::AsyncEvent`] names it.
    pub fn handle(&self) -> u32 {
        // SAFETY: `raw` is a live SRQ for as long as `self` lives.
        unsafe { (*self.inner.raw).handle }
    }

    /// The raw `ibv_srq`; `None` for a provider that is not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_srq> {
        Some(self.inner.raw)
    }
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("max_wr", &self.inner.max_wr)
            .field("max_sge", &self.inner.max_sge)
            .finish()
    }
}
