//! A bounded least-recently-used cache of address handles, keyed by destination GID (an
//! address handle names the path to a port; the QPN and Q_Key travel in each request).
//!
//! A linear scan over a few dozen entries costs less than hashing, and the cache never
//! allocates after it is full: a miss reuses the stalest entry's place. A handle evicted
//! while sends through it are in flight stays alive: each in-flight send holds a clone.

use rsrdma::{Ah, Gid};
use std::sync::Arc;

/// The cache. Generic over the handle so that its policy is testable without a device.
#[derive(Debug)]
pub(crate) struct AhCache<H = Arc<Ah>> {
    entries: Vec<Entry<H>>,
    capacity: usize,
    clock: u64,
    misses: u64,
}

#[derive(Debug)]
struct Entry<H> {
    gid: Gid,
    handle: H,
    used: u64,
}

impl<H: Clone> AhCache<H> {
    /// A cache of at most `capacity` handles (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        AhCache {
            entries: Vec::with_capacity(capacity),
            capacity,
            clock: 0,
            misses: 0,
        }
    }

    /// The cached handle for `gid`, marked as the most recently used.
    pub(crate) fn get(&mut self, gid: Gid) -> Option<H> {
        self.clock += 1;
        let e = self.entries.iter_mut().find(|e| e.gid == gid)?;
        e.used = self.clock;
        Some(e.handle.clone())
    }

    /// Caches `handle`, made for `gid` after [`AhCache::get`] missed (evicting the least
    /// recently used entry when full), and returns the handle to use: one cached meanwhile
    /// (another thread made one too) wins, and `handle` is dropped.
    pub(crate) fn insert(&mut self, gid: Gid, handle: H) -> H {
        if let Some(h) = self.get(gid) {
            return h;
        }
        self.misses += 1;
        let entry = Entry {
            gid,
            handle,
            used: self.clock,
        };
        let handle = entry.handle.clone();
        if self.entries.len() < self.capacity {
            self.entries.push(entry);
        } else if let Some(stalest) = self.entries.iter_mut().min_by_key(|e| e.used) {
            *stalest = entry;
        }
        handle
    }

    /// Entries held now.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Handles created so far.
    pub(crate) fn misses(&self) -> u64 {
        self.misses
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn gid(n: u8) -> Gid {
        Gid([n; 16])
    }

    /// As the send path uses the cache: the cached handle, else one made by `make` (which
    /// the send path runs outside its lock) and inserted.
    fn get_or_make<E>(
        c: &mut AhCache<u8>,
        gid: Gid,
        make: impl FnOnce() -> Result<u8, E>,
    ) -> Result<u8, E> {
        match c.get(gid) {
            Some(h) => Ok(h),
            None => Ok(c.insert(gid, make()?)),
        }
    }

    #[test]
    fn bounded_and_evicts_the_least_recently_used() {
        let mut c: AhCache<u8> = AhCache::new(2);
        let mut made = Vec::new();
        let mut get = |c: &mut AhCache<u8>, n: u8| {
            get_or_make(c, gid(n), || {
                made.push(n);
                Ok::<_, Infallible>(n)
            })
            .unwrap()
        };
        assert_eq!(get(&mut c, 1), 1);
        assert_eq!(get(&mut c, 2), 2);
        assert_eq!(get(&mut c, 1), 1); // 1 is now the most recent
        assert_eq!(get(&mut c, 3), 3); // evicts 2
        assert_eq!(c.len(), 2);
        assert_eq!(get(&mut c, 1), 1); // still cached
        assert_eq!(get(&mut c, 2), 2); // made again
        assert_eq!(made, vec![1, 2, 3, 2]);
        assert_eq!(c.misses(), 4);
    }

    #[test]
    fn a_failed_creation_caches_nothing() {
        let mut c: AhCache<u8> = AhCache::new(4);
        assert!(get_or_make(&mut c, gid(1), || Err("no route")).is_err());
        assert_eq!(c.len(), 0);
        assert_eq!(get_or_make(&mut c, gid(1), || Ok::<_, ()>(7)), Ok(7));
    }

    /// Two threads that both missed make a handle each: the first inserted is kept and
    /// returned to the second, whose own is dropped.
    #[test]
    fn a_handle_cached_meanwhile_wins() {
        let mut c: AhCache<u8> = AhCache::new(4);
        assert_eq!(c.insert(gid(1), 7), 7);
        assert_eq!(c.insert(gid(1), 8), 7);
        assert_eq!((c.len(), c.misses()), (1, 1));
    }
}
