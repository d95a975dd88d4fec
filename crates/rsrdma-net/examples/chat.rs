//! chat: full duplex over one [`Conn`]: a thread sends the lines of stdin while the main
//! thread prints what the peer sends (a `Conn` is `Send + Sync`: one reader and one writer
//! on two threads make progress for each other).
//!
//! At the end of stdin the local side closes the connection: the peer prints
//! `peer closed` and exits, and the local side's blocked receive returns at once
//! ([`NetError::Closed`]), so it exits too.
//!
//! ```text
//! cargo run -p rsrdma-net --example chat -- -l 0.0.0.0:18515     # one side
//! cargo run -p rsrdma-net --example chat -- 10.77.0.1:18515      # the other
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::{Outcome, Side};
use rsrdma_net::{Conn, Listener, NetError};
use std::io::BufRead;
use std::process::ExitCode;
use std::sync::Arc;

/// Full-duplex line chat.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
}

fn main() -> ExitCode {
    common::main("chat", |a: Args| {
        let conn = match a.role.side() {
            Side::Server(addr) => {
                let listener = Listener::bind(addr, a.dev.conn_options())?;
                common::listening("chat", listener.local_addr());
                listener.accept()?
            }
            Side::Client(addr) => Conn::dial(addr, a.dev.conn_options())?,
        };
        println!("chat: connected to {}", conn.peer_addr());
        chat(Arc::new(conn))
    })
}

fn chat(conn: Arc<Conn>) -> Outcome {
    // The sender: stdin to the peer. It is not joined: at the peer's close the process
    // ends while it may still wait for a line.
    let sender = conn.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Err(e) = sender.send_msg(line.as_bytes()) {
                eprintln!("chat: send: {e}");
                return;
            }
        }
        // The end of stdin: close, which also wakes the receive loop below.
        if let Err(e) = sender.close() {
            eprintln!("chat: close: {e}");
        }
    });
    loop {
        match conn.recv_msg() {
            Ok(Some(m)) => println!("peer: {}", String::from_utf8_lossy(&m)),
            Ok(None) => {
                println!("chat: peer closed");
                break;
            }
            Err(NetError::Closed { .. }) => {
                println!("chat: closed");
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    conn.close()?;
    Ok(())
}
