//! Completion queues and completion channels.
//!
//! Busy polling: [`Cq::poll`] into a caller's slice, never allocating. Event mode: create the
//! CQ with a [`CompChannel`], [`Cq::arm`] it, poll until empty, then [`Cq::wait`] (or watch the
//! channel's fd with epoll/mio/tokio, it is non-blocking and [`AsFd`], and call
//! [`Cq::try_event`] when it is readable). Events are acknowledged in batches, because
//! `ibv_ack_cq_events` takes a lock and `ibv_destroy_cq` waits for every event to be
//! acknowledged.
//!
//! # One channel, several CQs
//! A channel may serve several CQs (a connection's send and receive CQs, say). Whoever reads
//! an event off the channel routes it to the CQ it names, where it counts as pending until
//! that CQ's [`Cq::wait`] or [`Cq::try_event`] takes it; a thread waiting for that CQ is
//! woken. So no wake-up is lost, whichever thread reads the fd. At most one thread at a time
//! blocks in `poll(2)` on the fd; other waiters sleep on a condition variable and are woken
//! when an event is routed to them or when the reader leaves.

use crate::context::Context;
use crate::error::{check_rc, Error, Result};
use crate::ffi;
use crate::wc::Wc;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// Events are acknowledged once this many have accumulated (and on drop).
const ACK_BATCH: u32 = 64;

/// A completion channel (`ibv_comp_channel`): a file descriptor that becomes readable when an
/// armed CQ gets a completion. Its fd is non-blocking. Cheap to clone; CQs using it keep it
/// alive.
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    raw: *mut ffi::ibv_comp_channel,
    ctx: Context,
    /// The CQs attached to this channel, by their `ibv_cq` address: where events are routed.
    cqs: Mutex<HashMap<usize, Weak<CqInner>>>,
    /// True while one waiter blocks on the fd; the others sleep on `wake`.
    reading: Mutex<bool>,
    wake: Condvar,
    /// Wakes the waiter blocked on the fd when another thread routed an event (it may be the
    /// one that waiter wants): it polls this eventfd beside the channel's fd.
    kick: OwnedFd,
}

// SAFETY: the channel is a kernel fd plus an immutable struct; reads are serialised by the kernel.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: created by us; every CQ attached to it holds a clone, so none is left.
        let rc = unsafe { ffi::ibv_destroy_comp_channel(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_comp_channel failed");
        }
    }
}

impl CompChannel {
    /// The raw channel, for a CQ being made on it.
    pub(crate) fn raw(&self) -> *mut ffi::ibv_comp_channel {
        self.inner.raw
    }

    /// Creates a channel on `ctx`, with its fd set non-blocking.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_create_comp_channel` or `fcntl`.
    pub fn new(ctx: &Context) -> Result<CompChannel> {
        // SAFETY: the context is open.
        let raw = unsafe { ffi::ibv_create_comp_channel(ctx.inner.raw) };
        if raw.is_null() {
            return Err(Error::last_os("ibv_create_comp_channel"));
        }
        // SAFETY: eventfd has no memory preconditions.
        let kick_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if kick_fd < 0 {
            let e = Error::last_os("eventfd");
            // SAFETY: created just above, not yet owned by anything else.
            unsafe { ffi::ibv_destroy_comp_channel(raw) };
            return Err(e);
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let kick = unsafe { OwnedFd::from_raw_fd(kick_fd) };
        let ch = CompChannel {
            inner: Arc::new(ChannelInner {
                raw,
                ctx: ctx.clone(),
                cqs: Mutex::new(HashMap::new()),
                reading: Mutex::new(false),
                wake: Condvar::new(),
                kick,
            }),
        };
        let fd = ch.as_raw_fd();
        // SAFETY: `fd` is the channel's open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above; only O_NONBLOCK is added.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::last_os("fcntl"));
        }
        Ok(ch)
    }

