//! [`OpFuture`]: a connection's operation ([`crate::conn::Op`]) awaited. Each poll runs the
//! operation's step, the same attempt the blocking face's runner makes; a future that ends
//! without a value, or is dropped half-way, has the operation hand back what the core holds
//! and free its side, exactly once, under the lock (the blocking face's abandon).

use super::driven::Driven;
use crate::conn::Op;
use crate::error::{NetError, Result};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `op` on `d`, as a future.
pub(super) struct OpFuture<'a, O: Op> {
    d: &'a Driven,
    op: O,
    /// The operation holds its side of the connection.
    owned: bool,
    /// The future returned its value (nothing to hand back).
    done: bool,
}

impl<'a, O: Op> OpFuture<'a, O> {
    pub(super) fn new(d: &'a Driven, op: O) -> OpFuture<'a, O> {
        OpFuture {
            d,
            op,
            owned: false,
            done: false,
        }
    }
}

impl<O: Op + Unpin> Future for OpFuture<'_, O> {
    type Output = Result<O::Out>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (d, op, owned) = (this.d, &mut this.op, &mut this.owned);
        match d.poll_op(cx, |c, live| c.step_op(op, owned, live)) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(v)) => {
                this.done = true;
                Poll::Ready(Ok(v))
            }
            Poll::Ready(Err(e)) => {
                this.done = true;
                let r = d.conn().give_up_op(&mut this.op, this.owned, Err(e));
                this.owned = false;
                d.gave_up();
                Poll::Ready(r)
            }
        }
    }
}

impl<O: Op> Drop for OpFuture<'_, O> {
    fn drop(&mut self) {
        if !self.done {
            let dropped = Err(NetError::Closed {
                op: "a dropped future",
            });
            let _ = self.d.conn().give_up_op(&mut self.op, self.owned, dropped);
            self.d.gave_up();
        }
    }
}
