//! The command lines of `rs_rdmanet_bw` and `rs_rdmanet_lat`: gordma's `go_rdmanet_*` flags,
//! read by clap and checked into [`BwArgs`] and [`LatArgs`]. Pure: nothing is opened here.

use clap::error::ErrorKind;
use clap::Parser;
use rsrdma_net::{Establish, PollMode};

/// gordma's (and perftest's) default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// The largest message either tool sends (and the largest a server accepts).
pub const MAX_SIZE: u64 = 1 << 30;
/// The largest tx depth of `--raw`.
pub const MAX_TX_DEPTH: u32 = 8192;
/// `--buffers`' default: registered buffers the zero-copy bandwidth client keeps in flight.
pub const DEFAULT_BUFFERS: u32 = 8;
/// The most `--buffers`.
pub const MAX_BUFFERS: u32 = 1024;
/// `--depth` without `--raw` sets the credit window, which the protocol bounds.
const SLOTS: std::ops::RangeInclusive<u32> = 8..=32768;

/// `--poll`: how `Conn`'s blocking calls wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Poll {
    /// Poll the completion queue in a loop.
    Busy,
    /// Sleep on the completion channel (gordma's default).
    Event,
    /// Poll for 20 µs, then sleep.
    Adaptive,
}

impl Poll {
    /// The flag's value, as `--json` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Poll::Busy => "busy",
            Poll::Event => "event",
            Poll::Adaptive => "adaptive",
        }
    }

    /// rsrdma-net's mode.
    pub fn mode(self) -> PollMode {
        match self {
            Poll::Busy => PollMode::Busy,
            Poll::Event => PollMode::Event,
            Poll::Adaptive => PollMode::default(),
        }
    }
}

/// The flags both tools take.
#[derive(clap::Args, Debug)]
struct CommonCli {
    /// RDMA device (the first one, or the one rdma_cm resolves the address to, by default)
    #[arg(short = 'd', long = "device")]
    device: Option<String>,
    /// HCA port
    #[arg(short = 'i', long = "ib-port", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..))]
    ib_port: u8,
    /// GID index (the library's choice by default: IPv4-mapped RoCE v2 first)
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u8>,
    /// Number of messages (round trips for the latency tool)
    #[arg(short = 'n', long = "count", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// TCP port (server: the one it listens on; client: unless HOST:PORT names one)
    #[arg(short = 'p', long = "tcp-port", value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    /// Use the TCP handshake instead of rdma_cm
    #[arg(long = "handshake")]
    handshake: bool,
    /// How blocking calls wait for the NIC
    #[arg(long = "poll", value_enum, default_value_t = Poll::Event)]
    poll: Poll,
    /// Print the results as one JSON object on stdout (the other lines go to stderr); its
    /// fields are listed below
    #[arg(long = "json")]
    json: bool,
    /// The server, as HOST[:PORT]: client mode; absent: server mode
    host: Option<String>,
}

/// The zero-copy, rendezvous and receive-pool flags of both tools (`Conn` only).
#[derive(clap::Args, Debug)]
struct ZeroCopyCli {
    /// Send from registered Buffers (send_buffer) and receive into one (recv_buffer): no copy of the payload where the protocol allows
    #[arg(long = "zero-copy")]
    zero_copy: bool,
    /// Rendezvous threshold: messages of at least BYTES are pulled by RDMA READ (settled: the larger of both ends'; default 262144)
    #[arg(long = "rendezvous", value_name = "BYTES",
          value_parser = clap::value_parser!(u32).range(1..=MAX_SIZE as i64))]
    rendezvous: Option<u32>,
    /// Do not offer rendezvous: every message goes eagerly through the slots (and is copied on receipt)
    #[arg(long = "no-rendezvous", conflicts_with = "rendezvous")]
    no_rendezvous: bool,
    /// Server: every accepted connection receives from one shared pool (SRQ) of N slots; prints the listener's receive memory
    #[arg(long = "shared-recv", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    shared_recv: Option<u32>,
}

