//! Operations as values: a blocking call's state lives in the fields of one value, not in
//! the cells of closures, and one runner ([`Conn::run`]) waits for every operation, as quinn
//! drives quinn-proto's. An operation that owns a side of the connection ([`super::sides`])
//! takes it before its first attempt and frees it in the step that ends it; one that gives up
//! (a timeout, an error, a close) hands back what the core holds through
//! [`Op::abandon`], exactly once, under the lock.
//!
//! # The seam for tests
//! Operations see the connection through [`Link`]: the protocol core, the record of which
//! sides are owned, and whether the peer left. The driver is the link of a real connection;
//! a simulated pair of cores is one on the host (`op_sim` tests), where the operations run
//! under random interleavings, give-ups and deliveries with no device at all.

use super::driver::Driver;
use super::sides::{Owners, Side};
use super::Conn;
use crate::error::{NetError, Result};
use crate::progress::{wait_until_on, Clock, PollMode, Waitable};
use rsrdma_proto::{Conn as Core, SlotMemory};
use std::time::Duration;

/// What an operation reaches of the connection.
pub(crate) trait Link {
    /// The slot memory of the core.
    type Mem: SlotMemory;
    /// The protocol core.
    fn core(&mut self) -> &mut Core<Self::Mem>;
    /// Which sides are owned.
    fn owners(&mut self) -> &mut Owners;
    /// The peer left after its FIN: reads go on, sends fail.
    fn peer_gone(&self) -> bool;
    /// The head message cannot be read any more: the peer left with its READ in flight.
    fn read_stranded(&self) -> bool;
}

impl Link for Driver {
    type Mem = super::slots::Slots;

    fn core(&mut self) -> &mut Core<Self::Mem> {
        Driver::core(self)
    }

    fn owners(&mut self) -> &mut Owners {
        Driver::owners(self)
    }

    fn peer_gone(&self) -> bool {
        Driver::peer_gone(self)
    }

    fn read_stranded(&self) -> bool {
        Driver::read_stranded(self)
    }
}

/// One operation of either face, over link `L` (the driver, or a simulated link in tests).
pub(crate) trait Op<L: Link = Driver> {
    /// What the operation gives when it completes.
    type Out;

    /// The call's name, for errors.
    fn name(&self) -> &'static str;

    /// The side the operation owns for its whole run (`None`: it needs none).
    fn side(&self) -> Option<Side>;

    /// One attempt under the lock, after the step reaped completions and fired timers (and
    /// as the side's owner): `Ok(None)` while it would block.
    fn poll(&mut self, d: &mut L) -> Result<Option<Self::Out>>;

    /// The run ended without a value (`r`: the timeout or the error), under the lock, with
    /// the side still owned: hand back what the core holds of the operation and give the
    /// call's result (which may be a success: a message begun is sent whole from a copy).
    fn abandon(&mut self, d: &mut L, r: Result<Self::Out>) -> Result<Self::Out> {
        let _ = d;
        r
    }
}

/// One attempt of `op` as the owner of its side (taken first if it is free; `owned` says
/// whether this run holds it), freeing the side when the attempt completes the operation.
/// The one step of an operation, for the blocking runner and for the async face alike.
pub(super) fn attempt<L: Link, O: Op<L>>(
    d: &mut L,
    op: &mut O,
    owned: &mut bool,
) -> Result<Option<O::Out>> {
    let side = op.side();
    if let (Some(s), false) = (side, *owned) {
        let flag = d.owners().flag(s);
        if *flag {
            return Ok(None);
        }
        *flag = true;
        *owned = true;
    }
    let v = match op.poll(d) {
        Ok(Some(v)) => v,
        r => return r,
    };
    if let (Some(s), true) = (side, *owned) {
        *d.owners().flag(s) = false;
        *owned = false;
    }
    Ok(Some(v))
}

/// The end of a run that gave up (`r`, an error), under the lock: the operation hands back
/// what the core holds (only if it got its side, or needs none) and the side is freed.
pub(super) fn give_up<L: Link, O: Op<L>>(
    d: &mut L,
    op: &mut O,
    owned: bool,
    r: Result<O::Out>,
) -> Result<O::Out> {
    let side = op.side();
    if side.is_some() && !owned {
        return r;
    }
    let r = op.abandon(d, r);
    if let Some(s) = side {
        *d.owners().flag(s) = false;
    }
    r
}

/// How a blocking call waits, for a real connection and a simulated one alike: one `step`
/// before anything is set up (a call that succeeds at once makes no waiter and reads no
/// clock), then steps under [`wait_until_on`] until one gives a value or `timeout` passes
/// (`Timeout`). `step` gets the waiter once there is one (it carries what the last step saw).
///
/// A value is the caller's whatever the wait answers: the step that gave it may have
/// consumed something to produce it (a message taken, a side freed), so it is never dropped
/// for a timeout that passed at the same moment (F1).
pub(crate) fn block_on<T, W: Waitable>(
    clock: &impl Clock,
    mode: PollMode,
    op: &'static str,
    timeout: Option<Duration>,
    waiter: impl FnOnce() -> W,
    mut step: impl FnMut(Option<&W>) -> Result<Option<T>>,
) -> Result<T> {
    if let Some(v) = step(None)? {
        return Ok(v);
    }
    let deadline = timeout.map(|t| crate::deadline::deadline_from(clock.now(), t));
    let waiter = waiter();
    let mut out = None;
    wait_until_on(clock, mode, &waiter, deadline, || {
        out = step(Some(&waiter))?;
        Ok(out.is_some())
    })?;
    out.ok_or(NetError::Timeout {
        op,
        millis: timeout.map_or(0, crate::deadline::whole_millis),
    })
}

impl Conn {
    /// Runs `op` until it completes, waiting as the poll mode says, up to `timeout`.
    ///
    /// The side is taken before the first attempt, as any other resource is waited for, and
    /// freed in the same locked step as the attempt that completes (whose one batch post and
    /// wake-up then cover both); only an operation that gives up takes the lock again, to
    /// [`Op::abandon`] and free the side. A call that never got its side abandons nothing.
    pub(super) fn run<O: Op>(&self, op: &mut O, timeout: Option<Duration>) -> Result<O::Out> {
        let mut owned = false;
        let r = self.block(op.name(), timeout, |d| attempt(d, op, &mut owned));
        if r.is_ok() {
            return r;
        }
        self.give_up_op(op, owned, r)
    }

    /// A run of `op` ends without a value (an error, a timeout, or its future was dropped):
    /// under the lock, the operation hands back what the core holds and its side is freed.
    pub(crate) fn give_up_op<O: Op>(
        &self,
        op: &mut O,
        owned: bool,
        r: Result<O::Out>,
    ) -> Result<O::Out> {
        let mut st = self.shared.lock();
        let Some(d) = st.driver.as_mut() else {
            return r;
        };
        let r = give_up(d, op, owned, r);
        d.post_work();
        self.shared.changed(&mut st);
        r
    }
}
