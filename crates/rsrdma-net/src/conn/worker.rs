//! The progress thread: one per connection. It sleeps on the CQ's completion channel, the
//! liveness descriptor (rdma_cm id or TCP channel) and a wake eventfd, with the core's next
//! timer as timeout; on each wake it runs one driver step. So keepalive PINGs are answered,
//! PINGs sent and a dead peer detected while the application is not calling in, and an idle
//! connection costs no CPU beyond one wake per keepalive interval.
//!
//! In [`PollMode::Busy`] the thread never arms the CQ (a busy caller polls it anyway, and an
//! event per completion would wake this thread to fight the caller for the lock): while
//! callers run steps (each marks `stepped`) it stays off the lock entirely (the callers run
//! the timers too), and once none ran for a [`BUSY_PARK`] it looks in every [`SPIN_PARK`].

use super::fdwait::wait_readable;
use super::shared::Shared;
use crate::progress::{coarse_now, PollMode};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// While nobody waits on the CQ's events (busy mode, or a caller spinning), the thread looks
/// in this often.
const SPIN_PARK: Duration = Duration::from_millis(5);
/// Busy mode, while callers run steps: the thread only checks this often whether they still do.
const BUSY_PARK: Duration = Duration::from_millis(50);
/// The thread's stack: it runs short, non-recursive steps.
const STACK: usize = 256 * 1024;

pub(crate) fn spawn(shared: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("rsrdma-conn".into())
        .stack_size(STACK)
        .spawn(move || run(&shared))
}

fn run(shared: &Shared) {
    let cq_fd = shared.cq.comp_channel().map(|c| c.as_raw_fd());
    let busy = shared.mode == PollMode::Busy;
    let mut live_ready = false;
    // Known from the start: a busy caller may spin from the first moment (a server reading
    // right after accept), and the spinning branch below watches only this fd for the peer's
    // end (without it, a close after the peer left waited out its whole linger).
    let mut live_fd = shared.lock().driver.as_ref().and_then(|d| d.liveness_fd());
    loop {
        if busy && !live_ready && shared.stepped.swap(false, Ordering::Relaxed) {
            // The spinning caller does the steps; wake only for the liveness signal or stop.
            match wait_readable([Some(shared.wake.raw()), live_fd], Some(BUSY_PARK)) {
                Ok([wake, live]) => {
                    if wake {
                        shared.wake.clear();
                    }
                    live_ready = live;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rsrdma-net conn: poll failed");
                    std::thread::sleep(BUSY_PARK);
                }
            }
            if !live_ready && !shared.lock().stop {
                continue;
            }
        }
        let (deadline, fd, armed) = {
            let mut st = shared.lock();
            if st.stop {
                return;
            }
            let Some(d) = st.driver.as_mut() else {
                return;
            };
            let now = coarse_now();
            if live_ready {
                d.check_liveness(now);
                live_ready = false;
            }
            let mut changed = d.progress(now);
            let spinning = shared.spinners.load(Ordering::Acquire) > 0;
            let armed = !busy && !spinning && cq_fd.is_some() && d.arm();
            if armed {
                // A completion that arrived before the arm raises no event: look once more.
                changed |= d.progress(now);
            }
            changed |= d.post_work();
            let out = (d.next_deadline(), d.liveness_fd(), armed);
            if changed {
                shared.changed(&mut st);
            }
            out
        };
        // Measured on the clock the deadline came from: the coarse one lags, so the thread
        // wakes when the timer is due by that clock too (not a tick early, to find it not due).
        let mut timeout = deadline.map(|t| t.saturating_duration_since(coarse_now()));
        if !armed {
            timeout = Some(timeout.map_or(SPIN_PARK, |t| t.min(SPIN_PARK)));
        }
        live_fd = fd;
        let fds = [cq_fd.filter(|_| armed), Some(shared.wake.raw()), live_fd];
        match wait_readable(fds, timeout) {
            Ok([cq, wake, live]) => {
                if cq {
                    let _ = shared.cq.try_event();
                }
                if wake {
                    shared.wake.clear();
                }
                live_ready = live;
            }
            Err(e) => {
                tracing::warn!(error = %e, "rsrdma-net conn: poll failed");
                std::thread::sleep(SPIN_PARK);
            }
        }
    }
}
