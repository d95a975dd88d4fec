//! [`PacketConn`]: a UD endpoint with `send_to`/`recv_from`, safe to share between threads.

use super::addr::{Addr, MAX_QPN};
use super::gate::Gate;
use super::grh::GRH_LEN;
use super::options::PacketOptions;
use super::recv::{Ready, RecvQueue, RecvRing};
#[cfg(feature = "tokio")]
use super::send::Made;
use super::send::{make_ah, Posted, Route, SendRing, CHUNK};
use crate::error::{NetError, Result};
use crate::progress::{wait_until, PollMode};
use rsrdma::{CompChannel, Cq, InitAttr, Pd, Qp, QpCaps, QpType, RtrAttr, RtsAttr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Buffers are laid out on cache-line boundaries.
const ALIGN: usize = 64;
/// How long dropping a connection waits for its last sends to leave.
const DROP_FLUSH: Duration = Duration::from_secs(1);
/// "No timeout" in the atomic timeout fields.
const NO_TIMEOUT: u64 = u64::MAX;

/// A UD datagram endpoint. See the [module docs](super).
pub struct PacketConn {
    // Field order is drop order: the QP goes before the CQs and buffers it uses.
    qp: Qp,
    send: Mutex<SendRing>,
    send_cq: Cq,
    send_gate: Gate<Cq>,
    recv: RecvRing,
    queue: Mutex<RecvQueue>,
    recv_cq: Cq,
    recv_gate: Gate<Cq>,
    pd: Pd,
    local: Addr,
    route: Route,
    max_datagram: usize,
    mode: PollMode,
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
}

// Shared by threads: every method takes `&self`.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<PacketConn>();
};

/// Counters of a [`PacketConn`], from [`PacketConn::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PacketStats {
    /// Datagrams posted for sending.
    pub sent: u64,
    /// Datagrams handed to callers.
    pub received: u64,
    /// Send completions with an error.
    pub send_errors: u64,
    /// Receive completions with an error (not counting the flush at teardown).
    pub recv_errors: u64,
    /// Datagrams dropped on arrival for being larger than [`PacketConn::max_datagram`] (a
    /// receive buffer rounds up past it; what does not fit it at all the NIC drops uncounted).
    pub oversized: u64,
    /// Address handles created (cache misses).
    pub ah_created: u64,
    /// Address handles cached now.
    pub ah_cached: usize,
}

impl std::fmt::Debug for PacketConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketConn")
            .field("local", &self.local)
            .field("max_datagram", &self.max_datagram)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn round_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// The most a stored limit holds: a limit this long or longer (584 years) reads back as
/// `Duration::MAX`, so that `set_read_timeout(Some(Duration::MAX))` reads back as it was set.
const LONGEST: u64 = NO_TIMEOUT - 1;

fn to_nanos(t: Option<Duration>) -> u64 {
    t.map_or(NO_TIMEOUT, |d| d.as_nanos().min(u128::from(LONGEST)) as u64)
}

fn from_nanos(n: u64) -> Option<Duration> {
    match n {
        NO_TIMEOUT => None,
        LONGEST => Some(Duration::MAX),
        n => Some(Duration::from_nanos(n)),
    }
}

