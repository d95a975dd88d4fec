//! What the application threads and the progress thread share: the driver behind one
//! mutex, a generation counter bumped after every step that changed something, and a
//! condition variable for threads waiting on it.
//!
//! Why one mutex and a condition variable: one CQ serves both directions, and its event can
//! wake only one sleeper; so the progress thread alone sleeps on the completion channel and
//! every other waiter sleeps on the condition variable, woken by whoever ran a step that
//! changed something. Busy and spinning adaptive waiters run the steps themselves (counted in
//! `spinners`, so the progress thread does not arm the CQ and take an interrupt per
//! completion while someone is polling anyway).

use super::driver::Driver;
use super::fdwait::Wake;
use crate::error::Result;
use crate::progress::{PollMode, Waitable};
use rsrdma::Cq;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// The progress thread should exit.
    pub(crate) stop: bool,
    pub(crate) read_timeout: Option<Duration>,
    pub(crate) write_timeout: Option<Duration>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    sleepers: AtomicUsize,
    pub(crate) spinners: AtomicUsize,
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
                stop: false,
                read_timeout: None,
                write_timeout: None,
            }),
            cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            spinners: AtomicUsize::new(0),
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

    /// Whether waiters in this mode run steps themselves while they wait.
    pub(crate) fn spins(&self) -> bool {
        self.mode != PollMode::Event
    }
}

/// A waiter for [`crate::progress::wait_until`]: sleeping means waiting for the generation
/// to move past the one the last step saw.
pub(crate) struct Waiter<'a> {
    shared: &'a Shared,
    pub(crate) seen: Cell<u64>,
}

impl<'a> Waiter<'a> {
    /// Counts the caller as a spinner (in the modes that spin) until dropped.
    pub(crate) fn new(shared: &'a Shared) -> Waiter<'a> {
        if shared.spins() {
            shared.spinners.fetch_add(1, Ordering::AcqRel);
        }
        Waiter {
            shared,
            seen: Cell::new(0),
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
