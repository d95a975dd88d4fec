//! A run's verbs resources (spec 2.2–2.3): one region holding a source and a target area per
//! QP, the CQs and the QPs, sized for the largest message of the run.

use crate::args::{Conn, Params};
use crate::error::{Ctx, Error, Result};
use crate::{Kind, Verb};
use rsrdma::{
    AccessFlags, Ah, CompChannel, Context, Cq, Mr, Pd, Qp, QpBuilder, QpCaps, QpType, SendOps,
    SendWr,
};

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

/// The memory layout both ends agreed on (the SYS exchange) and the largest message.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// The largest message of the run.
    pub max_size: u64,
    /// The larger page size of the two ends.
    pub page: usize,
    /// The larger cache line of the two ends.
    pub line: usize,
}

/// Rounds `x` up to whole cache lines (at least one).
pub fn inc(x: usize, line: usize) -> usize {
    x.div_ceil(line).max(1) * line
}

/// Allocates everything a run needs; the QPs stay in RESET.
///
/// # Errors
/// The failing verbs call, with perftest's wording.
pub fn create(p: &Params, ctx: &Context, layout: Layout, out_reads: u32) -> Result<Res> {
    create_with(p, ctx, layout, out_reads, |_, b, pd, s, r| {
        if p.new_post_send {
            b.build_ex(pd, s, r, send_ops(p.tool.verb))
        } else {
            b.build(pd, s, r)
        }
        .map_err(|e| Error::rdma("Couldn't create QP", e))
    })
}

/// What an extended QP of the tool posts (`--use_new_post_send`).
fn send_ops(verb: Verb) -> SendOps {
    match verb {
        Verb::Send => SendOps::SEND | SendOps::SEND_WITH_IMM,
        Verb::Write => SendOps::RDMA_WRITE | SendOps::RDMA_WRITE_WITH_IMM,
        Verb::Read => SendOps::RDMA_READ,
        Verb::Atomic => SendOps::ATOMIC_CMP_AND_SWP | SendOps::ATOMIC_FETCH_AND_ADD,
    }
}

