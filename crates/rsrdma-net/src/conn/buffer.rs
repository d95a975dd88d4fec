//! Registered buffers for zero-copy transfers: [`Buffer`] and [`BufferPool`].
//!
//! A `Buffer` is page-aligned memory registered on a protection domain with local access
//! only (`LOCAL_WRITE`, so that an RDMA READ can land in it; never remote access; and
//! `MW_BIND` where the device has type-2 memory windows, which grants nothing by itself: a
//! rendezvous send binds a window over the message for the connected peer's QP alone, and
//! invalidates it before the buffer is idle again). A
//! connection sends from it ([`crate::Conn::send_buffer`]) and receives into it
//! ([`crate::Conn::recv_buffer`]) without copying the payload where the protocol allows
//! (every send; rendezvous receives; see the `rendezvous` module).
//!
//! # State is checked, not trusted
//! While the NIC may touch a buffer (a rendezvous send until the peer's DONE, an eager send
//! until the completion of its last fragment, a READ into it until its completion) the
//! buffer is *in flight*: [`Buffer::as_slice`],
//! [`Buffer::as_mut_slice`], and sending or receiving with it again answer
//! [`NetError::BufferBusy`]. The connection holds a clone of the buffer's allocation
//! (an `Arc`) for as long as the NIC may touch it, so dropping a `Buffer` in flight frees
//! nothing: the memory goes (or back to its pool) when the transfer completed, or after the
//! queue pair's flush at teardown, and is leaked if that flush cannot be confirmed.
//!
//! `as_mut_slice` needs `&mut Buffer` and receiving needs `&mut Buffer`, so the borrow rules
//! already keep a slice from living across a receive; the in-flight flag covers what the
//! borrow rules cannot see (a send started by [`crate::Conn::start_send_buffer`] that
//! outlives its call).
//!
//! # Pools
//! [`BufferPool::new`] registers `count` buffers of one size on a domain; any connection on
//! that domain ([`crate::ConnOptions::pd`]) can take them. A buffer goes back to its pool
//! when its last holder (the application or an in-flight transfer) drops it.

use crate::error::{NetError, Result};
use rsrdma::{AccessFlags, Mr, Pd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The allocation behind a [`Buffer`], shared with in-flight transfers.
pub(crate) struct BufInner {
    /// `Some` until drop (which returns it to the pool).
    mr: Option<Mr>,
    busy: AtomicBool,
    pool: Option<Arc<PoolShared>>,
}

impl Drop for BufInner {
    fn drop(&mut self) {
        if let (Some(pool), Some(mr)) = (&self.pool, self.mr.take()) {
            pool.free.lock().unwrap_or_else(|p| p.into_inner()).push(mr);
        }
    }
}

impl BufInner {
    fn mr(&self) -> &Mr {
        // Only `drop` takes it.
        self.mr
            .as_ref()
            .expect("a live buffer has its registration")
    }
}

/// What a buffer's registration grants: local write, and window binding where the device
/// has type-2 windows (rendezvous sends then expose the message through a window, not a
/// registration of their own).
pub(crate) fn buffer_access(pd: &Pd) -> AccessFlags {
    if pd.context().attr().has_type2_windows() {
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
    } else {
        AccessFlags::LOCAL_WRITE
    }
}

/// A registered buffer (local access only). See the module docs.
pub struct Buffer {
    inner: Arc<BufInner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.len())
            .field("busy", &self.is_busy())
            .finish()
    }
}

impl Buffer {
    /// A new zeroed buffer of `len` bytes registered on `pd` (local write, no remote access).
    ///
    /// # Errors
    /// The verbs error of the registration ([`rsrdma::Mr::new`]); a zero length.
    pub fn new(pd: &Pd, len: usize) -> Result<Buffer> {
        let mr = Mr::new(pd, len, buffer_access(pd))?;
        Ok(Buffer::from_mr(mr, None))
    }

