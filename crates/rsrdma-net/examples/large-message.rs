//! large-message: one multi-MiB message, fragmented into frames under credit flow control
//! and reassembled by one receive.
//!
//! The client sends one message of `--size` MiB with a single `send_msg`; the server takes
//! it with a single `recv_msg_into`. Both print the SHA-256, which must match. `--buf`
//! (frame size, KiB) and `--depth` (frames in flight each way) shape the fragmentation;
//! both sides raise the message cap to `--size`.
//!
//! ```text
//! cargo run -p rsrdma-net --example large-message -- -l 0.0.0.0:18515 --size 16
//! cargo run -p rsrdma-net --example large-message -- 10.77.0.1:18515 --size 16
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::{Conn, ConnOptions};
use std::process::ExitCode;
use std::time::Instant;

/// One large message, fragmented and reassembled.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// Message size in MiB (the server takes messages up to this size)
    #[arg(long, default_value_t = 16)]
    size: u32,
    /// Frame (slot) size in KiB (default: the library's)
    #[arg(long)]
    buf: Option<u32>,
    /// Frames in flight each way (default: the library's)
    #[arg(long)]
    depth: Option<u16>,
}

impl Args {
    fn bytes(&self) -> Result<u32, String> {
        self.size
            .checked_mul(1 << 20)
            .filter(|&b| b > 0)
            .ok_or_else(|| format!("--size {} MiB: must be 1 to 4095", self.size))
    }

    fn options(&self) -> Result<ConnOptions, String> {
        let mut o = self.dev.conn_options().max_message(self.bytes()?);
        if let Some(kib) = self.buf {
            o = o.slot_size(kib.saturating_mul(1024));
        }
        if let Some(d) = self.depth {
            o = o.send_slots(d).recv_slots(d);
        }
        Ok(o)
    }
}

fn main() -> ExitCode {
    common::main("large-message", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let conn = common::accept_one("large-message", addr, a.options()?)?;
    let mut buf = vec![0u8; a.bytes()? as usize];
    let start = Instant::now();
    let len = conn
        .recv_msg_into(&mut buf)?
        .ok_or("the client closed before sending")?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "server: received one message of {len} bytes in {secs:.3} s ({} B frames), sha256 {}",
        conn.info().settled.frame_size,
        common::sha256_hex(&buf[..len])
    );
    conn.send_msg(b"ok")?;
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let conn = Conn::dial(addr, a.options()?)?;
    let msg: Vec<u8> = (0..a.bytes()?)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let start = Instant::now();
    conn.send_msg(&msg)?;
    let ack = conn
        .recv_msg()?
        .ok_or("the server closed without answering")?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "client: sent one message of {} bytes in {secs:.3} s ({:.1} MiB/s), sha256 {}; server says {:?}",
        msg.len(),
        msg.len() as f64 / (1 << 20) as f64 / secs,
        common::sha256_hex(&msg),
        String::from_utf8_lossy(&ack)
    );
    conn.close()?;
    Ok(())
}
