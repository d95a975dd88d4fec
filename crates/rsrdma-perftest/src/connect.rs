//! Bringing the QPs up to the peer's endpoints with [`Qp::connect`], and perftest's message for
//! the transition that failed.

use crate::args::{Conn, Params};
use crate::error::{Error, Result};
use crate::resources::Res;
use crate::wire::Dest;
use crate::Verb;
use rsrdma::{
    AccessFlags, Ah, AhAttr, ConnectOptions, DeviceAttr, Gid, GlobalRoute, Mtu, Qp, QpEndpoint,
    QpState,
};

/// Connects QP `i` to `remote[i]` for every QP: up to RTS on the sides that send (and always
/// for UD), else RTR; UD also gets an address handle per peer.
///
/// # Errors
/// perftest's message for the failed transition, or a failed address handle.
pub fn connect_qps(
    p: &Params,
    res: &mut Res,
    remote: &[Dest],
    mtu: Mtu,
    gid_index: Option<u8>,
) -> Result<()> {
    let dev = res.pd.context().attr().clone();
    for (i, (qp, r)) in res.qps.iter().zip(remote).enumerate() {
        let opts = options(p, &dev, res.out_reads, r, mtu, gid_index);
        let peer = QpEndpoint {
            qp_num: r.qpn,
            psn: r.psn,
            lid: r.lid,
            gid: Gid(r.gid),
        };
        qp.connect(&opts, res.psn[i], &peer)
            .map_err(|e| failed_transition(qp, e))?;
        if p.conn == Conn::Ud {
            let a = Ah::new(&res.pd, &ud_path(p, r, gid_index))
                .map_err(|e| Error::Perftest(format!(" Failed to create AH for UD\n ({e})")))?;
            res.ahs.push(a);
        }
    }
    Ok(())
}

/// perftest's QP attributes: its read depths (this side serves `out_reads`, the peer's count
/// bounds what this side issues), `-u`, `-S`, `--tclass`, `--pkey_index`.
fn options(
    p: &Params,
    dev: &DeviceAttr,
    out_reads: u32,
    r: &Dest,
    mtu: Mtu,
    gid_index: Option<u8>,
) -> ConnectOptions {
    let access = match p.tool.verb {
        // rsrdma validates QP access flags like MR flags (REMOTE_WRITE needs LOCAL_WRITE);
        // LOCAL_WRITE has no meaning on a QP, so adding it changes nothing.
        Verb::Write | Verb::Send => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        Verb::Read => AccessFlags::REMOTE_READ,
        Verb::Atomic => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    };
    let served = out_reads.min(dev.max_qp_rd_atom).min(255) as u8;
    let issued = r
        .out_reads
        .clamp(1, dev.max_qp_init_rd_atom.max(1))
        .min(255) as u8;
    ConnectOptions::default()
        .port(p.ib_port)
        .gid_index(gid_index)
        .mtu(mtu)
        .access(access)
        .timeout(p.qp_timeout)
        .max_dest_rd_atomic(served)
        .max_rd_atomic(issued)
        .sl(p.sl)
        .traffic_class(p.tclass)
        .pkey_index(p.pkey_index)
        // The write and read servers (unidirectional) never send: they stop at RTR.
        .ready_to_send(p.sends() || p.conn == Conn::Ud)
}

/// The path a UD QP sends on to `r`.
fn ud_path(p: &Params, r: &Dest, gid_index: Option<u8>) -> AhAttr {
    AhAttr {
        port_num: p.ib_port,
        dlid: r.lid,
        sl: p.sl,
        grh: gid_index.map(|g| GlobalRoute {
            dgid: Gid(r.gid),
            sgid_index: g,
            hop_limit: 0xff,
            traffic_class: p.tclass,
            flow_label: 0,
        }),
        ..Default::default()
    }
}

/// perftest's message for the transition that failed: the QP stays in the last state reached.
fn failed_transition(qp: &Qp, e: rsrdma::Error) -> Error {
    let n = qp.qp_num();
    let to = match qp.state() {
        // `Qp::connect` checks the RTR and RTS values before its first transition: a value
        // it refused is the failure of the step that takes it, as perftest reports it.
        QpState::Reset => match &e {
            rsrdma::Error::Limit {
                what: "max_rd_atomic" | "timeout" | "retry_cnt" | "rnr_retry" | "sq_psn",
                ..
            } => "RTS",
            rsrdma::Error::Limit { .. } | rsrdma::Error::InvalidArgument(_) => "RTR",
            _ => return Error::rdma(format!(" Failed to modify QP {n} to INIT"), e),
        },
        QpState::Rtr => "RTS",
        state => {
            if state != QpState::Init {
                tracing::debug!(?state, "connect failed in an unexpected state");
            }
            "RTR"
        }
    };
    tracing::debug!(%e, "{to} failed");
    Error::Perftest(format!(
        "Failed to modify QP {n} to {to}\n Unable to Connect the HCA's through the link\n ({e})"
    ))
}
