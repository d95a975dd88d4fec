//! The busy loops (spec 2.4, 2.5): work requests are built before the loop, completions are
//! polled into a reused array, and nothing on the hot path allocates, locks or formats.

use crate::args::{Conn, Params};
use crate::engine::{inc, Handshake};
use crate::error::{Error, Result};
use crate::oob::Oob;
use crate::stats::{self, BwResult};
use crate::watch::{Clock, Probe, Watchdog};
use crate::wire::Dest;
use crate::Verb;
use rsrdma::{Ah, Cq, Mr, Pd, Qp, RecvWr, SendWr, Sge, Wc, WcStatus};
use std::time::{Duration, Instant};

/// perftest's UD Q_Key.
pub const QKEY: u32 = 0x1111_1111;
/// Bytes of the GRH in front of every UD receive.
pub const GRH: usize = 40;

/// A run's verbs resources. Fields drop in order: QPs and AHs before the CQs and the memory.
pub struct Res {
    /// One QP per `-q`.
    pub qps: Vec<Qp>,
    /// UD address handles, one per QP.
    pub ahs: Vec<Ah>,
    /// The send CQ.
    pub send_cq: Cq,
    /// The receive CQ (the send CQ unless SEND).
    pub recv_cq: Cq,
    /// The one data region: per QP a source area, then per QP a target area.
    pub mr: Mr,
    /// The protection domain.
    pub pd: Pd,
    /// Bytes per area.
    pub buff: usize,
    /// The larger page size of the two ends.
    pub page: usize,
    /// The larger cache line of the two ends.
    pub line: usize,
    /// Inline size in use.
    pub inline: u32,
    /// This side's PSN per QP.
    pub psn: Vec<u32>,
    /// Outstanding reads this side serves.
    pub out_reads: u32,
    /// Receives posted so far in this size's run, per QP.
    pub recv_posted: Vec<u64>,
}

/// The connection to the peer during the test phase.
pub struct Ends<'a> {
    /// The TCP channel.
    pub oob: &'a mut Oob,
    /// The peer's endpoints.
    pub remote: &'a [Dest],
    /// The handshakes.
    pub hs: Handshake<'a>,
}

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

/// Polls `cq`, sleeping on its channel when events are on and it is empty.
#[inline]
fn poll(cq: &Cq, wcs: &mut [Wc], events: bool) -> Result<usize> {
    let n = cq
        .poll(wcs)
        .map_err(|e| Error::rdma(" Poll CQ failed", e))?;
    if n > 0 || !events {
        return Ok(n);
    }
    poll_events(cq, wcs)
}

#[cold]
fn poll_events(cq: &Cq, wcs: &mut [Wc]) -> Result<usize> {
    cq.arm(false)
        .map_err(|e| Error::rdma(" Couldn't request CQ notification", e))?;
    let n = cq
        .poll(wcs)
        .map_err(|e| Error::rdma(" Poll CQ failed", e))?;
    if n > 0 {
        return Ok(n);
    }
    match cq.wait(Some(Duration::from_millis(50))) {
        Ok(()) | Err(rsrdma::Error::Timeout { .. }) => {}
        Err(e) => return Err(Error::rdma(" Failed to get CQ event", e)),
    }
    cq.poll(wcs).map_err(|e| Error::rdma(" Poll CQ failed", e))
}

/// perftest's completion error message, with a hint about the likely cause.
#[cold]
fn wc_error(wc: &Wc, server: bool, counts: String) -> Error {
    let hint = match wc.status() {
        WcStatus::LOC_LEN_ERR => "a message larger than the receive buffer arrived: the peer's -s (message size) is larger than this side's",
        WcStatus::REM_INV_REQ_ERR => "the peer rejected the request: its -s (message size) may be smaller, or it runs a different test",
        WcStatus::REM_ACCESS_ERR => "the peer's memory does not allow this access: is it running the same test (write/read)?",
        WcStatus::RETRY_EXC_ERR => "the peer does not answer: it exited, or its connection type (-c) differs",
        WcStatus::RNR_RETRY_EXC_ERR => "the peer has no receive posted",
        WcStatus::WR_FLUSH_ERR => "the queue pair went to the error state after an earlier failure",
        _ => "",
    };
    Error::Perftest(format!(
        " Completion with error at {}\n Failed status {}: wr_id {} syndrom 0x{:x}\n{counts}\n ({}{}{})",
        if server { "server" } else { "client" },
        wc.status().0,
        wc.wr_id(),
        wc.vendor_err(),
        wc.status(),
        if hint.is_empty() { "" } else { ": " },
        hint
    ))
}

