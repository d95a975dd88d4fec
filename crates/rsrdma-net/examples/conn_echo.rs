//! An echo server and client over [`rsrdma_net::Conn`].
//!
//! ```text
//! conn_echo server [ADDR] [-d DEVICE] [-x GID_INDEX] [--tcp]       # default 0.0.0.0:18515
//! conn_echo client ADDR   [-d DEVICE] [-x GID_INDEX] [--tcp] [-n COUNT] [-s SIZE]
//! ```
//!
//! rdma_cm (the default) needs an address of an RDMA device (in the VM: 10.77.0.1); `--tcp`
//! uses the TCP handshake instead. The client sends COUNT messages of SIZE bytes, checks
//! every echo and prints the round-trip time. Without RDMA it says so and exits with 2.

use rsrdma_net::{Conn, ConnOptions, Establish, Listener, NetError};
use std::time::Instant;

struct Args {
    server: bool,
    addr: String,
    opts: ConnOptions,
    count: usize,
    size: usize,
}

fn parse() -> Result<Args, String> {
    const USAGE: &str = "usage: conn_echo server [ADDR] | client ADDR  [-d DEVICE] [-x GID] [--tcp] [-n COUNT] [-s SIZE]";
    let mut it = std::env::args().skip(1);
    let server = match it.next().as_deref() {
        Some("server") => true,
        Some("client") => false,
        _ => return Err(USAGE.into()),
    };
    let mut a = Args {
        server,
        addr: String::new(),
        opts: ConnOptions::default(),
        count: 1000,
        size: 64,
    };
    let num = |v: Option<String>, what: &str| -> Result<usize, String> {
        v.and_then(|v| v.parse().ok())
            .ok_or(format!("{what} needs a number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-d" => a.opts = a.opts.device(it.next().ok_or("-d needs a device")?),
            "-x" => a.opts = a.opts.gid_index(num(it.next(), "-x")? as u8),
            "--tcp" => a.opts = a.opts.establish(Establish::Tcp),
            "-n" => a.count = num(it.next(), "-n")?,
            "-s" => a.size = num(it.next(), "-s")?,
            s if !s.starts_with('-') && a.addr.is_empty() => a.addr = s.to_string(),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if a.addr.is_empty() {
        if !a.server {
            return Err(USAGE.into());
        }
        a.addr = "0.0.0.0:18515".into();
    }
    Ok(a)
}

fn serve(a: &Args) -> Result<(), NetError> {
    let l = Listener::bind(a.addr.as_str(), a.opts.clone())?;
    println!("conn_echo: listening on {}", l.local_addr());
    loop {
        // Peers that fail their handshake are skipped (and logged): only the listener's own
        // errors end the loop.
        let c = l.accept()?;
        std::thread::spawn(move || {
            let peer = c.peer_addr();
            let mut n = 0u64;
            let r = (|| {
                while let Some(m) = c.recv_msg()? {
                    c.send_msg(&m)?;
                    n += 1;
                }
                c.close()
            })();
            println!("conn_echo: {peer}: {n} messages, {r:?}");
        });
    }
}

fn client(a: &Args) -> Result<(), NetError> {
    let c = Conn::dial(a.addr.as_str(), a.opts.clone())?;
    let i = c.info();
    println!(
        "conn_echo: {} -> {} on {} port {} qpn {} -> {}, mtu {:?}, frame {} B, max message {} B",
        c.local_addr(),
        c.peer_addr(),
        i.device,
        i.port,
        i.local_qpn,
        i.peer_qpn,
        i.mtu,
        i.settled.frame_size,
        i.settled.max_message
    );
    let msg: Vec<u8> = (0..a.size).map(|k| k as u8).collect();
    let t0 = Instant::now();
    for _ in 0..a.count {
        c.send_msg(&msg)?;
        match c.recv_msg()? {
            Some(back) if back == msg => {}
            Some(_) => return Err(NetError::InvalidArgument("the echo differs".into())),
            None => return Err(NetError::PeerClosed("the echo")),
        }
    }
    let rtt = t0.elapsed() / a.count.max(1) as u32;
    println!(
        "conn_echo: {} echoes of {} B, {rtt:?} per round trip",
        a.count, a.size
    );
    c.close()
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let r = if a.server { serve(&a) } else { client(&a) };
    if let Err(e) = r {
        let no_rdma = matches!(&e, NetError::Verbs(v) if v.is_unsupported());
        if no_rdma {
            eprintln!("conn_echo: no RDMA device here ({e}); try `cargo xtask vm -- ...`");
            std::process::exit(2);
        }
        eprintln!("conn_echo: {e}");
        std::process::exit(1);
    }
}
