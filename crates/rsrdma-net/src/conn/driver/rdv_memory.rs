//! Memory the NIC may touch for a rendezvous: a send's window or registration and buffer
//! until its DONE, a READ's destination until it lands (the driver's own vector, or a
//! `Buffer`), and cutting the NIC off when a caller must have its memory back.

use super::*;

/// A READ's destination that the driver owns: the message lands in the core as the head's
/// reassembled bytes, so any read call serves it, and no call holds memory the NIC writes.
pub(super) struct OwnedRead {
    /// `None` once deregistered.
    pub(super) mr: Option<Mr>,
    pub(super) vec: Vec<u8>,
}

impl OwnedRead {
    /// The landed bytes, once the registration is gone; `None` (the vector leaked) when the
    /// deregistration failed (F11).
    fn into_landed(mut self) -> Option<Vec<u8>> {
        let mr = self.mr.take()?;
        let vec = std::mem::take(&mut self.vec);
        if crate::conn::region::deregistered(mr) {
            Some(vec)
        } else {
            std::mem::forget(vec);
            None
        }
    }
}

impl Drop for OwnedRead {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            if !crate::conn::region::deregistered(mr) {
                std::mem::forget(std::mem::take(&mut self.vec));
            }
        }
    }
}

/// What a rendezvous send keeps alive until its DONE (its window or registration, and its
/// buffer), or a lent send until its last completion (its buffer alone). Fields drop in order:
/// the window (deallocating it unbinds it) and the registration go before the allocation they
/// cover.
pub(crate) struct RdvSend {
    pub(super) msg: u64,
    pub(super) window: Option<Mw>,
    pub(super) mr: Option<Mr>,
    /// The buffer (`None` for a caller's slice, whose call waits for the release).
    pub(super) hold: Option<InFlight>,
}

impl Drop for RdvSend {
    fn drop(&mut self) {
        // In field order, but checked (F11): a registration the device keeps leaks the buffer
        // it covers instead of handing it back for reuse.
        drop(self.window.take());
        if let Some(mr) = self.mr.take() {
            if !crate::conn::region::deregistered(mr) {
                std::mem::forget(self.hold.take());
            }
        }
    }
}

impl RdvSend {
    /// The window and the registration it is bound to: the message's own (a caller's slice,
    /// registered for binding), else the buffer's.
    pub(super) fn window_parts(&self) -> Option<(&Mw, &Mr)> {
        let mr = match (&self.mr, &self.hold) {
            (Some(mr), _) => mr,
            (None, Some(hold)) => hold.mr(),
            (None, None) => return None,
        };
        Some((self.window.as_ref()?, mr))
    }
}

/// Where message `msg`'s entry is (the newest are at the back).
pub(super) fn rdv_index(rdv: &VecDeque<RdvSend>, msg: u64) -> Option<usize> {
    rdv.iter().rposition(|r| r.msg == msg)
}

/// Message `msg`'s entry.
pub(super) fn rdv_entry(rdv: &VecDeque<RdvSend>, msg: u64) -> Option<&RdvSend> {
    rdv.get(rdv_index(rdv, msg)?)
}

impl Driver {
    /// Starts the rendezvous READ of the head message (`len` bytes, as the core's
    /// `Recv::NeedsRead` said) into a vector of the driver's own, registered for local write
    /// only: a read call that needs the message then waits as for any message, and when the
    /// READ lands the step moves the vector into the core as the head message
    /// ([`rsrdma_proto::Conn::take_read_into_core`]; `recv_msg` then takes it without a
    /// copy). No call holds the destination, so a call that gives up (a timeout, a dropped
    /// future) strands nothing: the message stays the next one to read. `Ok(false)`: not now
    /// (another READ in flight, no SQ room, the head changed); the caller steps again.
    ///
    /// # Errors
    /// The registration's error; the core's (a failed connection).
    pub(crate) fn start_owned_read(&mut self, len: usize) -> Result<bool> {
        if self.owned_read.is_some() || self.core.pending_read() != Some(len) {
            return Ok(false);
        }
        let mut vec = vec![0u8; len];
        // SAFETY: the vector is kept with its registration in `owned_read` until the READ
        // landed (or, after a failure, until the teardown's flush, or leaked with the rest);
        // the registration always drops first; nothing reads or writes the vector meanwhile.
        let mr = unsafe {
            Mr::register(
                self.qp.pd(),
                vec.as_mut_ptr(),
                len,
                AccessFlags::LOCAL_WRITE,
            )
        }?;
        match self.core.start_read(mr.addr(), mr.lkey(), len) {
            Ok(Step::Done(())) => {
                self.owned_read = Some(OwnedRead { mr: Some(mr), vec });
                Ok(true)
            }
            Ok(Step::Blocked) => Ok(false),
            Err(e) => Err(from_core(e)),
        }
    }

