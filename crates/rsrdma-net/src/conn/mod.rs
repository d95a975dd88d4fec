//! `Conn` and `Listener`: the net-style RDMA connection.
//!
//! A [`Conn`] carries whole messages (`send_msg`, `recv_msg`, `recv_msg_into`, batches) and,
//! through [`std::io::Read`]/[`std::io::Write`], a byte stream, over one RC queue pair. The
//! protocol (frames, credits, fragmentation, close, keepalive) is `rsrdma_proto`'s core; this
//! module is its driver and its blocking, thread-safe face. The wire format is
//! `docs/conn-protocol.md`.
//!
//! # Design, and why
//!
//! - **Two establishment paths, one result.** rdma_cm ([`Establish::Cm`], the default) or the
//!   project's TCP handshake ([`Establish::Tcp`], which works wherever TCP does). Both post
//!   every receive before the peer may send, exchange versioned `Params` and settle them, so
//!   no option has to match by luck ([`establish`](self) module docs).
//! - **Send + Sync, one mutex.** The driver and the core sit behind one mutex; every call
//!   takes it for a short, non-blocking step. One sender at a time owns the send side for a
//!   whole message (or batch), so concurrent senders never interleave fragments, and a reader
//!   and a writer on two threads make progress for each other.
//! - **Waiting.** One CQ serves both directions with one completion channel, and a channel
//!   event wakes one sleeper: so a per-connection progress thread is the only one that sleeps
//!   on it; blocked callers wait on a condition variable that every step which changed
//!   something notifies. In [`PollMode::Busy`] (and the spin phase of `Adaptive`) callers
//!   poll the CQ themselves and the progress thread stays out of the way. The progress
//!   thread also answers and sends keepalives and notices a dead peer (keepalive timeout,
//!   rdma_cm DISCONNECTED, or the TCP channel's end) when nobody calls in.
//! - **Every wait has a deadline or an end.** Read and write timeouts as `TcpStream`'s
//!   (a timeout is [`std::io::ErrorKind::TimedOut`] and leaves the connection usable);
//!   a dead peer fails every call within the peer timeout (default 5 s); `close` wakes every
//!   blocked call at once.
//! - **Close.** `close` (and drop) sends FIN after everything queued, lingers (bounded) until
//!   the FIN's completion says everything was delivered, then moves the QP to ERROR and reaps the flush before
//!   any memory is released; if the flush cannot be confirmed the memory is leaked, never
//!   freed under the NIC.
//! - **Memory.** `(send_slots + recv_slots) × slot_size` registered bytes, 2 MiB by default,
//!   and nothing more for a message of any size while the caller waits: `send_msg` sends
//!   fragments straight from the caller's slice as credits return, and `recv_msg_into`
//!   copies them from the receive slots straight into the caller's buffer (the `transfer`
//!   module). Only a message that arrives while nobody waits in `recv_msg_into` (or is
//!   read by `recv_msg`/`read`) is reassembled in the core, up to `max_message`, and a
//!   buffer above 256 KiB is freed once its message is done.
//! - **Flush semantics.** `send_msg` and `write` return once every fragment is handed to the
//!   NIC (or, after a timeout mid-message, to the core's copy); [`std::io::Write::flush`]
//!   waits until every byte is handed to the NIC; delivery to the peer is confirmed by
//!   `close`.

mod accept_queue;
mod admission;
mod buffer;
mod close;
mod device_events;
mod driver;
mod establish;
mod fdwait;
mod info;
mod io;
mod listener;
mod op;
#[cfg(test)]
mod op_sim;
mod options;
mod pool;
mod pool_events;
mod read_hold;
mod region;
mod rendezvous;
mod shared;
mod sides;
mod slots;
mod transfer;
mod worker;
mod wr_id;

pub(crate) use accept_queue::{take_tcp_peer, AcceptQueue, Unaccepted};
#[cfg(feature = "tokio")]
pub(crate) use accept_queue::{AcceptError, STARVED_PAUSE};

/// Waits until the listening socket `fd` is readable (a peer is queued).
pub(crate) fn wait_listener(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    fdwait::wait_readable([Some(fd)], None).map(drop)
}
pub use admission::ListenerCounters;
pub(crate) use admission::{Admission, Incoming, Ticket};
pub use buffer::{Buffer, BufferPool};
#[cfg(feature = "tokio")]
pub(crate) use close::{CloseStart, CloseWait};
#[cfg(feature = "tokio")]
pub(crate) use establish::cm::refuse_waiting_requests;
pub use info::{ConnInfo, RendezvousMode};
pub use listener::Listener;
#[cfg(feature = "tokio")]
pub(crate) use listener::{checked_for_listening, cm_listener};
#[cfg(feature = "tokio")]
pub(crate) use op::Op;
pub use options::{ConnOptions, Establish, SharedRecv};
pub use pool::RecvMemory;
#[cfg(feature = "tokio")]
pub(crate) use pool::RecvPools;
#[cfg(feature = "tokio")]
pub(crate) use rendezvous::{BufferIdle, Dest, PreparedSend, Pull, Pulled, RecvStep};
#[cfg(feature = "tokio")]
pub(crate) use transfer::RecvInto;

