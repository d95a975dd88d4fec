//! One-sided requests between two processes: the target's memory must see every WRITE and
//! atomic, and the initiator must read what the target holds. On soft0 between processes of
//! one host these are done by the initiator in the target's shared memory (the direct path);
//! on a NIC, by the NIC. Either way the bytes are checked in the target's own process.

use crate::common::{connect_opts, ctx, gid_index, poll_n, poll_ok};
use rsrdma::{
    AccessFlags, Context, Cq, Gid, Mr, Pd, Qp, QpCaps, QpEndpoint, QpType, SendWr, WcOpcode,
    WcStatus,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const CHILD_ENV: &str = "RSRDMA_TEST_ONE_SIDED_CHILD";
const LEN: usize = 8192;
/// The target word of the atomics.
const WORD: usize = 4096;

fn pattern(i: usize) -> u8 {
    (i * 7 % 251) as u8
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn endpoint_words(e: &QpEndpoint) -> String {
    format!("{} {} {} {}", e.qp_num, e.psn, e.lid, hex(e.gid.as_bytes()))
}

fn parse_endpoint(w: &[&str]) -> QpEndpoint {
    let gid: [u8; 16] = unhex(w[3]).try_into().unwrap();
    QpEndpoint {
        qp_num: w[0].parse().unwrap(),
        psn: w[1].parse().unwrap(),
        lid: w[2].parse().unwrap(),
        gid: Gid(gid),
    }
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// A reliable-connected queue pair on the device under test, with its domain and one CQ.
fn rc_qp() -> (Context, Pd, Cq, Qp) {
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 16, None).unwrap();
    let qp = Qp::builder(QpType::Rc)
        .caps(QpCaps::default())
        .build(&pd, &cq, &cq)
        .unwrap();
    (ctx, pd, cq, qp)
}

/// The target, run only as the child of
/// `one_sided_requests_between_processes_land_in_the_targets_memory`: a region with every
/// remote right, shown to the parent on request.
#[test]
#[ignore = "runs as the child process of one_sided_requests_between_processes_land_in_the_targets_memory"]
fn one_sided_target_child() {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "run by the parent test"
    );
    let (_ctx, pd, cq, qp) = rc_qp();
    let mut qp = Some(qp);
    let inbox = Mr::new(&pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let mut mr = Some(Mr::new(&pd, LEN, access()).unwrap());
    let bytes: Vec<u8> = (0..LEN).map(pattern).collect();
    let m = mr.as_mut().unwrap();
    m.write_at(0, &bytes).unwrap();
    m.write_at(WORD, &100u64.to_ne_bytes()).unwrap();
    let me = qp
        .as_ref()
        .unwrap()
        .endpoint(1, Some(gid_index()), 0x3000)
        .unwrap();
    let r = m.remote();
    println!("TARGET {} {} {}", endpoint_words(&me), r.addr, r.rkey);
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("CONNECT") => {
                let peer = parse_endpoint(&w[1..]);
                let qp = qp.as_ref().unwrap();
                qp.connect(&connect_opts(access()), me.psn, &peer).unwrap();
                println!("CONNECTED");
            }
            // The queue pair fails, or goes, while the process lives on.
            Some("FAIL") => {
                qp.as_ref().unwrap().to_error().unwrap();
                println!("FAILED");
            }
            Some("DESTROY") => {
                qp = None;
                println!("DESTROYED");
            }
            Some("SHOW") => {
                let (at, len) = (w[1].parse().unwrap(), w[2].parse().unwrap());
                let mut b = vec![0u8; len];
                mr.as_ref().unwrap().read_at(at, &mut b).unwrap();
                println!("BYTES {}", hex(&b));
            }
            // `n` receives of `len` bytes each.
            Some("RECV") => {
                let (n, len): (usize, usize) = (w[1].parse().unwrap(), w[2].parse().unwrap());
                for i in 0..n {
                    let sge = [inbox.sge(i * len, len).unwrap()];
                    // SAFETY: `inbox` outlives the queue pair's receives.
                    unsafe {
                        qp.as_ref()
                            .unwrap()
                            .post_recv(&rsrdma::RecvWr::new(i as u64, &sge))
                            .unwrap()
                    };
                }
                println!("POSTED");
            }
            // The statuses of the next `n` completions.
            Some("POLL") => {
                let got = poll_n(&cq, w[1].parse().unwrap());
                let words: Vec<String> = got.iter().map(|c| c.status().0.to_string()).collect();
                println!("POLLED {}", words.join(" "));
            }
            Some("DEREG") => {
                mr = None;
                println!("DEREGISTERED");
            }
            _ => break,
        }
        std::io::stdout().flush().unwrap();
    }
    drop(mr);
    drop(qp);
}

