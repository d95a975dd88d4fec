//! `cargo xtask vm`: a throwaway QEMU (TCG) virtual machine with a real soft-RoCE device, for
//! machines whose kernel has no RDMA (see docs/vm.md and the rxe VM recipe it follows).
//!
//! The guest has no root file system of its own: the host's `/` is shared read-only over
//! virtio-9p and the guest chroots into it, so every host binary, library and build output is
//! there unchanged. A tiny initramfs (busybox + the kernel modules) loads the modules and mounts
//! it, plus a small read-write control share; the per-run work is done by two shell scripts the
//! host writes into that share (see `stages.rs`). The working directory and the target directory
//! get shares of their own when the guest's tmpfs mounts would hide them (a checkout under
//! `/tmp`). Inside the guest: `rxe0` on `veth0`, address 10.77.0.1/24, GID index 1 = its RoCE v2
//! IPv4 GID. The guest has no network card: nothing it sends leaves it.
//!
//! The steps, one file each: `packages` (host packages), `kernel` (the Debian kernel package,
//! `vmlinux`), `initramfs` (busybox and the modules), `shares` (which host directories the guest
//! mounts where), `stages` (the guest's setup scripts), `qemu` (the command line and the run),
//! `console` (the guest's serial console and the exit status), `lock`.

mod console;
mod initramfs;
mod kernel;
mod lock;
mod packages;
mod qemu;
mod shares;
mod stages;

pub use packages::{ensure_packages, HOST_PACKAGES};

