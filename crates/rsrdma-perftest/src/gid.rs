//! The GID a run uses (spec 1.4): `-x`, or rsrdma's default choice on RoCE (perftest's:
//! IPv4-mapped first, then RoCE v2).

use crate::args::Params;
use crate::device::PortInfo;
use crate::error::{Error, Result};
use rsrdma::{Context, Gid};

/// The GID index (none on InfiniBand without `-x`) and this side's GID.
///
/// perftest checks `-x` only against the table's length: an index past it fails the setup,
/// an empty entry goes out as zeros (and connecting fails later).
///
/// # Errors
/// [`Error::Perftest`] for `-x` past the table; a RoCE port without a usable GID.
pub fn choose(p: &Params, ctx: &Context, port: &PortInfo) -> Result<(Option<u8>, Gid)> {
    let index = match (p.gid_index, ctx.resolve_gid_index(p.ib_port, p.gid_index)) {
        (_, Ok(i)) => i,
        (Some(i), Err(e)) if u32::from(i) < port.gid_tbl_len => {
            tracing::debug!(%e, "empty GID entry: sent as zeros, as perftest does");
            Some(i)
        }
        (Some(_), Err(e)) => {
            tracing::debug!(%e, "GID index past the table");
            return Err(Error::Perftest(
                " Unable to set up socket connection".into(),
            ));
        }
        (None, Err(e)) => return Err(Error::rdma(" Couldn't choose a GID", e)),
    };
    let gid = match index {
        Some(i) => ctx
            .query_gid(p.ib_port, i.into())
            .map(|e| e.gid)
            .unwrap_or_default(),
        None => Gid::default(),
    };
    Ok((index, gid))
}

/// Both ends must use the same kind of GID: IPv4-mapped or not.
///
/// # Errors
/// perftest's incompatibility message.
pub fn check_types(local: &[u8; 16], remote: &[u8; 16]) -> Result<()> {
    if ipv4_mapped(local) != ipv4_mapped(remote) {
        return Err(Error::Perftest(
            "\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.\n".into(),
        ));
    }
    Ok(())
}

fn ipv4_mapped(g: &[u8; 16]) -> bool {
    g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_types_must_match() {
        let mapped = Gid::from("::ffff:10.0.0.1".parse::<std::net::Ipv6Addr>().unwrap()).0;
        let link = Gid::from("fe80::1".parse::<std::net::Ipv6Addr>().unwrap()).0;
        assert!(check_types(&mapped, &mapped).is_ok());
        assert!(check_types(&link, &link).is_ok());
        let e = check_types(&mapped, &link).unwrap_err().to_string();
        assert!(
            e.contains("Found Incompatibility issue with GID types."),
            "{e}"
        );
        assert!(check_types(&[0; 16], &mapped).is_err());
    }
}
