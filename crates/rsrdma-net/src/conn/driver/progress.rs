//! One step's input side: reaping completions into the core, firing due timers, and the
//! reader hand-off ([`Take`]).

use super::*;

impl Driver {
    /// One step: reaps completions, fires due timers, drains events; returns whether anything
    /// happened (a completion, a timer, a state change). It posts nothing: the caller runs its
    /// operation next and then [`Driver::post_work`] once, so that what both queued goes out
    /// in one batch.
    pub(crate) fn progress(&mut self, now: Instant) -> bool {
        self.progress_taking(now, &mut Take::new(None))
    }

    /// [`Driver::progress`], offering `take`'s buffer to the receive completions it reaps: the
    /// first whole message that would be the next one read goes straight into it
    /// ([`rsrdma_proto::Conn::handle_recv_completion_into`]), and `take.got` says its length.
    pub(crate) fn progress_taking(&mut self, now: Instant, take: &mut Take<'_>) -> bool {
        let mut changed = self.poll_cq(now, take);
        // The transport's end after the peer's FIN (`peer_gone`) releases too.
        changed |= self.check_end(now);
        if changed && !self.rdv_sends.is_empty() {
            self.release_rendezvous();
        }
        if changed && self.owned_read.is_some() {
            self.land_owned_read();
        }
        if changed && self.read_hold.is_held() {
            let (core, peer_gone, sends_done) = (&mut self.core, self.peer_gone, self.sends_done);
            self.read_hold
                .settle(core, peer_gone, sends_done, |h, len| h.landed(len).to_vec());
        }
        changed |= self.look_at_device(now);
        if !self.peer_gone {
            if let Some(t) = self.core.poll_timeout() {
                if now >= t {
                    // A peer whose frames wait for room in this side's shared pool is not
                    // silent by its own doing (see `Conn::excuse_silence`).
                    if let Some(low_at) =
                        self.core.memory().pool().and_then(|p| p.events().low_at())
                    {
                        self.core.excuse_silence(now, low_at);
                    }
                    self.core.handle_timeout(now);
                    changed = true;
                }
            }
        }
        if self.core.memory().faulted() && self.core.error().is_none() {
            tracing::error!("rsrdma-net conn: the core addressed memory outside its slots");
            self.core.handle_fatal(Fatal::QpError);
            changed = true;
        }
        while self.core.poll_event().is_some() {
            changed = true;
        }
        changed
    }

    /// Now and then ([`LOOK_EVERY`]), what the device's event queue says: a device that
    /// reported a fatal error fails the connection (its queues may never complete anything
    /// again, so nothing else would tell). Returns whether it did.
    fn look_at_device(&mut self, now: Instant) -> bool {
        if self.next_look.is_some_and(|t| now < t) {
            return false;
        }
        self.next_look = Some(now + LOOK_EVERY);
        self.facts.poll(self.qp.pd().context());
        if self.core.error().is_some() {
            return false;
        }
        if self.facts.device_failed() {
            tracing::error!("rsrdma-net conn: its device failed");
        } else if let Some(port) = self.rail_port.filter(|p| self.facts.port_down(*p)) {
            // A rail is taken out at once: its stripes go on the other rails.
            tracing::warn!(port, "rsrdma-net conn: a rail's port went down");
        } else {
            return false;
        }
        self.broken = true;
        self.core.handle_fatal(Fatal::Disconnected);
        true
    }

    pub(super) fn poll_cq(&mut self, now: Instant, take: &mut Take<'_>) -> bool {
        let mut any = false;
        loop {
            let n = match self.cq.poll(&mut self.wcs) {
                Ok(n) => n,
                Err(_) => {
                    self.broken = true;
                    if self.core.error().is_none() {
                        self.core.handle_fatal(Fatal::QpError);
                    }
                    return true;
                }
            };
            for i in 0..n {
                let wc = self.wcs[i];
                self.on_completion(&wc, now, take);
            }
            any |= n > 0;
            if n < POLL_BATCH {
                return any;
            }
        }
    }

    pub(super) fn on_completion(&mut self, wc: &Wc, now: Instant, take: &mut Take<'_>) {
        let id = wc.wr_id();
        if id == crate::conn::wr_id::AUTH_WR_ID {
            // The rdma_cm proof sent before the core started (its bytes were inline).
            return;
        }
        let status = if wc.is_ok() {
            Ok(())
        } else {
            Err(wc.status().0)
        };
        let is_recv = id & RECV_TAG != 0;
        // Before anything may return early: a pool slot must be bound (or given back).
        let mut recv_slot = None;
        if is_recv {
            self.recvs_posted = self.recvs_posted.saturating_sub(1);
            let landed = wc.is_ok().then(|| wc.byte_len() as usize);
            recv_slot = self.core.memory_mut().take_recv(id, landed);
        } else {
            self.sends_done = self.sends_done.max(id + 1);
        }
        if self.peer_gone || (status.is_err() && self.core.error().is_some()) {
            return;
        }
        if status.is_err() {
            self.broken = true;
            if self.core.peer_closed() {
                // The peer tore down after its FIN (see the module docs).
                self.peer_gone = true;
                return;
            }
            if self.flushing_after_end {
                // The flush after the transport's end, and no FIN before it.
                self.core.handle_fatal(Fatal::Disconnected);
                return;
            }
        }
        if let (true, Some(slot), Some(_)) = (is_recv && status.is_ok(), recv_slot, wc.imm_data()) {
            self.core.handle_recv_with_immediate(slot, now);
            return;
        }
        if is_recv {
            match (recv_slot, take.wants()) {
                (Some(slot), Some(buf)) => {
                    take.got = self.core.handle_recv_completion_into(
                        slot,
                        wc.byte_len(),
                        status,
                        now,
                        buf,
                    );
                }
                (Some(slot), None) => {
                    self.core
                        .handle_recv_completion(slot, wc.byte_len(), status, now);
                }
                // No free slot: the peer sent beyond its credits.
                (None, _) => self.core.handle_fatal(Fatal::QpError),
            }
        } else {
            self.core.handle_send_completion(WrId(id), status);
        }
    }

    /// Asks for a completion event (the progress thread, before it sleeps).
    pub(crate) fn arm(&self) -> bool {
        self.cq.arm(false).is_ok()
    }
}
