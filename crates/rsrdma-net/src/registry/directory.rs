//! [`Directory`]: what a name directory offers, whichever backend serves it.
//!
//! Two backends implement it with the same semantics: the built-in server
//! ([`RegistryClient`], one process, for development and tests) and etcd
//! ([`super::EtcdDirectory`], for clusters). Code written against the trait (and
//! [`super::Registration`]) runs on either.

use super::client::RegistryClient;
use super::codec::OWNER_LEN;
use crate::error::Result;
use crate::packet::Addr;
use std::time::{Duration, Instant};

/// How often [`Directory::watch`]'s default implementation looks again.
pub const WATCH_POLL: Duration = Duration::from_millis(20);

/// A name → [`Addr`] directory with leases and owners.
///
/// - A name registered with a lease lives until the lease runs out, unless renewed (register
///   it again) or unregistered.
/// - A live name belongs to the owner that registered it ([`Directory::owner`]); another
///   owner's register or unregister fails with [`super::ErrorCode::NotOwner`].
/// - Errors about names are [`crate::NetError::Registry`] with an [`super::ErrorCode`]
///   (`NotFound`, `NotOwner`, `Full`…), the same on every backend.
pub trait Directory {
    /// Who this client registers names as.
    fn owner(&self) -> [u8; OWNER_LEN];

    /// Registers or renews `name` → `addr` with a lease of `lease` (zero: the backend's
    /// default); returns the lease granted.
    ///
    /// # Errors
    /// `NotOwner` when another owner holds the name; `Full`; connection errors.
    fn register_for(&mut self, name: &str, addr: &Addr, lease: Duration) -> Result<Duration>;

    /// The address registered under `name`.
    ///
    /// # Errors
    /// `NotFound` when no live entry has it; connection errors.
    fn lookup(&mut self, name: &str) -> Result<Addr>;

    /// Removes `name`.
    ///
    /// # Errors
    /// `NotFound`, `NotOwner`; connection errors.
    fn unregister(&mut self, name: &str) -> Result<()>;

    /// Waits until `name`'s entry is not `seen` any more (registered, moved, removed or
    /// expired), at most `timeout`; returns what it is now (`None`: no live entry), or `seen`
    /// again at the timeout.
    ///
    /// # Errors
    /// Connection errors.
    fn watch(&mut self, name: &str, seen: Option<Addr>, timeout: Duration) -> Result<Option<Addr>> {
        let deadline = crate::deadline::deadline_after(timeout);
        loop {
            let now = match self.lookup(name) {
                Ok(a) => Some(a),
                Err(crate::NetError::Registry {
                    code: super::ErrorCode::NotFound,
                    ..
                }) => None,
                Err(e) => return Err(e),
            };
            if now != seen || Instant::now() >= deadline {
                return Ok(now);
            }
            std::thread::sleep(WATCH_POLL.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
}

impl Directory for RegistryClient {
    fn owner(&self) -> [u8; OWNER_LEN] {
        RegistryClient::owner(self)
    }

    fn register_for(&mut self, name: &str, addr: &Addr, lease: Duration) -> Result<Duration> {
        RegistryClient::register_for(self, name, addr, lease)
    }

    fn lookup(&mut self, name: &str) -> Result<Addr> {
        RegistryClient::lookup(self, name)
    }

    fn unregister(&mut self, name: &str) -> Result<()> {
        RegistryClient::unregister(self, name)
    }
}
