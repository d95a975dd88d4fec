//! The two registered slot regions, lent to the protocol core through
//! [`rsrdma_proto::SlotMemory`].
//!
//! Copies go through [`Mr::write_at`]/[`Mr::read_at`]: they hold no reference into memory
//! the NIC reads (send slots in flight) or writes (posted receives), so there is nothing to
//! get wrong about aliasing, and the core's contract (it writes only send slots that are not
//! in flight, reads only receive slots that completed and are not reposted) keeps the bytes
//! consistent. Neither region is remotely accessible: the protocol uses SEND/RECV only.

use rsrdma::{AccessFlags, Mr, Pd, Sge};
use rsrdma_proto::SlotMemory;
use std::cell::Cell;

/// Send and receive slots of one connection.
pub(crate) struct Slots {
    send: Mr,
    recv: Mr,
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
            send: Mr::new(pd, usize::from(send_slots) * size, AccessFlags::NONE)?,
            recv: Mr::new(pd, usize::from(recv_slots) * size, AccessFlags::LOCAL_WRITE)?,
            slot_size: size,
            fault: Cell::new(false),
        })
    }

    /// The SGE of a send: the first `len` bytes of send slot `slot`.
    pub(crate) fn send_sge(&self, slot: u16, len: u32) -> Option<Sge> {
        self.send
            .sge(usize::from(slot) * self.slot_size, len as usize)
            .ok()
    }

    /// The SGE of a receive: the whole of receive slot `slot`.
    pub(crate) fn recv_sge(&self, slot: u16) -> Option<Sge> {
        self.recv
            .sge(usize::from(slot) * self.slot_size, self.slot_size)
            .ok()
    }

    /// Whether a copy ever fell outside a region.
    pub(crate) fn faulted(&self) -> bool {
        self.fault.get()
    }

    /// Registered bytes.
    pub(crate) fn registered(&self) -> usize {
        self.send.len() + self.recv.len()
    }
}

impl SlotMemory for Slots {
    fn write_send(&mut self, slot: u16, offset: usize, bytes: &[u8]) {
        let at = usize::from(slot) * self.slot_size + offset;
        if offset + bytes.len() > self.slot_size || self.send.write_at(at, bytes).is_err() {
            self.fault.set(true);
        }
    }

    fn read_recv(&self, slot: u16, offset: usize, out: &mut [u8]) {
        let at = usize::from(slot) * self.slot_size + offset;
        if offset + out.len() > self.slot_size || self.recv.read_at(at, out).is_err() {
            self.fault.set(true);
        }
    }
}
