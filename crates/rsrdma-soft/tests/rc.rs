//! Two queue pairs on two soft devices (each its own memory and region table), joined by a
//! pipe that carries encoded packets in order: the semantics rxe gives, request by request.

use proptest::prelude::*;
use rsrdma_soft::{
    Access, Bind, Completion, DeregError, Direct, Handled, Memory, MrTable, Nak, Packet,
    PacketKind, Payload, PostError, QpConfig, QpEvent, QpState, RcQp, RecvWr, ResponderQp, SendOp,
    SendWr, Sge, Srq, Status, VecMemory, WcOpcode,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const BASE: u64 = 0x10_0000;
const MEM: usize = 64 * 1024;

struct Side {
    qp: RcQp,
    mrs: MrTable,
    mem: VecMemory,
    /// A region over all of the memory, with every right.
    key: u32,
}

struct Pair {
    s: [Side; 2],
    /// Encoded packets from side `i` to the other.
    wire: [VecDeque<Vec<u8>>; 2],
    now: Instant,
    /// Sends go through `post_send_direct`, with the other side's memory reachable.
    direct: bool,
    /// Requests from side `i` the other side dropped unexecuted.
    dropped: [u32; 2],
}

/// The other side's memory, as a device that reaches it directly sees it: the responder's
/// checks by [`ResponderQp::allows`], then the memory itself.
struct Reach<'a> {
    from: u32,
    responder: ResponderQp,
    mrs: &'a MrTable,
    mem: &'a mut VecMemory,
}

impl Reach<'_> {
    fn allows(&self, rkey: u32, addr: u64, len: u64, right: Access) -> bool {
        self.mrs
            .get(rkey)
            .is_some_and(|mr| self.responder.allows(self.from, mr, rkey, addr, len, right))
    }
}

impl Direct for Reach<'_> {
    fn write(&mut self, rkey: u32, addr: u64, data: &[u8]) -> bool {
        let ok = self.allows(rkey, addr, data.len() as u64, Access::REMOTE_WRITE);
        if ok {
            self.mem.write(addr, data);
        }
        ok
    }

    fn read(&mut self, rkey: u32, addr: u64, len: usize, out: &mut Vec<u8>) -> bool {
        let ok = self.allows(rkey, addr, len as u64, Access::REMOTE_READ);
        if ok {
            self.mem.read_append(addr, len, out);
        }
        ok
    }

    fn atomic(&mut self, rkey: u32, addr: u64, f: &mut dyn FnMut(u64) -> u64) -> Option<u64> {
        self.allows(rkey, addr, 8, Access::REMOTE_ATOMIC)
            .then(|| self.mem.atomic(addr, f))
    }
}

fn cfg(qp_num: u32, rnr_retry: u8) -> QpConfig {
    QpConfig {
        qp_num,
        pd: 1,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        max_send_wr: 64,
        max_recv_wr: 64,
        max_inline: 64,
        rnr_retry,
        min_rnr_timer: Duration::from_micros(640),
        retry_cnt: 3,
        ack_timeout: Some(Duration::from_millis(1)),
        sq_sig_all: false,
        uses_srq: false,
        unreliable: false,
    }
}

/// An unreliable-connected queue pair's settings.
fn uc_cfg(qp_num: u32) -> QpConfig {
    QpConfig {
        unreliable: true,
        ..cfg(qp_num, 0)
    }
}

impl Pair {
    fn new(rnr_retry: u8) -> Pair {
        Pair::with(cfg(10, rnr_retry), cfg(20, rnr_retry))
    }

    fn with(a: QpConfig, b: QpConfig) -> Pair {
        let side = |c: QpConfig| {
            let mut mrs = MrTable::new();
            let all = Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC;
            let key = mrs.register(1, BASE, MEM as u64, all);
            Side {
                qp: RcQp::new(c),
                mrs,
                mem: VecMemory::new(BASE, MEM),
                key,
            }
        };
        let mut p = Pair {
            s: [side(a), side(b)],
            wire: [VecDeque::new(), VecDeque::new()],
            now: Instant::now(),
            direct: false,
            dropped: [0, 0],
        };
        let (na, nb) = (a.qp_num, b.qp_num);
        for (i, dest) in [(0, nb), (1, na)] {
            let qp = &mut p.s[i].qp;
            qp.to_init().unwrap();
            qp.to_rtr(dest, 100).unwrap();
            qp.to_rts(100).unwrap();
        }
        p
    }

    fn post_send(&mut self, i: usize, wr: SendWr) -> Result<(), PostError> {
        if !self.direct {
            let s = &mut self.s[i];
            return s.qp.post_send(wr, &mut s.mrs, &s.mem);
        }
        let (a, b) = self.s.split_at_mut(1);
        let (me, peer) = if i == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        };
        let cfg = *peer.qp.config();
        let mut reach = Reach {
            from: me.qp.qp_num(),
            responder: ResponderQp {
                qp_num: cfg.qp_num,
                ready: matches!(peer.qp.state(), QpState::Rtr | QpState::Rts),
                access: cfg.access,
                pd: cfg.pd,
                dest_qpn: peer.qp.dest_qpn(),
                unreliable: cfg.unreliable,
            },
            mrs: &peer.mrs,
            mem: &mut peer.mem,
        };
        me.qp
            .post_send_direct(wr, &mut me.mrs, &mut me.mem, &mut reach)
    }

    fn post_recv(&mut self, i: usize, wr_id: u64, addr: u64, len: u32) {
        let key = self.s[i].key;
        self.s[i]
            .qp
            .post_recv(RecvWr {
                wr_id,
                sges: vec![Sge {
                    addr,
                    len,
                    lkey: key,
                }]
                .into(),
            })
            .unwrap();
    }

    /// Moves side `i`'s queued packets onto the wire.
    fn transmit(&mut self, i: usize) -> bool {
        let mut any = false;
        while let Some(p) = self.s[i].qp.poll_transmit() {
            self.wire[i].push_back(p.encode());
            any = true;
        }
        any
    }

    /// Delivers the oldest packet from side `i`.
    fn deliver(&mut self, i: usize) -> bool {
        let Some(bytes) = self.wire[i].pop_front() else {
            return false;
        };
        let p = Packet::decode(&bytes).expect("a packet the core encoded decodes");
        let now = self.now;
        let peer = &mut self.s[1 - i];
        assert_eq!(p.dest_qpn, peer.qp.qp_num());
        let (psn, requester) = (p.psn, self.s[i].qp.qp_num());
        let peer = &mut self.s[1 - i];
        if peer
            .qp
            .handle_packet(p, &mut peer.mrs, &mut peer.mem, None, || now)
            == Handled::Dropped
        {
            // The device tells the requester (routed to it, as the device finds it: the
            // harness addresses it to the requester's number).
            self.dropped[i] += 1;
            let notice = Packet::dropped(requester, psn);
            self.wire[1 - i].push_back(notice.encode());
        }
        true
    }

    /// Runs everything until quiet, advancing time for RNR retries (at most `limit` steps).
    fn run(&mut self) {
        for _ in 0..10_000 {
            let mut any = false;
            for i in 0..2 {
                any |= self.transmit(i);
                while self.deliver(i) {
                    any = true;
                }
            }
            if !any {
                // Quiet: a device flushes the acknowledgements it held back (its application
                // polls and finds nothing).
                if self.s.iter_mut().fold(false, |f, s| s.qp.flush_ack() | f) {
                    continue;
                }
                let due = self.s.iter().filter_map(|s| s.qp.poll_timeout()).min();
                match due {
                    Some(t) => {
                        self.now = self.now.max(t);
                        for s in &mut self.s {
                            s.qp.handle_timeout(self.now);
                        }
                    }
                    None => return,
                }
            }
        }
        panic!("no quiet after 10 000 rounds");
    }

    fn completions(&mut self, i: usize) -> Vec<Completion> {
        std::iter::from_fn(|| self.s[i].qp.poll_completion()).collect()
    }

    fn sge(&self, i: usize, addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            len,
            lkey: self.s[i].key,
        }
    }

    fn fill(&mut self, i: usize, addr: u64, data: &[u8]) {
        let at = (addr - BASE) as usize;
        self.s[i].mem.bytes[at..at + data.len()].copy_from_slice(data);
    }

    fn bytes(&self, i: usize, addr: u64, len: usize) -> Vec<u8> {
        let at = (addr - BASE) as usize;
        self.s[i].mem.bytes[at..at + len].to_vec()
    }
}

fn send(wr_id: u64, sges: Vec<Sge>, signaled: bool) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send { imm: None },
        sges: sges.into(),
        inline: None,
        signaled,
        fence: false,
        solicited: false,
    }
}

/// An RDMA WRITE of `sge` to `remote_addr` under `rkey`.
fn write_to(wr_id: u64, sge: Sge, remote_addr: u64, rkey: u32, signaled: bool) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr,
            rkey,
            imm: None,
        },
        sges: vec![sge].into(),
        inline: None,
        signaled,
        fence: false,
        solicited: false,
    }
}

/// A side's completions: its send requests', then its receives', each in order.
fn sends_and_receives(c: Vec<Completion>) -> (Vec<Completion>, Vec<Completion>) {
    c.into_iter().partition(|c| (c.opcode as u32) < 128)
}

fn ids(c: &[Completion]) -> Vec<(u64, Status)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn send_lands_in_the_oldest_receive_across_sges_with_immediate_and_selective_signalling() {
    let mut p = Pair::new(0);
    p.fill(0, BASE, b"hello, soft world");
    p.post_recv(1, 7, BASE + 100, 5);
    p.post_recv(1, 8, BASE + 200, 64);
    // Unsignalled: no completion on success.
    let s0 = vec![p.sge(0, BASE, 5)];
    p.post_send(0, send(1, s0, false)).unwrap();
    // Two SGEs and immediate data, signalled.
    let wr = SendWr {
        wr_id: 2,
        op: SendOp::Send { imm: Some(0xabcd) },
        sges: vec![p.sge(0, BASE, 6), p.sge(0, BASE + 6, 11)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, wr).unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(2, Status::Success)]);
    let r = p.completions(1);
    assert_eq!(ids(&r), [(7, Status::Success), (8, Status::Success)]);
    assert_eq!(
        (r[0].opcode, r[0].byte_len, r[0].imm),
        (WcOpcode::Recv, 5, None)
    );
    assert_eq!((r[1].byte_len, r[1].imm), (17, Some(0xabcd)));
    assert_eq!(p.bytes(1, BASE + 100, 5), b"hello");
    assert_eq!(p.bytes(1, BASE + 200, 17), b"hello, soft world");
}

