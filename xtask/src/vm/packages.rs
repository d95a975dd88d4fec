//! The host's Debian packages: what the VM needs, installed with apt-get when missing.

use super::say;
use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};

/// Host packages the VM needs (qemu and the initramfs tools, plus the RDMA user space that the
/// guest runs from the shared host root). The build itself needs none of them; rdma-core's
/// headers serve rsrdma-sys's layout test and `bench overhead`, which compile C when they run.
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
    // rstream, rsocket's benchmark: the peer `cargo xtask bench rdmanet` measures Conn against.
    "rdmacm-utils",
    "iproute2",
    "xz-utils",
    // A real etcd, which the Registry's etcd backend tests start on loopback.
    "etcd-server",
];

pub(super) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Installs the Debian packages in `pkgs` that are missing (as root), or fails with the exact
/// apt-get line to run.
pub fn ensure_packages(pkgs: &[&str]) -> Result<()> {
    let missing = missing_packages(pkgs)?;
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing host packages: {}; install them with:\n    sudo apt-get update && sudo \
             apt-get install -y --no-install-recommends {}",
            missing.join(" "),
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

/// The packages of `pkgs` that dpkg does not list as installed.
fn missing_packages<'a>(pkgs: &[&'a str]) -> Result<Vec<&'a str>> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\n"])
        .args(pkgs)
        .stderr(Stdio::null())
        .output()
        .context("running dpkg-query (is this a Debian system?)")?;
    let listing = String::from_utf8_lossy(&out.stdout);
    let installed = installed_names(&listing);
    Ok(pkgs
        .iter()
        .copied()
        .filter(|p| !installed.contains(p))
        .collect())
}

/// The installed package names in a `dpkg-query` listing of `<name>[:arch] <status>` lines.
fn installed_names(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter_map(|l| l.split_once(' '))
        // db:Status-Abbrev is "<wanted><state><error>"; state `i` is installed.
        .filter(|(_, status)| status.as_bytes().get(1) == Some(&b'i'))
        .map(|(name, _)| name.split(':').next().unwrap_or(name))
        .collect()
}

pub(super) fn apt_get(args: &[&str]) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_installed_states_count() {
        let listing = "cpio ii \nkmod:amd64 ii \nperftest un \nqemu-system-x86 rc \n";
        assert_eq!(installed_names(listing), ["cpio", "kmod"]);
    }
}
