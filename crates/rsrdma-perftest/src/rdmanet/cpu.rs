//! This process's CPU time, so that a run can say what its transfer cost (the `cpu:` line
//! `cargo xtask bench rdmanet` reads): setup (device, registration, connection) is left out
//! by taking the difference around the transfer only.

use std::time::Duration;

/// User + system CPU time of every thread of this process so far (`getrusage(RUSAGE_SELF)`);
/// zero if the call fails (it cannot with these arguments).
pub fn process_cpu() -> Duration {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage` for the duration of the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_costs_cpu_time() {
        let before = process_cpu();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spent = process_cpu().saturating_sub(before);
        assert!(
            spent >= Duration::from_millis(10),
            "{spent:?} for 50 ms of spinning"
        );
    }
}
