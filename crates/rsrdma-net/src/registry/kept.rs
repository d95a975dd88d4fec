//! [`Registration`]: a name kept registered for as long as the handle lives.
//!
//! Leases exist so that a crashed process's names go away by themselves; the price is that a
//! live process must renew them. A `Registration` does it on a thread of its own: it renews
//! at a third of the lease granted (so two renewals may fail before the name lapses),
//! reconnects as the same owner when the directory connection breaks, and unregisters the
//! name when dropped. It works on any [`Directory`] backend.

use super::client::{ClientOptions, RegistryClient};
use super::directory::Directory;
use super::etcd::{EtcdDirectory, EtcdOptions};
use crate::error::{NetError, Result};
use crate::packet::Addr;
use std::net::SocketAddr;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Shortest pause between renewals, whatever the lease.
const MIN_RENEW_EVERY: Duration = Duration::from_millis(50);

/// A name registered and renewed in the background until dropped. See the module docs.
#[derive(Debug)]
pub struct Registration {
    name: String,
    lease: Duration,
    stop: Option<mpsc::Sender<()>>,
    renewer: Option<JoinHandle<()>>,
}

impl Registration {
    /// Registers `name` → `addr` at the built-in registry at `registry` (with its default
    /// lease) and keeps it registered until the returned handle is dropped.
    ///
    /// # Errors
    /// The errors of the first [`RegistryClient::connect`] and
    /// [`RegistryClient::register`] (a name held by another owner gives `NotOwner`). Later
    /// renewal failures are logged (`tracing`, WARN) and retried.
    pub fn keep(
        registry: SocketAddr,
        opts: ClientOptions,
        name: &str,
        addr: Addr,
    ) -> Result<Registration> {
        let first = RegistryClient::connect(registry, opts.clone())?;
        let opts = opts.owner(Some(first.owner()));
        let mut first = Some(first);
        Registration::keep_on(
            move || match first.take() {
                Some(c) => Ok(c),
                None => RegistryClient::connect(registry, opts.clone()),
            },
            name,
            addr,
        )
    }

    /// As [`Registration::keep`], on etcd ([`EtcdDirectory`]).
    ///
    /// # Errors
    /// As [`EtcdDirectory::connect`] and [`Directory::register_for`].
    pub fn keep_on_etcd(
        endpoints: Vec<SocketAddr>,
        opts: EtcdOptions,
        name: &str,
        addr: Addr,
    ) -> Result<Registration> {
        let first = EtcdDirectory::connect(&endpoints[..], opts.clone())?;
        let opts = opts.owner(Some(first.owner()));
        let mut first = Some(first);
        Registration::keep_on(
            move || match first.take() {
                Some(d) => Ok(d),
                None => EtcdDirectory::connect(&endpoints[..], opts.clone()),
            },
            name,
            addr,
        )
    }

    /// Keeps `name` → `addr` registered on the directories `connect` makes: the first one
    /// registers it now, and a new one replaces a connection that failed. Every directory
    /// `connect` returns must act as the same owner.
    ///
    /// # Errors
    /// The errors of the first `connect` and registration.
    pub fn keep_on<D, F>(mut connect: F, name: &str, addr: Addr) -> Result<Registration>
    where
        D: Directory + Send + 'static,
        F: FnMut() -> Result<D> + Send + 'static,
    {
        let mut dir = connect()?;
        let lease = dir.register_for(name, &addr, Duration::ZERO)?;
        let (stop, stopped) = mpsc::channel();
        let owned = name.to_owned();
        let renewer = std::thread::Builder::new()
            .name("rs-registry-renew".into())
            .spawn(move || renew(Some(dir), &mut connect, &owned, addr, lease, &stopped))
            .map_err(|e| NetError::io("spawn the renewal thread", e))?;
        Ok(Registration {
            name: name.to_owned(),
            lease,
            stop: Some(stop),
            renewer: Some(renewer),
        })
    }

