//! Two cores over the simulated RC link: deterministic scenarios.

mod util;

use rsrdma_proto::{Event, FrameType, ProtoError, Recv, Step};
use std::time::Duration;
use util::{payload, small_config, Checker, Pair};

/// Sends `msgs` from side `from` as fast as the link allows, reading on the other side with
/// `recv_msg`; returns the checker of the receiving side.
fn transfer(p: &mut Pair, from: usize, lens: &[usize]) -> Checker {
    let to = 1 - from;
    let mut chk = Checker::default();
    let mut next = 0;
    for _ in 0..100_000 {
        if next < lens.len()
            && p.sides[from]
                .conn
                .send_msg(&payload(next as u64, lens[next]))
                == Ok(Step::Done(()))
        {
            chk.lens.push(lens[next]);
            next += 1;
            p.pump(from);
        }
        while let Ok(Recv::Data(m)) = p.sides[to].conn.recv_msg() {
            chk.on_msg(&m);
        }
        p.pump(to);
        if !p.step() && next == lens.len() && chk.all_taken() {
            return chk;
        }
    }
    panic!(
        "no progress: {} of {} sent, {} taken",
        next,
        lens.len(),
        chk.done()
    );
}

#[test]
fn a_message_larger_than_the_ring_gets_through() {
    let mut p = Pair::new(small_config(), small_config());
    let chk = transfer(&mut p, 0, &[40_000, 0, 1, 240, 241, 64 * 1024]);
    assert!(chk.all_taken());
    p.check_conservation();
}

#[test]
fn peers_with_different_slot_sizes_settle_on_the_smaller() {
    let big = small_config().with_slot_size(4096).with_recv_slots(16);
    let mut p = Pair::new(small_config(), big);
    assert_eq!(p.sides[1].conn.settled().frame_size, 256);
    transfer(&mut p, 1, &[5000, 3, 4000]);
    transfer(&mut p, 0, &[5000, 3, 4000]);
}

#[test]
fn both_directions_at_once_with_delayed_completions() {
    let mut p = Pair::new(small_config(), small_config());
    p.delay_completions = true;
    let lens: Vec<usize> = (0..60).map(|i| (i * 97) % 900).collect();
    let mut chk = [Checker::default(), Checker::default()];
    let mut next = [0usize; 2];
    for round in 0..200_000 {
        for i in 0..2 {
            if next[i] < lens.len()
                && p.sides[i]
                    .conn
                    .send_msg(&payload(next[i] as u64, lens[next[i]]))
                    == Ok(Step::Done(()))
            {
                chk[1 - i].lens.push(lens[next[i]]);
                next[i] += 1;
                p.pump(i);
            }
            while let Ok(Recv::Data(m)) = p.sides[1 - i].conn.recv_msg() {
                chk[1 - i].on_msg(&m);
            }
            p.pump(1 - i);
        }
        // Completions only every few rounds: the sender must wait for them, never overflow.
        let progressed = p.deliver(round % 2) | p.deliver(1 - round % 2);
        if round % 7 == 0 || !progressed {
            p.complete(0);
            p.complete(1);
        }
        if next == [lens.len(); 2] && chk.iter().all(Checker::all_taken) {
            return;
        }
    }
    panic!(
        "stalled: sent {next:?}, taken {} / {}",
        chk[0].done(),
        chk[1].done()
    );
}

