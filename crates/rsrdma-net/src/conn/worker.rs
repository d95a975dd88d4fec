//! The progress thread: one per connection. It sleeps on the CQ's completion channel, the
//! liveness descriptor (rdma_cm id or TCP channel) and a wake eventfd, with the core's next
//! timer as timeout; on each wake it runs one driver step. So keepalive PINGs are answered,
//! PINGs sent and a dead peer detected while the application is not calling in, and an idle
//! connection costs no CPU beyond one wake per keepalive interval.

use super::fdwait::wait_readable;
use super::shared::Shared;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// While a caller polls the CQ itself, the thread only looks in this often.
const SPIN_PARK: Duration = Duration::from_millis(5);
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
    let mut live_ready = false;
    loop {
        let (deadline, live_fd, armed) = {
            let mut st = shared.lock();
            if st.stop {
                return;
            }
            let Some(d) = st.driver.as_mut() else {
                return;
            };
            if live_ready {
                d.check_liveness(Instant::now());
                live_ready = false;
            }
            let mut changed = d.progress(Instant::now());
            let spinning = shared.spinners.load(Ordering::Acquire) > 0;
            let armed = !spinning && cq_fd.is_some() && d.arm();
            if armed {
                // A completion that arrived before the arm raises no event: look once more.
                changed |= d.progress(Instant::now());
            }
            let out = (d.next_deadline(), d.liveness_fd(), armed);
            if changed {
                shared.changed(&mut st);
            }
            out
        };
        let mut timeout = deadline.map(|t| t.saturating_duration_since(Instant::now()));
        if !armed {
            timeout = Some(timeout.map_or(SPIN_PARK, |t| t.min(SPIN_PARK)));
        }
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