    fn from_mr(mr: Mr, pool: Option<Arc<PoolShared>>) -> Buffer {
        Buffer {
            inner: Arc::new(BufInner {
                mr: Some(mr),
                busy: AtomicBool::new(false),
                pool,
            }),
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.mr().len()
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether a transfer has it in flight.
    pub fn is_busy(&self) -> bool {
        self.inner.busy.load(Ordering::Acquire)
    }

    /// The protection domain it is registered on.
    pub fn pd(&self) -> &Pd {
        self.inner.mr().pd()
    }

    /// Its bytes.
    ///
    /// # Errors
    /// [`NetError::BufferBusy`] while it is in flight.
    pub fn as_slice(&self) -> Result<&[u8]> {
        self.check_idle("Buffer::as_slice")?;
        // SAFETY: the region has no remote access, and it is not in flight: no READ writes
        // it (a receive needs `&mut self`, which this shared borrow excludes). A send started
        // later only reads it.
        Ok(unsafe { self.inner.mr().as_slice_unchecked() })
    }

    /// Its bytes, to fill.
    ///
    /// # Errors
    /// [`NetError::BufferBusy`] while it is in flight.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.check_idle("Buffer::as_mut_slice")?;
        let mr = self.inner.mr();
        // SAFETY: not in flight, and `&mut self` keeps any transfer from starting while the
        // slice lives (both need a borrow of the buffer); no remote access exists.
        Ok(unsafe { std::slice::from_raw_parts_mut(mr.addr() as *mut u8, mr.len()) })
    }

    fn check_idle(&self, op: &'static str) -> Result<()> {
        if self.is_busy() {
            return Err(NetError::BufferBusy { op });
        }
        Ok(())
    }

    /// Marks it in flight; the returned hold keeps the allocation alive and clears the flag
    /// when dropped.
    pub(crate) fn start(&self, op: &'static str) -> Result<InFlight> {
        if self
            .inner
            .busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(NetError::BufferBusy { op });
        }
        Ok(InFlight {
            inner: self.inner.clone(),
        })
    }

    /// Whether its registration allows binding memory windows ([`buffer_access`]).
    pub(crate) fn mr_allows_windows(&self) -> bool {
        self.inner.mr().access().contains(AccessFlags::MW_BIND)
    }

    /// Checks that the buffer is on `pd` and holds `len` bytes.
    pub(crate) fn check_for(&self, op: &'static str, pd: &Pd, len: usize) -> Result<()> {
        if self.pd().as_raw() != pd.as_raw() {
            return Err(NetError::BadBuffer {
                op,
                reason: "the buffer is registered on another protection domain",
            });
        }
        if len > self.len() {
            return Err(NetError::BadBuffer {
                op,
                reason: "the length is beyond the buffer",
            });
        }
        Ok(())
    }
}

/// A buffer's allocation while a transfer has it: keeps the memory alive (and out of its
/// pool), and marks the buffer idle again when dropped.
pub(crate) struct InFlight {
    inner: Arc<BufInner>,
}

impl InFlight {
    /// Start address of the buffer.
    pub(crate) fn addr(&self) -> u64 {
        self.inner.mr().addr()
    }

    /// The buffer's local key.
    pub(crate) fn lkey(&self) -> u32 {
        self.inner.mr().lkey()
    }

    /// The buffer's registration (windows are bound to it).
    pub(crate) fn mr(&self) -> &Mr {
        self.inner.mr()
    }

    /// The buffer's bytes, read by a copy into send slots (the core only reads them).
    /// The first `len` bytes after a READ into the buffer landed (its completion was reaped:
    /// the NIC no longer writes it, and the buffer grants no remote access).
    pub(crate) fn landed(&self, len: usize) -> &[u8] {
        let mr = self.inner.mr();
        // SAFETY: the READ that wrote the buffer completed; nothing else writes it while it
        // is in flight (held by the driver); `len` is clamped to the allocation.
        unsafe { std::slice::from_raw_parts(mr.addr() as *const u8, len.min(mr.len())) }
    }

    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        let mr = self.inner.mr();
        // SAFETY: in flight for a send only (the caller holds it for that): nothing writes
        // the buffer meanwhile; `len` was checked against the buffer.
        unsafe { std::slice::from_raw_parts(mr.addr() as *const u8, len.min(mr.len())) }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.inner.busy.store(false, Ordering::Release);
    }
}

pub(crate) struct PoolShared {
    free: Mutex<Vec<Mr>>,
    buf_size: usize,
    count: usize,
}

/// Registered buffers of one size on one protection domain, for every connection on that
/// domain. Cloning shares the pool.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<PoolShared>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("buf_size", &self.shared.buf_size)
            .field("count", &self.shared.count)
            .field("available", &self.available())
            .finish()
    }
}

impl BufferPool {
    /// Registers `count` buffers of `buf_size` bytes on `pd`.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a zero size or count; the registration's error.
    pub fn new(pd: &Pd, buf_size: usize, count: usize) -> Result<BufferPool> {
        if buf_size == 0 || count == 0 {
            return Err(NetError::InvalidArgument(
                "BufferPool: buf_size and count must be at least 1".into(),
            ));
        }
        let free = (0..count)
            .map(|_| Mr::new(pd, buf_size, buffer_access(pd)))
            .collect::<rsrdma::Result<Vec<Mr>>>()?;
        Ok(BufferPool {
            shared: Arc::new(PoolShared {
                free: Mutex::new(free),
                buf_size,
                count,
            }),
        })
    }

    /// A free buffer, or `None` when all are taken (or in flight).
    pub fn take(&self) -> Option<Buffer> {
        let mr = self
            .shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()?;
        Some(Buffer::from_mr(mr, Some(self.shared.clone())))
    }

    /// Buffers free now.
    pub fn available(&self) -> usize {
        self.shared
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Bytes per buffer.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.shared.count
    }
}
