//! [`ConnOptions`]: how a [`crate::Conn`] is established, sized, and waits.
//!
//! Only local choices live here. Everything both ends must agree on (slot size, slot count,
//! message cap, protocol version) is announced in the handshake and settled by
//! [`rsrdma_proto::settle`], so two ends with different options still interoperate: nothing
//! has to match by luck.

use crate::progress::PollMode;
use rsrdma::Pd;
use rsrdma_proto::Config;
use std::time::Duration;

use rsrdma::option_setters as setters;

/// How two ends find each other and connect their queue pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Establish {
    /// rdma_cm (`rdma_connect`/`rdma_accept`): the protocol parameters travel in the connect
    /// and accept private data; the listener's address is an address of an RDMA device.
    #[default]
    Cm,
    /// The project's TCP handshake ([`crate::handshake`]): works wherever TCP does, also where
    /// rdma_cm cannot resolve a route; the TCP connection stays open as a liveness signal.
    Tcp,
}

/// A shared receive pool for every connection a [`crate::Listener`] accepts
/// ([`ConnOptions::shared_recv`]).
///
/// The accepted connections' QPs attach to one SRQ that holds `pool_slots` receive slots of
/// [`ConnOptions::slot_size`] bytes each, registered once: the listener's receive memory is
/// `pool_slots × slot_size` plus a few bytes of bookkeeping per connection, whatever the number
/// of connections. Each connection still grants its peer [`ConnOptions::recv_slots`] credits
/// (keep them small, e.g. 8–16); when the credits of all connections exceed the pool, a send
/// that finds the pool empty is retried by its sender after a short RNR delay (the listener
/// brings its QPs up so the peer retries without limit), so it is late, never lost. Messages
/// an application has not read yet leave the pool for the connection's own memory once the
/// pool is crowded (all but an eighth of its slots taken), so slow readers do not hold up
/// the other connections. Both
/// establishment paths support it; [`crate::Conn::dial`] refuses it (it is a listener option).
/// The pool is made per device when the first peer arrives; see
/// [`crate::Listener::recv_memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedRecv {
    /// Receive slots in the pool (the SRQ's depth), at least 1 and at most the device's
    /// `max_srq_wr`.
    pub pool_slots: u32,
}

impl SharedRecv {
    /// A pool of `pool_slots` receive slots.
    pub fn new(pool_slots: u32) -> SharedRecv {
        SharedRecv { pool_slots }
    }
}

