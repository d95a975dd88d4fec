//! rdma-write-read: one-sided RDMA Write and Read over a [`RawConn`]: the client writes
//! into the server's memory and reads it back, with no receive posted and no CPU on the
//! server's side of the data path.
//!
//! The server registers a region with remote write and read access only after it has
//! accepted the client (never expose writable memory to a peer that has not been
//! accepted), and sends its descriptor (`exchange_memory`). Control-channel barriers
//! (`sync`) say when each step is done:
//! 1. the client writes its pattern into the region; the server prints the region's SHA-256;
//! 2. the server fills the region with a new pattern; the client reads it and prints the
//!    SHA-256 of what it read.
//!
//! Each side prints the SHA-256 of what it put and what it found, which must match.
//!
//! ```text
//! cargo run -p rsrdma-net --example rdma-write-read -- -l 0.0.0.0:18516
//! cargo run -p rsrdma-net --example rdma-write-read -- 127.0.0.1:18516 --size 256   # KiB
//! ```
//!
//! The connection uses the TCP handshake, so any address of the server works. `-d`/`-x`
//! pick the device and GID (default: the first device and its RoCE v2 GID). Without an RDMA
//! device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma::{AccessFlags, Mr, SendWr, Wc};
use rsrdma_net::{RawConn, RawListener};
use std::process::ExitCode;
use std::time::Duration;

/// How long one work request may take to complete.
const COMPLETION_LIMIT: Duration = Duration::from_secs(10);

/// One-sided RDMA Write and Read.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// Region size in KiB
    #[arg(long, default_value_t = 256)]
    size: usize,
}

fn main() -> ExitCode {
    common::main("rdma-write-read", |a: Args| {
        let len = a
            .size
            .checked_mul(1024)
            .filter(|&l| l > 0 && l <= 1 << 30)
            .ok_or("--size must be 1 to 1048576 KiB")?;
        a.role
            .serve_or_dial(|addr| server(addr, &a, len), |addr| client(addr, &a, len))
    })
}

/// `len` bytes of a pattern that differs per seed.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A copy of a region's bytes (`read_at` holds no reference to memory a peer may write).
fn snapshot(mr: &Mr) -> Result<Vec<u8>, rsrdma::Error> {
    let mut v = vec![0u8; mr.len()];
    mr.read_at(0, &mut v)?;
    Ok(v)
}

fn server(addr: &str, a: &Args, len: usize) -> Outcome {
    let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let listener = RawListener::bind(addr, a.dev.raw_options().remote_access(remote))?;
    common::listening("rdma-write-read", listener.local_addr()?);
    let mut conn = listener.accept()?;
    // Registered only now, for the accepted peer, with only the access it needs.
    let mut region = conn.register_memory(len, AccessFlags::LOCAL_WRITE | remote)?;
    conn.exchange_memory(&[&region])?;
    conn.sync()?; // 1: the client has written
    println!(
        "server: region after the client's write: {len} bytes, sha256 {}",
        common::sha256_hex(&snapshot(&region)?)
    );
    let fresh = pattern(len, 200);
    region.write_at(0, &fresh)?;
    println!(
        "server: filled the region for the read: sha256 {}",
        common::sha256_hex(&fresh)
    );
    conn.sync()?; // 2: the client may read
    conn.sync()?; // 3: the client has read
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args, len: usize) -> Outcome {
    let mut conn = RawConn::dial(addr, a.dev.raw_options())?;
    let peer = *conn
        .exchange_memory(&[])?
        .first()
        .ok_or("the server shared no region")?;
    if peer.len < len as u64 {
        return Err(format!("the server's region has {} bytes, not {len}", peer.len).into());
    }
    let mut local = conn.register_memory(len, AccessFlags::LOCAL_WRITE)?;
    let data = pattern(len, 7);
    local.as_mut_slice()?.copy_from_slice(&data);

    // Step 1: one RDMA Write of the whole buffer.
    let sge = [local.sge(0, len)?];
    let wr = SendWr::rdma_write(1, &sge, peer.addr_at(0, len as u64)?, peer.rkey);
    // SAFETY: `local` stays alive and unchanged until the completion is reaped just below.
    unsafe { conn.post_send(&wr)? };
    wait_one(&conn)?;
    println!(
        "client: wrote {len} bytes, sha256 {}",
        common::sha256_hex(&data)
    );
    conn.sync()?; // 1
    conn.sync()?; // 2: the server has refilled its region

    // Step 2: one RDMA Read of it into a fresh buffer.
    let back = conn.register_memory(len, AccessFlags::LOCAL_WRITE)?;
    let sge = [back.sge(0, len)?];
    let wr = SendWr::rdma_read(2, &sge, peer.addr_at(0, len as u64)?, peer.rkey);
    // SAFETY: `back` stays alive, and is not read, until the completion is reaped below.
    unsafe { conn.post_send(&wr)? };
    wait_one(&conn)?;
    println!(
        "client: read {len} bytes, sha256 {}",
        common::sha256_hex(back.as_slice()?)
    );
    conn.sync()?; // 3
    conn.close()?;
    Ok(())
}

/// Waits for one send-queue completion and checks its status.
fn wait_one(conn: &RawConn) -> Outcome {
    let mut wcs = [Wc::default()];
    conn.send_cq().poll_blocking(&mut wcs, COMPLETION_LIMIT)?;
    wcs[0].ok()?;
    Ok(())
}