    /// A READ into the driver's own vector that cannot land: the peer left after its FIN
    /// (its failed completions are its normal teardown then, not the connection's failure).
    pub(crate) fn owned_read_stranded(&self) -> bool {
        self.peer_gone && self.owned_read.is_some() && !self.core.read_landed()
    }

    /// The head message cannot be read any more: the peer left after its FIN with its READ
    /// in flight (into the driver's vector, or into a buffer, which is free again).
    pub(crate) fn read_stranded(&self) -> bool {
        self.owned_read_stranded() || self.read_hold.stranded()
    }

    /// The call reading into the held buffer gave up: when the READ lands, the message is
    /// copied into the core (as the head, for the next read) and the buffer freed.
    pub(crate) fn orphan_buffer_read(&mut self, len: usize) {
        self.read_hold.orphan(len);
        let (core, peer_gone, sends_done) = (&mut self.core, self.peer_gone, self.sends_done);
        self.read_hold
            .settle(core, peer_gone, sends_done, |h, len| h.landed(len).to_vec());
    }

    /// A READ into the driver's own vector landed: the message becomes the core's head.
    pub(super) fn land_owned_read(&mut self) -> bool {
        if !self.core.read_landed() {
            return false;
        }
        let vec = if let Some(read) = self.owned_read.take() {
            let Some(vec) = read.into_landed() else {
                // The device keeps the registration: the message cannot be handed over.
                self.core.handle_fatal(Fatal::QpError);
                return true;
            };
            vec
        } else {
            return false;
        };
        if !self.core.take_read_into_core(vec) {
            tracing::error!("rsrdma-net conn: a landed read did not match its message");
            self.core.handle_fatal(Fatal::QpError);
        }
        true
    }

    /// Keeps buffer-send `msg`'s buffer (and, for rendezvous, its window or per-message
    /// registration) until the core releases it: a rendezvous message at its DONE (and its
    /// window's invalidation), a lent one when the completion covering its last fragment is
    /// reaped (its SENDs read the buffer in place).
    pub(crate) fn hold_send(
        &mut self,
        msg: u64,
        window: Option<Mw>,
        mr: Option<Mr>,
        hold: Option<InFlight>,
    ) {
        self.rdv_sends.push_back(RdvSend {
            msg,
            window,
            mr,
            hold,
        });
    }

    /// An unbound window for a rendezvous send (a free one, else a new one); `Ok(None)` where
    /// the device has no type-2 windows (the send registers its message instead).
    ///
    /// # Errors
    /// The allocation's error.
    pub(super) fn take_window(&mut self) -> rsrdma::Result<Option<Mw>> {
        let Some(free) = self.free_windows.as_mut() else {
            return Ok(None);
        };
        match free.pop() {
            Some(w) => Ok(Some(w)),
            None => Mw::alloc_type2(self.qp.pd()).map(Some),
        }
    }

    /// Queues a rendezvous message of `len` bytes at `addr` (memory registered for window
    /// binding) through one of the driver's windows, which the core binds right before the
    /// RTS. `Ok(Some((msg, window)))`: queued, and the window is the message's (the caller
    /// keeps it with [`Driver::hold_send`]); `Ok(None)`: the core would block, and the window
    /// went back to the free ones.
    ///
    /// # Errors
    /// The window's allocation; the core's refusal; [`NetError::InvalidArgument`] on a device
    /// without windows (callers register for binding only where it has them).
    pub(crate) fn queue_through_window(
        &mut self,
        op: &'static str,
        len: usize,
        addr: u64,
    ) -> Result<Option<(u64, Mw)>> {
        let Some(w) = self.take_window()? else {
            return Err(NetError::InvalidArgument(format!(
                "{op}: rendezvous through a window on a device without windows"
            )));
        };
        match self.core.send_rendezvous_window(len, addr, w.next_rkey()) {
            Ok(Step::Done(msg)) => Ok(Some((msg, w))),
            Ok(Step::Blocked) => {
                self.put_window(w);
                Ok(None)
            }
            Err(e) => {
                self.put_window(w);
                Err(from_core(e))
            }
        }
    }

    /// Gives back a window taken by [`Driver::take_window`] and never bound (or invalidated).
    pub(crate) fn put_window(&mut self, w: Mw) {
        if let Some(free) = self.free_windows.as_mut() {
            free.push(w);
        }
    }

    /// Whether rendezvous sends go through windows (the device has type-2 windows).
    pub(crate) fn has_windows(&self) -> bool {
        self.free_windows.is_some()
    }

