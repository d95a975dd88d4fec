//! Memory windows: remote access to part of a registered region, granted and revoked by work
//! requests instead of registrations.
//!
//! A type-2 window ([`Mw`]) is bound by an `IBV_WR_BIND_MW` request ([`crate::SendWr::bind_mw`])
//! on one queue pair to a range of a region registered with [`crate::AccessFlags::MW_BIND`]; its key
//! then works only for requests arriving on that queue pair, so another peer of the same
//! protection domain cannot use it. It is invalidated by a local `IBV_WR_LOCAL_INV`
//! ([`crate::SendWr::local_inv`]) or by the peer's send with invalidate, and can then be bound
//! again under a new key. Binding and invalidating are posted on the send queue like any
//! request (no system call, no page pinning): the cheap way to expose memory for one
//! transfer only.
//!
//! Keys: a window's key is a 24-bit index and an 8-bit tag; each bind names a new tag
//! ([`Mw::next_rkey`]), so a key from an earlier bind no longer works. libibverbs keeps the
//! current key in `ibv_mw.rkey`, which a bind request reads as the window's present key (rxe
//! checks it): after posting a bind, record its key with [`Mw::set_rkey`].

use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::Pd;
use std::fmt;

/// A type-2 memory window (`ibv_mw`). Keeps its [`Pd`] alive.
///
/// Dropping it deallocates it, which also unbinds it: a region with a bound window cannot be
/// deregistered on some providers (rxe), so drop windows before the regions they cover.
pub struct Mw {
    raw: *mut ffi::ibv_mw,
    pd: Pd,
}

// SAFETY: an ibv_mw is a handle; the only field written after allocation (`rkey`) is written
// through `&mut self`.
unsafe impl Send for Mw {}
// SAFETY: shared access only reads the handle.
unsafe impl Sync for Mw {}

impl Mw {
    /// Allocates a type-2 window on `pd`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where the device has no memory windows
    /// ([`crate::DeviceAttr::has_type2_windows`]); [`Error::Verbs`] naming `ibv_alloc_mw`.
    pub fn alloc_type2(pd: &Pd) -> Result<Mw> {
        // SAFETY: the PD is live.
        let raw = unsafe { ffi::ibv_alloc_mw(pd.inner.raw, ffi::IBV_MW_TYPE_2) };
        if raw.is_null() {
            return Err(Error::last_os("ibv_alloc_mw"));
        }
        Ok(Mw {
            raw,
            pd: pd.clone(),
        })
    }

    /// The window's present key (the key of its last bind, or the key it was allocated with).
    pub fn rkey(&self) -> u32 {
        // SAFETY: live handle; `rkey` is plain data.
        unsafe { (*self.raw).rkey }
    }

    /// The key the next bind should give the window: the present one with its 8-bit tag
    /// incremented (`ibv_inc_rkey`).
    pub fn next_rkey(&self) -> u32 {
        next_tag(self.rkey())
    }

    /// Records that a bind to `rkey` was posted: the next bind names it as the window's
    /// present key.
    pub fn set_rkey(&mut self, rkey: u32) {
        // SAFETY: live handle that this `Mw` owns; `&mut self` excludes any other access.
        unsafe { (*self.raw).rkey = rkey };
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The raw `ibv_mw`.
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.raw
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        // SAFETY: allocated by us, deallocated once.
        let rc = unsafe { ffi::ibv_dealloc_mw(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dealloc_mw failed");
        }
    }
}

impl fmt::Debug for Mw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mw")
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// `key` with its low 8 bits (the tag) incremented, the 24-bit index kept.
fn next_tag(key: u32) -> u32 {
    (key & 0xffff_ff00) | (key.wrapping_add(1) & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_key_changes_only_the_tag_and_wraps_within_it() {
        let tag = next_tag;
        assert_eq!(tag(0x0800_0107), 0x0800_0108);
        assert_eq!(tag(0x0800_01ff), 0x0800_0100);
        assert_eq!(tag(0xffff_ffff), 0xffff_ff00);
    }
}
