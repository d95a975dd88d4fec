//! What a run is configured with: [`Params`] and the option enums.

use crate::{Kind, Tool, Verb};

/// Transport type (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Conn {
    /// Reliable connected.
    #[value(name = "RC")]
    Rc,
    /// Unreliable connected.
    #[value(name = "UC")]
    Uc,
    /// Unreliable datagram (send tools only).
    #[value(name = "UD")]
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

    /// Whether `verb`'s tools run over this transport: UD carries only SEND, UC no READ.
    pub fn carries(self, verb: Verb) -> bool {
        match self {
            Conn::Rc => true,
            Conn::Uc => matches!(verb, Verb::Send | Verb::Write),
            Conn::Ud => verb == Verb::Send,
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

/// `-A`: the atomic operation of the atomic tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicType {
    /// Compare-and-swap (compare 0, swap 0, as perftest posts it).
    CmpAndSwap,
    /// Fetch-and-add of 1 (perftest's default).
    FetchAndAdd,
}

impl AtomicType {
    /// perftest's name, as `-A` takes it and the title shows it.
    pub fn name(self) -> &'static str {
        match self {
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
        }
    }

    /// The `-A` value, if it is one of perftest's names.
    pub fn from_name(s: &str) -> Option<AtomicType> {
        [AtomicType::CmpAndSwap, AtomicType::FetchAndAdd]
            .into_iter()
            .find(|t| t.name() == s)
    }
}

/// `--output=`: print only one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputOnly {
    /// Average bandwidth.
    #[value(name = "bandwidth")]
    Bandwidth,
    /// Message rate.
    #[value(name = "message_rate")]
    MessageRate,
    /// Average latency.
    #[value(name = "latency")]
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
    /// `-A` (atomic tools).
    pub atomic_type: AtomicType,
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
    /// `--use_new_post_send`: QPs made by `ibv_create_qp_ex`, requests posted through
    /// `ibv_wr_*` batches (rsrdma's `Qp::wr_batch`).
    pub new_post_send: bool,
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
            Kind::Lat => !(self.tool.verb.reads() && self.is_server()),
            Kind::Bw => !self.is_server() || self.bidir,
        }
    }

    /// Whether this side posts receives.
    pub fn receives(&self) -> bool {
        self.tool.verb == Verb::Send
            && (self.is_server() || self.bidir || self.tool.kind == Kind::Lat)
    }
}
