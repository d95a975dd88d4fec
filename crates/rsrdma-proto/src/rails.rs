//! Rails: one connection striped over several reliable, ordered channels ("rails": queue
//! pairs on one device or on several), with failover. The wire format is section 9 of
//! `docs/conn-protocol.md`.
//!
//! A rail delivers whole rail messages in order, or fails. What a failed rail carried last
//! may or may not have arrived (an RC request flushed with an error may have landed before
//! the error), so no rail's word is taken for delivery: the sender keeps every message until
//! the receiver says it handed it to its application, as a cumulative count that every stripe
//! going the other way carries (and an ACK stripe, when nothing goes that way). When a rail
//! fails, the stripes it carried that are not confirmed go again on the others, and the
//! receiver drops what it already has. Messages keep their order (a sequence number across
//! rails) and their boundaries (each stripe names its message's length and its offset in it);
//! a message larger than a stripe is cut into stripes that go on whichever rail asks first,
//! so free rails share a large message and small messages spread over the rails.
//!
//! The count that confirms delivery is also the flow control: the sender keeps at most a
//! window of bytes (and [`MAX_PENDING`] messages) unconfirmed, so the receiver never holds
//! more than that waiting for its application, however the rails reorder stripes.
//!
//! No I/O, no clock, no `unsafe`: a driver asks [`Rails::next_stripe`] what a rail with room
//! carries next and hands every rail message that arrives to [`Rails::handle_stripe`].

use crate::error::ProtoError;
use crate::step::Step;
use std::collections::VecDeque;

/// Bytes of a stripe's header.
pub const STRIPE_HEADER_LEN: usize = 32;
/// The most rails one connection stripes over.
pub const MAX_RAILS: usize = 16;
/// The most messages a sender keeps unconfirmed (and so a receiver holds ahead of its
/// application).
pub const MAX_PENDING: usize = 4096;
/// A receiver confirms at the latest after this many messages, or a quarter of the window,
/// or as soon as its application has read everything that arrived.
const ACK_EVERY: u64 = 64;

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;

/// What both ends of a striped connection agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailsConfig {
    /// How many rails (1 ..= [`MAX_RAILS`]).
    pub rails: usize,
    /// The most data bytes one stripe carries (at least 1).
    pub stripe_size: u32,
    /// The most bytes a sender keeps unconfirmed; a larger message goes alone.
    pub window: usize,
    /// The largest message either side accepts.
    pub max_message: u32,
}

impl RailsConfig {
    /// Checks the ranges (what a proposal on the wire and a local configuration must both
    /// meet).
    ///
    /// # Errors
    /// [`ProtoError::BadParams`] naming the rule.
    pub fn check(&self) -> Result<(), ProtoError> {
        let bad = |reason| Err(ProtoError::BadParams { reason });
        if self.rails == 0 || self.rails > MAX_RAILS {
            return bad("rails: between 1 and 16");
        }
        if self.stripe_size == 0 || self.window == 0 {
            return bad("rails: the stripe size and the window are at least 1");
        }
        // The settled maximum is the smaller of both ends': 0 would carry no message at all.
        if self.max_message == 0 {
            return bad("rails: max_message is at least 1");
        }
        Ok(())
    }
}

/// A stripe's header (32 bytes, little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeHeader {
    /// A stripe of a message's data, or only a confirmation.
    pub data: bool,
    /// DATA: where the bytes go in the message.
    pub offset: u32,
    /// DATA: the message's sequence number (the first message is 0).
    pub seq: u64,
    /// Messages the sender of this stripe has handed to its application, cumulative.
    pub ack: u64,
    /// DATA: the message's length.
    pub total: u32,
    /// DATA: the data bytes after the header.
    pub len: u32,
}

