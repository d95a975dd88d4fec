//! Posting what the core queued: a small round trip's requests directly, the rest as one
//! batch of receives and one of sends (see the driver's module docs for the order rules).

use super::*;

/// How to post one send-queue request the core queued.
#[derive(Clone, Copy, Default)]
pub(super) struct SendMeta {
    wr_id: u64,
    signaled: bool,
    inline: bool,
    /// Scatter-gather entries used (2 for a lent frame: header, then payload).
    sges: usize,
    op: SendOp,
}

/// What a staged send-queue request is.
#[derive(Clone, Copy, Default)]
pub(super) enum SendOp {
    /// A SEND of the SGEs.
    #[default]
    Send,
    /// An RDMA READ from this remote address and key (rendezvous).
    Read { remote_addr: u64, rkey: u32 },
    /// A bind of message `msg`'s window (in `rdv_sends`) to `len` bytes at `addr`, key `rkey`.
    Bind {
        msg: u64,
        addr: u64,
        len: u32,
        rkey: u32,
    },
    /// A local invalidation of window key `rkey`.
    Invalidate { rkey: u32 },
}

/// What one posting round gathers before its two post calls. Kept in the driver and
/// overwritten in place: set up on the stack, its ~3 KiB were zeroed at every posting step
/// (figures: the guide's performance chapter).
pub(super) struct Staging {
    recvs: [Sge; POST_BATCH],
    recv_ids: [u64; POST_BATCH],
    sends: [[Sge; 2]; POST_BATCH],
    send_meta: [SendMeta; POST_BATCH],
}

impl Staging {
    pub(super) fn new() -> Staging {
        Staging {
            recvs: [Sge::default(); POST_BATCH],
            recv_ids: [0; POST_BATCH],
            sends: [[Sge::default(); 2]; POST_BATCH],
            send_meta: [SendMeta::default(); POST_BATCH],
        }
    }
}

/// How many requests of a list of `n` a post call's result says were posted.
pub(super) fn posted(r: &rsrdma::Result<()>, n: usize) -> usize {
    match r {
        Ok(()) => n,
        Err(rsrdma::Error::Post { index, .. }) => (*index).min(n),
        Err(_) => 0,
    }
}

impl Driver {
    /// Posts whatever the core queued; `true` when there was anything. What a small round
    /// trip queues goes directly ([`Driver::post_from`]), the rest as batches
    /// ([`Driver::post_queued`]).
    pub(crate) fn post_work(&mut self) -> bool {
        // Most of a busy caller's polling queues nothing: then this is one empty pop, no call.
        let Some(first) = self.core.poll_work() else {
            return false;
        };
        self.post_from(first);
        true
    }

    /// Posts `first` and everything the core queued after it. What a small message's round
    /// trip queues (a receive's repost, an inline send, or the two) is built on the stack and
    /// posted directly, without the batch's staging and bookkeeping; anything else goes as
    /// batches.
    pub(super) fn post_from(&mut self, first: Work) {
        let mut work = first;
        loop {
            let direct = !self.broken && !self.peer_gone && !self.core.memory().pooled();
            let posted = direct
                && match (work, self.core.work_queued()) {
                    (Work::PostRecv { slot }, 0) => self.post_recv_alone(slot),
                    (Work::PostSend { .. }, 0) => self.post_send_alone(work),
                    (Work::PostRecv { slot }, 1) => self.post_send_then_recv(slot),
                    _ => false,
                };
            if !posted {
                self.post_queued(work);
                return;
            }
            // Taking receives may have made a CREDIT frame due: it comes now, after them.
            match self.core.poll_work() {
                Some(next) => work = next,
                None => return,
            }
        }
    }

    /// Sends `msg` as one inline frame posted at once, then posts whatever the core had
    /// queued (a receive loop's reposts, off the round trip's path after the doorbell):
    /// the lean way of a small send ([`rsrdma_proto::Conn::send_inline_now`]). `false`: it
    /// cannot go that way, nothing done.
    pub(crate) fn send_inline_now(&mut self, msg: &[u8]) -> bool {
        if self.broken || self.peer_gone {
            return false;
        }
        let Some(work) = self.core.send_inline_now(msg) else {
            return false;
        };
        // Not an inline send, or no staging for it: a core bug; the connection fails.
        if !self.post_send_alone(work) {
            self.fail_posting();
        }
        self.post_work();
        true
    }

