//! Fault injection on the software device `soft0`, for tests: what a real fabric does
//! rarely and at random, on purpose and at once, so that a program's timeout, error, close
//! and peer-death paths can be reached quickly and deterministically. Every function names a
//! queue pair of soft0 in this process by its number ([`crate::Qp::qp_num`]; rsrdma-net's
//! `ConnInfo::local_qpn`) and fails with [`Error::InvalidArgument`] for any other.
//!
//! A peer process that vanishes is had by killing it: soft0 then breaks the links of the
//! queue pairs that talked to it (`RETRY_EXC_ERR`), as a NIC's retries would run out.

use crate::error::{Error, Result};
use std::time::Duration;

fn done(ok: bool, qp_num: u32, what: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "soft0 fault injection: no {what}queue pair numbered {qp_num} in this process"
        )))
    }
}

/// The queue pair fails as on a fatal error: it moves to ERROR, every request it holds
/// completes with `WR_FLUSH_ERR`, and its context reports `IBV_EVENT_QP_FATAL`
/// ([`crate::Context::read_async_event`]). The peer learns nothing (its own requests then
/// go unanswered).
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn fail_qp(qp_num: u32) -> Result<()> {
    done(super::verbs::fail_qp(qp_num), qp_num, "")
}

/// The queue pair loses its peer, as when the peer's host dies or its cable is pulled: the
/// oldest request waiting for an answer completes with `RETRY_EXC_ERR` and the queue pair
/// fails (the rest flush). UC and UD queue pairs wait for no answer and never notice.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn cut_link(qp_num: u32) -> Result<()> {
    done(super::verbs::cut_link(qp_num), qp_num, "")
}

/// The next `count` requests that need a receive at this queue pair (SEND, WRITE with
/// immediate data) find none, as if the application had not posted one in time: a
/// reliable-connected responder answers RNR NAK, so the requester waits out the RNR timer
/// and retries, up to its `rnr_retry` (then `RNR_RETRY_EXC_ERR`); an unreliable-connected
/// one drops the message.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such connected queue pair.
pub fn refuse_receives(qp_num: u32, count: u32) -> Result<()> {
    done(
        super::verbs::refuse_receives(qp_num, count),
        qp_num,
        "connected ",
    )
}

/// The queue pair's completions reach its completion queues only `delay` after they
/// happened (in their order), so completions of other queue pairs overtake them, and a
/// waiter sees them late. `Duration::ZERO` ends it.
///
/// # Errors
/// [`Error::InvalidArgument`] when soft0 has no such queue pair.
pub fn delay_completions(qp_num: u32, delay: Duration) -> Result<()> {
    done(super::verbs::delay_completions(qp_num, delay), qp_num, "")
}
