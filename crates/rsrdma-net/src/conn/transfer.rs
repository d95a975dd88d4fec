//! Blocking transfers that lend the caller's memory to the protocol core for the whole call.
//!
//! A blocking `send_msg` holds the caller's slice until it returns, so the core sends
//! fragments straight from it as credits come back ([`rsrdma_proto::Conn::send_msg_borrowed`])
//! instead of copying the unsent rest of a large message; `recv_msg_into` holds the caller's
//! buffer, so fragments go from their receive slots straight into it
//! ([`rsrdma_proto::Conn::recv_msg_direct`]) instead of through a reassembly buffer. A
//! connection thus needs no memory beyond its slots for a message of any size.
//!
//! While the core holds a borrowed slice only its owner may continue the transfer, so each
//! direction has one owner at a time ([`Side`]): other senders (or `recv_msg_into` callers)
//! wait for it like for any other resource, within their own timeouts. The send owner holds
//! the side for a whole batch, which keeps a batch contiguous. A call that gives up (timeout,
//! close) hands its transfer back: a message already partly sent has its rest copied into
//! the core (it is then sent whole, and the call reports success), one not begun is
//! withdrawn; the part of a message already received into the caller's buffer is copied
//! back into the core, so the message stays whole for the next read.

use super::driver::Driver;
use super::{from_core, Conn};
use crate::error::{NetError, Result};
use rsrdma_proto::ProtoError;
use std::cell::Cell;
use std::time::Duration;

/// A direction of the connection that one call at a time may own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Send,
    Recv,
}

/// Which sides are owned (lives in the driver, behind the connection's mutex).
#[derive(Debug, Default)]
pub(crate) struct Owners {
    send: bool,
    recv: bool,
}

impl Owners {
    fn flag(&mut self, side: Side) -> &mut bool {
        match side {
            Side::Send => &mut self.send,
            Side::Recv => &mut self.recv,
        }
    }
}

impl Conn {
    /// Sends `msgs` in order, each from the caller's memory, as one owner of the send side.
    /// On an error the messages before the failing one are sent, and that one too when it
    /// had begun; a single message that had begun when the timeout hit is sent whole and the
    /// call succeeds.
    pub(super) fn send_lent(&self, op: &'static str, msgs: &[&[u8]]) -> Result<()> {
        let timeout = self.shared.lock().write_timeout;
        let next = Cell::new(0usize);
        self.owning(
            op,
            Side::Send,
            timeout,
            |d| {
                if d.peer_gone() {
                    return Err(NetError::PeerGone { op });
                }
                while let Some(m) = msgs.get(next.get()) {
                    match d.core().send_msg_borrowed(m) {
                        Ok(true) => next.set(next.get() + 1),
                        Ok(false) | Err(ProtoError::WouldBlock) => return Ok(None),
                        Err(e) => return Err(from_core(e)),
                    }
                }
                Ok(Some(()))
            },
            |d, r| {
                let Some(m) = msgs.get(next.get()) else {
                    return r;
                };
                let kept = d.core().send_unborrow(m);
                match r {
                    Err(NetError::Timeout { .. }) if kept && msgs.len() == 1 => Ok(()),
                    r => r,
                }
            },
        )
    }

    /// Receives the next message into `buf`, its fragments straight from their slots, as the
    /// one owner of the direct receive.
    pub(super) fn recv_lent(&self, buf: &mut [u8]) -> Result<Option<usize>> {
        let timeout = self.shared.lock().read_timeout;
        let buf = Cell::new(Some(buf));
        self.owning(
            "recv_msg_into",
            Side::Recv,
            timeout,
            |d| {
                // Not `ok_or(error)`: that builds and drops an error on every poll.
                let Some(b) = buf.take() else {
                    return Err(NetError::Closed {
                        op: "recv_msg_into",
                    });
                };
                let r = d.core().recv_msg_direct(b);
                buf.set(Some(b));
                match r {
                    Ok(n) => Ok(Some(n)),
                    Err(ProtoError::WouldBlock) => Ok(None),
                    Err(e) => Err(from_core(e)),
                }
            },
            |d, r| {
                if r.is_err() {
                    if let Some(b) = buf.take() {
                        d.core().recv_direct_abort(b);
                    }
                }
                r
            },
        )
    }

    /// [`Conn::block`] for a call that must own `side` first: it waits for the side like for
    /// any other resource (within `timeout`), runs `attempt` as its owner, and on the way out
    /// runs `finish` (with the result, which it may change) and frees the side. `finish` runs
    /// only if the side was owned and the connection still exists.
    fn owning<T>(
        &self,
        op: &'static str,
        side: Side,
        timeout: Option<Duration>,
        mut attempt: impl FnMut(&mut Driver) -> Result<Option<T>>,
        finish: impl FnOnce(&mut Driver, Result<T>) -> Result<T>,
    ) -> Result<T> {
        let owned = Cell::new(false);
        let r = self.block(op, timeout, |d| {
            if !owned.get() {
                let flag = d.owners().flag(side);
                if *flag {
                    return Ok(None);
                }
                *flag = true;
                owned.set(true);
            }
            attempt(d)
        });
        if !owned.get() {
            return r;
        }
        let mut st = self.shared.lock();
        let Some(d) = st.driver.as_mut() else {
            return r;
        };
        let r = finish(d, r);
        *d.owners().flag(side) = false;
        d.post_work();
        self.shared.changed(&mut st);
        r
    }
}
