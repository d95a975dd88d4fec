//! The lines the two tools print, as gordma's `go_rdmanet_*` print them (pure).
//!
//! Durations are written as Go's `time.Duration.String` writes them (`1.5ms`, `12.345µs`,
//! `2.000001s`), since gordma prints its durations that way; rates are computed from the
//! exact nanosecond count.

use crate::stats::{bw_avg, BwResult, MIB};
use std::time::Duration;

/// How the bandwidth client sent: one message per call, or groups of `b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendMode {
    /// `send_msg` per message.
    Single,
    /// `send_batch` with groups of this many.
    Batch(u32),
    /// `--zero-copy`: `start_send_buffer` from a ring of this many registered buffers.
    Buffers(u32),
    /// `--both-ways`: `send_msg` per message, then as many back (the count is both ways).
    BothWays,
    /// `--rails N`: `RailConn::send_msg` per message, timed until every one is confirmed.
    Rails(u32),
}

/// `SendMsg: sent N x S bytes in D: X Gb/s, Y Mpps` (or `SendBatch(b): …`).
pub fn send_line(mode: SendMode, count: u64, size: u64, elapsed: Duration) -> String {
    let label = match mode {
        SendMode::Single => "SendMsg".to_string(),
        SendMode::Batch(b) => format!("SendBatch({b})"),
        SendMode::Buffers(n) => format!("SendBuffer({n})"),
        SendMode::BothWays => "BothWays".to_string(),
        SendMode::Rails(n) => format!("Rails({n})"),
    };
    let secs = elapsed.as_secs_f64();
    let (gbits, mpps) = if secs > 0.0 {
        (
            count as f64 * size as f64 * 8.0 / secs / 1e9,
            count as f64 / secs / 1e6,
        )
    } else {
        (0.0, 0.0)
    };
    format!(
        "{label}: sent {count} x {size} bytes in {}: {gbits:.2} Gb/s, {mpps:.3} Mpps\n",
        go_duration(elapsed)
    )
}

/// The server's line: how many messages and bytes arrived.
pub fn received_line(messages: u64, bytes: u64) -> String {
    format!("server received {messages} messages ({bytes} bytes)\n")
}

/// The memory this end registered for its connection (read by `cargo xtask bench rdmanet`).
pub fn registered_line(bytes: usize) -> String {
    format!("registered memory: {bytes} bytes for this connection\n")
}

/// The CPU time (user + sys, every thread) this end spent from the start of the transfer to
/// its end (read by `cargo xtask bench rdmanet`).
pub fn cpu_line(cpu: Duration) -> String {
    format!(
        "cpu: {:.6} s user+sys during the transfer\n",
        cpu.as_secs_f64()
    )
}

/// The latency server's line.
pub fn echoed_line(messages: u64, bytes: u64) -> String {
    format!("server echoed {messages} messages ({bytes} bytes)\n")
}

/// What a server prints once it listens.
pub fn listening_line(what: &str, addr: impl std::fmt::Display) -> String {
    format!("listening on {addr} ({what})\n")
}

/// What a server prints once a client is connected (before any data moves).
pub fn accepted_line(peer: impl std::fmt::Display) -> String {
    format!("accepted a connection from {peer}\n")
}

/// The round-trip statistics of the latency client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatSummary {
    /// Round trips measured.
    pub count: usize,
    /// Mean.
    pub avg: Duration,
    /// Median (gordma's index `len*50/100` of the sorted samples).
    pub p50: Duration,
    /// 99th percentile (index `len*99/100`).
    pub p99: Duration,
    /// Fastest.
    pub min: Duration,
    /// Slowest.
    pub max: Duration,
}

/// Sorts `samples` and summarises them; `None` when there are none.
pub fn lat_summary(samples: &mut [Duration]) -> Option<LatSummary> {
    let n = samples.len();
    if n == 0 {
        return None;
    }
    samples.sort_unstable();
    let total: u128 = samples.iter().map(Duration::as_nanos).sum();
    let avg = (total / n as u128).min(u128::from(u64::MAX)) as u64;
    Some(LatSummary {
        count: n,
        avg: Duration::from_nanos(avg),
        p50: samples[n * 50 / 100],
        p99: samples[n * 99 / 100],
        min: samples[0],
        max: samples[n - 1],
    })
}

