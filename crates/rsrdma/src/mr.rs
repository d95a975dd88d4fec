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
    /// Memory windows ([`crate::Mw`]) may be bound to the region. Grants a peer nothing by
    /// itself: a window grants what its bind asks for, through one queue pair, until it is
    /// invalidated.
    pub const MW_BIND: AccessFlags = AccessFlags(ffi::ibv_access_flags::IBV_ACCESS_MW_BIND.0);
    /// Allow the NIC to reorder writes (PCIe relaxed ordering) where supported.
    pub const RELAXED_ORDERING: AccessFlags =
        AccessFlags(ffi::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0);

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

// The raw bits are `IBV_ACCESS_*`.
crate::flags::flag_set!(AccessFlags, u32);

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
            (Self::RELAXED_ORDERING, "RELAXED_ORDERING"),
            (Self::MW_BIND, "MW_BIND"),
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
    /// soft0's shared memory (peers of the host reach it directly); unmapped after
    /// deregistration.
    Shared(crate::soft::SharedAlloc),
}

/// A registered memory region (`ibv_mr`). Keeps its [`Pd`] alive.
///
/// The NIC writes a region's bytes too, so Rust references to them are handed out only where
/// that cannot race:
/// - a region no peer can write (no `REMOTE_WRITE`/`REMOTE_ATOMIC`): [`Mr::as_slice`] and
///   [`Mr::as_mut_slice`]; local DMA (a posted receive, an RDMA read result) is excluded by
///   the contract of the `unsafe` posting calls;
/// - a remotely writable region: no references in safe code, only copies that hold none
///   ([`Mr::read_at`], [`Mr::write_at`]), or the `unsafe` `*_unchecked` accessors once the
///   protocol says the peer is done.
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
    /// `access`. On the software device `soft0`, memory with a remote right is a shared
    /// mapping (a memfd), so that processes of the same host and user do their one-sided
    /// requests in it themselves (see the guide's software device chapter).
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
        let layout = page_layout(len)?;
        if let Some(shared) = soft_shared(pd, len, access) {
            // SAFETY: `shared` is a fresh mapping of at least `len` bytes that `Mr` owns and
            // unmaps only after deregistering it.
            let raw = unsafe { reg_mr(pd, shared.ptr(), len, access) }?;
            return Ok(Mr {
                raw,
                ptr: shared.ptr(),
                len,
                access,
                backing: Backing::Shared(shared),
                pd: pd.clone(),
            });
        }
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

    /// True when a peer may change the bytes at any time: the region was registered with
    /// `REMOTE_WRITE` or `REMOTE_ATOMIC`. Such a region never hands out Rust references to its
    /// bytes in safe code; see [`Mr::read_at`] and [`Mr::write_at`].
    pub fn remotely_writable(&self) -> bool {
        self.access.contains(AccessFlags::REMOTE_WRITE)
            || self.access.contains(AccessFlags::REMOTE_ATOMIC)
    }

    /// The region's bytes, for a region no peer can write.
    ///
    /// Once a remotely writable region's key is with a peer, the peer's DMA can change bytes
    /// under a live `&[u8]`, which is undefined behaviour; so for those this is an error and
    /// [`Mr::read_at`] (a copy that holds no reference) is the safe way in. Local DMA (posted
    /// receives, RDMA read results) is covered by the contract of the `unsafe` posting calls.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a remotely writable region.
    pub fn as_slice(&self) -> Result<&[u8]> {
        self.check_local_only("as_slice")?;
        // SAFETY: `ptr..ptr+len` is valid for the region's lifetime, which the borrow is tied
        // to, and no peer can write it (checked above).
        Ok(unsafe { self.as_slice_unchecked() })
    }

    /// The region's bytes, writable, for a region no peer can write.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a remotely writable region (use [`Mr::write_at`]).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.check_local_only("as_mut_slice")?;
        // SAFETY: as `as_slice`, and `&mut self` makes this the only reference from Rust.
        Ok(unsafe { self.as_mut_slice_unchecked() })
    }

    /// The region's bytes, whatever its access.
    ///
    /// # Safety
    /// While the returned borrow lives, nothing may write the region: no peer (the protocol
    /// must say the peer is done, e.g. a message after its last RDMA write), and no local DMA
    /// (no posted receive or RDMA read into it).
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: the range is valid for the region's lifetime; the caller excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The region's bytes, writable, whatever its access.
    ///
    /// # Safety
    /// While the returned borrow lives, neither a peer nor the local NIC may read or write the
    /// region (no request naming it in flight, no peer access the protocol allows).
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes this the only reference from Rust.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Copies `dst.len()` bytes at `offset` out of the region. Sound while a peer writes the
    /// region: the copy uses volatile loads and creates no reference to the region's bytes.
    /// Bytes a peer is writing at that moment may be old, new, or a mix; a protocol message
    /// says when they are final.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is outside the region.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        // SAFETY: the range is inside the region (checked), valid while `self` lives; `dst`
        // is ordinary memory that cannot overlap the region's (no reference to it exists
        // from safe code for remotely writable regions, and `&self` excludes `&mut` ones).
        unsafe { volatile_copy::load(self.ptr.add(offset), dst) };
        Ok(())
    }

    /// Copies `src` into the region at `offset`, with volatile stores: sound while a peer may
    /// read or write the region (racing bytes are the protocol's business, not UB).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is outside the region.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        // SAFETY: the range is inside the region (checked); `&mut self` excludes Rust
        // references to it; `src` cannot overlap it for the same reason.
        unsafe { volatile_copy::store(src, self.ptr.add(offset)) };
        Ok(())
    }

    fn check_local_only(&self, what: &str) -> Result<()> {
        if self.remotely_writable() {
            return Err(Error::InvalidArgument(format!(
                "Mr::{what}: the region is remotely writable ({:?}), so a peer may change it \
                 under a reference; use read_at/write_at, or the unsafe *_unchecked accessors \
                 once the protocol says the peer is done",
                self.access
            )));
        }
        Ok(())
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range {offset}+{len} is outside the {}-byte memory region",
                self.len
            ))),
        }
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is outside the region or longer than 4 GiB.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        region_sge(self.addr(), self.len, self.lkey(), offset, len)
    }

    /// The raw `ibv_mr`; `None` for a provider that is not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_mr> {
        Some(self.raw)
    }
}

