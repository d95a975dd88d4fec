//! What the application threads and the progress thread share: the driver behind one
//! mutex, a generation counter bumped after every step that changed something, and a
//! condition variable for threads waiting on it. The timeouts sit beside the mutex, in
//! atomics: every blocking call reads one, and that should not cost a lock round trip.
//!
//! Why one mutex and a condition variable: one CQ serves both directions, and its event can
//! wake only one sleeper; so the progress thread alone sleeps on the completion channel and
//! every other waiter sleeps on the condition variable, woken by whoever ran a step that
//! changed something. Busy and spinning adaptive waiters run the steps themselves, so the
//! progress thread need not: spinning adaptive waiters are counted in `spinners` (the thread
//! does not arm the CQ and take an interrupt per completion while someone polls anyway); in
//! busy mode every step marks `stepped` instead, a plain store where a count would cost two
//! atomic read-modify-writes per call, and the thread stays off the lock while it finds the
//! mark set.

use super::driver::Driver;
use super::fdwait::Wake;
use crate::error::Result;
use crate::progress::{PollMode, Waitable};
use rsrdma::Cq;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// State behind the mutex.
pub(crate) struct State {
    /// `None` once the connection is torn down.
    pub(crate) driver: Option<Driver>,
    /// Bumped after every change a waiter may care about.
    pub(crate) gen: u64,
    /// `close` started.
    pub(crate) closing: bool,
    /// How the close ended, once its teardown is done: a close that raced it returns this.
    pub(crate) closed: Option<super::close::CloseEnd>,
    /// The progress thread should exit.
    pub(crate) stop: bool,
    /// What the core knew of the messages that wait for the peer or the NIC (offered for a
    /// READ, or lent) when a close detached the driver: a call whose message was done with
    /// just before the detach reads it here (it may not have looked in time).
    pub(crate) offers_at_detach: Option<Offers>,
}

/// The messages a core still waited for, and those it had seen dropped unread.
pub(crate) struct Offers {
    unanswered: Vec<u64>,
    withdrawn: Vec<u64>,
    failed: bool,
}

/// How an offer stood when the driver was detached.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum OfferEnd {
    /// Done with: the peer read it whole (its DONE came), or every fragment of a lent one
    /// completed.
    Read,
    /// The peer dropped it unread at this side's request (WITHDRAWN).
    Withdrawn,
    /// No answer: the detach cut the NIC off from it (or the connection had failed).
    Unanswered,
}

impl Offers {
    /// What `core` knows now.
    pub(crate) fn of(core: &rsrdma_proto::Conn<super::slots::Slots>) -> Offers {
        Offers {
            unanswered: core.sends_unanswered().collect(),
            withdrawn: core.withdrawn_untaken().collect(),
            failed: core.error().is_some(),
        }
    }

    /// How message `msg` (a rendezvous or lent one) stood.
    pub(crate) fn end_of(&self, msg: u64) -> OfferEnd {
        if self.failed || self.unanswered.contains(&msg) {
            OfferEnd::Unanswered
        } else if self.withdrawn.contains(&msg) {
            OfferEnd::Withdrawn
        } else {
            OfferEnd::Read
        }
    }
}

/// A timeout kept in an atomic, so that every blocking call can read it without the lock:
/// nanoseconds, [`NO_TIMEOUT`] for none.
pub(crate) struct AtomicTimeout(AtomicU64);

/// [`AtomicTimeout`]'s value for "block indefinitely".
const NO_TIMEOUT: u64 = u64::MAX;

impl AtomicTimeout {
    fn new() -> AtomicTimeout {
        AtomicTimeout(AtomicU64::new(NO_TIMEOUT))
    }

    pub(crate) fn get(&self) -> Option<Duration> {
        let n = self.0.load(Ordering::Relaxed);
        (n != NO_TIMEOUT).then(|| Duration::from_nanos(n))
    }

