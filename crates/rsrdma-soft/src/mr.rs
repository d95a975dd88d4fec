//! Memory keys: which key reaches which memory, from which protection domain, with which
//! rights. Regions and type-2 memory windows share one key space, as rxe's: a key is
//! `index << 8 | tag`, and the slot at the index says whether it is a region or a window.
//!
//! A region's key is checked exactly, so a deregistered region's key stops working at once and
//! is not reused by the next object in its slot until the 8-bit generation wraps.
//!
//! A window's tag is the application's: each bind names a new one (only the low 8 bits of the
//! bind's key count, the index stays the window's), and the previous key stops working. The
//! rules, restated from rxe (IBA's compliance statements in brackets):
//! - a bind names the window by its present key exactly; it is refused when the window is
//!   already bound (a type-2 window must be invalidated first, o10-37.2.30), when the window
//!   or the region is of another protection domain than the QP (C10-72), when the length is 0
//!   (o10-37.2.40), when the region lacks MW_BIND (C10-73), when the window would grant
//!   remote write or atomics over a region without local write (C10-74), when the range is not
//!   inside the region (C10-75), and for a zero-based window (which soft0 does not do) or a
//!   right libibverbs does not define for windows;
//! - a bound window belongs to the QP the bind was posted on: a peer's request naming its key
//!   is served only when it arrives on that QP, asks for a right the window grants, and lies
//!   inside the window;
//! - a local invalidation names the window's present key and needs it bound; a SEND with
//!   invalidate also needs it bound to the QP it arrives on; either leaves it free to be bound
//!   again;
//! - a region with bound windows is not deregistered (IBA 10.6.7.2.6); deallocating a window
//!   unbinds it.

use crate::access::Access;
use crate::wr::{Bind, Sge};

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
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        covers(self.addr, self.len, addr, len)
    }
}

/// Whether `[addr, addr + len)` lies inside `[start, start + size)`.
fn covers(start: u64, size: u64, addr: u64, len: u64) -> bool {
    addr >= start
        && addr
            .checked_add(len)
            .is_some_and(|end| start.checked_add(size).is_some_and(|e| end <= e))
}

/// One type-2 memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwEntry {
    /// The protection domain it belongs to.
    pub pd: u32,
    /// The key it was allocated with: it names the window for its deallocation, whatever its
    /// present key.
    pub handle: u32,
    /// Its present key (its last bind's).
    pub key: u32,
    /// Where it is bound; `None` while it is free.
    pub binding: Option<MwBinding>,
}

/// Where a window is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBinding {
    /// The QP it was bound on: the only one its key works through.
    pub qp_num: u32,
    /// The key of the region it lies in.
    pub mr_key: u32,
    /// Its first address.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// What it grants.
    pub access: Access,
}

/// What a slot of the key space holds.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// A region, and how many windows are bound to it.
    Region {
        mr: MrEntry,
        windows: u32,
    },
    Window(MwEntry),
}

/// A device's memory regions and windows.
#[derive(Debug, Default, Clone)]
pub struct MrTable {
    slots: Vec<Option<Slot>>,
    /// The generation each slot's next key gets.
    gens: Vec<u8>,
    free: Vec<usize>,
}

/// Why a key check failed (the caller turns it into its status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No region or window has this key, it is another domain's, or (a window) it is not
    /// bound to the QP the request came on.
    Key,
    /// The range is not inside the region or window.
    Range,
    /// The region or window lacks the right.
    Access,
}

/// Why a deregistration was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeregError {
    /// No region has this key.
    NoSuchRegion,
    /// This many windows are bound to the region (IBA 10.6.7.2.6): it stays registered.
    WindowsBound(u32),
}

/// Why a bind was refused (the bind completes with `MW_BIND_ERR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BindError {
    /// No window has the bind's window key, or it is of another domain than the QP.
    Window,
    /// The window is bound already.
    Bound,
    /// No region of the QP's domain has the bind's region key.
    Region,
    /// A zero-based window, or a right libibverbs does not define for windows.
    Rights,
    /// The region was not registered with MW_BIND.
    NoBind,
    /// Remote write or atomics over a region without local write.
    NoLocalWrite,
    /// A length of 0, or a range not inside the region.
    Range,
}

impl MrTable {
    /// An empty table.
    pub fn new() -> MrTable {
        MrTable::default()
    }

