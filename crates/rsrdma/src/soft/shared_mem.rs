//! Memory for soft0's regions that peers of the same host reach directly: [`crate::Mr::new`]
//! allocates a region with remote rights here (a sealed memfd, mapped shared) instead of on
//! the heap, and soft0's `ibv_reg_mr` publishes a region that lies in such memory in its
//! directory ([`super::directory`]), with the memfd's descriptor number, so that a peer maps
//! it and does WRITEs, READs and atomics itself. Memory the caller registers
//! ([`crate::Mr::register`]) is not shared: requests to it take the packet path.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// Shared allocations by first address: (length, descriptor number, inode).
static ALLOCS: Mutex<BTreeMap<u64, (u64, i32, u64)>> = Mutex::new(BTreeMap::new());

/// A zeroed, page-aligned allocation in a memfd, mapped shared in this process.
pub(crate) struct SharedAlloc {
    ptr: *mut u8,
    len: usize,
    _fd: OwnedFd,
}

// SAFETY: plain memory owned by this value; who may touch it is the region's business.
unsafe impl Send for SharedAlloc {}
// SAFETY: as above.
unsafe impl Sync for SharedAlloc {}

impl SharedAlloc {
    /// At least `len` bytes (a whole number of pages).
    ///
    /// # Errors
    /// `memfd_create`'s, `ftruncate`'s, `fcntl`'s or `mmap`'s; `InvalidInput` for a length
    /// past the address space.
    pub(crate) fn new(len: usize) -> io::Result<SharedAlloc> {
        let size = len
            .checked_next_multiple_of(4096)
            .filter(|&s| s > 0 && i64::try_from(s).is_ok())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a NUL-terminated name and constant flags.
        let raw = unsafe {
            libc::memfd_create(
                c"rsrdma-soft0-region".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Sealed against shrinking: a peer's mapping never turns into SIGBUS.
        // SAFETY: plain calls on our own descriptor.
        let ok = unsafe {
            libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) == 0
                && libc::fcntl(
                    fd.as_raw_fd(),
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
                ) == 0
        };
        if !ok {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a plain call on our own descriptor, into a zeroed stat buffer.
        let inode = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                return Err(io::Error::last_os_error());
            }
            st.st_ino
        };
        // SAFETY: a fresh shared mapping of our own file, at an address the kernel picks.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        ALLOCS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr as u64, (size as u64, fd.as_raw_fd(), inode));
        Ok(SharedAlloc {
            ptr: ptr.cast(),
            len: size,
            _fd: fd,
        })
    }

    /// Its first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for SharedAlloc {
    fn drop(&mut self) {
        ALLOCS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(self.ptr as u64));
        // SAFETY: the mapping made in `new`, not used after this (its region was
        // deregistered first: `Mr` drops its backing only after `ibv_dereg_mr` succeeded).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
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