/// `round-trips=N avg=… p50=… p99=… min=… max=…`.
pub fn lat_line(s: &LatSummary) -> String {
    format!(
        "round-trips={} avg={} p50={} p99={} min={} max={}\n",
        s.count,
        go_duration(s.avg),
        go_duration(s.p50),
        go_duration(s.p99),
        go_duration(s.min),
        go_duration(s.max)
    )
}

/// The `--raw` table line's numbers: perftest's units (its "MB/sec" is MiB/s, as ib_send_bw's
/// and gordma's `BW average[MiB/sec]`); no peak is measured, as in gordma.
pub fn raw_result(size: u64, completed: u64, elapsed: Duration) -> BwResult {
    let ns = elapsed.as_nanos().min(u128::from(u64::MAX)) as u64;
    let (avg, msg_rate) = bw_avg(size, completed, ns, MIB);
    BwResult {
        size,
        iters: completed,
        peak: 0.0,
        avg,
        msg_rate,
    }
}

/// Go's `time.Duration.String`: `0s`, `850ns`, `12.345µs`, `1.5ms`, `2.000001s`, `1m30s`,
/// `1h0m0s`; the fraction keeps every significant digit.
pub fn go_duration(d: Duration) -> String {
    const US: u128 = 1_000;
    const MS: u128 = 1_000_000;
    const S: u128 = 1_000_000_000;
    let ns = d.as_nanos();
    match ns {
        0 => "0s".into(),
        n if n < US => format!("{n}ns"),
        n if n < MS => format!("{}µs", fraction(n, 3)),
        n if n < S => format!("{}ms", fraction(n, 6)),
        n => {
            let secs = n / S;
            let (h, m) = (secs / 3600, secs / 60 % 60);
            let s = fraction((secs % 60) * S + n % S, 9);
            match (h, m) {
                (0, 0) => format!("{s}s"),
                (0, m) => format!("{m}m{s}s"),
                (h, m) => format!("{h}h{m}m{s}s"),
            }
        }
    }
}

/// `v / 10^digits` in decimal, without trailing zeros in the fraction.
fn fraction(v: u128, digits: u32) -> String {
    let unit = 10u128.pow(digits);
    let (int, frac) = (v / unit, v % unit);
    if frac == 0 {
        return int.to_string();
    }
    let f = format!("{frac:0w$}", w = digits as usize);
    format!("{int}.{}", f.trim_end_matches('0'))
}

/// One value of a [`Json`] object.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonValue {
    /// A string (escaped when rendered).
    Str(String),
    /// An unsigned integer.
    Int(u64),
    /// A number; `null` when not finite.
    Num(f64),
}

/// The one JSON object `--json` prints on stdout: flat, keys in insertion order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Json {
    fields: Vec<(&'static str, JsonValue)>,
}

impl Json {
    /// An object that starts with `"tool"` and `"role"`.
    pub fn new(tool: &str, role: &str) -> Json {
        Json::default().str("tool", tool).str("role", role)
    }

    /// Adds a string field.
    pub fn str(mut self, key: &'static str, v: &str) -> Json {
        self.fields.push((key, JsonValue::Str(v.to_string())));
        self
    }

    /// Adds an integer field.
    pub fn int(mut self, key: &'static str, v: u64) -> Json {
        self.fields.push((key, JsonValue::Int(v)));
        self
    }

    /// Adds a number field.
    pub fn num(mut self, key: &'static str, v: f64) -> Json {
        self.fields.push((key, JsonValue::Num(v)));
        self
    }

