//! The striped connection's core (`rsrdma_proto::rails`) between two ends over simulated
//! rails: each rail is a pair of in-order channels that may fail at any moment, having
//! delivered any prefix of what it carried; each end learns of the failure later, and until
//! then may still hand the dead rail stripes (lost). Random sends, reads, pumps, deliveries
//! and failures; invariants: what each end reads is always a prefix of what the other sent
//! (nothing lost, duplicated or reordered), and once everything settles with a rail still up
//! it is all of it, every message confirmed.

use proptest::prelude::*;
use rsrdma_proto::rails::{Rails, RailsConfig, StripeHeader, STRIPE_HEADER_LEN};
use rsrdma_proto::{ProtoError, Step};
use std::collections::VecDeque;

#[derive(Debug, Clone)]
enum Op {
    Send { side: usize, len: usize },
    Pump { side: usize, rail: usize },
    Deliver { to: usize, rail: usize },
    Recv { side: usize },
    Fail { rail: usize, arrived: usize },
    Notice { side: usize, rail: usize },
}

fn op(rails: usize, max_len: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize, 0..=max_len).prop_map(|(side, len)| Op::Send { side, len }),
        6 => (0..2usize, 0..rails).prop_map(|(side, rail)| Op::Pump { side, rail }),
        6 => (0..2usize, 0..rails).prop_map(|(to, rail)| Op::Deliver { to, rail }),
        2 => (0..2usize).prop_map(|side| Op::Recv { side }),
        1 => (0..rails, 0..6usize).prop_map(|(rail, arrived)| Op::Fail { rail, arrived }),
        1 => (0..2usize, 0..rails).prop_map(|(side, rail)| Op::Notice { side, rail }),
    ]
}

/// A message whose bytes say which message it is.
fn message(side: usize, n: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (side * 131 + n * 17 + i * 7) as u8)
        .collect()
}

struct World {
    ends: [Rails; 2],
    /// In flight on each rail towards each end.
    wire: Vec<[VecDeque<Vec<u8>>; 2]>,
    up: Vec<bool>,
    /// Rails each end knows to be down.
    noticed: [Vec<bool>; 2],
    sent: [Vec<Vec<u8>>; 2],
    got: [Vec<Vec<u8>>; 2],
    /// Rail messages a rail holds per direction at most (its room).
    room: usize,
    all_failed: [bool; 2],
}

