//! packet: UD datagrams with a [`PacketConn`] (`send_to`/`recv_from`, like a `UdpSocket`).
//!
//! The server binds an endpoint and prints its address (`<gid>%0x<qpn>`); the client sends
//! `hello datagram` to that address; the server prints the payload and the sender's QPN and
//! sends the datagram back, which the client prints. UD may drop a datagram, so the client
//! tries up to three times.
//!
//! ```text
//! cargo run -p rsrdma-net --example packet -- -l                    # prints ADDR
//! cargo run -p rsrdma-net --example packet -- 'ADDR'                # client
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::{Addr, NetError, PacketConn};
use std::process::ExitCode;
use std::time::Duration;

/// UD datagrams between two endpoints.
#[derive(Parser)]
struct Args {
    /// Bind an endpoint, print its address and wait for one datagram (server)
    #[arg(short = 'l', long = "listen", conflicts_with = "peer")]
    listen: bool,
    /// The server's endpoint address, as the server printed it (client)
    #[arg(value_name = "ADDR", required_unless_present = "listen")]
    peer: Option<Addr>,
    #[command(flatten)]
    dev: common::Device,
    /// The text the client sends
    #[arg(short = 'm', long, default_value = "hello datagram")]
    msg: String,
    /// How long the server waits for the datagram, in seconds
    #[arg(long, default_value_t = 60)]
    wait: u64,
}

fn main() -> ExitCode {
    common::main("packet", |a: Args| match a.peer {
        Some(to) => client(&a, &to),
        None => server(&a),
    })
}

fn server(a: &Args) -> Outcome {
    let opts = a
        .dev
        .packet_options()
        .read_timeout(Some(Duration::from_secs(a.wait)));
    let conn = PacketConn::bind(opts)?;
    common::listening("packet", conn.local_addr());
    let mut buf = vec![0u8; conn.max_datagram()];
    let (n, from) = conn.recv_from(&mut buf)?;
    println!(
        "server: received {:?} from QPN {:#x} ({from})",
        String::from_utf8_lossy(&buf[..n]),
        from.qpn
    );
    conn.send_to(&buf[..n], &from)?;
    conn.flush(Duration::from_secs(5))?;
    Ok(())
}

fn client(a: &Args, to: &Addr) -> Outcome {
    let opts = a
        .dev
        .packet_options()
        .read_timeout(Some(Duration::from_secs(3)));
    let conn = PacketConn::bind(opts)?;
    println!("client: {} -> {to}", conn.local_addr());
    let mut buf = vec![0u8; conn.max_datagram()];
    for _attempt in 0..3 {
        conn.send_to(a.msg.as_bytes(), to)?;
        match conn.recv_from(&mut buf) {
            Ok((n, from)) => {
                println!(
                    "client: reply {:?} from QPN {:#x}",
                    String::from_utf8_lossy(&buf[..n]),
                    from.qpn
                );
                return Ok(());
            }
            Err(NetError::Timeout { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err("no reply after three datagrams".into())
}
