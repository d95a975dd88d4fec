//! The directory itself: names with leases and owners, bounded, expired lazily. Pure (time
//! is passed in), so it is tested without sockets or clocks.
//!
//! A live name belongs to the owner that registered it: only that owner renews, moves or
//! removes it; anyone else gets [`ErrorCode::NotOwner`]. Once its lease runs out, the name is
//! free for anyone.

use super::ErrorCode;
use crate::packet::Addr;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Entry {
    addr: Addr,
    expires: Instant,
    owner: Owner,
}

/// Who registered a name.
pub(crate) type Owner = [u8; super::codec::OWNER_LEN];

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

    /// Registers or renews `name` for `owner` until `now + lease`. A live name of another
    /// owner is refused; a new name in a full table first drops expired entries, then is
    /// refused.
    pub(crate) fn register(
        &mut self,
        name: &str,
        addr: Addr,
        lease: Duration,
        owner: Owner,
        now: Instant,
    ) -> Result<(), ErrorCode> {
        let expires = crate::deadline::deadline_from(now, lease);
        if let Some(e) = self.entries.get_mut(name) {
            if e.expires > now && e.owner != owner {
                return Err(ErrorCode::NotOwner);
            }
            *e = Entry {
                addr,
                expires,
                owner,
            };
            return Ok(());
        }
        if self.entries.len() >= self.cap {
            self.purge(now);
            if self.entries.len() >= self.cap {
                return Err(ErrorCode::Full);
            }
        }
        self.entries.insert(
            name.to_owned(),
            Entry {
                addr,
                expires,
                owner,
            },
        );
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

    /// Removes `name` for its `owner`: `NotFound` when no live entry has it, `NotOwner`
    /// when another owner holds it (the entry stays).
    pub(crate) fn unregister(
        &mut self,
        name: &str,
        owner: Owner,
        now: Instant,
    ) -> Result<(), ErrorCode> {
        match self.entries.get(name) {
            Some(e) if e.expires > now && e.owner != owner => Err(ErrorCode::NotOwner),
            Some(e) if e.expires > now => {
                self.entries.remove(name);
                Ok(())
            }
            Some(_) => {
                self.entries.remove(name);
                Err(ErrorCode::NotFound)
            }
            None => Err(ErrorCode::NotFound),
        }
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

    const ME: Owner = [1; 16];
    const OTHER: Owner = [2; 16];

    /// F13: a live name belongs to whoever registered it; others can neither take it over,
    /// move it, nor remove it, until its lease runs out.
    #[test]
    fn a_live_name_belongs_to_its_owner_until_its_lease_runs_out() {
        let mut t = Table::new(8);
        let t0 = Instant::now();
        let lease = Duration::from_secs(10);
        t.register("svc", addr(1), lease, ME, t0).unwrap();
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            t.register("svc", addr(66), lease, OTHER, later),
            Err(ErrorCode::NotOwner)
        );
        assert_eq!(t.unregister("svc", OTHER, later), Err(ErrorCode::NotOwner));
        assert_eq!(
            t.lookup("svc", later).map(|x| x.0),
            Some(addr(1)),
            "untouched"
        );
        // The owner renews and moves it.
        t.register("svc", addr(2), lease, ME, later).unwrap();
        assert_eq!(t.lookup("svc", later).map(|x| x.0), Some(addr(2)));
        // Expired: anyone may take the name.
        let gone = later + lease;
        t.register("svc", addr(3), lease, OTHER, gone).unwrap();
        assert_eq!(t.unregister("svc", ME, gone), Err(ErrorCode::NotOwner));
        assert_eq!(t.unregister("svc", OTHER, gone), Ok(()));
        assert_eq!(t.unregister("svc", OTHER, gone), Err(ErrorCode::NotFound));
    }

    #[test]
    fn leases_expire_and_renewals_extend_them() {
        let mut t = Table::new(8);
        let t0 = Instant::now();
        let lease = Duration::from_secs(10);
        t.register("a", addr(1), lease, ME, t0).unwrap();
        assert_eq!(
            t.lookup("a", t0 + Duration::from_secs(4)),
            Some((addr(1), Duration::from_secs(6)))
        );
        // Renewed at 9 s with a new address: lives until 19 s.
        t.register("a", addr(2), lease, ME, t0 + Duration::from_secs(9))
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
        t.register("a", addr(1), Duration::from_secs(1), ME, t0)
            .unwrap();
        t.register("b", addr(2), Duration::from_secs(100), ME, t0)
            .unwrap();
        assert_eq!(
            t.register("c", addr(3), Duration::from_secs(1), ME, t0),
            Err(ErrorCode::Full)
        );
        // Renewing an existing name needs no room.
        t.register("b", addr(4), Duration::from_secs(100), ME, t0)
            .unwrap();
        // Once "a" expired, "c" fits.
        let later = t0 + Duration::from_secs(2);
        t.register("c", addr(3), Duration::from_secs(1), ME, later)
            .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.unregister("c", ME, later), Ok(()));
        assert_eq!(t.unregister("c", ME, later), Err(ErrorCode::NotFound));
    }
}
