//! The data path's helpers: the clock, the stall watchdog and the post/poll probe.

use crate::error::{Error, Result};
use crate::oob::Oob;
use std::time::{Duration, Instant};

/// A nanosecond clock; perftest's "cycles" in rs tools. On x86-64 it reads the time-stamp
/// counter (as perftest does) scaled to nanoseconds: a vDSO `clock_gettime` is as cheap only
/// with a TSC clocksource, and a syscall per post (virtual machines) would slow the loops
/// that stamp every work request.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    #[cfg(target_arch = "x86_64")]
    base: u64,
    #[cfg(target_arch = "x86_64")]
    ns_per_tick: f64,
    #[cfg(not(target_arch = "x86_64"))]
    base: Instant,
}

#[cfg(target_arch = "x86_64")]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no preconditions and every x86-64 CPU has it.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Nanoseconds per TSC tick, measured once per process against the monotonic clock over
/// 20 ms (perftest measures its cycle rate the same way).
#[cfg(target_arch = "x86_64")]
fn ns_per_tick() -> f64 {
    static SCALE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SCALE.get_or_init(|| {
        let t0 = Instant::now();
        let c0 = rdtsc();
        while t0.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let c1 = rdtsc();
        let ns = t0.elapsed().as_nanos() as f64;
        if c1 > c0 {
            ns / (c1 - c0) as f64
        } else {
            1.0
        }
    })
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        #[cfg(target_arch = "x86_64")]
        {
            let ns_per_tick = ns_per_tick();
            Clock {
                base: rdtsc(),
                ns_per_tick,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Clock {
                base: Instant::now(),
            }
        }
    }

    /// Nanoseconds since the clock started.
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            (rdtsc().wrapping_sub(self.base) as f64 * self.ns_per_tick) as u64
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self.base.elapsed().as_nanos() as u64
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// How long the data path may go without progress before giving up. Overridable with
/// `RSRDMA_PERFTEST_STALL_SECS`.
pub fn stall_limit() -> Duration {
    std::env::var("RSRDMA_PERFTEST_STALL_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_secs)
}

/// A busy loop's watchdog looks at every 1024th idle turn ([`Watchdog::every`]).
const BUSY_LOOK_EVERY: u32 = 1023;

/// Watches a busy loop: when it stops making progress, or the peer's TCP connection closes,
/// it ends the run with a message instead of spinning forever. Cheap on the hot path: only
/// every 1024th idle turn looks at the clock (every one in event mode, see
/// [`Watchdog::events`]).
#[derive(Debug)]
pub struct Watchdog {
    idle: u32,
    /// Idle turns between two looks, less one (a power of two less one).
    every: u32,
    last_progress: u64,
    last_change: Instant,
    last_peek: Instant,
    peer_waiting: bool,
    limit: Duration,
    what: &'static str,
}

impl Watchdog {
    /// A watchdog for a loop waiting for `what` (e.g. "receive completions").
    pub fn new(what: &'static str) -> Watchdog {
        let now = Instant::now();
        Watchdog {
            idle: 0,
            every: BUSY_LOOK_EVERY,
            last_progress: 0,
            last_change: now,
            last_peek: now,
            peer_waiting: false,
            limit: stall_limit(),
            what,
        }
    }

    /// In event mode (`-e`) an idle turn already slept on the completion channel (up to
    /// 50 ms): every one looks. (Every 1024th looked, about 51 s apart: a receiver whose
    /// sender was killed noticed after 34 to 48 s, or, with `-D`, never, and reported a
    /// result with status 0.)
    pub fn events(mut self, events: bool) -> Watchdog {
        self.every = if events { 0 } else { BUSY_LOOK_EVERY };
        self
    }

    /// Called on every turn that made no progress; `progress` is any counter that grows when
    /// work completes. `expected` describes what is still awaited, for the message.
    ///
    /// # Errors
    /// [`Error::Stalled`] or [`Error::Oob`] as described on the type.
    pub fn idle(
        &mut self,
        progress: u64,
        oob: &Oob,
        expected: impl FnOnce() -> String,
    ) -> Result<()> {
        self.idle = self.idle.wrapping_add(1);
        if self.idle & self.every != 0 {
            return Ok(());
        }
        self.check(progress, oob, expected)
    }

    #[cold]
    fn check(&mut self, progress: u64, oob: &Oob, expected: impl FnOnce() -> String) -> Result<()> {
        let now = Instant::now();
        if progress != self.last_progress {
            self.last_progress = progress;
            self.last_change = now;
        }
        if now.duration_since(self.last_peek) >= Duration::from_millis(20) {
            self.last_peek = now;
            match oob.peek_state() {
                Some(true) => {
                    // write_lat has no closing handshake (as perftest's): a peer with fewer
                    // iterations just exits after its last (an outside tester's -n 2000
                    // against -n 1000 read as a crash).
                    let shorter = if progress > 0 {
                        ", or it finished a shorter run (were both ends started with the same -n?)"
                    } else {
                        ""
                    };
                    return Err(Error::Oob(format!(
                        " The peer ({}) closed the connection during the test: it exited or was killed{shorter}\n (this side was waiting for {}; {})",
                        oob.peer(),
                        self.what,
                        expected()
                    )));
                }
                Some(false) => self.peer_waiting = true,
                None => {}
            }
        }
        let stalled = now.duration_since(self.last_change);
        // A peer already waiting in the next handshake has finished its part: what is still
        // missing will not come.
        let limit = if self.peer_waiting {
            self.limit.min(Duration::from_secs(2))
        } else {
            self.limit
        };
        if stalled >= limit {
            let why = if self.peer_waiting {
                "the peer has finished its part and waits in the next handshake: the two ends were probably started with a different -n (iterations), or messages were lost (UD)"
            } else {
                // A receiver that got its -n and waits in the closing handshake (which the
                // other side opens) looks the same from here as one that stopped.
                "the peer does not answer: it stopped or died, or it had fewer iterations to \
                 do (were both ends started with the same -n?)"
            };
            return Err(Error::Stalled(format!(
                " No progress for {} s while waiting for {} ({}): {why}",
                stalled.as_secs(),
                self.what,
                expected()
            )));
        }
        Ok(())
    }
}

/// Time spent inside post and poll calls, when `RSRDMA_PROBE` is on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Probe {
    /// Whether the probe is on.
    pub on: bool,
    /// Nanoseconds inside post calls.
    pub post_ns: u64,
    /// Nanoseconds inside poll calls.
    pub poll_ns: u64,
    /// Post calls.
    pub post_calls: u64,
    /// Poll calls, empty ones included.
    pub poll_calls: u64,
}

impl Probe {
    /// A probe, on when `RSRDMA_PROBE` is set to something other than empty or `0` (the
    /// convention of rsrdma-net).
    pub fn from_env() -> Probe {
        Probe {
            on: std::env::var_os("RSRDMA_PROBE").is_some_and(|v| !v.is_empty() && v != "0"),
            ..Default::default()
        }
    }

    /// The line printed after the table: each share of the send loop's time and ns per WR.
    pub fn report(&self, total_ns: u64, wrs: u64) -> String {
        let total = total_ns.max(1) as f64;
        let per = |ns: u64| ns as f64 / wrs.max(1) as f64;
        format!(
            " probe: post {:.1}% ({:.0} ns/WR, {} calls), poll {:.1}% ({:.0} ns/WR, {} calls), other {:.1}%\n",
            self.post_ns as f64 * 100.0 / total,
            per(self.post_ns),
            self.post_calls,
            self.poll_ns as f64 * 100.0 / total,
            per(self.poll_ns),
            self.poll_calls,
            (total - self.post_ns as f64 - self.poll_ns as f64).max(0.0) * 100.0 / total,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_line() {
        let p = Probe {
            on: true,
            post_ns: 250,
            poll_ns: 500,
            post_calls: 10,
            poll_calls: 40,
        };
        assert_eq!(
            p.report(1000, 10),
            " probe: post 25.0% (25 ns/WR, 10 calls), poll 50.0% (50 ns/WR, 40 calls), other 25.0%\n"
        );
    }

    #[test]
    fn clock_moves_forward() {
        let c = Clock::new();
        let a = c.now();
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let measured = c.now() - a;
        let real = t.elapsed().as_nanos() as u64;
        // Calibrated against the monotonic clock: within 5 %.
        assert!(measured.abs_diff(real) * 20 < real, "{measured} vs {real}");
    }
}
