//! The duration mode's sampling window (`-D`, `-f`): the count between the margins.

use crate::args::Params;

/// The duration mode's sampling window, in clock ns.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    start_at: u64,
    end_at: u64,
    stop_at: u64,
    start: Option<(u64, u64)>,
    end: Option<(u64, u64)>,
    /// The latest tick: the window's end when the run stopped before `end_at` was ticked (a
    /// peer whose own duration ran out first stops answering, and no completion comes after
    /// `end_at`).
    last: Option<(u64, u64)>,
}

impl Window {
    pub(super) fn new(p: &Params, now: u64) -> Option<Window> {
        let d = p.duration?;
        let m = if d > 2 * p.margin { p.margin } else { 0 };
        let s = 1_000_000_000;
        Some(Window {
            start_at: now + m * s,
            end_at: now + (d - m) * s,
            stop_at: now + d * s,
            start: None,
            end: None,
            last: None,
        })
    }

    /// Records the counter at the window's edges; true once the run should stop.
    pub(super) fn tick(&mut self, now: u64, count: u64) -> bool {
        if self.start.is_none() && now >= self.start_at {
            self.start = Some((count, now));
        }
        if self.end.is_none() && now >= self.end_at {
            self.end = Some((count, now));
        }
        self.last = Some((count, now));
        now >= self.stop_at
    }

    /// When the run ends (clock ns).
    pub(super) fn stop_at(&self) -> u64 {
        self.stop_at
    }

    pub(super) fn measured(&self) -> (u64, u64) {
        match (self.start, self.end.or(self.last)) {
            (Some((c0, t0)), Some((c1, t1))) => (c1 - c0, t1.saturating_sub(t0)),
            _ => (0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kind, Tool, Verb};

    #[test]
    fn duration_window() {
        let p = crate::args::parse(
            Tool::new(Verb::Write, Kind::Bw),
            &["-D".to_string(), "5".to_string(), "h".to_string()],
        )
        .unwrap();
        let s = 1_000_000_000;
        let mut w = Window::new(&p, 0).unwrap();
        assert!(!w.tick(s, 10));
        assert!(!w.tick(2 * s, 100));
        assert!(!w.tick(3 * s, 300));
        assert!(w.tick(5 * s, 500));
        assert_eq!(w.measured(), (200, s));
    }

    /// A peer whose duration ran out first stops answering: no completion reaches the
    /// window's end, and the window closes at the last completion instead of measuring 0.
    #[test]
    fn a_peer_that_stops_early_still_gives_a_window() {
        let p = crate::args::parse(
            Tool::new(Verb::Write, Kind::Bw),
            &["-D".to_string(), "5".to_string(), "h".to_string()],
        )
        .unwrap();
        let s = 1_000_000_000;
        let mut w = Window::new(&p, 0).unwrap();
        // The window is 2 s .. 3 s (a 2 s margin at each end of 5 s): it opens, then the
        // completions stop before 3 s.
        assert!(!w.tick(s, 10));
        assert!(!w.tick(2 * s, 60));
        assert!(!w.tick(2 * s + s / 2, 110));
        assert_eq!(w.measured(), (50, s / 2));
    }
}
