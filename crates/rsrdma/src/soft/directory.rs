//! What a soft device publishes for the devices of its host that reach its memory directly
//! (`rsrdma_soft::Direct`): its queue pairs (state, rights, domain, peer) and its regions that
//! live in shared memory (key, domain, range, rights, and which memfd holds them). A peer reads
//! it, checks a one-sided request as the responder would (`rsrdma_soft::ResponderQp::allows`),
//! and does it in the region's memory, which it maps from `/proc/<pid>/fd/<n>`.
//!
//! The directory is a memfd of fixed layout, written only by its device (under the device
//! lock) and mapped read-only by peers: it is sealed against writable mappings once its owner
//! mapped it (`F_SEAL_FUTURE_WRITE`), so a peer cannot forge an entry. Each entry is a
//! sequence lock: an odd sequence number while it is being written, so a reader retries (a
//! few times, then leaves the request to the packet path) rather than act on half an entry.
//! A peer trusts nothing it reads beyond what it does to the owner's own memory: every range
//! is checked against the size of the memfd it maps.
//!
//! Only a peer of the same user gets the directory (its Unix socket's credentials say so),
//! and only such a peer can open another process's `/proc/<pid>/fd`: the kernel already
//! trusts it with that process's memory (ptrace). Others use the packet path, with the
//! responder's checks.

use super::fast_hash::FastMap;
use super::memfd;
use rsrdma_soft::{Access, MrEntry, MrTable, ResponderQp};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// "rsrdmaD1" in ASCII.
const MAGIC: u64 = 0x3144_616d_6472_7372;
const HEADER: usize = 4096;
const ENTRY: usize = 64;
/// Regions whose key's slot index is below this are published (the others take the packet
/// path).
const REGION_SLOTS: usize = 4096;
/// Queue pairs are published at `qpn % QP_SLOTS` (a queue pair whose slot another holds is
/// not).
const QP_SLOTS: usize = 4096;
const LEN: usize = HEADER + (REGION_SLOTS + QP_SLOTS) * ENTRY;
/// How often a reader tries an entry that is being written before it gives up.
const TRIES: usize = 16;

/// The 8-byte word at `off` of a directory mapping.
fn word(map: &memfd::Mapping, off: usize) -> &AtomicU64 {
    assert!(off % 8 == 0 && off + 8 <= map.len());
    // SAFETY: `off` is 8-byte aligned and inside the mapping (page aligned, `len` bytes),
    // which lives as long as the borrow; the memory is only ever accessed atomically. A
    // read-only mapping is only loaded from.
    unsafe { AtomicU64::from_ptr(map.base().add(off).cast()) }
}

fn region_at(index: usize) -> usize {
    HEADER + index * ENTRY
}

fn qp_at(qpn: u32) -> usize {
    HEADER + (REGION_SLOTS + qpn as usize % QP_SLOTS) * ENTRY
}

/// A region in shared memory, as its device publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SharedRegion {
    pub(super) mr: MrEntry,
    /// The memfd's descriptor number in the owner's process, and its inode (so a reused
    /// number is not taken for the old file).
    pub(super) fd_no: i32,
    pub(super) inode: u64,
    /// Where the region starts in the memfd.
    pub(super) offset: u64,
}

/// A queue pair as its device publishes it: what a responder checks, and where its peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SharedQp {
    pub(super) responder: ResponderQp,
    /// The device its peer queue pair lives on.
    pub(super) peer: SocketAddrV4,
}

/// The owner's side: written under the device lock.
pub(super) struct Directory {
    map: memfd::Mapping,
    fd: OwnedFd,
}

impl Directory {
    /// A new, empty directory.
    ///
    /// # Errors
    /// `memfd_create`'s, `ftruncate`'s, `mmap`'s or `fcntl`'s.
    pub(super) fn create() -> io::Result<Directory> {
        let fd = memfd::create(
            c"rsrdma-soft0-directory",
            LEN,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )?;
        let map = memfd::Mapping::new(&fd, LEN, true)?;
        word(&map, 0).store(MAGIC, Ordering::Release);
        // From now on nobody maps it writable (this mapping stays so).
        memfd::add_seals(&fd, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)?;
        Ok(Directory { map, fd })
    }

    /// The memfd, for a peer.
    pub(super) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn write(&self, at: usize, words: [u64; 7]) {
        let seq = word(&self.map, at);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (i, w) in words.iter().enumerate() {
            word(&self.map, at + 8 * (i + 1)).store(*w, Ordering::Relaxed);
        }
        seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }

    /// Publishes a region (its key's slot index below [`REGION_SLOTS`]; others are not).
    pub(super) fn publish_region(&self, r: &SharedRegion) {
        let Some(index) = slot_of(r.mr.key) else {
            return;
        };
        self.write(
            region_at(index),
            [
                u64::from(r.mr.key) | u64::from(r.mr.pd) << 32,
                r.mr.addr,
                r.mr.len,
                u64::from(r.mr.access.0) | u64::from(r.fd_no as u32) << 32,
                r.inode,
                r.offset,
                0,
            ],
        );
    }

