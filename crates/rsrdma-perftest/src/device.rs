//! The device and port a run uses, and the parameters that depend on them.

use crate::args::{Conn, Params, RESULT_LINE};
use crate::error::{Error, Result};
use crate::out::Out;
use crate::report;
use crate::{Kind, Verb};
use rsrdma::{Context, LinkLayer, Mtu, PortState};

/// What the port offers.
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// Link layer.
    pub link: LinkLayer,
    /// LID.
    pub lid: u16,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
}

/// Opens `-d` (`auto`: the active device nearest to this CPU) or the first device, with
/// perftest's messages.
///
/// # Errors
/// [`Error::Perftest`] with perftest's wording.
pub fn open_device(p: &Params) -> Result<Context> {
    let none = " Did not detect devices \n If device exists, check if driver is up\n Unable to find the Infiniband/RoCE device";
    let list = rsrdma::devices().map_err(|e| {
        tracing::debug!(%e, "no device list");
        Error::Perftest(none.into())
    })?;
    // `-d auto`: the active device nearest to the CPU this runs on (sysfs's topology); the
    // first device when sysfs names none (the software device).
    let auto = p.device.as_deref() == Some("auto");
    let nearest = auto
        .then(|| {
            let devices = rsrdma::topology::topology().ok()?;
            let name = rsrdma::topology::nearest(&devices, rsrdma::topology::current_numa_node())?
                .name
                .clone();
            tracing::debug!(device = %name, "-d auto");
            Some(name)
        })
        .flatten();
    let wanted = if auto {
        nearest.as_ref()
    } else {
        p.device.as_ref()
    };
    let dev = match wanted {
        Some(name) => list.find(name).ok_or_else(|| {
            Error::Perftest(format!(
                "IB device {name} not found\n Unable to find the Infiniband/RoCE device"
            ))
        })?,
        None => list
            .iter()
            .next()
            .ok_or_else(|| Error::Perftest(none.into()))?,
    };
    Context::open(&dev).map_err(|e| {
        Error::Perftest(format!(
            "Couldn't get context for the device: {e}\n Unable to find the Infiniband/RoCE device"
        ))
    })
}

/// Queries the port `-i`; it must be active.
///
/// # Errors
/// [`Error::Perftest`] for a missing or inactive port.
pub fn port_info(ctx: &Context, p: &Params) -> Result<PortInfo> {
    let a = ctx.query_port(p.ib_port).map_err(|e| {
        Error::Perftest(format!(
            " Unable to query port {} of {}: {e}\n Couldn't get context for the device",
            p.ib_port,
            ctx.name()
        ))
    })?;
    if a.state != PortState::Active {
        return Err(Error::Perftest(format!(
            " Port number {} state is {}\n Couldn't set the link layer",
            p.ib_port, a.state
        )));
    }
    Ok(PortInfo {
        link: a.link_layer,
        lid: a.lid,
        active_mtu: a.active_mtu.unwrap_or(Mtu::Mtu1024),
        gid_tbl_len: a.gid_tbl_len,
    })
}

fn is_mellanox(ctx: &Context) -> bool {
    matches!(ctx.attr().vendor_id, 0x02c9 | 0x119f | 0x15b3)
}

/// Applies the rules that need the device: inline defaults, the UD size cap, and the notes
/// perftest prints about them before connecting.
///
/// # Errors
/// [`Error::Perftest`] for an explicit UD size above the MTU.
pub fn adjust_for_device(
    p: &Params,
    ctx: &Context,
    port: &PortInfo,
    o: &mut Out<'_>,
) -> Result<Params> {
    let mut p = p.clone();
    if p.inline.is_none() {
        let known = is_mellanox(ctx);
        if p.tool.verb.reads() && !known {
            // As perftest's `ctx_set_max_inline`: the dashed line on stdout, then the note
            // on stderr.
            o.text(RESULT_LINE);
            o.text_err("Device not recognized to implement inline feature. Disabling it\n");
        }
        let dflt = match (p.tool.verb, p.tool.kind, known) {
            (Verb::Write, Kind::Lat, true) => 220,
            (Verb::Send, Kind::Lat, true) if p.conn == Conn::Ud => 188,
            (Verb::Send, Kind::Lat, true) => 236,
            _ => 0,
        };
        p.inline = Some(dflt);
    }
    if p.conn == Conn::Ud {
        // The MTU the QPs get: `-m`, else the port's active one (an outside tester's `-m
        // 1024` still let 4096-byte datagrams through).
        let mtu = p.mtu.map_or(u64::from(port.active_mtu.bytes()), u64::from);
        if !p.all && p.size > mtu {
            if p.size_explicit {
                return Err(Error::Perftest(format!(
                    " Max message size in UD cannot be greater than MTU \n (the MTU is {mtu}: -s {} is too large for UD, -c UD)",
                    p.size
                )));
            }
            o.text_err(&report::ud_size_note(mtu as u32));
            p.size = mtu;
        }
    }
    Ok(p)
}
