//! file-transfer: a file over a [`Conn`] with [`std::io::copy`], ended by a clean EOF.
//!
//! The client copies `--in FILE` into the connection and closes it, which sends FIN after
//! the data; the server copies the connection into `--out FILE` until that end of the
//! stream. Both print the byte count and the SHA-256 of what they sent or received.
//!
//! ```text
//! cargo run -p rsrdma-net --example file-transfer -- -l 0.0.0.0:18515 --out received.bin
//! cargo run -p rsrdma-net --example file-transfer -- 10.77.0.1:18515 --in payload.bin
//! ```
//!
//! `-d`/`-x` pick the device and GID (default: the first device and its RoCE v2 GID).
//! Without an RDMA device it prints the library's error and exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::Parser;
use common::Outcome;
use rsrdma_net::Conn;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Streams a file over a connection.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// The file the client sends
    #[arg(long = "in", value_name = "FILE", required_unless_present = "listen")]
    input: Option<PathBuf>,
    /// Where the server writes what it receives
    #[arg(long = "out", value_name = "FILE", default_value = "received.bin")]
    output: PathBuf,
}

/// A writer that hashes what goes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn main() -> ExitCode {
    common::main("file-transfer", |a: Args| {
        a.role
            .serve_or_dial(|addr| server(addr, &a), |addr| client(addr, &a))
    })
}

fn server(addr: &str, a: &Args) -> Outcome {
    let mut conn = common::accept_one("file-transfer", addr, a.dev.conn_options())?;
    let file =
        File::create(&a.output).map_err(|e| format!("creating {}: {e}", a.output.display()))?;
    let mut out = Hashing {
        inner: BufWriter::new(file),
        hash: Sha256::new(),
    };
    let start = Instant::now();
    // Ends at the client's FIN, after all its data.
    let bytes = io::copy(&mut conn, &mut out)?;
    out.flush()?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "server: received {bytes} bytes into {} in {secs:.3} s, sha256 {}",
        a.output.display(),
        common::hex(&out.hash.finalize())
    );
    conn.close()?;
    Ok(())
}

fn client(addr: &str, a: &Args) -> Outcome {
    let path = a.input.as_ref().ok_or("the client needs --in FILE")?;
    let mut file = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let conn = Conn::dial(addr, a.dev.conn_options())?;
    let mut out = Hashing {
        inner: &conn,
        hash: Sha256::new(),
    };
    let start = Instant::now();
    let bytes = io::copy(&mut file, &mut out)?;
    let hash = out.hash;
    // Close sends FIN after the data and waits until everything is delivered.
    conn.close()?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "client: sent {bytes} bytes from {} in {secs:.3} s, sha256 {}",
        path.display(),
        common::hex(&hash.finalize())
    );
    Ok(())
}
