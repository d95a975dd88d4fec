//! The send side of a [`super::PacketConn`]: a ring of send buffers in one memory region,
//! many datagrams in flight, selective signaling, and an address-handle cache.
//!
//! Buffers are used in ring order, so a signaled completion frees every buffer posted before
//! it (a UD send queue completes in order). A batch signals every `signal_every`-th request
//! and its last one, so the ring never fills with requests that nobody will report, and a
//! flush can always wait for the last one.

use super::addr::Addr;
use super::ah_cache::AhCache;
use crate::error::{NetError, Result};
use rsrdma::{Ah, AhAttr, GlobalRoute, Mr, Pd, Qp, SendWr, Sge, Wc};
use std::sync::Arc;

/// Requests posted per call into the provider, and completions polled per call.
pub(crate) const CHUNK: usize = 32;

/// How the send side addresses a path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub(crate) port: u8,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// Everything behind the send lock.
#[derive(Debug)]
pub(crate) struct SendRing {
    mr: Mr,
    slot_len: usize,
    depth: u64,
    /// Requests posted so far; the next one uses buffer `head % depth`.
    head: u64,
    /// Requests known complete; buffers `tail..head` are in flight.
    tail: u64,
    since_signal: u64,
    signal_every: u64,
    /// The address handle each in-flight buffer's request uses, kept alive until it completes.
    held: Vec<Option<Arc<Ah>>>,
    cache: AhCache,
    /// The first failed send completion. A UD send queue stops at its first error (the QP
    /// leaves RTS; every later request is flushed), so every later send reports it.
    failed: Option<Wc>,
    pub(crate) errors: u64,
}

impl SendRing {
    pub(crate) fn new(pd: &Pd, depth: u32, slot_len: usize, ah_cache: usize) -> Result<Self> {
        let depth = u64::from(depth.max(1));
        let mr = Mr::new(pd, depth as usize * slot_len, rsrdma::AccessFlags::NONE)?;
        Ok(SendRing {
            mr,
            slot_len,
            depth,
            head: 0,
            tail: 0,
            since_signal: 0,
            signal_every: (depth / 4).max(1),
            held: vec![None; depth as usize],
            cache: AhCache::new(ah_cache),
            failed: None,
            errors: 0,
        })
    }

    /// Free buffers.
    pub(crate) fn free(&self) -> u64 {
        self.depth - (self.head - self.tail)
    }

    /// True when every posted request has completed.
    pub(crate) fn idle(&self) -> bool {
        self.head == self.tail
    }

    /// Address handles created so far (cache misses), and held now.
    pub(crate) fn ah_stats(&self) -> (u64, usize) {
        (self.cache.misses(), self.cache.len())
    }

    /// The failed completion reaped earlier, if any: the send queue stopped at it.
    pub(crate) fn take_failure(&mut self) -> Result<()> {
        match &self.failed {
            Some(wc) => wc.ok().map(|_| ()).map_err(Into::into),
            None => Ok(()),
        }
    }

