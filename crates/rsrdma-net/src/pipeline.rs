//! The bookkeeping of a posting pipeline, with no I/O: how many work requests to post next,
//! given how many are in flight. [`crate::RawConn::pipeline`] and friends drive it with real
//! posts and polls; the unit tests drive it with fakes.

use std::time::Duration;

/// Keeps up to `depth` requests in flight until `iters` have completed, posting in groups of
/// at least `batch` (except the last group).
#[derive(Debug, Clone)]
pub struct Pipeline {
    iters: u64,
    depth: u64,
    batch: u64,
    posted: u64,
    completed: u64,
}

impl Pipeline {
    /// A pipeline of `iters` requests, `depth` in flight, refilled `batch` at a time. `depth`
    /// and `batch` are at least 1, and `batch` at most `depth`.
    pub fn new(iters: u64, depth: u32, batch: u32) -> Pipeline {
        let depth = u64::from(depth.max(1));
        let batch = u64::from(batch.max(1)).min(depth);
        Pipeline {
            iters,
            depth,
            batch,
            posted: 0,
            completed: 0,
        }
    }

    /// The ids (`posted..posted+n`) to post now: none while fewer than `batch` slots are free,
    /// unless what remains to post is smaller than a batch.
    pub fn next_ids(&self) -> std::ops::Range<u64> {
        let free = self.depth - (self.posted - self.completed);
        let left = self.iters - self.posted;
        let n = free.min(left);
        if n == 0 || (n < self.batch && n < left) {
            return self.posted..self.posted;
        }
        self.posted..self.posted + n
    }

    /// Records that `n` requests were posted.
    pub fn posted(&mut self, n: u64) {
        self.posted += n;
        debug_assert!(self.posted - self.completed <= self.depth && self.posted <= self.iters);
    }

    /// Records that `n` requests completed.
    pub fn completed(&mut self, n: u64) {
        self.completed += n;
        debug_assert!(self.completed <= self.posted);
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.posted - self.completed
    }

    /// True when every request has completed.
    pub fn done(&self) -> bool {
        self.completed >= self.iters
    }

    /// Requests posted so far.
    pub fn posted_count(&self) -> u64 {
        self.posted
    }

    /// Requests completed so far.
    pub fn completed_count(&self) -> u64 {
        self.completed
    }
}

/// What a pipeline or drain run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunStats {
    /// Work requests completed.
    pub completed: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Wall time from the first post to the last completion.
    pub elapsed: Duration,
    /// Calls into the provider to post.
    pub post_calls: u64,
    /// Calls into the provider to poll, including empty ones.
    pub poll_calls: u64,
    /// With the probe on (`RSRDMA_PROBE=1`): time spent inside post calls.
    pub post_time: Option<Duration>,
    /// With the probe on: time spent inside poll calls.
    pub poll_time: Option<Duration>,
}

impl RunStats {
    /// Payload throughput in Gb/s (10^9 bits per second).
    pub fn gbits_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        self.bytes as f64 * 8.0 / secs / 1e9
    }

    /// Completed requests per second, in millions.
    pub fn mpps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        self.completed as f64 / secs / 1e6
    }

    /// The probe's report: each share of the loop's time and ns per work request, or `None`
    /// when the probe was off.
    pub fn probe_report(&self) -> Option<String> {
        let (post, poll) = (self.post_time?, self.poll_time?);
        let total = self.elapsed.as_nanos().max(1) as f64;
        let per = |d: Duration| d.as_nanos() as f64 / self.completed.max(1) as f64;
        Some(format!(
            "probe: post {:.1}% ({:.0} ns/WR, {} calls), poll {:.1}% ({:.0} ns/WR, {} calls), other {:.1}%",
            post.as_nanos() as f64 * 100.0 / total,
            per(post),
            self.post_calls,
            poll.as_nanos() as f64 * 100.0 / total,
            per(poll),
            self.poll_calls,
            (total - post.as_nanos() as f64 - poll.as_nanos() as f64).max(0.0) * 100.0 / total,
        ))
    }
}

/// True when `RSRDMA_PROBE` is set to something other than `0` or empty.
pub fn probe_enabled() -> bool {
    std::env::var_os("RSRDMA_PROBE").is_some_and(|v| !v.is_empty() && v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a pipeline against a fake queue that completes a pseudo-random number of the
    /// oldest requests per poll; checks the depth bound and that every id is posted once.
    fn run(iters: u64, depth: u32, batch: u32, seed: u64) {
        let mut p = Pipeline::new(iters, depth, batch);
        let mut next_expected = 0;
        let mut rng = seed | 1;
        let mut rounds = 0;
        while !p.done() {
            let ids = p.next_ids();
            assert_eq!(ids.start, next_expected, "ids are posted in order, once");
            let n = ids.end - ids.start;
            if n > 0 {
                assert!(
                    n >= u64::from(batch).min(u64::from(depth)) || ids.end == iters,
                    "short batch mid-run"
                );
            }
            next_expected = ids.end;
            p.posted(n);
            assert!(p.in_flight() <= u64::from(depth.max(1)));
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let finish = (rng % (p.in_flight() + 1)).max(u64::from(p.in_flight() > 0));
            p.completed(finish);
            rounds += 1;
            assert!(rounds < 10 * iters + 100, "no progress");
        }
        assert_eq!(p.posted_count(), iters);
        assert_eq!(p.completed_count(), iters);
    }

    #[test]
    fn pipelines_keep_the_depth_and_post_every_id_once() {
        for (iters, depth, batch) in [
            (0, 4, 1),
            (1, 1, 1),
            (10, 4, 1),
            (1000, 128, 1),
            (1000, 128, 32),
            (37, 8, 8),
            (5, 16, 4),
            (100, 3, 7),
        ] {
            for seed in 1..20 {
                run(iters, depth, batch, seed);
            }
        }
    }

    #[test]
    fn batches_wait_for_enough_room() {
        let mut p = Pipeline::new(100, 8, 4);
        assert_eq!(p.next_ids(), 0..8);
        p.posted(8);
        p.completed(3);
        assert_eq!(
            p.next_ids(),
            8..8,
            "3 free slots are less than a batch of 4"
        );
        p.completed(1);
        assert_eq!(p.next_ids(), 8..12);
    }

    #[test]
    fn stats_arithmetic() {
        let s = RunStats {
            completed: 1000,
            bytes: 1_000_000_000,
            elapsed: Duration::from_secs(1),
            ..Default::default()
        };
        assert!((s.gbits_per_sec() - 8.0).abs() < 1e-9);
        assert!((s.mpps() - 0.001).abs() < 1e-12);
        assert_eq!(s.probe_report(), None);
        let s = RunStats {
            post_time: Some(Duration::from_millis(250)),
            poll_time: Some(Duration::from_millis(500)),
            ..s
        };
        let r = s.probe_report().unwrap();
        assert!(r.contains("post 25.0%") && r.contains("poll 50.0%"), "{r}");
    }
}
