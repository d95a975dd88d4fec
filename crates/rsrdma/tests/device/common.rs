//! Shared set-up: the device under test and loopback-connected queue pairs on it.

use rsrdma::{ConnectOptions, Context, Cq, Mr, Pd, Qp, QpCaps, QpType, Srq, Wc};
use std::time::{Duration, Instant};

/// How long any single wait may take. Soft-RoCE under emulation is slow, but never this slow.
pub const WAIT: Duration = Duration::from_secs(20);

pub fn device_name() -> String {
    std::env::var("RSRDMA_TEST_DEVICE").unwrap_or_else(|_| "rxe0".into())
}

pub fn gid_index() -> u8 {
    std::env::var("RSRDMA_TEST_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Opens the device under test, failing the test (never skipping it) when it is not there.
pub fn ctx() -> Context {
    let name = device_name();
    rsrdma::open(&name).unwrap_or_else(|e| panic!("device tests need RDMA device {name:?}: {e}"))
}

pub fn connect_opts(access: rsrdma::AccessFlags) -> ConnectOptions {
    ConnectOptions::default()
        .gid_index(Some(gid_index()))
        .access(access)
}

/// Two queue pairs of `qp_type` on one device, connected to each other, each with its own CQ.
pub struct Pair {
    pub ctx: Context,
    pub pd: Pd,
    pub cq_a: Cq,
    pub cq_b: Cq,
    pub a: Qp,
    pub b: Qp,
}

pub fn pair(qp_type: QpType, caps: QpCaps, access: rsrdma::AccessFlags) -> Pair {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let depth = caps.max_send_wr + caps.max_recv_wr;
    let cq_a = Cq::new(&ctx, depth, None).unwrap();
    let cq_b = Cq::new(&ctx, depth, None).unwrap();
    let a = Qp::builder(qp_type)
        .caps(caps)
        .build(&pd, &cq_a, &cq_a)
        .unwrap();
    let b = Qp::builder(qp_type)
        .caps(caps)
        .build(&pd, &cq_b, &cq_b)
        .unwrap();
    let opts = connect_opts(access);
    let ea = a.endpoint(1, Some(gid_index()), 0x1000).unwrap();
    let eb = b.endpoint(1, Some(gid_index()), 0x2000).unwrap();
    a.connect(&opts, ea.psn, &eb).unwrap();
    b.connect(&opts, eb.psn, &ea).unwrap();
    Pair {
        ctx,
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

pub fn rc_pair(caps: QpCaps, access: rsrdma::AccessFlags) -> Pair {
    pair(QpType::Rc, caps, access)
}

/// Polls `cq` until `n` completions arrived (failing after [`WAIT`]), returning them.
pub fn poll_n(cq: &Cq, n: usize) -> Vec<Wc> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [Wc::default(); 16];
    let start = Instant::now();
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let got = cq.poll(&mut buf[..want]).unwrap();
        out.extend_from_slice(&buf[..got]);
        assert!(
            start.elapsed() < WAIT,
            "only {} of {n} completions after {WAIT:?}: {out:?}",
            out.len()
        );
        if got == 0 {
            std::thread::yield_now();
        }
    }
    out
}

/// Polls one completion and requires it to have succeeded.
pub fn poll_ok(cq: &Cq) -> Wc {
    let wc = poll_n(cq, 1)[0];
    wc.ok().unwrap_or_else(|e| panic!("completion failed: {e}"));
    wc
}

/// Asserts that nothing more arrives on `cq` for a short while.
pub fn assert_quiet(cq: &Cq) {
    std::thread::sleep(Duration::from_millis(200));
    let mut buf = [Wc::default(); 4];
    let n = cq.poll(&mut buf).unwrap();
    assert_eq!(n, 0, "unexpected completions: {:?}", &buf[..n]);
}

/// Fills `mr` with a pattern that differs per `seed` (through `write_at`, which works on
/// remotely writable regions too).
pub fn fill(mr: &mut Mr, seed: u8) {
    let pattern: Vec<u8> = (0..mr.len())
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    mr.write_at(0, &pattern).unwrap();
}

/// A copy of the region's bytes (through `read_at`, sound whatever the region's access).
pub fn snap(mr: &Mr) -> Vec<u8> {
    let mut v = vec![0u8; mr.len()];
    mr.read_at(0, &mut v).unwrap();
    v
}

/// An RC QP that receives from `srq` (completing on `cq_srv`), connected to a plain RC QP
/// completing on `cq_cli`, with the PSNs `psns` (server, client); no remote access.
pub fn srq_pair(pd: &Pd, srq: &Srq, cq_srv: &Cq, cq_cli: &Cq, psns: (u32, u32)) -> (Qp, Qp) {
    let srv = Qp::builder(QpType::Rc)
        .srq(srq)
        .build(pd, cq_srv, cq_srv)
        .unwrap();
    let cli = Qp::builder(QpType::Rc).build(pd, cq_cli, cq_cli).unwrap();
    let opts = connect_opts(rsrdma::AccessFlags::NONE);
    let es = srv.endpoint(1, Some(gid_index()), psns.0).unwrap();
    let ec = cli.endpoint(1, Some(gid_index()), psns.1).unwrap();
    srv.connect(&opts, es.psn, &ec).unwrap();
    cli.connect(&opts, ec.psn, &es).unwrap();
    (srv, cli)
}