    /// Posts the repost of own receive slot `slot` alone; `false`: not done (no SGE for the
    /// slot: the batch path fails the connection).
    pub(super) fn post_recv_alone(&mut self, slot: u16) -> bool {
        let Some(sge) = self.core.memory().recv_sge(slot) else {
            return false;
        };
        let list = [sge];
        let wr = RecvWr::new(recv_wr_id(slot), &list);
        // SAFETY: as in `post_recvs`.
        let r = unsafe { self.qp.post_recv(&wr) };
        self.recvs_posted += posted(&r, 1) as u64;
        self.check_post(&r);
        true
    }

    /// Posts `work` alone when it is an inline send; `false`: not one, nothing done.
    pub(super) fn post_send_alone(&mut self, work: Work) -> bool {
        let Work::PostSend {
            wr_id,
            slot: None,
            len: _,
            signaled,
            lent: None,
        } = work
        else {
            return false;
        };
        let Some(frame) = self.core.inline_frame(wr_id) else {
            return false;
        };
        let list = [Sge::inline(frame)];
        let wr = SendWr::send(wr_id.0, &list).signaled(signaled).inline();
        // SAFETY: an inline send's bytes are copied during the call (see `post_sends`).
        let r = unsafe { self.qp.post_send(&wr) };
        if r.is_ok() {
            self.sends_posted = self.sends_posted.max(wr_id.0 + 1);
        }
        self.check_post(&r);
        true
    }

    /// The core queued an inline send after the repost of own receive slot `slot` (just
    /// taken): a receive loop's repost, left for its next send (`Conn::reposts_may_wait`).
    /// The send was queued before the receive was taken, so it does not announce that
    /// receive: it goes first, and the repost after its doorbell, off the round trip's path.
    /// `false`: not that pair, nothing done.
    pub(super) fn post_send_then_recv(&mut self, slot: u16) -> bool {
        let Some(
            send @ Work::PostSend {
                slot: None,
                lent: None,
                ..
            },
        ) = self.core.peek_work()
        else {
            return false;
        };
        let _queued_before = self.core.poll_work();
        // Either failing is a core bug (no inline frame for an outstanding send, no SGE for a
        // slot the core holds): the connection fails, as in the batch.
        if !self.post_send_alone(send) || (!self.broken && !self.post_recv_alone(slot)) {
            self.fail_posting();
        }
        true
    }

    /// Whether this step may leave the core's queue for a later one: it holds only reposts of
    /// own receive slots whose credit the peer does not need soon
    /// ([`rsrdma_proto::Conn::reposts_may_wait`]); a shared pool's slots go back at once.
    pub(crate) fn reposts_may_wait(&self) -> bool {
        self.core.work_queued() > 0
            && !self.broken
            && !self.peer_gone
            && !self.core.memory().pooled()
            && self.core.reposts_may_wait()
    }

    /// After a post: a failure breaks the connection (nothing more is posted).
    pub(super) fn check_post(&mut self, r: &rsrdma::Result<()>) {
        if r.is_err() {
            self.fail_posting();
        }
    }

    /// A post failed (or the core named something unpostable): the connection breaks once.
    pub(super) fn fail_posting(&mut self) {
        if !self.broken {
            self.broken = true;
            if self.core.error().is_none() {
                self.core.handle_fatal(Fatal::QpError);
            }
        }
    }