/// Options of [`crate::Conn::dial`] and [`crate::Listener::bind`]. Build them from `Default`
/// with setters named after the fields: `ConnOptions::default().establish(Establish::Tcp)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnOptions {
    /// rdma_cm (default) or the TCP handshake.
    pub establish: Establish,
    /// How blocking calls wait for the NIC. Default: adaptive (spin 20 µs, then sleep).
    pub poll_mode: PollMode,
    /// Device name; `None`: the one rdma_cm resolves the address to, or the first device on
    /// the TCP path (or the device of [`ConnOptions::pd`]).
    pub device: Option<String>,
    /// Port, from 1 (TCP path; rdma_cm picks the port of the address).
    pub port: u8,
    /// GID index (TCP path); `None` lets [`rsrdma::Context::resolve_gid_index`] choose.
    pub gid_index: Option<u8>,
    /// A protection domain to create the connection in (TCP path; rdma_cm needs the domain to
    /// be on the device the address resolves to, which is checked, and made on rdma_cm's own
    /// context of it: librdmacm opens its devices itself, so take the context from a
    /// [`rsrdma::cm::CmId`] bound to that address, `CmId::context`).
    pub pd: Option<Pd>,
    /// Bytes per slot, the 16-byte frame header included. Default 32 KiB + 16 B: exactly
    /// 32 KiB of payload a frame, so power-of-two messages fill whole frames.
    pub slot_size: u32,
    /// Receive slots (the peer's credits). Default 32.
    pub recv_slots: u16,
    /// Send slots. Default 32. Registered memory per connection is
    /// `(send_slots + recv_slots) × slot_size`: 2 MiB + 1 KiB by default.
    pub send_slots: u16,
    /// Send-queue depth. Default 64.
    pub sq_depth: u16,
    /// Frames up to this many bytes (header included) go inline, capped at what the device
    /// grants. Default 128 (a 64-byte message goes inline).
    pub inline_size: u16,
    /// Largest message this side sends or accepts; the settled cap is the smaller of both
    /// ends'. Default 16 MiB. A rendezvous message longer than the device's `max_msg_sz`
    /// (1 GiB on mlx5) is read in pieces of that size.
    pub max_message: u32,
    /// PING after this long without hearing from the peer; `None` turns keepalive and
    /// dead-peer detection off. Default 1 s.
    pub keepalive: Option<Duration>,
    /// Declare the peer dead after this long without hearing from it while this side could
    /// listen (a side that did not run for over two keepalive intervals probes the peer and
    /// waits this long again). Default 5 s. Keep it above the RNR waits the peer's queue
    /// pair may impose (its RNR timer × the retry count): frames queue behind a SEND waiting
    /// out an RNR NAK, keepalives too, so a shorter timeout declares a live peer dead (seen
    /// with soft0's fault injection, `rsrdma::soft_faults::refuse_receives`).
    pub peer_timeout: Duration,
    /// Limit for the whole establishment of a dial, for each address: address resolution,
    /// this side's queue pair and memory, the TCP connect and the handshake, on either path
    /// (one deadline, not one per step). Default 10 s. On a listener: each peer's handshake
    /// (on the TCP path a peer it runs out on is told so, naming this option).
    pub connect_timeout: Duration,
    /// How long `close` waits for the queued data (and its FIN) to be delivered before it
    /// tears down anyway. Default 2 s.
    pub linger: Duration,
    /// Shared secret (at least 16 bytes): a listener admits only a peer that proves it, and
    /// a dialer only a listener that proves it back, on either path: the TCP handshake
    /// (which then also seals its control channel) or rdma_cm (proofs exchanged on the new
    /// queue pair before either side delivers or exposes anything). Both ends need it. Not
    /// with a shared receive pool on rdma_cm (refused).
    pub secret: Option<crate::Secret>,
    /// Listener only: every accepted connection receives from one shared pool
    /// ([`SharedRecv`]). Default `None`: each connection registers its own receive slots.
    pub shared_recv: Option<SharedRecv>,
    /// Rendezvous threshold: messages of at least this many bytes are pulled by the receiver
    /// with RDMA READ instead of copied through the slots, when the peer offers rendezvous
    /// too (the settled threshold is the larger of both). `None` does not offer rendezvous.
    /// Default 256 KiB.
    pub rendezvous: Option<u32>,
    /// Listener only: how long a new peer has to open its handshake (send a valid hello, and
    /// prove the secret when there is one; without a secret, send its first step after the
    /// hello, since anyone can send a hello) before it is dropped. Much shorter than a good
    /// client's [`ConnOptions::connect_timeout`], so silent sockets cannot hold the listener.
    /// On rdma_cm: from the connect request until the connection is established and, with a
    /// secret, the peer's proof has checked. Default 3 s.
    pub opening_timeout: Duration,
    /// Listener only: handshakes running at once (plus connections finished and not yet
    /// accepted). A new peer past it sheds the oldest handshake that has not opened yet and
    /// had an eighth of [`ConnOptions::opening_timeout`] to (younger ones are left alone:
    /// the new peer waits in the kernel's queue; so a burst of clients whose round trip is
    /// longer than that needs a longer opening timeout), else (without a secret, when a
    /// well-formed endpoint proves nothing) one that has kept the listener waiting for its
    /// next step longer than a quarter of [`ConnOptions::opening_timeout`]; a peer that
    /// proved the secret is never shed.
    /// Default 64.
    pub max_handshakes: usize,
    /// Listener only: handshakes from one source address that have not opened yet (see
    /// [`ConnOptions::opening_timeout`]) past which that source's are shed first once
    /// [`ConnOptions::max_handshakes`] is reached (below it nothing is shed, so a burst of
    /// good dials from one host is served whole). Default 16.
    pub max_handshakes_per_source: usize,
    /// Offer to be a rail of a striped connection (feature bit 1 of the protocol): set by
    /// [`crate::RailConn`] and [`crate::RailListener`] on the connections they make. A peer
    /// that does not offer it is a plain `Conn`, which a striped end then talks to as one
    /// plain connection. Default false.
    #[doc(hidden)]
    pub offer_rails: bool,
}

