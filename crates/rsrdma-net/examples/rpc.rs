//! rpc: a request/response loop over a [`Conn`]: no memory regions, work requests or
//! completion queues in sight.
//!
//! The server receives a request, uppercases it and answers `reply: <REQUEST>`, until the
//! client closes. The client sends `-n` requests (`--req TEXT` plus a number), waits for
//! each reply and prints the mean call time.
//!
//! ```text
//! cargo run -p rsrdma-net --example rpc -- -l 0.0.0.0:18515           # server
//! cargo run -p rsrdma-net --example rpc -- 10.77.0.1:18515 -n 10      # client
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
use std::time::Instant;

/// A request/response loop.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// Requests the client makes
    #[arg(short = 'n', long, default_value_t = 10)]
    count: u32,
    /// The request text (each request adds its number)
    #[arg(long, default_value = "hello rpc")]
    req: String,
}

fn main() -> ExitCode {
    common::main("rpc", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let conn = common::accept_one("rpc", addr, a.dev.conn_options())?;
    let mut served = 0u64;
    // `None`: the client closed, after its last request.
    while let Some(req) = conn.recv_msg()? {
        let reply = format!("reply: {}", String::from_utf8_lossy(&req).to_uppercase());
        conn.send_msg(reply.as_bytes())?;
        served += 1;
    }
    println!("server: served {served} requests");
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let conn = Conn::dial(addr, a.dev.conn_options())?;
    let start = Instant::now();
    let mut last = String::new();
    for i in 0..a.count {
        let req = format!("{} {i}", a.req);
        conn.send_msg(req.as_bytes())?;
        let reply = conn.recv_msg()?.ok_or("the server closed mid-call")?;
        last = String::from_utf8(reply).map_err(|_| "the reply is not UTF-8")?;
        let want = format!("reply: {}", req.to_uppercase());
        if last != want {
            return Err(format!("wrong reply {last:?} to {req:?}").into());
        }
    }
    let per_call = start.elapsed() / a.count.max(1);
    println!(
        "client: {} calls, {per_call:?} per call, last reply {last:?}",
        a.count
    );
    conn.close()?;
    Ok(())
}
