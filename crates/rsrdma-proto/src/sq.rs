//! Send-queue occupancy, send slots and selective signalling.
//!
//! WRs get consecutive sequence numbers; a signalled completion of WR `n` completes every WR up
//! to `n` (RC processes a send queue in order), which frees their send slots. A WR is
//! signalled when it is the k-th since the last signalled one, when after it fewer than k SQ
//! entries or send slots are free, or when the caller forces it (FIN, ABORT, everything after
//! FIN). So whenever the core waits for an SQ entry or a slot, a signalled WR is outstanding:
//! the wait ends with its completion.

use crate::work::WrId;

#[derive(Debug, Clone, Copy, Default)]
struct WrRecord {
    slot: Option<u16>,
    len: u32,
    signaled: bool,
}

#[derive(Debug)]
pub(crate) struct SendQueue {
    depth: u64,
    /// `records.len() - 1`: the ring has a power-of-two length (at least `depth`), so a WR's
    /// entry is a mask, not a division (several per frame on the send path).
    mask: u64,
    signal_every: u64,
    slot_low_water: usize,
    next: u64,
    done: u64,
    since_signal: u64,
    records: Box<[WrRecord]>,
    free_slots: Vec<u16>,
    pub(crate) signal_all: bool,
}

impl SendQueue {
    pub(crate) fn new(depth: u16, interval: u16, send_slots: u16) -> Self {
        let signal_every = u64::from(interval.min(depth / 2).max(1));
        let entries = usize::from(depth).next_power_of_two();
        Self {
            depth: u64::from(depth),
            mask: entries as u64 - 1,
            signal_every,
            slot_low_water: usize::from(interval.min(send_slots / 2).max(1)),
            next: 0,
            done: 0,
            since_signal: 0,
            records: vec![WrRecord::default(); entries].into_boxed_slice(),
            free_slots: (0..send_slots).rev().collect(),
            signal_all: false,
        }
    }

    pub(crate) fn outstanding(&self) -> u64 {
        self.next - self.done
    }

    /// The number the next WR gets: every WR below it has been posted.
    pub(crate) fn next_index(&self) -> u64 {
        self.next
    }

    /// Whether every WR below `index` has completed.
    pub(crate) fn done_below(&self, index: u64) -> bool {
        self.done >= index
    }

    pub(crate) fn free_slots(&self) -> usize {
        self.free_slots.len()
    }

    #[inline]
    pub(crate) fn has_room(&self, needs_slot: bool) -> bool {
        self.has_room_for(1, needs_slot)
    }

    /// Room for `entries` WRs, one of them with a slot when `needs_slot`.
    pub(crate) fn has_room_for(&self, entries: u64, needs_slot: bool) -> bool {
        self.outstanding() + entries <= self.depth && (!needs_slot || !self.free_slots.is_empty())
    }

    /// How many entries the ring has (inline staging needs one per entry).
    pub(crate) fn entries(&self) -> usize {
        self.records.len()
    }

    /// Index of a WR's inline staging entry (valid while the WR is outstanding).
    #[inline]
    pub(crate) fn entry(&self, wr: WrId) -> usize {
        (wr.0 & self.mask) as usize
    }

    /// Takes an SQ entry (and a slot when asked); the caller checked `has_room`.
    #[inline]
    pub(crate) fn post(
        &mut self,
        needs_slot: bool,
        len: u32,
        force_signal: bool,
    ) -> (WrId, Option<u16>, bool) {
        let slot = if needs_slot {
            self.free_slots.pop()
        } else {
            None
        };
        let sq_free_after = self.depth - self.outstanding() - 1;
        let signaled = force_signal
            || self.signal_all
            || self.since_signal + 1 >= self.signal_every
            || sq_free_after < self.signal_every
            || self.free_slots.len() < self.slot_low_water;
        let wr = WrId(self.next);
        let at = self.entry(wr);
        self.records[at] = WrRecord {
            slot,
            len,
            signaled,
        };
        self.next += 1;
        self.since_signal = if signaled { 0 } else { self.since_signal + 1 };
        (wr, slot, signaled)
    }

