//! The two registered slot regions, lent to the protocol core through
//! [`rsrdma_proto::SlotMemory`].
//!
//! Each region is memory this module allocates and registers itself ([`Mr::register`]), so it
//! keeps the allocation's raw pointer and copies with `ptr::copy_nonoverlapping` (a plain
//! `memcpy`, fast even in a debug build, where [`Mr::read_at`]'s volatile word loop made the
//! copies the largest cost of a transfer). No Rust reference into a region is ever created:
//! the NIC reads send slots in flight and writes posted receive slots, and the core's contract
//! (it writes only send slots that are not in flight, reads only receive slots that completed
//! and are not reposted) keeps every copy off bytes the NIC touches at that moment. Neither
//! region is remotely accessible: the protocol uses SEND/RECV only.

use rsrdma::{AccessFlags, Mr, Pd, Sge};
use rsrdma_proto::SlotMemory;
use std::alloc::Layout;
use std::cell::Cell;

/// Regions are page-aligned, as [`Mr::new`] makes them.
const PAGE: usize = 4096;

/// One registered allocation that this module owns.
struct Region {
    /// `Some` until drop, which deregisters it before the memory is freed.
    mr: Option<Mr>,
    ptr: *mut u8,
    layout: Layout,
    len: usize,
}

// SAFETY: the region owns its allocation outright; the raw pointer is only dereferenced
// through `&self`/`&mut self` methods of `Slots`, whose borrow rules serialise the copies.
unsafe impl Send for Region {}

impl Region {
    fn new(pd: &Pd, len: usize, access: AccessFlags) -> rsrdma::Result<Region> {
        let layout = len
            .checked_next_multiple_of(PAGE)
            .and_then(|size| Layout::from_size_align(size.max(PAGE), PAGE).ok())
            .ok_or_else(|| {
                rsrdma::Error::InvalidArgument(format!("a slot region of {len} bytes"))
            })?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(rsrdma::Error::Verbs {
                op: "alloc",
                errno: libc::ENOMEM,
            });
        }
        // SAFETY: `ptr..ptr+len` is a fresh allocation that stays put until `drop`, which
        // deregisters first; no reference into it is ever created (module docs).
        match unsafe { Mr::register(pd, ptr, len, access) } {
            Ok(mr) => Ok(Region {
                mr: Some(mr),
                ptr,
                layout,
                len,
            }),
            Err(e) => {
                // SAFETY: allocated above with this layout, never registered.
                unsafe { std::alloc::dealloc(ptr, layout) };
                Err(e)
            }
        }
    }

    fn mr(&self) -> Option<&Mr> {
        self.mr.as_ref()
    }

    /// Whether `offset..offset+len` lies inside the region.
    fn holds(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Deregister before freeing; the driver drops the memory only after the QP's flush
        // (or leaks it, see `Driver::teardown`).
        drop(self.mr.take());
        // SAFETY: allocated in `new` with this layout; the registration is gone.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Send and receive slots of one connection.
pub(crate) struct Slots {
    send: Region,
    recv: Region,
    slot_size: usize,
    /// Set when the core asked for a range outside a region (a bug, never expected): the
    /// driver then fails the connection instead of panicking.
    fault: Cell<bool>,
}

impl Slots {
    /// Registers `send_slots × slot_size` bytes (local access) and `recv_slots × slot_size`
    /// bytes (local write).
    pub(crate) fn new(
        pd: &Pd,
        send_slots: u16,
        recv_slots: u16,
        slot_size: u32,
    ) -> rsrdma::Result<Slots> {
        let size = slot_size as usize;
        Ok(Slots {
            send: Region::new(pd, usize::from(send_slots) * size, AccessFlags::NONE)?,
            recv: Region::new(pd, usize::from(recv_slots) * size, AccessFlags::LOCAL_WRITE)?,
            slot_size: size,
            fault: Cell::new(false),
        })
    }

    /// The SGE of a send: the first `len` bytes of send slot `slot`.
    pub(crate) fn send_sge(&self, slot: u16, len: u32) -> Option<Sge> {
        let at = usize::from(slot) * self.slot_size;
        self.send.mr()?.sge(at, len as usize).ok()
    }

    /// The SGE of a receive: the whole of receive slot `slot`.
    pub(crate) fn recv_sge(&self, slot: u16) -> Option<Sge> {
        let at = usize::from(slot) * self.slot_size;
        self.recv.mr()?.sge(at, self.slot_size).ok()
    }

    /// Whether a copy ever fell outside a region.
    pub(crate) fn faulted(&self) -> bool {
        self.fault.get()
    }

    /// Registered bytes.
    pub(crate) fn registered(&self) -> usize {
        self.send.len + self.recv.len
    }

    fn in_slot(&self, region: &Region, slot: u16, offset: usize, len: usize) -> Option<usize> {
        let at = usize::from(slot) * self.slot_size + offset;
        let fits = offset + len <= self.slot_size && region.holds(at, len);
        if !fits {
            self.fault.set(true);
        }
        fits.then_some(at)
    }
}

impl SlotMemory for Slots {
    fn write_send(&mut self, slot: u16, offset: usize, bytes: &[u8]) {
        if let Some(at) = self.in_slot(&self.send, slot, offset, bytes.len()) {
            // SAFETY: `at..at+len` is inside the send allocation (checked); the core writes
            // only a slot that is not in flight, so the NIC does not read these bytes now;
            // `bytes` is caller memory, which cannot overlap our private allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.send.ptr.add(at), bytes.len())
            };
        }
    }

    fn read_recv(&self, slot: u16, offset: usize, out: &mut [u8]) {
        if let Some(at) = self.in_slot(&self.recv, slot, offset, out.len()) {
            // SAFETY: inside the receive allocation (checked); the core reads only a slot whose
            // receive completed and that is not reposted, so the NIC does not write it now.
            unsafe {
                std::ptr::copy_nonoverlapping(self.recv.ptr.add(at), out.as_mut_ptr(), out.len())
            };
        }
    }
}