    /// The slot index a key names (keys are `(index + 1) << 8 | generation`; a slot holds
    /// one region or window at a time, each new one with the next generation).
    pub fn slot_of(key: u32) -> Option<usize> {
        Some((key >> 8).checked_sub(1)? as usize)
    }

    /// A free slot and the key its next object gets.
    fn take_slot(&mut self) -> (usize, u32) {
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.gens.push(0);
            self.slots.len() - 1
        });
        let gen = self.gens[index];
        self.gens[index] = gen.wrapping_add(1);
        // Index 0 with generation 0 would be key 0, which some programs use as "no key".
        (index, ((index as u32 + 1) << 8) | u32::from(gen))
    }

    /// Registers `len` bytes at `addr` in domain `pd` with `access`; returns the key.
    pub fn register(&mut self, pd: u32, addr: u64, len: u64, access: Access) -> u32 {
        let (index, key) = self.take_slot();
        let mr = MrEntry {
            pd,
            addr,
            len,
            access,
            key,
        };
        self.slots[index] = Some(Slot::Region { mr, windows: 0 });
        key
    }

    /// Deregisters the region with `key`.
    ///
    /// # Errors
    /// [`DeregError::NoSuchRegion`]; [`DeregError::WindowsBound`] while windows are bound to
    /// it (it stays registered).
    pub fn deregister(&mut self, key: u32) -> Result<(), DeregError> {
        let index = self.index(key).ok_or(DeregError::NoSuchRegion)?;
        match self.slots[index] {
            Some(Slot::Region { windows: 0, .. }) => {}
            Some(Slot::Region { windows, .. }) => return Err(DeregError::WindowsBound(windows)),
            _ => return Err(DeregError::NoSuchRegion),
        }
        self.slots[index] = None;
        self.free.push(index);
        Ok(())
    }

    /// The region with `key`, if it is registered.
    pub fn get(&self, key: u32) -> Option<&MrEntry> {
        match self.slots[self.index(key)?].as_ref()? {
            Slot::Region { mr, .. } => Some(mr),
            Slot::Window(_) => None,
        }
    }

    /// Allocates a free type-2 window in domain `pd`; returns its key, which is also its
    /// handle.
    pub fn alloc_window(&mut self, pd: u32) -> u32 {
        let (index, key) = self.take_slot();
        self.slots[index] = Some(Slot::Window(MwEntry {
            pd,
            handle: key,
            key,
            binding: None,
        }));
        key
    }

    /// Deallocates the window allocated as `handle`, unbinding it; `false` if there is none.
    pub fn dealloc_window(&mut self, handle: u32) -> bool {
        let Some(index) = Self::slot_of(handle) else {
            return false;
        };
        let binding = match self.slots.get(index) {
            Some(Some(Slot::Window(w))) if w.handle == handle => w.binding,
            _ => return false,
        };
        if let Some(b) = binding {
            self.unbound_from(b.mr_key);
        }
        self.slots[index] = None;
        self.free.push(index);
        true
    }

    /// The window whose present key is `key`.
    pub fn window(&self, key: u32) -> Option<&MwEntry> {
        match self.slots[self.index(key)?].as_ref()? {
            Slot::Window(w) => Some(w),
            Slot::Region { .. } => None,
        }
    }

    /// The slot index of the object whose present key is exactly `key`.
    fn index(&self, key: u32) -> Option<usize> {
        let index = Self::slot_of(key)?;
        let present = match self.slots.get(index)?.as_ref()? {
            Slot::Region { mr, .. } => mr.key,
            Slot::Window(w) => w.key,
        };
        (present == key).then_some(index)
    }

    fn window_mut(&mut self, key: u32) -> Option<&mut MwEntry> {
        let index = self.index(key)?;
        match self.slots[index].as_mut()? {
            Slot::Window(w) => Some(w),
            Slot::Region { .. } => None,
        }
    }

    /// A window bound to region `mr_key` was unbound.
    fn unbound_from(&mut self, mr_key: u32) {
        if let Some(i) = self.index(mr_key) {
            if let Some(Slot::Region { windows, .. }) = &mut self.slots[i] {
                *windows = windows.saturating_sub(1);
            }
        }
    }

    /// Binds a window on QP `qp_num` of domain `pd` (see the module docs for the rules);
    /// returns the window's new key.
    pub(crate) fn bind(&mut self, pd: u32, qp_num: u32, b: &Bind) -> Result<u32, BindError> {
        let w = self
            .window(b.mw_key)
            .filter(|w| w.pd == pd)
            .ok_or(BindError::Window)?;
        if w.binding.is_some() {
            return Err(BindError::Bound);
        }
        let mr = self
            .get(b.mr_key)
            .filter(|m| m.pd == pd)
            .ok_or(BindError::Region)?;
        // What rxe accepts, less ZERO_BASED; the local rights grant a peer nothing.
        let known = Access::LOCAL_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_WRITE
            | Access::REMOTE_ATOMIC
            | Access::MW_BIND;
        if b.access.0 & !known.0 != 0 {
            return Err(BindError::Rights);
        }
        if !mr.access.contains(Access::MW_BIND) {
            return Err(BindError::NoBind);
        }
        let writes = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if b.access.intersects(writes) && !mr.access.contains(Access::LOCAL_WRITE) {
            return Err(BindError::NoLocalWrite);
        }
        if b.len == 0 || !mr.covers(b.addr, b.len) {
            return Err(BindError::Range);
        }
        let key = (b.mw_key & !0xff) | (b.new_key & 0xff);
        let binding = MwBinding {
            qp_num,
            mr_key: b.mr_key,
            addr: b.addr,
            len: b.len,
            access: b.access,
        };
        let index = self.index(b.mr_key).ok_or(BindError::Region)?;
        if let Some(Slot::Region { windows, .. }) = &mut self.slots[index] {
            *windows += 1;
        }
        let w = self.window_mut(b.mw_key).ok_or(BindError::Window)?;
        w.key = key;
        w.binding = Some(binding);
        Ok(key)
    }

    /// Invalidates the window with present key `key` from a QP of domain `pd`: locally
    /// (`via: None`) or by a SEND with invalidate arriving on QP `via`, which must be the
    /// window's. `false` (nothing changed) when the key names no bound window of the domain
    /// (or of that QP).
    pub(crate) fn invalidate(&mut self, pd: u32, via: Option<u32>, key: u32) -> bool {
        let Some(w) = self.window_mut(key).filter(|w| w.pd == pd) else {
            return false;
        };
        let Some(b) = w.binding else {
            return false;
        };
        if via.is_some_and(|qp| qp != b.qp_num) {
            return false;
        }
        w.binding = None;
        self.unbound_from(b.mr_key);
        true
    }

    /// Checks a peer's access of `len` bytes at `addr` through `rkey`, arriving on QP
    /// `qp_num` of domain `pd`.
    pub(crate) fn check_remote(
        &self,
        pd: u32,
        qp_num: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(), KeyError> {
        let index = self.index(rkey).ok_or(KeyError::Key)?;
        let (start, size, access) = match self.slots[index].as_ref().ok_or(KeyError::Key)? {
            Slot::Region { mr, .. } if mr.pd == pd => (mr.addr, mr.len, mr.access),
            Slot::Window(w) if w.pd == pd => match w.binding {
                Some(b) if b.qp_num == qp_num => (b.addr, b.len, b.access),
                _ => return Err(KeyError::Key),
            },
            _ => return Err(KeyError::Key),
        };
        if !covers(start, size, addr, len) {
            return Err(KeyError::Range);
        }
        if !access.contains(need) {
            return Err(KeyError::Access);
        }
        Ok(())
    }

    /// Checks a local scatter/gather entry of domain `pd`: the NIC reads it, or writes it
    /// when `write` (which needs LOCAL_WRITE). A window's key is no local key.
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
            t.check_remote(1, 9, k, 0x1000, 64, Access::REMOTE_READ),
            Ok(())
        );
        assert_eq!(
            t.check_remote(2, 9, k, 0x1000, 8, Access::REMOTE_READ),
            Err(KeyError::Key)
        );
        assert_eq!(
            t.check_remote(1, 9, k, 0x1001, 64, Access::REMOTE_READ),
            Err(KeyError::Range)
        );
        assert_eq!(
            t.check_remote(1, 9, k, 0x1000, 8, Access::REMOTE_WRITE),
            Err(KeyError::Access)
        );
        assert_eq!(t.deregister(k), Ok(()));
        assert_eq!(
            t.check_remote(1, 9, k, 0x1000, 8, Access::REMOTE_READ),
            Err(KeyError::Key)
        );
        // The slot is reused with a new generation: the old key stays dead.
        let k2 = t.register(1, 0x1000, 64, Access::REMOTE_READ);
        assert_eq!(k2 >> 8, k >> 8);
        assert_ne!(k2, k);
        assert!(t.get(k).is_none());
        assert_eq!(t.deregister(k), Err(DeregError::NoSuchRegion));
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

    const QP: u32 = 7;

    /// A region at 0x1000 of 8 KiB (local write and MW_BIND) and a free window, domain 1.
    fn region_and_window(t: &mut MrTable) -> (u32, u32) {
        let mr = t.register(1, 0x1000, 8192, Access::LOCAL_WRITE | Access::MW_BIND);
        (mr, t.alloc_window(1))
    }

    /// A region and a window bound over 64 bytes of it for remote read on `QP`: (region
    /// key, window handle, window key).
    fn bound_window(t: &mut MrTable) -> (u32, u32, u32) {
        let (mr, mw) = region_and_window(t);
        let b = bind(mw, mw + 1, mr, 0x1000, 64, Access::REMOTE_READ);
        let key = t.bind(1, QP, &b).unwrap();
        (mr, mw, key)
    }

    fn bind(mw_key: u32, new_key: u32, mr_key: u32, addr: u64, len: u64, access: Access) -> Bind {
        Bind {
            mw_key,
            new_key,
            mr_key,
            addr,
            len,
            access,
        }
    }

    #[test]
    fn a_bound_window_serves_its_qp_inside_its_range_with_its_rights_only() {
        let mut t = MrTable::new();
        let (mr, mw) = region_and_window(&mut t);
        let tag = (mw + 1) & 0xff;
        // The bind's key names another index: only its tag counts.
        let b = bind(mw, 0xabcd_ef00 | tag, mr, 0x2000, 4096, Access::REMOTE_READ);
        let key = t.bind(1, QP, &b).unwrap();
        assert_eq!(
            key,
            (mw & !0xff) | tag,
            "the tag is the bind's, the index the window's"
        );
        assert!(t.window(key).is_some_and(|w| w.binding.is_some()));
        let read = |t: &MrTable, qp, k, addr, len| {
            t.check_remote(1, qp, k, addr, len, Access::REMOTE_READ)
        };
        assert_eq!(read(&t, QP, key, 0x2000, 4096), Ok(()));
        assert_eq!(read(&t, QP, key, 0x2800, 8), Ok(()));
        // Another QP of the same domain: the key is not its.
        assert_eq!(read(&t, QP + 1, key, 0x2000, 8), Err(KeyError::Key));
        // Inside the region but outside the window.
        assert_eq!(read(&t, QP, key, 0x1ff8, 16), Err(KeyError::Range));
        assert_eq!(read(&t, QP, key, 0x2001, 4096), Err(KeyError::Range));
        // A right the window does not grant (the region grants none either way).
        assert_eq!(
            t.check_remote(1, QP, key, 0x2000, 8, Access::REMOTE_WRITE),
            Err(KeyError::Access)
        );
        // The key the window had before the bind is dead.
        assert_eq!(read(&t, QP, mw, 0x2000, 8), Err(KeyError::Key));
        // Another domain's QP with the same number.
        assert_eq!(
            t.check_remote(2, QP, key, 0x2000, 8, Access::REMOTE_READ),
            Err(KeyError::Key)
        );
        // A window's key is no local key.
        let sge = Sge {
            addr: 0x2000,
            len: 8,
            lkey: key,
        };
        assert_eq!(t.check_local(1, &sge, false), Err(KeyError::Key));
    }

    #[test]
    fn binds_that_break_a_rule_are_refused_and_change_nothing() {
        let mut t = MrTable::new();
        let (mr, mw) = region_and_window(&mut t);
        let plain = t.register(1, 0x1000, 8192, Access::LOCAL_WRITE);
        let read_only = t.register(1, 0x1000, 8192, Access::MW_BIND);
        let other_pd = t.register(2, 0x1000, 8192, Access::LOCAL_WRITE | Access::MW_BIND);
        let r = Access::REMOTE_READ;
        let cases = [
            (bind(mw, mw + 1, plain, 0x1000, 64, r), BindError::NoBind),
            (bind(mw, mw + 1, mr, 0x1000, 8193, r), BindError::Range),
            (bind(mw, mw + 1, mr, 0x2fff, 4098, r), BindError::Range),
            (bind(mw, mw + 1, mr, 0xfff, 8, r), BindError::Range),
            (bind(mw, mw + 1, mr, u64::MAX, 2, r), BindError::Range),
            (bind(mw, mw + 1, mr, 0x1000, 0, r), BindError::Range),
            (
                bind(mw, mw + 1, read_only, 0x1000, 64, Access::REMOTE_WRITE),
                BindError::NoLocalWrite,
            ),
            (
                bind(mw, mw + 1, read_only, 0x1000, 64, Access::REMOTE_ATOMIC),
                BindError::NoLocalWrite,
            ),
            (
                bind(mw, mw + 1, mr, 0x1000, 64, r | Access::ZERO_BASED),
                BindError::Rights,
            ),
            (bind(mw, mw + 1, other_pd, 0x1000, 64, r), BindError::Region),
            (bind(mw + 1, mw + 2, mr, 0x1000, 64, r), BindError::Window),
            (bind(mr, mr + 1, mr, 0x1000, 64, r), BindError::Window),
        ];
        for (b, why) in cases {
            assert_eq!(t.bind(1, QP, &b), Err(why), "{b:?}");
            assert_eq!(t.window(mw).and_then(|w| w.binding), None, "{b:?}");
        }
        // A window of domain 1 is not bound from a QP of domain 2.
        let b = bind(mw, mw + 1, other_pd, 0x1000, 64, r);
        assert_eq!(t.bind(2, QP, &b), Err(BindError::Window));
        // Read-only windows over a region without local write are fine.
        let ok = bind(mw, mw + 1, read_only, 0x1000, 64, r);
        let key = t.bind(1, QP, &ok).unwrap();
        // Bound: a second bind (under its present key) is refused until it is invalidated.
        let again = bind(key, key + 1, mr, 0x1000, 64, r);
        assert_eq!(t.bind(1, QP, &again), Err(BindError::Bound));
        assert!(t.invalidate(1, None, key));
        assert_eq!(
            t.bind(1, QP, &again),
            Ok((key & !0xff) | ((key + 1) & 0xff))
        );
    }

    #[test]
    fn invalidation_frees_the_window_and_kills_its_key() {
        let mut t = MrTable::new();
        let (mr, _, key) = bound_window(&mut t);
        assert!(!t.invalidate(1, None, key + 1), "not the present key");
        assert!(!t.invalidate(2, None, key), "another domain's QP");
        assert!(!t.invalidate(1, None, mr), "a region's key names no window");
        assert!(!t.invalidate(1, Some(QP + 1), key), "remotely: not its QP");
        assert!(t.invalidate(1, Some(QP), key));
        assert_eq!(
            t.check_remote(1, QP, key, 0x1000, 8, Access::REMOTE_READ),
            Err(KeyError::Key),
            "no access after the invalidation"
        );
        assert!(!t.invalidate(1, None, key), "already free");
        // Free again: bound anew under the next tag, on another QP this time.
        let next = (key & !0xff) | ((key + 1) & 0xff);
        let b = bind(key, next, mr, 0x1000, 64, Access::REMOTE_READ);
        assert_eq!(t.bind(1, QP + 1, &b), Ok(next));
        assert_eq!(
            t.check_remote(1, QP + 1, next, 0x1000, 8, Access::REMOTE_READ),
            Ok(())
        );
        assert!(t.invalidate(1, None, next));
    }

    #[test]
    fn a_region_with_a_bound_window_stays_registered_until_the_window_goes() {
        let mut t = MrTable::new();
        let (mr, mw, key) = bound_window(&mut t);
        assert_eq!(t.deregister(mr), Err(DeregError::WindowsBound(1)));
        assert!(t.get(mr).is_some(), "still registered");
        assert_eq!(t.deregister(key), Err(DeregError::NoSuchRegion));
        assert!(!t.dealloc_window(key), "deallocation names the handle");
        assert!(
            t.dealloc_window(mw),
            "deallocating a bound window unbinds it"
        );
        assert!(t.window(key).is_none());
        assert!(!t.dealloc_window(mw));
        assert_eq!(t.deregister(mr), Ok(()));
        // Invalidation unbinds too.
        let (mr, _, key) = bound_window(&mut t);
        assert!(t.invalidate(1, None, key));
        assert_eq!(t.deregister(mr), Ok(()));
    }
}