#[test]
fn write_read_and_atomics_move_exactly_their_bytes() {
    let mut p = Pair::new(0);
    let rkey = p.s[1].key;
    p.fill(0, BASE, &[1, 2, 3, 4, 5, 6, 7, 8]);
    p.fill(1, BASE + 1000, b"remote bytes");
    p.fill(1, BASE + 2000, &41u64.to_le_bytes());
    let wr = |wr_id, op, sges| SendWr {
        wr_id,
        op,
        sges,
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    let w = wr(
        1,
        SendOp::Write {
            remote_addr: BASE + 3,
            rkey,
            imm: None,
        },
        vec![p.sge(0, BASE, 8)].into(),
    );
    p.post_send(0, w).unwrap();
    let r = wr(
        2,
        SendOp::Read {
            remote_addr: BASE + 1000,
            rkey,
        },
        vec![p.sge(0, BASE + 500, 12)].into(),
    );
    p.post_send(0, r).unwrap();
    let f = wr(
        3,
        SendOp::FetchAdd {
            remote_addr: BASE + 2000,
            rkey,
            add: 1,
        },
        vec![p.sge(0, BASE + 600, 8)].into(),
    );
    p.post_send(0, f).unwrap();
    let c = wr(
        4,
        SendOp::CompareSwap {
            remote_addr: BASE + 2000,
            rkey,
            compare: 42,
            swap: 7,
        },
        vec![p.sge(0, BASE + 608, 8)].into(),
    );
    p.post_send(0, c).unwrap();
    // Inline: copied at posting, so the source may change at once.
    let inline = SendWr {
        wr_id: 5,
        op: SendOp::Write {
            remote_addr: BASE + 3000,
            rkey,
            imm: None,
        },
        sges: Vec::new().into(),
        inline: Some(b"inline!".to_vec().into()),
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, inline).unwrap();
    p.run();
    let got = p.completions(0);
    assert_eq!(
        got.iter()
            .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
            .collect::<Vec<_>>(),
        [
            (1, Status::Success, WcOpcode::RdmaWrite, 0),
            (2, Status::Success, WcOpcode::RdmaRead, 12),
            (3, Status::Success, WcOpcode::FetchAdd, 8),
            (4, Status::Success, WcOpcode::CompSwap, 8),
            (5, Status::Success, WcOpcode::RdmaWrite, 0),
        ]
    );
    assert_eq!(p.bytes(1, BASE + 3, 8), [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(p.bytes(1, BASE + 2, 1), [0], "nothing before the range");
    assert_eq!(p.bytes(1, BASE + 11, 1), [0], "nothing after it");
    assert_eq!(p.bytes(0, BASE + 500, 12), b"remote bytes");
    assert_eq!(
        p.bytes(0, BASE + 600, 8),
        41u64.to_le_bytes(),
        "fetch-add's old value"
    );
    assert_eq!(
        p.bytes(0, BASE + 608, 8),
        42u64.to_le_bytes(),
        "cas's old value"
    );
    assert_eq!(
        p.bytes(1, BASE + 2000, 8),
        7u64.to_le_bytes(),
        "41 + 1, swapped for 7"
    );
    assert_eq!(p.bytes(1, BASE + 3000, 7), b"inline!");
    assert!(
        p.completions(1).is_empty(),
        "one-sided: nothing at the target"
    );
}

#[test]
fn a_bad_rkey_fails_both_sides_and_flushes_everything_after_it() {
    let mut p = Pair::new(0);
    let rkey = p.s[1].key;
    p.post_recv(1, 50, BASE, 64);
    let s = p.sge(0, BASE, 8);
    let bad = write_to(1, s, BASE, rkey ^ 0x100, false);
    p.post_send(0, bad).unwrap();
    p.post_send(0, send(2, vec![s], false)).unwrap();
    p.post_send(0, send(3, vec![s], true)).unwrap();
    p.run();
    // The failing request completes although unsignalled; the rest flush, signalled or not.
    assert_eq!(
        ids(&p.completions(0)),
        [
            (1, Status::RemAccessErr),
            (2, Status::WrFlushErr),
            (3, Status::WrFlushErr)
        ]
    );
    assert_eq!(p.s[0].qp.state(), QpState::Error);
    // rxe moves the responder to ERROR too: its receive flushes.
    assert_eq!(p.s[1].qp.state(), QpState::Error);
    assert_eq!(ids(&p.completions(1)), [(50, Status::WrFlushErr)]);
    // Posting on a QP in ERROR completes at once with a flush.
    p.post_send(0, send(4, vec![s], false)).unwrap();
    assert_eq!(ids(&p.completions(0)), [(4, Status::WrFlushErr)]);

    // Out of range and missing region rights are access errors too.
    for (addr, len, access) in [
        (BASE + MEM as u64 - 4, 8, None),
        (BASE, 8, Some(Access::REMOTE_READ)),
    ] {
        let mut p = Pair::new(0);
        let key = match access {
            Some(a) => p.s[1].mrs.register(1, BASE, 64, a),
            None => p.s[1].key,
        };
        let w = SendWr {
            wr_id: 9,
            op: SendOp::Write {
                remote_addr: addr,
                rkey: key,
                imm: None,
            },
            sges: vec![p.sge(0, BASE, len)].into(),
            inline: None,
            signaled: true,
            fence: false,
            solicited: false,
        };
        p.post_send(0, w).unwrap();
        p.run();
        assert_eq!(ids(&p.completions(0)), [(9, Status::RemAccessErr)]);
    }
}

/// A SEND and then a request the responder refuses, arriving together (as the rings between
/// processes deliver them, in one batch before the responder sends anything): the SEND's
/// acknowledgement still goes, before the NAK. The responder's move to ERROR dropped it with
/// everything else it had queued, and the requester, whose oldest request was the SEND, took
/// the NAK for another and waited for ever (an outside tester, on soft0 between processes).
#[test]
fn an_answer_queued_before_a_nak_still_goes() {
    for refused in ["bad key", "long send"] {
        let mut p = Pair::new(0);
        let rkey = p.s[1].key;
        p.post_recv(1, 50, BASE, 64);
        p.post_recv(1, 51, BASE + 64, 64);
        let s = p.sge(0, BASE, 8);
        let second = match refused {
            "bad key" => write_to(2, s, BASE, rkey ^ 0x100, true),
            _ => send(2, vec![p.sge(0, BASE, 65)], true),
        };
        p.post_send(0, send(1, vec![s], true)).unwrap();
        p.post_send(0, second).unwrap();
        // Both requests reach the responder before it answers either.
        p.transmit(0);
        while p.deliver(0) {}
        p.run();
        let nak = match refused {
            "bad key" => Status::RemAccessErr,
            _ => Status::RemInvReqErr,
        };
        assert_eq!(
            ids(&p.completions(0)),
            [(1, Status::Success), (2, nak)],
            "{refused}"
        );
        assert_eq!(p.s[0].qp.state(), QpState::Error);
    }
}

/// A NAK acknowledges the requests before the one it refuses, as an ACK of the PSN before
/// it would (rxe completes SENDs and WRITEs older than an answer's PSN as acknowledged): the
/// requester completes them even when no ACK of theirs came.
#[test]
fn a_nak_acknowledges_the_sends_before_it() {
    let mut p = Pair::new(0);
    let rkey = p.s[1].key;
    p.post_recv(1, 50, BASE, 64);
    p.post_recv(1, 51, BASE + 64, 64);
    let s = p.sge(0, BASE, 8);
    let bad = write_to(3, s, BASE, rkey ^ 0x100, true);
    p.post_send(0, send(1, vec![s], true)).unwrap();
    p.post_send(0, send(2, vec![s], false)).unwrap();
    p.post_send(0, bad).unwrap();
    p.transmit(0);
    while p.deliver(0) {}
    p.transmit(1);
    // Only the NAK reaches the requester.
    let before = p.wire[1].len();
    p.wire[1].retain(|b| {
        let k = Packet::decode(b).unwrap().kind;
        matches!(k, PacketKind::Nak(_))
    });
    assert!(
        p.wire[1].len() < before,
        "an acknowledgement went before the NAK"
    );
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        [(1, Status::Success), (3, Status::RemAccessErr)]
    );
}

#[test]
fn requests_the_responder_does_not_allow_are_invalid_requests() {
    // The responder's QP grants no remote access at all.
    let mut b = cfg(20, 0);
    b.access = Access::NONE;
    let mut p = Pair::with(cfg(10, 0), b);
    let rkey = p.s[1].key;
    let s8 = p.sge(0, BASE, 8);
    let w = SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: BASE,
            rkey,
        },
        sges: vec![s8].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, w).unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(1, Status::RemInvReqErr)]);

    // A misaligned atomic.
    let mut p = Pair::new(0);
    let rkey = p.s[1].key;
    let a = SendWr {
        wr_id: 2,
        op: SendOp::FetchAdd {
            remote_addr: BASE + 4,
            rkey,
            add: 1,
        },
        sges: vec![p.sge(0, BASE, 8)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    // Refused at the post, as rxe's provider does (nothing fails)...
    assert_eq!(
        p.post_send(0, a),
        Err(PostError::Invalid(
            "an atomic's remote address must be 8-byte aligned"
        ))
    );
    // ...and a responder that gets one anyway (from a peer that does not check) refuses it
    // as an invalid request.
    let now = p.now;
    let r = &mut p.s[1];
    let misaligned = Packet {
        ack: None,
        solicited: false,
        dest_qpn: 20,
        psn: 100,
        kind: PacketKind::FetchAdd {
            addr: BASE + 4,
            rkey,
            add: 1,
        },
        payload: Payload::default(),
    };
    let handled =
        r.qp.handle_packet(misaligned, &mut r.mrs, &mut r.mem, None, || now);
    assert_eq!(handled, Handled::Taken);
    let answer = r.qp.poll_transmit().expect("an answer");
    assert_eq!(answer.kind, PacketKind::Nak(Nak::InvalidRequest));

    // A receive too short: both the send and the receive fail.
    let mut p = Pair::new(0);
    p.post_recv(1, 30, BASE, 4);
    let s = p.sge(0, BASE, 8);
    p.post_send(0, send(3, vec![s], true)).unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(3, Status::RemInvReqErr)]);
    assert_eq!(ids(&p.completions(1)), [(30, Status::RemInvReqErr)]);
}

#[test]
fn a_zero_length_write_checks_no_key() {
    let mut p = Pair::new(0);
    let w = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: 0xdead_beef,
            rkey: 0x1234_5678,
            imm: None,
        },
        sges: Vec::new().into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, w).unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(1, Status::Success)]);
}

/// A responder not in RTR or RTS drops requests unexecuted, as a NIC does; the requester
/// (told by the device, where a fabric would leave it to its transport timer) sends again
/// after its timeout, `retry_cnt` times, then fails the request with `RETRY_EXC_ERR` and
/// flushes the rest. (Before: the request waited for ever.)
#[test]
fn a_request_to_a_responder_in_error_is_sent_retry_cnt_more_times_then_fails() {
    let mut p = Pair::new(0);
    p.s[1].qp.to_error();
    let s = p.sge(0, BASE, 8);
    p.post_send(0, send(1, vec![s], false)).unwrap();
    p.post_send(0, send(2, vec![s], true)).unwrap();
    let t0 = p.now;
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        [(1, Status::RetryExcErr), (2, Status::WrFlushErr)]
    );
    assert_eq!(p.s[0].qp.state(), QpState::Error);
    // retry_cnt 3: the first send and three more, each followed by a timeout (1 ms) that
    // runs out, as rxe's transport timer: (retry_cnt + 1) timeouts in all.
    assert_eq!(p.now - t0, Duration::from_millis(4));
    assert_eq!(
        p.dropped[0],
        4 * 2,
        "each send of both requests was dropped"
    );
}

