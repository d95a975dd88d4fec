//! Timers as a table (quinn style): each kind has one optional deadline.

use std::time::Instant;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Timer {
    /// Send a PING: nothing heard for the keepalive interval.
    KeepAlive = 0,
    /// Declare the peer dead: nothing heard for the peer timeout.
    PeerDead = 1,
}

#[derive(Debug, Default)]
pub(crate) struct Timers {
    at: [Option<Instant>; 2],
}

impl Timers {
    #[inline]
    pub(crate) fn set(&mut self, t: Timer, at: Option<Instant>) {
        self.at[t as usize] = at;
    }

    pub(crate) fn get(&self, t: Timer) -> Option<Instant> {
        self.at[t as usize]
    }

    pub(crate) fn clear(&mut self) {
        self.at = [None; 2];
    }

    #[inline]
    pub(crate) fn next(&self) -> Option<Instant> {
        // Not `iter().flatten().min()`: this runs at every driver step.
        match self.at {
            [Some(a), Some(b)] => Some(a.min(b)),
            [a, b] => a.or(b),
        }
    }

    #[inline]
    pub(crate) fn expired(&self, t: Timer, now: Instant) -> bool {
        self.at[t as usize].is_some_and(|at| at <= now)
    }
}

/// `from + d`, clamped far into the future instead of overflowing: a keepalive interval or
/// peer timeout of `Duration::MAX` means "never", not a panic inside a timer tick.
pub(crate) fn later(from: Instant, d: std::time::Duration) -> Instant {
    const FAR: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);
    from.checked_add(d.min(FAR))
        .or_else(|| from.checked_add(FAR))
        .unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::later;
    use std::time::{Duration, Instant};

    #[test]
    fn a_huge_interval_clamps_instead_of_overflowing() {
        let now = Instant::now();
        assert!(later(now, Duration::MAX) > now + Duration::from_secs(3_000_000_000));
        assert_eq!(
            later(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }
}