    /// Takes one event off the channel without blocking: the CQ it is for, or `None` if no
    /// event is pending. The caller must acknowledge it on that CQ.
    fn try_get_event(&self) -> Result<Option<*mut ffi::ibv_cq>> {
        let mut cq = std::ptr::null_mut();
        let mut cq_ctx = std::ptr::null_mut();
        // SAFETY: the channel is live; both out-pointers are valid.
        let rc = unsafe { ffi::ibv_get_cq_event(self.inner.raw, &mut cq, &mut cq_ctx) };
        if rc == 0 {
            return Ok(Some(cq));
        }
        let e = Error::last_os("ibv_get_cq_event");
        match e.errno() {
            Some(libc::EAGAIN) => Ok(None),
            _ => Err(e),
        }
    }

    /// Reads every pending event off the channel and routes each to its CQ. Whenever one is
    /// routed, every waiter is woken: the sleepers on the condvar, and the reader blocked on
    /// the fd (through the kick eventfd), since the event may be the one it waits for.
    fn drain(&self) -> Result<()> {
        let mut routed = false;
        while let Some(cq) = self.try_get_event()? {
            self.route(cq);
            routed = true;
        }
        if routed {
            self.wake_all();
            self.kick_reader()?;
        }
        Ok(())
    }

    /// Credits one event to the CQ at `raw`: it becomes pending there and is acknowledged by
    /// that CQ (in its batches, or when it is dropped).
    fn route(&self, raw: *mut ffi::ibv_cq) {
        // Upgrade under the lock, act after it: if this was the last strong reference, the
        // CQ's drop runs here and takes the same lock.
        let live = lock(&self.inner.cqs)
            .get(&(raw as usize))
            .and_then(Weak::upgrade);
        match live {
            Some(cq) => {
                cq.unacked.fetch_add(1, Ordering::AcqRel);
                cq.events.fetch_add(1, Ordering::AcqRel);
            }
            // The CQ is being dropped (it unregistered, or its last reference is going). The
            // kernel counted this event as read, so its ibv_destroy_cq cannot return before
            // the event is acknowledged: `raw` is still valid, and acknowledging here is what
            // lets that destroy finish.
            // SAFETY: as just said; one event taken, acknowledged once.
            None => unsafe { ffi::ibv_ack_cq_events(raw, 1) },
        }
    }

    /// Wakes every waiter sleeping on the condvar. Taken under the same lock waiters check
    /// their CQ under, so no wake-up falls between a waiter's check and its sleep.
    fn wake_all(&self) {
        let _reading = lock(&self.inner.reading);
        self.inner.wake.notify_all();
    }

