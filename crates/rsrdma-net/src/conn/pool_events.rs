//! A shared receive pool's device events: one thread per pool reads the asynchronous events
//! of the pool's device context ([`rsrdma::Context::read_async_event`]), because the verbs
//! API delivers some facts about an SRQ and its QPs only there:
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
//! The thread holds the pool only weakly and ends within [`TICK`] of the pool's end. It
//! reads every event of the context: with a protection domain shared with other users
//! ([`crate::ConnOptions::pd`]), their events are logged here at DEBUG and not seen by them.

use super::pool::RecvPool;
use rsrdma::{AsyncElement, AsyncEventKind, Context};
use std::collections::HashSet;
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
}

impl PoolEvents {
    /// Starts the thread that reads `pool`'s device events, and arms the SRQ limit.
    pub(crate) fn start(pool: &Arc<RecvPool>) {
        let limit = low_mark(pool);
        if let Err(e) = pool.srq().arm_limit(limit) {
            tracing::debug!(error = %e, "rsrdma-net: the pool's SRQ limit cannot be armed");
        }
        let ctx = pool.pd().context().clone();
        let weak = Arc::downgrade(pool);
        let spawned = std::thread::Builder::new()
            .name("rsrdma-pool-events".into())
            .spawn(move || run(&ctx, &weak, limit));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "rsrdma-net: no thread for the pool's device events");
        }
    }

    /// Forgets an event of an earlier QP that had the same number; called before the QP
    /// goes to ERROR.
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

/// The thread: reads events until the pool is gone (or the context fails).
fn run(ctx: &Context, pool: &Weak<RecvPool>, limit: u32) {
    let mut rearm_at: Option<Instant> = None;
    let mut last_warning: Option<Instant> = None;
    loop {
        let event = ctx.wait_async_event(TICK);
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let event = match event {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                if rearm_at.is_some_and(|t| Instant::now() >= t) {
                    rearm_at = None;
                    if let Err(e) = pool.srq().arm_limit(limit) {
                        tracing::debug!(error = %e, "rsrdma-net: re-arming the SRQ limit failed");
                    }
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "rsrdma-net: reading the device's events failed");
                return;
            }
        };
        let events = pool.events();
        match (event.kind, event.element) {
            (AsyncEventKind::QpLastWqeReached, AsyncElement::Qp(n)) => {
                events.raises_last_wqe.store(true, Ordering::Relaxed);
                let mut seen = events.lock();
                if seen.len() >= MAX_KEPT {
                    seen.clear();
                }
                seen.insert(n);
                events.arrived.notify_all();
            }
            (AsyncEventKind::SrqLimitReached, AsyncElement::Srq(h)) if h == pool.srq().handle() => {
                let n = events.low.fetch_add(1, Ordering::Relaxed) + 1;
                let now = Instant::now();
                if !last_warning.is_some_and(|t| now.duration_since(t) < REARM_AFTER) {
                    last_warning = Some(now);
                    tracing::warn!(
                        slots = pool.slots(),
                        below = limit,
                        times = n,
                        "rsrdma-net: the shared receive pool ran low; peers wait in RNR \
                         retries until slots come back (a larger SharedRecv pool avoids it)"
                    );
                }
                rearm_at = Some(now + REARM_AFTER);
            }
            (
                AsyncEventKind::QpFatal | AsyncEventKind::QpReqErr | AsyncEventKind::QpAccessErr,
                AsyncElement::Qp(n),
            ) => {
                tracing::warn!(qp_num = n, kind = ?event.kind, "rsrdma-net: a QP failed");
            }
            (AsyncEventKind::PortErr | AsyncEventKind::DeviceFatal | AsyncEventKind::SrqErr, _) => {
                tracing::warn!(device = ctx.name(), ?event, "rsrdma-net: device event");
            }
            _ => tracing::debug!(device = ctx.name(), ?event, "rsrdma-net: device event"),
        }
    }
}
