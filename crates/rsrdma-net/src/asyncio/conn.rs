//! [`AsyncConn`]: a [`Conn`](crate::Conn) for tokio.

use super::driven::Driven;
use super::op_future::OpFuture;
use super::split::{OwnedReadHalf, OwnedWriteHalf};
use crate::conn::{BufferIdle, Dest, PreparedSend, Pull, Pulled, RecvInto, RecvStep};
use crate::error::{NetError, Result};
use crate::Buffer;
use crate::{ConnInfo, ConnOptions};
use std::future::poll_fn;
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;

/// A message-oriented RDMA connection on tokio: [`Conn`](crate::Conn)'s protocol, driven from
/// the task that awaits it (no thread of its own; see the [module docs](super)).
///
/// Messages: [`AsyncConn::send_msg`], [`AsyncConn::recv_msg`], [`AsyncConn::recv_msg_into`]
/// (these take `&self`, so tasks may share an `Arc<AsyncConn>`). Byte stream:
/// [`tokio::io::AsyncRead`] and [`tokio::io::AsyncWrite`] (`poll_shutdown` is the
/// half-close). [`AsyncConn::into_split`] gives owned halves for two tasks.
///
/// Dropping it without [`AsyncConn::close`] closes it in the background: FIN after
/// everything queued, up to [`ConnOptions::linger`] for its delivery, then the teardown, on
/// tokio's blocking pool (no runtime thread waits for it). Await `close` to learn whether
/// everything was delivered.
#[derive(Debug)]
pub struct AsyncConn {
    pub(super) d: Arc<Driven>,
}

impl AsyncConn {
    /// Connects to an [`AsyncListener`](super::AsyncListener) (or a
    /// [`Listener`](crate::Listener)) at `addr`, trying each address it resolves to.
    ///
    /// The establishment (rdma_cm's connect, or the TCP handshake) runs on tokio's blocking
    /// pool, bounded by [`ConnOptions::connect_timeout`] per address; the connection then
    /// lives on the reactor. Cancel-safe in the sense that matters: a dial dropped during the
    /// establishment lets it finish in the pool and closes what it built.
    ///
    /// # Errors
    /// As [`Conn::dial`](crate::Conn::dial); [`NetError::Io`] naming `resolve address`, or
    /// the registration with the reactor (no tokio runtime with IO enabled).
    pub async fn dial(
        addr: impl tokio::net::ToSocketAddrs,
        opts: ConnOptions,
    ) -> Result<AsyncConn> {
        opts.check()?;
        // Polled by another executor, tokio's blocking pool (below) would panic.
        super::watch::in_runtime().map_err(|e| NetError::io("dial", e))?;
        let addrs = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| NetError::io("resolve address", e))?;
        let mut last = None;
        for a in addrs {
            let o = opts.clone();
            let built = tokio::task::spawn_blocking(move || crate::Conn::dial_threadless(a, &o))
                .await
                .map_err(|e| NetError::io("dial on the blocking pool", e.into()))?;
            match built {
                Ok(conn) => return AsyncConn::start(conn, &opts),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or_else(|| NetError::InvalidArgument("the address resolved to nothing".into())))
    }

    /// Puts a threadless connection on the reactor.
    pub(super) fn start(conn: crate::Conn, opts: &ConnOptions) -> Result<AsyncConn> {
        Ok(AsyncConn {
            d: Driven::start(conn, opts.poll_mode)?,
        })
    }

    /// Sends one message (0 bytes up to the negotiated cap), waiting while the previous one
    /// is still partly queued (credits come back as the peer reads).
    ///
    /// Cancel-safe: the message is taken whole in the poll that completes the future, or
    /// not at all.
    ///
    /// # Errors
    /// As [`Conn::send_msg`](crate::Conn::send_msg), less the timeout (use
    /// [`tokio::time::timeout`]).
    pub async fn send_msg(&self, msg: &[u8]) -> Result<()> {
        send_msg(&self.d, msg).await
    }

    /// Receives the next message; `Ok(None)` at the end of the stream.
    ///
    /// Cancel-safe: a message is taken in the poll that completes the future; a future
    /// dropped before that leaves it queued for the next call.
    ///
    /// # Errors
    /// As [`Conn::recv_msg`](crate::Conn::recv_msg), less the timeout.
    pub async fn recv_msg(&self) -> Result<Option<Vec<u8>>> {
        recv_msg(&self.d).await
    }

    /// Receives the next message into `buf`: `Ok(Some(len))`, or `Ok(None)` at the end of
    /// the stream. Cancel-safe as [`AsyncConn::recv_msg`]; the bytes are copied into `buf`
    /// only in the poll that completes.
    ///
    /// # Errors
    /// [`NetError::ShortBuffer`] (the message stays queued); as [`AsyncConn::recv_msg`].
    pub async fn recv_msg_into(&self, buf: &mut [u8]) -> Result<Option<usize>> {
        recv_msg_into(&self.d, buf).await
    }