    /// The field `key`, if present.
    pub fn get(&self, key: &str) -> Option<&JsonValue> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// One line: `{"tool":"rs_rdmanet_bw","role":"client",...}` and a newline.
    pub fn render(&self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(&mut out, k);
            out.push(':');
            match v {
                JsonValue::Str(s) => push_json_str(&mut out, s),
                JsonValue::Int(n) => out.push_str(&n.to_string()),
                // Rust writes finite floats in plain decimal (no exponent), which JSON takes.
                JsonValue::Num(x) if x.is_finite() => out.push_str(&x.to_string()),
                JsonValue::Num(_) => out.push_str("null"),
            }
        }
        out.push_str("}\n");
        out
    }
}

fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The bandwidth fields of a transfer of `count` messages of `size` bytes in `elapsed`.
pub fn json_rates(j: Json, count: u64, size: u64, elapsed: Duration) -> Json {
    let secs = elapsed.as_secs_f64();
    let (gbits, mpps) = if secs > 0.0 {
        (
            count as f64 * size as f64 * 8.0 / secs / 1e9,
            count as f64 / secs / 1e6,
        )
    } else {
        (0.0, 0.0)
    };
    j.int("messages", count)
        .int("size", size)
        .int("bytes", count.saturating_mul(size))
        .num("seconds", secs)
        .num("gbits", gbits)
        .num("mpps", mpps)
}