    /// Undoes the newest post (a WR the driver never saw, dropped after a failure).
    pub(crate) fn unpost_last(&mut self, wr: WrId) {
        debug_assert_eq!(wr.0 + 1, self.next);
        let rec = self.records[self.entry(wr)];
        if let Some(slot) = rec.slot {
            self.free_slots.push(slot);
        }
        self.next -= 1;
    }

    /// A completion for `wr`: completes it and every earlier WR. A successful completion must
    /// be for a signalled WR; a flushed one may be for any outstanding WR.
    pub(crate) fn complete(&mut self, wr: WrId, ok: bool) -> Result<(), &'static str> {
        if wr.0 < self.done || wr.0 >= self.next {
            return Err("send completion for a WR that is not outstanding");
        }
        if ok && !self.records[self.entry(wr)].signaled {
            return Err("successful completion for an unsignalled WR");
        }
        while self.done <= wr.0 {
            let at = self.entry(WrId(self.done));
            if let Some(slot) = self.records[at].slot.take() {
                self.free_slots.push(slot);
            }
            self.done += 1;
        }
        Ok(())
    }

    /// The queue pair was flushed: nothing is outstanding any more.
    pub(crate) fn complete_all(&mut self) {
        if self.next > self.done {
            let _ = self.complete(WrId(self.next - 1), false);
        }
    }

    pub(crate) fn is_done(&self, wr: WrId) -> bool {
        wr.0 < self.done
    }

    pub(crate) fn record_len(&self, wr: WrId) -> Option<(Option<u16>, u32)> {
        if wr.0 < self.done || wr.0 >= self.next {
            return None;
        }
        let r = self.records[self.entry(wr)];
        Some((r.slot, r.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kth_is_signalled_and_a_completion_frees_earlier_slots() {
        let mut sq = SendQueue::new(64, 4, 32);
        let sig: Vec<bool> = (0..8).map(|_| sq.post(true, 100, false).2).collect();
        assert_eq!(sig, [false, false, false, true, false, false, false, true]);
        assert_eq!(sq.free_slots(), 24);
        assert_eq!(
            sq.complete(WrId(2), true),
            Err("successful completion for an unsignalled WR")
        );
        sq.complete(WrId(3), true).unwrap();
        assert_eq!((sq.outstanding(), sq.free_slots()), (4, 28));
        assert!(
            sq.complete(WrId(3), true).is_err(),
            "a completed WR completes once"
        );
    }

    #[test]
    fn a_depth_that_is_no_power_of_two_keeps_outstanding_entries_apart() {
        let mut sq = SendQueue::new(6, 2, 8);
        assert_eq!(sq.entries(), 8);
        for round in 0..5u64 {
            let wrs: Vec<WrId> = (0..6).map(|_| sq.post(false, 10, false).0).collect();
            assert!(
                !sq.has_room(false),
                "depth 6, not the ring's 8, bounds what is out"
            );
            let mut at: Vec<usize> = wrs.iter().map(|&w| sq.entry(w)).collect();
            at.sort_unstable();
            at.dedup();
            assert_eq!(
                at.len(),
                6,
                "round {round}: two outstanding WRs share an entry"
            );
            assert!(at.iter().all(|&e| e < sq.entries()));
            sq.complete(*wrs.last().unwrap(), true).unwrap();
        }
    }

    #[test]
    fn low_sq_or_slots_force_signalling() {
        let mut sq = SendQueue::new(8, 16, 32); // interval capped at depth/2 = 4
        let sig: Vec<bool> = (0..8).map(|_| sq.post(false, 10, false).2).collect();
        assert_eq!(sig, [false, false, false, true, true, true, true, true]);
        assert!(!sq.has_room(false));
        let mut sq = SendQueue::new(64, 16, 4); // slot low water = 2
        let sig: Vec<bool> = (0..4).map(|_| sq.post(true, 10, false).2).collect();
        assert_eq!(sig, [false, false, true, true]);
        assert!(!sq.has_room(true) && sq.has_room(false));
    }
}
