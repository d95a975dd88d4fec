//! `std::io::Read` and `Write` for [`Conn`] and `&Conn`: a byte stream over the messages.
//!
//! `read` fills the buffer from the next messages (it may stop inside one; message
//! boundaries are not kept) and returns 0 only at the end of the stream. `write` sends one
//! message of up to the negotiated cap and returns its length; a zero-length write sends
//! nothing. `flush` waits until every byte taken so far is handed to the NIC (delivery is
//! confirmed by `close`). Timeouts are the read and write timeouts, as
//! [`io::ErrorKind::TimedOut`].

use super::driver::Driver;
use super::op::Op;
use super::rendezvous::read_attempt;
use super::sides::Side;
use super::Conn;
use crate::error::{NetError, Result};
use std::io;

/// The wait of a flush, for either face: done once every byte taken is handed to the NIC
/// (or the peer left); a failed connection ends it.
pub(crate) struct Flushed;

impl Op for Flushed {
    type Out = ();

    fn name(&self) -> &'static str {
        "flush"
    }

    fn side(&self) -> Option<Side> {
        None
    }

    fn poll(&mut self, d: &mut Driver) -> Result<Option<()>> {
        d.check_failed()?;
        let queued = d.core_ref().counters().queued_send_bytes;
        Ok((queued == 0 || d.peer_gone()).then_some(()))
    }
}

impl io::Read for &Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // A rendezvous message is read whole into the driver's memory, then served from the
        // core as any message.
        let timeout = self.shared.read_timeout.get();
        self.block("read", timeout, |d| read_attempt(d, buf))
            .map_err(NetError::into_io)
    }
}

impl io::Write for &Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min(self.info.settled.max_message as usize);
        self.send_msg(&buf[..n])
            .map_err(|e| e.naming("write").into_io())?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let timeout = self.shared.write_timeout.get();
        self.run(&mut Flushed, timeout).map_err(NetError::into_io)
    }
}

impl io::Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl io::Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}
