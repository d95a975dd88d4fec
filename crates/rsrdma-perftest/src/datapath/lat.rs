//! The latency loops (spec 2.5): send_lat's and write_lat's ping-pongs and read_lat's reads,
//! one request in flight at a time.

use super::{check_recv_len, post_one_recv, wait_one, QKEY};
use crate::args::{Conn, Params};
use crate::error::{Error, Result};
use crate::handshake::Ends;
use crate::resources::Res;
use crate::watch::{Clock, Watchdog};
use rsrdma::{SendWr, Sge, Wc};

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