fn recv_sge(res: &Res, p: &Params, i: usize, size: u64) -> Sge {
    let q = res.qps.len();
    let (off, len) = if p.conn == Conn::Ud {
        (res.line.saturating_sub(GRH), size as usize + GRH)
    } else {
        (0, size as usize)
    };
    Sge::new(
        res.mr.addr() + ((q + i) * res.buff + off) as u64,
        len as u32,
        res.mr.lkey(),
    )
}

#[inline]
fn post_one_recv(res: &Res, p: &Params, i: usize, size: u64) -> Result<()> {
    let sge = [recv_sge(res, p, i, size)];
    let wr = RecvWr::new(i as u64, &sge);
    // SAFETY: the SGE names this QP's target area inside `res.mr`, which outlives the QP's
    // requests (Res drops its QPs first); the CPU never reads or writes that area while
    // receives are posted (payloads are not checked).
    unsafe { res.qps[i].post_recv(&wr) }.map_err(|e| Error::rdma(" Couldn't post receive", e))
}

/// Posts the first receives of a run (SEND tests, on the sides that receive): `rx_depth` per
/// QP, at most the iterations.
///
/// # Errors
/// A failed post.
pub fn prepost_recvs(p: &Params, res: &mut Res, size: u64) -> Result<()> {
    let q = res.qps.len();
    res.recv_posted = vec![0; q];
    if !p.receives() {
        return Ok(());
    }
    let n = if p.duration.is_some() {
        u64::from(p.rx_depth)
    } else {
        u64::from(p.rx_depth).min(p.iters)
    };
    for i in 0..q {
        for _ in 0..n {
            post_one_recv(res, p, i, size)?;
        }
        res.recv_posted[i] = n;
    }
    Ok(())
}

/// The duration mode's sampling window, in clock ns.
#[derive(Debug, Clone, Copy)]
struct Window {
    start_at: u64,
    end_at: u64,
    stop_at: u64,
    start: Option<(u64, u64)>,
    end: Option<(u64, u64)>,
}

impl Window {
    fn new(p: &Params, now: u64) -> Option<Window> {
        let d = p.duration?;
        let m = if d > 2 * p.margin { p.margin } else { 0 };
        let s = 1_000_000_000;
        Some(Window {
            start_at: now + m * s,
            end_at: now + (d - m) * s,
            stop_at: now + d * s,
            start: None,
            end: None,
        })
    }

    /// Records the counter at the window's edges; true once the run should stop.
    fn tick(&mut self, now: u64, count: u64) -> bool {
        if self.start.is_none() && now >= self.start_at {
            self.start = Some((count, now));
        }
        if self.end.is_none() && now >= self.end_at {
            self.end = Some((count, now));
        }
        now >= self.stop_at
    }

    fn measured(&self) -> (u64, u64) {
        match (self.start, self.end) {
            (Some((c0, t0)), Some((c1, t1))) => (c1 - c0, t1.saturating_sub(t0)),
            _ => (0, 0),
        }
    }
}