impl Default for ConnOptions {
    fn default() -> Self {
        let p = Config::default();
        ConnOptions {
            establish: Establish::Cm,
            poll_mode: PollMode::default(),
            device: None,
            port: 1,
            gid_index: None,
            pd: None,
            slot_size: p.slot_size,
            recv_slots: p.recv_slots,
            send_slots: p.send_slots,
            sq_depth: p.sq_depth,
            inline_size: p.inline_size,
            max_message: p.max_message,
            keepalive: p.keepalive,
            peer_timeout: p.peer_timeout,
            connect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(2),
            secret: None,
            shared_recv: None,
            rendezvous: Some(rsrdma_proto::DEFAULT_RDV_THRESHOLD),
            opening_timeout: Duration::from_secs(3),
            max_handshakes: 64,
            max_handshakes_per_source: 16,
            offer_rails: false,
        }
    }
}

setters!(ConnOptions {
    /// Sets [`ConnOptions::establish`].
    establish: Establish,
    /// Sets [`ConnOptions::poll_mode`].
    poll_mode: PollMode,
    /// Sets [`ConnOptions::device`].
    device: Option<String>,
    /// Sets [`ConnOptions::port`].
    port: u8,
    /// Sets [`ConnOptions::gid_index`].
    gid_index: Option<u8>,
    /// Sets [`ConnOptions::pd`].
    pd: Option<Pd>,
    /// Sets [`ConnOptions::slot_size`].
    slot_size: u32,
    /// Sets [`ConnOptions::recv_slots`].
    recv_slots: u16,
    /// Sets [`ConnOptions::send_slots`].
    send_slots: u16,
    /// Sets [`ConnOptions::sq_depth`].
    sq_depth: u16,
    /// Sets [`ConnOptions::inline_size`].
    inline_size: u16,
    /// Sets [`ConnOptions::max_message`].
    max_message: u32,
    /// Sets [`ConnOptions::keepalive`].
    keepalive: Option<Duration>,
    /// Sets [`ConnOptions::peer_timeout`].
    peer_timeout: Duration,
    /// Sets [`ConnOptions::connect_timeout`].
    connect_timeout: Duration,
    /// Sets [`ConnOptions::linger`].
    linger: Duration,
    /// Sets [`ConnOptions::secret`].
    secret: Option<crate::Secret>,
    /// Sets [`ConnOptions::shared_recv`].
    shared_recv: Option<SharedRecv>,
    /// Sets [`ConnOptions::rendezvous`].
    rendezvous: Option<u32>,
    /// Sets [`ConnOptions::opening_timeout`].
    opening_timeout: Duration,
    /// Sets [`ConnOptions::max_handshakes`].
    max_handshakes: usize,
    /// Sets [`ConnOptions::max_handshakes_per_source`].
    max_handshakes_per_source: usize,
});

impl ConnOptions {
    /// The protocol core's configuration, with the inline size capped at `max_inline` (what
    /// the queue pair granted).
    pub(crate) fn proto_config(&self, max_inline: u32) -> Config {
        let inline = u32::from(self.inline_size).min(max_inline);
        Config::default()
            .with_slot_size(self.slot_size)
            .with_recv_slots(self.recv_slots)
            .with_send_slots(self.send_slots)
            .with_sq_depth(self.sq_depth)
            .with_inline_size(inline as u16)
            .with_max_message(self.max_message)
            .with_keepalive(self.keepalive)
            .with_peer_timeout(self.peer_timeout)
            .with_features(
                match self.rendezvous {
                    Some(_) => rsrdma_proto::FEATURE_RENDEZVOUS | rsrdma_proto::FEATURE_WITHDRAW,
                    None => 0,
                } | if self.offer_rails {
                    rsrdma_proto::FEATURE_RAILS
                } else {
                    0
                },
            )
            .with_rdv_threshold(
                self.rendezvous
                    .unwrap_or(rsrdma_proto::DEFAULT_RDV_THRESHOLD),
            )
    }

