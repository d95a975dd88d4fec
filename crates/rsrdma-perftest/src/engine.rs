//! One end of a test: the device, the TCP exchange in each tool's order (spec 1.2–1.4),
//! resources (spec 2.2–2.3) and reporting. The busy loops live in [`crate::datapath`].

use crate::args::{self, Conn, OutputOnly, Params, ParseOutcome, RESULT_LINE};
use crate::datapath::{self, Ends, Res};
use crate::error::{Ctx, Error, Result};
use crate::oob::{self, Oob, Wait};
use crate::report::{self, HeaderInfo, JsonResults};
use crate::stats::{BwResult, LatResult};
use crate::wire::{self, Dest, Report, Trailer};
use crate::{Kind, Tool, Verb};
use rsrdma::{
    AccessFlags, Ah, AhAttr, CompChannel, Context, Cq, GlobalRoute, InitAttr, LinkLayer, Mr, Mtu,
    Pd, PortState, Qp, QpCaps, QpType, RtrAttr, RtsAttr,
};
use std::io::Write;

/// What the binaries call: parse, run, print errors, return the exit code.
pub fn main(tool: Tool) -> i32 {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let p = match args::parse(tool, &argv) {
        Ok(p) => p,
        Err(ParseOutcome::Print { stdout, code }) => {
            print!("{stdout}");
            return code;
        }
        Err(ParseOutcome::Error { stderr, stdout }) => {
            eprint!("{stderr}");
            print!("{stdout}");
            return 1;
        }
    };
    if p.rdma_cm {
        eprintln!("{}", Error::Unsupported("rdma_cm (-R)"));
        return 1;
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let r = if p.loopback {
        loopback(&p, &mut out)
    } else {
        single(&p, &mut out)
    };
    let _ = out.flush();
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Runs one end as its own process would: open the device, connect, run.
fn single(p: &Params, out: &mut dyn Write) -> Result<()> {
    let mut o = Out::new(out, p.output.is_some());
    o.notes(p);
    let ctx = open_device(p)?;
    let port = port_info(&ctx, p)?;
    let p = adjust_for_device(p, &ctx, &port, &mut o)?;
    let oob = if p.is_server() {
        let l = oob::listen(p.port)?;
        o.text(report::BANNER);
        o.flush();
        Oob::accept(l)?
    } else {
        Oob::connect(p.host.as_deref().unwrap_or_default(), p.port)?
    };
    run_connected(&p, &ctx, &port, oob, &mut o)
}

/// `--loopback`: the server runs on a thread with its output discarded; this thread is the
/// client and prints what a client prints.
fn loopback(p: &Params, out: &mut dyn Write) -> Result<()> {
    let mut o = Out::new(out, p.output.is_some());
    o.notes(p);
    let listener = oob::listen(p.port)?;
    let port_no = listener.local_addr().map(|a| a.port()).unwrap_or(p.port);
    let mut sp = p.clone();
    sp.loopback = false;
    sp.host = None;
    sp.out_json = None;
    let server = std::thread::Builder::new()
        .name("loopback-server".into())
        .spawn(move || -> Result<()> {
            let mut sink = std::io::sink();
            let mut so = Out::new(&mut sink, true);
            let ctx = open_device(&sp)?;
            let port = port_info(&ctx, &sp)?;
            let sp = adjust_for_device(&sp, &ctx, &port, &mut so)?;
            let oob = Oob::accept(listener)?;
            run_connected(&sp, &ctx, &port, oob, &mut so)
        })
        .map_err(|e| Error::Oob(format!(" Unable to start the loopback server thread: {e}")))?;
    let mut cp = p.clone();
    cp.loopback = false;
    cp.host = Some("127.0.0.1".into());
    let client = (|| {
        let ctx = open_device(&cp)?;
        let port = port_info(&ctx, &cp)?;
        let cp = adjust_for_device(&cp, &ctx, &port, &mut o)?;
        let oob = Oob::connect("127.0.0.1", port_no)?;
        run_connected(&cp, &ctx, &port, oob, &mut o)
    })();
    let srv = server
        .join()
        .unwrap_or_else(|_| Err(Error::Oob(" The loopback server thread panicked".into())));
    match (client, srv) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err(Error::Oob(format!(" loopback server: {e}"))),
    }
}

/// Output that honours `--output=` (only the bare value) and flushes per line.
pub struct Out<'a> {
    w: &'a mut dyn Write,
    quiet: bool,
}