    /// A new registered buffer of `len` bytes on this connection's protection domain, as
    /// [`Conn::alloc_buffer`](crate::Conn::alloc_buffer).
    ///
    /// # Errors
    /// As [`Conn::alloc_buffer`](crate::Conn::alloc_buffer).
    pub fn alloc_buffer(&self, len: usize) -> Result<Buffer> {
        self.d.conn().alloc_buffer(len)
    }

    /// Sends the first `len` bytes of `buf` as one message with no copy, as
    /// [`Conn::send_buffer`](crate::Conn::send_buffer), and returns when `buf` may be reused:
    /// [`AsyncConn::start_send_buffer`], then [`AsyncConn::wait_buffer`].
    ///
    /// Cancel-safe: a future dropped before the message was queued sends nothing (the
    /// buffer is idle again); one dropped later leaves the message going out, and the buffer
    /// stays in flight ([`Buffer::is_busy`]) until the connection is done with it. That may
    /// be already when the future is dropped, so after a cancellation `is_busy` does not tell
    /// whether the message went: a caller that sends again after a cancellation awaits
    /// [`AsyncConn::start_send_buffer`] (ready in the very poll that queues the message) and
    /// then [`AsyncConn::wait_buffer`].
    ///
    /// # Errors
    /// As [`Conn::send_buffer`](crate::Conn::send_buffer), less the timeout.
    pub async fn send_buffer(&self, buf: &Buffer, len: usize) -> Result<()> {
        let queued = start_send_buffer(&self.d, buf, len).await?;
        match (buffer_idle(&self.d, "send_buffer", buf).await, queued) {
            // A close detached the driver: the message may have been done with just before.
            (Err(e @ NetError::Closed { .. }), Some(msg)) => self.d.conn().closed_under(msg, e),
            (r, _) => r,
        }
    }

    /// Queues the first `len` bytes of `buf` as one message with no copy, as
    /// [`Conn::start_send_buffer`](crate::Conn::start_send_buffer): `buf` stays in flight
    /// until the connection is done with it ([`AsyncConn::wait_buffer`]).
    ///
    /// Cancel-safe in the strict sense: the future is ready in the very poll that queues the
    /// message, so one dropped before it was ready queued nothing (`buf` is idle again), and
    /// a ready one's message goes out whole.
    ///
    /// # Errors
    /// As [`Conn::start_send_buffer`](crate::Conn::start_send_buffer), less the timeout.
    pub async fn start_send_buffer(&self, buf: &Buffer, len: usize) -> Result<()> {
        start_send_buffer(&self.d, buf, len).await.map(drop)
    }

    /// Waits until `buf` is no longer in flight, as
    /// [`Conn::wait_buffer`](crate::Conn::wait_buffer). Cancel-safe: it takes nothing.
    ///
    /// # Errors
    /// As [`Conn::wait_buffer`](crate::Conn::wait_buffer), less the timeout.
    pub async fn wait_buffer(&self, buf: &Buffer) -> Result<()> {
        buffer_idle(&self.d, "wait_buffer", buf).await
    }

    /// Receives the next message into `buf`: `Ok(Some(len))`, or `Ok(None)` at the end of
    /// the stream, as [`Conn::recv_buffer`](crate::Conn::recv_buffer). An eager message's
    /// fragments are copied from the receive slots straight into `buf`; a rendezvous message
    /// is read by RDMA READ straight into `buf` (no copy).
    ///
    /// Cancel-safe: a future dropped mid-message hands the part received back to the
    /// connection, and the message stays whole for the next read; one dropped while the
    /// READ lands in `buf` leaves `buf` in flight ([`Buffer::is_busy`]) until it landed, and
    /// the message then goes to the next read. A call on a buffer in flight waits for it.
    ///
    /// # Errors
    /// As [`Conn::recv_buffer`](crate::Conn::recv_buffer), less the timeout.
    pub async fn recv_buffer(&self, buf: &mut Buffer) -> Result<Option<usize>> {
        recv_buffer(&self.d, buf).await
    }

    /// Half-close: FIN goes after everything queued; waits until every queued byte is
    /// handed to the NIC. Reading goes on. Cancel-safe (the FIN is queued at the first poll;
    /// a second call only waits again).
    ///
    /// # Errors
    /// As [`Conn::shutdown`](crate::Conn::shutdown) with `Shutdown::Write`.
    pub async fn shutdown_write(&self) -> Result<()> {
        shutdown_write(&self.d).await
    }

    /// Shuts down reading, as [`Conn::shutdown`](crate::Conn::shutdown) with
    /// `Shutdown::Read`: what has arrived and whatever still arrives is discarded (its credit
    /// still returns, so the peer never stalls), and reads (pending ones too) report the end
    /// of the stream; sending goes on. For a task that stops reading while the peer may
    /// still send: unread messages would otherwise hold the receive slots, and the peer's
    /// sends stall once they are full.
    ///
    /// # Errors
    /// As [`Conn::shutdown`](crate::Conn::shutdown).
    pub fn shutdown_read(&self) -> Result<()> {
        shutdown_read(&self.d)
    }

