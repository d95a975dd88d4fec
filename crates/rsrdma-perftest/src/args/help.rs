//! The help text: perftest's layout (`Usage:`, then one `  -x, --long  text` line per flag,
//! then the long-only options), listing exactly the flags a tool takes.

use crate::{Kind, Tool, Verb};

/// Which tools list a flag.
#[derive(Debug, Clone, Copy)]
enum Only {
    All,
    Bw,
    Lat,
    Send,
    Reads,
    NotReads,
    NotWrite,
    Atomic,
    NotAtomic,
}

impl Only {
    fn has(self, tool: Tool) -> bool {
        match self {
            Only::All => true,
            Only::Bw => tool.kind == Kind::Bw,
            Only::Lat => tool.kind == Kind::Lat,
            Only::Send => tool.verb == Verb::Send,
            Only::Reads => tool.verb.reads(),
            Only::NotReads => !tool.verb.reads(),
            Only::NotWrite => tool.verb != Verb::Write,
            Only::Atomic => tool.verb == Verb::Atomic,
            Only::NotAtomic => tool.verb != Verb::Atomic,
        }
    }
}

/// The flags with a short form, in perftest's order. `{conns}`, `{iters}` and `{size}` stand
/// for the tool's values.
const SHORT: &[(Only, &str, &str)] = &[
    (Only::NotAtomic, "-a, --all", "Run sizes from 2 till 2^23"),
    (
        Only::Atomic,
        "-A, --atomic_type=<type>",
        "type of atomic operation from {CMP_AND_SWAP,FETCH_AND_ADD} (default FETCH_AND_ADD)",
    ),
    (
        Only::Bw,
        "-b, --bidirectional",
        "Measure bidirectional bandwidth (default unidirectional)",
    ),
    (
        Only::All,
        "-c, --connection=<{conns}>",
        "Connection type {conns} (default RC)",
    ),
    (
        Only::Lat,
        "-C, --report-cycles",
        "report times in cpu cycle units (default microseconds; here: nanoseconds)",
    ),
    (
        Only::All,
        "-d, --ib-dev=<dev>",
        "Use IB device <dev> (default first device found; auto: the active device nearest to this CPU)",
    ),
    (
        Only::All,
        "-D, --duration",
        "Run test for a customized period of seconds.",
    ),
    (
        Only::NotWrite,
        "-e, --events",
        "Sleep on CQ events (default poll)",
    ),
    (
        Only::All,
        "-f, --margin",
        "measure results within margins. (default=2sec)",
    ),
    (
        Only::All,
        "-F, --CPU-freq",
        "Accepted for compatibility (a nanosecond clock is used)",
    ),
    (Only::All, "-h, --help", "Show this help screen."),
    (
        Only::Lat,
        "-H, --report-histogram",
        "Print out all results (default print summary only)",
    ),
    (
        Only::All,
        "-i, --ib-port=<port>",
        "Use port <port> of IB device (default 1)",
    ),
    (
        Only::NotReads,
        "-I, --inline_size=<size>",
        "Max size of message to be sent in inline",
    ),
    (
        Only::Bw,
        "-l, --post_list=<list size>",
        "Post list of send WQEs of <list size> size (instead of single post)",
    ),
    (
        Only::All,
        "-m, --mtu=<mtu>",
        "MTU size : 256 - 4096 (default port mtu)",
    ),
    (
        Only::All,
        "-n, --iters=<iters>",
        "Number of exchanges (at least 5, default {iters})",
    ),
    (
        Only::Bw,
        "-N, --noPeak",
        "Cancel peak-bw calculation (default with peak up to iters=20000)",
    ),
    (
        Only::Reads,
        "-o, --outs=<num>",
        "num of outstanding read/atom(default max of device)",
    ),
    (
        Only::All,
        "-p, --port=<port>",
        "Listen on/connect to port <port> (default 18515)",
    ),
    (Only::Bw, "-q, --qp=<num of qp's>", "Num of qp's(default 1)"),
    (
        Only::Bw,
        "-Q, --cq-mod",
        "Generate Cqe only after <--cq-mod> completion",
    ),
    (
        Only::Send,
        "-r, --rx-depth=<dep>",
        "Rx queue size (default 512)",
    ),
    (
        Only::All,
        "-R, --rdma_cm",
        "Connect QPs with rdma_cm and run test on those QPs",
    ),
    (
        Only::NotAtomic,
        "-s, --size=<size>",
        "Size of message to exchange (default {size})",
    ),
    (Only::All, "-S, --sl=<sl>", "SL (default 0)"),
    (
        Only::Bw,
        "-t, --tx-depth=<dep>",
        "Size of tx queue (default 128)",
    ),
    (
        Only::All,
        "-u, --qp-timeout=<timeout>",
        "QP timeout, timeout value is 4 usec * 2 ^(timeout), default 14",
    ),
    (
        Only::Lat,
        "-U, --report-unsorted",
        "(implies -H) print out unsorted results (default sorted)",
    ),
    (Only::All, "-V, --version", "Display version number"),
    (
        Only::All,
        "-x, --gid-index=<index>",
        "Test uses GID with GID index (Default : IB - no gid . ETH - automatic)",
    ),
];

