//! The directory itself: names with leases, bounded, expired lazily. Pure (time is passed
//! in), so it is tested without sockets or clocks.

use super::ErrorCode;
use crate::packet::Addr;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Entry {
    addr: Addr,
    expires: Instant,
}

/// Names → addresses, at most `cap` of them.
#[derive(Debug)]
pub(crate) struct Table {
    entries: HashMap<String, Entry>,
    cap: usize,
}

impl Table {
    pub(crate) fn new(cap: usize) -> Self {
        Table {
            entries: HashMap::new(),
            cap,
        }
    }

    /// Registers or renews `name` until `now + lease`. A new name in a full table first
    /// drops expired entries, then is refused.
    pub(crate) fn register(
        &mut self,
        name: &str,
        addr: Addr,
        lease: Duration,
        now: Instant,
    ) -> Result<(), ErrorCode> {
        let expires = crate::deadline::deadline_from(now, lease);
        if let Some(e) = self.entries.get_mut(name) {
            *e = Entry { addr, expires };
            return Ok(());
        }
        if self.entries.len() >= self.cap {
            self.purge(now);
            if self.entries.len() >= self.cap {
                return Err(ErrorCode::Full);
            }
        }
        self.entries
            .insert(name.to_owned(), Entry { addr, expires });
        Ok(())
    }

    /// The live address of `name` and the time left on its lease; an expired entry is
    /// removed.
    pub(crate) fn lookup(&mut self, name: &str, now: Instant) -> Option<(Addr, Duration)> {
        let e = self.entries.get(name)?;
        if e.expires <= now {
            self.entries.remove(name);
            return None;
        }
        Some((e.addr, e.expires - now))
    }

    /// Removes `name`; true if it was there and live.
    pub(crate) fn unregister(&mut self, name: &str, now: Instant) -> bool {
        self.entries.remove(name).is_some_and(|e| e.expires > now)
    }

    /// Drops every expired entry.
    pub(crate) fn purge(&mut self, now: Instant) {
        self.entries.retain(|_, e| e.expires > now);
    }

    /// Entries held (live or not yet purged).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsrdma::Gid;

    fn addr(n: u32) -> Addr {
        Addr::new(Gid([n as u8; 16]), n)
    }

    #[test]
    fn leases_expire_and_renewals_extend_them() {
        let mut t = Table::new(8);
        let t0 = Instant::now();
        let lease = Duration::from_secs(10);
        t.register("a", addr(1), lease, t0).unwrap();
        assert_eq!(
            t.lookup("a", t0 + Duration::from_secs(4)),
            Some((addr(1), Duration::from_secs(6)))
        );
        // Renewed at 9 s with a new address: lives until 19 s.
        t.register("a", addr(2), lease, t0 + Duration::from_secs(9))
            .unwrap();
        assert_eq!(
            t.lookup("a", t0 + Duration::from_secs(18)).map(|x| x.0),
            Some(addr(2))
        );
        assert_eq!(t.lookup("a", t0 + Duration::from_secs(19)), None);
        assert_eq!(t.len(), 0, "the expired entry was removed");
    }

    #[test]
    fn a_full_table_makes_room_only_from_expired_entries() {
        let mut t = Table::new(2);
        let t0 = Instant::now();
        t.register("a", addr(1), Duration::from_secs(1), t0)
            .unwrap();
        t.register("b", addr(2), Duration::from_secs(100), t0)
            .unwrap();
        assert_eq!(
            t.register("c", addr(3), Duration::from_secs(1), t0),
            Err(ErrorCode::Full)
        );
        // Renewing an existing name needs no room.
        t.register("b", addr(4), Duration::from_secs(100), t0)
            .unwrap();
        // Once "a" expired, "c" fits.
        let later = t0 + Duration::from_secs(2);
        t.register("c", addr(3), Duration::from_secs(1), later)
            .unwrap();
        assert_eq!(t.len(), 2);
        assert!(t.unregister("c", later));
        assert!(!t.unregister("c", later));
    }
}
