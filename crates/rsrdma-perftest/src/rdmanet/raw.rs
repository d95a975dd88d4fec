//! `rs_rdmanet_bw --raw`: SEND bandwidth on `RawConn` (TCP handshake, busy polling, no
//! framing or credits), with ib_send_bw's header, address lines and table.
//!
//! Unlike gordma, the client sends its size and message count as handshake parameters, so the
//! server receives exactly that many and ends; `--raw-onebuf` is a parameter both send, so
//! ends that disagree are refused at the handshake instead of measuring different things.

use super::args::{BwArgs, Raw, Target};
use super::cpu::process_cpu;
use super::net::{connect_error, net_error};
use super::text::{
    accepted_line, cpu_line, json_rates, listening_line, raw_result, received_line,
    registered_line, Json,
};
use crate::args::{Params, RESULT_LINE};
use crate::error::{Error, Result};
use crate::out::Out;
use crate::report::{self, HeaderInfo};
use crate::wire::Dest;
use crate::{Kind, Tool, Verb};
use rsrdma::{AccessFlags, LinkLayer, RecvWr, SendWr, Sge};
use rsrdma_net::{RawConn, RawListener, RawOptions};
use std::time::Duration;

/// Handshake parameter: the message size (client only).
const PARAM_SIZE: u16 = 1;
/// Handshake parameter: the message count (client only).
const PARAM_COUNT: u16 = 2;
/// Handshake parameter: `--raw-onebuf` (both ends, so they must agree).
const PARAM_ONEBUF: u16 = 3;
/// Limit for the TCP connect and each wait on the control channel.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// The most memory a server registers for a client's request.
const MAX_REGION: u64 = 4 << 30;

fn options(a: &BwArgs, r: &Raw) -> RawOptions {
    let c = &a.common;
    RawOptions::default()
        .device(c.device.clone())
        .port(c.ib_port)
        .gid_index(c.gid_index)
        .send_depth(r.tx_depth)
        .recv_depth(r.tx_depth)
        .timeout(CONTROL_TIMEOUT)
}

fn param_name(k: u16) -> &'static str {
    match k {
        PARAM_SIZE => "-s (message size)",
        PARAM_COUNT => "-n (message count)",
        PARAM_ONEBUF => "--raw-onebuf",
        _ => "a handshake parameter",
    }
}

/// The server: one client; receives the count it announced, then prints it.
///
/// # Errors
/// Listening, the handshake (including `--raw-onebuf` on one end only), verbs errors, a
/// client that dies or stalls.
pub fn server(a: &BwArgs, r: &Raw, o: &mut Out<'_>) -> Result<Json> {
    let opts = options(a, r).params(vec![(PARAM_ONEBUF, u64::from(r.onebuf))]);
    let l =
        RawListener::bind(("0.0.0.0", a.common.port), opts).map_err(|e| raw_err("listen", e))?;
    let addr = l.local_addr().map_err(|e| net_error("listen", e))?;
    o.text(&listening_line("RawConn, TCP handshake", addr));
    o.flush();
    // One client, as perftest: its failed handshake ends the tool with its error.
    let mut rc = l.accept_first().map_err(|e| raw_err("accept", e))?;
    match rc.channel().stream().peer_addr() {
        Ok(peer) => o.text(&accepted_line(peer)),
        Err(_) => o.text(&accepted_line("an unknown address")),
    }
    let peer = |k: u16| {
        rc.peer_endpoint()
            .params
            .iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| *v)
            .ok_or_else(|| Error::Protocol(format!("the client sent no {}", param_name(k))))
    };
    let (size, count) = (peer(PARAM_SIZE)?, peer(PARAM_COUNT)?);
    let depth = r.tx_depth.min(rc.qp().caps().max_recv_wr).max(1);
    let slots = if r.onebuf { 1 } else { depth };
    if size == 0 || size > super::args::MAX_SIZE || size * u64::from(slots) > MAX_REGION {
        return Err(Error::Protocol(format!(
            "the client asks for {slots} buffers of {size} bytes: refused"
        )));
    }
    let h = header_info(&rc)?;
    let p = header_params(size, count, depth, r, None)?;
    print_header(o, &p, &h);
    let size = size as usize;
    let mr = rc
        .register_memory(size * slots as usize, AccessFlags::LOCAL_WRITE)
        .map_err(|e| raw_err("register memory", e))?;
    o.text(&registered_line(mr.len()));
    let sges = sges(&mr, size, slots)?;
    let cpu = process_cpu();
    // SAFETY: `mr` outlives the drain, which reaps every completion before it returns; the
    // CPU does not touch the region meanwhile.
    let st = unsafe {
        rc.recv_drain(count, depth, |id| {
            RecvWr::new(id, &sges[(id % sges.len() as u64) as usize])
        })
    }
    .map_err(|e| raw_err("receive", e))?;
    rc.sync().map_err(|e| raw_err("final barrier", e))?;
    let cpu = process_cpu().saturating_sub(cpu);
    o.text(&received_line(st.completed, st.bytes));
    o.text(&cpu_line(cpu));
    o.flush();
    let registered = mr.len() as u64;
    rc.close().map_err(|e| raw_err("close", e))?;
    Ok(Json::new("rs_rdmanet_bw", "server")
        .str("transport", "raw")
        .int("registered_bytes", registered)
        .num("cpu_seconds", cpu.as_secs_f64())
        .int("messages", st.completed)
        .int("bytes", st.bytes))
}