    /// Refuses options whose queues `ctx`'s device cannot hold, naming the option (a dial,
    /// an accept, and a listener's bind where it knows its device).
    ///
    /// # Errors
    /// [`crate::NetError::InvalidArgument`] naming the option and the device's limit.
    pub(crate) fn check_fits(&self, ctx: &rsrdma::Context) -> crate::Result<()> {
        // rdma_cm authentication sends one proof beside the core's sends (`cm_auth`).
        let proof = u32::from(self.secret.is_some() && self.establish == crate::Establish::Cm);
        let cq = super::establish::cq_entries(u32::from(self.recv_slots), self.sq_depth);
        crate::domain::check_fits(
            ctx,
            &crate::domain::Fits {
                queues: &[
                    ("ConnOptions::recv_slots", u32::from(self.recv_slots)),
                    ("ConnOptions::sq_depth", u32::from(self.sq_depth) + proof),
                ],
                cqs: &[(
                    "the completion queue of a connection (recv_slots + sq_depth + 1)",
                    cq,
                )],
                srq: self
                    .shared_recv
                    .as_ref()
                    .map(|s| ("SharedRecv::pool_slots", s.pool_slots)),
            },
        )
    }

    /// Refuses options that cannot work, before any socket or verb.
    ///
    /// # Errors
    /// [`crate::NetError::InvalidArgument`] naming the rule.
    pub fn check(&self) -> crate::Result<()> {
        self.proto_config(u32::from(self.inline_size))
            .check()
            .map_err(|e| crate::NetError::InvalidArgument(format!("ConnOptions: {e}")))?;
        if self.shared_recv.is_some_and(|s| s.pool_slots == 0) {
            return Err(crate::NetError::InvalidArgument(
                "ConnOptions: shared_recv with a pool of 0 slots".into(),
            ));
        }
        if self.connect_timeout.is_zero() || self.opening_timeout.is_zero() {
            return Err(crate::NetError::InvalidArgument(
                "ConnOptions: connect_timeout and opening_timeout must be above 0".into(),
            ));
        }
        if self.max_handshakes == 0 || self.max_handshakes_per_source == 0 {
            return Err(crate::NetError::InvalidArgument(
                "ConnOptions: max_handshakes and max_handshakes_per_source must be above 0".into(),
            ));
        }
        crate::secret::check_secret(self.secret.as_ref(), "ConnOptions::secret")?;
        if self.secret.is_some() && self.establish == Establish::Cm && self.shared_recv.is_some() {
            // F5: rdma_cm's proofs land in a connection's own receive slots; a pooled
            // listener cannot check them yet, so the combination is refused, not left open.
            return Err(crate::NetError::InvalidArgument(
                "ConnOptions: a secret with a shared receive pool is checked on the TCP \
                 handshake only: use .establish(Establish::Tcp) on both ends"
                    .into(),
            ));
        }
        crate::domain::check_device(self.device.as_deref(), self.pd.as_ref())
    }

    /// The domain of [`ConnOptions::pd`], or a new one on `ctx` (checking a named device).
    pub(crate) fn domain_on(&self, ctx: &rsrdma::Context) -> crate::Result<Pd> {
        use crate::NetError;
        if let Some(name) = &self.device {
            if name != ctx.name() {
                return Err(NetError::InvalidArgument(format!(
                    "device {name} was named, but the address is on {}",
                    ctx.name()
                )));
            }
        }
        match &self.pd {
            Some(pd) if pd.context().name() == ctx.name() => Ok(pd.clone()),
            Some(pd) => Err(NetError::InvalidArgument(format!(
                "the protection domain is on {}, but the address is on {}",
                pd.context().name(),
                ctx.name()
            ))),
            None => Ok(Pd::new(ctx)?),
        }
    }

