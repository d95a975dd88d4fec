//! A shared receive pool's device events: one thread per device context reads its
//! asynchronous events ([`rsrdma::Context::read_async_event`]) for every pool on it, because
//! the verbs API delivers some facts about an SRQ and its QPs only there:
//!
//! - **LAST_WQE_REACHED** says that a QP in ERROR takes no more receives from the SRQ: once
//!   its CQ is empty after the event, every pool slot it took has come back. A pooled
//!   connection's teardown waits for it ([`PoolEvents::wait_last_wqe`]) where the device
//!   raises it (mlx5 does; rxe only from Linux 6.3 on); elsewhere it ends its drain after a
//!   quiet spell, as before (`Driver::drain_pool_completions`).
//! - **SRQ_LIMIT_REACHED**: the pool's SRQ is armed to report when fewer than an eighth of its
//!   slots are posted. Peers then wait in RNR retries; a pool that runs low often is too
//!   small for its load. Counted ([`crate::RecvMemory::pool_low_events`]), logged at WARN at
//!   most once a second, and re-armed a second later.
//! - QP errors, port and device events are logged (the connections learn of a QP's error
//!   from its completions).
//!
//! One thread per context, not per pool: a context has one event queue, and rdma_cm gives
//! every id of a process the same context of a device, so two pools (two listeners) on one
//! device each reading the queue would take each other's events (a pool's SRQ limit event
//! read and dropped by the other pool's thread). The thread holds its pools only weakly and
//! ends within [`TICK`] of the last one's end. It reads every event of the context: with a
//! protection domain shared with other users ([`crate::ConnOptions::pd`]), their events are
//! logged here at DEBUG and not seen by them.

use super::pool::RecvPool;
use rsrdma::{AsyncElement, AsyncEventKind, Context};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often the thread looks whether its pool is gone.
const TICK: Duration = Duration::from_millis(100);
/// How long after a low-pool event the SRQ limit is armed again.
const REARM_AFTER: Duration = Duration::from_secs(1);
/// LAST_WQE_REACHED events kept for teardowns that have not asked yet; beyond this the
/// oldest are forgotten (a teardown that misses its event ends by the quiet rule).
const MAX_KEPT: usize = 4096;

/// What the pool's event thread learned, for the teardowns and the listener's counters.
#[derive(Debug, Default)]
pub(crate) struct PoolEvents {
    /// QPs for which LAST_WQE_REACHED came and whose teardown has not taken it yet.
    last_wqe: Mutex<HashSet<u32>>,
    arrived: Condvar,
    /// The device raised LAST_WQE_REACHED at least once: it is one that raises them.
    raises_last_wqe: AtomicBool,
    /// SRQ limit events.
    low: AtomicU64,
    /// When the pool last ran low (an SRQ limit event, or a connection that found it
    /// crowded): nanoseconds after [`epoch`], 0 for never.
    low_at: AtomicU64,
}

impl PoolEvents {
    /// Arms `pool`'s SRQ limit and has its context's event thread (started if there is
    /// none) serve it.
    pub(crate) fn start(pool: &Arc<RecvPool>) {
        let limit = low_mark(pool);
        if let Err(e) = pool.srq().arm_limit(limit) {
            tracing::debug!(error = %e, "rsrdma-net: the pool's SRQ limit cannot be armed");
        }
        let ctx = pool.pd().context().clone();
        let key = ctx.as_raw().map_or(0, |p| p as usize);
        let watched = Watched {
            pool: Arc::downgrade(pool),
            limit,
            rearm_at: None,
            last_warning: None,
        };
        let mut readers = readers();
        if let Some(r) = readers.get(&key) {
            lock(&r.pools).push(watched);
            return;
        }
        let reader = Arc::new(Reader {
            pools: Mutex::new(vec![watched]),
        });
        let spawned = {
            let reader = reader.clone();
            std::thread::Builder::new()
                .name("rsrdma-pool-events".into())
                .spawn(move || run(&ctx, key, &reader))
        };
        match spawned {
            Ok(_) => {
                readers.insert(key, reader);
            }
            Err(e) => {
                tracing::warn!(error = %e, "rsrdma-net: no thread for the pool's device events")
            }
        }
    }

    /// Forgets an event of an earlier QP that had the same number; called when a pooled
    /// connection's driver starts, before anything can move its QP to ERROR (forgetting at
    /// the teardown would lose the event of a QP a disconnect or the peer already failed).
    pub(crate) fn forget(&self, qp_num: u32) {
        self.lock().remove(&qp_num);
    }

    /// Whether the device raised LAST_WQE_REACHED before (so a teardown can wait for it).
    pub(crate) fn raises_last_wqe(&self) -> bool {
        self.raises_last_wqe.load(Ordering::Relaxed)
    }

