//! The latency loops (spec 2.5): send_lat's and write_lat's ping-pongs and the one-sided
//! reads and atomics, one request in flight at a time; with `-D` each runs until the duration
//! ends and counts the iterations completed inside the sampling window.

use super::window::Window;
use super::{check_recv_len, one_sided_wr, poll, post_one_recv, wc_error_hinted, QKEY};
use crate::args::{Conn, Params};
use crate::error::{Error, Result};
use crate::handshake::Ends;
use crate::oob::Oob;
use crate::resources::Res;
use crate::watch::{Clock, Watchdog};
use rsrdma::{Cq, SendWr, Sge, Wc, WcStatus};
use std::time::{Duration, Instant};

/// How far apart the two sides' durations may end (both start at one handshake; 1 s is
/// far more than it takes).
const PEER_END_SKEW: u64 = 1_000_000_000;

/// What one latency run produced.
#[derive(Debug, Clone, Default)]
pub struct LatRun {
    /// Post time of every iteration (iteration mode; empty with `-D`).
    pub tposted: Vec<u64>,
    /// `-D`: iterations completed in the sampling window and the window's length in ns.
    pub window: Option<(u64, u64)>,
}

/// The pace of a latency loop: the iteration count or the duration, the post times, the
/// watchdog and the reused completion.
struct Pace {
    iters: u64,
    window: Option<Window>,
    tposted: Vec<u64>,
    completed: u64,
    clock: Clock,
    wd: Watchdog,
    wcs: [Wc; 1],
}

impl Pace {
    fn new(p: &Params, what: &'static str) -> Pace {
        let clock = Clock::new();
        let window = Window::new(p, clock.now());
        Pace {
            iters: p.iters,
            tposted: if window.is_some() {
                Vec::new()
            } else {
                vec![0; p.iters as usize]
            },
            window,
            completed: 0,
            clock,
            wd: Watchdog::new(what).events(p.events),
            wcs: [Wc::default(); 1],
        }
    }

    /// Whether the `k`-th (0-based) step is due: below the iterations, or until the duration
    /// ends.
    fn due(&self, k: u64) -> bool {
        self.window.is_some() || k < self.iters
    }

    /// Records the post time of iteration `k` (iteration mode).
    fn stamp(&mut self, k: u64) {
        if let Some(t) = self.tposted.get_mut(k as usize) {
            *t = self.clock.now();
        }
    }

    /// Counts an iteration as completed; true once the duration is over.
    fn completed(&mut self) -> bool {
        self.completed += 1;
        match self.window.as_mut() {
            Some(w) => w.tick(self.clock.now(), self.completed),
            None => false,
        }
    }

    /// True once the duration is over (never in iteration mode).
    fn stopped(&self) -> bool {
        self.window.is_some_and(|w| self.clock.now() >= w.stop_at())
    }

    /// Waits for the one completion in flight on `cq`; false when the duration ended first.
    fn wait(
        &mut self,
        cq: &Cq,
        p: &Params,
        oob: &Oob,
        progress: u64,
        counts: impl Fn() -> String,
    ) -> Result<bool> {
        loop {
            if poll(cq, &mut self.wcs, p.events)? > 0 {
                if self.peer_ended_first() {
                    return Ok(false);
                }
                if !self.wcs[0].is_ok() {
                    let hint = shorter_run_hint(self.wcs[0].status(), progress, oob);
                    return Err(wc_error_hinted(&self.wcs[0], p.is_server(), counts(), hint));
                }
                return Ok(true);
            }
            if self.stopped() || !self.idle(progress, oob, &counts)? {
                return Ok(false);
            }
        }
    }

