//! The operations on the host, with no device: two protocol cores joined by a simulated RC
//! link (in order, lossless; a SEND lands in the peer's oldest posted receive, and a
//! signalled send completes when it lands), driven through [`Link`] exactly as the driver
//! drives them, under random interleavings of attempts, give-ups (a timeout at any step),
//! posting and delivery. Invariants: every send that ended `Ok` arrives whole, once, in
//! order; a send that ended in `Timeout` never arrives (nothing of it was sent); a receive
//! that gives up mid-message loses nothing (the next one gets the message whole); a side is
//! never left owned (every later operation makes progress: no wedge). A link that breaks at a
//! random step (a QP in ERROR) ends every operation with an error, leaves no side owned, and
//! what arrived before is still a whole, in-order prefix of what was accepted.
//!
//! Mutations this catches (each checked by hand when it was written, 3 runs of 300 cases):
//! `send_unborrow` answering "kept" for a message never started (F2: an accepted message
//! never arrives), `RecvInto::abandon` not handing the part back (a message arrives
//! corrupted), and a give-up that does not free its side (the side stays owned). Not here:
//! rendezvous (the READ, F3) and the wait itself (F1: `progress::wait_until`'s own tests),
//! which need a device model with registrations and a clock.

use super::op::{self, Link, Op};
use super::rendezvous::RecvStep;
use super::sides::Owners;
use super::transfer::{RecvInto, SendMsg, SliceRdv, SliceRendezvous};
use crate::error::{NetError, Result};
use proptest::prelude::*;
use rsrdma_proto::{settle, Config, Conn as Core, Fatal, VecSlots, Work, WrId};
use std::collections::VecDeque;
use std::time::Instant;

/// One end: a core over plain memory, its posted receives, and the owners' record.
struct SimSide {
    core: Core<VecSlots>,
    owners: Owners,
    posted: VecDeque<u16>,
}

impl Link for SimSide {
    type Mem = VecSlots;

    fn core(&mut self) -> &mut Core<VecSlots> {
        &mut self.core
    }

    fn owners(&mut self) -> &mut Owners {
        &mut self.owners
    }

    fn peer_gone(&self) -> bool {
        false
    }
}

impl SliceRendezvous for SimSide {
    fn send_slice_rdv(&mut self, _: &[u8], _: &mut Option<SliceRdv>) -> Result<bool> {
        Err(NetError::InvalidArgument(
            "the simulated link has no rendezvous".into(),
        ))
    }

    fn drop_send(&mut self, _: u64, _: bool) {}
}

/// A frame on the wire: its bytes, and the send's completion to give when it lands.
struct Frame {
    bytes: Vec<u8>,
    wr_id: WrId,
    signaled: bool,
}

struct SimPair {
    sides: [SimSide; 2],
    /// Frames from side `i` to the other, in order.
    wire: [VecDeque<Frame>; 2],
    now: Instant,
    /// The link broke (a QP in ERROR): nothing more is delivered, both cores failed.
    broken: bool,
}

/// Small slots and few credits, so that messages fragment and credits run out often; no
/// timers (the simulation has no clock to speak of).
fn config() -> Config {
    Config::default()
        .with_slot_size(256)
        .with_recv_slots(8)
        .with_send_slots(6)
        .with_sq_depth(8)
        .with_signal_interval(4)
        .with_inline_size(64)
        .with_max_message(16 * 1024)
        .with_keepalive(None)
}

impl SimPair {
    fn new() -> SimPair {
        let now = Instant::now();
        let cfg = config();
        let side = || {
            let settled = settle(&cfg.params(), &cfg.params()).expect("settle");
            let core = Core::new(&cfg, &settled, VecSlots::for_config(&cfg), now).expect("core");
            SimSide {
                core,
                owners: Owners::default(),
                posted: VecDeque::new(),
            }
        };
        let mut p = SimPair {
            sides: [side(), side()],
            wire: [VecDeque::new(), VecDeque::new()],
            now,
            broken: false,
        };
        p.post(0);
        p.post(1);
        p
    }