    /// Closes: FIN after everything queued, then waits (up to [`ConnOptions::linger`]) for
    /// its delivery, then releases the queue pair and memory (after reaping the flush, which
    /// is bounded and quick). Other tasks' pending calls end with [`NetError::Closed`].
    /// Idempotent: a close that finds another one running (another task's) waits for its
    /// teardown and returns what it returned. Cancel-safe: a close dropped half-way is
    /// finished by the next `close` or by the drop.
    ///
    /// # Errors
    /// As [`Conn::close`](crate::Conn::close).
    pub async fn close(&self) -> Result<()> {
        self.d.close().await
    }

    /// Splits into a read half and a write half, each owned (for two tasks).
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        super::split::split(self)
    }

    /// The local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.d.conn().local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.d.conn().peer_addr()
    }

    /// Device, port, GIDs, QP numbers, MTU and the negotiated parameters.
    pub fn info(&self) -> &ConnInfo {
        self.d.conn().info()
    }

    /// The protocol core's counters; `None` after close.
    pub fn counters(&self) -> Option<rsrdma_proto::Counters> {
        self.d.conn().counters()
    }

    /// Fault injection for tests: moves the queue pair to ERROR.
    ///
    /// # Errors
    /// As [`Conn::inject_qp_error`](crate::Conn::inject_qp_error).
    #[doc(hidden)]
    pub fn inject_qp_error(&self) -> Result<()> {
        self.d.conn().inject_qp_error()
    }
}

pub(super) async fn send_msg(d: &Driven, msg: &[u8]) -> Result<()> {
    poll_fn(|cx| d.poll_op(cx, |c, live| c.step_send_msg(msg, live))).await
}

pub(super) async fn recv_msg(d: &Driven) -> Result<Option<Vec<u8>>> {
    poll_fn(|cx| d.poll_op(cx, |c, live| c.step_recv_msg(live))).await
}

pub(super) async fn recv_msg_into(d: &Driven, buf: &mut [u8]) -> Result<Option<usize>> {
    poll_fn(|cx| d.poll_op(cx, |c, live| c.step_recv_msg_into(buf, live))).await
}

/// Queues a buffer's message; ready in the poll that queues it (the op's, or, on a device
/// with one send SGE, the one that copies the message whole into the core). Its number,
/// when the buffer stays in flight with it.
pub(super) async fn start_send_buffer(d: &Driven, buf: &Buffer, len: usize) -> Result<Option<u64>> {
    match d.conn().prepare_send_buffer(buf, len)? {
        PreparedSend::Op(op) => OpFuture::new(d, op).await.map(|q| Some(q.msg)),
        // The buffer is idle again once the copy is taken (`hold` drops after).
        PreparedSend::Copy(hold) => send_msg(d, hold.bytes(len)).await.map(|()| None),
    }
}

/// The wait (for call `name`) until `buf` is no longer in flight.
async fn buffer_idle(d: &Driven, name: &'static str, buf: &Buffer) -> Result<()> {
    OpFuture::new(d, BufferIdle { name, buf }).await
}

pub(super) async fn recv_buffer(d: &Driven, buf: &mut Buffer) -> Result<Option<usize>> {
    const OP: &str = "recv_buffer";
    // As the blocking face: a buffer of another protection domain is refused here, before a
    // READ into it could break the connection with a protection error.
    buf.check_for(OP, &d.conn().pd(OP)?, 0)?;
    loop {
        // A READ of an earlier, dropped call may still be landing in the buffer: wait for it.
        buffer_idle(d, OP, buf).await?;
        let step = OpFuture::new(d, RecvInto::new(OP, buf.as_mut_slice()?)).await?;
        let len = match step {
            RecvStep::Got(n) => return Ok(n),
            RecvStep::Rendezvous(len) => len,
        };
        // Zero copy: the READ lands in the buffer. A future dropped meanwhile hands the READ
        // to the driver, which keeps the buffer until it lands and moves the message into the
        // core for the next read.
        let pull = Pull::new(OP, len, Dest::Buffer(buf), &d.conn().pd(OP)?)?;
        match OpFuture::new(d, pull).await? {
            Pulled::Done(n) => return Ok(Some(n)),
            // Another reader took the head first: read again.
            Pulled::Retry => continue,
        }
    }
}

pub(super) fn shutdown_read(d: &Driven) -> Result<()> {
    d.conn().shutdown(Shutdown::Read)?;
    // The credit of what is discarded goes back with the keeper's steps, and pending reads
    // wake to see the end.
    d.kick_keeper();
    Ok(())
}

pub(super) async fn shutdown_write(d: &Driven) -> Result<()> {
    d.conn().shutdown(Shutdown::Write)?;
    poll_fn(|cx| d.poll_op(cx, |c, live| c.step_flushed(live))).await
}