    /// The watchdog's look between polls; false (the run is over) when, with `-D`, it finds
    /// the peer gone as this side's duration is about to end (see
    /// [`Pace::peer_ended_first`]).
    fn idle(&mut self, progress: u64, oob: &Oob, counts: impl FnOnce() -> String) -> Result<bool> {
        match self.wd.idle(progress, oob, counts) {
            Ok(()) => Ok(true),
            Err(_) if self.near_the_end() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// With `-D`: as close to this side's end as the peer's may be.
    fn near_the_end(&self) -> bool {
        self.window
            .is_some_and(|w| self.clock.now() + PEER_END_SKEW >= w.stop_at())
    }

    /// With `-D`: the completion just polled says the peer is gone (`RETRY_EXC_ERR`) as this
    /// side's duration is about to end. write_lat has no closing handshake (as perftest's),
    /// so the side whose duration runs out first exits, and the other's last request finds no
    /// peer: the end of the run, not a failure. (On a NIC the transport timer outlasts the
    /// rest of the duration; soft0 knows at once.)
    fn peer_ended_first(&self) -> bool {
        self.wcs[0].status() == rsrdma::WcStatus::RETRY_EXC_ERR && self.near_the_end()
    }

    fn finish(self) -> LatRun {
        LatRun {
            tposted: self.tposted,
            window: self.window.map(|w| w.measured()),
        }
    }
}

/// Posts `wr` on QP 0 and waits for its completion; false when the duration ended first.
fn post_and_wait(
    pace: &mut Pace,
    p: &Params,
    res: &Res,
    wr: &SendWr<'_>,
    oob: &Oob,
    progress: u64,
) -> Result<bool> {
    // SAFETY: every latency request names QP 0's source area in `res.mr` (alive longer than
    // the QP: Res drops its QPs first); the CPU does not touch that area while the request is
    // in flight (write_lat stores its counter before posting); the completion is reaped here
    // or, when the duration ends first, the QP is destroyed before the region.
    let r = if p.new_post_send {
        // SAFETY: as above.
        unsafe { crate::resources::post(true, &res.qps[0], &mut [*wr]) }
    } else {
        // SAFETY: as above.
        unsafe { res.qps[0].post_send(wr) }
    };
    r.map_err(|e| Error::rdma(" Couldn't post send", e))?;
    pace.wait(&res.send_cq, p, oob, progress, || {
        format!(" scnt={progress}")
    })
}

/// How long a side whose request found no peer waits to see the peer's out-of-band
/// connection close (both end when its process exits, in either order).
const PEER_CLOSE_WAIT: Duration = Duration::from_millis(200);

/// The hint for a request that found no peer (`RETRY_EXC_ERR`) after the run made progress,
/// when the peer has closed its out-of-band connection too: write_lat has no closing
/// handshake (as perftest's), so a peer with fewer iterations exits after its last, and this
/// side learns it either here or from the watchdog's look at that connection (which says the
/// same). Which one comes first is a race (a test saw both).
#[cold]
fn shorter_run_hint(status: WcStatus, progress: u64, oob: &Oob) -> Option<&'static str> {
    if status != WcStatus::RETRY_EXC_ERR || progress == 0 {
        return None;
    }
    let until = Instant::now() + PEER_CLOSE_WAIT;
    loop {
        if oob.peek_state() == Some(true) {
            return Some(
                "the peer is gone: it exited or was killed, or it finished a shorter run \
                 (were both ends started with the same -n?)",
            );
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// send_lat's ping-pong (the client sends first).
///
/// # Errors
/// Failed posts or completions, a stalled run, a vanished peer.
pub fn send_lat(p: &Params, res: &mut Res, ends: &mut Ends<'_>, size: u64) -> Result<LatRun> {
    let client = !p.is_server();
    let r = ends.remote[0];
    let sge = [Sge::new(res.mr.addr(), size as u32, res.mr.lkey())];
    let mut wr = SendWr::send(0, &sge);
    if p.conn == Conn::Ud {
        wr = wr.ud(&res.ahs[0], r.qpn, QKEY);
    }
    if size <= u64::from(res.inline) && res.inline > 0 {
        wr = wr.inline();
    }
    let mut pace = Pace::new(p, "the peer's message");
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while pace.due(scnt) || pace.due(rcnt) {
        if pace.due(rcnt) && !(scnt == 0 && client) {
            let counts = || format!(" scnt={scnt}, rcnt={rcnt}");
            if !pace.wait(&res.recv_cq, p, ends.oob, scnt + rcnt, counts)? {
                break;
            }
            check_recv_len(p, &pace.wcs[0], size)?;
            rcnt += 1;
            if pace.window.is_some() || res.recv_posted[0] < p.iters {
                post_one_recv(res, p, 0, size)?;
                res.recv_posted[0] += 1;
            }
        }
        if pace.due(scnt) {
            pace.stamp(scnt);
            scnt += 1;
            if !post_and_wait(&mut pace, p, res, &wr, ends.oob, scnt + rcnt)? || pace.completed() {
                break;
            }
        }
    }
    Ok(pace.finish())
}

/// write_lat's ping-pong: each side writes a counter into the last byte of the peer's target
/// area and spins on its own; the server writes first.
///
/// # Errors
/// Failed posts or completions, a stalled run, a vanished peer.
pub fn write_lat(p: &Params, res: &mut Res, ends: &mut Ends<'_>, size: u64) -> Result<LatRun> {
    let server = p.is_server();
    let r = ends.remote[0];
    let base = res.mr.addr();
    let send_last = (base + size - 1) as *mut u8;
    let recv_last = (base + (res.qps.len() * res.buff) as u64 + size - 1) as *const u8;
    let sge = [Sge::new(base, size as u32, res.mr.lkey())];
    let mut wr = SendWr::rdma_write(0, &sge, r.vaddr, r.rkey);
    if size <= u64::from(res.inline) && res.inline > 0 {
        wr = wr.inline();
    }
    let mut pace = Pace::new(p, "the peer's write");
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while pace.due(scnt) || pace.due(rcnt) {
        if pace.due(rcnt) && !(scnt == 0 && server) {
            rcnt += 1;
            let want = rcnt as u8;
            loop {
                // SAFETY: `recv_last` is inside `res.mr` (target area of QP 0, `size` ≤ the
                // area), which lives for this whole function; the peer's NIC writes it, so
                // it is read with a volatile load and never through a reference.
                let v = unsafe { std::ptr::read_volatile(recv_last) };
                if v == want {
                    break;
                }
                if pace.stopped()
                    || !pace.idle(scnt + rcnt, ends.oob, || {
                        format!(" scnt={scnt}, rcnt={rcnt}")
                    })?
                {
                    return Ok(pace.finish());
                }
                std::hint::spin_loop();
            }
        }
        if pace.due(scnt) {
            pace.stamp(scnt);
            scnt += 1;
            // SAFETY: `send_last` is inside `res.mr` (QP 0's source area); the previous write
            // from it has completed (reaped before the loop turns), so the NIC is not reading
            // it now.
            unsafe { std::ptr::write_volatile(send_last, scnt as u8) };
            if !post_and_wait(&mut pace, p, res, &wr, ends.oob, scnt + rcnt)? || pace.completed() {
                break;
            }
        }
    }
    Ok(pace.finish())
}

/// read_lat and atomic_lat: the client reads (or runs its atomic on) `size` bytes of the
/// server's target area, waits for the completion, repeats.
///
/// # Errors
/// Failed posts or completions, a stalled run, a vanished peer.
pub fn one_sided_lat(p: &Params, res: &mut Res, ends: &mut Ends<'_>, size: u64) -> Result<LatRun> {
    let r = ends.remote[0];
    let sge = [Sge::new(res.mr.addr(), size as u32, res.mr.lkey())];
    let wr = one_sided_wr(p, 0, &sge, r.vaddr, r.rkey);
    let mut pace = Pace::new(p, "RDMA read or atomic completions");
    let mut k = 0u64;
    while pace.due(k) {
        pace.stamp(k);
        k += 1;
        if !post_and_wait(&mut pace, p, res, &wr, ends.oob, k)? || pace.completed() {
            break;
        }
    }
    Ok(pace.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that finished a shorter run and exited: this side's next request may fail
    /// before the watchdog sees the out-of-band connection close (a CI rehearsal under load
    /// saw it), and the error then says "-c differs" unless it names -n too.
    #[test]
    fn a_request_that_found_no_peer_after_progress_names_n_once_the_peer_closed() {
        let l = crate::oob::listen(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let peer = std::thread::spawn(move || crate::oob::Oob::accept(l).unwrap());
        let oob = Oob::connect("127.0.0.1", port).unwrap();
        let peer = peer.join().unwrap();
        // The peer is still there: no hint (after the short wait).
        assert_eq!(shorter_run_hint(WcStatus::RETRY_EXC_ERR, 5, &oob), None);
        drop(peer);
        let hint = shorter_run_hint(WcStatus::RETRY_EXC_ERR, 5, &oob).unwrap();
        assert!(hint.contains("the same -n"), "{hint}");
        // Before any progress, or another failure: the status's own hint.
        assert_eq!(shorter_run_hint(WcStatus::RETRY_EXC_ERR, 0, &oob), None);
        assert_eq!(shorter_run_hint(WcStatus::REM_ACCESS_ERR, 5, &oob), None);
    }
}
