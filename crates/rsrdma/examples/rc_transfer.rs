//! A real RC transfer between two processes, measured: the project's demo.
//!
//! ```text
//! rc_transfer server [--port P] [-d|--device D] [-x|--gid-index N] [--size B] [--iters N]
//! rc_transfer client HOST [same options]
//! ```
//!
//! Verbs only (rsrdma, no rsrdma-net): device, protection domain, CQ, RC queue pair, memory
//! regions, work requests and completions, with the queue-pair endpoints swapped over a
//! plain TCP socket. The device defaults to the first one, the GID index to the device's
//! RoCE v2 GID (`Context::default_gid_index`). Without RDMA it prints the library's error
//! (which says how to use the VM) and exits with status 1.
//!
//! The two sides exchange their queue-pair endpoints over TCP, connect an RC queue pair, and
//! the client then runs three phases, checking every byte:
//! 1. send bandwidth: `iters` sends of `size` bytes, `depth` in flight;
//! 2. RDMA write: one-sided writes into a region the server exposes (registered only after the
//!    client connected), verified by a checksum the server computes;
//! 3. latency: 8-byte send ping-pong.

use rsrdma::{
    AccessFlags, ConnectOptions, Cq, Gid, Mr, Pd, Qp, QpCaps, QpEndpoint, QpType, RecvWr,
    RemoteMemory, SendWr, Wc,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const DEPTH: usize = 16;
const WAIT: Duration = Duration::from_secs(30);

struct Opts {
    server: bool,
    host: String,
    port: u16,
    /// `None`: the first device.
    device: Option<String>,
    /// `None`: the device's default (RoCE v2) GID.
    gid_index: Option<u8>,
    size: usize,
    iters: usize,
}

fn parse() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    let role = args
        .next()
        .ok_or("usage: rc_transfer server|client HOST [options]")?;
    let mut o = Opts {
        server: role == "server",
        host: String::new(),
        port: 18600,
        device: None,
        gid_index: None,
        size: 65536,
        iters: 1000,
    };
    if !o.server {
        if role != "client" {
            return Err(format!("unknown role {role:?}: use server or client"));
        }
        o.host = args.next().ok_or("client needs the server's host")?;
    }
    while let Some(flag) = args.next() {
        let v = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |_| format!("bad value {v:?} for {flag}");
        match flag.as_str() {
            "--port" => o.port = v.parse().map_err(bad)?,
            "--device" | "-d" => o.device = Some(v),
            "--gid-index" | "-x" => o.gid_index = Some(v.parse().map_err(bad)?),
            "--size" => o.size = v.parse().map_err(bad)?,
            "--iters" => o.iters = v.parse().map_err(bad)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if o.size < 8 || o.iters == 0 {
        return Err("--size must be at least 8 and --iters at least 1".into());
    }
    Ok(o)
}

/// What each side tells the other: its endpoint, the test shape, and (server) its region.
#[derive(Default)]
struct Hello {
    ep: QpEndpoint,
    size: u64,
    iters: u64,
    region: RemoteMemory,
}

impl Hello {
    fn write(&self, s: &mut TcpStream) -> std::io::Result<()> {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(b"RSRDMA1\0");
        b.extend_from_slice(&self.ep.qp_num.to_be_bytes());
        b.extend_from_slice(&self.ep.psn.to_be_bytes());
        b.extend_from_slice(&self.ep.lid.to_be_bytes());
        b.extend_from_slice(&self.ep.gid.0);
        b.extend_from_slice(&self.size.to_be_bytes());
        b.extend_from_slice(&self.iters.to_be_bytes());
        b.extend_from_slice(&self.region.addr.to_be_bytes());
        b.extend_from_slice(&self.region.len.to_be_bytes());
        b.extend_from_slice(&self.region.rkey.to_be_bytes());
        s.write_all(&b)
    }

    fn read(s: &mut TcpStream) -> std::io::Result<Hello> {
        let mut b = [0u8; 8 + 4 + 4 + 2 + 16 + 8 + 8 + 8 + 8 + 4];
        s.read_exact(&mut b)?;
        if &b[..8] != b"RSRDMA1\0" {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "peer is not rc_transfer (bad magic)",
            ));
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        Ok(Hello {
            ep: QpEndpoint {
                qp_num: u32_at(8),
                psn: u32_at(12),
                lid: u16::from_be_bytes([b[16], b[17]]),
                gid: Gid(b[18..34].try_into().unwrap()),
            },
            size: u64_at(34),
            iters: u64_at(42),
            region: RemoteMemory {
                addr: u64_at(50),
                len: u64_at(58),
                rkey: u32_at(66),
            },
        })
    }
}

fn poll_one(cq: &Cq) -> Result<Wc, Box<dyn std::error::Error>> {
    let mut wc = [Wc::default()];
    cq.poll_blocking(&mut wc, WAIT)?;
    wc[0].ok()?;
    Ok(wc[0])
}

fn checksum(data: &[u8]) -> u64 {
    // FNV-1a: enough to prove both ends hold the same bytes.
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn pattern(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
    }
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rc_transfer: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        eprintln!(
            "rc_transfer {}: {e}",
            if o.server { "server" } else { "client" }
        );
        std::process::exit(1);
    }
}

