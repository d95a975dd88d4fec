//! Memory regions and their keys: which key reaches which memory, from which protection
//! domain, with which rights. Keys are `index << 8 | generation`, as rxe's: a key is checked
//! exactly, so a deregistered region's key stops working at once and is not reused by the
//! next region in its slot until the 8-bit generation wraps.

use crate::access::Access;
use crate::wr::Sge;

/// One registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrEntry {
    /// The protection domain it belongs to.
    pub pd: u32,
    /// Its first address.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Its rights.
    pub access: Access,
    /// Its key (the local and the remote key are the same).
    pub key: u32,
}

impl MrEntry {
    /// Whether `[addr, addr + len)` lies inside the region.
    fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// A device's memory regions.
#[derive(Debug, Default, Clone)]
pub struct MrTable {
    slots: Vec<Option<MrEntry>>,
    /// The generation each slot's next key gets.
    gens: Vec<u8>,
    free: Vec<usize>,
}

/// Why a key check failed (the caller turns it into its status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No region has this key, or it is another domain's.
    Key,
    /// The range is not inside the region.
    Range,
    /// The region lacks the right.
    Access,
}

impl MrTable {
    /// An empty table.
    pub fn new() -> MrTable {
        MrTable::default()
    }

    /// Registers `len` bytes at `addr` in domain `pd` with `access`; returns the key.
    pub fn register(&mut self, pd: u32, addr: u64, len: u64, access: Access) -> u32 {
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.gens.push(0);
            self.slots.len() - 1
        });
        let gen = self.gens[index];
        self.gens[index] = gen.wrapping_add(1);
        // Index 0 with generation 0 would be key 0, which some programs use as "no key".
        let key = ((index as u32 + 1) << 8) | u32::from(gen);
        self.slots[index] = Some(MrEntry {
            pd,
            addr,
            len,
            access,
            key,
        });
        key
    }

    /// Deregisters the region with `key`; `false` if there is none.
    pub fn deregister(&mut self, key: u32) -> bool {
        let Some(index) = self.index(key) else {
            return false;
        };
        self.slots[index] = None;
        self.free.push(index);
        true
    }

    /// The region with `key`, if it is registered.
    pub fn get(&self, key: u32) -> Option<&MrEntry> {
        self.index(key).and_then(|i| self.slots[i].as_ref())
    }

    fn index(&self, key: u32) -> Option<usize> {
        let index = (key >> 8).checked_sub(1)? as usize;
        match self.slots.get(index)? {
            Some(e) if e.key == key => Some(index),
            _ => None,
        }
    }

    /// Checks a peer's access of `len` bytes at `addr` through `rkey` from domain `pd`.
    pub(crate) fn check_remote(
        &self,
        pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(), KeyError> {
        let e = self.get(rkey).filter(|e| e.pd == pd).ok_or(KeyError::Key)?;
        if !e.covers(addr, len) {
            return Err(KeyError::Range);
        }
        if !e.access.contains(need) {
            return Err(KeyError::Access);
        }
        Ok(())
    }

    /// Checks a local scatter/gather entry of domain `pd`: the NIC reads it, or writes it
    /// when `write` (which needs LOCAL_WRITE).
    pub(crate) fn check_local(&self, pd: u32, sge: &Sge, write: bool) -> Result<(), KeyError> {
        let e = self
            .get(sge.lkey)
            .filter(|e| e.pd == pd)
            .ok_or(KeyError::Key)?;
        if !e.covers(sge.addr, u64::from(sge.len)) {
            return Err(KeyError::Range);
        }
        if write && !e.access.contains(Access::LOCAL_WRITE) {
            return Err(KeyError::Access);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_exact_per_domain_and_die_with_their_region() {
        let mut t = MrTable::new();
        let k = t.register(1, 0x1000, 64, Access::REMOTE_READ);
        assert_ne!(k, 0);
        assert_eq!(
            t.check_remote(1, k, 0x1000, 64, Access::REMOTE_READ),
            Ok(())
        );
        assert_eq!(
            t.check_remote(2, k, 0x1000, 8, Access::REMOTE_READ),
            Err(KeyError::Key)
        );
        assert_eq!(
            t.check_remote(1, k, 0x1001, 64, Access::REMOTE_READ),
            Err(KeyError::Range)
        );
        assert_eq!(
            t.check_remote(1, k, 0x1000, 8, Access::REMOTE_WRITE),
            Err(KeyError::Access)
        );
        assert!(t.deregister(k));
        assert_eq!(
            t.check_remote(1, k, 0x1000, 8, Access::REMOTE_READ),
            Err(KeyError::Key)
        );
        // The slot is reused with a new generation: the old key stays dead.
        let k2 = t.register(1, 0x1000, 64, Access::REMOTE_READ);
        assert_eq!(k2 >> 8, k >> 8);
        assert_ne!(k2, k);
        assert!(t.get(k).is_none());
        assert!(!t.deregister(k));
    }

    #[test]
    fn local_writes_need_local_write() {
        let mut t = MrTable::new();
        let k = t.register(1, 0, 16, Access::NONE);
        let sge = Sge {
            addr: 0,
            len: 16,
            lkey: k,
        };
        assert_eq!(t.check_local(1, &sge, false), Ok(()));
        assert_eq!(t.check_local(1, &sge, true), Err(KeyError::Access));
        let long = Sge { len: 17, ..sge };
        assert_eq!(t.check_local(1, &long, false), Err(KeyError::Range));
    }
}
