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