/// `rs_rdmanet_bw --json`'s fields, for `--help`.
pub const BW_JSON_HELP: &str = "\
With --json, stdout is one JSON object on one line:
  both ends: tool (\"rs_rdmanet_bw\"), role (\"client\" or \"server\"), transport (\"conn\" or
    \"raw\"), registered_bytes (memory registered for the connection), cpu_seconds (user +
    sys of the process during the transfer), messages, bytes
  Conn: poll (\"busy\", \"event\" or \"adaptive\"); client: mode (\"send_msg\",
    \"send_batch\", or \"send_buffer\" with --zero-copy), batch
  --raw client: mode (\"pipeline_batch\" or \"pipeline\"), tx_depth
  client: size, seconds, gbits, mpps (from messages x size over seconds)";

/// `rs_rdmanet_lat --json`'s fields, for `--help`.
pub const LAT_JSON_HELP: &str = "\
With --json, stdout is one JSON object on one line:
  both ends: tool (\"rs_rdmanet_lat\"), role (\"client\" or \"server\"), poll
  client: size, round_trips, avg_ns, p50_ns, p99_ns, min_ns, max_ns (round-trip times);
    mode (\"zero_copy\", only with --zero-copy)
  server: messages, bytes (echoed)";

#[derive(Parser, Debug)]
#[command(
    name = "rs_rdmanet_bw",
    no_binary_name = true,
    about = "One-way message bandwidth over rsrdma-net's Conn (or RawConn with --raw)",
    after_help = BW_JSON_HELP
)]
struct BwCli {
    #[command(flatten)]
    common: CommonCli,
    /// Message size in bytes
    #[arg(short = 's', long = "size", default_value_t = 65536,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SIZE))]
    size: u64,
    /// 1: send_msg one at a time; >1: send_batch/recv_batch_into groups; with --raw: the tx depth
    #[arg(short = 'b', long = "batch", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Credit window (Conn) or queue depth (--raw); 0: the library's default
    #[arg(long = "depth", default_value_t = 0)]
    depth: u32,
    /// Use RawConn: no framing, no credits, busy polling, the TCP handshake
    #[arg(long = "raw", conflicts_with = "poll")]
    raw: bool,
    /// --raw: send from / receive into one region instead of one slot per request in flight (both ends)
    #[arg(long = "raw-onebuf", requires = "raw")]
    raw_onebuf: bool,
    /// --raw client: post one request per call instead of lists
    #[arg(long = "raw-single", requires = "raw")]
    raw_single: bool,
    /// Conn, both ends: rstream's burst both ways (`rstream -S SIZE -C COUNT`): the client
    /// sends -n messages, the server receives them all and sends as many back; the rate
    /// counts both directions
    #[arg(long = "both-ways", conflicts_with_all = ["raw", "zero_copy", "batch"])]
    both_ways: bool,
    /// Both ends: a striped connection (RailConn) over N rails, each a Conn on the device;
    /// the client's rate counts until every message is confirmed read
    #[arg(long = "rails", value_name = "N",
          conflicts_with_all = ["raw", "zero_copy", "batch", "both_ways"],
          value_parser = clap::value_parser!(u32).range(1..=16))]
    rails: Option<u32>,
    #[command(flatten)]
    zc: ZeroCopyCli,
    /// --zero-copy client: registered buffers of -s bytes in flight (a ring)
    #[arg(long = "buffers", value_name = "N", requires = "zero_copy",
          default_value_t = DEFAULT_BUFFERS,
          value_parser = clap::value_parser!(u32).range(1..=MAX_BUFFERS as i64))]
    buffers: u32,
}

#[derive(Parser, Debug)]
#[command(
    name = "rs_rdmanet_lat",
    no_binary_name = true,
    about = "Ping-pong round-trip latency over rsrdma-net's Conn",
    after_help = LAT_JSON_HELP
)]
struct LatCli {
    #[command(flatten)]
    common: CommonCli,
    /// Message size in bytes
    #[arg(short = 's', long = "size", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SIZE))]
    size: u64,
    #[command(flatten)]
    zc: ZeroCopyCli,
}