fn run(o: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = match &o.device {
        Some(name) => rsrdma::open(name)?,
        None => {
            let list = rsrdma::devices()?;
            let first = list.iter().next().ok_or("no RDMA device found")?;
            rsrdma::Context::open(&first)?
        }
    };
    let gid_index = ctx.resolve_gid_index(1, o.gid_index)?;
    let pd = Pd::new(&ctx)?;
    let cq = Cq::new(&ctx, (4 * DEPTH) as u32, None)?;
    let caps = QpCaps::default()
        .max_send_wr(DEPTH as u32 * 2)
        .max_recv_wr(DEPTH as u32 * 2);
    let qp = Qp::builder(QpType::Rc).caps(caps).build(&pd, &cq, &cq)?;
    let psn = std::process::id() & 0xff_ffff;
    let me = qp.endpoint(1, gid_index, psn)?;
    let ring = o.size * DEPTH;

    let (mut tcp, peer) = if o.server {
        let l = TcpListener::bind(("0.0.0.0", o.port))?;
        let (mut s, from) = l.accept()?;
        s.set_read_timeout(Some(WAIT))?;
        let peer = Hello::read(&mut s)?;
        println!("server: accepted {from}, peer QP {:#x}", peer.ep.qp_num);
        (s, peer)
    } else {
        let mut s = connect_retry(&o.host, o.port)?;
        s.set_read_timeout(Some(WAIT))?;
        Hello {
            ep: me,
            size: o.size as u64,
            iters: o.iters as u64,
            ..Default::default()
        }
        .write(&mut s)?;
        let peer = Hello::read(&mut s)?;
        (s, peer)
    };
    // The client chooses the test's shape; the server follows it.
    let (size, iters) = if o.server {
        (peer.size as usize, peer.iters as usize)
    } else {
        (o.size, o.iters)
    };
    if o.server && (!(8..=1 << 30).contains(&size) || iters == 0) {
        return Err(
            format!("the client asked for an unreasonable test: {iters} x {size} B").into(),
        );
    }

    // The server grants remote write only now, to the peer it accepted, and only on this region.
    let exposed = if o.server {
        Some(Mr::new(
            &pd,
            size * DEPTH,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )?)
    } else {
        None
    };
    let access = if o.server {
        AccessFlags::REMOTE_WRITE
    } else {
        AccessFlags::NONE
    };
    qp.connect(
        &ConnectOptions::default()
            .gid_index(gid_index)
            .access(access),
        psn,
        &peer.ep,
    )?;
    let mut bufs = Mr::new(&pd, size.max(ring), AccessFlags::LOCAL_WRITE)?;

    if o.server {
        let region = exposed.as_ref().map(|m| m.remote()).unwrap_or_default();
        // Receives for phase 1 first, then tell the client it may start.
        let sges: Vec<_> = (0..DEPTH)
            .map(|i| [bufs.sge(i * size, size).unwrap()])
            .collect();
        for (i, s) in sges.iter().enumerate() {
            // SAFETY: `bufs` outlives every completion reaped below; read only after each.
            unsafe { qp.post_recv(&RecvWr::new(i as u64, s))? };
        }
        Hello {
            ep: me,
            size: size as u64,
            iters: iters as u64,
            region,
        }
        .write(&mut tcp)?;
        let mut sum = 0u64;
        for n in 0..iters {
            let wc = poll_one(&cq)?;
            let slot = wc.wr_id() as usize;
            let got = &bufs.as_slice()?[slot * size..slot * size + wc.byte_len() as usize];
            sum = sum.wrapping_add(checksum(got));
            if n + DEPTH < iters {
                // SAFETY: as above; the slot was just consumed.
                unsafe { qp.post_recv(&RecvWr::new(slot as u64, &sges[slot]))? };
            }
        }
        tcp.write_all(&sum.to_be_bytes())?;
        // Phase 2: the client writes into `exposed`, then says so; answer with its checksum.
        let mut done = [0u8; 1];
        tcp.read_exact(&mut done)?;
        // The region is remotely writable: copy it out rather than borrow it.
        let region = exposed.as_ref().unwrap();
        let mut written = vec![0u8; region.len()];
        region.read_at(0, &mut written)?;
        tcp.write_all(&checksum(&written).to_be_bytes())?;
        // Phase 3: echo 8-byte pings. The next receive is posted before each echo goes out,
        // so the client's next ping always finds one.
        let lat_iters = iters.min(1000);
        let rsge = [bufs.sge(0, 8)?];
        let ssge = [bufs.sge(16, 8)?];
        // SAFETY: `bufs` outlives the completions; the CPU does not touch it in this phase.
        unsafe { qp.post_recv(&RecvWr::new(0, &rsge))? };
        tcp.write_all(b"R")?;
        for i in 0..lat_iters {
            poll_one(&cq)?;
            if i + 1 < lat_iters {
                // SAFETY: as above.
                unsafe { qp.post_recv(&RecvWr::new(i as u64 + 1, &rsge))? };
            }
            // SAFETY: as above.
            unsafe { qp.post_send(&SendWr::send(i as u64, &ssge))? };
            poll_one(&cq)?;
        }
        tcp.read_exact(&mut done)?;
        println!("server: done");
        return Ok(());
    }

    // Client. The server's hello came only after it had posted its receives, and it carries
    // the region the server exposes.
    let mut sum = 0u64;
    for slot in 0..DEPTH {
        pattern(
            &mut bufs.as_mut_slice()?[slot * size..(slot + 1) * size],
            slot as u8,
        );
    }
    let sges: Vec<_> = (0..DEPTH)
        .map(|i| [bufs.sge(i * size, size).unwrap()])
        .collect();
    let start = Instant::now();
    let mut posted = 0;
    let mut done = 0;
    while done < iters {
        while posted < iters && posted - done < DEPTH {
            let slot = posted % DEPTH;
            // SAFETY: `bufs` outlives every completion reaped here; slots are not rewritten.
            unsafe { qp.post_send(&SendWr::send(slot as u64, &sges[slot]))? };
            sum = sum.wrapping_add(checksum(&bufs.as_slice()?[slot * size..(slot + 1) * size]));
            posted += 1;
        }
        poll_one(&cq)?;
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let mut theirs = [0u8; 8];
    tcp.read_exact(&mut theirs)?;
    let ok = u64::from_be_bytes(theirs) == sum;
    let gbits = (iters * size) as f64 * 8.0 / secs / 1e9;
    println!("send bandwidth : {iters} x {size} B in {secs:.3} s = {gbits:.3} Gb/s, {:.0} msg/s, data {}", iters as f64 / secs, if ok { "verified" } else { "MISMATCH" });
    if !ok {
        return Err("the server received different bytes than were sent".into());
    }

    // Phase 2: one-sided writes into the server's region, DEPTH in flight, then verify.
    // The region is `DEPTH` messages long: write all of it, one message-sized piece per WR.
    let region = peer.region;
    let total = region.len as usize;
    if total > bufs.len() {
        return Err(format!(
            "the server exposed {total} B, more than the {} B here",
            bufs.len()
        )
        .into());
    }
    pattern(&mut bufs.as_mut_slice()?[..total], 99);
    let chunk = size;
    let chunks = total.div_ceil(chunk);
    let start = Instant::now();
    let (mut posted, mut done) = (0usize, 0usize);
    while done < chunks {
        while posted < chunks && posted - done < DEPTH {
            let off = posted * chunk;
            let len = chunk.min(total - off);
            let sge = [bufs.sge(off, len)?];
            // SAFETY: as above; this part of `bufs` is not rewritten until verified.
            unsafe {
                qp.post_send(&SendWr::rdma_write(
                    posted as u64,
                    &sge,
                    region.addr_at(off as u64, len as u64)?,
                    region.rkey,
                ))?
            };
            posted += 1;
        }
        poll_one(&cq)?;
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    tcp.write_all(b"W")?;
    tcp.read_exact(&mut theirs)?;
    let ok = u64::from_be_bytes(theirs) == checksum(&bufs.as_slice()?[..total]);
    println!(
        "rdma write     : {total} B in {chunks} writes in {:.3} ms = {:.3} Gb/s, data {}",
        secs * 1e3,
        total as f64 * 8.0 / secs / 1e9,
        if ok { "verified" } else { "MISMATCH" }
    );
    if !ok {
        return Err("the server's region differs from what was written".into());
    }

    // Phase 3: latency.
    let lat_iters = iters.min(1000);
    let sge = [bufs.sge(0, 8)?];
    let rsge = [bufs.sge(8, 8)?];
    let mut ready = [0u8; 1];
    tcp.read_exact(&mut ready)?;
    let mut samples = Vec::with_capacity(lat_iters);
    for i in 0..lat_iters {
        // SAFETY: as above.
        unsafe { qp.post_recv(&RecvWr::new(i as u64, &rsge))? };
        let t = Instant::now();
        // SAFETY: as above.
        unsafe { qp.post_send(&SendWr::send(i as u64, &sge))? };
        poll_one(&cq)?;
        poll_one(&cq)?;
        samples.push(t.elapsed());
    }
    tcp.write_all(b"D")?;
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "send latency   : {lat_iters} round trips of 8 B: min {:.1} us, median {:.1} us, p99 {:.1} us (round trip)",
        us(samples[0]),
        us(samples[samples.len() / 2]),
        us(samples[samples.len() * 99 / 100]),
    );
    println!(
        "client: done (device {}, GID index {gid_index:?}, QP {:#x} -> {:#x})",
        ctx.name(),
        me.qp_num,
        peer.ep.qp_num
    );
    Ok(())
}

fn connect_retry(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}
