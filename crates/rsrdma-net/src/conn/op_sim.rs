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
//! Messages at and above a threshold go by rendezvous, as the blocking face sends them: the
//! sender exposes a copy of the slice (an RTS), the receiver's `recv_buffer` pulls it with a
//! READ into its buffer ([`Pull`]), which the link executes in order with the frames on the
//! wire against the sender's exposed memory; a READ of memory its sender already got back
//! is a failure. A pull that gives up mid-READ hands the READ to the link, which moves the
//! message into the core when it lands. A send that gives up with its RTS out waits for the
//! DONE (as `send_lent` does) and then counts as sent; one that a broken link ends may or may
//! not have arrived.
//!
//! Mutations this catches (each checked by hand when it was written, 3 runs of 300 cases):
//! `send_unborrow` answering "kept" for a message never started (F2: an accepted message
//! never arrives), `RecvInto::abandon` not handing the part back (a message arrives
//! corrupted), a give-up that does not free its side (the side stays owned), and
//! `Pull::abandon` not handing its READ over (F3: the receive side wedges). Not here: the
//! wait itself (F1: `progress::wait_until`'s own tests), windows, slices as READ
//! destinations and close, which the device tests cover.

use super::op::{self, Link, Op};
use super::rendezvous::{Pull, Pulled, ReadLink, RecvStep};
use super::sides::Owners;
use super::transfer::{RecvInto, SendMsg, SliceRdv, SliceRendezvous};
use crate::error::{from_core, NetError, Result};
use proptest::prelude::*;
use rsrdma_proto::{
    settle, Config, Conn as Core, Fatal, Step, VecSlots, Work, WrId, FEATURE_RENDEZVOUS,
};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Messages of at least this many bytes go by rendezvous.
const THRESHOLD: usize = 3000;
/// The largest message.
const MAX_MESSAGE: usize = 16 * 1024;
/// The key of the receiver's buffer, which READs land in (at address 0).
const BUFFER_LKEY: u32 = 1;

/// One end: a core over plain memory, its posted receives, and the owners' record; as a
/// sender, the rendezvous messages it exposes; as a receiver, the buffer READs land in.
struct SimSide {
    core: Core<VecSlots>,
    owners: Owners,
    posted: VecDeque<u16>,
    /// Exposed rendezvous messages by key: copies of the caller's slices, removed when the
    /// call gets its slice back (a READ after that is a failure).
    exposed: HashMap<u32, Vec<u8>>,
    /// Message number → key of the exposed copy.
    exposed_msg: HashMap<u64, u32>,
    next_rkey: u32,
    /// The receive buffer.
    buffer: Vec<u8>,
    /// A READ holds the buffer (from its start until its message is taken, or landed into
    /// the core after its call gave up).
    held: bool,
    /// The call reading into the buffer gave up: the message's length, to move into the
    /// core when the READ lands.
    orphaned: Option<usize>,
}

impl SimSide {
    /// As the driver's step does after completions: a READ whose call gave up landed, so
    /// its message becomes the core's head and the buffer is free.
    fn land_orphan(&mut self) {
        let Some(len) = self.orphaned else {
            return;
        };
        if !self.core.read_landed() {
            return;
        }
        self.orphaned = None;
        self.held = false;
        let msg = self.buffer[..len].to_vec();
        assert!(
            self.core.take_read_into_core(msg),
            "a landed read did not match its message"
        );
    }
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
    /// As the driver's: queue the RTS (exposing a copy under a new key), then wait for the
    /// release.
    fn send_slice_rdv(&mut self, m: &[u8], slot: &mut Option<SliceRdv>) -> Result<bool> {
        match slot.as_ref().and_then(SliceRdv::msg) {
            None => {
                let rkey = self.next_rkey;
                match self.core.send_rendezvous(m.len(), 0, rkey) {
                    Ok(Step::Done(msg)) => {
                        self.next_rkey += 1;
                        self.exposed.insert(rkey, m.to_vec());
                        self.exposed_msg.insert(msg, rkey);
                        *slot = Some(SliceRdv::queued(msg));
                    }
                    Ok(Step::Blocked) => {}
                    Err(e) => return Err(from_core(e)),
                }
                Ok(false)
            }
            Some(msg) if self.core.rendezvous_released(msg) => {
                self.drop_send(msg, true);
                *slot = None;
                Ok(true)
            }
            Some(_) => self.check_failed().map(|()| false),
        }
    }

