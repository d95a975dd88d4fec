//! A UD echo over PacketConn, with the peer found through a registry.
//!
//! ```text
//! rs_registry --listen 0.0.0.0:9100 &
//! cargo run --example ud_echo -- server 127.0.0.1:9100 [device] [gid-index]
//! cargo run --example ud_echo -- client 127.0.0.1:9100 [device] [gid-index]
//! ```
//! The server registers its address as "echo" and answers every datagram to its sender;
//! the client looks "echo" up, sends ten datagrams and prints the replies.

use rsrdma_net::registry::{lookup, register};
use rsrdma_net::{PacketConn, PacketOptions};
use std::time::{Duration, Instant};

fn main() {
    // The error as its message, not a `Debug` dump (what `fn main() -> Result` prints).
    if let Err(e) = run() {
        eprintln!("ud_echo: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(role), Some(registry)) = (args.first(), args.get(1)) else {
        eprintln!("usage: ud_echo server|client REGISTRY_ADDR [DEVICE] [GID_INDEX]");
        std::process::exit(2);
    };
    let opts = PacketOptions::default()
        .device(args.get(2).cloned())
        .gid_index(args.get(3).map(|g| g.parse()).transpose()?)
        .read_timeout(Duration::from_secs(5));
    let conn = PacketConn::bind(opts)?;
    let mut buf = vec![0u8; conn.max_datagram()];
    if role == "server" {
        let lease = register(registry.as_str(), "echo", &conn.local_addr())?;
        println!("echo server at {} (lease {lease:?})", conn.local_addr());
        let mut renew_at = Instant::now() + lease / 2;
        loop {
            if Instant::now() >= renew_at {
                register(registry.as_str(), "echo", &conn.local_addr())?;
                renew_at = Instant::now() + lease / 2;
            }
            match conn.recv_from(&mut buf) {
                Ok((n, from)) => {
                    conn.send_to(&buf[..n], &from)?;
                }
                Err(rsrdma_net::NetError::Timeout { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    let server = lookup(registry.as_str(), "echo")?;
    println!("client {} → echo server {server}", conn.local_addr());
    for i in 0..10 {
        let t0 = Instant::now();
        conn.send_to(format!("hello {i}").as_bytes(), &server)?;
        let (n, from) = conn.recv_from(&mut buf)?;
        println!(
            "{:?} from {from} in {:?}",
            String::from_utf8_lossy(&buf[..n]),
            t0.elapsed()
        );
    }
    Ok(())
}
