//! Teardown: the QP to ERROR, its flush reaped (the pool's completions drained), and only
//! then the memory released, or leaked if the flush cannot be confirmed.

use super::*;

impl Driver {
    pub(super) fn outstanding(&self) -> u64 {
        self.recvs_posted + self.sends_posted.saturating_sub(self.sends_done)
    }

    /// Unsignaled sends that already executed leave the send queue without a completion, so
    /// after the last signaled one nothing would ever confirm them: a signaled empty send
    /// posted on the QP in ERROR is flushed after every earlier request, and its completion
    /// accounts for them all.
    pub(super) fn post_flush_marker(&mut self) {
        if self.sends_posted <= self.sends_done {
            return;
        }
        self.post_marker();
    }

    /// A signaled empty send, on the QP in ERROR: flushed after everything before it, so its
    /// completion comes even when nothing else of the QP's is outstanding.
    pub(super) fn post_marker(&mut self) {
        let wr = SendWr::send(self.sends_posted, &[]).signaled(true);
        // SAFETY: an empty send names no memory.
        if unsafe { self.qp.post_send(&wr) }.is_ok() {
            self.sends_posted += 1;
        }
    }

    /// Stops the QP, reaps its flushed requests, and releases everything; leaks the memory
    /// if the flush cannot be confirmed by `deadline`.
    pub(crate) fn teardown(mut self, deadline: Instant) {
        if let Liveness::Cm(id) = &self.liveness {
            let _ = id.disconnect();
        }
        if let Err(e) = self.qp.to_error() {
            tracing::debug!(error = %e, "moving the QP to ERROR failed");
        }
        self.post_flush_marker();
        let mut wcs = [Wc::default(); POLL_BATCH];
        while self.outstanding() > 0 {
            match self.cq.poll(&mut wcs) {
                Ok(0) if Instant::now() >= deadline => break,
                Ok(0) => std::thread::sleep(Duration::from_micros(200)),
                Ok(n) => {
                    for wc in &wcs[..n] {
                        let id = wc.wr_id();
                        if id == crate::conn::wr_id::AUTH_WR_ID {
                            // rdma_cm's proof, sent before the core: none of the core's.
                            continue;
                        }
                        if id & RECV_TAG != 0 {
                            self.recvs_posted = self.recvs_posted.saturating_sub(1);
                            self.core.memory_mut().reaped_recv(id);
                        } else {
                            self.sends_done = self.sends_done.max(id + 1);
                        }
                    }
                }
                Err(_) => break,
            }
        }
        if self.outstanding() > 0 {
            tracing::error!(
                outstanding = self.outstanding(),
                "rsrdma-net conn: the QP's flush was not confirmed; leaking its memory rather \
                 than freeing what the NIC may still touch"
            );
            let Driver {
                core,
                qp,
                liveness,
                rdv_sends,
                read_hold,
                owned_read,
                ..
            } = self;
            drop(qp);
            drop(liveness);
            std::mem::forget(core);
            std::mem::forget(rdv_sends);
            std::mem::forget(read_hold);
            std::mem::forget(owned_read);
            return;
        }
        // With a shared receive pool (F6): the receives this QP took from the SRQ are not
        // counted in `outstanding` (they were never posted on the QP), and a completion left
        // in the CQ when it is destroyed takes its pool slot with it: every peer SEND that
        // landed after the last step (a close while the peer streams), and the receive a
        // flush ends mid-message.
        if self.core.memory_mut().pooled() {
            let qp_num = self.qp.qp_num();
            drain_pool_completions(&self.cq, self.core.memory_mut(), qp_num, deadline);
        }
        self.core.handle_fatal(Fatal::Disconnected);
        self.core.handle_flushed();
        // Windows go first: a bound type-2 window holds a reference to its QP, whose
        // destruction would wait for it (rxe: a timeout per window). The QP is flushed, so
        // no request reaches the memory through them any more. Then the QP (it names the
        // memory), then the memory and the CQ.
        let Driver {
            core,
            qp,
            cq,
            liveness,
            mut rdv_sends,
            free_windows,
            read_hold,
            owned_read,
            ..
        } = self;
        for r in rdv_sends.iter_mut() {
            drop(r.window.take());
        }
        drop(free_windows);
        drop(qp);
        // Flushed: the peer can no longer read what our RTSs exposed, nor a READ land.
        drop(rdv_sends);
        drop(read_hold);
        drop(owned_read);
        drop(core);
        drop(cq);
        drop(liveness);
    }
}

/// Drains `cq`, the CQ of QP `qp_num` (in ERROR) whose receives come from `slots`' shared
/// pool, giving each pool slot back, until the device's LAST_WQE_REACHED for that QP has
/// come (read by the pool's event thread, [`crate::conn::pool_events`]) and the CQ is then
/// empty: after that event no receive of the QP is left to complete. A device that raises
/// no such event (rxe before Linux 6.3) ends the drain once the CQ stayed empty for
/// [`POOL_QUIET`]. Used by the teardown and by a set-up that fails once its QP could receive
/// ([`crate::conn::establish::Local::abandon`]).
pub(crate) fn drain_pool_completions(cq: &Cq, slots: &mut Slots, qp_num: u32, deadline: Instant) {
    let events = slots.pool().cloned();
    let mut wcs = [Wc::default(); POLL_BATCH];
    let mut quiet_since = Instant::now();
    let mut last_wqe = false;
    loop {
        match cq.poll(&mut wcs) {
            Ok(0) => {
                if last_wqe {
                    return;
                }
                let now = Instant::now();
                if now >= deadline {
                    return;
                }
                match events.as_ref().map(|p| p.events()) {
                    // A lost event costs at most a second of waiting.
                    Some(ev)
                        if ev.raises_last_wqe()
                            && now.duration_since(quiet_since) < Duration::from_secs(1) =>
                    {
                        let step = (now + Duration::from_micros(200)).min(deadline);
                        last_wqe = ev.wait_last_wqe(qp_num, step);
                    }
                    _ if now.duration_since(quiet_since) >= POOL_QUIET => return,
                    _ => std::thread::sleep(Duration::from_micros(200)),
                }
            }
            Ok(n) => {
                for wc in &wcs[..n] {
                    if wc.wr_id() & RECV_TAG != 0 {
                        slots.reaped_recv(wc.wr_id());
                    }
                }
                quiet_since = Instant::now();
            }
            Err(_) => return,
        }
    }
}
