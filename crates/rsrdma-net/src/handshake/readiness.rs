//! Waiting for a non-blocking socket with poll(2), up to a deadline.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Instant;

/// What a wait found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ready {
    /// Bytes (or end of stream, or an error) can be read.
    pub readable: bool,
    /// There is room to write.
    pub writable: bool,
}

/// Waits until `fd` is readable (with `want_read`) or writable (with `want_write`), or
/// `deadline` passes. `None` on time-out. Hang-ups and errors count as readable: the read
/// reports them.
pub(crate) fn wait(
    fd: BorrowedFd<'_>,
    want_read: bool,
    want_write: bool,
    deadline: Instant,
) -> io::Result<Option<Ready>> {
    let mut events = 0;
    if want_read {
        events |= libc::POLLIN;
    }
    if want_write {
        events |= libc::POLLOUT;
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Round up, so a sub-millisecond remainder still waits instead of spinning.
        let ms = if left.is_zero() {
            0
        } else {
            left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32
        };
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            let bad = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
            return Ok(Some(Ready {
                readable: pfd.revents & (libc::POLLIN | bad) != 0,
                writable: pfd.revents & libc::POLLOUT != 0,
            }));
        }
        if n == 0 {
            if left.is_zero() {
                return Ok(None);
            }
            continue;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