/// The parent's end of the child's pipes.
struct Child {
    proc: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Child {
    /// The words of the next line that has `tag` (libtest prints its own text first).
    fn expect(&mut self, tag: &str) -> Vec<String> {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "the child exited before {tag}"
            );
            if let Some(at) = line.find(tag) {
                return line[at + tag.len()..]
                    .split_whitespace()
                    .map(String::from)
                    .collect();
            }
        }
    }

    fn say(&mut self, line: &str) {
        let stdin = self.proc.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn show(&mut self, at: usize, len: usize) -> Vec<u8> {
        self.say(&format!("SHOW {at} {len}"));
        unhex(&self.expect("BYTES ")[0])
    }
}

/// The target child, started: its endpoint, and its region's address and key.
fn spawn_target() -> (Child, QpEndpoint, u64, u32) {
    let mut proc = Command::new(std::env::current_exe().unwrap())
        .args([
            "processes::one_sided_target_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(proc.stdout.take().unwrap());
    let mut child = Child { proc, out };
    let t = child.expect("TARGET ");
    let w: Vec<&str> = t.iter().map(String::as_str).collect();
    let target = parse_endpoint(&w[..4]);
    let (raddr, rkey): (u64, u32) = (w[4].parse().unwrap(), w[5].parse().unwrap());
    (child, target, raddr, rkey)
}

/// The target child, and a queue pair of this process connected to its own (reading
/// locally only): the child, its region's address and key, and the local objects.
fn connected_target() -> (Child, u64, u32, (Context, Pd, Cq, Qp)) {
    let (mut child, target, raddr, rkey) = spawn_target();
    let local = rc_qp();
    let me = local.3.endpoint(1, Some(gid_index()), 0x4000).unwrap();
    local
        .3
        .connect(&connect_opts(AccessFlags::LOCAL_WRITE), me.psn, &target)
        .unwrap();
    child.say(&format!("CONNECT {}", endpoint_words(&me)));
    child.expect("CONNECTED");
    (child, raddr, rkey, local)
}

#[test]
fn one_sided_requests_between_processes_land_in_the_targets_memory() {
    let (mut child, raddr, rkey, (_ctx, pd, cq, qp)) = connected_target();

    let mut local = Mr::new(&pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let mut want: Vec<u8> = (0..LEN).map(pattern).collect();
    want[WORD..WORD + 8].copy_from_slice(&100u64.to_ne_bytes());

    // A WRITE lands in the target's memory, exactly where it was sent.
    let data: Vec<u8> = (0..3000).map(|i| (i % 13) as u8 + 1).collect();
    local.write_at(0, &data).unwrap();
    let sge = [local.sge(0, data.len()).unwrap()];
    // SAFETY: `local` outlives the completion polled below, untouched meanwhile.
    unsafe {
        qp.post_send(&SendWr::rdma_write(1, &sge, raddr + 100, rkey))
            .unwrap()
    };
    assert_eq!(poll_ok(&cq).opcode(), WcOpcode::RDMA_WRITE);
    want[100..3100].copy_from_slice(&data);
    assert_eq!(
        child.show(96, 3008),
        want[96..3104],
        "the WRITE as the target sees it"
    );

    // An unsignaled WRITE, then a signaled one: one completion, both land.
    local.write_at(4000, &[0xaa; 16]).unwrap();
    local.write_at(4016, &[0xbb; 16]).unwrap();
    let s1 = [local.sge(4000, 16).unwrap()];
    let s2 = [local.sge(4016, 16).unwrap()];
    // SAFETY: as above.
    unsafe {
        qp.post_send(&SendWr::rdma_write(2, &s1, raddr + 5000, rkey).signaled(false))
            .unwrap();
        qp.post_send(&SendWr::rdma_write(3, &s2, raddr + 5016, rkey))
            .unwrap();
    }
    assert_eq!(poll_ok(&cq).wr_id(), 3);
    want[5000..5016].fill(0xaa);
    want[5016..5032].fill(0xbb);

    // A READ of the whole region gives what the target holds.
    let sge = [local.sge(0, LEN).unwrap()];
    // SAFETY: as above.
    unsafe {
        qp.post_send(&SendWr::rdma_read(4, &sge, raddr, rkey))
            .unwrap()
    };
    let wc = poll_ok(&cq);
    assert_eq!(
        (wc.opcode(), wc.byte_len() as usize),
        (WcOpcode::RDMA_READ, LEN)
    );
    let mut got = vec![0u8; LEN];
    local.read_at(0, &mut got).unwrap();
    assert_eq!(got, want, "the READ");

    // Atomics on the target's word.
    let old = |mr: &Mr| {
        let mut b = [0u8; 8];
        mr.read_at(0, &mut b).unwrap();
        u64::from_ne_bytes(b)
    };
    let sge = [local.sge(0, 8).unwrap()];
    // SAFETY: as above.
    unsafe {
        qp.post_send(&SendWr::atomic_fetch_add(
            5,
            &sge,
            raddr + WORD as u64,
            rkey,
            23,
        ))
        .unwrap()
    };
    assert_eq!(poll_ok(&cq).opcode(), WcOpcode::FETCH_ADD);
    assert_eq!(old(&local), 100);
    // SAFETY: as above.
    unsafe {
        qp.post_send(&SendWr::atomic_cmp_swap(
            6,
            &sge,
            raddr + WORD as u64,
            rkey,
            123,
            999,
        ))
        .unwrap()
    };
    assert_eq!(poll_ok(&cq).opcode(), WcOpcode::COMP_SWAP);
    assert_eq!(old(&local), 123);
    assert_eq!(child.show(WORD, 8), 999u64.to_ne_bytes(), "the atomics");
    assert_eq!(
        child.show(4990, 48)[10..42],
        want[5000..5032],
        "both WRITEs"
    );

    // Once the target deregistered its region, its key reaches nothing: the WRITE fails
    // with a remote access error (and the queue pair with it).
    child.say("DEREG");
    child.expect("DEREGISTERED");
    let sge = [local.sge(0, 8).unwrap()];
    // SAFETY: as above.
    unsafe {
        qp.post_send(&SendWr::rdma_write(7, &sge, raddr, rkey))
            .unwrap()
    };
    let wc = poll_n(&cq, 1).remove(0);
    assert_eq!(
        (wc.wr_id(), wc.status()),
        (7, WcStatus::REM_ACCESS_ERR),
        "a WRITE through a deregistered region's key"
    );
    child.say("QUIT");
    let status = child.proc.wait().unwrap();
    assert!(status.success(), "the target child failed: {status}");
}

/// A peer queue pair that fails, or is destroyed, in a process that lives on drops what
/// arrives for it, as a NIC does; the requester sends again after its timeout, `retry_cnt`
/// times, and then ends the request with `RETRY_EXC_ERR` and flushes the rest (rxe's
/// transport timer; soft0's device tells the requester's that it dropped the request). Before,
/// on soft0, the requests waited for ever.
#[test]
fn a_peer_queue_pair_that_fails_or_goes_in_a_live_process_ends_requests_with_retry_exceeded() {
    for (say, reply) in [("FAIL", "FAILED"), ("DESTROY", "DESTROYED")] {
        let (mut child, target, raddr, rkey) = spawn_target();
        let (_ctx, pd, cq, qp) = rc_qp();
        let me = qp.endpoint(1, Some(gid_index()), 0x4000).unwrap();
        // Retries every 4 ms (code 10), twice.
        let mut opts = connect_opts(AccessFlags::LOCAL_WRITE);
        opts.timeout = 10;
        opts.retry_cnt = 2;
        qp.connect(&opts, me.psn, &target).unwrap();
        child.say(&format!("CONNECT {}", endpoint_words(&me)));
        child.expect("CONNECTED");
        let local = Mr::new(&pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = [local.sge(0, 64).unwrap()];
        // SAFETY: `local` outlives every completion polled below, untouched meanwhile.
        unsafe {
            qp.post_send(&SendWr::rdma_write(1, &sge, raddr, rkey))
                .unwrap()
        };
        assert_eq!(poll_ok(&cq).wr_id(), 1, "{say}: the WRITE before");
        child.say(say);
        child.expect(reply);
        let t0 = std::time::Instant::now();
        // SAFETY: as above.
        unsafe {
            qp.post_send(&SendWr::rdma_write(2, &sge, raddr, rkey))
                .unwrap();
            qp.post_send(&SendWr::rdma_read(3, &sge, raddr, rkey))
                .unwrap();
        }
        let wcs = poll_n(&cq, 2);
        let got: Vec<_> = wcs.iter().map(|w| (w.wr_id(), w.status())).collect();
        assert_eq!(
            got,
            [(2, WcStatus::RETRY_EXC_ERR), (3, WcStatus::WR_FLUSH_ERR)],
            "{say}"
        );
        eprintln!("{say}: RETRY_EXC_ERR after {:?}", t0.elapsed());
        child.say("QUIT");
        let status = child.proc.wait().unwrap();
        assert!(status.success(), "the target child failed: {status}");
    }
}

/// Destroying a queue pair whose peer process is stopped (`SIGSTOP`, a debugger) while what
/// it sent fills the link does not wait the whole second soft0 allows the links to write
/// what is queued (`destroy_qp`'s flush): a link that moves nothing is given up after a
/// tenth of a second. Two outside testers saw every close against a stopped peer take its
/// linger plus a second.
#[test]
fn destroying_a_queue_pair_whose_peer_process_is_stopped_does_not_wait_for_it() {
    let (mut child, target, _, _) = spawn_target();
    let ctx = ctx();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 64, None).unwrap();
    let qp = Qp::builder(QpType::Rc)
        .caps(QpCaps::default().max_send_wr(32))
        .build(&pd, &cq, &cq)
        .unwrap();
    let me = qp.endpoint(1, Some(gid_index()), 0x4000).unwrap();
    qp.connect(&connect_opts(AccessFlags::LOCAL_WRITE), me.psn, &target)
        .unwrap();
    child.say(&format!("CONNECT {}", endpoint_words(&me)));
    child.expect("CONNECTED");
    let pid = child.proc.id().to_string();
    let stopped = Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    assert!(stopped.success());
    // 2 MiB of SENDs: more than a shared-memory ring holds (1 MiB).
    let local = Mr::new(&pd, 64 << 10, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [local.sge(0, 64 << 10).unwrap()];
    for i in 0..32 {
        // SAFETY: `local` outlives the queue pair, destroyed below before it.
        unsafe { qp.post_send(&SendWr::send(i, &sge)).unwrap() };
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    drop(qp);
    let took = t0.elapsed();
    let _ = Command::new("kill").args(["-KILL", &pid]).status();
    let _ = child.proc.wait();
    eprintln!("destroying the queue pair took {took:?}");
    assert!(
        took < std::time::Duration::from_millis(600),
        "destroying a queue pair whose peer is stopped took {took:?}"
    );
}

/// A SEND, then a request the target refuses (a SEND longer than its receive, a WRITE with a
/// bad key), in one burst: the SEND completes and the refused request fails with the
/// target's NAK, then the queue pair flushes. On soft0 between processes of one host the
/// requester got nothing at all and its queue pair stayed in RTS for ever (an outside
/// tester, 5 of 5 runs; over TCP it was right).
#[test]
fn a_send_and_then_a_refused_request_between_processes_both_complete() {
    for refused in ["long send", "bad key"] {
        let (mut child, raddr, rkey, (_ctx, pd, cq, qp)) = connected_target();
        child.say("RECV 2 300");
        child.expect("POSTED");
        let local = Mr::new(&pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
        let first = [local.sge(0, 100).unwrap()];
        let long = [local.sge(0, 301).unwrap()];
        let second = match refused {
            "long send" => SendWr::send(2, &long),
            _ => SendWr::rdma_write(2, &first, raddr, rkey ^ 0x55),
        };
        // SAFETY: `local` outlives the completions polled below.
        unsafe {
            qp.post_send(&SendWr::send(1, &first)).unwrap();
            qp.post_send(&second).unwrap();
        }
        let wcs = poll_n(&cq, 2);
        let got: Vec<_> = wcs.iter().map(|c| (c.wr_id(), c.status())).collect();
        // A receive too short is an invalid request to soft0 (as to later rxe); the VM's rxe
        // (Debian 12's Linux 6.1) calls it a remote operational error.
        let naks: &[WcStatus] = match refused {
            "long send" => &[WcStatus::REM_INV_REQ_ERR, WcStatus::REM_OP_ERR],
            _ => &[WcStatus::REM_ACCESS_ERR],
        };
        assert_eq!(got[0], (1, WcStatus::SUCCESS), "{refused}: {got:?}");
        assert!(
            got[1].0 == 2 && naks.contains(&got[1].1),
            "{refused}: {got:?}"
        );
        child.say("QUIT");
        let status = child.proc.wait().unwrap();
        assert!(status.success(), "the target child failed: {status}");
    }
}

/// One call that posts more requests than the send queue holds is refused at the first that
/// does not fit, as a NIC (and rxe, which sees a call's requests only at its one doorbell)
/// refuses it, even when each is unsignaled and done at once: over shared memory soft0 took
/// 300 unsignaled WRITEs on a 128-deep queue in one call (an outside tester's find), so a
/// program tested there broke on a NIC. The requests before it land. (rxe's queue holds up
/// to the next power of two above the depth asked for, less one: 255 for 128; the list is
/// four times the depth, past either.)
#[test]
fn a_post_longer_than_the_send_queue_is_refused_where_it_overflows() {
    let (mut child, raddr, rkey, (_ctx, pd, cq, qp)) = connected_target();
    let depth = qp.caps().max_send_wr as usize;
    let mut local = Mr::new(&pd, LEN, AccessFlags::LOCAL_WRITE).unwrap();
    local.write_at(0, &[0x5a; 64]).unwrap();
    let sge = [local.sge(0, 1).unwrap()];
    let mut wrs: Vec<_> = (0..depth * 4)
        .map(|i| SendWr::rdma_write(i as u64, &sge, raddr + (i % 64) as u64, rkey).signaled(false))
        .collect();
    // SAFETY: `local` outlives the completions polled below, untouched meanwhile.
    let e = unsafe { qp.post_send_batch(&mut wrs) }.unwrap_err();
    let taken = match e {
        rsrdma::Error::Post { index, errno, .. } => {
            assert_eq!(errno, libc::ENOMEM, "{e}");
            assert!(
                (1..depth * 2).contains(&index),
                "refused at {index} of {}, the queue holding {depth}",
                depth * 4
            );
            index
        }
        other => panic!("expected the list refused where the queue overflowed: {other}"),
    };
    // What was taken completes: a signaled WRITE after it (once the queue drained).
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: as above.
    unsafe { qp.post_send(&SendWr::rdma_write(7777, &sge, raddr + 100, rkey)) }.unwrap();
    assert_eq!(poll_ok(&cq).wr_id(), 7777);
    let landed = taken.min(64);
    assert_eq!(
        child.show(0, landed),
        vec![0x5a; landed],
        "the WRITEs taken"
    );
    child.say("QUIT");
    let status = child.proc.wait().unwrap();
    assert!(status.success(), "the target child failed: {status}");
}
