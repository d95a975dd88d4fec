//! What only a device's asynchronous event queue says about it, for every connection on it
//! (F6): that the device failed (`IBV_EVENT_DEVICE_FATAL`: its queues may never complete
//! anything again, so no completion would tell), and which ports are down. A plain
//! connection only logs a port going down (its requests then fail by themselves once their
//! retries run out; a port that comes back in time loses nothing); a rail of a striped
//! connection is taken out at once (its stripes go on the other rails). A queue pair's own
//! error reaches its connection through its completions (the flush), so QP events are only
//! logged.
//!
//! No thread: a connection's driver looks now and then, from its own steps
//! ([`DeviceFacts::poll`], at most every [`LOOK_EVERY`]), taking what waits on the queue
//! without blocking; one context's facts are shared by all its connections (a context has
//! one event queue; rdma_cm gives every id of a process the same context of a device). Where
//! a shared receive pool's thread reads the queue ([`super::pool_events`]), the connections
//! leave it to that thread, which records the same facts here, so that neither takes the
//! other's events.

use rsrdma::{AsyncElement, AsyncEvent, AsyncEventKind, Context};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often a driver looks at its device's event queue (one non-blocking read).
pub(crate) const LOOK_EVERY: Duration = Duration::from_millis(100);

/// One context's facts.
#[derive(Debug, Default)]
pub(crate) struct DeviceFacts {
    failed: AtomicBool,
    /// Bit `p`: port `p` went down and has not come back (ports 1 to 63).
    ports_down: AtomicU64,
    /// Held by the one connection reading the queue now (the others skip their look).
    reading: Mutex<()>,
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<usize, Weak<DeviceFacts>>> {
    static R: std::sync::OnceLock<Mutex<HashMap<usize, Weak<DeviceFacts>>>> =
        std::sync::OnceLock::new();
    R.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The key of a context in the registries: its address.
pub(crate) fn context_key(ctx: &Context) -> usize {
    ctx.as_raw().map_or(0, |p| p as usize)
}

impl DeviceFacts {
    /// The facts of `ctx`, shared with every other user of it.
    pub(crate) fn of(ctx: &Context) -> Arc<DeviceFacts> {
        let key = context_key(ctx);
        let mut r = registry();
        if let Some(f) = r.get(&key).and_then(Weak::upgrade) {
            return f;
        }
        r.retain(|_, w| w.strong_count() > 0);
        let f = Arc::new(DeviceFacts::default());
        r.insert(key, Arc::downgrade(&f));
        f
    }

    /// Records what `event` says about the device (any other event is only logged).
    pub(crate) fn record(&self, device: &str, event: &AsyncEvent) {
        match (event.kind, event.element) {
            (AsyncEventKind::DeviceFatal, _) => {
                if !self.failed.swap(true, Ordering::AcqRel) {
                    tracing::error!(device, "rsrdma-net: the device reported a fatal error");
                }
            }
            (AsyncEventKind::PortErr, AsyncElement::Port(p)) => {
                tracing::warn!(device, port = p, "rsrdma-net: a port went down");
                self.ports_down.fetch_or(port_bit(p), Ordering::AcqRel);
            }
            (AsyncEventKind::PortActive, AsyncElement::Port(p)) => {
                tracing::info!(device, port = p, "rsrdma-net: a port is active");
                self.ports_down.fetch_and(!port_bit(p), Ordering::AcqRel);
            }
            _ => tracing::debug!(device, ?event, "rsrdma-net: device event"),
        }
    }

    /// Takes what waits on `ctx`'s event queue, without blocking, unless another connection
    /// is reading it now or a shared receive pool's thread reads it.
    pub(crate) fn poll(&self, ctx: &Context) {
        if super::pool_events::has_reader(context_key(ctx)) {
            return;
        }
        let Ok(_reading) = self.reading.try_lock() else {
            return;
        };
        loop {
            match ctx.read_async_event() {
                Ok(Some(ev)) => self.record(ctx.name(), &ev),
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "rsrdma-net: reading the device's events failed");
                    return;
                }
            }
        }
    }

    /// Whether the device reported a fatal error.
    pub(crate) fn device_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Whether port `port` went down and has not come back.
    pub(crate) fn port_down(&self, port: u8) -> bool {
        self.ports_down.load(Ordering::Acquire) & port_bit(port) != 0
    }
}

/// Port `p`'s bit (none past 63).
fn port_bit(p: u8) -> u64 {
    1u64.checked_shl(u32::from(p)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: AsyncEventKind, element: AsyncElement) -> AsyncEvent {
        AsyncEvent { kind, element }
    }

    #[test]
    fn only_a_fatal_device_event_marks_the_device_failed() {
        let f = DeviceFacts::default();
        f.record("d", &ev(AsyncEventKind::QpFatal, AsyncElement::Qp(7)));
        f.record("d", &ev(AsyncEventKind::PortErr, AsyncElement::Port(1)));
        f.record("d", &ev(AsyncEventKind::PortActive, AsyncElement::Port(1)));
        assert!(!f.device_failed());
        f.record("d", &ev(AsyncEventKind::DeviceFatal, AsyncElement::Device));
        assert!(f.device_failed());
    }

    #[test]
    fn a_port_is_down_from_its_error_until_it_is_active_again() {
        let f = DeviceFacts::default();
        assert!(!f.port_down(1));
        f.record("d", &ev(AsyncEventKind::PortErr, AsyncElement::Port(1)));
        assert!(f.port_down(1));
        assert!(!f.port_down(2));
        f.record("d", &ev(AsyncEventKind::PortActive, AsyncElement::Port(1)));
        assert!(!f.port_down(1));
        f.record("d", &ev(AsyncEventKind::PortErr, AsyncElement::Port(200)));
        assert!(!f.port_down(200), "past 63: not tracked");
    }
}
