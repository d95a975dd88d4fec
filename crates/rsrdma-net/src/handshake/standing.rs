//! How far a server's peer has come in its handshake, shared between the handshake (which
//! moves it on) and the listener's admission table (which may shed the peer to make room).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A server's peer, as its listener sees it.
///
/// - *Unopened*: no valid hello yet, or (with a secret) no proof, or (without one) no step
///   after the hello: silent or garbage sockets look like this.
/// - *Opened and proven*: it proved the listener's secret (or came by rdma_cm): never shed.
/// - *Opened, unproven*: without a secret, its endpoint came, but anyone can send a
///   well-formed one. Shed only while it keeps the server waiting for its next step longer
///   than a grace: a real peer answers within a round trip and its queue pair's bring-up.
#[derive(Debug, Default)]
pub(crate) struct Standing {
    opened: AtomicBool,
    proven: AtomicBool,
    /// Since when the server waits for an opened, unproven peer's next step.
    waiting_since: Mutex<Option<Instant>>,
    /// The listener shed it (to make room, or because it is closing): the handshake tells
    /// the peer so at its next wait, and ends.
    shed: AtomicBool,
    /// It was shed because the listener is closing (not to make room).
    closing: AtomicBool,
    /// The listener's count of failed handshakes: a handshake that is about to tell its peer
    /// why it fails counts itself first, so a dialer that hears the reason and then reads
    /// the listener's counters sees its failure there.
    failures: Option<Arc<AtomicU64>>,
    /// This handshake's failure is counted.
    failure_counted: AtomicBool,
}

impl Standing {
    /// A peer that has not opened yet, whose failure counts in `failures`.
    pub(crate) fn counting_into(failures: Arc<AtomicU64>) -> Standing {
        Standing {
            failures: Some(failures),
            ..Standing::default()
        }
    }

    /// A peer that opened, proven, from the start (an rdma_cm connect request).
    pub(crate) fn proven(failures: Arc<AtomicU64>) -> Standing {
        let s = Standing::counting_into(failures);
        s.open(true);
        s
    }

    /// The handshake fails and is about to tell its peer: counted now, once. A shed one is
    /// not a failure (the listener counted it as shed).
    pub(crate) fn count_failure(&self) {
        if self.is_shed() || self.failure_counted.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(f) = &self.failures {
            f.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Its failure is counted already ([`Standing::count_failure`]).
    pub(crate) fn failure_counted(&self) -> bool {
        self.failure_counted.load(Ordering::Acquire)
    }

    /// The peer opened; `proven` when it proved a secret.
    pub(crate) fn open(&self, proven: bool) {
        self.proven.store(proven, Ordering::Release);
        self.opened.store(true, Ordering::Release);
    }

    /// The listener shed the handshake.
    pub(crate) fn shed(&self) {
        self.shed.store(true, Ordering::Release);
    }

    pub(crate) fn is_shed(&self) -> bool {
        self.shed.load(Ordering::Acquire)
    }

    /// The listener is closing: when it is then shed, the peer is told that instead of
    /// "no room" (set before [`Standing::shed`], which the handshake looks at first).
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Shed because the listener is closing.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    pub(crate) fn opened(&self) -> bool {
        self.opened.load(Ordering::Acquire)
    }

    /// Opened without proving a secret.
    pub(crate) fn unproven(&self) -> bool {
        self.opened() && !self.proven.load(Ordering::Acquire)
    }

    /// The server starts waiting for the peer's next step (`Some(now)`), or got it (`None`).
    /// Only an opened, unproven peer's waits are recorded.
    pub(crate) fn set_waiting(&self, since: Option<Instant>) {
        if since.is_none() || self.unproven() {
            *self.lock() = since;
        }
    }

    /// When an opened, unproven peer stalls past `grace` (it may then be shed): `None` when
    /// it is not opened, proven, or the server is not waiting for it.
    pub(crate) fn stalls_at(&self, grace: Duration) -> Option<Instant> {
        if !self.unproven() {
            return None;
        }
        self.lock().map(|t| t + grace)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.waiting_since.lock().unwrap_or_else(|p| p.into_inner())
    }
}