use crate::error::{from_core, NetError, Result};
use crate::progress::{self, PollMode};
use driver::{Driver, Take};
use establish::Established;
use shared::{Shared, Waiter};
use sides::Side;
use std::cell::Cell;
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A connected, message-oriented RDMA connection. `Send + Sync`: share it (`Arc<Conn>` or
/// `&Conn` in scoped threads) to read and write from different threads. See the module docs.
pub struct Conn {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    info: ConnInfo,
    local_addr: SocketAddr,
    peer_addr: SocketAddr,
    linger: Duration,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("local", &self.local_addr)
            .field("peer", &self.peer_addr)
            .field("qpn", &self.info.local_qpn)
            .finish()
    }
}

impl Conn {
    /// Connects to a [`Listener`] at `addr`, within `opts.connect_timeout` per address.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for options that cannot work; the establishment's errors
    /// (rdma_cm: [`NetError::Verbs`] naming the failing step, [`NetError::PeerAborted`] with
    /// the listener's reason for a refusal; TCP: [`NetError::Io`], [`NetError::Timeout`] and
    /// the handshake's); [`NetError::ConnFailed`] when the two ends cannot agree.
    pub fn dial(addr: impl ToSocketAddrs, opts: ConnOptions) -> Result<Conn> {
        opts.check()?;
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| NetError::io("resolve address", e))?
            .collect();
        let mut last = None;
        for a in addrs {
            let r = match opts.establish {
                Establish::Cm => establish::cm::dial(a, &opts),
                Establish::Tcp => establish::tcp::dial(a, &opts),
            };
            match r {
                Ok(est) => return Conn::start(est, &opts),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or_else(|| NetError::InvalidArgument("the address resolved to nothing".into())))
    }

    /// Starts the progress thread over an established connection.
    fn start(est: Established, opts: &ConnOptions) -> Result<Conn> {
        let wake = fdwait::Wake::new().map_err(|e| NetError::io("eventfd", e))?;
        let shared = Arc::new(Shared::new(est.driver, est.cq, opts.poll_mode, wake));
        let worker =
            worker::spawn(shared.clone()).map_err(|e| NetError::io("spawn progress thread", e))?;
        Ok(Conn {
            shared,
            worker: Mutex::new(Some(worker)),
            info: est.info,
            local_addr: est.local_addr,
            peer_addr: est.peer_addr,
            linger: opts.linger,
        })
    }

    /// Sends one message (0 bytes up to the negotiated cap), blocking until every fragment is
    /// handed to the NIC: fragments go straight from `msg` into send slots as credits come
    /// back (the peer reads), so no copy of the message is kept. Concurrent senders take
    /// turns, whole messages at a time. Up to the write timeout; a message that had begun to
    /// go out when the timeout hit is finished from a copy and the call succeeds.
    ///
    /// A message at or above the rendezvous threshold ([`ConnOptions::rendezvous`], 256 KiB
    /// by default) is read by the peer straight from `msg`. When the write timeout (or a
    /// close) ends the wait after the peer was offered it, the call asks the message back:
    /// the peer drops it unread if it had not begun to read it (the call then says
    /// `Timeout`: nothing of it was delivered, and the connection goes on), or finishes the
    /// read it began (the call then succeeds, a little past its timeout). The answer takes
    /// one round trip with the peer's driver, which answers without its application. Only a
    /// peer that does not answer within 10 s (a stopped process, or a peer of a version
    /// before withdrawal, protocol 1.1) fails the connection, rather than return memory it
    /// may still read.
    ///
    /// `Ok` means the connection took the whole message and will deliver it, in order,
    /// unless the connection fails or its close runs out of time: as with a TCP socket, only
    /// a close that returns `Ok` confirms delivery. A call that returns `Ok` while fragments
    /// of its message still wait for credits (it had begun when a timeout or a close came)
    /// leaves them queued; a close whose linger runs out before the peer takes them says
    /// `Timeout` ("close: delivering the queued data"), and that message may then be lost.
    ///
    /// A `close` (or `shutdown(Write)`) on another thread ends a call whose message has not
    /// begun with [`NetError::Closed`] at once; one that had begun goes whole before the FIN.
    /// A large message the peer was offered is asked back, and the call says `Closed` when
    /// the peer dropped it, `Ok` when it read it; only when the close's linger runs out
    /// before the peer answers (the close then says `Timeout`: delivery unconfirmed) may a
    /// message of a call that says `Closed` have been read.
    ///
    /// # Errors
    /// [`NetError::MessageTooLarge`] above the cap (nothing sent, the connection stays
    /// usable); [`NetError::Timeout`] (nothing of the message was sent); [`NetError::Closed`]
    /// after `shutdown(Write)` or `close`; [`NetError::PeerGone`]; [`NetError::ConnFailed`].
    pub fn send_msg(&self, msg: &[u8]) -> Result<()> {
        if self.send_at_once("send_msg", msg)? {
            return Ok(());
        }
        self.send_lent("send_msg", &[msg])
    }

