//! batch: several messages in one call, [`Conn::send_batch`] and [`Conn::recv_batch`].
//!
//! The client sends 8 small messages with one `send_batch` (they go out contiguously, no
//! other sender's message between them); the server calls `recv_batch(8 - got)` until it
//! has all 8, and prints how many calls that took.
//!
//! ```text
//! cargo run -p rsrdma-net --example batch -- -l 0.0.0.0:18515      # server
//! cargo run -p rsrdma-net --example batch -- 10.77.0.1:18515       # client
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::Conn;
use std::process::ExitCode;

const COUNT: usize = 8;

/// Batched sends and receives.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
}

fn main() -> ExitCode {
    common::main("batch", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let conn = common::accept_one("batch", addr, a.dev.conn_options())?;
    let mut got = Vec::with_capacity(COUNT);
    let mut calls = 0;
    while got.len() < COUNT {
        let Some(batch) = conn.recv_batch(COUNT - got.len())? else {
            return Err(format!("the client closed after {} messages", got.len()).into());
        };
        calls += 1;
        got.extend(batch);
    }
    for m in &got {
        println!("server: {}", String::from_utf8_lossy(m));
    }
    println!(
        "server: received {} messages in {calls} recv_batch calls",
        got.len()
    );
    // Tell the client everything arrived, then close.
    conn.send_msg(format!("got {}", got.len()).as_bytes())?;
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let conn = Conn::dial(addr, a.dev.conn_options())?;
    let texts: Vec<String> = (0..COUNT).map(|i| format!("message {i}")).collect();
    let msgs: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
    conn.send_batch(&msgs)?;
    println!("client: sent {} messages with one send_batch", msgs.len());
    let ack = conn
        .recv_msg()?
        .ok_or("the server closed without answering")?;
    println!("client: server says {:?}", String::from_utf8_lossy(&ack));
    conn.close()?;
    Ok(())
}
