//! Lent (zero-copy) messages over the simulated link: the receiver gets exactly the bytes of
//! the lent memory, in order with copied and rendezvous messages, and the sender's memory is
//! released only after the NIC read it (the sim asserts lent memory is still registered when
//! each SEND is transmitted).

mod util;

use rsrdma_proto::{Config, ProtoError, FEATURE_RENDEZVOUS};
use util::{payload, Checker, Pair};

fn cfg() -> Config {
    Config::default()
        .with_slot_size(256)
        .with_recv_slots(8)
        .with_send_slots(6)
        .with_sq_depth(8)
        .with_signal_interval(4)
        .with_inline_size(64)
        .with_max_message(64 * 1024)
        .with_rdv_threshold(4000)
        .with_features(FEATURE_RENDEZVOUS)
}

/// Message `i` goes lent when `lent(i)`, else by `send_any` (copied or rendezvous).
fn transfer(p: &mut Pair, lens: &[usize], lent: impl Fn(usize) -> bool) -> Checker {
    let mut chk = Checker::default();
    let mut next = 0;
    for _ in 0..200_000 {
        if next < lens.len() {
            let data = payload(next as u64, lens[next]);
            let r = if lent(next) {
                p.sides[0].send_lent(&data).map(|_| ())
            } else {
                p.sides[0].send_any(&data)
            };
            if r.is_ok() {
                chk.lens.push(lens[next]);
                next += 1;
            }
        }
        p.pump(0);
        loop {
            match p.sides[1].recv_any() {
                Ok(Some(m)) => chk.on_msg(&m),
                Ok(None) | Err(ProtoError::WouldBlock) => break,
                Err(e) => panic!("{e}"),
            }
        }
        p.pump(1);
        p.sides[0].release();
        if !p.step() && next == lens.len() && chk.all_taken() {
            return chk;
        }
    }
    panic!(
        "no progress: {next} of {} sent, {} taken",
        lens.len(),
        chk.done()
    );
}

#[test]
fn lent_messages_of_every_shape_arrive_whole_and_in_order() {
    let mut p = Pair::new(cfg(), cfg());
    // 240 payload bytes per frame.
    let lens = [0, 1, 239, 240, 241, 480, 481, 3000, 5000, 0, 64, 2000];
    transfer(&mut p, &lens, |_| true);
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
    transfer(&mut p, &lens, |i| i % 2 == 0);
    assert!(p.sides[0].lent_sends.is_empty() && p.sides[0].rdv_sends.is_empty());
}

#[test]
fn lent_memory_is_held_while_completions_are_delayed() {
    let mut p = Pair::new(cfg(), cfg());
    p.delay_completions = true;
    p.sides[0].send_lent(&payload(0, 1000)).unwrap();
    p.pump(0);
    while p.deliver(0) {}
    p.sides[0].release();
    assert_eq!(p.sides[0].lent_sends.len(), 1, "no completion reaped yet");
    while p.complete(0) {}
    p.sides[0].release();
    assert!(p.sides[0].lent_sends.is_empty());
}