    fn drop_send(&mut self, msg: u64, _: bool) {
        if let Some(k) = self.exposed_msg.remove(&msg) {
            self.exposed.remove(&k);
        }
    }
}

impl ReadLink for SimSide {
    type Hold = ();

    fn hold_read(&mut self, (): ()) {
        self.held = true;
    }

    fn end_read(&mut self) {
        self.held = false;
    }

    fn orphan_buffer_read(&mut self, len: usize) {
        if self.held {
            self.orphaned = Some(len);
            self.land_orphan();
        }
    }
}

/// A request on the wire: a SEND's bytes (and its completion to give when it lands), or a
/// READ of the peer's memory.
enum Frame {
    Send {
        bytes: Vec<u8>,
        wr_id: WrId,
        signaled: bool,
    },
    /// A [`Work::PostRead`].
    Read(Work),
}

struct SimPair {
    sides: [SimSide; 2],
    /// Frames from side `i` to the other, in order.
    wire: [VecDeque<Frame>; 2],
    now: Instant,
    /// The link broke (a QP in ERROR): nothing more is delivered, both cores failed.
    broken: bool,
}

/// Small slots and few credits, so that messages fragment and credits run out often;
/// rendezvous from [`THRESHOLD`]; no timers (the simulation has no clock to speak of).
fn config() -> Config {
    Config::default()
        .with_slot_size(256)
        .with_recv_slots(8)
        .with_send_slots(6)
        .with_sq_depth(8)
        .with_signal_interval(4)
        .with_inline_size(64)
        .with_max_message(MAX_MESSAGE as u32)
        .with_keepalive(None)
        .with_features(FEATURE_RENDEZVOUS)
        .with_rdv_threshold(THRESHOLD as u32)
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
                exposed: HashMap::new(),
                exposed_msg: HashMap::new(),
                next_rkey: 1,
                buffer: vec![0; MAX_MESSAGE],
                held: false,
                orphaned: None,
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
                    self.wire[i].push_back(Frame::Send {
                        bytes,
                        wr_id,
                        signaled,
                    });
                }
                read @ Work::PostRead { .. } => self.wire[i].push_back(Frame::Read(read)),
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

    /// Lands the oldest request from side `i`: a SEND in the other side's oldest posted
    /// receive, a READ in side `i`'s buffer from the other side's exposed memory.
    fn deliver(&mut self, i: usize) -> bool {
        if self.broken {
            self.wire[i].clear();
            return false;
        }
        let Some(f) = self.wire[i].pop_front() else {
            return false;
        };
        match f {
            Frame::Send {
                bytes,
                wr_id,
                signaled,
            } => {
                let peer = &mut self.sides[1 - i];
                let slot = peer
                    .posted
                    .pop_front()
                    .expect("RNR: a frame beyond the peer's credit");
                peer.core.memory_mut().recv_slot_mut(slot)[..bytes.len()].copy_from_slice(&bytes);
                peer.core
                    .handle_recv_completion(slot, bytes.len() as u32, Ok(()), self.now);
                while peer.core.poll_event().is_some() {}
                if signaled {
                    self.sides[i].core.handle_send_completion(wr_id, Ok(()));
                }
            }
            Frame::Read(Work::PostRead {
                wr_id,
                local_addr,
                lkey,
                remote_addr,
                rkey,
                len,
            }) => {
                let source = self.sides[1 - i]
                    .exposed
                    .get(&rkey)
                    .expect("a READ of memory its sender already got back");
                let (from, len, to) = (remote_addr as usize, len as usize, local_addr as usize);
                let bytes = source[from..from + len].to_vec();
                let me = &mut self.sides[i];
                assert_eq!(
                    lkey, BUFFER_LKEY,
                    "a READ into memory that is not the buffer"
                );
                assert!(me.held, "a READ into a buffer nobody holds");
                me.buffer[to..to + len].copy_from_slice(&bytes);
                me.core.handle_send_completion(wr_id, Ok(()));
                while me.core.poll_event().is_some() {}
                me.land_orphan();
            }
            Frame::Read(other) => panic!("not a READ: {other:?}"),
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

/// How a send ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// `Ok`: the peer gets it whole.
    Accepted,
    /// `Timeout`: nothing of it was sent.
    Refused,
    /// The link broke: it may or may not arrive (whole, if at all).
    Uncertain,
}

/// The receiver's `recv_buffer` call in progress.
enum Receiving {
    /// Waiting for its side, or for a message (`RecvInto`), with this patience left.
    Into(u32),
    /// Pulling a rendezvous message into the buffer.
    Pulling(Running<Pull<'static, ()>>),
}

/// Checks what arrived against how the sends ended: in order, each whole and once; an
/// accepted message is never skipped, a refused one never arrives, an uncertain one may be
/// missing; with the link intact every accepted message arrived.
fn check_arrivals(msgs: &[Vec<u8>], sent: &[Sent], received: &[Vec<u8>], broken: bool) {
    let candidates: Vec<(usize, Sent)> = sent
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, s)| s != Sent::Refused)
        .collect();
    let mut next = 0;
    for (k, got) in received.iter().enumerate() {
        loop {
            let Some(&(m, how)) = candidates.get(next) else {
                panic!(
                    "arrival {k} ({} B) is none of the messages sent: {sent:?}",
                    got.len()
                );
            };
            next += 1;
            if &msgs[m] == got {
                break;
            }
            assert!(
                how == Sent::Uncertain,
                "message {m} was accepted but arrival {k} differs (lost, reordered, duplicated \
                 or corrupted): {sent:?}"
            );
        }
    }
    if !broken {
        let missing: Vec<usize> = candidates[next..]
            .iter()
            .filter(|&&(_, how)| how == Sent::Accepted)
            .map(|&(m, _)| m)
            .collect();
        assert!(
            missing.is_empty(),
            "accepted, never arrived: {missing:?} ({sent:?})"
        );
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
    // A send that gave up with its RTS out waits for the DONE: (message number, its result).
    let mut grace: Option<(u64, Result<()>)> = None;
    let mut recv_buf = vec![0u8; MAX_MESSAGE];
    let mut sent: Vec<Sent> = Vec::new();
    let mut received: Vec<Vec<u8>> = Vec::new();
    let mut recv_patience = patience.iter().copied().cycle().skip(1);
    let mut receiving: Option<Receiving> = None;
    let batches: Vec<[&[u8]; 1]> = msgs.iter().map(|m| [m.as_slice()]).collect();
    let acts_len = acts.len();
    let mut acts = acts.iter().cycle();
    let mut steps = 0usize;
    let accepted = |sent: &[Sent]| sent.iter().filter(|&&s| s == Sent::Accepted).count();
    // Phase 1: as the actions say; phase 2 (once every send ended): drain.
    loop {
        steps += 1;
        if break_at == Some(steps) {
            p.break_link();
        }
        assert!(
            steps < 200_000,
            "no progress (a wedge): sent {next_send} of {}, {sent:?}, received {}, wire {} {}, \
             posted {} {}, owners {:?} {:?}, buffer held {} orphaned {:?}, counters {:?} / {:?}",
            lens.len(),
            received.len(),
            p.wire[0].len(),
            p.wire[1].len(),
            p.sides[0].posted.len(),
            p.sides[1].posted.len(),
            p.sides[0].owners,
            p.sides[1].owners,
            p.sides[1].held,
            p.sides[1].orphaned,
            p.sides[0].core.counters(),
            p.sides[1].core.counters(),
        );
        let draining = next_send == lens.len() && sending.is_none() && grace.is_none();
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
                if let Some((msg, r)) = grace.take() {
                    // `send_lent`'s wait for the DONE (bounded there; here, until the link
                    // breaks): the caller gets its slice back only after it.
                    let side = &mut p.sides[0];
                    if side.core.rendezvous_released(msg) {
                        side.drop_send(msg, true);
                        sent.push(match r {
                            Ok(()) | Err(NetError::Timeout { .. }) => Sent::Accepted,
                            Err(e) => panic!("send {next_send}: {e}"),
                        });
                        next_send += 1;
                    } else if side.core.error().is_some() {
                        side.drop_send(msg, false);
                        sent.push(Sent::Uncertain);
                        next_send += 1;
                    } else {
                        grace = Some((msg, r));
                    }
                    continue;
                }
                if sending.is_none() && next_send < lens.len() {
                    sending = Some(Running {
                        op: SendMsg::with_threshold("sim send", &batches[next_send], THRESHOLD),
                        owned: false,
                        patience: patience_of.next().unwrap_or(0),
                    });
                }
                if let Some(run) = sending.as_mut() {
                    if let Outcome::Done(r) = step(&mut p.sides[0], run) {
                        assert!(!p.sides[0].owners.owned(super::sides::Side::Send));
                        if let Some(msg) = run.op.take_rts_out() {
                            grace = Some((msg, r));
                            sending = None;
                            continue;
                        }
                        sent.push(match r {
                            Ok(()) => Sent::Accepted,
                            Err(NetError::Timeout { .. }) => Sent::Refused,
                            Err(NetError::ConnFailed(_)) if p.broken => Sent::Uncertain,
                            Err(e) => panic!("send {next_send}: {e}"),
                        });
                        sending = None;
                        next_send += 1;
                    }
                }
            }
            Act::Recv => {
                let fresh = |draining: bool, it: &mut dyn Iterator<Item = u32>| {
                    if draining {
                        u32::MAX
                    } else {
                        it.next().unwrap_or(0)
                    }
                };
                match receiving.take() {
                    Some(Receiving::Pulling(mut run)) => match step(&mut p.sides[1], &mut run) {
                        Outcome::Pending => receiving = Some(Receiving::Pulling(run)),
                        Outcome::Done(Ok(Pulled::Done(n))) => {
                            received.push(p.sides[1].buffer[..n].to_vec());
                        }
                        Outcome::Done(Ok(Pulled::Retry)) => {}
                        Outcome::Done(Err(NetError::Timeout { .. })) => {}
                        Outcome::Done(Err(NetError::ConnFailed(_))) if p.broken => {
                            recv_failed = true;
                        }
                        Outcome::Done(Err(e)) => panic!("pull: {e}"),
                    },
                    r => {
                        let patience = match r {
                            Some(Receiving::Into(left)) => left,
                            _ => fresh(draining, &mut recv_patience),
                        };
                        let side = &mut p.sides[1];
                        if side.held {
                            // `recv_buffer` first waits until its buffer is no longer in
                            // flight (a READ whose call gave up); a failure ends that wait.
                            if side.core.error().is_some() {
                                recv_failed = true;
                            } else if patience > 0 {
                                receiving = Some(Receiving::Into(patience - 1));
                            }
                            continue;
                        }
                        let mut run = Running {
                            op: RecvInto::new("sim recv", &mut recv_buf),
                            owned: side.owners.owned(super::sides::Side::Recv),
                            patience,
                        };
                        // A receive lasts across steps only through the owners' record and
                        // its patience: its buffer is the same between attempts, as a
                        // blocked call's is.
                        match step(side, &mut run) {
                            Outcome::Pending => receiving = Some(Receiving::Into(run.patience)),
                            Outcome::Done(r) => {
                                let got = match &r {
                                    Ok(RecvStep::Got(Some(n))) => Some(recv_buf[..*n].to_vec()),
                                    _ => None,
                                };
                                // The next call brings a buffer of its own (as a caller
                                // would): what a call that gave up had received must be back
                                // in the core.
                                recv_buf.fill(0xee);
                                match r {
                                    Ok(RecvStep::Got(Some(_))) => received.extend(got),
                                    Ok(RecvStep::Got(None)) => {
                                        panic!("end of stream without a FIN")
                                    }
                                    Ok(RecvStep::Rendezvous(len)) => {
                                        receiving = Some(Receiving::Pulling(Running {
                                            op: Pull::into_buffer(
                                                "sim pull",
                                                len,
                                                (0, BUFFER_LKEY, MAX_MESSAGE),
                                                (),
                                            ),
                                            owned: false,
                                            patience: fresh(draining, &mut recv_patience),
                                        }));
                                    }
                                    Err(NetError::Timeout { .. }) => {}
                                    Err(NetError::ConnFailed(_)) if p.broken => recv_failed = true,
                                    Err(e) => panic!("receive: {e}"),
                                }
                                assert!(!p.sides[1].owners.owned(super::sides::Side::Recv));
                            }
                        }
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
        if draining && (received.len() >= accepted(&sent) || recv_failed) {
            // Everything accepted arrived: a receive still waiting gives up (a timeout), and
            // nothing else may still come.
            let timeout = || NetError::Timeout {
                op: "sim",
                millis: 0,
            };
            match receiving.take() {
                Some(Receiving::Into(_)) => {
                    let mut op = RecvInto::new("sim recv", &mut recv_buf);
                    let owned = p.sides[1].owners.owned(super::sides::Side::Recv);
                    let r = op::give_up(&mut p.sides[1], &mut op, owned, Err(timeout()));
                    assert!(matches!(r, Err(NetError::Timeout { .. })));
                }
                Some(Receiving::Pulling(mut run)) => {
                    let r = op::give_up(&mut p.sides[1], &mut run.op, run.owned, Err(timeout()));
                    assert!(matches!(r, Err(NetError::Timeout { .. })));
                }
                None => {}
            }
            assert!(!p.sides[1].owners.owned(super::sides::Side::Recv));
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
            match step(&mut p.sides[1], &mut run) {
                Outcome::Done(Ok(RecvStep::Got(Some(n)))) => {
                    received.push(recv_buf[..n].to_vec());
                }
                Outcome::Done(Ok(RecvStep::Rendezvous(len))) => {
                    panic!("a rendezvous message of {len} B is still queued after the last accepted one")
                }
                _ => {}
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
    check_arrivals(&msgs, &sent, &received, p.broken);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random sizes (inline, one frame, many fragments, past the credit window, rendezvous),
    /// patience
    /// (0: give up after the first attempt that would block) and interleavings.
    #[test]
    fn operations_lose_duplicate_reorder_and_wedge_nothing(
        lens in prop::collection::vec(
            prop_oneof![0..64usize, 64..600usize, 600..THRESHOLD, THRESHOLD..12_000],
            1..12,
        ),
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
        &[2500, 2500, 100],
        &[0, 0, 50],
        &[Act::Send, Act::Post(0), Act::Send, Act::Send, Act::Send],
        None,
    );
}

#[test]
fn a_pull_that_gives_up_mid_read_leaves_the_message_for_the_next_read() {
    // F3 as a scenario: the RTS of a rendezvous message arrives, `recv_buffer` starts its
    // READ and gives up at once (a timeout) before the READ lands; a later read gets the
    // message whole, and nothing wedges.
    run(
        &[5000, 100],
        &[50, 0, 0],
        &[
            Act::Send,
            Act::Post(0),
            Act::Deliver(0),
            Act::Recv,
            Act::Recv,
        ],
        None,
    );
}