/// One bandwidth run of `size` on every QP: sends (write, read or send, on the sides that
/// send) and receives (send, on the sides that receive), per spec 2.4.
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
    let do_send = p.sends();
    let do_recv = p.receives();
    let q = res.qps.len();
    let server = p.is_server();
    let events = p.events;
    let iters = if p.duration.is_some() {
        u64::MAX
    } else {
        p.iters
    };
    let goal = p.iters.saturating_mul(q as u64);
    let tx_depth = u64::from(p.tx_depth);
    let cq_mod = u64::from(p.cq_mod.max(1));
    let l = p.post_list.max(1) as usize;
    let peak = do_send && !p.no_peak() && p.duration.is_none();

    // Build every send request once. Each QP gets a ring of requests long enough for the
    // address cycle and a whole number of post lists, so a list is always one contiguous
    // slice posted with one call.
    let (period, step) = cycle(size, res.page, res.line);
    let ring = if do_send {
        period / gcd(period, l) * l
    } else {
        0
    };
    let lkey = res.mr.lkey();
    let base = res.mr.addr();
    let mut sges = Vec::with_capacity(q * ring);
    for i in 0..q {
        for k in 0..ring {
            let off = (k % period) * step;
            sges.push(Sge::new(
                base + (i * res.buff + off) as u64,
                size as u32,
                lkey,
            ));
        }
    }
    let inline = p.tool.verb != Verb::Read && size <= u64::from(res.inline) && res.inline > 0;
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(q * ring);
    for i in 0..q {
        let r = &ends.remote[i];
        for k in 0..ring {
            let sge = std::slice::from_ref(&sges[i * ring + k]);
            let raddr = r.vaddr + ((k % period) * step) as u64;
            let mut wr = match p.tool.verb {
                Verb::Write => SendWr::rdma_write(i as u64, sge, raddr, r.rkey),
                Verb::Read => SendWr::rdma_read(i as u64, sge, raddr, r.rkey),
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
    let n_stamps = if peak { goal as usize } else { 1 };
    let mut tposted = vec![0u64; n_stamps];
    let mut tcompleted = vec![0u64; n_stamps];
    let mut scnt = vec![0u64; q];
    let mut ccnt = vec![0u64; q];
    let (mut tot_s, mut tot_c, mut tot_r) = (0u64, 0u64, 0u64);
    let mut wcs = [Wc::default(); 16];
    let mut probe = Probe::from_env();
    probe.on &= do_send;
    let mut wd = Watchdog::new(if do_send {
        "send completions"
    } else {
        "receive completions"
    });
    let clock = Clock::new();
    let mut window = Window::new(p, clock.now());
    let mut stopped = false;
    let mut turn = 0u32;
    let (mut first_recv, mut last_recv) = (None::<u64>, 0u64);
    let recv_goal = if do_recv { goal } else { 0 };
    let send_goal = if do_send { goal } else { 0 };

    loop {
        if window.is_none() && tot_c >= send_goal && tot_r >= recv_goal {
            break;
        }
        let mut progressed = false;
        if do_send && !stopped {
            for i in 0..q {
                while scnt[i] < iters && scnt[i] + l as u64 - ccnt[i] <= tx_depth {
                    let at = i * ring + (scnt[i] % ring as u64) as usize;
                    let batch = &mut wrs[at..at + l];
                    for (j, wr) in batch.iter_mut().enumerate() {
                        let t = scnt[i] + j as u64 + 1;
                        *wr = wr.signaled(t % cq_mod == 0 || t == iters);
                    }
                    let now = if peak || tot_s == 0 { clock.now() } else { 0 };
                    let t0 = probe.on.then(|| clock.now());
                    // SAFETY: every SGE names a source area inside `res.mr` (alive until the
                    // QPs are gone: Res drops them first); RDMA READ results land there and
                    // the CPU never touches those areas during the run; UD address handles
                    // live in `res.ahs`. All completions are reaped before this returns
                    // (duration mode: drained below, else flushed when the QP is destroyed).
                    let r = unsafe {
                        if l == 1 {
                            res.qps[i].post_send(&batch[0])
                        } else {
                            res.qps[i].post_send_batch(batch)
                        }
                    };
                    if let Some(t0) = t0 {
                        probe.post_ns += clock.now().saturating_sub(t0);
                        probe.post_calls += 1;
                    }
                    r.map_err(|e| Error::rdma(" Couldn't post send", e))?;
                    if peak {
                        for k in 0..l {
                            tposted[tot_s as usize + k] = now;
                        }
                    } else if tot_s == 0 {
                        tposted[0] = now;
                    }
                    scnt[i] += l as u64;
                    tot_s += l as u64;
                }
            }
        }
        if do_send && tot_c < tot_s {
            let t0 = probe.on.then(|| clock.now());
            let n = poll(&res.send_cq, &mut wcs, events)?;
            if let Some(t0) = t0 {
                probe.poll_ns += clock.now().saturating_sub(t0);
                probe.poll_calls += 1;
            }
            if n > 0 {
                progressed = true;
                // Without peak only the end time matters: it is taken once after the loop.
                let now = if peak { clock.now() } else { 0 };
                for wc in &wcs[..n] {
                    if !wc.is_ok() {
                        return Err(wc_error(wc, server, format!("scnt={tot_s}, ccnt={tot_c}")));
                    }
                    let qi = (wc.wr_id() as usize).min(q - 1);
                    let c = cq_mod.min(iters - ccnt[qi]);
                    ccnt[qi] += c;
                    if peak {
                        for k in tot_c..tot_c + c {
                            tcompleted[k as usize] = now;
                        }
                    }
                    tot_c += c;
                }
            }
        }
        if do_recv && (window.is_some() || tot_r < recv_goal) {
            let n = poll(&res.recv_cq, &mut wcs, events)?;
            if n > 0 {
                progressed = true;
                let now = clock.now();
                first_recv.get_or_insert(now);
                last_recv = now;
                for wc in &wcs[..n] {
                    if !wc.is_ok() {
                        return Err(wc_error(wc, server, format!(" rcnt={tot_r}")));
                    }
                    check_recv_len(p, wc, size)?;
                    let qi = (wc.wr_id() as usize).min(q - 1);
                    tot_r += 1;
                    if res.recv_posted[qi] < iters {
                        post_one_recv(res, p, qi, size)?;
                        res.recv_posted[qi] += 1;
                    }
                }
            }
        }
        if let Some(w) = window.as_mut() {
            turn = turn.wrapping_add(1);
            if turn & 63 == 0 {
                let count = if do_send { tot_c } else { tot_r };
                if w.tick(clock.now(), count) {
                    stopped = true;
                    break;
                }
            }
        }
        if !progressed {
            wd.idle(tot_c + tot_r, ends.oob, || {
                format!(
                    "sent {tot_s}, send completions {tot_c} of {send_goal}, received {tot_r} of {recv_goal}"
                )
            })?;
        }
    }
    let end = clock.now();
    if !peak {
        tcompleted[0] = end;
    }
    if stopped {
        drain(res, tot_s - tot_c.min(tot_s));
    }
    let n = goal;
    let result = if let Some(w) = window {
        let (count, ns) = w.measured();
        let (avg, rate) = stats::bw_avg(size, count, ns, unit);
        BwResult {
            size,
            iters: count,
            peak: 0.0,
            avg,
            msg_rate: rate,
        }
    } else if do_send {
        let t = tcompleted[n_stamps - 1].saturating_sub(tposted[0]);
        let (avg, rate) = stats::bw_avg(size, n, t, unit);
        let pk = if peak {
            stats::bw_peak(size, &tposted, &tcompleted, l as u64, cq_mod, unit)
        } else {
            0.0
        };
        BwResult {
            size,
            iters: n,
            peak: pk,
            avg,
            msg_rate: rate,
        }
    } else {
        let t = last_recv.saturating_sub(first_recv.unwrap_or(last_recv));
        let (avg, rate) = stats::bw_avg(size, n, t, unit);
        BwResult {
            size,
            iters: n,
            peak: 0.0,
            avg,
            msg_rate: rate,
        }
    };
    let probe_line = probe
        .on
        .then(|| probe.report(end.saturating_sub(tposted[0]), tot_s));
    Ok(BwRun {
        result,
        probe: probe_line,
    })
}

/// After a duration run: reap what is still in flight, for a short while, so the peer's
/// handshake is not mixed with late traffic. Errors here no longer matter.
fn drain(res: &Res, mut outstanding: u64) {
    let mut wcs = [Wc::default(); 16];
    let until = Instant::now() + Duration::from_secs(2);
    while outstanding > 0 && Instant::now() < until {
        match res.send_cq.poll(&mut wcs) {
            Ok(n) => outstanding = outstanding.saturating_sub(n as u64),
            Err(_) => break,
        }
    }
}

/// A receive's length tells the peer's message size: a different one is a mismatch that
/// perftest itself does not notice.
#[inline]
fn check_recv_len(p: &Params, wc: &Wc, size: u64) -> Result<()> {
    let grh = if p.conn == Conn::Ud { GRH as u64 } else { 0 };
    let got = u64::from(wc.byte_len());
    if got != size + grh {
        return Err(size_mismatch(size, got.saturating_sub(grh)));
    }
    Ok(())
}

#[cold]
fn size_mismatch(size: u64, got: u64) -> Error {
    Error::Mismatch {
        option: "-s (message size)".into(),
        mine: size.to_string(),
        theirs: got.to_string(),
    }
}

/// The SEND bandwidth run: identical loop, receives posted beforehand by [`prepost_recvs`].
///
/// # Errors
/// As [`bw_run`].
pub fn bw_run_send(
    p: &Params,
    res: &mut Res,
    ends: &mut Ends<'_>,
    size: u64,
    unit: f64,
) -> Result<BwRun> {
    bw_run(p, res, ends, size, unit)
}

fn wait_one(
    cq: &Cq,
    wcs: &mut [Wc; 1],
    p: &Params,
    wd: &mut Watchdog,
    oob: &Oob,
    progress: u64,
    counts: impl Fn() -> String,
) -> Result<()> {
    loop {
        let n = poll(cq, wcs, p.events)?;
        if n > 0 {
            if !wcs[0].is_ok() {
                return Err(wc_error(&wcs[0], p.is_server(), counts()));
            }
            return Ok(());
        }
        wd.idle(progress, oob, &counts)?;
    }
}

/// send_lat's ping-pong (the client sends first); returns the post times.
///
/// # Errors
/// Failed posts or completions, a stalled run, a vanished peer.
pub fn send_lat(p: &Params, res: &mut Res, ends: &mut Ends<'_>, size: u64) -> Result<Vec<u64>> {
    let iters = p.iters;
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
    let mut ts = vec![0u64; iters as usize];
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut wcs = [Wc::default(); 1];
    let mut wd = Watchdog::new("the peer's message");
    let clock = Clock::new();
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt == 0 && client) {
            wait_one(
                &res.recv_cq,
                &mut wcs,
                p,
                &mut wd,
                ends.oob,
                scnt + rcnt,
                || format!(" scnt={scnt}, rcnt={rcnt}"),
            )?;
            check_recv_len(p, &wcs[0], size)?;
            rcnt += 1;
            if res.recv_posted[0] < iters {
                post_one_recv(res, p, 0, size)?;
                res.recv_posted[0] += 1;
            }
        }
        if scnt < iters {
            ts[scnt as usize] = clock.now();
            scnt += 1;
            // SAFETY: the SGE names QP 0's source area in `res.mr` (alive longer than the
            // QP); the CPU never writes it; the completion is reaped just below.
            unsafe { res.qps[0].post_send(&wr) }
                .map_err(|e| Error::rdma(" Couldn't post send", e))?;
            wait_one(
                &res.send_cq,
                &mut wcs,
                p,
                &mut wd,
                ends.oob,
                scnt + rcnt,
                || format!(" scnt={scnt}, rcnt={rcnt}"),
            )?;
        }
    }
    Ok(ts)
}

