//! How the core reaches memory: only through [`Memory`], and only at addresses its
//! [`crate::MrTable`] checked first.

use crate::PayloadBuf;

/// The memory a device's queue pairs work on, addressed by the virtual addresses of its
/// memory regions. The core calls it only for ranges that lie inside a region whose key,
/// protection domain and access it checked, so an implementation over the process's own
/// memory may rely on that (the device keeps each region's memory alive and in place while
/// it is registered).
pub trait Memory {
    /// Copies `out.len()` bytes at `addr` into `out`.
    fn read(&self, addr: u64, out: &mut [u8]);
    /// An empty buffer with room for `capacity` bytes, for a payload the core is about to
    /// gather: a device that reuses the memory of payloads it is done with
    /// ([`crate::Payload::try_into_buf`]) hands one out here (the default allocates).
    fn payload_buffer(&self, capacity: usize) -> PayloadBuf {
        PayloadBuf::with_capacity(capacity)
    }
    /// Appends the `len` bytes at `addr` to `out`. The default zeroes the room first and
    /// reads into it; a device that copies from raw memory may fill the vector's spare
    /// capacity instead (a payload is written once, not twice).
    fn read_append(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + len, 0);
        self.read(addr, &mut out[at..]);
    }
    /// Copies `data` to `addr`.
    fn write(&mut self, addr: u64, data: &[u8]);
    /// The 8-byte word at `addr` (8-byte aligned), read and replaced by `f` of it as one
    /// atomic step; returns the value before.
    fn atomic(&mut self, addr: u64, f: &mut dyn FnMut(u64) -> u64) -> u64;
}

/// Memory as one vector that starts at address `base`: for tests, and for a device whose
/// regions are copies.
#[derive(Debug, Clone)]
pub struct VecMemory {
    /// The first address.
    pub base: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl VecMemory {
    /// `len` zero bytes at `base`.
    pub fn new(base: u64, len: usize) -> VecMemory {
        VecMemory {
            base,
            bytes: vec![0; len],
        }
    }

    fn at(&self, addr: u64, len: usize) -> std::ops::Range<usize> {
        let off = addr
            .checked_sub(self.base)
            .and_then(|o| usize::try_from(o).ok())
            .expect("an address below the memory");
        let end = off.checked_add(len).expect("a range past the end");
        assert!(
            end <= self.bytes.len(),
            "a range past the end of the memory"
        );
        off..end
    }
}

impl Memory for VecMemory {
    fn read(&self, addr: u64, out: &mut [u8]) {
        let r = self.at(addr, out.len());
        out.copy_from_slice(&self.bytes[r]);
    }

    fn write(&mut self, addr: u64, data: &[u8]) {
        let r = self.at(addr, data.len());
        self.bytes[r].copy_from_slice(data);
    }

    fn atomic(&mut self, addr: u64, f: &mut dyn FnMut(u64) -> u64) -> u64 {
        let r = self.at(addr, 8);
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.bytes[r.clone()]);
        let old = u64::from_le_bytes(word);
        self.bytes[r].copy_from_slice(&f(old).to_le_bytes());
        old
    }
}