    /// Wakes the waiter blocked in poll(2), if any, by making the kick eventfd readable.
    fn kick_reader(&self) -> Result<()> {
        if !*lock(&self.inner.reading) {
            return Ok(());
        }
        let one: u64 = 1;
        // SAFETY: the eventfd is open for the channel's life; an 8-byte write is its protocol.
        let n = unsafe { libc::write(self.inner.kick.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if n < 0 {
            let e = Error::last_os("write(eventfd)");
            // EAGAIN: the counter is saturated, the reader is woken anyway.
            if e.errno() != Some(libc::EAGAIN) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Resets the kick eventfd after the reader woke.
    fn clear_kick(&self) {
        let mut v: u64 = 0;
        // SAFETY: as above; a non-blocking read of 8 bytes (EAGAIN when not kicked).
        let _ = unsafe { libc::read(self.inner.kick.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// Waits until the channel's fd or the kick eventfd is readable, or `deadline` passes.
    /// Returns false on time-out.
    fn wait_readable(&self, deadline: Option<Instant>) -> Result<bool> {
        loop {
            let Some(timeout_ms) = crate::error::poll_timeout_ms(deadline) else {
                return Ok(false);
            };
            let mut fds = [self.as_raw_fd(), self.inner.kick.as_raw_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: two valid pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
            if n > 0 {
                if fds[1].revents != 0 {
                    self.clear_kick();
                }
                return Ok(true);
            }
            if n < 0 {
                let e = Error::last_os("poll");
                if e.errno() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
}

/// Locks `m`, ignoring poisoning: the guarded state (a map of weak pointers, a flag) stays
/// consistent even if a holder panicked.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is open for as long as the channel, which the borrow is tied to.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is a plain field.
        unsafe { (*self.inner.raw).fd }
    }
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// A completion queue (`ibv_cq`). Cheap to clone; queue pairs using it keep it alive.
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

pub(crate) struct CqInner {
    pub(crate) raw: *mut ffi::ibv_cq,
    channel: Option<CompChannel>,
    /// Events taken off the channel for this CQ and not yet acknowledged.
    unacked: AtomicU32,
    /// Events routed to this CQ and not yet taken by [`Cq::wait`]/[`Cq::try_event`].
    events: AtomicU32,
    pub(crate) ctx: Context,
    /// The extended CQ of one made by [`Cq::new_ex`] (the same object as `raw`); null
    /// otherwise.
    pub(crate) ex: *mut ffi::ibv_cq_ex,
    /// [`Cq::count_polled`] was called: polls add to `polled`.
    counting: AtomicBool,
    /// Completions polled since counting began ([`Cq::polled`]).
    polled: AtomicU64,
}

// SAFETY: libibverbs serialises polling and arming of a CQ internally (unless a provider is
// told to drop its locks, `MLX5_SINGLE_THREADED=1`: then the caller serialises, see `Srq`);
// our own state is atomic.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Some(ch) = &self.channel {
            // Unregister first: from here on no thread can route an event to this CQ, and
            // one that found it dead acknowledged its event itself (see `route`).
            lock(&ch.inner.cqs).remove(&(self.raw as usize));
        }
        let n = *self.unacked.get_mut();
        if n > 0 {
            // SAFETY: these events were taken from this CQ's channel and not yet acknowledged;
            // ibv_destroy_cq would wait for them forever.
            unsafe { ffi::ibv_ack_cq_events(self.raw, n) };
        }
        // SAFETY: created by us; every QP using it holds a clone, so none is left.
        let rc = unsafe { ffi::ibv_destroy_cq(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

impl Cq {
    /// Creates a CQ with room for at least `cqe` completions, attached to `channel` if given.
    ///
    /// # Errors
    /// [`Error::Limit`] above the device's `max_cqe` (checked before any verb);
    /// [`Error::InvalidArgument`] for 0 or a channel of another context; [`Error::Verbs`]
    /// naming `ibv_create_cq`.
    pub fn new(ctx: &Context, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        Cq::check_size(ctx, cqe)?;
        Cq::check_channel(ctx, channel)?;
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.inner.raw);
        // SAFETY: the context is open; `ch` is null or a live channel of the same device that
        // the CQ keeps alive (its clone is stored below).
        let raw =
            unsafe { ffi::ibv_create_cq(ctx.inner.raw, cqe as i32, std::ptr::null_mut(), ch, 0) };
        if raw.is_null() {
            return Err(Error::last_os("ibv_create_cq"));
        }
        Ok(Cq::created(raw, std::ptr::null_mut(), ctx, channel))
    }

    /// Refuses a completion channel of another context: the verbs call picks the provider by
    /// the CQ's context, and would hand it another context's (another provider's) channel.
    pub(crate) fn check_channel(ctx: &Context, channel: Option<&CompChannel>) -> Result<()> {
        match channel {
            Some(c) if !c.inner.ctx.is(ctx) => Err(Error::InvalidArgument(
                "the completion channel belongs to another device context than the CQ \
                 (open the device once and make every object from it)"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// Checks a CQ's size against the device before any verb.
    pub(crate) fn check_size(ctx: &Context, cqe: u32) -> Result<()> {
        if cqe == 0 {
            return Err(Error::InvalidArgument(
                "a completion queue needs at least one entry".into(),
            ));
        }
        let max = ctx.attr().max_cqe;
        if cqe > max {
            return Err(Error::Limit {
                what: "cqe",
                requested: cqe.into(),
                limit: max.into(),
                source_of_limit: "device max_cqe",
            });
        }
        Ok(())
    }

    /// Wraps a CQ just created (`ex`: its extended form, or null), routing `channel`'s events
    /// to it.
    pub(crate) fn created(
        raw: *mut ffi::ibv_cq,
        ex: *mut ffi::ibv_cq_ex,
        ctx: &Context,
        channel: Option<&CompChannel>,
    ) -> Cq {
        let inner = Arc::new(CqInner {
            raw,
            channel: channel.cloned(),
            unacked: AtomicU32::new(0),
            events: AtomicU32::new(0),
            ctx: ctx.clone(),
            ex,
            counting: AtomicBool::new(false),
            polled: AtomicU64::new(0),
        });
        if let Some(ch) = channel {
            lock(&ch.inner.cqs).insert(raw as usize, Arc::downgrade(&inner));
        }
        Cq { inner }
    }

    /// Wraps a CQ of the bench's do-nothing provider ([`crate::bench_support`]).
    ///
    /// # Safety
    /// `raw` must stay valid while any handle lives, and no handle may ever be dropped.
    #[cfg(feature = "bench-support")]
    pub(crate) unsafe fn wrap_fake(raw: *mut ffi::ibv_cq, ctx: &Context) -> Cq {
        Cq {
            inner: Arc::new(CqInner {
                raw,
                channel: None,
                unacked: AtomicU32::new(0),
                events: AtomicU32::new(0),
                ctx: ctx.clone(),
                ex: std::ptr::null_mut(),
                counting: AtomicBool::new(false),
                polled: AtomicU64::new(0),
            }),
        }
    }

    /// The number of entries the provider actually gave (at least what was asked).
    pub fn capacity(&self) -> u32 {
        // SAFETY: the CQ is live; `cqe` is a plain field.
        unsafe { (*self.inner.raw).cqe.max(0) as u32 }
    }

    /// Moves up to `wcs.len()` completions into `wcs`, returning how many. Never blocks and
    /// never allocates. A failed completion is returned like any other: check
    /// [`Wc::status`]/[`Wc::ok`].
    ///
    /// A CQ that overran (more completions than it holds) reports it on some devices as an
    /// error here; on rxe and soft0 the completions that found no room are lost, the queue
    /// pair whose completion was lost goes to ERROR, and the context raises
    /// [`AsyncEventKind::CqErr`](crate::AsyncEventKind::CqErr): size a CQ for every
    /// completion that can be outstanding.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `ibv_poll_cq` (a CQ overrun on devices that report it here, or
    /// a broken device).
    #[inline]
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        let n = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        // SAFETY: the CQ is live; `wcs` has room for `n` entries and Wc is repr(transparent)
        // over ibv_wc.
        let rc = unsafe { ffi::data_path::ibv_poll_cq(self.inner.raw, n, wcs.as_mut_ptr().cast()) };
        if rc < 0 {
            return Err(Error::from_errno(
                "ibv_poll_cq",
                if rc == -1 { libc::EIO } else { -rc },
            ));
        }
        self.note_polled(rc as usize);
        Ok(rc as usize)
    }

    /// Starts counting the completions polled from this CQ, through any of its handles
    /// ([`Cq::polled`]): for a layer that lends its CQ to the application (which may poll it
    /// any way it likes) and must still know how many completions were taken, such as
    /// rsrdma-net's `RawConn`, which bounds the signaled requests left unreaped so that its
    /// send CQ never overruns. Costs each poll that finds completions one atomic add; a CQ
    /// that does not count pays one relaxed load. [`Cq::poll_ex`] counts too.
    pub fn count_polled(&self) {
        self.inner.counting.store(true, Ordering::Relaxed);
    }

    /// The completions polled from this CQ since [`Cq::count_polled`] (0 before it).
    pub fn polled(&self) -> u64 {
        self.inner.polled.load(Ordering::Relaxed)
    }

    /// Adds `n` polled completions to the count, when counting.
    #[inline]
    pub(crate) fn note_polled(&self, n: usize) {
        if n > 0 && self.inner.counting.load(Ordering::Relaxed) {
            self.inner.polled.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Polls until at least one completion arrives or `timeout` passes, spinning.
    ///
    /// # Errors
    /// [`Error::Timeout`] when nothing came; the errors of [`Cq::poll`].
    pub fn poll_blocking(&self, wcs: &mut [Wc], timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        loop {
            let n = self.poll(wcs)?;
            if n > 0 {
                return Ok(n);
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    op: "poll_cq",
                    millis: timeout.as_millis() as u64,
                });
            }
            std::hint::spin_loop();
        }
    }

    /// Requests an event on the channel for the next completion (or the next solicited one).
    /// Poll the CQ empty after arming: a completion that arrived before the arm raises no event.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the CQ has no channel; [`Error::Verbs`] naming
    /// `ibv_req_notify_cq`.
    pub fn arm(&self, solicited_only: bool) -> Result<()> {
        self.channel()?;
        // SAFETY: the CQ is live.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.inner.raw, solicited_only as i32) };
        check_rc("ibv_req_notify_cq", rc)
    }

    /// Takes one event for this CQ if one is ready, without blocking: for event loops that
    /// watch the channel's fd themselves. Events read off the channel for other CQs are
    /// routed to them (and their waiters woken). Re-arm before polling again.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] without a channel; [`Error::Verbs`] naming
    /// `ibv_get_cq_event`.
    pub fn try_event(&self) -> Result<bool> {
        let ch = self.channel()?;
        if self.take_routed() {
            return Ok(true);
        }
        ch.drain()?;
        Ok(self.take_routed())
    }

    /// Blocks until the channel delivers an event for this CQ, or `timeout` passes. The event
    /// is consumed and acknowledged (in batches); re-arm before polling again. Several CQs may
    /// share the channel, and several threads may wait on them: each event reaches the CQ it
    /// is for (see the module docs).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::InvalidArgument`] without a channel; [`Error::Verbs`].
    pub fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let ch = self.channel()?;
        let deadline = timeout.map(crate::error::deadline_after);
        let timed_out = || Error::Timeout {
            op: "wait for a completion event",
            millis: timeout.map_or(0, |t| t.as_millis() as u64),
        };
        loop {
            if self.try_event()? {
                return Ok(());
            }
            let mut reading = lock(&ch.inner.reading);
            if self.take_routed() {
                return Ok(());
            }
            if *reading {
                // Another waiter blocks on the fd: sleep until it routes us an event or leaves.
                let left = match deadline {
                    None => Duration::from_secs(3600),
                    Some(d) => d.saturating_duration_since(Instant::now()),
                };
                if left.is_zero() {
                    return Err(timed_out());
                }
                drop(ch.inner.wake.wait_timeout(reading, left));
                continue;
            }
            *reading = true;
            drop(reading);
            let readable = ch.wait_readable(deadline);
            *lock(&ch.inner.reading) = false;
            ch.wake_all();
            if !readable? && !self.try_event()? {
                return Err(timed_out());
            }
        }
    }

    /// Consumes one routed event, acknowledging in batches.
    fn take_routed(&self) -> bool {
        let taken = self
            .inner
            .events
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if taken && self.inner.unacked.load(Ordering::Acquire) >= ACK_BATCH {
            self.ack_pending();
        }
        taken
    }

    fn ack_pending(&self) {
        let n = self.inner.unacked.swap(0, Ordering::AcqRel);
        if n > 0 {
            // SAFETY: `n` events of this CQ were taken and not yet acknowledged.
            unsafe { ffi::ibv_ack_cq_events(self.inner.raw, n) };
        }
    }

    /// The channel this CQ reports to, if any.
    pub fn comp_channel(&self) -> Option<&CompChannel> {
        self.inner.channel.as_ref()
    }

    fn channel(&self) -> Result<&CompChannel> {
        self.inner.channel.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "this completion queue was created without a completion channel".into(),
            )
        })
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The CQ's kernel handle, unique among the CQs of its context: how an
    /// [`crate::AsyncEvent`] names it.
    pub fn handle(&self) -> u32 {
        // SAFETY: `raw` is a live CQ for as long as `self` lives.
        unsafe { (*self.inner.raw).handle }
    }

    /// The raw `ibv_cq`; `None` for a provider that is not libibverbs.
    pub fn as_raw(&self) -> Option<*mut ffi::ibv_cq> {
        Some(self.inner.raw)
    }
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("capacity", &self.capacity())
            .field("channel", &self.inner.channel)
            .finish()
    }
}