impl PacketConn {
    /// Opens the device, creates a UD queue pair with its own send and receive CQs, posts
    /// every receive buffer and moves the queue pair to RTS with [`PacketOptions::qkey`].
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for depths of 0, a `max_datagram` of 0 or a device that
    /// differs from the shared domain's; the verbs errors of the setup (a depth over the
    /// device's limits gives [`rsrdma::Error::Limit`]).
    pub fn bind(opts: PacketOptions) -> Result<PacketConn> {
        check_options(&opts)?;
        let (ctx, pd) = crate::domain::open_domain(opts.device.as_deref(), opts.pd.as_ref())?;
        let port = ctx.query_port(opts.port)?;
        let gid_index = ctx
            .resolve_gid_index(opts.port, opts.gid_index)?
            .unwrap_or(0);
        let mtu = port.active_mtu.map_or(1024, |m| m.bytes()) as usize;
        let max_datagram = opts.max_datagram.map_or(mtu, |m| (m as usize).min(mtu));
        let channel = || -> Result<Option<CompChannel>> {
            Ok(match opts.poll_mode.needs_channel() {
                true => Some(CompChannel::new(&ctx)?),
                false => None,
            })
        };
        let send_cq = Cq::new(&ctx, opts.send_depth, channel()?.as_ref())?;
        let recv_cq = Cq::new(&ctx, opts.recv_depth, channel()?.as_ref())?;
        let caps = QpCaps::default()
            .max_send_wr(opts.send_depth)
            .max_recv_wr(opts.recv_depth);
        let qp = Qp::builder(QpType::Ud)
            .caps(caps)
            .build(&pd, &send_cq, &recv_cq)?;
        let send = SendRing::new(&pd, opts.send_depth, round_up(max_datagram), opts.ah_cache)?;
        let recv = RecvRing::new(&pd, opts.recv_depth, round_up(GRH_LEN + max_datagram))?;
        qp.to_init(&InitAttr::default().port(opts.port).qkey(opts.qkey))?;
        // Receives go up before the QP can take traffic.
        let slots: Vec<u32> = (0..opts.recv_depth).collect();
        recv.post(&qp, &slots)?;
        qp.to_rtr(&RtrAttr::default())?;
        qp.to_rts(&RtsAttr::default())?;
        let gid = ctx.query_gid(opts.port, gid_index.into())?.gid;
        let local = Addr {
            gid,
            qpn: qp.qp_num(),
            qkey: opts.qkey,
        };
        tracing::debug!(%local, max_datagram, "UD endpoint bound");
        Ok(PacketConn {
            qp,
            send: Mutex::new(send),
            send_gate: Gate::new(send_cq.clone()),
            send_cq,
            recv,
            queue: Mutex::new(RecvQueue::new(opts.recv_depth, max_datagram)),
            recv_gate: Gate::new(recv_cq.clone()),
            recv_cq,
            pd,
            local,
            route: Route {
                port: opts.port,
                sgid_index: gid_index,
                hop_limit: opts.hop_limit,
                traffic_class: opts.traffic_class,
            },
            max_datagram,
            mode: opts.poll_mode,
            read_timeout: AtomicU64::new(to_nanos(opts.read_timeout)),
            write_timeout: AtomicU64::new(to_nanos(opts.write_timeout)),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
        })
    }

    /// This endpoint's address: give it to peers (as text, or through a registry).
    pub fn local_addr(&self) -> Addr {
        self.local
    }

    /// The largest datagram this endpoint sends and receives.
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    /// The protection domain, for memory shared with other connections.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The receive time limit.
    pub fn read_timeout(&self) -> Option<Duration> {
        from_nanos(self.read_timeout.load(Ordering::Relaxed))
    }

    /// Sets the receive time limit (`None`: block indefinitely), as
    /// [`std::net::UdpSocket::set_read_timeout`] and [`crate::Conn::set_read_timeout`].
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a zero duration.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> Result<()> {
        check_timeout(t)?;
        self.read_timeout.store(to_nanos(t), Ordering::Relaxed);
        Ok(())
    }

    /// The time limit of a send waiting for a free buffer.
    pub fn write_timeout(&self) -> Option<Duration> {
        from_nanos(self.write_timeout.load(Ordering::Relaxed))
    }

    /// Sets the time limit of a send waiting for a free buffer (`None`: block indefinitely).
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a zero duration.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> Result<()> {
        check_timeout(t)?;
        self.write_timeout.store(to_nanos(t), Ordering::Relaxed);
        Ok(())
    }

    /// The counters.
    pub fn stats(&self) -> PacketStats {
        let send = lock(&self.send);
        let (ah_created, ah_cached) = send.ah_stats();
        let (recv_errors, oversized) = {
            let q = lock(&self.queue);
            (q.errors, q.oversized)
        };
        PacketStats {
            sent: self.sent.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            send_errors: send.errors,
            recv_errors,
            oversized,
            ah_created,
            ah_cached,
        }
    }

    /// What a datagram must be before anything is posted: no longer than the limit, to a
    /// queue pair number that fits its 24 bits (the fields of an [`Addr`] are public, and a
    /// wider one would be cut by the NIC, the datagram going to another queue pair or to
    /// none while the send said `Ok`).
    fn check_datagram(&self, data: &[u8], to: &Addr) -> Result<()> {
        if data.len() > self.max_datagram {
            return Err(NetError::DatagramTooLarge {
                len: data.len(),
                limit: self.max_datagram,
            });
        }
        if to.qpn > MAX_QPN {
            return Err(NetError::InvalidArgument(format!(
                "the destination's queue pair number {:#x} is over 24 bits",
                to.qpn
            )));
        }
        Ok(())
    }

