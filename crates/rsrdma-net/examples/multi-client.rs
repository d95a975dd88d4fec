//! multi-client: a server that accepts connection after connection, echoing one message on
//! each and closing it before the next, while the listener stays up.
//!
//! The server runs until killed, or until it has served `--clients N`; each client sends
//! one message (`-m`) and prints the echo. Run several clients, one after another or at once.
//!
//! ```text
//! cargo run -p rsrdma-net --example multi-client -- -l 0.0.0.0:18515
//! cargo run -p rsrdma-net --example multi-client -- 10.77.0.1:18515 -m 'client 1'
//! cargo run -p rsrdma-net --example multi-client -- 10.77.0.1:18515 -m 'client 2'
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::{Conn, Listener};
use std::process::ExitCode;

/// An accept loop serving many clients.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// Stop after serving this many clients (0: serve until killed)
    #[arg(long, default_value_t = 0)]
    clients: u64,
    /// The message a client sends
    #[arg(short = 'm', long, default_value = "hello from a client")]
    msg: String,
}

fn main() -> ExitCode {
    common::main("multi-client", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let listener = Listener::bind(addr, a.dev.conn_options())?;
    common::listening("multi-client", listener.local_addr());
    let mut served = 0;
    while a.clients == 0 || served < a.clients {
        // A peer that fails its handshake is skipped (logged, counted): the listener serves on.
        let conn = listener.accept()?;
        served += 1;
        if let Err(e) = serve_one(&conn, served) {
            eprintln!("server: client {served}: {e}");
        }
    }
    println!("server: served {served} clients");
    Ok(())
}

fn serve_one(conn: &Conn, n: u64) -> Outcome {
    let msg = conn.recv_msg()?.ok_or("closed before sending")?;
    println!(
        "server: client {n} ({}) says {:?}",
        conn.peer_addr(),
        String::from_utf8_lossy(&msg)
    );
    conn.send_msg(&msg)?;
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let conn = Conn::dial(addr, a.dev.conn_options())?;
    conn.send_msg(a.msg.as_bytes())?;
    let echo = conn.recv_msg()?;
    common::check_echo(echo.as_deref(), a.msg.as_bytes())?;
    conn.close()?;
    Ok(())
}
