//! `cargo xtask vm`: a throwaway QEMU (TCG) virtual machine with a real soft-RoCE device, for
//! machines whose kernel has no RDMA (see docs/vm.md and the rxe VM recipe it follows).
//!
//! The guest has no root file system of its own: the host's `/` is shared read-only over
//! virtio-9p and the guest chroots into it, so every host binary, library and build output is
//! there unchanged. A tiny initramfs (busybox + the kernel modules) loads the modules and mounts
//! it, plus a small read-write control share; the per-run work is done by two shell scripts the
//! host writes into that share: stage 1 (busybox, before the chroot: the guest's own /proc, /sys,
//! /dev, tmpfs mounts and the writable share) and stage 2 (the host's /bin/sh, in the chroot:
//! veth0/veth1, rxe0, then the command, whose exit status is written back to the share).
//! Inside the guest: `rxe0` on `veth0`, address 10.77.0.1/24, GID index 1 = its RoCE v2 IPv4 GID.
//! The guest has no network card: nothing it sends leaves it.
//!
//! The guest kernel is Debian's own `linux-image-*-amd64` package, downloaded once with
//! `apt-get download` and cached under `target/vm/<package>/` together with the initramfs.

use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsStr;
use std::fs;
use std::io::{IsTerminal, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Host packages the VM needs (qemu and the initramfs tools, plus the RDMA user space that the
/// guest runs from the shared host root).
pub const HOST_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "libibverbs-dev",
    "librdmacm-dev",
    "ibverbs-providers",
    "rdma-core",
    "ibverbs-utils",
    "perftest",
    "iproute2",
    "xz-utils",
];

/// Modules loaded by the initramfs, in this order (their dependencies from `modules.dep` are
/// loaded first where missing). `crc32_generic` is not a link-time dependency of anything, but
/// without it `rdma link add … type rxe` fails with ENOENT. `rdma_ucm` is rdma_cm's user-space
/// interface (`/dev/infiniband/rdma_cm`); without it librdmacm fails with ENOENT.
const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "9pnet",
    "9pnet_virtio",
    "netfs",
    "fscache",
    "9p",
    "crc32_generic",
    "ib_core",
    "ib_uverbs",
    "rdma_cm",
    "rdma_ucm",
    "udp_tunnel",
    "ip6_udp_tunnel",
    "rdma_rxe",
    "veth",
];

/// The fixed guest topology, also documented in docs/vm.md.
pub const GUEST_DEVICE: &str = "rxe0";
pub const GUEST_GID_INDEX: &str = "1";
pub const GUEST_IP: &str = "10.77.0.1";

/// Host environment variables passed into the guest command (plus every `RSRDMA_*`).
const PASSED_ENV: &[&str] = &["RUST_BACKTRACE", "RUST_LOG", "RUST_TEST_THREADS"];

/// Mount point of the control share inside the guest (on the guest's tmpfs `/tmp`).
const GUEST_CTL: &str = "/tmp/.xtask-vm";
/// 9p message size: larger than the default makes reading big test binaries faster.
const MSIZE: u32 = 512 * 1024;
/// How long the guest waits for rxe0's port to become ACTIVE, in tenths of a second.
const ACTIVE_WAIT_TENTHS: u32 = 200;

const QUIET_CMDLINE: &str = "console=ttyS0 quiet loglevel=1 panic=-1";
const VERBOSE_CMDLINE: &str = "console=ttyS0 loglevel=7 printk.time=1 panic=-1";

