//! The host directories shared into the guest besides its root. The guest mounts file systems
//! of its own on `/tmp`, `/run` and `/dev`, which hide what the host has there; a working
//! directory or target directory under one of them (a checkout under `/tmp`) is therefore
//! shared on its own, read-only, and mounted at the same path over the guest's mount.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Where the guest mounts file systems of its own over the host root.
const GUEST_OWN_MOUNTS: &[&str] = &["/tmp", "/run", "/dev", "/dev/shm"];

/// A host directory shared read-only into the guest, mounted there at the same path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Share {
    /// The 9p mount tag (also qemu's fsdev id).
    pub tag: String,
    pub path: PathBuf,
}

/// The shares that make the working directory `cwd` and the target directory `target`
/// visible in the guest (none when the host root share shows both).
pub(super) fn guest_shares(cwd: &Path, target: &Path) -> Result<Vec<Share>> {
    // Symbolic links (say /var/run) would hide where the directory really is.
    let target = target
        .canonicalize()
        .unwrap_or_else(|_| target.to_path_buf());
    shares_for(&[cwd, &target])
}

/// The shares for `dirs` (absolute, without symbolic links): one per hidden directory that no
/// other hidden one contains.
fn shares_for(dirs: &[&Path]) -> Result<Vec<Share>> {
    let mut hidden: Vec<&Path> = Vec::new();
    for &dir in dirs {
        let Some(mount) = GUEST_OWN_MOUNTS.iter().find(|m| dir.starts_with(m)) else {
            continue;
        };
        if GUEST_OWN_MOUNTS.iter().any(|m| dir == Path::new(m)) {
            bail!(
                "{} is where the guest mounts a file system of its own; run from a directory \
                 below it (like {mount}/rsrdma)",
                dir.display()
            );
        }
        if hidden.iter().any(|h| dir.starts_with(h)) {
            continue;
        }
        hidden.retain(|h| !h.starts_with(dir));
        hidden.push(dir);
    }
    Ok(hidden
        .into_iter()
        .enumerate()
        .map(|(i, path)| Share {
            tag: format!("xtaskdir{i}"),
            path: path.to_path_buf(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(dirs: &[&str]) -> Vec<PathBuf> {
        shares_for(&dirs.iter().map(Path::new).collect::<Vec<_>>())
            .unwrap()
            .into_iter()
            .map(|s| s.path)
            .collect()
    }

    #[test]
    fn a_checkout_outside_the_guest_mounts_needs_no_share() {
        assert!(paths(&["/home/u/rsrdma", "/home/u/rsrdma/target"]).is_empty());
        // Component-wise: /tmpfoo is not under /tmp.
        assert!(paths(&["/tmpfoo/rsrdma", "/runner/target"]).is_empty());
    }

    #[test]
    fn a_checkout_under_tmp_is_shared_once() {
        assert_eq!(
            paths(&["/tmp/rsrdma", "/tmp/rsrdma/target"]),
            [PathBuf::from("/tmp/rsrdma")]
        );
        // The target directory first: the checkout containing it replaces it.
        assert_eq!(
            paths(&["/tmp/rsrdma/target", "/tmp/rsrdma"]),
            [PathBuf::from("/tmp/rsrdma")]
        );
    }

    #[test]
    fn separate_hidden_directories_get_a_share_each() {
        let shares = shares_for(&[Path::new("/home/u/rsrdma"), Path::new("/tmp/t")]).unwrap();
        assert_eq!(
            shares,
            [Share {
                tag: "xtaskdir0".into(),
                path: "/tmp/t".into()
            }]
        );
        assert_eq!(
            paths(&["/tmp/rsrdma", "/dev/shm/target"]),
            [
                PathBuf::from("/tmp/rsrdma"),
                PathBuf::from("/dev/shm/target")
            ]
        );
    }

    #[test]
    fn a_guest_mount_itself_is_refused() {
        let err = shares_for(&[Path::new("/tmp")]).unwrap_err();
        assert!(err.to_string().contains("/tmp/rsrdma"), "{err}");
    }
}
