//! [`Driven`]: a threadless [`Conn`] driven from poll functions, and its keeper task.
//!
//! Every async operation is one loop in [`Driven::poll_op`]: run one driver step with the
//! operation in it; if it would block, register the task in the [`WakerSet`], arm the CQ
//! (once per event) and step again, so a completion that came before the arm is not slept
//! through; then look at the completion channel and the liveness fd, polled with the set's
//! fan-out waker. A readable channel is emptied and the loop steps again; otherwise the task
//! sleeps until the next event wakes every waiter.
//!
//! The keeper task runs the steps that are due by time alone (keepalive PINGs, the
//! dead-peer timeout, the grace after the transport ended) while nobody awaits anything. It
//! sleeps on a timerfd (see `timer.rs`: not tokio's timer, whose clock may be paused) until
//! the driver's next deadline or a close's linger end; a step that brings the deadline
//! forward wakes it. It also waits on the CQ like an operation does (in busy mode only while
//! frames wait to go out): what the peer sends while nobody awaits anything (a PING, a
//! WITHDRAW) is answered at once, as the blocking face's progress thread does, and frames
//! left waiting (the rest of a message `send_msg` accepted, a control frame) go out on the
//! completions that free their credit, though the caller may await nothing afterwards.
//! It holds only a weak reference and ends with the connection.

use super::op_future::OpFuture;
use super::timer::Timer;
use super::wakers::WakerSet;
use super::watch::Watch;
use crate::conn::{CloseStart, CloseWait, Step};
use crate::error::{NetError, Result};
use crate::progress::PollMode;
use crate::Conn;
use rsrdma_proto::ProtoError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// In busy mode, how often the keeper looks at the connection while nothing else is due
/// (the blocking face's progress thread's `SPIN_PARK`).
const BUSY_LOOK: Duration = Duration::from_millis(5);

/// What the keeper sleeps until, and how to wake it early.
#[derive(Debug, Default)]
struct KeeperSlot {
    at: Option<Instant>,
    waker: Option<Waker>,
    /// The keeper will look at the frames waiting to go out: its last step saw them and it
    /// waits on the CQ, or it was woken for them and has not stepped since. Cleared before
    /// each of its steps, so an operation that leaves frames waiting after that step either
    /// finds it cleared (and wakes the keeper) or was seen by that step.
    on_sends: bool,
    /// When a close's linger ends: the keeper wakes every waiter then (the close among
    /// them), on the monotonic clock like every other deadline.
    alarm: Option<Instant>,
}

