//! soft0 holds back the acknowledgement of a request that a busy-polling application takes
//! from a shared ring, for its next request to carry (a ping-pong then sends one packet per
//! message). A peer that stops polling right after, with no CQ armed and nothing to send,
//! must still let the request complete: its ring's reader, which naps while the application
//! polls, sends what is held when it wakes (within 1 ms), not when the application next polls
//! or exits.

mod soft_peer;

use rsrdma::{AccessFlags, Mr, SendWr};
use soft_peer::{child_ready, end_child, parent_end, poll_len, spawn_child};
use std::time::{Duration, Instant};

/// How long the child stops polling.
const QUIET: Duration = Duration::from_secs(3);

/// The child of `a_peer_that_stops_polling_still_lets_the_request_complete`: takes one
/// message by busy polling, stops polling for [`QUIET`] (no CQ armed), then takes the last
/// one.
#[test]
#[ignore = "runs as the child process of a_peer_that_stops_polling_still_lets_the_request_complete"]
fn quiet_child() {
    let (e, _mr) = child_ready();
    assert_eq!(poll_len(&e.cq), 8);
    std::thread::sleep(QUIET);
    assert_eq!(poll_len(&e.cq), 0);
}

#[test]
fn a_peer_that_stops_polling_still_lets_the_request_complete() {
    let (mut child, mut lines) = spawn_child("quiet_child");
    let e = parent_end(&mut child, &mut lines);
    lines.next_with("READY");
    // The child busy-polls meanwhile: its ring's reader, once its first sleep ends (at most
    // 100 ms: it slept before the child polled), naps.
    std::thread::sleep(Duration::from_millis(300));
    let mr = Mr::new(&e.pd, 8, AccessFlags::NONE).unwrap();
    let sge = [mr.sge(0, 8).unwrap()];
    let sent = Instant::now();
    // SAFETY: `mr` outlives the request, which completes below.
    unsafe {
        e.qp.post_send(&SendWr::send(1, &sge).signaled(true))
            .unwrap()
    };
    assert_eq!(poll_len(&e.cq), 0, "the send completes");
    let took = sent.elapsed();
    end_child(&e, &mut child);
    assert!(
        took < Duration::from_millis(500),
        "the send completed after {took:?}: its acknowledgement waited for the peer's next poll"
    );
}