/// Exit status reported when the time limit kills the VM (as `timeout(1)` does).
pub const TIMEOUT_STATUS: i32 = 124;

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
    let _lock = lock(&vm_dir.join("lock"))?;
    let kernel = prepare_kernel(&vm_dir)?;

    // The writable share, emptied at the start of every run.
    let out_dir = target.join("vm-out");
    if out_dir.exists() {
        fs::remove_dir_all(&out_dir).with_context(|| format!("emptying {}", out_dir.display()))?;
    }
    fs::create_dir_all(&out_dir)?;

    // The control share: the per-run stages in, the exit status out.
    let ctl_dir = vm_dir.join(format!("run-{}", std::process::id()));
    if ctl_dir.exists() {
        fs::remove_dir_all(&ctl_dir)?;
    }
    fs::create_dir_all(&ctl_dir)?;
    let cwd = std::env::current_dir()?;
    let nonce = format!("{:x}-{:x}", std::process::id(), now_nanos());
    let markers = Markers {
        begin: format!("@@xtask-vm-{nonce}:begin@@"),
        end: format!("@@xtask-vm-{nonce}:end@@"),
    };
    fs::write(ctl_dir.join("stage1.sh"), stage1(&out_dir, opts.verbose))?;
    fs::write(
        ctl_dir.join("stage2.sh"),
        stage2(script, &cwd, &markers, opts.verbose),
    )?;

    let result = boot(opts, &kernel, &ctl_dir, &out_dir, &markers);
    let status_file = fs::read_to_string(ctl_dir.join("status")).unwrap_or_default();
    let _ = fs::remove_dir_all(&ctl_dir);
    let mut run = result?;

    if run.timed_out {
        eprintln!(
            "[vm] TIMEOUT: killed the VM after {} s (limit --timeout {}); exit status {TIMEOUT_STATUS}",
            run.total.as_secs(),
            opts.timeout.as_secs()
        );
        return Ok(run);
    }
    match status_file.trim() {
        s if s.starts_with("setup-failed") => {
            bail!(
                "the VM started but its setup failed: {} (guest console above)",
                s.trim_start_matches("setup-failed").trim()
            )
        }
        "" => bail!(
            "the VM exited without reporting the command's exit status after {:.1} s (guest crash, \
             kernel panic or out of memory?)",
            run.total.as_secs_f64()
        ),
        s => {
            run.status = s
                .parse()
                .with_context(|| format!("bad status {s:?} from the guest"))?;
        }
    }
    eprintln!(
        "[vm] exit status {} (boot {:.1} s, total {:.1} s)",
        run.status,
        run.boot.as_secs_f64(),
        run.total.as_secs_f64()
    );
    Ok(run)
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
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

// ---------------------------------------------------------------------------------------------
// Host packages

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Installs the Debian packages in `pkgs` that are missing (as root), or fails with the exact
/// apt-get line to run.
pub fn ensure_packages(pkgs: &[&str]) -> Result<()> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\n"])
        .args(pkgs)
        .stderr(Stdio::null())
        .output()
        .context("running dpkg-query (is this a Debian system?)")?;
    let listing = String::from_utf8_lossy(&out.stdout);
    let installed: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_once(' '))
        // db:Status-Abbrev is "<wanted><state><error>"; state `i` is installed.
        .filter(|(_, status)| status.as_bytes().get(1) == Some(&b'i'))
        .map(|(name, _)| name.split(':').next().unwrap_or(name))
        .collect();
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| !installed.contains(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let line = format!(
        "apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !is_root() {
        bail!(
            "missing host packages: {}; install them with:\n    sudo apt-get update && sudo {line}",
            missing.join(" ")
        );
    }
    say(format!(
        "installing missing host packages: {}",
        missing.join(" ")
    ));
    apt_get(&["update"])?;
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(&missing);
    apt_get(&args)
}