impl<'a> Out<'a> {
    /// Output to `w`; with `quiet`, only [`Out::value`] prints.
    pub fn new(w: &'a mut dyn Write, quiet: bool) -> Out<'a> {
        Out { w, quiet }
    }

    /// Normal text.
    pub fn text(&mut self, s: &str) {
        if !self.quiet {
            let _ = self.w.write_all(s.as_bytes());
        }
    }

    /// The `--output=` value.
    pub fn value(&mut self, s: &str) {
        if self.quiet {
            let _ = self.w.write_all(s.as_bytes());
        }
    }

    /// Pushes what was written to the terminal or pipe.
    pub fn flush(&mut self) {
        let _ = self.w.flush();
    }

    fn notes(&mut self, p: &Params) {
        for n in &p.notes {
            self.text(n);
        }
    }
}

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

/// Opens `-d` or the first device, with perftest's messages.
///
/// # Errors
/// [`Error::Perftest`] with perftest's wording.
pub fn open_device(p: &Params) -> Result<Context> {
    let none = " Did not detect devices \n If device exists, check if driver is up\n Unable to find the Infiniband/RoCE device";
    let list = rsrdma::devices().map_err(|e| {
        tracing::debug!(%e, "no device list");
        Error::Perftest(none.into())
    })?;
    let dev = match &p.device {
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
fn adjust_for_device(
    p: &Params,
    ctx: &Context,
    port: &PortInfo,
    o: &mut Out<'_>,
) -> Result<Params> {
    let mut p = p.clone();
    if p.inline.is_none() {
        let known = is_mellanox(ctx);
        if p.tool.verb == Verb::Read && !known {
            o.text("Device not recognized to implement inline feature. Disabling it\n");
            o.text(RESULT_LINE);
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
        let mtu = u64::from(port.active_mtu.bytes());
        if !p.all && p.size > mtu {
            if p.size_explicit {
                return Err(Error::Perftest(format!(
                    " Max msg size in UD is MTU {mtu}\n Message size {} is too large for UD (-c UD)",
                    p.size
                )));
            }
            o.text(&report::ud_size_note(mtu as u32));
            p.size = mtu;
        }
    }
    Ok(p)
}

fn ctrl_err(msg: &str) -> Error {
    Error::Perftest(msg.to_string())
}

/// Runs one end over an established TCP connection.
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
    // VER, with the rs trailer that perftest cannot see.
    let mine = Trailer::of(p);
    let mut ver = [0u8; wire::VER_LEN];
    oob.exchange(
        "the version",
        &wire::encode_version(Some(&mine)),
        &mut ver,
        Wait::Prompt,
    )?;
    let (version, peer_trailer) = wire::parse_version(&ver);
    if version < wire::MIN_VERSION {
        return Err(Error::Protocol(format!(
            "Current implementation is not compatible with versions older than 5.70\n (the peer {} sent \"{}\" instead of a perftest version: is it a perftest tool?)",
            oob.peer(),
            wire::printable(&ver)
        )));
    }
    if let Some(t) = &peer_trailer {
        if let Some((option, a, b)) = mine.first_difference(t) {
            return Err(Error::Mismatch {
                option: option.into(),
                mine: a,
                theirs: b,
            });
        }
    }

    // SYS: page size and cache line; both ends use the larger.
    let local_page = page_size();
    let local_line = cache_line();
    let mut b4 = [0u8; 4];
    oob.exchange(
        "the page size",
        &wire::encode_sys(local_page),
        &mut b4,
        Wait::Prompt,
    )?;
    let page = local_page.max(wire::parse_sys(&b4)).clamp(64, 1 << 30) as usize;
    oob.exchange(
        "the cache line size",
        &wire::encode_sys(local_line),
        &mut b4,
        Wait::Prompt,
    )?;
    let line = local_line.max(wire::parse_sys(&b4)).clamp(16, 4096) as usize;

    // MTU: the smaller of the two.
    let mut local_mtu = port.active_mtu;
    if let Some(bad) = p.mtu_invalid {
        eprint!(
            " Invalid MTU - {bad} \n Please choose mtu from {{256,512,1024,2048,4096}}\n Will run with the port active mtu - {}\n",
            port.active_mtu as u32
        );
    }
    if let Some(m) = p.mtu.and_then(Mtu::from_bytes) {
        if m > port.active_mtu {
            o.text(&format!(
                "Requested mtu is higher than active mtu \nChanging to active mtu - {}\n",
                port.active_mtu as u32
            ));
        } else {
            local_mtu = m;
        }
    }
    let mut b2 = [0u8; 2];
    oob.exchange(
        "the MTU",
        &wire::encode_mtu(local_mtu),
        &mut b2,
        Wait::Prompt,
    )?;
    let mut mtu = local_mtu;
    if let Some(remote) = wire::parse_mtu(&b2) {
        let explicit = p.mtu.is_some() || peer_trailer.is_some_and(|t| t.mtu_explicit());
        if explicit && remote != local_mtu {
            return Err(Error::Mismatch {
                option: "-m (MTU)".into(),
                mine: local_mtu.bytes().to_string(),
                theirs: remote.bytes().to_string(),
            });
        }
        mtu = mtu.min(remote);
    }

    // The GID: -x, or perftest's automatic choice on RoCE.
    let gid_index = match p.gid_index {
        Some(i) => {
            if u32::from(i) >= port.gid_tbl_len {
                return Err(ctrl_err(" Unable to set up socket connection"));
            }
            Some(i)
        }
        None if port.link == LinkLayer::Ethernet => Some(auto_gid_index(ctx, p.ib_port, port)),
        None => None,
    };
    let gid = match gid_index {
        Some(i) => ctx
            .query_gid(p.ib_port, i.into())
            .map(|e| e.gid)
            .unwrap_or_default(),
        None => rsrdma::Gid::default(),
    };

    let max_size = if p.all {
        if p.conn == Conn::Ud {
            u64::from(mtu.bytes())
        } else {
            args::MAX_ALL_SIZE
        }
    } else {
        p.size
    };
    let out_reads = if p.tool.verb == Verb::Read {
        p.out_reads
            .unwrap_or(ctx.attr().max_qp_rd_atom)
            .min(ctx.attr().max_qp_rd_atom)
            .clamp(1, 255)
    } else {
        1
    };
    let mut res = create_resources(p, ctx, max_size, page, line, out_reads)?;
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

    let with_gid = gid_index.is_some();
    let my: Vec<Dest> = (0..res.qps.len())
        .map(|i| Dest {
            lid: port.lid,
            out_reads,
            qpn: res.qps[i].qp_num(),
            psn: res.psn[i],
            rkey: res.mr.rkey(),
            vaddr: res.mr.addr() + ((res.qps.len() + i) * res.buff) as u64,
            srqn: 0,
            gid: gid.0,
        })
        .collect();
    let mut hs = Handshake {
        my: &my,
        with_gid,
        remote: Vec::new(),
    };
    let q = res.qps.len();
    let connect = |res: &mut Res, remote: &[Dest]| -> Result<()> {
        check_gid_types(&gid.0, &remote[0].gid)?;
        connect_qps(p, res, remote, mtu, gid_index)
    };
    match (p.tool.verb, p.tool.kind) {
        (Verb::Write | Verb::Read, Kind::Bw) => {
            hs.round(&mut oob, q, true)?;
            connect(&mut res, &hs.remote)?;
            local_lines(o, &my, p.tool.verb, with_gid);
            hs.round(&mut oob, q, false)?;
            remote_lines(o, &hs.remote, p.tool.verb, with_gid);
            hs.one(&mut oob, Wait::Prompt)?;
        }
        (Verb::Send, Kind::Bw) => {
            hs.round(&mut oob, q, true)?;
            connect(&mut res, &hs.remote)?;
            hs.one(&mut oob, Wait::Prompt)?;
            local_lines(o, &my, p.tool.verb, with_gid);
            hs.round(&mut oob, q, false)?;
            remote_lines(o, &hs.remote, p.tool.verb, with_gid);
        }
        (_, Kind::Lat) => {
            hs.round(&mut oob, 1, true)?;
            connect(&mut res, &hs.remote)?;
            local_lines(o, &my, p.tool.verb, with_gid);
            hs.one(&mut oob, Wait::Prompt)?;
            hs.one(&mut oob, Wait::Prompt)?;
            if p.tool.verb != Verb::Send {
                hs.one(&mut oob, Wait::Prompt)?;
            }
            remote_lines(o, &hs.remote, p.tool.verb, with_gid);
        }
    }
    o.text(RESULT_LINE);
    o.flush();
    let remote = hs.remote.clone();
    let mut ends = Ends {
        oob: &mut oob,
        remote: &remote,
        hs,
    };
    let sizes = p.sizes(max_size);
    match p.tool.kind {
        Kind::Bw => bw_flow(p, &mut res, &mut ends, &sizes, &h, o)?,
        Kind::Lat => lat_flow(p, &mut res, &mut ends, &sizes, &h, o)?,
    }
    let write_lat = p.tool.verb == Verb::Write && p.tool.kind == Kind::Lat;
    if !write_lat {
        // The closing handshake. perftest reports a failure here but still exits 0: the
        // results are already out.
        if let Err(e) = ends.hs.one(ends.oob, Wait::Long(p.duration.unwrap_or(0))) {
            tracing::debug!(%e, "closing handshake failed");
            eprint!(" Failed to close connection between server and client\n Trying to close this side resources\n");
            return Ok(());
        }
        oob.finish();
    }
    Ok(())
}

/// The DEST handshakes of a run: this side's endpoints and what the peer sent.
pub struct Handshake<'a> {
    my: &'a [Dest],
    with_gid: bool,
    /// The peer's endpoints, from the first round.
    pub remote: Vec<Dest>,
}

impl Handshake<'_> {
    fn exchange(&self, oob: &mut Oob, i: usize, wait: Wait) -> Result<Dest> {
        let len = if self.with_gid {
            wire::DEST_LEN_GID
        } else {
            wire::DEST_LEN_NO_GID
        };
        let mut b = vec![0u8; len];
        oob.exchange(
            "remote address",
            &self.my[i].encode(self.with_gid),
            &mut b,
            wait,
        )?;
        Dest::parse(&b, self.with_gid)
    }

    /// One round over QPs `0..n`; the first round records the peer's endpoints, later ones
    /// check that the peer is in step (a different `-q` or test shows up here).
    fn round(&mut self, oob: &mut Oob, n: usize, first: bool) -> Result<()> {
        for i in 0..n {
            let d = self.exchange(oob, i, Wait::Prompt)?;
            if first {
                if self.remote.iter().any(|r| r.qpn == d.qpn) {
                    return Err(out_of_step());
                }
                self.remote.push(d);
            } else if self.remote.get(i) != Some(&d) {
                return Err(out_of_step());
            }
        }
        Ok(())
    }

    /// A sync handshake with QP 0's endpoint.
    pub fn one(&mut self, oob: &mut Oob, wait: Wait) -> Result<()> {
        let d = self.exchange(oob, 0, wait)?;
        if self.remote.first() != Some(&d) {
            return Err(out_of_step());
        }
        Ok(())
    }
}

fn out_of_step() -> Error {
    Error::Protocol(
        " The peer's handshake is out of step with this side's: the two ends were probably started with a different -q (number of QPs), a different test (send/write/read, bw/lat) or -a/-b on one side only".into(),
    )
}

fn local_lines(o: &mut Out<'_>, my: &[Dest], verb: Verb, gid: bool) {
    for d in my {
        o.text(&report::address_line(true, d, verb, gid));
    }
}

fn remote_lines(o: &mut Out<'_>, r: &[Dest], verb: Verb, gid: bool) {
    for d in r {
        o.text(&report::address_line(false, d, verb, gid));
    }
}

fn check_gid_types(local: &[u8; 16], remote: &[u8; 16]) -> Result<()> {
    let mapped = |g: &[u8; 16]| g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff;
    if mapped(local) != mapped(remote) {
        return Err(ctrl_err(
            "\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.\n",
        ));
    }
    Ok(())
}

/// perftest's automatic GID choice on RoCE: prefer IPv4-mapped, then RoCE v2.
fn auto_gid_index(ctx: &Context, port: u8, pi: &PortInfo) -> u8 {
    let mapped = |g: &rsrdma::Gid| g.to_ipv4().is_some();
    let mut best: Option<rsrdma::GidEntry> = ctx.query_gid(port, 0).ok();
    for i in 1..pi.gid_tbl_len.min(256) {
        let Ok(c) = ctx.query_gid(port, i) else {
            continue;
        };
        if c.gid.is_zero() {
            continue;
        }
        let replace = match &best {
            None => true,
            Some(b) if mapped(&c.gid) != mapped(&b.gid) => mapped(&c.gid),
            Some(b) => {
                c.gid_type == rsrdma::GidType::RoceV2 && b.gid_type == rsrdma::GidType::RoceV1
            }
        };
        if replace {
            best = Some(c);
        }
    }
    best.map_or(0, |b| b.index.min(255) as u8)
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u32
    } else {
        4096
    }
}

