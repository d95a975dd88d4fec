//! Scripted tests (smoltcp style): inputs in, the exact `Work` out.
//!
//! Geometry: 256-byte slots (240 payload bytes per frame), 8 receive slots on both sides (so 8
//! initial credits, 5 usable for data), 8 send slots, SQ depth 16, signal every 4th WR, frames
//! up to 64 bytes inline.

mod util;

use rsrdma_proto::frame::{abort_code, FLAG_FIRST, FLAG_LAST};
use rsrdma_proto::{
    settle, Config, Conn, Event, FrameType, Header, LentPayload, ProtoError, Recv, Step, VecSlots,
    Work, WrId, FEATURE_SHARED_POOL, HEADER_LEN,
};
use std::time::{Duration, Instant};
use util::done;

fn cfg() -> Config {
    Config::default()
        .with_slot_size(256)
        .with_recv_slots(8)
        .with_send_slots(8)
        .with_sq_depth(16)
        .with_signal_interval(4)
        .with_inline_size(64)
        .with_max_message(4096)
}

struct Script {
    c: Conn<VecSlots>,
    t0: Instant,
    /// Cumulative credit limit the fake peer grants.
    peer_grant: u32,
    /// Next receive slot the fake peer's frames land in (the core posts 0..8 in order and
    /// reposts in consumption order; scripts pick slots explicitly where it matters).
    next_slot: u16,
}

impl Script {
    fn new(cfg: Config) -> Self {
        let settled = settle(&cfg.params(), &cfg.params()).unwrap();
        let t0 = Instant::now();
        let mut c = Conn::new(&cfg, &settled, VecSlots::for_config(&cfg), t0).unwrap();
        let first: Vec<Work> = std::iter::from_fn(|| c.poll_work()).collect();
        let want: Vec<Work> = (0..cfg.recv_slots)
            .map(|slot| Work::PostRecv { slot })
            .collect();
        assert_eq!(first, want, "every receive slot is posted at creation");
        Self {
            c,
            t0,
            peer_grant: u32::from(cfg.recv_slots),
            next_slot: 0,
        }
    }

    fn work(&mut self) -> Vec<Work> {
        std::iter::from_fn(|| self.c.poll_work()).collect()
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.c.poll_event()).collect()
    }

    /// A frame from the fake peer into the next receive slot.
    fn arrive(&mut self, h: Header, payload: &[u8]) -> u16 {
        let slot = self.next_slot;
        self.next_slot += 1;
        self.arrive_in(slot, h, payload);
        slot
    }

    fn arrive_in(&mut self, slot: u16, h: Header, payload: &[u8]) {
        let len = self.land(slot, h, payload);
        self.c.handle_recv_completion(slot, len, Ok(()), self.t0);
    }

    /// `arrive`, with the completion taken for a reader waiting with `buf`.
    fn arrive_into(&mut self, h: Header, payload: &[u8], buf: &mut [u8]) -> Option<usize> {
        let slot = self.next_slot;
        self.next_slot += 1;
        let len = self.land(slot, h, payload);
        self.c
            .handle_recv_completion_into(slot, len, Ok(()), self.t0, buf)
    }

    /// Writes the fake peer's frame (with its credit) into receive slot `slot`; its length.
    fn land(&mut self, slot: u16, mut h: Header, payload: &[u8]) -> u32 {
        h.credit_limit = self.peer_grant;
        let len = HEADER_LEN + payload.len();
        let mem = self.c.memory_mut().recv_slot_mut(slot);
        mem[..HEADER_LEN].copy_from_slice(&h.encode());
        mem[HEADER_LEN..len].copy_from_slice(payload);
        len as u32
    }

    /// Header and payload of a posted send.
    fn sent(&self, w: &Work) -> (Header, Vec<u8>) {
        let Work::PostSend {
            wr_id, slot, len, ..
        } = *w
        else {
            panic!("{w:?} is not a send")
        };
        let bytes = match slot {
            None => self.c.inline_frame(wr_id).unwrap().to_vec(),
            Some(s) => self.c.memory().send_slot(s)[..len as usize].to_vec(),
        };
        (
            Header::decode(&bytes).unwrap(),
            bytes[HEADER_LEN..].to_vec(),
        )
    }
}

/// The header of message 0 offered by rendezvous (an RTS), `len` bytes long; its 16-byte
/// payload (address, rkey) is the caller's.
fn rts(len: u32) -> Header {
    Header {
        kind: FrameType::Rts,
        flags: 0,
        msg_id: 0,
        credit_limit: 0,
        payload_len: 16,
        aux: len,
    }
}

fn send(wr: u64, slot: Option<u16>, len: u32, signaled: bool) -> Work {
    Work::PostSend {
        wr_id: WrId(wr),
        slot,
        len,
        signaled,
        lent: None,
    }
}

/// A SEND whose header is in `slot` and whose payload is lent memory.
fn send_lent(wr: u64, slot: u16, signaled: bool, addr: u64, payload: u32) -> Work {
    Work::PostSend {
        wr_id: WrId(wr),
        slot: Some(slot),
        len: HEADER_LEN as u32 + payload,
        signaled,
        lent: Some(LentPayload {
            addr,
            lkey: LKEY,
            len: payload,
        }),
    }
}

const LKEY: u32 = 0x5eed;
const ADDR: u64 = 0x10_0000;

fn single(msg_id: u16, payload: &[u8]) -> Header {
    Header {
        kind: FrameType::Data,
        flags: FLAG_FIRST | FLAG_LAST,
        msg_id,
        credit_limit: 0,
        payload_len: payload.len() as u32,
        aux: payload.len() as u32,
    }
}

fn fragment(flags: u8, msg_id: u16, len: usize, total: u32) -> Header {
    Header {
        kind: FrameType::Data,
        flags,
        msg_id,
        credit_limit: 0,
        payload_len: len as u32,
        aux: if flags & FLAG_FIRST != 0 { total } else { 0 },
    }
}

#[test]
fn a_small_message_goes_inline_and_is_read_in_place() {
    let mut s = Script::new(cfg());
    done(s.c.send_msg(b"hello"));
    let w = s.work();
    assert_eq!(w, [send(0, None, 21, false)]);
    let (h, p) = s.sent(&w[0]);
    assert_eq!(
        h,
        Header {
            credit_limit: 8,
            ..single(0, b"hello")
        }
    );
    assert_eq!(p, b"hello");

    s.arrive(single(0, b"world"), b"world");
    assert_eq!(
        s.work(),
        [],
        "the slot stays lent until the message is read"
    );
    assert_eq!(s.events(), [Event::Readable]);
    let mut buf = [0u8; 16];
    assert_eq!(s.c.recv_msg_into(&mut buf), Ok(Recv::Data(5)));
    assert_eq!(&buf[..5], b"world");
    assert_eq!(s.work(), [Work::PostRecv { slot: 0 }]);
    assert_eq!(s.c.recv_msg_into(&mut buf), Ok(Recv::Blocked));
}