/// write_lat's ping-pong: each side writes a counter into the last byte of the peer's target
/// area and spins on its own; the server writes first. Returns the post times.
///
/// # Errors
/// Failed posts or completions, a stalled run, a vanished peer.
pub fn write_lat(p: &Params, res: &mut Res, ends: &mut Ends<'_>, size: u64) -> Result<Vec<u64>> {
    let iters = p.iters;
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
    let mut ts = vec![0u64; iters as usize];
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut wcs = [Wc::default(); 1];
    let mut wd = Watchdog::new("the peer's write");
    let clock = Clock::new();
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt == 0 && server) {
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
                wd.idle(scnt + rcnt, ends.oob, || {
                    format!(" scnt={scnt}, rcnt={rcnt}")
                })?;
                std::hint::spin_loop();
            }
        }
        if scnt < iters {
            ts[scnt as usize] = clock.now();
            scnt += 1;
            // SAFETY: `send_last` is inside `res.mr` (QP 0's source area); the previous write
            // from it has completed (reaped below before the loop turns), so the NIC is not
            // reading it now.
            unsafe { std::ptr::write_volatile(send_last, scnt as u8) };
            // SAFETY: the SGE names QP 0's source area in `res.mr`; the CPU does not touch it
            // until the completion below is reaped.
            unsafe { res.qps[0].post_send(&wr) }
                .map_err(|e| Error::rdma(" Couldn't post send", e))?;
            wait_one(
                &res.send_cq,
                &mut wcs,
                p,
                &mut wd,
                ends.oob,
                scnt + rcnt,
                || format!(" scnt={scnt}, rcnt={rcnt}"),
            )?;
        }
    }
    Ok(ts)
}

