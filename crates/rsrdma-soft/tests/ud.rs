//! Unreliable-datagram queue pairs: what is delivered (behind a GRH), what is dropped, and
//! what completes, as rxe does.

use rsrdma_soft::{
    grh, Access, MrTable, Packet, PostError, QpConfig, QpEvent, QpState, RecvWr, SendOp, SendWr,
    Sge, Srq, Status, UdDest, UdQp, UdSource, VecMemory, WcOpcode, GRH_LEN,
};

const BASE: u64 = 0x20_0000;
const MEM: usize = 16 * 1024;
const MTU: u32 = 1024;
const QKEY: u32 = 0x1111_1111;
const GID_A: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 1, 1];
const GID_B: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 2, 2];

struct Side {
    qp: UdQp,
    mrs: MrTable,
    mem: VecMemory,
    key: u32,
}

fn cfg(qp_num: u32, uses_srq: bool) -> QpConfig {
    QpConfig {
        qp_num,
        pd: 1,
        access: Access::NONE,
        max_send_wr: 16,
        max_recv_wr: 16,
        max_inline: 64,
        rnr_retry: 0,
        min_rnr_timer: std::time::Duration::ZERO,
        retry_cnt: 0,
        ack_timeout: None,
        sq_sig_all: false,
        uses_srq,
        unreliable: false,
    }
}

fn side(qp_num: u32, uses_srq: bool) -> Side {
    let mut mrs = MrTable::new();
    let key = mrs.register(1, BASE, MEM as u64, Access::LOCAL_WRITE);
    let mut qp = UdQp::new(cfg(qp_num, uses_srq), MTU);
    qp.set_qkey(QKEY);
    qp.to_init().unwrap();
    qp.to_rtr().unwrap();
    qp.to_rts().unwrap();
    Side {
        qp,
        mrs,
        mem: VecMemory::new(BASE, MEM),
        key,
    }
}

impl Side {
    fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: BASE + off,
            len,
            lkey: self.key,
        }
    }

    fn fill(&mut self, off: u64, data: &[u8]) {
        rsrdma_soft::Memory::write(&mut self.mem, BASE + off, data);
    }

    fn bytes(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        rsrdma_soft::Memory::read(&self.mem, BASE + off, &mut v);
        v
    }

    fn send(&mut self, wr_id: u64, sges: Vec<Sge>, imm: Option<u32>, dest: UdDest) {
        let wr = SendWr {
            wr_id,
            op: SendOp::Send { imm },
            sges: sges.into(),
            inline: None,
            signaled: true,
            fence: false,
            solicited: false,
        };
        self.qp.post_send(wr, dest, &self.mrs, &self.mem).unwrap();
    }

    fn recv(&mut self, wr_id: u64, sges: Vec<Sge>) {
        self.qp
            .post_recv(RecvWr {
                wr_id,
                sges: sges.into(),
            })
            .unwrap();
    }
}

/// Carries what `from` sent to `to` (LID 1 is A's device, LID 2 B's).
fn carry(from: &mut Side, from_lid: u16, from_gid: [u8; 16], to: &mut Side, to_gid: [u8; 16]) {
    while let Some((dest, p)) = from.qp.poll_transmit() {
        assert_ne!(dest.lid, from_lid);
        let p = Packet::decode(&p.encode()).unwrap();
        let src = UdSource {
            lid: from_lid,
            gid: from_gid,
        };
        to.qp
            .handle_datagram(p, src, to_gid, &to.mrs, &mut to.mem, None);
    }
}

fn to_b(qkey: u32) -> UdDest {
    UdDest {
        lid: 2,
        gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        qpn: 20,
        qkey,
    }
}

#[test]
fn a_datagram_lands_behind_its_grh_with_the_senders_address() {
    let (mut a, mut b) = (side(10, false), side(20, false));
    let payload: Vec<u8> = (0..900u32).map(|i| (i * 7) as u8).collect();
    a.fill(0, &payload);
    b.recv(1, vec![b.sge(4096, 2048)]);
    a.send(2, vec![a.sge(0, 900)], Some(0xabcd), to_b(QKEY));
    let s = a.qp.poll_completion().unwrap();
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.grh),
        (2, Status::Success, WcOpcode::Send, false)
    );
    carry(&mut a, 1, GID_A, &mut b, GID_B);
    let r = b.qp.poll_completion().unwrap();
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.imm),
        (
            1,
            Status::Success,
            WcOpcode::Recv,
            (GRH_LEN + 900) as u32,
            Some(0xabcd)
        )
    );
    assert_eq!((r.src_qp, r.slid, r.grh, r.qp_num), (10, 1, true, 20));
    assert_eq!(b.bytes(4096, GRH_LEN), grh(GID_A, GID_B, 900).to_vec());
    assert_eq!(b.bytes(4096 + GRH_LEN as u64, 900), payload);
    // The GRH is an IPv6-form header naming the sender's GID at bytes 8..24.
    assert_eq!(b.bytes(4096, 1)[0] >> 4, 6);
    assert_eq!(b.bytes(4096 + 8, 16), GID_A.to_vec());
}

