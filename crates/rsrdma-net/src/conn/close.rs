//! Close, one for both faces: [`Conn::begin_close`] queues the FIN after everything queued;
//! the caller waits for [`CloseWait`] (blocking: the runner, up to the linger; async: a
//! future under a tokio timeout); [`Conn::finish_close`] stops the connection's steps, tears
//! the driver down (the QP's flush reaped before any memory goes) and says how it went.

use super::driver::Driver;
use super::op::Op;
use super::sides::Side;
use super::Conn;
use crate::error::{NetError, Result};
use rsrdma_proto::ProtoError;
use std::time::Duration;

/// How long teardown waits for the QP's flush before it leaks the memory instead.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// How [`Conn::begin_close`] found the connection.
#[derive(Debug)]
pub(crate) enum CloseStart {
    /// Another close began earlier: nothing to do.
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
        let driver = self.detach_driver();
        self.shared.wake.wake();
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = worker {
            let _ = w.join();
        }
        let ours_done = driver
            .as_ref()
            .is_some_and(|d| d.core_ref().is_drained() || d.peer_gone());
        if let Some(d) = driver {
            d.teardown(crate::deadline::deadline_after(FLUSH_LIMIT));
        }
        if let Some(e) = failed {
            return Err(NetError::ConnFailed(e));
        }
        match delivered {
            Err(NetError::Timeout { .. }) if ours_done => Ok(()),
            Err(NetError::Timeout { .. }) => Err(NetError::Timeout {
                op: "close: delivering the queued data",
                millis: self.linger.as_millis().try_into().unwrap_or(u64::MAX),
            }),
            Err(NetError::ConnFailed(e)) => Err(NetError::ConnFailed(e)),
            _ => Ok(()),
        }
    }
}