fn cache_line() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_LEVEL1_DCACHE_LINESIZE) };
    if v > 0 {
        return v as u32;
    }
    std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(64)
}

/// Rounds `x` up to whole cache lines (at least one).
pub fn inc(x: usize, line: usize) -> usize {
    x.div_ceil(line).max(1) * line
}

fn create_resources(
    p: &Params,
    ctx: &Context,
    max_size: u64,
    page: usize,
    line: usize,
    out_reads: u32,
) -> Result<Res> {
    let q = p.num_qps as usize;
    let buff = inc((max_size as usize).max(page), line);
    let len = 2 * q * buff + line + 64;
    let pd = Pd::new(ctx).ctx("Couldn't allocate PD")?;
    let mut access = match p.tool.verb {
        Verb::Write => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        Verb::Read => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        Verb::Send => AccessFlags::LOCAL_WRITE,
    };
    if p.relaxed_ordering {
        access |= AccessFlags::RELAXED_ORDERING;
    }
    let mut mr = Mr::new(&pd, len, access).ctx("Couldn't allocate MR")?;
    if !(p.tool.verb == Verb::Write && p.tool.kind == Kind::Lat) {
        // perftest fills the buffer with random bytes; write_lat's stays zero (its last byte
        // is the ping-pong counter).
        let mut x = seed() | 1;
        for chunk in mr.as_mut_slice().chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
    let channel = if p.events {
        Some(CompChannel::new(ctx).ctx("Couldn't create completion channel")?)
    } else {
        None
    };
    let send_cq = Cq::new(ctx, (p.tx_depth * p.num_qps).max(1), channel.as_ref())
        .ctx("Couldn't create CQ")?;
    let recv_cq = if p.tool.verb == Verb::Send {
        Cq::new(ctx, (p.rx_depth * p.num_qps).max(1), channel.as_ref()).ctx("Couldn't create CQ")?
    } else {
        send_cq.clone()
    };
    let qp_type = match p.conn {
        Conn::Rc => QpType::Rc,
        Conn::Uc => QpType::Uc,
        Conn::Ud => QpType::Ud,
    };
    let inline = p.inline.unwrap_or(0);
    let caps = QpCaps {
        max_send_wr: p.tx_depth,
        max_recv_wr: if p.tool.verb == Verb::Send {
            p.rx_depth
        } else {
            1
        },
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: inline,
    };
    let mut qps = Vec::with_capacity(q);
    for _ in 0..q {
        let qp = Qp::builder(qp_type)
            .caps(caps)
            .build(&pd, &send_cq, &recv_cq)
            .map_err(|e| Error::rdma("Couldn't create QP", e))?;
        qps.push(qp);
    }
    let mut rng = seed();
    let psn = (0..q)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng & 0xff_ffff) as u32
        })
        .collect();
    Ok(Res {
        pd,
        mr,
        send_cq,
        recv_cq,
        qps,
        ahs: Vec::new(),
        buff,
        page,
        line,
        inline,
        psn,
        out_reads,
        recv_posted: vec![0; q],
    })
}

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