/// Posts `wrs` on `qp`: one `post_send` (one request) or `post_send_batch`, or, with
/// `--use_new_post_send`, one `ibv_wr_*` batch.
///
/// # Safety
/// As [`Qp::post_send`], for every request.
///
/// # Errors
/// The post's.
pub unsafe fn post(new_post_send: bool, qp: &Qp, wrs: &mut [SendWr<'_>]) -> rsrdma::Result<()> {
    if new_post_send {
        let mut batch = qp.wr_batch()?;
        for wr in wrs.iter() {
            // SAFETY: the caller's contract.
            unsafe { batch.post(wr) }?;
        }
        return batch.complete();
    }
    // SAFETY: the caller's contract.
    unsafe {
        match wrs {
            [one] => qp.post_send(one),
            many => qp.post_send_batch(many),
        }
    }
}

/// Makes QP `i` of a run from the builder, the PD and the send and receive CQs.
pub trait MakeQp: FnMut(usize, &QpBuilder, &Pd, &Cq, &Cq) -> Result<Qp> {}
impl<F: FnMut(usize, &QpBuilder, &Pd, &Cq, &Cq) -> Result<Qp>> MakeQp for F {}

/// As [`create`], with the QPs made by `make_qp` (rdma_cm makes them on its ids, `-R`).
///
/// # Errors
/// The failing verbs call, with perftest's wording, or what `make_qp` returns.
pub fn create_with(
    p: &Params,
    ctx: &Context,
    layout: Layout,
    out_reads: u32,
    mut make_qp: impl MakeQp,
) -> Result<Res> {
    let q = p.num_qps as usize;
    let buff = inc((layout.max_size as usize).max(layout.page), layout.line);
    let pd = Pd::new(ctx).ctx("Couldn't allocate PD")?;
    let mr = region(p, &pd, 2 * q * buff + layout.line + 64)?;
    let channel = if p.events {
        Some(CompChannel::new(ctx).ctx("Couldn't create completion channel")?)
    } else {
        None
    };
    // perftest's words, then the options that sized it (an outside tester asked what to lower).
    let send_cq = Cq::new(ctx, (p.tx_depth * p.num_qps).max(1), channel.as_ref()).ctx(&format!(
        "Couldn't create CQ (the send CQ holds -t {} x -q {} entries: lower either)",
        p.tx_depth, p.num_qps
    ))?;
    let recv_cq = if p.tool.verb == Verb::Send {
        Cq::new(ctx, (p.rx_depth * p.num_qps).max(1), channel.as_ref()).ctx(&format!(
            "Couldn't create CQ (the receive CQ holds -r {} x -q {} entries: lower either)",
            p.rx_depth, p.num_qps
        ))?
    } else {
        send_cq.clone()
    };
    let inline = p.inline.unwrap_or(0);
    let builder = qp_builder(p);
    let qps = (0..q)
        .map(|i| make_qp(i, &builder, &pd, &send_cq, &recv_cq))
        .collect::<Result<Vec<_>>>()?;
    Ok(Res {
        pd,
        mr,
        send_cq,
        recv_cq,
        qps,
        ahs: Vec::new(),
        buff,
        page: layout.page,
        line: layout.line,
        inline,
        psn: psns(q),
        out_reads,
        recv_posted: vec![0; q],
    })
}

/// The data region, with the access the test needs, filled as perftest fills it.
fn region(p: &Params, pd: &Pd, len: usize) -> Result<Mr> {
    let mut access = match p.tool.verb {
        Verb::Write => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        Verb::Read => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        Verb::Atomic => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        Verb::Send => AccessFlags::LOCAL_WRITE,
    };
    if p.relaxed_ordering {
        access |= AccessFlags::RELAXED_ORDERING;
    }
    let mut mr = Mr::new(pd, len, access).ctx("Couldn't allocate MR")?;
    if !(p.tool.verb == Verb::Write && p.tool.kind == Kind::Lat) {
        // perftest fills the buffer with random bytes; write_lat's stays zero (its last byte
        // is the ping-pong counter).
        // Through `write_at`: the region may be remotely writable, so no slice of it.
        let mut x = Xorshift(seed());
        let mut bytes = vec![0u8; len];
        for chunk in bytes.chunks_mut(8) {
            let b = x.next().to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        mr.write_at(0, &bytes).ctx("Couldn't allocate MR")?;
    }
    Ok(mr)
}

/// How the run's QPs are made: type and queue sizes.
pub fn qp_builder(p: &Params) -> QpBuilder {
    Qp::builder(qp_type(p.conn)).caps(caps(p, p.inline.unwrap_or(0)))
}

fn qp_type(conn: Conn) -> QpType {
    match conn {
        Conn::Rc => QpType::Rc,
        Conn::Uc => QpType::Uc,
        Conn::Ud => QpType::Ud,
    }
}

fn caps(p: &Params, inline: u32) -> QpCaps {
    let recv_wr = if p.tool.verb == Verb::Send {
        p.rx_depth
    } else {
        1
    };
    QpCaps::default()
        .max_send_wr(p.tx_depth)
        .max_recv_wr(recv_wr)
        .max_send_sge(1u32)
        .max_recv_sge(1u32)
        .max_inline_data(inline)
}

/// Random 24-bit first PSNs, one per QP.
fn psns(q: usize) -> Vec<u32> {
    let mut rng = Xorshift(seed());
    (0..q).map(|_| (rng.next() & 0xff_ffff) as u32).collect()
}

/// xorshift64: cheap bytes that differ per run (perftest uses `rand()`).
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// A non-zero seed that differs per process, thread and moment.
fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let tid = std::thread::current().id();
    let h = format!("{tid:?}")
        .bytes()
        .fold(0u64, |a, b| a.wrapping_mul(31) ^ u64::from(b));
    (t ^ (u64::from(std::process::id()) << 32) ^ h.rotate_left(17)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rounds_up_to_whole_lines() {
        assert_eq!(inc(0, 64), 64);
        assert_eq!(inc(1, 64), 64);
        assert_eq!(inc(64, 64), 64);
        assert_eq!(inc(65, 64), 128);
    }

    #[test]
    fn psns_are_24_bit() {
        let p = psns(64);
        assert_eq!(p.len(), 64);
        assert!(p.iter().all(|&x| x <= 0xff_ffff));
        assert!(p.windows(2).any(|w| w[0] != w[1]));
    }
}
