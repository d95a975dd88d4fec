//! Memory regions: memory the NIC may read and write.
//!
//! [`Mr::new`] allocates page-aligned, zeroed memory and registers it; the memory is freed only
//! after it is deregistered, so once an `Mr` is gone the NIC can no longer reach it.
//! [`Mr::register`] registers memory the caller owns (hugepages, a pool, a GPU-adjacent
//! buffer); it is `unsafe` because rsrdma cannot see that memory's lifetime.

use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::Pd;
use crate::wr::Sge;
use std::alloc::Layout;
use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// The page size registered buffers are aligned to.
pub const PAGE_SIZE: usize = 4096;

/// What a memory region allows. The default is [`AccessFlags::LOCAL_WRITE`] alone: nothing a
/// peer can touch. Grant remote access only to memory a peer needs, once the peer is accepted.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No access beyond local reads (sending from it).
    pub const NONE: AccessFlags = AccessFlags(0);
    /// The NIC may write it locally (receiving into it, RDMA read results).
    pub const LOCAL_WRITE: AccessFlags =
        AccessFlags(ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// A peer may RDMA-write it. Requires `LOCAL_WRITE`.
    pub const REMOTE_WRITE: AccessFlags =
        AccessFlags(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// A peer may RDMA-read it.
    pub const REMOTE_READ: AccessFlags =
        AccessFlags(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// A peer may run atomics on it. Requires `LOCAL_WRITE`.
    pub const REMOTE_ATOMIC: AccessFlags =
        AccessFlags(ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// Allow the NIC to reorder writes (PCIe relaxed ordering) where supported.
    pub const RELAXED_ORDERING: AccessFlags =
        AccessFlags(ffi::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0);

    /// The raw `IBV_ACCESS_*` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// True when every bit of `other` is set here.
    pub fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Rejects combinations the verbs API refuses, with a message that says why.
    pub(crate) fn validate(self) -> Result<()> {
        let needs_local_write = AccessFlags(Self::REMOTE_WRITE.0 | Self::REMOTE_ATOMIC.0);
        if self.0 & needs_local_write.0 != 0 && !self.contains(Self::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(format!(
                "access {self:?}: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE"
            )));
        }
        Ok(())
    }
}

impl Default for AccessFlags {
    fn default() -> Self {
        AccessFlags::LOCAL_WRITE
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, rhs: AccessFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
            (Self::RELAXED_ORDERING, "RELAXED_ORDERING"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(b, _)| self.contains(*b))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&set.join("|"))
        }
    }
}

/// A registered memory region as a peer sees it: a plain value to send over the wire, naming
/// memory the peer may then access with one-sided operations (as far as the region's
/// [`AccessFlags`] allow).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RemoteMemory {
    /// Virtual address of the first byte, in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote key.
    pub rkey: u32,
}

impl RemoteMemory {
    /// The address `offset` bytes in, checked so that `len` bytes from there stay inside.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is outside the region.
    pub fn addr_at(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.addr + offset),
            _ => Err(Error::InvalidArgument(format!(
                "remote range {offset}+{len} is outside the {}-byte region",
                self.len
            ))),
        }
    }
}

enum Backing {
    /// Memory we allocated with this layout; freed after deregistration.
    Owned(Layout),
    /// The caller's memory; never freed by us.
    Borrowed,
}

/// A registered memory region (`ibv_mr`). Keeps its [`Pd`] alive.
///
/// Reading and writing its bytes is safe Rust, but the NIC writes them too: a buffer named by a
/// posted receive or RDMA read, or exposed to a peer with remote write access, may change under
/// a `&[u8]`. Only look at such bytes after the completion that covers them is reaped (the
/// contract of the `unsafe` posting calls).
pub struct Mr {
    raw: *mut ffi::ibv_mr,
    ptr: *mut u8,
    len: usize,
    access: AccessFlags,
    backing: Backing,
    pd: Pd,
}

// SAFETY: the region is an owned allocation plus an immutable verbs handle.
unsafe impl Send for Mr {}
// SAFETY: shared access only hands out `&[u8]`; mutation needs `&mut Mr`.
unsafe impl Sync for Mr {}