/// Where the client connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or address (an IPv6 address without brackets).
    pub host: String,
    /// TCP port (or rdma_cm port).
    pub port: u16,
}

/// What both tools are configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// `-d`.
    pub device: Option<String>,
    /// `-i`.
    pub ib_port: u8,
    /// `-x`.
    pub gid_index: Option<u8>,
    /// `-n`.
    pub count: u64,
    /// The server's port (`-p`, or the default).
    pub port: u16,
    /// rdma_cm, or the TCP handshake with `--handshake`.
    pub establish: Establish,
    /// `--poll`.
    pub poll: Poll,
    /// `--json`: the results as one JSON object on stdout.
    pub json: bool,
    /// The server to connect to; `None` makes this side the server.
    pub target: Option<Target>,
}

/// `--raw`'s settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw {
    /// Requests in flight (and the queue depths): `-b` above 1, else `--depth`, else 128.
    pub tx_depth: u32,
    /// `--raw-onebuf`.
    pub onebuf: bool,
    /// `--raw-single`.
    pub single: bool,
}

impl Raw {
    /// How many requests a list refills at once (and the selective-signaling interval):
    /// an eighth of the depth, 1 to 64, as perftest's CQ moderation; 1 with `--raw-single`.
    pub fn refill(&self) -> u32 {
        if self.single {
            1
        } else {
            (self.tx_depth / 8).clamp(1, 64)
        }
    }
}

/// `--zero-copy`, the rendezvous threshold and `--shared-recv`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroCopy {
    /// `--zero-copy`: registered buffers (`send_buffer`, `recv_buffer`).
    pub enabled: bool,
    /// `--buffers` (bandwidth client): buffers in flight; 1 for the latency tool.
    pub buffers: u32,
    /// What `ConnOptions::rendezvous` gets: the library's default, `--rendezvous BYTES`, or
    /// `None` with `--no-rendezvous`.
    pub rendezvous: Option<u32>,
    /// `--shared-recv N` (server only): the listener's pool slots.
    pub shared_recv: Option<u32>,
}

/// `rs_rdmanet_bw`'s checked command line.
#[derive(Debug, Clone, PartialEq)]
pub struct BwArgs {
    /// The shared flags.
    pub common: Common,
    /// `-s`.
    pub size: u64,
    /// `-b` (without `--raw`).
    pub batch: u32,
    /// `--depth` (without `--raw`): the credit window, 0 for the default.
    pub depth: u32,
    /// `--raw` and its settings.
    pub raw: Option<Raw>,
    /// `--zero-copy` and friends (without `--raw`).
    pub zc: ZeroCopy,
    /// `--both-ways`: rstream's burst each way.
    pub both_ways: bool,
    /// `--rails N`: a striped connection over N rails (`None`: one `Conn`).
    pub rails: Option<u32>,
}

/// `rs_rdmanet_lat`'s checked command line.
#[derive(Debug, Clone, PartialEq)]
pub struct LatArgs {
    /// The shared flags.
    pub common: Common,
    /// `-s`.
    pub size: u64,
    /// `--zero-copy` and friends.
    pub zc: ZeroCopy,
}

