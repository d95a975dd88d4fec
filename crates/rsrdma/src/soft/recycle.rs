//! Payload memory a link's reader takes back once the device is done with a packet: a
//! reader allocates a buffer per packet for its payload, and allocating and freeing 64 KiB
//! at a time made the allocator return and take back its pages each time (page faults were
//! most of a receiver's time).

use rsrdma_soft::Payload;

/// Payloads this long or longer have their memory taken back.
const RECLAIM_FROM: usize = 4096;
/// The most buffers kept for reuse.
const MAX_FREE: usize = 8;

/// One reader's buffers: those lent out with packets, and those free.
#[derive(Default)]
pub(super) struct Recycler {
    lent: Vec<Payload>,
    free: Vec<Vec<u8>>,
}

impl Recycler {
    /// An empty buffer with room for `len` bytes, reused when one is free.
    pub(super) fn buffer(&mut self, len: usize) -> Vec<u8> {
        match self.free.pop() {
            Some(mut v) => {
                v.reserve(len);
                v
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps a share of `p` to take its memory back once the device dropped the packet.
    pub(super) fn lend(&mut self, p: &Payload) {
        if p.len() >= RECLAIM_FROM {
            self.lent.push(p.clone());
        }
    }

    /// Takes back the memory of the payloads the device no longer holds.
    pub(super) fn reclaim(&mut self) {
        for p in self.lent.drain(..) {
            if let Ok(mut v) = p.try_into_vec() {
                if self.free.len() < MAX_FREE && v.capacity() > 0 {
                    v.clear();
                    self.free.push(v);
                }
            }
        }
    }
}