fn connect_qps(
    p: &Params,
    res: &mut Res,
    remote: &[Dest],
    mtu: Mtu,
    gid_index: Option<u8>,
) -> Result<()> {
    let access = match p.tool.verb {
        // rsrdma validates QP access flags like MR flags (REMOTE_WRITE needs LOCAL_WRITE);
        // LOCAL_WRITE has no meaning on a QP, so adding it changes nothing.
        Verb::Write | Verb::Send => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        Verb::Read => AccessFlags::REMOTE_READ,
    };
    let dev = res.pd.context().attr().clone();
    for (i, qp) in res.qps.iter().enumerate() {
        let r = &remote[i];
        let ah = AhAttr {
            port_num: p.ib_port,
            dlid: r.lid,
            sl: p.sl,
            grh: gid_index.map(|g| GlobalRoute {
                dgid: rsrdma::Gid(r.gid),
                sgid_index: g,
                hop_limit: 0xff,
                traffic_class: p.tclass,
                flow_label: 0,
            }),
            ..Default::default()
        };
        qp.to_init(&InitAttr {
            port: p.ib_port,
            pkey_index: p.pkey_index,
            access,
            ..Default::default()
        })
        .map_err(|e| Error::rdma(format!(" Failed to modify QP {} to INIT", qp.qp_num()), e))?;
        let rtr_fail = |e: rsrdma::Error| {
            tracing::debug!(%e, "RTR failed");
            Error::Perftest(format!(
                "Failed to modify QP {} to RTR\n Unable to Connect the HCA's through the link\n ({e})",
                qp.qp_num()
            ))
        };
        qp.to_rtr(&RtrAttr {
            path_mtu: mtu,
            dest_qp_num: r.qpn,
            rq_psn: r.psn & 0xff_ffff,
            max_dest_rd_atomic: res.out_reads.min(dev.max_qp_rd_atom).min(255) as u8,
            min_rnr_timer: 12,
            ah,
        })
        .map_err(rtr_fail)?;
        if p.sends() || p.conn == Conn::Ud {
            qp.to_rts(&RtsAttr {
                sq_psn: res.psn[i],
                timeout: p.qp_timeout,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: r.out_reads.clamp(1, dev.max_qp_init_rd_atom.max(1)).min(255) as u8,
            })
            .map_err(|e| {
                Error::Perftest(format!(
                    "Failed to modify QP {} to RTS\n Unable to Connect the HCA's through the link\n ({e})",
                    qp.qp_num()
                ))
            })?;
        }
        if p.conn == Conn::Ud {
            let a = Ah::new(&res.pd, &ah)
                .map_err(|e| Error::Perftest(format!(" Failed to create AH for UD\n ({e})")))?;
            res.ahs.push(a);
        }
    }
    Ok(())
}

