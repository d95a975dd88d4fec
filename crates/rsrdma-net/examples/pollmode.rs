//! pollmode: how blocking calls wait for the NIC ([`PollMode`]): `busy` polls (lowest
//! latency, one core per waiting thread), `event` sleeps on the completion channel (no CPU
//! while idle), `adaptive` (the default) polls for a while, then sleeps.
//!
//! An echo: the client sends `-n` small messages one at a time and prints the mean round
//! trip. The two sides may use different modes: the mode is local, nothing on the wire.
//!
//! ```text
//! cargo run -p rsrdma-net --example pollmode -- -l 0.0.0.0:18515 --poll event    # server
//! cargo run -p rsrdma-net --example pollmode -- 10.77.0.1:18515 --poll busy      # client
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::{Parser, ValueEnum};
use common::Outcome;
use rsrdma_net::{Conn, PollMode};
use std::process::ExitCode;
use std::time::Instant;

/// How a blocking call waits.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Busy,
    Event,
    Adaptive,
}

impl Mode {
    fn poll_mode(self) -> PollMode {
        match self {
            Mode::Busy => PollMode::Busy,
            Mode::Event => PollMode::Event,
            Mode::Adaptive => PollMode::default(),
        }
    }
}

/// An echo in a chosen poll mode.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// How blocking calls wait for completions
    #[arg(long, value_enum, default_value = "adaptive")]
    poll: Mode,
    /// Round trips the client makes
    #[arg(short = 'n', long, default_value_t = 1000)]
    count: u32,
}

fn main() -> ExitCode {
    common::main("pollmode", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let opts = a.dev.conn_options().poll_mode(a.poll.poll_mode());
    let conn = common::accept_one("pollmode", addr, opts)?;
    let mut buf = [0u8; 64];
    let mut n = 0u64;
    while let Some(len) = conn.recv_msg_into(&mut buf)? {
        conn.send_msg(&buf[..len])?;
        n += 1;
    }
    println!("server: poll={:?}, echoed {n} messages", conn.poll_mode());
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let opts = a.dev.conn_options().poll_mode(a.poll.poll_mode());
    let conn = Conn::dial(addr, opts)?;
    let msg = [7u8; 64];
    let mut buf = [0u8; 64];
    let start = Instant::now();
    for _ in 0..a.count {
        conn.send_msg(&msg)?;
        let len = conn
            .recv_msg_into(&mut buf)?
            .ok_or("the server closed early")?;
        if buf[..len] != msg {
            return Err("the echo differs".into());
        }
    }
    let rtt = start.elapsed() / a.count.max(1);
    println!(
        "client: poll={:?}, {} round trips, mean {rtt:?}",
        conn.poll_mode(),
        a.count
    );
    conn.close()?;
    Ok(())
}
