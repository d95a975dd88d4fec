//! A fan-out waker: one [`Waker`] for the reactor that wakes every task waiting on a
//! connection.
//!
//! Why: a connection has one completion channel for both directions, and tokio keeps one
//! reader waker per registered fd. If a reading task and a writing task (or two tasks
//! sharing `&AsyncConn`) each registered their own waker on the fd, the second would
//! replace the first, and a task woken and then dropped (a `select!` branch that lost)
//! would take the wake-up with it. So every waiter puts its waker here, the fds are polled
//! with this set's own waker, and an event wakes them all: each runs a step and finds out
//! whether it can go on. Registering is deduplicated per task (`Waker::will_wake`), and the
//! list keeps its capacity, so steady waiting does not allocate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Wake, Waker};

/// The tasks waiting on one connection.
#[derive(Debug, Default)]
pub(crate) struct WakerSet {
    list: Mutex<Vec<Waker>>,
    /// How many times the set woke its waiters (see [`WakerSet::wakes`]).
    wakes: AtomicU64,
}

impl WakerSet {
    fn lock(&self) -> MutexGuard<'_, Vec<Waker>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `w` unless the same task is already in the set.
    pub(crate) fn register(&self, w: &Waker) {
        let mut list = self.lock();
        if !list.iter().any(|x| x.will_wake(w)) {
            list.push(w.clone());
        }
    }

    /// Wakes and removes every waiter.
    pub(crate) fn wake_all(&self) {
        // Waking only schedules the task; no waker runs our code, so holding the lock is safe.
        let mut list = self.lock();
        list.drain(..).for_each(Waker::wake);
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }

    /// How many wake-ups the set sent so far (each counted under the list's lock, after its
    /// wakers ran). A task that stepped, then registered, compares it with the count before
    /// its step: a wake-up in between (another task's progress, sent before this one was in
    /// the list) means it must step again instead of sleeping.
    pub(crate) fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::SeqCst)
    }

    /// Wakes and removes every waiter but `me` (who is running already).
    pub(crate) fn wake_others(&self, me: &Waker) {
        let mut list = self.lock();
        list.retain(|w| {
            if w.will_wake(me) {
                return true;
            }
            w.wake_by_ref();
            false
        });
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }

    /// How many waiters are registered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Wake for WakerSet {
    fn wake(self: Arc<Self>) {
        self.wake_all();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn one_event_wakes_every_waiter_once_and_empties_the_set() {
        let set = Arc::new(WakerSet::default());
        let (a, b) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        set.register(&wa);
        set.register(&wa);
        set.register(&wb);
        assert_eq!(set.len(), 2, "the same task registers once");
        let fanout = Waker::from(set.clone());
        fanout.wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        assert_eq!(set.len(), 0);
        fanout.wake();
        assert_eq!(a.0.load(Ordering::SeqCst), 1, "nobody left to wake");
    }

    #[test]
    fn wake_others_keeps_the_caller() {
        let set = WakerSet::default();
        let (a, b) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let (wa, wb) = (Waker::from(a.clone()), Waker::from(b.clone()));
        set.register(&wa);
        set.register(&wb);
        set.wake_others(&wa);
        assert_eq!(a.0.load(Ordering::SeqCst), 0);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        assert_eq!(set.len(), 1);
    }
}
