//! Command-line options: perftest's flags, defaults and derived rules (spec section 2.1).
//!
//! Parsing is pure (no device is opened): [`parse`] turns `argv` into [`Params`] or a
//! [`ParseOutcome`] saying what to print and which exit code to use. Rules that need the device
//! (inline defaults, the UD size cap, outstanding reads) are applied later by the engine.

use crate::{Kind, Tool, Verb};
use clap::Parser;

/// perftest's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// The largest message of `-a` (2^23 bytes).
pub const MAX_ALL_SIZE: u64 = 1 << 23;
/// perftest's `RESULT_LINE`: 87 dashes and a newline.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------\n";

/// Transport type (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram (send tools only).
    Ud,
}

impl Conn {
    /// The name perftest prints.
    pub fn name(self) -> &'static str {
        match self {
            Conn::Rc => "RC",
            Conn::Uc => "UC",
            Conn::Ud => "UD",
        }
    }

    /// Code carried in the rs-to-rs parameter trailer.
    pub(crate) fn code(self) -> u8 {
        match self {
            Conn::Rc => 0,
            Conn::Uc => 1,
            Conn::Ud => 2,
        }
    }
}

/// `--output=`: print only one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputOnly {
    /// Average bandwidth.
    Bandwidth,
    /// Message rate.
    MessageRate,
    /// Average latency.
    Latency,
}

/// Everything a run needs, after perftest's derived rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Which tool.
    pub tool: Tool,
    /// The server to connect to; `None` makes this side the server.
    pub host: Option<String>,
    /// `-d`: device name (first device when absent).
    pub device: Option<String>,
    /// `-i`: port number.
    pub ib_port: u8,
    /// `-x`: GID index (automatic on RoCE when absent).
    pub gid_index: Option<u8>,
    /// `-s`: message size (the first size with `-a`).
    pub size: u64,
    /// `-s` was given (UD then refuses sizes above the MTU instead of capping them).
    pub size_explicit: bool,
    /// `-a`: every power of two from 2 to 2^23 (capped at the MTU for UD later).
    pub all: bool,
    /// `-n`: iterations.
    pub iters: u64,
    /// `-D`: duration in seconds (replaces iterations).
    pub duration: Option<u64>,
    /// `-f`: margin of the duration mode, seconds.
    pub margin: u64,
    /// `-t`: send queue depth.
    pub tx_depth: u32,
    /// `-r`: receive queue depth (send tools).
    pub rx_depth: u32,
    /// `-q`: number of QPs.
    pub num_qps: u32,
    /// `-I`: inline size; `None` means the per-device default.
    pub inline: Option<u32>,
    /// `-l`: post list length.
    pub post_list: u32,
    /// `-Q` after derivation.
    pub cq_mod: u32,
    /// `-c`.
    pub conn: Conn,
    /// `-R`.
    pub rdma_cm: bool,
    /// `-p`.
    pub port: u16,
    /// `-m` in bytes, if given (validated later against the port).
    pub mtu: Option<u32>,
    /// `-m` had a value that is not an MTU (perftest warns and uses the port's).
    pub mtu_invalid: Option<u32>,
    /// `-e`.
    pub events: bool,
    /// `-b`.
    pub bidir: bool,
    /// `-o`.
    pub out_reads: Option<u32>,
    /// `-N`, or implied (see [`Params::no_peak`]).
    pub no_peak_flag: bool,
    /// `--report_gbits`.
    pub report_gbits: bool,
    /// `--output=`.
    pub output: Option<OutputOnly>,
    /// `--out_json` / `--out_json_file=`.
    pub out_json: Option<String>,
    /// `--loopback`: both ends in this process.
    pub loopback: bool,
    /// `-u`.
    pub qp_timeout: u8,
    /// `-S`.
    pub sl: u8,
    /// `--tclass`.
    pub tclass: u8,
    /// `--pkey_index`.
    pub pkey_index: u16,
    /// `-C`.
    pub report_cycles: bool,
    /// `-H` (and `-U`).
    pub histogram: bool,
    /// `-U`.
    pub unsorted: bool,
    /// PCIe relaxed ordering (off with `--disable_pcie_relaxed`, always off for write_lat).
    pub relaxed_ordering: bool,
    /// Lines perftest's parser prints before anything else (warnings, notes).
    pub notes: Vec<String>,
}

impl Params {
    /// True on the server (no host given).
    pub fn is_server(&self) -> bool {
        self.host.is_none()
    }

    /// The message sizes to run.
    pub fn sizes(&self, max: u64) -> Vec<u64> {
        if self.all {
            (1..=23)
                .map(|e| 1u64 << e)
                .take_while(|&s| s <= max)
                .collect()
        } else {
            vec![self.size]
        }
    }

