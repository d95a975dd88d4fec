//! What the core's non-blocking calls give when they did not fail.
//!
//! "Not now" and "this message comes by rendezvous" are the normal course of a non-blocking
//! connection, not failures: a driver answers them by waiting for an [`Event`] or by starting
//! a READ, and the connection is as healthy as before. So they are values of the call's
//! result, beside the value it gives on success, and [`ProtoError`] holds only what went
//! wrong: a caller's `?` never passes control flow off as an error, and a `match` on a
//! result names every outcome the driver must handle.
//!
//! [`Event`]: crate::Event
//! [`ProtoError`]: crate::ProtoError

/// What a send-side call of the core ([`Conn::send_msg`] and the like, and
/// [`Conn::start_read`]) gives when it did not fail.
///
/// [`Conn::send_msg`]: crate::Conn::send_msg
/// [`Conn::start_read`]: crate::Conn::start_read
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<T> {
    /// The call did its work; its value.
    Done(T),
    /// It cannot make progress now: another message is being sent, or the send queue is
    /// full. Nothing changed; call again once something did ([`Event::Writable`] follows
    /// when `send_msg` would accept a message).
    ///
    /// [`Event::Writable`]: crate::Event::Writable
    Blocked,
}

impl<T> Step<T> {
    /// Whether the call could not make progress now.
    pub fn is_blocked(&self) -> bool {
        matches!(self, Step::Blocked)
    }
}

/// What a read call of the core ([`Conn::recv_msg_into`], [`Conn::recv_msg_direct`],
/// [`Conn::recv_msg`], [`Conn::read`]) gives when it did not fail.
///
/// [`Conn::recv_msg_into`]: crate::Conn::recv_msg_into
/// [`Conn::recv_msg_direct`]: crate::Conn::recv_msg_direct
/// [`Conn::recv_msg`]: crate::Conn::recv_msg
/// [`Conn::read`]: crate::Conn::read
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recv<T> {
    /// A message (or, for the byte-stream `read`, some bytes).
    Data(T),
    /// End of stream: the peer's FIN arrived after all its data was read, or reading was
    /// shut down.
    Eof,
    /// Nothing to take now; [`Event::Readable`] follows when there is.
    ///
    /// [`Event::Readable`]: crate::Event::Readable
    Blocked,
    /// The next message comes by rendezvous: the driver registers a destination of at least
    /// `len` bytes and calls [`Conn::start_read`]. The message stays queued.
    ///
    /// [`Conn::start_read`]: crate::Conn::start_read
    NeedsRead {
        /// The message length.
        len: usize,
    },
}

impl<T> Recv<T> {
    /// The same outcome with the data mapped by `f`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Recv<U> {
        match self {
            Recv::Data(v) => Recv::Data(f(v)),
            Recv::Eof => Recv::Eof,
            Recv::Blocked => Recv::Blocked,
            Recv::NeedsRead { len } => Recv::NeedsRead { len },
        }
    }
}
