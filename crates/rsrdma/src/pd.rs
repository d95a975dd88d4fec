//! Protection domains.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::ffi;
use std::sync::Arc;

/// A protection domain (`ibv_pd`): the scope within which memory regions, queue pairs and
/// address handles may refer to each other. Cheap to clone; every object made in it keeps it
/// (and its [`Context`]) alive.
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    pub(crate) raw: *mut ffi::ibv_pd,
    pub(crate) ctx: Context,
}

// SAFETY: an ibv_pd is an immutable handle once allocated; libibverbs serialises its uses.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by us; every MR, QP, SRQ and AH in it holds an Arc to this inner,
        // so none is left.
        let rc = unsafe { ffi::ibv_dealloc_pd(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dealloc_pd failed");
        }
    }
}

impl Pd {
    /// Allocates a protection domain on `ctx`.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_alloc_pd`.
    pub fn new(ctx: &Context) -> Result<Pd> {
        // SAFETY: the context is open.
        let raw = unsafe { ffi::ibv_alloc_pd(ctx.inner.raw) };
        if raw.is_null() {
            return Err(Error::last_os("ibv_alloc_pd"));
        }
        Ok(Pd {
            inner: Arc::new(PdInner {
                raw,
                ctx: ctx.clone(),
            }),
        })
    }

    /// The device context this domain belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The raw `ibv_pd`; `None` for a provider that is not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_pd> {
        Some(self.inner.raw)
    }
}

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.inner.ctx.name())
            .finish_non_exhaustive()
    }
}
