//! Where a connection's verbs objects come from: a protection domain the caller shares between
//! connections, or a device named in the options, or the first device. One place, so RawConn,
//! Conn and PacketConn agree on the rules and the errors.

use crate::error::{NetError, Result};
use rsrdma::{Context, Pd};

/// The device context: the shared domain's, the named device's, or the first device's. A name
/// that differs from the shared domain's device is an error, not silently ignored.
///
/// # Errors
/// [`NetError::InvalidArgument`] for that conflict or when there is no device at all; the
/// errors of [`rsrdma::open`] and [`rsrdma::devices`].
pub(crate) fn open_device(device: Option<&str>, pd: Option<&Pd>) -> Result<Context> {
    check_device(device, pd)?;
    if let Some(pd) = pd {
        return Ok(pd.context().clone());
    }
    if let Some(name) = device {
        return Ok(rsrdma::open(name)?);
    }
    let list = rsrdma::devices()?;
    let dev = list
        .iter()
        .next()
        .ok_or_else(|| NetError::InvalidArgument("no RDMA device".into()))?;
    Ok(Context::open(&dev)?)
}

/// Refuses a device name that differs from the shared domain's device. Callers run it with
/// their other option checks, before any socket or verb.
///
/// # Errors
/// [`NetError::InvalidArgument`] naming both devices.
pub(crate) fn check_device(device: Option<&str>, pd: Option<&Pd>) -> Result<()> {
    if let (Some(name), Some(pd)) = (device, pd) {
        let pd_device = pd.context().name();
        if name != pd_device {
            return Err(NetError::InvalidArgument(format!(
                "device {name} was named, but the shared protection domain is on {pd_device}"
            )));
        }
    }
    Ok(())
}

/// Checks at a listener's bind what every handshake would otherwise find on its own side,
/// after the peer was accepted: the device exists, `port` is one of its ports, the GID index
/// (or the default choice) is there, and the queues fit ([`check_fits`]). Without it, a
/// listener whose options cannot work bound fine and then failed every peer, its `accept`
/// never returning.
///
/// # Errors
/// [`NetError::InvalidArgument`] naming the option; the device's errors (no such device).
pub(crate) fn check_fits_device(
    device: Option<&str>,
    pd: Option<&Pd>,
    port: u8,
    gid_index: Option<u8>,
    fits: &Fits<'_>,
) -> Result<()> {
    let ctx = open_device(device, pd)?;
    ctx.query_port(port)?;
    ctx.resolve_gid_index(port, gid_index)?;
    check_fits(&ctx, fits)
}

/// What a connection's queues need of a device, each with the option it comes from.
#[derive(Default)]
pub(crate) struct Fits<'a> {
    /// Work requests of a queue pair's send or receive queue (`max_qp_wr`).
    pub(crate) queues: &'a [(&'a str, u32)],
    /// Entries of a completion queue (`max_cqe`).
    pub(crate) cqs: &'a [(&'a str, u32)],
    /// Work requests of a shared receive queue (`max_srq_wr`).
    pub(crate) srq: Option<(&'a str, u32)>,
}

/// Refuses options whose queues `ctx`'s device cannot hold, naming the option and the
/// device's limit (each against its own limit: a completion queue against `max_cqe`, not
/// `max_qp_wr`, which refused depths that work). Run before any queue is made, so that the
/// error names what the user set rather than a verbs field.
///
/// # Errors
/// [`NetError::InvalidArgument`] naming the option.
pub(crate) fn check_fits(ctx: &Context, fits: &Fits<'_>) -> Result<()> {
    let attr = ctx.attr();
    let refuse = |what: &str, n: u32, holds: &str, limit: u32| {
        Err(NetError::InvalidArgument(format!(
            "{what} {n} does not fit device {}: its {holds} hold at most {limit}",
            ctx.name()
        )))
    };
    if let Some((what, n)) = fits.srq.filter(|&(_, n)| n > attr.max_srq_wr) {
        return refuse(what, n, "shared receive queues", attr.max_srq_wr);
    }
    if let Some(&(what, n)) = fits.queues.iter().find(|(_, n)| *n > attr.max_qp_wr) {
        return refuse(what, n, "queue pairs' queues", attr.max_qp_wr);
    }
    if let Some(&(what, n)) = fits.cqs.iter().find(|(_, n)| *n > attr.max_cqe) {
        return refuse(what, n, "completion queues", attr.max_cqe);
    }
    Ok(())
}

/// The device context and a protection domain: the shared one, or a new one on the device
/// [`open_device`] picks.
///
/// # Errors
/// As [`open_device`], and [`rsrdma::Error`] from `ibv_alloc_pd`.
pub(crate) fn open_domain(device: Option<&str>, pd: Option<&Pd>) -> Result<(Context, Pd)> {
    let ctx = open_device(device, pd)?;
    let pd = match pd {
        Some(pd) => pd.clone(),
        None => Pd::new(&ctx)?,
    };
    Ok((ctx, pd))
}
