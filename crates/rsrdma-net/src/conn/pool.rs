//! A shared receive pool: one SRQ and one registered region of receive slots that every
//! connection a [`crate::Listener`] accepts receives into ([`crate::SharedRecv`]), so the
//! listener's receive memory is O(pool), not O(connections).
//!
//! - **Memory.** One page-aligned allocation of `pool_slots × slot_size` bytes, registered
//!   once with LOCAL_WRITE only (never remotely accessible), on the protection domain every
//!   accepted QP of that device is created in (a receive's MR must be on its QP's domain).
//! - **Posting.** Every slot is posted on the SRQ when the pool is made; a slot is reposted
//!   as soon as the connection that received into it is done with it
//!   ([`super::slots::Slots::release_recv`]), from whichever thread runs that connection's
//!   step (`ibv_post_srq_recv` is thread-safe). A receive's WR id carries `RECV_TAG |
//!   POOL_TAG | slot`.
//! - **Credits and an empty pool.** Each connection still grants its peer `recv_slots`
//!   credits, and the credits of all connections may exceed the pool. A send that finds the
//!   SRQ empty is answered with an RNR NAK and retried by the sender: the listener's QPs are
//!   brought up so that the peer retries without limit (rnr_retry 7) after a short timer
//!   ([`MIN_RNR_TIMER`]). A momentarily empty pool is therefore a delay, never a failure.
//!   A message waits unread in its slot only while the pool has room: once all but an eighth
//!   of the slots are bound, a connection copies each message it takes out of its slot into
//!   memory of its own and gives the slot back at once ([`RecvPool::bind`]), so connections
//!   whose application does not read cannot hold the slots the others' frames need (then
//!   every connection holds up to `recv_slots` unread messages in its own memory, as without
//!   a pool).
//!   The pool is not grown at run time; the SRQ limit event says when it runs low
//!   ([`super::pool_events`]).
//! - **Lifetime.** The listener and every connection's slot memory hold the pool (`Arc`). A
//!   connection's QP is destroyed before its slot memory drops (which returns the pool slots
//!   it still had bound), so when the last holder goes no QP is attached any more: the SRQ is
//!   destroyed first, then the memory is deregistered and freed. Flushing a QP does not
//!   return the SRQ's posted receives (they stay for the other QPs); only a receive that
//!   completes on the QP (with data, or flushed mid-message) comes back through its CQ.

use super::options::{ConnOptions, SharedRecv};
use super::pool_events::PoolEvents;
use super::region::Region;
use super::wr_id::{POOL_TAG, RECV_TAG};
use crate::error::Result;
use rsrdma::{AccessFlags, Context, Pd, RecvWr, Srq};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The RNR NAK timer code the listener's QPs announce with a pool: 0.64 ms (code 12 in the
/// IB table) before the peer retries a send that found the pool empty.
pub(crate) const MIN_RNR_TIMER: u8 = 12;
/// RNR retries the peers of a pooled listener use: 7 means without limit.
pub(crate) const RNR_RETRY_FOREVER: u8 = 7;

/// Registered receive memory of a [`crate::Listener`] ([`crate::Listener::recv_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecvMemory {
    /// Registered bytes of the shared pools (0 without [`crate::SharedRecv`]).
    pub pool_bytes: usize,
    /// Receive slots in the shared pools.
    pub pool_slots: usize,
    /// Accepted connections alive now (from their handshake until their memory is freed).
    pub connections: usize,
    /// Receive memory those connections hold themselves: their receive regions without a
    /// pool; with one, the virtual slots' bookkeeping and the messages copied out of a
    /// crowded pool that wait to be read.
    pub connection_bytes: usize,
    /// Times a shared pool fell below an eighth of its slots posted (the device's SRQ limit
    /// event, where it has one; each is also logged at WARN, at most once a second). Peers
    /// then wait in RNR retries until slots come back: a pool that runs low often is too
    /// small for its load.
    pub pool_low_events: u64,
}

impl RecvMemory {
    /// All of it: the pools plus every connection's own receive memory.
    pub fn total(&self) -> usize {
        self.pool_bytes + self.connection_bytes
    }
}