    /// Sends several messages in order, contiguously: no other thread's message goes between
    /// them (the batch holds the send side). Every length is checked against the cap before
    /// anything is sent.
    ///
    /// # Errors
    /// As [`Conn::send_msg`], with the write timeout for the whole batch; on an error the
    /// messages before the failing one are sent, and that one too when it had begun.
    pub fn send_batch(&self, msgs: &[&[u8]]) -> Result<()> {
        let max = self.info.settled.max_message;
        if let Some(m) = msgs.iter().find(|m| m.len() > max as usize) {
            return Err(NetError::MessageTooLarge { len: m.len(), max });
        }
        self.send_lent("send_batch", msgs)
            .map_err(|e| e.naming("send_batch"))
    }

    /// Receives the next message; `Ok(None)` at the end of the stream (the peer's FIN after
    /// all its data). Waits up to the read timeout.
    ///
    /// # Errors
    /// [`NetError::Timeout`] (the connection stays usable); [`NetError::Closed`] after
    /// `close`; [`NetError::PeerClosed`] when the peer closed before a large message it had
    /// offered (by rendezvous) could be read; [`NetError::ConnFailed`] once the connection
    /// failed, after the messages that had arrived whole before (those are still read).
    pub fn recv_msg(&self) -> Result<Option<Vec<u8>>> {
        self.recv_msg_pulling()
    }

    /// Receives the next message into `buf`: `Ok(Some(len))`, or `Ok(None)` at the end of
    /// the stream. A large message goes from the receive slots straight into `buf`, with no
    /// reassembly buffer (one `recv_msg_into` at a time does this; others wait their turn).
    /// A rendezvous message (at or above the settled threshold) is READ straight into `buf`
    /// when there is no read timeout; with one, it is READ into the connection's memory and
    /// copied, so that a call that times out returns on time and the message goes to the
    /// next read (a READ into `buf` must end before `buf` is handed back). For no copy and
    /// a timeout, use [`Conn::recv_buffer`].
    ///
    /// # Errors
    /// [`NetError::ShortBuffer`] with the length the message needs when `buf` is too short;
    /// the message is not consumed (call again with a larger buffer). Otherwise as
    /// [`Conn::recv_msg`].
    pub fn recv_msg_into(&self, buf: &mut [u8]) -> Result<Option<usize>> {
        let timeout = self.shared.read_timeout.get();
        // A message that fits `buf` is then one frame, never reassembled while this waits;
        // a larger `buf` is for large messages, which go straight into it (the owned way).
        if buf.len() > self.info.settled.frame_payload() as usize {
            return self.recv_lent(buf, timeout);
        }
        // Read only with a timeout: the owned way gets what is left of it.
        let start = timeout.map(|_| Instant::now());
        if let Some(got) = self.recv_unowned("recv_msg_into", buf, timeout)? {
            return Ok(got);
        }
        let left = timeout
            .zip(start)
            .map(|(t, s)| t.saturating_sub(s.elapsed()));
        transfer::reported_as(self.recv_lent(buf, left), timeout)
    }

    /// Waits (up to the read timeout) for at least one message, then takes every message
    /// that is ready, at most `max` (at least one). `Ok(None)` at the end of the stream, as
    /// [`Conn::recv_msg`]. The first message and the rest are taken in two steps: with
    /// several threads receiving on one `Conn`, another thread's message may fall between
    /// them (every message still goes to exactly one caller, in order within each batch).
    ///
    /// # Errors
    /// As [`Conn::recv_msg`].
    pub fn recv_batch(&self, max: usize) -> Result<Option<Vec<Vec<u8>>>> {
        let Some(first) = self.recv_msg()? else {
            return Ok(None);
        };
        let mut out = vec![first];
        self.take_ready(|d| {
            if out.len() >= max {
                return false;
            }
            match d.core().recv_msg() {
                Ok(rsrdma_proto::Recv::Data(m)) => {
                    out.push(m);
                    true
                }
                _ => false,
            }
        });
        Ok(Some(out))
    }

    /// The rest of a batch, after its first message: under one lock, `take_one` takes
    /// messages that are ready until it says it took none, but not while another call owns
    /// the receive side (its message comes first); then the reposts go.
    fn take_ready(&self, mut take_one: impl FnMut(&mut Driver) -> bool) {
        let mut st = self.shared.lock();
        let Some(d) = st.driver.as_mut() else {
            return;
        };
        while !d.owners().owned(Side::Recv) && take_one(d) {}
        d.post_work();
        self.shared.changed(&mut st);
    }