/// The client: `-n` SENDs of `-s` bytes with the tx depth in flight, then the table.
///
/// # Errors
/// Connecting, the handshake, verbs errors, a server that dies or stalls.
pub fn client(a: &BwArgs, r: &Raw, target: &Target, o: &mut Out<'_>) -> Result<Json> {
    let count = a.common.count;
    let opts = options(a, r).params(vec![
        (PARAM_SIZE, a.size),
        (PARAM_COUNT, count),
        (PARAM_ONEBUF, u64::from(r.onebuf)),
    ]);
    let mut rc = RawConn::dial((target.host.as_str(), target.port), opts).map_err(|e| match e {
        e @ rsrdma_net::NetError::Mismatch { .. } => raw_err("connect", e),
        e => connect_error(target, e, true),
    })?;
    let h = header_info(&rc)?;
    let p = header_params(a.size, count, r.tx_depth, r, Some(&target.host))?;
    print_header(o, &p, &h);
    let size = a.size as usize;
    let slots = if r.onebuf { 1 } else { r.tx_depth };
    let mr = rc
        .register_memory(size * slots as usize, AccessFlags::NONE)
        .map_err(|e| raw_err("register memory", e))?;
    o.text(&registered_line(mr.len()));
    let sges = sges(&mr, size, slots)?;
    let make = |id: u64| SendWr::send(id, &sges[(id % sges.len() as u64) as usize]);
    let cpu = process_cpu();
    // SAFETY: `mr` outlives the pipeline, which reaps every completion before it returns, and
    // the CPU never writes the region while it runs.
    let st = unsafe {
        if r.single {
            rc.pipeline(count, r.tx_depth, make)
        } else {
            rc.pipeline_batch(count, r.tx_depth, r.refill(), make)
        }
    }
    .map_err(|e| raw_err("send", e))?;
    rc.sync().map_err(|e| raw_err("final barrier", e))?;
    let cpu = process_cpu().saturating_sub(cpu);
    o.text(&report::bw_table_header(false));
    o.text(&report::bw_line(
        &raw_result(a.size, st.completed, st.elapsed),
        false,
    ));
    o.text(RESULT_LINE);
    if let Some(probe) = st.probe_report() {
        o.text(&format!("{probe}\n"));
    }
    o.text(&cpu_line(cpu));
    o.flush();
    let registered = mr.len() as u64;
    rc.close().map_err(|e| raw_err("close", e))?;
    let j = Json::new("rs_rdmanet_bw", "client")
        .str("transport", "raw")
        .str(
            "mode",
            if r.single {
                "pipeline"
            } else {
                "pipeline_batch"
            },
        )
        .int("tx_depth", u64::from(r.tx_depth))
        .int("registered_bytes", registered)
        .num("cpu_seconds", cpu.as_secs_f64());
    Ok(json_rates(j, st.completed, a.size, st.elapsed))
}

fn sges(mr: &rsrdma::Mr, size: usize, slots: u32) -> Result<Vec<[Sge; 1]>> {
    (0..slots as usize)
        .map(|i| {
            mr.sge(i * size, size)
                .map(|s| [s])
                .map_err(|e| Error::rdma("describe a buffer", e))
        })
        .collect()
}

fn raw_err(what: &str, e: rsrdma_net::NetError) -> Error {
    match e {
        // Only --raw-onebuf is a parameter both ends send.
        rsrdma_net::NetError::Mismatch { local, peer, .. } => Error::Mismatch {
            option: param_name(PARAM_ONEBUF).into(),
            mine: local,
            theirs: peer,
        },
        e => net_error(what, e),
    }
}

/// The header block, this side's and the peer's address lines, and a rule, as ib_send_bw.
fn print_header(o: &mut Out<'_>, p: &Params, h: &(HeaderInfo, Dest, Dest)) {
    let with_gid = h.0.gid_index.is_some();
    o.text(&report::header(p, &h.0));
    o.text(&report::address_line(true, &h.1, Verb::Send, with_gid));
    o.text(&report::address_line(false, &h.2, Verb::Send, with_gid));
    o.text(RESULT_LINE);
    o.flush();
}

