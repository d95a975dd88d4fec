//! The busy loops (spec 2.4, 2.5): work requests are built before the loop, completions are
//! polled into a reused array, and nothing on the hot path allocates, locks or formats.
//!
//! `bw` holds the bandwidth loop, `lat` the latency loops; this module the pieces both use:
//! polling, receives, completion errors.

mod bw;
mod lat;
mod window;

pub use bw::{bw_run, cycle, BwRun};
pub use lat::{one_sided_lat, send_lat, write_lat, LatRun};

use crate::args::{AtomicType, Conn, Params};
use crate::error::{Error, Result};
use crate::resources::Res;
use crate::Verb;
use rsrdma::{Cq, RecvWr, SendWr, Sge, Wc, WcStatus};
use std::time::Duration;

/// perftest's UD Q_Key: the one [`rsrdma::Qp::connect`] gives UD QPs.
pub const QKEY: u32 = rsrdma::qp::DEFAULT_QKEY;
/// Bytes of the GRH in front of every UD receive.
pub const GRH: usize = 40;

/// Polls `cq`, sleeping on its channel when events are on and it is empty.
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
    wc_error_hinted(wc, server, counts, None)
}

/// [`wc_error`] with `hint` in place of the status's own.
#[cold]
fn wc_error_hinted(wc: &Wc, server: bool, counts: String, hint: Option<&str>) -> Error {
    let hint = hint.unwrap_or(match wc.status() {
        WcStatus::LOC_LEN_ERR => "a message larger than the receive buffer arrived: the peer's -s (message size) is larger than this side's",
        WcStatus::REM_INV_REQ_ERR => "the peer rejected the request: its -s (message size) may be smaller, or it runs a different test",
        WcStatus::REM_ACCESS_ERR => "the peer's memory does not allow this access: is it running the same test (write/read)?",
        WcStatus::RETRY_EXC_ERR => "the peer does not answer: it exited, or its connection type (-c) differs",
        WcStatus::RNR_RETRY_EXC_ERR => "the peer has no receive posted",
        WcStatus::WR_FLUSH_ERR => "the queue pair went to the error state after an earlier failure",
        _ => "",
    });
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

/// A receive's length tells the peer's message size: a different one is a mismatch that
/// perftest itself does not notice.
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

/// perftest's atomic values: fetch-and-add adds 1; compare-and-swap compares with 0 and swaps
/// in 0.
pub const ATOMIC_ADD: u64 = 1;

/// The request of a READ or atomic test: `sge` from (or into) `raddr` in the peer's region.
fn one_sided_wr<'a>(p: &Params, wr_id: u64, sge: &'a [Sge], raddr: u64, rkey: u32) -> SendWr<'a> {
    match (p.tool.verb, p.atomic_type) {
        (Verb::Atomic, AtomicType::FetchAndAdd) => {
            SendWr::atomic_fetch_add(wr_id, sge, raddr, rkey, ATOMIC_ADD)
        }
        (Verb::Atomic, AtomicType::CmpAndSwap) => {
            SendWr::atomic_cmp_swap(wr_id, sge, raddr, rkey, 0, 0)
        }
        _ => SendWr::rdma_read(wr_id, sge, raddr, rkey),
    }
}
