//! zerocopy: sending from and receiving into registered [`Buffer`]s, with no copy of the
//! payload.
//!
//! The client takes a registered buffer from the connection, writes a text into it and sends
//! exactly that many bytes with [`Conn::send_buffer`] (gordma sent the whole buffer, padded
//! with zeros: here the length is an argument). Then it sends a large buffer (`-s`, default
//! 1 MiB): at or above the rendezvous threshold the server's NIC READs it straight into the
//! server's registered buffer ([`Conn::recv_buffer`]). Both sides print what they moved; the
//! client also prints how many payload bytes were copied into send slots (0: no copy).
//!
//! ```text
//! cargo run -p rsrdma-net --example zerocopy -- -l 0.0.0.0:18515      # server
//! cargo run -p rsrdma-net --example zerocopy -- 10.77.0.1:18515       # client
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::{Buffer, Conn};
use std::process::ExitCode;

/// Zero-copy sends and receives with registered buffers.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// The text the client sends first
    #[arg(short = 'm', long, default_value = "hello zero-copy")]
    msg: String,
    /// Bytes of the large message (rendezvous at or above 256 KiB by default)
    #[arg(short = 's', long, default_value_t = 1 << 20)]
    size: usize,
}

/// The device's options, with room for a message of `-s` bytes (both ends take the smaller
/// maximum, so both raise it).
fn options(a: &Args) -> rsrdma_net::ConnOptions {
    let max = u32::try_from(a.size).unwrap_or(u32::MAX);
    let o = a.dev.conn_options();
    let at_least = o.max_message.max(max);
    o.max_message(at_least)
}

fn main() -> ExitCode {
    common::main("zerocopy", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

/// Receives the next message into `buf`; an error if the peer closed first.
fn recv_into(conn: &Conn, buf: &mut Buffer) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(conn
        .recv_buffer(buf)?
        .ok_or("the client closed before sending")?)
}

fn server(addr: &str, a: &Args) -> Outcome {
    let conn = common::accept_one("zerocopy", addr, options(a))?;
    // One registered buffer for both messages; it must hold the largest.
    let mut buf = conn.alloc_buffer(a.size.max(4096))?;
    let n = recv_into(&conn, &mut buf)?;
    println!(
        "server: received {:?} ({n} bytes)",
        String::from_utf8_lossy(&buf.as_slice()?[..n])
    );
    let n = recv_into(&conn, &mut buf)?;
    println!(
        "server: received {n} bytes into a registered buffer, sha256 {}",
        common::sha256_hex(&buf.as_slice()?[..n])
    );
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let conn = Conn::dial(addr, options(a))?;

    let mut small = conn.alloc_buffer(64)?;
    let text = a.msg.as_bytes();
    if text.len() > small.len() {
        return Err(format!("-m: at most {} bytes", small.len()).into());
    }
    small.as_mut_slice()?[..text.len()].copy_from_slice(text);
    conn.send_buffer(&small, text.len())?; // returns when `small` may be reused
    println!("client: sent {:?} from a registered buffer", a.msg);

    let mut large = conn.alloc_buffer(a.size)?;
    for (i, b) in large.as_mut_slice()?.iter_mut().enumerate() {
        *b = (i * 7 + i / 4096) as u8;
    }
    let sum = common::sha256_hex(large.as_slice()?);
    conn.send_buffer(&large, a.size)?;
    let copied = conn.counters().map_or(0, |c| c.send_copied_bytes);
    println!("client: sent {} bytes, sha256 {sum}", a.size);
    println!("client: payload bytes copied into send slots: {copied}");
    conn.close()?;
    Ok(())
}
