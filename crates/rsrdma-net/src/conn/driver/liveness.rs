//! The peer's liveness besides the data path: the rdma_cm id's or the TCP channel's end, and
//! the grace for a FIN to surface after it.

use super::*;

impl Driver {
    /// The fd that signals the transport's end, while it has not ended.
    pub(crate) fn liveness_fd(&self) -> Option<RawFd> {
        if self.ended_at.is_some() {
            return None;
        }
        Some(match &self.liveness {
            Liveness::Cm(id) => id.as_raw_fd(),
            Liveness::Tcp(ch) => ch.as_raw_fd(),
        })
    }

    /// Reads the liveness signal (never blocks); called when its fd is readable.
    pub(crate) fn check_liveness(&mut self, now: Instant) {
        if self.ended_at.is_some() {
            return;
        }
        let ended = match &mut self.liveness {
            Liveness::Cm(id) => {
                let mut ended = false;
                loop {
                    match id.try_next_event() {
                        Ok(Some(ev)) => {
                            ended |= matches!(
                                ev.kind,
                                CmEventType::DISCONNECTED | CmEventType::DEVICE_REMOVAL
                            );
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "rdma_cm event channel failed");
                            ended = true;
                            break;
                        }
                    }
                }
                ended
            }
            Liveness::Tcp(ch) => !matches!(ch.peer_open(), Ok(true)),
        };
        if ended {
            tracing::debug!("rsrdma-net conn: the transport ended");
            self.ended_at = Some(now);
        }
    }

    /// After the transport ended: the peer's FIN makes it a normal end, its absence a fatal
    /// one. Whether the FIN came is told by the QP's flush, not by a clock: the QP goes to
    /// ERROR, and what the peer sent that landed completes before the flush (the device
    /// completed it before it acknowledged it; soft0's delayed completions keep each QP's
    /// order), so the FIN is seen first if it came, and the first flushed completion
    /// otherwise ([`Driver::on_completion`]). A fixed grace (200 ms) lost every message of a
    /// peer's clean close to completions 300 ms late (soft0's `delay` fault), although the
    /// peer's close had said `Ok` (an outside tester's find; another found the same with a
    /// shared receive pool). The flush does not complete a pool's receives, so a marker send
    /// posted on the QP in ERROR makes sure a flushed completion comes after everything that
    /// landed. Only a QP that cannot be moved to ERROR falls back to a short grace.
    pub(super) fn check_end(&mut self, now: Instant) -> bool {
        let Some(at) = self.ended_at else {
            return false;
        };
        if self.peer_gone || self.core.error().is_some() {
            return false;
        }
        if self.core.peer_closed() {
            self.peer_gone = true;
            return true;
        }
        if !self.flushing_after_end {
            self.flushing_after_end = true;
            match self.qp.to_error() {
                Ok(()) => {
                    // A flushed completion comes even with nothing outstanding.
                    self.post_marker();
                    return true;
                }
                Err(e) => tracing::debug!(error = %e, "moving the QP to ERROR failed"),
            }
        }
        if now >= at + self.end_limit() {
            self.broken = true;
            self.core.handle_fatal(Fatal::Disconnected);
            return true;
        }
        false
    }

    /// How long after the transport's end the FIN may still surface.
    fn end_limit(&self) -> Duration {
        if self.flushing_after_end {
            END_FLUSH_LIMIT
        } else {
            END_GRACE
        }
    }

    /// When [`Driver::progress`] is next due without any completion.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let grace = match self.ended_at {
            Some(at) if !self.peer_gone && self.core.error().is_none() => {
                Some(at + self.end_limit())
            }
            _ => None,
        };
        let timer = if self.peer_gone {
            None
        } else {
            self.core.poll_timeout()
        };
        match (grace, timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
