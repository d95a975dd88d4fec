//! Results, computed as perftest computes them (spec 3.4 and 3.5), from timestamps in "cycles".
//! rs tools count nanoseconds, so their cycle rate is 10^9 Hz (1000 cycles per µs).

/// Cycles per second of the rs clock (nanoseconds).
pub const HZ: f64 = 1e9;
/// Cycles per microsecond.
pub const MHZ: f64 = 1000.0;
/// "MB/sec" is MiB/s.
pub const MIB: f64 = 1_048_576.0;
/// "Gb/sec" is 10^9 bit/s.
pub const GBIT: f64 = 125_000_000.0;

/// A bandwidth result line.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwResult {
    /// Message size.
    pub size: u64,
    /// Messages counted (iters × QPs, or those in the sampling window).
    pub iters: u64,
    /// Peak bandwidth in the chosen unit (0 when not measured).
    pub peak: f64,
    /// Average bandwidth.
    pub avg: f64,
    /// Messages per second, millions.
    pub msg_rate: f64,
}

/// Average bandwidth and message rate of `n` messages of `size` bytes in `cycles`.
pub fn bw_avg(size: u64, n: u64, cycles: u64, unit: f64) -> (f64, f64) {
    if cycles == 0 {
        return (0.0, 0.0);
    }
    let avg = (size as f64 * n as f64 * HZ) / (cycles as f64 * unit);
    let rate = (n as f64 * HZ) / (cycles as f64 * 1e6);
    (avg, rate)
}

/// Peak bandwidth per spec 3.4: the fastest per-message time over every window from a post
/// index `i` (stepping by the post list) to a completion index `j` that a completion covers.
/// `tposted[k]` is when WR k was posted; `tcompleted[j]` when the completion covering WR j was
/// seen. Both have `n` entries.
pub fn bw_peak(
    size: u64,
    tposted: &[u64],
    tcompleted: &[u64],
    post_list: u64,
    cq_mod: u64,
    unit: f64,
) -> f64 {
    let n = tposted.len().min(tcompleted.len()) as u64;
    if n == 0 {
        return 0.0;
    }
    let cq_mod = cq_mod.max(1);
    let post_list = post_list.max(1);
    let mut d = tcompleted[(n - 1) as usize].saturating_sub(tposted[0]);
    let mut i = 0;
    while i < n {
        let t0 = tposted[i as usize];
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < n {
            let t = tcompleted[j as usize].saturating_sub(t0) / (j - i + 1);
            d = d.min(t);
            j += cq_mod;
        }
        if n % cq_mod != 0 {
            let j = n - 1;
            d = d.min(tcompleted[j as usize].saturating_sub(t0) / (j - i + 1));
        }
        i += post_list;
    }
    if d == 0 {
        return 0.0;
    }
    (size as f64 * HZ) / (d as f64 * unit)
}

/// A latency summary line (spec 3.5), in µs (or cycles with `-C`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatResult {
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Smallest sample.
    pub min: f64,
    /// Second-largest sample.
    pub max: f64,
    /// Median (of all but the two largest).
    pub typical: f64,
    /// Mean (of all but the two largest).
    pub avg: f64,
    /// perftest's standard deviation (integer µs differences).
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// A latency line of the duration mode (`-D`, spec 3.5).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LatDurationResult {
    /// Message size.
    pub size: u64,
    /// Iterations completed in the sampling window.
    pub iters: u64,
    /// Mean latency: the window over the iterations, per round-trip factor.
    pub avg: f64,
    /// Iterations per second.
    pub tps: f64,
}

/// The duration mode's line: `iters` iterations in `cycles`; `per_usec` as in [`lat_summary`].
pub fn lat_duration(size: u64, iters: u64, cycles: u64, per_usec: f64) -> LatDurationResult {
    // perftest divides by zero here; an empty window prints zeros instead.
    if iters == 0 || cycles == 0 {
        return LatDurationResult {
            size,
            iters,
            ..Default::default()
        };
    }
    LatDurationResult {
        size,
        iters,
        avg: cycles as f64 / per_usec / iters as f64,
        tps: iters as f64 / (cycles as f64 / HZ),
    }
}

/// The per-round-trip samples in cycles: differences of consecutive post times.
pub fn lat_samples(tposted: &[u64]) -> Vec<u64> {
    tposted
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect()
}

