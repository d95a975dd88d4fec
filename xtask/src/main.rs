//! The project's commands: `cargo xtask <command>`.
//!
//! - `regen-bindings`: regenerate rsrdma-sys's committed bindings (needs libclang).
//! - `vm -- <command…>`: boot a throwaway VM with soft-RoCE (rxe0) and run the command in it.
//! - `test`: every test: fmt, clippy, unit tests, then the RDMA tests inside the VM.
//! - `examples`: build every example and run each in the VM (server and clients), checking
//!   its output: one `example NAME ok|FAILED` line each.
//! - `demo`: build, boot the VM, run a real RC transfer between two processes, print what it measured.
//! - `bench perftest`: ours against C perftest side by side (A B A B …), medians and ratios.
//! - `bench rdmanet`: rsrdma-net's Conn against RawConn and rs_send_lat (A B A B …), medians,
//!   ratios and targets; registered memory and CPU per GB.
//! - `bench overhead`: rsrdma's post path against C on a do-nothing provider (no RDMA needed).
//! - `bench soft`: the software device soft0 against UCX, libfabric and kernel TCP on this
//!   host (no RDMA, no VM needed).
//! - `docs`: build the user guide (docs/guide, mdBook) and check every link in it.

mod bench;
mod bench_overhead;
mod bench_rdmanet;
mod bench_soft;
mod build;
mod demo;
mod docs;
mod examples;
mod no_rdma_core;
mod regen;
mod soft_tests;
mod svg;
mod test;
mod vm;

use anyhow::{bail, Result};
use std::path::PathBuf;

fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    match args.first().map(String::as_str) {
        Some("regen-bindings") => regen::run(&root),
        Some("vm") => std::process::exit(vm::main(&args[1..])?),
        Some("test") => std::process::exit(test::main(&root, &args[1..])?),
        Some("examples") => std::process::exit(examples::main(&root, &args[1..])?),
        Some("demo") => std::process::exit(demo::main(&root, &args[1..])?),
        Some("bench") => std::process::exit(bench::main(&root, &args[1..])?),
        Some("docs") => std::process::exit(docs::main(&root, &args[1..])?),
        _ => {
            eprintln!(
                "usage: cargo xtask <regen-bindings|vm|test|examples|demo|docs|bench perftest|rdmanet|overhead|soft>"
            );
            bail!("unknown command")
        }
    }
}