/// A request whose PSN the responder does not expect (the two sides disagree on it, or the
/// responder now talks to another QP) is dropped each time; its requester times out and,
/// after its retries, fails it with `RETRY_EXC_ERR` (soft0 let it wait for ever).
#[test]
fn a_request_with_a_psn_the_responder_does_not_expect_ends_in_retry_exceeded() {
    for delta in [5u32, 5u32.wrapping_neg()] {
        let mut p = Pair::new(0);
        p.s[1].qp.reset();
        p.s[1].qp.to_init().unwrap();
        p.s[1].qp.to_rtr(10, 100u32.wrapping_add(delta)).unwrap();
        p.post_recv(1, 9, BASE, 8);
        let s = p.sge(0, BASE, 8);
        p.post_send(0, send(1, vec![s], true)).unwrap();
        p.run();
        assert_eq!(
            ids(&p.completions(0)),
            [(1, Status::RetryExcErr)],
            "{delta}"
        );
        assert!(p.completions(1).is_empty(), "{delta}");
    }
}

/// UC: a message dropped before the receiver was up leaves a gap in the PSNs; the next
/// message is taken all the same (as rxe's UC does), not every later one dropped for good.
#[test]
fn uc_takes_the_next_message_after_one_was_lost() {
    let mut p = Pair::with(uc_cfg(10), uc_cfg(20));
    p.s[1].qp.reset();
    p.s[1].qp.to_init().unwrap();
    p.fill(0, BASE, b"lost....later...");
    p.post_send(0, send(1, vec![p.sge(0, BASE, 8)], true))
        .unwrap();
    p.run();
    p.s[1].qp.to_rtr(10, 100).unwrap();
    p.post_recv(1, 7, BASE + 100, 8);
    p.post_recv(1, 8, BASE + 200, 8);
    p.post_send(0, send(2, vec![p.sge(0, BASE + 8, 8)], true))
        .unwrap();
    p.post_send(0, send(3, vec![p.sge(0, BASE + 8, 8)], true))
        .unwrap();
    p.run();
    assert_eq!(
        ids(&p.completions(1)),
        [(7, Status::Success), (8, Status::Success)]
    );
    assert_eq!(p.bytes(1, BASE + 100, 8), b"later...");
    // A sender brought up again from a lower PSN (reset, reconnected) to the same receiver:
    // its messages are taken too (an outside tester's were all lost after a reset across the
    // 24-bit wrap, each completing with success).
    p.s[0].qp.reset();
    p.s[0].qp.to_init().unwrap();
    p.s[0].qp.to_rtr(20, 100).unwrap();
    p.s[0].qp.to_rts(0x10).unwrap();
    p.post_recv(1, 9, BASE + 300, 8);
    p.post_send(0, send(4, vec![p.sge(0, BASE + 8, 8)], true))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(1)), [(9, Status::Success)]);
}

/// A request that reaches its responder before it is ready (still in INIT: the two sides
/// of a connection come up one after the other) is done once it is: the requester's retry
/// finds it in RTR.
#[test]
fn a_request_sent_before_the_responder_is_ready_is_done_once_it_is() {
    let mut a = cfg(10, 0);
    a.ack_timeout = Some(Duration::from_millis(5));
    let mut p = Pair::with(a, cfg(20, 0));
    p.s[1].qp.reset();
    p.s[1].qp.to_init().unwrap();
    p.post_recv(1, 9, BASE + 100, 8);
    p.fill(0, BASE, b"early!!!");
    let s = p.sge(0, BASE, 8);
    p.post_send(0, send(1, vec![s], true)).unwrap();
    // Sent and dropped; the requester waits for its timeout.
    p.transmit(0);
    p.deliver(0);
    p.transmit(1);
    p.deliver(1);
    assert_eq!(p.dropped[0], 1);
    assert!(p.completions(0).is_empty());
    assert!(p.s[0].qp.poll_timeout().is_some());
    p.s[1].qp.to_rtr(10, 100).unwrap();
    p.s[1].qp.to_rts(100).unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(1, Status::Success)]);
    assert_eq!(ids(&p.completions(1)), [(9, Status::Success)]);
    assert_eq!(p.bytes(1, BASE + 100, 8), b"early!!!");
}

/// Timeout code 0 (`ack_timeout: None`): the transport timer never runs out, so a dropped
/// request waits for ever, as on a NIC (nothing completes, no timer is set).
#[test]
fn with_no_timeout_a_dropped_request_waits_for_ever() {
    let mut a = cfg(10, 0);
    a.ack_timeout = None;
    let mut p = Pair::with(a, cfg(20, 0));
    p.s[1].qp.to_error();
    let s = p.sge(0, BASE, 8);
    p.post_send(0, send(1, vec![s], true)).unwrap();
    p.run();
    assert!(p.completions(0).is_empty());
    assert_eq!(p.s[0].qp.poll_timeout(), None);
    assert_eq!(p.s[0].qp.state(), QpState::Rts);
}

/// A fenced SEND starts only once the READ before it has completed, so it carries what the
/// READ brought (its bytes are gathered then, not when it was posted); what is posted after
/// it waits behind it, in order. (soft0 gathered them at the post: the SEND carried the
/// buffer's old bytes, as an outside tester found.)
#[test]
fn a_fenced_send_carries_what_the_read_before_it_brought() {
    let mut p = Pair::new(0);
    p.fill(0, BASE, &[0xee; 8]);
    p.fill(1, BASE + 200, b"fresh!!!");
    p.post_recv(1, 7, BASE + 300, 8);
    p.post_recv(1, 8, BASE + 400, 8);
    let rkey = p.s[1].key;
    let read = SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: BASE + 200,
            rkey,
        },
        sges: vec![p.sge(0, BASE, 8)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, read).unwrap();
    let mut fenced = send(2, vec![p.sge(0, BASE, 8)], true);
    fenced.fence = true;
    p.post_send(0, fenced).unwrap();
    // Not fenced itself, but behind the fenced one: it goes after it.
    p.post_send(0, send(3, vec![p.sge(0, BASE, 8)], true))
        .unwrap();
    assert!(p.transmit(0));
    assert_eq!(p.wire[0].len(), 1, "only the READ leaves before its answer");
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        [
            (1, Status::Success),
            (2, Status::Success),
            (3, Status::Success)
        ]
    );
    assert_eq!(p.bytes(1, BASE + 300, 8), b"fresh!!!");
    assert_eq!(p.bytes(1, BASE + 400, 8), b"fresh!!!");
}

/// A receive consumed by a solicited SEND (or WRITE with immediate data) completes
/// solicited; one of an unsolicited SEND does not; a send's own completion never is; a
/// failed receive is (it wakes a solicited-only arm, as on rxe).
#[test]
fn solicited_requests_mark_the_receives_they_consume() {
    let mut p = Pair::new(0);
    for id in 1..=3 {
        p.post_recv(1, id, BASE + 100 * id, 8);
    }
    let rkey = p.s[1].key;
    let mut plain = send(1, vec![p.sge(0, BASE, 8)], true);
    plain.solicited = false;
    let mut asked = send(2, vec![p.sge(0, BASE, 8)], true);
    asked.solicited = true;
    let write_imm = SendWr {
        wr_id: 3,
        op: SendOp::Write {
            remote_addr: BASE + 500,
            rkey,
            imm: Some(7),
        },
        sges: vec![p.sge(0, BASE, 8)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: true,
    };
    for w in [plain, asked, write_imm] {
        p.post_send(0, w).unwrap();
    }
    p.run();
    let marks: Vec<_> = p
        .completions(1)
        .iter()
        .map(|c| (c.wr_id, c.solicited))
        .collect();
    assert_eq!(marks, [(1, false), (2, true), (3, true)]);
    assert!(p.completions(0).iter().all(|c| !c.solicited));
    // A flushed receive is solicited.
    p.post_recv(1, 9, BASE, 8);
    p.s[1].qp.to_error();
    let flushed = p.completions(1);
    assert_eq!((flushed[0].wr_id, flushed[0].solicited), (9, true));
}

#[test]
fn rnr_retries_as_rnr_retry_says() {
    // 0: no retry.
    let mut p = Pair::new(0);
    let s = p.sge(0, BASE, 8);
    p.post_send(0, send(1, vec![s], false)).unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(1, Status::RnrRetryExcErr)]);
    // The responder is fine: an RNR NAK is not its error.
    assert_eq!(p.s[1].qp.state(), QpState::Rts);

    // 2: three tries, then the error.
    let mut p = Pair::new(2);
    let s = p.sge(0, BASE, 8);
    p.post_send(0, send(1, vec![s], true)).unwrap();
    let t0 = p.now;
    p.run();
    assert_eq!(ids(&p.completions(0)), [(1, Status::RnrRetryExcErr)]);
    assert_eq!(
        p.now - t0,
        Duration::from_micros(2 * 640),
        "two timers waited"
    );

    // 7: for ever, until a receive comes; what was sent after the refused request goes
    // again after it, in order, exactly once.
    let mut p = Pair::new(7);
    p.fill(0, BASE, b"abcdefgh");
    let rkey = p.s[1].key;
    p.post_send(0, send(1, vec![p.sge(0, BASE, 4)], true))
        .unwrap();
    let w = SendWr {
        wr_id: 2,
        op: SendOp::Write {
            remote_addr: BASE + 100,
            rkey,
            imm: None,
        },
        sges: vec![p.sge(0, BASE + 4, 4)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, w).unwrap();
    for _ in 0..20 {
        p.transmit(0);
        p.deliver(0);
        p.transmit(1);
        p.deliver(1);
        p.now += Duration::from_millis(1);
        p.s[0].qp.handle_timeout(p.now);
    }
    assert!(p.completions(0).is_empty(), "still retrying");
    assert_eq!(
        p.bytes(1, BASE + 100, 4),
        [0; 4],
        "the WRITE behind it waits"
    );
    p.post_recv(1, 9, BASE + 200, 16);
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        [(1, Status::Success), (2, Status::Success)]
    );
    assert_eq!(ids(&p.completions(1)), [(9, Status::Success)]);
    assert_eq!(p.bytes(1, BASE + 200, 4), b"abcd");
    assert_eq!(p.bytes(1, BASE + 100, 4), b"efgh");
}

#[test]
fn a_write_with_immediate_consumes_a_receive() {
    let mut p = Pair::new(7);
    let rkey = p.s[1].key;
    p.fill(0, BASE, b"data");
    let w = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: BASE + 64,
            rkey,
            imm: Some(5),
        },
        sges: vec![p.sge(0, BASE, 4)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, w).unwrap();
    p.post_recv(1, 3, BASE + 1000, 0);
    p.run();
    assert_eq!(ids(&p.completions(0)), [(1, Status::Success)]);
    let r = p.completions(1);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].imm),
        (3, WcOpcode::RecvRdmaWithImm, 4, Some(5))
    );
    assert_eq!(p.bytes(1, BASE + 64, 4), b"data");
}

