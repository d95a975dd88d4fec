//! A one-way byte stream between two processes of one host, through shared memory: the
//! pipe soft0 uses in place of a loopback TCP connection when its peer device lives on the
//! same host ([`super::link`]). One process writes (the producer), the other reads (the
//! consumer); neither makes a system call while the other keeps up, which is the point: a
//! packet crosses with one copy in and one copy out, as over TCP, but without the kernel.
//!
//! The memory is a sealed memfd (it cannot shrink under the peer's mapping, which would
//! turn its next access into SIGBUS), passed to the consumer over a Unix socket. Its first
//! page holds the ring's header, each field on its own cache line:
//!
//! | offset | field | written by |
//! |---|---|---|
//! | 0 | magic, version, capacity | the producer, before the consumer maps it |
//! | 64 | `head`: bytes written so far (u64) | the producer |
//! | 128 | `tail`: bytes read so far (u64) | the consumer |
//! | 192 | `consumer_sleeping` (u32) | the consumer |
//! | 256 | `producer_waiting` (u32) | the producer |
//!
//! then `capacity` bytes of data (a power of two; byte `i` of the stream lives at
//! `i % capacity`).
//!
//! A packet starts on a cache line: after one, the producer leaves the rest of its last line
//! unused ([`Producer::try_push`], [`Producer::pad_len`]) and the consumer skips it
//! ([`Consumer::skip_pad`]). A small packet (a latency test's 56 bytes) then costs the reader
//! one line fetched from the writer's core, not two half the time: measured in a ping-pong of
//! two pinned threads through two rings, 56-byte packets crossed in about 320 ns one way where
//! 64-byte ones took about 250.
//!
//! # Trust
//! The peer is another process, maybe a faulty one: it can write anything anywhere in the
//! shared pages at any time. So each side keeps its own position privately and only
//! publishes it; the peer's position is checked on every read (a producer ahead of the
//! consumer by more than the capacity, or a consumer ahead of the producer, is a broken
//! link, [`Corrupt`]); data is copied out with raw-pointer copies into the reader's own
//! memory before anything looks at it, so Rust never holds a reference to memory the peer
//! writes (the atomics are the exception, as atomics are meant to be shared).
//!
//! # Waking
//! A side that finds nothing to do may sleep on an eventfd, after saying so in its flag
//! (`consumer_sleeping`, `producer_waiting`); the other side, after publishing its position,
//! signals the eventfd only when the flag is set. Both sides order "publish, then look at
//! the flag" and "set the flag, then look at the position" with sequentially consistent
//! fences, so a sleeper is never left with work waiting (the two-flag handshake of a
//! futex-based queue).

use super::memfd;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// "rsrdmaR1" in ASCII.
const MAGIC: u64 = 0x3152_616d_6472_7372;
/// 2: requests may carry acknowledgements (`rsrdma_soft::Packet::ack`), which a peer of
/// version 1 would not see; the two then talk over TCP, where no acknowledgement is held.
/// 3: packets start on a cache line (a peer of version 2 would read the padding as data).
const VERSION: u32 = 3;
/// A cache line: where each packet starts.
pub(super) const LINE: usize = 64;
/// The header page.
const HEADER: usize = 4096;
const OFF_HEAD: usize = 64;
const OFF_TAIL: usize = 128;
const OFF_CONSUMER_SLEEPING: usize = 192;
const OFF_PRODUCER_WAITING: usize = 256;
/// The capacities a consumer accepts.
const MIN_CAPACITY: usize = 4096;
const MAX_CAPACITY: usize = 1 << 30;

/// The bytes from stream position `pos` to the next cache line.
fn pad_after(pos: u64) -> usize {
    (pos.wrapping_neg() as usize) & (LINE - 1)
}

/// The peer broke the ring's rules (a position out of range): the link is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Corrupt;

impl From<Corrupt> for io::Error {
    fn from(_: Corrupt) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer broke the shared ring's positions",
        )
    }
}

/// A mapping of a ring's memfd.
struct Mapping {
    map: memfd::Mapping,
    capacity: usize,
    fd: OwnedFd,
}

impl Mapping {
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the header's 8-byte aligned fields, inside the mapping
        // (page aligned, at least a page long), which lives as long as `self`; the memory is
        // only ever accessed atomically (by both processes).
        unsafe { AtomicU64::from_ptr(self.map.base().add(off).cast()) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `u64_at`.
        unsafe { AtomicU32::from_ptr(self.map.base().add(off).cast()) }
    }