    /// Bytes of registered slot memory one connection uses (with [`ConnOptions::shared_recv`],
    /// an accepted connection registers only its send slots).
    pub fn slot_memory(&self) -> usize {
        (usize::from(self.send_slots) + usize::from(self.recv_slots)) * self.slot_size as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F5: a secret on rdma_cm is checked now (device test `a_secret_is_checked_on_rdma_cm`);
    /// the one combination that cannot check it yet (a shared pool on rdma_cm) is refused at
    /// bind, with an error that names the way out, never silently ignored.
    #[test]
    fn a_secret_with_a_pool_on_rdma_cm_is_refused_not_ignored() {
        let o = ConnOptions::default().secret(b"0123456789abcdef");
        o.check().unwrap();
        let pooled = o.clone().shared_recv(SharedRecv::new(16));
        let e = pooled.check().unwrap_err();
        assert!(e.to_string().contains("Establish::Tcp"), "{e}");
        let e = crate::Listener::bind("127.0.0.1:0", pooled.clone()).unwrap_err();
        assert!(matches!(e, crate::NetError::InvalidArgument(_)), "{e:?}");
        pooled.establish(Establish::Tcp).check().unwrap();
    }

    /// F4: a secret under 128 bits is refused wherever one is given, before any socket, with
    /// the limit named (a proof over a short secret can be guessed offline).
    #[test]
    fn a_short_secret_is_refused_wherever_it_is_given() {
        let short = b"hunter2hunter2!"; // 15 bytes
        let errors = [
            ConnOptions::default()
                .establish(Establish::Tcp)
                .secret(short)
                .check()
                .unwrap_err(),
            crate::RawConn::dial("127.0.0.1:9", crate::RawOptions::default().secret(short))
                .unwrap_err(),
            crate::Registry::serve_with(
                "127.0.0.1:0",
                crate::RegistryOptions::default().secret(short),
            )
            .unwrap_err(),
            crate::registry::RegistryClient::connect(
                "127.0.0.1:9",
                crate::registry::ClientOptions::default().secret(short),
            )
            .unwrap_err(),
        ];
        for e in errors {
            assert!(matches!(e, crate::NetError::InvalidArgument(_)), "{e:?}");
            assert!(e.to_string().contains("at least 16 bytes"), "{e}");
        }
        let good = crate::Secret::generate().unwrap();
        assert_eq!(good.len(), 32);
        assert_ne!(good, crate::Secret::generate().unwrap());
        ConnOptions::default()
            .establish(Establish::Tcp)
            .secret(Some(good))
            .check()
            .unwrap();
    }

    #[test]
    fn defaults_fit_in_two_mib_and_their_headers_and_check() {
        let o = ConnOptions::default();
        assert_eq!(o.slot_memory(), (2 << 20) + 64 * 16, "{}", o.slot_memory());
        o.check().unwrap();
        assert_eq!(o.establish, Establish::Cm);
        assert!(matches!(o.poll_mode, PollMode::Adaptive { .. }));
    }

    #[test]
    fn setters_set_and_bad_values_are_refused() {
        let o = ConnOptions::default()
            .establish(Establish::Tcp)
            .slot_size(4096)
            .recv_slots(16)
            .keepalive(None);
        assert_eq!(
            (o.establish, o.slot_size, o.recv_slots),
            (Establish::Tcp, 4096, 16)
        );
        assert_eq!(o.keepalive, None);
        o.check().unwrap();
        for bad in [
            ConnOptions::default().slot_size(16),
            ConnOptions::default().recv_slots(2),
            ConnOptions::default().max_message(0),
            ConnOptions::default().keepalive(Duration::from_secs(9)),
            ConnOptions::default().connect_timeout(Duration::ZERO),
        ] {
            let e = bad.check().unwrap_err().to_string();
            assert!(e.contains("ConnOptions"), "{e}");
        }
    }

    #[test]
    fn shared_recv_is_off_by_default_and_an_empty_pool_is_refused() {
        assert_eq!(ConnOptions::default().shared_recv, None);
        let o = ConnOptions::default().shared_recv(SharedRecv::new(512));
        assert_eq!(o.shared_recv.map(|s| s.pool_slots), Some(512));
        o.check().unwrap();
        let e = ConnOptions::default()
            .shared_recv(SharedRecv::new(0))
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("shared_recv"), "{e}");
    }

    #[test]
    fn inline_is_capped_by_the_device() {
        let o = ConnOptions::default().inline_size(256);
        assert_eq!(o.proto_config(100).inline_size, 100);
        assert_eq!(o.proto_config(1000).inline_size, 256);
    }
}