fn unit(p: &Params) -> f64 {
    if p.report_gbits {
        crate::stats::GBIT
    } else {
        crate::stats::MIB
    }
}

fn exchange_report(ends: &mut Ends<'_>, r: &Report) -> Result<Report> {
    let msgs = r.encode();
    let mut got = [[0u8; 8]; 5];
    for (m, g) in msgs.iter().zip(got.iter_mut()) {
        ends.oob
            .exchange("reports", m, g, Wait::Prompt)
            .map_err(|e| Error::Oob(format!("ethernet_read_data: Couldn't read reports\n{e}")))?;
    }
    Ok(Report::decode(&got))
}

fn print_bw(p: &Params, h: &HeaderInfo, o: &mut Out<'_>, r: &BwResult) {
    o.text(&report::bw_line(r, p.report_gbits));
    match p.output {
        Some(OutputOnly::Bandwidth) => o.value(&format!("{:.6}\n", r.avg)),
        Some(OutputOnly::MessageRate) => o.value(&format!("{:.6}\n", r.msg_rate)),
        _ => {}
    }
    if let Some(path) = &p.out_json {
        let res = match p.output {
            Some(OutputOnly::Bandwidth) => JsonResults::Only(format!("bw_avg: {:.6},\n", r.avg)),
            Some(OutputOnly::MessageRate) => {
                JsonResults::Only(format!("msgRate_avg: {:.6},\n", r.msg_rate))
            }
            _ => JsonResults::Bw(*r),
        };
        if let Err(e) = std::fs::write(path, report::json(p, h, &res)) {
            eprintln!(" Couldn't write the json report {path}: {e}");
        }
    }
    o.flush();
}