    fn head(&self) -> &AtomicU64 {
        self.u64_at(OFF_HEAD)
    }

    fn tail(&self) -> &AtomicU64 {
        self.u64_at(OFF_TAIL)
    }

    /// Where stream position `pos` lives in the data area, and how many of `want` bytes
    /// from there lie before the area's end (the rest wraps to its start).
    fn span(&self, pos: u64, want: usize) -> (*mut u8, usize) {
        let i = (pos as usize) & (self.capacity - 1);
        // SAFETY: `i < capacity` and the data area is `capacity` bytes after the header.
        let at = unsafe { self.map.base().add(HEADER + i) };
        (at, want.min(self.capacity - i))
    }
}

/// Whether a ring may hold bytes, asked by a poller that does not hold its consumer: an
/// empty ring is then passed over with no lock taken (most polls find every ring empty).
pub(super) struct Peek(Arc<Mapping>);

impl Peek {
    /// Whether the producer published bytes past what the consumer last released. A hint
    /// only (the peer can write both positions): the consumer, under its lock, decides. At
    /// rest (no read under way) the released position is the consumer's own, so an empty
    /// ring says false.
    pub(super) fn maybe_ready(&self) -> bool {
        self.0.head().load(Ordering::Acquire) != self.0.tail().load(Ordering::Relaxed)
    }
}

/// The writing end of a ring.
pub(super) struct Producer {
    map: Mapping,
    /// Bytes written so far (what `head` says, kept here so the peer cannot change it).
    head: u64,
    /// The consumer's position when the producer last looked at it (it only grows): room is
    /// counted from it, and `tail` is read again only when that room is too small. Reading
    /// `tail` on every packet moved its cache line between the two cores twice a packet
    /// (the consumer writes it on every read), on the way of every packet.
    tail_seen: u64,
}

/// The reading end of a ring.
pub(super) struct Consumer {
    map: Arc<Mapping>,
    /// Bytes read so far.
    tail: u64,
}

impl Producer {
    /// A new ring of `capacity` bytes (a power of two, at least a page), in a sealed memfd.
    ///
    /// # Errors
    /// `memfd_create`'s, `ftruncate`'s, `fcntl`'s or `mmap`'s.
    pub(super) fn create(capacity: usize) -> io::Result<Producer> {
        assert!(capacity.is_power_of_two() && (MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity));
        let len = HEADER + capacity;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        let fd = memfd::create(c"rsrdma-soft0-ring", len, seals)?;
        let map = Mapping {
            map: memfd::Mapping::new(&fd, len, true)?,
            capacity,
            fd,
        };
        map.u64_at(0).store(MAGIC, Ordering::Relaxed);
        map.u32_at(8).store(VERSION, Ordering::Relaxed);
        map.u32_at(12).store(capacity as u32, Ordering::Relaxed);
        Ok(Producer {
            map,
            head: 0,
            tail_seen: 0,
        })
    }

    /// The capacity in bytes.
    pub(super) fn capacity(&self) -> usize {
        self.map.capacity
    }

    /// Publishes a head past the capacity, as a faulty producer might.
    #[cfg(test)]
    pub(super) fn break_head(&self) {
        self.map
            .head()
            .store(self.head + 2 * self.map.capacity as u64, Ordering::Release);
    }

    /// Publishes a tail ahead of what was written, as a faulty consumer might, and forgets
    /// the one seen, so that the next push reads it.
    #[cfg(test)]
    pub(super) fn break_tail(&mut self) {
        self.map.tail().store(self.head + 1, Ordering::Release);
        self.tail_seen = self.head.wrapping_sub(self.map.capacity as u64);
    }

    /// The memfd, to hand to the consumer.
    pub(super) fn fd(&self) -> &OwnedFd {
        &self.map.fd
    }

    /// Room left for writing: counted from the consumer's position last seen, or, when
    /// that leaves less than `want` bytes, from its published position now.
    fn room(&mut self, want: usize) -> Result<usize, Corrupt> {
        // `tail_seen` passed the checks below when it was read: `head - tail_seen` is at
        // most the capacity (exactly it after `forget_tail`).
        let room = self.map.capacity - self.head.wrapping_sub(self.tail_seen) as usize;
        if room >= want {
            return Ok(room);
        }
        let tail = self.map.tail().load(Ordering::Acquire);
        let used = self.head.checked_sub(tail).ok_or(Corrupt)?;
        if used > self.map.capacity as u64 {
            return Err(Corrupt);
        }
        self.tail_seen = tail;
        Ok(self.map.capacity - used as usize)
    }