    /// Whether this side measures no peak (perftest's noPeak rules).
    pub fn no_peak(&self) -> bool {
        self.no_peak_flag
            || self.iters > 20_000
            || self.duration.is_some()
            || (self.tool.verb == Verb::Send && self.is_server() && !self.bidir)
    }

    /// Whether this side sends on the data path (goes to RTS and posts sends).
    pub fn sends(&self) -> bool {
        match self.tool.kind {
            Kind::Lat => !(self.tool.verb == Verb::Read && self.is_server()),
            Kind::Bw => !self.is_server() || self.bidir,
        }
    }

    /// Whether this side posts receives.
    pub fn receives(&self) -> bool {
        self.tool.verb == Verb::Send
            && (self.is_server() || self.bidir || self.tool.kind == Kind::Lat)
    }
}

/// What to do instead of running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseOutcome {
    /// Print `stdout` (help or version) and exit with `code`.
    Print {
        /// Text for stdout.
        stdout: String,
        /// Exit code (perftest exits 1 even for `-h`/`-V`).
        code: i32,
    },
    /// A bad command line: print `stderr` (and usage on stdout when set), exit 1.
    Error {
        /// Text for stderr.
        stderr: String,
        /// Usage for stdout, or empty.
        stdout: String,
    },
}

/// The version perftest 4.5-0.17 reports and sends.
pub const VERSION: &str = "6.06";

#[derive(Parser, Debug)]
// perftest reads options with getopt: the last of a repeated option wins.
#[command(
    disable_help_flag = true,
    disable_version_flag = true,
    no_binary_name = true,
    args_override_self = true
)]
struct Cli {
    #[arg(short = 'h', long = "help")]
    help: bool,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[arg(short = 'a', long = "all")]
    all: bool,
    #[arg(short = 'b', long = "bidirectional")]
    bidir: bool,
    #[arg(short = 'c', long = "connection")]
    conn: Option<String>,
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    #[arg(short = 'D', long = "duration")]
    duration: Option<String>,
    #[arg(short = 'e', long = "events")]
    events: bool,
    #[arg(short = 'f', long = "margin")]
    margin: Option<String>,
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    #[arg(short = 'i', long = "ib-port")]
    ib_port: Option<String>,
    #[arg(short = 'I', long = "inline_size")]
    inline: Option<String>,
    #[arg(short = 'l', long = "post_list")]
    post_list: Option<String>,
    #[arg(short = 'm', long = "mtu")]
    mtu: Option<String>,
    #[arg(short = 'n', long = "iters")]
    iters: Option<String>,
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    #[arg(short = 'o', long = "outs")]
    outs: Option<String>,
    #[arg(short = 'p', long = "port")]
    port: Option<String>,
    #[arg(short = 'q', long = "qp")]
    qps: Option<String>,
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<String>,
    #[arg(short = 'r', long = "rx-depth")]
    rx_depth: Option<String>,
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    #[arg(short = 's', long = "size")]
    size: Option<String>,
    #[arg(short = 'S', long = "sl")]
    sl: Option<String>,
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<String>,
    #[arg(short = 'u', long = "qp-timeout")]
    qp_timeout: Option<String>,
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<String>,
    #[arg(short = 'C', long = "report-cycles")]
    report_cycles: bool,
    #[arg(short = 'H', long = "report-histogram")]
    histogram: bool,
    #[arg(short = 'U', long = "report-unsorted")]
    unsorted: bool,
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    #[arg(long = "output")]
    output: Option<String>,
    #[arg(long = "out_json")]
    out_json: bool,
    #[arg(long = "out_json_file")]
    out_json_file: Option<String>,
    #[arg(long = "tclass")]
    tclass: Option<String>,
    #[arg(long = "pkey_index")]
    pkey_index: Option<String>,
    #[arg(long = "disable_pcie_relaxed")]
    disable_relaxed: bool,
    #[arg(long = "use_old_post_send")]
    old_post_send: bool,
    #[arg(long = "loopback")]
    loopback: bool,
    host: Option<String>,
}