/// Receive memory that a listener's connections hold, counted as they come and go.
#[derive(Debug, Default)]
pub(crate) struct RecvAccount {
    bytes: AtomicUsize,
    connections: AtomicUsize,
}

impl RecvAccount {
    pub(crate) fn add(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn remove(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// A connection holds `bytes` more (a message copied out of the pool), or fewer.
    pub(crate) fn held(&self, bytes: usize, more: bool) {
        if more {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

/// One SRQ with its registered receive slots.
pub(crate) struct RecvPool {
    // Field order is drop order: the SRQ (with its posted receives) goes before the memory.
    srq: Srq,
    mem: PoolMemory,
    pd: Pd,
    slot_size: usize,
    slots: u32,
    /// Slots whose repost failed (they stay out of use).
    lost: AtomicU64,
    /// Slots bound to a connection's virtual slot now: a message its application has not
    /// read yet, mostly ([`RecvPool::bind`]).
    bound: AtomicU32,
    /// What the device's asynchronous events said ([`super::pool_events`]).
    events: PoolEvents,
    /// Serialises posts to the SRQ, which every connection of the listener reposts to from
    /// its own thread: a provider may run without its own locks (`MLX5_SINGLE_THREADED=1`),
    /// and reposts are off the hot path (one per consumed slot, uncontended in practice).
    post_lock: std::sync::Mutex<()>,
}

/// The pool's region, shared by the connections.
struct PoolMemory(Region);

// SAFETY: the region is only touched through raw-pointer copies of whole slots, and a slot is
// copied by the one connection it is bound to, between its completion and its repost
// (module docs of `slots`); no Rust reference into it exists, so sharing it is sound.
unsafe impl Sync for PoolMemory {}

impl RecvPool {
    /// Registers `slots × slot_size` bytes on `pd`, creates the SRQ and posts every slot.
    fn new(pd: Pd, slots: u32, slot_size: u32) -> Result<RecvPool> {
        let size = slot_size as usize;
        let len = (slots as usize).checked_mul(size).ok_or_else(|| {
            crate::NetError::InvalidArgument(format!("a pool of {slots} × {size} bytes"))
        })?;
        let mem = PoolMemory(Region::new(&pd, len, AccessFlags::LOCAL_WRITE)?);
        let srq = Srq::new(&pd, slots, 1)?;
        let pool = RecvPool {
            srq,
            mem,
            pd,
            slot_size: size,
            slots,
            lost: AtomicU64::new(0),
            bound: AtomicU32::new(0),
            events: PoolEvents::default(),
            post_lock: std::sync::Mutex::new(()),
        };
        for p in 0..slots {
            pool.post(p)?;
        }
        tracing::debug!(
            slots,
            slot_size,
            bytes = len,
            "rsrdma-net: shared receive pool"
        );
        Ok(pool)
    }

    /// The SRQ the listener's QPs attach to.
    pub(crate) fn srq(&self) -> &Srq {
        &self.srq
    }

    /// The domain every QP that receives from the pool must be in.
    pub(crate) fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Slots in the pool.
    pub(crate) fn slots(&self) -> u32 {
        self.slots
    }

    /// What the device's asynchronous events said about the pool and its QPs.
    pub(crate) fn events(&self) -> &PoolEvents {
        &self.events
    }

    /// Bytes per pool slot.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    fn post(&self, p: u32) -> rsrdma::Result<()> {
        let mr = self.mem.0.mr().ok_or_else(|| {
            rsrdma::Error::InvalidArgument("the pool's memory is deregistered".into())
        })?;
        let sge = [mr.sge(p as usize * self.slot_size, self.slot_size)?];
        let wr = RecvWr::new(RECV_TAG | POOL_TAG | u64::from(p), &sge);
        let _one_at_a_time = self.post_lock.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the slot lies in the pool's registered region, which outlives the SRQ (field
        // order, and every holder of the pool outlives its QP); the slot was released by the
        // one connection that had it bound, so no CPU copy touches it until it completes.
        unsafe { self.srq.post_recv(&wr) }
    }

    /// A connection bound a slot to one of its virtual slots; whether the pool is now so
    /// crowded with bound slots that the connection should copy this one out and give it
    /// back at once ([`super::slots`]): messages nobody reads yet must not take the slots
    /// every other connection's frames (their credits, their keepalive answers) land in, or
    /// a few idle readers starve every busy connection of the listener until its peer is
    /// declared dead. The last eighth of the slots (at least one) stays for frames that are
    /// handled as they land.
    pub(crate) fn bind(&self) -> bool {
        let now = self.bound.fetch_add(1, Ordering::Relaxed) + 1;
        let reserve = (self.slots / 8).max(1);
        let crowded = now > self.slots.saturating_sub(reserve);
        if crowded {
            self.events.note_low(std::time::Instant::now());
        }
        crowded
    }

    /// A slot bound to a virtual slot was given back ([`RecvPool::give_back`] follows).
    pub(crate) fn unbind(&self) {
        self.bound.fetch_sub(1, Ordering::Relaxed);
    }

    /// Reposts pool slot `p`, done with by the connection it was bound to.
    pub(crate) fn give_back(&self, p: u32) {
        if p >= self.slots {
            return;
        }
        if let Err(e) = self.post(p) {
            let lost = self.lost.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(error = %e, lost, "rsrdma-net: a pool slot could not be reposted");
        }
    }

    /// Copies `out.len()` bytes at `offset` of pool slot `p`; `false` if out of range.
    pub(crate) fn read(&self, p: u32, offset: usize, out: &mut [u8]) -> bool {
        let fits = p < self.slots
            && offset
                .checked_add(out.len())
                .is_some_and(|end| end <= self.slot_size);
        if !fits {
            return false;
        }
        let at = p as usize * self.slot_size + offset;
        // SAFETY: inside the pool's allocation (checked above and by construction); the slot
        // is bound to the calling connection, its receive completed and it is not reposted,
        // so the NIC does not write it now; `out` is caller memory, never the pool's.
        unsafe {
            std::ptr::copy_nonoverlapping(self.mem.0.ptr.add(at), out.as_mut_ptr(), out.len())
        };
        true
    }
}

/// A listener's pools, one per device, made when the first peer arrives on that device,
/// and the account of its connections' receive memory.
pub(crate) struct RecvPools {
    config: Option<SharedRecv>,
    pools: Mutex<Vec<Arc<RecvPool>>>,
    pub(crate) account: Arc<RecvAccount>,
}

impl std::fmt::Debug for RecvPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvPools")
            .field("config", &self.config)
            .field("memory", &self.memory())
            .finish()
    }
}

impl RecvPools {
    pub(crate) fn new(config: Option<SharedRecv>) -> RecvPools {
        RecvPools {
            config,
            pools: Mutex::new(Vec::new()),
            account: Arc::default(),
        }
    }

    /// The pool of device `ctx`, made on first use; `None` without [`SharedRecv`].
    pub(crate) fn pool_on(
        &self,
        ctx: &Context,
        opts: &ConnOptions,
    ) -> Result<Option<Arc<RecvPool>>> {
        let Some(cfg) = &self.config else {
            return Ok(None);
        };
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.iter().find(|p| p.pd.context().name() == ctx.name()) {
            return Ok(Some(p.clone()));
        }
        let pd = opts.domain_on(ctx)?;
        let pool = Arc::new(RecvPool::new(pd, cfg.pool_slots, opts.slot_size)?);
        PoolEvents::start(&pool);
        pools.push(pool.clone());
        Ok(Some(pool))
    }

    /// The pools' and connections' receive memory now.
    pub(crate) fn memory(&self) -> RecvMemory {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        RecvMemory {
            pool_bytes: pools.iter().map(|p| p.mem.0.len).sum(),
            pool_slots: pools.iter().map(|p| p.slots as usize).sum(),
            connections: self.account.connections.load(Ordering::Relaxed),
            connection_bytes: self.account.bytes.load(Ordering::Relaxed),
            pool_low_events: pools.iter().map(|p| p.events.low_events()).sum(),
        }
    }
}