fn print_lat(p: &Params, h: &HeaderInfo, o: &mut Out<'_>, r: &LatResult) {
    o.text(&report::lat_line(r));
    if p.output == Some(OutputOnly::Latency) {
        o.value(&format!("{:.6}\n", r.avg));
    }
    if let Some(path) = &p.out_json {
        let res = if p.output == Some(OutputOnly::Latency) {
            JsonResults::Only(format!("avg_lat: {:.6}\n", r.avg))
        } else {
            JsonResults::Lat(*r)
        };
        if let Err(e) = std::fs::write(path, report::json(p, h, &res)) {
            eprintln!(" Couldn't write the json report {path}: {e}");
        }
    }
    o.flush();
}

fn sum(a: &BwResult, b: &Report) -> BwResult {
    BwResult {
        size: a.size,
        iters: a.iters,
        peak: a.peak + b.bw_peak,
        avg: a.avg + b.bw_avg,
        msg_rate: a.msg_rate + b.msg_rate,
    }
}

fn to_report(r: &BwResult) -> Report {
    Report {
        size: r.size,
        iters: r.iters,
        bw_peak: r.peak,
        bw_avg: r.avg,
        msg_rate: r.msg_rate,
    }
}

fn bw_flow(
    p: &Params,
    res: &mut Res,
    ends: &mut Ends<'_>,
    sizes: &[u64],
    h: &HeaderInfo,
    o: &mut Out<'_>,
) -> Result<()> {
    let unit = unit(p);
    o.text(&report::bw_table_header(p.report_gbits));
    o.flush();
    let long = Wait::Long(p.duration.unwrap_or(0));
    let mut probe_lines = Vec::new();
    match p.tool.verb {
        Verb::Write | Verb::Read if !p.bidir => {
            if p.is_server() {
                // Passive: the client runs every size, then reports the last one.
                ends.hs.one(ends.oob, long)?;
                let got = exchange_report(ends, &Report::default())?;
                let r = BwResult {
                    size: got.size,
                    iters: got.iters,
                    peak: got.bw_peak,
                    avg: got.bw_avg,
                    msg_rate: got.msg_rate,
                };
                print_bw(p, h, o, &r);
            } else {
                let mut last = BwResult::default();
                for &size in sizes {
                    let run = datapath::bw_run(p, res, ends, size, unit)?;
                    last = run.result;
                    print_bw(p, h, o, &last);
                    probe_lines.extend(run.probe);
                }
                ends.hs.one(ends.oob, long)?;
                // The server answers with whatever it has (perftest: garbage): ignored.
                let _ = exchange_report(ends, &to_report(&last))?;
            }
        }
        Verb::Write | Verb::Read => {
            for (k, &size) in sizes.iter().enumerate() {
                if k == 0 || p.all {
                    ends.hs.one(ends.oob, Wait::Prompt)?;
                }
                let run = datapath::bw_run(p, res, ends, size, unit)?;
                if p.all {
                    ends.hs.one(ends.oob, long)?;
                }
                let peer = exchange_report(ends, &to_report(&run.result))?;
                print_bw(p, h, o, &sum(&run.result, &peer));
                probe_lines.extend(run.probe);
            }
        }
        Verb::Send => {
            for (k, &size) in sizes.iter().enumerate() {
                datapath::prepost_recvs(p, res, size)?;
                if k == 0 || p.all {
                    ends.hs.one(ends.oob, Wait::Prompt)?;
                }
                let run = datapath::bw_run_send(p, res, ends, size, unit)?;
                if p.bidir {
                    let peer = exchange_report(ends, &to_report(&run.result))?;
                    print_bw(p, h, o, &sum(&run.result, &peer));
                } else {
                    print_bw(p, h, o, &run.result);
                }
                probe_lines.extend(run.probe);
                if p.all {
                    ends.hs.one(ends.oob, long)?;
                }
            }
        }
    }
    o.text(RESULT_LINE);
    for l in probe_lines {
        o.text(&l);
    }
    o.flush();
    Ok(())
}

