//! One registered allocation of slot memory that the connection owns (its send slots, its own
//! receive slots, or a listener's shared pool): allocated page-aligned, registered for local
//! access only, deregistered before it is freed. No Rust reference into it is ever created
//! (see the `slots` module docs): copies go through its raw pointer.

use rsrdma::{AccessFlags, Mr, Pd, Sge};
use std::alloc::Layout;

/// Regions are page-aligned, as [`Mr::new`] makes them.
const PAGE: usize = 4096;

/// One registered allocation that this module owns.
pub(crate) struct Region {
    /// `Some` until drop, which deregisters it before the memory is freed.
    mr: Option<Mr>,
    pub(crate) ptr: *mut u8,
    layout: Layout,
    pub(crate) len: usize,
    /// The registration's local key, kept here: an SGE per post is then a bounds test and
    /// arithmetic, without a call into the verbs crate (a send or a repost builds one).
    lkey: u32,
}

// SAFETY: the region owns its allocation outright; the raw pointer is only dereferenced
// through `&self`/`&mut self` methods of `Slots`, whose borrow rules serialise the copies.
unsafe impl Send for Region {}

impl Region {
    pub(crate) fn new(pd: &Pd, len: usize, access: AccessFlags) -> rsrdma::Result<Region> {
        let layout = len
            .checked_next_multiple_of(PAGE)
            .and_then(|size| Layout::from_size_align(size.max(PAGE), PAGE).ok())
            .ok_or_else(|| {
                rsrdma::Error::InvalidArgument(format!("a slot region of {len} bytes"))
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(rsrdma::Error::Verbs {
                op: "alloc",
                errno: libc::ENOMEM,
            });
        }
        // SAFETY: `ptr..ptr+len` is a fresh allocation that stays put until `drop`, which
        // deregisters first; no reference into it is ever created (module docs).
        match unsafe { Mr::register(pd, ptr, len, access) } {
            Ok(mr) => Ok(Region {
                lkey: mr.lkey(),
                mr: Some(mr),
                ptr,
                layout,
                len,
            }),
            Err(e) => {
                // SAFETY: allocated above with this layout, never registered.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Err(e)
            }
        }
    }

    pub(crate) fn mr(&self) -> Option<&Mr> {
        self.mr.as_ref()
    }

    /// Whether `offset..offset+len` lies inside the region.
    pub(crate) fn holds(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// The SGE of `offset..offset+len`, when that lies inside the region (and the region is
    /// still registered).
    pub(crate) fn sge(&self, offset: usize, len: usize) -> Option<Sge> {
        if self.mr.is_none() || !self.holds(offset, len) {
            return None;
        }
        Some(Sge::new(
            self.ptr as u64 + offset as u64,
            len as u32,
            self.lkey,
        ))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Deregister before freeing; the driver drops the memory only after the QP's flush
        // (or leaks it, see `Driver::teardown`). F11: a failed deregistration leaks the
        // memory, which the NIC may still reach.
        if let Some(mr) = self.mr.take() {
            if !deregistered(mr) {
                return;
            }
        }
        // SAFETY: allocated in `new` with this layout; the registration is gone.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Deregisters `mr`, a registration of memory its caller owns: true when the memory may now
/// be freed; false (logged, the registration leaked) when the device refused, and the caller
/// must leak the memory too (F11).
pub(crate) fn deregistered(mr: Mr) -> bool {
    match mr.deregister() {
        Ok(()) => true,
        Err(failed) => {
            tracing::error!(
                error = %failed.error,
                addr = failed.mr.addr(),
                len = failed.mr.len(),
                "rsrdma-net: deregistration failed; leaking the memory it covers"
            );
            std::mem::forget(failed);
            false
        }
    }
}
