//! Fault injection on the software device `soft0`, for tests: what a real fabric does
//! rarely and at random, on purpose and at once, so that a program's timeout, error, close
//! and peer-death paths can be reached quickly and deterministically. Every function names a
//! queue pair of soft0 in this process by its number ([`crate::Qp::qp_num`]; rsrdma-net's
//! `ConnInfo::local_qpn`) and fails with [`Error::InvalidArgument`] for any other.
//!
//! A peer process that vanishes is had by killing it: soft0 then breaks the links of the
//! queue pairs that talked to it (`RETRY_EXC_ERR`), as a NIC's retries would run out.

use crate::error::{Error, Result};
use std::time::Duration;

fn done(ok: bool, qp_num: u32, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "soft0 fault injection: no {what}queue pair numbered {qp_num} in this process"
        )))
    }
}

/// The queue pair fails as on a fatal error: it moves to ERROR, every request it holds
/// completes with `WR_FLUSH_ERR`, and its context reports `IBV_EVENT_QP_FATAL`
/// ([`crate::Context::read_async_event`]). The peer learns nothing (its own requests then
/// go unanswered).
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn fail_qp(qp_num: u32) -> Result<()> {
    done(super::verbs::fail_qp(qp_num), qp_num, "")
}

/// The queue pair loses its peer, as when the peer's host dies or its cable is pulled: the
/// oldest request waiting for an answer completes with `RETRY_EXC_ERR` and the queue pair
/// fails (the rest flush). UC and UD queue pairs wait for no answer and never notice.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn cut_link(qp_num: u32) -> Result<()> {
    done(super::verbs::cut_link(qp_num), qp_num, "")
}

/// The next `count` requests that need a receive at this queue pair (SEND, WRITE with
/// immediate data) find none, as if the application had not posted one in time: a
/// reliable-connected responder answers RNR NAK, so the requester waits out the RNR timer
/// and retries, up to its `rnr_retry` (then `RNR_RETRY_EXC_ERR`); an unreliable-connected
/// one drops the message.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such connected queue pair.
pub fn refuse_receives(qp_num: u32, count: u32) -> Result<()> {
    done(
        super::verbs::refuse_receives(qp_num, count),
        qp_num,
        "connected ",
    )
}

/// The queue pair's completions reach its completion queues only `delay` after they
/// happened (in their order), so completions of other queue pairs overtake them, and a
/// waiter sees them late. `Duration::ZERO` ends it; a delay beyond a day counts as a day.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn delay_completions(qp_num: u32, delay: Duration) -> Result<()> {
    done(
        super::verbs::delay_completions(qp_num, delay.min(LONGEST)),
        qp_num,
        "",
    )
}

/// The device reports a fatal error to the context that holds the queue pair: it gets
/// `IBV_EVENT_DEVICE_FATAL` ([`crate::Context::read_async_event`]). Nothing else changes (the
/// queues go on working), so a program that fails only because it read the event shows
/// that it reads it: a real device's fatal error may stop completions for good, and the
/// event is then the only sign. Other contexts of the process (other tests' connections)
/// are not told.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn fail_device(qp_num: u32) -> Result<()> {
    done(super::verbs::raise_device_fatal(qp_num), qp_num, "")
}

/// The port (1) of the context that holds the queue pair goes down, as its context's event
/// queue says (`IBV_EVENT_PORT_ERR`); nothing else changes: the queues go on working, as a
/// real port's would until their retries run out. [`port_up`] says it is active again.
/// Other contexts are not told.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn port_down(qp_num: u32) -> Result<()> {
    done(super::verbs::raise_port_event(qp_num, false), qp_num, "")
}

/// The port of the queue pair's context is active again (`IBV_EVENT_PORT_ACTIVE`).
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn port_up(qp_num: u32) -> Result<()> {
    done(super::verbs::raise_port_event(qp_num, true), qp_num, "")
}

/// Faults for every queue pair of a process, from the environment variable
/// `RSRDMA_SOFT_FAULTS`, so that a program (a tool, a server) meets them without a line of
/// code changed: comma-separated `key=value` items, durations as `500ms`, `2s`, `100us`:
///
/// - `delay=DURATION`: every queue pair's completions come `DURATION` late
///   ([`delay_completions`]);
/// - `refuse=N`: every connected queue pair finds no receive for its first `N` requests
///   that need one ([`refuse_receives`]);
/// - `fail_after=DURATION`: every queue pair fails `DURATION` after it was created
///   ([`fail_qp`]);
/// - `cut_after=DURATION`: every queue pair loses its peer `DURATION` after it was created
///   ([`cut_link`]): the peer "vanishes".
///
/// Durations are at most a day, and each key comes at most once. A value soft0 cannot read
/// (or one beyond those bounds) makes opening it fail (`EINVAL`, the reason logged at ERROR
/// through `tracing`): a fault asked for is never silently left out.
pub const ENV: &str = "RSRDMA_SOFT_FAULTS";

/// What [`ENV`] asks for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EnvFaults {
    delay: Option<Duration>,
    refuse: u32,
    fail_after: Option<Duration>,
    cut_after: Option<Duration>,
}