/// Parses `rs_rdmanet_bw`'s arguments (without the program name).
///
/// # Errors
/// clap's error, to print as it is (`-h` is one, with exit code 0).
pub fn parse_bw(args: &[String]) -> Result<BwArgs, clap::Error> {
    let cli = BwCli::try_parse_from(args)?;
    let common = common(cli.common)?;
    let raw = cli.raw.then_some(Raw {
        tx_depth: match (cli.batch, cli.depth) {
            (b, _) if b > 1 => b,
            (_, d) if d > 0 => d,
            _ => 128,
        },
        onebuf: cli.raw_onebuf,
        single: cli.raw_single,
    });
    if let Some(r) = &raw {
        if r.tx_depth > MAX_TX_DEPTH {
            return Err(invalid(format!(
                "the tx depth of --raw (-b or --depth) is {}, above {MAX_TX_DEPTH}",
                r.tx_depth
            )));
        }
    } else if cli.depth != 0 && !SLOTS.contains(&cli.depth) {
        return Err(invalid(format!(
            "--depth {} without --raw: the credit window must be 0 (default) or {} ..= {}",
            cli.depth,
            SLOTS.start(),
            SLOTS.end()
        )));
    }
    let z = &cli.zc;
    let any_zc =
        z.zero_copy || z.rendezvous.is_some() || z.no_rendezvous || z.shared_recv.is_some();
    if raw.is_some() && any_zc {
        return Err(invalid(
            "--zero-copy, --rendezvous, --no-rendezvous and --shared-recv are Conn options: \
             --raw (RawConn) takes none of them"
                .into(),
        ));
    }
    let zc = zero_copy(z, cli.buffers, &common)?;
    if zc.enabled && cli.batch > 1 {
        return Err(invalid(format!(
            "--zero-copy sends one buffer per call: -b {} (send_batch) does not combine with it; \
             --buffers sets how many are in flight",
            cli.batch
        )));
    }
    Ok(BwArgs {
        common,
        size: cli.size,
        batch: if raw.is_some() { 1 } else { cli.batch },
        depth: if raw.is_some() { 0 } else { cli.depth },
        raw,
        zc,
        both_ways: cli.both_ways,
        rails: cli.rails,
    })
}

/// Parses `rs_rdmanet_lat`'s arguments (without the program name).
///
/// # Errors
/// clap's error, to print as it is.
pub fn parse_lat(args: &[String]) -> Result<LatArgs, clap::Error> {
    let cli = LatCli::try_parse_from(args)?;
    let common = common(cli.common)?;
    Ok(LatArgs {
        zc: zero_copy(&cli.zc, 1, &common)?,
        common,
        size: cli.size,
    })
}

/// Checks the zero-copy flags against the end (`--shared-recv` is the server's).
fn zero_copy(z: &ZeroCopyCli, buffers: u32, c: &Common) -> Result<ZeroCopy, clap::Error> {
    if let (Some(n), Some(t)) = (z.shared_recv, &c.target) {
        return Err(invalid(format!(
            "--shared-recv {n} is a server option (it pools the receive memory of the \
             connections a listener accepts): drop it, or drop {:?} to be the server",
            t.host
        )));
    }
    Ok(ZeroCopy {
        enabled: z.zero_copy,
        buffers,
        rendezvous: match (z.no_rendezvous, z.rendezvous) {
            (true, _) => None,
            (false, Some(b)) => Some(b),
            (false, None) => rsrdma_net::ConnOptions::default().rendezvous,
        },
        shared_recv: z.shared_recv,
    })
}

fn common(c: CommonCli) -> Result<Common, clap::Error> {
    let port = c.port.unwrap_or(DEFAULT_PORT);
    let target = c
        .host
        .as_deref()
        .map(|h| parse_target(h, c.port))
        .transpose()
        .map_err(invalid)?;
    Ok(Common {
        device: c.device,
        ib_port: c.ib_port,
        gid_index: c.gid_index,
        count: c.count,
        port,
        establish: if c.handshake {
            Establish::Tcp
        } else {
            Establish::Cm
        },
        poll: c.poll,
        json: c.json,
        target,
    })
}

/// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT` (a bare IPv6 address has no port). A port in
/// the argument and a different `-p` are refused rather than one silently winning.
///
/// # Errors
/// What is wrong with the argument.
pub fn parse_target(arg: &str, flag_port: Option<u16>) -> Result<Target, String> {
    let (host, port) = if let Some(rest) = arg.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{arg:?}: no closing ']'"))?;
        match after {
            "" => (h, None),
            _ => (
                h,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| format!("{arg:?}: expected ':PORT' after ']'"))?,
                ),
            ),
        }
    } else {
        match arg.matches(':').count() {
            1 => arg
                .split_once(':')
                .map_or((arg, None), |(h, p)| (h, Some(p))),
            _ => (arg, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{arg:?}: no host"));
    }
    let port = match port {
        None => flag_port.unwrap_or(DEFAULT_PORT),
        Some(p) => {
            let p: u16 = p
                .parse()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("{arg:?}: the port must be 1 ..= 65535"))?;
            if flag_port.is_some_and(|f| f != p) {
                return Err(format!(
                    "{arg:?} names port {p}, but -p says {}: give the port once",
                    flag_port.unwrap_or_default()
                ));
            }
            p
        }
    };
    Ok(Target {
        host: host.to_string(),
        port,
    })
}