#[test]
fn local_errors_and_posting_rules() {
    let mut p = Pair::new(0);
    // A bad local key: LOC_PROT_ERR, then ERROR.
    let bad = Sge {
        addr: BASE,
        len: 8,
        lkey: 0xffff_ff00,
    };
    p.post_send(0, send(1, vec![bad], false)).unwrap();
    assert_eq!(ids(&p.completions(0)), [(1, Status::LocProtErr)]);
    assert_eq!(p.s[0].qp.state(), QpState::Error);

    // A READ into memory without LOCAL_WRITE.
    let mut p = Pair::new(0);
    let ro = p.s[0].mrs.register(1, BASE, 64, Access::NONE);
    let rkey = p.s[1].key;
    let r = SendWr {
        wr_id: 2,
        op: SendOp::Read {
            remote_addr: BASE,
            rkey,
        },
        sges: vec![Sge {
            addr: BASE,
            len: 8,
            lkey: ro,
        }]
        .into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, r).unwrap();
    assert_eq!(ids(&p.completions(0)), [(2, Status::LocProtErr)]);

    // Refused at posting, with nothing queued.
    let mut q = RcQp::new(cfg(1, 0));
    let (mut mrs, mem) = (MrTable::new(), VecMemory::new(0, 0));
    assert_eq!(
        q.post_send(send(1, Vec::new(), true), &mut mrs, &mem),
        Err(PostError::State(QpState::Reset))
    );
    let r = RecvWr {
        wr_id: 1,
        sges: Vec::new().into(),
    };
    assert_eq!(q.post_recv(r), Err(PostError::State(QpState::Reset)));
    assert_eq!(q.to_rts(0), Err(PostError::State(QpState::Reset)));
    let mut p = Pair::new(0);
    let long = SendWr {
        wr_id: 1,
        op: SendOp::Send { imm: None },
        sges: Vec::new().into(),
        inline: Some(vec![0; 65].into()),
        signaled: true,
        fence: false,
        solicited: false,
    };
    assert!(matches!(p.post_send(0, long), Err(PostError::Invalid(_))));
    for k in 0..64 {
        p.post_send(0, send(k, Vec::new(), false)).unwrap();
    }
    assert_eq!(
        p.post_send(0, send(99, Vec::new(), false)),
        Err(PostError::Full)
    );
}

#[test]
fn a_broken_link_ends_the_oldest_request_with_retry_exceeded() {
    let mut p = Pair::new(0);
    p.post_recv(0, 40, BASE, 8);
    let s = p.sge(0, BASE, 8);
    p.post_send(0, send(1, vec![s], false)).unwrap();
    p.post_send(0, send(2, vec![s], false)).unwrap();
    p.s[0].qp.handle_link_down();
    assert_eq!(
        ids(&p.completions(0)),
        [
            (1, Status::RetryExcErr),
            (2, Status::WrFlushErr),
            (40, Status::WrFlushErr)
        ]
    );
}

#[test]
fn queue_pairs_share_an_srq_in_posting_order_with_its_limit_and_last_wqe_events() {
    // Two requesters (10, 11) on one device, two responders (20, 21) on another that take
    // their receives from one SRQ.
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (mut mrs_a, mut mrs_b) = (MrTable::new(), MrTable::new());
    let ka = mrs_a.register(1, BASE, MEM as u64, all);
    let kb = mrs_b.register(1, BASE, MEM as u64, all);
    let (mut mem_a, mut mem_b) = (VecMemory::new(BASE, MEM), VecMemory::new(BASE, MEM));
    mem_a.bytes[..6].copy_from_slice(b"AAABBB");
    let mut srq = Srq::new(77, 8);
    let mut qps: Vec<RcQp> = [(10, 20), (11, 21), (20, 10), (21, 11)]
        .into_iter()
        .map(|(me, peer)| {
            let mut c = cfg(me, 7);
            c.uses_srq = me >= 20;
            let mut q = RcQp::new(c);
            q.to_init().unwrap();
            q.to_rtr(peer, 0).unwrap();
            q.to_rts(0).unwrap();
            q
        })
        .collect();
    let r = RecvWr {
        wr_id: 1,
        sges: Vec::new().into(),
    };
    assert!(matches!(qps[2].post_recv(r), Err(PostError::Invalid(_))));
    for k in 0..4u64 {
        let sges = vec![Sge {
            addr: BASE + 100 + 16 * k,
            len: 16,
            lkey: kb,
        }];
        srq.post_recv(RecvWr {
            wr_id: k,
            sges: sges.into(),
        })
        .unwrap();
    }
    assert!(srq.arm_limit(8).is_err());
    srq.arm_limit(2).unwrap();
    let now = Instant::now();
    // Requester 11 first, then 10, then 11 again: receives go in posting order.
    for (from, at) in [(1usize, 3u64), (0, 0), (1, 3)] {
        let sges = vec![Sge {
            addr: BASE + at,
            len: 3,
            lkey: ka,
        }];
        qps[from]
            .post_send(send(at, sges, false), &mut mrs_a, &mem_a)
            .unwrap();
        let p = qps[from].poll_transmit().unwrap();
        let to = from + 2;
        let _ = qps[to].handle_packet(
            Packet::decode(&p.encode()).unwrap(),
            &mut mrs_b,
            &mut mem_b,
            Some(&mut srq),
            || now,
        );
        let ack = qps[to].poll_transmit().unwrap();
        let _ = qps[from].handle_packet(ack, &mut mrs_a, &mut mem_a, None, || now);
    }
    let c21: Vec<u64> = std::iter::from_fn(|| qps[3].poll_completion())
        .map(|c| c.wr_id)
        .collect();
    let c20: Vec<u64> = std::iter::from_fn(|| qps[2].poll_completion())
        .map(|c| c.wr_id)
        .collect();
    assert_eq!((c21, c20), (vec![0, 2], vec![1]));
    assert_eq!(&mem_b.bytes[100..103], b"BBB");
    assert_eq!(&mem_b.bytes[116..119], b"AAA");
    // 4 - 3 = 1 left, below 2: the limit event, once.
    assert_eq!(srq.len(), 1);
    assert!(srq.poll_limit_event());
    assert!(!srq.poll_limit_event());
    // A responder in ERROR reports that it takes no more receives from the SRQ.
    assert_eq!(qps[2].poll_event(), None);
    qps[2].to_error();
    assert_eq!(qps[2].poll_event(), Some(QpEvent::LastWqeReached));
    assert_eq!(qps[2].poll_event(), None);
    assert_eq!(srq.len(), 1, "its SRQ's receives stay for the others");
    // The other responder takes the last one; with the SRQ empty, the next SEND is an RNR.
    let mut answers = Vec::new();
    for k in 0..2 {
        let sges = vec![Sge {
            addr: BASE,
            len: 3,
            lkey: ka,
        }];
        qps[1]
            .post_send(send(10 + k, sges, false), &mut mrs_a, &mem_a)
            .unwrap();
        let p = qps[1].poll_transmit().unwrap();
        let _ = qps[3].handle_packet(p, &mut mrs_b, &mut mem_b, Some(&mut srq), || now);
        answers.push(qps[3].poll_transmit().unwrap().kind);
    }
    assert_eq!(answers[0], rsrdma_soft::PacketKind::Ack);
    assert!(matches!(
        answers[1],
        rsrdma_soft::PacketKind::Nak(rsrdma_soft::Nak::Rnr { timer_us: 640 })
    ));
    qps[0].to_error();
    assert_eq!(qps[0].poll_event(), None, "no SRQ, no event");
}

