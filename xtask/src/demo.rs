//! `cargo xtask demo`: build the `rc_transfer` example (release), boot the soft-RoCE VM and run a
//! real RC transfer between two processes in it: a server in the background, then the client.
//! The example prints what it measured; the demo shows it and exits with its status.
//!
//! `cargo xtask demo --soft` runs the same two processes on this machine over the software
//! device `soft0` instead: no VM, no root, no RDMA hardware (soft0 carries the packets between
//! the two processes through shared-memory rings; see the guide's software-device chapter).

use crate::vm::{self, sh_quote, VmOpts};
use anyhow::{anyhow, bail, Context, Result};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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

const USAGE: &str = "usage: cargo xtask demo [--soft] [--no-build] [--timeout SECS] [--mem MB] \
                     [--cpus N] [--verbose]";

/// The software device the `--soft` demo uses.
const SOFT_DEVICE: &str = "soft0";

pub fn main(root: &Path, args: &[String]) -> Result<i32> {
    let mut opts = VmOpts {
        timeout: DEFAULT_TIMEOUT,
        ..VmOpts::default()
    };
    let mut build = true;
    let mut soft = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if vm::parse_common_opt(arg, &mut it, &mut opts)? {
            continue;
        }
        match arg.as_str() {
            // Run what target/release/examples already holds.
            "--no-build" => build = false,
            // On this machine over soft0: no VM, no root.
            "--soft" => soft = true,
            "-h" | "--help" => {
                eprintln!("{USAGE}");
                return Ok(0);
            }
            _ => bail!("unknown argument {arg:?}\n{USAGE}"),
        }
    }

    // On soft0 nothing is needed (rsrdma loads rdma-core only where it is installed); the VM
    // needs its packages (and rdma-core's user space, which the guest runs from the host).
    if !soft {
        vm::ensure_packages(vm::HOST_PACKAGES)?;
    }
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
    if soft {
        return run_on_soft(&exe, opts.timeout);
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

/// Runs the example's server and client as two processes of this machine over `soft0`, with the
/// demo's timeout over both; returns the client's status, or the server's if the client passed.
fn run_on_soft(exe: &Path, timeout: Duration) -> Result<i32> {
    // A port the system just had free, not the example's fixed one: two demos (or a demo
    // and anything else at that port) on one machine do not meet.
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .context("finding a free port for the demo")?
        .port()
        .to_string();
    let common = ["--device", SOFT_DEVICE, "--port", &port];
    let deadline = Instant::now() + timeout;
    eprintln!("[demo] server: {EXAMPLE} server {}", common.join(" "));
    let mut server = Command::new(exe)
        .arg("server")
        .args(common)
        .spawn()
        .context("starting the server")?;
    std::thread::sleep(Duration::from_secs(SERVER_HEADSTART.parse()?));
    eprintln!(
        "[demo] client: {EXAMPLE} client 127.0.0.1 {}",
        common.join(" ")
    );
    let mut client = Command::new(exe)
        .args(["client", "127.0.0.1"])
        .args(common)
        .spawn()
        .context("starting the client")?;
    let client_st = wait_until(&mut client, deadline, "client")?;
    if client_st != 0 {
        eprintln!("[demo] the client failed (exit status {client_st}); stopping the server");
        let _ = server.kill();
    }
    let server_st = wait_until(&mut server, deadline, "server")?;
    eprintln!("[demo] server exit status {server_st}, client exit status {client_st}");
    Ok(if client_st != 0 { client_st } else { server_st })
}

/// Waits for `child` until `deadline`; kills it and fails past it. A child killed by a signal
/// counts as status 128 + the signal, as a shell says.
fn wait_until(child: &mut Child, deadline: Instant, what: &str) -> Result<i32> {
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the {what} did not finish within the demo's timeout");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
