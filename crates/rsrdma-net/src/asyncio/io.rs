//! [`AsyncRead`] and [`AsyncWrite`] for [`AsyncConn`] and its halves: the byte stream of
//! [`Conn`](crate::Conn)'s `Read`/`Write`, with the same meaning.
//!
//! `poll_read` fills the buffer from the next messages (boundaries are not kept) and reads
//! nothing only at the end of the stream. `poll_write` sends one message of up to the
//! negotiated cap. `poll_flush` waits until every byte taken is handed to the NIC.
//! `poll_shutdown` is the half-close (FIN after everything queued, then as `poll_flush`);
//! reading goes on. Errors are [`NetError::into_io`](crate::NetError::into_io)'s kinds.
//!
//! All four are cancel-safe: bytes are taken from or copied into the caller's buffer only
//! in the poll that returns `Ready`, and the NIC only ever touches the connection's own
//! registered slots, never a caller's buffer.

use super::conn::AsyncConn;
use super::driven::Driven;
use super::split::{OwnedReadHalf, OwnedWriteHalf};
use crate::error::NetError;
use std::io;
use std::net::Shutdown;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn io_err(e: NetError) -> io::Error {
    e.into_io()
}

pub(super) fn poll_read(
    d: &Driven,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    if buf.remaining() == 0 {
        return Poll::Ready(Ok(()));
    }
    let dst = buf.initialize_unfilled();
    let n = match d.poll_op(cx, |c, live| c.step_read(dst, live)) {
        Poll::Ready(Ok(n)) => n,
        Poll::Ready(Err(e)) => return Poll::Ready(Err(io_err(e))),
        Poll::Pending => return Poll::Pending,
    };
    buf.advance(n);
    Poll::Ready(Ok(()))
}

pub(super) fn poll_write(d: &Driven, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    if buf.is_empty() {
        return Poll::Ready(Ok(0));
    }
    let n = buf.len().min(d.conn().info().settled.max_message as usize);
    d.poll_op(cx, |c, live| c.step_send_msg(&buf[..n], live))
        .map_ok(|()| n)
        .map_err(|e| io_err(e.naming("write")))
}

pub(super) fn poll_flush(d: &Driven, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    d.poll_op(cx, |c, live| c.step_flushed(live))
        .map_err(io_err)
}

pub(super) fn poll_shutdown(d: &Driven, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    // Idempotent: the FIN is queued once, later polls only wait for the flush.
    if let Err(e) = d.conn().shutdown(Shutdown::Write) {
        return Poll::Ready(Err(io_err(e)));
    }
    poll_flush(d, cx)
}

impl AsyncRead for AsyncConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read(&self.d, cx, buf)
    }
}

impl AsyncWrite for AsyncConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_write(&self.d, cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_flush(&self.d, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_shutdown(&self.d, cx)
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read(&self.d, cx, buf)
    }
}

impl AsyncWrite for OwnedWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_write(&self.d, cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_flush(&self.d, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_shutdown(&self.d, cx)
    }
}
