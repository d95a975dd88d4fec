//! How the core reaches slot memory that the driver owns and registers.
//!
//! The driver allocates and registers two regions: `send_slots × slot_size` bytes (local
//! access) and `recv_slots × slot_size` bytes (local write). Slot `i` of a region starts at
//! byte `i × slot_size`. A `Work::PostSend { slot: Some(i), len, .. }` is one SGE
//! `{send_base + i × slot_size, len, send_lkey}`; a `Work::PostRecv { slot: i }` is one SGE
//! `{recv_base + i × slot_size, slot_size, recv_lkey}`. The core touches memory only through
//! this trait, by copies: it writes a frame into a send slot that is not in flight, and reads a
//! receive slot only between its completion and its repost. So a driver over registered memory
//! hands out no references into memory the NIC may write, and the only copy on the send path
//! is the one into the send slot.
//!
//! A *lent* message ([`crate::Conn::send_msg_lent`]) is not copied at all: its memory is the
//! driver's (registered, named by address and lkey as plain numbers), the core writes only
//! each fragment's header into a send slot, and `Work::PostSend { lent: Some(p), .. }` is two
//! SGEs: `{send_base + i × slot_size, HEADER_LEN, send_lkey}` then `{p.addr, p.len, p.lkey}`.

/// Slot memory lent by the driver.
pub trait SlotMemory {
    /// Copies `bytes` into send slot `slot` at `offset`. The core never writes past
    /// `slot_size` nor into a slot that is in flight.
    fn write_send(&mut self, slot: u16, offset: usize, bytes: &[u8]);

    /// Copies bytes of receive slot `slot` at `offset` into `out`. The core reads only a slot
    /// whose receive completed and that it has not reposted yet.
    fn read_recv(&self, slot: u16, offset: usize, out: &mut [u8]);
}

/// Plain heap memory, for tests, simulations and a software transport.
#[derive(Debug, Clone)]
pub struct VecSlots {
    slot_size: usize,
    send: Vec<u8>,
    recv: Vec<u8>,
}

impl VecSlots {
    /// Zeroed memory for the given geometry.
    pub fn new(send_slots: u16, recv_slots: u16, slot_size: u32) -> Self {
        let slot_size = slot_size as usize;
        Self {
            slot_size,
            send: vec![0; send_slots as usize * slot_size],
            recv: vec![0; recv_slots as usize * slot_size],
        }
    }

    /// Memory for `config`'s geometry.
    pub fn for_config(config: &crate::Config) -> Self {
        Self::new(config.send_slots, config.recv_slots, config.slot_size)
    }

    /// A whole send slot (what a NIC would read).
    pub fn send_slot(&self, slot: u16) -> &[u8] {
        let at = slot as usize * self.slot_size;
        &self.send[at..at + self.slot_size]
    }

    /// A whole receive slot (what a NIC would write).
    pub fn recv_slot_mut(&mut self, slot: u16) -> &mut [u8] {
        let at = slot as usize * self.slot_size;
        &mut self.recv[at..at + self.slot_size]
    }
}

impl SlotMemory for VecSlots {
    fn write_send(&mut self, slot: u16, offset: usize, bytes: &[u8]) {
        let at = slot as usize * self.slot_size + offset;
        self.send[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn read_recv(&self, slot: u16, offset: usize, out: &mut [u8]) {
        let at = slot as usize * self.slot_size + offset;
        out.copy_from_slice(&self.recv[at..at + out.len()]);
    }
}

/// Copies `src` into `dst` (the same length): up to 64 bytes with a few fixed-size moves (the
/// first and the last `N` bytes, which overlap), above that with `copy_from_slice`. A small
/// message's copies (into the inline staging, out of its receive slot) are then no call into
/// the C library's `memcpy` (through the PLT), which on a round trip's path costs more than
/// the bytes: measured in the VM, where each call and return of the path is a lookup in the
/// emulator's jump cache.
///
/// # Panics
/// If the lengths differ, as `copy_from_slice`.
#[inline(always)]
pub fn copy_small(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    assert_eq!(dst.len(), n, "copy_small: lengths differ");
    match n {
        0 => {}
        1..=3 => {
            dst[0] = src[0];
            dst[n / 2] = src[n / 2];
            dst[n - 1] = src[n - 1];
        }
        4..=7 => ends::<4>(dst, src),
        8..=15 => ends::<8>(dst, src),
        16..=31 => ends::<16>(dst, src),
        32..=64 => ends::<32>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// The first and the last `N` bytes of `src` (`N <= len <= 2N`), which cover all of it.
#[inline(always)]
fn ends<const N: usize>(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    let head: [u8; N] = src[..N].try_into().expect("N <= len");
    let tail: [u8; N] = src[n - N..].try_into().expect("N <= len");
    dst[..N].copy_from_slice(&head);
    dst[n - N..].copy_from_slice(&tail);
}

#[cfg(test)]
mod tests {
    use super::copy_small;

    #[test]
    fn copy_small_copies_every_length_exactly() {
        let src: Vec<u8> = (0..200u8)
            .map(|b| b.wrapping_mul(7).wrapping_add(1))
            .collect();
        for n in 0..=130 {
            let mut dst = vec![0u8; n];
            copy_small(&mut dst, &src[3..3 + n]);
            assert_eq!(dst, &src[3..3 + n], "length {n}");
        }
    }
}
