//! What the soft-device tests with a peer process share: a connected RC queue pair on
//! soft0, its endpoint written as a line, and a child process (this same test binary running
//! one ignored test) that the parent talks to over its stdin and stdout.

#![allow(dead_code)] // Each test file uses some of it.

use rsrdma::{AccessFlags, ConnectOptions, Cq, Mr, Pd, Qp, QpCaps, QpType, RecvWr, Wc};
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout};
use std::time::{Duration, Instant};

/// Set in a child process (by [`spawn_child`]).
pub const CHILD_ENV: &str = "RSRDMA_TEST_SOFT_CHILD";

pub fn endpoint_line(e: &rsrdma::QpEndpoint) -> String {
    let gid: String = e
        .gid
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("EP {} {} {} {gid}", e.qp_num, e.psn, e.lid)
}

pub fn parse_endpoint(line: &str) -> rsrdma::QpEndpoint {
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w.first(), Some(&"EP"), "{line}");
    let gid: Vec<u8> = (0..32)
        .step_by(2)
        .map(|i| u8::from_str_radix(&w[4][i..i + 2], 16).unwrap())
        .collect();
    rsrdma::QpEndpoint {
        qp_num: w[1].parse().unwrap(),
        psn: w[2].parse().unwrap(),
        lid: w[3].parse().unwrap(),
        gid: rsrdma::Gid(gid.try_into().unwrap()),
    }
}

/// One end: a connected RC queue pair with its CQ (for sends and receives).
pub struct End {
    _ctx: rsrdma::Context,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
}

/// A new end, not connected yet.
pub fn end() -> End {
    let ctx = rsrdma::open("soft0").unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq = Cq::new(&ctx, 64, None).unwrap();
    let qp = Qp::builder(QpType::Rc)
        .caps(QpCaps::default().max_send_wr(16).max_recv_wr(16))
        .build(&pd, &cq, &cq)
        .unwrap();
    End {
        _ctx: ctx,
        pd,
        cq,
        qp,
    }
}

impl End {
    /// Connects to the peer whose endpoint `peer` names, from `me` (this end's endpoint).
    pub fn connect(&self, me: &rsrdma::QpEndpoint, peer: &rsrdma::QpEndpoint) {
        self.qp
            .connect(&ConnectOptions::default().gid_index(Some(1)), me.psn, peer)
            .unwrap();
    }
}

/// Polls `cq` (busily) for one successful completion and returns its length.
pub fn poll_len(cq: &Cq) -> u32 {
    let mut wcs = [Wc::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if cq.poll(&mut wcs).unwrap() == 1 {
            assert!(wcs[0].is_ok(), "{:?}", wcs[0].status());
            return wcs[0].byte_len();
        }
        assert!(Instant::now() < deadline, "no completion");
    }
}

/// A child process running the ignored test `name` of this binary (with [`CHILD_ENV`] set),
/// its stdin and stdout piped.
pub fn spawn_child(name: &str) -> (Child, Lines) {
    spawn_child_with(name, &[])
}

/// [`spawn_child`] with more environment variables.
pub fn spawn_child_with(name: &str, env: &[(&str, &str)]) -> (Child, Lines) {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, Lines(out))
}

/// A child's stdout.
pub struct Lines(BufReader<ChildStdout>);

impl Lines {
    /// The next line that contains `want`, from `want` on (the harness may have begun the
    /// line: "test name ... ").
    pub fn next_with(&mut self, want: &str) -> String {
        loop {
            let mut line = String::new();
            assert!(self.0.read_line(&mut line).unwrap() > 0, "the child ended");
            if let Some(at) = line.find(want) {
                return line[at..].to_string();
            }
        }
    }
}

/// In a child: asserts it is one, writes its end's endpoint, reads the parent's and connects.
pub fn child_end() -> End {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "run by the parent test"
    );
    let e = end();
    let me = e.qp.endpoint(1, Some(1), 0x4000).unwrap();
    println!("{}", endpoint_line(&me));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    e.connect(&me, &parse_endpoint(&line));
    e
}

/// In a child: [`child_end`], two receives of 64 bytes posted in the region it returns
/// (receives 0 and 1), then "READY" for the parent. The caller keeps the region until both
/// receives have completed.
pub fn child_ready() -> (End, Mr) {
    let e = child_end();
    let mr = Mr::new(&e.pd, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [mr.sge(0, 64).unwrap()];
    for id in 0..2 {
        // SAFETY: the caller keeps `mr` until both receives have completed (see above).
        unsafe { e.qp.post_recv(&RecvWr::new(id, &recv)).unwrap() };
    }
    println!("READY");
    (e, mr)
}

/// In the parent: makes its end, connects to the child's (whose endpoint `lines` gives) and
/// tells the child its own.
pub fn parent_end(child: &mut Child, lines: &mut Lines) -> End {
    use std::io::Write;
    let peer = parse_endpoint(&lines.next_with("EP "));
    let e = end();
    let me = e.qp.endpoint(1, Some(1), 0x5000).unwrap();
    e.connect(&me, &peer);
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", endpoint_line(&me)).unwrap();
    e
}

/// In the parent: sends the child an empty message (its sign to end), waits for the send to
/// complete and for the child to exit, and asserts it succeeded.
pub fn end_child(e: &End, child: &mut Child) {
    let none: [rsrdma::Sge; 0] = [];
    // SAFETY: no memory named.
    unsafe {
        e.qp.post_send(&rsrdma::SendWr::send(u64::MAX, &none).signaled(true))
            .unwrap()
    };
    poll_len(&e.cq);
    assert!(child.wait().unwrap().success(), "the child failed");
}
