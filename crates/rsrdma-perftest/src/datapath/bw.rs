//! The bandwidth loop (spec 2.4): per QP a ring of prepared send requests posted within the tx
//! depth, completions reaped 16 at a time, receives re-posted as they complete.

use super::window::Window;
use super::{check_recv_len, one_sided_wr, poll, post_one_recv, wc_error, QKEY};
use crate::args::{Conn, Params};
use crate::error::{Error, Result};
use crate::handshake::Ends;
use crate::oob::Oob;
use crate::resources::{inc, Res};
use crate::stats::{self, BwResult};
use crate::watch::{Clock, Probe, Watchdog};
use crate::wire::Dest;
use crate::Verb;
use rsrdma::{SendWr, Sge, Wc};
use std::time::{Duration, Instant};

/// What one bandwidth run produced.
#[derive(Debug, Clone)]
pub struct BwRun {
    /// The line.
    pub result: BwResult,
    /// The probe's line, with `RSRDMA_PROBE=1` on a sending side.
    pub probe: Option<String>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Address cycling (spec 2.2): the number of distinct slots and the distance between them.
pub fn cycle(size: u64, page: usize, line: usize) -> (usize, usize) {
    if (size as usize) <= page / 2 {
        let step = inc(size as usize, line);
        ((page / step).max(1), step)
    } else {
        (1, 0)
    }
}

/// One bandwidth run of `size` on every QP: sends (write, read or send, on the sides that
/// send) and receives (send, on the sides that receive), per spec 2.4. SEND runs need their
/// first receives posted beforehand ([`super::prepost_recvs`]).
///
/// # Errors
/// Failed posts or completions, a stalled run, a vanished peer.
pub fn bw_run(
    p: &Params,
    res: &mut Res,
    ends: &mut Ends<'_>,
    size: u64,
    unit: f64,
) -> Result<BwRun> {
    let plan = Plan::new(p, res, size);
    // The loop keeps the receive counts while the requests borrow the resources.
    let mut run = Run::new(p, plan, std::mem::take(&mut res.recv_posted));
    let looped = {
        let res: &Res = res;
        let sges = ring_sges(&plan, res, size);
        let mut wrs = ring_wrs(p, &plan, res, ends.remote, &sges, size);
        run.run(p, res, &mut wrs, ends.oob, size)
    };
    res.recv_posted = std::mem::take(&mut run.recv_posted);
    let stopped = looped?;
    let end = run.clock.now();
    if !plan.peak {
        run.tcompleted[0] = end;
    }
    if stopped {
        drain(res, run.signaled.saturating_sub(run.reaped));
    }
    Ok(BwRun {
        result: run.result(size, unit),
        probe: run.probe.on.then(|| {
            run.probe
                .report(end.saturating_sub(run.tposted[0]), run.tot_s)
        }),
    })
}

/// The fixed shape of one run.
#[derive(Debug, Clone, Copy)]
struct Plan {
    q: usize,
    do_send: bool,
    do_recv: bool,
    server: bool,
    events: bool,
    /// Requests per QP (unbounded in duration mode).
    iters: u64,
    /// Requests over all QPs (`-n` × QPs).
    goal: u64,
    tx_depth: u64,
    cq_mod: u64,
    /// Post list length.
    list: usize,
    /// Time every request (for the peak), not only the first and last.
    peak: bool,
    /// Address cycle: distinct slots and their distance.
    period: usize,
    step: usize,
    /// Requests per QP ring: a whole number of address cycles and of post lists, so a list is
    /// always one contiguous slice posted with one call.
    ring: usize,
    /// `--use_new_post_send`.
    new_post_send: bool,
}

impl Plan {
    fn new(p: &Params, res: &Res, size: u64) -> Plan {
        let do_send = p.sends();
        let list = p.post_list.max(1) as usize;
        let (period, step) = cycle(size, res.page, res.line);
        Plan {
            q: res.qps.len(),
            do_send,
            do_recv: p.receives(),
            server: p.is_server(),
            events: p.events,
            iters: if p.duration.is_some() {
                u64::MAX
            } else {
                p.iters
            },
            goal: p.iters.saturating_mul(res.qps.len() as u64),
            tx_depth: u64::from(p.tx_depth),
            cq_mod: u64::from(p.cq_mod.max(1)),
            list,
            peak: do_send && !p.no_peak() && p.duration.is_none(),
            period,
            step,
            ring: if do_send {
                period / gcd(period, list) * list
            } else {
                0
            },
            new_post_send: p.new_post_send,
        }
    }

    fn send_goal(&self) -> u64 {
        if self.do_send {
            self.goal
        } else {
            0
        }
    }