fn apt_get(args: &[&str]) -> Result<()> {
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(std::io::stderr())
        .status()
        .context("running apt-get")?;
    if !status.success() {
        bail!("apt-get {} failed ({status})", args.join(" "));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Guest kernel and initramfs

struct Kernel {
    /// The uncompressed `vmlinux` (booted directly through its PVH entry: no firmware boot
    /// loader, no decompression, about 5 s faster under TCG), else the package's `vmlinuz`.
    image: PathBuf,
    initrd: PathBuf,
}

/// The exact kernel package behind Debian's `linux-image-amd64` meta package.
fn kernel_package_name() -> Option<String> {
    let out = Command::new("apt-cache")
        .args(["depends", "linux-image-amd64"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().trim_start_matches('|').strip_prefix("Depends:"))
        .map(|d| d.trim().trim_matches(|c| c == '<' || c == '>').to_string())
        .find(|d| d.starts_with("linux-image-") && d != "linux-image-amd64")
}

fn resolve_kernel_package(vm_dir: &Path) -> Result<String> {
    if let Some(name) = kernel_package_name() {
        return Ok(name);
    }
    if is_root() {
        say("apt-cache does not know linux-image-amd64; running apt-get update");
        apt_get(&["update"])?;
        if let Some(name) = kernel_package_name() {
            return Ok(name);
        }
    }
    // Offline and unknown to apt: fall back to a kernel prepared earlier.
    let mut cached: Vec<String> = fs::read_dir(vm_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("kernel.ok").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    cached.sort();
    match cached.pop() {
        Some(name) => {
            say(format!("apt-cache cannot resolve linux-image-amd64; using the cached {name}"));
            Ok(name)
        }
        None => bail!("cannot find the kernel package: `apt-cache depends linux-image-amd64` names none (run apt-get update)"),
    }
}

fn prepare_kernel(vm_dir: &Path) -> Result<Kernel> {
    let pkg = resolve_kernel_package(vm_dir)?;
    let dir = vm_dir.join(&pkg);
    let modules_dir = dir.join("modules");
    // Bump the leading version when the cache's layout changes.
    let wanted = format!("v2 {}", MODULES.join(" "));
    let ok_file = dir.join("kernel.ok");
    let fresh = ok_file.exists()
        && fs::read_to_string(dir.join("modules.wanted"))
            .ok()
            .as_deref()
            == Some(&wanted);
    if !fresh {
        let started = Instant::now();
        let _ = fs::remove_file(&ok_file);
        let deb = fetch_deb(&pkg, &dir.join("deb"))?;
        let root = dir.join("root");
        if root.exists() {
            fs::remove_dir_all(&root)?;
        }
        say(format!("unpacking {}", deb.display()));
        run_ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        let versions: Vec<String> = fs::read_dir(root.join("lib/modules"))
            .context("the kernel package has no lib/modules")?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        let [version] = versions.as_slice() else {
            bail!("expected one kernel version in {pkg}, found {versions:?}");
        };
        run_ok(Command::new("depmod").arg("-b").arg(&root).arg(version))?;
        fs::copy(
            root.join(format!("boot/vmlinuz-{version}")),
            dir.join("vmlinuz"),
        )
        .context("copying vmlinuz")?;
        if let Err(e) = extract_vmlinux(&dir.join("vmlinuz"), &dir.join("vmlinux")) {
            say(format!(
                "cannot extract vmlinux ({e:#}); booting vmlinuz (slower)"
            ));
            let _ = fs::remove_file(dir.join("vmlinux"));
        }
        let order = collect_modules(&root.join("lib/modules").join(version), &modules_dir)?;
        fs::write(dir.join("modules.order"), order.join("\n") + "\n")?;
        fs::remove_dir_all(&root)?;
        fs::write(dir.join("modules.wanted"), &wanted)?;
        fs::write(&ok_file, format!("{version}\n"))?;
        // Older kernels' caches (the meta package moved on) are of no further use.
        for entry in fs::read_dir(vm_dir)?.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("linux-image-") && *name != *pkg && entry.path().is_dir() {
                say(format!("removing the cache of {name}"));
                let _ = fs::remove_dir_all(entry.path());
            }
        }
        say(format!(
            "kernel {version} ready in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            dir.display()
        ));
    }
    let order: Vec<String> = fs::read_to_string(dir.join("modules.order"))?
        .lines()
        .map(str::to_string)
        .collect();
    let initrd = dir.join("initrd.gz");
    build_initrd(&dir, &modules_dir, &order, &initrd)?;
    let vmlinux = dir.join("vmlinux");
    let image = if vmlinux.exists() {
        vmlinux
    } else {
        dir.join("vmlinuz")
    };
    Ok(Kernel { image, initrd })
}

/// Extracts the ELF `vmlinux` from a bzImage: the payload is the first stream, at some offset,
/// in one of the kernel's compression formats that decompresses to an ELF file.
fn extract_vmlinux(bzimage: &Path, out: &Path) -> Result<()> {
    let data = fs::read(bzimage)?;
    let formats: [(&[u8], &str); 3] = [
        (b"\xfd7zXZ\x00", "xz"),
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\x1f\x8b\x08\x00", "gzip"),
    ];
    let tail = out.with_extension("payload");
    for (magic, tool) in formats {
        let Some(at) = find(&data, magic) else {
            continue;
        };
        fs::write(&tail, &data[at..])?;
        // The payload is followed by more of the image: the decompressor complains about the
        // trailing bytes and exits non-zero, so judge by what it wrote.
        let _ = Command::new(tool)
            .arg("-dc")
            .stdin(fs::File::open(&tail)?)
            .stdout(fs::File::create(out)?)
            .stderr(Stdio::null())
            .status();
        let _ = fs::remove_file(&tail);
        let mut head = [0u8; 4];
        if fs::File::open(out)
            .and_then(|mut f| f.read_exact(&mut head))
            .is_ok()
            && head == *b"\x7fELF"
        {
            return Ok(());
        }
    }
    bail!("no known compressed payload in {}", bzimage.display())
}

/// Finds `<pkg>_*.deb` in `dir` or apt's cache, or downloads it with `apt-get download`.
fn fetch_deb(pkg: &str, dir: &Path) -> Result<PathBuf> {
    let find = |d: &Path| -> Option<PathBuf> {
        let mut debs: Vec<PathBuf> = fs::read_dir(d)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().and_then(OsStr::to_str).unwrap_or("");
                n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb")
            })
            .collect();
        debs.sort();
        debs.pop()
    };
    if let Some(deb) = find(dir).or_else(|| find(Path::new("/var/cache/apt/archives"))) {
        return Ok(deb);
    }
    fs::create_dir_all(dir)?;
    say(format!(
        "downloading {pkg} with apt-get download (about 70 MB, once)"
    ));
    let started = Instant::now();
    let mut cmd = Command::new("apt-get");
    if is_root() {
        // apt's download sandbox user cannot write into our directory; download as root quietly.
        cmd.args(["-o", "APT::Sandbox::User=root"]);
    }
    run_ok(
        cmd.args(["download", "-q", pkg])
            .current_dir(dir)
            .stdout(std::io::stderr()),
    )?;
    let deb = find(dir)
        .ok_or_else(|| anyhow!("apt-get download {pkg} left no .deb in {}", dir.display()))?;
    say(format!(
        "downloaded {} in {:.1} s",
        deb.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(deb)
}

/// Copies [`MODULES`] and whatever they depend on from an unpacked kernel's module tree into
/// `dest` (flat, uncompressed), returning the load order.
fn collect_modules(moddir: &Path, dest: &Path) -> Result<Vec<String>> {
    let norm = |p: &str| -> String {
        let base = p.rsplit('/').next().unwrap_or(p);
        let base = base.split(".ko").next().unwrap_or(base);
        base.replace('-', "_")
    };
    let dep_text = fs::read_to_string(moddir.join("modules.dep")).context("reading modules.dep")?;
    let mut deps: Vec<(String, String, Vec<String>)> = Vec::new();
    for line in dep_text.lines() {
        let Some((path, rest)) = line.split_once(':') else {
            continue;
        };
        deps.push((
            norm(path),
            path.to_string(),
            rest.split_whitespace().map(norm).collect(),
        ));
    }
    let builtin = fs::read_to_string(moddir.join("modules.builtin")).unwrap_or_default();
    let builtin: Vec<String> = builtin.lines().map(norm).collect();

    fn visit(
        name: &str,
        deps: &[(String, String, Vec<String>)],
        builtin: &[String],
        order: &mut Vec<(String, String)>,
    ) -> Result<()> {
        if order.iter().any(|(n, _)| n == name) || builtin.iter().any(|b| b == name) {
            return Ok(());
        }
        let (_, path, needs) = deps
            .iter()
            .find(|(n, _, _)| n == name)
            .ok_or_else(|| anyhow!("module {name} not in the kernel package"))?;
        // modules.dep lists the whole closure, nearest last; load the farthest first.
        for need in needs.iter().rev() {
            visit(need, deps, builtin, order)?;
        }
        order.push((name.to_string(), path.clone()));
        Ok(())
    }
    let mut order = Vec::new();
    for m in MODULES {
        visit(m, &deps, &builtin, &mut order)?;
    }

    if dest.exists() {
        fs::remove_dir_all(dest)?;
    }
    fs::create_dir_all(dest)?;
    for (name, path) in &order {
        let src = moddir.join(path);
        let out = dest.join(format!("{name}.ko"));
        let decompressor = if path.ends_with(".ko.xz") {
            Some("xz")
        } else if path.ends_with(".ko.zst") {
            Some("zstd")
        } else if path.ends_with(".ko.gz") {
            Some("gzip")
        } else {
            None
        };
        match decompressor {
            None => {
                fs::copy(&src, &out).with_context(|| format!("copying {}", src.display()))?;
            }
            Some(tool) => {
                let data = Command::new(tool)
                    .arg("-dc")
                    .arg(&src)
                    .output()
                    .with_context(|| format!("running {tool} to decompress {}", src.display()))?;
                if !data.status.success() {
                    bail!("{tool} -dc {} failed", src.display());
                }
                fs::write(&out, data.stdout)?;
            }
        }
    }
    Ok(order.into_iter().map(|(n, _)| n).collect())
}

/// The initramfs's `/init`: load the modules, mount the host root and the control share, then
/// hand over to the per-run stages from the control share, and power off whatever happens.
fn init_script(order: &[String]) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
fail() {{
    echo "[vm] guest setup failed: $*"
    echo "setup-failed $*" > /host{GUEST_CTL}/status
    poweroff -f
}}
for m in {modules}; do
    insmod /lib/modules/$m.ko || fail "insmod $m"
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize={MSIZE} hostroot /host || fail "mount the host root"
mount -t tmpfs -o mode=1777 tmpfs /host/tmp || fail "mount /tmp"
mkdir -p /host{GUEST_CTL}
mount -t 9p -o trans=virtio,version=9p2000.L,msize={MSIZE} xtaskctl /host{GUEST_CTL} || fail "mount the control share"
. /host{GUEST_CTL}/stage1.sh
chroot /host /bin/sh {GUEST_CTL}/stage2.sh
poweroff -f
"#,
        modules = order.join(" ")
    )
}

fn build_initrd(dir: &Path, modules_dir: &Path, order: &[String], initrd: &Path) -> Result<()> {
    let init = init_script(order);
    let busybox = Path::new("/bin/busybox");
    let meta = fs::metadata(busybox).context("no /bin/busybox (package busybox-static)")?;
    let stamp = format!(
        "{init}\nbusybox {} {:?}\n",
        meta.len(),
        meta.modified().ok()
    );
    let stamp_file = dir.join("initrd.stamp");
    if initrd.exists() && fs::read_to_string(&stamp_file).ok().as_deref() == Some(&stamp) {
        return Ok(());
    }
    say("building the initramfs");
    let stage = dir.join("initramfs");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    for d in ["bin", "dev", "proc", "sys", "host", "lib/modules"] {
        fs::create_dir_all(stage.join(d))?;
    }
    fs::copy(busybox, stage.join("bin/busybox"))?;
    for m in order {
        fs::copy(
            modules_dir.join(format!("{m}.ko")),
            stage.join(format!("lib/modules/{m}.ko")),
        )?;
    }
    fs::write(stage.join("init"), init)?;
    fs::set_permissions(stage.join("init"), fs::Permissions::from_mode(0o755))?;
    let tmp = initrd.with_extension("tmp");
    run_ok(
        Command::new("bash")
            .arg("-c")
            .arg(r#"set -euo pipefail; cd "$1"; find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 > "$2""#)
            .arg("bash")
            .arg(&stage)
            .arg(&tmp),
    )?;
    fs::rename(&tmp, initrd)?;
    fs::remove_dir_all(&stage)?;
    fs::write(stamp_file, stamp)?;
    Ok(())
}

fn run_ok(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The run itself

/// Lines the guest prints around the command's output (unique per run).
struct Markers {
    /// Printed on a line of its own before the command runs.
    begin: String,
    /// Printed right after the command's output, which may not end with a newline.
    end: String,
}

/// The guest environment for the command: a clean one, with what the host passes through.
fn guest_env() -> Vec<(String, String)> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut path: Vec<String> = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    for p in [format!("{home}/.cargo/bin"), "/root/.cargo/bin".into()]
        .into_iter()
        .chain(
            [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
            .map(String::from),
        )
    {
        if !path.contains(&p) {
            path.push(p);
        }
    }
    let term = match std::env::var("TERM") {
        Ok(t) if std::io::stdout().is_terminal() => t,
        _ => "dumb".into(),
    };
    let mut env = vec![
        ("HOME".into(), home),
        ("PATH".into(), path.join(":")),
        ("TERM".into(), term),
    ];
    for (k, v) in std::env::vars() {
        if PASSED_ENV.contains(&k.as_str()) || k.starts_with("RSRDMA_") {
            env.push((k, v));
        }
    }
    for (k, v) in [
        ("RSRDMA_TEST_DEVICE", GUEST_DEVICE),
        ("RSRDMA_TEST_GID_INDEX", GUEST_GID_INDEX),
        ("RSRDMA_TEST_IP", GUEST_IP),
    ] {
        if !env.iter().any(|(name, _)| name == k) {
            env.push((k.into(), v.into()));
        }
    }
    env
}

/// Stage 1, sourced by the initramfs's busybox shell before the chroot (busybox is static, so
/// this costs no library loads over 9p): the guest's own file systems on top of the host root.
fn stage1(out_dir: &Path, verbose: bool) -> String {
    format!(
        r#"# Stage 1 of `cargo xtask vm`, generated by xtask/src/vm.rs; run by busybox before the chroot.
{note}
h=/host
mount -t proc proc $h/proc || fail "mount /proc"
note "stage 1"
mount -t sysfs sysfs $h/sys || fail "mount /sys"
mount -t devtmpfs devtmpfs $h/dev || fail "mount /dev"
mkdir -p $h/dev/shm $h/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $h/dev/shm || fail "mount /dev/shm"
mount -t devpts devpts $h/dev/pts || fail "mount /dev/pts"
mount -t tmpfs -o mode=755 tmpfs $h/run || fail "mount /run"
mount -t 9p -o trans=virtio,version=9p2000.L,msize={MSIZE} xtaskout $h{out} || fail "mount the writable share on "{out}
stty -onlcr
hostname xtask-vm
note "file systems mounted"
"#,
        out = sh_quote(&out_dir.to_string_lossy()),
        note = note_fn(verbose),
    )
}

/// With `--verbose`, the stages say how far they got (in guest uptime).
fn note_fn(verbose: bool) -> &'static str {
    if verbose {
        r#"note() { read up _ < ${h:-}/proc/uptime; echo "[vm] guest at $up s: $*"; }"#
    } else {
        "note() { :; }"
    }
}

/// Stage 2, run by the host's `/bin/sh` inside the chroot: the network and rxe0, then the script
/// in a clean environment, with its exit status written to the control share.
fn stage2(script: &str, cwd: &Path, markers: &Markers, verbose: bool) -> String {
    let env = guest_env()
        .iter()
        .map(|(k, v)| format!("{k}={}", sh_quote(v)))
        .collect::<Vec<_>>()
        .join(" \\\n    ");
    format!(
        r#"# Stage 2 of `cargo xtask vm`, generated by xtask/src/vm.rs; run in the chroot.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ctl={GUEST_CTL}
setup_fail() {{ echo "[vm] guest setup failed: $*"; echo "setup-failed $*" > $ctl/status; exit 1; }}
{note}
note "stage 2"
ulimit -l unlimited || setup_fail "ulimit -l unlimited"
ip -batch - <<'END' || setup_fail "creating veth0/veth1"
link set lo up
link add veth0 type veth peer name veth1
addr add {GUEST_IP}/24 dev veth0
link set veth0 up
link set veth1 up
END
note "veth up"
rdma link add {GUEST_DEVICE} type rxe netdev veth0 || setup_fail "rdma link add {GUEST_DEVICE} type rxe netdev veth0"
port=/sys/class/infiniband/{GUEST_DEVICE}/ports/1
i=0
while :; do
    read state < $port/state
    read gid < $port/gids/{GUEST_GID_INDEX}
    case "$state $gid" in
        *ACTIVE*ffff:*) break ;;
    esac
    i=$((i+1))
    [ $i -le {ACTIVE_WAIT_TENTHS} ] || setup_fail "{GUEST_DEVICE} port 1 not ACTIVE with an IPv4 GID at index {GUEST_GID_INDEX} after {wait_secs} s: $state, $gid"
    sleep 0.1
done
note "{GUEST_DEVICE} active"
cd {cwd} || setup_fail "working directory "{cwd}" is not visible in the guest (the guest's /tmp, /run and /dev/shm are its own)"
printf '%s\n' {begin}
env -i {env} \
    /bin/sh -c {script} </dev/null
echo $? > $ctl/status
printf '%s' {end}
"#,
        cwd = sh_quote(&cwd.to_string_lossy()),
        script = sh_quote(script),
        begin = sh_quote(&markers.begin),
        end = sh_quote(&markers.end),
        wait_secs = ACTIVE_WAIT_TENTHS / 10,
        note = note_fn(verbose),
    )
}

/// An option value for qemu's `-fsdev`: commas are doubled.
fn qemu_path(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

fn boot(
    opts: &VmOpts,
    kernel: &Kernel,
    ctl_dir: &Path,
    out_dir: &Path,
    markers: &Markers,
) -> Result<VmRun> {
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-nographic",
        "-no-reboot",
        "-net",
        "none",
    ])
    .args([
        "-m",
        &opts.mem_mb.to_string(),
        "-smp",
        &opts.cpus.to_string(),
    ])
    .arg("-kernel")
    .arg(&kernel.image)
    .arg("-initrd")
    .arg(&kernel.initrd)
    .args([
        "-append",
        if opts.verbose {
            VERBOSE_CMDLINE
        } else {
            QUIET_CMDLINE
        },
    ])
    .args([
        "-fsdev",
        "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
    ])
    .args(["-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot"])
    .args([
        "-fsdev",
        &format!(
            "local,id=xtaskctl,path={},security_model=none",
            qemu_path(ctl_dir)
        ),
    ])
    .args(["-device", "virtio-9p-pci,fsdev=xtaskctl,mount_tag=xtaskctl"])
    .args([
        "-fsdev",
        &format!(
            "local,id=xtaskout,path={},security_model=none",
            qemu_path(out_dir)
        ),
    ])
    .args(["-device", "virtio-9p-pci,fsdev=xtaskout,mount_tag=xtaskout"])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl, which is
    // async-signal-safe; it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(|| {
            // qemu must not outlive us (Ctrl-C, a killed CI job): it gets SIGKILL when we die.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    say(format!(
        "booting ({} vCPUs, {} MB, TCG; time limit {} s)",
        opts.cpus,
        opts.mem_mb,
        opts.timeout.as_secs()
    ));
    let started = Instant::now();
    let deadline = started + opts.timeout;
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    let mut stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });

    let mut console = Console::new(markers, opts.verbose);
    let mut boot_time = None;
    let mut timed_out = false;
    let mut end_seen_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        // After the end marker the guest only has to power off.
        let limit = match end_seen_at {
            Some(t) => deadline.min(t + Duration::from_secs(60)),
            None => deadline,
        };
        if now >= limit {
            timed_out = end_seen_at.is_none();
            let _ = child.kill();
            break;
        }
        match rx.recv_timeout(limit - now) {
            Ok(chunk) => {
                if let Err(e) = console.feed(&chunk) {
                    // Our stdout is gone (a closed pipe): nobody sees the run any more.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e.context("writing the guest's output"));
                }
                if boot_time.is_none() && console.state != State::Booting {
                    let t = started.elapsed();
                    boot_time = Some(t);
                    say(format!(
                        "guest ready after {:.1} s; running the command",
                        t.as_secs_f64()
                    ));
                }
                if end_seen_at.is_none() && console.state == State::Done {
                    end_seen_at = Some(Instant::now());
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let exit = child.wait()?;
    let _ = reader.join();
    let total = started.elapsed();
    console.flush()?;
    if console.state == State::Booting && !opts.verbose {
        // Never got to the command: show what the guest said (firmware, kernel, init).
        eprintln!("[vm] guest console (the guest never reached the command; qemu {exit}):");
        eprintln!("{}", String::from_utf8_lossy(&console.boot_log));
    } else if console.state == State::Running && !timed_out {
        eprintln!("[vm] the guest stopped while the command was running (qemu {exit})");
    }
    Ok(VmRun {
        status: if timed_out { TIMEOUT_STATUS } else { -1 },
        timed_out,
        output: String::from_utf8_lossy(&console.output).into_owned(),
        boot: boot_time.unwrap_or(total),
        total,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Booting,
    Running,
    Done,
}

/// Splits the serial console into the boot log (hidden unless the boot fails), the command's
/// output (streamed to stdout live and kept) and what follows the end marker (dropped).
struct Console {
    begin: Vec<u8>,
    end: Vec<u8>,
    /// Copy the boot log to stderr as it comes.
    verbose: bool,
    /// Stream the command's output to stdout (off in unit tests).
    live: bool,
    state: State,
    boot_log: Vec<u8>,
    /// How much of the boot log `verbose` has shown.
    shown: usize,
    /// Bytes held back because they could be the start of the end marker.
    pending: Vec<u8>,
    output: Vec<u8>,
}

impl Console {
    fn new(markers: &Markers, verbose: bool) -> Self {
        Console {
            begin: markers.begin.as_bytes().to_vec(),
            end: markers.end.as_bytes().to_vec(),
            verbose,
            live: true,
            state: State::Booting,
            boot_log: Vec::new(),
            shown: 0,
            pending: Vec::new(),
            output: Vec::new(),
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<()> {
        match self.state {
            State::Booting => {
                self.boot_log.extend_from_slice(chunk);
                // The begin marker counts once its line is complete ("\n", or "\r\n" if the
                // console still translates newlines).
                let begin = find(&self.boot_log, &self.begin).and_then(|i| {
                    let after = &self.boot_log[i + self.begin.len()..];
                    let eol = [&b"\n"[..], b"\r\n"]
                        .into_iter()
                        .find(|e| after.starts_with(e))?;
                    Some((i, i + self.begin.len() + eol.len()))
                });
                if self.verbose {
                    // Whole lines only, so that a marker is never shown in pieces.
                    let upto = begin.map_or_else(
                        || {
                            self.boot_log
                                .iter()
                                .rposition(|&b| b == b'\n')
                                .map_or(0, |i| i + 1)
                        },
                        |(i, _)| i,
                    );
                    if upto > self.shown {
                        std::io::stderr()
                            .lock()
                            .write_all(&self.boot_log[self.shown..upto])?;
                        self.shown = upto;
                    }
                }
                if let Some((i, rest)) = begin {
                    let rest = self.boot_log.split_off(rest);
                    self.boot_log.truncate(i);
                    self.state = State::Running;
                    self.feed(&rest)?;
                }
            }
            State::Running => {
                self.pending.extend_from_slice(chunk);
                let (emit, done) = match find(&self.pending, &self.end) {
                    Some(i) => (i, true),
                    None => (
                        self.pending.len() - partial_suffix(&self.pending, &self.end),
                        false,
                    ),
                };
                let out: Vec<u8> = self.pending.drain(..emit).collect();
                self.emit(&out)?;
                if done {
                    self.pending.clear();
                    self.state = State::Done;
                }
            }
            State::Done => {}
        }
        Ok(())
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.output.extend_from_slice(bytes);
        if !self.live {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(bytes)?;
        stdout.flush()?;
        Ok(())
    }

    /// Emits what was held back, and ends the output with a newline if it has none.
    fn flush(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        self.emit(&pending)?;
        if self.live && self.output.last().is_some_and(|&b| b != b'\n') {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(b"\n")?;
            stdout.flush()?;
        }
        Ok(())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest suffix of `data` that is a proper prefix of `marker`.
fn partial_suffix(data: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(data.len() + 1))
        .rev()
        .find(|&n| data.ends_with(&marker[..n]))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// A lock, so that two runs do not share target/vm-out or rebuild the cache at once.

struct Lock(fs::File);

fn lock(path: &Path) -> Result<Lock> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let fd = file.as_raw_fd();
    // SAFETY: fd is an open descriptor owned by `file`, which outlives the call.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        say(format!(
            "waiting for another `cargo xtask vm` to finish ({})",
            path.display()
        ));
        // SAFETY: as above.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).context("locking target/vm");
        }
    }
    Ok(Lock(file))
}

impl Drop for Lock {
    fn drop(&mut self) {
        // SAFETY: the descriptor is still open (owned by self.0).
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
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
    fn console_splits_and_holds_back_marker_prefixes() {
        let markers = Markers {
            begin: "<B>".into(),
            end: "<END>".into(),
        };
        let mut c = Console::new(&markers, false);
        c.live = false;
        c.feed(b"firmware noise\n<B").unwrap();
        assert_eq!(c.state, State::Booting);
        c.feed(b">\nhello <E").unwrap();
        assert_eq!(c.state, State::Running);
        assert_eq!(c.output, b"hello ");
        c.feed(b"x <EN").unwrap();
        assert_eq!(c.output, b"hello <Ex ");
        c.feed(b"D>poweroff").unwrap();
        assert_eq!(c.state, State::Done);
        assert_eq!(c.output, b"hello <Ex ");
    }

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix(b"abc<E", b"<END>"), 2);
        assert_eq!(partial_suffix(b"abc", b"<END>"), 0);
        assert_eq!(partial_suffix(b"<", b"<END>"), 1);
    }
}