/// What a random program does from side 0.
#[derive(Debug, Clone)]
enum Op {
    Send(Vec<u8>),
    Write {
        at: u16,
        data: Vec<u8>,
    },
    Read {
        at: u16,
        len: u16,
    },
    Add {
        word: u8,
        add: u64,
    },
    /// Side 1 posts one receive.
    PostRecv,
    /// Side 1 sends a message back (into receives side 0 posted at the start): its requests
    /// carry the acknowledgements side 1 holds back.
    Reply(Vec<u8>),
    /// Side `i` sends the acknowledgement it holds back as a packet.
    FlushAck(u8),
    /// One delivery step in either direction, or a timer.
    Step(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..200).prop_map(Op::Send),
        2 => (0..4000u16, prop::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(at, data)| Op::Write { at, data }),
        2 => (0..4000u16, 0..300u16).prop_map(|(at, len)| Op::Read { at, len }),
        1 => (0..8u8, any::<u64>()).prop_map(|(word, add)| Op::Add { word, add }),
        2 => Just(Op::PostRecv),
        1 => prop::collection::vec(any::<u8>(), 0..100).prop_map(Op::Reply),
        1 => (0..2u8).prop_map(Op::FlushAck),
        6 => (0..3u8).prop_map(Op::Step),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random programs, random interleavings of posting and delivery, receives that come
    /// late (RNR NAKs, retried for ever), messages back the other way, acknowledgements held
    /// back (carried by those messages, or flushed at random): every request succeeds in
    /// order, and the target's memory, every READ and every received message are what
    /// executing the program in order gives.
    #[test]
    fn random_programs_give_what_executing_them_in_order_gives(
        ops in prop::collection::vec(op(), 1..80),
        direct in any::<bool>(),
        hold_acks in any::<bool>(),
    ) {
        let mut p = Pair::new(7);
        p.direct = direct;
        for s in &mut p.s {
            s.qp.set_hold_acks(hold_acks);
        }
        // Side 0's receives for the replies, posted before anything is sent.
        for k in 0..60u64 {
            p.post_recv(0, k, BASE + 40_000 + k * 128, 128);
        }
        let mut replies: Vec<Vec<u8>> = Vec::new();
        let rkey = p.s[1].key;
        // The reference: the target's memory region [0, 4300) and [8000, 8064) for atomics.
        let mut model = vec![0u8; 8064];
        let mut expect_reads: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut expect_msgs: Vec<Vec<u8>> = Vec::new();
        let mut posted = 0u64;
        let mut sent = 0u64;
        // Side 0's staging area: each request's bytes at their own place (never reused).
        let mut stage = 10_000u64;
        for o in &ops {
            match o {
                Op::Send(d) | Op::Write { data: d, .. } => {
                    let addr = BASE + stage;
                    p.fill(0, addr, d);
                    stage += d.len() as u64 + 1;
                    let s = p.sge(0, addr, d.len() as u32);
                    let op = match o {
                        Op::Send(_) => {
                            expect_msgs.push(d.clone());
                            SendOp::Send { imm: None }
                        }
                        Op::Write { at, .. } => {
                            model[*at as usize..*at as usize + d.len()].copy_from_slice(d);
                            SendOp::Write { remote_addr: BASE + u64::from(*at), rkey, imm: None }
                        }
                        _ => unreachable!(),
                    };
                    let wr = SendWr { wr_id: sent, op, sges: vec![s].into(), inline: None, signaled: true, fence: false, solicited: false };
                    p.post_send(0, wr).unwrap();
                    sent += 1;
                }
                Op::Read { at, len } => {
                    let addr = BASE + stage;
                    stage += u64::from(*len) + 1;
                    expect_reads.push((addr, model[*at as usize..(*at + *len) as usize].to_vec()));
                    let wr = SendWr {
                        wr_id: sent,
                        op: SendOp::Read { remote_addr: BASE + u64::from(*at), rkey },
                        sges: vec![p.sge(0, addr, u32::from(*len))].into(),
                        inline: None,
                        signaled: true,
                        fence: false,
                        solicited: false,
                    };
                    p.post_send(0, wr).unwrap();
                    sent += 1;
                }
                Op::Add { word, add } => {
                    let at = 8000 + 8 * usize::from(*word);
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&model[at..at + 8]);
                    let old = u64::from_le_bytes(w);
                    model[at..at + 8].copy_from_slice(&old.wrapping_add(*add).to_le_bytes());
                    let addr = BASE + stage;
                    stage += 9;
                    expect_reads.push((addr, old.to_le_bytes().to_vec()));
                    let wr = SendWr {
                        wr_id: sent,
                        op: SendOp::FetchAdd { remote_addr: BASE + at as u64, rkey, add: *add },
                        sges: vec![p.sge(0, addr, 8)].into(),
                        inline: None,
                        signaled: true,
                        fence: false,
                        solicited: false,
                    };
                    p.post_send(0, wr).unwrap();
                    sent += 1;
                }
                Op::PostRecv => {
                    if posted < 60 {
                        p.post_recv(1, posted, BASE + 20_000 + posted * 256, 256);
                        posted += 1;
                    }
                }
                Op::Reply(d) if replies.len() < 60 => {
                    let addr = BASE + 30_000 + replies.len() as u64 * 128;
                    p.fill(1, addr, d);
                    let wr = send(replies.len() as u64, vec![p.sge(1, addr, d.len() as u32)], true);
                    let s = &mut p.s[1];
                    s.qp.post_send(wr, &mut s.mrs, &s.mem).unwrap();
                    replies.push(d.clone());
                }
                Op::Reply(_) => {}
                Op::FlushAck(i) => {
                    p.s[usize::from(*i)].qp.flush_ack();
                }
                Op::Step(k) => match k {
                    0 => { p.transmit(0); p.deliver(0); }
                    1 => { p.transmit(1); p.deliver(1); }
                    _ => {
                        p.now += Duration::from_micros(700);
                        p.s[0].qp.handle_timeout(p.now);
                    }
                },
            }
        }
        // Enough receives for every SEND, then run to the end.
        while posted < expect_msgs.len() as u64 {
            p.post_recv(1, posted, BASE + 20_000 + posted * 256, 256);
            posted += 1;
        }
        p.run();
        let (done, got_back) = sends_and_receives(p.completions(0));
        let (back, got) = sends_and_receives(p.completions(1));
        prop_assert_eq!(done.len() as u64, sent);
        for (k, c) in done.iter().enumerate() {
            prop_assert_eq!((c.wr_id, c.status), (k as u64, Status::Success));
        }
        prop_assert_eq!(p.bytes(1, BASE, 8064), model);
        for (addr, want) in &expect_reads {
            prop_assert_eq!(&p.bytes(0, *addr, want.len()), want);
        }
        prop_assert_eq!(got.len(), expect_msgs.len());
        for (k, (c, want)) in got.iter().zip(&expect_msgs).enumerate() {
            prop_assert_eq!((c.wr_id, c.status, c.byte_len as usize), (k as u64, Status::Success, want.len()));
            prop_assert_eq!(&p.bytes(1, BASE + 20_000 + k as u64 * 256, want.len()), want);
        }
        // The replies: every one sent and received whole, in order.
        prop_assert_eq!(ids(&back), (0..replies.len() as u64).map(|k| (k, Status::Success)).collect::<Vec<_>>());
        prop_assert_eq!(got_back.len(), replies.len());
        for (k, (c, want)) in got_back.iter().zip(&replies).enumerate() {
            prop_assert_eq!((c.wr_id, c.status, c.byte_len as usize), (k as u64, Status::Success, want.len()));
            prop_assert_eq!(&p.bytes(0, BASE + 40_000 + k as u64 * 128, want.len()), want);
        }
        prop_assert_eq!(p.s[0].qp.held_acks() + p.s[1].qp.held_acks(), 0);
        prop_assert_eq!(p.s[0].qp.state(), QpState::Rts);
        prop_assert_eq!(p.s[1].qp.state(), QpState::Rts);
    }
}

#[test]
fn unreliable_connected_sends_and_writes_complete_as_they_leave_and_drop_what_fails() {
    let mut p = Pair::with(uc_cfg(10), uc_cfg(20));
    p.fill(0, BASE, b"first second third");
    // No receive at the peer: the SEND completes at the sender and is dropped there (no
    // RNR, no retry); the next one, with a receive, lands.
    p.post_send(0, send(1, vec![p.sge(0, BASE, 5)], true))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), vec![(1, Status::Success)]);
    assert!(p.completions(1).is_empty());
    p.post_recv(1, 9, BASE + 1000, 64);
    p.post_send(0, send(2, vec![p.sge(0, BASE + 6, 6)], true))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), vec![(2, Status::Success)]);
    let r = p.completions(1);
    assert_eq!((r[0].wr_id, r[0].byte_len), (9, 6));
    assert_eq!(p.bytes(1, BASE + 1000, 6), b"second");
    // A WRITE with a bad key is dropped at the responder; neither QP fails, and a good
    // WRITE after it lands.
    let write = |wr_id, rkey, addr| SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr: addr,
            rkey,
            imm: None,
        },
        sges: vec![Sge {
            addr: BASE + 13,
            len: 5,
            lkey: p.s[0].key,
        }]
        .into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    let (bad, good) = (
        write(3, p.s[1].key ^ 0x100, BASE + 2000),
        write(4, p.s[1].key, BASE + 2000),
    );
    p.post_send(0, bad).unwrap();
    p.post_send(0, good).unwrap();
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        vec![(3, Status::Success), (4, Status::Success)]
    );
    assert_eq!(p.bytes(1, BASE + 2000, 5), b"third");
    assert_eq!(
        (p.s[0].qp.state(), p.s[1].qp.state()),
        (QpState::Rts, QpState::Rts)
    );
    // No READ, no atomics; a broken link goes unnoticed.
    let read = SendWr {
        wr_id: 5,
        op: SendOp::Read {
            remote_addr: BASE,
            rkey: p.s[1].key,
        },
        sges: vec![p.sge(0, BASE, 8)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    assert!(matches!(p.post_send(0, read), Err(PostError::Invalid(_))));
    p.s[0].qp.handle_link_down();
    assert_eq!(p.s[0].qp.state(), QpState::Rts);
}

#[test]
fn refused_receives_answer_rnr_and_the_requester_retries() {
    // Retries left: the refused SEND goes again after the responder's timer and lands.
    let mut p = Pair::new(7);
    p.fill(0, BASE, b"abcdef");
    p.post_recv(1, 5, BASE + 100, 16);
    p.s[1].qp.refuse_receives(2);
    let start = p.now;
    p.post_send(0, send(1, vec![p.sge(0, BASE, 6)], true))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), vec![(1, Status::Success)]);
    assert_eq!(ids(&p.completions(1)), vec![(5, Status::Success)]);
    assert_eq!(p.bytes(1, BASE + 100, 6), b"abcdef");
    // Two refusals: two RNR timers passed.
    assert!(p.now.duration_since(start) >= Duration::from_micros(2 * 640));
    // No retries left: the request fails with RNR_RETRY_EXC_ERR.
    let mut p = Pair::new(1);
    p.post_recv(1, 5, BASE + 100, 16);
    p.s[1].qp.refuse_receives(2);
    p.post_send(0, send(1, vec![p.sge(0, BASE, 6)], true))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), vec![(1, Status::RnrRetryExcErr)]);
}

// ----- type-2 memory windows ------------------------------------------------------------------

/// A bind request of window `mw_key` to `len` bytes at `addr` of region `mr_key`, under the
/// next tag.
fn bind_wr(wr_id: u64, mw_key: u32, mr_key: u32, addr: u64, len: u64, access: Access) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::BindMw(Bind {
            mw_key,
            new_key: mw_key.wrapping_add(1),
            mr_key,
            addr,
            len,
            access,
        }),
        sges: Vec::new().into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    }
}

/// The key a bind by [`bind_wr`] gives window `mw_key`.
fn next_key(mw_key: u32) -> u32 {
    (mw_key & !0xff) | (mw_key.wrapping_add(1) & 0xff)
}

fn local_inv(wr_id: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::LocalInv { rkey },
        sges: Vec::new().into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    }
}

fn read(wr_id: u64, sge: Sge, remote_addr: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Read { remote_addr, rkey },
        sges: vec![sge].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    }
}

/// Side 1's region for windows (local write and MW_BIND, no remote right of its own) over
/// its memory, and a free window.
fn window_on_side_1(p: &mut Pair) -> (u32, u32) {
    let mrs = &mut p.s[1].mrs;
    let mr = mrs.register(1, BASE, MEM as u64, Access::LOCAL_WRITE | Access::MW_BIND);
    (mr, mrs.alloc_window(1))
}

fn opcodes(c: &[Completion]) -> Vec<(u64, Status, WcOpcode)> {
    c.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect()
}

#[test]
fn a_bound_window_serves_its_range_with_its_rights_until_it_is_invalidated() {
    let mut p = Pair::new(0);
    let (mr, mw) = window_on_side_1(&mut p);
    p.fill(1, BASE + 4096, b"through the window");
    // The region itself grants no remote read.
    p.post_send(0, read(1, p.sge(0, BASE, 8), BASE + 4096, mr))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(1, Status::RemAccessErr)]);

    let mut p = Pair::new(0);
    let (mr, mw2) = window_on_side_1(&mut p);
    assert_eq!(mw2, mw, "the same table, the same first keys");
    p.fill(1, BASE + 4096, b"through the window");
    p.post_send(
        1,
        bind_wr(7, mw, mr, BASE + 4096, 4096, Access::REMOTE_READ),
    )
    .unwrap();
    p.run();
    assert_eq!(
        opcodes(&p.completions(1)),
        [(7, Status::Success, WcOpcode::BindMw)]
    );
    let key = next_key(mw);
    p.post_send(0, read(2, p.sge(0, BASE, 18), BASE + 4096, key))
        .unwrap();
    p.run();
    assert_eq!(
        opcodes(&p.completions(0)),
        [(2, Status::Success, WcOpcode::RdmaRead)]
    );
    assert_eq!(p.bytes(0, BASE, 18), b"through the window");
    // The window's key from before the bind does not work.
    p.post_send(0, read(3, p.sge(0, BASE, 8), BASE + 4096, mw))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(3, Status::RemAccessErr)]);
    assert_eq!(p.s[1].qp.state(), QpState::Error, "as for a bad region key");

    // Outside the window (inside its region), and a right it does not grant.
    for (addr, write) in [
        (BASE + 4096 - 8, false),
        (BASE + 8192 - 4, false),
        (BASE + 4096, true),
    ] {
        let mut p = Pair::new(0);
        let (mr, mw) = window_on_side_1(&mut p);
        p.post_send(
            1,
            bind_wr(1, mw, mr, BASE + 4096, 4096, Access::REMOTE_READ),
        )
        .unwrap();
        let key = next_key(mw);
        let op = if write {
            SendOp::Write {
                remote_addr: addr,
                rkey: key,
                imm: None,
            }
        } else {
            SendOp::Read {
                remote_addr: addr,
                rkey: key,
            }
        };
        let wr = SendWr {
            wr_id: 2,
            op,
            sges: vec![p.sge(0, BASE, 8)].into(),
            inline: None,
            signaled: true,
            fence: false,
            solicited: false,
        };
        p.post_send(0, wr).unwrap();
        p.run();
        assert_eq!(
            ids(&p.completions(0)),
            [(2, Status::RemAccessErr)],
            "{addr:#x}"
        );
        assert_eq!(p.s[1].qp.state(), QpState::Error);
    }

    // Invalidated: the key is dead; the window may be bound again under a new tag.
    let mut p = Pair::new(0);
    let (mr, mw) = window_on_side_1(&mut p);
    let key = next_key(mw);
    p.post_send(1, bind_wr(1, mw, mr, BASE, 64, Access::REMOTE_READ))
        .unwrap();
    p.post_send(1, local_inv(2, key)).unwrap();
    p.post_send(1, bind_wr(3, key, mr, BASE + 64, 64, Access::REMOTE_READ))
        .unwrap();
    p.run();
    assert_eq!(
        opcodes(&p.completions(1)),
        [
            (1, Status::Success, WcOpcode::BindMw),
            (2, Status::Success, WcOpcode::LocalInv),
            (3, Status::Success, WcOpcode::BindMw)
        ]
    );
    let again = next_key(key);
    p.post_send(0, read(4, p.sge(0, BASE, 8), BASE + 64, again))
        .unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(4, Status::Success)]);
    p.post_send(0, read(5, p.sge(0, BASE, 8), BASE, key))
        .unwrap();
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        [(5, Status::RemAccessErr)],
        "no access after the invalidation"
    );
}

