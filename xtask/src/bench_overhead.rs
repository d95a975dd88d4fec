//! `cargo xtask bench overhead`: what the Rust layer adds per work request, against the same
//! calls made from C, both on a do-nothing provider (no RDMA needed, any machine). It builds
//! rsrdma's `post_overhead` example in release mode with the `bench-support` feature and runs
//! it; the example prints the table (ns/WR side by side, and instructions/WR: from the CPU's
//! counters, or counted by valgrind's callgrind where there are none) and says whether the
//! target (at most 2 ns/WR added, in each main row) is met.

use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        eprintln!("usage: cargo xtask bench overhead [--rounds N] [--wrs N] [--no-callgrind]");
        return Ok(0);
    }
    let status = Command::new(crate::vm::cargo())
        .current_dir(root)
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "rsrdma",
            "--features",
            "bench-support",
            "--example",
            "post_overhead",
            "--",
        ])
        .args(args)
        .status()
        .context("running cargo for the post_overhead example")?;
    Ok(status.code().unwrap_or(1))
}
