//! `--zero-copy`, the rendezvous threshold and `--shared-recv` of `rs_rdmanet_bw` and
//! `rs_rdmanet_lat`: sending from and receiving into registered [`Buffer`]s.
//!
//! - **Bandwidth client.** A [`Ring`] of `--buffers` registered buffers of `-s` bytes, made
//!   before the clock starts: message `i` goes from buffer `i mod N` with
//!   `start_send_buffer` once `wait_buffer` says the buffer is free again, so up to N
//!   messages are in flight (eager lent frames below the rendezvous threshold, RTS + the
//!   peer's READ at or above it). The clock stops when every buffer is free (delivered and
//!   released by the NIC).
//! - **Bandwidth server.** `recv_buffer` into one registered buffer, replaced by a larger
//!   one when a message does not fit (as the copying server grows its vector).
//! - **Latency.** Both ends use buffers: the client sends its buffer and receives the echo
//!   into another, the server receives into a buffer and echoes that buffer.
//! - **Verification.** Every message carries its sequence number in its first and last 8
//!   bytes (fewer for shorter messages) over a fixed fill pattern: the zero-copy bandwidth
//!   server checks the stamps of each message it receives, the latency client those of each
//!   echo. Two stamps per message keep the check off the transfer's cost, yet a message that
//!   arrived out of order, truncated, or not at all into the buffer fails the run.

use super::args::{LatArgs, ZeroCopy};
use super::conn_bw::after;
use super::net::net_error;
use super::text::{Json, SendMode};
use crate::error::{Error, Result};
use crate::out::Out;
use crate::watch::Clock;
use rsrdma_net::{Buffer, Conn, ConnOptions, Listener, NetError, RecvMemory, SharedRecv};
use std::time::Duration;

/// `opts` with the rendezvous threshold and the shared receive pool of the flags.
pub fn options(opts: ConnOptions, zc: &ZeroCopy) -> ConnOptions {
    opts.rendezvous(zc.rendezvous)
        .shared_recv(zc.shared_recv.map(SharedRecv::new))
}

/// The server's last line with `--shared-recv`: the listener's registered receive memory.
pub fn recv_memory_line(m: &RecvMemory) -> String {
    format!(
        "listener receive memory: {} bytes (pool {} bytes in {} slots, {} bytes for {} connections)\n",
        m.total(),
        m.pool_bytes,
        m.pool_slots,
        m.connection_bytes,
        m.connections
    )
}

/// The receive-memory line when the listener pools its receive memory, else nothing.
pub fn recv_memory_text(l: &Listener, zc: &ZeroCopy) -> String {
    match zc.shared_recv {
        Some(_) => recv_memory_line(&l.recv_memory()),
        None => String::new(),
    }
}

/// With `--zero-copy`, the client's proof that it did not copy: the payload bytes its
/// connection copied into send slots (`Counters::send_copied_bytes`), else nothing.
pub fn copied_text(conn: &Conn, zc: &ZeroCopy) -> String {
    match (zc.enabled, conn.counters()) {
        (true, Some(c)) => format!(
            "payload copied into send slots: {} bytes\n",
            c.send_copied_bytes
        ),
        _ => String::new(),
    }
}

/// The fill byte at offset `i` of every message (between the stamps).
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Writes the fill pattern over `buf`.
pub fn fill(buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(i);
    }
}

/// The stamp ranges of a message of `len` bytes: the head (up to 8 bytes) and, from 16
/// bytes on, the tail.
fn stamp_ranges(len: usize) -> [std::ops::Range<usize>; 2] {
    let head = 0..len.min(8);
    let tail = if len >= 16 { len - 8..len } else { 0..0 };
    [head, tail]
}

/// Stamps message `seq` into `msg` (its whole length is the message).
pub fn stamp(msg: &mut [u8], seq: u64) {
    let le = seq.to_le_bytes();
    for r in stamp_ranges(msg.len()) {
        let n = r.len();
        msg[r].copy_from_slice(&le[..n]);
    }
}

/// Checks that `msg` carries the stamps of message `seq`.
///
/// # Errors
/// [`Error::Protocol`] naming the message and what it carries instead.
pub fn check_stamp(msg: &[u8], seq: u64) -> Result<()> {
    let le = seq.to_le_bytes();
    for r in stamp_ranges(msg.len()) {
        let n = r.len();
        if msg[r.clone()] != le[..n] {
            let mut got = [0u8; 8];
            got[..n].copy_from_slice(&msg[r.clone()]);
            return Err(Error::Protocol(format!(
                "message {seq} ({} bytes) carries the stamp {} at bytes {}..{}: \
                 out of order or not all delivered (a --zero-copy server needs a \
                 --zero-copy client)",
                msg.len(),
                u64::from_le_bytes(got),
                r.start,
                r.end
            )));
        }
    }
    Ok(())
}