#[test]
fn a_window_works_only_through_the_qp_it_was_bound_on() {
    // Requesters 10 and 11 on device a; responders 20 and 21 on device b, one domain.
    let mut mrs_a = MrTable::new();
    let mut mrs_b = MrTable::new();
    let ka = mrs_a.register(1, BASE, MEM as u64, Access::LOCAL_WRITE);
    let mr = mrs_b.register(1, BASE, MEM as u64, Access::LOCAL_WRITE | Access::MW_BIND);
    let mw = mrs_b.alloc_window(1);
    let (mut mem_a, mut mem_b) = (VecMemory::new(BASE, MEM), VecMemory::new(BASE, MEM));
    mem_b.bytes[..4].copy_from_slice(b"mine");
    let mut qps: Vec<RcQp> = [(10, 20), (11, 21), (20, 10), (21, 11)]
        .into_iter()
        .map(|(me, peer)| {
            let mut q = RcQp::new(cfg(me, 0));
            q.to_init().unwrap();
            q.to_rtr(peer, 0).unwrap();
            q.to_rts(0).unwrap();
            q
        })
        .collect();
    qps[2]
        .post_send(
            bind_wr(1, mw, mr, BASE, 64, Access::REMOTE_READ),
            &mut mrs_b,
            &mem_b,
        )
        .unwrap();
    let c = qps[2].poll_completion().unwrap();
    assert_eq!((c.status, c.opcode), (Status::Success, WcOpcode::BindMw));
    let key = next_key(mw);
    let now = Instant::now();
    let mut exchange = |qps: &mut Vec<RcQp>, from: usize, mrs_a: &mut MrTable| {
        let sge = Sge {
            addr: BASE,
            len: 4,
            lkey: ka,
        };
        qps[from]
            .post_send(read(9, sge, BASE, key), mrs_a, &mem_a)
            .unwrap();
        let req = qps[from].poll_transmit().unwrap();
        let _ = qps[from + 2].handle_packet(req, &mut mrs_b, &mut mem_b, None, || now);
        let answer = qps[from + 2].poll_transmit().unwrap();
        let _ = qps[from].handle_packet(answer, mrs_a, &mut mem_a, None, || now);
        qps[from].poll_completion().unwrap().status
    };
    // Through QP 21, on the same domain as the window: refused, and 21 fails.
    assert_eq!(exchange(&mut qps, 1, &mut mrs_a), Status::RemAccessErr);
    assert_eq!(qps[3].state(), QpState::Error);
    // Through QP 20, the one it was bound on.
    assert_eq!(exchange(&mut qps, 0, &mut mrs_a), Status::Success);
    assert_eq!(qps[2].state(), QpState::Rts);
}

