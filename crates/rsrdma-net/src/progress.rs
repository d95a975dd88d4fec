//! How a connection waits for completions: busy polling, sleeping on a completion channel, or
//! both in turn. Shared by `Conn` and `PacketConn`, so the three modes mean the same thing
//! everywhere.
//!
//! The loop is written against [`Waitable`], not a `Cq`, so that it can be tested without a
//! device and a connection can wait on whatever it owns (one CQ, or a CQ behind a lock).

use crate::error::{NetError, Result};
use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A cheap, slightly late `Instant` for the data path's timers and deadlines.
///
/// `Instant::now` reads `CLOCK_MONOTONIC`, which is a system call wherever the vDSO cannot
/// read the clock source itself (an HPET clock source, as in the emulated test VM, where the
/// read was a tenth of a busy round trip's time). `CLOCK_MONOTONIC_COARSE` is always answered
/// by the vDSO: it is the same clock as of the kernel's last tick, so it never leads
/// `CLOCK_MONOTONIC`, but it may lag it by a tick, or by much more where timer interrupts come
/// late (an overloaded emulated VM). Good for keepalive timers and time-outs (a deadline
/// checked with it fires late, never early), not for measuring.
///
/// The mapping to `Instant` is calibrated once against the precise `CLOCK_MONOTONIC` (the
/// clock `Instant` reads on Linux), never against the coarse clock itself: calibrating against
/// a coarse reading that happened to be stale would make every later result lead the true
/// time by that staleness, and time-outs fire early.
pub(crate) fn coarse_now() -> Instant {
    static BASE: OnceLock<(Instant, Duration)> = OnceLock::new();
    let (base, mono_base) = *BASE.get_or_init(|| {
        // `Instant` first, then the precise clock: the pair maps a clock value to an
        // `Instant` no later than the true one.
        let now = Instant::now();
        (now, read_clock(libc::CLOCK_MONOTONIC))
    });
    let coarse = read_clock(libc::CLOCK_MONOTONIC_COARSE);
    // The coarse clock moves once a tick, and a busy loop reads it many times a tick: the
    // conversion of the last reading is kept (per thread, so without any sharing).
    thread_local! {
        static LAST: Cell<Option<(Duration, Instant)>> = const { Cell::new(None) };
    }
    if let Some((at, instant)) = LAST.get() {
        if at == coarse {
            return instant;
        }
    }
    let instant = match coarse.checked_sub(mono_base) {
        Some(ahead) => base + ahead,
        // A coarse reading from before the calibration (it lagged then): earlier still.
        None => base.checked_sub(mono_base - coarse).unwrap_or(base),
    };
    LAST.set(Some((coarse, instant)));
    instant
}

/// `clock_gettime(clock)`; zero if it fails (it does not for the monotonic clocks).
fn read_clock(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// How a blocking call waits for the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PollMode {
    /// Poll the completion queue in a loop: the lowest latency, one core per waiting thread.
    Busy,
    /// Sleep on the completion channel until the NIC raises an event: no CPU while idle, a
    /// system call and a wake-up per wait.
    Event,
    /// Poll for `spin`, then sleep as in `Event`: close to `Busy` under load, close to `Event`
    /// when idle (rsocket's `polling_time` does the same).
    Adaptive {
        /// How long to poll before sleeping.
        spin: Duration,
    },
}

impl Default for PollMode {
    /// `Adaptive` with 20 µs of polling.
    fn default() -> Self {
        PollMode::Adaptive {
            spin: Duration::from_micros(20),
        }
    }
}

impl PollMode {
    /// Whether completion queues for this mode need a completion channel.
    pub fn needs_channel(self) -> bool {
        !matches!(self, PollMode::Busy)
    }

    /// How long to poll before sleeping (`None`: never sleep).
    fn spin(self) -> Option<Duration> {
        match self {
            PollMode::Busy => None,
            PollMode::Event => Some(Duration::ZERO),
            PollMode::Adaptive { spin } => Some(spin),
        }
    }
}

/// What [`wait_until`] sleeps on: a completion queue with a channel, in practice.
pub trait Waitable {
    /// Asks for an event at the next completion (`Cq::arm`).
    fn arm(&self) -> Result<()>;
    /// Sleeps until an event or `deadline`; `Ok(false)` when the deadline passed first.
    fn sleep(&self, deadline: Option<Instant>) -> Result<bool>;
}

