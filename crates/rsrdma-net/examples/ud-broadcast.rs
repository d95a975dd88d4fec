//! ud-broadcast: one UD sender, many receivers found through the registry.
//!
//! Receivers (`-l REGISTRY --name nodeN`) register their endpoint and wait for `-n`
//! datagrams. The sender (`REGISTRY --to node1,node2,…`) looks every name up and sends `-n`
//! rounds of datagrams to all of them from one [`PacketConn`]. An address handle names the
//! path to a destination port (its GID; the QPN travels in each send), so the endpoint
//! caches one per destination GID and reuses it: the sender prints how many it created, one
//! per distinct GID however many datagrams and receivers (receivers on one RoCE port share
//! one; on the software device soft0 each process is a port of its own, with its own GID).
//! `--registry ADDR` runs the directory.
//!
//! ```text
//! cargo run -p rsrdma-net --example ud-broadcast -- --registry 0.0.0.0:9100
//! cargo run -p rsrdma-net --example ud-broadcast -- -l 127.0.0.1:9100 --name node1
//! cargo run -p rsrdma-net --example ud-broadcast -- -l 127.0.0.1:9100 --name node2
//! cargo run -p rsrdma-net --example ud-broadcast -- 127.0.0.1:9100 --to node1,node2
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device the endpoint roles print the library's error and exit with
//! status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::registry::{lookup, register};
use rsrdma_net::{PacketConn, Registry};
use std::process::ExitCode;
use std::time::Duration;

/// One UD sender, many registry-discovered receivers.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::RegistryRole,
    /// The receiver's name
    #[arg(long, default_value = "node1")]
    name: String,
    /// The receivers the sender sends to, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "node1,node2")]
    to: Vec<String>,
    /// Datagrams per receiver
    #[arg(short = 'n', long, default_value_t = 3)]
    rounds: u32,
    #[command(flatten)]
    dev: common::Device,
    /// How long a receiver waits for each datagram, in seconds
    #[arg(long, default_value_t = 60)]
    wait: u64,
}

fn main() -> ExitCode {
    common::run("ud-broadcast", || {
        let a = Args::parse();
        a.role
            .dispatch(directory, |at| receiver(at, &a), |at| sender(at, &a))
    })
}

fn directory(addr: &str) -> Outcome {
    let handle = Registry::serve(addr)?;
    common::listening("ud-broadcast", handle.local_addr());
    loop {
        std::thread::park();
    }
}

fn receiver(at: &str, a: &Args) -> Outcome {
    let opts = a
        .dev
        .packet_options()
        .read_timeout(Some(Duration::from_secs(a.wait)));
    let conn = PacketConn::bind(opts)?;
    register(at, &a.name, &conn.local_addr())?;
    println!("{}: registered {}", a.name, conn.local_addr());
    let mut buf = vec![0u8; conn.max_datagram()];
    for _ in 0..a.rounds {
        let (n, from) = conn.recv_from(&mut buf)?;
        println!(
            "{}: received {:?} from QPN {:#x}",
            a.name,
            String::from_utf8_lossy(&buf[..n]),
            from.qpn
        );
    }
    println!("{}: received {} datagrams", a.name, a.rounds);
    Ok(())
}

fn sender(at: &str, a: &Args) -> Outcome {
    let conn = PacketConn::bind(a.dev.packet_options())?;
    let mut dests = Vec::with_capacity(a.to.len());
    for name in &a.to {
        let addr = lookup(at, name)?;
        println!("sender: {name} is {addr}");
        dests.push((name, addr));
    }
    for round in 0..a.rounds {
        for (name, addr) in &dests {
            conn.send_to(format!("round {round} to {name}").as_bytes(), addr)?;
        }
    }
    conn.flush(Duration::from_secs(5))?;
    let st = conn.stats();
    let mut gids: Vec<_> = dests.iter().map(|(_, addr)| addr.gid).collect();
    gids.sort_unstable_by_key(|g| g.0);
    gids.dedup();
    println!(
        "sender: {} datagrams to {} receivers, {} address handles created for {} destination GIDs",
        st.sent,
        dests.len(),
        st.ah_created,
        gids.len()
    );
    Ok(())
}