/// The help text: perftest's layout, listing every flag this tool takes.
pub fn help_text(tool: Tool) -> String {
    let name = tool.binary_name();
    let bw = tool.kind == Kind::Bw;
    let mut s = String::new();
    s.push_str("Usage:\n");
    s.push_str(&format!(
        "  {name}            start a server and wait for connection\n"
    ));
    s.push_str(&format!(
        "  {name} <host>     connect to server at <host>\n"
    ));
    s.push_str(&format!(
        "  {name} --loopback run both ends on one device in this process\n\nOptions:\n"
    ));
    let mut line = |flag: &str, text: &str| s.push_str(&format!("  {flag}  {text}\n"));
    line("-a, --all", "Run sizes from 2 till 2^23");
    if bw {
        line(
            "-b, --bidirectional",
            "Measure bidirectional bandwidth (default unidirectional)",
        );
    }
    let conns = match tool.verb {
        Verb::Send => "RC/UC/UD",
        Verb::Write => "RC/UC",
        Verb::Read => "RC",
    };
    line(
        &format!("-c, --connection=<{conns}>"),
        &format!("Connection type {conns} (default RC)"),
    );
    if tool.kind == Kind::Lat {
        line(
            "-C, --report-cycles",
            "report times in cpu cycle units (default microseconds; here: nanoseconds)",
        );
    }
    line(
        "-d, --ib-dev=<dev>",
        "Use IB device <dev> (default first device found)",
    );
    line(
        "-D, --duration",
        "Run test for a customized period of seconds.",
    );
    if tool.verb != Verb::Write {
        line("-e, --events", "Sleep on CQ events (default poll)");
    }
    line(
        "-f, --margin",
        "measure results within margins. (default=2sec)",
    );
    line(
        "-F, --CPU-freq",
        "Accepted for compatibility (a nanosecond clock is used)",
    );
    line("-h, --help", "Show this help screen.");
    if tool.kind == Kind::Lat {
        line(
            "-H, --report-histogram",
            "Print out all results (default print summary only)",
        );
    }
    line(
        "-i, --ib-port=<port>",
        "Use port <port> of IB device (default 1)",
    );
    if tool.verb != Verb::Read {
        line(
            "-I, --inline_size=<size>",
            "Max size of message to be sent in inline",
        );
    }
    if bw {
        line(
            "-l, --post_list=<list size>",
            "Post list of send WQEs of <list size> size (instead of single post)",
        );
    }
    line(
        "-m, --mtu=<mtu>",
        "MTU size : 256 - 4096 (default port mtu)",
    );
    line(
        "-n, --iters=<iters>",
        &format!(
            "Number of exchanges (at least 5, default {})",
            default_iters(tool)
        ),
    );
    if bw {
        line(
            "-N, --noPeak",
            "Cancel peak-bw calculation (default with peak up to iters=20000)",
        );
    }
    if tool.verb == Verb::Read {
        line(
            "-o, --outs=<num>",
            "num of outstanding read/atom(default max of device)",
        );
    }
    line(
        "-p, --port=<port>",
        "Listen on/connect to port <port> (default 18515)",
    );
    if bw {
        line("-q, --qp=<num of qp's>", "Num of qp's(default 1)");
        line(
            "-Q, --cq-mod",
            "Generate Cqe only after <--cq-mod> completion",
        );
    }
    if tool.verb == Verb::Send {
        line("-r, --rx-depth=<dep>", "Rx queue size (default 512)");
    }
    line(
        "-R, --rdma_cm",
        "Connect QPs with rdma_cm and run test on those QPs (not supported: exits with an error)",
    );
    line(
        "-s, --size=<size>",
        &format!(
            "Size of message to exchange (default {})",
            default_size(tool)
        ),
    );
    line("-S, --sl=<sl>", "SL (default 0)");
    if bw {
        line("-t, --tx-depth=<dep>", "Size of tx queue (default 128)");
    }
    line(
        "-u, --qp-timeout=<timeout>",
        "QP timeout, timeout value is 4 usec * 2 ^(timeout), default 14",
    );
    if tool.kind == Kind::Lat {
        line(
            "-U, --report-unsorted",
            "(implies -H) print out unsorted results (default sorted)",
        );
    }
    line("-V, --version", "Display version number");
    line(
        "-x, --gid-index=<index>",
        "Test uses GID with GID index (Default : IB - no gid . ETH - automatic)",
    );
    s.push('\n');
    let mut long = |flag: &str, text: &str| s.push_str(&format!("      {flag}  {text}\n"));
    long("--out_json", "Save the report in a json file");
    long(
        "--out_json_file=<file>",
        "Name of the report json file. (Default: perftest_out.json in the working directory)",
    );
    long(
        "--output=<units>",
        "Set verbosity output level: bandwidth , message_rate, latency",
    );
    long("--pkey_index=<pkey index>", "PKey index to use for QP");
    if bw {
        long(
            "--report_gbits",
            "Report Max/Average BW of test in Gbit/sec (instead of MiB/sec)",
        );
    }
    long(
        "--tclass=<value>",
        "Set the Traffic Class in GRH (if GRH is in use)",
    );
    long("--disable_pcie_relaxed", "Disable PCIe relaxed ordering");
    long(
        "--use_old_post_send",
        "Accepted for compatibility (ibv_post_send is always used)",
    );
    long(
        "--loopback",
        "Run server and client in this process on one device; print the client's output",
    );
    s.push_str("\n Environment: RSRDMA_PROBE=1 adds a line splitting the send loop's time into posting and polling (bw tests).\n");
    s
}

