//! The guest kernel: Debian's own `linux-image-*-amd64` package, downloaded once with
//! `apt-get download`, unpacked and cached under `target/vm/<package>/` with its modules.

use super::packages::{apt_get, is_root};
use super::{console::find, initramfs, run_ok, say};
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

pub(super) struct Kernel {
    /// The uncompressed `vmlinux` (booted directly through its PVH entry: no firmware boot
    /// loader, no decompression, about 5 s faster under TCG), else the package's `vmlinuz`.
    pub image: PathBuf,
    pub initrd: PathBuf,
}

/// The cached kernel and a current initramfs for it, fetching and unpacking the kernel package
/// when the cache is missing or was built for another module list.
pub(super) fn prepare_kernel(vm_dir: &Path) -> Result<Kernel> {
    let pkg = resolve_kernel_package(vm_dir)?;
    let dir = vm_dir.join(&pkg);
    // Bump the leading version when the cache's layout changes.
    let wanted = format!("v2 {}", initramfs::MODULES.join(" "));
    let fresh = dir.join("kernel.ok").exists()
        && fs::read_to_string(dir.join("modules.wanted"))
            .ok()
            .as_deref()
            == Some(&wanted);
    if !fresh {
        unpack_kernel(vm_dir, &pkg, &wanted)?;
    }
    let initrd = initramfs::build_initrd(&dir)?;
    let vmlinux = dir.join("vmlinux");
    let image = if vmlinux.exists() {
        vmlinux
    } else {
        dir.join("vmlinuz")
    };
    Ok(Kernel { image, initrd })
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
    match newest_cached_kernel(vm_dir)? {
        Some(name) => {
            say(format!("apt-cache cannot resolve linux-image-amd64; using the cached {name}"));
            Ok(name)
        }
        None => bail!("cannot find the kernel package: `apt-cache depends linux-image-amd64` names none (run apt-get update)"),
    }
}

fn newest_cached_kernel(vm_dir: &Path) -> Result<Option<String>> {
    let mut cached: Vec<String> = fs::read_dir(vm_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("kernel.ok").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    cached.sort();
    Ok(cached.pop())
}

/// Fills `vm_dir/<pkg>/`: `vmlinuz`, `vmlinux`, the modules and their load order; `kernel.ok`
/// last, so that an interrupted run starts over.
fn unpack_kernel(vm_dir: &Path, pkg: &str, wanted: &str) -> Result<()> {
    let started = Instant::now();
    let dir = vm_dir.join(pkg);
    let ok_file = dir.join("kernel.ok");
    let _ = fs::remove_file(&ok_file);
    let deb = fetch_deb(pkg, &dir.join("deb"))?;
    let root = dir.join("root");
    let version = unpack_deb(pkg, &deb, &root)?;
    install_image(&root, &version, &dir)?;
    let moddir = root.join("lib/modules").join(&version);
    initramfs::collect_modules(&moddir, &dir)?;
    fs::remove_dir_all(&root)?;
    fs::write(dir.join("modules.wanted"), wanted)?;
    fs::write(&ok_file, format!("{version}\n"))?;
    remove_other_kernels(vm_dir, pkg);
    say(format!(
        "kernel {version} ready in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        dir.display()
    ));
    Ok(())
}

/// Unpacks `deb` into `root` and runs `depmod` there; returns the kernel version.
fn unpack_deb(pkg: &str, deb: &Path, root: &Path) -> Result<String> {
    if root.exists() {
        fs::remove_dir_all(root)?;
    }
    say(format!("unpacking {}", deb.display()));
    run_ok(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root))?;
    let versions: Vec<String> = fs::read_dir(root.join("lib/modules"))
        .context("the kernel package has no lib/modules")?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let [version] = versions.as_slice() else {
        bail!("expected one kernel version in {pkg}, found {versions:?}");
    };
    run_ok(Command::new("depmod").arg("-b").arg(root).arg(version))?;
    Ok(version.clone())
}

/// Copies `vmlinuz` into `dir` and extracts `vmlinux` from it where possible.
fn install_image(root: &Path, version: &str, dir: &Path) -> Result<()> {
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
    Ok(())
}

/// Older kernels' caches (the meta package moved on) are of no further use.
fn remove_other_kernels(vm_dir: &Path, pkg: &str) {
    let Ok(entries) = fs::read_dir(vm_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("linux-image-") && *name != *pkg && entry.path().is_dir() {
            say(format!("removing the cache of {name}"));
            let _ = fs::remove_dir_all(entry.path());
        }
    }
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
    for (magic, tool) in formats {
        let Some(at) = find(&data, magic) else {
            continue;
        };
        if decompress_to_elf(tool, &data[at..], out)? {
            return Ok(());
        }
    }
    bail!("no known compressed payload in {}", bzimage.display())
}

/// Decompresses `payload` with `tool` into `out`; returns whether that made an ELF file.
fn decompress_to_elf(tool: &str, payload: &[u8], out: &Path) -> Result<bool> {
    let tail = out.with_extension("payload");
    fs::write(&tail, payload)?;
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
    Ok(fs::File::open(out)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head == *b"\x7fELF")
}

/// The newest `<pkg>_*.deb` in `dir`.
fn find_deb(pkg: &str, dir: &Path) -> Option<PathBuf> {
    let mut debs: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().and_then(OsStr::to_str).unwrap_or("");
            n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb")
        })
        .collect();
    debs.sort();
    debs.pop()
}

/// Finds `<pkg>_*.deb` in `dir` or apt's cache, or downloads it with `apt-get download`.
fn fetch_deb(pkg: &str, dir: &Path) -> Result<PathBuf> {
    if let Some(deb) =
        find_deb(pkg, dir).or_else(|| find_deb(pkg, Path::new("/var/cache/apt/archives")))
    {
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
    let deb = find_deb(pkg, dir)
        .ok_or_else(|| anyhow!("apt-get download {pkg} left no .deb in {}", dir.display()))?;
    say(format!(
        "downloaded {} in {:.1} s",
        deb.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(deb)
}
