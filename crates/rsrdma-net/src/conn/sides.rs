//! The two directions of a connection, and which call owns each: while the core holds a
//! caller's memory for a transfer (a borrowed slice being sent, a buffer being received
//! into), only that call may continue it, so each side has one owner at a time. The driver
//! keeps the record behind the connection's lock; the operations take and free a side.

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
    /// Whether a call owns `side`.
    pub(crate) fn owned(&self, side: Side) -> bool {
        match side {
            Side::Send => self.send,
            Side::Recv => self.recv,
        }
    }

    pub(crate) fn flag(&mut self, side: Side) -> &mut bool {
        match side {
            Side::Send => &mut self.send,
            Side::Recv => &mut self.recv,
        }
    }
}