    /// Drops what [`Driver::hold_send`] keeps for `msg` now (nothing if it is gone already):
    /// for a caller's slice, whose memory must be unregistered before the call returns. Its
    /// window goes back to the free ones when `unbound` (released by the core, or withdrawn
    /// before its bind), else it is deallocated (which unbinds it; the caller moved the QP to
    /// ERROR first).
    pub(crate) fn drop_send(&mut self, msg: u64, unbound: bool) {
        let Some(mut r) = rdv_index(&self.rdv_sends, msg).and_then(|at| self.rdv_sends.remove(at))
        else {
            return;
        };
        if let (true, Some(w)) = (unbound, r.window.take()) {
            self.put_window(w);
        }
    }

    /// Keeps the buffer a READ lands in until [`Driver::end_read`].
    pub(crate) fn hold_read(&mut self, hold: InFlight) {
        self.read_hold.hold(hold);
    }

    /// The READ's message was taken: its buffer is free.
    pub(crate) fn end_read(&mut self) {
        self.read_hold.end();
    }

    /// Whether memory lent to the NIC or offered to the peer waits for what releases it (a
    /// rendezvous send's DONE, a lent send's last completion, a READ into a buffer): only a
    /// step on the completions that bring it frees that memory, even when no call waits.
    #[cfg(feature = "tokio")]
    pub(crate) fn memory_in_flight(&self) -> bool {
        !self.rdv_sends.is_empty() || self.read_hold.is_held()
    }

    /// Releases rendezvous sends whose DONE arrived and lent sends whose last completion was
    /// reaped (never after a failure: those wait for the flush at teardown), and rendezvous
    /// sends a peer that is gone read whole ([`Driver::release_offer_of_gone_peer`]).
    pub(super) fn release_rendezvous(&mut self) {
        if self.core.error().is_some() {
            return;
        }
        let mut i = 0;
        while let Some(r) = self.rdv_sends.get(i) {
            let exposed = r.mr.is_some() || r.window.is_some();
            let released = if exposed {
                self.core.rendezvous_released(r.msg)
            } else {
                self.core.lent_released(r.msg)
            };
            if !released {
                // Read whole by a peer that is gone: released here (its buffer is free, and
                // a wait for it says Ok). Unread, it stays, for the teardown's flush.
                let msg = r.msg;
                let gone_read = exposed && self.peer_gone && self.core.rendezvous_read(msg);
                if gone_read {
                    self.release_offer_of_gone_peer(msg);
                } else {
                    i += 1;
                }
                continue;
            }
            let Some(mut r) = self.rdv_sends.remove(i) else {
                break;
            };
            // Invalidated (the core released it after that completion): reusable.
            if let Some(w) = r.window.take() {
                self.put_window(w);
            }
        }
    }

    /// A rendezvous send (`msg`) not released when the peer left after its FIN
    /// ([`Driver::peer_gone`]): nothing more comes through the ended transport (neither the
    /// peer's DONE nor the completion of the window's invalidation). The QP goes to ERROR, so
    /// it serves no READ of that memory (what the peer sent before its FIN is still read, to
    /// EOF: a gone peer's flushes are not the core's), then the message's window and
    /// registration go, as [`Driver::drop_send`] does. Returns whether the peer had read it
    /// whole (its DONE came): delivered, though never released by the core.
    pub(crate) fn release_offer_of_gone_peer(&mut self, msg: u64) -> bool {
        if let Err(e) = self.qp.to_error() {
            tracing::debug!(error = %e, "moving the QP to ERROR failed");
        }
        self.drop_send(msg, false);
        self.core.rendezvous_read(msg)
    }

    /// Before the driver leaves the connection for its teardown (close): a caller's slice
    /// exposed through a window is registered here while its call waits for the DONE, and
    /// that call returns as soon as the driver is gone, before the teardown's flush. So the
    /// QP goes to ERROR first, under the lock: the NIC then serves no READ of that memory;
    /// then the slice's window is deallocated (which unbinds it) and its registration dropped,
    /// still under the lock (F9): once its call returns, nothing of the driver's refers to the
    /// caller's memory, however long the teardown's flush takes.
    pub(crate) fn cut_off_lent_slices(&mut self) {
        if self.rdv_sends.iter().any(|r| r.hold.is_none()) {
            self.abort_transfer();
            // Fields drop in order: the window before the registration it is bound to.
            self.rdv_sends.retain(|r| r.hold.is_some());
        }
    }

    /// Moves the QP to ERROR and fails the core: for a caller that must give up memory the
    /// NIC may still touch (it deregisters it next, which the NIC then can no longer reach).
    pub(crate) fn abort_transfer(&mut self) {
        if let Err(e) = self.qp.to_error() {
            tracing::debug!(error = %e, "moving the QP to ERROR failed");
        }
        self.broken = true;
        if self.core.error().is_none() {
            self.core.handle_fatal(Fatal::QpError);
        }
    }
}
