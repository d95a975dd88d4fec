//! The slot memory of one connection, lent to the protocol core through
//! [`rsrdma_proto::SlotMemory`]: a registered send region, and either a registered receive
//! region of its own or a share of a listener's receive pool ([`super::pool`]).
//!
//! Each region is memory this module allocates and registers itself ([`rsrdma::Mr::register`]), so it
//! keeps the allocation's raw pointer and copies with `ptr::copy_nonoverlapping` (a plain
//! `memcpy`, fast even in a debug build, where [`rsrdma::Mr::read_at`]'s volatile word loop made the
//! copies the largest cost of a transfer). No Rust reference into a region is ever created:
//! the NIC reads send slots in flight and writes posted receive slots, and the core's contract
//! (it writes only send slots that are not in flight, reads only receive slots that completed
//! and are not reposted) keeps every copy off bytes the NIC touches at that moment. Neither
//! region is remotely accessible: the protocol uses SEND/RECV only.
//!
//! # Receives from a shared pool
//! The core believes it has `recv_slots` receive slots (the credits it grants); with a pool
//! they are *virtual*. A receive completion names a pool slot `P` (in its WR id);
//! [`Slots::take_recv`] binds a free virtual slot `v` to `P` and the core handles `v`; reads
//! of `v` read `P`. When the core hands `v` back (`Work::PostRecv`), [`Slots::release_recv`]
//! unbinds it and reposts `P` on the SRQ for any connection to use. Credits bound the
//! completions a peer can cause to the free virtual slots, so binding never runs out with a
//! well-behaved peer (a peer that overruns fails its connection, the slot goes back). Slots
//! still bound when the memory drops go back to the pool then (after the QP is gone).

use super::pool::{RecvAccount, RecvPool};
use super::region::Region;
use super::wr_id::{pool_slot_of, POOL_TAG};
use rsrdma::{AccessFlags, Pd, Sge};
use rsrdma_proto::SlotMemory;
use std::cell::Cell;
use std::sync::Arc;

/// Send and receive slots of one connection.
pub(crate) struct Slots {
    send: Region,
    recv: RecvSide,
    slot_size: usize,
    /// Set when the core asked for a range outside a region (a bug, never expected): the
    /// driver then fails the connection instead of panicking.
    fault: Cell<bool>,
    /// The listener's receive-memory account this connection counts in, with the bytes.
    account: Option<(Arc<RecvAccount>, usize)>,
}

/// Where the receive slots are.
enum RecvSide {
    /// A registered region of the connection's own, posted on its QP.
    Own(Region),
    /// Virtual slots bound to slots of a shared pool (module docs).
    Pooled(PoolShare),
}

/// A connection's view of a shared pool.
struct PoolShare {
    pool: Arc<RecvPool>,
    /// Virtual slot → the pool slot bound to it, or [`UNBOUND`].
    bound: Box<[u32]>,
    /// Virtual slots the core holds as posted and that no completion is bound to.
    free: Vec<u16>,
    /// Virtual slot → the bytes of its message, copied out of the pool slot it came in (which
    /// went back at once) while the pool was crowded ([`RecvPool::bind`]).
    copied: Box<[Option<Box<[u8]>>]>,
}

const UNBOUND: u32 = u32::MAX;

/// What to do with a receive slot the core hands back.
pub(crate) enum Repost {
    /// Post this SGE on the connection's QP.
    Own(Sge),
    /// Done: its pool slot went back to the shared pool.
    Pooled,
}