    fn recv_goal(&self) -> u64 {
        if self.do_recv {
            self.goal
        } else {
            0
        }
    }
}

/// Each QP's ring of source slices, in address-cycle order.
fn ring_sges(plan: &Plan, res: &Res, size: u64) -> Vec<Sge> {
    let mut sges = Vec::with_capacity(plan.q * plan.ring);
    for i in 0..plan.q {
        for k in 0..plan.ring {
            let off = (k % plan.period) * plan.step;
            sges.push(Sge::new(
                res.mr.addr() + (i * res.buff + off) as u64,
                size as u32,
                res.mr.lkey(),
            ));
        }
    }
    sges
}

/// Each QP's ring of requests to the matching slot of the peer's target area.
fn ring_wrs<'a>(
    p: &Params,
    plan: &Plan,
    res: &'a Res,
    remote: &[Dest],
    sges: &'a [Sge],
    size: u64,
) -> Vec<SendWr<'a>> {
    let inline = !p.tool.verb.reads() && size <= u64::from(res.inline) && res.inline > 0;
    let mut wrs = Vec::with_capacity(plan.q * plan.ring);
    for (i, r) in remote.iter().enumerate().take(plan.q) {
        for k in 0..plan.ring {
            let sge = std::slice::from_ref(&sges[i * plan.ring + k]);
            let raddr = r.vaddr + ((k % plan.period) * plan.step) as u64;
            let mut wr = match p.tool.verb {
                Verb::Write => SendWr::rdma_write(i as u64, sge, raddr, r.rkey),
                Verb::Read | Verb::Atomic => one_sided_wr(p, i as u64, sge, raddr, r.rkey),
                Verb::Send => SendWr::send(i as u64, sge),
            };
            if p.conn == Conn::Ud {
                wr = wr.ud(&res.ahs[i], r.qpn, QKEY);
            }
            if inline {
                wr = wr.inline();
            }
            wrs.push(wr);
        }
    }
    wrs
}

/// The counters, time stamps and instruments of a run.
struct Run {
    plan: Plan,
    /// Posted and completed per QP.
    scnt: Vec<u64>,
    ccnt: Vec<u64>,
    /// Posted, completed and received over all QPs.
    tot_s: u64,
    tot_c: u64,
    tot_r: u64,
    /// Signaled requests posted, and send completions reaped (with CQ moderation one
    /// completion stands for `cq_mod` requests, and those after the last signaled one give
    /// none): what a duration run's drain waits for is their difference.
    signaled: u64,
    reaped: u64,
    /// Receives posted so far per QP (taken from [`Res::recv_posted`] for the run).
    recv_posted: Vec<u64>,
    /// Post and completion times: one per request with the peak, else the first and last.
    tposted: Vec<u64>,
    tcompleted: Vec<u64>,
    first_recv: Option<u64>,
    last_recv: u64,
    wcs: [Wc; 16],
    probe: Probe,
    wd: Watchdog,
    clock: Clock,
    window: Option<Window>,
}

impl Run {
    fn new(p: &Params, plan: Plan, recv_posted: Vec<u64>) -> Run {
        let n_stamps = if plan.peak { plan.goal as usize } else { 1 };
        let mut probe = Probe::from_env();
        probe.on &= plan.do_send;
        let clock = Clock::new();
        let window = Window::new(p, clock.now());
        Run {
            plan,
            scnt: vec![0; plan.q],
            ccnt: vec![0; plan.q],
            tot_s: 0,
            tot_c: 0,
            tot_r: 0,
            signaled: 0,
            reaped: 0,
            recv_posted,
            tposted: vec![0; n_stamps],
            tcompleted: vec![0; n_stamps],
            first_recv: None,
            last_recv: 0,
            wcs: [Wc::default(); 16],
            probe,
            wd: Watchdog::new(if plan.do_send {
                "send completions"
            } else {
                "receive completions"
            })
            .events(p.events),
            clock,
            window,
        }
    }

