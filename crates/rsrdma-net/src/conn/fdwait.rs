//! poll(2) on a few descriptors with a timeout, and the eventfd that wakes the progress
//! thread.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Waits until one of `fds` is readable (or hung up, or in error), or `timeout` passes
/// (`None`: no limit). Returns one flag per descriptor; `None` entries are skipped.
pub(crate) fn wait_readable<const N: usize>(
    fds: [Option<RawFd>; N],
    timeout: Option<Duration>,
) -> io::Result<[bool; N]> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; N];
    for (p, fd) in pfds.iter_mut().zip(fds) {
        // A negative fd is ignored by poll(2).
        p.fd = fd.unwrap_or(-1);
    }
    let ms = match timeout {
        None => -1,
        // Round up, so a sub-millisecond remainder waits instead of spinning.
        Some(t) if t.is_zero() => 0,
        Some(t) => t.as_millis().saturating_add(1).min(i32::MAX as u128) as i32,
    };
    // SAFETY: `pfds` is a valid array of N pollfd for the duration of the call.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, ms) };
    let mut ready = [false; N];
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(ready)
        } else {
            Err(e)
        };
    }
    let any = libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    for (r, p) in ready.iter_mut().zip(pfds) {
        *r = p.fd >= 0 && p.revents & any != 0;
    }
    Ok(ready)
}

/// A non-blocking eventfd: `wake` makes it readable, `clear` makes it quiet again.
#[derive(Debug)]
pub(crate) struct Wake {
    fd: OwnedFd,
}

impl Wake {
    pub(crate) fn new() -> io::Result<Wake> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Wake { fd })
    }

    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd; a full counter (EAGAIN)
        // means it is readable already, which is all we want.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub(crate) fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN when already clear.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn wake_makes_it_readable_and_clear_quiet() {
        let w = Wake::new().unwrap();
        let t0 = Instant::now();
        let r = wait_readable([Some(w.raw()), None], Some(Duration::from_millis(20))).unwrap();
        assert_eq!(r, [false, false]);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        w.wake();
        w.wake();
        let r = wait_readable([None, Some(w.raw())], None).unwrap();
        assert_eq!(r, [false, true]);
        w.clear();
        let r = wait_readable([Some(w.raw())], Some(Duration::ZERO)).unwrap();
        assert_eq!(r, [false]);
    }
}