/// Summarises `samples` (cycles; sorted here) per spec 3.5. `per_usec` is the number of cycles
/// per reported unit times the round-trip factor (MHz × 2 for WRITE/SEND, MHz for READ).
pub fn lat_summary(size: u64, iters: u64, samples: &mut [u64], per_usec: f64) -> LatResult {
    samples.sort_unstable();
    let conv = |c: u64| c as f64 / per_usec;
    if samples.len() < 3 {
        // Too few samples for perftest's trimming (it requires at least 5 iterations).
        let v = samples.first().copied().map(conv).unwrap_or(0.0);
        return LatResult {
            size,
            iters,
            min: v,
            max: v,
            typical: v,
            avg: v,
            stdev: 0.0,
            p99: v,
            p999: v,
        };
    }
    let m = samples.len() - 2;
    let typical = if m % 2 == 0 {
        conv((samples[m / 2 - 1] + samples[m / 2]) / 2)
    } else {
        conv(samples[m / 2])
    };
    let avg = samples[..m].iter().map(|&c| conv(c)).sum::<f64>() / m as f64;
    let var = samples[..m]
        .iter()
        .map(|&c| {
            let d = (avg - conv(c)) as i64 as f64;
            d * d
        })
        .sum::<f64>()
        / m as f64;
    let pct = |p: f64| {
        let idx = ((p * m as f64).ceil() as usize).min(samples.len() - 1);
        conv(samples[idx])
    };
    LatResult {
        size,
        iters,
        min: conv(samples[0]),
        max: conv(samples[m]),
        typical,
        avg,
        stdev: var.sqrt(),
        p99: pct(0.99),
        p999: pct(0.999),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_units_match_perftest() {
        // 1000 messages of 65536 B in 1 s: 62.5 MiB/s... avg/msgrate = size*1e6/2^20.
        let (avg, rate) = bw_avg(65536, 1000, 1_000_000_000, MIB);
        assert!((avg - 62.5).abs() < 1e-9);
        assert!((rate - 0.001).abs() < 1e-12);
        assert!((avg / rate - 65536.0 * 1e6 / MIB).abs() < 1e-6);
        let (gb, _) = bw_avg(125_000_000, 1, 1_000_000_000, GBIT);
        assert!((gb - 1.0).abs() < 1e-12);
        assert_eq!(bw_avg(1, 1, 0, MIB), (0.0, 0.0));
    }

    #[test]
    fn peak_is_the_fastest_window() {
        // 4 WRs, cq_mod 1: posted at 0,10,20,30; completed at 100,110,120,200.
        // Windows (ns per message): i=0: 100,55,40,50; i=1: 100,55,63(190/3);
        // i=2: 100,90; i=3: 170. The minimum is 40 ns -> 1 byte * 1e9 / 40 = 25e6 B/s.
        let tp = [0, 10, 20, 30];
        let tc = [100, 110, 120, 200];
        let peak = bw_peak(1, &tp, &tc, 1, 1, 1.0);
        assert!((peak - 25e6).abs() < 1e-3, "{peak}");
        // cq_mod 2: only j = 1 and 3 are completion indices: i=0: j=1 -> 110/2=55,
        // j=3 -> 200/4 = 50; i=1: j=1 -> 100, j=3 -> 190/3 = 63; i=2: j=3 -> 180/2 = 90;
        // i=3: j=3 -> 170. Minimum 50.
        let peak = bw_peak(1, &tp, &tc, 1, 2, 1.0);
        assert!((peak - 20e6).abs() < 1e-3, "{peak}");
        // cq_mod 3 with n = 4: j = 2 and the last (3). i=0: 120/3=40.
        let peak = bw_peak(1, &tp, &tc, 1, 3, 1.0);
        assert!((peak - 25e6).abs() < 1e-3, "{peak}");
    }

    #[test]
    fn latency_summary_by_hand() {
        // 7 iterations -> 6 samples (µs with per_usec 1): 5, 1, 9, 3, 100, 7.
        // Sorted: 1 3 5 7 9 100; m = 4: min 1, max = s[4] = 9, typical = (3+5)/2 = 4,
        // avg = (1+3+5+7)/4 = 4, stdev: diffs 3,1,-1,-3 -> (9+1+1+9)/4 = 5 -> sqrt 2.236,
        // p99 = s[ceil(3.96)] = s[4] = 9, p99.9 = s[ceil(3.996)] = s[4] = 9.
        let tp = [0, 5, 6, 15, 18, 118, 125];
        let mut s = lat_samples(&tp);
        assert_eq!(s, vec![5, 1, 9, 3, 100, 7]);
        let r = lat_summary(2, 7, &mut s, 1.0);
        assert_eq!((r.min, r.max, r.typical, r.avg), (1.0, 9.0, 4.0, 4.0));
        assert!((r.stdev - 5f64.sqrt()).abs() < 1e-12);
        assert_eq!((r.p99, r.p999), (9.0, 9.0));
    }

    #[test]
    fn latency_duration_as_perftest_prints_it() {
        // ib_write_lat -D 3 in the VM: 58505 iterations in 3.0018 s -> 25.65 µs, 19489.6 tps.
        let r = lat_duration(2, 58505, 3_001_800_000, MHZ * 2.0);
        assert!((r.avg - 25.654).abs() < 0.001, "{r:?}");
        assert!((r.tps - 19489.97).abs() < 0.01, "{r:?}");
        assert_eq!(lat_duration(2, 0, 5, 1.0).avg, 0.0);
    }

    #[test]
    fn latency_typical_odd_and_integer_stdev() {
        // 6 samples in ns, per_usec = 2000 (write: MHz 1000 x rtt 2).
        // 2000,2100,2300,2900,3000,9000 ns -> µs 1.0,1.05,1.15,1.45,1.5,4.5; m = 4... use 5
        // samples + 2 dropped: 7 samples.
        let mut s = vec![2000, 2100, 2300, 2900, 3000, 9000, 9500];
        let r = lat_summary(2, 8, &mut s, 2000.0);
        // m = 5: typical = s[2] = 2300 -> 1.15; avg = (1+1.05+1.15+1.45+1.5)/5 = 1.23.
        assert!((r.typical - 1.15).abs() < 1e-12);
        assert!((r.avg - 1.23).abs() < 1e-12);
        // Each |avg - x| < 1 µs truncates to 0: perftest prints 0.00.
        assert_eq!(r.stdev, 0.0);
        assert_eq!(r.max, 4.5);
        // p99 = s[ceil(4.95)] = s[5] = 9000 -> 4.5.
        assert_eq!(r.p99, 4.5);
    }
}