    /// Waits until LAST_WQE_REACHED came for `qp_num`, up to `deadline`: `true` if it came.
    pub(crate) fn wait_last_wqe(&self, qp_num: u32, deadline: Instant) -> bool {
        let mut seen = self.lock();
        loop {
            if seen.remove(&qp_num) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            seen = self
                .arrived
                .wait_timeout(seen, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// SRQ limit events so far.
    pub(crate) fn low_events(&self) -> u64 {
        self.low.load(Ordering::Relaxed)
    }

    /// The pool ran low at `at` (peers may be waiting in RNR retries).
    pub(crate) fn note_low(&self, at: Instant) {
        let nanos = at.saturating_duration_since(epoch()).as_nanos();
        self.low_at.fetch_max(
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
    }

    /// When the pool last ran low, if it ever did.
    pub(crate) fn low_at(&self) -> Option<Instant> {
        match self.low_at.load(Ordering::Relaxed) {
            0 => None,
            n => Some(epoch() + Duration::from_nanos(n)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.last_wqe.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The SRQ limit: an eighth of the pool's slots, at least 1, below the SRQ's size.
fn low_mark(pool: &RecvPool) -> u32 {
    (pool.slots() / 8)
        .max(1)
        .min(pool.srq().max_wr().saturating_sub(1))
}

/// The pools a context's event thread serves, by context.
struct Reader {
    pools: Mutex<Vec<Watched>>,
}

/// One pool a reader serves, with its SRQ limit's state.
struct Watched {
    pool: Weak<RecvPool>,
    limit: u32,
    rearm_at: Option<Instant>,
    last_warning: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a pool's thread reads the event queue of the context with this key.
pub(crate) fn has_reader(key: usize) -> bool {
    readers().contains_key(&key)
}

/// The running readers, by the address of their context.
fn readers() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<Reader>>> {
    static READERS: std::sync::OnceLock<Mutex<HashMap<usize, Arc<Reader>>>> =
        std::sync::OnceLock::new();
    lock(READERS.get_or_init(Default::default))
}

/// A context's event thread: reads events until its last pool is gone (or the context
/// fails).
fn run(ctx: &Context, key: usize, reader: &Reader) {
    loop {
        let event = ctx.wait_async_event(TICK);
        {
            // Under the readers' lock, so a pool starting now finds this reader alive or
            // starts another.
            let mut readers = readers();
            let mut pools = lock(&reader.pools);
            pools.retain(|w| w.pool.strong_count() > 0);
            if pools.is_empty() || event.is_err() {
                readers.remove(&key);
                if let Err(e) = &event {
                    tracing::warn!(error = %e, "rsrdma-net: reading the device's events failed");
                }
                return;
            }
        }
        let mut pools = lock(&reader.pools);
        let now = Instant::now();
        for w in pools.iter_mut() {
            if w.rearm_at.is_some_and(|t| now >= t) {
                w.rearm_at = None;
                if let Some(pool) = w.pool.upgrade() {
                    if let Err(e) = pool.srq().arm_limit(w.limit) {
                        tracing::debug!(error = %e, "rsrdma-net: re-arming the SRQ limit failed");
                    }
                }
            }
        }
        let Ok(Some(event)) = event else {
            continue;
        };
        match (event.kind, event.element) {
            // QP numbers are the device's: every pool keeps it, the one whose connection it
            // is takes it (the others forget it when a QP of that number starts).
            (AsyncEventKind::QpLastWqeReached, AsyncElement::Qp(n)) => {
                for pool in pools.iter().filter_map(|w| w.pool.upgrade()) {
                    let events = pool.events();
                    events.raises_last_wqe.store(true, Ordering::Relaxed);
                    let mut seen = events.lock();
                    if seen.len() >= MAX_KEPT {
                        seen.clear();
                    }
                    seen.insert(n);
                    events.arrived.notify_all();
                }
            }
            (AsyncEventKind::SrqLimitReached, AsyncElement::Srq(h)) => {
                let mine = pools.iter_mut().find_map(|w| {
                    let pool = w.pool.upgrade()?;
                    (pool.srq().handle() == h).then_some((w, pool))
                });
                let Some((w, pool)) = mine else {
                    tracing::debug!(device = ctx.name(), ?event, "rsrdma-net: device event");
                    continue;
                };
                let n = pool.events().low.fetch_add(1, Ordering::Relaxed) + 1;
                pool.events().note_low(now);
                if !w
                    .last_warning
                    .is_some_and(|t| now.duration_since(t) < REARM_AFTER)
                {
                    w.last_warning = Some(now);
                    tracing::warn!(
                        slots = pool.slots(),
                        below = w.limit,
                        times = n,
                        "rsrdma-net: the shared receive pool ran low; peers wait in RNR \
                         retries until slots come back (a larger SharedRecv pool avoids it)"
                    );
                }
                w.rearm_at = Some(now + REARM_AFTER);
            }
            (
                AsyncEventKind::QpFatal | AsyncEventKind::QpReqErr | AsyncEventKind::QpAccessErr,
                AsyncElement::Qp(n),
            ) => {
                tracing::warn!(qp_num = n, kind = ?event.kind, "rsrdma-net: a QP failed");
            }
            // What the connections on this context look for (they leave the queue to us).
            (
                AsyncEventKind::PortErr | AsyncEventKind::PortActive | AsyncEventKind::DeviceFatal,
                _,
            ) => super::device_events::DeviceFacts::of(ctx).record(ctx.name(), &event),
            (AsyncEventKind::SrqErr, _) => {
                tracing::warn!(device = ctx.name(), ?event, "rsrdma-net: device event");
            }
            _ => tracing::debug!(device = ctx.name(), ?event, "rsrdma-net: device event"),
        }
    }
}

/// The instant the pools' timestamps count from (the first use in the process).
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}