    /// Withdraws the region with `key` (a later request through it takes the packet path).
    pub(super) fn withdraw_region(&self, key: u32) {
        if let Some(index) = slot_of(key) {
            self.write(region_at(index), [0; 7]);
        }
    }

    /// Publishes queue pair `q` (or withdraws it: `None`).
    pub(super) fn publish_qp(&self, qpn: u32, q: Option<&SharedQp>) {
        let words = match q {
            None => [0; 7],
            Some(q) => {
                let r = &q.responder;
                let flags = u64::from(r.ready) | u64::from(r.unreliable) << 1;
                [
                    u64::from(r.qp_num) | u64::from(r.dest_qpn) << 32,
                    u64::from(r.pd) | u64::from(r.access.0) << 32,
                    flags | 1 << 8,
                    u64::from(u32::from(*q.peer.ip())) << 16 | u64::from(q.peer.port()),
                    0,
                    0,
                    0,
                ]
            }
        };
        self.write(qp_at(qpn), words);
    }
}

/// The directory slot of a region key: its region table slot, when below [`REGION_SLOTS`].
fn slot_of(key: u32) -> Option<usize> {
    MrTable::slot_of(key).filter(|&i| i < REGION_SLOTS)
}

/// A peer's side: read-only.
pub(super) struct DirectoryView {
    map: memfd::Mapping,
}

impl DirectoryView {
    /// Maps a peer's directory, after checking its shape.
    ///
    /// # Errors
    /// `InvalidData` when it is not a directory of this version; `fstat`'s or `mmap`'s.
    pub(super) fn open(fd: OwnedFd) -> io::Result<DirectoryView> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "not a soft0 directory");
        let (_, size) = memfd::sealed_size(&fd)?;
        if size != LEN {
            return Err(bad());
        }
        let map = memfd::Mapping::new(&fd, LEN, false)?;
        if word(&map, 0).load(Ordering::Acquire) != MAGIC {
            return Err(bad());
        }
        Ok(DirectoryView { map })
    }

    fn read(&self, at: usize) -> Option<[u64; 7]> {
        let seq = word(&self.map, at);
        for _ in 0..TRIES {
            let s1 = seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut w = [0u64; 7];
            for (i, x) in w.iter_mut().enumerate() {
                *x = word(&self.map, at + 8 * (i + 1)).load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if seq.load(Ordering::Relaxed) == s1 {
                return Some(w);
            }
        }
        None
    }

    /// The region published under `key`, if any.
    pub(super) fn region(&self, key: u32) -> Option<SharedRegion> {
        let w = self.read(region_at(slot_of(key)?))?;
        if w[0] as u32 != key || key == 0 {
            return None;
        }
        Some(SharedRegion {
            mr: MrEntry {
                pd: (w[0] >> 32) as u32,
                addr: w[1],
                len: w[2],
                access: Access(w[3] as u32),
                key,
            },
            fd_no: (w[3] >> 32) as u32 as i32,
            inode: w[4],
            offset: w[5],
        })
    }

    /// Queue pair `qpn`, if it is published.
    pub(super) fn qp(&self, qpn: u32) -> Option<SharedQp> {
        let w = self.read(qp_at(qpn))?;
        if w[2] & 1 << 8 == 0 || w[0] as u32 != qpn {
            return None;
        }
        Some(SharedQp {
            responder: ResponderQp {
                qp_num: qpn,
                ready: w[2] & 1 != 0,
                access: Access((w[1] >> 32) as u32),
                pd: w[1] as u32,
                dest_qpn: (w[0] >> 32) as u32,
                unreliable: w[2] & 2 != 0,
            },
            peer: SocketAddrV4::new(Ipv4Addr::from((w[3] >> 16) as u32), w[3] as u16),
        })
    }
}

/// The most regions of one peer kept mapped.
const MAX_MAPS: usize = 256;

/// A peer's regions, mapped from its `/proc/<pid>/fd`, by descriptor number and inode.
pub(super) struct PeerMemory {
    pid: u32,
    maps: FastMap<(i32, u64), memfd::Mapping>,
}

impl PeerMemory {
    pub(super) fn new(pid: u32) -> PeerMemory {
        PeerMemory {
            pid,
            maps: FastMap::default(),
        }
    }

    /// The address in this process of `len` bytes at `addr` of region `r`, mapping its memfd
    /// first if needed; `None` when it cannot be mapped or the range lies outside the file
    /// (a directory that lies).
    pub(super) fn at(&mut self, r: &SharedRegion, addr: u64, len: u64) -> Option<*mut u8> {
        let key = (r.fd_no, r.inode);
        if let Some(m) = self.maps.get(&key) {
            return Self::inside(m, r, addr, len);
        }
        let m = self.map(r)?;
        // A mapping keeps its memfd alive after the peer freed the region: past a bound,
        // start afresh (the live regions are mapped again as they are used).
        if self.maps.len() >= MAX_MAPS {
            self.maps.clear();
        }
        Self::inside(self.maps.entry(key).or_insert(m), r, addr, len)
    }

