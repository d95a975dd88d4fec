//! Memory files shared between the processes of one host (memfd), as soft0's rings, its
//! directory and its shared regions use them: made sealed, mapped shared, and checked when a
//! peer hands one over.
//!
//! A file a peer may shrink under a mapping turns the next access past its new end into
//! SIGBUS, so a file is mapped only once it is sealed against shrinking, and its size is
//! read after the seal is seen: from then on it can only stay or grow.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::raw::c_int;

/// A new memfd of `size` bytes (zero-filled), sealed with `seals` once sized.
///
/// # Errors
/// `memfd_create`'s, `ftruncate`'s or `fcntl`'s; `InvalidInput` for a size past the file
/// offsets.
pub(super) fn create(name: &CStr, size: usize, seals: c_int) -> io::Result<OwnedFd> {
    let size = libc::off_t::try_from(size).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a NUL-terminated name and constant flags.
    let raw =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a plain call on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(io::Error::last_os_error());
    }
    add_seals(&fd, seals)?;
    Ok(fd)
}

/// Adds `seals` to a memfd.
///
/// # Errors
/// `fcntl`'s.
pub(super) fn add_seals(fd: &OwnedFd, seals: c_int) -> io::Result<()> {
    // SAFETY: a plain call on a descriptor we hold.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The inode and size of a file.
///
/// # Errors
/// `fstat`'s.
pub(super) fn stat(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    // SAFETY: all-zero is a valid `stat`, which the call fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a plain call on a descriptor we hold, into a writable buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_ino, u64::try_from(st.st_size).unwrap_or(0)))
}

/// The size of a file a peer handed over, once it is sealed against shrinking (checked
/// first), with its inode.
///
/// # Errors
/// `InvalidData` when it is not sealed against shrinking (or is no memfd: other files have
/// no seals); `fcntl`'s or `fstat`'s errors.
pub(super) fn sealed_size(fd: &OwnedFd) -> io::Result<(u64, usize)> {
    // SAFETY: a plain call on a descriptor we hold.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a shared memory file that is not sealed against shrinking",
        ));
    }
    let (inode, size) = stat(fd)?;
    let size = usize::try_from(size).map_err(|_| io::ErrorKind::InvalidData)?;
    Ok((inode, size))
}

/// A shared mapping of a file, unmapped when dropped.
pub(super) struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: shared memory, reached only through raw pointers and atomics by its users, who
// say why each access is sound; the mapping itself may move between threads.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` hands out only the address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` (read-write, or read-only).
    ///
    /// # Errors
    /// `mmap`'s (EPERM for a writable mapping of a file sealed against it).
    pub(super) fn new(fd: &OwnedFd, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a fresh shared mapping of a file we hold, at an address the kernel picks.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }

    /// The first byte (page aligned).
    pub(super) fn base(&self) -> *mut u8 {
        self.base
    }

    /// The length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; its users hold `&self` while they use it.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