/// Reads [`ENV`]'s value.
pub(crate) fn parse(spec: &str) -> std::result::Result<EnvFaults, String> {
    let mut f = EnvFaults::default();
    let mut seen: Vec<&str> = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not key=value"))?;
        let (key, value) = (key.trim(), value.trim());
        if seen.contains(&key) {
            return Err(format!("{key} is given twice"));
        }
        seen.push(key);
        match key {
            "delay" => f.delay = Some(duration(value)?),
            "refuse" => {
                f.refuse = value
                    .parse()
                    .map_err(|_| format!("refuse={value:?}: not a count"))?
            }
            "fail_after" => f.fail_after = Some(duration(value)?),
            "cut_after" => f.cut_after = Some(duration(value)?),
            other => {
                return Err(format!(
                    "unknown fault {other:?} (known: delay, refuse, fail_after, cut_after)"
                ))
            }
        }
    }
    Ok(f)
}

/// `500ms`, `2s`, `100us`; at most [`LONGEST`].
fn duration(v: &str) -> std::result::Result<Duration, String> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{v:?}: not a duration (500ms, 2s, 100us)"))?;
    let d = match unit {
        "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "us" => Duration::from_micros(n),
        _ => return Err(format!("{v:?}: not a duration (500ms, 2s, 100us)")),
    };
    if d > LONGEST {
        return Err(format!("{v:?}: longer than a day"));
    }
    Ok(d)
}

/// The longest fault time the variable takes (and the longest completion delay
/// [`delay_completions`] applies): a day is beyond any test, and far from the end of
/// `Instant`'s range.
pub(crate) const LONGEST: Duration = Duration::from_secs(86_400);

/// [`ENV`], read once per process.
pub(crate) fn from_env() -> &'static std::result::Result<EnvFaults, String> {
    static FAULTS: std::sync::OnceLock<std::result::Result<EnvFaults, String>> =
        std::sync::OnceLock::new();
    FAULTS.get_or_init(|| match std::env::var(ENV) {
        Ok(spec) => parse(&spec).map_err(|e| format!("{ENV}={spec:?}: {e}")),
        // A value that is not UTF-8 asks for something too: never silently nothing (it was
        // taken as unset: an outside tester's find).
        Err(std::env::VarError::NotUnicode(spec)) => Err(format!(
            "{ENV}={spec:?}: not UTF-8 (items such as delay=1ms,refuse=3)"
        )),
        Err(std::env::VarError::NotPresent) => Ok(EnvFaults::default()),
    })
}

/// Applies [`ENV`]'s faults to a queue pair just created (called without the device lock).
pub(crate) fn on_create(qp_num: u32) {
    let Ok(f) = from_env() else {
        return;
    };
    if let Some(d) = f.delay {
        super::verbs::delay_completions(qp_num, d);
    }
    if f.refuse > 0 {
        super::verbs::refuse_receives(qp_num, f.refuse);
    }
    let now = std::time::Instant::now();
    if let Some(d) = f.fail_after {
        timers::at(now + d, qp_num, timers::Kind::Fail);
    }
    if let Some(d) = f.cut_after {
        timers::at(now + d, qp_num, timers::Kind::Cut);
    }
}

/// One thread for the process's timed faults (started with the first).
mod timers {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    pub(super) enum Kind {
        Fail,
        Cut,
    }

    type Due = Reverse<(Instant, u32, Kind)>;

    pub(super) fn at(when: Instant, qp_num: u32, kind: Kind) {
        static TX: OnceLock<Mutex<Sender<Due>>> = OnceLock::new();
        let tx = TX.get_or_init(|| {
            let (tx, rx) = channel::<Due>();
            let spawned = std::thread::Builder::new()
                .name("rsrdma-soft-faults".into())
                .spawn(move || {
                    let mut heap: BinaryHeap<Due> = BinaryHeap::new();
                    loop {
                        let got = match heap.peek() {
                            Some(Reverse((due, ..))) => {
                                rx.recv_timeout(due.saturating_duration_since(Instant::now()))
                            }
                            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        };
                        match got {
                            Ok(d) => heap.push(d),
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => return,
                        }
                        while heap
                            .peek()
                            .is_some_and(|Reverse((due, ..))| *due <= Instant::now())
                        {
                            let Some(Reverse((_, qp, kind))) = heap.pop() else {
                                break;
                            };
                            // A queue pair destroyed meanwhile is simply not found.
                            let _ = match kind {
                                Kind::Fail => super::super::verbs::fail_qp(qp),
                                Kind::Cut => super::super::verbs::cut_link(qp),
                            };
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "soft0: the fault timer thread did not start");
            }
            Mutex::new(tx)
        });
        let tx = tx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = tx.send(Reverse((when, qp_num, kind)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_reads_every_fault_and_refuses_the_rest() {
        let f = parse("delay=5ms, refuse=3,fail_after=2s,cut_after=100us").unwrap();
        assert_eq!(f.delay, Some(Duration::from_millis(5)));
        assert_eq!(f.refuse, 3);
        assert_eq!(f.fail_after, Some(Duration::from_secs(2)));
        assert_eq!(f.cut_after, Some(Duration::from_micros(100)));
        assert_eq!(parse("").unwrap(), EnvFaults::default());
        for bad in [
            "delay",
            "delay=5",
            "delay=5m",
            "refuse=-1",
            "explode=1s",
            "cut_after=ms",
            "delay=18446744073709551615s",
            "cut_after=86401s",
            "cut_after=1s,cut_after=60s",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }
}