    /// Copies `data` at the private head (the caller checked the room).
    fn copy_in(&mut self, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let (at, n) = self.map.span(self.head, data.len() - done);
            // SAFETY: `at..at + n` lies inside the data area (`n` stops at its end), which
            // the consumer does not read until `head` is published past it; `data` is the
            // caller's own memory, which cannot overlap the mapping's.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(done), at, n) };
            done += n;
            self.head += n as u64;
        }
    }

    /// Writes all of `parts` (one packet) and the padding to the next cache line if there is
    /// room for all of it, and publishes it; writes nothing and returns false if there is
    /// not.
    ///
    /// # Errors
    /// [`Corrupt`] when the consumer's position is out of range.
    pub(super) fn try_push(&mut self, parts: &[&[u8]]) -> Result<bool, Corrupt> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let padded = total + pad_after(self.head + total as u64);
        if padded > self.room(padded)? {
            return Ok(false);
        }
        for p in parts {
            self.copy_in(p);
        }
        self.head += (padded - total) as u64;
        self.map.head().store(self.head, Ordering::Release);
        Ok(true)
    }

    /// The padding a packet that ends here needs, to be written with [`Producer::push_some`]
    /// (any bytes: the consumer skips them) by a writer that writes packets in pieces.
    pub(super) fn pad_len(&self) -> usize {
        pad_after(self.head)
    }

    /// Writes as much of `data` as there is room for and publishes it; returns how much.
    ///
    /// # Errors
    /// [`Corrupt`] when the consumer's position is out of range.
    pub(super) fn push_some(&mut self, data: &[u8]) -> Result<usize, Corrupt> {
        let n = data.len().min(self.room(data.len())?);
        if n > 0 {
            self.copy_in(&data[..n]);
            self.map.head().store(self.head, Ordering::Release);
        }
        Ok(n)
    }

    /// After publishing: whether the consumer said it sleeps (then signal it).
    pub(super) fn consumer_sleeping(&self) -> bool {
        fence(Ordering::SeqCst);
        self.map
            .u32_at(OFF_CONSUMER_SLEEPING)
            .load(Ordering::Relaxed)
            != 0
    }

    /// Says (or unsays) that the producer waits for room; saying it is followed by a fence,
    /// so the caller's next look at the room sees what the consumer freed before it looked
    /// at the flag.
    pub(super) fn set_waiting(&self, waiting: bool) {
        self.map
            .u32_at(OFF_PRODUCER_WAITING)
            .store(u32::from(waiting), Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Whether there is room for `n` bytes now.
    pub(super) fn has_room(&mut self, n: usize) -> Result<bool, Corrupt> {
        let n = n.min(self.map.capacity);
        Ok(self.room(n)? >= n)
    }
}

impl Consumer {
    /// Maps the ring in `fd`, after checking that it is one: sealed against shrinking, of a
    /// size that matches its header.
    ///
    /// # Errors
    /// `InvalidData` when it is not a ring this version reads; `fstat`'s, `fcntl`'s or
    /// `mmap`'s errors.
    pub(super) fn open(fd: OwnedFd) -> io::Result<Consumer> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let (_, len) = memfd::sealed_size(&fd)?;
        let capacity = len.saturating_sub(HEADER);
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(bad("the shared ring has a bad size"));
        }
        let map = Mapping {
            map: memfd::Mapping::new(&fd, len, true)?,
            capacity,
            fd,
        };
        let magic = map.u64_at(0).load(Ordering::Acquire);
        let version = map.u32_at(8).load(Ordering::Relaxed);
        let said = map.u32_at(12).load(Ordering::Relaxed) as usize;
        if magic != MAGIC || version != VERSION || said != capacity {
            return Err(bad("not a shared ring of this version"));
        }
        let tail = map.tail().load(Ordering::Relaxed);
        Ok(Consumer {
            map: Arc::new(map),
            tail,
        })
    }

    /// A look at the ring that needs no hold of its consumer ([`Peek::maybe_ready`]).
    pub(super) fn peek(&self) -> Peek {
        Peek(self.map.clone())
    }

    /// How far it has read (bytes since the ring was made): it moves whenever anyone reads.
    pub(super) fn position(&self) -> u64 {
        self.tail
    }

    /// Skips the padding after a packet (to the next cache line), as much of it as was
    /// written; returns whether the position is on a line now, where a packet starts.
    ///
    /// # Errors
    /// [`Corrupt`] when the producer's position is out of range.
    pub(super) fn skip_pad(&mut self) -> Result<bool, Corrupt> {
        let pad = pad_after(self.tail);
        if pad == 0 {
            return Ok(true);
        }
        let k = pad.min(self.available()?);
        self.tail += k as u64;
        Ok(k == pad)
    }

    /// Bytes waiting to be read.
    ///
    /// # Errors
    /// [`Corrupt`] when the producer's position is out of range.
    pub(super) fn available(&self) -> Result<usize, Corrupt> {
        let head = self.map.head().load(Ordering::Acquire);
        let ready = head.checked_sub(self.tail).ok_or(Corrupt)?;
        if ready > self.map.capacity as u64 {
            return Err(Corrupt);
        }
        Ok(ready as usize)
    }

    /// Copies up to `out.len()` waiting bytes into `out` (without publishing that they were
    /// read: [`Consumer::release`] does); returns how many.
    ///
    /// # Errors
    /// [`Corrupt`] when the producer's position is out of range.
    pub(super) fn read(&mut self, out: &mut [u8]) -> Result<usize, Corrupt> {
        // SAFETY: `out` is valid for writes of its length.
        unsafe { self.read_raw(out.as_mut_ptr(), out.len()) }
    }

    /// [`Consumer::read`] into the spare capacity of `v`, up to `limit` more bytes.
    ///
    /// # Errors
    /// As [`Consumer::read`].
    pub(super) fn read_into_vec(
        &mut self,
        v: &mut Vec<u8>,
        limit: usize,
    ) -> Result<usize, Corrupt> {
        let want = limit.min(v.capacity() - v.len());
        // SAFETY: the spare capacity holds at least `want` bytes.
        let n = unsafe { self.read_raw(v.as_mut_ptr().add(v.len()), want) }?;
        // SAFETY: `read_raw` initialised `n` bytes past the old length.
        unsafe { v.set_len(v.len() + n) };
        Ok(n)
    }

    /// # Safety
    /// `out` is valid for writes of `len` bytes and does not overlap the ring.
    unsafe fn read_raw(&mut self, out: *mut u8, len: usize) -> Result<usize, Corrupt> {
        let n = len.min(self.available()?);
        let mut done = 0;
        while done < n {
            let (at, k) = self.map.span(self.tail, n - done);
            // SAFETY: `at..at + k` lies inside the data area, published by the producer (it
            // does not write there again until `tail` passes it); `out` is the caller's, for
            // `len >= n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(at, out.add(done), k) };
            done += k;
            self.tail += k as u64;
        }
        Ok(n)
    }

    /// Publishes what was read, so the producer may write there again; returns whether the
    /// producer said it waits for room (then signal it).
    pub(super) fn release(&self) -> bool {
        self.map.tail().store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        self.map
            .u32_at(OFF_PRODUCER_WAITING)
            .load(Ordering::Relaxed)
            != 0
    }

    /// Says (or unsays) that the consumer sleeps; saying it is followed by a fence, so the
    /// caller's next look at [`Consumer::available`] sees what the producer published
    /// before it looked at the flag.
    pub(super) fn set_sleeping(&self, sleeping: bool) {
        self.map
            .u32_at(OFF_CONSUMER_SLEEPING)
            .store(u32::from(sleeping), Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn pair(capacity: usize) -> (Producer, Consumer) {
        let p = Producer::create(capacity).unwrap();
        let fd = p.fd().try_clone().unwrap();
        (p, Consumer::open(fd).unwrap())
    }

    #[test]
    fn bytes_cross_in_order_across_the_wrap() {
        let (mut p, mut c) = pair(4096);
        let mut sent = Vec::new();
        let mut got = Vec::new();
        let mut next = 0u8;
        for round in 0..200 {
            // Sizes that do not divide the capacity, so writes and reads straddle its end.
            let chunk: Vec<u8> = (0..(round * 37) % 3000 + 1)
                .map(|_| {
                    next = next.wrapping_add(1);
                    next
                })
                .collect();
            let n = p.push_some(&chunk).unwrap();
            sent.extend_from_slice(&chunk[..n]);
            let mut buf = vec![0u8; (round * 53) % 2500 + 1];
            let k = c.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..k]);
            c.release();
        }
        let mut buf = vec![0u8; 4096];
        let k = c.read(&mut buf).unwrap();
        got.extend_from_slice(&buf[..k]);
        assert_eq!(got, sent);
        assert!(
            sent.len() > 3 * 4096,
            "the test wrapped the ring a few times"
        );
    }

    #[test]
    fn a_packet_goes_whole_or_not_at_all() {
        let (mut p, mut c) = pair(4096);
        assert!(p.try_push(&[&[1; 3000], &[2; 1000]]).unwrap());
        // 4000 bytes and 32 of padding: 64 left, a 100-byte packet does not go, and nothing
        // of it is written.
        assert!(!p.try_push(&[&[3; 50], &[4; 50]]).unwrap());
        assert_eq!(c.available().unwrap(), 4032);
        let mut v = Vec::with_capacity(4000);
        assert_eq!(c.read_into_vec(&mut v, 4000).unwrap(), 4000);
        assert!(v[..3000].iter().all(|&b| b == 1) && v[3000..].iter().all(|&b| b == 2));
        assert!(c.skip_pad().unwrap());
        assert_eq!(c.available().unwrap(), 0);
        assert!(!c.release(), "the producer did not say it waits");
        assert!(p.try_push(&[&[3; 50], &[4; 50]]).unwrap());
    }

    #[test]
    fn packets_start_on_a_cache_line_whichever_way_they_were_written() {
        let (mut p, mut c) = pair(4096);
        // Whole, with its padding.
        assert!(p.try_push(&[&[1; 48], &[2; 8]]).unwrap());
        assert_eq!(c.available().unwrap(), LINE);
        // In pieces, the padding last and in two goes: the reader skips what has come.
        assert_eq!(p.push_some(&[3; 70]).unwrap(), 70);
        let mut v = vec![0u8; 56];
        assert_eq!(c.read(&mut v).unwrap(), 56);
        assert!(v[..48].iter().all(|&b| b == 1) && v[48..].iter().all(|&b| b == 2));
        assert!(c.skip_pad().unwrap());
        let mut w = vec![0u8; 70];
        assert_eq!(c.read(&mut w).unwrap(), 70);
        assert!(w.iter().all(|&b| b == 3));
        assert_eq!(p.pad_len(), 3 * LINE - 64 - 70);
        assert_eq!(p.push_some(&[0; 20]).unwrap(), 20);
        assert!(!c.skip_pad().unwrap(), "only part of the padding came");
        let rest = p.pad_len();
        assert_eq!(p.push_some(&vec![0; rest]).unwrap(), rest);
        assert_eq!(p.pad_len(), 0);
        assert!(c.skip_pad().unwrap());
        assert!(p.try_push(&[&[4; 8]]).unwrap());
        assert_eq!(c.position(), 3 * LINE as u64);
        assert_eq!(c.read(&mut v[..8]).unwrap(), 8);
        assert_eq!(&v[..8], &[4; 8]);
    }

    #[test]
    fn positions_out_of_range_break_the_link_instead_of_reading_past_the_data() {
        let (mut p, c) = pair(4096);
        // A producer that claims more than the capacity was written.
        c.map.head().store(5000, Ordering::Release);
        assert_eq!(c.available(), Err(Corrupt));
        // A consumer that claims to have read more than was written: seen when the producer
        // next needs its position, here to fill the ring past what it knows is free.
        assert_eq!(p.push_some(&[0; 4000]), Ok(4000));
        p.map.tail().store(5000, Ordering::Release);
        assert_eq!(p.push_some(&[0; 8]), Ok(8), "room it knew of needs no look");
        assert_eq!(p.push_some(&[0; 100]), Err(Corrupt));
    }

    #[test]
    fn only_a_sealed_ring_of_a_known_shape_is_mapped() {
        // An ordinary memfd of the right size, not sealed: refused.
        // SAFETY: a NUL-terminated name and constant flags.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a descriptor just opened.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a plain call on our own descriptor.
        let sized = unsafe { libc::ftruncate(raw, (HEADER + 4096) as libc::off_t) };
        assert_eq!(sized, 0);
        let e = Consumer::open(fd).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // A sealed ring whose header was overwritten: refused.
        let p = Producer::create(4096).unwrap();
        p.map.u64_at(0).store(1, Ordering::Relaxed);
        let e = Consumer::open(p.fd().try_clone().unwrap()).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn the_flags_are_seen_after_the_positions() {
        let (mut p, c) = pair(4096);
        assert!(!p.consumer_sleeping());
        c.set_sleeping(true);
        assert!(p.try_push(&[&[9; 10]]).unwrap());
        assert!(p.consumer_sleeping());
        p.set_waiting(true);
        assert!(c.release());
        p.set_waiting(false);
        assert!(!c.release());
    }
}