impl Slots {
    /// Registers `send_slots × slot_size` bytes (local access) and, without a pool,
    /// `recv_slots × slot_size` bytes (local write); with a pool, only the virtual slots'
    /// bookkeeping. `account` is the listener's receive-memory account.
    pub(crate) fn new(
        pd: &Pd,
        send_slots: u16,
        recv_slots: u16,
        slot_size: u32,
        pool: Option<Arc<RecvPool>>,
        account: Option<Arc<RecvAccount>>,
    ) -> rsrdma::Result<Slots> {
        let size = slot_size as usize;
        let recv = match pool {
            None => RecvSide::Own(Region::new(
                pd,
                usize::from(recv_slots) * size,
                AccessFlags::LOCAL_WRITE,
            )?),
            Some(pool) => {
                if pool.slot_size() < size {
                    return Err(rsrdma::Error::InvalidArgument(format!(
                        "pool slots of {} bytes are smaller than the {size}-byte slot size",
                        pool.slot_size()
                    )));
                }
                RecvSide::Pooled(PoolShare {
                    pool,
                    bound: vec![UNBOUND; usize::from(recv_slots)].into_boxed_slice(),
                    free: (0..recv_slots).rev().collect(),
                    copied: (0..recv_slots).map(|_| None).collect(),
                })
            }
        };
        let mut slots = Slots {
            send: Region::new(pd, usize::from(send_slots) * size, AccessFlags::NONE)?,
            recv,
            slot_size: size,
            fault: Cell::new(false),
            account: None,
        };
        if let Some(account) = account {
            let bytes = slots.recv_bytes();
            account.add(bytes);
            slots.account = Some((account, bytes));
        }
        Ok(slots)
    }

    /// The SGE of a send: the first `len` bytes of send slot `slot`.
    pub(crate) fn send_sge(&self, slot: u16, len: u32) -> Option<Sge> {
        let at = usize::from(slot) * self.slot_size;
        self.send.sge(at, len as usize)
    }

    /// The SGE of a receive into own slot `slot`; `None` with a pool.
    pub(crate) fn recv_sge(&self, slot: u16) -> Option<Sge> {
        let RecvSide::Own(recv) = &self.recv else {
            return None;
        };
        let at = usize::from(slot) * self.slot_size;
        recv.sge(at, self.slot_size)
    }

    /// The shared pool the receive slots come from, if any.
    pub(crate) fn pool(&self) -> Option<&Arc<RecvPool>> {
        match &self.recv {
            RecvSide::Own(_) => None,
            RecvSide::Pooled(share) => Some(&share.pool),
        }
    }

    /// Whether the receive slots come from a shared pool (nothing to post on the QP).
    pub(crate) fn pooled(&self) -> bool {
        matches!(self.recv, RecvSide::Pooled(_))
    }

    /// The core handed receive slot `slot` back: post it again (own), or unbind it and
    /// return its pool slot to the pool. `None` for a slot that is not the core's to hand
    /// back (a bug: the driver fails the connection).
    pub(crate) fn release_recv(&mut self, slot: u16) -> Option<Repost> {
        let share = match &mut self.recv {
            RecvSide::Own(_) => return self.recv_sge(slot).map(Repost::Own),
            RecvSide::Pooled(share) => share,
        };
        let b = share.bound.get_mut(usize::from(slot))?;
        let p = std::mem::replace(b, UNBOUND);
        if p != UNBOUND {
            share.pool.unbind();
            share.pool.give_back(p);
        }
        if let Some(copy) = share.copied[usize::from(slot)].take() {
            if let Some((account, _)) = &self.account {
                account.held(copy.len(), false);
            }
        }
        // The core hands back only a slot it held, which is not on the free list.
        share.free.push(slot);
        Some(Repost::Pooled)
    }