    /// Posts what side `i` queued, as the driver's `post_work` does.
    fn post(&mut self, i: usize) -> bool {
        let mut any = false;
        while let Some(w) = self.sides[i].core.poll_work() {
            any = true;
            match w {
                Work::PostRecv { slot } => {
                    assert!(!self.sides[i].posted.contains(&slot), "slot posted twice");
                    self.sides[i].posted.push_back(slot);
                }
                Work::PostSend {
                    wr_id,
                    slot,
                    len,
                    signaled,
                    lent: None,
                } => {
                    let core = &self.sides[i].core;
                    let bytes = match slot {
                        Some(s) => core.memory().send_slot(s)[..len as usize].to_vec(),
                        None => core.inline_frame(wr_id).expect("inline frame").to_vec(),
                    };
                    self.wire[i].push_back(Frame {
                        bytes,
                        wr_id,
                        signaled,
                    });
                }
                other => panic!("the simulation posts no {other:?}"),
            }
        }
        while self.sides[i].core.poll_event().is_some() {}
        any
    }

    /// Breaks the link, as a QP going to ERROR under either side: both cores fail (the
    /// driver's failed completion on one side, the peer's retries or keepalive on the other)
    /// and nothing in flight lands.
    fn break_link(&mut self) {
        self.broken = true;
        self.wire = [VecDeque::new(), VecDeque::new()];
        for s in &mut self.sides {
            s.core.handle_fatal(Fatal::QpError);
        }
    }

    /// Lands the oldest frame from side `i` in the other side's oldest posted receive.
    fn deliver(&mut self, i: usize) -> bool {
        if self.broken {
            self.wire[i].clear();
            return false;
        }
        let Some(f) = self.wire[i].pop_front() else {
            return false;
        };
        let peer = &mut self.sides[1 - i];
        let slot = peer
            .posted
            .pop_front()
            .expect("RNR: a frame beyond the peer's credit");
        peer.core.memory_mut().recv_slot_mut(slot)[..f.bytes.len()].copy_from_slice(&f.bytes);
        peer.core
            .handle_recv_completion(slot, f.bytes.len() as u32, Ok(()), self.now);
        while peer.core.poll_event().is_some() {}
        if f.signaled {
            self.sides[i].core.handle_send_completion(f.wr_id, Ok(()));
        }
        true
    }
}

/// Message `id` of `len` bytes: its id in the first 8 bytes (when it has room), then a
/// pattern of the id, so loss, duplication, reordering and corruption all show.
fn message(id: u64, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|k| (id.wrapping_mul(131) as usize ^ k.wrapping_mul(7)) as u8)
        .collect();
    if len >= 8 {
        m[..8].copy_from_slice(&id.to_le_bytes());
    }
    m
}

/// What the test does at one step.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// One attempt of the running send (giving up after its patience).
    Send,
    /// One attempt of the running receive.
    Recv,
    Post(usize),
    Deliver(usize),
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        3 => Just(Act::Send),
        3 => Just(Act::Recv),
        2 => (0..2usize).prop_map(Act::Post),
        4 => (0..2usize).prop_map(Act::Deliver),
    ]
}

/// A running operation: how many more attempts it makes before it gives up.
struct Running<O> {
    op: O,
    owned: bool,
    patience: u32,
}

/// The outcome of one attempt of a running operation.
enum Outcome<T> {
    Pending,
    Done(Result<T>),
}

fn step<L: Link, O: Op<L>>(d: &mut L, run: &mut Running<O>) -> Outcome<O::Out> {
    match op::attempt(d, &mut run.op, &mut run.owned) {
        Ok(Some(v)) => Outcome::Done(Ok(v)),
        Ok(None) if run.patience > 0 => {
            run.patience -= 1;
            Outcome::Pending
        }
        Ok(None) => {
            let timeout = Err(NetError::Timeout {
                op: "sim",
                millis: 0,
            });
            Outcome::Done(op::give_up(d, &mut run.op, run.owned, timeout))
        }
        Err(e) => Outcome::Done(op::give_up(d, &mut run.op, run.owned, Err(e))),
    }
}

