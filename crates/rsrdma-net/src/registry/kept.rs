//! [`Registration`]: a name kept registered for as long as the handle lives.
//!
//! Leases exist so that a crashed process's names go away by themselves; the price is that a
//! live process must renew them. A `Registration` does it on a thread of its own: it renews
//! at a third of the lease granted (so two renewals may fail before the name lapses),
//! reconnects as the same owner when the registry connection breaks, and unregisters the
//! name when dropped.

use super::client::{ClientOptions, RegistryClient};
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
    /// Registers `name` → `addr` at `registry` (with the registry's default lease) and keeps
    /// it registered until the returned handle is dropped.
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
        let mut client = RegistryClient::connect(registry, opts.clone())?;
        let lease = client.register(name, &addr)?;
        let opts = opts.owner(Some(client.owner()));
        let (stop, stopped) = mpsc::channel();
        let owned = name.to_owned();
        let renewer = std::thread::Builder::new()
            .name("rs-registry-renew".into())
            .spawn(move || renew(client, registry, &opts, &owned, addr, lease, &stopped))
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

    /// The lease the registry granted first (renewals come at a third of it).
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Dropping the sender wakes the renewer, which unregisters and returns.
        drop(self.stop.take());
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
    }
}

fn renew(
    client: RegistryClient,
    registry: SocketAddr,
    opts: &ClientOptions,
    name: &str,
    addr: Addr,
    lease: Duration,
    stopped: &mpsc::Receiver<()>,
) {
    let mut client = Some(client);
    let mut every = (lease / 3).max(MIN_RENEW_EVERY);
    loop {
        match stopped.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            // Dropped: unregister (best effort) and stop.
            _ => {
                if let Some(mut c) = client {
                    let _ = c.unregister(name);
                }
                return;
            }
        }
        let renewed = match client.as_mut() {
            Some(c) => c.register(name, &addr),
            None => RegistryClient::connect(registry, opts.clone()).and_then(|mut c| {
                let r = c.register(name, &addr);
                client = Some(c);
                r
            }),
        };
        match renewed {
            Ok(granted) => every = (granted / 3).max(MIN_RENEW_EVERY),
            Err(e) => {
                tracing::warn!(name, error = %e, "registry renewal failed; retrying");
                // A broken connection is replaced at the next attempt.
                client = None;
                every = MIN_RENEW_EVERY.max(every / 2);
            }
        }
    }
}
