//! registry: finding a UD endpoint by name through the registry ([`Registry`], a small
//! name → [`Addr`] directory over TCP, no RDMA).
//!
//! Three roles: `--registry ADDR` runs the directory (as the `rs_registry` binary does);
//! `-l REGISTRY` binds a UD endpoint, registers it under `--name` and waits for one
//! datagram, which it answers; the client (`REGISTRY`) looks the name up and sends
//! `hello registry` to it.
//!
//! ```text
//! cargo run -p rsrdma-net --example registry -- --registry 0.0.0.0:9100       # directory
//! cargo run -p rsrdma-net --example registry -- -l 127.0.0.1:9100 --name svc  # UD server
//! cargo run -p rsrdma-net --example registry -- 127.0.0.1:9100 --name svc     # client
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device the endpoint roles print the library's error and exit with
//! status 1 (the directory needs no RDMA).

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::registry::{lookup, register};
use rsrdma_net::{PacketConn, Registry};
use std::process::ExitCode;
use std::time::Duration;

/// Name-based discovery of UD endpoints.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::RegistryRole,
    /// The name the server registers and the client looks up
    #[arg(long, default_value = "echo")]
    name: String,
    #[command(flatten)]
    dev: common::Device,
    /// How long the server waits for the datagram, in seconds
    #[arg(long, default_value_t = 60)]
    wait: u64,
}

fn main() -> ExitCode {
    common::run("registry", || {
        let a = Args::parse();
        a.role
            .dispatch(directory, |at| server(at, &a), |at| client(at, &a))
    })
}

fn directory(addr: &str) -> Outcome {
    let handle = Registry::serve(addr)?;
    common::listening("registry", handle.local_addr());
    // Serves on its own threads until the process is killed.
    loop {
        std::thread::park();
    }
}

fn server(at: &str, a: &Args) -> Outcome {
    let opts = a
        .dev
        .packet_options()
        .read_timeout(Some(Duration::from_secs(a.wait)));
    let conn = PacketConn::bind(opts)?;
    let lease = register(at, &a.name, &conn.local_addr())?;
    println!(
        "server: registered {:?} -> {} at {at} (lease {lease:?})",
        a.name,
        conn.local_addr()
    );
    let mut buf = vec![0u8; conn.max_datagram()];
    let (n, from) = conn.recv_from(&mut buf)?;
    println!(
        "server: received {:?} from {from}",
        String::from_utf8_lossy(&buf[..n])
    );
    conn.send_to(&buf[..n], &from)?;
    conn.flush(Duration::from_secs(5))?;
    Ok(())
}

fn client(at: &str, a: &Args) -> Outcome {
    let to = lookup(at, &a.name)?;
    println!("client: {:?} is {to}", a.name);
    let opts = a
        .dev
        .packet_options()
        .read_timeout(Some(Duration::from_secs(3)));
    let conn = PacketConn::bind(opts)?;
    let mut buf = vec![0u8; conn.max_datagram()];
    // send_to and recv_from, retried: UD may drop a datagram.
    let (n, _) = common::send_until_reply(&conn, b"hello registry", &to, &mut buf)?;
    println!("client: reply {:?}", String::from_utf8_lossy(&buf[..n]));
    Ok(())
}
