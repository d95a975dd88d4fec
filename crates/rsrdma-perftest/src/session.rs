//! One end of a test over an established TCP connection, step by step: the setup exchanges,
//! the GID, the resources and header, the endpoint handshakes and connection, the test phase
//! and the closing handshake.

use crate::args::{self, Conn, Params, RESULT_LINE};
use crate::atomic_total;
use crate::cmqps;
use crate::connect::connect_qps;
use crate::device::PortInfo;
use crate::error::{Error, Result};
use crate::flow::{self, Phase};
use crate::gid;
use crate::handshake::{Ends, Handshake};
use crate::oob::{Oob, Wait};
use crate::out::Out;
use crate::report::{self, HeaderInfo};
use crate::resources::{self, Layout, Res};
use crate::setup;
use crate::wire::Dest;
use crate::{Kind, Verb};
use rsrdma::{Context, Gid, LinkLayer, Mtu};

/// Runs one end over an established exchange channel (TCP, or rdma_cm with `-R`).
///
/// # Errors
/// Any failure of the exchange, the device or the data path.
pub fn run_connected(
    p: &Params,
    ctx: &Context,
    port: &PortInfo,
    mut oob: Oob,
    o: &mut Out<'_>,
) -> Result<()> {
    let peer_trailer = setup::version(p, &mut oob)?;
    let (page, line) = setup::sys(&mut oob)?;
    let mtu = setup::mtu(p, port, peer_trailer.as_ref(), &mut oob, o)?;
    let (gid_index, gid) = gid::choose(p, ctx, port)?;
    let layout = Layout {
        max_size: max_size(p, mtu),
        page,
        line,
    };
    let out_reads = out_reads(p, ctx, o);
    let mut res = if oob.is_rdma_cm() {
        cmqps::connect(p, &mut oob, layout, out_reads)?
    } else {
        resources::create(p, ctx, layout, out_reads)?
    };
    let atomic_before = if p.tool.verb == Verb::Atomic && !p.sends() && atomic_total::enabled() {
        Some(atomic_total::sum_targets(&res)?)
    } else {
        None
    };
    let h = HeaderInfo {
        device: ctx.name().to_string(),
        mtu: mtu.bytes(),
        link_type: if port.link == LinkLayer::Ethernet {
            "Ethernet"
        } else {
            "IB"
        },
        gid_index,
        inline: res.inline,
        out_reads,
    };
    o.text(&report::header(p, &h));
    o.flush();

    let my = endpoints(&res, port, gid);
    let mut hs = Handshake::new(&my, gid_index.is_some());
    let cm = oob.is_rdma_cm();
    hs.setup(p.tool, &mut oob, o, |remote: &[Dest]| {
        if cm {
            // rdma_cm connected the QPs already (and perftest skips the GID check).
            return Ok(());
        }
        gid::check_types(&gid.0, &remote[0].gid)?;
        connect_qps(p, &mut res, remote, mtu, gid_index)
    })?;
    o.text(RESULT_LINE);
    o.flush();

    let remote = hs.remote.clone();
    let mut ends = Ends {
        oob: &mut oob,
        remote: &remote,
        hs,
    };
    let sizes = p.sizes(layout.max_size);
    let mut phase = Phase {
        p,
        h: &h,
        o,
        sizes: &sizes,
    };
    match p.tool.kind {
        Kind::Bw => flow::bw(&mut phase, &mut res, &mut ends)?,
        Kind::Lat => flow::lat(&mut phase, &mut res, &mut ends)?,
    }
    if closing_handshake(p, &mut ends)? {
        oob.finish();
    }
    if let Some(before) = atomic_before {
        atomic_total::report(&res, before, o)?;
    }
    Ok(())
}

/// The largest message: `-s`, or with `-a` 2^23 (UD: the MTU).
fn max_size(p: &Params, mtu: Mtu) -> u64 {
    match (p.all, p.conn) {
        (true, Conn::Ud) => u64::from(mtu.bytes()),
        (true, _) => args::MAX_ALL_SIZE,
        (false, _) => p.size,
    }
}

/// perftest's read depth: `-o` or the device's maximum, at most the device's, 1..=255; 1 for
/// the tests that neither read nor use atomics. An `-o` over the device's maximum is said, as
/// perftest's `ctx_set_out_reads` says it (it was clamped silently).
fn out_reads(p: &Params, ctx: &Context, o: &mut Out<'_>) -> u32 {
    if !p.tool.verb.reads() {
        return 1;
    }
    let max = ctx.attr().max_qp_rd_atom;
    if p.out_reads.is_some_and(|asked| asked > max) {
        o.text(RESULT_LINE);
        o.text_err(&format!(
            " Number of outstanding reads is above max = {max}\n Changing to that max value\n"
        ));
    }
    p.out_reads.unwrap_or(max).min(max).clamp(1, 255)
}

/// This side's endpoint per QP; each advertises its QP's target area.
fn endpoints(res: &Res, port: &PortInfo, gid: Gid) -> Vec<Dest> {
    let q = res.qps.len();
    (0..q)
        .map(|i| Dest {
            lid: port.lid,
            out_reads: res.out_reads,
            qpn: res.qps[i].qp_num(),
            psn: res.psn[i],
            rkey: res.mr.rkey(),
            vaddr: res.mr.addr() + ((q + i) * res.buff) as u64,
            srqn: 0,
            gid: gid.0,
        })
        .collect()
}

/// The closing handshake (none for write_lat); true when the connection should be closed
/// with perftest's "done". A failure is reported as each perftest tool does: send_bw says so
/// and goes on to exit 0 (its results are out); every other tool fails with exit status 1
/// (its `ctx_close_connection` error returns 1: an outside tester's killed client left
/// `rs_read_lat`'s server exiting 0, as if the run had passed).
fn closing_handshake(p: &Params, ends: &mut Ends<'_>) -> Result<bool> {
    if p.tool.verb == Verb::Write && p.tool.kind == Kind::Lat {
        return Ok(false);
    }
    if let Err(e) = ends.hs.one(ends.oob, Wait::Long(p.duration.unwrap_or(0))) {
        tracing::debug!(%e, "closing handshake failed");
        if p.tool.verb == Verb::Send && p.tool.kind == Kind::Bw {
            eprint!(" Failed to close connection between server and client\n Trying to close this side resources\n");
            return Ok(false);
        }
        return Err(Error::Perftest(
            "Failed to close connection between server and client".into(),
        ));
    }
    Ok(true)
}
