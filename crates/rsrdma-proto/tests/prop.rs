//! Property tests: two cores on the simulated link, driven by random interleavings of sends,
//! receives (message and stream reads, short buffers), deliveries, completions, time, closes
//! and broken QPs, with rendezvous (RTS, READ, DONE) offered by one, both or neither side and
//! messages below, at and above a random threshold. After every op: credits within bounds, memory bounded, at most one ABORT
//! after a failure. At the end, with the readers reading: the pair goes idle (no deadlock)
//! and every message sent arrived once, in order, byte-exact, with EOF right after the data
//! of a side that closed. Either side's driver may leave its reposts queued whenever the core
//! allows it (as a blocking receive loop does), and every frame announces only receives
//! posted before it.

mod util;

use proptest::prelude::*;
use rsrdma_proto::{Config, FrameType, ProtoError, Recv, Step, FEATURE_RENDEZVOUS};
use std::time::Duration;
use util::{payload, Checker, Pair};

const MAX_MESSAGE: u32 = 3000;

#[derive(Debug, Clone)]
enum Op {
    Send {
        side: usize,
        len: usize,
    },
    RecvInto {
        side: usize,
        buf: usize,
    },
    RecvMsg {
        side: usize,
    },
    Read {
        side: usize,
        buf: usize,
    },
    Deliver {
        from: usize,
        n: usize,
    },
    /// One frame delivered to a side whose reader waits with a buffer of `buf` bytes (the
    /// driver's `handle_recv_completion_into`).
    DeliverInto {
        from: usize,
        buf: usize,
    },
    Complete {
        side: usize,
    },
    Advance {
        ms: u64,
    },
    Close {
        side: usize,
        full: bool,
    },
    Hold {
        from: usize,
        on: bool,
    },
    DelayCompletions(bool),
    Break {
        side: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let side = 0..2usize;
    let len = prop_oneof![
        6 => 0..120usize,
        2 => 120..700usize,
        1 => Just(MAX_MESSAGE as usize),
        1 => Just(MAX_MESSAGE as usize + 1),
        1 => 700..MAX_MESSAGE as usize,
    ];
    prop_oneof![
        12 => (side.clone(), len).prop_map(|(side, len)| Op::Send { side, len }),
        3 => (side.clone(), 0..1200usize).prop_map(|(side, buf)| Op::RecvInto { side, buf }),
        3 => side.clone().prop_map(|side| Op::RecvMsg { side }),
        3 => (side.clone(), 1..900usize).prop_map(|(side, buf)| Op::Read { side, buf }),
        10 => (side.clone(), 1..40usize).prop_map(|(from, n)| Op::Deliver { from, n }),
        4 => (side.clone(), 0..1200usize).prop_map(|(from, buf)| Op::DeliverInto { from, buf }),
        4 => side.clone().prop_map(|side| Op::Complete { side }),
        2 => (0..2500u64).prop_map(|ms| Op::Advance { ms }),
        1 => (side.clone(), any::<bool>(), 0..8u8).prop_map(|(side, full, gate)| if gate == 0 {
            Op::Close { side, full }
        } else {
            Op::RecvMsg { side }
        }),
        1 => (side.clone(), 0..4u8).prop_map(|(from, on)| Op::Hold { from, on: on == 0 }),
        1 => any::<bool>().prop_map(Op::DelayCompletions),
        1 => (1..200u32).prop_map(|w| w == 1).prop_flat_map(move |b| (Just(b), 0..2usize))
            .prop_map(|(b, side)| if b { Op::Break { side } } else { Op::Complete { side } }),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (
        prop_oneof![Just(64u32), Just(128), Just(300), Just(1024)],
        8..20u16,
        2..9u16,
        2..24u16,
        1..9u16,
        prop_oneof![Just(0u16), Just(16), Just(64), Just(200)],
        (any::<bool>(), 1..2500u32),
        // READs in pieces (a device's max_msg_sz below the message) or whole.
        prop_oneof![Just(u32::MAX), 100..3000u32],
    )
        .prop_map(
            |(slot, recv, send, depth, interval, inline, (rdv, threshold), max_read)| {
                let features = if rdv { FEATURE_RENDEZVOUS } else { 0 };
                Config::default()
                    .with_max_read(max_read)
                    .with_features(features)
                    .with_rdv_threshold(threshold)
                    .with_slot_size(slot)
                    .with_recv_slots(recv)
                    .with_send_slots(send)
                    .with_sq_depth(depth)
                    .with_signal_interval(interval)
                    .with_inline_size(inline)
                    .with_max_message(MAX_MESSAGE)
            },
        )
}

/// What the test knows beyond the cores.
struct World {
    p: Pair,
    /// `chk[i]` checks what side `i` reads (sent by the other side).
    chk: [Checker; 2],
    write_closed: [bool; 2],
    read_closed: [bool; 2],
    broken: [bool; 2],
}

impl World {
    fn apply(&mut self, op: &Op) {
        let p = &mut self.p;
        match *op {
            Op::Send { side, len } => {
                let data = payload(self.chk[1 - side].lens.len() as u64, len);
                match p.send(side, &data) {
                    Ok(Step::Done(())) => self.chk[1 - side].lens.push(len),
                    Ok(Step::Blocked) => {}
                    Err(ProtoError::TooLarge { .. }) => assert!(len > MAX_MESSAGE as usize),
                    Err(ProtoError::Closed { .. }) => assert!(self.write_closed[side]),
                    Err(e) => assert!(e.is_sticky() && p.sides[side].failed(), "{e}"),
                }
                p.pump(side);
            }
            Op::RecvInto { side, buf } => {
                if let Some(key) = p.sides[side].read_key {
                    if let Some(n) = p.sides[side].conn.take_read() {
                        p.sides[side].read_key = None;
                        let v = p.sides[side].regions.remove(&key).unwrap();
                        self.chk[side].on_msg(&v[..n]);
                    }
                    self.p.pump(side);
                    self.check();
                    return;
                }
                let mut b = vec![0; buf];
                let r = p.sides[side].conn.recv_msg_into(&mut b);
                match r {
                    Ok(Recv::NeedsRead { len }) => {
                        assert_eq!(len, self.chk[side].expected_len(), "rendezvous length");
                        match p.sides[side].start_read(buf) {
                            Ok(Step::Done(()) | Step::Blocked) => {}
                            Err(ProtoError::ShortBuffer { needed }) => assert_eq!(needed, len),
                            Err(e) => assert!(e.is_sticky() && p.sides[side].failed(), "{e}"),
                        }
                    }
                    Ok(Recv::Data(n)) => self.chk[side].on_msg(&b[..n]),
                    Err(ProtoError::ShortBuffer { needed }) => {
                        assert!(needed > buf);
                        assert_eq!(needed, self.chk[side].expected_len(), "needed length");
                    }
                    other => self.check_no_message(side, other.map(|o| o.map(|_| ()))),
                }
                self.p.pump(side);
            }
            Op::RecvMsg { side } => {
                match p.sides[side].recv_any() {
                    Ok(Recv::Data(m)) => self.chk[side].on_msg(&m),
                    other => self.check_no_message(side, other.map(|o| o.map(|_| ()))),
                }
                self.p.pump(side);
            }
            Op::Read { side, buf } => {
                if let Some(key) = p.sides[side].read_key {
                    let Some(n) = p.sides[side].conn.take_read() else {
                        self.p.pump(side);
                        self.check();
                        return;
                    };
                    // Landed: `take_read` consumed it; hand the bytes to the checker as a
                    // message read (the stream path is `take_read_into_core`, tested apart).
                    p.sides[side].read_key = None;
                    let v = p.sides[side].regions.remove(&key).unwrap();
                    self.chk[side].on_msg(&v[..n]);
                    self.p.pump(side);
                    self.check();
                    return;
                }
                let mut b = vec![0; buf];
                let r = p.sides[side].conn.read(&mut b);
                if let Ok(Recv::NeedsRead { len }) = r {
                    // The read may have skipped empty messages before the rendezvous one.
                    let received = p.sides[side].conn.counters().messages_received;
                    self.chk[side].on_read(&[], received);
                    match p.sides[side].start_read(len) {
                        Ok(Step::Done(()) | Step::Blocked) => {}
                        Err(e) => assert!(e.is_sticky() && p.sides[side].failed(), "{e}"),
                    }
                    self.p.pump(side);
                    self.check();
                    return;
                }
                let received = p.sides[side].conn.counters().messages_received;
                match r {
                    Ok(Recv::Data(n)) => {
                        assert!(n > 0, "read gave no bytes into a buffer of {buf}");
                        self.chk[side].on_read(&b[..n], received);
                    }
                    Ok(Recv::Eof) => {
                        self.chk[side].on_read(&[], received);
                        self.check_no_message(side, Ok(Recv::Eof));
                    }
                    Ok(Recv::Blocked) => self.chk[side].on_read(&[], received),
                    Ok(Recv::NeedsRead { .. }) => unreachable!("handled above"),
                    Err(e) => self.check_no_message(side, Err(e)),
                }
                self.p.pump(side);
            }
            Op::Deliver { from, n } => {
                for _ in 0..n {
                    if p.hold[from] || !p.deliver(from) {
                        break;
                    }
                }
            }
            Op::DeliverInto { from, buf } => {
                let mut b = vec![0; buf];
                if !p.hold[from] {
                    if let (_, Some(n)) = p.deliver_into(from, Some(&mut b)) {
                        self.chk[1 - from].on_msg(&b[..n]);
                    }
                }
            }
            Op::Complete { side } => {
                p.complete(side);
            }
            Op::Advance { ms } => {
                assert!(p.drive(100_000), "livelock");
                p.advance(Duration::from_millis(ms));
            }
            Op::Close { side, full } => {
                let r = if full {
                    p.sides[side].conn.close()
                } else {
                    p.sides[side].conn.shutdown_write()
                };
                if r.is_ok() {
                    self.write_closed[side] = true;
                    self.read_closed[side] |= full;
                }
                p.pump(side);
            }
            Op::Hold { from, on } => p.hold[from] = on,
            Op::DelayCompletions(on) => p.delay_completions = on,
            Op::Break { side } => {
                if !self.broken[side] {
                    self.broken[side] = true;
                    p.break_qp(side);
                }
            }
        }
        self.check();
    }

    /// A read that returned no message: Blocked, EOF (only after all data and a FIN),
    /// Closed (only after close), or the sticky error.
    fn check_no_message(&self, side: usize, r: Result<Recv<()>, ProtoError>) {
        match r {
            Ok(Recv::Data(())) => unreachable!(),
            Ok(Recv::NeedsRead { len }) => panic!("side {side}: an unhandled NeedsRead ({len})"),
            Ok(Recv::Eof) => {
                assert!(self.write_closed[1 - side], "EOF without the peer closing");
                assert!(self.chk[side].all_taken(), "EOF before all data was read");
            }
            Ok(Recv::Blocked) => {}
            Err(ProtoError::Closed { .. }) => assert!(self.read_closed[side]),
            Err(e) => assert!(e.is_sticky() && self.p.sides[side].failed(), "{e}"),
        }
    }

    fn check(&mut self) {
        for s in &mut self.p.sides {
            s.release();
        }
        self.p.check_credits();
        for s in &self.p.sides {
            let c = s.conn.counters();
            assert!(
                c.reassembly_bytes <= u64::from(MAX_MESSAGE),
                "reassembly over the cap"
            );
            assert!(
                c.queued_send_bytes <= u64::from(MAX_MESSAGE),
                "queued send bytes unbounded"
            );
            assert!(
                s.posted_after_failure.len() <= 1,
                "more than one frame after failure"
            );
            assert!(s
                .posted_after_failure
                .iter()
                .all(|f| *f == FrameType::Abort));
            assert!(s.posted_receives() <= usize::from(s.cfg.recv_slots));
        }
    }

    /// Readers read everything, senders finish: must go idle with everything delivered.
    fn finish(&mut self) {
        self.p.hold = [false; 2];
        self.p.delay_completions = false;
        for _ in 0..10_000 {
            assert!(self.p.drive(100_000), "livelock");
            let mut progressed = false;
            for side in 0..2 {
                loop {
                    match self.p.sides[side].recv_any() {
                        Ok(Recv::Data(m)) => {
                            self.chk[side].on_msg(&m);
                            progressed = true;
                        }
                        Ok(Recv::Blocked) if self.p.sides[side].read_key.is_some() => {
                            progressed = true;
                            break;
                        }
                        _ => break,
                    }
                }
                self.p.pump(side);
                self.p.sides[side].release();
            }
            if !progressed && !self.p.step() {
                break;
            }
        }
        if self.p.sides.iter().any(|s| s.failed()) {
            return; // Failures were checked op by op; delivery is not promised after one.
        }
        for side in 0..2 {
            if !self.read_closed[side] {
                assert!(
                    self.chk[side].all_taken(),
                    "side {side} did not get everything"
                );
                if self.write_closed[1 - side] {
                    assert_eq!(
                        self.p.sides[side].conn.recv_msg(),
                        Ok(Recv::Eof),
                        "EOF after the data"
                    );
                }
            }
            assert!(
                self.p.sides[side].conn.can_send() || self.write_closed[side],
                "sender stuck"
            );
        }
        self.p.check_conservation();
        // Close both and drain.
        for side in 0..2 {
            self.p.sides[side].conn.close().unwrap();
            self.p.pump(side);
        }
        assert!(self.p.drive(100_000));
        for side in 0..2 {
            assert!(
                self.p.sides[side].conn.is_drained(),
                "side {side} not drained after close"
            );
            assert_eq!(self.p.sides[side].conn.poll_timeout(), None);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_every_promise(
        a in config(),
        b in config(),
        ops in proptest::collection::vec(op(), 1..300),
        defer in any::<(bool, bool)>(),
        fast in any::<(bool, bool)>(),
        windows in any::<(bool, bool)>(),
    ) {
        let mut w = World {
            p: Pair::new(a, b),
            chk: [Checker::default(), Checker::default()],
            write_closed: [false; 2],
            read_closed: [false; 2],
            broken: [false; 2],
        };
        w.p.defer_reposts = [defer.0, defer.1];
        w.p.fast_sends = [fast.0, fast.1];
        w.p.sides[0].use_windows = windows.0;
        w.p.sides[1].use_windows = windows.1;
        for op in &ops {
            w.apply(op);
        }
        w.finish();
    }
}

/// A case the property test found (CI, proptest's shrunk input): a rendezvous message whose
/// RTS slot was released after the QP broke made the core queue a receive on the broken QP.
#[test]
fn a_slot_released_after_a_broken_qp_is_not_reposted() {
    let cfg = |send_slots, rdv_threshold| {
        Config::default()
            .with_features(FEATURE_RENDEZVOUS)
            .with_rdv_threshold(rdv_threshold)
            .with_slot_size(64)
            .with_recv_slots(8)
            .with_send_slots(send_slots)
            .with_sq_depth(4)
            .with_signal_interval(1)
            .with_inline_size(0)
            .with_max_message(MAX_MESSAGE)
    };
    let mut w = World {
        p: Pair::new(cfg(5, 95), cfg(2, 1)),
        chk: [Checker::default(), Checker::default()],
        write_closed: [false; 2],
        read_closed: [false; 2],
        broken: [false; 2],
    };
    let ops = [
        Op::Send { side: 0, len: 0 },
        Op::Advance { ms: 0 },
        Op::RecvInto { side: 1, buf: 0 },
        Op::Send { side: 0, len: 120 },
        Op::Send { side: 0, len: 49 },
        Op::Deliver { from: 0, n: 2 },
        Op::RecvMsg { side: 1 },
        Op::Deliver { from: 1, n: 1 },
        Op::Break { side: 1 },
    ];
    for op in &ops {
        w.apply(op);
    }
    w.finish();
}
