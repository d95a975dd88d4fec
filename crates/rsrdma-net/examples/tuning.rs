//! tuning: every connection option as a flag; prints the resolved configuration and the
//! registered memory it costs, then runs a small echo and prints what the two ends settled.
//!
//! Registered memory per connection is `(send slots + receive slots) × slot size`
//! (`--depth` sets both slot counts, `--buf` the slot size in KiB); nothing more is
//! registered for a message of any size.
//!
//! ```text
//! cargo run -p rsrdma-net --example tuning -- -l 0.0.0.0:18515 --depth 16 --buf 16
//! cargo run -p rsrdma-net --example tuning -- 10.77.0.1:18515 --depth 64 --buf 64 --poll busy
//! ```
//!
//! The two ends may choose differently: the frame size and message cap are settled in the
//! handshake (the smaller of each). `-d`/`-x` pick the device and GID (default: the first
//! device and its RoCE v2 GID). Without an RDMA device it prints the library's error and
//! exits with status 1.

#[path = "common/mod.rs"]
mod common;

use clap::{Parser, ValueEnum};
use common::{Outcome, Side};
use rsrdma_net::{Conn, ConnOptions, Establish, PollMode};
use std::process::ExitCode;
use std::time::Duration;

/// How blocking calls wait.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Busy,
    Event,
    Adaptive,
}

/// Every ConnOptions knob as a flag.
#[derive(Parser)]
struct Args {
    #[command(flatten)]
    role: common::Role,
    #[command(flatten)]
    dev: common::Device,
    /// Device port (TCP handshake path; rdma_cm takes the port of the address)
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Slots each way (credits): frames in flight
    #[arg(long, default_value_t = 32)]
    depth: u16,
    /// Slot (frame) size in KiB
    #[arg(long, default_value_t = 32)]
    buf: u32,
    /// Send-queue depth
    #[arg(long, default_value_t = 64)]
    sq_depth: u16,
    /// Frames up to this many bytes go inline
    #[arg(long, default_value_t = 64)]
    inline: u16,
    /// Largest message, in KiB
    #[arg(long, default_value_t = 16 * 1024)]
    max_message: u32,
    /// How blocking calls wait for completions
    #[arg(long, value_enum, default_value = "adaptive")]
    poll: Mode,
    /// Spin time of the adaptive mode, in microseconds
    #[arg(long, default_value_t = 20)]
    spin_us: u64,
    /// Keepalive interval in ms (0: off)
    #[arg(long, default_value_t = 1000)]
    keepalive_ms: u64,
    /// Declare the peer dead after this many ms of silence
    #[arg(long, default_value_t = 5000)]
    peer_timeout_ms: u64,
    /// Use the TCP handshake instead of rdma_cm
    #[arg(long)]
    handshake: bool,
    /// Shared secret of the TCP handshake
    #[arg(long)]
    secret: Option<String>,
}

impl Args {
    fn options(&self) -> ConnOptions {
        let poll = match self.poll {
            Mode::Busy => PollMode::Busy,
            Mode::Event => PollMode::Event,
            Mode::Adaptive => PollMode::Adaptive {
                spin: Duration::from_micros(self.spin_us),
            },
        };
        let keepalive = (self.keepalive_ms > 0).then(|| Duration::from_millis(self.keepalive_ms));
        self.dev
            .conn_options()
            .establish(if self.handshake {
                Establish::Tcp
            } else {
                Establish::Cm
            })
            .port(self.ib_port)
            .send_slots(self.depth)
            .recv_slots(self.depth)
            .slot_size(self.buf.saturating_mul(1024))
            .sq_depth(self.sq_depth)
            .inline_size(self.inline)
            .max_message(self.max_message.saturating_mul(1024))
            .poll_mode(poll)
            .keepalive(keepalive)
            .peer_timeout(Duration::from_millis(self.peer_timeout_ms))
            .secret(self.secret.as_deref().map(rsrdma_net::Secret::from))
    }
}

fn main() -> ExitCode {
    common::main("tuning", |a: Args| {
        let opts = a.options();
        // Refuse what cannot work before touching the device.
        opts.check()?;
        print_config(&opts);
        match a.role.side() {
            Side::Server(addr) => server(addr, opts),
            Side::Client(addr) => client(addr, opts),
        }
    })
}

fn print_config(o: &ConnOptions) {
    println!(
        "tuning: establish={:?} device={} gid_index={} port={} poll={:?}",
        o.establish,
        o.device.as_deref().unwrap_or("(default)"),
        o.gid_index.map_or("(default)".into(), |g| g.to_string()),
        o.port,
        o.poll_mode
    );
    println!(
        "tuning: slots send={} recv={} of {} B, sq_depth={} inline={} B max_message={} B \
         keepalive={:?} peer_timeout={:?}",
        o.send_slots,
        o.recv_slots,
        o.slot_size,
        o.sq_depth,
        o.inline_size,
        o.max_message,
        o.keepalive,
        o.peer_timeout
    );
    println!(
        "tuning: registered memory per connection = ({} + {}) x {} B = {} B",
        o.send_slots,
        o.recv_slots,
        o.slot_size,
        o.slot_memory()
    );
}

fn print_settled(side: &str, c: &Conn) {
    let i = c.info();
    println!(
        "{side}: settled frame {} B, credits {} (peer {}), max message {} B, \
         {} B registered, device {} GID index {:?}, MTU {:?}",
        i.settled.frame_size,
        // This side's credits are the receives the peer posts, and the reverse.
        i.settled.peer_recv_slots,
        i.settled.local_recv_slots,
        i.settled.max_message,
        i.registered_bytes,
        i.device,
        i.gid_index,
        i.mtu
    );
}

fn server(addr: &str, opts: ConnOptions) -> Outcome {
    let conn = common::accept_one("tuning", addr, opts)?;
    print_settled("server", &conn);
    while let Some(m) = conn.recv_msg()? {
        conn.send_msg(&m)?;
    }
    conn.close()?;
    Ok(())
}

fn client(addr: &str, opts: ConnOptions) -> Outcome {
    let conn = Conn::dial(addr, opts)?;
    print_settled("client", &conn);
    // One message that spans several frames, to see the settled frame size at work.
    let frame = conn.info().settled.frame_payload() as usize;
    let msg: Vec<u8> = (0..frame * 3 + 17).map(|i| i as u8).collect();
    conn.send_msg(&msg)?;
    let echo = conn
        .recv_msg()?
        .ok_or("the server closed without echoing")?;
    if echo != msg {
        return Err("the echo differs".into());
    }
    println!(
        "client: echoed {} bytes ({} frames)",
        msg.len(),
        msg.len().div_ceil(frame)
    );
    conn.close()?;
    Ok(())
}
