//! What the examples share: the `-d`/`-x` device flags, the `-l ADDR` / `HOST:PORT` role,
//! and how a failure becomes a message and an exit status.
//!
//! Included by each example with `#[path = "common/mod.rs"] mod common;` (cargo does not
//! take this directory for an example: it has no `main.rs`).

// Each example uses only some of these helpers.
#![allow(dead_code)]

use rsrdma_net::{
    Addr, Conn, ConnOptions, Listener, NetError, PacketConn, PacketOptions, RawOptions,
};
use std::error::Error;
use std::fmt::Display;
use std::process::ExitCode;

/// What an example's body returns.
pub type Outcome = Result<(), Box<dyn Error>>;

/// Which RDMA device and GID to use. By default the first device and the GID the library
/// picks (`rsrdma::Context::default_gid_index`: an IPv4-mapped RoCE v2 GID first); with
/// rdma_cm, the device the address resolves to.
#[derive(clap::Args, Debug, Clone)]
pub struct Device {
    /// RDMA device (default: the first one; rdma_cm: the device of the address)
    #[arg(short = 'd', long = "device", value_name = "DEVICE")]
    pub device: Option<String>,
    /// GID index (default: the device's RoCE v2 GID, IPv4-mapped first)
    #[arg(short = 'x', long = "gid-index", value_name = "INDEX")]
    pub gid_index: Option<u8>,
}

impl Device {
    /// Conn options for this device and GID, the rest default.
    pub fn conn_options(&self) -> ConnOptions {
        ConnOptions::default()
            .device(self.device.clone())
            .gid_index(self.gid_index)
    }

    /// PacketConn options for this device and GID, the rest default.
    pub fn packet_options(&self) -> PacketOptions {
        PacketOptions::default()
            .device(self.device.clone())
            .gid_index(self.gid_index)
    }

    /// RawConn options for this device and GID, the rest default.
    pub fn raw_options(&self) -> RawOptions {
        RawOptions::default()
            .device(self.device.clone())
            .gid_index(self.gid_index)
    }
}

/// Server or client, as gordma's examples: `-l ADDR` listens, a positional `HOST:PORT` dials.
#[derive(clap::Args, Debug, Clone)]
pub struct Role {
    /// Listen on ADDR (server); with rdma_cm, an address of an RDMA device or 0.0.0.0
    #[arg(
        short = 'l',
        long = "listen",
        value_name = "ADDR",
        conflicts_with = "peer"
    )]
    pub listen: Option<String>,
    /// The server to dial (client); with rdma_cm, its RDMA device's address
    #[arg(value_name = "HOST:PORT", required_unless_present = "listen")]
    pub peer: Option<String>,
}

/// What [`Role`] says to do.
pub enum Side<'a> {
    /// Listen on this address.
    Server(&'a str),
    /// Dial this address.
    Client(&'a str),
}

impl Role {
    /// Runs `server` with the address to listen on, or `client` with the address to dial.
    pub fn serve_or_dial<T>(
        &self,
        server: impl FnOnce(&str) -> T,
        client: impl FnOnce(&str) -> T,
    ) -> T {
        match self.side() {
            Side::Server(addr) => server(addr),
            Side::Client(addr) => client(addr),
        }
    }

    /// Server or client (clap has made sure one of them was given).
    pub fn side(&self) -> Side<'_> {
        match (&self.listen, &self.peer) {
            (Some(l), _) => Side::Server(l),
            (None, Some(p)) => Side::Client(p),
            (None, None) => Side::Server("0.0.0.0:18515"),
        }
    }
}

/// The three roles of the registry examples: `--registry ADDR` runs the directory (no RDMA);
/// `-l REGISTRY` binds an endpoint and registers it there (server); `REGISTRY` looks names
/// up there (client).
#[derive(clap::Args, Debug, Clone)]
pub struct RegistryRole {
    /// Run the directory on ADDR until killed
    #[arg(long = "registry", value_name = "ADDR", conflicts_with_all = ["listen", "at"])]
    pub registry: Option<String>,
    /// Register an endpoint at REGISTRY under --name and wait for datagrams (server)
    #[arg(short = 'l', long = "listen")]
    pub listen: bool,
    /// The directory's HOST:PORT (server and client)
    #[arg(value_name = "REGISTRY", required_unless_present = "registry")]
    pub at: Option<String>,
}

