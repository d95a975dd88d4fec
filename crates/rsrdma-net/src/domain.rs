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
/// (or the default choice) is there, every `(what, depth)` of `depths` fits a queue of the
/// device (`max_qp_wr` and `max_cqe`), and a shared receive queue `srq` (what, depth) fits
/// `max_srq_wr`. Without it, a listener whose options cannot work bound fine and then failed
/// every peer, its `accept` never returning.
///
/// # Errors
/// [`NetError::InvalidArgument`] naming the option; the device's errors (no such device).
pub(crate) fn check_fits_device(
    device: Option<&str>,
    pd: Option<&Pd>,
    port: u8,
    gid_index: Option<u8>,
    depths: &[(&str, u32)],
    srq: Option<(&str, u32)>,
) -> Result<()> {
    let ctx = open_device(device, pd)?;
    ctx.query_port(port)?;
    ctx.resolve_gid_index(port, gid_index)?;
    let attr = ctx.attr();
    if let Some((what, depth)) = srq.filter(|&(_, d)| d > attr.max_srq_wr) {
        return Err(NetError::InvalidArgument(format!(
            "{what} {depth} does not fit device {}: its shared receive queues hold at most {}",
            ctx.name(),
            attr.max_srq_wr
        )));
    }
    let limit = attr.max_qp_wr.min(attr.max_cqe);
    if let Some((what, depth)) = depths.iter().find(|(_, d)| *d > limit) {
        return Err(NetError::InvalidArgument(format!(
            "{what} {depth} does not fit device {}: its queues hold at most {limit}",
            ctx.name()
        )));
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