#[test]
fn a_reader_that_stops_stalls_the_sender_but_not_the_connection() {
    let mut p = Pair::new(small_config(), small_config());
    let mut sent = 0;
    while p.sides[0].conn.send_msg(&payload(sent, 1000)) == Ok(Step::Done(())) {
        sent += 1;
        p.pump(0);
        assert!(p.drive(10_000));
    }
    assert!(sent >= 2, "the first messages go");
    // B does not read for a minute: keepalive keeps both alive, nothing is lost.
    for _ in 0..600 {
        p.advance(Duration::from_millis(100));
        assert!(p.drive(10_000));
    }
    assert!(
        !p.sides[0].failed() && !p.sides[1].failed(),
        "{:?}",
        p.sides[0].conn.error()
    );
    assert!(p.sides[0].frames_posted.contains(&FrameType::Ping));
    assert!(p.sides[1].frames_posted.contains(&FrameType::Pong));
    let mut chk = Checker::default();
    chk.lens = vec![1000; sent as usize];
    while let Ok(Recv::Data(m)) = p.sides[1].conn.recv_msg() {
        chk.on_msg(&m);
        p.pump(1);
        assert!(p.drive(10_000));
    }
    assert!(chk.all_taken());
    assert!(p.sides[0].conn.can_send());
    p.check_conservation();
}

#[test]
fn graceful_close_both_ways_reaches_eof_and_drains() {
    let mut p = Pair::new(small_config(), small_config());
    let chk = transfer(&mut p, 0, &[10, 2000, 0]);
    assert!(chk.all_taken());
    p.sides[0].conn.close().unwrap();
    p.pump(0);
    assert!(p.drive(1000));
    assert!(p.sides[1].events.contains(&Event::PeerClosed));
    assert_eq!(p.sides[1].conn.recv_msg(), Ok(Recv::Eof), "EOF");
    assert!(p.sides[0].conn.is_drained(), "A's FIN completed");
    // B may still send after A's FIN: A discards it but returns the credit.
    transfer_discarded(&mut p);
    p.sides[1].conn.shutdown_write().unwrap();
    p.pump(1);
    assert!(p.drive(1000));
    assert!(p.sides[1].conn.is_drained());
    assert!(p.sides[0].conn.peer_closed());
    assert_eq!(
        p.sides[0].conn.poll_timeout(),
        None,
        "both closed: no timers"
    );
}

fn transfer_discarded(p: &mut Pair) {
    for i in 0..20 {
        loop {
            if p.sides[1].conn.send_msg(&payload(i, 700)) == Ok(Step::Done(())) {
                break;
            }
            assert!(p.step(), "B blocked forever on a closed peer");
        }
        p.pump(1);
    }
    assert!(p.drive(10_000));
}

#[test]
fn a_held_direction_makes_the_other_side_declare_the_peer_dead() {
    let mut p = Pair::new(small_config(), small_config());
    p.hold[1] = true; // nothing from B reaches A
    for _ in 0..60 {
        p.advance(Duration::from_millis(100));
        assert!(p.drive(1000));
    }
    assert!(p.sides[0].failed());
    assert!(matches!(
        p.sides[0].conn.error(),
        Some(ProtoError::PeerDead { .. })
    ));
    assert_eq!(p.sides[0].posted_after_failure, [FrameType::Abort]);
    assert_eq!(
        p.sides[1].conn.error(),
        Some(&ProtoError::PeerAborted { code: 6 })
    );
    assert_eq!(p.sides[1].posted_after_failure, [], "no answer to an ABORT");
}

#[test]
fn a_broken_qp_mid_transfer_fails_both_sides_cleanly() {
    for k in [0, 3, 17, 60] {
        let mut p = Pair::new(small_config(), small_config());
        for i in 0..10 {
            let _ = p.sides[0].conn.send_msg(&payload(i, 900));
            p.pump(0);
            let _ = p.sides[1].conn.send_msg(&payload(i, 300));
            p.pump(1);
        }
        for _ in 0..k {
            p.step();
        }
        p.break_qp(0);
        for _ in 0..100 {
            p.advance(Duration::from_millis(100));
            assert!(p.drive(10_000));
        }
        assert!(p.sides[1].failed(), "k={k}: the survivor notices");
        assert!(p.sides[1].posted_after_failure.len() <= 1);
        assert!(p.sides[1]
            .posted_after_failure
            .iter()
            .all(|f| *f == FrameType::Abort));
        assert!(p.sides[0].posted_after_failure.is_empty());
    }
}