impl Waitable for rsrdma::Cq {
    fn arm(&self) -> Result<()> {
        rsrdma::Cq::arm(self, false).map_err(NetError::from)
    }

    fn sleep(&self, deadline: Option<Instant>) -> Result<bool> {
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match self.wait(timeout) {
            Ok(()) => Ok(true),
            Err(rsrdma::Error::Timeout { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// The clocks a wait reads: the real ones ([`SystemClock`]), or a simulated one in the
/// host tests of the operations, where a deadline can pass at the very moment a completion
/// lands.
pub(crate) trait Clock {
    /// The precise time (the adaptive spin's length is measured with it).
    fn now(&self) -> Instant;
    /// The cheap, possibly late time deadlines are checked with ([`coarse_now`]).
    fn coarse(&self) -> Instant;
}

/// `Instant::now` and [`coarse_now`].
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn coarse(&self) -> Instant {
        coarse_now()
    }
}

/// Runs `progress` (poll the CQ, feed the protocol, check the condition) until it returns
/// true or `deadline` passes, waiting between calls as `mode` says. Returns false on the
/// deadline. In the sleeping modes the CQ is armed and `progress` runs once more before each
/// sleep, so a completion that arrived before the arm is not missed.
///
/// Once `progress` returns true it is never called again, and the call returns true: an
/// attempt may consume as its side effect (a message taken, its slot reposted), so a success
/// must never be followed by another attempt whose failure would report a timeout.
///
/// The spinning loop reads no precise clock: busy polling without a deadline reads none at
/// all, and a deadline is checked with the coarse clock (it may pass a few milliseconds
/// late, never early). Only the spin phase of `Adaptive`, microseconds long, reads the
/// precise one.
///
/// # Errors
/// Whatever `progress` or the CQ returns.
pub fn wait_until(
    mode: PollMode,
    cq: &impl Waitable,
    deadline: Option<Instant>,
    progress: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    wait_until_on(&SystemClock, mode, cq, deadline, progress)
}

/// [`wait_until`] reading `clock`.
pub(crate) fn wait_until_on(
    clock: &impl Clock,
    mode: PollMode,
    cq: &impl Waitable,
    deadline: Option<Instant>,
    mut progress: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let spin = mode.spin();
    let started = match spin {
        Some(s) if !s.is_zero() => Some(clock.now()),
        _ => None,
    };
    loop {
        if progress()? {
            return Ok(true);
        }
        if deadline.is_some_and(|d| clock.coarse() >= d) {
            return Ok(false);
        }
        let spun = match (spin, started) {
            (Some(s), Some(t)) => clock.now().saturating_duration_since(t) >= s,
            (Some(_), None) => true,
            (None, _) => false,
        };
        match spin {
            Some(_) if spun => {
                cq.arm()?;
                if progress()? {
                    return Ok(true);
                }
                if !cq.sleep(deadline)? {
                    // The deadline passed: one last look, whose answer is the call's.
                    return progress();
                }
            }
            // The adaptive spin is short and may share a core with a sibling thread: a
            // pause per poll. A busy wait polls back to back, as perftest does: the pause
            // (up to ~140 cycles on recent x86 cores; an exit to the emulator's main loop
            // under QEMU's TCG, ~0.5 µs) would be added to how late a completion is seen.
            Some(_) => std::hint::spin_loop(),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_never_leads_the_precise_one_and_advances() {
        let first = coarse_now();
        for _ in 0..10_000 {
            let c = coarse_now();
            assert!(c <= Instant::now(), "the coarse clock led the precise one");
        }
        std::thread::sleep(Duration::from_millis(50));
        let later = coarse_now();
        assert!(
            later >= first + Duration::from_millis(20),
            "{:?}",
            later - first
        );
        assert!(later <= Instant::now());
    }

    /// A CQ stand-in: counts arms and sleeps; a sleep "delivers" the completion.
    #[derive(Default)]
    struct FakeCq {
        arms: Cell<u32>,
        sleeps: Cell<u32>,
        fires: Cell<bool>,
    }

    impl Waitable for FakeCq {
        fn arm(&self) -> Result<()> {
            self.arms.set(self.arms.get() + 1);
            Ok(())
        }
        fn sleep(&self, deadline: Option<Instant>) -> Result<bool> {
            self.sleeps.set(self.sleeps.get() + 1);
            if self.fires.get() {
                return Ok(true);
            }
            if let Some(d) = deadline {
                std::thread::sleep(d.saturating_duration_since(Instant::now()));
            }
            Ok(false)
        }
    }

    #[test]
    fn busy_never_arms_or_sleeps() {
        let cq = FakeCq::default();
        let mut n = 0;
        let done = wait_until(PollMode::Busy, &cq, None, || {
            n += 1;
            Ok(n == 1000)
        })
        .unwrap();
        assert!(done);
        assert_eq!((cq.arms.get(), cq.sleeps.get()), (0, 0));
    }

    #[test]
    fn event_arms_rechecks_then_sleeps() {
        let cq = FakeCq {
            fires: Cell::new(true),
            ..Default::default()
        };
        let mut n = 0;
        // Ready on the third progress call: the one after the first sleep.
        let done = wait_until(PollMode::Event, &cq, None, || {
            n += 1;
            Ok(n == 3)
        })
        .unwrap();
        assert!(done);
        assert_eq!((cq.arms.get(), cq.sleeps.get()), (1, 1));
    }

    #[test]
    fn a_completion_before_the_arm_is_not_slept_through() {
        let cq = FakeCq::default();
        let mut n = 0;
        // Ready on the re-check right after arming: no sleep at all.
        let done = wait_until(PollMode::Event, &cq, None, || {
            n += 1;
            Ok(n == 2)
        })
        .unwrap();
        assert!(done);
        assert_eq!((cq.arms.get(), cq.sleeps.get()), (1, 0));
    }

    /// F1: the look right after a sleep that ran into the deadline succeeds (a completion
    /// landed at that moment). Its success is the call's: `progress` consumed something to
    /// report it, and must not be called again (a second look would find nothing, and the
    /// caller would get a timeout for a message it no longer has).
    #[test]
    fn a_success_at_the_deadline_is_returned_and_never_followed_by_another_attempt() {
        let modes = [
            PollMode::Event,
            PollMode::default(),
            PollMode::Adaptive {
                spin: Duration::from_millis(2),
            },
        ];
        for mode in modes {
            let cq = FakeCq::default();
            let deadline = Some(Instant::now() + Duration::from_millis(20));
            let mut succeeded = false;
            let done = wait_until(mode, &cq, deadline, || {
                assert!(!succeeded, "{mode:?}: an attempt after a success");
                succeeded = cq.sleeps.get() == 1;
                Ok(succeeded)
            })
            .unwrap();
            assert!(
                done,
                "{mode:?}: the success at the deadline was reported as a timeout"
            );
            assert_eq!(cq.sleeps.get(), 1, "{mode:?}");
        }
    }

    #[test]
    fn deadlines_end_every_mode() {
        for mode in [PollMode::Busy, PollMode::Event, PollMode::default()] {
            let cq = FakeCq::default();
            let t0 = Instant::now();
            let deadline = Some(t0 + Duration::from_millis(30));
            let done = wait_until(mode, &cq, deadline, || Ok(false)).unwrap();
            assert!(!done, "{mode:?}");
            let took = t0.elapsed();
            assert!(took >= Duration::from_millis(30), "{mode:?} {took:?}");
            assert!(took < Duration::from_secs(2), "{mode:?} {took:?}");
        }
    }

    #[test]
    fn adaptive_spins_before_it_sleeps() {
        let cq = FakeCq {
            fires: Cell::new(true),
            ..Default::default()
        };
        let spin = Duration::from_millis(20);
        let t0 = Instant::now();
        let mut first_sleep_at = None;
        let done = wait_until(PollMode::Adaptive { spin }, &cq, None, || {
            if cq.arms.get() > 0 && first_sleep_at.is_none() {
                first_sleep_at = Some(t0.elapsed());
            }
            Ok(cq.sleeps.get() == 1)
        })
        .unwrap();
        assert!(done);
        assert!(first_sleep_at.unwrap() >= spin, "{first_sleep_at:?}");
    }
}
