//! One sleeper per completion queue.
//!
//! An armed CQ raises one event for its next completion, and one waiter takes it. If two
//! threads slept on the same CQ, the one that missed the event would sleep on even after the
//! other had reaped the completion it needed. So one thread at a time sleeps on the CQ; the
//! others wait on a condition variable that the sleeper signals when it wakes (having made
//! the event's completions visible to every thread's next poll).

use crate::error::Result;
use crate::progress::Waitable;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// A [`Waitable`] for a CQ shared by threads.
#[derive(Debug)]
pub(crate) struct Gate<W> {
    cq: W,
    sleeping: Mutex<bool>,
    woke: Condvar,
}

impl<W: Waitable> Gate<W> {
    pub(crate) fn new(cq: W) -> Self {
        Gate {
            cq,
            sleeping: Mutex::new(false),
            woke: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, bool> {
        self.sleeping.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<W: Waitable> Waitable for Gate<W> {
    fn arm(&self) -> Result<()> {
        self.cq.arm()
    }

    fn sleep(&self, deadline: Option<Instant>) -> Result<bool> {
        let mut sleeping = self.lock();
        if *sleeping {
            // Another thread sleeps on the CQ: wait for it to wake, then poll again.
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            return Ok(match left {
                Some(left) if left.is_zero() => false,
                Some(left) => {
                    let (_g, t) = self
                        .woke
                        .wait_timeout(sleeping, left)
                        .unwrap_or_else(PoisonError::into_inner);
                    !t.timed_out()
                }
                None => {
                    drop(self.woke.wait(sleeping));
                    true
                }
            });
        }
        *sleeping = true;
        drop(sleeping);
        let woke = self.cq.sleep(deadline);
        *self.lock() = false;
        self.woke.notify_all();
        woke
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A CQ whose one event comes after 50 ms, to one sleeper only.
    struct OneEvent {
        sleeps: AtomicU32,
    }

    impl Waitable for OneEvent {
        fn arm(&self) -> Result<()> {
            Ok(())
        }
        fn sleep(&self, deadline: Option<Instant>) -> Result<bool> {
            if self.sleeps.fetch_add(1, Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(50));
                return Ok(true);
            }
            std::thread::sleep(deadline.unwrap().saturating_duration_since(Instant::now()));
            Ok(false)
        }
    }

    #[test]
    fn a_second_waiter_wakes_with_the_sleeper() {
        let gate = Arc::new(Gate::new(OneEvent {
            sleeps: AtomicU32::new(0),
        }));
        let deadline = Some(Instant::now() + Duration::from_secs(5));
        let t0 = Instant::now();
        let first = {
            let g = gate.clone();
            std::thread::spawn(move || g.sleep(deadline).unwrap())
        };
        std::thread::sleep(Duration::from_millis(10));
        let second = gate.sleep(deadline).unwrap();
        assert!(first.join().unwrap());
        assert!(
            second,
            "the second waiter was woken by the sleeper, not the deadline"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(gate.cq.sleeps.load(Ordering::SeqCst), 1);
    }
}
