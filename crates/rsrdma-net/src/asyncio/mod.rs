//! The async layer (feature `tokio`): [`AsyncConn`], [`AsyncListener`] and
//! [`AsyncPacketConn`] on tokio.
//!
//! ```no_run
//! # async fn f() -> rsrdma_net::Result<()> {
//! use rsrdma_net::{AsyncConn, AsyncListener, ConnOptions};
//! let listener = AsyncListener::bind("10.77.0.1:0", ConnOptions::default())?;
//! let addr = listener.local_addr();
//! tokio::spawn(async move {
//!     let conn = listener.accept().await?;
//!     while let Some(m) = conn.recv_msg().await? {
//!         conn.send_msg(&m).await?;
//!     }
//!     conn.close().await
//! });
//! let conn = AsyncConn::dial(addr, ConnOptions::default()).await?;
//! conn.send_msg(b"ping").await?;
//! assert_eq!(conn.recv_msg().await?.as_deref(), Some(&b"ping"[..]));
//! conn.close().await
//! # }
//! ```
//!
//! # Design: no thread per connection
//!
//! An [`AsyncConn`] is a [`Conn`](crate::Conn) built *without* its progress thread. The
//! protocol core and its driver are the same; what differs is who runs the driver's steps
//! and where waiting happens:
//!
//! - **Steps run inside the poll functions.** Every `poll_read`, `poll_write`, `send_msg`,
//!   `recv_msg`… runs one non-blocking step (poll the CQ, feed the core, fire due timers,
//!   try the operation, post the work) under the connection's lock. If it cannot finish, the
//!   task arms the CQ, steps once more (a completion that came before the arm raises no
//!   event), and returns `Pending`.
//! - **Readiness comes from the reactor.** The completion channel's fd and the liveness fd
//!   (the rdma_cm id's event channel, or the TCP handshake socket) are registered with
//!   tokio's reactor through [`tokio::io::unix::AsyncFd`]. They are polled with a fan-out
//!   waker that wakes every task waiting on the connection (a reader and a writer share one
//!   CQ, and tokio keeps one waker per fd; see `wakers.rs`).
//! - **Timers come from tokio.** Keepalive PINGs, the dead-peer timeout and the grace after
//!   the transport ended must run while no task awaits the connection. Each connection has
//!   one small *task* (not a thread), the keeper, that sleeps on a `tokio::time` timer until
//!   the driver's next deadline, runs a step and sleeps again (about one wake per keepalive
//!   interval). While frames wait to go out (the rest of a message `send_msg` accepted,
//!   whose call returned once the core held it; a control frame), the keeper also waits on
//!   the completion channel and steps on its events: nobody else may be awaiting the
//!   connection, and the credit those frames need comes back as completions. It holds a
//!   weak reference and ends with the connection.
//! - **Busy polling only in busy mode.** With [`PollMode::Busy`](crate::PollMode::Busy) a
//!   waiting call wakes its own task and polls again on its next turn (the runtime keeps
//!   other tasks running); the CQ is never armed. [`PollMode::Event`](crate::PollMode::Event)
//!   and `Adaptive` both wait on the channel: spinning inside a runtime would stall every
//!   other task on its thread, so `Adaptive`'s spin is not used here.
//!
//! One exception uses threads: **establishment**. rsrdma's rdma_cm calls (`resolve_addr`,
//! `connect`, `accept` waiting for ESTABLISHED) and the TCP handshake are synchronous, so
//! [`AsyncConn::dial`] and [`AsyncListener::accept`] run them on tokio's blocking pool
//! (bounded by [`ConnOptions::connect_timeout`](crate::ConnOptions::connect_timeout)); the
//! pool thread returns once the connection is up, and nothing runs on a thread afterwards.
//! Waiting for a connect request on the listener is on the reactor.
//!
//! [`AsyncPacketConn`] needs no keeper (UD has no timers): it watches its send and receive
//! CQs' channels the same way.
//!
//! # Cancellation
//!
//! Every operation is documented as cancel-safe, for one reason: a step either completes
//! the operation (and the future returns `Ready` in that same poll) or changes nothing the
//! caller owns. Messages are taken from the core, or accepted by it, whole and only inside
//! the step that returns them; the caller's buffers are copied to or from the connection's
//! own registered slots, so the NIC never writes into a caller's memory, and dropping a
//! future can neither lose a message nor leave the NIC writing into freed memory. A
//! rendezvous message is read into memory the driver owns. The operations that own a side
//! of the connection for several steps (`send_buffer`, `recv_buffer`) are the blocking
//! face's operations ([`crate::conn`]'s `Op`), polled by a future that, when dropped, has
//! the operation hand back what the core holds and free its side, as a blocking call that
//! times out does. The
//! slots themselves are released only after the QP's flush is reaped, as with
//! [`Conn`](crate::Conn) (a `close` dropped half-way is finished by the next `close` or by
//! the drop).
//!
//! Read and write timeouts of [`Conn`](crate::Conn) do not apply: use
//! [`tokio::time::timeout`] or `select!`.
//!
//! # Runtime
//!
//! Everything here must be created inside a tokio runtime with IO enabled (`enable_io`;
//! the connections keep time on timerfds, not on tokio's timer, so a runtime without
//! `enable_time`, or with a paused clock, serves them too); a current-thread runtime serves
//! any number of connections.

mod conn;
mod driven;
mod io;
mod listener;
mod op_future;
mod packet;
mod split;
mod timer;
mod wakers;
mod watch;

pub use conn::AsyncConn;
pub use listener::AsyncListener;
pub use packet::AsyncPacketConn;
pub use split::{OwnedReadHalf, OwnedWriteHalf, ReuniteError};