    /// [`Conn::recv_batch`] into the caller's buffers, allocating nothing: waits (up to the
    /// read timeout) for one message, received into `bufs[0]` as by [`Conn::recv_msg_into`],
    /// then takes every message that is ready and fits the next buffer, up to
    /// `min(bufs.len(), lens.len())`. `lens[i]` is the length of the message in `bufs[i]`;
    /// returns how many (`Ok(Some(0))` for no buffers), or `Ok(None)` at the end of the
    /// stream. A message after the first that does not fit its buffer, a large message that
    /// comes by rendezvous, and the end of the stream are left for the next call. As with
    /// `recv_batch`, another thread receiving on the same `Conn` may take a message between
    /// the first and the rest.
    ///
    /// `recv_batch` allocates a `Vec` per message, and a batch of large ones is freed
    /// together: glibc gives that memory back to the system and the next batch takes it
    /// again (`rs_rdmanet_bw -s 16384 -b 32`'s server made 1,100 to 3,300 `brk` calls per
    /// 100,000 messages with `recv_batch`, 8 with this). Buffers reused, as a NIC's receive
    /// queue reuses its own, cost nothing per message.
    ///
    /// # Errors
    /// [`NetError::ShortBuffer`] when `bufs[0]` cannot hold the next message (it stays
    /// queued); otherwise as [`Conn::recv_msg`].
    pub fn recv_batch_into(
        &self,
        bufs: &mut [&mut [u8]],
        lens: &mut [usize],
    ) -> Result<Option<usize>> {
        let want = bufs.len().min(lens.len());
        if want == 0 {
            return Ok(Some(0));
        }
        let Some(first) = self.recv_msg_into(bufs[0])? else {
            return Ok(None);
        };
        lens[0] = first;
        let mut got = 1;
        self.take_ready(|d| {
            if got >= want {
                return false;
            }
            match d.core().recv_msg_into(bufs[got]) {
                Ok(rsrdma_proto::Recv::Data(n)) => {
                    lens[got] = n;
                    got += 1;
                    true
                }
                _ => false,
            }
        });
        Ok(Some(got))
    }

    /// Shuts down a direction, as [`std::net::TcpStream::shutdown`]. `Write`: FIN goes after
    /// everything queued; reading goes on and the peer's reads end after our data. `Read`:
    /// what has arrived and whatever still arrives is discarded (its credit still returns, so
    /// the peer never stalls), and reads report the end of the stream; sending goes on.
    /// `Both`: [`Conn::close`].
    ///
    /// # Errors
    /// [`NetError::Closed`] after close; [`NetError::ConnFailed`]; for `Both`, as
    /// [`Conn::close`].
    pub fn shutdown(&self, how: Shutdown) -> Result<()> {
        if how == Shutdown::Both {
            return self.close();
        }
        let mut st = self.shared.lock();
        let Some(d) = st.driver.as_mut() else {
            return Err(NetError::Closed { op: "shutdown" });
        };
        let r = match how {
            Shutdown::Write => d.core().shutdown_write(),
            _ => d.core().shutdown_read(),
        };
        d.post_work();
        self.shared.changed(&mut st);
        r.map_err(from_core)
    }

    /// Closes: FIN after everything queued, then waits (up to [`ConnOptions::linger`]) for
    /// its delivery, then releases the queue pair and memory after reaping the flush (up to
    /// 2 s more; a flush never confirmed leaves the memory leaked rather than freed while
    /// the NIC may touch it). Blocked calls on other threads return at once with
    /// [`NetError::Closed`]. Idempotent: a close that finds another one begun (on another
    /// thread, or earlier) waits for its teardown and returns what it returned; drop does
    /// the same.
    ///
    /// # Errors
    /// [`NetError::Timeout`] when the queued data was not confirmed delivered within the
    /// linger time; [`NetError::ConnFailed`] for a connection that had failed. The
    /// resources are released (or leaked, as above) either way.
    pub fn close(&self) -> Result<()> {
        self.close_lingering(self.linger)
    }

    /// [`Conn::close`], waiting at most `linger` for the delivery (a striped connection
    /// closes its rails within what is left of its own linger).
    pub(crate) fn close_lingering(&self, linger: Duration) -> Result<()> {
        let failed = match self.begin_close() {
            // Another thread's close began: its end is this one's (a close that returned
            // before the teardown would let the caller free what the NIC may still use).
            close::CloseStart::Already => return self.wait_close_end(),
            close::CloseStart::Started => None,
            close::CloseStart::Failed(e) => Some(e),
        };
        let delivered = match failed {
            None => self.run(&mut close::CloseWait, Some(linger)),
            Some(_) => Ok(()),
        };
        self.finish_close(failed, delivered)
    }

    /// How message `msg` (rendezvous or lent) stood when a close detached the driver; `None`
    /// while attached. A call that waited for it and found the driver gone answers from this:
    /// the close may have detached it between the message's end and the call's look.
    pub(super) fn end_at_detach(&self, msg: u64) -> Option<shared::OfferEnd> {
        let st = self.shared.lock();
        st.offers_at_detach.as_ref().map(|o| o.end_of(msg))
    }

