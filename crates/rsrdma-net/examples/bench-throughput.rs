//! bench-throughput: `send_msg` one at a time against `send_batch`, measured.
//!
//! The client sends `-n` messages of `-s` bytes with `send_msg` (pass 1), then `-n` more in
//! batches of `-b` with `send_batch` (pass 2), and prints Gb/s and Mmsg/s for each. A pass
//! ends when the server, which drains with `recv_batch(256)`, says it has them all. The
//! client tells the server `-n` first, so only the client takes the shape flags.
//!
//! ```text
//! cargo run --release -p rsrdma-net --example bench-throughput -- -l 0.0.0.0:18515
//! cargo run --release -p rsrdma-net --example bench-throughput -- 10.77.0.1:18515 -n 100000 -s 1024 -b 32
//! ```
//!
//! A self-test, not a benchmark harness: `cargo xtask bench rdmanet` compares Conn with
//! RawConn and perftest properly. `-d`/`-x` pick the device and GID (default: the first
//! device and its RoCE v2 GID). Without an RDMA device it prints the library's error and
//! exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::Conn;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// SendMsg against SendBatch.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// Messages per pass
    #[arg(short = 'n', long, default_value_t = 100_000)]
    count: u64,
    /// Message size in bytes
    #[arg(short = 's', long, default_value_t = 1024)]
    size: usize,
    /// Messages per send_batch call in pass 2
    #[arg(short = 'b', long, default_value_t = 32)]
    batch: usize,
}

fn main() -> ExitCode {
    common::main("bench-throughput", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let conn = common::accept_one("bench-throughput", addr, a.dev.conn_options())?;
    let header = conn
        .recv_msg()?
        .ok_or("the client closed before the header")?;
    let count: u64 = std::str::from_utf8(&header)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or("the header is not a message count")?;
    for pass in 1..=2 {
        let (mut got, mut bytes) = (0u64, 0u64);
        while got < count {
            let Some(batch) = conn.recv_batch(256)? else {
                return Err(format!("the client closed after {got} messages").into());
            };
            got += batch.len() as u64;
            bytes += batch.iter().map(|m| m.len() as u64).sum::<u64>();
        }
        println!("server: pass {pass}: received {got} messages, {bytes} bytes");
        conn.send_msg(b"done")?;
    }
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    if a.count == 0 || a.batch == 0 {
        return Err("-n and -b must be at least 1".into());
    }
    let conn = Conn::dial(addr, a.dev.conn_options())?;
    conn.send_msg(a.count.to_string().as_bytes())?;
    let msg = vec![0x5au8; a.size];

    let start = Instant::now();
    for _ in 0..a.count {
        conn.send_msg(&msg)?;
    }
    wait_done(&conn)?;
    report("send_msg  ", a, start.elapsed());

    let batch: Vec<&[u8]> = vec![&msg[..]; a.batch];
    let start = Instant::now();
    let mut left = a.count;
    while left > 0 {
        let k = left.min(a.batch as u64) as usize;
        conn.send_batch(&batch[..k])?;
        left -= k as u64;
    }
    wait_done(&conn)?;
    report("send_batch", a, start.elapsed());
    conn.close()?;
    Ok(())
}

fn wait_done(conn: &Conn) -> Outcome {
    match conn.recv_msg()? {
        Some(m) if m == b"done" => Ok(()),
        _ => Err("the server did not confirm the pass".into()),
    }
}

fn report(what: &str, a: &Args, took: Duration) {
    let secs = took.as_secs_f64().max(1e-9);
    let gbits = (a.count as f64 * a.size as f64 * 8.0) / secs / 1e9;
    let mmsgs = a.count as f64 / secs / 1e6;
    println!(
        "client: {what}: {} messages of {} B in {secs:.3} s: {gbits:.3} Gb/s, {mmsgs:.4} Mmsg/s",
        a.count, a.size
    );
}