fn invalid(msg: String) -> clap::Error {
    clap::Error::raw(ErrorKind::ValueValidation, format!("{msg}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    fn bw(args: &[&str]) -> BwArgs {
        parse_bw(&argv(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn bw_err(args: &[&str]) -> String {
        match parse_bw(&argv(args)) {
            Ok(a) => panic!("{args:?} parsed: {a:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bw_defaults_are_gordmas() {
        let a = bw(&[]);
        assert_eq!((a.size, a.batch, a.depth, a.raw), (65536, 1, 0, None));
        let c = &a.common;
        assert_eq!((c.count, c.port, c.ib_port), (1000, DEFAULT_PORT, 1));
        assert_eq!((c.device.as_deref(), c.gid_index), (None, None));
        assert_eq!(
            (c.establish, c.poll, &c.target),
            (Establish::Cm, Poll::Event, &None)
        );
    }

    #[test]
    fn bw_flags_short_and_long() {
        let a = bw(&[
            "-d",
            "rxe0",
            "-i",
            "2",
            "-x",
            "1",
            "-s",
            "4096",
            "-n",
            "7",
            "-p",
            "9000",
            "-b",
            "8",
            "--depth",
            "64",
            "--handshake",
            "--poll",
            "busy",
            "10.77.0.1",
        ]);
        let c = &a.common;
        assert_eq!(c.device.as_deref(), Some("rxe0"));
        assert_eq!(
            (c.ib_port, c.gid_index, c.count, c.port),
            (2, Some(1), 7, 9000)
        );
        assert_eq!((a.size, a.batch, a.depth), (4096, 8, 64));
        assert_eq!((c.establish, c.poll), (Establish::Tcp, Poll::Busy));
        assert_eq!(
            c.target,
            Some(Target {
                host: "10.77.0.1".into(),
                port: 9000
            })
        );
        let b = bw(&[
            "--device",
            "rxe0",
            "--ib-port",
            "2",
            "--gid-index",
            "1",
            "--size",
            "4096",
            "--count",
            "7",
            "--tcp-port",
            "9000",
            "--batch",
            "8",
            "--depth",
            "64",
            "--handshake",
            "--poll",
            "busy",
            "10.77.0.1",
        ]);
        assert_eq!(a, b);
        assert_eq!(bw(&["--poll", "adaptive"]).common.poll, Poll::Adaptive);
        assert_eq!(bw(&["--poll", "event"]).common.poll.mode(), PollMode::Event);
    }

    #[test]
    fn raw_tx_depth_is_b_then_depth_then_128() {
        let r = |args: &[&str]| bw(args).raw.unwrap();
        assert_eq!(r(&["--raw"]).tx_depth, 128);
        assert_eq!(r(&["--raw", "--depth", "32"]).tx_depth, 32);
        assert_eq!(r(&["--raw", "-b", "256", "--depth", "32"]).tx_depth, 256);
        assert_eq!(r(&["--raw", "-b", "1", "--depth", "32"]).tx_depth, 32);
        let x = r(&["--raw", "--raw-onebuf", "--raw-single", "-b", "16"]);
        assert_eq!(
            x,
            Raw {
                tx_depth: 16,
                onebuf: true,
                single: true
            }
        );
        assert_eq!(x.refill(), 1);
        assert_eq!(r(&["--raw"]).refill(), 16);
        assert_eq!(r(&["--raw", "-b", "4"]).refill(), 1);
        assert_eq!(r(&["--raw", "-b", "8192"]).refill(), 64);
        // -b is the depth in raw mode, not a batch of Conn sends.
        let a = bw(&["--raw", "-b", "64"]);
        assert_eq!((a.batch, a.depth), (1, 0));
    }

    #[test]
    fn bad_bw_command_lines_are_refused() {
        for (args, says) in [
            (&["-s", "0"][..], "--size"),
            (&["-n", "0"], "--count"),
            (&["-b", "0"], "--batch"),
            (&["-i", "0"], "--ib-port"),
            (&["-x", "300"], "--gid-index"),
            (&["-p", "0"], "--tcp-port"),
            (&["-s", "2G"], "--size"),
            (&["--poll", "sometimes"], "sometimes"),
            (&["--raw-onebuf"], "--raw"),
            (&["--raw-single"], "--raw"),
            (&["--raw", "--poll", "busy"], "--poll"),
            (&["--depth", "4"], "--depth 4"),
            (&["--depth", "40000"], "--depth 40000"),
            (&["--raw", "-b", "9000"], "9000"),
            (&["--bogus"], "--bogus"),
            (&["h1", "h2"], "h2"),
            (&["-p", "1", "h:2"], "give the port once"),
        ] {
            let e = bw_err(args);
            assert!(e.contains(says), "{args:?}: {e}");
        }
        assert!(parse_bw(&argv(&["--depth", "8"])).is_ok());
        assert!(parse_bw(&argv(&["--raw", "--depth", "4"])).is_ok());
    }

    #[test]
    fn json_is_off_by_default_and_documented_in_the_help() {
        assert!(!bw(&[]).common.json);
        assert!(bw(&["--json", "--raw"]).common.json);
        assert!(parse_lat(&argv(&["--json"])).unwrap().common.json);
        let help = parse_bw(&argv(&["--help"])).unwrap_err().to_string();
        assert!(help.contains("--json"), "{help}");
        for field in [
            "registered_bytes",
            "cpu_seconds",
            "gbits",
            "mpps",
            "tx_depth",
        ] {
            assert!(help.contains(field), "{field}: {help}");
        }
        let help = parse_lat(&argv(&["--help"])).unwrap_err().to_string();
        for field in ["p50_ns", "round_trips", "avg_ns"] {
            assert!(help.contains(field), "{field}: {help}");
        }
    }

    #[test]
    fn help_is_clap_s_with_exit_code_0() {
        let e = parse_bw(&argv(&["-h"])).unwrap_err();
        assert_eq!(e.exit_code(), 0);
        assert_eq!(parse_bw(&argv(&["--nope"])).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn lat_defaults_and_flags() {
        let a = parse_lat(&[]).unwrap();
        assert_eq!(
            (a.size, a.common.count, a.common.port),
            (64, 1000, DEFAULT_PORT)
        );
        assert_eq!(a.common.poll, Poll::Event);
        let a = parse_lat(&argv(&["-s", "8", "-n", "3", "--handshake", "h:77"])).unwrap();
        assert_eq!((a.size, a.common.count), (8, 3));
        assert_eq!(a.common.establish, Establish::Tcp);
        assert_eq!(a.common.target.unwrap().port, 77);
        // No bandwidth-only flags.
        for f in ["-b", "--raw", "--depth"] {
            assert!(parse_lat(&argv(&[f, "1"])).is_err(), "{f}");
        }
    }

    #[test]
    fn zero_copy_flags() {
        let d = bw(&[]).zc;
        let lib = rsrdma_net::ConnOptions::default().rendezvous;
        assert_eq!(
            d,
            ZeroCopy {
                enabled: false,
                buffers: DEFAULT_BUFFERS,
                rendezvous: lib,
                shared_recv: None
            }
        );
        assert!(lib.is_some());
        let a = bw(&["--zero-copy", "--buffers", "4", "-s", "1048576", "h"]);
        assert_eq!((a.zc.enabled, a.zc.buffers), (true, 4));
        assert_eq!(bw(&["--no-rendezvous"]).zc.rendezvous, None);
        assert_eq!(
            bw(&["--rendezvous", "65536", "--zero-copy"]).zc.rendezvous,
            Some(65536)
        );
        let s = bw(&["--shared-recv", "64", "--zero-copy"]);
        assert_eq!((s.zc.shared_recv, s.common.target), (Some(64), None));
        // Copying with the pool, or with rendezvous off, is allowed (the bench's baseline).
        assert_eq!(bw(&["--shared-recv", "8"]).zc.shared_recv, Some(8));
        let l = parse_lat(&argv(&["--zero-copy", "--no-rendezvous", "h"])).unwrap();
        assert_eq!(
            (l.zc.enabled, l.zc.buffers, l.zc.rendezvous),
            (true, 1, None)
        );
        let l = parse_lat(&argv(&["--shared-recv", "16"])).unwrap();
        assert_eq!(l.zc.shared_recv, Some(16));
    }

    #[test]
    fn bad_zero_copy_command_lines_are_refused() {
        for (args, says) in [
            (
                &["--shared-recv", "64", "h"][..],
                "--shared-recv 64 is a server option",
            ),
            (&["--shared-recv", "0"], "--shared-recv"),
            (&["--buffers", "4"], "--zero-copy"),
            (&["--zero-copy", "--buffers", "0"], "--buffers"),
            (&["--zero-copy", "--buffers", "5000"], "--buffers"),
            (
                &["--zero-copy", "-b", "8"],
                "-b 8 (send_batch) does not combine",
            ),
            (&["--rendezvous", "0"], "--rendezvous"),
            (
                &["--rendezvous", "4096", "--no-rendezvous"],
                "--no-rendezvous",
            ),
            (&["--raw", "--zero-copy"], "--raw (RawConn) takes none"),
            (&["--raw", "--no-rendezvous"], "--raw (RawConn) takes none"),
            (
                &["--raw", "--rendezvous", "8"],
                "--raw (RawConn) takes none",
            ),
            (
                &["--raw", "--shared-recv", "8"],
                "--raw (RawConn) takes none",
            ),
        ] {
            let e = bw_err(args);
            assert!(e.contains(says), "{args:?}: {e}");
        }
        let e = parse_lat(&argv(&["--shared-recv", "8", "h"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("server option"), "{e}");
        assert!(parse_lat(&argv(&["--zero-copy", "--buffers", "2"])).is_err());
    }

    #[test]
    fn help_names_the_zero_copy_flags() {
        let bw_help = parse_bw(&argv(&["--help"])).unwrap_err().to_string();
        for f in [
            "--zero-copy",
            "--buffers",
            "--rendezvous",
            "--no-rendezvous",
            "--shared-recv",
        ] {
            assert!(bw_help.contains(f), "{f}: {bw_help}");
        }
        let lat_help = parse_lat(&argv(&["--help"])).unwrap_err().to_string();
        assert!(lat_help.contains("--zero-copy") && lat_help.contains("--shared-recv"));
        assert!(!lat_help.contains("--buffers"), "{lat_help}");
    }

    #[test]
    fn targets() {
        let t = |s: &str, p: Option<u16>| parse_target(s, p);
        let ok = |host: &str, port: u16| {
            Ok(Target {
                host: host.into(),
                port,
            })
        };
        assert_eq!(t("10.77.0.1", None), ok("10.77.0.1", DEFAULT_PORT));
        assert_eq!(t("10.77.0.1", Some(9)), ok("10.77.0.1", 9));
        assert_eq!(t("10.77.0.1:9", None), ok("10.77.0.1", 9));
        assert_eq!(t("10.77.0.1:9", Some(9)), ok("10.77.0.1", 9));
        assert_eq!(t("host:18515", None), ok("host", 18515));
        assert_eq!(t("fe80::1", None), ok("fe80::1", DEFAULT_PORT));
        assert_eq!(t("[fe80::1]", Some(5)), ok("fe80::1", 5));
        assert_eq!(t("[fe80::1]:6", None), ok("fe80::1", 6));
        for bad in [
            "", ":9", "h:", "h:0", "h:x", "h:70000", "[::1", "[::1]x", "[]:5",
        ] {
            assert!(t(bad, None).is_err(), "{bad:?}");
        }
        assert!(t("h:2", Some(1))
            .unwrap_err()
            .contains("give the port once"));
    }
}
