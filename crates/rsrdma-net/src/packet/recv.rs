//! The receive side of a [`super::PacketConn`]: `depth` buffers of GRH + datagram in one
//! memory region, all posted at all times except while a caller copies one out.
//!
//! Every receive completion goes into a FIFO (it can never hold more than `depth`, so it
//! never grows), whichever thread polled it; callers take datagrams from the FIFO. A
//! datagram too big for the caller's buffer stays at the front.

use super::grh::{source_gid, GRH_LEN};
use super::send::CHUNK;
use crate::error::Result;
use rsrdma::{AccessFlags, Cq, Gid, Mr, Pd, Qp, RecvWr, Sge, Wc, WcStatus};
use std::collections::VecDeque;

/// A received datagram waiting in its buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    pub(crate) slot: u32,
    /// Payload bytes (after the GRH).
    pub(crate) len: u32,
    pub(crate) src_qp: u32,
}

/// The receive buffers.
#[derive(Debug)]
pub(crate) struct RecvRing {
    mr: Mr,
    slot_len: usize,
}

/// Everything behind the receive lock.
#[derive(Debug)]
pub(crate) struct RecvQueue {
    ready: VecDeque<Ready>,
    pub(crate) errors: u64,
    /// Datagrams dropped for being larger than the endpoint's `max_datagram`.
    pub(crate) oversized: u64,
    /// A receive came back flushed while the endpoint lives: the QP is in ERROR (a fault,
    /// the device's), and nothing will arrive again. Reported by every receive once the
    /// datagrams that arrived before are taken.
    pub(crate) failed: Option<Wc>,
    /// The endpoint's `max_datagram`: a receive buffer rounds up past it, so a larger
    /// datagram can land; it is dropped, as a NIC drops one larger than the buffer (a
    /// caller's buffer of `max_datagram` bytes would otherwise stop at it for ever).
    max_len: u32,
}

impl RecvRing {
    pub(crate) fn new(pd: &Pd, depth: u32, slot_len: usize) -> Result<Self> {
        let mr = Mr::new(pd, depth as usize * slot_len, AccessFlags::LOCAL_WRITE)?;
        Ok(RecvRing { mr, slot_len })
    }

    /// Posts buffers `slots` (ids), [`CHUNK`] per call.
    pub(crate) fn post(&self, qp: &Qp, slots: &[u32]) -> Result<()> {
        for part in slots.chunks(CHUNK) {
            let mut sges = [Sge::new(0, 0, 0); CHUNK];
            for (s, &slot) in sges.iter_mut().zip(part) {
                *s = self.mr.sge(slot as usize * self.slot_len, self.slot_len)?;
            }
            let mut wrs: [RecvWr<'_>; CHUNK] = std::array::from_fn(|i| {
                RecvWr::new(part.get(i).copied().unwrap_or(0).into(), &sges[i..i + 1])
            });
            // SAFETY: the buffers live in `self.mr`, which the connection drops after the QP;
            // no thread reads a buffer while it is posted (a buffer is read only between its
            // completion and this repost).
            unsafe { qp.post_recv_batch(&mut wrs[..part.len()])? };
        }
        Ok(())
    }

    /// Copies datagram `r` into `buf` (which holds it) and returns the sender's GID.
    pub(crate) fn copy_out(&self, r: &Ready, buf: &mut [u8]) -> Result<Gid> {
        let off = r.slot as usize * self.slot_len;
        let mut grh = [0u8; GRH_LEN];
        self.mr.read_at(off, &mut grh)?;
        self.mr.read_at(off + GRH_LEN, &mut buf[..r.len as usize])?;
        Ok(source_gid(&grh).unwrap_or_else(|| {
            tracing::warn!(slot = r.slot, "a UD receive with an unreadable GRH");
            Gid::default()
        }))
    }
}

impl RecvQueue {
    pub(crate) fn new(depth: u32, max_datagram: usize) -> Self {
        RecvQueue {
            ready: VecDeque::with_capacity(depth as usize),
            errors: 0,
            oversized: 0,
            failed: None,
            max_len: u32::try_from(max_datagram).unwrap_or(u32::MAX),
        }
    }

    /// The oldest datagram, without taking it.
    pub(crate) fn front(&self) -> Option<&Ready> {
        self.ready.front()
    }

    pub(crate) fn pop(&mut self) -> Option<Ready> {
        self.ready.pop_front()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// Moves every receive completion there is into the FIFO. A failed receive (other than
    /// a flush at teardown), or a datagram over `max_datagram`, is counted and its buffer
    /// reposted.
    pub(crate) fn refill(&mut self, cq: &Cq, qp: &Qp, ring: &RecvRing) -> Result<()> {
        let mut wcs = [Wc::default(); CHUNK];
        // A repost that fails (the QP is breaking) does not drop the rest of what was polled:
        // every datagram that arrived is still queued, then the failure is said.
        let mut reposted = Ok(());
        let mut repost = |slot: u32| {
            if let Err(e) = ring.post(qp, &[slot]) {
                if reposted.is_ok() {
                    reposted = Err(e);
                }
            }
        };
        loop {
            let n = cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                let slot = wc.wr_id() as u32;
                if wc.is_ok() {
                    let len = wc.byte_len().saturating_sub(GRH_LEN as u32);
                    if len > self.max_len {
                        self.oversized += 1;
                        tracing::debug!(
                            len,
                            max = self.max_len,
                            "dropped a UD datagram over max_datagram"
                        );
                        repost(slot);
                        continue;
                    }
                    self.ready.push_back(Ready {
                        slot,
                        len,
                        src_qp: wc.src_qp(),
                    });
                } else if wc.status() == WcStatus::WR_FLUSH_ERR {
                    // Not at teardown (nothing refills then): the QP failed. Not reposted.
                    if self.failed.is_none() {
                        tracing::warn!(
                            "a UD endpoint's queue pair failed: its receives were flushed"
                        );
                        self.failed = Some(*wc);
                    }
                } else {
                    self.errors += 1;
                    tracing::warn!(status = %wc.status(), "a UD receive failed");
                    repost(slot);
                }
            }
            if n < CHUNK {
                return reposted;
            }
        }
    }
}