/// A scatter/gather entry for `len` bytes at `offset` in a region of `region_len` bytes whose
/// first byte work requests name `base` (a host address, or a DMA-BUF region's iova).
pub(crate) fn region_sge(
    base: u64,
    region_len: usize,
    lkey: u32,
    offset: usize,
    len: usize,
) -> Result<Sge> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len && len <= u32::MAX as usize => {
            Ok(Sge::new(base + offset as u64, len as u32, lkey))
        }
        _ => Err(Error::InvalidArgument(format!(
            "range {offset}+{len} is outside the {region_len}-byte memory region"
        ))),
    }
}

/// The page-aligned layout that holds `len` bytes, rounded up to whole pages. The rounding is
/// checked: a length near `usize::MAX` would wrap to a zero-size layout.
fn page_layout(len: usize) -> Result<Layout> {
    len.checked_next_multiple_of(PAGE_SIZE)
        .and_then(|size| Layout::from_size_align(size, PAGE_SIZE).ok())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "a memory region of {len} bytes cannot be allocated (past the address space)"
            ))
        })
}

/// On soft0, memory a peer may reach (a remote right) comes from shared memory, so that peers
/// of the host do their WRITEs, READs and atomics in it themselves (see the guide's software
/// device chapter); `None` elsewhere, or when soft0 cannot share (it then falls back to the
/// heap, and peers' requests take the packet path).
fn soft_shared(pd: &Pd, len: usize, access: AccessFlags) -> Option<crate::soft::SharedAlloc> {
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    // SAFETY: a live PD's context is a live context.
    let soft = unsafe { crate::soft::is_context((*pd.inner.raw).context) };
    if !soft || access.bits() & remote.bits() == 0 || !crate::soft::shares_memory() {
        return None;
    }
    crate::soft::SharedAlloc::new(len)
        .inspect_err(|e| tracing::debug!(error = %e, "soft0: no shared memory for a region"))
        .ok()
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

/// A deregistration that failed ([`Mr::deregister`]): the region is still registered, and
/// comes back so that its owner can decide (retry, or leak the memory: never free it).
#[derive(Debug)]
pub struct DeregFailed {
    /// The region, still registered.
    pub mr: Mr,
    /// Why `ibv_dereg_mr` failed.
    pub error: Error,
}

impl fmt::Display for DeregFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (the region stays registered)", self.error)
    }
}

impl std::error::Error for DeregFailed {}