/// perftest's [`Params`] for the header: ib_send_bw's flags for this run. The run itself
/// does not use them; the header then shows the tx depth (client) or rx depth (server), the
/// refill interval as CQ moderation, and relaxed ordering off.
///
/// # Errors
/// perftest's parser's refusal (a value outside its ranges), as a message.
pub fn header_params(
    size: u64,
    count: u64,
    depth: u32,
    r: &Raw,
    host: Option<&str>,
) -> Result<Params> {
    let mut argv: Vec<String> = vec![
        "-s".into(),
        size.to_string(),
        // perftest's -n takes 5 ..= 10^8; only the depth clamp reads it here.
        "-n".into(),
        count.clamp(5, 100_000_000).to_string(),
        if host.is_some() { "-t" } else { "-r" }.into(),
        depth.clamp(1, 15000).to_string(),
        "-Q".into(),
        r.refill().to_string(),
        "--disable_pcie_relaxed".into(),
    ];
    argv.extend(host.map(str::to_string));
    crate::args::parse(Tool::new(Verb::Send, Kind::Bw), &argv).map_err(|e| {
        Error::Perftest(format!(
            " Cannot describe this run in perftest's header: {e:?}"
        ))
    })
}

/// The device, link and both ends' addresses, read from the connection.
fn header_info(rc: &RawConn) -> Result<(HeaderInfo, Dest, Dest)> {
    let q = rc
        .qp()
        .query()
        .map_err(|e| Error::rdma("ibv_query_qp", e))?;
    let ctx = rc.pd().context();
    let port = ctx
        .query_port(q.port)
        .map_err(|e| Error::rdma("ibv_query_port", e))?;
    let gid_index = q.ah.grh.map(|g| g.sgid_index);
    let gid = match gid_index {
        Some(i) => {
            ctx.query_gid(q.port, i.into())
                .map_err(|e| Error::rdma("ibv_query_gid", e))?
                .gid
                .0
        }
        None => [0; 16],
    };
    let local = Dest {
        lid: port.lid,
        out_reads: 0,
        qpn: rc.qp().qp_num(),
        psn: q.sq_psn,
        gid,
        ..Default::default()
    };
    let pe = rc.peer_endpoint();
    let remote = Dest {
        lid: pe.lid,
        out_reads: 0,
        qpn: pe.qp_num,
        psn: pe.psn,
        gid: pe.gid.0,
        ..Default::default()
    };
    let h = HeaderInfo {
        device: ctx.name().to_string(),
        mtu: u32::from(rc.settled().mtu),
        link_type: match port.link_layer {
            LinkLayer::Ethernet => "Ethernet",
            _ => "IB",
        },
        gid_index,
        inline: 0,
        out_reads: 0,
    };
    Ok((h, local, remote))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(tx_depth: u32, single: bool) -> Raw {
        Raw {
            tx_depth,
            onebuf: false,
            single,
        }
    }

    fn info() -> HeaderInfo {
        HeaderInfo {
            device: "rxe0".into(),
            mtu: 1024,
            link_type: "Ethernet",
            gid_index: Some(1),
            inline: 0,
            out_reads: 0,
        }
    }

    #[test]
    fn client_header_shows_depth_and_refill() {
        let p = header_params(65536, 1000, 128, &raw(128, false), Some("h")).unwrap();
        let h = report::header(&p, &info());
        assert!(h.starts_with(RESULT_LINE), "{h}");
        assert!(h.contains("                    Send BW Test\n"), "{h}");
        assert!(h.contains(" TX depth        : 128\n"), "{h}");
        assert!(h.contains(" CQ Moderation   : 16\n"), "{h}");
        assert!(h.contains(" PCIe relax order: OFF\n"), "{h}");
        assert!(h.contains("Device         : rxe0\n"), "{h}");
        assert!(!h.contains("RX depth"), "{h}");
        let p = header_params(64, 1, 4, &raw(4, true), Some("h")).unwrap();
        let h = report::header(&p, &info());
        assert!(h.contains(" TX depth        : 4\n"), "{h}");
        assert!(h.contains(" CQ Moderation   : 1\n"), "{h}");
    }

    #[test]
    fn server_header_shows_rx_depth() {
        let p = header_params(4096, 200, 64, &raw(64, false), None).unwrap();
        assert!(p.is_server());
        let h = report::header(&p, &info());
        assert!(h.contains(" RX depth        : 64\n"), "{h}");
        assert!(!h.contains("TX depth"), "{h}");
    }

    #[test]
    fn parameter_names_say_which_flag() {
        assert_eq!(param_name(PARAM_ONEBUF), "--raw-onebuf");
        assert!(param_name(PARAM_SIZE).contains("-s"));
        assert!(param_name(PARAM_COUNT).contains("-n"));
    }
}