use anyhow::{anyhow, bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The fixed guest topology, also documented in docs/vm.md.
pub const GUEST_DEVICE: &str = "rxe0";
pub const GUEST_GID_INDEX: &str = "1";
pub const GUEST_IP: &str = "10.77.0.1";
/// A second device on a second link, for striped connections over two NICs (its link is
/// taken down by the test of a rail's failover).
pub const GUEST_DEVICE2: &str = "rxe1";
pub const GUEST_IP2: &str = "10.78.0.1";
pub const GUEST_NETDEV2: &str = "veth2";

/// Exit status reported when the time limit kills the VM (as `timeout(1)` does).
pub const TIMEOUT_STATUS: i32 = 124;

/// 9p message size: larger than the default makes reading big test binaries faster.
const MSIZE: u32 = 512 * 1024;

#[derive(Clone, Debug)]
pub struct VmOpts {
    /// Wall-clock limit for the whole VM run (boot included).
    pub timeout: Duration,
    pub mem_mb: u32,
    pub cpus: u32,
    /// Show the guest's boot (firmware, kernel, init) on stderr as it happens.
    pub verbose: bool,
}

impl Default for VmOpts {
    fn default() -> Self {
        VmOpts {
            timeout: Duration::from_secs(900),
            mem_mb: 2048,
            cpus: 2,
            verbose: false,
        }
    }
}

/// What a VM run produced.
#[derive(Debug)]
pub struct VmRun {
    /// The script's exit status; [`TIMEOUT_STATUS`] when the time limit killed the VM.
    pub status: i32,
    pub timed_out: bool,
    /// Everything the script printed (stdout and stderr, as the console saw them).
    pub output: String,
    /// From starting qemu to the guest being ready to run the script.
    pub boot: Duration,
    /// From starting qemu to qemu exiting.
    pub total: Duration,
}

/// `cargo xtask vm [--timeout SECS] [--mem MB] [--cpus N] -- <command> [args…]`.
/// Returns the command's exit status.
pub fn main(args: &[String]) -> Result<i32> {
    let mut opts = VmOpts::default();
    let mut it = args.iter();
    let mut command: Vec<String> = Vec::new();
    while let Some(arg) = it.next() {
        if parse_common_opt(arg, &mut it, &mut opts)? {
            continue;
        }
        match arg.as_str() {
            "--" => {}
            "-h" | "--help" => {
                eprintln!("{VM_USAGE}");
                return Ok(0);
            }
            a if a.starts_with('-') => bail!("unknown option {arg:?}\n{VM_USAGE}"),
            _ => command.push(arg.clone()),
        }
        // Everything after `--` or the first word is the command.
        command.extend(it.by_ref().cloned());
    }
    if command.is_empty() {
        bail!("no command given\n{VM_USAGE}");
    }
    let script = command
        .iter()
        .map(|a| sh_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    run_in_vm(&opts, &script)
}

const VM_USAGE: &str =
    "usage: cargo xtask vm [--timeout SECS] [--mem MB] [--cpus N] [--verbose] -- <command> [args...]";

/// Parses `--timeout`, `--mem`, `--cpus` (also as `--opt=value`) and `--verbose` into `opts`; returns whether
/// `arg` was one of them. Shared by the commands that boot the VM.
pub fn parse_common_opt<'a>(
    arg: &str,
    rest: &mut impl Iterator<Item = &'a String>,
    opts: &mut VmOpts,
) -> Result<bool> {
    if arg == "-v" || arg == "--verbose" {
        opts.verbose = true;
        return Ok(true);
    }
    let (name, inline) = match arg.split_once('=') {
        Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
        _ => (arg, None),
    };
    if !matches!(name, "--timeout" | "--mem" | "--cpus") {
        return Ok(false);
    }
    let value = match inline {
        Some(v) => v,
        None => rest
            .next()
            .cloned()
            .ok_or_else(|| anyhow!("{name} needs a value"))?,
    };
    let number: u64 = value
        .parse()
        .with_context(|| format!("{name} {value:?}: not a number"))?;
    if number == 0 {
        bail!("{name} must be positive");
    }
    match name {
        "--timeout" => opts.timeout = Duration::from_secs(number),
        "--mem" => opts.mem_mb = u32::try_from(number)?,
        _ => opts.cpus = u32::try_from(number)?,
    }
    Ok(true)
}

/// Runs `script` (a POSIX shell snippet, run by `/bin/sh -c` in the host's current directory)
/// inside a fresh VM; its output streams to stdout. Returns its exit status, or
/// [`TIMEOUT_STATUS`] if the time limit killed the VM (after saying so on stderr).
pub fn run_in_vm(opts: &VmOpts, script: &str) -> Result<i32> {
    Ok(run_in_vm_captured(opts, script)?.status)
}

/// Like [`run_in_vm`], and also returns what the script printed.
pub fn run_in_vm_captured(opts: &VmOpts, script: &str) -> Result<VmRun> {
    ensure_packages(HOST_PACKAGES)?;
    let target = target_dir()?;
    let vm_dir = target.join("vm");
    fs::create_dir_all(&vm_dir).with_context(|| format!("creating {}", vm_dir.display()))?;
    let _lock = lock::lock(&vm_dir.join("lock"))?;
    let kernel = kernel::prepare_kernel(&vm_dir)?;
    let cwd = std::env::current_dir()?;
    let shares = shares::guest_shares(&cwd, &target)?;
    let run = RunDirs::create(&target, &vm_dir)?;
    let markers = console::Markers::new();
    fs::write(
        run.ctl.join("stage1.sh"),
        stages::stage1(&run.out, &shares, opts.verbose),
    )?;
    fs::write(
        run.ctl.join("stage2.sh"),
        stages::stage2(script, &cwd, &markers, opts.verbose),
    )?;
    let vm = qemu::Vm {
        kernel: &kernel,
        ctl_dir: &run.ctl,
        out_dir: &run.out,
        shares: &shares,
    };
    let result = qemu::boot(opts, &vm, &markers);
    let status_file = fs::read_to_string(run.ctl.join("status")).unwrap_or_default();
    let _ = fs::remove_dir_all(&run.ctl);
    console::finish(opts, result?, &status_file)
}

/// The per-run directories on the host.
struct RunDirs {
    /// The writable share, `target/vm-out`, emptied at the start of every run.
    out: PathBuf,
    /// The control share: the per-run stages in, the exit status out.
    ctl: PathBuf,
}

impl RunDirs {
    fn create(target: &Path, vm_dir: &Path) -> Result<RunDirs> {
        let dirs = RunDirs {
            out: target.join("vm-out"),
            ctl: vm_dir.join(format!("run-{}", std::process::id())),
        };
        for dir in [&dirs.out, &dirs.ctl] {
            if dir.exists() {
                fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
            }
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        Ok(dirs)
    }
}

/// The build's target directory (as cargo reports it).
pub fn target_dir() -> Result<PathBuf> {
    Ok(PathBuf::from(
        cargo_metadata()?["target_directory"]
            .as_str()
            .ok_or_else(|| anyhow!("cargo metadata: no target_directory"))?,
    ))
}

/// `cargo metadata --no-deps`, parsed.
pub fn cargo_metadata() -> Result<serde_json::Value> {
    let out = Command::new(cargo())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed");
    }
    serde_json::from_slice(&out.stdout).context("parsing cargo metadata")
}

/// The cargo that runs us, or `cargo` from PATH.
pub fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Single-quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn say(msg: impl AsRef<str>) {
    eprintln!("[vm] {}", msg.as_ref());
}

/// Runs `cmd`, failing unless it exits successfully.
fn run_ok(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn common_options_parse_both_forms() {
        let mut opts = VmOpts::default();
        let rest = ["30".to_string()];
        let mut it = rest.iter();
        assert!(parse_common_opt("--timeout", &mut it, &mut opts).unwrap());
        assert!(parse_common_opt("--mem=512", &mut it, &mut opts).unwrap());
        assert!(!parse_common_opt("--filter", &mut it, &mut opts).unwrap());
        assert!(parse_common_opt("--cpus=0", &mut it, &mut opts).is_err());
        assert_eq!(opts.timeout, Duration::from_secs(30));
        assert_eq!(opts.mem_mb, 512);
    }
}