fn default_size(tool: Tool) -> u64 {
    match tool.kind {
        Kind::Bw => 65536,
        Kind::Lat => 2,
    }
}

fn default_iters(tool: Tool) -> u64 {
    if tool.verb == Verb::Write && tool.kind == Kind::Bw {
        5000
    } else {
        1000
    }
}

fn parser_error(msg: &str) -> ParseOutcome {
    ParseOutcome::Error {
        stderr: format!(" {msg}\n Parser function exited with Error\n"),
        stdout: String::new(),
    }
}

/// Parses a number the way perftest's options are read (decimal; `-s` also takes K/M/G).
fn num(opt: &str, v: &str, suffixes: bool) -> Result<u64, ParseOutcome> {
    let v = v.trim();
    let (digits, mult) = match v.chars().last() {
        Some('K' | 'k') if suffixes => (&v[..v.len() - 1], 1u64 << 10),
        Some('M' | 'm') if suffixes => (&v[..v.len() - 1], 1 << 20),
        Some('G' | 'g') if suffixes => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| parser_error(&format!("Invalid value '{v}' for option {opt}")))
}

fn ranged(opt: &str, v: &str, lo: u64, hi: u64, what: &str) -> Result<u64, ParseOutcome> {
    let n = num(opt, v, false)?;
    if n < lo || n > hi {
        return Err(parser_error(&format!(
            "{what} should be between {lo} and {hi}"
        )));
    }
    Ok(n)
}

/// [`ranged`] for an option that may be absent.
fn opt_ranged(
    v: Option<&str>,
    opt: &str,
    lo: u64,
    hi: u64,
    what: &str,
) -> Result<Option<u64>, ParseOutcome> {
    v.map(|v| ranged(opt, v, lo, hi, what)).transpose()
}

