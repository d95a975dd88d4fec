//! Rendezvous over the simulated link: RTS in the message order, the receiver's READ from
//! the sender's still-registered memory (the sim asserts it was not released), DONE, and the
//! fallback to eager when one side does not offer the feature.

mod util;

use rsrdma_proto::{Config, FrameType, ProtoError, Recv, FEATURE_RENDEZVOUS};
use util::{done, payload, small_config, transfer_lent_or_any, Checker, Pair};

const THRESHOLD: u32 = 1000;

fn cfg(rdv: bool) -> Config {
    let c = small_config().with_rdv_threshold(THRESHOLD);
    if rdv {
        c.with_features(FEATURE_RENDEZVOUS)
    } else {
        c
    }
}

/// Sends `lens` from side 0 (rendezvous at and above the threshold) and reads them on side 1.
fn transfer(p: &mut Pair, lens: &[usize]) -> Checker {
    transfer_lent_or_any(p, lens, |_| false)
}

#[test]
fn the_larger_threshold_is_settled_and_only_with_both_offering() {
    let p = Pair::new(cfg(true), cfg(true).with_rdv_threshold(5000));
    assert_eq!(p.sides[0].conn.rendezvous_threshold(), Some(5000));
    assert_eq!(p.sides[1].conn.rendezvous_threshold(), Some(5000));
    let p = Pair::new(cfg(true), cfg(false));
    assert_eq!(p.sides[0].conn.rendezvous_threshold(), None);
    assert_eq!(p.sides[1].conn.rendezvous_threshold(), None);
}

#[test]
fn messages_around_and_far_above_the_threshold_keep_their_order() {
    let mut p = Pair::new(cfg(true), cfg(true));
    let t = THRESHOLD as usize;
    let lens = [
        t - 1,
        t,
        t + 1,
        5,
        4 * t,
        0,
        60_000,
        300,
        t,
        t - 1,
        64 * 1024,
    ];
    let chk = transfer(&mut p, &lens);
    assert!(chk.all_taken());
    let rts = p.sides[0]
        .frames_posted
        .iter()
        .filter(|f| **f == FrameType::Rts)
        .count();
    assert_eq!(rts, lens.iter().filter(|&&l| l >= t).count());
    let done = p.sides[1]
        .frames_posted
        .iter()
        .filter(|f| **f == FrameType::Done)
        .count();
    assert_eq!(done, rts, "one DONE per RTS");
    assert_eq!(p.sides[1].reads_posted, rts);
    assert!(p.sides[0].rdv_sends.is_empty(), "every rendezvous released");
    assert!(p.sides[0].regions.is_empty());
    p.check_conservation();
}

/// A device's `max_msg_sz` below a message (mlx5 takes 1 GiB, a message may be 4 GiB):
/// the receiver reads it in pieces of at most `max_read`, one after another, each into its
/// place (the sim refuses a longer READ, and the checker compares every byte).
#[test]
fn a_message_longer_than_max_read_is_read_in_pieces() {
    let mut p = Pair::new(cfg(true), cfg(true).with_max_read(4096));
    let lens = [10_000, 4096, 4097, 60_000, 8192, 1000, 12_288];
    let chk = transfer(&mut p, &lens);
    assert!(chk.all_taken());
    let pieces: usize = lens.iter().map(|l| l.div_ceil(4096)).sum();
    assert_eq!(p.sides[1].reads_posted, pieces);
    assert!(p.sides[0].rdv_sends.is_empty(), "every rendezvous released");
    p.check_conservation();
}

#[test]
fn a_peer_without_the_feature_gets_everything_eagerly() {
    let mut p = Pair::new(cfg(true), cfg(false));
    let t = THRESHOLD as usize;
    let chk = transfer(&mut p, &[t - 1, t, 4 * t]);
    assert!(chk.all_taken());
    assert!(!p.sides[0].frames_posted.contains(&FrameType::Rts));
    assert_eq!(
        p.sides[0].conn.send_rendezvous(10, 0, 1),
        Err(ProtoError::NotNegotiated {
            op: "send_rendezvous",
            feature: "rendezvous"
        })
    );
}