impl StripeHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; STRIPE_HEADER_LEN] {
        let mut b = [0u8; STRIPE_HEADER_LEN];
        b[0] = if self.data { KIND_DATA } else { KIND_ACK };
        b[4..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.ack.to_le_bytes());
        b[24..28].copy_from_slice(&self.total.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Reads the header of a rail message, checking what the header alone can tell: the
    /// kind, the zero fields, and that the data length is what follows it.
    ///
    /// # Errors
    /// [`ProtoError::BadStripe`] naming the broken rule.
    pub fn decode(msg: &[u8]) -> Result<StripeHeader, ProtoError> {
        let bad = |reason| Err(ProtoError::BadStripe { reason });
        if msg.len() < STRIPE_HEADER_LEN {
            return bad("shorter than its header");
        }
        let u32_at = |i: usize| u32::from_le_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&msg[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if msg[1] != 0 || msg[2] != 0 || msg[3] != 0 {
            return bad("flags and reserved bytes are not zero");
        }
        let h = StripeHeader {
            data: msg[0] == KIND_DATA,
            offset: u32_at(4),
            seq: u64_at(8),
            ack: u64_at(16),
            total: u32_at(24),
            len: u32_at(28),
        };
        match msg[0] {
            KIND_DATA => {}
            KIND_ACK if h.offset == 0 && h.seq == 0 && h.total == 0 && h.len == 0 => {}
            KIND_ACK => return bad("an ACK stripe with data fields set"),
            _ => return bad("unknown kind"),
        }
        if h.len as usize != msg.len() - STRIPE_HEADER_LEN {
            return bad("its length is not what follows the header");
        }
        Ok(h)
    }
}

/// A message kept until confirmed, stored as its stripes, each with room for its header
/// before its bytes: a stripe is handed out as one slice, its header written in place (one
/// rail message, with no gathering of header and bytes).
#[derive(Debug)]
struct Outgoing {
    /// Stripe `k` at `k * (STRIPE_HEADER_LEN + stripe_size)`: its header, then its bytes.
    bytes: Vec<u8>,
    len: usize,
}

/// What a striped connection has done, for its counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RailCounters {
    /// Rails that failed.
    pub rails_failed: u32,
    /// Data stripes sent again after their rail failed (or the peer closed it).
    pub stripes_resent: u64,
    /// Data stripes (or parts of them) that arrived a second time and were dropped.
    pub stripes_duplicate: u64,
    /// ACK stripes sent (confirmations that found no data stripe to ride on).
    pub acks_sent: u64,
}

/// A stripe to send: a part of an unconfirmed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Stripe {
    seq: u64,
    offset: u32,
    len: u32,
}

/// A message arriving, in pieces that may come on any rail in any order.
#[derive(Debug)]
struct Incoming {
    data: Vec<u8>,
    /// The byte ranges already here: sorted, disjoint, not touching.
    have: Vec<(u32, u32)>,
    got: u32,
}

impl Incoming {
    fn complete(&self) -> bool {
        self.got as usize == self.data.len()
    }

    /// Copies the parts of `bytes` (at `offset`) not here yet; returns how many bytes were
    /// here already.
    fn land(&mut self, offset: u32, bytes: &[u8]) -> u32 {
        let end = offset + bytes.len() as u32;
        let mut at = offset;
        let mut dup = 0;
        let mut i = 0;
        // Walk the gaps of `have` that overlap [offset, end) and fill them.
        while at < end {
            while i < self.have.len() && self.have[i].1 <= at {
                i += 1;
            }
            let next_have = self.have.get(i).copied();
            match next_have {
                Some((s, e)) if s <= at => {
                    let skip = e.min(end) - at;
                    dup += skip;
                    at += skip;
                }
                _ => {
                    let gap_end = next_have.map_or(end, |(s, _)| s.min(end));
                    let (from, to) = ((at - offset) as usize, (gap_end - offset) as usize);
                    self.data[at as usize..gap_end as usize].copy_from_slice(&bytes[from..to]);
                    self.got += gap_end - at;
                    self.have.insert(i, (at, gap_end));
                    at = gap_end;
                }
            }
        }
        self.merge();
        dup
    }

