//! Deadlines from caller-given durations, clamped instead of overflowing.
//!
//! `Instant + Duration` panics when the sum does not fit, and a user may well pass
//! `Duration::MAX` for "no limit" (a linger, a connect or read timeout, a lease): every
//! deadline in this crate is made here, so none of those can panic, in a `Drop` or elsewhere.

use std::time::{Duration, Instant};

/// How far a clamped deadline lies: far beyond any wait, well inside what `Instant` holds.
const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The instant `timeout` after `now`, clamped to [`FAR`] after it.
pub(crate) fn deadline_from(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout.min(FAR))
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// The instant `timeout` from now, clamped (`Duration::MAX` means no practical limit).
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    deadline_from(Instant::now(), timeout)
}

/// [`deadline_after`] for an optional timeout (`None`: no deadline).
pub(crate) fn deadline_within(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(deadline_after)
}

/// `d` in whole milliseconds, rounded up (saturating), for an error that names a limit: a
/// wait that measured what was left of its deadline from a moment after it was set (1 s less a
/// few microseconds) says 1000 ms, not 999.
pub(crate) fn whole_millis(d: Duration) -> u64 {
    d.as_nanos()
        .div_ceil(1_000_000)
        .try_into()
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_named_in_whole_milliseconds_rounded_up() {
        assert_eq!(whole_millis(Duration::from_nanos(999_999_999)), 1000);
        assert_eq!(whole_millis(Duration::from_millis(1000)), 1000);
        assert_eq!(whole_millis(Duration::from_nanos(1)), 1);
        assert_eq!(whole_millis(Duration::ZERO), 0);
        assert_eq!(whole_millis(Duration::MAX), u64::MAX);
    }

    #[test]
    fn huge_durations_clamp_instead_of_panicking() {
        let now = Instant::now();
        for t in [Duration::MAX, Duration::from_secs(u64::MAX), FAR * 3] {
            let d = deadline_from(now, t);
            assert!(d > now + Duration::from_secs(50 * 365 * 86_400), "{t:?}");
        }
        assert_eq!(
            deadline_from(now, Duration::from_millis(5)),
            now + Duration::from_millis(5)
        );
        assert!(deadline_within(Some(Duration::MAX)).is_some());
        assert!(deadline_within(None).is_none());
    }
}