/// A connection and what its poll functions wait on. Field order is drop order: the
/// watches deregister before the connection closes their descriptors.
#[derive(Debug)]
pub(crate) struct Driven {
    /// `None` only inside the drop, which deregisters it before the connection goes.
    cq: Option<Watch>,
    live: Mutex<Option<Watch>>,
    /// The CQ is armed and no event was taken since.
    armed: AtomicBool,
    /// The liveness fd was readable: the next step reads it.
    live_ready: AtomicBool,
    /// A close of ours began and has not torn down yet (see [`Driven::close`]).
    close_pending: AtomicBool,
    /// Its listener went before anyone accepted it: the drop aborts it (no FIN, no linger;
    /// see [`Conn::abort_unaccepted`]) instead of closing it cleanly.
    refused: AtomicBool,
    waiters: Arc<WakerSet>,
    fanout: Waker,
    keeper: Mutex<KeeperSlot>,
    busy: bool,
    /// `None` only inside the drop, which hands it to the blocking pool (see there).
    conn: Option<Conn>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Driven {
    /// Registers the connection's fds with the current runtime and starts its keeper.
    ///
    /// On failure the connection is dropped (closed) on the blocking pool, not here: its
    /// close may wait, and this runs on a runtime thread.
    ///
    /// # Errors
    /// [`NetError::Io`] when the fds cannot be registered (no tokio runtime with IO), or the
    /// keeper's timer cannot be made.
    pub(crate) fn start(conn: Conn, mode: PollMode) -> Result<Arc<Driven>> {
        let (cq, live, timer) = match Driven::register(&conn) {
            Ok(parts) => parts,
            Err(e) => {
                run_off_runtime(move || drop(conn));
                return Err(e);
            }
        };
        let waiters = Arc::new(WakerSet::default());
        let d = Arc::new(Driven {
            cq: Some(cq),
            live: Mutex::new(live),
            armed: AtomicBool::new(false),
            live_ready: AtomicBool::new(false),
            close_pending: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            fanout: Waker::from(waiters.clone()),
            waiters,
            keeper: Mutex::new(KeeperSlot::default()),
            busy: mode == PollMode::Busy,
            conn: Some(conn),
        });
        tokio::spawn(keep(Arc::downgrade(&d), timer));
        Ok(d)
    }

    /// What [`Driven::start`] can fail at: the watches of the connection's fds and the
    /// keeper's timer.
    fn register(conn: &Conn) -> Result<(Watch, Option<Watch>, Timer)> {
        let reg = |e| NetError::io("register with the tokio reactor", e);
        let cq_fd = conn.cq_channel_fd().ok_or_else(|| {
            NetError::InvalidArgument("the connection's CQ has no completion channel".into())
        })?;
        // SAFETY: the channel belongs to the connection's CQ, which `conn` keeps (in its
        // shared state) until it is dropped, and `Driven` drops this watch before `conn`.
        let cq = unsafe { Watch::new(cq_fd) }.map_err(reg)?;
        let step = conn.step_idle(false)?;
        // SAFETY: the liveness fd belongs to the driver, which closes it only in
        // `Conn::finish_close` or in the connection's drop: `Driven::finish_close` takes this
        // watch out (deregisters it) before the former, and field order drops it before the
        // latter.
        let live = step
            .live_fd
            .map(|fd| unsafe { Watch::new(fd) })
            .transpose()
            .map_err(reg)?;
        let timer = Timer::new().map_err(|e| NetError::io("create the keeper's timerfd", e))?;
        Ok((cq, live, timer))
    }

    /// The connection (present for the whole life of `self`: only the drop takes it).
    pub(crate) fn conn(&self) -> &Conn {
        self.conn
            .as_ref()
            .expect("the connection is taken only by Driven's drop")
    }

    /// An operation gave up (its future was dropped, or it failed): what it handed back (its
    /// side, a partly read message, the rest of a send) may let the other waiting tasks go
    /// on, and frames it left to send go out only when someone steps on the completions that
    /// free their credit. So every waiter and the keeper are woken (the blocking face's
    /// condition variable alone was).
    pub(crate) fn gave_up(&self) {
        self.waiters.wake_all();
        self.kick_keeper();
    }

    /// Runs `op` (one step of the connection) until it gives a value; see the module docs.
    pub(crate) fn poll_op<T>(
        &self,
        cx: &mut Context<'_>,
        mut op: impl FnMut(&Conn, bool) -> Result<Step<T>>,
    ) -> Poll<Result<T>> {
        loop {
            let wakes_before = self.waiters.wakes();
            let live = self.live_ready.swap(false, Ordering::AcqRel);
            let step = match op(self.conn(), live) {
                Ok(s) => s,
                Err(e) => {
                    // A failure or a close concerns every waiter.
                    self.waiters.wake_others(cx.waker());
                    return Poll::Ready(Err(e));
                }
            };
            self.after_step(&step, cx.waker(), false);
            if let Some(v) = step.out {
                return Poll::Ready(Ok(v));
            }
            if self.busy {
                // Busy mode: poll again on the task's next turn (the runtime keeps others running).
                if let Err(e) = self.poll_live(step.live_fd.is_some()) {
                    return Poll::Ready(Err(e));
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.waiters.register(cx.waker());
            // Another task's progress between this step and the registration woke only the
            // tasks already registered: step again rather than sleep through it (this step's
            // own wake-up of the others counts one).
            if self.waiters.wakes() - wakes_before > u64::from(step.changed) {
                continue;
            }
            match self.poll_fds(step.live_fd.is_some()) {
                Ok(true) => continue,
                Ok(false) => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Takes a channel event if there is one, and arms the CQ when it is not armed (the
    /// first wait, or an event was just taken); true when the caller should step again.
    fn poll_fds(&self, live: bool) -> Result<bool> {
        let Some(cq) = self.cq.as_ref() else {
            return Ok(false);
        };
        let ready = cq
            .take_ready(&self.fanout)
            .map_err(|e| NetError::io("poll the completion channel", e))?;
        if ready && self.conn().take_cq_events()? {
            self.armed.store(false, Ordering::Release);
        }
        if !self.armed.swap(true, Ordering::AcqRel) {
            if let Err(e) = self.conn().arm_cq() {
                self.armed.store(false, Ordering::Release);
                return Err(e);
            }
            // A completion that came before the arm raises no event: step once more.
            return Ok(true);
        }
        Ok(ready || self.poll_live(live)?)
    }

    /// Whether the liveness fd was readable (then the next step reads it).
    fn poll_live(&self, live: bool) -> Result<bool> {
        if !live {
            return Ok(false);
        }
        let guard = lock(&self.live);
        let Some(w) = guard.as_ref() else {
            return Ok(false);
        };
        let ready = w
            .take_ready(&self.fanout)
            .map_err(|e| NetError::io("poll the liveness fd", e))?;
        if ready {
            self.live_ready.store(true, Ordering::Release);
        }
        Ok(ready)
    }

    /// Wakes the others after a change, and the keeper when its deadline came forward or
    /// frames wait to go out that it does not know of.
    fn after_step<T>(&self, step: &Step<T>, me: &Waker, keeper: bool) {
        if step.changed {
            self.waiters.wake_others(me);
        }
        if keeper {
            return;
        }
        let mut k = lock(&self.keeper);
        let earlier = matches!(step.deadline, Some(due) if !matches!(k.at, Some(at) if at <= due));
        // Frames left waiting (the rest of a message send_msg accepted) go out only if someone
        // steps on the completions that free their credit: the keeper, since the caller may
        // await nothing more. Without this wake a keeper asleep on a far timer left them
        // until its next keepalive.
        let sends = step.sends_waiting && !k.on_sends;
        if earlier {
            k.at = step.deadline;
        }
        if earlier || sends {
            k.on_sends |= sends;
            if let Some(w) = k.waker.take() {
                w.wake();
            }
        }
    }

    /// The keeper's poll: steps while a deadline has passed, then sleeps until the next.
    fn poll_keep(&self, cx: &mut Context<'_>, timer: &mut Timer) -> Poll<()> {
        loop {
            lock(&self.keeper).on_sends = false;
            let live = self.live_ready.swap(false, Ordering::AcqRel);
            let step = match self.conn().step_idle(live) {
                Ok(s) => s,
                Err(_) => {
                    // Failed or closed: tell every waiter, and stop.
                    self.waiters.wake_all();
                    return Poll::Ready(());
                }
            };
            self.after_step(&step, cx.waker(), true);
            let (due, rang) = {
                let mut k = lock(&self.keeper);
                k.at = step.deadline;
                k.on_sends = step.sends_waiting;
                if !k.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    k.waker = Some(cx.waker().clone());
                }
                let rang = k.alarm.is_some_and(|a| a <= Instant::now());
                if rang {
                    k.alarm = None;
                }
                let due = match (step.deadline, k.alarm) {
                    (Some(d), Some(a)) => Some(d.min(a)),
                    (d, a) => d.or(a),
                };
                (due, rang)
            };
            if rang {
                // A close's linger ended: it looks at the clock when woken.
                self.waiters.wake_all();
            }
            if step.sends_waiting || !self.busy {
                // Completions free the credit and room waiting frames need, and bring what the
                // peer sends while nobody awaits anything (a PING to answer, a WITHDRAW): step
                // on them as an operation would (as the blocking face's progress thread does),
                // but always on the task's next turn, so a stream of completions cannot keep
                // this task from yielding to the others on its thread (busy mode: only for
                // waiting frames, always). A reactor error leaves the timer below to run the
                // keeper; the operations that poll the same fd report it.
                self.waiters.register(cx.waker());
                if self.busy || matches!(self.poll_fds(step.live_fd.is_some()), Ok(true)) {
                    cx.waker().wake_by_ref();
                }
            }
            // Busy mode never arms the CQ (an event per completion would have this task fight
            // the spinning operations for the lock): while nothing else is due, the keeper
            // looks in every BUSY_LOOK, as the blocking face's progress thread does, so what
            // the peer sends while nobody awaits anything (a PING, a WITHDRAW) is answered.
            let due = if self.busy && !step.sends_waiting {
                let look = Instant::now() + BUSY_LOOK;
                Some(due.map_or(look, |d| d.min(look)))
            } else {
                due
            };
            let armed = timer.set(due).and_then(|()| match due {
                Some(_) => timer.poll_fired(cx.waker()),
                None => Ok(false),
            });
            match armed {
                Ok(true) => continue,
                Ok(false) => return Poll::Pending,
                Err(e) => {
                    // Nothing to fall back on: the keepalives and the dead-peer timeout
                    // then run only when an operation steps. Not expected (the timerfd is
                    // ours, and registered).
                    tracing::warn!(error = %e, "rsrdma-net async conn: the keeper's timer failed");
                    return Poll::Pending;
                }
            }
        }
    }

    /// Marks a connection nobody accepted, whose listener is gone: its drop aborts it.
    pub(crate) fn refuse(&self) {
        self.refused.store(true, Ordering::Release);
    }

    /// Has the keeper step now: a call outside any step (a write half's drop queues its
    /// FIN; a dropped future leaves its message going out, its buffer in flight) may have
    /// left frames waiting for credit or memory waiting for its release, which only the
    /// keeper's steps on the completions see to when no task awaits the connection.
    pub(crate) fn kick_keeper(&self) {
        if let Some(w) = lock(&self.keeper).waker.take() {
            w.wake();
        }
    }

    /// Has the keeper wake every waiter at `at` (a close's linger end), unless an earlier
    /// alarm is set.
    fn alarm(&self, at: Instant) {
        let mut k = lock(&self.keeper);
        if k.alarm.is_some_and(|a| a <= at) {
            return;
        }
        k.alarm = Some(at);
        if let Some(w) = k.waker.take() {
            w.wake();
        }
    }

    /// Closes: FIN after everything queued, up to the linger time for its delivery (driven
    /// from this task), then the teardown. Cancel-safe: a close dropped half-way is finished
    /// by the next `close` or by the drop of the connection.
    pub(crate) async fn close(self: &Arc<Self>) -> Result<()> {
        let failed = match self.conn().begin_close() {
            // Another task's close is tearing down, or has: its end is this one's.
            CloseStart::Already if !self.close_pending.load(Ordering::Acquire) => {
                return self.close_end().await
            }
            CloseStart::Already | CloseStart::Started => None,
            CloseStart::Failed(e) => Some(e),
        };
        self.close_pending.store(true, Ordering::Release);
        self.waiters.wake_all();
        let delivered = match failed {
            Some(_) => Ok(()),
            None => {
                // The same wait as the blocking close's, bounded on the monotonic clock (the
                // keeper's alarm wakes it), not tokio's: a paused runtime clock would end
                // the linger as soon as the runtime idles.
                let linger = self.conn().linger().max(Duration::from_millis(1));
                let until = crate::deadline::deadline_after(linger);
                let mut wait = OpFuture::new(self, CloseWait);
                std::future::poll_fn(|cx| match Pin::new(&mut wait).poll(cx) {
                    Poll::Pending if Instant::now() >= until => {
                        Poll::Ready(Err(NetError::Timeout {
                            op: "close",
                            millis: crate::deadline::whole_millis(linger),
                        }))
                    }
                    Poll::Pending => {
                        // Again at every poll: an earlier alarm (another close's) that rang
                        // replaced this one.
                        self.alarm(until);
                        Poll::Pending
                    }
                    p => p,
                })
                .await
            }
        };
        // The teardown reaps the QP's flush (bounded, but a wait): on the blocking pool, so
        // that no runtime thread blocks (F12). Another close that ran at the same time may
        // have torn down first.
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.finish_close(failed, delivered)).await {
            Ok(Some(r)) => r,
            Ok(None) => self.close_end().await,
            Err(e) => Err(NetError::io("close on the blocking pool", e.into())),
        }
    }

    /// Waits for the end of a close that another task tears down (its teardown wakes every
    /// waiter when done) and says what it said: returning earlier would let the caller drop
    /// what the NIC may still use, or end the runtime under the teardown.
    async fn close_end(&self) -> Result<()> {
        std::future::poll_fn(|cx| {
            self.waiters.register(cx.waker());
            match self.conn().close_end() {
                Some(r) => Poll::Ready(r),
                None => Poll::Pending,
            }
        })
        .await
    }

    /// Tears down once (deregistering the liveness fd first); `None` if another did.
    fn finish_close(
        &self,
        failed: Option<ProtoError>,
        delivered: Result<()>,
    ) -> Option<Result<()>> {
        if !self.close_pending.swap(false, Ordering::AcqRel) {
            return None;
        }
        drop(lock(&self.live).take());
        let r = self.conn().finish_close(failed, delivered);
        self.waiters.wake_all();
        Some(r)
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        // Let the keeper see that the connection is gone.
        if let Some(w) = lock(&self.keeper).waker.take() {
            w.wake();
        }
        // The watches deregister before the connection closes their descriptors.
        drop(lock(&self.live).take());
        drop(self.cq.take());
        let pending = self.close_pending.swap(false, Ordering::AcqRel);
        let refused = self.refused.load(Ordering::Acquire);
        let Some(conn) = self.conn.take() else {
            return;
        };
        // What is left blocks: a close cancelled half-way is finished (its teardown reaps the
        // flush), and a connection never closed closes in its own drop (FIN, linger, teardown,
        // polling the CQ itself). On the blocking pool, never on a runtime thread (F12): with
        // both ends on one current-thread runtime, a linger there would keep the peer from
        // ever reading what it waits to deliver. Outside a runtime, here.
        let finish = move || {
            if refused {
                conn.abort_unaccepted();
            } else if pending {
                // A close dropped half-way still delivers what was queued, up to the linger,
                // as a drop without close does (an outside tester's find: it tore down at
                // once, and the peer lost a large message still waiting for credits).
                if let Err(e) = conn.finish_begun_close() {
                    tracing::debug!(error = %e, "rsrdma-net async conn: close finished on drop");
                }
            }
            drop(conn);
        };
        run_off_runtime(finish);
    }
}

/// The keeper task of one connection.
async fn keep(conn: Weak<Driven>, mut timer: Timer) {
    std::future::poll_fn(|cx| match conn.upgrade() {
        Some(d) => d.poll_keep(cx, &mut timer),
        None => Poll::Ready(()),
    })
    .await;
}

/// Runs `f`, which may block (a close's linger, a teardown's flush), where no runtime thread
/// waits for it (F12): on the blocking pool inside a runtime, here outside one.
pub(crate) fn run_off_runtime(f: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(f)),
        Err(_) => f(),
    }
}