/// The latency client's fields: the summary in nanoseconds.
pub fn json_lat(j: Json, size: u64, s: &LatSummary) -> Json {
    let ns = |d: Duration| d.as_nanos().min(u128::from(u64::MAX)) as u64;
    j.int("size", size)
        .int("round_trips", s.count as u64)
        .int("avg_ns", ns(s.avg))
        .int("p50_ns", ns(s.p50))
        .int("p99_ns", ns(s.p99))
        .int("min_ns", ns(s.min))
        .int("max_ns", ns(s.max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_objects_render_flat_and_escaped() {
        let j = Json::new("rs_rdmanet_bw", "client")
            .str("mode", "a\"b\\c\n")
            .int("messages", 3)
            .num("gbits", 0.25)
            .num("bad", f64::NAN);
        assert_eq!(
            j.render(),
            "{\"tool\":\"rs_rdmanet_bw\",\"role\":\"client\",\"mode\":\"a\\\"b\\\\c\\u000a\",\
             \"messages\":3,\"gbits\":0.25,\"bad\":null}\n"
        );
        assert_eq!(j.get("messages"), Some(&JsonValue::Int(3)));
        assert_eq!(j.get("nope"), None);
        // Small rates stay plain decimals (JSON has no room for Rust's `inf` or `1e-7`).
        let tiny = Json::default().num("x", 1e-7).render();
        assert_eq!(tiny, "{\"x\":0.0000001}\n");
    }

    #[test]
    fn json_rates_and_latency_fields() {
        let j = json_rates(Json::default(), 1000, 65536, Duration::from_millis(500));
        assert_eq!(j.get("bytes"), Some(&JsonValue::Int(65_536_000)));
        assert_eq!(j.get("seconds"), Some(&JsonValue::Num(0.5)));
        match j.get("gbits") {
            Some(JsonValue::Num(g)) => assert!((g - 1.048576).abs() < 1e-12, "{g}"),
            other => panic!("{other:?}"),
        }
        let zero = json_rates(Json::default(), 0, 1, Duration::ZERO);
        assert_eq!(zero.get("mpps"), Some(&JsonValue::Num(0.0)));
        let mut v = [Duration::from_micros(3), Duration::from_micros(1)];
        let s = lat_summary(&mut v).unwrap();
        let j = json_lat(Json::default(), 64, &s);
        assert_eq!(j.get("p50_ns"), Some(&JsonValue::Int(3000)));
        assert_eq!(j.get("min_ns"), Some(&JsonValue::Int(1000)));
        assert_eq!(j.get("round_trips"), Some(&JsonValue::Int(2)));
    }

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    #[test]
    fn durations_as_go_prints_them() {
        let cases = [
            (0, "0s"),
            (1, "1ns"),
            (999, "999ns"),
            (1_000, "1µs"),
            (12_345, "12.345µs"),
            (1_500_000, "1.5ms"),
            (1_234_567, "1.234567ms"),
            (1_000_000_000, "1s"),
            (2_000_001_000, "2.000001s"),
            (90_000_000_000, "1m30s"),
            (61_500_000_000, "1m1.5s"),
            (3_600_000_000_000, "1h0m0s"),
            (3_723_000_000_001, "1h2m3.000000001s"),
        ];
        for (n, want) in cases {
            assert_eq!(go_duration(ns(n)), want, "{n} ns");
        }
    }

    #[test]
    fn send_lines() {
        // 1000 × 65536 bytes in 0.5 s: 1.048576 Gb/s, 0.002 Mpps.
        assert_eq!(
            send_line(SendMode::Single, 1000, 65536, Duration::from_millis(500)),
            "SendMsg: sent 1000 x 65536 bytes in 500ms: 1.05 Gb/s, 0.002 Mpps\n"
        );
        assert_eq!(
            send_line(SendMode::Batch(32), 1_000_000, 64, Duration::from_secs(2)),
            "SendBatch(32): sent 1000000 x 64 bytes in 2s: 0.26 Gb/s, 0.500 Mpps\n"
        );
        assert_eq!(
            send_line(SendMode::Single, 0, 1, Duration::ZERO),
            "SendMsg: sent 0 x 1 bytes in 0s: 0.00 Gb/s, 0.000 Mpps\n"
        );
    }

    #[test]
    fn latency_summary_uses_gordmas_indexes() {
        // 1..=100 µs, shuffled: p50 is index 50 (51 µs), p99 index 99 (100 µs).
        let mut v: Vec<Duration> = (1..=100u64)
            .map(|i| Duration::from_micros((i * 37) % 100 + 1))
            .collect();
        let s = lat_summary(&mut v).unwrap();
        assert_eq!(s.count, 100);
        assert_eq!(s.min, Duration::from_micros(1));
        assert_eq!(s.max, Duration::from_micros(100));
        assert_eq!(s.p50, Duration::from_micros(51));
        assert_eq!(s.p99, Duration::from_micros(100));
        assert_eq!(s.avg, Duration::from_nanos(50_500));
        assert_eq!(
            lat_line(&s),
            "round-trips=100 avg=50.5µs p50=51µs p99=100µs min=1µs max=100µs\n"
        );
        assert_eq!(lat_summary(&mut []), None);
        let mut one = [ns(1_500)];
        let s = lat_summary(&mut one).unwrap();
        assert_eq!(
            (s.p50, s.p99, s.min, s.max),
            (one[0], one[0], one[0], one[0])
        );
    }

    #[test]
    fn raw_results_in_mib_per_second() {
        // 1024 messages of 1 MiB in one second: 1024 MiB/s and 0.001024 Mpps.
        let r = raw_result(1 << 20, 1024, Duration::from_secs(1));
        assert!((r.avg - 1024.0).abs() < 1e-9, "{}", r.avg);
        assert!((r.msg_rate - 0.001024).abs() < 1e-12, "{}", r.msg_rate);
        assert_eq!((r.size, r.iters, r.peak), (1 << 20, 1024, 0.0));
        assert_eq!(
            crate::report::bw_line(&r, false),
            " 1048576    1024             0.00               1024.00\t\t   0.001024\n"
        );
        assert_eq!(raw_result(64, 0, Duration::ZERO).avg, 0.0);
    }

    #[test]
    fn server_lines() {
        assert_eq!(
            received_line(3, 192),
            "server received 3 messages (192 bytes)\n"
        );
        assert_eq!(
            accepted_line("10.77.0.1:4000"),
            "accepted a connection from 10.77.0.1:4000\n"
        );
        assert_eq!(
            registered_line(2 << 20),
            "registered memory: 2097152 bytes for this connection\n"
        );
        assert_eq!(
            cpu_line(Duration::from_micros(1_250_500)),
            "cpu: 1.250500 s user+sys during the transfer\n"
        );
        assert_eq!(
            echoed_line(2, 128),
            "server echoed 2 messages (128 bytes)\n"
        );
        assert_eq!(
            listening_line("rdma_cm", "0.0.0.0:18515"),
            "listening on 0.0.0.0:18515 (rdma_cm)\n"
        );
    }
}
