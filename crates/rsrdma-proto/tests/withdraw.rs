//! Withdrawal over the simulated link: a sender asks back a rendezvous message whose RTS is
//! out (WITHDRAW); the receiver drops it if no read of it began (WITHDRAWN), or lets its read
//! finish (DONE). Either way the sender's memory is released exactly once, and the receiver
//! reads every other message, in order.

mod util;

use rsrdma_proto::{settle, Config, FrameType, Recv, FEATURE_RENDEZVOUS, FEATURE_WITHDRAW};
use util::{done, payload, small_config, Pair};

const THRESHOLD: u32 = 1000;

fn cfg(features: u32) -> Config {
    small_config()
        .with_rdv_threshold(THRESHOLD)
        .with_features(features)
}

fn both() -> Config {
    cfg(FEATURE_RENDEZVOUS | FEATURE_WITHDRAW)
}

/// Side 0 sends `lens` (rendezvous at and above the threshold) and returns the message
/// numbers of its rendezvous sends, in order; nothing is delivered yet.
fn send_all(p: &mut Pair, lens: &[usize]) -> Vec<u64> {
    for (i, &len) in lens.iter().enumerate() {
        done(p.sides[0].send_any(&payload(i as u64, len)));
        p.pump(0);
    }
    p.sides[0].rdv_sends.iter().map(|&(m, _)| m).collect()
}

/// Side 1 reads until idle; returns the payloads read.
fn read_all(p: &mut Pair) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    for _ in 0..10_000 {
        assert!(p.drive(100_000), "livelock");
        match p.sides[1].recv_any() {
            Ok(Recv::Data(m)) => got.push(m),
            Ok(Recv::Blocked) if p.sides[1].read_key.is_some() => {}
            Ok(Recv::Blocked) => {
                p.pump(1);
                if !p.step() {
                    break;
                }
            }
            other => panic!("read: {other:?}"),
        }
        p.pump(1);
        p.sides[0].release();
    }
    got
}

fn frames(p: &Pair, side: usize, kind: FrameType) -> usize {
    p.sides[side]
        .frames_posted
        .iter()
        .filter(|&&f| f == kind)
        .count()
}

#[test]
fn withdrawal_settles_only_with_rendezvous_on_both_ends() {
    let s = |a: u32, b: u32| settle(&cfg(a).params(), &cfg(b).params()).unwrap();
    assert!(s(
        FEATURE_RENDEZVOUS | FEATURE_WITHDRAW,
        FEATURE_RENDEZVOUS | FEATURE_WITHDRAW
    )
    .withdraw());
    assert!(!s(FEATURE_RENDEZVOUS | FEATURE_WITHDRAW, FEATURE_RENDEZVOUS).withdraw());
    // Nothing to withdraw without RTSs: the bit does not settle alone.
    assert!(!s(FEATURE_WITHDRAW, FEATURE_WITHDRAW).withdraw());
    let mut p = Pair::new(both(), cfg(FEATURE_RENDEZVOUS));
    let msgs = send_all(&mut p, &[2000]);
    assert!(!p.sides[0].conn.ask_withdraw(msgs[0]), "not settled");
    assert_eq!(frames(&p, 0, FrameType::Withdraw), 0);
}

#[test]
fn an_unread_message_asked_back_is_dropped_and_the_rest_is_read_in_order() {
    for windows in [false, true] {
        let mut p = Pair::new(both(), both());
        p.sides[0].use_windows = windows;
        let lens = [2000, 50, 3000];
        let msgs = send_all(&mut p, &lens);
        assert!(p.drive(100_000));
        assert!(!p.sides[0].conn.rendezvous_released(msgs[0]));
        assert!(p.sides[0].conn.ask_withdraw(msgs[0]));
        assert!(p.sides[0].conn.ask_withdraw(msgs[0]), "asked twice");
        p.pump(0);
        assert!(p.drive(100_000));
        p.sides[0].release();
        assert!(p.sides[0].conn.rendezvous_released(msgs[0]));
        assert!(p.sides[0].conn.take_withdrawn(msgs[0]));
        assert!(!p.sides[0].conn.take_withdrawn(msgs[0]), "taken once");
        assert_eq!(frames(&p, 0, FrameType::Withdraw), 1, "one WITHDRAW");
        assert_eq!(frames(&p, 1, FrameType::Withdrawn), 1);
        if windows {
            // `release` asserts no window still exposed the memory when it went.
            assert_eq!(p.sides[0].windows_invalidated, 1);
        }
        let got = read_all(&mut p);
        assert_eq!(
            got,
            vec![payload(1, 50), payload(2, 3000)],
            "windows {windows}"
        );
        assert!(p.sides[0].conn.rendezvous_released(msgs[1]));
        assert!(
            !p.sides[0].conn.take_withdrawn(msgs[1]),
            "read, not withdrawn"
        );
        assert!(p.sides[0].rdv_sends.is_empty(), "memory released");
        assert_eq!(
            p.sides[1].reads_posted, 1,
            "the withdrawn message was never read"
        );
        // The connection goes on: both close cleanly.
        for side in 0..2 {
            p.sides[side].conn.close().unwrap();
            p.pump(side);
        }
        assert!(p.drive(100_000));
        assert!(p.sides[0].conn.is_drained() && p.sides[1].conn.is_drained());
    }
}