#[test]
fn a_short_destination_leaves_the_message_queued_and_stream_reads_get_it() {
    let mut p = Pair::new(cfg(true), cfg(true));
    let msg = payload(0, 3000);
    done(p.sides[0].send_any(&msg));
    p.pump(0);
    assert!(p.drive(10_000));
    assert_eq!(
        p.sides[1].conn.recv_msg(),
        Ok(Recv::NeedsRead { len: 3000 })
    );
    assert_eq!(
        p.sides[1].conn.start_read(0, 99, 2999),
        Err(ProtoError::ShortBuffer { needed: 3000 })
    );
    let mut small = [0u8; 10];
    assert_eq!(
        p.sides[1].conn.read(&mut small),
        Ok(Recv::NeedsRead { len: 3000 })
    );
    // A stream reader: read into a vector, hand it to the core, read it in pieces.
    done(p.sides[1].start_read(3000));
    p.pump(1);
    assert!(p.drive(10_000));
    let key = p.sides[1].read_key.take().unwrap();
    let landed = p.sides[1].regions.remove(&key).unwrap();
    assert!(p.sides[1].conn.take_read_into_core(landed));
    let mut got = Vec::new();
    let mut buf = [0u8; 700];
    while got.len() < 3000 {
        let r = p.sides[1].conn.read(&mut buf);
        let Ok(Recv::Data(n)) = r else {
            panic!("read: {r:?}")
        };
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, msg);
    p.pump(1);
    assert!(p.drive(10_000));
    p.sides[0].release();
    assert!(p.sides[0].rdv_sends.is_empty());
}

#[test]
fn closing_the_reader_releases_the_senders_memory_and_close_waits_for_done() {
    let mut p = Pair::new(cfg(true), cfg(true));
    done(p.sides[0].send_any(&payload(0, 2000)));
    p.sides[0].conn.close().unwrap();
    p.pump(0);
    assert!(p.drive(10_000));
    assert!(
        !p.sides[0].conn.is_drained(),
        "drained before the peer's DONE"
    );
    p.sides[1].conn.close().unwrap();
    p.pump(1);
    assert!(p.drive(10_000));
    p.sides[0].release();
    assert!(
        p.sides[0].rdv_sends.is_empty(),
        "DONE for the discarded message"
    );
    assert!(p.sides[0].conn.is_drained() && p.sides[1].conn.is_drained());
}

#[test]
fn an_rts_before_the_read_is_withdrawn_only_if_unsent() {
    let mut p = Pair::new(cfg(true), cfg(true));
    p.hold[0] = true;
    let msg = done(p.sides[0].conn.send_rendezvous(2000, 0, 7));
    assert!(!p.sides[0].conn.withdraw_rendezvous(msg), "RTS already out");
    assert!(!p.sides[0].conn.rendezvous_released(msg));
}

#[test]
fn rendezvous_frames_without_the_feature_are_refused() {
    let mut p = Pair::new(cfg(false), cfg(false));
    // Side 0's core refuses to send one; a forged RTS is checked by the codec tests.
    assert!(matches!(
        p.sides[0].conn.send_rendezvous(5000, 0, 1),
        Err(ProtoError::NotNegotiated { .. })
    ));
    assert!(p.drive(100));
}

