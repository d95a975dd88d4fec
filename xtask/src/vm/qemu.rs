//! The QEMU command line (TCG, the kernel and initramfs, the 9p shares) and starting it.

use super::kernel::Kernel;
use super::shares::Share;
use super::{console, say, VmOpts, VmRun};
use anyhow::{Context, Result};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const QUIET_CMDLINE: &str = "console=ttyS0 quiet loglevel=1 panic=-1";
const VERBOSE_CMDLINE: &str = "console=ttyS0 loglevel=7 printk.time=1 panic=-1";

/// What one boot runs and shares.
pub(super) struct Vm<'a> {
    pub kernel: &'a Kernel,
    /// The control share (the stages in, the exit status out).
    pub ctl_dir: &'a Path,
    /// The writable share, `target/vm-out`.
    pub out_dir: &'a Path,
    /// Directories the guest's own mounts would hide, shared read-only.
    pub shares: &'a [Share],
}

/// Boots the VM and follows its console until it powers off or the time limit kills it.
pub(super) fn boot(opts: &VmOpts, vm: &Vm, markers: &console::Markers) -> Result<VmRun> {
    let mut cmd = command(opts, vm);
    die_with_parent(&mut cmd);
    say(format!(
        "booting ({} vCPUs, {} MB, TCG; time limit {} s)",
        opts.cpus,
        opts.mem_mb,
        opts.timeout.as_secs()
    ));
    let started = Instant::now();
    let child = cmd.spawn().context("starting qemu-system-x86_64")?;
    console::watch(child, started, opts, markers)
}

fn command(opts: &VmOpts, vm: &Vm) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    // The plain 64-bit model, not `max`: what TCG emulates for `max` (AVX2 among it, which
    // the guest's libc then uses) ran the same device tests 10-15% slower (conn_device: 58
    // and 66 s against 69 and 70, alternating); nothing in the guest needs more.
    cmd.args(["-accel", "tcg,thread=multi", "-cpu", "qemu64"])
        .args(["-nographic", "-no-reboot", "-net", "none"])
        .args(["-m", &opts.mem_mb.to_string()])
        .args(["-smp", &opts.cpus.to_string()])
        .arg("-kernel")
        .arg(&vm.kernel.image)
        .arg("-initrd")
        .arg(&vm.kernel.initrd)
        .args([
            "-append",
            if opts.verbose {
                VERBOSE_CMDLINE
            } else {
                QUIET_CMDLINE
            },
        ]);
    share(&mut cmd, "hostroot", Path::new("/"), true);
    share(&mut cmd, "xtaskctl", vm.ctl_dir, false);
    share(&mut cmd, "xtaskout", vm.out_dir, false);
    for s in vm.shares {
        share(&mut cmd, &s.tag, &s.path, true);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// Adds a virtio-9p share of `path` with mount tag `tag`.
fn share(cmd: &mut Command, tag: &str, path: &Path, readonly: bool) {
    // Read-only shares span several host file systems (the root); remap keeps their inode
    // numbers apart.
    let ro = if readonly {
        ",readonly=on,multidevs=remap"
    } else {
        ""
    };
    cmd.args([
        "-fsdev",
        &format!(
            "local,id={tag},path={},security_model=none{ro}",
            qemu_path(path)
        ),
    ])
    .args([
        "-device",
        &format!("virtio-9p-pci,fsdev={tag},mount_tag={tag}"),
    ]);
}

/// An option value for qemu's `-fsdev`: commas are doubled.
fn qemu_path(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// qemu must not outlive us (Ctrl-C, a killed CI job): it gets SIGKILL when we die.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl, which is
    // async-signal-safe; it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_tmp_checkout_becomes_a_read_only_share() {
        let kernel = Kernel {
            image: "/k/vmlinux".into(),
            initrd: "/k/initrd.gz".into(),
        };
        let shares = [Share {
            tag: "xtaskdir0".into(),
            path: PathBuf::from("/tmp/a,b"),
        }];
        let vm = Vm {
            kernel: &kernel,
            ctl_dir: Path::new("/tmp/a,b/target/vm/run-1"),
            out_dir: Path::new("/tmp/a,b/target/vm-out"),
            shares: &shares,
        };
        let cmd = command(&VmOpts::default(), &vm);
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let has = |s: &str| args.iter().any(|a| a == s);
        assert!(has(
            "local,id=xtaskdir0,path=/tmp/a,,b,security_model=none,readonly=on,multidevs=remap"
        ));
        assert!(has("virtio-9p-pci,fsdev=xtaskdir0,mount_tag=xtaskdir0"));
        assert!(has(
            "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
        ));
        assert!(has(
            "local,id=xtaskout,path=/tmp/a,,b/target/vm-out,security_model=none"
        ));
        assert!(has(QUIET_CMDLINE));
    }
}