#[test]
fn a_message_whose_read_began_is_read_whole_and_its_done_answers() {
    let mut p = Pair::new(both(), both());
    let msgs = send_all(&mut p, &[2000]);
    while p.deliver(0) {}
    // The receiver's read starts: its READ is on the wire, not done.
    assert_eq!(p.sides[1].recv_any(), Ok(Recv::Blocked));
    p.pump(1);
    assert!(p.sides[1].read_key.is_some());
    assert!(p.sides[0].conn.ask_withdraw(msgs[0]));
    p.pump(0);
    assert!(p.deliver(0), "the WITHDRAW reaches the reader mid-READ");
    let got = read_all(&mut p);
    assert_eq!(got, vec![payload(0, 2000)]);
    p.sides[0].release();
    assert!(p.sides[0].conn.rendezvous_released(msgs[0]));
    assert!(!p.sides[0].conn.take_withdrawn(msgs[0]), "read whole");
    assert_eq!(frames(&p, 1, FrameType::Withdrawn), 0);
}

#[test]
fn a_later_message_asked_back_overtakes_the_done_of_an_earlier_one() {
    let mut p = Pair::new(both(), both());
    let msgs = send_all(&mut p, &[2000, 2500, 10]);
    assert!(p.drive(100_000));
    assert!(p.sides[0].conn.ask_withdraw(msgs[1]));
    p.pump(0);
    assert!(p.drive(100_000));
    p.sides[0].release();
    assert!(p.sides[0].conn.rendezvous_released(msgs[1]));
    assert!(
        !p.sides[0].conn.rendezvous_released(msgs[0]),
        "still offered"
    );
    let got = read_all(&mut p);
    assert_eq!(got, vec![payload(0, 2000), payload(2, 10)]);
    assert!(p.sides[0].conn.take_withdrawn(msgs[1]));
    assert!(!p.sides[0].conn.take_withdrawn(msgs[0]));
    assert!(p.sides[0].rdv_sends.is_empty());
}

#[test]
fn a_message_the_reader_discarded_on_close_is_released_as_read() {
    let mut p = Pair::new(both(), both());
    let msgs = send_all(&mut p, &[2000]);
    assert!(p.drive(100_000));
    // The reader closes first: it answers the discarded RTS with DONE; the sender's WITHDRAW
    // crosses it and finds nothing to drop.
    p.sides[1].conn.close().unwrap();
    p.pump(1);
    assert!(p.sides[0].conn.ask_withdraw(msgs[0]));
    p.pump(0);
    assert!(p.drive(100_000));
    p.sides[0].release();
    assert!(p.sides[0].conn.rendezvous_released(msgs[0]));
    assert!(!p.sides[0].conn.take_withdrawn(msgs[0]));
    assert!(!p.sides[0].failed() && !p.sides[1].failed());
    assert_eq!(frames(&p, 1, FrameType::Withdrawn), 0);
}

#[test]
fn nothing_is_asked_back_once_released_or_never_offered() {
    let mut p = Pair::new(both(), both());
    let msgs = send_all(&mut p, &[2000]);
    assert!(
        !p.sides[0].conn.ask_withdraw(msgs[0] + 1),
        "no such message"
    );
    let got = read_all(&mut p);
    assert_eq!(got.len(), 1);
    assert!(!p.sides[0].conn.ask_withdraw(msgs[0]), "released already");
    assert_eq!(frames(&p, 0, FrameType::Withdraw), 0);
}