/// read_lat: the client reads `size` bytes, waits for the completion, repeats. Returns the
/// post times.
///
/// # Errors
/// Failed posts or completions, a stalled run, a vanished peer.
pub fn read_lat(p: &Params, res: &mut Res, ends: &mut Ends<'_>, size: u64) -> Result<Vec<u64>> {
    let r = ends.remote[0];
    let sge = [Sge::new(res.mr.addr(), size as u32, res.mr.lkey())];
    let wr = SendWr::rdma_read(0, &sge, r.vaddr, r.rkey);
    let mut ts = vec![0u64; p.iters as usize];
    let mut wcs = [Wc::default(); 1];
    let mut wd = Watchdog::new("RDMA read completions");
    let clock = Clock::new();
    for k in 0..p.iters {
        ts[k as usize] = clock.now();
        // SAFETY: the SGE names QP 0's source area in `res.mr`, where the read's data lands;
        // the CPU never reads it; the completion is reaped before the next post.
        unsafe { res.qps[0].post_send(&wr) }.map_err(|e| Error::rdma(" Couldn't post send", e))?;
        wait_one(&res.send_cq, &mut wcs, p, &mut wd, ends.oob, k, || {
            format!("scnt={k}")
        })?;
    }
    Ok(ts)
}

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

    #[test]
    fn duration_window() {
        let p = crate::args::parse(
            crate::Tool::new(Verb::Write, crate::Kind::Bw),
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
}