impl RegistryRole {
    /// Runs `directory` with the address to serve on, or, once [`require_rdma`] passed,
    /// `listen` or `dial` with the directory's address.
    pub fn dispatch(
        &self,
        directory: impl FnOnce(&str) -> Outcome,
        listen: impl FnOnce(&str) -> Outcome,
        dial: impl FnOnce(&str) -> Outcome,
    ) -> Outcome {
        match (&self.registry, &self.at) {
            (Some(addr), _) => directory(addr),
            (None, Some(at)) => {
                require_rdma()?;
                if self.listen {
                    listen(at)
                } else {
                    dial(at)
                }
            }
            (None, None) => Err("give --registry ADDR, -l REGISTRY or REGISTRY".into()),
        }
    }
}

/// Fails early, with the library's message, where there is no RDMA device: the TCP
/// handshake path and the registry would otherwise get as far as waiting for a peer.
pub fn require_rdma() -> Outcome {
    // Where the machine has no RDMA stack, the error says so and how to use the VM.
    let list = rsrdma::devices()?;
    if list.is_empty() {
        return Err(format!("no RDMA device found ({})", rsrdma::error::NO_RDMA_HINT).into());
    }
    Ok(())
}

/// Says where the server listens, in the one form every example uses (scripts wait for it).
pub fn listening(name: &str, addr: impl Display) {
    println!("{name}: listening on {addr}");
}

/// The server side of the examples whose point is what happens on a connection, not how
/// it is made: binds a [`Listener`] on `addr`, says where it listens (see [`listening`]) and
/// accepts one connection. echo-msg shows these steps one by one.
pub fn accept_one(name: &str, addr: &str, opts: ConnOptions) -> Result<Conn, Box<dyn Error>> {
    let listener = Listener::bind(addr, opts)?;
    listening(name, listener.local_addr());
    Ok(listener.accept()?)
}

/// The client's check of one echoed message: `None` (the server closed without echoing) is
/// an error; else it prints `client: echo TEXT` and fails where the echo differs from `sent`.
pub fn check_echo(echo: Option<&[u8]>, sent: &[u8]) -> Outcome {
    let echo = echo.ok_or("the server closed without echoing")?;
    println!("client: echo {:?}", String::from_utf8_lossy(echo));
    if echo != sent {
        return Err("the echo differs from the message sent".into());
    }
    Ok(())
}

/// Sends `msg` to `to` and waits for one reply into `buf`, giving its length and sender. UD
/// may drop a datagram, so it sends up to three times; the endpoint's read timeout bounds
/// each wait.
pub fn send_until_reply(
    conn: &PacketConn,
    msg: &[u8],
    to: &Addr,
    buf: &mut [u8],
) -> Result<(usize, Addr), Box<dyn Error>> {
    for _attempt in 0..3 {
        conn.send_to(msg, to)?;
        match conn.recv_from(buf) {
            Ok(reply) => return Ok(reply),
            Err(NetError::Timeout { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err("no reply after three datagrams".into())
}

/// Runs an example's body: success is exit status 0; an error is printed as `NAME: error`
/// (the library's message says what failed, and where there is no RDMA stack, how to use
/// the VM) and gives status 1. No panic, no backtrace.
pub fn run(name: &str, body: impl FnOnce() -> Outcome) -> ExitCode {
    match body() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The usual `main`: parses the example's arguments (clap exits on `--help` or bad input),
/// fails early where there is no RDMA device ([`require_rdma`]), then runs `body` as [`run`]
/// does.
pub fn main<A: clap::Parser>(name: &str, body: impl FnOnce(A) -> Outcome) -> ExitCode {
    run(name, || {
        let args = A::parse();
        require_rdma()?;
        body(args)
    })
}

/// The SHA-256 of `data`, in hex.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(data))
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
