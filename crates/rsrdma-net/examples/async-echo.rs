//! async-echo: an echo server and client on tokio ([`AsyncListener`], [`AsyncConn`]; feature
//! `tokio`).
//!
//! The server accepts connections in a loop and echoes every message of each in a task of
//! its own, so one thread serves many clients (no thread per connection: the connections
//! are driven by the tasks that await them). It stops after `--clients N` connections (0:
//! serve until killed). The client sends `-n` messages and checks every echo.
//!
//! ```text
//! cargo run -p rsrdma-net --features tokio --example async-echo -- -l 0.0.0.0:18515
//! cargo run -p rsrdma-net --features tokio --example async-echo -- 10.77.0.1:18515 -n 100
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::{Outcome, Side};
use rsrdma_net::{AsyncConn, AsyncListener, NetError};
use std::process::ExitCode;
use std::time::Instant;

/// An async echo server and client.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// Stop after serving this many connections (0: serve until killed)
    #[arg(long, default_value_t = 0)]
    clients: u64,
    /// Messages the client sends
    #[arg(short = 'n', long, default_value_t = 100)]
    count: u32,
    /// Message size in bytes
    #[arg(short = 's', long, default_value_t = 64)]
    size: usize,
}

fn main() -> ExitCode {
    common::main("async-echo", |a: Args| {
        // One thread: the point is that connections need none of their own.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            match a.role.side() {
                Side::Server(addr) => server(addr, &a).await,
                Side::Client(addr) => client(addr, &a).await,
            }
        })
    })
}

async fn server(addr: &str, a: &Args) -> Outcome {
    let listener = AsyncListener::bind(addr, a.dev.conn_options())?;
    common::listening("async-echo", listener.local_addr());
    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0;
    while a.clients == 0 || accepted < a.clients {
        // A peer that fails its handshake is skipped (logged, counted): the loop goes on.
        let conn = listener.accept().await?;
        accepted += 1;
        tasks.spawn(echo(conn, accepted));
    }
    let mut messages = 0;
    while let Some(done) = tasks.join_next().await {
        match done? {
            Ok(n) => messages += n,
            Err(e) => eprintln!("server: a connection failed: {e}"),
        }
    }
    println!("server: {accepted} connections, {messages} messages echoed");
    Ok(())
}

/// Echoes every message of one connection until its end; returns how many.
async fn echo(conn: AsyncConn, id: u64) -> Result<u64, NetError> {
    let peer = conn.peer_addr();
    let mut n = 0;
    while let Some(m) = conn.recv_msg().await? {
        conn.send_msg(&m).await?;
        n += 1;
    }
    conn.close().await?;
    println!("server: connection {id} ({peer}): {n} messages");
    Ok(n)
}

async fn client(addr: &str, a: &Args) -> Outcome {
    let conn = AsyncConn::dial(addr, a.dev.conn_options()).await?;
    let msg: Vec<u8> = (0..a.size).map(|i| i as u8).collect();
    let start = Instant::now();
    for _ in 0..a.count {
        conn.send_msg(&msg).await?;
        match conn.recv_msg().await? {
            Some(back) if back == msg => {}
            Some(_) => return Err("the echo differs".into()),
            None => return Err("the server closed early".into()),
        }
    }
    let rtt = start.elapsed() / a.count.max(1);
    println!(
        "client: {} echoes of {} B, {rtt:?} per round trip",
        a.count, a.size
    );
    conn.close().await?;
    Ok(())
}