/// The bandwidth client's registered buffers, used in turn.
pub struct Ring {
    bufs: Vec<Buffer>,
    size: usize,
}

impl Ring {
    /// `n` buffers of `size` bytes on `conn`'s domain, filled with the pattern.
    ///
    /// # Errors
    /// The registration's error.
    pub fn new(conn: &Conn, size: usize, n: u32) -> Result<Ring> {
        let mut bufs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let mut b = conn
                .alloc_buffer(size)
                .map_err(|e| net_error("alloc_buffer", e))?;
            fill(&mut b.as_mut_slice().map_err(|e| net_error("as_mut_slice", e))?[..size]);
            bufs.push(b);
        }
        Ok(Ring { bufs, size })
    }

    /// Sends `count` stamped messages, up to one per buffer in flight, and waits until every
    /// buffer is free again.
    ///
    /// # Errors
    /// What failed, after how many messages.
    pub fn send(&mut self, conn: &Conn, count: u64) -> Result<SendMode> {
        let n = self.bufs.len() as u64;
        for i in 0..count {
            let b = &mut self.bufs[(i % n) as usize];
            conn.wait_buffer(b)
                .map_err(|e| after("wait_buffer", i, e))?;
            stamp(
                &mut b.as_mut_slice().map_err(|e| after("as_mut_slice", i, e))?[..self.size],
                i,
            );
            conn.start_send_buffer(b, self.size)
                .map_err(|e| after("start_send_buffer", i, e))?;
        }
        for b in &self.bufs {
            conn.wait_buffer(b)
                .map_err(|e| after("wait_buffer", count, e))?;
        }
        Ok(SendMode::Buffers(n as u32))
    }
}

/// Receives into a registered buffer until the end of the stream, checking every message's
/// stamps; `(messages, bytes)`.
///
/// # Errors
/// A failed connection, or a message with the wrong stamps.
pub fn drain(conn: &Conn, size: usize) -> Result<(u64, u64)> {
    let mut buf = conn
        .alloc_buffer(size)
        .map_err(|e| net_error("alloc_buffer", e))?;
    let (mut messages, mut bytes) = (0u64, 0u64);
    loop {
        match conn.recv_buffer(&mut buf) {
            Ok(Some(n)) => {
                let msg = buf.as_slice().map_err(|e| after("as_slice", messages, e))?;
                check_stamp(&msg[..n], messages)?;
                messages += 1;
                bytes += n as u64;
            }
            Ok(None) => return Ok((messages, bytes)),
            Err(NetError::ShortBuffer { needed }) => {
                buf = conn
                    .alloc_buffer(needed)
                    .map_err(|e| after("alloc_buffer", messages, e))?;
            }
            Err(e) => return Err(after("recv_buffer", messages, e)),
        }
    }
}

/// The latency server: echoes each message from the buffer it was received into;
/// `(messages, bytes)`.
///
/// # Errors
/// A failed connection.
pub fn echo(conn: &Conn, size: usize) -> Result<(u64, u64)> {
    let mut buf = conn
        .alloc_buffer(size)
        .map_err(|e| net_error("alloc_buffer", e))?;
    let (mut messages, mut bytes) = (0u64, 0u64);
    loop {
        let n = match conn.recv_buffer(&mut buf) {
            Ok(Some(n)) => n,
            Ok(None) => return Ok((messages, bytes)),
            Err(NetError::ShortBuffer { needed }) => {
                buf = conn
                    .alloc_buffer(needed)
                    .map_err(|e| after("alloc_buffer", messages, e))?;
                continue;
            }
            Err(e) => return Err(after("recv_buffer", messages, e)),
        };
        conn.send_buffer(&buf, n)
            .map_err(|e| after("send_buffer", messages, e))?;
        messages += 1;
        bytes += n as u64;
    }
}

/// The latency client's two buffers: what it sends, and where the echo lands.
pub struct PingPong {
    send: Buffer,
    echo: Buffer,
    size: usize,
}