    fn merge(&mut self) {
        let mut out: Vec<(u32, u32)> = Vec::with_capacity(self.have.len());
        for &(s, e) in &self.have {
            match out.last_mut() {
                Some(last) if last.1 >= s => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        self.have = out;
    }
}

/// An empty vector with room for `len` bytes: a spare one with enough capacity, else a new
/// one.
fn spare_for(spare: &mut Vec<Vec<u8>>, spare_bytes: &mut usize, len: usize) -> Vec<u8> {
    match spare.iter().rposition(|v| v.capacity() >= len) {
        Some(i) => {
            let v = spare.swap_remove(i);
            *spare_bytes -= v.capacity();
            v
        }
        None => Vec::with_capacity(len),
    }
}

/// Both directions of one striped connection: what this side sends (kept until confirmed)
/// and what it receives (put back in order).
#[derive(Debug)]
pub struct Rails {
    cfg: RailsConfig,
    failed: Vec<bool>,
    // ----- sending
    /// Messages sent and not confirmed, oldest first; the first is message `confirmed`.
    out: VecDeque<Outgoing>,
    confirmed: u64,
    out_bytes: usize,
    /// Stripes to send, in (message, offset) order.
    queue: VecDeque<Stripe>,
    /// Per rail: stripes it carried that are not confirmed.
    carried: Vec<VecDeque<Stripe>>,
    // ----- receiving
    /// Messages handed to the application (the next one to hand over is this one).
    delivered: u64,
    /// Messages from `delivered` on; `None` where nothing of one arrived yet.
    pending: VecDeque<Option<Incoming>>,
    pending_bytes: usize,
    /// The confirmation last sent, and whether it may have been lost with a rail.
    ack_sent: u64,
    ack_lost: bool,
    /// The rail the next confirmation goes on: one that just brought a stripe of a message
    /// delivered already. The peer sends such a stripe again only when it lost a rail whose
    /// stripes it had not seen confirmed: our confirmations may be going down a rail that is
    /// dead on its side only (ours cannot tell yet), and this one works both ways.
    ack_rail: Option<usize>,
    /// An ACK stripe's bytes, as [`Rails::next_stripe`] lends them.
    ack_stripe: [u8; STRIPE_HEADER_LEN],
    /// Memory of confirmed and read messages, for the next ones: a fresh vector per message
    /// made the allocator hand pages back and fault them in again, most of a receiver's time
    /// at 64 KiB. At most a window's worth of capacity ([`Rails::keep_spare`]).
    spare: Vec<Vec<u8>>,
    spare_bytes: usize,
    bytes_since_ack: usize,
    counters: RailCounters,
}

impl Rails {
    /// A striped connection over `cfg.rails` rails, all up.
    ///
    /// # Errors
    /// [`ProtoError::BadParams`] for a configuration out of range.
    pub fn new(cfg: RailsConfig) -> Result<Rails, ProtoError> {
        cfg.check()?;
        Ok(Rails {
            cfg,
            failed: vec![false; cfg.rails],
            out: VecDeque::new(),
            confirmed: 0,
            out_bytes: 0,
            queue: VecDeque::new(),
            carried: (0..cfg.rails).map(|_| VecDeque::new()).collect(),
            delivered: 0,
            pending: VecDeque::new(),
            pending_bytes: 0,
            ack_sent: 0,
            ack_lost: false,
            ack_rail: None,
            ack_stripe: [0; STRIPE_HEADER_LEN],
            spare: Vec::new(),
            spare_bytes: 0,
            bytes_since_ack: 0,
            counters: RailCounters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RailsConfig {
        &self.cfg
    }

    /// Rails still up.
    pub fn live_rails(&self) -> usize {
        self.failed.iter().filter(|f| !**f).count()
    }

    /// Whether rail `rail` failed.
    pub fn is_failed(&self, rail: usize) -> bool {
        self.failed.get(rail).copied().unwrap_or(true)
    }

    /// What it has done.
    pub fn counters(&self) -> RailCounters {
        self.counters
    }

    // ----- sending ----------------------------------------------------------------------

    /// Takes a message to send (a copy, kept until the peer confirms it); gives its sequence
    /// number, or [`Step::Blocked`] while the window is full (confirmations open it).
    ///
    /// # Errors
    /// [`ProtoError::TooLarge`] over the agreed maximum (nothing changes);
    /// [`ProtoError::AllRailsFailed`] once no rail is up.
    pub fn send(&mut self, msg: &[u8]) -> Result<Step<u64>, ProtoError> {
        if self.live_rails() == 0 {
            return Err(ProtoError::AllRailsFailed);
        }
        if msg.len() > self.cfg.max_message as usize {
            return Err(ProtoError::TooLarge {
                len: msg.len(),
                max: self.cfg.max_message,
            });
        }
        let full = self.out_bytes + msg.len() > self.cfg.window || self.out.len() >= MAX_PENDING;
        if full && !self.out.is_empty() {
            return Ok(Step::Blocked);
        }
        let seq = self.confirmed + self.out.len() as u64;
        let stripe = self.cfg.stripe_size as usize;
        let stripes = msg.len().div_ceil(stripe).max(1);
        let mut bytes = spare_for(
            &mut self.spare,
            &mut self.spare_bytes,
            stripes * STRIPE_HEADER_LEN + msg.len(),
        );
        let mut offset = 0;
        loop {
            let len = (msg.len() - offset).min(stripe);
            self.queue.push_back(Stripe {
                seq,
                offset: offset as u32,
                len: len as u32,
            });
            bytes.extend_from_slice(&[0; STRIPE_HEADER_LEN]);
            bytes.extend_from_slice(&msg[offset..offset + len]);
            offset += len;
            if offset >= msg.len() {
                break;
            }
        }
        self.out_bytes += msg.len();
        self.out.push_back(Outgoing {
            bytes,
            len: msg.len(),
        });
        Ok(Step::Done(seq))
    }

    /// Whether a rail should be asked for a stripe: data waits, or a confirmation is due.
    pub fn wants_to_send(&self) -> bool {
        !self.queue.is_empty() || self.ack_due()
    }

    /// Messages sent and not confirmed yet.
    pub fn unconfirmed(&self) -> usize {
        self.out.len()
    }

    /// The next rail message for rail `rail`, which has room for one: the next stripe of
    /// data (its 32-byte header, then its bytes), or a confirmation when one is due and no
    /// data waits; `None` when nothing is due or the rail failed. The stripe counts as
    /// carried by that rail from now on.
    pub fn next_stripe(&mut self, rail: usize) -> Option<&[u8]> {
        if self.is_failed(rail) {
            return None;
        }
        let Some(s) = self.queue.pop_front() else {
            if !self.ack_due() || !self.may_confirm_on(rail) {
                return None;
            }
            self.counters.acks_sent += 1;
            self.ack_stripe = self.header_with_ack(
                rail,
                StripeHeader {
                    data: false,
                    offset: 0,
                    seq: 0,
                    ack: 0,
                    total: 0,
                    len: 0,
                },
            );
            return Some(&self.ack_stripe);
        };
        self.carried[rail].push_back(s);
        let total = self.out[(s.seq - self.confirmed) as usize].len;
        let header = self.header_with_ack(
            rail,
            StripeHeader {
                data: true,
                offset: s.offset,
                seq: s.seq,
                ack: 0,
                total: total as u32,
                len: s.len,
            },
        );
        let at = (s.offset / self.cfg.stripe_size) as usize
            * (STRIPE_HEADER_LEN + self.cfg.stripe_size as usize);
        let msg = &mut self.out[(s.seq - self.confirmed) as usize];
        let end = at + STRIPE_HEADER_LEN + s.len as usize;
        msg.bytes[at..at + STRIPE_HEADER_LEN].copy_from_slice(&header);
        Some(&msg.bytes[at..end])
    }

    /// Whether a confirmation may go on `rail`: any rail, unless one is chosen (and up).
    fn may_confirm_on(&self, rail: usize) -> bool {
        self.ack_rail
            .map_or(true, |r| r == rail || self.is_failed(r))
    }

    /// `h` with the latest confirmation. It counts as sent only on a rail that may carry it
    /// ([`Rails::may_confirm_on`]); elsewhere it rides along, and a confirmation stays due.
    fn header_with_ack(&mut self, rail: usize, mut h: StripeHeader) -> [u8; STRIPE_HEADER_LEN] {
        h.ack = self.delivered;
        if self.may_confirm_on(rail) {
            self.ack_sent = self.delivered;
            self.ack_lost = false;
            self.ack_rail = None;
            self.bytes_since_ack = 0;
        }
        h.encode()
    }

    /// Rail `rail` failed: what it carried that is not confirmed goes again on the others.
    ///
    /// # Errors
    /// [`ProtoError::AllRailsFailed`] when it was the last rail up.
    pub fn rail_failed(&mut self, rail: usize) -> Result<(), ProtoError> {
        self.rail_down(rail, true)
    }

    /// The peer closed rail `rail` (an orderly end, not counted as a failure): as
    /// [`Rails::rail_failed`], what it carried that is not confirmed goes again on the others.
    ///
    /// # Errors
    /// [`ProtoError::AllRailsFailed`] when it was the last rail up.
    pub fn rail_closed(&mut self, rail: usize) -> Result<(), ProtoError> {
        self.rail_down(rail, false)
    }

    fn rail_down(&mut self, rail: usize, failed: bool) -> Result<(), ProtoError> {
        if rail >= self.failed.len() {
            return Ok(());
        }
        if !self.failed[rail] {
            self.failed[rail] = true;
            self.counters.rails_failed += u32::from(failed);
            let lost = std::mem::take(&mut self.carried[rail]);
            self.counters.stripes_resent += lost.len() as u64;
            if !lost.is_empty() {
                let mut all: Vec<Stripe> = self.queue.drain(..).chain(lost).collect();
                all.sort_unstable();
                self.queue = all.into();
            }
            // A confirmation it carried may be lost with it.
            self.ack_lost = true;
        }
        if self.live_rails() == 0 {
            return Err(ProtoError::AllRailsFailed);
        }
        Ok(())
    }

    fn handle_ack(&mut self, ack: u64) -> Result<(), ProtoError> {
        // Confirmations ride on every rail: an older one may come after a newer one.
        if ack <= self.confirmed {
            return Ok(());
        }
        let sent = self.confirmed + self.out.len() as u64;
        if ack > sent {
            return Err(ProtoError::BadStripe {
                reason: "it confirms a message never sent",
            });
        }
        while self.confirmed < ack {
            if let Some(m) = self.out.pop_front() {
                self.out_bytes -= m.len;
                self.keep_spare(m.bytes);
            }
            self.confirmed += 1;
        }
        for c in &mut self.carried {
            c.retain(|s| s.seq >= ack);
        }
        // Stripes queued again after a failure whose message arrived after all (the rail
        // delivered them before it died). The queue is in message order.
        while self.queue.front().is_some_and(|s| s.seq < ack) {
            self.queue.pop_front();
        }
        Ok(())
    }

    // ----- receiving --------------------------------------------------------------------

    fn ack_due(&self) -> bool {
        if self.delivered == self.ack_sent {
            return self.ack_lost && self.delivered > 0;
        }
        let caught_up = !self
            .pending
            .front()
            .is_some_and(|m| m.as_ref().is_some_and(Incoming::complete));
        caught_up
            || self.ack_lost
            || self.delivered - self.ack_sent >= ACK_EVERY
            || self.bytes_since_ack >= self.cfg.window / 4
    }

    /// A rail message that arrived on rail `rail` (stripes are not bound to one; the rail
    /// only says where a confirmation goes again when a stripe comes twice).
    ///
    /// # Errors
    /// [`ProtoError::BadStripe`] for a stripe that breaks the format or the agreement; the
    /// connection should then fail.
    pub fn handle_stripe(&mut self, rail: usize, msg: &[u8]) -> Result<(), ProtoError> {
        let h = StripeHeader::decode(msg)?;
        self.handle_ack(h.ack)?;
        if !h.data {
            return Ok(());
        }
        let bad = |reason| Err(ProtoError::BadStripe { reason });
        if h.total > self.cfg.max_message {
            return bad("its message is over the agreed maximum");
        }
        if u64::from(h.offset) + u64::from(h.len) > u64::from(h.total) {
            return bad("it reaches past its message's end");
        }
        if h.len == 0 && h.total != 0 {
            return bad("an empty stripe of a message that is not empty");
        }
        if h.seq < self.delivered {
            // Sent again, so the peer has not seen it confirmed: confirm again, on the rail
            // it came by.
            self.counters.stripes_duplicate += 1;
            self.ack_lost = true;
            self.ack_rail = (rail < self.failed.len()).then_some(rail);
            return Ok(());
        }
        let idx = h.seq - self.delivered;
        if idx >= MAX_PENDING as u64 {
            return bad("its message is too far ahead");
        }
        let idx = idx as usize;
        while self.pending.len() <= idx {
            self.pending.push_back(None);
        }
        let limit = self.cfg.window + self.cfg.max_message as usize;
        let entry = &mut self.pending[idx];
        let fresh = entry.is_none();
        let m = match entry {
            Some(m) => {
                if m.data.len() != h.total as usize {
                    return bad("its message's length differs from an earlier stripe's");
                }
                m
            }
            None => {
                if self.pending_bytes + h.total as usize > limit {
                    return bad("more bytes ahead of the application than the window");
                }
                self.pending_bytes += h.total as usize;
                let data = &msg[STRIPE_HEADER_LEN..];
                if h.offset == 0 && h.len == h.total {
                    // A whole message in one stripe (the common case): one copy, no zeroing.
                    let mut v = spare_for(&mut self.spare, &mut self.spare_bytes, data.len());
                    v.extend_from_slice(data);
                    *entry = Some(Incoming {
                        data: v,
                        have: vec![(0, h.total)],
                        got: h.total,
                    });
                    return Ok(());
                }
                let mut v = spare_for(&mut self.spare, &mut self.spare_bytes, h.total as usize);
                v.resize(h.total as usize, 0);
                entry.insert(Incoming {
                    data: v,
                    have: Vec::new(),
                    got: 0,
                })
            }
        };
        let data = &msg[STRIPE_HEADER_LEN..];
        if !fresh && m.complete() || m.land(h.offset, data) > 0 {
            self.counters.stripes_duplicate += 1;
        }
        Ok(())
    }

    /// The next message in order, once all of it arrived.
    pub fn recv(&mut self) -> Option<Vec<u8>> {
        if !self.pending.front()?.as_ref()?.complete() {
            return None;
        }
        let m = self.pending.pop_front()??;
        self.delivered += 1;
        self.pending_bytes -= m.data.len();
        self.bytes_since_ack += m.data.len();
        Some(m.data)
    }

    /// The next message in order, once all of it arrived, copied into `buf`: its length;
    /// `Ok(None)` when none is whole yet. Its memory serves later messages.
    ///
    /// # Errors
    /// [`ProtoError::ShortBuffer`] when `buf` is shorter than the message (which stays).
    pub fn recv_into(&mut self, buf: &mut [u8]) -> Result<Option<usize>, ProtoError> {
        let Some(Some(m)) = self.pending.front() else {
            return Ok(None);
        };
        if !m.complete() {
            return Ok(None);
        }
        let n = m.data.len();
        if buf.len() < n {
            return Err(ProtoError::ShortBuffer { needed: n });
        }
        let Some(data) = self.recv() else {
            return Ok(None);
        };
        buf[..n].copy_from_slice(&data);
        self.keep_spare(data);
        Ok(Some(n))
    }

    /// Keeps `v`'s memory for a later message, within a window's worth of capacity.
    fn keep_spare(&mut self, mut v: Vec<u8>) {
        if self.spare_bytes + v.capacity() <= self.cfg.window && self.spare.len() < 64 {
            v.clear();
            self.spare_bytes += v.capacity();
            self.spare.push(v);
        }
    }

    /// Whether stripes of a message not handed over yet are held (a message partly
    /// arrived, or whole behind one that did not): at the end of the stream, one was cut
    /// short.
    pub fn receiving(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Messages handed to the application so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }
}
