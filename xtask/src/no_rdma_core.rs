//! Runs a command in a mount namespace where rdma-core is hidden: its libraries
//! (`libibverbs.so*`, `librdmacm.so*`: each file has `/dev/null` mounted over it, so it
//! cannot load) and its headers (`/usr/include/infiniband`, `/usr/include/rdma`: an empty
//! tmpfs over each). Issue 22 asks that the workspace build and the software device's tests
//! and tools pass so; `cargo xtask test` runs its soft0 stage (build included) this way.
//!
//! As root (CI) `unshare --mount`; otherwise `unshare --map-root-user --mount` (a user
//! namespace), where the kernel allows it.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// What the namespace hides.
const LIBRARIES: &[&str] = &["libibverbs.so", "librdmacm.so"];
const HEADER_DIRS: &[&str] = &["/usr/include/infiniband", "/usr/include/rdma"];
const LIBRARY_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
];

/// Every file of rdma-core's two libraries (the real files behind their links).
fn library_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in LIBRARY_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if LIBRARIES.iter().any(|l| name.starts_with(l)) {
                if let Ok(real) = std::fs::canonicalize(e.path()) {
                    if !files.contains(&real) {
                        files.push(real);
                    }
                }
            }
        }
    }
    files
}

/// `cmd` (program, arguments, environment, directory) wrapped to run with rdma-core hidden.
/// The wrapper checks that every library file is empty before it runs `cmd`.
///
/// # Errors
/// `unshare` is not installed.
pub fn wrap(cmd: &Command) -> Result<Command> {
    which("unshare").context("`unshare` (util-linux) is needed to hide rdma-core")?;
    let mut script = String::from("set -e\n");
    for f in library_files() {
        let f = crate::vm::sh_quote(&f.to_string_lossy());
        script.push_str(&format!("mount --bind /dev/null {f}\ntest ! -s {f}\n"));
    }
    for d in HEADER_DIRS {
        script.push_str(&format!(
            "if [ -d {d} ]; then mount -t tmpfs none {d}; test -z \"$(ls -A {d})\"; fi\n"
        ));
    }
    script.push_str("exec \"$@\"\n");
    let mut w = Command::new("unshare");
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        w.arg("--map-root-user");
    }
    w.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
        "sh",
    ]);
    w.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => w.env(k, v),
            None => w.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        w.current_dir(dir);
    }
    Ok(w)
}

/// Whether a namespace can be made here (a quick `unshare ... true`).
pub fn available() -> Result<()> {
    let probe = wrap(&Command::new("true"))?
        .output()
        .context("running unshare")?;
    if !probe.status.success() {
        bail!(
            "cannot hide rdma-core in a mount namespace: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
    }
    Ok(())
}

fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(prog))
            .find(|p| p.is_file())
    })
}
