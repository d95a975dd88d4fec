//! The help text: perftest's layout, listing every flag a tool takes.

use crate::{Kind, Tool, Verb};

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

pub(super) fn default_size(tool: Tool) -> u64 {
    match tool.kind {
        Kind::Bw => 65536,
        Kind::Lat => 2,
    }
}

pub(super) fn default_iters(tool: Tool) -> u64 {
    if tool.verb == Verb::Write && tool.kind == Kind::Bw {
        5000
    } else {
        1000
    }
}