    /// Sends one datagram to `to`, returning its length. Returns once the datagram is
    /// posted (copied into a send buffer), waiting only when every buffer is in flight.
    ///
    /// # Errors
    /// [`NetError::DatagramTooLarge`] (nothing sent); [`NetError::InvalidArgument`] for a
    /// queue pair number over 24 bits (nothing sent); [`NetError::Timeout`] when no buffer
    /// freed up within the write timeout; a failed earlier send's completion error (the send
    /// queue stops at its first error, so every later send reports it); verbs errors.
    pub fn send_to(&self, buf: &[u8], to: &Addr) -> Result<usize> {
        self.send_batch(&[(buf, *to)])?;
        Ok(buf.len())
    }

    /// Sends many datagrams, posting up to 32 per call into the provider. Returns how many
    /// were sent, from the first: all of them, or fewer when the write timeout passed or a
    /// datagram failed (an address that gives no address handle, a failed queue pair) after
    /// some were sent, as `sendmmsg(2)` does: resend from the first one not sent, and the
    /// error, if it lasts, comes back then.
    ///
    /// # Errors
    /// As [`PacketConn::send_to`], when none was sent; an oversized datagram or a bad
    /// queue pair number anywhere refuses the whole batch before anything is sent.
    pub fn send_batch(&self, msgs: &[(&[u8], Addr)]) -> Result<usize> {
        for (data, to) in msgs {
            self.check_datagram(data, to)?;
        }
        let timeout = self.write_timeout();
        let deadline = crate::deadline::deadline_within(timeout);
        lock(&self.send).take_failure()?;
        let (mut done, mut made) = (0, None);
        while done < msgs.len() {
            let posted = {
                let mut ring = lock(&self.send);
                match ring.reap(&self.send_cq) {
                    Ok(()) => ring.post(&self.qp, &msgs[done..], made.take()),
                    Err(e) => Posted {
                        n: 0,
                        error: Some(e),
                        missing: None,
                    },
                }
            };
            self.sent.fetch_add(posted.n as u64, Ordering::Relaxed);
            done += posted.n;
            let waited = match (posted.error, posted.missing) {
                (Some(e), _) => Err(e),
                // Made outside the send lock: the kernel may take seconds over an address
                // that does not answer, and other threads' sends go on meanwhile.
                (None, Some(to)) => make_ah(&self.pd, self.route, &to).map(|m| {
                    made = Some(m);
                    true
                }),
                (None, None) if posted.n == 0 => self.wait_send(deadline, |r| r.free() > 0),
                (None, None) => Ok(true),
            };
            match waited {
                Ok(true) => {}
                Ok(false) if done == 0 => {
                    return Err(timed_out(
                        "send_to (waiting for a free send buffer)",
                        timeout,
                    ))
                }
                // Those sent are counted (as sendmmsg(2) does): the caller resends from the
                // first one not sent, and meets the error again there if it lasts.
                Ok(false) => return Ok(done),
                Err(e) if done == 0 => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, sent = done, "a send batch stopped short");
                    return Ok(done);
                }
            }
        }
        Ok(done)
    }

    /// Waits until every datagram sent so far has left (its completion is reaped).
    ///
    /// # Errors
    /// [`NetError::Timeout`] after `timeout`; a failed send's completion error.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        if !self.wait_send(Some(crate::deadline::deadline_after(timeout)), |r| r.idle())? {
            return Err(timed_out("flush", Some(timeout)));
        }
        lock(&self.send).take_failure()
    }

    fn wait_send(
        &self,
        deadline: Option<Instant>,
        ready: impl Fn(&SendRing) -> bool,
    ) -> Result<bool> {
        wait_until(self.mode, &self.send_gate, deadline, || {
            let mut ring = lock(&self.send);
            ring.reap(&self.send_cq)?;
            Ok(ready(&ring))
        })
    }

    /// Receives one datagram into `buf`: its length and the sender's address (with the GID
    /// from the GRH, so `send_to(reply, &from)` answers it). The sender's Q_Key is not on the
    /// wire: `from` carries this endpoint's own, which is right when both use the same.
    ///
    /// # Errors
    /// [`NetError::BufferTooSmall`] when `buf` cannot hold the next datagram, which stays
    /// queued; [`NetError::Timeout`] after the read timeout (the endpoint stays usable);
    /// the flushed receive's completion error once the queue pair failed (after the
    /// datagrams that arrived before it); verbs errors.
    pub fn recv_from(&self, buf: &mut [u8]) -> Result<(usize, Addr)> {
        let mut meta = [(0, self.local)];
        self.recv_batch(&mut [buf], &mut meta)?;
        Ok(meta[0])
    }

    /// Receives up to `min(bufs.len(), meta.len())` datagrams: waits for the first (as
    /// [`PacketConn::recv_from`]), then takes whatever else is already there. `meta[i]` is the
    /// length and sender of the datagram in `bufs[i]`. Returns how many.
    ///
    /// # Errors
    /// As [`PacketConn::recv_from`]; [`NetError::BufferTooSmall`] only for the first.
    pub fn recv_batch(&self, bufs: &mut [&mut [u8]], meta: &mut [(usize, Addr)]) -> Result<usize> {
        let want = bufs.len().min(meta.len());
        if want == 0 {
            return Ok(0);
        }
        let timeout = self.read_timeout();
        let deadline = crate::deadline::deadline_within(timeout);
        loop {
            let mut taken = [None::<Ready>; CHUNK];
            // Only `want` of them: `deliver` fills `meta` for each one taken.
            let n = self.take(&bufs[..want], &mut taken)?;
            if n > 0 {
                return self.deliver(&taken[..n], bufs, meta);
            }
            let arrived = wait_until(self.mode, &self.recv_gate, deadline, || {
                let mut q = lock(&self.queue);
                q.refill(&self.recv_cq, &self.qp, &self.recv)?;
                Ok(!q.is_empty() || q.failed.is_some())
            })?;
            if !arrived {
                return Err(timed_out("recv_from", timeout));
            }
        }
    }

    /// Takes up to [`CHUNK`] ready datagrams that fit `bufs`, in order.
    fn take(&self, bufs: &[&mut [u8]], taken: &mut [Option<Ready>; CHUNK]) -> Result<usize> {
        let mut q = lock(&self.queue);
        q.refill(&self.recv_cq, &self.qp, &self.recv)?;
        if q.is_empty() {
            if let Some(wc) = &q.failed {
                // What arrived before was taken: nothing more will.
                wc.ok()?;
            }
        }
        let mut n = 0;
        while n < bufs.len().min(CHUNK) {
            match q.front() {
                Some(r) if r.len as usize > bufs[n].len() => {
                    if n == 0 {
                        return Err(NetError::BufferTooSmall {
                            needed: r.len as usize,
                            got: bufs[0].len(),
                        });
                    }
                    break;
                }
                Some(_) => {
                    taken[n] = q.pop();
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    /// Copies taken datagrams out and reposts their buffers.
    fn deliver(
        &self,
        taken: &[Option<Ready>],
        bufs: &mut [&mut [u8]],
        meta: &mut [(usize, Addr)],
    ) -> Result<usize> {
        let mut slots = [0u32; CHUNK];
        let mut copied = Ok(());
        for (i, r) in taken.iter().flatten().enumerate() {
            slots[i] = r.slot;
            match self.recv.copy_out(r, bufs[i]) {
                Ok(gid) => {
                    meta[i] = (
                        r.len as usize,
                        Addr {
                            gid,
                            qpn: r.src_qp,
                            qkey: self.local.qkey,
                        },
                    )
                }
                Err(e) => copied = Err(e),
            }
        }
        // Repost even when a copy failed: a buffer not reposted is a receive lost for good.
        // A repost that fails (the QP is breaking: its next completions are flushes, which
        // the next call reports) does not take back the datagrams already copied out.
        if let Err(e) = self.recv.post(&self.qp, &slots[..taken.len()]) {
            tracing::warn!(error = %e, "a UD endpoint could not repost its receive buffers");
        }
        copied?;
        self.received
            .fetch_add(taken.len() as u64, Ordering::Relaxed);
        Ok(taken.len())
    }
}

// ===== BEGIN async hooks (feature `tokio`, used by `crate::asyncio`) =====================
// Non-blocking variants of send and receive, and the CQs whose channels the async layer
// watches through the reactor. Nothing outside this block changes for it.
#[cfg(feature = "tokio")]
impl PacketConn {
    /// [`PacketConn::send_to`] without waiting: [`SendAttempt::Full`] when every send buffer
    /// is in flight, [`SendAttempt::NeedsAh`] when `to` has no address handle yet (make it
    /// with [`PacketConn::ah_maker`], off the runtime, and pass it as `made` to the next
    /// attempt). Nothing was sent in either case.
    ///
    /// # Errors
    /// As [`PacketConn::send_to`], less the timeout.
    pub(crate) fn try_send_to(
        &self,
        buf: &[u8],
        to: &Addr,
        made: &mut Option<Made>,
    ) -> Result<SendAttempt> {
        self.check_datagram(buf, to)?;
        let posted = {
            let mut ring = lock(&self.send);
            ring.take_failure()?;
            ring.reap(&self.send_cq)?;
            ring.post(&self.qp, &[(buf, *to)], made.take())
        };
        Ok(match (posted.error, posted.missing) {
            (Some(e), _) => return Err(e),
            (None, Some(to)) => SendAttempt::NeedsAh(to),
            (None, None) if posted.n == 0 => SendAttempt::Full,
            (None, None) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
                SendAttempt::Sent(buf.len())
            }
        })
    }

    /// Makes the address handle for `to` when called: it may block (the kernel resolving
    /// the path), so an async caller runs it on the blocking pool.
    pub(crate) fn ah_maker(&self, to: Addr) -> impl FnOnce() -> Result<Made> + Send + 'static {
        let (pd, route) = (self.pd.clone(), self.route);
        move || make_ah(&pd, route, &to)
    }

    /// [`PacketConn::recv_from`] without waiting: `Ok(None)` when no datagram is there.
    /// Taking the datagram and copying it out happen in this one call.
    ///
    /// # Errors
    /// As [`PacketConn::recv_from`], less the timeout.
    pub(crate) fn try_recv_from(&self, buf: &mut [u8]) -> Result<Option<(usize, Addr)>> {
        let mut taken = [None::<Ready>; CHUNK];
        let mut bufs = [buf];
        let n = self.take(&bufs, &mut taken)?;
        if n == 0 {
            return Ok(None);
        }
        let mut meta = [(0, self.local)];
        self.deliver(&taken[..n], &mut bufs, &mut meta)?;
        Ok(Some(meta[0]))
    }

    /// The send and the receive CQ (each on a channel of its own unless the mode is busy).
    pub(crate) fn cqs(&self) -> (&Cq, &Cq) {
        (&self.send_cq, &self.recv_cq)
    }

    /// The poll mode it was bound with.
    pub(crate) fn poll_mode(&self) -> PollMode {
        self.mode
    }
}
// ===== END async hooks =================================================================

impl Drop for PacketConn {
    fn drop(&mut self) {
        // Let the last datagrams leave before the queue pair is destroyed.
        if let Err(e) = self.flush(DROP_FLUSH) {
            tracing::debug!(error = %e, "UD endpoint dropped with sends unfinished");
        }
    }
}

fn timed_out(op: &'static str, t: Option<Duration>) -> NetError {
    NetError::Timeout {
        op,
        millis: t.map_or(0, crate::deadline::whole_millis),
    }
}

/// A zero timeout is an error, as on std's sockets and [`crate::Conn`].
fn check_timeout(t: Option<Duration>) -> Result<()> {
    if t.is_some_and(|t| t.is_zero()) {
        return Err(NetError::InvalidArgument(
            "a zero timeout is not allowed (use None to block)".into(),
        ));
    }
    Ok(())
}

fn check_options(opts: &PacketOptions) -> Result<()> {
    check_timeout(opts.read_timeout)?;
    check_timeout(opts.write_timeout)?;
    let bad = |m: &str| Err(NetError::InvalidArgument(m.into()));
    if opts.send_depth == 0 || opts.recv_depth == 0 {
        return bad("PacketOptions: send_depth and recv_depth must be at least 1");
    }
    if opts.max_datagram == Some(0) {
        return bad("PacketOptions: max_datagram must be at least 1");
    }
    crate::domain::check_device(opts.device.as_deref(), opts.pd.as_ref())
}

/// What [`PacketConn::try_send_to`] did.
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub(crate) enum SendAttempt {
    /// Posted: the datagram's length.
    Sent(usize),
    /// Every send buffer is in flight.
    Full,
    /// The destination has no address handle yet.
    NeedsAh(Addr),
}

#[cfg(test)]
mod tests {
    use super::{from_nanos, to_nanos};
    use std::time::Duration;

    #[test]
    fn a_stored_time_limit_reads_back_as_it_was_set() {
        for t in [
            None,
            Some(Duration::from_nanos(1)),
            Some(Duration::from_millis(250)),
            Some(Duration::from_secs(86_400 * 365)),
            Some(Duration::MAX),
        ] {
            assert_eq!(from_nanos(to_nanos(t)), t);
        }
        // Past what nanoseconds in a u64 hold: forever, as set.
        let long = Some(Duration::from_secs(u64::MAX / 2));
        assert_eq!(from_nanos(to_nanos(long)), Some(Duration::MAX));
    }
}
