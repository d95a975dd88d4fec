//! A shared receive queue: one queue of receives that several queue pairs take from, in
//! posting order, and its limit event.

use crate::qp::PostError;
use crate::wr::RecvWr;
use std::collections::VecDeque;

/// A shared receive queue. The queue pairs attached to it take their receives from it (the
/// device passes it to [`crate::RcQp::handle_packet`] for them).
#[derive(Debug)]
pub struct Srq {
    handle: u32,
    max_wr: u32,
    queue: VecDeque<RecvWr>,
    /// The armed limit (0: disarmed).
    limit: u32,
    /// The limit was crossed and the event not taken yet.
    limit_reached: bool,
}

impl Srq {
    /// An empty SRQ holding up to `max_wr` receives, named `handle` in its events.
    pub fn new(handle: u32, max_wr: u32) -> Srq {
        Srq {
            handle,
            max_wr,
            queue: VecDeque::new(),
            limit: 0,
            limit_reached: false,
        }
    }

    /// Its handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Receives queued now.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no receive is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues a receive.
    ///
    /// # Errors
    /// [`PostError::Full`].
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.queue.len() >= self.max_wr as usize {
            return Err(PostError::Full);
        }
        self.queue.push_back(wr);
        Ok(())
    }

    /// Arms the limit: once fewer than `limit` receives are queued, one limit event
    /// ([`Srq::poll_limit_event`]) and the limit disarms.
    ///
    /// # Errors
    /// [`PostError::Invalid`] for 0 or a limit not below the SRQ's size.
    pub fn arm_limit(&mut self, limit: u32) -> Result<(), PostError> {
        if limit == 0 || limit >= self.max_wr {
            return Err(PostError::Invalid("an SRQ limit between 1 and max_wr - 1"));
        }
        self.limit = limit;
        Ok(())
    }

    /// Whether the limit was crossed since the last call (the event, taken).
    pub fn poll_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }

    /// The oldest receive, left queued.
    pub(crate) fn front(&self) -> Option<&RecvWr> {
        self.queue.front()
    }

    /// Takes the oldest receive (for a queue pair attached to it).
    pub(crate) fn take(&mut self) -> Option<RecvWr> {
        let r = self.queue.pop_front()?;
        if self.limit != 0 && (self.queue.len() as u32) < self.limit {
            self.limit = 0;
            self.limit_reached = true;
        }
        Some(r)
    }
}