    /// Stops the connection's steps and takes its driver out for the teardown (both closes),
    /// with whether everything this side sent was delivered (FIN done, every rendezvous
    /// message released) or the peer had left, as it stood before the cut-off below (which
    /// withdraws what the peer did not read). A caller's slice that a window exposes is cut
    /// off from the NIC first, under the lock: its waiting call returns as soon as the driver
    /// is gone, before the teardown's flush.
    fn detach_driver(&self) -> (Option<Driver>, bool) {
        let mut st = self.shared.lock();
        st.stop = true;
        let done = st
            .driver
            .as_ref()
            .is_some_and(|d| d.core_ref().is_drained() || d.peer_gone());
        let offers = st.driver.as_ref().map(|d| shared::Offers::of(d.core_ref()));
        st.offers_at_detach = offers;
        if let Some(d) = st.driver.as_mut() {
            d.cut_off_lent_slices();
        }
        let d = st.driver.take();
        self.shared.changed(&mut st);
        (d, done)
    }

    /// Sets the read timeout (`None`: block indefinitely), as [`std::net::TcpStream::set_read_timeout`].
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a zero duration.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> Result<()> {
        check_timeout(t)?;
        self.shared.read_timeout.set(t);
        Ok(())
    }

    /// Sets the write timeout (`None`: block indefinitely).
    ///
    /// A message at or above the rendezvous threshold is read by the peer straight from the
    /// caller's slice, so a send that times out after offering it waits for the peer to give
    /// the slice back or finish its read: a round trip late with a live peer, up to 10 s
    /// (after which the connection fails) with a stalled one. Smaller messages are copied
    /// and return on time.
    ///
    /// # Errors
    /// [`NetError::InvalidArgument`] for a zero duration.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> Result<()> {
        check_timeout(t)?;
        self.shared.write_timeout.set(t);
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> Option<Duration> {
        self.shared.read_timeout.get()
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> Option<Duration> {
        self.shared.write_timeout.get()
    }

    /// The local address (rdma_cm: the RDMA device's IP address; TCP: the socket's).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// Device, port, GIDs, QP numbers, MTU and the negotiated parameters.
    pub fn info(&self) -> &ConnInfo {
        &self.info
    }

    /// The protocol core's counters (credits, slots, messages), for diagnostics; `None`
    /// after close.
    pub fn counters(&self) -> Option<rsrdma_proto::Counters> {
        let st = self.shared.lock();
        st.driver.as_ref().map(|d| d.core_ref().counters())
    }

    /// Whether a message would begin to go now, without waiting for credit (the core's
    /// [`rsrdma_proto::Conn::can_send_now`]); `false` after close. A striped connection's
    /// writer prefers its rails that can.
    pub(crate) fn can_send_now(&self) -> bool {
        let st = self.shared.lock();
        st.driver
            .as_ref()
            .is_some_and(|d| d.core_ref().can_send_now())
    }

    /// The poll mode.
    pub fn poll_mode(&self) -> PollMode {
        self.shared.mode
    }

    /// Fault injection for tests: moves the queue pair to ERROR, as a failing NIC would.
    ///
    /// # Errors
    /// [`NetError::Closed`] after close; the verbs error of the transition.
    #[doc(hidden)]
    pub fn inject_qp_error(&self) -> Result<()> {
        let st = self.shared.lock();
        let d = st.driver.as_ref().ok_or(NetError::Closed {
            op: "inject_qp_error",
        })?;
        Ok(d.qp().to_error()?)
    }

    /// Runs driver steps until `attempt` gives a value, waiting as the poll mode says, up to
    /// `timeout`.
    ///
    /// The first step runs before any waiting is set up: a call that succeeds at once (a small
    /// send within the credit, a receive whose message is there) reads no clock and does not
    /// count itself as a spinner.
    fn block<T>(
        &self,
        op: &'static str,
        timeout: Option<Duration>,
        mut attempt: impl FnMut(&mut Driver) -> Result<Option<T>>,
    ) -> Result<T> {
        self.block_taking(op, timeout, None, |d, _| attempt(d))
    }

    /// [`Conn::block`] for a reader waiting with `buf`: each step offers it to the receive
    /// completions it reaps ([`Driver::progress_taking`]), and `attempt` sees what was taken
    /// (and has the buffer back through the [`Take`]).
    fn block_taking<T>(
        &self,
        op: &'static str,
        timeout: Option<Duration>,
        buf: Option<&mut [u8]>,
        mut attempt: impl FnMut(&mut Driver, &mut Take<'_>) -> Result<Option<T>>,
    ) -> Result<T> {
        let shared = &*self.shared;
        let clock = StepClock::default();
        let mut take = Take::new(buf);
        let first_seen = Cell::new(0);
        op::block_on(
            &progress::SystemClock,
            shared.mode,
            op,
            timeout,
            || {
                let waiter = Waiter::new(shared);
                waiter.seen.set(first_seen.get());
                waiter
            },
            |waiter| match waiter {
                None => self.step_taking(
                    op,
                    &first_seen,
                    Some(clock.now(true)),
                    &mut take,
                    &mut attempt,
                ),
                Some(w) => self.step_taking(
                    op,
                    &w.seen,
                    Some(clock.now(w.slept.take())),
                    &mut take,
                    &mut attempt,
                ),
            },
        )
    }

    /// One locked step of a blocking call: polls the CQ and fires due timers (when given the
    /// time, `poll`), runs `attempt`, posts what the core queued, and records in `seen` the
    /// generation it saw. The fast paths of `send_msg` and `recv_msg_into` are one such step.
    fn step_once<T>(
        &self,
        op: &'static str,
        seen: &Cell<u64>,
        poll: Option<Instant>,
        attempt: &mut impl FnMut(&mut Driver) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        self.step_taking(op, seen, poll, &mut Take::new(None), &mut |d, _| attempt(d))
    }

    /// [`Conn::step_once`], offering `take`'s buffer to the completions the step reaps while
    /// no other call owns the receive side.
    fn step_taking<T>(
        &self,
        op: &'static str,
        seen: &Cell<u64>,
        poll: Option<Instant>,
        take: &mut Take<'_>,
        attempt: &mut impl FnMut(&mut Driver, &mut Take<'_>) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let shared = &*self.shared;
        // Keeps a busy connection's progress thread off the lock (see `worker`), only when
        // this step does the thread's work: a caller that only sends at once would otherwise
        // leave the peer's keepalive PINGs unanswered.
        if poll.is_some() {
            shared.stepped.store(true, Ordering::Relaxed);
        }
        let mut st = shared.lock();
        let unchanged = st.gen == seen.get();
        let Some(d) = st.driver.as_mut() else {
            return Err(NetError::Closed { op });
        };
        if take.offered() {
            take.open = !d.owners().owned(Side::Recv);
        }
        let mut changed = poll.is_some_and(|now| d.progress_taking(now, take));
        // A waiting reader's look again (`recv_unowned`, whose attempt only reads): this step
        // reaped nothing, and nobody changed anything since its last look (the generation it
        // saw then), so the read would find what it found then (nothing), and nothing new is
        // queued. Skipping it keeps the busy wait's step short, and so how late it sees what
        // arrives.
        if take.offered() && take.looked && unchanged && !changed && take.got.is_none() {
            return Ok(None);
        }
        take.looked = true;
        let r = attempt(d, take);
        // A receive loop's reposts may wait for its next send, which posts them after its
        // own doorbell (`Driver::reposts_may_wait`).
        if !d.reposts_may_wait() {
            changed |= d.post_work();
        }
        // A result (or an error) may have freed a side another caller waits for.
        if changed || !matches!(r, Ok(None)) {
            shared.changed(&mut st);
        }
        seen.set(st.gen);
        r
    }
}

/// The time a blocking call's steps pass to the driver. A busy wait runs a step every few
/// microseconds and the coarse clock moves once a tick (milliseconds), so it is read at the
/// first step, after every sleep, and every [`StepClock::EVERY`]th step: reading it was a
/// fifth of an idle step's instructions, and a spinning caller's idle step is on the path of
/// whatever arrives next. Timers and liveness deadlines are in seconds; a reading a few
/// dozen steps old is well inside the clock's own tick.
#[derive(Default)]
struct StepClock {
    steps: Cell<u32>,
    last: Cell<Option<Instant>>,
}

impl StepClock {
    const EVERY: u32 = 32;

    /// The time for the next step; `fresh` forces a reading (the caller slept).
    fn now(&self, fresh: bool) -> Instant {
        self.now_with(fresh, progress::coarse_now)
    }

    fn now_with(&self, fresh: bool, read: impl FnOnce() -> Instant) -> Instant {
        let n = self.steps.get();
        self.steps.set(n.wrapping_add(1));
        match self.last.get() {
            Some(t) if !fresh && n % Self::EVERY != 0 => t,
            _ => {
                let t = read();
                self.last.set(Some(t));
                t
            }
        }
    }
}

#[cfg(test)]
mod step_clock_tests {
    use super::StepClock;
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    #[test]
    fn the_clock_is_read_first_after_a_sleep_and_every_32nd_step() {
        let clock = StepClock::default();
        let base = Instant::now();
        let reads = Cell::new(0u64);
        let read = || {
            reads.set(reads.get() + 1);
            base + Duration::from_millis(reads.get())
        };
        let first = clock.now_with(false, read);
        assert_eq!((reads.get(), first), (1, base + Duration::from_millis(1)));
        for _ in 1..StepClock::EVERY {
            assert_eq!(
                clock.now_with(false, read),
                first,
                "cached between readings"
            );
        }
        assert_eq!(reads.get(), 1);
        clock.now_with(false, read);
        assert_eq!(reads.get(), 2, "the 32nd step after a reading reads again");
        let after_sleep = clock.now_with(true, read);
        assert_eq!(
            (reads.get(), after_sleep),
            (3, base + Duration::from_millis(3))
        );
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::debug!(error = %e, "rsrdma-net conn: close on drop");
        }
    }
}

// ===== BEGIN async hooks (feature `tokio`, used by `crate::asyncio`) =====================
// A connection without the progress thread: the async layer runs the driver's steps inside
// its poll functions and sleeps on the completion channel's and liveness fds through the
// reactor (see `crate::asyncio` for why). Nothing outside this block changes for it.

/// What one non-blocking step ([`Conn::step_send_msg`] and friends) found.
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub(crate) struct Step<T> {
    /// The operation's result, or `None` when it would block.
    pub(crate) out: Option<T>,
    /// The step changed something another waiter may care about.
    pub(crate) changed: bool,
    /// When a step is next due without any completion (keepalive, grace timers).
    pub(crate) deadline: Option<std::time::Instant>,
    /// The liveness fd (rdma_cm id or TCP channel) to watch, while the transport lives.
    pub(crate) live_fd: Option<std::os::fd::RawFd>,
    /// Frames wait to go out as completions free credit and room
    /// ([`rsrdma_proto::Conn::sends_waiting`]), or memory in flight waits for what releases
    /// it (a buffer whose send's future was dropped, a DONE): someone must step on the CQ's
    /// events.
    pub(crate) sends_waiting: bool,
}

#[cfg(feature = "tokio")]
impl Conn {
    /// Establishes as [`Conn::dial`] does for one address (blocking), without the thread.
    pub(crate) fn dial_threadless(addr: SocketAddr, opts: &ConnOptions) -> Result<Conn> {
        let est = match opts.establish {
            Establish::Cm => establish::cm::dial(addr, opts)?,
            Establish::Tcp => establish::tcp::dial(addr, opts)?,
        };
        Conn::start_threadless(est, opts)
    }

    /// Accepts an rdma_cm connect request (blocking), without the thread, receiving from the
    /// listener's shared pool when it has one.
    pub(crate) fn accept_cm_threadless(
        req: rsrdma::cm::ConnectRequest,
        opts: &ConnOptions,
        pools: &pool::RecvPools,
        standing: &crate::handshake::Standing,
    ) -> Result<Conn> {
        Conn::start_threadless(establish::cm::accept(req, opts, pools, standing)?, opts)
    }

    /// Runs the server side of the TCP handshake (blocking), without the thread.
    pub(crate) fn accept_tcp_threadless(
        stream: std::net::TcpStream,
        opts: &ConnOptions,
        pools: &pool::RecvPools,
        standing: std::sync::Arc<crate::handshake::Standing>,
    ) -> Result<Conn> {
        let est = establish::tcp::accept(stream, opts, Some(pools), Some(standing))?;
        Conn::start_threadless(est, opts)
    }

    /// A connection with no progress thread. Its own blocking paths (`close` on drop) then
    /// poll the CQ themselves: busy mode, as nobody else would run a step for them.
    fn start_threadless(est: Established, opts: &ConnOptions) -> Result<Conn> {
        let wake = fdwait::Wake::new().map_err(|e| NetError::io("eventfd", e))?;
        let shared = Arc::new(Shared::new(est.driver, est.cq, PollMode::Busy, wake));
        Ok(Conn {
            shared,
            worker: Mutex::new(None),
            info: est.info,
            local_addr: est.local_addr,
            peer_addr: est.peer_addr,
            linger: opts.linger,
        })
    }

    /// The CQ's completion channel fd (non-blocking; every connection has its own channel).
    pub(crate) fn cq_channel_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.shared.cq.comp_channel().map(|c| c.as_raw_fd())
    }

    /// Asks for a channel event at the next completion.
    ///
    /// # Errors
    /// The verbs error of `ibv_req_notify_cq`.
    pub(crate) fn arm_cq(&self) -> Result<()> {
        Ok(self.shared.cq.arm(false)?)
    }

    /// Takes every pending channel event (never blocks); returns whether there was one.
    ///
    /// # Errors
    /// The verbs error of `ibv_get_cq_event`.
    pub(crate) fn take_cq_events(&self) -> Result<bool> {
        let mut any = false;
        while self.shared.cq.try_event()? {
            any = true;
        }
        Ok(any)
    }

    /// The linger time of `close`.
    pub(crate) fn linger(&self) -> Duration {
        self.linger
    }

    /// One non-blocking step: reads the liveness signal when `live` says its fd was
    /// readable, polls the CQ, fires due timers, runs `attempt`, posts its work.
    fn step<T>(
        &self,
        op: &'static str,
        live: bool,
        attempt: impl FnOnce(&mut Driver) -> Result<Option<T>>,
    ) -> Result<Step<T>> {
        let mut st = self.shared.lock();
        let Some(d) = st.driver.as_mut() else {
            return Err(NetError::Closed { op });
        };
        // The precise clock: the reactor sleeps until the returned deadline by its own
        // (precise) clock, and a late coarse `now` would find the timer not yet due.
        let now = Instant::now();
        if live {
            d.check_liveness(now);
        }
        let mut changed = d.progress(now);
        let r = attempt(d);
        // As in a blocking step: a receive loop's reposts may wait for its next send.
        if !d.reposts_may_wait() {
            changed |= d.post_work();
        }
        let (deadline, live_fd) = (d.next_deadline(), d.liveness_fd());
        let sends_waiting = d.core_ref().sends_waiting() || d.memory_in_flight();
        // An operation that ended let go of its side and may have left what it reaped for
        // the others (a receiver waiting for the side, with a message queued): they must
        // look again, whether or not the step posted anything.
        changed |= matches!(r, Ok(Some(_)));
        if changed {
            self.shared.changed(&mut st);
        }
        Ok(Step {
            out: r?,
            changed,
            deadline,
            live_fd,
            sends_waiting,
        })
    }

    /// One step of operation `op` ([`op::Op`], the same attempt the blocking runner makes):
    /// `owned` is the future's record of whether it holds the operation's side.
    pub(crate) fn step_op<O: Op>(
        &self,
        op: &mut O,
        owned: &mut bool,
        live: bool,
    ) -> Result<Step<O::Out>> {
        self.step(op.name(), live, |d| op::attempt(d, op, owned))
    }

    /// A step with no operation (timers, keepalive); fails once the connection failed.
    pub(crate) fn step_idle(&self, live: bool) -> Result<Step<()>> {
        self.step("progress", live, |d| d.check_failed().map(|()| None))
    }

    /// [`Conn::send_msg`] as one step.
    pub(crate) fn step_send_msg(&self, msg: &[u8], live: bool) -> Result<Step<()>> {
        self.step("send_msg", live, |d| {
            if d.peer_gone() {
                return Err(NetError::PeerGone { op: "send_msg" });
            }
            match d.core().send_msg(msg) {
                Ok(rsrdma_proto::Step::Done(())) => Ok(Some(())),
                Ok(rsrdma_proto::Step::Blocked) => Ok(None),
                Err(e) => Err(from_core(e)),
            }
        })
    }

    /// [`Conn::recv_msg`] as one step: `Some(None)` is the end of the stream. A rendezvous
    /// message is read into the driver's memory (the same attempt as the blocking face's), so
    /// a future dropped at any point strands nothing.
    pub(crate) fn step_recv_msg(&self, live: bool) -> Result<Step<Option<Vec<u8>>>> {
        self.step("recv_msg", live, rendezvous::recv_msg_attempt)
    }

    /// [`Conn::recv_msg_into`] as one step (a rendezvous message is copied from the driver's
    /// memory, where its READ landed).
    pub(crate) fn step_recv_msg_into(
        &self,
        buf: &mut [u8],
        live: bool,
    ) -> Result<Step<Option<usize>>> {
        self.step("recv_msg_into", live, |d| {
            rendezvous::recv_msg_into_attempt(d, buf)
        })
    }

    /// `Read::read` as one step (0 is the end of the stream).
    pub(crate) fn step_read(&self, buf: &mut [u8], live: bool) -> Result<Step<usize>> {
        self.step("read", live, |d| rendezvous::read_attempt(d, buf))
    }

    /// `Write::flush` as one step: done once every byte taken is handed to the NIC.
    pub(crate) fn step_flushed(&self, live: bool) -> Result<Step<()>> {
        self.step_op(&mut io::Flushed, &mut false, live)
    }
}
// ===== END async hooks =================================================================

/// A refused TCP connect names the other path: a [`Listener`] on the default
/// [`Establish::Cm`] path has no TCP socket at its port.
pub(crate) fn tcp_connect_error(addr: SocketAddr, e: std::io::Error) -> NetError {
    if e.kind() == std::io::ErrorKind::ConnectionRefused {
        return NetError::NotListening {
            addr,
            path: "the TCP handshake (Establish::Tcp)",
            hint: "is the server running, on this port? A Listener on the default \
                   Establish::Cm path takes no TCP connections: if that is what listens \
                   there, dial it with Establish::Cm",
        };
    }
    NetError::io("connect", e)
}

pub(crate) fn check_timeout(t: Option<Duration>) -> Result<()> {
    if t.is_some_and(|t| t.is_zero()) {
        return Err(NetError::InvalidArgument(
            "a zero timeout is not allowed (use None to block)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsrdma_proto::ProtoError;

    #[test]
    fn conn_and_listener_are_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<Conn>();
        both::<Listener>();
    }

    #[test]
    fn core_errors_map_to_clear_errors_and_io_kinds() {
        use std::io::ErrorKind as K;
        let short = from_core(ProtoError::ShortBuffer { needed: 77 });
        assert!(matches!(short, NetError::ShortBuffer { needed: 77 }));
        assert!(short.to_string().contains("77"));
        let big = from_core(ProtoError::TooLarge { len: 9, max: 8 });
        assert_eq!(big.io_kind(), K::InvalidInput);
        let dead = from_core(ProtoError::PeerDead { silent_ms: 5000 });
        assert_eq!(dead.io_kind(), K::ConnectionAborted);
        let t = NetError::Timeout {
            op: "recv_msg",
            millis: 5,
        };
        assert_eq!(t.into_io().kind(), K::TimedOut);
        assert_eq!(
            from_core(ProtoError::Closed { op: "read" }).io_kind(),
            K::NotConnected
        );
        assert!(check_timeout(Some(Duration::ZERO)).is_err());
        assert!(check_timeout(None).is_ok());
    }
}