/// Runs the messages `lens` from side 0 to side 1 under `acts` (repeated), the sends and
/// receives giving up after their patience; then drains with unlimited patience and checks
/// the invariants.
fn run(lens: &[usize], patience: &[u32], acts: &[Act], break_at: Option<usize>) {
    let mut p = SimPair::new();
    let mut recv_failed = false;
    let msgs: Vec<Vec<u8>> = (0..lens.len())
        .map(|i| message(i as u64 + 1, lens[i]))
        .collect();
    let mut next_send = 0;
    let mut patience_of = patience.iter().copied().cycle();
    let mut sending: Option<Running<SendMsg<'_>>> = None;
    let mut recv_buf = vec![0u8; 16 * 1024];
    let mut accepted: Vec<usize> = Vec::new();
    let mut received: Vec<Vec<u8>> = Vec::new();
    let mut recv_patience = patience.iter().copied().cycle().skip(1);
    let mut receiving: Option<u32> = None;
    let batches: Vec<[&[u8]; 1]> = msgs.iter().map(|m| [m.as_slice()]).collect();
    let acts_len = acts.len();
    let mut acts = acts.iter().cycle();
    let mut steps = 0usize;
    let done_sending = |n: usize, s: &Option<Running<SendMsg<'_>>>| n == lens.len() && s.is_none();
    // Phase 1: as the actions say; phase 2 (once every send ended): drain.
    loop {
        steps += 1;
        if break_at == Some(steps) {
            p.break_link();
        }
        assert!(
            steps < 200_000,
            "no progress (a wedge): sent {next_send} of {}, accepted {accepted:?}, received {}, \
             receiving {receiving:?}, wire {} {}, posted {} {}, owners {:?} {:?}, counters {:?} / {:?}",
            lens.len(),
            received.len(),
            p.wire[0].len(),
            p.wire[1].len(),
            p.sides[0].posted.len(),
            p.sides[1].posted.len(),
            p.sides[0].owners,
            p.sides[1].owners,
            p.sides[0].core.counters(),
            p.sides[1].core.counters(),
        );
        let draining = done_sending(next_send, &sending);
        // The random actions for a while (they may starve either side), then a fair cycle.
        let a = if steps > 50 * acts_len {
            match steps % 6 {
                0 => Act::Send,
                1 => Act::Post(0),
                2 => Act::Post(1),
                3 => Act::Deliver(0),
                4 => Act::Deliver(1),
                _ => Act::Recv,
            }
        } else {
            *acts.next().expect("actions")
        };
        match a {
            Act::Send => {
                if sending.is_none() && next_send < lens.len() {
                    sending = Some(Running {
                        op: SendMsg::eager("sim send", &batches[next_send]),
                        owned: false,
                        patience: patience_of.next().unwrap_or(0),
                    });
                }
                if let Some(run) = sending.as_mut() {
                    if let Outcome::Done(r) = step(&mut p.sides[0], run) {
                        match r {
                            Ok(()) => accepted.push(next_send),
                            Err(NetError::Timeout { .. }) => {}
                            Err(NetError::ConnFailed(_)) if p.broken => {}
                            Err(e) => panic!("send {next_send}: {e}"),
                        }
                        assert!(!p.sides[0].owners.owned(super::sides::Side::Send));
                        sending = None;
                        next_send += 1;
                    }
                }
            }
            Act::Recv => {
                let patience = match receiving {
                    Some(left) => left,
                    None if draining => u32::MAX,
                    None => recv_patience.next().unwrap_or(0),
                };
                let mut run = Running {
                    op: RecvInto::new("sim recv", &mut recv_buf),
                    owned: p.sides[1].owners.owned(super::sides::Side::Recv),
                    patience,
                };
                // A receive lasts across steps only through the owners' record and its
                // patience: its buffer is the same between attempts, as a blocked call's is.
                match step(&mut p.sides[1], &mut run) {
                    Outcome::Pending => receiving = Some(run.patience),
                    Outcome::Done(r) => {
                        receiving = None;
                        let got = match &r {
                            Ok(RecvStep::Got(Some(n))) => Some(recv_buf[..*n].to_vec()),
                            _ => None,
                        };
                        // The next call brings a buffer of its own (as a caller would): what
                        // a call that gave up had received must be back in the core.
                        recv_buf.fill(0xee);
                        match r {
                            Ok(RecvStep::Got(Some(_))) => received.extend(got),
                            Ok(RecvStep::Got(None)) => panic!("end of stream without a FIN"),
                            Ok(RecvStep::Rendezvous(_)) => panic!("rendezvous in the simulation"),
                            Err(NetError::Timeout { .. }) => {}
                            Err(NetError::ConnFailed(_)) if p.broken => recv_failed = true,
                            Err(e) => panic!("receive: {e}"),
                        }
                        assert!(!p.sides[1].owners.owned(super::sides::Side::Recv));
                    }
                }
            }
            Act::Post(i) => {
                p.post(i);
            }
            Act::Deliver(i) => {
                p.deliver(i);
            }
        }
        if draining && (received.len() >= accepted.len() || recv_failed) {
            // Everything accepted arrived: a receive still waiting gives up (a timeout), and
            // nothing else may still come.
            if receiving.take().is_some() {
                let mut run = Running {
                    op: RecvInto::new("sim recv", &mut recv_buf),
                    owned: p.sides[1].owners.owned(super::sides::Side::Recv),
                    patience: 0,
                };
                let timeout = Err(NetError::Timeout {
                    op: "sim",
                    millis: 0,
                });
                let r = op::give_up(&mut p.sides[1], &mut run.op, run.owned, timeout);
                assert!(matches!(r, Err(NetError::Timeout { .. })));
                assert!(!p.sides[1].owners.owned(super::sides::Side::Recv));
            }
            for _ in 0..50 {
                p.post(0);
                p.post(1);
                p.deliver(0);
                p.deliver(1);
            }
            let mut run = Running {
                op: RecvInto::new("sim recv", &mut recv_buf),
                owned: false,
                patience: 0,
            };
            if let Outcome::Done(Ok(RecvStep::Got(Some(n)))) = step(&mut p.sides[1], &mut run) {
                assert!(p.broken, "a message that was not accepted arrived ({n} B)");
                received.push(recv_buf[..n].to_vec());
            }
            break;
        }
    }
    assert!(
        !p.sides[0].owners.owned(super::sides::Side::Send),
        "send side left owned"
    );
    assert!(
        !p.sides[1].owners.owned(super::sides::Side::Recv),
        "receive side left owned"
    );
    let want: Vec<&Vec<u8>> = accepted.iter().map(|&i| &msgs[i]).collect();
    let got: Vec<&Vec<u8>> = received.iter().collect();
    if p.broken {
        // A broken link may lose what was accepted, never reorder, duplicate or corrupt.
        assert!(got.len() <= want.len(), "more arrived than was accepted");
    } else {
        assert_eq!(got.len(), want.len(), "accepted {accepted:?}");
    }
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "message {k} (of those accepted) differs");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random sizes (inline, one frame, many fragments, past the credit window), patience
    /// (0: give up after the first attempt that would block) and interleavings.
    #[test]
    fn operations_lose_duplicate_reorder_and_wedge_nothing(
        lens in prop::collection::vec(prop_oneof![0..64usize, 64..600usize, 600..6000usize], 1..12),
        patience in prop::collection::vec(prop_oneof![Just(0u32), 0..4u32, 0..40u32], 1..8),
        acts in prop::collection::vec(act(), 8..64),
        break_at in prop::option::weighted(0.3, 1..400usize),
    ) {
        run(&lens, &patience, &acts, break_at);
    }
}

#[test]
fn a_message_waiting_behind_a_kept_rest_is_not_reported_sent() {
    // F2 as a scenario: the first message begins and times out (its rest is kept), the
    // second never starts before its own timeout; nothing is read meanwhile.
    run(
        &[3000, 3000, 100],
        &[0, 0, 50],
        &[Act::Send, Act::Post(0), Act::Send, Act::Send, Act::Send],
        None,
    );
}