/// A fenced invalidation waits for the READ before it: the window it takes away stays valid
/// until then (soft0 invalidated it at the post, and the peer's WRITE through it failed).
#[test]
fn a_fenced_invalidation_waits_for_the_read_before_it() {
    let mut p = Pair::new(0);
    let (mr, mw) = window_on_side_1(&mut p);
    p.post_send(1, bind_wr(1, mw, mr, BASE, 64, Access::REMOTE_WRITE))
        .unwrap();
    p.run();
    let key = next_key(mw);
    let _ = p.completions(1);
    let rkey = p.s[0].key;
    let read = SendWr {
        wr_id: 2,
        op: SendOp::Read {
            remote_addr: BASE,
            rkey,
        },
        sges: vec![p.sge(1, BASE + 200, 8)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(1, read).unwrap();
    let mut inv = local_inv(3, key);
    inv.fence = true;
    p.post_send(1, inv).unwrap();
    assert!(
        p.s[1].mrs.window(key).and_then(|w| w.binding).is_some(),
        "the window is still bound while the READ is unanswered"
    );
    p.run();
    assert_eq!(
        opcodes(&p.completions(1)),
        [
            (2, Status::Success, WcOpcode::RdmaRead),
            (3, Status::Success, WcOpcode::LocalInv)
        ]
    );
    assert_eq!(p.s[1].mrs.window(key).and_then(|w| w.binding), None);
}

#[test]
fn binds_and_invalidations_complete_in_send_queue_order_and_their_errors_fail_the_qp() {
    // A bind posted behind a SEND that waits for its ACK completes after it.
    let mut p = Pair::new(0);
    let (mr, mw) = window_on_side_1(&mut p);
    p.post_recv(0, 50, BASE + 100, 16);
    p.post_send(1, send(1, vec![p.sge(1, BASE, 4)], true))
        .unwrap();
    p.post_send(1, bind_wr(2, mw, mr, BASE, 64, Access::REMOTE_READ))
        .unwrap();
    assert_eq!(
        p.completions(1),
        [],
        "the bind waits for the SEND before it"
    );
    p.run();
    assert_eq!(
        opcodes(&p.completions(1)),
        [
            (1, Status::Success, WcOpcode::Send),
            (2, Status::Success, WcOpcode::BindMw)
        ]
    );
    // Unsignalled: no completion.
    let key = next_key(mw);
    let mut inv = local_inv(3, key);
    inv.signaled = false;
    p.post_send(1, inv).unwrap();
    assert_eq!(p.completions(1), []);
    assert_eq!(p.s[1].mrs.window(key).and_then(|w| w.binding), None);

    // A bind that breaks a rule: MW_BIND_ERR (even unsignalled), the QP fails, the rest
    // flushes.
    let mut p = Pair::new(0);
    let (_, mw) = window_on_side_1(&mut p);
    let no_bind = p.s[1].key;
    let mut bad = bind_wr(1, mw, no_bind, BASE, 64, Access::REMOTE_READ);
    bad.signaled = false;
    p.post_send(1, bad).unwrap();
    p.post_send(1, send(2, Vec::new(), true)).unwrap();
    assert_eq!(
        opcodes(&p.completions(1)),
        [
            (1, Status::MwBindErr, WcOpcode::BindMw),
            (2, Status::WrFlushErr, WcOpcode::Send)
        ]
    );
    assert_eq!(p.s[1].qp.state(), QpState::Error);
    assert_eq!(p.s[1].mrs.window(mw).and_then(|w| w.binding), None);

    // An invalidation of a key that names no bound window (a free window's, nobody's, a
    // region's): LOC_QP_OP_ERR, the QP fails.
    for which in 0..3 {
        let mut p = Pair::new(0);
        let (_, mw) = window_on_side_1(&mut p);
        let key = [mw, 0x1234_5678, p.s[1].key][which];
        p.post_send(1, local_inv(1, key)).unwrap();
        assert_eq!(
            opcodes(&p.completions(1)),
            [(1, Status::LocQpOpErr, WcOpcode::LocalInv)],
            "{key:#x}"
        );
        assert_eq!(p.s[1].qp.state(), QpState::Error);
    }
}

#[test]
fn a_region_with_a_bound_window_is_not_deregistered() {
    let mut p = Pair::new(0);
    let (mr, mw) = window_on_side_1(&mut p);
    p.post_send(1, bind_wr(1, mw, mr, BASE, 64, Access::REMOTE_READ))
        .unwrap();
    assert_eq!(p.s[1].mrs.deregister(mr), Err(DeregError::WindowsBound(1)));
    assert!(p.s[1].mrs.dealloc_window(mw));
    assert_eq!(p.s[1].mrs.deregister(mr), Ok(()));
}

#[test]
fn a_send_with_invalidate_frees_the_peers_window_bound_to_its_qp() {
    let mut p = Pair::new(0);
    let (mr, mw) = window_on_side_1(&mut p);
    p.post_send(1, bind_wr(1, mw, mr, BASE, 64, Access::REMOTE_READ))
        .unwrap();
    let key = next_key(mw);
    p.fill(0, BASE, b"done");
    p.post_recv(1, 40, BASE + 200, 16);
    let inv = SendWr {
        wr_id: 2,
        op: SendOp::SendWithInv { rkey: key },
        sges: vec![p.sge(0, BASE, 4)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, inv.clone()).unwrap();
    p.run();
    assert_eq!(
        opcodes(&p.completions(0)),
        [(2, Status::Success, WcOpcode::Send)]
    );
    let r = p.completions(1);
    assert_eq!(
        opcodes(&r),
        [
            (1, Status::Success, WcOpcode::BindMw),
            (40, Status::Success, WcOpcode::Recv)
        ]
    );
    assert_eq!((r[1].byte_len, r[1].invalidated_rkey), (4, Some(key)));
    assert_eq!(p.bytes(1, BASE + 200, 4), b"done");
    assert_eq!(p.s[1].mrs.window(key).and_then(|w| w.binding), None);
    // Again: no bound window has the key any more. The receive fails, the sender learns it.
    p.post_recv(1, 41, BASE + 200, 16);
    p.post_send(0, inv).unwrap();
    p.run();
    assert_eq!(ids(&p.completions(0)), [(2, Status::RemInvReqErr)]);
    assert_eq!(ids(&p.completions(1)), [(41, Status::RemInvReqErr)]);
    assert_eq!(p.s[1].qp.state(), QpState::Error);

    // UC has none.
    let (mut a, mut b) = (cfg(10, 0), cfg(20, 0));
    a.unreliable = true;
    b.unreliable = true;
    let mut p = Pair::with(a, b);
    let inv = SendWr {
        wr_id: 1,
        op: SendOp::SendWithInv { rkey: 1 },
        sges: Vec::new().into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    assert!(matches!(p.post_send(0, inv), Err(PostError::Invalid(_))));
    // But binds a window (done as it is posted).
    let (mr, mw) = window_on_side_1(&mut p);
    p.post_send(1, bind_wr(2, mw, mr, BASE, 64, Access::REMOTE_WRITE))
        .unwrap();
    assert_eq!(ids(&p.completions(1)), [(2, Status::Success)]);
}

/// A WRITE with immediate data, for the tests of the direct path.
fn write_wr(wr_id: u64, sge: Sge, remote_addr: u64, rkey: u32, imm: Option<u32>) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr,
            rkey,
            imm,
        },
        sges: vec![sge].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    }
}

#[test]
fn direct_requests_complete_at_once_take_no_psn_and_leave_everything_else_to_packets() {
    let mut p = Pair::new(0);
    p.direct = true;
    let rkey = p.s[1].key;
    p.fill(0, BASE, b"direct!!");
    p.fill(1, BASE + 104, &7u64.to_le_bytes());
    // A WRITE, a READ and a fetch-and-add with nothing ahead: done at once, no packet.
    p.post_send(0, write_wr(1, p.sge(0, BASE, 8), BASE + 4000, rkey, None))
        .unwrap();
    p.post_send(0, read(2, p.sge(0, BASE + 16, 8), BASE + 4000, rkey))
        .unwrap();
    let add = SendWr {
        wr_id: 3,
        op: SendOp::FetchAdd {
            remote_addr: BASE + 104,
            rkey,
            add: 5,
        },
        sges: vec![p.sge(0, BASE + 24, 8)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, add).unwrap();
    assert!(!p.transmit(0), "no packet went");
    assert_eq!(
        opcodes(&p.completions(0)),
        vec![
            (1, Status::Success, WcOpcode::RdmaWrite),
            (2, Status::Success, WcOpcode::RdmaRead),
            (3, Status::Success, WcOpcode::FetchAdd),
        ]
    );
    assert_eq!(p.bytes(1, BASE + 4000, 8), b"direct!!");
    assert_eq!(p.bytes(0, BASE + 16, 8), b"direct!!");
    assert_eq!(p.bytes(0, BASE + 24, 8), 7u64.to_le_bytes());
    assert_eq!(p.bytes(1, BASE + 104, 8), 12u64.to_le_bytes());
    // The responder heard of none of them: a SEND after them still carries the PSN it
    // expects, and lands.
    p.post_recv(1, 50, BASE + 5000, 64);
    p.post_send(0, send(4, vec![p.sge(0, BASE, 8)], true))
        .unwrap();
    assert!(p.transmit(0), "a SEND goes as a packet");
    // Behind the unanswered SEND, a WRITE goes as a packet too (in order).
    p.post_send(0, write_wr(5, p.sge(0, BASE, 8), BASE + 4100, rkey, None))
        .unwrap();
    assert!(p.transmit(0), "the WRITE behind it went as a packet");
    // So does a WRITE with immediate data (it needs the responder's receive).
    p.run();
    p.post_recv(1, 51, BASE + 5100, 64);
    p.post_send(
        0,
        write_wr(6, p.sge(0, BASE, 8), BASE + 4200, rkey, Some(9)),
    )
    .unwrap();
    assert!(p.transmit(0), "a WRITE with immediate went as a packet");
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        vec![
            (4, Status::Success),
            (5, Status::Success),
            (6, Status::Success)
        ]
    );
    assert_eq!(
        ids(&p.completions(1)),
        vec![(50, Status::Success), (51, Status::Success)]
    );
    assert_eq!(p.bytes(1, BASE + 5000, 8), b"direct!!");
    assert_eq!(p.bytes(1, BASE + 4100, 8), b"direct!!");
    // A bad key is not the direct path's to judge: the packet goes, and the responder fails
    // it as ever (REM_ACCESS_ERR, both queue pairs to ERROR).
    p.post_send(
        0,
        write_wr(7, p.sge(0, BASE, 8), BASE + 4000, rkey ^ 0x100, None),
    )
    .unwrap();
    assert!(p.transmit(0), "a bad key went as a packet");
    p.run();
    assert_eq!(ids(&p.completions(0)), vec![(7, Status::RemAccessErr)]);
    assert_eq!(p.s[1].qp.state(), QpState::Error);
    // Once the requester failed, nothing goes direct: requests flush.
    p.post_send(0, write_wr(8, p.sge(0, BASE, 8), BASE + 4300, rkey, None))
        .unwrap();
    assert_eq!(ids(&p.completions(0)), vec![(8, Status::WrFlushErr)]);
    assert_eq!(p.bytes(1, BASE + 4300, 8), vec![0; 8]);
}

#[test]
fn a_responder_without_the_right_or_not_ready_is_reached_through_packets() {
    let mut b = cfg(20, 0);
    b.access = Access::REMOTE_READ;
    let mut p = Pair::with(cfg(10, 0), b);
    p.direct = true;
    let rkey = p.s[1].key;
    // The responder grants no REMOTE_WRITE: the WRITE goes as a packet and fails there.
    p.post_send(0, write_wr(1, p.sge(0, BASE, 8), BASE + 4000, rkey, None))
        .unwrap();
    assert!(p.transmit(0));
    p.run();
    assert_eq!(ids(&p.completions(0)), vec![(1, Status::RemInvReqErr)]);
}

#[test]
fn an_unreliable_connected_queue_pair_never_goes_direct() {
    let mut p = Pair::with(uc_cfg(10), uc_cfg(20));
    p.direct = true;
    let rkey = p.s[1].key;
    // Its WRITEs complete as they leave: one still on its way leaves no trace in the queue
    // pair, so a later one must not overtake it by going direct.
    p.post_send(0, write_wr(1, p.sge(0, BASE, 8), BASE + 4000, rkey, None))
        .unwrap();
    assert!(p.transmit(0), "the WRITE went as a packet");
    p.post_send(0, write_wr(2, p.sge(0, BASE, 8), BASE + 4100, rkey, None))
        .unwrap();
    assert!(p.transmit(0), "and so did the next");
}

/// A peer that answers a request with a response of another kind (its bug or malice): a READ
/// response to a SEND, an atomic's old value to a WRITE, an ACK past a READ. As rxe, the
/// request fails (`FATAL_ERR`) and the QP goes to ERROR; nothing of the answer lands (a READ
/// response scattered into a SEND's buffers would write memory the peer has no right to).
#[test]
fn an_answer_of_the_wrong_kind_fails_the_request_and_writes_nothing() {
    use rsrdma_soft::{PacketKind, Payload};
    let forged = |kind: PacketKind, payload: &[u8]| Packet {
        ack: None,
        solicited: false,
        dest_qpn: 10,
        psn: 100,
        kind,
        payload: Payload::from_slice(payload),
    };
    let rkey_of = |p: &Pair| p.s[1].key;
    // (what, the request from its id, its buffer and the peer's key, the forged answer)
    type Request = fn(u64, Sge, u32) -> SendWr;
    let cases: [(&str, Request, PacketKind, &[u8]); 3] = [
        (
            "a READ response to a SEND",
            |id, sge, _| send(id, vec![sge], true),
            PacketKind::ReadResponse,
            b"PEER-WROTE-THIS!",
        ),
        (
            "an atomic response to a WRITE",
            |id, sge, rkey| write_wr(id, sge, BASE + 4000, rkey, None),
            PacketKind::AtomicResponse { old: u64::MAX },
            &[],
        ),
        (
            "an ACK past a READ",
            |id, sge, rkey| SendWr {
                wr_id: id,
                op: SendOp::Read {
                    remote_addr: BASE + 4000,
                    rkey,
                },
                sges: vec![sge].into(),
                inline: None,
                signaled: true,
                fence: false,
                solicited: false,
            },
            PacketKind::Ack,
            &[],
        ),
    ];
    for (what, wr, kind, payload) in cases {
        let mut p = Pair::new(0);
        p.fill(0, BASE, b"ORIGINAL-SENDBUF");
        let rkey = rkey_of(&p);
        p.post_send(0, wr(7, p.sge(0, BASE, 16), rkey)).unwrap();
        // The request goes nowhere; the forged answer comes instead.
        assert!(p.transmit(0));
        p.wire[0].clear();
        let now = p.now;
        let s = &mut p.s[0];
        let _ =
            s.qp.handle_packet(forged(kind, payload), &mut s.mrs, &mut s.mem, None, || now);
        assert_eq!(
            ids(&p.completions(0)),
            vec![(7, Status::FatalErr)],
            "{what}"
        );
        assert_eq!(p.s[0].qp.state(), QpState::Error, "{what}");
        assert_eq!(
            p.bytes(0, BASE, 16),
            b"ORIGINAL-SENDBUF",
            "{what}: nothing landed"
        );
    }
}

/// A message over `max_msg_sz` (2 GiB) is refused at its post: a packet's length field would
/// wrap past 4 GiB, and a peer device takes no payload over 2 GiB.
#[test]
fn a_message_over_two_gib_is_refused_at_its_post() {
    let mut p = Pair::new(0);
    let rkey = p.s[1].key;
    let half = p.sge(0, BASE, 1 << 30);
    let big = vec![half, half, p.sge(0, BASE, 1)];
    let read = SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: BASE,
            rkey,
        },
        sges: big.clone().into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    for wr in [send(1, big.clone(), true), read] {
        assert!(
            matches!(p.post_send(0, wr), Err(PostError::Invalid(_))),
            "2 GiB + 1 byte"
        );
    }
    assert!(p.completions(0).is_empty());
    assert_eq!(p.s[0].qp.state(), QpState::Rts, "the QP goes on");
}

/// A request that fails its local checks behind others still waiting for the peer completes
/// in send-queue order, as rxe's completer reports it: the requests before it complete
/// (delivered), then it fails (`LOC_PROT_ERR`) and the QP with it, and what follows is
/// flushed. Before, its error came first and flushed the valid requests before it, which the
/// peer then never got.
#[test]
fn a_request_failing_its_local_checks_completes_after_those_before_it() {
    let mut p = Pair::new(0);
    for k in 0..3 {
        p.post_recv(1, 100 + k, BASE + 64 * k, 16);
    }
    let bad = Sge {
        addr: BASE,
        len: 8,
        lkey: 0xdead,
    };
    p.fill(0, BASE + 512, b"first");
    p.post_send(0, send(1, vec![p.sge(0, BASE + 512, 5)], true))
        .unwrap();
    p.post_send(0, send(2, vec![bad], true)).unwrap();
    p.post_send(0, send(3, vec![p.sge(0, BASE + 512, 5)], true))
        .unwrap();
    assert_eq!(ids(&p.completions(0)), [], "nothing before the first's ACK");
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        [
            (1, Status::Success),
            (2, Status::LocProtErr),
            (3, Status::WrFlushErr)
        ]
    );
    assert_eq!(p.s[0].qp.state(), QpState::Error);
    assert_eq!(
        ids(&p.completions(1)),
        [(100, Status::Success)],
        "the first arrived"
    );
    assert_eq!(p.bytes(1, BASE, 5), b"first");
}

