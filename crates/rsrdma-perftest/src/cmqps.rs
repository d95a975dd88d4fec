//! The data QPs of `-R` (spec 2.7): made on rdma_cm ids and connected by rdma_cm, between
//! two empty endpoint exchanges on the exchange channel, as perftest's
//! `create_rdma_cm_connection` does. The client resolves one id per QP and connects them in
//! turn; the server listens on the same port (free again once the exchange's listener is
//! gone) and accepts as many requests.

use crate::args::Params;
use crate::cmlink;
use crate::error::{Error, Result};
use crate::handshake::empty_sync;
use crate::oob::{Oob, Wait};
use crate::resources::{self, Layout, Res};
use rsrdma::cm::{CmId, ConnParam, ConnectRequest};
use rsrdma::DeviceAttr;
use std::time::Duration;

/// Creates the run's resources on the rdma_cm device and connects every QP.
///
/// # Errors
/// A failed exchange, resolution, resource or connection.
pub fn connect(p: &Params, oob: &mut Oob, layout: Layout, out_reads: u32) -> Result<Res> {
    empty_sync(oob, Wait::Prompt)?;
    let res = match &p.host {
        Some(host) => client(p, host, layout, out_reads)?,
        None => {
            // Listen at once: the client connects as soon as it has the answer to the sync.
            let listener = cmlink::listen(p.port, p.num_qps.min(i32::MAX as u32) as i32)?;
            server(p, &listener, layout, out_reads)?
        }
    };
    empty_sync(oob, Wait::Prompt)?;
    Ok(res)
}

fn client(p: &Params, host: &str, layout: Layout, out_reads: u32) -> Result<Res> {
    let dst = cmlink::resolve(host, p.port)?;
    let mut ids = (0..p.num_qps)
        .map(|_| cmlink::resolved_id(dst))
        .collect::<rsrdma::Result<Vec<_>>>()
        .map_err(|e| failed("resolve the server's address", e))?;
    let ctx = ids[0]
        .context()
        .map_err(|e| failed("open the rdma_cm device", e))?;
    let mut res = resources::create_with(p, &ctx, layout, out_reads, |i, b, pd, s, r| {
        ids[i]
            .create_qp(pd, b, s, r)
            .map_err(|e| Error::rdma("Couldn't create QP", e))
    })?;
    let param = connect_param(p, ctx.attr(), out_reads);
    for (i, id) in ids.iter_mut().enumerate() {
        let mut tries = 1;
        while let Err(e) = id.connect(&param, Wait::Prompt.limit()) {
            // The server may not listen yet: a new id and QP, as perftest retries.
            if !matches!(e, rsrdma::Error::CmEvent { .. }) || tries == cmlink::CONNECT_TRIES {
                return Err(failed("connect the data QP", e));
            }
            tracing::debug!(%e, i, "data QP connect refused; trying again");
            tries += 1;
            std::thread::sleep(Duration::from_millis(100));
            *id =
                cmlink::resolved_id(dst).map_err(|e| failed("resolve the server's address", e))?;
            res.qps[i] = id
                .create_qp(
                    &res.pd,
                    &resources::qp_builder(p),
                    &res.send_cq,
                    &res.recv_cq,
                )
                .map_err(|e| Error::rdma("Couldn't create QP", e))?;
        }
    }
    Ok(res)
}

fn server(p: &Params, listener: &CmId, layout: Layout, out_reads: u32) -> Result<Res> {
    let take = || {
        listener
            .get_request(Wait::Prompt.limit())
            .map_err(|e| failed("take the client's connect request", e))
    };
    let mut first = Some(take()?);
    let ctx = first
        .as_ref()
        .map(|r| r.id.context())
        .transpose()
        .map_err(|e| failed("open the rdma_cm device", e))?
        .ok_or_else(|| Error::Perftest("no connect request".into()))?;
    resources::create_with(p, &ctx, layout, out_reads, |_, b, pd, s, r| {
        let req = match first.take() {
            Some(req) => req,
            None => take()?,
        };
        let qp = req
            .id
            .create_qp(pd, b, s, r)
            .map_err(|e| Error::rdma("Couldn't create QP", e))?;
        req.id
            .accept(
                &accept_param(p, ctx.attr(), out_reads, &req),
                Wait::Prompt.limit(),
            )
            .map_err(|e| failed("accept the data QP", e))?;
        Ok(qp)
    })
}

/// perftest's connect depths: its read depth both ways for READ and the atomics, else none.
fn connect_param(p: &Params, dev: &DeviceAttr, out_reads: u32) -> ConnParam {
    let (resp, init) = if p.tool.verb.reads() {
        (
            out_reads.min(dev.max_qp_rd_atom),
            out_reads.min(dev.max_qp_init_rd_atom),
        )
    } else {
        (0, 0)
    };
    depths(resp, init)
}

/// perftest's accept depths: its read depth, at most what the requester issues (served) and
/// serves (issued).
fn accept_param(p: &Params, dev: &DeviceAttr, out_reads: u32, req: &ConnectRequest) -> ConnParam {
    let (resp, init) = if p.tool.verb.reads() {
        (
            out_reads
                .min(u32::from(req.requester_initiator_depth))
                .min(dev.max_qp_rd_atom),
            out_reads
                .min(u32::from(req.requester_responder_resources))
                .min(dev.max_qp_init_rd_atom),
        )
    } else {
        (0, 0)
    };
    depths(resp, init)
}

fn depths(responder: u32, initiator: u32) -> ConnParam {
    ConnParam::default()
        .with_responder_resources(responder.min(255) as u8)
        .with_initiator_depth(initiator.min(255) as u8)
}

fn failed(what: &str, e: rsrdma::Error) -> Error {
    Error::Perftest(format!(
        " Failed to {what} with rdma_cm: {e}\nFailed to create RDMA CM connection with resources."
    ))
}
