//! The initramfs: static busybox, the kernel modules the guest needs, and an `/init` that loads
//! them, mounts the host root and the control share, and hands over to the per-run stages.

use super::stages::GUEST_CTL;
use super::{run_ok, say, MSIZE};
use anyhow::{anyhow, bail, Context, Result};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Modules loaded by the initramfs, in this order (their dependencies from `modules.dep` are
/// loaded first where missing). `crc32_generic` is not a link-time dependency of anything, but
/// without it `rdma link add … type rxe` fails with ENOENT. `rdma_ucm` is rdma_cm's user-space
/// interface (`/dev/infiniband/rdma_cm`); without it librdmacm fails with ENOENT.
pub(super) const MODULES: &[&str] = &[
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

/// One line of `modules.dep`: a module's name, its path in the tree, and what it needs.
struct ModuleDep {
    name: String,
    path: String,
    needs: Vec<String>,
}

/// A module's name as `insmod` and `modules.dep` agree on it: no directory, no `.ko*`, `_`.
fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let base = base.split(".ko").next().unwrap_or(base);
    base.replace('-', "_")
}

fn parse_modules_dep(text: &str) -> Vec<ModuleDep> {
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(path, rest)| ModuleDep {
            name: module_name(path),
            path: path.to_string(),
            needs: rest.split_whitespace().map(module_name).collect(),
        })
        .collect()
}

/// The `wanted` modules and what they need, dependencies first, as (name, path) pairs; built-in
/// modules are skipped.
fn load_order(
    wanted: &[&str],
    deps: &[ModuleDep],
    builtin: &[String],
) -> Result<Vec<(String, String)>> {
    fn visit(
        name: &str,
        deps: &[ModuleDep],
        builtin: &[String],
        order: &mut Vec<(String, String)>,
    ) -> Result<()> {
        if order.iter().any(|(n, _)| n == name) || builtin.iter().any(|b| b == name) {
            return Ok(());
        }
        let dep = deps
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| anyhow!("module {name} not in the kernel package"))?;
        // modules.dep lists the whole closure, nearest last; load the farthest first.
        for need in dep.needs.iter().rev() {
            visit(need, deps, builtin, order)?;
        }
        order.push((name.to_string(), dep.path.clone()));
        Ok(())
    }
    let mut order = Vec::new();
    for m in wanted {
        visit(m, deps, builtin, &mut order)?;
    }
    Ok(order)
}

/// Copies [`MODULES`] and whatever they depend on from an unpacked kernel's module tree into
/// `dir/modules` (flat, uncompressed), and writes their load order to `dir/modules.order`.
pub(super) fn collect_modules(moddir: &Path, dir: &Path) -> Result<()> {
    let dep_text = fs::read_to_string(moddir.join("modules.dep")).context("reading modules.dep")?;
    let builtin = fs::read_to_string(moddir.join("modules.builtin")).unwrap_or_default();
    let builtin: Vec<String> = builtin.lines().map(module_name).collect();
    let order = load_order(MODULES, &parse_modules_dep(&dep_text), &builtin)?;
    let dest = dir.join("modules");
    if dest.exists() {
        fs::remove_dir_all(&dest)?;
    }
    fs::create_dir_all(&dest)?;
    for (name, path) in &order {
        copy_module(&moddir.join(path), &dest.join(format!("{name}.ko")))?;
    }
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    fs::write(dir.join("modules.order"), names.join("\n") + "\n")?;
    Ok(())
}

/// Copies a module, decompressing it if the package compressed it.
fn copy_module(src: &Path, out: &Path) -> Result<()> {
    let name = src.to_string_lossy();
    let tool = [(".ko.xz", "xz"), (".ko.zst", "zstd"), (".ko.gz", "gzip")]
        .into_iter()
        .find(|(ext, _)| name.ends_with(ext))
        .map(|(_, tool)| tool);
    let Some(tool) = tool else {
        fs::copy(src, out).with_context(|| format!("copying {}", src.display()))?;
        return Ok(());
    };
    let data = Command::new(tool)
        .arg("-dc")
        .arg(src)
        .output()
        .with_context(|| format!("running {tool} to decompress {}", src.display()))?;
    if !data.status.success() {
        bail!("{tool} -dc {} failed", src.display());
    }
    fs::write(out, data.stdout)?;
    Ok(())
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

/// Builds `dir/initrd.gz` from the modules in `dir` unless it is current (same `/init`, same
/// busybox); returns its path.
pub(super) fn build_initrd(dir: &Path) -> Result<PathBuf> {
    let order: Vec<String> = fs::read_to_string(dir.join("modules.order"))?
        .lines()
        .map(str::to_string)
        .collect();
    let initrd = dir.join("initrd.gz");
    let init = init_script(&order);
    let busybox = Path::new("/bin/busybox");
    let meta = fs::metadata(busybox).context("no /bin/busybox (package busybox-static)")?;
    let stamp = format!(
        "{init}\nbusybox {} {:?}\n",
        meta.len(),
        meta.modified().ok()
    );
    let stamp_file = dir.join("initrd.stamp");
    if initrd.exists() && fs::read_to_string(&stamp_file).ok().as_deref() == Some(&stamp) {
        return Ok(initrd);
    }
    say("building the initramfs");
    let stage = dir.join("initramfs");
    stage_tree(&stage, busybox, &dir.join("modules"), &order, &init)?;
    pack_cpio(&stage, &initrd)?;
    fs::remove_dir_all(&stage)?;
    fs::write(stamp_file, stamp)?;
    Ok(initrd)
}

/// Lays out the initramfs's files under `stage`.
fn stage_tree(
    stage: &Path,
    busybox: &Path,
    modules_dir: &Path,
    order: &[String],
    init: &str,
) -> Result<()> {
    if stage.exists() {
        fs::remove_dir_all(stage)?;
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
    Ok(())
}

/// Packs `stage` into a gzipped newc cpio archive at `initrd` (atomically).
fn pack_cpio(stage: &Path, initrd: &Path) -> Result<()> {
    let tmp = initrd.with_extension("tmp");
    run_ok(
        Command::new("bash")
            .arg("-c")
            .arg(r#"set -euo pipefail; cd "$1"; find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 > "$2""#)
            .arg("bash")
            .arg(stage)
            .arg(&tmp),
    )?;
    fs::rename(&tmp, initrd)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_order_puts_dependencies_first_and_skips_builtins() {
        let dep = "kernel/a/ib_core.ko.xz: kernel/b/crc-x.ko.xz\n\
                   kernel/c/rdma_rxe.ko.xz: kernel/d/ip6_udp_tunnel.ko kernel/a/ib_core.ko.xz\n\
                   kernel/d/ip6_udp_tunnel.ko:\n";
        let deps = parse_modules_dep(dep);
        assert_eq!(deps[0].needs, ["crc_x"]);
        let builtin = vec!["crc_x".to_string()];
        let order = load_order(&["rdma_rxe", "ib_core"], &deps, &builtin).unwrap();
        let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["ib_core", "ip6_udp_tunnel", "rdma_rxe"]);
        assert_eq!(order[0].1, "kernel/a/ib_core.ko.xz");
        let missing = load_order(&["veth"], &deps, &builtin).unwrap_err();
        assert!(missing.to_string().contains("veth"), "{missing}");
    }

    #[test]
    fn module_names_are_normalised() {
        assert_eq!(
            module_name("kernel/net/9p/9pnet-virtio.ko.zst"),
            "9pnet_virtio"
        );
        assert_eq!(module_name("veth.ko"), "veth");
    }
}
