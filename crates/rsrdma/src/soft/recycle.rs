//! Payload memory taken back once the device is done with a packet, for the next one: a
//! link's reader fills a buffer per packet it reads, and the device one per request it
//! gathers. Allocating and freeing them per packet cost twice: at 64 KiB the allocator
//! returned and took back its pages each time (page faults were most of a receiver's
//! time), and below that every packet of a message longer than
//! [`rsrdma_soft::INLINE_PAYLOAD`] made two allocations (the bytes and the shared box
//! around them), on the data path that must make none. [`PayloadBuf`] keeps both.

use rsrdma_soft::{Payload, PayloadBuf};

/// The most buffers the device keeps free, and the most bytes they may hold together: enough
/// for a send queue's worth of small requests, or a few dozen 64 KiB ones, in flight at once.
pub(super) const DEVICE_FREE: usize = 256;
pub(super) const DEVICE_FREE_BYTES: usize = 32 << 20;
/// The same for each link's reader: it lends at most a batch of packets to the device at a
/// time, and a process may read from many peers.
const READER_FREE: usize = 64;
const READER_FREE_BYTES: usize = 8 << 20;
/// Free buffers are kept by size class: class `k` holds buffers of at least `2^k` bytes, up
/// to 4 MiB (a larger one is not kept: a rare huge message does not pin its memory).
const CLASSES: usize = 23;
/// How many classes above its own a request looks in before it allocates (a buffer a few
/// times larger is reused; a much larger one stays for the payloads that need it).
const LOOK_UP: usize = 2;

/// The class whose every buffer holds `len` bytes (the least `k` with `2^k >= len`).
fn class_for(len: usize) -> usize {
    len.max(1).next_power_of_two().trailing_zeros() as usize
}

/// Buffers free for the next payloads, by size class.
#[derive(Debug)]
pub(super) struct Spare {
    free: [Vec<PayloadBuf>; CLASSES],
    count: usize,
    /// Their capacity, summed.
    bytes: usize,
    max_count: usize,
    max_bytes: usize,
}

impl Spare {
    /// Keeps at most `max_count` buffers of `max_bytes` together.
    pub(super) const fn new(max_count: usize, max_bytes: usize) -> Spare {
        Spare {
            free: [const { Vec::new() }; CLASSES],
            count: 0,
            bytes: 0,
            max_count,
            max_bytes,
        }
    }

    /// An empty buffer with room for `len` bytes: a free one of its class (or a little
    /// larger), else a new one, rounded up to its class so that it serves its neighbours
    /// too.
    pub(super) fn take(&mut self, len: usize) -> PayloadBuf {
        let c = class_for(len);
        for k in c..(c + LOOK_UP + 1).min(CLASSES) {
            if let Some(b) = self.free[k].pop() {
                self.count -= 1;
                self.bytes -= b.capacity();
                return b;
            }
        }
        PayloadBuf::with_capacity(if c < CLASSES { 1 << c } else { len })
    }

    /// Keeps `p`'s buffer for a later [`Spare::take`], if nothing else holds it and there
    /// is room.
    pub(super) fn give(&mut self, p: Payload) {
        let Ok(b) = p.try_into_buf() else {
            return;
        };
        let cap = b.capacity();
        if cap == 0 || self.count >= self.max_count || self.bytes + cap > self.max_bytes {
            return;
        }
        let k = cap.ilog2() as usize;
        if k < CLASSES {
            self.count += 1;
            self.bytes += cap;
            self.free[k].push(b);
        }
    }
}

/// One reader's buffers: those lent out with packets, and those free.
#[derive(Debug)]
pub(super) struct Recycler {
    lent: Vec<Payload>,
    spare: Spare,
}

impl Default for Recycler {
    fn default() -> Recycler {
        Recycler {
            lent: Vec::new(),
            spare: Spare::new(READER_FREE, READER_FREE_BYTES),
        }
    }
}

impl Recycler {
    /// An empty buffer with room for `len` bytes, reused when one is free.
    pub(super) fn buffer(&mut self, len: usize) -> PayloadBuf {
        self.spare.take(len)
    }

    /// Keeps a share of `p` to take its memory back once the device dropped the packet.
    pub(super) fn lend(&mut self, p: &Payload) {
        if p.has_buffer() {
            self.lent.push(p.clone());
        }
    }

    /// Takes back the memory of the payloads the device no longer holds.
    pub(super) fn reclaim(&mut self) {
        for p in self.lent.drain(..) {
            self.spare.give(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again() {
        let mut spare = Spare::new(DEVICE_FREE, DEVICE_FREE_BYTES);
        let mut b = spare.take(100);
        b.bytes_mut().extend_from_slice(&[7; 100]);
        let p = Payload::from(b);
        let at = p.as_ptr();
        spare.give(p.clone());
        assert_eq!(spare.count, 0, "a share was still held");
        // A short payload has no buffer to give.
        spare.give(Payload::from_slice(&[1; 8]));
        assert_eq!(spare.count, 0);
        spare.give(p);
        assert_eq!(spare.count, 1);

        let mut b = spare.take(100);
        assert!(b.is_empty());
        b.bytes_mut().extend_from_slice(&[1; 100]);
        let p = Payload::from(b);
        assert_eq!(
            (p.as_ptr(), &p[..]),
            (at, &[1; 100][..]),
            "the same buffer again"
        );
    }

    #[test]
    fn the_free_buffers_hold_at_most_their_bound() {
        let mut spare = Spare::new(DEVICE_FREE, DEVICE_FREE_BYTES);
        for _ in 0..DEVICE_FREE + 10 {
            let mut b = PayloadBuf::with_capacity(64);
            b.bytes_mut().extend_from_slice(&[0; 64]);
            spare.give(Payload::from(b));
        }
        assert_eq!(spare.count, DEVICE_FREE);
        let mut spare = Spare::new(DEVICE_FREE, DEVICE_FREE_BYTES);
        let mut big = PayloadBuf::with_capacity((1 << CLASSES) + 1);
        big.bytes_mut().push(1);
        spare.give(Payload::from(big));
        assert_eq!(spare.count, 0, "too large to keep");
    }

    #[test]
    fn a_buffer_is_taken_from_its_size_class_or_a_little_above() {
        let mut spare = Spare::new(DEVICE_FREE, DEVICE_FREE_BYTES);
        for cap in [64, 4096, 1 << 16] {
            spare.give(Payload::from(PayloadBuf::with_capacity(cap)));
        }
        // 41 bytes: class 6 (64 bytes); 65 bytes would need class 7..=9, which is empty.
        assert_eq!(spare.take(41).capacity(), 64);
        assert_eq!(spare.take(65).capacity(), 128, "a new one, rounded up");
        assert_eq!(spare.take(1025).capacity(), 4096, "two classes up");
        assert_eq!(spare.take(60_000).capacity(), 1 << 16);
        assert_eq!((spare.count, spare.bytes), (0, 0));
    }
}