    pub(crate) fn set(&self, t: Option<Duration>) {
        let n = t.map_or(NO_TIMEOUT, |d| {
            d.as_nanos().min(u128::from(NO_TIMEOUT - 1)) as u64
        });
        self.0.store(n, Ordering::Relaxed);
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    sleepers: AtomicUsize,
    pub(crate) spinners: AtomicUsize,
    /// Busy mode: a caller ran a step since the progress thread last looked.
    pub(crate) stepped: AtomicBool,
    pub(crate) read_timeout: AtomicTimeout,
    pub(crate) write_timeout: AtomicTimeout,
    pub(crate) wake: Wake,
    pub(crate) cq: Cq,
    pub(crate) mode: PollMode,
}

impl Shared {
    pub(crate) fn new(driver: Driver, cq: Cq, mode: PollMode, wake: Wake) -> Shared {
        Shared {
            state: Mutex::new(State {
                driver: Some(driver),
                gen: 0,
                closing: false,
                closed: None,
                stop: false,
                offers_at_detach: None,
            }),
            cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            spinners: AtomicUsize::new(0),
            stepped: AtomicBool::new(false),
            read_timeout: AtomicTimeout::new(),
            write_timeout: AtomicTimeout::new(),
            wake,
            cq,
            mode,
        }
    }

    /// The state; a panic on another thread does not make it unusable (every step leaves it
    /// consistent between calls).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a change and wakes the waiters (called with the lock held).
    pub(crate) fn changed(&self, st: &mut State) {
        st.gen = st.gen.wrapping_add(1);
        if self.sleepers.load(Ordering::Acquire) > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits until `ready` finds what it looks for in the state, or `deadline` passes
    /// (`None`). For waits on the connection's life, not its data: no step runs meanwhile.
    pub(crate) fn wait_for<T>(
        &self,
        deadline: Instant,
        mut ready: impl FnMut(&State) -> Option<T>,
    ) -> Option<T> {
        let mut st = self.lock();
        self.sleepers.fetch_add(1, Ordering::AcqRel);
        let found = loop {
            if let Some(v) = ready(&st) {
                break Some(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break None;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        };
        self.sleepers.fetch_sub(1, Ordering::AcqRel);
        found
    }

    /// Whether waiters in this mode count themselves in `spinners` while they run steps
    /// (adaptive mode; busy callers mark `stepped` instead, and event waiters only sleep).
    pub(crate) fn spins(&self) -> bool {
        matches!(self.mode, PollMode::Adaptive { .. })
    }
}

/// A waiter for [`crate::progress::wait_until`]: sleeping means waiting for the generation
/// to move past the one the last step saw.
pub(crate) struct Waiter<'a> {
    shared: &'a Shared,
    pub(crate) seen: Cell<u64>,
    /// Set by every sleep: the next step reads the clock afresh.
    pub(crate) slept: Cell<bool>,
}

impl<'a> Waiter<'a> {
    /// Counts the caller as a spinner (in adaptive mode) until dropped.
    pub(crate) fn new(shared: &'a Shared) -> Waiter<'a> {
        if shared.spins() {
            shared.spinners.fetch_add(1, Ordering::AcqRel);
        }
        Waiter {
            shared,
            seen: Cell::new(0),
            slept: Cell::new(false),
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if self.shared.spins() {
            self.shared.spinners.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Waitable for Waiter<'_> {
    fn arm(&self) -> Result<()> {
        Ok(())
    }

    fn sleep(&self, deadline: Option<Instant>) -> Result<bool> {
        self.slept.set(true);
        let s = self.shared;
        if s.spins() {
            // Stop counting as a spinner, and let the progress thread arm the CQ now.
            s.spinners.fetch_sub(1, Ordering::AcqRel);
            s.wake.wake();
        }
        let mut st = s.lock();
        s.sleepers.fetch_add(1, Ordering::AcqRel);
        let woke = loop {
            if st.gen != self.seen.get() {
                break true;
            }
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break false;
                    }
                    left
                }
                None => Duration::from_secs(3600),
            };
            st =
                s.cv.wait_timeout(st, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
        };
        s.sleepers.fetch_sub(1, Ordering::AcqRel);
        drop(st);
        if s.spins() {
            s.spinners.fetch_add(1, Ordering::AcqRel);
        }
        Ok(woke)
    }
}
