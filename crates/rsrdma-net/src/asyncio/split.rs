//! [`OwnedReadHalf`] and [`OwnedWriteHalf`]: an [`AsyncConn`] split for two tasks.
//!
//! Both halves drive the same connection: whichever task runs a step makes progress for
//! the other, and one completion event wakes both (see [`super::wakers`]). Dropping the
//! write half half-closes the connection (FIN after everything queued), as tokio's
//! `TcpStream` halves do; [`OwnedReadHalf::reunite`] gives the connection back instead.
//! Either half can [`close`](OwnedWriteHalf::close) the whole connection (no need to reunite
//! them first), and dropping both closes it in the background as dropping an
//! [`AsyncConn`] does.

use super::conn::{recv_msg, recv_msg_into, send_msg, shutdown_read, shutdown_write, AsyncConn};
use super::driven::Driven;
use crate::error::Result;
use std::net::Shutdown;
use std::sync::Arc;

/// The reading half of an [`AsyncConn`]: [`tokio::io::AsyncRead`] and the receive calls.
#[derive(Debug)]
pub struct OwnedReadHalf {
    pub(super) d: Arc<Driven>,
}

/// The writing half of an [`AsyncConn`]: [`tokio::io::AsyncWrite`] and `send_msg`. Dropping
/// it half-closes the connection.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    pub(super) d: Arc<Driven>,
    shutdown_on_drop: bool,
}

/// [`OwnedReadHalf::reunite`] was given halves of two different connections; here they are
/// back.
#[derive(Debug)]
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

impl std::fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the two halves are not from the same AsyncConn")
    }
}

impl std::error::Error for ReuniteError {}

pub(super) fn split(conn: AsyncConn) -> (OwnedReadHalf, OwnedWriteHalf) {
    let d = conn.d.clone();
    (
        OwnedReadHalf { d: conn.d },
        OwnedWriteHalf {
            d,
            shutdown_on_drop: true,
        },
    )
}

impl OwnedReadHalf {
    /// As [`AsyncConn::recv_msg`] (cancel-safe).
    ///
    /// # Errors
    /// As [`AsyncConn::recv_msg`].
    pub async fn recv_msg(&self) -> Result<Option<Vec<u8>>> {
        recv_msg(&self.d).await
    }

    /// As [`AsyncConn::recv_msg_into`] (cancel-safe).
    ///
    /// # Errors
    /// As [`AsyncConn::recv_msg_into`].
    pub async fn recv_msg_into(&self, buf: &mut [u8]) -> Result<Option<usize>> {
        recv_msg_into(&self.d, buf).await
    }

    /// As [`AsyncConn::shutdown_read`]: for a task that stops reading while the write half
    /// goes on sending.
    ///
    /// # Errors
    /// As [`AsyncConn::shutdown_read`].
    pub fn shutdown_read(&self) -> Result<()> {
        shutdown_read(&self.d)
    }

    /// Closes the whole connection, as [`AsyncConn::close`]: the write half's sends fail
    /// afterwards.
    ///
    /// # Errors
    /// As [`AsyncConn::close`].
    pub async fn close(&self) -> Result<()> {
        self.d.close().await
    }

    /// Joins the halves again.
    ///
    /// # Errors
    /// [`ReuniteError`] (with both halves) when they come from different connections.
    pub fn reunite(self, mut w: OwnedWriteHalf) -> std::result::Result<AsyncConn, ReuniteError> {
        if !Arc::ptr_eq(&self.d, &w.d) {
            return Err(ReuniteError(self, w));
        }
        w.shutdown_on_drop = false;
        Ok(AsyncConn { d: self.d })
    }
}

impl OwnedWriteHalf {
    /// As [`AsyncConn::send_msg`] (cancel-safe).
    ///
    /// # Errors
    /// As [`AsyncConn::send_msg`].
    pub async fn send_msg(&self, msg: &[u8]) -> Result<()> {
        send_msg(&self.d, msg).await
    }

    /// As [`AsyncConn::shutdown_write`].
    ///
    /// # Errors
    /// As [`AsyncConn::shutdown_write`].
    pub async fn shutdown_write(&self) -> Result<()> {
        shutdown_write(&self.d).await
    }

    /// Closes the whole connection, as [`AsyncConn::close`]: the read half's reads end
    /// afterwards.
    ///
    /// # Errors
    /// As [`AsyncConn::close`].
    pub async fn close(&self) -> Result<()> {
        self.d.close().await
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            // Queues the FIN without waiting; an error (closed, failed) leaves nothing to do.
            // A FIN that waits for credit goes with the keeper's steps.
            if self.d.conn().shutdown(Shutdown::Write).is_ok() {
                self.d.kick_keeper();
            }
        }
    }
}
