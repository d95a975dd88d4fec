//! RawConn send bandwidth, for the side-by-side benchmark (`cargo xtask bench perftest`).
//!
//! ```text
//! rawconn_bw server [--port P] [--device D] [--gid-index N]
//! rawconn_bw client HOST [--port P] [--device D] [--gid-index N] [--size B] [--iters N]
//!            [--depth N] [--batch N]      # --batch 1: per-WR `pipeline`; >1: `pipeline_batch`
//! ```
//!
//! The client's size, iteration count and depth are handshake parameters, so the two ends
//! cannot disagree silently. The client prints one line:
//! `rawconn_bw: mode=batch size=65536 iters=5000 depth=128 batch=16 gbits=… mpps=… post_calls=…`
//! plus the probe's line with `RSRDMA_PROBE=1`.

use rsrdma::{AccessFlags, RecvWr, SendWr};
use rsrdma_net::{RawConn, RawListener, RawOptions};
use std::time::Duration;

const PARAM_SIZE: u16 = 1;
const PARAM_ITERS: u16 = 2;
const PARAM_DEPTH: u16 = 3;

struct Args {
    server: bool,
    host: String,
    port: u16,
    device: Option<String>,
    gid_index: Option<u8>,
    size: usize,
    iters: u64,
    depth: u32,
    batch: u32,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let role = it
        .next()
        .ok_or("usage: rawconn_bw server|client HOST [options]")?;
    let mut a = Args {
        server: role == "server",
        host: String::new(),
        port: 18700,
        device: None,
        gid_index: None,
        size: 65536,
        iters: 5000,
        depth: 128,
        batch: 16,
    };
    if !a.server {
        if role != "client" {
            return Err(format!("unknown role {role:?}"));
        }
        a.host = it.next().ok_or("client needs a host")?;
    }
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |_| format!("bad value {v:?} for {flag}");
        match flag.as_str() {
            "--port" => a.port = v.parse().map_err(bad)?,
            "--device" | "-d" => a.device = Some(v),
            "--gid-index" | "-x" => a.gid_index = Some(v.parse().map_err(bad)?),
            "--size" | "-s" => a.size = v.parse().map_err(bad)?,
            "--iters" | "-n" => a.iters = v.parse().map_err(bad)?,
            "--depth" | "-t" => a.depth = v.parse().map_err(bad)?,
            "--batch" | "-l" => a.batch = v.parse().map_err(bad)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.size == 0 || a.iters == 0 || a.depth == 0 || a.batch == 0 || a.batch > a.depth {
        return Err("size, iters and depth must be positive, and 1 <= batch <= depth".into());
    }
    Ok(a)
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rawconn_bw: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&a) {
        eprintln!(
            "rawconn_bw {}: {e}",
            if a.server { "server" } else { "client" }
        );
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let opts = RawOptions::default()
        .device(a.device.clone())
        .gid_index(a.gid_index)
        .send_depth(a.depth)
        .recv_depth(a.depth)
        .timeout(Duration::from_secs(30));
    if a.server {
        // The server takes the test's shape from the client: accept first with no parameters
        // of its own, then read them from the peer's endpoint.
        let l = RawListener::bind(("0.0.0.0", a.port), opts)?;
        let mut rc = l.accept()?;
        let p = |k: u16| {
            rc.peer_endpoint()
                .params
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| *v)
                .ok_or(format!("the client sent no parameter {k}"))
        };
        let (size, iters, depth) = (
            p(PARAM_SIZE)? as usize,
            p(PARAM_ITERS)?,
            p(PARAM_DEPTH)? as u32,
        );
        if size > 1 << 30 || depth > 1 << 16 {
            return Err(format!("unreasonable request: size {size}, depth {depth}").into());
        }
        let depth = depth.min(rc.qp().caps().max_recv_wr);
        let mr = rc.register_memory(size * depth as usize, AccessFlags::LOCAL_WRITE)?;
        let sges: Vec<_> = (0..depth as usize)
            .map(|i| [mr.sge(i * size, size).unwrap()])
            .collect();
        // SAFETY: `mr` outlives the drain, which reaps every completion before returning.
        let st = unsafe {
            rc.recv_drain(iters, depth, |id| {
                RecvWr::new(id, &sges[(id % u64::from(depth)) as usize])
            })
        }?;
        rc.sync()?;
        eprintln!(
            "rawconn_bw server: received {} messages, {} bytes",
            st.completed, st.bytes
        );
        rc.close()?;
        return Ok(());
    }
    let opts = opts.params(vec![
        (PARAM_SIZE, a.size as u64),
        (PARAM_ITERS, a.iters),
        (PARAM_DEPTH, u64::from(a.depth)),
    ]);
    let mut rc = dial_retry(&a.host, a.port, opts)?;
    let slots = a.depth as usize;
    let mr = rc.register_memory(a.size * slots, AccessFlags::NONE)?;
    let sges: Vec<_> = (0..slots)
        .map(|i| [mr.sge(i * a.size, a.size).unwrap()])
        .collect();
    let make = |id: u64| SendWr::send(id, &sges[(id % slots as u64) as usize]);
    // SAFETY: `mr` outlives the pipeline and is never written during it.
    let st = unsafe {
        if a.batch == 1 {
            rc.pipeline(a.iters, a.depth, make)
        } else {
            rc.pipeline_batch(a.iters, a.depth, a.batch, make)
        }
    }?;
    rc.sync()?;
    println!(
        "rawconn_bw: mode={} size={} iters={} depth={} batch={} gbits={:.6} mpps={:.6} post_calls={} secs={:.6}",
        if a.batch == 1 { "pipeline" } else { "batch" },
        a.size,
        st.completed,
        a.depth,
        a.batch,
        st.gbits_per_sec(),
        st.mpps(),
        st.post_calls,
        st.elapsed.as_secs_f64(),
    );
    if let Some(p) = st.probe_report() {
        println!("{p}");
    }
    rc.close()?;
    Ok(())
}

fn dial_retry(host: &str, port: u16, opts: RawOptions) -> rsrdma_net::Result<RawConn> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match RawConn::dial((host, port), opts.clone()) {
            Err(rsrdma_net::NetError::Io { op: "connect", .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}