    /// The name kept.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease the directory granted first (renewals come at a third of it).
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

/// Unregisters the name, waiting for the registry's answer: at most about one client timeout
/// ([`ClientOptions::timeout`], 5 s by default) when the registry does not answer, plus
/// what a renewal in progress still takes. A name that could not be unregistered lapses
/// with its lease. In async code, drop it on the blocking pool
/// (`tokio::task::spawn_blocking`).
impl Drop for Registration {
    fn drop(&mut self) {
        // Dropping the sender wakes the renewer, which unregisters and returns.
        drop(self.stop.take());
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
    }
}

fn renew<D: Directory>(
    mut dir: Option<D>,
    connect: &mut dyn FnMut() -> Result<D>,
    name: &str,
    addr: Addr,
    lease: Duration,
    stopped: &mpsc::Receiver<()>,
) {
    let mut every = (lease / 3).max(MIN_RENEW_EVERY);
    // After a failure the next try comes sooner (the lease runs on), but not sooner than a
    // tenth of the lease: a registry that is down, full, or gave the name to another owner
    // is not asked twenty times a second, and its warning is logged once per outage.
    let mut retry_floor = (lease / 10).max(MIN_RENEW_EVERY);
    let mut failing = 0u32;
    loop {
        match stopped.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            // Dropped: unregister (best effort) and stop. On the connection it has, else (none,
            // or it broke: a full registry sheds clients idle for a second, as this one mostly
            // is) on a new one: the name must not outlive its Registration by a lease. Not
            // after a timeout: a registry that does not answer one connection would not
            // answer a new one either, and the drop would wait twice (the name then lapses
            // with its lease).
            _ => {
                let first = dir.as_mut().map(|d| d.unregister(name));
                let answered = first.as_ref().is_some_and(|r| {
                    matches!(
                        r,
                        Ok(()) | Err(NetError::Registry { .. } | NetError::Timeout { .. })
                    )
                });
                if !answered {
                    if let Ok(mut d) = connect() {
                        let _ = d.unregister(name);
                    }
                }
                return;
            }
        }
        let renewed = match dir.as_mut() {
            Some(d) => d.register_for(name, &addr, Duration::ZERO),
            None => connect().and_then(|mut d| {
                let r = d.register_for(name, &addr, Duration::ZERO);
                dir = Some(d);
                r
            }),
        };
        match renewed {
            Ok(granted) => {
                if failing > 0 {
                    tracing::info!(name, failures = failing, "registry renewal works again");
                }
                failing = 0;
                every = (granted / 3).max(MIN_RENEW_EVERY);
                retry_floor = (granted / 10).max(MIN_RENEW_EVERY);
            }
            Err(e) => {
                failing += 1;
                if failing == 1 {
                    tracing::warn!(name, error = %e, "registry renewal failed; retrying");
                } else {
                    tracing::debug!(name, error = %e, failures = failing, "registry renewal failed again");
                }
                // A broken connection is replaced at the next attempt.
                dir = None;
                every = retry_floor.max(every / 2);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A directory that registers, then times out on every unregistration.
    struct Silent;

    impl Directory for Silent {
        fn owner(&self) -> [u8; super::super::codec::OWNER_LEN] {
            [1; super::super::codec::OWNER_LEN]
        }
        fn register_for(&mut self, _: &str, _: &Addr, _: Duration) -> Result<Duration> {
            Ok(Duration::from_secs(30))
        }
        fn lookup(&mut self, _: &str) -> Result<Addr> {
            Err(NetError::InvalidArgument("none".into()))
        }
        fn unregister(&mut self, _: &str) -> Result<()> {
            Err(NetError::Timeout {
                op: "registry call",
                millis: 5000,
            })
        }
    }

    /// A registry that does not answer the unregistration is asked once, not again on a new
    /// connection (an outside tester's find: the drop waited for two timeouts).
    #[test]
    fn a_drop_asks_a_registry_that_timed_out_only_once() {
        let connects = Arc::new(AtomicUsize::new(0));
        let counted = connects.clone();
        let r = Registration::keep_on(
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(Silent)
            },
            "name",
            "fe80::1%0x12".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(connects.load(Ordering::SeqCst), 1);
        drop(r);
        assert_eq!(connects.load(Ordering::SeqCst), 1, "no second connection");
    }
}
