//! [`AsyncPacketConn`]: a [`PacketConn`] for tokio.
//!
//! The send and the receive CQ each have a completion channel; each is watched through the
//! reactor with its own fan-out [`WakerSet`], so any number of tasks may send and receive
//! through one `&AsyncPacketConn` at once. In busy mode (no channels) a waiting call polls
//! again on its task's next turn instead.

use super::wakers::WakerSet;
use super::watch::Watch;
use crate::error::{NetError, Result};
use crate::packet::{Addr, PacketConn, PacketOptions, PacketStats, SendAttempt};
use crate::progress::PollMode;
use rsrdma::Cq;
use std::future::poll_fn;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// One CQ's channel on the reactor, and the tasks waiting on it.
#[derive(Debug)]
struct Side {
    watch: Watch,
    waiters: Arc<WakerSet>,
    fanout: Waker,
}

impl Side {
    fn new(cq: &Cq) -> Result<Option<Side>> {
        let Some(ch) = cq.comp_channel() else {
            return Ok(None);
        };
        // SAFETY: the channel belongs to a CQ of the endpoint that `AsyncPacketConn` holds
        // in a field declared after its `Side`s, so the watch is dropped first.
        let watch = unsafe { Watch::new(ch.as_raw_fd()) }
            .map_err(|e| NetError::io("register with the tokio reactor", e))?;
        let waiters = Arc::new(WakerSet::default());
        Ok(Some(Side {
            watch,
            fanout: Waker::from(waiters.clone()),
            waiters,
        }))
    }
}

/// A UD datagram endpoint on tokio: [`PacketConn`]'s `send_to`/`recv_from`, awaited.
/// Share it by reference or `Arc` between tasks.
#[derive(Debug)]
pub struct AsyncPacketConn {
    // Field order is drop order: the watches deregister before the endpoint closes the fds.
    send: Option<Side>,
    recv: Option<Side>,
    /// `None` only inside the drop, which hands it to the blocking pool.
    inner: Option<PacketConn>,
}

impl Drop for AsyncPacketConn {
    fn drop(&mut self) {
        // The watches deregister before the endpoint closes the channels' fds.
        self.send = None;
        self.recv = None;
        // The endpoint's drop lets its last datagrams leave (a bounded wait): on the blocking
        // pool, never on a runtime thread (F12); outside a runtime, here.
        if let Some(inner) = self.inner.take() {
            super::driven::run_off_runtime(move || drop(inner));
        }
    }
}

impl AsyncPacketConn {
    /// Binds as [`PacketConn::bind`] (verbs calls only, no network wait, so it runs in
    /// place) and registers the CQs' channels with the current runtime's reactor.
    ///
    /// # Errors
    /// As [`PacketConn::bind`]; [`NetError::Io`] when the reactor refuses an fd, and
    /// outside a tokio runtime or in one built without IO.
    ///
    /// # Panics
    /// In a runtime built without IO, when the program is built with `panic = "abort"`
    /// (tokio's own panic, which the error above is caught from otherwise).
    pub fn bind(opts: PacketOptions) -> Result<AsyncPacketConn> {
        let inner = PacketConn::bind(opts)?;
        let (send_cq, recv_cq) = inner.cqs();
        Ok(AsyncPacketConn {
            send: Side::new(send_cq)?,
            recv: Side::new(recv_cq)?,
            inner: Some(inner),
        })
    }

    /// Sends one datagram to `to`, waiting while every send buffer is in flight.
    ///
    /// Cancel-safe: the datagram is copied into a send buffer and posted in the poll that
    /// completes the future, or not at all.
    ///
    /// # Errors
    /// As [`PacketConn::send_to`], less the timeout (use [`tokio::time::timeout`]).
    pub async fn send_to(&self, buf: &[u8], to: &Addr) -> Result<usize> {
        let cq = self.inner().cqs().0;
        let mut made = None;
        loop {
            // Ok: sent (its length); Err: the destination has no address handle yet.
            let attempt = poll_fn(|cx| {
                self.poll_side(cx, self.send.as_ref(), cq, || {
                    Ok(match self.inner().try_send_to(buf, to, &mut made)? {
                        SendAttempt::Full => None,
                        SendAttempt::Sent(n) => Some(Ok(n)),
                        SendAttempt::NeedsAh(to) => Some(Err(to)),
                    })
                })
            })
            .await?;
            match attempt {
                Ok(n) => return Ok(n),
                Err(to) => {
                    // Making an address handle may block for seconds (an address that does
                    // not answer): on the blocking pool, never on a runtime thread.
                    let make = self.inner().ah_maker(to);
                    let handle = tokio::task::spawn_blocking(make).await.map_err(|e| {
                        NetError::io("ibv_create_ah on the blocking pool", e.into())
                    })?;
                    made = Some(handle?);
                }
            }
        }
    }

    /// Receives one datagram into `buf`: its length and the sender's address.
    ///
    /// Cancel-safe: a datagram is taken off the queue and copied into `buf` in the poll that
    /// completes the future; a future dropped before that leaves it queued.
    ///
    /// # Errors
    /// As [`PacketConn::recv_from`], less the timeout.
    pub async fn recv_from(&self, buf: &mut [u8]) -> Result<(usize, Addr)> {
        let cq = self.inner().cqs().1;
        poll_fn(|cx| {
            self.poll_side(cx, self.recv.as_ref(), cq, || {
                self.inner().try_recv_from(buf)
            })
        })
        .await
    }

    /// This endpoint's address.
    pub fn local_addr(&self) -> Addr {
        self.inner().local_addr()
    }

    /// The largest datagram this endpoint sends and receives.
    pub fn max_datagram(&self) -> usize {
        self.inner().max_datagram()
    }

    /// The counters.
    pub fn stats(&self) -> PacketStats {
        self.inner().stats()
    }

    /// The blocking endpoint underneath (for its other calls; its blocking waits block the
    /// runtime's thread).
    pub fn get_ref(&self) -> &PacketConn {
        self.inner()
    }

    fn inner(&self) -> &PacketConn {
        self.inner
            .as_ref()
            .expect("the endpoint is taken only by AsyncPacketConn's drop")
    }

    /// Tries `attempt`; when it would block, arms `cq`, tries again, then waits on the
    /// channel (or, in busy mode, polls again on the next turn).
    fn poll_side<T>(
        &self,
        cx: &mut Context<'_>,
        side: Option<&Side>,
        cq: &Cq,
        mut attempt: impl FnMut() -> Result<Option<T>>,
    ) -> Poll<Result<T>> {
        loop {
            match attempt() {
                Ok(Some(v)) => return Poll::Ready(Ok(v)),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            let Some(side) = side.filter(|_| self.inner().poll_mode() != PollMode::Busy) else {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            };
            side.waiters.register(cx.waker());
            if let Err(e) = cq.arm(false) {
                return Poll::Ready(Err(e.into()));
            }
            match attempt() {
                Ok(Some(v)) => return Poll::Ready(Ok(v)),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            match side.watch.take_ready(&side.fanout) {
                Ok(true) => {
                    // Empty the channel; the loop re-arms before it waits again.
                    while cq.try_event()? {}
                }
                Ok(false) => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(NetError::io("poll the completion channel", e))),
            }
        }
    }
}