#[test]
fn a_waiting_reader_takes_a_whole_message_from_its_completion_in_order_only() {
    let mut s = Script::new(cfg());
    let mut buf = [0u8; 16];
    // The next message, whole, fitting: straight into the buffer, its slot reposted.
    assert_eq!(s.arrive_into(single(0, b"one"), b"one", &mut buf), Some(3));
    assert_eq!(&buf[..3], b"one");
    assert_eq!(s.work(), [Work::PostRecv { slot: 0 }]);
    assert_eq!(s.c.recv_msg_into(&mut buf), Ok(Recv::Blocked));
    assert_eq!(s.c.counters().messages_received, 1);
    // Too large for the buffer: queued as usual, and read whole later.
    let msg = [7u8; 40];
    assert_eq!(s.arrive_into(single(1, &msg), &msg, &mut buf), None);
    assert_eq!(s.work(), []);
    // Queued behind it: a message that would not be the next one read is not taken.
    assert_eq!(s.arrive_into(single(2, b"two"), b"two", &mut buf), None);
    let mut big = [0u8; 64];
    assert_eq!(s.c.recv_msg_into(&mut big), Ok(Recv::Data(40)));
    assert_eq!(s.c.recv_msg_into(&mut big), Ok(Recv::Data(3)));
    assert_eq!(&big[..3], b"two");
    // A first fragment is never taken (it is reassembled or read directly).
    let first = fragment(FLAG_FIRST, 3, 240, 300);
    assert_eq!(s.arrive_into(first, &[1u8; 240], &mut big), None);
    assert!(s.c.recv_incomplete());
}

#[test]
fn a_fragmented_message_uses_slots_and_reassembles() {
    let mut s = Script::new(cfg());
    let msg: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
    done(s.c.send_msg(&msg));
    let w = s.work();
    assert_eq!(
        w,
        [
            send(0, Some(0), 256, false),
            send(1, Some(1), 256, false),
            send(2, Some(2), 136, false)
        ]
    );
    let frames: Vec<(Header, Vec<u8>)> = w.iter().map(|w| s.sent(w)).collect();
    assert_eq!(
        frames[0].0,
        Header {
            credit_limit: 8,
            ..fragment(FLAG_FIRST, 0, 240, 600)
        }
    );
    assert_eq!(
        frames[1].0,
        Header {
            credit_limit: 8,
            ..fragment(0, 0, 240, 0)
        }
    );
    assert_eq!(
        frames[2].0,
        Header {
            credit_limit: 8,
            ..fragment(FLAG_LAST, 0, 120, 0)
        }
    );
    let joined: Vec<u8> = frames.iter().flat_map(|f| f.1.clone()).collect();
    assert_eq!(joined, msg);

    // Receiving: each fragment is copied into the reassembly buffer and its slot goes back.
    s.arrive(fragment(FLAG_FIRST, 0, 240, 600), &msg[..240]);
    assert_eq!(s.work(), [Work::PostRecv { slot: 0 }]);
    assert_eq!(s.c.recv_msg(), Ok(Recv::Blocked), "incomplete");
    s.arrive(fragment(0, 0, 240, 0), &msg[240..480]);
    s.arrive(fragment(FLAG_LAST, 0, 120, 0), &msg[480..]);
    // With 8 slots a quarter of the ring is 2: once the driver took the second repost (its
    // credit counts from then), that is worth a CREDIT frame, which comes after both.
    let w = s.work();
    assert_eq!(
        w,
        [
            Work::PostRecv { slot: 1 },
            Work::PostRecv { slot: 2 },
            send(3, None, 16, true)
        ]
    );
    assert_eq!(
        s.sent(&w[2]).0,
        Header::control(FrameType::Credit, 0, 11, 0)
    );
    assert_eq!(s.events(), [Event::Readable]);
    assert_eq!(s.c.recv_msg(), Ok(Recv::Data(msg)));
}

#[test]
fn credit_exhaustion_blocks_data_and_a_credit_frame_releases_it() {
    let mut s = Script::new(cfg());
    for i in 0..5u8 {
        done(s.c.send_msg(&[i]));
    }
    assert_eq!(
        s.work().len(),
        5,
        "8 credits, 3 kept for control: 5 data frames"
    );
    done(s.c.send_msg(b"sixth")); // accepted, held by the core
    assert_eq!(s.work(), []);
    assert_eq!(s.c.counters().queued_send_bytes, 5);
    assert_eq!(s.c.send_msg(b"seventh"), Ok(Step::Blocked));

    s.peer_grant += 1;
    s.arrive(Header::control(FrameType::Credit, 0, 0, 0), &[]);
    let w = s.work();
    assert_eq!(w, [Work::PostRecv { slot: 0 }, send(5, None, 21, false)]);
    let (h, p) = s.sent(&w[1]);
    assert_eq!(
        (h.msg_id, h.credit_limit, &p[..]),
        (5, 8, &b"sixth"[..]),
        "built before the driver took the CREDIT's repost: it does not announce it"
    );
    assert_eq!(s.events(), [Event::Writable]);
    assert_eq!(s.c.send_msg(b"seventh"), Ok(Step::Done(())));
    assert_eq!(s.work(), [], "back at the reserve");
    let c = s.c.counters();
    assert_eq!(
        (c.grant, c.announced),
        (9, 8),
        "the repost counts once taken; the next frame announces it"
    );
}

#[test]
fn the_control_reserve_carries_fin_and_pong_while_data_is_blocked() {
    let mut s = Script::new(cfg());
    for i in 0..5u8 {
        done(s.c.send_msg(&[i]));
    }
    s.work();
    s.arrive(Header::control(FrameType::Ping, 0, 0, 77), &[]);
    let w = s.work();
    assert_eq!(w, [Work::PostRecv { slot: 0 }, send(5, None, 16, false)]);
    // Built in the same input as the PING's repost, before the driver took it: the PONG
    // does not announce that slot; the FIN, built after, does.
    assert_eq!(s.sent(&w[1]).0, Header::control(FrameType::Pong, 0, 8, 77));
    s.c.shutdown_write().unwrap();
    let w = s.work();
    assert_eq!(w, [send(6, None, 16, true)], "FIN is signalled");
    assert_eq!(s.sent(&w[0]).0, Header::control(FrameType::Fin, 5, 9, 0));
    assert_eq!(
        s.c.send_msg(b"x"),
        Err(ProtoError::Closed { op: "send_msg" })
    );
    // One credit left and nothing new to announce: a PING must wait (it would strand us at 0).
    s.c.handle_timeout(s.t0 + Duration::from_secs(1));
    assert_eq!(s.work(), []);
}

#[test]
fn data_spending_the_peers_control_reserve_aborts() {
    let mut s = Script::new(cfg());
    for i in 0..5u16 {
        s.arrive(single(i, b"d"), b"d");
    }
    assert!(s.c.error().is_none());
    s.arrive(single(5, b"d"), b"d");
    assert_eq!(s.c.error(), Some(&ProtoError::ReserveViolated));
    let w = s.work();
    assert_eq!(w, [send(0, None, 16, true)]);
    assert_eq!(
        s.sent(&w[0]).0,
        Header::control(FrameType::Abort, 0, 8, abort_code::CREDIT)
    );
}

#[test]
fn selective_signalling_every_kth_and_when_the_sq_runs_low() {
    let c = cfg().with_sq_depth(8).with_recv_slots(32);
    let mut s = Script::new(c);
    for i in 0..8u8 {
        done(s.c.send_msg(&[i]));
    }
    let sig: Vec<bool> = s
        .work()
        .iter()
        .map(|w| matches!(w, Work::PostSend { signaled: true, .. }))
        .collect();
    assert_eq!(sig, [false, false, false, true, true, true, true, true]);
    done(s.c.send_msg(b"ninth"));
    assert_eq!(s.work(), [], "SQ full");
    s.c.handle_send_completion(WrId(3), Ok(()));
    assert_eq!(
        s.work(),
        [send(8, None, 21, true)],
        "4 entries free, fewer than k=4 after it"
    );
    assert_eq!(s.c.counters().sq_outstanding, 5);
    // A successful completion for an unsignalled WR is a driver bug.
    let mut s = Script::new(cfg());
    done(s.c.send_msg(b"a"));
    s.work();
    s.c.handle_send_completion(WrId(0), Ok(()));
    assert!(matches!(s.c.error(), Some(ProtoError::Misuse { .. })));
}

