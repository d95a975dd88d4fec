//! [`Timer`]: a timerfd on the monotonic clock, watched through the reactor: the keeper's
//! sleep.
//!
//! Not tokio's timer. The driver's deadlines are `std::time::Instant`s (the monotonic
//! clock), and a runtime whose clock is paused (`tokio::time::pause`, `start_paused`) moves
//! its timers only when it idles, and then straight to the next one: the keeper slept while
//! real time passed (no keepalive in 1.5 s of real time while a blocking task ran: the peer
//! would declare us dead), or woke before the driver's deadline. A runtime built without
//! `enable_time` has no timer at all (tokio panicked in the keeper and in `close`). A
//! timerfd needs only the reactor, which the connection's fds need anyway; `Instant` is
//! `CLOCK_MONOTONIC` on Linux, so the two agree.

use super::watch::Watch;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::task::Waker;
use std::time::Instant;

/// A one-shot timer for the keeper. Field order is drop order: the watch deregisters
/// before the descriptor closes.
#[derive(Debug)]
pub(crate) struct Timer {
    watch: Watch,
    fd: OwnedFd,
    /// What the timer is armed for (`None`: disarmed, or it fired).
    armed: Option<Instant>,
}

impl Timer {
    /// A disarmed timer, registered with the current runtime's reactor.
    ///
    /// # Errors
    /// `timerfd_create`'s (out of descriptors), or the reactor's.
    pub(crate) fn new() -> io::Result<Timer> {
        // SAFETY: plain system call; a non-negative return is a new descriptor we own.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor timerfd_create just opened for us alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is open and stays open (it is the next field, dropped after the
        // watch) while the watch lives.
        let watch = unsafe { Watch::new(fd.as_raw_fd()) }?;
        Ok(Timer {
            watch,
            fd,
            armed: None,
        })
    }

    /// Arms the timer to fire at `at` (re-arming replaces the earlier time), or disarms it.
    ///
    /// # Errors
    /// `timerfd_settime`'s.
    pub(crate) fn set(&mut self, at: Option<Instant>) -> io::Result<()> {
        if at == self.armed {
            return Ok(());
        }
        let mut spec: libc::itimerspec = unsafe {
            // SAFETY: itimerspec is plain integers; all zero is a valid value (disarmed).
            std::mem::zeroed()
        };
        if let Some(at) = at {
            let left = at.saturating_duration_since(Instant::now());
            // Zero would disarm: a time already past fires at once.
            let left = left.max(std::time::Duration::from_nanos(1));
            spec.it_value.tv_sec =
                libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX);
            spec.it_value.tv_nsec = left.subsec_nanos() as libc::c_long;
        }
        // SAFETY: `fd` is our timerfd; `spec` is a valid itimerspec; the old value is not
        // asked for (null).
        let r =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            self.armed = None;
            return Err(io::Error::last_os_error());
        }
        // Re-arming resets the expiry count: a readiness left from an earlier expiry finds
        // nothing to read (see `poll_fired`).
        self.armed = at;
        Ok(())
    }

    /// Whether the timer fired since it was armed; if not, `waker` is woken when it does.
    ///
    /// # Errors
    /// The reactor's, or `read`'s (other than "nothing yet").
    pub(crate) fn poll_fired(&mut self, waker: &Waker) -> io::Result<bool> {
        loop {
            if !self.watch.take_ready(waker)? {
                return Ok(false);
            }
            let mut count = [0u8; 8];
            // SAFETY: `fd` is our timerfd; `count` is 8 writable bytes, what a timerfd read
            // returns.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
            if n == 8 {
                self.armed = None;
                return Ok(true);
            }
            if n >= 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a timerfd read returned less than 8 bytes",
                ));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(e);
            }
            // Readiness left from before the last re-arm: it is cleared now, so the next
            // look registers the waker for the real expiry.
        }
    }
}
