//! `rs_rdmanet_bw` and `rs_rdmanet_lat`: gordma's `go_rdmanet_bw`/`go_rdmanet_lat` on
//! rsrdma-net's [`rsrdma_net::Conn`] (and, with `--raw`, [`rsrdma_net::RawConn`]).
//!
//! Without a host the tool is the server: it serves one client, prints what it received and
//! exits 0 when that client is done (gordma's raw server never ends; this one does). With
//! `HOST[:PORT]` it is the client and prints gordma's result line. Either side exits 1 with a
//! message on stderr when the peer dies: `Conn`'s keepalive (or rdma_cm, or the TCP channel)
//! notices within 5 s, `RawConn`'s pipelines through their stall watch.
//!
//! With `--json`, stdout is one JSON object with the results ([`text::Json`]; its fields are
//! in `--help`) and the other lines go to stderr.
//!
//! - [`args`]: the flags (pure). [`text`]: the printed lines (pure).
//! - [`net`]: `Conn` options, connecting, errors. [`conn_bw`]: the `Conn` bandwidth ends;
//!   [`lat`]: the ping-pong ends; [`raw`]: the `RawConn` bandwidth ends (perftest's header
//!   and table from [`crate::report`]). [`cpu`]: the CPU time a transfer took.
//! - [`zerocopy`]: `--zero-copy` (registered buffers), the rendezvous threshold and
//!   `--shared-recv`.

pub mod args;
pub mod conn_bw;
pub mod cpu;
pub mod lat;
pub mod net;
pub mod rails;
pub mod raw;
pub mod text;
pub mod zerocopy;

use crate::error::Result;
use crate::out::Out;
use std::io::Write;
use text::Json;

/// `rs_rdmanet_bw`'s main: parse, run one end, print errors, return the exit code.
pub fn main_bw() -> i32 {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match args::parse_bw(&argv) {
        Ok(a) => finish(with_stdout(a.common.json, |o| run_bw(&a, o))),
        Err(e) => clap_exit(&e),
    }
}

/// `rs_rdmanet_lat`'s main.
pub fn main_lat() -> i32 {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match args::parse_lat(&argv) {
        Ok(a) => finish(with_stdout(a.common.json, |o| run_lat(&a, o))),
        Err(e) => clap_exit(&e),
    }
}

/// Runs the end of `rs_rdmanet_bw` that `a` names; returns its results for `--json`.
///
/// # Errors
/// What ended the run.
pub fn run_bw(a: &args::BwArgs, o: &mut Out<'_>) -> Result<Json> {
    match (&a.raw, &a.common.target) {
        (Some(r), Some(t)) => raw::client(a, r, t, o),
        (Some(r), None) => raw::server(a, r, o),
        (None, Some(t)) if a.rails.is_some() => rails::client(a, t, o),
        (None, None) if a.rails.is_some() => rails::server(a, o),
        (None, Some(t)) => conn_bw::client(a, t, o),
        (None, None) => conn_bw::server(a, o),
    }
}

/// Runs the end of `rs_rdmanet_lat` that `a` names; returns its results for `--json`.
///
/// # Errors
/// What ended the run.
pub fn run_lat(a: &args::LatArgs, o: &mut Out<'_>) -> Result<Json> {
    match &a.common.target {
        Some(t) => lat::client(a, t, o),
        None => lat::server(a, o),
    }
}

/// Runs with the text on stdout; with `json`, the text goes to stderr and stdout gets the
/// results' one JSON object.
fn with_stdout(json: bool, run: impl FnOnce(&mut Out<'_>) -> Result<Json>) -> Result<()> {
    let r = if json {
        let stderr = std::io::stderr();
        let mut lock = stderr.lock();
        let r = run(&mut Out::new(&mut lock, false));
        let _ = lock.flush();
        r
    } else {
        let stdout = std::io::stdout();
        let mut lock = stdout.lock();
        let r = run(&mut Out::new(&mut lock, false));
        let _ = lock.flush();
        r
    };
    let j = r?;
    if json {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(j.render().as_bytes());
        let _ = out.flush();
    }
    Ok(())
}

fn finish(r: Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn clap_exit(e: &clap::Error) -> i32 {
    let _ = e.print();
    e.exit_code()
}