#[test]
fn send_slots_are_freed_by_a_later_signalled_completion() {
    let mut s = Script::new(cfg().with_recv_slots(32));
    let big = vec![7u8; 200];
    for _ in 0..8 {
        done(s.c.send_msg(&big));
    }
    let w = s.work();
    let slots: Vec<Option<u16>> = w
        .iter()
        .map(|w| match w {
            Work::PostSend { slot, .. } => *slot,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(slots, (0..8).map(Some).collect::<Vec<_>>());
    assert_eq!(s.c.counters().free_send_slots, 0);
    done(s.c.send_msg(&big));
    assert_eq!(s.work(), [], "no free send slot");
    s.c.handle_send_completion(WrId(7), Ok(()));
    assert_eq!(s.c.counters().free_send_slots, 7);
    assert_eq!(s.work().len(), 1);
}

#[test]
fn fin_goes_after_all_queued_data_and_drains() {
    let mut s = Script::new(cfg());
    let msg = vec![1u8; 240 * 7];
    done(s.c.send_msg(&msg));
    assert_eq!(s.work().len(), 5);
    s.c.shutdown_write().unwrap();
    assert_eq!(s.work(), [], "FIN waits for the rest of the message");
    s.peer_grant += 4;
    s.arrive(Header::control(FrameType::Credit, 0, 0, 0), &[]);
    let w = s.work();
    assert_eq!(w.len(), 4);
    assert_eq!(s.sent(&w[1]).0.flags, 0);
    assert_eq!(s.sent(&w[2]).0.flags, FLAG_LAST);
    assert_eq!(w[3], send(7, None, 16, true));
    assert_eq!(s.sent(&w[3]).0.kind, FrameType::Fin);
    assert!(!s.c.is_drained());
    s.c.handle_send_completion(WrId(7), Ok(()));
    assert!(s.c.is_drained());
}

#[test]
fn a_short_buffer_does_not_consume_the_message() {
    let mut s = Script::new(cfg());
    let msg = [9u8; 100];
    s.arrive(single(0, &msg), &msg);
    let mut small = [0u8; 10];
    assert_eq!(
        s.c.recv_msg_into(&mut small),
        Err(ProtoError::ShortBuffer { needed: 100 })
    );
    assert_eq!(s.work(), []);
    // A stream read takes a part; the message read then returns the rest.
    assert_eq!(s.c.read(&mut small), Ok(Recv::Data(10)));
    assert_eq!(
        s.c.recv_msg_into(&mut small),
        Err(ProtoError::ShortBuffer { needed: 90 })
    );
    let mut big = [0u8; 100];
    assert_eq!(s.c.recv_msg_into(&mut big), Ok(Recv::Data(90)));
    assert_eq!(s.work(), [Work::PostRecv { slot: 0 }]);
}

#[test]
fn stream_reads_cross_messages_and_skip_empty_ones() {
    let mut s = Script::new(cfg());
    s.arrive(single(0, b"ab"), b"ab");
    s.arrive(single(1, b""), b"");
    s.arrive(single(2, b"cd"), b"cd");
    let mut buf = [0u8; 8];
    assert_eq!(s.c.read(&mut buf), Ok(Recv::Data(4)));
    assert_eq!(&buf[..4], b"abcd");
    assert_eq!(s.c.read(&mut buf), Ok(Recv::Blocked));
    s.arrive(Header::control(FrameType::Fin, 3, 0, 0), &[]);
    assert_eq!(s.events(), [Event::PeerClosed, Event::Readable]);
    assert_eq!(s.c.read(&mut buf), Ok(Recv::Eof), "EOF");
    assert_eq!(s.c.recv_msg(), Ok(Recv::Eof), "EOF");
}

/// A stream read that got what it asked for stops there: an empty message after the one it
/// finished is left for a message read (an outside tester's `read_exact` of a 100-byte
/// message swallowed the empty message behind it, and `recv_msg` returned the one after).
#[test]
fn a_satisfied_stream_read_leaves_the_empty_message_after_it() {
    let mut s = Script::new(cfg());
    s.arrive(single(0, b"ab"), b"ab");
    s.arrive(single(1, b""), b"");
    s.arrive(single(2, b"c"), b"c");
    let mut two = [0u8; 2];
    assert_eq!(s.c.read(&mut two), Ok(Recv::Data(2)));
    assert_eq!(
        s.c.recv_msg(),
        Ok(Recv::Data(Vec::new())),
        "the empty message"
    );
    assert_eq!(s.c.recv_msg(), Ok(Recv::Data(b"c".to_vec())));
}

/// While this side's receive pool ran low, a silent peer is probed and given more time, up
/// to four times `peer_timeout` of silence (its frames may be waiting in RNR retries for
/// room in the pool); silence from before the pool ran low is held against it as usual.
#[test]
fn a_low_pool_excuses_a_silent_peer_for_a_while() {
    let mut s = Script::new(cfg());
    let t0 = s.t0;
    let sec = Duration::from_secs;
    // Ticking every second; the pool ran low at 1 s, after the peer was last heard (at 0).
    for t in 1..5 {
        s.c.handle_timeout(t0 + sec(t));
    }
    let _ = s.work();
    assert!(
        s.c.excuse_silence(t0 + sec(5), t0 + sec(1)),
        "excused at 5 s"
    );
    s.c.handle_timeout(t0 + sec(5));
    assert!(s.c.error().is_none());
    let w = s.work();
    assert!(
        w.iter().any(|w| s.sent(w).0.kind == FrameType::Ping),
        "probed: {w:?}"
    );
    for t in 6..20 {
        s.c.excuse_silence(t0 + sec(t), t0 + sec(1));
        s.c.handle_timeout(t0 + sec(t));
        assert!(s.c.error().is_none(), "at {t} s");
    }
    // Twenty seconds of silence is four peer timeouts: no more excuses.
    assert!(!s.c.excuse_silence(t0 + sec(20), t0 + sec(1)));
    s.c.handle_timeout(t0 + sec(20));
    assert_eq!(
        s.c.error(),
        Some(&ProtoError::PeerDead { silent_ms: 20_000 })
    );
    // A pool that ran low before the peer was last heard (at the start) excuses nothing.
    let mut s = Script::new(cfg());
    let t0 = s.t0;
    for t in 1..5 {
        s.c.handle_timeout(t0 + sec(t));
    }
    let before = t0
        .checked_sub(sec(1))
        .expect("the clock runs longer than a second");
    assert!(!s.c.excuse_silence(t0 + sec(5), before));
}

#[test]
fn a_side_that_did_not_run_probes_the_peer_before_declaring_it_dead() {
    let mut s = Script::new(cfg());
    let t0 = s.t0;
    // No tick for 6 s (the driver's thread was blocked): past the 5 s peer timeout, but
    // this side could not have heard anything.
    s.c.handle_timeout(t0 + Duration::from_secs(6));
    assert!(
        s.c.error().is_none(),
        "our own stall is not the peer's death"
    );
    let w = s.work();
    assert_eq!(w.len(), 1);
    assert_eq!(s.sent(&w[0]).0.kind, FrameType::Ping, "probed at once");
    assert_eq!(s.c.poll_timeout(), Some(t0 + Duration::from_secs(7)));
    // Ticking normally from then on, a peer that stays silent is dead 5 s after the probe.
    for sec in 7..11 {
        s.c.handle_timeout(t0 + Duration::from_secs(sec));
        assert!(s.c.error().is_none());
    }
    s.c.handle_timeout(t0 + Duration::from_secs(11));
    assert_eq!(
        s.c.error(),
        Some(&ProtoError::PeerDead { silent_ms: 11_000 })
    );
}

#[test]
fn keepalive_pings_and_a_silent_peer_is_declared_dead() {
    let mut s = Script::new(cfg());
    let t0 = s.t0;
    assert_eq!(s.c.poll_timeout(), Some(t0 + Duration::from_secs(1)));
    s.c.handle_timeout(t0 + Duration::from_millis(999));
    assert_eq!(s.work(), [], "early timeout is a no-op");
    s.c.handle_timeout(t0 + Duration::from_secs(1));
    let w = s.work();
    // Signalled: its completion says whether this side's frames get through.
    assert_eq!(w, [send(0, None, 16, true)]);
    assert_eq!(s.sent(&w[0]).0, Header::control(FrameType::Ping, 0, 8, 0));
    assert_eq!(s.c.poll_timeout(), Some(t0 + Duration::from_secs(2)));
    // Hearing anything pushes both deadlines out.
    s.t0 = t0 + Duration::from_secs(3);
    s.arrive(Header::control(FrameType::Pong, 0, 0, 0), &[]);
    assert_eq!(s.c.poll_timeout(), Some(t0 + Duration::from_secs(4)));
    for sec in 4..8 {
        s.c.handle_timeout(t0 + Duration::from_secs(sec));
    }
    assert_eq!(
        s.work().len(),
        1 + 4,
        "the PONG's repost, then one PING a second"
    );
    assert!(s.c.error().is_none());
    s.c.handle_timeout(t0 + Duration::from_secs(8));
    assert_eq!(s.c.error(), Some(&ProtoError::PeerDead { silent_ms: 5000 }));
    let w = s.work();
    assert_eq!(w.len(), 1);
    assert_eq!(s.sent(&w[0]).0.kind, FrameType::Abort);
    assert_eq!(s.sent(&w[0]).0.aux, abort_code::TIMEOUT);
    assert_eq!(
        s.events(),
        [Event::Failed(ProtoError::PeerDead { silent_ms: 5000 })]
    );
    assert_eq!(s.c.poll_timeout(), None);
}

/// Drivers pass a coarse clock: frames heard at the reading the deadlines were set from move
/// nothing (a PING just sent is not followed by another at once), a later reading moves both.
#[test]
fn frames_heard_before_the_clock_ticks_leave_the_deadlines_alone() {
    let mut s = Script::new(cfg());
    let t0 = s.t0;
    s.c.handle_timeout(t0 + Duration::from_secs(1));
    assert_eq!(s.work().len(), 1, "the PING");
    assert_eq!(s.c.poll_timeout(), Some(t0 + Duration::from_secs(2)));
    s.arrive(Header::control(FrameType::Pong, 0, 0, 0), &[]);
    assert_eq!(
        s.c.poll_timeout(),
        Some(t0 + Duration::from_secs(2)),
        "heard at the start's reading: the next PING stays a second after the last"
    );
    s.t0 = t0 + Duration::from_millis(1500);
    s.arrive(Header::control(FrameType::Pong, 0, 0, 0), &[]);
    assert_eq!(s.c.poll_timeout(), Some(t0 + Duration::from_millis(2500)));
    assert!(s.c.error().is_none());
}

#[test]
fn a_bad_frame_aborts_once_and_then_nothing() {
    let mut s = Script::new(cfg());
    done(s.c.send_msg(b"queued")); // built but not taken by the driver: dropped on failure
    let slot = s.next_slot;
    let mem = s.c.memory_mut().recv_slot_mut(slot);
    mem[..HEADER_LEN].copy_from_slice(&[99; HEADER_LEN]);
    s.c.handle_recv_completion(slot, HEADER_LEN as u32, Ok(()), s.t0);
    let err = ProtoError::BadFrame {
        reason: "unknown frame type",
    };
    assert_eq!(s.c.error(), Some(&err));
    let w = s.work();
    assert_eq!(w, [send(0, None, 16, true)]);
    assert_eq!(
        s.sent(&w[0]).0,
        Header::control(FrameType::Abort, 0, 8, abort_code::BAD_FRAME)
    );
    assert_eq!(s.events(), [Event::Failed(err.clone())]);
    assert_eq!(s.c.send_msg(b"x"), Err(err.clone()));
    assert_eq!(s.c.recv_msg(), Err(err.clone()));
    s.c.handle_timeout(s.t0 + Duration::from_secs(60));
    s.arrive_in(1, single(0, b"late"), b"late");
    assert_eq!(s.work(), [], "after the ABORT nothing is posted");
    assert!(!s.c.is_drained());
    s.c.handle_send_completion(WrId(0), Ok(()));
    assert!(s.c.is_drained());
}

#[test]
fn every_peer_violation_is_a_sticky_error() {
    type Case = (&'static str, fn(&mut Script), ProtoError);
    let cases: Vec<Case> = vec![
        (
            "continuation without start",
            |s| {
                s.arrive(fragment(FLAG_LAST, 0, 5, 0), b"abcde");
            },
            ProtoError::Sequence {
                reason: "a continuation without a first fragment",
            },
        ),
        (
            "start inside a message",
            |s| {
                s.arrive(fragment(FLAG_FIRST, 0, 240, 500), &[0; 240]);
                s.arrive(fragment(FLAG_FIRST, 1, 240, 500), &[0; 240]);
            },
            ProtoError::Sequence {
                reason: "a first fragment inside a message",
            },
        ),
        (
            "message id out of order",
            |s| {
                s.arrive(single(1, b"x"), b"x");
            },
            ProtoError::Sequence {
                reason: "a message id out of order",
            },
        ),
        (
            "fragments longer than the message",
            |s| {
                s.arrive(fragment(FLAG_FIRST, 0, 240, 300), &[0; 240]);
                s.arrive(fragment(FLAG_LAST, 0, 61, 0), &[0; 61]);
            },
            ProtoError::Sequence {
                reason: "fragments longer than their message",
            },
        ),
        (
            "message over the cap",
            |s| {
                s.arrive(fragment(FLAG_FIRST, 0, 240, 4097), &[0; 240]);
            },
            ProtoError::MessageTooLarge {
                len: 4097,
                max: 4096,
            },
        ),
        (
            "oversize fragment",
            |s| {
                // A peer that ignores the settled frame size (its slot would be larger).
                let mut h = fragment(FLAG_FIRST, 0, 240, 1000);
                h.payload_len = 241;
                let slot = s.next_slot;
                let m = s.c.memory_mut().recv_slot_mut(slot);
                m[..HEADER_LEN].copy_from_slice(
                    &Header {
                        credit_limit: 8,
                        ..h
                    }
                    .encode(),
                );
                s.c.handle_recv_completion(slot, 257, Ok(()), s.t0);
            },
            ProtoError::BadFrame {
                reason: "completion length outside header ..= slot size",
            },
        ),
        (
            "data after FIN",
            |s| {
                s.arrive(Header::control(FrameType::Fin, 0, 0, 0), &[]);
                s.arrive(single(0, b"x"), b"x");
            },
            ProtoError::DataAfterFin { what: "DATA" },
        ),
        (
            "FIN inside a message",
            |s| {
                s.arrive(fragment(FLAG_FIRST, 0, 240, 500), &[0; 240]);
                s.arrive(Header::control(FrameType::Fin, 0, 0, 0), &[]);
            },
            ProtoError::Sequence {
                reason: "FIN inside a message",
            },
        ),
        (
            "credit above the peer's slots",
            |s| {
                s.peer_grant += 1;
                s.arrive(Header::control(FrameType::Credit, 0, 0, 0), &[]);
            },
            ProtoError::CreditOverrun {
                reason: "credit limit above the peer's receive slots",
            },
        ),
        (
            "credit moved back",
            |s| {
                s.peer_grant -= 1;
                s.arrive(Header::control(FrameType::Credit, 0, 0, 0), &[]);
            },
            ProtoError::CreditOverrun {
                reason: "credit limit moved back or by more than the peer's slots",
            },
        ),
        (
            "rendezvous not negotiated",
            |s| {
                s.arrive(rts(100), &[0; 16]);
            },
            ProtoError::Unsupported { frame: 7 },
        ),
        (
            "completion length differs",
            |s| {
                let slot = s.next_slot;
                let m = s.c.memory_mut().recv_slot_mut(slot);
                m[..HEADER_LEN].copy_from_slice(
                    &Header {
                        credit_limit: 8,
                        ..single(0, b"abc")
                    }
                    .encode(),
                );
                s.c.handle_recv_completion(slot, HEADER_LEN as u32 + 2, Ok(()), s.t0);
            },
            ProtoError::BadFrame {
                reason: "payload length differs from the received length",
            },
        ),
    ];
    for (name, script, want) in cases {
        let mut s = Script::new(cfg());
        script(&mut s);
        assert_eq!(s.c.error(), Some(&want), "{name}");
        let w = s.work();
        let aborts = w
            .iter()
            .filter(|w| matches!(w, Work::PostSend { .. }))
            .count();
        assert_eq!(aborts, 1, "{name}: exactly one ABORT");
        assert_eq!(s.c.send_msg(b"x"), Err(want), "{name}: sticky");
    }
}

/// A connection its listener never handed out is refused: one ABORT saying so goes to the
/// peer (so its dialer does not read an end-of-stream, nor only a broken transport), and
/// the peer's error names it.
#[test]
fn a_refused_connection_tells_the_peer_why() {
    let mut s = Script::new(cfg());
    s.c.refuse();
    assert_eq!(s.c.error(), Some(&ProtoError::Refused));
    let w = s.work();
    assert_eq!(w.len(), 1, "{w:?}");
    let (h, _) = s.sent(&w[0]);
    assert_eq!(
        h,
        Header::control(
            FrameType::Abort,
            0,
            h.credit_limit,
            abort_code::LISTENER_CLOSED
        )
    );
    s.c.handle_send_completion(WrId(0), Ok(()));
    assert!(s.c.is_drained());
    // The peer's side.
    let mut p = Script::new(cfg());
    p.arrive(h, &[]);
    let e = p.c.error().cloned().unwrap();
    assert_eq!(e, ProtoError::PeerAborted { code: 7 });
    assert!(
        e.to_string()
            .contains("listener closed before anyone accepted"),
        "{e}"
    );
}

#[test]
fn a_peer_abort_fails_without_an_answer() {
    let mut s = Script::new(cfg());
    s.arrive(
        Header::control(FrameType::Abort, 0, 0, abort_code::SEQUENCE),
        &[],
    );
    assert_eq!(s.c.error(), Some(&ProtoError::PeerAborted { code: 4 }));
    assert_eq!(s.work(), []);
}

#[test]
fn close_discards_arriving_data_and_returns_its_credit() {
    let mut s = Script::new(cfg());
    s.arrive(single(0, b"unread"), b"unread");
    s.c.close().unwrap();
    assert_eq!(
        s.work(),
        [Work::PostRecv { slot: 0 }, send(0, None, 16, true)]
    );
    s.arrive(single(1, b"more"), b"more");
    // The FIN went before the driver took slot 0's repost: with slot 1's, two credits are
    // unannounced, a quarter of this 8-slot ring, so a CREDIT frame follows.
    let w = s.work();
    assert_eq!(w, [Work::PostRecv { slot: 1 }, send(1, None, 16, true)]);
    assert_eq!(
        s.sent(&w[1]).0,
        Header::control(FrameType::Credit, 0, 10, 0)
    );
    assert_eq!(s.c.recv_msg(), Err(ProtoError::Closed { op: "recv_msg" }));
    s.c.handle_send_completion(WrId(1), Ok(()));
    assert!(s.c.is_drained());
}

#[test]
fn a_fatal_error_posts_nothing_and_drains_after_the_flush() {
    let mut s = Script::new(cfg());
    done(s.c.send_msg(b"in flight"));
    s.work();
    done(s.c.send_msg(&[0; 600])); // queued, not taken by the driver
    s.c.handle_fatal(rsrdma_proto::Fatal::QpError);
    assert_eq!(s.work(), []);
    assert!(!s.c.is_drained(), "WR 0 is still outstanding");
    s.c.handle_flushed();
    assert!(s.c.is_drained());
}

#[test]
fn a_peer_down_to_its_last_credit_gets_a_credit_frame_early() {
    let mut s = Script::new(cfg().with_recv_slots(16)); // a quarter of the ring: 4
    for i in 0..13u16 {
        s.arrive(single(i, b"d"), b"d"); // held unread: the peer may send 3 more frames
    }
    s.arrive(Header::control(FrameType::Pong, 0, 0, 0), &[]);
    assert_eq!(
        s.work(),
        [Work::PostRecv { slot: 13 }],
        "one unannounced credit: not worth a frame"
    );
    s.arrive(Header::control(FrameType::Pong, 0, 0, 0), &[]);
    let w = s.work();
    assert_eq!(w, [Work::PostRecv { slot: 14 }, send(0, None, 16, false)]);
    assert_eq!(
        s.sent(&w[1]).0,
        Header::control(FrameType::Credit, 0, 18, 0)
    );
}

impl Script {
    /// The fake peer grants `n` more credits with a CREDIT frame.
    fn grant(&mut self, n: u32) {
        self.peer_grant += n;
        self.arrive(Header::control(FrameType::Credit, 0, 0, 0), &[]);
    }

    /// Payloads of the DATA frames in `w`, and the last signalled WR.
    fn data_of(&self, w: &[Work]) -> (Vec<u8>, Option<WrId>) {
        let mut bytes = Vec::new();
        let mut signalled = None;
        for work in w {
            if let Work::PostSend {
                wr_id, signaled, ..
            } = *work
            {
                let (h, p) = self.sent(work);
                if h.kind == FrameType::Data {
                    bytes.extend(p);
                }
                if signaled {
                    signalled = Some(wr_id);
                }
            }
        }
        (bytes, signalled)
    }
}

fn counting(n: u32) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn a_borrowed_send_copies_nothing_and_moves_only_when_its_caller_calls() {
    let mut s = Script::new(cfg());
    let msg = counting(2000);
    assert_eq!(s.c.send_msg_borrowed(&msg), Ok(Step::Done(false)));
    let w = s.work();
    let (mut got, last) = s.data_of(&w);
    assert_eq!(got.len(), 5 * 240, "data keeps the control reserve");
    assert_eq!(s.c.counters().queued_send_bytes, 0, "nothing copied");
    assert_eq!(s.c.send_msg(b"x"), Ok(Step::Blocked));
    s.c.handle_send_completion(last.unwrap(), Ok(()));
    s.grant(5);
    assert!(
        s.work().iter().all(|w| matches!(w, Work::PostRecv { .. })),
        "the rest is the caller's: no DATA without its call"
    );
    assert_eq!(s.c.send_msg_borrowed(&msg), Ok(Step::Done(true)));
    let w = s.work();
    got.extend(s.data_of(&w).0);
    assert_eq!(got, msg);
    assert_eq!(
        s.c.send_msg_borrowed(&msg[..10]),
        Ok(Step::Done(true)),
        "the next message starts (one credit above the reserve is left)"
    );
}

#[test]
fn an_unborrowed_send_is_finished_from_a_copy_or_withdrawn() {
    let mut s = Script::new(cfg());
    let msg = counting(2000);
    assert_eq!(s.c.send_msg_borrowed(&msg), Ok(Step::Done(false)));
    let w = s.work();
    let (mut got, last) = s.data_of(&w);
    assert!(s.c.send_unborrow(&msg), "begun: kept");
    assert_eq!(s.c.counters().queued_send_bytes, 800);
    s.c.handle_send_completion(last.unwrap(), Ok(()));
    s.grant(5);
    let w = s.work();
    got.extend(s.data_of(&w).0);
    assert_eq!(got, msg, "the core finished it alone");

    let mut s = Script::new(cfg());
    done(s.c.send_msg(&[1u8; 1200])); // five frames: the data credits are spent
    let _ = s.work();
    assert_eq!(s.c.send_msg_borrowed(&msg), Ok(Step::Done(false)));
    let w = s.work();
    assert_eq!(s.data_of(&w).0.len(), 0);
    assert!(!s.c.send_unborrow(&msg), "not begun: withdrawn");
    assert_eq!(s.c.counters().messages_sent, 1);
    assert!(s.c.can_send());
}

/// F2: a message that waits behind the copied rest of an earlier one was never started, so
/// giving it up must say that nothing of it will be sent (the driver reported `Ok` for it,
/// and the message was lost).
#[test]
fn a_message_that_never_started_is_not_reported_kept() {
    let mut s = Script::new(cfg());
    let first = counting(2000);
    assert_eq!(s.c.send_msg_borrowed(&first), Ok(Step::Done(false)));
    let w = s.work();
    let (mut got, last) = s.data_of(&w);
    assert!(s.c.send_unborrow(&first), "begun: kept");
    // The same length on purpose: the core must not take it for the message it holds.
    let second = vec![7u8; 2000];
    assert_eq!(
        s.c.send_msg_borrowed(&second),
        Ok(Step::Blocked),
        "behind the first message's rest"
    );
    assert!(
        !s.c.send_unborrow(&second),
        "never started: nothing of it is held or will be sent"
    );
    s.c.handle_send_completion(last.unwrap(), Ok(()));
    s.grant(5);
    let w = s.work();
    got.extend(s.data_of(&w).0);
    assert_eq!(got, first, "only the first message goes out");
    assert_eq!(s.c.counters().messages_sent, 1);
}

#[test]
fn a_direct_receive_takes_fragments_from_their_slots_and_can_give_them_back() {
    let msg = counting(600);
    for abort in [false, true] {
        let mut s = Script::new(cfg());
        s.arrive(fragment(FLAG_FIRST, 0, 240, 600), &msg[..240]);
        assert_eq!(s.c.counters().reassembly_bytes, 240, "no reader yet");
        let mut small = [0u8; 100];
        assert_eq!(
            s.c.recv_msg_direct(&mut small),
            Err(ProtoError::ShortBuffer { needed: 600 })
        );
        let mut buf = vec![0u8; 700];
        assert_eq!(s.c.recv_msg_direct(&mut buf), Ok(Recv::Blocked));
        assert_eq!(s.c.counters().reassembly_bytes, 0, "taken over");
        let _ = s.work();
        s.arrive(fragment(0, 0, 240, 0), &msg[240..480]);
        assert_eq!(s.c.counters().held_slots, 1, "waits in its slot");
        assert_eq!(s.c.recv_msg(), Ok(Recv::Blocked));
        if abort {
            s.c.recv_direct_abort(&buf);
            assert_eq!(s.c.counters().reassembly_bytes, 480);
            s.arrive(fragment(FLAG_LAST, 0, 120, 0), &msg[480..]);
            assert_eq!(s.c.recv_msg(), Ok(Recv::Data(msg.clone())));
            continue;
        }
        assert_eq!(s.c.recv_msg_direct(&mut buf), Ok(Recv::Blocked));
        assert_eq!(s.c.counters().held_slots, 0);
        s.arrive(fragment(FLAG_LAST, 0, 120, 0), &msg[480..]);
        assert_eq!(s.c.recv_msg_direct(&mut buf), Ok(Recv::Data(600)));
        assert_eq!(&buf[..600], &msg[..]);
        assert_eq!(s.c.recv_msg_direct(&mut buf), Ok(Recv::Blocked));
    }
}

#[test]
fn shutdown_read_discards_data_returns_its_credit_and_reads_eof() {
    let mut s = Script::new(cfg());
    s.arrive(single(0, b"held"), b"held");
    assert_eq!(s.work(), []);
    s.c.shutdown_read().unwrap();
    assert_eq!(s.work(), [Work::PostRecv { slot: 0 }]);
    assert_eq!(s.c.recv_msg(), Ok(Recv::Eof));
    s.arrive(single(1, b"late"), b"late");
    assert!(
        s.work().contains(&Work::PostRecv { slot: 1 }),
        "discarded at once"
    );
    assert_eq!(s.c.read(&mut [0u8; 4]), Ok(Recv::Eof));
    assert_eq!(
        s.c.counters().messages_received,
        2,
        "still checked in sequence"
    );
    done(s.c.send_msg(b"writing goes on"));
    assert!(!s.work().is_empty());
}

#[test]
fn a_lent_message_posts_header_slots_and_lent_ranges_and_copies_nothing() {
    let mut s = Script::new(cfg());
    let msg = done(s.c.send_msg_lent(600, ADDR, LKEY));
    let w = s.work();
    assert_eq!(
        w,
        [
            send_lent(0, 0, false, ADDR, 240),
            send_lent(1, 1, false, ADDR + 240, 240),
            send_lent(2, 2, true, ADDR + 480, 120),
        ],
        "fragments as send_msg makes them, the last one signalled"
    );
    let heads: Vec<Header> = (0..3)
        .map(|i| Header::decode(&s.c.memory().send_slot(i)[..HEADER_LEN]).unwrap())
        .collect();
    assert_eq!(
        heads[0],
        Header {
            credit_limit: 8,
            ..fragment(FLAG_FIRST, 0, 240, 600)
        }
    );
    assert_eq!(
        heads[1],
        Header {
            credit_limit: 8,
            ..fragment(0, 0, 240, 600)
        }
    );
    assert_eq!(
        heads[2],
        Header {
            credit_limit: 8,
            ..fragment(FLAG_LAST, 0, 120, 600)
        }
    );
    let k = s.c.counters();
    assert_eq!((k.send_copied_bytes, k.queued_send_bytes), (0, 0));
    assert_eq!(k.lent_unreleased, 1);
    assert!(
        !s.c.lent_released(msg),
        "in flight until the last completion"
    );
    s.c.handle_send_completion(WrId(2), Ok(()));
    assert!(s.c.lent_released(msg));
    assert_eq!(s.c.counters().lent_unreleased, 0);
    // A copied message after it counts its bytes.
    done(s.c.send_msg(&[7u8; 100]));
    assert_eq!(s.c.counters().send_copied_bytes, 100);
}

#[test]
fn an_empty_lent_message_is_one_signalled_header() {
    let mut s = Script::new(cfg());
    let msg = done(s.c.send_msg_lent(0, ADDR, LKEY));
    let w = s.work();
    assert_eq!(w, [send(0, None, HEADER_LEN as u32, true)]);
    assert_eq!(
        Header::decode(s.c.inline_frame(WrId(0)).unwrap()).unwrap(),
        Header {
            credit_limit: 8,
            ..single(0, b"")
        }
    );
    assert!(!s.c.lent_released(msg));
    s.c.handle_send_completion(WrId(0), Ok(()));
    assert!(s.c.lent_released(msg));
}

#[test]
fn a_lent_message_waits_for_credit_in_place_and_keeps_the_order() {
    let mut s = Script::new(cfg());
    // 7 fragments; 5 data credits.
    let msg = done(s.c.send_msg_lent(7 * 240, ADDR, LKEY));
    let w = s.work();
    assert_eq!(w.len(), 5);
    assert_eq!(s.c.send_msg(b"next"), Ok(Step::Blocked));
    let k = s.c.counters();
    assert_eq!((k.send_copied_bytes, k.queued_send_bytes), (0, 0));
    assert!(!s.c.lent_released(msg));
    // The last posted fragment is not the message's last: no completion may release it.
    s.c.handle_send_completion(WrId(3), Ok(()));
    assert!(!s.c.lent_released(msg));
    s.grant(2);
    let w = s.work();
    let sends: Vec<&Work> = w
        .iter()
        .filter(|w| matches!(w, Work::PostSend { .. }))
        .collect();
    assert_eq!(
        sends,
        [
            // Slots 0..=3 came back with WR 3's completion.
            &send_lent(5, 3, false, ADDR + 5 * 240, 240),
            &send_lent(6, 2, true, ADDR + 6 * 240, 240)
        ]
    );
    assert_eq!(s.events(), [Event::Writable]);
    done(s.c.send_msg(b"next"));
    assert!(!s.c.lent_released(msg));
    s.c.handle_send_completion(WrId(6), Ok(()));
    assert!(s.c.lent_released(msg));
}

#[test]
fn a_failed_lent_message_is_released_only_by_the_flush() {
    let mut s = Script::new(cfg());
    let msg = done(s.c.send_msg_lent(7 * 240, ADDR, LKEY));
    assert_eq!(s.work().len(), 5);
    s.c.handle_send_completion(WrId(3), Err(12));
    assert!(s.c.error().is_some());
    assert!(!s.c.lent_released(msg), "WR 4 may still be read by the NIC");
    s.c.handle_flushed();
    assert!(s.c.lent_released(msg));
    assert_eq!(s.c.counters().lent_unreleased, 0);
}

#[test]
fn a_receive_loop_may_leave_its_reposts_for_its_next_send_which_does_not_announce_them() {
    let mut s = Script::new(cfg().with_recv_slots(16)); // a quarter of the ring: 4
    s.arrive(single(0, b"ping"), b"ping");
    assert_eq!(s.c.recv_msg(), Ok(Recv::Data(b"ping".to_vec())));
    assert!(
        s.c.reposts_may_wait(),
        "one repost queued, the peer can still send 15 frames"
    );
    done(s.c.send_msg(b"pong"));
    assert!(!s.c.reposts_may_wait(), "a send is queued too");
    assert_eq!(s.c.peek_work(), Some(Work::PostRecv { slot: 0 }));
    let w = s.work();
    assert_eq!(w, [Work::PostRecv { slot: 0 }, send(0, None, 20, false)]);
    assert_eq!(
        s.sent(&w[1]).0.credit_limit,
        16,
        "queued before the driver took the repost: the send may go first"
    );
    let c = s.c.counters();
    assert_eq!(
        (c.grant, c.announced),
        (17, 16),
        "taken: counted, not yet announced"
    );
    done(s.c.send_msg(b"next"));
    let w = s.work();
    assert_eq!(
        s.sent(&w[0]).0.credit_limit,
        17,
        "the next frame announces it"
    );

    // Reposts wait only while their credit is not needed soon.
    for i in 1..4u16 {
        s.arrive(single(i, b"d"), b"d");
        assert_eq!(s.c.recv_msg(), Ok(Recv::Data(b"d".to_vec())));
    }
    assert!(
        s.c.reposts_may_wait(),
        "3 queued: not yet a CREDIT frame's worth"
    );
    s.arrive(single(4, b"d"), b"d");
    assert_eq!(s.c.recv_msg(), Ok(Recv::Data(b"d".to_vec())));
    assert!(!s.c.reposts_may_wait(), "4 queued: a CREDIT frame's worth");
    let w = s.work();
    assert_eq!(w.len(), 5, "{w:?}");
    assert_eq!(
        s.sent(&w[4]).0,
        Header::control(FrameType::Credit, 0, 21, 0),
        "taken, the four go in a CREDIT frame after them"
    );
    let mut s = Script::new(cfg().with_recv_slots(16));
    for i in 0..13u16 {
        s.arrive(single(i, b"d"), b"d"); // unread: the peer can send 3 more frames at most
    }
    assert_eq!(s.c.recv_msg(), Ok(Recv::Data(b"d".to_vec())));
    assert!(s.c.reposts_may_wait());
    s.arrive(Header::control(FrameType::Pong, 0, 0, 0), &[]);
    assert!(s.c.reposts_may_wait(), "the peer can still send 2 frames");
    s.arrive(Header::control(FrameType::Pong, 0, 0, 0), &[]);
    assert!(
        !s.c.reposts_may_wait(),
        "the peer is down to its last credit"
    );
    let w = s.work();
    assert_eq!(
        w[..3],
        [
            Work::PostRecv { slot: 0 },
            Work::PostRecv { slot: 13 },
            Work::PostRecv { slot: 14 }
        ]
    );
    assert_eq!(
        s.sent(&w[3]).0,
        Header::control(FrameType::Credit, 0, 19, 0),
        "taken, they are worth a CREDIT frame to a peer at its last credit"
    );
}

#[test]
fn a_small_message_goes_now_ahead_of_queued_reposts_and_otherwise_not_at_all() {
    let mut s = Script::new(cfg().with_recv_slots(16));
    s.arrive(single(0, b"ping"), b"ping");
    assert_eq!(s.c.recv_msg(), Ok(Recv::Data(b"ping".to_vec())));
    assert!(s.c.reposts_may_wait());
    let w = s.c.send_inline_now(b"pong").expect("an inline frame fits");
    assert_eq!(w, send(0, None, 20, false), "built, not queued");
    let (h, payload) = s.sent(&w);
    assert_eq!(
        (h, &payload[..]),
        (
            Header {
                credit_limit: 16,
                ..single(0, b"pong")
            },
            &b"pong"[..]
        ),
        "the repost not taken yet is not announced"
    );
    assert_eq!(s.c.counters().send_copied_bytes, 4);
    assert_eq!(
        s.work(),
        [Work::PostRecv { slot: 0 }],
        "only the repost is queued"
    );
    // The next message (the core's own numbering) announces the repost taken.
    let w = s.c.send_inline_now(b"next").unwrap();
    assert_eq!(
        s.sent(&w).0,
        Header {
            credit_limit: 17,
            ..single(1, b"next")
        }
    );

    // Not that way: too large for one inline frame, behind a queued send (a PONG the
    // driver's step queued while polling, before its send), after close.
    assert_eq!(
        s.c.send_inline_now(&[0u8; 49]),
        None,
        "16 + 49 > 64 inline bytes"
    );
    s.arrive(Header::control(FrameType::Ping, 0, 0, 7), &[]);
    assert_eq!(
        s.c.send_inline_now(b"x"),
        None,
        "a PONG is queued: WR order"
    );
    let w = s.work();
    assert_eq!(s.sent(&w[1]).0.kind, FrameType::Pong, "{w:?}");
    done(s.c.send_msg(b"queued"));
    assert_eq!(
        s.c.send_inline_now(b"x"),
        None,
        "a send is queued: WR order"
    );
    assert_eq!(s.work().len(), 1);
    s.c.shutdown_write().unwrap();
    assert_eq!(s.c.send_inline_now(b"x"), None, "write side closed");
    assert_eq!(
        s.c.send_msg(b"x"),
        Err(ProtoError::Closed { op: "send_msg" }),
        "the general way reports why"
    );
}

#[test]
fn withdrawal_frames_the_core_did_not_ask_for_or_settle_fail_the_connection() {
    use rsrdma_proto::{FEATURE_RENDEZVOUS, FEATURE_WITHDRAW};
    // A WITHDRAWN that answers no WITHDRAW of ours.
    let mut s = Script::new(cfg().with_features(FEATURE_RENDEZVOUS | FEATURE_WITHDRAW));
    s.arrive(Header::control(FrameType::Withdrawn, 0, 0, 0), &[]);
    assert_eq!(
        s.c.error(),
        Some(&ProtoError::Sequence {
            reason: "a WITHDRAWN for a message not asked back"
        })
    );
    // A WITHDRAW for no message of ours is harmless: nothing is dropped, nothing answered.
    let mut s = Script::new(cfg().with_features(FEATURE_RENDEZVOUS | FEATURE_WITHDRAW));
    s.arrive(Header::control(FrameType::Withdraw, 5, 0, 0), &[]);
    assert_eq!(s.c.error(), None);
    assert!(s.work().iter().all(|w| matches!(w, Work::PostRecv { .. })));
    // Without the feature settled, either frame is refused.
    for kind in [FrameType::Withdraw, FrameType::Withdrawn] {
        let mut s = Script::new(cfg().with_features(FEATURE_RENDEZVOUS));
        s.arrive(Header::control(kind, 0, 0, 0), &[]);
        assert_eq!(
            s.c.error(),
            Some(&ProtoError::Unsupported { frame: kind as u8 })
        );
    }
}

/// A peer that receives from a shared pool (a listener's) may refuse this side's frames for
/// want of room, PINGs included (RNR retries): this side's sends then make no progress, and
/// the peer, never having got a PING, has nothing to answer. Its silence is excused up to
/// four times `peer_timeout`, as a listener excuses its peers' (an outside tester's find:
/// dialers of a listener with a small pool declared it dead while it served them). Sends
/// that complete, or a peer without a pool, excuse nothing.
#[test]
fn a_pooled_peer_that_takes_none_of_our_frames_is_excused_for_a_while() {
    let sec = Duration::from_secs;
    for (pooled, complete, dead_at) in [(true, false, 20), (false, false, 5), (true, true, 5)] {
        let cfg = cfg();
        let features = if pooled { FEATURE_SHARED_POOL } else { 0 };
        let peer = cfg.clone().with_features(features).params();
        let settled = settle(&cfg.params(), &peer).unwrap();
        assert_eq!(settled.peer_pooled, pooled);
        assert_eq!(settled.features, 0, "announced, not negotiated");
        let t0 = Instant::now();
        let mut c = Conn::new(&cfg, &settled, VecSlots::for_config(&cfg), t0).unwrap();
        let mut died = None;
        for t in 1..=25 {
            c.handle_timeout(t0 + sec(t));
            for w in std::iter::from_fn(|| c.poll_work()).collect::<Vec<_>>() {
                if let (
                    true,
                    Work::PostSend {
                        wr_id, signaled, ..
                    },
                ) = (complete, w)
                {
                    assert!(signaled, "a PING is signalled");
                    c.handle_send_completion(wr_id, Ok(()));
                }
            }
            if let Some(e) = c.error() {
                died = Some((t, e.clone()));
                break;
            }
        }
        let silent_ms = dead_at * 1000;
        assert_eq!(
            died,
            Some((dead_at, ProtoError::PeerDead { silent_ms })),
            "pooled {pooled}, sends complete {complete}"
        );
    }
}

/// A frame that came with immediate data (the protocol sends none) fails the connection as
/// a malformed frame and the peer is told (ABORT code 1); before, a hostile peer's SEND
/// with immediate was delivered as an ordinary message. Its slot is no longer posted.
#[test]
fn a_frame_with_immediate_data_is_a_malformed_frame() {
    let mut s = Script::new(cfg());
    let slot = s.next_slot;
    s.land(slot, single(0, b"hello"), b"hello");
    s.c.handle_recv_with_immediate(slot, s.t0);
    let e = s.c.error().cloned().unwrap();
    assert!(matches!(e, ProtoError::BadFrame { .. }), "{e}");
    assert!(e.is_peers_violation());
    assert!(e.to_string().contains("immediate data"), "{e}");
    let w = s.work();
    let aborts: Vec<_> = w
        .iter()
        .map(|w| s.sent(w).0)
        .filter(|h| h.kind == FrameType::Abort)
        .collect();
    assert_eq!(aborts.len(), 1, "{w:?}");
    assert_eq!(aborts[0].aux, abort_code::BAD_FRAME);
    assert_eq!(s.c.recv_msg(), Err(e.clone()), "nothing is delivered");
    // The slot was taken: a second completion for it is the driver's misuse, not a frame.
    s.c.handle_recv_with_immediate(slot, s.t0);
    assert_eq!(s.c.error(), Some(&e), "the first error stays");
}

/// Which errors are the peer's breaking of the protocol (a close that began before one
/// came reports it) and which are not.
#[test]
fn protocol_violations_are_told_from_transport_failures() {
    assert!(ProtoError::DataAfterFin {
        what: "a second FIN"
    }
    .is_peers_violation());
    assert!(ProtoError::Sequence { reason: "x" }.is_peers_violation());
    assert!(!ProtoError::PeerDead { silent_ms: 1 }.is_peers_violation());
    assert!(!ProtoError::PeerAborted { code: 1 }.is_peers_violation());
    assert!(!ProtoError::Fatal(rsrdma_proto::Fatal::QpError).is_peers_violation());
    assert!(!ProtoError::Refused.is_peers_violation());
    // A receive that a frame too long for its slot failed says so, on the side that got it.
    for status in [1, 9] {
        let e = rsrdma_proto::Fatal::RecvCompletion { status }.to_string();
        assert!(e.contains("longer than this side's receive slot"), "{e}");
    }
}

/// While this side READs a large rendezvous message, the peer's answers may wait behind the
/// READ's data on a slow link (512 MiB through soft0's ring took longer than `peer_timeout`,
/// and a live peer was declared dead: an outside tester's find). The silence is excused up
/// to four times `peer_timeout` while the READ makes no progress; a READ that never ends is
/// still a dead peer then.
#[test]
fn a_read_in_progress_excuses_the_peers_silence_for_a_while() {
    use rsrdma_proto::FEATURE_RENDEZVOUS;
    let sec = Duration::from_secs;
    let mut s = Script::new(
        cfg()
            .with_features(FEATURE_RENDEZVOUS)
            .with_rdv_threshold(1000),
    );
    let t0 = s.t0;
    // At most the script's max_message (4096).
    let len = 4000u32;
    let mut payload = [0u8; 16];
    payload[..8].copy_from_slice(&0x1000u64.to_le_bytes());
    payload[8..12].copy_from_slice(&7u32.to_le_bytes());
    s.arrive(rts(len), &payload);
    assert_eq!(s.c.error(), None);
    assert!(matches!(s.c.recv_msg(), Ok(Recv::NeedsRead { .. })));
    assert!(matches!(
        s.c.start_read(0x2000, 9, len as usize),
        Ok(Step::Done(()))
    ));
    assert!(s.work().iter().any(|w| matches!(w, Work::PostRead { .. })));
    let mut died = None;
    for t in 1..=25 {
        s.c.handle_timeout(t0 + sec(t));
        let _ = s.work();
        if let Some(e) = s.c.error() {
            died = Some((t, e.clone()));
            break;
        }
    }
    assert_eq!(
        died,
        Some((20, ProtoError::PeerDead { silent_ms: 20_000 })),
        "excused while the READ was outstanding, up to four peer timeouts"
    );
}