    /// Runs until every request completed (or the duration ended: returns true then).
    fn run(
        &mut self,
        p: &Params,
        res: &Res,
        wrs: &mut [SendWr<'_>],
        oob: &Oob,
        size: u64,
    ) -> Result<bool> {
        let plan = self.plan;
        let mut turn = 0u32;
        loop {
            if self.window.is_none()
                && self.tot_c >= plan.send_goal()
                && self.tot_r >= plan.recv_goal()
            {
                return Ok(false);
            }
            if plan.do_send {
                self.post_sends(res, wrs)?;
            }
            let mut progressed = false;
            if plan.do_send && self.tot_c < self.tot_s {
                progressed |= self.reap_sends(res)?;
            }
            if plan.do_recv && (self.window.is_some() || self.tot_r < plan.recv_goal()) {
                progressed |= self.reap_recvs(p, res, size)?;
            }
            if self.window.is_some() {
                // The clock is read every 64 turns that made progress, and on every turn that
                // made none: with events such a turn slept up to 50 ms on the CQ's channel,
                // and 64 of them once the peer had stopped kept the window open for seconds
                // (an outside tester's `-e -D 2` client measured a 4 s window at half the
                // server's rate).
                turn = turn.wrapping_add(1);
                if (turn & 63 == 0 || !progressed) && self.window_closed() {
                    return Ok(true);
                }
            }
            if !progressed {
                self.idle(oob)?;
            }
        }
    }

    /// Posts on every QP while its tx depth has room for a whole post list.
    fn post_sends(&mut self, res: &Res, wrs: &mut [SendWr<'_>]) -> Result<()> {
        let plan = self.plan;
        let l = plan.list as u64;
        for i in 0..plan.q {
            while self.scnt[i] < plan.iters && self.scnt[i] + l - self.ccnt[i] <= plan.tx_depth {
                let at = i * plan.ring + (self.scnt[i] % plan.ring as u64) as usize;
                let batch = &mut wrs[at..at + plan.list];
                for (j, wr) in batch.iter_mut().enumerate() {
                    let t = self.scnt[i] + j as u64 + 1;
                    let signaled = t % plan.cq_mod == 0 || t == plan.iters;
                    *wr = wr.signaled(signaled);
                    self.signaled += u64::from(signaled);
                }
                let now = if plan.peak || self.tot_s == 0 {
                    self.clock.now()
                } else {
                    0
                };
                let t0 = self.probe.on.then(|| self.clock.now());
                // SAFETY: every SGE names a source area inside `res.mr` (alive until the
                // QPs are gone: Res drops them first); RDMA READ results land there and
                // the CPU never touches those areas during the run; UD address handles
                // live in `res.ahs`. All completions are reaped before the run returns
                // (duration mode: drained after it, else flushed when the QP is destroyed).
                let r = unsafe { crate::resources::post(plan.new_post_send, &res.qps[i], batch) };
                if let Some(t0) = t0 {
                    self.probe.post_ns += self.clock.now().saturating_sub(t0);
                    self.probe.post_calls += 1;
                }
                r.map_err(|e| Error::rdma(" Couldn't post send", e))?;
                if plan.peak {
                    let from = self.tot_s as usize;
                    self.tposted[from..from + plan.list].fill(now);
                } else if self.tot_s == 0 {
                    self.tposted[0] = now;
                }
                self.scnt[i] += l;
                self.tot_s += l;
            }
        }
        Ok(())
    }

    /// Reaps send completions; each one stands for `cq_mod` requests of its QP.
    fn reap_sends(&mut self, res: &Res) -> Result<bool> {
        let plan = self.plan;
        let t0 = self.probe.on.then(|| self.clock.now());
        let n = poll(&res.send_cq, &mut self.wcs, plan.events)?;
        if let Some(t0) = t0 {
            self.probe.poll_ns += self.clock.now().saturating_sub(t0);
            self.probe.poll_calls += 1;
        }
        if n == 0 {
            return Ok(false);
        }
        self.reaped += n as u64;
        // Without peak only the end time matters: it is taken once after the loop.
        let now = if plan.peak { self.clock.now() } else { 0 };
        for k in 0..n {
            let wc = self.wcs[k];
            if !wc.is_ok() {
                return Err(wc_error(
                    &wc,
                    plan.server,
                    format!("scnt={}, ccnt={}", self.tot_s, self.tot_c),
                ));
            }
            let qi = (wc.wr_id() as usize).min(plan.q - 1);
            let c = plan.cq_mod.min(plan.iters - self.ccnt[qi]);
            self.ccnt[qi] += c;
            if plan.peak {
                self.tcompleted[self.tot_c as usize..(self.tot_c + c) as usize].fill(now);
            }
            self.tot_c += c;
        }
        Ok(true)
    }

    /// Reaps receive completions, checks their length, and re-posts while receives are due.
    fn reap_recvs(&mut self, p: &Params, res: &Res, size: u64) -> Result<bool> {
        let plan = self.plan;
        let n = poll(&res.recv_cq, &mut self.wcs, plan.events)?;
        if n == 0 {
            return Ok(false);
        }
        let now = self.clock.now();
        self.first_recv.get_or_insert(now);
        self.last_recv = now;
        for k in 0..n {
            let wc = self.wcs[k];
            if !wc.is_ok() {
                return Err(wc_error(&wc, plan.server, format!(" rcnt={}", self.tot_r)));
            }
            check_recv_len(p, &wc, size)?;
            let qi = (wc.wr_id() as usize).min(plan.q - 1);
            self.tot_r += 1;
            if self.recv_posted[qi] < plan.iters {
                post_one_recv(res, p, qi, size)?;
                self.recv_posted[qi] += 1;
            }
        }
        Ok(true)
    }

    /// Duration mode: records the window's edges; true once the run should stop.
    fn window_closed(&mut self) -> bool {
        let count = if self.plan.do_send {
            self.tot_c
        } else {
            self.tot_r
        };
        let now = self.clock.now();
        self.window.as_mut().is_some_and(|w| w.tick(now, count))
    }

    /// A turn without progress: the watchdog ends a stalled run or a vanished peer.
    fn idle(&mut self, oob: &Oob) -> Result<()> {
        let (s, c, r) = (self.tot_s, self.tot_c, self.tot_r);
        let (send_goal, recv_goal) = (self.plan.send_goal(), self.plan.recv_goal());
        // With -D there is no goal (the -n default would only mislead).
        let timed = self.window.is_some();
        self.wd.idle(c + r, oob, || match timed {
            true => format!("sent {s}, send completions {c}, received {r}"),
            false => format!(
                "sent {s}, send completions {c} of {send_goal}, received {r} of {recv_goal}"
            ),
        })
    }

    /// The run's line: from the duration window, the send times, or the receive times.
    fn result(&self, size: u64, unit: f64) -> BwResult {
        let plan = self.plan;
        let (iters, avg, rate, peak) = if let Some(w) = self.window {
            let (count, ns) = w.measured();
            let (avg, rate) = stats::bw_avg(size, count, ns, unit);
            (count, avg, rate, 0.0)
        } else if plan.do_send {
            let last = self.tcompleted[self.tcompleted.len() - 1];
            let t = last.saturating_sub(self.tposted[0]);
            let (avg, rate) = stats::bw_avg(size, plan.goal, t, unit);
            let peak = if plan.peak {
                let l = plan.list as u64;
                stats::bw_peak(size, &self.tposted, &self.tcompleted, l, plan.cq_mod, unit)
            } else {
                0.0
            };
            (plan.goal, avg, rate, peak)
        } else {
            let t = self
                .last_recv
                .saturating_sub(self.first_recv.unwrap_or(self.last_recv));
            let (avg, rate) = stats::bw_avg(size, plan.goal, t, unit);
            (plan.goal, avg, rate, 0.0)
        };
        BwResult {
            size,
            iters,
            peak,
            avg,
            msg_rate: rate,
        }
    }
}

/// After a duration run: reap the `outstanding` completions still to come (of the signaled
/// requests in flight), for a short while, so the peer's handshake is not mixed with late
/// traffic. Errors here no longer matter. (It counted requests, not completions: with CQ
/// moderation it waited for completions that never come, its whole 2 s, on every duration
/// run: an outside tester's `-D 2` took 4 s.)
///
/// It also stops once nothing has completed for [`DRAIN_QUIET`]: a SEND whose peer stopped
/// posting receives (its own duration ended) waits out RNR retries and completes only when
/// the connection is torn down.
fn drain(res: &Res, mut outstanding: u64) {
    let mut wcs = [Wc::default(); 16];
    let until = Instant::now() + Duration::from_secs(2);
    let mut heard = Instant::now();
    while outstanding > 0 {
        let now = Instant::now();
        if now >= until || now.duration_since(heard) >= DRAIN_QUIET {
            break;
        }
        match res.send_cq.poll(&mut wcs) {
            Ok(0) => std::hint::spin_loop(),
            Ok(n) => {
                outstanding = outstanding.saturating_sub(n as u64);
                heard = now;
            }
            Err(_) => break,
        }
    }
}

/// How long a duration run's drain waits without a completion before it gives up.
const DRAIN_QUIET: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycling_as_perftest() {
        // -s 64 with 4 KiB pages and 64 B lines: +0x40 per WR, wrap after 64.
        assert_eq!(cycle(64, 4096, 64), (64, 64));
        assert_eq!(cycle(2, 4096, 64), (64, 64));
        assert_eq!(cycle(100, 4096, 64), (32, 128));
        assert_eq!(cycle(2048, 4096, 64), (2, 2048));
        assert_eq!(cycle(2049, 4096, 64), (1, 0));
        assert_eq!(cycle(65536, 4096, 64), (1, 0));
    }

    #[test]
    fn rings_hold_whole_post_lists() {
        for (period, l) in [(64usize, 1usize), (64, 10), (21, 4), (1, 7)] {
            let ring = period / gcd(period, l) * l;
            assert_eq!(ring % l, 0);
            assert_eq!(ring % period, 0);
        }
    }
}