impl World {
    fn new(cfg: RailsConfig, room: usize) -> World {
        let n = cfg.rails;
        World {
            ends: [Rails::new(cfg).unwrap(), Rails::new(cfg).unwrap()],
            wire: (0..n).map(|_| [VecDeque::new(), VecDeque::new()]).collect(),
            up: vec![true; n],
            noticed: [vec![false; n], vec![false; n]],
            sent: [Vec::new(), Vec::new()],
            got: [Vec::new(), Vec::new()],
            room,
            all_failed: [false; 2],
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Send { side, len } => {
                let msg = message(side, self.sent[side].len(), len);
                match self.ends[side].send(&msg) {
                    Ok(Step::Done(seq)) => {
                        prop_assert_eq!(seq, self.sent[side].len() as u64);
                        self.sent[side].push(msg);
                    }
                    Ok(Step::Blocked) => {}
                    Err(ProtoError::AllRailsFailed) => prop_assert!(self.all_failed[side]),
                    Err(e) => prop_assert!(false, "send failed: {e}"),
                }
            }
            Op::Pump { side, rail } => {
                if self.noticed[side][rail] || self.wire[rail][1 - side].len() >= self.room {
                    return Ok(());
                }
                if let Some(s) = self.ends[side].next_stripe(rail) {
                    let m = s.to_vec();
                    // A dead rail the sender has not noticed loses what it is given.
                    if self.up[rail] {
                        self.wire[rail][1 - side].push_back(m);
                    }
                }
            }
            Op::Deliver { to, rail } => {
                if let Some(m) = self.wire[rail][to].pop_front() {
                    let r = self.ends[to].handle_stripe(rail, &m);
                    prop_assert!(r.is_ok(), "a stripe was refused: {:?}", r);
                }
            }
            Op::Recv { side } => {
                // Every other message is read into a buffer that starts too short.
                loop {
                    if self.got[side].len() % 2 == 0 {
                        let Some(m) = self.ends[side].recv() else {
                            break;
                        };
                        self.got[side].push(m);
                        continue;
                    }
                    let mut buf = vec![0u8; 3];
                    let n = match self.ends[side].recv_into(&mut buf) {
                        Err(ProtoError::ShortBuffer { needed }) => {
                            buf.resize(needed, 0);
                            self.ends[side].recv_into(&mut buf)
                        }
                        r => r,
                    };
                    match n {
                        Ok(Some(n)) => self.got[side].push(buf[..n].to_vec()),
                        Ok(None) => break,
                        Err(e) => prop_assert!(false, "recv_into: {e}"),
                    }
                }
                let peer = 1 - side;
                let n = self.got[side].len();
                prop_assert!(n <= self.sent[peer].len(), "more arrived than was sent");
                for (i, m) in self.got[side].iter().enumerate() {
                    prop_assert!(
                        *m == self.sent[peer][i],
                        "message {} differs (lost, duplicated or reordered)",
                        i
                    );
                }
            }
            Op::Fail { rail, arrived } => {
                if !self.up[rail] {
                    return Ok(());
                }
                // The rail dies having delivered a prefix of what it carried.
                self.up[rail] = false;
                for to in 0..2 {
                    let keep = arrived.min(self.wire[rail][to].len());
                    for _ in 0..keep {
                        let m = self.wire[rail][to].pop_front().unwrap();
                        let r = self.ends[to].handle_stripe(rail, &m);
                        prop_assert!(r.is_ok(), "a stripe was refused: {:?}", r);
                    }
                    self.wire[rail][to].clear();
                }
            }
            Op::Notice { side, rail } => self.notice(side, rail)?,
        }
        Ok(())
    }

    fn notice(&mut self, side: usize, rail: usize) -> Result<(), TestCaseError> {
        if self.up[rail] || self.noticed[side][rail] {
            return Ok(());
        }
        self.noticed[side][rail] = true;
        match self.ends[side].rail_failed(rail) {
            Ok(()) => prop_assert!(self.ends[side].live_rails() > 0),
            Err(ProtoError::AllRailsFailed) => self.all_failed[side] = true,
            Err(e) => prop_assert!(false, "rail_failed: {e}"),
        }
        Ok(())
    }

    /// Both ends notice every dead rail, then everything moves until nothing does.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for rail in 0..self.up.len() {
            for side in 0..2 {
                self.notice(side, rail)?;
            }
        }
        for _ in 0..100_000 {
            let mut moved = false;
            for side in 0..2 {
                for rail in 0..self.up.len() {
                    let before = self.wire[rail][1 - side].len();
                    self.apply(&Op::Pump { side, rail })?;
                    moved |= self.wire[rail][1 - side].len() != before;
                }
            }
            for to in 0..2 {
                for rail in 0..self.up.len() {
                    while !self.wire[rail][to].is_empty() {
                        self.apply(&Op::Deliver { to, rail })?;
                        moved = true;
                    }
                }
                let before = self.got[to].len();
                self.apply(&Op::Recv { side: to })?;
                moved |= self.got[to].len() != before;
            }
            if !moved {
                return Ok(());
            }
        }
        prop_assert!(false, "the connection never settled");
        Ok(())
    }
}