fn lat_flow(
    p: &Params,
    res: &mut Res,
    ends: &mut Ends<'_>,
    sizes: &[u64],
    h: &HeaderInfo,
    o: &mut Out<'_>,
) -> Result<()> {
    let read_server = p.tool.verb == Verb::Read && p.is_server();
    if read_server {
        // Passive: the client reads our memory; we wait in the closing handshake.
        return Ok(());
    }
    o.text(report::LAT_TABLE_HEADER);
    o.flush();
    let rtt = if p.tool.verb == Verb::Read { 1.0 } else { 2.0 };
    let per_usec = if p.report_cycles {
        rtt
    } else {
        crate::stats::MHZ * rtt
    };
    for &size in sizes {
        let tposted = match p.tool.verb {
            Verb::Send => {
                datapath::prepost_recvs(p, res, size)?;
                ends.hs.one(ends.oob, Wait::Prompt)?;
                datapath::send_lat(p, res, ends, size)?
            }
            Verb::Write => datapath::write_lat(p, res, ends, size)?,
            Verb::Read => datapath::read_lat(p, res, ends, size)?,
        };
        let mut samples = crate::stats::lat_samples(&tposted);
        if p.histogram {
            let mut shown = samples.clone();
            if !p.unsorted {
                shown.sort_unstable();
            }
            let us: Vec<f64> = shown.iter().map(|&c| c as f64 / per_usec).collect();
            o.text(&report::histogram(&us));
            o.text(RESULT_LINE);
            o.text(report::LAT_TABLE_HEADER);
        }
        let r = crate::stats::lat_summary(size, p.iters, &mut samples, per_usec);
        print_lat(p, h, o, &r);
    }
    o.text(RESULT_LINE);
    o.flush();
    Ok(())
}
