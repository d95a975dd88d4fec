//! perftest's flags as clap parses them: every value is checked here, in perftest's words
//! ([`super::values`]); what depends on the tool or on other flags is left to
//! [`super::rules`].

use super::params::{Conn, OutputOnly};
use super::values::{ConnOf, Named, Ranged};
use crate::{Tool, Verb};
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};

/// The largest `-s`, `-D` and `-f` perftest takes.
const I32_MAX: u64 = i32::MAX as u64;

#[derive(Parser, Debug)]
// perftest reads options with getopt: the last of a repeated option wins.
#[command(
    disable_help_flag = true,
    disable_version_flag = true,
    no_binary_name = true,
    args_override_self = true
)]
pub(super) struct Cli {
    #[arg(short = 'h', long = "help")]
    pub help: bool,
    #[arg(short = 'V', long = "version")]
    pub version: bool,
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    // Checked by `super::parse`: perftest's complaint has no parser trailer.
    #[arg(short = 'A', long = "atomic_type")]
    pub atomic_type: Option<String>,
    #[arg(short = 'b', long = "bidirectional")]
    pub bidir: bool,
    // The transports depend on the tool: `parse_args` sets this parser per tool.
    #[arg(short = 'c', long = "connection", value_parser = ConnOf(Verb::Send))]
    pub conn: Option<Conn>,
    #[arg(short = 'd', long = "ib-dev")]
    pub device: Option<String>,
    #[arg(short = 'D', long = "duration",
          value_parser = Ranged::<u64>::new(1, I32_MAX + 1, "Duration"))]
    pub duration: Option<u64>,
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    #[arg(short = 'f', long = "margin", value_parser = Ranged::<u64>::new(0, I32_MAX + 1, "Margin"))]
    pub margin: Option<u64>,
    // Accepted for compatibility, no effect (a nanosecond clock is used).
    #[arg(short = 'F', long = "CPU-freq")]
    _cpu_freq: bool,
    #[arg(short = 'i', long = "ib-port", value_parser = Ranged::<u8>::new(1, 255, "IB port"))]
    pub ib_port: Option<u8>,
    #[arg(short = 'I', long = "inline_size", value_parser = INLINE)]
    pub inline: Option<u32>,
    #[arg(short = 'l', long = "post_list", value_parser = Ranged::<u32>::new(1, 15000, "Post list"))]
    pub post_list: Option<u32>,
    // Any number: one that is not an MTU gets perftest's warning later.
    #[arg(short = 'm', long = "mtu", value_parser = Ranged::<u32>::new(0, u32::MAX as u64, "MTU"))]
    pub mtu: Option<u32>,
    #[arg(short = 'n', long = "iters",
          value_parser = Ranged::<u64>::new(5, 100_000_000, "Iteration num"))]
    pub iters: Option<u64>,
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    #[arg(short = 'o', long = "outs",
          value_parser = Ranged::<u32>::new(1, 65535, "Outstanding reads"))]
    pub outs: Option<u32>,
    #[arg(short = 'p', long = "port", value_parser = Ranged::<u16>::new(1, 65535, "Port"))]
    pub port: Option<u16>,
    #[arg(short = 'q', long = "qp", value_parser = Ranged::<u32>::new(1, 16384, "Num of qps"))]
    pub qps: Option<u32>,
    #[arg(short = 'Q', long = "cq-mod", value_parser = Ranged::<u32>::new(1, 1024, "CQ moderation"))]
    pub cq_mod: Option<u32>,
    #[arg(short = 'r', long = "rx-depth", value_parser = Ranged::<u32>::new(1, 16384, "Rx depth"))]
    pub rx_depth: Option<u32>,
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
    #[arg(short = 's', long = "size", value_parser = SIZE)]
    pub size: Option<u64>,
    #[arg(short = 'S', long = "sl", value_parser = Ranged::<u8>::new(0, 15, "SL"))]
    pub sl: Option<u8>,
    #[arg(short = 't', long = "tx-depth", value_parser = Ranged::<u32>::new(1, 15000, "Tx depth"))]
    pub tx_depth: Option<u32>,
    #[arg(short = 'u', long = "qp-timeout", value_parser = Ranged::<u8>::new(0, 31, "QP timeout"))]
    pub qp_timeout: Option<u8>,
    #[arg(short = 'x', long = "gid-index", value_parser = Ranged::<u8>::new(0, 64, "Gid index"))]
    pub gid_index: Option<u8>,
    #[arg(short = 'C', long = "report-cycles")]
    pub report_cycles: bool,
    #[arg(short = 'H', long = "report-histogram")]
    pub histogram: bool,
    #[arg(short = 'U', long = "report-unsorted")]
    pub unsorted: bool,
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    #[arg(long = "output", value_parser = Named::<OutputOnly>::new(
        "Invalid verbosity level output flag. Please use bandwidth, latency, message_rate"))]
    pub output: Option<OutputOnly>,
    #[arg(long = "out_json")]
    pub out_json: bool,
    #[arg(long = "out_json_file")]
    pub out_json_file: Option<String>,
    #[arg(long = "tclass", value_parser = Ranged::<u8>::new(0, 255, "Traffic class"))]
    pub tclass: Option<u8>,
    #[arg(long = "pkey_index", value_parser = Ranged::<u16>::new(0, 65535, "PKey index"))]
    pub pkey_index: Option<u16>,
    #[arg(long = "disable_pcie_relaxed")]
    pub disable_relaxed: bool,
    // Accepted for compatibility, no effect (ibv_post_send is the default here).
    #[arg(long = "use_old_post_send")]
    _old_post_send: bool,
    // Not perftest's: post through the extended work-request API (ibv_wr_*).
    #[arg(long = "use_new_post_send")]
    pub new_post_send: bool,
    #[arg(long = "loopback")]
    pub loopback: bool,
    pub host: Option<String>,
}

/// `-s`: 1 … 2^31−1 bytes, with K/M/G suffixes.
pub(super) const SIZE: Ranged<u64> = Ranged::new(1, I32_MAX, "Message Size").with_suffixes();

/// `-I`: 0 … 912 bytes (UD: 884, checked with [`UD_INLINE`] once `-c` is known).
pub(super) const INLINE: Ranged<u32> = Ranged::new(0, 912, "Inline size");

/// `-I` over UD.
pub(super) const UD_INLINE: Ranged<u32> = Ranged::new(0, 884, "Inline size");

impl Cli {
    /// Parses `args` for `tool`.
    ///
    /// # Errors
    /// clap's error, for an unknown flag, a missing value or a value the parsers refuse.
    pub(super) fn parse_args(tool: Tool, args: &[String]) -> Result<Cli, clap::Error> {
        let cmd = Cli::command().mut_arg("conn", |a| a.value_parser(ConnOf(tool.verb)));
        let m: ArgMatches = cmd.try_get_matches_from(args)?;
        Cli::from_arg_matches(&m)
    }
}