fn config() -> impl Strategy<Value = (RailsConfig, usize)> {
    (1..=4usize, 1..=48u32, 32..=600usize, 1..=6usize).prop_map(|(rails, stripe, window, room)| {
        (
            RailsConfig {
                rails,
                stripe_size: stripe,
                window,
                max_message: 200,
            },
            room,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn failing_rails_lose_duplicate_and_reorder_nothing(
        (cfg, room) in config(),
        ops in prop::collection::vec(op(4, 200), 1..400),
    ) {
        let mut w = World::new(cfg, room);
        // Rail 0 never fails here: the connection must then deliver everything.
        for o in &ops {
            let o = match *o {
                Op::Fail { rail, .. } | Op::Pump { rail, .. } | Op::Deliver { rail, .. }
                | Op::Notice { rail, .. } if rail >= cfg.rails => continue,
                Op::Fail { rail: 0, .. } => continue,
                ref o => o.clone(),
            };
            w.apply(&o)?;
        }
        w.settle()?;
        for side in 0..2 {
            prop_assert_eq!(w.got[1 - side].len(), w.sent[side].len(), "not everything arrived");
            prop_assert_eq!(w.ends[side].unconfirmed(), 0, "not everything was confirmed");
        }
    }

    #[test]
    fn when_every_rail_fails_each_end_says_so_and_read_a_prefix(
        (cfg, room) in config(),
        ops in prop::collection::vec(op(4, 200), 1..300),
    ) {
        let mut w = World::new(cfg, room);
        for o in &ops {
            match *o {
                Op::Fail { rail, .. } | Op::Pump { rail, .. } | Op::Deliver { rail, .. }
                | Op::Notice { rail, .. } if rail >= cfg.rails => continue,
                ref o => w.apply(o)?,
            }
        }
        for rail in 0..cfg.rails {
            w.apply(&Op::Fail { rail, arrived: 0 })?;
        }
        w.settle()?;
        for side in 0..2 {
            prop_assert!(w.all_failed[side]);
            let r = w.ends[side].send(b"x");
            prop_assert_eq!(r, Err(ProtoError::AllRailsFailed));
        }
    }
}

fn two(rails: usize) -> (Rails, Rails) {
    let cfg = RailsConfig {
        rails,
        stripe_size: 4,
        window: 64,
        max_message: 100,
    };
    (Rails::new(cfg).unwrap(), Rails::new(cfg).unwrap())
}

fn carry(from: &mut Rails, rail: usize) -> Vec<u8> {
    from.next_stripe(rail).expect("a stripe").to_vec()
}

#[test]
fn a_large_message_is_shared_by_the_rails_that_ask() {
    let (mut a, mut b) = two(2);
    assert_eq!(a.send(b"abcdefghij").unwrap(), Step::Done(0));
    // Stripes of 4 bytes: rail 1 asks first, then rail 0, then rail 1 again.
    let s1 = carry(&mut a, 1);
    let s2 = carry(&mut a, 0);
    let s3 = carry(&mut a, 1);
    assert!(a.next_stripe(0).is_none());
    for m in [&s3, &s1, &s2] {
        b.handle_stripe(0, m).unwrap();
    }
    assert_eq!(b.recv().unwrap(), b"abcdefghij");
    // b read everything: its confirmation goes on the next stripe it sends.
    let ack = carry(&mut b, 0);
    assert_eq!(ack.len(), STRIPE_HEADER_LEN);
    assert_eq!(a.unconfirmed(), 1);
    a.handle_stripe(0, &ack).unwrap();
    assert_eq!(a.unconfirmed(), 0);
}

#[test]
fn a_failed_rails_unconfirmed_stripes_go_again_and_the_copies_are_dropped() {
    let (mut a, mut b) = two(2);
    assert_eq!(a.send(b"12345678").unwrap(), Step::Done(0));
    let on0 = carry(&mut a, 0);
    let on1 = carry(&mut a, 1);
    // Rail 1 dies after its stripe landed; the sender cannot know and sends it again.
    b.handle_stripe(1, &on1).unwrap();
    a.rail_failed(1).unwrap();
    assert!(a.next_stripe(1).is_none());
    let again = carry(&mut a, 0);
    assert_eq!(again, on1);
    b.handle_stripe(0, &on0).unwrap();
    b.handle_stripe(0, &again).unwrap();
    assert_eq!(b.recv().unwrap(), b"12345678");
    assert!(b.recv().is_none());
    assert_eq!(b.counters().stripes_duplicate, 1);
    assert_eq!(a.counters().stripes_resent, 1);
    assert_eq!(a.counters().rails_failed, 1);
    assert_eq!(a.rail_failed(0), Err(ProtoError::AllRailsFailed));
}

#[test]
fn a_rail_the_peer_closed_resends_like_a_failed_one_but_is_no_failure() {
    let (mut a, mut b) = two(2);
    assert_eq!(a.send(b"12345678").unwrap(), Step::Done(0));
    let on0 = carry(&mut a, 0);
    let on1 = carry(&mut a, 1);
    a.rail_closed(1).unwrap();
    assert_eq!(
        carry(&mut a, 0),
        on1,
        "rail 1's stripe goes again on rail 0"
    );
    assert_eq!(a.counters().rails_failed, 0);
    assert_eq!(a.counters().stripes_resent, 1);
    assert_eq!(a.live_rails(), 1);
    // Half a message held is a cut stream; whole and read, nothing is held.
    b.handle_stripe(0, &on0).unwrap();
    assert!(b.recv().is_none());
    assert!(b.receiving(), "half a message arrived");
    b.handle_stripe(1, &on1).unwrap();
    assert_eq!(b.recv().unwrap(), b"12345678");
    assert!(!b.receiving());
    assert_eq!(a.rail_closed(0), Err(ProtoError::AllRailsFailed));
}

#[test]
fn the_window_blocks_the_sender_until_the_receiver_reads() {
    let (mut a, mut b) = two(1);
    assert_eq!(a.send(&[1; 40]).unwrap(), Step::Done(0));
    assert_eq!(a.send(&[2; 40]).unwrap(), Step::Blocked);
    while let Some(s) = a.next_stripe(0) {
        let m = s.to_vec();
        b.handle_stripe(0, &m).unwrap();
    }
    // Nothing read yet: nothing confirmed, still blocked.
    assert!(!b.wants_to_send());
    assert_eq!(a.send(&[2; 40]).unwrap(), Step::Blocked);
    assert_eq!(b.recv().unwrap(), vec![1; 40]);
    assert!(b.wants_to_send());
    a.handle_stripe(0, &carry(&mut b, 0)).unwrap();
    assert_eq!(a.send(&[2; 40]).unwrap(), Step::Done(1));
    // A message larger than the window goes alone.
    let (mut c, _) = two(1);
    assert_eq!(c.send(&[3; 100]).unwrap(), Step::Done(0));
}

#[test]
fn stripes_that_break_the_rules_are_refused() {
    let (mut a, mut b) = two(1);
    assert_eq!(a.send(b"abcdef").unwrap(), Step::Done(0));
    let good = carry(&mut a, 0);
    let h = StripeHeader::decode(&good).unwrap();
    let with = |f: &dyn Fn(&mut StripeHeader)| {
        let mut h = h;
        f(&mut h);
        let mut m = h.encode().to_vec();
        m.extend_from_slice(&good[STRIPE_HEADER_LEN..]);
        m
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..10].to_vec(), "shorter than its header"),
        (with(&|h| h.len = 3), "its length is not what follows"),
        (with(&|h| h.offset = 5), "reaches past its message's end"),
        (with(&|h| h.total = 101), "over the agreed maximum"),
        (with(&|h| h.seq = 5000), "too far ahead"),
        (with(&|h| h.ack = 1), "confirms a message never sent"),
    ];
    for (m, why) in cases {
        match b.handle_stripe(0, &m) {
            Err(ProtoError::BadStripe { reason }) => assert!(reason.contains(why), "{reason}"),
            r => panic!("{why}: {r:?}"),
        }
    }
    let mut flagged = good.clone();
    flagged[1] = 1;
    assert!(b.handle_stripe(0, &flagged).is_err());
    let mut kind = good.clone();
    kind[0] = 9;
    assert!(b.handle_stripe(0, &kind).is_err());
    // The same message announced with another length.
    b.handle_stripe(0, &good).unwrap();
    let other = with(&|h| h.total = 7);
    assert!(b.handle_stripe(0, &other).is_err());
}

#[test]
fn a_confirmation_lost_with_its_rail_is_sent_again() {
    let (mut a, mut b) = two(2);
    assert_eq!(a.send(b"abc").unwrap(), Step::Done(0));
    b.handle_stripe(0, &carry(&mut a, 0)).unwrap();
    assert_eq!(b.recv().unwrap(), b"abc");
    // b's confirmation leaves on rail 1, which dies with it.
    let _lost = carry(&mut b, 1);
    assert!(!b.wants_to_send());
    b.rail_failed(1).unwrap();
    assert!(
        b.wants_to_send(),
        "the confirmation may be lost: it must go again"
    );
    a.handle_stripe(0, &carry(&mut b, 0)).unwrap();
    assert_eq!(a.unconfirmed(), 0);
}

#[test]
fn the_protocol_documents_example_stripe_is_what_the_core_writes() {
    let h = StripeHeader {
        data: true,
        offset: 16_384,
        seq: 2,
        ack: 5,
        total: 20_000,
        len: 3_616,
    };
    let doc = "01 00 00 00 00 40 00 00 02 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 \
               20 4e 00 00 20 0e 00 00";
    let bytes: Vec<u8> = doc
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    assert_eq!(h.encode().to_vec(), bytes);
}

#[test]
fn the_rails_feature_settles_only_when_both_ends_offer_it() {
    use rsrdma_proto::{settle, Config, FEATURE_RAILS, FEATURE_RENDEZVOUS};
    let plain = Config::default().with_features(FEATURE_RENDEZVOUS).params();
    let striped = Config::default()
        .with_features(FEATURE_RENDEZVOUS | FEATURE_RAILS)
        .params();
    let both = settle(&striped, &striped).unwrap();
    assert_eq!(both.features, FEATURE_RENDEZVOUS | FEATURE_RAILS);
    for (a, b) in [(&plain, &striped), (&striped, &plain)] {
        let s = settle(a, b).unwrap();
        assert_eq!(s.features, FEATURE_RENDEZVOUS, "a plain end: no rails");
    }
}

#[test]
fn a_stripe_that_comes_twice_is_confirmed_again_on_the_rail_it_came_by() {
    let (mut a, mut b) = two(2);
    assert_eq!(a.send(b"12345678").unwrap(), Step::Done(0));
    let on0 = carry(&mut a, 0);
    let on1 = carry(&mut a, 1);
    b.handle_stripe(0, &on0).unwrap();
    b.handle_stripe(1, &on1).unwrap();
    assert_eq!(b.recv().unwrap(), b"12345678");
    // b confirms on rail 1, which died on a's side only: b cannot tell, the confirmation is
    // lost, and a sends rail 1's stripe again on rail 0.
    let _lost = carry(&mut b, 1);
    assert!(!b.wants_to_send());
    a.rail_failed(1).unwrap();
    let again = carry(&mut a, 0);
    b.handle_stripe(0, &again).unwrap();
    assert!(
        b.wants_to_send(),
        "a stripe sent again: the sender lacks a confirmation"
    );
    // Not on rail 1 (maybe dead on the far side): on rail 0, which brought the copy.
    assert!(b.next_stripe(1).is_none());
    let ack = carry(&mut b, 0);
    a.handle_stripe(0, &ack).unwrap();
    assert_eq!(a.unconfirmed(), 0);
    assert!(!b.wants_to_send());
    // Should rail 0 fail too before it carries it, any live rail takes the confirmation.
    let (mut a, mut b) = two(3);
    assert_eq!(a.send(b"x").unwrap(), Step::Done(0));
    let on2 = carry(&mut a, 2);
    b.handle_stripe(2, &on2).unwrap();
    assert_eq!(b.recv().unwrap(), b"x");
    let _lost = carry(&mut b, 1);
    b.handle_stripe(2, &on2).unwrap();
    b.rail_failed(2).unwrap();
    a.handle_stripe(0, &carry(&mut b, 0)).unwrap();
    assert_eq!(a.unconfirmed(), 0);
}
