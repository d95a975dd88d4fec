//! UD datagrams (with the 40-byte GRH, replies through an AH made from the completion) and
//! shared receive queues.

use crate::common::{assert_quiet, ctx, fill, gid_index, poll_n, poll_ok, snap};
use rsrdma::{
    AccessFlags, Ah, AhAttr, Cq, GlobalRoute, Mr, Pd, Qp, QpType, RecvWr, SendWr, Srq, WcOpcode,
};

const GRH: usize = 40;
const QKEY: u32 = rsrdma::qp::DEFAULT_QKEY;

fn ud_qp(pd: &Pd, cq: &Cq) -> Qp {
    let qp = Qp::builder(QpType::Ud).build(pd, cq, cq).unwrap();
    // UD connects to nobody: connect() just walks it to RTS.
    let opts = crate::common::connect_opts(AccessFlags::NONE);
    qp.connect(&opts, 0x77, &Default::default()).unwrap();
    qp
}

/// Two UD queue pairs, each with a CQ of its own: (CQ of a, CQ of b, a, b).
fn ud_pair(ctx: &rsrdma::Context, pd: &Pd) -> (Cq, Cq, Qp, Qp) {
    let (cq_a, cq_b) = (
        Cq::new(ctx, 64, None).unwrap(),
        Cq::new(ctx, 64, None).unwrap(),
    );
    let (a, b) = (ud_qp(pd, &cq_a), ud_qp(pd, &cq_b));
    (cq_a, cq_b, a, b)
}

/// The port is RoCE (rxe's, soft0's): an address handle needs a GRH there, and one without
/// is refused (`EINVAL`) on both devices (soft0 once took it and sent by LID alone, which a
/// program would then find failing on rxe: an outside tester's find).
#[test]
fn an_address_handle_without_a_grh_is_refused_on_a_roce_port() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let lid = ctx.query_port(1).unwrap().lid;
    let attr = AhAttr {
        port_num: 1,
        dlid: lid,
        ..Default::default()
    };
    let err = Ah::new(&pd, &attr).expect_err("an address handle without a GRH on a RoCE port");
    assert!(err.to_string().contains("Invalid argument"), "{err}");
}

#[test]
fn ud_send_recv_with_grh_and_reply_by_wc() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let (cq_a, cq_b, a, b) = ud_pair(&ctx, &pd);
    let payload = 1000usize; // under the port's 1024-byte active MTU
    let mut src = Mr::new(&pd, 4096, AccessFlags::NONE).unwrap();
    let dst = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    fill(&mut src, 11);
    let my_gid = ctx.query_gid(1, gid_index().into()).unwrap().gid;
    let ah = Ah::new(
        &pd,
        &AhAttr {
            port_num: 1,
            grh: Some(GlobalRoute::new(my_gid, gid_index())),
            ..Default::default()
        },
    )
    .unwrap();

    let rsge = [dst.sge(0, GRH + payload).unwrap()];
    let ssge = [src.sge(0, payload).unwrap()];
    // SAFETY: MRs and the AH outlive the completions polled below.
    unsafe {
        b.post_recv(&RecvWr::new(1, &rsge)).unwrap();
        a.post_send(&SendWr::send_with_imm(2, &ssge, 5).ud(&ah, b.qp_num(), QKEY))
            .unwrap();
    }
    poll_ok(&cq_a);
    let r = poll_ok(&cq_b);
    assert_eq!(r.opcode(), WcOpcode::RECV);
    assert!(r.has_grh(), "UD receives carry a GRH");
    assert_eq!(
        r.byte_len() as usize,
        GRH + payload,
        "byte_len counts the 40-byte GRH"
    );
    assert_eq!(r.src_qp(), a.qp_num());
    assert_eq!(r.imm_data(), Some(5));
    assert_eq!(&snap(&dst)[GRH..GRH + payload], &snap(&src)[..payload]);

    // Reply to the sender with an AH built from the completion and its GRH.
    let back = Ah::from_wc(&pd, 1, &r, &snap(&dst)[..GRH]).unwrap();
    let rsge_a = [dst.sge(2048, GRH + 8).unwrap()];
    let reply = [src.sge(0, 8).unwrap()];
    // SAFETY: as above.
    unsafe {
        a.post_recv(&RecvWr::new(3, &rsge_a)).unwrap();
        b.post_send(&SendWr::send(4, &reply).ud(&back, r.src_qp(), QKEY))
            .unwrap();
    }
    poll_ok(&cq_b);
    let r2 = poll_ok(&cq_a);
    assert_eq!(
        (r2.wr_id(), r2.src_qp(), r2.byte_len() as usize),
        (3, b.qp_num(), GRH + 8)
    );
    assert_eq!(&snap(&dst)[2048 + GRH..2048 + GRH + 8], &snap(&src)[..8]);

    // A datagram sent with the wrong Q_Key is dropped, not delivered.
    // SAFETY: as above.
    unsafe {
        b.post_recv(&RecvWr::new(5, &rsge)).unwrap();
        a.post_send(&SendWr::send(6, &ssge).ud(&ah, b.qp_num(), QKEY ^ 1))
            .unwrap();
    }
    poll_ok(&cq_a);
    assert_quiet(&cq_b);
}