    /// The address of `len` bytes at `addr` of region `r` in its mapping `m`, if inside.
    fn inside(m: &memfd::Mapping, r: &SharedRegion, addr: u64, len: u64) -> Option<*mut u8> {
        let off = r.offset.checked_add(addr.checked_sub(r.mr.addr)?)?;
        let end = off.checked_add(len)?;
        if end > m.len() as u64 {
            return None;
        }
        // SAFETY: `off + len <= m.len()`: inside the mapping.
        Some(unsafe { m.base().add(off as usize) })
    }

    fn map(&self, r: &SharedRegion) -> Option<memfd::Mapping> {
        let path = format!("/proc/{}/fd/{}\0", self.pid, r.fd_no);
        // SAFETY: a NUL-terminated path and constant flags.
        let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            tracing::debug!(
                pid = self.pid,
                error = %io::Error::last_os_error(),
                "soft0: a peer's region cannot be opened; its requests take the packet path"
            );
            return None;
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Sealed against shrinking (so a memfd, and one a mapping of which stays backed),
        // and the file the directory names, not another that took its descriptor number.
        let (inode, size) = memfd::sealed_size(&fd).ok()?;
        if inode != r.inode || size == 0 {
            return None;
        }
        memfd::Mapping::new(&fd, size, true).ok()
    }
}

/// What a device knows of a peer device of its host that shares its memory: its directory
/// and the regions mapped so far.
pub(super) struct PeerDirect {
    pub(super) view: DirectoryView,
    pub(super) memory: std::sync::Mutex<PeerMemory>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::SharedAlloc;

    fn region(key: u32, fd_no: i32, inode: u64) -> SharedRegion {
        SharedRegion {
            mr: MrEntry {
                pd: 3,
                addr: 0x10_0000,
                len: 8192,
                access: Access::REMOTE_WRITE | Access::REMOTE_READ,
                key,
            },
            fd_no,
            inode,
            offset: 0,
        }
    }

    #[test]
    fn a_peer_reads_what_the_owner_publishes_and_cannot_write_the_directory() {
        let dir = Directory::create().unwrap();
        let view = DirectoryView::open(dir.fd().try_clone().unwrap()).unwrap();
        let key = (5 + 1) << 8 | 7;
        assert_eq!(view.region(key), None);
        dir.publish_region(&region(key, 12, 345));
        assert_eq!(view.region(key), Some(region(key, 12, 345)));
        // Another generation of the same slot is another key: not this region.
        assert_eq!(view.region(key + 1), None);
        dir.withdraw_region(key);
        assert_eq!(view.region(key), None);
        let q = SharedQp {
            responder: ResponderQp {
                qp_num: 4100,
                ready: true,
                access: Access::REMOTE_READ,
                pd: 3,
                dest_qpn: 17,
                unreliable: false,
            },
            peer: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40000),
        };
        dir.publish_qp(4100, Some(&q));
        assert_eq!(view.qp(4100), Some(q));
        // The slot's other queue pair number is not this one.
        assert_eq!(view.qp(4100 - QP_SLOTS as u32), None);
        dir.publish_qp(4100, None);
        assert_eq!(view.qp(4100), None);
        // Sealed: nobody maps it writable any more (the owner's mapping stays so).
        let fd = dir.fd().try_clone().unwrap();
        let e = memfd::Mapping::new(&fd, LEN, true)
            .err()
            .expect("a writable mapping is refused");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn a_peers_region_is_mapped_by_its_inode_and_only_inside_its_file() {
        let alloc = SharedAlloc::new(8192).unwrap();
        let addr = alloc.ptr() as u64;
        let (fd_no, inode, offset) = crate::soft::shared_mem::lookup(addr, 8192).unwrap();
        assert_eq!(offset, 0);
        let mut r = region(1 << 8, fd_no, inode);
        r.mr.addr = addr;
        // This very process plays the peer, through its own /proc/<pid>/fd.
        let mut peer = PeerMemory::new(std::process::id());
        let at = peer.at(&r, addr + 100, 8).unwrap();
        // SAFETY: 8 bytes inside the mapping `at` points into.
        unsafe { std::ptr::copy_nonoverlapping(b"through!".as_ptr(), at, 8) };
        let mut seen = [0u8; 8];
        // SAFETY: the allocation is 8192 bytes long and alive.
        unsafe { std::ptr::copy_nonoverlapping(alloc.ptr().add(100), seen.as_mut_ptr(), 8) };
        assert_eq!(
            &seen, b"through!",
            "the same memory, seen from both mappings"
        );
        // Past the file's end: refused, whatever the directory says of the region's length.
        r.mr.len = 1 << 20;
        assert!(peer.at(&r, addr + 8190, 8).is_none());
        // Another file under the same descriptor number is not mapped.
        let mut other = region(2 << 8, fd_no, inode + 1);
        other.mr.addr = addr;
        assert!(PeerMemory::new(std::process::id())
            .at(&other, addr, 8)
            .is_none());
    }
}
