//! Memory for soft0's regions that peers of the same host reach directly: [`crate::Mr::new`]
//! allocates a region with remote rights here (a sealed memfd, mapped shared) instead of on
//! the heap, and soft0's `ibv_reg_mr` publishes a region that lies in such memory in its
//! directory ([`super::directory`]), with the memfd's descriptor number, so that a peer maps
//! it and does WRITEs, READs and atomics itself. Memory the caller registers
//! ([`crate::Mr::register`]) is not shared: requests to it take the packet path.

use super::memfd;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

/// Shared allocations by first address: (length, descriptor number, inode).
static ALLOCS: Mutex<BTreeMap<u64, (u64, i32, u64)>> = Mutex::new(BTreeMap::new());

/// A zeroed, page-aligned allocation in a memfd, mapped shared in this process.
pub(crate) struct SharedAlloc {
    map: memfd::Mapping,
    _fd: OwnedFd,
}

impl SharedAlloc {
    /// At least `len` bytes (a whole number of pages).
    ///
    /// # Errors
    /// `memfd_create`'s, `ftruncate`'s, `fcntl`'s, `fstat`'s or `mmap`'s; `InvalidInput` for a
    /// length past the address space.
    pub(crate) fn new(len: usize) -> io::Result<SharedAlloc> {
        let size = len
            .checked_next_multiple_of(4096)
            .filter(|&s| s > 0)
            .ok_or(io::ErrorKind::InvalidInput)?;
        // Sealed against shrinking: a peer's mapping never turns into SIGBUS.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        let fd = memfd::create(c"rsrdma-soft0-region", size, seals)?;
        let (inode, _) = memfd::stat(&fd)?;
        let map = memfd::Mapping::new(&fd, size, true)?;
        ALLOCS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(map.base() as u64, (size as u64, fd.as_raw_fd(), inode));
        Ok(SharedAlloc { map, _fd: fd })
    }

    /// Its first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map.base()
    }
}

impl Drop for SharedAlloc {
    fn drop(&mut self) {
        // Forgotten first; the mapping goes as the fields drop (the region was deregistered
        // before: `Mr` drops its backing only after `ibv_dereg_mr` succeeded).
        ALLOCS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(self.map.base() as u64));
    }
}

/// The shared allocation holding `[addr, addr + len)`: its descriptor number, inode, and
/// where the range starts in it.
pub(super) fn lookup(addr: u64, len: u64) -> Option<(i32, u64, u64)> {
    let allocs = ALLOCS.lock().unwrap_or_else(|p| p.into_inner());
    let (&start, &(size, fd_no, inode)) = allocs.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + size).then_some((fd_no, inode, addr - start))
}
