//! Lent (zero-copy) messages over the simulated link: the receiver gets exactly the bytes of
//! the lent memory, in order with copied and rendezvous messages, and the sender's memory is
//! released only after the NIC read it (the sim asserts lent memory is still registered when
//! each SEND is transmitted).

mod util;

use rsrdma_proto::{Config, FEATURE_RENDEZVOUS};
use util::{done, payload, small_config, transfer_lent_or_any, Pair};

fn cfg() -> Config {
    small_config()
        .with_rdv_threshold(4000)
        .with_features(FEATURE_RENDEZVOUS)
}

#[test]
fn lent_messages_of_every_shape_arrive_whole_and_in_order() {
    let mut p = Pair::new(cfg(), cfg());
    // 240 payload bytes per frame.
    let lens = [0, 1, 239, 240, 241, 480, 481, 3000, 5000, 0, 64, 2000];
    transfer_lent_or_any(&mut p, &lens, |_| true);
    assert_eq!(p.sides[0].conn.counters().send_copied_bytes, 0);
    assert!(
        p.sides[0].lent_sends.is_empty(),
        "every lent message released"
    );
}

#[test]
fn lent_copied_and_rendezvous_messages_interleave() {
    let mut p = Pair::new(cfg(), cfg());
    let lens = [700, 10, 5000, 1500, 3999, 4000, 1, 241];
    transfer_lent_or_any(&mut p, &lens, |i| i % 2 == 0);
    assert!(p.sides[0].lent_sends.is_empty() && p.sides[0].rdv_sends.is_empty());
}

#[test]
fn lent_memory_is_held_while_completions_are_delayed() {
    let mut p = Pair::new(cfg(), cfg());
    p.delay_completions = true;
    done(p.sides[0].send_lent(&payload(0, 1000)));
    p.pump(0);
    while p.deliver(0) {}
    p.sides[0].release();
    assert_eq!(p.sides[0].lent_sends.len(), 1, "no completion reaped yet");
    while p.complete(0) {}
    p.sides[0].release();
    assert!(p.sides[0].lent_sends.is_empty());
}