/// The long-only options, after an empty line.
const LONG: &[(Only, &str, &str)] = &[
    (Only::All, "--out_json", "Save the report in a json file"),
    (
        Only::All,
        "--out_json_file=<file>",
        "Name of the report json file. (Default: perftest_out.json in the working directory)",
    ),
    (
        Only::All,
        "--output=<units>",
        "Set verbosity output level: bandwidth , message_rate, latency",
    ),
    (
        Only::All,
        "--pkey_index=<pkey index>",
        "PKey index to use for QP",
    ),
    (
        Only::Bw,
        "--report_gbits",
        "Report Max/Average BW of test in Gbit/sec (instead of MiB/sec)",
    ),
    (
        Only::All,
        "--tclass=<value>",
        "Set the Traffic Class in GRH (if GRH is in use)",
    ),
    (
        Only::All,
        "--disable_pcie_relaxed",
        "Disable PCIe relaxed ordering",
    ),
    (
        Only::All,
        "--use_old_post_send",
        "Accepted for compatibility (ibv_post_send is the default)",
    ),
    (
        Only::All,
        "--use_new_post_send",
        "Post through the extended work-request API (ibv_wr_*; not with -R)",
    ),
    (
        Only::All,
        "--loopback",
        "Run server and client in this process on one device; print the client's output",
    ),
];

/// The help text of `tool`.
pub fn help_text(tool: Tool) -> String {
    let name = tool.binary_name();
    let conns = match tool.verb {
        Verb::Send => "RC/UC/UD",
        Verb::Write => "RC/UC",
        Verb::Read | Verb::Atomic => "RC",
    };
    let fill = |s: &str| {
        s.replace("{conns}", conns)
            .replace("{iters}", &default_iters(tool).to_string())
            .replace("{size}", &default_size(tool).to_string())
    };
    let mut s = format!(
        "Usage:\n  {name}            start a server and wait for connection\n  {name} <host>     connect to server at <host>\n  {name} --loopback run both ends on one device in this process\n\nOptions:\n"
    );
    for (_, flag, text) in SHORT.iter().filter(|(only, _, _)| only.has(tool)) {
        s.push_str(&format!("  {}  {}\n", fill(flag), fill(text)));
    }
    s.push('\n');
    for (_, flag, text) in LONG.iter().filter(|(only, _, _)| only.has(tool)) {
        s.push_str(&format!("      {flag}  {text}\n"));
    }
    s.push_str("\n Environment: RSRDMA_PROBE=1 adds a line splitting the send loop's time into posting and polling (bw tests).\n");
    s
}

/// `-s`'s default: 64 KiB for bandwidth, 2 bytes for latency, 8 for the atomics.
pub(super) fn default_size(tool: Tool) -> u64 {
    if tool.verb == Verb::Atomic {
        return super::rules::ATOMIC_SIZE;
    }
    match tool.kind {
        Kind::Bw => 65536,
        Kind::Lat => 2,
    }
}

/// `-n`'s default: 5000 for write_bw, else 1000.
pub(super) fn default_iters(tool: Tool) -> u64 {
    if tool.verb == Verb::Write && tool.kind == Kind::Bw {
        5000
    } else {
        1000
    }
}
