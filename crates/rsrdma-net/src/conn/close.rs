//! Close, one for both faces: [`Conn::begin_close`] queues the FIN after everything queued;
//! the caller waits for [`CloseWait`] (blocking: the runner, up to the linger; async: a
//! future bounded by the keeper's alarm at the linger's end); [`Conn::finish_close`] stops
//! the connection's steps, tears the driver down (the QP's flush reaped before any memory
//! goes) and says how it went, which it keeps ([`CloseEnd`]) for a close that raced it.

use super::driver::Driver;
use super::op::Op;
use super::sides::Side;
use super::Conn;
use crate::error::{NetError, Result};
use rsrdma_proto::ProtoError;
use std::time::Duration;

/// How long teardown waits for the QP's flush before it leaks the memory instead.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// How long a refused connection waits for its ABORT to leave before its teardown.
const REFUSAL_LIMIT: Duration = Duration::from_millis(200);

/// How a close ended, kept in the shared state so that a close that raced it (another
/// thread's or task's, which found it begun) waits for the same teardown and says the same.
#[derive(Clone, Debug)]
pub(crate) enum CloseEnd {
    Delivered,
    Undelivered { millis: u64 },
    Failed(ProtoError),
}

impl CloseEnd {
    fn of(r: &Result<()>) -> CloseEnd {
        match r {
            Ok(()) => CloseEnd::Delivered,
            Err(NetError::ConnFailed(e)) => CloseEnd::Failed(e.clone()),
            Err(NetError::Timeout { millis, .. }) => CloseEnd::Undelivered { millis: *millis },
            // finish_close says nothing else; were it to, the racing close reports success
            // of the teardown rather than an error it cannot rebuild.
            Err(_) => CloseEnd::Delivered,
        }
    }

    pub(crate) fn result(&self) -> Result<()> {
        match self {
            CloseEnd::Delivered => Ok(()),
            CloseEnd::Undelivered { millis } => Err(NetError::Timeout {
                op: UNDELIVERED,
                millis: *millis,
            }),
            CloseEnd::Failed(e) => Err(NetError::ConnFailed(e.clone())),
        }
    }
}

/// The timeout's name when a close's linger ended before the queued data was confirmed.
const UNDELIVERED: &str = "close: delivering the queued data";

/// How [`Conn::begin_close`] found the connection.
#[derive(Debug)]
pub(crate) enum CloseStart {
    /// Another close began earlier: wait for its end ([`Conn::close_end`]) and say the same.
    Already,
    /// FIN is queued: wait for [`CloseWait`], then [`Conn::finish_close`].
    Started,
    /// The connection had failed: go straight to [`Conn::finish_close`].
    Failed(ProtoError),
}

/// The wait of a close: done when our FIN completed (so every byte before it sits in the
/// peer's slots), the peer left, or the connection failed. Close does not wait for the
/// peer's FIN: a peer that is still reading gets our FIN, then sees our teardown as its peer
/// leaving after FIN (its reads go on to EOF, its sends say `PeerGone`), as a TCP peer would
/// see a closed socket.
pub(crate) struct CloseWait;

impl Op for CloseWait {
    type Out = ();

    fn name(&self) -> &'static str {
        "close"
    }

    fn side(&self) -> Option<Side> {
        None
    }

    fn poll(&mut self, d: &mut Driver) -> Result<Option<()>> {
        let core = d.core_ref();
        Ok((core.error().is_some() || d.peer_gone() || core.is_drained()).then_some(()))
    }
}

/// The wait of a refused connection ([`Conn::abort_unaccepted`]): done when nothing is in
/// flight any more (its ABORT completed), or the peer left.
struct RefusalSent;

impl Op for RefusalSent {
    type Out = ();

    fn name(&self) -> &'static str {
        "refuse an unaccepted connection"
    }

    fn side(&self) -> Option<Side> {
        None
    }

    fn poll(&mut self, d: &mut Driver) -> Result<Option<()>> {
        Ok((d.peer_gone() || d.core_ref().is_drained()).then_some(()))
    }
}

impl Conn {
    /// Starts a close without waiting: FIN after everything queued.
    pub(crate) fn begin_close(&self) -> CloseStart {
        let mut st = self.shared.lock();
        if st.closing {
            return CloseStart::Already;
        }
        st.closing = true;
        let out = match st.driver.as_mut() {
            Some(d) => {
                let failed = d.core_ref().error().cloned();
                if failed.is_none() && !d.peer_gone() {
                    let _ = d.core().close();
                }
                d.post_work();
                failed.map_or(CloseStart::Started, CloseStart::Failed)
            }
            None => CloseStart::Started,
        };
        self.shared.changed(&mut st);
        out
    }

