//! `cargo xtask demo`: build the `rc_transfer` example (release), boot the soft-RoCE VM and run a
//! real RC transfer between two processes in it: a server in the background, then the client.
//! The example prints what it measured; the demo shows it and exits with its status.

use crate::vm::{self, sh_quote, VmOpts};
use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

// What the demo runs; change it here.
const PACKAGE: &str = "rsrdma";
const EXAMPLE: &str = "rc_transfer";
const SERVER_ARGS: &[&str] = &[
    "server",
    "--device",
    vm::GUEST_DEVICE,
    "--gid-index",
    vm::GUEST_GID_INDEX,
];
/// The example exchanges queue-pair endpoints over TCP, so loopback is fine. (Were it to use
/// rdma_cm, the client would have to dial `vm::GUEST_IP`: over rxe, rdma_cm cannot resolve a
/// route to 127.0.0.1 and fails with ENODEV.)
const CLIENT_ARGS: &[&str] = &[
    "client",
    "127.0.0.1",
    "--device",
    vm::GUEST_DEVICE,
    "--gid-index",
    vm::GUEST_GID_INDEX,
];
/// Seconds the server gets to start listening before the client starts.
const SERVER_HEADSTART: &str = "1";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

const USAGE: &str =
    "usage: cargo xtask demo [--no-build] [--timeout SECS] [--mem MB] [--cpus N] [--verbose]";

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    let mut opts = VmOpts {
        timeout: DEFAULT_TIMEOUT,
        ..VmOpts::default()
    };
    let mut build = true;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if vm::parse_common_opt(arg, &mut it, &mut opts)? {
            continue;
        }
        match arg.as_str() {
            // Run what target/release/examples already holds.
            "--no-build" => build = false,
            "-h" | "--help" => {
                eprintln!("{USAGE}");
                return Ok(0);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }

    // The build links libibverbs: install the development packages (and the VM's) first.
    vm::ensure_packages(vm::HOST_PACKAGES)?;
    if build {
        let args = ["build", "--release", "-p", PACKAGE, "--example", EXAMPLE];
        eprintln!("[demo] cargo {}", args.join(" "));
        let status = Command::new(vm::cargo())
            .args(args)
            .current_dir(root)
            .status()
            .context("running cargo build")?;
        if !status.success() {
            bail!("building the {EXAMPLE} example failed");
        }
    }
    let exe = vm::target_dir()?.join("release/examples").join(EXAMPLE);
    if !exe.is_file() {
        return Err(anyhow!("{} does not exist", exe.display()));
    }

    let quote_all = |args: &[&str]| {
        args.iter()
            .map(|a| sh_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let script = format!(
        r#"ex={exe}
echo {server_line}
"$ex" {server} &
server=$!
sleep {SERVER_HEADSTART}
echo {client_line}
"$ex" {client}
client_st=$?
if [ $client_st -ne 0 ]; then
    echo "[demo] the client failed (exit status $client_st); stopping the server"
    kill $server 2>/dev/null
fi
wait $server
server_st=$?
echo "[demo] server exit status $server_st, client exit status $client_st"
[ $client_st -ne 0 ] && exit $client_st
exit $server_st
"#,
        exe = sh_quote(&exe.to_string_lossy()),
        server = quote_all(SERVER_ARGS),
        client = quote_all(CLIENT_ARGS),
        server_line = sh_quote(&format!(
            "[demo] server: {EXAMPLE} {}",
            SERVER_ARGS.join(" ")
        )),
        client_line = sh_quote(&format!(
            "[demo] client: {EXAMPLE} {}",
            CLIENT_ARGS.join(" ")
        )),
    );
    vm::run_in_vm(&opts, &script)
}