#[test]
fn the_documented_rts_example_encodes_byte_by_byte() {
    let h = rsrdma_proto::Header {
        kind: FrameType::Rts,
        flags: 0,
        msg_id: 3,
        credit_limit: 40,
        payload_len: 16,
        aux: 1 << 20,
    };
    assert_eq!(
        h.encode(),
        [7, 0, 3, 0, 0x28, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0x10, 0]
    );
    assert_eq!(rsrdma_proto::Header::decode(&h.encode()), Ok(h));
    // What the core writes after the header for that RTS: address then key, LE.
    let mut p = Pair::new(cfg(true), cfg(true));
    p.hold[0] = true;
    done(
        p.sides[0]
            .conn
            .send_rendezvous(1 << 10, 0x7f00_0000_1000, 0x1234),
    );
    p.pump(0);
    p.hold[0] = false;
    assert!(p.deliver(0));
    let raw = p.sides[1].conn.memory_mut().recv_slot_mut(0)[..32].to_vec();
    assert_eq!(
        &raw[16..32],
        &[0x00, 0x10, 0, 0, 0, 0x7f, 0, 0, 0x34, 0x12, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn through_windows_each_message_is_bound_before_its_rts_and_invalidated_before_its_release() {
    let mut p = Pair::new(cfg(true), cfg(true));
    p.sides[0].use_windows = true;
    let t = THRESHOLD as usize;
    let lens = [t, 5, 4 * t, t - 1, 60_000, t + 1];
    let chk = transfer(&mut p, &lens);
    assert!(chk.all_taken());
    let rdv = lens.iter().filter(|&&l| l >= t).count();
    // The sim fails a READ through a key that is not bound, and a release while a window
    // still covers the memory.
    assert_eq!(p.sides[0].windows_bound, rdv);
    assert_eq!(p.sides[0].windows_invalidated, rdv);
    assert!(p.sides[0].windows.is_empty());
    assert!(p.sides[0].rdv_sends.is_empty(), "every rendezvous released");
    assert_eq!(p.sides[1].reads_posted, rdv);
    p.check_conservation();
}

#[test]
fn a_window_message_is_released_only_when_its_invalidation_completes() {
    let mut p = Pair::new(cfg(true), cfg(true));
    p.sides[0].use_windows = true;
    let data = payload(0, 3000);
    done(p.sides[0].send_any(&data));
    p.pump(0);
    let msg = p.sides[0].rdv_sends[0].0;
    // Bind, RTS, the reader's READ, until its DONE is posted (not yet delivered).
    let mut got = None;
    for _ in 0..100 {
        if p.sides[1].frames_posted.contains(&FrameType::Done) {
            break;
        }
        if let Ok(Recv::Data(m)) = p.sides[1].recv_any() {
            got = Some(m);
        }
        p.pump(1);
        p.step();
    }
    assert!(p.sides[1].frames_posted.contains(&FrameType::Done));
    assert_eq!(p.sides[0].windows.len(), 1);
    p.delay_completions = true;
    assert!(p.deliver(1), "the DONE");
    assert!(
        !p.sides[0].conn.rendezvous_released(msg),
        "DONE came, the window is still bound"
    );
    assert!(p.deliver(0), "the invalidation executes");
    assert_eq!(p.sides[0].windows_invalidated, 1);
    assert!(
        !p.sides[0].conn.rendezvous_released(msg),
        "invalidated, but its completion is not reaped"
    );
    while p.complete(0) {}
    assert!(p.sides[0].conn.rendezvous_released(msg));
    assert_eq!(p.sides[0].conn.counters().rendezvous_unreleased, 0);
    p.delay_completions = false;
    if got.is_none() {
        if let Ok(Recv::Data(m)) = p.sides[1].recv_any() {
            got = Some(m);
        }
    }
    assert_eq!(got.as_deref(), Some(&data[..]));
}

#[test]
fn a_window_bound_when_the_qp_breaks_is_released_by_the_flush_alone() {
    let mut p = Pair::new(cfg(true), cfg(true));
    p.sides[0].use_windows = true;
    p.hold[0] = true;
    done(p.sides[0].send_any(&payload(0, 3000)));
    p.pump(0);
    p.hold[0] = false;
    let msg = p.sides[0].rdv_sends[0].0;
    assert!(p.deliver(0), "the bind");
    assert_eq!(p.sides[0].windows.len(), 1);
    assert!(!p.sides[0].conn.rendezvous_released(msg));
    p.break_qp(0);
    assert!(p.sides[0].conn.rendezvous_released(msg));
    p.sides[0].release();
    assert!(p.sides[0].rdv_sends.is_empty());
}

#[test]
fn a_window_message_withdrawn_before_its_rts_is_never_bound() {
    let mut p = Pair::new(cfg(true), cfg(true));
    // No credit for the RTS: side 1's slots hold unread one-frame messages until only the
    // control reserve is left.
    let mut sent = 0;
    let left = |p: &Pair| {
        let c = p.sides[0].conn.counters();
        c.peer_limit - c.frames_sent
    };
    while left(&p) > u64::from(rsrdma_proto::CONTROL_RESERVE) {
        done(p.sides[0].conn.send_msg(&[1u8; 8]));
        p.pump(0);
        assert!(p.drive(10_000));
        sent += 1;
        assert!(sent < 1000, "credits never ran out");
    }
    let msg = done(
        p.sides[0]
            .conn
            .send_rendezvous_window(5000, 0x1000, 0x8000_0001),
    );
    p.pump(0);
    assert!(p.drive(10_000));
    assert!(
        !p.sides[0].conn.rendezvous_released(msg),
        "waiting for credit"
    );
    assert!(p.sides[0].conn.withdraw_rendezvous(msg));
    assert!(p.sides[0].conn.rendezvous_released(msg));
    p.pump(0);
    assert!(p.drive(10_000));
    assert_eq!(p.sides[0].windows_bound, 0, "no bind without its RTS");
    assert!(!p.sides[0].frames_posted.contains(&FrameType::Rts));
    assert_eq!(p.sides[0].conn.counters().rendezvous_unreleased, 0);
}