#[test]
fn srq_feeds_several_queue_pairs() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let srq = Srq::new(&pd, 64, 1).unwrap();
    let cq_srv = Cq::new(&ctx, 128, None).unwrap();
    let cq_cli = Cq::new(&ctx, 128, None).unwrap();
    // Two server QPs share the SRQ; each faces its own client QP.
    let pairs: Vec<_> = (0..2u32)
        .map(|i| crate::common::srq_pair(&pd, &srq, &cq_srv, &cq_cli, (100 + i, 200 + i)))
        .collect();
    let dst = Mr::new(&pd, 16 * 128, AccessFlags::LOCAL_WRITE).unwrap();
    let mut src = Mr::new(&pd, 128, AccessFlags::NONE).unwrap();
    fill(&mut src, 1);
    let rsges: Vec<_> = (0..16).map(|i| [dst.sge(i * 128, 128).unwrap()]).collect();
    let mut recvs: Vec<_> = rsges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr::new(i as u64, s))
        .collect();
    // SAFETY: `dst` outlives the completions polled below.
    unsafe { srq.post_recv_batch(&mut recvs).unwrap() };
    // Posting to an SRQ-attached QP's own receive queue is refused with a clear error.
    // SAFETY: refused before reaching the provider.
    assert!(unsafe { pairs[0].0.post_recv(&RecvWr::new(9, &rsges[0])) }.is_err());

    let ssge = [src.sge(0, 100).unwrap()];
    for (n, (_, cli)) in pairs.iter().enumerate() {
        for k in 0..4 {
            // SAFETY: `src` outlives the completions.
            unsafe {
                cli.post_send(&SendWr::send((n * 10 + k) as u64, &ssge))
                    .unwrap()
            };
        }
    }
    assert_eq!(poll_n(&cq_cli, 8).iter().filter(|w| w.is_ok()).count(), 8);
    let got = poll_n(&cq_srv, 8);
    let mut by_qp = std::collections::HashMap::new();
    for w in &got {
        w.ok().unwrap();
        assert_eq!(w.byte_len(), 100);
        *by_qp.entry(w.qp_num()).or_insert(0) += 1;
    }
    for (srv, _) in &pairs {
        assert_eq!(
            by_qp.get(&srv.qp_num()),
            Some(&4),
            "each server QP took 4 receives from the SRQ"
        );
    }
    // One SRQ slot per message: 8 consumed, 8 left, each holding the payload.
    for w in &got {
        let off = w.wr_id() as usize * 128;
        assert_eq!(&snap(&dst)[off..off + 100], &snap(&src)[..100]);
    }
}

/// The child of `datagrams_sent_just_before_the_sender_exits_arrive`: sends `DATAGRAMS`
/// datagrams to the QP that `UD_TARGET` ("GID-hex QPN") names, reaps their completions and
/// exits at once (its objects dropped, nothing waited for).
#[test]
#[ignore = "runs as the child process of datagrams_sent_just_before_the_sender_exits_arrive"]
fn ud_sender_child() {
    let target = std::env::var("UD_TARGET").unwrap();
    let (gid, qpn) = target.split_once(' ').unwrap();
    let mut raw = [0u8; 16];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).unwrap();
    }
    let qpn: u32 = qpn.parse().unwrap();
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 64, None).unwrap();
    let qp = ud_qp(&pd, &cq);
    let mut src = Mr::new(&pd, 4096, AccessFlags::NONE).unwrap();
    fill(&mut src, 3);
    let ah = Ah::new(
        &pd,
        &AhAttr {
            port_num: 1,
            grh: Some(GlobalRoute::new(rsrdma::Gid(raw), gid_index())),
            ..Default::default()
        },
    )
    .unwrap();
    let sge = [src.sge(0, 64).unwrap()];
    for i in 0..DATAGRAMS {
        // SAFETY: the MR and the AH outlive the completions polled below.
        unsafe { qp.post_send(&SendWr::send(i, &sge).ud(&ah, qpn, QKEY)) }.unwrap();
        poll_ok(&cq);
    }
    println!("sent");
    if std::env::var_os("UD_EXIT_AT_ONCE").is_some() {
        // Nothing dropped, no destructor run: the process just ends.
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        std::mem::forget((qp, ah, src, cq, pd, ctx));
        std::process::exit(0);
    }
}

const DATAGRAMS: u64 = 20;

