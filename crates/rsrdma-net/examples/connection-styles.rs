//! connection-styles: the three ways to talk, in one program (`--mode`):
//!
//! - `rc-cm` (default): RC, established with rdma_cm; dial the server's RDMA address;
//! - `rc-handshake`: RC, established with the TCP handshake ([`Establish::Tcp`]);
//! - `ud`: connectionless datagrams ([`PacketConn`]); the server prints its UD address and
//!   the client sends to it.
//!
//! The RC modes echo `hello RC`; the UD mode sends `hello UD`, which the server answers.
//!
//! ```text
//! cargo run -p rsrdma-net --example connection-styles -- -l 0.0.0.0:18515 --mode rc-cm
//! cargo run -p rsrdma-net --example connection-styles -- 10.77.0.1:18515 --mode rc-cm
//! cargo run -p rsrdma-net --example connection-styles -- -l - --mode ud     # prints ADDR
//! cargo run -p rsrdma-net --example connection-styles -- 'ADDR' --mode ud
//! ```
//!
//! (In `ud` mode the server's `-l` value is ignored: a UD endpoint has no IP address.)
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::{Parser, ValueEnum};
use common::{Outcome, Side};
use rsrdma_net::{Addr, Conn, ConnOptions, Establish, Listener, PacketConn};
use std::process::ExitCode;
use std::time::Duration;

/// How the two sides connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    RcCm,
    RcHandshake,
    Ud,
}

/// RC over rdma_cm, RC over the TCP handshake, or UD.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// The connection style
    #[arg(long, value_enum, default_value = "rc-cm")]
    mode: Mode,
}

fn main() -> ExitCode {
    common::main("connection-styles", |a: Args| {
        let rc = |est| a.dev.conn_options().establish(est);
        match (a.mode, a.role.side()) {
            (Mode::RcCm, Side::Server(addr)) => rc_server(addr, rc(Establish::Cm)),
            (Mode::RcCm, Side::Client(addr)) => rc_client(addr, rc(Establish::Cm)),
            (Mode::RcHandshake, Side::Server(addr)) => rc_server(addr, rc(Establish::Tcp)),
            (Mode::RcHandshake, Side::Client(addr)) => rc_client(addr, rc(Establish::Tcp)),
            (Mode::Ud, Side::Server(_)) => ud_server(&a),
            (Mode::Ud, Side::Client(addr)) => ud_client(&a, &addr.parse()?),
        }
    })
}

fn rc_server(addr: &str, opts: ConnOptions) -> Outcome {
    let listener = Listener::bind(addr, opts)?;
    common::listening("connection-styles", listener.local_addr());
    let conn = listener.accept()?;
    let msg = conn.recv_msg()?.ok_or("the client closed before sending")?;
    println!(
        "server ({:?}): received {:?}",
        conn.info().establish,
        String::from_utf8_lossy(&msg)
    );
    conn.send_msg(&msg)?;
    conn.close()?;
    Ok(())
}

fn rc_client(addr: &str, opts: ConnOptions) -> Outcome {
    let conn = Conn::dial(addr, opts)?;
    conn.send_msg(b"hello RC")?;
    let echo = conn
        .recv_msg()?
        .ok_or("the server closed without echoing")?;
    println!(
        "client ({:?}): echo {:?}",
        conn.info().establish,
        String::from_utf8_lossy(&echo)
    );
    conn.close()?;
    Ok(())
}

fn ud_server(a: &Args) -> Outcome {
    let opts = a
        .dev
        .packet_options()
        .read_timeout(Some(Duration::from_secs(60)));
    let conn = PacketConn::bind(opts)?;
    common::listening("connection-styles", conn.local_addr());
    let mut buf = vec![0u8; conn.max_datagram()];
    let (n, from) = conn.recv_from(&mut buf)?;
    println!(
        "server (UD): received {:?} from {from}",
        String::from_utf8_lossy(&buf[..n])
    );
    conn.send_to(&buf[..n], &from)?;
    conn.flush(Duration::from_secs(5))?;
    Ok(())
}

fn ud_client(a: &Args, to: &Addr) -> Outcome {
    let opts = a
        .dev
        .packet_options()
        .read_timeout(Some(Duration::from_secs(3)));
    let conn = PacketConn::bind(opts)?;
    let mut buf = vec![0u8; conn.max_datagram()];
    // send_to and recv_from, retried: UD may drop a datagram.
    let (n, _) = common::send_until_reply(&conn, b"hello UD", to, &mut buf)?;
    println!(
        "client (UD): reply {:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    Ok(())
}