    /// Posts `first` and everything the core queued after it as batches: its receives as one
    /// post and its sends as another (per [`POST_BATCH`] works), so a round costs one
    /// doorbell however many frames it built. Receives go first: a CREDIT frame built once
    /// they were taken (`Conn::poll_work`) may be in the same round and announce them.
    pub(super) fn post_queued(&mut self, first: Work) {
        let mut next = Some(first);
        while next.is_some() {
            let st = &mut self.stage;
            let (mut nr, mut ns) = (0, 0);
            let mut bad = false;
            while nr < POST_BATCH && ns < POST_BATCH {
                let Some(work) = next.take().or_else(|| self.core.poll_work()) else {
                    break;
                };
                if self.broken || self.peer_gone || bad {
                    continue;
                }
                match work {
                    // A pooled slot goes back to the shared pool; an own slot is posted here.
                    Work::PostRecv { slot } => match self.core.memory_mut().release_recv(slot) {
                        Some(Repost::Own(sge)) => {
                            st.recvs[nr] = sge;
                            st.recv_ids[nr] = recv_wr_id(slot);
                            nr += 1;
                        }
                        Some(Repost::Pooled) => {}
                        None => bad = true,
                    },
                    Work::PostSend {
                        wr_id,
                        slot,
                        len,
                        signaled,
                        lent,
                    } => {
                        // An inline frame's bytes stay in the core's staging entry, untouched
                        // until the post below copies them (draining the queue does not write
                        // them). A lent frame: the header from the slot, the payload from the
                        // lent buffer (never inline).
                        let head = len.checked_sub(lent.map_or(0, |l| l.len));
                        let first = match (slot, head) {
                            (Some(s), Some(head)) => self.core.memory().send_sge(s, head),
                            (None, Some(_)) if lent.is_none() => {
                                self.core.inline_frame(wr_id).map(Sge::inline)
                            }
                            _ => None,
                        };
                        match first {
                            Some(sge) => {
                                st.sends[ns] = [sge, sge];
                                let mut m = SendMeta {
                                    wr_id: wr_id.0,
                                    signaled,
                                    inline: slot.is_none(),
                                    sges: 1,
                                    op: SendOp::Send,
                                };
                                if let Some(l) = lent {
                                    st.sends[ns][1] = Sge::new(l.addr, l.len, l.lkey);
                                    m.sges = 2;
                                }
                                st.send_meta[ns] = m;
                                ns += 1;
                            }
                            None => bad = true,
                        }
                    }
                    Work::PostRead {
                        wr_id,
                        local_addr,
                        lkey,
                        remote_addr,
                        rkey,
                        len,
                    } => {
                        let sge = Sge::new(local_addr, len, lkey);
                        self.read_hold.posted(wr_id.0);
                        st.sends[ns] = [sge, sge];
                        st.send_meta[ns] = SendMeta {
                            wr_id: wr_id.0,
                            signaled: true,
                            inline: false,
                            sges: 1,
                            op: SendOp::Read { remote_addr, rkey },
                        };
                        ns += 1;
                    }
                    Work::BindWindow {
                        wr_id,
                        msg,
                        addr,
                        len,
                        rkey,
                        signaled,
                    } => {
                        // The window lives in the message's entry until its release.
                        let bound = rdv_entry(&self.rdv_sends, msg).and_then(|r| r.window_parts());
                        if bound.is_none() {
                            bad = true;
                            continue;
                        }
                        st.send_meta[ns] = SendMeta {
                            wr_id: wr_id.0,
                            signaled,
                            inline: false,
                            sges: 0,
                            op: SendOp::Bind {
                                msg,
                                addr,
                                len,
                                rkey,
                            },
                        };
                        ns += 1;
                    }
                    Work::InvalidateWindow { wr_id, rkey, .. } => {
                        st.send_meta[ns] = SendMeta {
                            wr_id: wr_id.0,
                            signaled: true,
                            inline: false,
                            sges: 0,
                            op: SendOp::Invalidate { rkey },
                        };
                        ns += 1;
                    }
                }
            }
            if !(!bad && self.post_recvs(nr) && self.post_sends(ns)) {
                self.fail_posting();
            }
            next = self.core.poll_work();
        }
    }