impl Mr {
    /// Deregisters the region now, reporting a failure instead of hiding it.
    ///
    /// `drop` deregisters too, but can only log a failure; memory it allocated itself
    /// ([`Mr::new`]) is then leaked, never freed. The owner of caller memory
    /// ([`Mr::register`]) must do the same: free the memory only after `Ok`, and leak it
    /// (`std::mem::forget`) when the region comes back in [`DeregFailed`], because the NIC
    /// may still reach it (a device refuses, for example, while a memory window is bound to
    /// the region).
    ///
    /// # Errors
    /// [`DeregFailed`]: `ibv_dereg_mr`'s errno, and the region.
    pub fn deregister(self) -> std::result::Result<(), Box<DeregFailed>> {
        // SAFETY: registered by us; on success the handle is gone and `self` is consumed
        // below without running `Drop` (which would deregister again).
        let rc = unsafe { ffi::ibv_dereg_mr(self.raw) };
        if rc != 0 {
            let errno = if rc > 0 {
                rc
            } else {
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)
            };
            return Err(Box::new(DeregFailed {
                mr: self,
                error: Error::Verbs {
                    op: "ibv_dereg_mr",
                    errno,
                },
            }));
        }
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used again: its backing is read out exactly once.
        match unsafe { std::ptr::read(&this.backing) } {
            // SAFETY: allocated in `Mr::new` with this layout; no registration remains.
            Backing::Owned(layout) => unsafe { std::alloc::dealloc(this.ptr, layout) },
            // No registration remains: unmapped as it drops.
            Backing::Shared(shared) => drop(shared),
            Backing::Borrowed => {}
        }
        // SAFETY: `this` is never used again; its `Pd` handle is dropped exactly once here.
        drop(unsafe { std::ptr::read(&this.pd) });
        Ok(())
    }
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
            std::mem::forget(std::mem::replace(&mut self.backing, Backing::Borrowed));
            return;
        }
        if let Backing::Owned(layout) = self.backing {
            // SAFETY: allocated in `Mr::new` with this layout; no registration remains.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// Copies between a region that DMA may change and ordinary memory, with volatile accesses:
/// word-sized in the middle, so a large copy is not a byte loop.
mod volatile_copy {
    const WORD: usize = std::mem::size_of::<u64>();

    /// Copies `dst.len()` bytes from `src` into `dst`.
    ///
    /// # Safety
    /// `src..src+dst.len()` must be valid for reads and must not overlap `dst`.
    pub(super) unsafe fn load(src: *const u8, dst: &mut [u8]) {
        let len = dst.len();
        let head = src.align_offset(WORD).min(len);
        let words = (len - head) / WORD;
        for (i, b) in dst[..head].iter_mut().enumerate() {
            // SAFETY: `i < len`: inside the source range.
            *b = unsafe { src.add(i).read_volatile() };
        }
        for w in 0..words {
            let at = head + w * WORD;
            // SAFETY: `src + at` is word-aligned (past the head) and `at + WORD <= len`.
            let v = unsafe { src.add(at).cast::<u64>().read_volatile() };
            dst[at..at + WORD].copy_from_slice(&v.to_ne_bytes());
        }
        for (i, b) in dst.iter_mut().enumerate().skip(head + words * WORD) {
            // SAFETY: `i < len`.
            *b = unsafe { src.add(i).read_volatile() };
        }
    }

    /// Copies `src` to `dst..dst+src.len()`.
    ///
    /// # Safety
    /// `dst..dst+src.len()` must be valid for writes and must not overlap `src`.
    pub(super) unsafe fn store(src: &[u8], dst: *mut u8) {
        let len = src.len();
        let head = dst.align_offset(WORD).min(len);
        let words = (len - head) / WORD;
        for (i, b) in src[..head].iter().enumerate() {
            // SAFETY: `i < len`: inside the destination range.
            unsafe { dst.add(i).write_volatile(*b) };
        }
        for w in 0..words {
            let at = head + w * WORD;
            let mut v = [0u8; WORD];
            v.copy_from_slice(&src[at..at + WORD]);
            // SAFETY: `dst + at` is word-aligned and `at + WORD <= len`.
            unsafe {
                dst.add(at)
                    .cast::<u64>()
                    .write_volatile(u64::from_ne_bytes(v))
            };
        }
        for (i, b) in src.iter().enumerate().skip(head + words * WORD) {
            // SAFETY: `i < len`.
            unsafe { dst.add(i).write_volatile(*b) };
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
    fn page_rounding_is_checked() {
        assert_eq!(page_layout(1).unwrap().size(), PAGE_SIZE);
        assert_eq!(page_layout(PAGE_SIZE).unwrap().size(), PAGE_SIZE);
        assert_eq!(page_layout(PAGE_SIZE + 1).unwrap().size(), 2 * PAGE_SIZE);
        // Before the fix, div_ceil * PAGE_SIZE wrapped these to a zero-size layout.
        for len in [usize::MAX, usize::MAX - PAGE_SIZE + 2, isize::MAX as usize] {
            let e = page_layout(len).unwrap_err();
            assert!(e.to_string().contains(&len.to_string()), "{e}");
        }
    }

    #[test]
    fn volatile_copies_match_plain_copies_at_every_alignment() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in 0..16 {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 150] {
                let mut out = vec![0u8; len];
                // SAFETY: `offset + len <= 200`; `out` is a separate buffer.
                unsafe { volatile_copy::load(src.as_ptr().add(offset), &mut out) };
                assert_eq!(out, src[offset..offset + len], "load {offset}+{len}");
                let mut region = vec![0xAAu8; 200];
                // SAFETY: as above.
                unsafe { volatile_copy::store(&src[..len], region.as_mut_ptr().add(offset)) };
                assert_eq!(
                    &region[offset..offset + len],
                    &src[..len],
                    "store {offset}+{len}"
                );
                assert!(region[..offset].iter().all(|&b| b == 0xAA));
                assert!(region[offset + len..].iter().all(|&b| b == 0xAA));
            }
        }
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
