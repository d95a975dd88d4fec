//! perftest-compatible RDMA benchmarks on rsrdma: `rs_send_bw`, `rs_send_lat`, `rs_write_bw`,
//! `rs_write_lat`, `rs_read_bw`, `rs_read_lat`, `rs_atomic_bw`, `rs_atomic_lat`.
//!
//! The tools speak Debian 12 perftest's (version 6.06) exchange, over TCP or with `-R` over
//! rdma_cm, so each end works against an `ib_*` peer, and print the same header, tables and exit codes (see
//! `docs/perftest-protocol.md` in the workspace and this crate's README).
//!
//! The library is the engine: [`args::parse`] turns a command line into [`args::Params`];
//! [`run_connected`] runs one end (server or client) against a connected [`oob::Oob`] and
//! writes perftest's output to an [`out::Out`]; [`main`] is what the binaries call.
//!
//! Dependencies point one way, from the entry point down to the pure modules:
//!
//! - [`engine`]: the entry point: parse, open the device, connect, run one end or both.
//! - [`session`]: one end over a TCP connection, step by step; it uses
//!   - [`setup`] (version, page/cache-line and MTU exchanges), [`gid`] (the GID),
//!     [`resources`] (PD, MR, CQs, QPs), [`handshake`] (the DEST exchanges),
//!     [`connect`] (QP bring-up with `Qp::connect`), [`flow`] (the test phase per size) and
//!     [`results`] (the REPORT exchange and printed lines);
//!   - [`datapath`]: the busy loops, on [`resources`] and [`handshake`] only.
//! - [`cmlink`] (the exchange over an rdma_cm QP) and [`cmqps`] (data QPs connected by
//!   rdma_cm): `-R`.
//! - [`atomic_total`]: the rs-only check of what the peer's atomics added.
//! - [`device`]: the device, the port, and the rules that depend on them.
//! - [`wire`]: the exchanged messages (pure). [`stats`]: bandwidth and latency arithmetic
//!   (pure). [`report`]: perftest's text (pure). [`oob`]: the TCP connection with time limits.
//!   [`watch`]: clock, stall watchdog, probe. [`out`]: where text goes.

pub mod args;
pub mod atomic_total;
pub mod cmlink;
pub mod cmqps;
pub mod connect;
pub mod datapath;
pub mod device;
pub mod engine;
pub mod error;
pub mod flow;
pub mod gid;
pub mod handshake;
pub mod oob;
pub mod out;
pub mod rdmanet;
pub mod report;
pub mod resources;
pub mod results;
pub mod session;
pub mod setup;
pub mod stats;
pub mod watch;
pub mod wire;

pub use engine::main;
pub use error::{Error, Result};
pub use session::run_connected;

/// The operation a tool measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// SEND/RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// RDMA atomics (fetch-and-add or compare-and-swap, `-A`) on 8 bytes.
    Atomic,
}

impl Verb {
    /// READ and the atomics: one-sided requests that bring data back, limited by the
    /// peer's outstanding-read depth; the server is passive.
    pub fn reads(self) -> bool {
        matches!(self, Verb::Read | Verb::Atomic)
    }
}

/// Bandwidth or latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Bandwidth (`*_bw`).
    Bw,
    /// Latency (`*_lat`).
    Lat,
}

/// One of the eight tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tool {
    /// What it measures.
    pub verb: Verb,
    /// Bandwidth or latency.
    pub kind: Kind,
}

impl Tool {
    /// The tool for `verb` and `kind`.
    pub const fn new(verb: Verb, kind: Kind) -> Tool {
        Tool { verb, kind }
    }

    /// perftest's name without prefix, e.g. `write_bw`.
    pub fn name(self) -> &'static str {
        match (self.verb, self.kind) {
            (Verb::Send, Kind::Bw) => "send_bw",
            (Verb::Send, Kind::Lat) => "send_lat",
            (Verb::Write, Kind::Bw) => "write_bw",
            (Verb::Write, Kind::Lat) => "write_lat",
            (Verb::Read, Kind::Bw) => "read_bw",
            (Verb::Read, Kind::Lat) => "read_lat",
            (Verb::Atomic, Kind::Bw) => "atomic_bw",
            (Verb::Atomic, Kind::Lat) => "atomic_lat",
        }
    }

    /// The binary's name, e.g. `rs_write_bw`.
    pub fn binary_name(self) -> String {
        format!("rs_{}", self.name())
    }
}