#[test]
fn what_cannot_be_delivered_is_dropped_without_a_completion() {
    let (mut a, mut b) = (side(10, false), side(20, false));
    // No receive posted.
    a.send(1, vec![a.sge(0, 100)], None, to_b(QKEY));
    carry(&mut a, 1, GID_A, &mut b, GID_B);
    assert_eq!(b.qp.poll_completion(), None);
    // A wrong Q_Key.
    b.recv(2, vec![b.sge(4096, 2048)]);
    a.send(3, vec![a.sge(0, 100)], None, to_b(QKEY ^ 1));
    carry(&mut a, 1, GID_A, &mut b, GID_B);
    assert_eq!(b.qp.poll_completion(), None);
    // Longer than the MTU: the send succeeds, nothing goes out.
    a.send(4, vec![a.sge(0, MTU + 1)], None, to_b(QKEY));
    assert!(a.qp.poll_transmit().is_none());
    // A receive too short for GRH + payload: the datagram is dropped, the receive stays
    // for the next one that fits.
    let mut c = side(20, false);
    c.recv(5, vec![c.sge(0, (GRH_LEN + 50) as u32)]);
    a.send(6, vec![a.sge(0, 51)], None, to_b(QKEY));
    a.send(7, vec![a.sge(0, 50)], None, to_b(QKEY));
    carry(&mut a, 1, GID_A, &mut c, GID_B);
    let r = c.qp.poll_completion().unwrap();
    assert_eq!(
        (r.wr_id, r.status, r.byte_len),
        (5, Status::Success, (GRH_LEN + 50) as u32)
    );
    assert_eq!(c.qp.poll_completion(), None);
    assert_eq!(b.qp.dropped() + c.qp.dropped(), 3);
    // Every send completed, in order, with success.
    let sends: Vec<_> = std::iter::from_fn(|| a.qp.poll_completion())
        .map(|c| (c.wr_id, c.status))
        .collect();
    let ok = |id| (id, Status::Success);
    assert_eq!(sends, vec![ok(1), ok(3), ok(4), ok(6), ok(7)]);
}

#[test]
fn an_srq_receive_too_short_completes_with_an_error() {
    let mut a = side(10, false);
    let mut b = side(20, true);
    let mut srq = Srq::new(1, 8);
    srq.post_recv(RecvWr {
        wr_id: 1,
        sges: vec![b.sge(0, 64)].into(),
    })
    .unwrap();
    srq.post_recv(RecvWr {
        wr_id: 2,
        sges: vec![b.sge(1024, 1024)].into(),
    })
    .unwrap();
    assert_eq!(
        b.qp.post_recv(RecvWr {
            wr_id: 3,
            sges: vec![].into()
        }),
        Err(PostError::Invalid("the QP receives from an SRQ"))
    );
    a.send(4, vec![a.sge(0, 100)], None, to_b(QKEY));
    a.send(5, vec![a.sge(0, 100)], None, to_b(QKEY));
    while let Some((_, p)) = a.qp.poll_transmit() {
        let src = UdSource { lid: 1, gid: GID_A };
        b.qp.handle_datagram(p, src, GID_B, &b.mrs, &mut b.mem, Some(&mut srq));
    }
    let r1 = b.qp.poll_completion().unwrap();
    assert_eq!((r1.wr_id, r1.status), (1, Status::RemInvReqErr));
    let r2 = b.qp.poll_completion().unwrap();
    assert_eq!(
        (r2.wr_id, r2.status, r2.byte_len, r2.src_qp),
        (2, Status::Success, (GRH_LEN + 100) as u32, 10)
    );
    assert_eq!(b.qp.state(), QpState::Rts, "a datagram error fails no QP");
    b.qp.to_error();
    assert_eq!(b.qp.poll_event(), Some(QpEvent::LastWqeReached));
}

#[test]
fn posting_rules_and_errors() {
    let mut a = side(10, false);
    // Only SENDs.
    let write = SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: 0,
            rkey: 0,
            imm: None,
        },
        sges: vec![].into(),
        inline: None,
        signaled: true,
        fence: false,
        solicited: false,
    };
    assert!(matches!(
        a.qp.post_send(write, to_b(QKEY), &a.mrs, &a.mem),
        Err(PostError::Invalid(_))
    ));
    // Not before RTS.
    let mut fresh = UdQp::new(cfg(30, false), MTU);
    let send = SendWr {
        wr_id: 2,
        op: SendOp::Send { imm: None },
        sges: vec![].into(),
        inline: Some(vec![1, 2, 3].into()),
        signaled: false,
        fence: false,
        solicited: false,
    };
    assert_eq!(
        fresh.post_send(send.clone(), to_b(QKEY), &a.mrs, &a.mem),
        Err(PostError::State(QpState::Reset))
    );
    // Inline data needs no key; an unsignalled send completes with nothing.
    a.qp.post_send(send, to_b(QKEY), &a.mrs, &a.mem).unwrap();
    assert_eq!(a.qp.poll_completion(), None);
    let (dest, p) = a.qp.poll_transmit().unwrap();
    assert_eq!((dest, p.payload.into_vec()), (to_b(QKEY), vec![1, 2, 3]));
    // A bad local key: LOC_PROT_ERR, and the QP fails, flushing its receives.
    a.recv(3, vec![a.sge(0, 64)]);
    let bad = Sge {
        addr: BASE,
        len: 8,
        lkey: a.key ^ 0x100,
    };
    a.send(4, vec![bad], None, to_b(QKEY));
    let c: Vec<_> = std::iter::from_fn(|| a.qp.poll_completion())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(c, vec![(4, Status::LocProtErr), (3, Status::WrFlushErr)]);
    assert_eq!(a.qp.state(), QpState::Error);
}