    /// Reaps every send completion there is, freeing buffers.
    pub(crate) fn reap(&mut self, cq: &rsrdma::Cq) -> Result<()> {
        let mut wcs = [Wc::default(); CHUNK];
        loop {
            let n = cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                self.complete(wc);
            }
            if n < CHUNK {
                return Ok(());
            }
        }
    }

    fn complete(&mut self, wc: &Wc) {
        if let Err(e) = wc.ok() {
            self.errors += 1;
            tracing::warn!(error = %e, "a UD send failed");
            if self.failed.is_none() {
                self.failed = Some(*wc);
            }
        }
        let done = wc.wr_id();
        while self.tail <= done && self.tail < self.head {
            self.held[(self.tail % self.depth) as usize] = None;
            self.tail += 1;
        }
    }

    /// Copies and posts as many of `msgs` as there are free buffers (at most [`CHUNK`]).
    /// A datagram that cannot go yet (no cached address handle: [`Posted::missing`]) or at
    /// all (the provider refusing it: [`Posted::error`]) stops the post there; those before
    /// it are posted. `made` is the handle made for the last post's [`Posted::missing`]:
    /// it is cached first, so the datagram that waited for it goes now.
    pub(crate) fn post(&mut self, qp: &Qp, msgs: &[(&[u8], Addr)], made: Option<Made>) -> Posted {
        if let Some((gid, ah)) = made {
            self.cache.insert(gid, ah);
        }
        let mut n = msgs.len().min(CHUNK).min(self.free() as usize);
        if n == 0 {
            return Posted::default();
        }
        let mut sges = [Sge::new(0, 0, 0); CHUNK];
        let mut ahs: [Option<Arc<Ah>>; CHUNK] = Default::default();
        let mut signaled = [false; CHUNK];
        let (mut error, mut missing) = (None, None);
        for (i, (data, to)) in msgs[..n].iter().enumerate() {
            let seq = self.head + i as u64;
            let off = (seq % self.depth) as usize * self.slot_len;
            let prepared = self
                .mr
                .write_at(off, data)
                .and_then(|()| self.mr.sge(off, data.len()));
            let sge = match prepared {
                Ok(sge) => sge,
                Err(e) => {
                    error = Some(NetError::from(e));
                    n = i;
                    break;
                }
            };
            // An address handle not cached yet is made by the caller, outside the lock.
            let Some(ah) = self.cache.get(to.gid) else {
                missing = Some(*to);
                n = i;
                break;
            };
            sges[i] = sge;
            self.held[(seq % self.depth) as usize] = Some(ah.clone());
            ahs[i] = Some(ah);
            self.since_signal += 1;
            if self.since_signal >= self.signal_every || i + 1 == n {
                signaled[i] = true;
                self.since_signal = 0;
            }
        }
        if n == 0 {
            return Posted { n, error, missing };
        }
        // The last request posted is signaled, also when a failed datagram cut the batch
        // short: otherwise nothing might ever free its buffer.
        signaled[n - 1] = true;
        self.since_signal = 0;
        let head = self.head;
        let mut wrs: [SendWr<'_>; CHUNK] = std::array::from_fn(|i| {
            let wr = SendWr::send(head + i as u64, &sges[i..i + 1]).signaled(signaled[i]);
            match (&ahs[i], msgs.get(i)) {
                (Some(ah), Some((_, to))) => wr.ud(ah, to.qpn, to.qkey),
                _ => wr,
            }
        });
        // SAFETY: the buffers live in `self.mr`, which outlives the QP's requests (the
        // connection drops the QP first) and is not written again until the request's
        // completion frees the buffer; each request's address handle is held in `self.held`
        // until then.
        let posted = unsafe { qp.post_send_batch(&mut wrs[..n]) };
        match posted {
            Ok(()) => {
                self.head += n as u64;
                Posted { n, error, missing }
            }
            Err(e) => {
                let ok = match &e {
                    rsrdma::Error::Post { index, .. } => *index,
                    _ => 0,
                };
                for i in ok..n {
                    self.held[((self.head + i as u64) % self.depth) as usize] = None;
                }
                self.head += ok as u64;
                if ok > 0 {
                    // The last posted request may be unsignaled: nothing would free it.
                    tracing::warn!(posted = ok, of = n, "a partial UD send batch");
                }
                Posted {
                    n: ok,
                    error: Some(NetError::from(e)),
                    missing: None,
                }
            }
        }
    }
}

/// What [`SendRing::post`] did.
#[derive(Debug, Default)]
pub(crate) struct Posted {
    /// Datagrams posted, in order from the first.
    pub(crate) n: usize,
    /// Why it stopped before the next one, if a datagram failed (none: no free buffer, or
    /// all posted).
    pub(crate) error: Option<NetError>,
    /// The next datagram's address, when it stopped for want of its address handle: make
    /// one ([`make_ah`]) and pass it to the next post.
    pub(crate) missing: Option<Addr>,
}

/// An address handle made outside the lock, and the GID it is for.
pub(crate) type Made = (rsrdma::Gid, Arc<Ah>);

/// An address handle for `to` on `pd`. It may take the kernel a while (resolving the path;
/// seconds for an address that does not answer), so callers make it outside the send lock.
///
/// # Errors
/// [`NetError::Verbs`] naming `ibv_create_ah`.
pub(crate) fn make_ah(pd: &Pd, route: Route, to: &Addr) -> Result<Made> {
    Ok((to.gid, Arc::new(Ah::new(pd, &ah_attr(route, to))?)))
}

fn ah_attr(route: Route, to: &Addr) -> AhAttr {
    AhAttr {
        port_num: route.port,
        grh: Some(GlobalRoute {
            hop_limit: route.hop_limit,
            traffic_class: route.traffic_class,
            ..GlobalRoute::new(to.gid, route.sgid_index)
        }),
        ..Default::default()
    }
}