    /// Ends a close begun by [`Conn::begin_close`]: stops the connection's steps (and its
    /// progress thread, when it has one), tears the driver down (reaping the flush, bounded)
    /// and says what `close` says. `delivered` is how the wait for [`CloseWait`] ended
    /// within the linger time. The async face deregisters its fds from the reactor first:
    /// the liveness fd closes here.
    ///
    /// # Errors
    /// [`NetError::ConnFailed`] for a connection that had failed; [`NetError::Timeout`] when
    /// the queued data was not confirmed delivered in time.
    pub(crate) fn finish_close(
        &self,
        failed: Option<ProtoError>,
        delivered: Result<()>,
    ) -> Result<()> {
        let (driver, ours_done) = self.detach_driver();
        if driver.is_none() {
            // Another close detached it first (two async closes that raced past the check of
            // a pending one): its end is this one's, which must neither return before that
            // teardown is done nor overwrite what it said.
            return self.wait_close_end();
        }
        self.shared.wake.wake();
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = worker {
            let _ = w.join();
        }
        // A protocol violation of the peer's that came while this close waited (a second
        // FIN, data after its FIN) is the connection's outcome: an outside tester's hostile
        // peer was aborted for one and the close said `Ok` (3 of 4 runs).
        let failed = failed.or_else(|| {
            driver
                .as_ref()
                .and_then(|d| d.core_ref().error())
                .filter(|e| e.is_peers_violation())
                .cloned()
        });
        if let Some(d) = driver {
            d.teardown(crate::deadline::deadline_after(FLUSH_LIMIT));
        }
        let r = match (failed, delivered) {
            (Some(e), _) => Err(NetError::ConnFailed(e)),
            (None, Err(NetError::Timeout { .. })) if ours_done => Ok(()),
            (None, Err(NetError::Timeout { .. })) => Err(NetError::Timeout {
                op: UNDELIVERED,
                millis: crate::deadline::whole_millis(self.linger),
            }),
            (None, Err(NetError::ConnFailed(e))) => Err(NetError::ConnFailed(e)),
            (None, _) => Ok(()),
        };
        let mut st = self.shared.lock();
        st.closed = Some(CloseEnd::of(&r));
        self.shared.changed(&mut st);
        r
    }

    /// Ends a connection its listener never handed out (the listener is gone) without a
    /// FIN and without a linger: the peer's reads end in an error (its peer left without
    /// closing), not in the end-of-stream that says this side read what it was sent and
    /// closed. (A dropped listener closed them cleanly: a dialer's messages were lost
    /// behind an end-of-stream.)
    pub(crate) fn abort_unaccepted(&self) {
        {
            let mut st = self.shared.lock();
            if st.closing {
                return;
            }
            st.closing = true;
            // The peer is told why (an ABORT: "its listener closed before anyone accepted
            // this connection"), where the teardown alone says only that the transport broke.
            if let Some(d) = st.driver.as_mut() {
                if d.core_ref().error().is_none() && !d.peer_gone() {
                    d.core().refuse();
                    d.post_work();
                }
            }
            self.shared.changed(&mut st);
        }
        // The ABORT must leave before the teardown flushes the queue pair: its completion is
        // waited for, briefly (the runner steps a connection that has no progress thread).
        let _ = self.run(&mut RefusalSent, Some(REFUSAL_LIMIT));
        let _ = self.finish_close(None, Ok(()));
    }

    /// Finishes a close that was begun and left (an async close dropped half-way, then its
    /// connection): waits for the delivery of what was queued up to the linger (stepping the
    /// driver itself: a connection without a progress thread has nobody else), then tears
    /// down.
    #[cfg(feature = "tokio")]
    pub(crate) fn finish_begun_close(&self) -> Result<()> {
        let failed = {
            let st = self.shared.lock();
            st.driver
                .as_ref()
                .and_then(|d| d.core_ref().error().cloned())
        };
        let delivered = match failed {
            Some(_) => Ok(()),
            None => self.run(&mut CloseWait, Some(self.linger)),
        };
        self.finish_close(failed, delivered)
    }

    /// How the close ended, once its teardown is done (`None` before).
    #[cfg(feature = "tokio")]
    pub(crate) fn close_end(&self) -> Option<Result<()>> {
        self.shared.lock().closed.as_ref().map(CloseEnd::result)
    }

    /// Waits for a close that another thread began and says what it said. Bounded: that
    /// close takes at most the linger and the teardown's flush limit.
    pub(crate) fn wait_close_end(&self) -> Result<()> {
        let limit = self
            .linger
            .saturating_add(FLUSH_LIMIT)
            .saturating_add(Duration::from_secs(1));
        let deadline = crate::deadline::deadline_after(limit);
        self.shared
            .wait_for(deadline, |st| st.closed.clone())
            .map_or_else(
                || {
                    Err(NetError::Timeout {
                        op: "close: waiting for another close of this connection",
                        millis: crate::deadline::whole_millis(limit),
                    })
                },
                |end| end.result(),
            )
    }
}