/// A datagram completes on a NIC once it is on the wire: a sender that exits right after its
/// completions loses none of them. (soft0 completed UD sends once queued to its link thread,
/// and a process exiting at once lost what the thread had not written yet: a UD reply, the
/// last datagrams to a second peer.)
#[test]
fn datagrams_sent_just_before_the_sender_exits_arrive() {
    datagrams_arrive_from_a_child(false);
}

/// As above, from a sender that calls `exit` without dropping anything: soft0's links are
/// flushed at the process's exit. (The datagrams to a peer whose link was still being set
/// up were lost: an outside tester's `PacketConn::flush` returned and the process exited,
/// 28 times in 30 with nothing delivered.)
#[test]
fn datagrams_of_a_sender_that_exits_without_dropping_anything_arrive() {
    datagrams_arrive_from_a_child(true);
}

fn datagrams_arrive_from_a_child(exit_at_once: bool) {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 64, None).unwrap();
    let qp = ud_qp(&pd, &cq);
    let dst = Mr::new(&pd, 64 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..32u64 {
        let sge = [dst.sge(i as usize * 1024, GRH + 64).unwrap()];
        // SAFETY: the MR outlives the completions polled below.
        unsafe { qp.post_recv(&RecvWr::new(i, &sge)) }.unwrap();
    }
    let gid = ctx.query_gid(1, gid_index().into()).unwrap().gid;
    let hex: String = gid.0.iter().map(|b| format!("{b:02x}")).collect();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ud_srq::ud_sender_child",
            "--ignored",
            "--nocapture",
        ])
        .env("UD_TARGET", format!("{hex} {}", qp.qp_num()))
        .envs(exit_at_once.then_some(("UD_EXIT_AT_ONCE", "1")))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("sent"),
        "the child:\n{said}"
    );
    let got = poll_n(&cq, DATAGRAMS as usize);
    for wc in &got {
        wc.ok().unwrap_or_else(|e| panic!("a receive failed: {e}"));
        assert_eq!(wc.byte_len() as usize, GRH + 64);
    }
    assert_quiet(&cq);
}

/// A receive with more SGEs than its SRQ was made for is refused at its post, as a QP's own
/// receive queue refuses one (soft0 took it).
#[test]
fn an_srq_refuses_a_receive_with_more_sges_than_it_takes() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let srq = Srq::new(&pd, 4, 1).unwrap();
    let mr = Mr::new(&pd, 128, AccessFlags::LOCAL_WRITE).unwrap();
    let two = [mr.sge(0, 64).unwrap(), mr.sge(64, 64).unwrap()];
    // SAFETY: `mr` outlives the SRQ (nothing is posted: the post is refused).
    let r = unsafe { srq.post_recv(&RecvWr::new(1, &two)) };
    assert!(r.is_err(), "{r:?}");
    // SAFETY: as above; `mr` outlives the SRQ.
    unsafe { srq.post_recv(&RecvWr::new(2, &two[..1])).unwrap() };
}

/// A datagram addressed to a GID that is not the receiver's (a link-local address of no
/// device here, a documentation address, `::`) does not reach a QP of that number on this
/// device: it goes nowhere, or its address handle cannot be made (rxe, for an address it
/// cannot resolve). (soft0 took any GID it did not know for its own, so such a datagram
/// reached whichever local QP had the number.)
#[test]
fn a_datagram_to_a_gid_of_no_device_here_reaches_no_local_queue_pair() {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let (cq_a, cq_b, a, b) = ud_pair(&ctx, &pd);
    let dst = Mr::new(&pd, 64 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..8u64 {
        let sge = [dst.sge(i as usize * 1024, GRH + 64).unwrap()];
        // SAFETY: the MR outlives the completions polled below.
        unsafe { b.post_recv(&RecvWr::new(i, &sge)) }.unwrap();
    }
    let src = Mr::new(&pd, 64, AccessFlags::NONE).unwrap();
    let sge = [src.sge(0, 64).unwrap()];
    let mut fe80_1 = [0u8; 16];
    fe80_1[0] = 0xfe;
    fe80_1[1] = 0x80;
    fe80_1[15] = 1;
    let mut doc = [0u8; 16];
    doc[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
    doc[15] = 0x42;
    for (i, gid) in [fe80_1, doc, [0; 16]].into_iter().enumerate() {
        let ah = Ah::new(
            &pd,
            &AhAttr {
                port_num: 1,
                grh: Some(GlobalRoute::new(rsrdma::Gid(gid), gid_index())),
                ..Default::default()
            },
        );
        let Ok(ah) = ah else {
            continue;
        };
        // SAFETY: the MR and the AH outlive the completion polled below.
        unsafe { a.post_send(&SendWr::send(i as u64, &sge).ud(&ah, b.qp_num(), QKEY)) }.unwrap();
        let _sent = poll_n(&cq_a, 1);
    }
    assert_quiet(&cq_b);
}