    /// The receive slot a completion with WR id `wr_id` filled, for the core: own slots
    /// are named in the id; a pool slot is bound to a free virtual slot. `None` when no
    /// virtual slot is free (the peer sent beyond its credits) or the id is not ours: the
    /// pool slot goes straight back, and the driver fails the connection. `landed`: the
    /// bytes a successful receive brought (`None` for a failed one); while the pool is
    /// crowded they are copied out and the pool slot goes back at once.
    pub(crate) fn take_recv(&mut self, wr_id: u64, landed: Option<usize>) -> Option<u16> {
        let share = match &mut self.recv {
            RecvSide::Own(_) if wr_id & POOL_TAG == 0 => return Some((wr_id & 0xffff) as u16),
            RecvSide::Own(_) => return None,
            RecvSide::Pooled(share) => share,
        };
        let p = pool_slot_of(wr_id)?;
        let Some(v) = share.free.pop() else {
            share.pool.give_back(p);
            return None;
        };
        let crowded = share.pool.bind();
        share.bound[usize::from(v)] = p;
        if let (true, Some(len)) = (crowded, landed) {
            let mut copy = vec![0u8; len.min(self.slot_size)].into_boxed_slice();
            if share.pool.read(p, 0, &mut copy) {
                if let Some((account, _)) = &self.account {
                    account.held(copy.len(), true);
                }
                share.copied[usize::from(v)] = Some(copy);
                share.bound[usize::from(v)] = UNBOUND;
                share.pool.unbind();
                share.pool.give_back(p);
            }
        }
        Some(v)
    }

    /// A receive completion reaped during teardown: its pool slot goes straight back.
    pub(crate) fn reaped_recv(&mut self, wr_id: u64) {
        if let (RecvSide::Pooled(share), Some(p)) = (&self.recv, pool_slot_of(wr_id)) {
            share.pool.give_back(p);
        }
    }

    /// Whether a copy ever fell outside a region.
    pub(crate) fn faulted(&self) -> bool {
        self.fault.get()
    }

    /// Registered bytes of this connection's own (send, and own receive) regions.
    pub(crate) fn registered(&self) -> usize {
        self.send.len
            + match &self.recv {
                RecvSide::Own(r) => r.len,
                RecvSide::Pooled(_) => 0,
            }
    }

    /// Receive-side bytes this connection holds: its receive region, or the virtual slots'
    /// bookkeeping (the pool is counted once, by the listener).
    pub(crate) fn recv_bytes(&self) -> usize {
        match &self.recv {
            RecvSide::Own(r) => r.len,
            RecvSide::Pooled(s) => {
                std::mem::size_of_val(&*s.bound) + s.free.capacity() * std::mem::size_of::<u16>()
            }
        }
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

impl Drop for Slots {
    fn drop(&mut self) {
        // The QP is gone before its memory drops (the driver's teardown), so the slots still
        // bound here are read by nobody: they go back to the pool.
        if let RecvSide::Pooled(share) = &mut self.recv {
            for b in share.bound.iter_mut() {
                let p = std::mem::replace(b, UNBOUND);
                if p != UNBOUND {
                    share.pool.unbind();
                    share.pool.give_back(p);
                }
            }
            let copies: usize = share.copied.iter().flatten().map(|c| c.len()).sum();
            if let (Some((account, _)), true) = (&self.account, copies > 0) {
                account.held(copies, false);
            }
        }
        if let Some((account, bytes)) = self.account.take() {
            account.remove(bytes);
        }
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
        match &self.recv {
            RecvSide::Own(recv) => {
                if let Some(at) = self.in_slot(recv, slot, offset, out.len()) {
                    // SAFETY: inside the receive allocation (checked); the core reads only a
                    // slot whose receive completed and that is not reposted, so the NIC does
                    // not write it while the slice lives; `out` is caller memory, which
                    // cannot overlap our private allocation.
                    let src = unsafe { std::slice::from_raw_parts(recv.ptr.add(at), out.len()) };
                    // A small message's bytes without a call into `memcpy`.
                    rsrdma_proto::memory::copy_small(out, src);
                }
            }
            RecvSide::Pooled(share) => {
                let copied = share.copied.get(usize::from(slot)).and_then(Option::as_ref);
                if let Some(copy) = copied {
                    match copy.get(offset..offset + out.len()) {
                        Some(src) => rsrdma_proto::memory::copy_small(out, src),
                        None => self.fault.set(true),
                    }
                    return;
                }
                let p = share.bound.get(usize::from(slot)).copied();
                let fits = offset + out.len() <= self.slot_size;
                match p {
                    Some(p) if p != UNBOUND && fits && share.pool.read(p, offset, out) => {}
                    _ => self.fault.set(true),
                }
            }
        }
    }
}
