//! [`Watch`]: readability of a descriptor that something else owns, through tokio's reactor.
//!
//! The descriptors (a completion channel, an rdma_cm id's event channel, a TCP socket) belong
//! to the verbs objects; a `Watch` only registers them. Whoever holds a `Watch` drops it
//! before the owner closes the descriptor: otherwise the reactor's later deregistration could
//! hit a reused descriptor number.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{Context, Poll, Waker};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A descriptor number, not owned.
#[derive(Debug)]
pub(crate) struct FdRef(pub(crate) RawFd);

impl AsRawFd for FdRef {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Runs `register`, which needs the current tokio runtime's reactor: outside a runtime, or
/// in one built without IO, tokio panics; this says so as an error instead. (tokio offers
/// no way to ask whether IO is enabled, so that case is caught as the panic it is: tokio's
/// message is still printed, and a program built with `panic = "abort"` aborts there.)
pub(crate) fn with_reactor<T>(register: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    in_runtime()?;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(register)).unwrap_or_else(|_| {
        Err(io::Error::other(
            "the tokio runtime has no IO driver: build it with enable_io (or enable_all)",
        ))
    })
}

/// Whether this runs inside a tokio runtime (whose blocking pool and reactor the async faces
/// use; outside one, tokio panics).
pub(crate) fn in_runtime() -> io::Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(_) => Err(io::Error::other(
            "no tokio runtime: call this inside one (built with enable_io or enable_all)",
        )),
    }
}

/// A registered descriptor, for readability.
#[derive(Debug)]
pub(crate) struct Watch {
    fd: AsyncFd<FdRef>,
}

impl Watch {
    /// Registers `fd` (which must be non-blocking) with the current runtime's reactor.
    ///
    /// # Safety
    /// `fd` must be open, and stay open and refer to the same file, until the `Watch` is
    /// dropped (tokio's rule for [`AsyncFd::register_with_interest`]).
    ///
    /// # Errors
    /// Outside a tokio runtime with IO enabled, or when epoll refuses the descriptor.
    pub(crate) unsafe fn new(fd: RawFd) -> io::Result<Watch> {
        let fd = with_reactor(|| {
            // SAFETY: the caller keeps `fd` open and unchanged for the Watch's lifetime.
            unsafe { AsyncFd::register_with_interest(FdRef(fd), Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
        })?;
        Ok(Watch { fd })
    }

    /// Whether the descriptor became readable; if so, the readiness is cleared (the caller
    /// then empties the descriptor: data that comes after the clear raises a new event).
    /// If not, `waker` is woken when it does.
    ///
    /// # Errors
    /// The reactor's.
    pub(crate) fn take_ready(&self, waker: &Waker) -> io::Result<bool> {
        let mut cx = Context::from_waker(waker);
        match self.fd.poll_read_ready(&mut cx) {
            Poll::Ready(Ok(mut guard)) => {
                guard.clear_ready();
                Ok(true)
            }
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Ok(false),
        }
    }

    /// Waits until the descriptor is readable, then clears the readiness (the caller
    /// empties it). Any number of tasks may wait at once.
    ///
    /// # Errors
    /// The reactor's.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        self.fd.readable().await?.clear_ready();
        Ok(())
    }
}
