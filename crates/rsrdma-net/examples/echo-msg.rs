//! echo-msg: the minimal message echo over a [`Conn`] (rdma_cm, the default).
//!
//! The server accepts one connection, receives one message, prints it and sends it back;
//! the client sends `hello rdmanet` (or `-m TEXT`) and prints the echo.
//!
//! ```text
//! cargo run -p rsrdma-net --example echo-msg -- -l 0.0.0.0:18515      # server
//! cargo run -p rsrdma-net --example echo-msg -- 10.77.0.1:18515       # client
//! ```
//!
//! rdma_cm resolves the address to a device: dial the server's RDMA device address (in the
//! VM, `10.77.0.1`), not 127.0.0.1. `-d`/`-x` pick the device and GID (default: the first
//! device and its RoCE v2 GID). Without an RDMA device it prints the library's error (which
//! says how to use the VM) and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::{Conn, Listener};
use std::process::ExitCode;

/// The minimal RC message echo.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// The message the client sends
    #[arg(short = 'm', long, default_value = "hello rdmanet")]
    msg: String,
}

fn main() -> ExitCode {
    common::main("echo-msg", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let listener = Listener::bind(addr, a.dev.conn_options())?;
    common::listening("echo-msg", listener.local_addr());
    let conn = listener.accept()?;
    let msg = conn
        .recv_msg()?
        .ok_or("the client closed before sending anything")?;
    println!(
        "server: received {:?} from {}",
        String::from_utf8_lossy(&msg),
        conn.peer_addr()
    );
    conn.send_msg(&msg)?;
    // Close sends FIN after the echo and waits (bounded) until it is delivered.
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