/// A READ (or atomic) whose destination region was deregistered after the post: its answer
/// lands in nothing (`LOC_PROT_ERR`, the QP fails), as rxe looks the key up when the answer
/// arrives. Before, the core scattered it into the old range, memory that may have been
/// freed and reused (a tester's program aborted in malloc).
#[test]
fn an_answer_for_a_deregistered_destination_writes_nothing() {
    for atomic in [false, true] {
        let mut p = Pair::new(0);
        p.fill(1, BASE + 2048, b"REMOTE-BYTES");
        let dest = p.s[0].mrs.register(1, BASE + 4096, 64, Access::LOCAL_WRITE);
        let sge = Sge {
            addr: BASE + 4096,
            len: if atomic { 8 } else { 12 },
            lkey: dest,
        };
        let rkey = p.s[1].key;
        let wr = if atomic {
            SendWr {
                wr_id: 5,
                op: SendOp::FetchAdd {
                    remote_addr: BASE + 2048,
                    rkey,
                    add: 1,
                },
                sges: vec![sge].into(),
                inline: None,
                signaled: true,
                fence: false,
                solicited: false,
            }
        } else {
            read(5, sge, BASE + 2048, rkey)
        };
        p.post_send(0, wr).unwrap();
        assert!(p.s[0].mrs.deregister(dest).is_ok(), "atomic {atomic}");
        p.run();
        assert_eq!(
            ids(&p.completions(0)),
            [(5, Status::LocProtErr)],
            "atomic {atomic}"
        );
        assert_eq!(p.s[0].qp.state(), QpState::Error);
        assert_eq!(
            p.bytes(0, BASE + 4096, 12),
            [0; 12],
            "atomic {atomic}: nothing landed"
        );
    }
}

/// The link breaks while the QP waits for nothing: as on rxe, the QP stays as it is (no
/// flush, receives stay posted) and its next request goes unanswered (`RETRY_EXC_ERR`),
/// then the QP fails. Before, it failed at once and silently: that next request said only
/// `WR_FLUSH_ERR`, which tells nothing of why.
#[test]
fn a_link_broken_while_idle_fails_the_next_request_with_retry_exceeded() {
    for direct in [false, true] {
        let mut p = Pair::new(0);
        p.direct = direct;
        p.post_recv(0, 40, BASE, 8);
        p.s[0].qp.handle_link_down();
        assert_eq!(p.s[0].qp.state(), QpState::Rts, "direct {direct}");
        assert_eq!(ids(&p.completions(0)), [], "nothing flushed yet");
        let rkey = p.s[1].key;
        p.post_send(
            0,
            write_wr(1, p.sge(0, BASE + 64, 8), BASE + 64, rkey, None),
        )
        .unwrap();
        p.post_send(0, send(2, vec![p.sge(0, BASE + 64, 8)], true))
            .unwrap();
        assert_eq!(
            ids(&p.completions(0)),
            [
                (1, Status::RetryExcErr),
                (40, Status::WrFlushErr),
                (2, Status::WrFlushErr)
            ],
            "direct {direct}: the failure flushes the receive, then the later post flushes"
        );
        assert_eq!(p.s[0].qp.state(), QpState::Error);
    }
}

#[test]
fn a_held_acknowledgement_rides_on_the_answer_and_goes_alone_when_flushed() {
    let mut p = Pair::new(0);
    for s in &mut p.s {
        s.qp.set_hold_acks(true);
    }
    p.post_recv(1, 1, BASE + 100, 64);
    p.post_recv(0, 2, BASE + 200, 64);
    let ping = send(10, vec![p.sge(0, BASE, 8)], true);
    p.post_send(0, ping).unwrap();
    assert!(p.transmit(0) && p.deliver(0));
    // Executed: its receive completes, and no ACK packet goes.
    assert_eq!(ids(&p.completions(1)), vec![(1, Status::Success)]);
    assert!(!p.transmit(1));
    assert_eq!(p.s[1].qp.held_acks(), 1);
    // The answer carries it: one packet each way completes both SENDs.
    let pong = send(20, vec![p.sge(1, BASE, 8)], true);
    p.post_send(1, pong).unwrap();
    let carried = p.s[1].qp.poll_transmit().unwrap();
    assert_eq!(
        (carried.kind, carried.ack),
        (PacketKind::Send { imm: None }, Some(100))
    );
    assert_eq!(p.s[1].qp.held_acks(), 0);
    p.wire[1].push_back(carried.encode());
    assert!(p.deliver(1));
    let (sent, got) = sends_and_receives(p.completions(0));
    assert_eq!(
        (ids(&sent), ids(&got)),
        (vec![(10, Status::Success)], vec![(2, Status::Success)])
    );
    // Side 0 holds the pong's: a flush sends it as an ACK packet, and side 1's SEND completes.
    assert_eq!(p.s[0].qp.held_acks(), 1);
    assert!(p.s[0].qp.flush_ack() && !p.s[0].qp.flush_ack());
    let ack = p.s[0].qp.poll_transmit().unwrap();
    assert_eq!((ack.kind, ack.psn, ack.ack), (PacketKind::Ack, 100, None));
    p.wire[0].push_back(ack.encode());
    assert!(p.deliver(0));
    assert_eq!(ids(&p.completions(1)), vec![(20, Status::Success)]);
    // Three SENDs held as one: a queue pair that fails still acknowledges what it executed;
    // one whose completion was lost gives up the acknowledgement, naming the first request
    // it covered.
    for k in 0..3 {
        p.post_recv(1, 30 + k, BASE + 300, 64);
        p.post_send(0, send(40 + k, vec![p.sge(0, BASE, 8)], true))
            .unwrap();
    }
    p.transmit(0);
    while p.deliver(0) {}
    assert_eq!(p.s[1].qp.held_acks(), 3);
    assert_eq!(p.s[1].qp.drop_held_ack(), Some(101));
    assert_eq!(p.s[1].qp.held_acks(), 0);
    p.post_recv(1, 33, BASE + 300, 64);
    p.post_send(0, send(43, vec![p.sge(0, BASE, 8)], true))
        .unwrap();
    p.transmit(0);
    assert!(p.deliver(0));
    assert_eq!(p.s[1].qp.held_acks(), 1);
    p.s[1].qp.to_error();
    let acks: Vec<_> = std::iter::from_fn(|| p.s[1].qp.poll_transmit()).collect();
    assert_eq!(acks.len(), 1);
    assert_eq!((acks[0].kind, acks[0].psn), (PacketKind::Ack, 104));
}

#[test]
fn a_carried_acknowledgement_that_passes_a_read_fails_the_read_and_drops_its_request() {
    let mut p = Pair::new(0);
    let rkey = p.s[1].key;
    p.post_send(0, read(1, p.sge(0, BASE, 8), BASE + 64, rkey))
        .unwrap();
    let _ = p.s[0].qp.poll_transmit();
    // A peer's SEND that claims to acknowledge the READ (a bug: a READ is answered by its
    // response): the READ fails, and the SEND is not executed.
    p.post_recv(0, 7, BASE + 512, 64);
    let forged = Packet {
        ack: Some(100),
        solicited: false,
        dest_qpn: 10,
        psn: 100,
        kind: PacketKind::Send { imm: None },
        payload: Payload::from_slice(&[1, 2, 3]),
    };
    let s = &mut p.s[0];
    let now = p.now;
    let handled =
        s.qp.handle_packet(forged, &mut s.mrs, &mut s.mem, None, || now);
    assert_eq!(handled, Handled::Dropped);
    assert_eq!(s.qp.state(), QpState::Error);
    let done = p.completions(0);
    assert_eq!(done[0].wr_id, 1);
    assert_eq!(done[0].status, Status::FatalErr);
    assert!(
        done[1..].iter().all(|c| c.status == Status::WrFlushErr),
        "{done:?}"
    );
}

/// A requester that fails (its SEND ran out of RNR retries) after it executed the peer's
/// READ and SEND in the same batch still sends the answers it owes them, before the
/// acknowledgement it held: they were executed, as good as answered (rxe sends each answer
/// as it executes). It cleared them: the held ACK then passed the READ's response (the READ
/// failed with FATAL_ERR at the peer and the SEND was flushed), or, with nothing held, the
/// peer's requests were never answered (an outside reviewer's find).
#[test]
fn a_requester_that_fails_still_sends_the_answers_it_owes() {
    for hold in [true, false] {
        let mut p = Pair::with(cfg(10, 0), cfg(20, 0));
        p.s[1].qp.set_hold_acks(hold);
        let rkey = p.s[1].key;
        // B's SEND to A, which has no receive: A answers RNR, and B has no RNR retry.
        p.post_send(1, send(50, vec![p.sge(1, BASE, 8)], true))
            .unwrap();
        assert!(p.transmit(1));
        // A's READ and SEND to B, which has a receive.
        p.post_recv(1, 60, BASE + 400, 64);
        p.post_send(0, read(1, p.sge(0, BASE + 64, 8), BASE + 128, rkey))
            .unwrap();
        p.post_send(0, send(2, vec![p.sge(0, BASE, 8)], true))
            .unwrap();
        assert!(p.transmit(0));
        // A's RNR NAK goes after its READ and SEND.
        assert!(p.deliver(1));
        assert!(p.transmit(0));
        assert_eq!(p.wire[0].len(), 3);
        // B takes all three before it sends anything.
        while p.deliver(0) {}
        p.run();
        let (a_sent, _) = sends_and_receives(p.completions(0));
        assert_eq!(
            ids(&a_sent),
            vec![(1, Status::Success), (2, Status::Success)],
            "hold {hold}"
        );
        assert_eq!(p.s[0].qp.state(), QpState::Rts, "hold {hold}");
        let (b_sent, b_received) = sends_and_receives(p.completions(1));
        assert_eq!(ids(&b_sent), vec![(50, Status::RnrRetryExcErr)]);
        assert_eq!(ids(&b_received), vec![(60, Status::Success)]);
    }
}

/// UC without an SRQ drops a message it cannot execute and leaves the receive posted for the
/// next one, as rxe (class E): a SEND longer than the receive, a WRITE with immediate data
/// through a bad key. (soft0 consumed the receive with an error completion.)
#[test]
fn uc_drops_what_it_cannot_execute_and_keeps_the_receive() {
    let mut p = Pair::with(uc_cfg(10), uc_cfg(20));
    p.fill(0, BASE, b"longer than four");
    p.post_recv(1, 9, BASE + 1000, 4);
    p.post_send(0, send(1, vec![p.sge(0, BASE, 16)], true))
        .unwrap();
    let bad_write = SendWr {
        wr_id: 2,
        op: SendOp::Write {
            remote_addr: BASE + 2000,
            rkey: p.s[1].key ^ 0x100,
            imm: Some(7),
        },
        sges: vec![p.sge(0, BASE, 4)].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    p.post_send(0, bad_write).unwrap();
    p.run();
    assert_eq!(
        ids(&p.completions(0)),
        vec![(1, Status::Success), (2, Status::Success)]
    );
    assert!(
        p.completions(1).is_empty(),
        "nothing completes at the responder"
    );
    // The receive is still there for the next message that fits it.
    p.post_send(0, send(3, vec![p.sge(0, BASE, 4)], true))
        .unwrap();
    p.run();
    let r = p.completions(1);
    assert_eq!(ids(&r), vec![(9, Status::Success)]);
    assert_eq!(p.bytes(1, BASE + 1000, 4), b"long");
}
