//! Credits as cumulative counters (quinn style), one per receive slot.
//!
//! Sender: `limit` is the cumulative number of frames the peer allowed (raised by every
//! header), `sent` the frames sent; `limit - sent` is the spendable credit. Receiver:
//! `grant` = slots + every repost the driver has taken (`Conn::poll_work`: a receive it has
//! not taken yet is not posted, so no header may announce it), `announced` = the grant last
//! written into a header,
//! `received` = frames that arrived. The wire carries `grant mod 2^32`; the sender rebuilds
//! the full value from the delta, which can never exceed the peer's slot count.

use crate::error::ProtoError;

#[derive(Debug)]
pub(crate) struct TxCredit {
    pub(crate) limit: u64,
    pub(crate) sent: u64,
    pub(crate) peer_slots: u64,
}

impl TxCredit {
    pub(crate) fn new(peer_slots: u16) -> Self {
        Self {
            limit: u64::from(peer_slots),
            sent: 0,
            peer_slots: u64::from(peer_slots),
        }
    }

    pub(crate) fn available(&self) -> u64 {
        self.limit - self.sent
    }

    /// Applies a header's credit field.
    #[inline]
    pub(crate) fn update(&mut self, wire: u32) -> Result<(), ProtoError> {
        let delta = u64::from(wire.wrapping_sub(self.limit as u32));
        if delta > self.peer_slots {
            return Err(ProtoError::CreditOverrun {
                reason: "credit limit moved back or by more than the peer's slots",
            });
        }
        if self.limit + delta - self.sent > self.peer_slots {
            return Err(ProtoError::CreditOverrun {
                reason: "credit limit above the peer's receive slots",
            });
        }
        self.limit += delta;
        Ok(())
    }
}

#[derive(Debug)]
pub(crate) struct RxCredit {
    pub(crate) grant: u64,
    pub(crate) announced: u64,
    pub(crate) received: u64,
}

impl RxCredit {
    pub(crate) fn new(slots: u16) -> Self {
        Self {
            grant: u64::from(slots),
            announced: u64::from(slots),
            received: 0,
        }
    }

    pub(crate) fn unannounced(&self) -> u64 {
        self.grant - self.announced
    }

    /// The most the peer can still send (its true credit is lower by what is in flight).
    pub(crate) fn peer_view(&self) -> u64 {
        self.announced - self.received
    }

    /// A frame arrived; returns the peer's credit as seen just before it.
    #[inline]
    pub(crate) fn arrive(&mut self) -> Result<u64, ProtoError> {
        let view = self.peer_view();
        if view == 0 {
            return Err(ProtoError::CreditOverrun {
                reason: "a frame beyond the announced limit",
            });
        }
        self.received += 1;
        Ok(view)
    }

    /// The value for the next header; the peer will know everything granted so far.
    #[inline]
    pub(crate) fn announce(&mut self) -> u32 {
        self.announced = self.grant;
        self.grant as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_value_wraps_and_overruns_are_refused() {
        let mut c = TxCredit::new(32);
        c.limit = u64::from(u32::MAX) - 3;
        c.sent = c.limit - 32;
        c.sent += 10;
        c.update(5).unwrap(); // wrapped past 2^32: delta 9
        assert_eq!(c.available(), 31);
        assert!(c.update(7).is_err(), "33 spendable credits from 32 slots");
        assert!(c.update(4).is_err(), "limit moved back");
    }
}
