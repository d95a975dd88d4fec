//! handshake-dial: the echo of `echo-msg`, established with the TCP handshake instead of
//! rdma_cm ([`Establish::Tcp`] on both sides).
//!
//! The send and receive code is the same as echo-msg's: both ways give the same [`Conn`].
//! The TCP handshake works wherever TCP does, also where rdma_cm cannot resolve a route
//! (127.0.0.1 is fine here).
//!
//! ```text
//! cargo run -p rsrdma-net --example handshake-dial -- -l 0.0.0.0:18515     # server
//! cargo run -p rsrdma-net --example handshake-dial -- 127.0.0.1:18515      # client
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::{Outcome, Side};
use rsrdma_net::{Conn, ConnOptions, Establish, Listener};
use std::process::ExitCode;

/// The message echo over the TCP handshake.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// The message the client sends
    #[arg(short = 'm', long, default_value = "hello handshake")]
    msg: String,
}

fn main() -> ExitCode {
    common::main("handshake-dial", |a: Args| {
        let opts = a.dev.conn_options().establish(Establish::Tcp);
        match a.role.side() {
            Side::Server(addr) => server(addr, &a, opts),
            Side::Client(addr) => client(addr, &a, opts),
        }
    })
}

/// Where the connection runs, as both paths report it.
fn describe(side: &str, conn: &Conn) {
    let i = conn.info();
    println!(
        "{side}: established over {:?}: device {} port {} GID index {:?}, QPN {:#x} -> {:#x}",
        i.establish, i.device, i.port, i.gid_index, i.local_qpn, i.peer_qpn
    );
}

fn server(addr: &str, _a: &Args, opts: ConnOptions) -> Outcome {
    let listener = Listener::bind(addr, opts)?;
    common::listening("handshake-dial", listener.local_addr());
    let conn = listener.accept()?;
    describe("server", &conn);
    let msg = conn
        .recv_msg()?
        .ok_or("the client closed before sending anything")?;
    println!("server: received {:?}", String::from_utf8_lossy(&msg));
    conn.send_msg(&msg)?;
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args, opts: ConnOptions) -> Outcome {
    let conn = Conn::dial(addr, opts)?;
    describe("client", &conn);
    conn.send_msg(a.msg.as_bytes())?;
    let echo = conn.recv_msg()?;
    common::check_echo(echo.as_deref(), a.msg.as_bytes())?;
    conn.close()?;
    Ok(())
}
