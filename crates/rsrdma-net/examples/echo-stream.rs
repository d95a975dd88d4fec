//! echo-stream: the echo over the byte-stream face of a [`Conn`] ([`std::io::Read`] and
//! [`std::io::Write`], like a `TcpStream`).
//!
//! The client writes its text in two writes and reads the echo back through a 32-byte
//! buffer: a read returns whatever bytes are there, so reads cross message boundaries
//! (contrast echo-msg, where one `recv_msg` is one whole message). The server copies what
//! it reads back until the end of the stream, which the client's close sends.
//!
//! ```text
//! cargo run -p rsrdma-net --example echo-stream -- -l 0.0.0.0:18515     # server
//! cargo run -p rsrdma-net --example echo-stream -- 10.77.0.1:18515      # client
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::Conn;
use std::io::{Read, Write};
use std::process::ExitCode;

/// The echo over the byte stream.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// The text the client sends
    #[arg(
        short = 'm',
        long,
        default_value = "hello rdmanet stream, in more than 32 bytes"
    )]
    msg: String,
}

fn main() -> ExitCode {
    common::main("echo-stream", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let mut conn = common::accept_one("echo-stream", addr, a.dev.conn_options())?;
    let mut buf = [0u8; 32];
    let mut total = 0;
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break; // the client's FIN: the end of the stream
        }
        conn.write_all(&buf[..n])?;
        total += n;
    }
    println!("server: echoed {total} bytes, then the end of the stream");
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let mut conn = Conn::dial(addr, a.dev.conn_options())?;
    let text = a.msg.as_bytes();
    let (first, second) = text.split_at(text.len() / 2);
    conn.write_all(first)?;
    conn.write_all(second)?;
    conn.flush()?;
    let mut back = Vec::with_capacity(text.len());
    let mut buf = [0u8; 32];
    let mut reads = 0;
    while back.len() < text.len() {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err("the server ended the stream before echoing everything".into());
        }
        back.extend_from_slice(&buf[..n]);
        reads += 1;
    }
    println!(
        "client: echo {:?} ({} bytes in {reads} reads)",
        String::from_utf8_lossy(&back),
        back.len()
    );
    if back != text {
        return Err("the echo differs from the text sent".into());
    }
    conn.close()?;
    Ok(())
}