impl Mr {
    /// Allocates `len` bytes of zeroed, page-aligned memory and registers it in `pd` with
    /// `access`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero length or an access combination the verbs refuse;
    /// [`Error::Limit`] beyond the device's `max_mr_size`; [`Error::Verbs`] naming
    /// `ibv_reg_mr` (ENOMEM is often `ulimit -l`).
    pub fn new(pd: &Pd, len: usize, access: AccessFlags) -> Result<Mr> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a memory region needs at least one byte".into(),
            ));
        }
        access.validate()?;
        let max = pd.context().attr().max_mr_size;
        if max != 0 && len as u64 > max {
            return Err(Error::Limit {
                what: "memory region length",
                requested: len as u64,
                limit: max,
                source_of_limit: "device max_mr_size",
            });
        }
        let size = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let layout = Layout::from_size_align(size, PAGE_SIZE)
            .map_err(|_| Error::InvalidArgument(format!("{len} bytes cannot be allocated")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Verbs {
                op: "alloc",
                errno: libc::ENOMEM,
            });
        }
        // SAFETY: `ptr` is a fresh allocation of `size >= len` bytes that `Mr` owns and frees
        // only after deregistering it.
        let raw = unsafe { reg_mr(pd, ptr, len, access) };
        match raw {
            Ok(raw) => Ok(Mr {
                raw,
                ptr,
                len,
                access,
                backing: Backing::Owned(layout),
                pd: pd.clone(),
            }),
            Err(e) => {
                // SAFETY: allocated just above with this layout, never registered.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Err(e)
            }
        }
    }

    /// Registers `len` bytes at `ptr`, memory the caller owns (hugepages included).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes, and must stay allocated and unmoved
    /// until this `Mr` is dropped and every work request naming it has completed. While the
    /// region is registered the caller must not create Rust references to that memory that
    /// conflict with [`Mr::as_slice`]/[`Mr::as_mut_slice`] or with what the NIC writes.
    ///
    /// # Errors
    /// As [`Mr::new`].
    pub unsafe fn register(pd: &Pd, ptr: *mut u8, len: usize, access: AccessFlags) -> Result<Mr> {
        if len == 0 || ptr.is_null() {
            return Err(Error::InvalidArgument(
                "registration needs a non-null, non-empty range".into(),
            ));
        }
        access.validate()?;
        // SAFETY: the caller guarantees the range is valid for the region's lifetime.
        let raw = unsafe { reg_mr(pd, ptr, len, access) }?;
        Ok(Mr {
            raw,
            ptr,
            len,
            access,
            backing: Backing::Borrowed,
            pd: pd.clone(),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte (what local SGEs and peers name).
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `raw` is a live registration.
        unsafe { (*self.raw).lkey }
    }

    /// The remote key, for peers.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `raw` is a live registration.
        unsafe { (*self.raw).rkey }
    }

    /// The access this region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain it is registered in.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The descriptor a peer needs for one-sided access.
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }

    /// The region's bytes. See the type's docs for when the NIC may be writing them.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is valid for the region's lifetime, which the borrow is tied to.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The region's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference from Rust.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is outside the region or longer than 4 GiB.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len && len <= u32::MAX as usize => Ok(Sge::new(
                self.addr() + offset as u64,
                len as u32,
                self.lkey(),
            )),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} is outside the {}-byte memory region",
                self.len
            ))),
        }
    }

    /// The raw `ibv_mr`; `None` for a provider that is not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_mr> {
        Some(self.raw)
    }
}

/// Registers memory, through `__ibv_reg_mr` (what the `ibv_reg_mr` macro expands to).
///
/// # Safety
/// `ptr..ptr+len` must be valid memory that outlives the registration.
unsafe fn reg_mr(
    pd: &Pd,
    ptr: *mut u8,
    len: usize,
    access: AccessFlags,
) -> Result<*mut ffi::ibv_mr> {
    // SAFETY: the PD is live; the caller vouches for the range. is_access_const = 0 lets the
    // library check optional-access bits at run time.
    let raw = unsafe { ffi::__ibv_reg_mr(pd.inner.raw, ptr.cast(), len, access.bits(), 0) };
    if raw.is_null() {
        return Err(Error::last_os("ibv_reg_mr"));
    }
    Ok(raw)
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once. After this returns the NIC holds no
        // translation for the range, so freeing the memory below is safe.
        let rc = unsafe { ffi::ibv_dereg_mr(self.raw) };
        if rc != 0 {
            // Freeing memory the NIC might still reach would be unsound: leak it instead.
            tracing::error!(
                rc,
                addr = self.addr(),
                len = self.len,
                "ibv_dereg_mr failed; leaking the buffer"
            );
            return;
        }
        if let Backing::Owned(layout) = self.backing {
            // SAFETY: allocated in `Mr::new` with this layout; no registration remains.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_access_is_least_privilege() {
        let a = AccessFlags::default();
        assert_eq!(a, AccessFlags::LOCAL_WRITE);
        assert!(!a.contains(AccessFlags::REMOTE_WRITE));
        assert!(!a.contains(AccessFlags::REMOTE_READ));
        assert_eq!(format!("{a:?}"), "LOCAL_WRITE");
    }

    #[test]
    fn remote_write_without_local_write_is_refused() {
        assert!(AccessFlags::REMOTE_WRITE.validate().is_err());
        assert!(AccessFlags::REMOTE_ATOMIC.validate().is_err());
        assert!((AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .validate()
            .is_ok());
        assert!(AccessFlags::REMOTE_READ.validate().is_ok());
    }

    #[test]
    fn remote_ranges_are_bounds_checked() {
        let r = RemoteMemory {
            addr: 0x1000,
            len: 64,
            rkey: 7,
        };
        assert_eq!(r.addr_at(0, 64).unwrap(), 0x1000);
        assert_eq!(r.addr_at(8, 8).unwrap(), 0x1008);
        assert!(r.addr_at(60, 8).is_err());
        assert!(r.addr_at(u64::MAX, 2).is_err());
    }
}