    /// Posts the first `n` staged receives (one SGE each) in one call; false on a failure
    /// (what was posted before it is counted).
    pub(super) fn post_recvs(&mut self, n: usize) -> bool {
        let (sges, ids) = (&self.stage.recvs, &self.stage.recv_ids);
        if n == 0 {
            return true;
        }
        let r = if n == 1 {
            let wr = RecvWr::new(ids[0], &sges[..1]);
            // SAFETY: the slot lies in our registered receive region, which outlives every
            // posted request (teardown reaps the flush before releasing it), and the core does
            // not read the slot until its completion.
            unsafe { self.qp.post_recv(&wr) }
        } else {
            let mut wrs = [const { MaybeUninit::<RecvWr<'_>>::uninit() }; POST_BATCH];
            for (i, w) in wrs.iter_mut().take(n).enumerate() {
                w.write(RecvWr::new(ids[i], &sges[i..=i]));
            }
            // SAFETY: the first `n` elements were written just above; `MaybeUninit<T>` has
            // `T`'s layout.
            let wrs = unsafe { std::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast(), n) };
            // SAFETY: as the single post above, for every slot of the list.
            unsafe { self.qp.post_recv_batch(wrs) }
        };
        self.recvs_posted += posted(&r, n) as u64;
        r.is_ok()
    }

    /// Posts the first `n` staged sends (and READs, window binds and invalidations) as their
    /// metadata says, in one call; false on a failure (what was posted before it is counted).
    pub(super) fn post_sends(&mut self, n: usize) -> bool {
        let (sges, meta) = (&self.stage.sends, &self.stage.send_meta);
        let rdv = &self.rdv_sends;
        if n == 0 {
            return true;
        }
        let wr = |i: usize| {
            let m = meta[i];
            let list = &sges[i][..m.sges];
            Some(match m.op {
                SendOp::Read { remote_addr, rkey } => {
                    SendWr::rdma_read(m.wr_id, list, remote_addr, rkey).signaled(true)
                }
                SendOp::Send => {
                    let wr = SendWr::send(m.wr_id, list).signaled(m.signaled);
                    if m.inline {
                        wr.inline()
                    } else {
                        wr
                    }
                }
                SendOp::Bind {
                    msg,
                    addr,
                    len,
                    rkey,
                } => {
                    let (mw, mr) = rdv_entry(rdv, msg)?.window_parts()?;
                    let read_only = AccessFlags::REMOTE_READ;
                    // Read-only, inside a held buffer's MW_BIND region: a refusal is a bug,
                    // and fails the post like a missing window.
                    SendWr::bind_mw(m.wr_id, mw, rkey, mr, addr, u64::from(len), read_only)
                        .ok()?
                        .signaled(m.signaled)
                }
                SendOp::Invalidate { rkey } => SendWr::local_inv(m.wr_id, rkey).signaled(true),
            })
        };
        let r = if n == 1 {
            let Some(one) = wr(0) else {
                return false;
            };
            // SAFETY: a slot send names our registered send region, which outlives the
            // request (see `post_recvs`), and the core does not rewrite a slot in flight; an
            // inline send's bytes are copied during the call. A lent payload is a range of a
            // `Buffer` (registered, on this QP's domain) whose allocation `hold_send` keeps
            // until the core says the completion covering this WR was reaped, or until
            // teardown's flush; the buffer is in flight meanwhile, so nothing writes it. A
            // READ's destination is registered (local write) by the caller of `start_read`,
            // which keeps it registered and alive until the core hands the message over, or
            // deregisters it only after moving the QP to ERROR (`abort_transfer`); a `Buffer`
            // destination is held in `read_hold` until then or until teardown's flush. A window
            // is bound over a range of a held buffer (remote read only, through this QP alone)
            // and invalidated before the core releases the buffer; after a failure, the flush
            // ends its use and the window is deallocated before the buffer goes.
            unsafe { self.qp.post_send(&one) }
        } else {
            let mut wrs = [const { MaybeUninit::<SendWr<'_>>::uninit() }; POST_BATCH];
            for (i, w) in wrs.iter_mut().take(n).enumerate() {
                // The staging checked every bind's window: a miss is a bug, and nothing of
                // this batch is posted.
                let Some(one) = wr(i) else {
                    return false;
                };
                w.write(one);
            }
            // SAFETY: the first `n` elements were written just above; `MaybeUninit<T>` has
            // `T`'s layout.
            let wrs = unsafe { std::slice::from_raw_parts_mut(wrs.as_mut_ptr().cast(), n) };
            // SAFETY: as the single post above, for every request of the list.
            unsafe { self.qp.post_send_batch(wrs) }
        };
        let done = posted(&r, n);
        if let Some(last) = meta[..done].last() {
            self.sends_posted = self.sends_posted.max(last.wr_id + 1);
        }
        // A posted bind gave its window a new key: the next bind names it as the present one.
        for m in &meta[..done] {
            if let SendOp::Bind { msg, rkey, .. } = m.op {
                let entry =
                    rdv_index(&self.rdv_sends, msg).and_then(|at| self.rdv_sends.get_mut(at));
                if let Some(w) = entry.and_then(|r| r.window.as_mut()) {
                    w.set_rkey(rkey);
                }
            }
        }
        r.is_ok()
    }
}