/// Parses `args` (without the program name) for `tool`.
///
/// # Errors
/// A [`ParseOutcome`] for help, version, and every invalid command line.
pub fn parse(tool: Tool, args: &[String]) -> Result<Params, ParseOutcome> {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let first = e.to_string();
            let first = first
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            return Err(ParseOutcome::Error {
                stderr: format!(
                    "{}: {first}\n Invalid Command or flag.\n Please check command line and run again.\n\n Parser function exited with Error\n",
                    tool.binary_name()
                ),
                stdout: help_text(tool),
            });
        }
    };
    if cli.help {
        return Err(ParseOutcome::Print {
            stdout: help_text(tool),
            code: 1,
        });
    }
    if cli.version {
        return Err(ParseOutcome::Print {
            stdout: format!("Version: {VERSION}\n"),
            code: 1,
        });
    }
    let bw = tool.kind == Kind::Bw;
    let lat = !bw;
    let not_for = |flag: &str| {
        Err(ParseOutcome::Error {
            stderr: format!(
                "{}: option {flag} is not available in this test\n Invalid Command or flag.\n Please check command line and run again.\n\n Parser function exited with Error\n",
                tool.binary_name()
            ),
            stdout: help_text(tool),
        })
    };
    if lat && cli.qps.is_some() {
        return Err(parser_error("Multiple QPs only available on bw tests"));
    }
    if lat && cli.bidir {
        return Err(parser_error(
            "Bidirectional mode only available on bw tests",
        ));
    }
    // perftest's latency tools accept --report_gbits and ignore it; so do these.
    if lat && (cli.post_list.is_some() || cli.cq_mod.is_some() || cli.no_peak) {
        return not_for(if cli.post_list.is_some() {
            "-l"
        } else if cli.cq_mod.is_some() {
            "-Q"
        } else {
            "-N"
        });
    }
    if tool.verb != Verb::Send && cli.rx_depth.is_some() {
        return not_for("-r");
    }
    if tool.verb != Verb::Read && cli.outs.is_some() {
        return not_for("-o");
    }
    if tool.verb == Verb::Read && cli.inline.is_some() {
        return not_for("-I");
    }
    if tool.verb == Verb::Write && cli.events {
        return not_for("-e");
    }
    if bw && (cli.report_cycles || cli.histogram || cli.unsorted) {
        return not_for("-C/-H/-U");
    }

    let conn = match cli.conn.as_deref() {
        None => Conn::Rc,
        Some("RC") => Conn::Rc,
        Some("UC") if tool.verb != Verb::Read => Conn::Uc,
        Some("UD") if tool.verb == Verb::Send => Conn::Ud,
        Some(other) => {
            return Err(parser_error(&format!(
                "Connection type {other} is not supported by this test (supported: {})",
                match tool.verb {
                    Verb::Send => "RC, UC, UD",
                    Verb::Write => "RC, UC",
                    Verb::Read => "RC",
                }
            )))
        }
    };

    let size_given = cli.size.is_some();
    let size = match &cli.size {
        Some(v) => {
            let n = num("-s", v, true)?;
            if n < 1 || n > i32::MAX as u64 {
                return Err(parser_error(&format!(
                    "Message Size should be between 1 and {}",
                    i32::MAX
                )));
            }
            n
        }
        None => default_size(tool),
    };
    let iters_given = cli.iters.is_some();
    let iters = match &cli.iters {
        Some(v) => ranged("-n", v, 5, 100_000_000, "Iteration num")?,
        None => default_iters(tool),
    };
    let duration = opt_ranged(cli.duration.as_deref(), "-D", 1, 1 << 31, "Duration")?;
    if duration.is_some() && iters_given {
        return Err(parser_error(
            "Duration (-D) and iterations (-n) cannot be used together",
        ));
    }
    if duration.is_some() && cli.all {
        return Err(parser_error(
            "Duration (-D) with all sizes (-a) is not supported",
        ));
    }
    if duration.is_some() && lat {
        return Err(parser_error(
            "Duration mode (-D) of the latency tests is not supported by the rs_* tools",
        ));
    }
    let margin = opt_ranged(cli.margin.as_deref(), "-f", 0, 1 << 31, "Margin")?.unwrap_or(2);
    let mut tx_depth = match &cli.tx_depth {
        Some(v) if bw => ranged("-t", v, 1, 15000, "Tx depth")? as u32,
        Some(_) => return not_for("-t"),
        None if bw => 128,
        None => 1,
    };
    let rx_given = cli.rx_depth.is_some();
    let mut rx_depth = match &cli.rx_depth {
        Some(v) => ranged("-r", v, 1, 16384, "Rx depth")? as u32,
        None if tool.verb == Verb::Send => 512,
        None => 1,
    };
    let num_qps = opt_ranged(cli.qps.as_deref(), "-q", 1, 16384, "Num of qps")?.unwrap_or(1) as u32;
    let cq_mod_given = cli.cq_mod.is_some();
    let mut cq_mod =
        opt_ranged(cli.cq_mod.as_deref(), "-Q", 1, 1024, "CQ moderation")?.unwrap_or(100) as u32;
    let inline = cli
        .inline
        .as_deref()
        .map(|v| {
            ranged(
                "-I",
                v,
                0,
                if conn == Conn::Ud { 884 } else { 912 },
                "Inline size",
            )
        })
        .transpose()?
        .map(|v| v as u32);
    let post_list =
        opt_ranged(cli.post_list.as_deref(), "-l", 1, 15000, "Post list")?.unwrap_or(1) as u32;
    let gid_index = cli
        .gid_index
        .as_deref()
        .map(|v| ranged("-x", v, 0, 64, "Gid index").map(|v| v as u8))
        .transpose()?;
    let ib_port = opt_ranged(cli.ib_port.as_deref(), "-i", 1, 255, "IB port")?.unwrap_or(1) as u8;
    let port = opt_ranged(cli.port.as_deref(), "-p", 1, 65535, "Port")?
        .unwrap_or(DEFAULT_PORT as u64) as u16;
    let (mtu, mtu_invalid) = match cli.mtu.as_deref() {
        None => (None, None),
        Some(v) => {
            let n = num("-m", v, false)? as u32;
            if rsrdma::Mtu::from_bytes(n).is_some() {
                (Some(n), None)
            } else {
                (None, Some(n))
            }
        }
    };
    let out_reads =
        opt_ranged(cli.outs.as_deref(), "-o", 1, 65535, "Outstanding reads")?.map(|v| v as u32);
    let qp_timeout =
        opt_ranged(cli.qp_timeout.as_deref(), "-u", 0, 31, "QP timeout")?.unwrap_or(14) as u8;
    let sl = opt_ranged(cli.sl.as_deref(), "-S", 0, 15, "SL")?.unwrap_or(0) as u8;
    let tclass =
        opt_ranged(cli.tclass.as_deref(), "--tclass", 0, 255, "Traffic class")?.unwrap_or(0) as u8;
    let pkey_index = opt_ranged(
        cli.pkey_index.as_deref(),
        "--pkey_index",
        0,
        65535,
        "PKey index",
    )?
    .unwrap_or(0) as u16;
    let output =
        match cli.output.as_deref() {
            None => None,
            Some("bandwidth") => Some(OutputOnly::Bandwidth),
            Some("message_rate") => Some(OutputOnly::MessageRate),
            Some("latency") => Some(OutputOnly::Latency),
            Some(_) => return Err(parser_error(
                "Invalid verbosity level output flag. Please use bandwidth, latency, message_rate",
            )),
        };
    let out_json = match (cli.out_json, cli.out_json_file) {
        (_, Some(f)) => Some(f),
        (true, None) => Some("perftest_out.json".to_string()),
        (false, None) => None,
    };
    if cli.loopback && cli.host.is_some() {
        return Err(parser_error("--loopback runs both ends: give no host"));
    }
    if cli.rdma_cm && conn == Conn::Uc {
        return Err(parser_error("rdma_cm (-R) does not support UC"));
    }
    if cli.all && size_given {
        // perftest lets -a override -s; keep the same.
        tracing::debug!("-a overrides -s");
    }

    let mut notes = Vec::new();
    // Derived rules, in perftest's order (spec 2.1).
    if duration.is_none() {
        tx_depth = tx_depth.min(iters.min(u32::MAX as u64) as u32);
    }
    if tool.verb == Verb::Send {
        if duration.is_none() {
            rx_depth = rx_depth.min(iters.min(u32::MAX as u64) as u32);
        }
        if conn != Conn::Rc && !rx_given {
            rx_depth = if duration.is_none() {
                iters.min(16000) as u32
            } else {
                512
            };
        }
        if !cli.all && rx_depth % 2 == 1 {
            rx_depth += 1;
        }
    }
    if lat {
        cq_mod = 1;
    } else {
        if size > 8192 && conn != Conn::Ud && !cli.all && !cli.events {
            if cq_mod_given {
                notes.push(format!(
                    "{RESULT_LINE}Warning: Large message requested and CQ moderation enabled\nWarning: It can lead to inaccurate results\n"
                ));
            } else {
                cq_mod = 1;
            }
        }
        cq_mod = cq_mod.min(tx_depth);
        if post_list > 1 {
            cq_mod = post_list;
            notes.push(format!(
                "{RESULT_LINE}Post List requested - CQ moderation will be the size of the post list\n"
            ));
            if duration.is_none() && iters % u64::from(post_list) != 0 {
                return Err(parser_error(
                    "Number of iterations must be a multiple of the post list size",
                ));
            }
            if post_list > tx_depth {
                return Err(parser_error(
                    "Post list size must not exceed the tx depth (-t)",
                ));
            }
        }
    }
    // write_lat always runs without relaxed ordering: its last-byte polling needs the
    // bytes of a write to land in order.
    let write_lat = tool.verb == Verb::Write && tool.kind == Kind::Lat;
    let relaxed_ordering = !(cli.disable_relaxed || write_lat);
    let _ = cli.cpu_freq || cli.old_post_send;

    Ok(Params {
        tool,
        host: cli.host,
        device: cli.device,
        ib_port,
        gid_index,
        size: if cli.all { 2 } else { size },
        size_explicit: size_given && !cli.all,
        all: cli.all,
        iters,
        duration,
        margin,
        tx_depth,
        rx_depth,
        num_qps,
        inline,
        post_list,
        cq_mod,
        conn,
        rdma_cm: cli.rdma_cm,
        port,
        mtu,
        mtu_invalid,
        events: cli.events,
        bidir: cli.bidir,
        out_reads,
        no_peak_flag: cli.no_peak,
        report_gbits: cli.report_gbits,
        output,
        out_json,
        loopback: cli.loopback,
        qp_timeout,
        sl,
        tclass,
        pkey_index,
        report_cycles: cli.report_cycles,
        histogram: cli.histogram || cli.unsorted,
        unsorted: cli.unsorted,
        relaxed_ordering,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        let (v, k) = name.split_once('_').unwrap();
        let verb = match v {
            "send" => Verb::Send,
            "write" => Verb::Write,
            _ => Verb::Read,
        };
        Tool::new(verb, if k == "bw" { Kind::Bw } else { Kind::Lat })
    }

    fn ok(name: &str, args: &[&str]) -> Params {
        let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(tool(name), &a).unwrap_or_else(|e| panic!("{name} {args:?}: {e:?}"))
    }

    fn err(name: &str, args: &[&str]) -> (String, String) {
        let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(tool(name), &a) {
            Err(ParseOutcome::Error { stderr, stdout }) => (stderr, stdout),
            other => panic!("{name} {args:?}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_per_tool() {
        // (tool, size, iters, tx depth, rx depth, cq_mod) as perftest 4.5-0.17 derives them.
        for (name, size, iters, tx, rx, cq) in [
            ("write_bw", 65536, 5000, 128, 1, 1),
            ("read_bw", 65536, 1000, 128, 1, 1),
            ("send_bw", 65536, 1000, 128, 512, 1),
            ("write_lat", 2, 1000, 1, 1, 1),
            ("read_lat", 2, 1000, 1, 1, 1),
            ("send_lat", 2, 1000, 1, 512, 1),
        ] {
            let p = ok(name, &[]);
            assert_eq!(
                (p.size, p.iters, p.tx_depth, p.rx_depth, p.cq_mod),
                (size, iters, tx, rx, cq),
                "{name}"
            );
            assert!(p.is_server() && p.host.is_none());
            assert_eq!(
                (p.port, p.ib_port, p.num_qps, p.conn),
                (18515, 1, 1, Conn::Rc)
            );
            assert_eq!((p.gid_index, p.inline, p.post_list), (None, None, 1));
        }
        assert!(!ok("write_lat", &[]).relaxed_ordering);
        assert!(ok("write_bw", &[]).relaxed_ordering);
        assert!(!ok("write_bw", &["--disable_pcie_relaxed"]).relaxed_ordering);
    }

    #[test]
    fn derived_rules() {
        // tx depth and rx depth clamp to the iterations; odd rx depth becomes even.
        let p = ok("send_bw", &["-n", "21"]);
        assert_eq!((p.tx_depth, p.rx_depth), (21, 22));
        assert_eq!(ok("send_bw", &["-n", "21", "-a"]).rx_depth, 21);
        // CQ moderation: 100 up to 8 KiB, 1 above (unless -Q, with a warning).
        assert_eq!(ok("write_bw", &["-s", "8192"]).cq_mod, 100);
        assert_eq!(ok("write_bw", &["-s", "8193"]).cq_mod, 1);
        let p = ok("write_bw", &["-s", "65536", "-Q", "10"]);
        assert_eq!(p.cq_mod, 10);
        assert!(p.notes[0].contains("Warning: Large message requested and CQ moderation enabled"));
        // UD keeps moderation, clamped to the tx depth; UD rx depth is min(iters, 16000).
        let p = ok("send_bw", &["-c", "UD", "-n", "20"]);
        assert_eq!((p.cq_mod, p.rx_depth), (20, 20));
        assert_eq!(ok("send_bw", &["-c", "UD", "-n", "20000"]).rx_depth, 16000);
        assert_eq!(ok("write_bw", &["-a", "-n", "5"]).cq_mod, 5);
        // A post list sets the moderation and must divide the iterations.
        let p = ok("write_bw", &["-l", "10", "-n", "100"]);
        assert_eq!((p.cq_mod, p.post_list), (10, 10));
        assert!(p.notes[0]
            .ends_with("Post List requested - CQ moderation will be the size of the post list\n"));
        assert!(err("write_bw", &["-l", "10", "-n", "105"])
            .0
            .contains("multiple"));
        // Duration mode keeps the depths.
        assert_eq!(ok("write_bw", &["-D", "3"]).tx_depth, 128);
    }

    #[test]
    fn values_suffixes_and_last_one_wins() {
        assert_eq!(ok("write_bw", &["-s", "64K"]).size, 65536);
        assert_eq!(ok("write_bw", &["-s", "1M"]).size, 1 << 20);
        assert_eq!(ok("write_bw", &["--size=4096"]).size, 4096);
        assert_eq!(ok("write_bw", &["-x", "1", "-x", "3"]).gid_index, Some(3));
        let p = ok(
            "send_bw",
            &["-d", "rxe0", "10.0.0.1", "-x", "1", "-c", "UD"],
        );
        assert_eq!(p.host.as_deref(), Some("10.0.0.1"));
        assert_eq!((p.device.as_deref(), p.conn), (Some("rxe0"), Conn::Ud));
        let p = ok("write_bw", &["-a"]);
        assert_eq!(p.sizes(MAX_ALL_SIZE).len(), 23);
        assert_eq!(
            p.sizes(1024),
            vec![2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        );
        let p = ok(
            "write_bw",
            &["--output=bandwidth", "--out_json", "--report_gbits", "-N"],
        );
        assert_eq!(p.output, Some(OutputOnly::Bandwidth));
        assert_eq!(p.out_json.as_deref(), Some("perftest_out.json"));
        assert!(p.report_gbits && p.no_peak());
        assert_eq!(
            ok("read_lat", &["--out_json_file=/tmp/x.json"])
                .out_json
                .as_deref(),
            Some("/tmp/x.json")
        );
        assert_eq!(ok("write_lat", &["-m", "1024"]).mtu, Some(1024));
        assert_eq!(ok("write_lat", &["-m", "1000"]).mtu_invalid, Some(1000));
    }

    #[test]
    fn peak_and_roles() {
        assert!(!ok("write_bw", &["h"]).no_peak());
        assert!(ok("write_bw", &["h", "-n", "20001"]).no_peak());
        assert!(ok("send_bw", &[]).no_peak(), "send_bw server");
        assert!(!ok("send_bw", &["-b"]).no_peak());
        assert!(ok("write_bw", &["h"]).sends() && !ok("write_bw", &[]).sends());
        assert!(ok("write_lat", &[]).sends() && !ok("read_lat", &[]).sends());
        assert!(ok("send_lat", &["h"]).receives() && !ok("send_bw", &["h"]).receives());
    }

    #[test]
    fn perftests_errors() {
        assert_eq!(
            err("write_bw", &["-n", "3"]).0,
            " Iteration num should be between 5 and 100000000\n Parser function exited with Error\n"
        );
        assert_eq!(
            err("send_lat", &["-q", "2"]).0,
            " Multiple QPs only available on bw tests\n Parser function exited with Error\n"
        );
        assert_eq!(
            err("send_bw", &["-x", "200"]).0,
            " Gid index should be between 0 and 64\n Parser function exited with Error\n"
        );
        assert_eq!(
            err("write_bw", &["--output=foo"]).0,
            " Invalid verbosity level output flag. Please use bandwidth, latency, message_rate\n Parser function exited with Error\n"
        );
        let (e, usage) = err("write_bw", &["--bogus"]);
        assert!(e.starts_with("rs_write_bw: "), "{e}");
        assert!(e.contains(" Invalid Command or flag.\n Please check command line and run again.\n\n Parser function exited with Error\n"));
        assert!(usage.starts_with("Usage:"));
        assert!(err("write_bw", &["-c", "UD"]).0.contains("UD"));
        assert!(err("read_bw", &["-c", "UC"]).0.contains("UC"));
        assert!(err("write_bw", &["-r", "10"]).0.contains("-r"));
        assert!(err("write_lat", &["-D", "5"]).0.contains("not supported"));
        assert!(err("write_bw", &["-s", "0"]).0.contains("Size"));
        assert!(err("write_bw", &["h", "--loopback"])
            .0
            .contains("--loopback"));
    }

    #[test]
    fn help_and_version_exit_1_on_stdout() {
        for name in [
            "send_bw",
            "send_lat",
            "write_bw",
            "write_lat",
            "read_bw",
            "read_lat",
        ] {
            let a = vec!["-h".to_string()];
            match parse(tool(name), &a) {
                Err(ParseOutcome::Print { stdout, code }) => {
                    assert_eq!(code, 1);
                    assert!(stdout.starts_with(&format!("Usage:\n  rs_{name} ")));
                    for flag in [
                        "-d,",
                        "-i,",
                        "-x,",
                        "-s,",
                        "-n,",
                        "-a,",
                        "-D,",
                        "-c,",
                        "-R,",
                        "-p,",
                        "-m,",
                        "-V,",
                        "--output=",
                        "--out_json",
                        "--out_json_file=",
                        "--loopback",
                    ] {
                        assert!(stdout.contains(flag), "{name} help lacks {flag}");
                    }
                    let bw = name.ends_with("bw");
                    for flag in ["-b,", "-t,", "-q,", "-l,", "-Q,", "-N,", "--report_gbits"] {
                        assert_eq!(stdout.contains(flag), bw, "{name} {flag}");
                    }
                    assert_eq!(
                        stdout.contains("-r,"),
                        name.starts_with("send"),
                        "{name} -r"
                    );
                    assert_eq!(
                        stdout.contains("-o,"),
                        name.starts_with("read"),
                        "{name} -o"
                    );
                    assert_eq!(
                        stdout.contains("-I,"),
                        !name.starts_with("read"),
                        "{name} -I"
                    );
                    assert_eq!(
                        stdout.contains("-e,"),
                        !name.starts_with("write"),
                        "{name} -e"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        let a = vec!["-V".to_string()];
        assert_eq!(
            parse(tool("read_bw"), &a),
            Err(ParseOutcome::Print {
                stdout: "Version: 6.06\n".into(),
                code: 1
            })
        );
    }
}
