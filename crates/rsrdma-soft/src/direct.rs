//! One-sided requests the requester does itself, in the responder's memory, when a device can
//! reach that memory (soft0 between processes of one host, through shared memory): a WRITE,
//! READ or atomic then completes at once, with no packet and no work from the responder.
//!
//! # When, exactly
//! Only where the outcome is the one the packet would have had, so that a program cannot tell
//! the difference (apart from time): [`crate::RcQp::post_send_direct`] goes direct only for a
//! request of a reliable-connected queue pair with nothing of its own ahead of it (no request
//! unanswered, none waiting to leave, no RNR back-off), which the responder would therefore
//! execute next (not on UC: its requests complete as they leave, so one may still be on its
//! way when nothing of the queue pair is left to say so); and the
//! device says yes ([`Direct`]) only after the checks the responder makes
//! ([`ResponderQp::allows`]: its state and rights, the key, domain, range and rights of the
//! region). Anything else (a window's key, a zero-length or misaligned request, a key the
//! device cannot see, a check that fails) goes as a packet, and the responder decides, with
//! its statuses. A direct request takes no PSN: the responder never hears of it.
//!
//! A race with the responder (its region deregistered, its queue pair failed, just as the
//! request is done) has the outcome of the request having arrived just before: the same as
//! on a NIC.

use crate::qp::{gather, scatter};
use crate::{Access, Memory, MrEntry, Sge};

/// The responder's memory, as the requester's device reaches it.
pub trait Direct {
    /// Copies `data` to `addr` through region key `rkey` and returns true, if the responder
    /// would execute this WRITE now; else returns false and touches nothing.
    fn write(&mut self, rkey: u32, addr: u64, data: &[u8]) -> bool;
    /// [`Direct::write`] of the bytes `sges` name in the requester's memory `local` (their
    /// keys checked). The default gathers them first; a device that can copy from the
    /// requester's memory straight into the responder's does one copy instead of two.
    fn write_gather(&mut self, rkey: u32, addr: u64, sges: &[Sge], local: &dyn Memory) -> bool {
        self.write(rkey, addr, &gather(sges, local))
    }
    /// Appends the `len` bytes at `addr` (through `rkey`) to `out` and returns true, if the
    /// responder would execute this READ now; else returns false and leaves `out` alone.
    fn read(&mut self, rkey: u32, addr: u64, len: usize, out: &mut Vec<u8>) -> bool;
    /// [`Direct::read`] of as many bytes as `sges` hold, spread over them in the requester's
    /// memory `local` (their keys checked). The default reads into a buffer first.
    fn read_scatter(&mut self, rkey: u32, addr: u64, sges: &[Sge], local: &mut dyn Memory) -> bool {
        let len = sges.iter().map(|s| s.len as usize).sum();
        let mut data = Vec::with_capacity(len);
        if !self.read(rkey, addr, len, &mut data) {
            return false;
        }
        scatter(sges, &data, local);
        true
    }
    /// Replaces the 8-byte word at `addr` (through `rkey`) with `f` of it, as one atomic step,
    /// and returns the word before, if the responder would execute this atomic now.
    fn atomic(&mut self, rkey: u32, addr: u64, f: &mut dyn FnMut(u64) -> u64) -> Option<u64>;
}

/// A responder queue pair as a requester's device sees it (what a device publishes for the
/// devices that reach its memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponderQp {
    /// Its number.
    pub qp_num: u32,
    /// In RTR or RTS: it executes what arrives.
    pub ready: bool,
    /// The remote rights it grants (`qp_access_flags`).
    pub access: Access,
    /// Its protection domain.
    pub pd: u32,
    /// The queue pair it is connected to.
    pub dest_qpn: u32,
    /// Unreliable-connected: it executes WRITEs only.
    pub unreliable: bool,
}

impl ResponderQp {
    /// Whether this responder would execute, for queue pair `from`, a request needing `right`
    /// (one of `REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`) on `len` bytes at `addr`
    /// through region `mr` named by `rkey`: the checks the responder makes on a packet, and
    /// those the direct path adds (a request of at least one byte; an atomic on an aligned
    /// word).
    pub fn allows(
        &self,
        from: u32,
        mr: &MrEntry,
        rkey: u32,
        addr: u64,
        len: u64,
        right: Access,
    ) -> bool {
        let kind_ok = match right {
            Access::REMOTE_WRITE => true,
            Access::REMOTE_READ => !self.unreliable,
            Access::REMOTE_ATOMIC => !self.unreliable && len == 8 && addr % 8 == 0,
            _ => false,
        };
        kind_ok
            && len > 0
            && self.ready
            && self.dest_qpn == from
            && self.access.contains(right)
            && mr.key == rkey
            && mr.pd == self.pd
            && mr.access.contains(right)
            && mr.covers(addr, len)
    }
}