impl PingPong {
    /// Two registered buffers of `size` bytes, the one to send filled with the pattern.
    ///
    /// # Errors
    /// The registration's error.
    pub fn new(conn: &Conn, size: usize) -> Result<PingPong> {
        let alloc = || {
            conn.alloc_buffer(size)
                .map_err(|e| net_error("alloc_buffer", e))
        };
        let (mut send, echo) = (alloc()?, alloc()?);
        fill(
            &mut send
                .as_mut_slice()
                .map_err(|e| net_error("as_mut_slice", e))?[..size],
        );
        Ok(PingPong { send, echo, size })
    }

    /// Stamps round trip `i` into the message (outside the timed part).
    ///
    /// # Errors
    /// The buffer is still in flight (it cannot be: `send_buffer` waited).
    pub fn stamp(&mut self, i: u64) -> Result<()> {
        let msg = self
            .send
            .as_mut_slice()
            .map_err(|e| after("as_mut_slice", i, e))?;
        stamp(&mut msg[..self.size], i);
        Ok(())
    }

    /// One round trip: sends the buffer, receives the echo; the echo's length (`None` at the
    /// end of the stream).
    ///
    /// # Errors
    /// A failed connection.
    pub fn round_trip(&mut self, conn: &Conn, i: u64) -> Result<Option<usize>> {
        conn.send_buffer(&self.send, self.size)
            .map_err(|e| after("send_buffer", i, e))?;
        conn.recv_buffer(&mut self.echo)
            .map_err(|e| after("recv_buffer", i, e))
    }

    /// Checks the stamps of round trip `i`'s echo of `n` bytes.
    ///
    /// # Errors
    /// [`Error::Protocol`] for an echo that is not message `i`.
    pub fn check(&self, i: u64, n: usize) -> Result<()> {
        let echo = self.echo.as_slice().map_err(|e| after("as_slice", i, e))?;
        check_stamp(&echo[..n.min(echo.len())], i)
    }
}

/// The latency client with `--zero-copy`: `-n` timed round trips from and into registered
/// buffers, each echo's stamps checked (outside the timed part), then the statistics.
///
/// # Errors
/// A failed connection, a dead server, or an echo of the wrong length or stamps.
pub fn lat_client(a: &LatArgs, conn: &Conn, o: &mut Out<'_>) -> Result<Json> {
    let c = &a.common;
    let size = a.size as usize;
    let mut pp = PingPong::new(conn, size)?;
    // Grown outside the timed part of each round trip when a run is longer than this.
    let mut samples = Vec::with_capacity(c.count.min(1 << 16) as usize);
    let clock = Clock::new();
    for i in 0..c.count {
        pp.stamp(i)?;
        let t0 = clock.now();
        let got = pp.round_trip(conn, i)?;
        samples.push(Duration::from_nanos(clock.now().saturating_sub(t0)));
        let n = super::lat::echo_len(i, got, size, c.count)?;
        pp.check(i, n)?;
    }
    super::lat::finish_client(a, conn, o, &mut samples, Some("zero_copy"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_catch_a_wrong_message() {
        for len in [1usize, 7, 8, 15, 16, 17, 4096] {
            let mut m = vec![0u8; len];
            fill(&mut m);
            stamp(&mut m, 0x0102_0304_0506_0708);
            check_stamp(&m, 0x0102_0304_0506_0708).unwrap();
            let e = check_stamp(&m, 9).unwrap_err().to_string();
            assert!(e.contains("message 9"), "{len}: {e}");
        }
        // A tail that did not arrive (still the pattern) is caught, not only the head.
        let mut m = vec![0u8; 64];
        fill(&mut m);
        stamp(&mut m, 3);
        m[63] ^= 0xff;
        let e = check_stamp(&m, 3).unwrap_err().to_string();
        assert!(e.contains("bytes 56..64"), "{e}");
    }

    #[test]
    fn the_pattern_is_not_a_stamp() {
        // A message that was never stamped does not pass as message 0.
        let mut m = vec![0u8; 32];
        fill(&mut m);
        assert!(check_stamp(&m, 0).is_err());
    }

    #[test]
    fn options_carry_the_threshold_and_the_pool() {
        let zc = ZeroCopy {
            enabled: true,
            buffers: 4,
            rendezvous: None,
            shared_recv: Some(64),
        };
        let o = options(ConnOptions::default(), &zc);
        assert_eq!(o.rendezvous, None);
        assert_eq!(o.shared_recv.map(|s| s.pool_slots), Some(64));
        let o = options(
            ConnOptions::default(),
            &ZeroCopy {
                rendezvous: Some(4096),
                shared_recv: None,
                ..zc
            },
        );
        assert_eq!((o.rendezvous, o.shared_recv), (Some(4096), None));
    }
}
