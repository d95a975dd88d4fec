//! A lock, so that two runs do not share target/vm-out or rebuild the cache at once.

use super::say;
use anyhow::{Context, Result};
use std::fs;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Held while it lives; unlocked on drop.
pub(super) struct Lock(fs::File);

/// Takes the lock in `path`, waiting (and saying so) while another run holds it.
pub(super) fn lock(path: &Path) -> Result<Lock> {
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
