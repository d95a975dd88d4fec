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

    /// After the transport ended: the peer's FIN makes it a normal end, its absence (after
    /// the grace) a fatal one.
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
        if now >= at + END_GRACE {
            self.broken = true;
            self.core.handle_fatal(Fatal::Disconnected);
            return true;
        }
        false
    }

    /// When [`Driver::progress`] is next due without any completion.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let grace = match self.ended_at {
            Some(at) if !self.peer_gone && self.core.error().is_none() => Some(at + END_GRACE),
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
