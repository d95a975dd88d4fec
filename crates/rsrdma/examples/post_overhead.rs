//! What the Rust layer adds per work request: rsrdma's post path against the same call made
//! from C, both on a do-nothing provider (`rsrdma::bench_support`), so nothing but the
//! software path is measured. `cargo xtask bench overhead` runs it in release mode.
//!
//! Cases, each C then Rust, alternating for `--rounds` rounds (medians reported):
//! - one WR per post: `ibv_post_send` from C, `Qp::post_send` from Rust;
//! - a chain of 32 per post (per WR): C links and posts, `Qp::post_send_batch` from Rust;
//! - a pipeline step (post one, poll one): the inner step of RawConn's pipelines.
//!
//! Each main row does the same user work on both sides: the C program builds its requests
//! once and sets only `wr_id` (and, in a chain, `next`) before each post, so the Rust side
//! builds its `SendWr`s once too and sets only the id (`SendWr::set_wr_id`); whatever else
//! the Rust side spends (the checks, the batch's links and unlinks, the `Result`s) is what
//! the layer adds, and the target (at most 2 ns/WR added) applies to these rows. Building a
//! fresh request per post (`SendWr::send`, a 128-byte struct written whole) is work a C
//! program can do or skip alike, so it is not counted against rsrdma, but it stays visible:
//! the "info" rows under each case run it, and "of which: raw FFI call only" shows the bare
//! call. They have no target.
//!
//! Instructions per WR come from the CPU's counters (perf_event_open) where the machine has
//! them. Virtual machines often do not; then, where valgrind is installed, they are counted
//! by callgrind: each side of each case runs once more under it, in a child process, for two
//! numbers of WRs, and the difference of the two totals over the difference of the WR counts
//! is the count per WR (set-up costs cancel; callgrind counts exactly, whatever the machine's
//! load; `--no-callgrind` skips this, as under emulation, where it is far too slow).
//! Otherwise the table says n/a.

use rsrdma::bench_support::FakeQp;
use rsrdma::ffi;
use rsrdma::{SendWr, Sge, Wc};
use std::hint::black_box;
use std::time::Instant;

const BATCH: usize = 32;
/// The most a main row may add over C, in ns/WR.
const TARGET_NS: f64 = 2.0;

fn main() {
    let mut rounds = 7usize;
    let mut per_round: u64 = 2_000_000;
    // Compiled before anything is timed.
    c_baseline();
    if let Some(one) = count_one_args() {
        return count_one(one);
    }
    let mut use_callgrind = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage(&format!("{name} needs a number")))
        };
        match a.as_str() {
            "--rounds" => rounds = value("--rounds").max(1) as usize,
            "--wrs" => per_round = value("--wrs").max(BATCH as u64),
            "--no-callgrind" => use_callgrind = false,
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let fake = FakeQp::new(4096);
    let counter = Counter::open();
    println!(
        "rsrdma's post path against C, on a do-nothing provider: {rounds} alternating rounds of {per_round} WRs, medians"
    );
    println!();
    println!(
        "{:<36} {:>10} {:>10} {:>11} {:>9} {:>11}  target",
        "case", "C ns/WR", "Rust ns/WR", "added ns/WR", "C ins/WR", "Rust ins/WR"
    );
    let mut all_met = true;
    let callgrind = use_callgrind && counter.0.is_err() && callgrind_available();
    for (ci, case) in CASES.into_iter().enumerate() {
        let (mut tc, mut tr, mut ic, mut ir) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            let (t, i) = measure(&counter, || (case.c)(&fake, per_round), per_round);
            tc.push(t);
            ic.extend(i);
            let (t, i) = measure(&counter, || (case.rust)(&fake, per_round), per_round);
            tr.push(t);
            ir.extend(i);
        }
        if callgrind {
            ic.extend(callgrind_per_wr(ci, Side::C));
            ir.extend(callgrind_per_wr(ci, Side::Rust));
        }
        let (mc, mr) = (median(&mut tc), median(&mut tr));
        let added = mr - mc;
        let verdict = if case.main {
            let met = added <= TARGET_NS;
            all_met &= met;
            format!(
                "added <= {TARGET_NS} ns: {}",
                if met { "met" } else { "MISSED" }
            )
        } else {
            "(info, no target)".to_string()
        };
        let ins = |v: &mut Vec<f64>| {
            if v.is_empty() {
                "n/a".to_string()
            } else {
                format!("{:.1}", median(v))
            }
        };
        println!(
            "{:<36} {mc:>10.2} {mr:>10.2} {added:>11.2} {:>9} {:>11}  {verdict}",
            case.name,
            ins(&mut ic),
            ins(&mut ir),
        );
    }
    println!();
    match &counter.0 {
        Ok(_) => println!("instructions: user-space instructions retired, from perf_event_open"),
        Err(_) if callgrind => println!(
            "instructions: counted by valgrind's callgrind (no CPU counters here: perf_event_open \
             failed), ({CG_LONG} - {CG_SHORT} WRs) runs' difference per WR, exact"
        ),
        Err(e) if use_callgrind => {
            println!("instructions: n/a on this machine (perf_event_open: {e}; valgrind not found)")
        }
        Err(e) => {
            println!("instructions: n/a (perf_event_open: {e}; callgrind skipped: --no-callgrind)")
        }
    }
    println!(
        "target (at most {TARGET_NS} ns/WR added over C, main rows): {}",
        if all_met {
            "met in every main row"
        } else {
            "missed"
        }
    );
}

type Runner = fn(&FakeQp, u64);

/// A row of the table: C side, Rust side, and whether the target applies (a main row) or the
/// row only shows where time goes.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    c: Runner,
    rust: Runner,
    main: bool,
}

const fn row(name: &'static str, c: Runner, rust: Runner) -> Case {
    Case {
        name,
        c,
        rust,
        main: true,
    }
}

const fn info(name: &'static str, c: Runner, rust: Runner) -> Case {
    Case {
        name,
        c,
        rust,
        main: false,
    }
}

/// The rows of the table, in order. `--count-one` names one by its index.
const CASES: [Case; 7] = [
    row("post 1 WR per call", c_post, rust_post),
    info("  of which: raw FFI call only", c_post, rust_ffi_only),
    info("  info: a SendWr::send per post", c_post, rust_post_rebuilt),
    row("post a chain of 32 (per WR)", c_chain, rust_chain),
    info(
        "  info: 32 SendWr::send per post",
        c_chain,
        rust_chain_rebuilt,
    ),
    row("pipeline step: post 1, poll 1", c_post_poll, rust_post_poll),
    info(
        "  info: a SendWr::send per post",
        c_post_poll,
        rust_post_poll_rebuilt,
    ),
];
/// The two WR counts of the callgrind runs (multiples of [`BATCH`]).
const CG_SHORT: u64 = 32 * 1024;
const CG_LONG: u64 = 2 * CG_SHORT;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    C,
    Rust,
}

/// The runner of side `side` of case `case` (an index into [`CASES`]).
fn runner(case: usize, side: Side) -> Runner {
    let case = CASES[case];
    match side {
        Side::C => case.c,
        Side::Rust => case.rust,
    }
}

/// `--count-one CASE c|rust WRS`: the hidden mode the callgrind runs use.
fn count_one_args() -> Option<(usize, Side, u64)> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.first().map(String::as_str) != Some("--count-one") {
        return None;
    }
    let parsed = (|| {
        let case: usize = a.get(1)?.parse().ok().filter(|&c| c < CASES.len())?;
        let side = match a.get(2)?.as_str() {
            "c" => Side::C,
            "rust" => Side::Rust,
            _ => return None,
        };
        Some((case, side, a.get(3)?.parse().ok()?))
    })();
    Some(parsed.unwrap_or_else(|| {
        usage(&format!(
            "--count-one needs CASE (0-{}), c|rust and WRS",
            CASES.len() - 1
        ))
    }))
}

/// Runs one side of one case once: under callgrind, for its instruction count.
fn count_one((case, side, wrs): (usize, Side, u64)) {
    let fake = FakeQp::new(4096);
    runner(case, side)(&fake, wrs);
}

fn callgrind_available() -> bool {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Instructions per WR of one side of one case, by callgrind: this program under it with
/// [`CG_LONG`] and with [`CG_SHORT`] WRs; the difference of the totals cancels start-up and
/// set-up. None (the table says n/a) if a run fails or prints no total.
fn callgrind_per_wr(case: usize, side: Side) -> Option<f64> {
    let total = |wrs: u64| -> Option<u64> {
        let exe = std::env::current_exe().ok()?;
        let out = std::process::Command::new("valgrind")
            .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
            .arg(exe)
            .arg("--count-one")
            .arg(case.to_string())
            .arg(if side == Side::C { "c" } else { "rust" })
            .arg(wrs.to_string())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        collected(&String::from_utf8_lossy(&out.stderr))
    };
    let (long, short) = (total(CG_LONG)?, total(CG_SHORT)?);
    Some(long.checked_sub(short)? as f64 / (CG_LONG - CG_SHORT) as f64)
}

/// The total of callgrind's `==PID== Collected : N` line.
fn collected(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|l| l.split_once("Collected :"))
        .and_then(|(_, n)| n.trim().parse().ok())
}

fn usage(why: &str) -> ! {
    if !why.is_empty() {
        eprintln!("post_overhead: {why}");
    }
    eprintln!("usage: post_overhead [--rounds N] [--wrs N] [--no-callgrind]");
    std::process::exit(2)
}

fn sge() -> [Sge; 1] {
    [Sge::new(0x1000, 64, 0x7)]
}

/// The C struct behind a `SendWr`, for the C side: the same request both sides post.
fn raw(wr: SendWr<'_>) -> ffi::ibv_send_wr {
    // SAFETY: `SendWr` is `repr(transparent)` over `ibv_send_wr`; the SGE pointer inside stays
    // valid for as long as the caller keeps `sges` alive.
    unsafe { std::mem::transmute::<SendWr<'_>, ffi::ibv_send_wr>(wr) }
}

/// The C side (`rsrdma-sys/c/bench.c`), compiled now at -O2 like rdma-core's users would.
struct CBaseline {
    post: unsafe extern "C" fn(*mut ffi::ibv_qp, *mut ffi::ibv_send_wr, u64) -> u64,
    post_chain: unsafe extern "C" fn(*mut ffi::ibv_qp, *mut ffi::ibv_send_wr, usize, u64) -> u64,
    post_poll:
        unsafe extern "C" fn(*mut ffi::ibv_qp, *mut ffi::ibv_cq, *mut ffi::ibv_send_wr, u64) -> u64,
}

fn c_baseline() -> &'static CBaseline {
    static C: std::sync::OnceLock<CBaseline> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        let lib = ffi::c_side::compile(&ffi::c_side::source("bench.c"))
            .unwrap_or_else(|e| usage(&format!("the C baseline: {e}")));
        // SAFETY: the signatures of c/bench.c's functions; the object is never unloaded.
        unsafe {
            CBaseline {
                post: lib.function(c"rsrdma_bench_c_post").unwrap(),
                post_chain: lib.function(c"rsrdma_bench_c_post_chain").unwrap(),
                post_poll: lib.function(c"rsrdma_bench_c_post_poll").unwrap(),
            }
        }
    })
}

fn c_post(f: &FakeQp, n: u64) {
    let sges = sge();
    let mut wr = raw(SendWr::send(0, &sges));
    // SAFETY: the fake QP is live; `wr` is a valid request naming no real memory (the
    // provider never reads it).
    let failed = unsafe { (c_baseline().post)(f.raw().0, &mut wr, n) };
    assert_eq!(failed, 0);
}

/// As `c_post`: one request built once, its id set before each post.
fn rust_post(f: &FakeQp, n: u64) {
    let sges = sge();
    let qp = f.qp();
    let mut wr = SendWr::send(0, &sges);
    for i in 0..n {
        wr.set_wr_id(i);
        // SAFETY: the provider never touches memory; nothing is in flight.
        unsafe { qp.post_send(black_box(&wr)) }.unwrap();
    }
}

/// Where the time goes: the raw FFI call alone, the same request each time.
fn rust_ffi_only(f: &FakeQp, n: u64) {
    let sges = sge();
    let mut wr = raw(SendWr::send(0, &sges));
    let qp = f.raw().0;
    let mut bad = std::ptr::null_mut();
    for i in 0..n {
        wr.wr_id = i;
        // SAFETY: as in `c_post`.
        let rc = unsafe { ffi::data_path::ibv_post_send(qp, black_box(&mut wr), &mut bad) };
        assert_eq!(rc, 0);
    }
}

/// What building a request per post costs: a fresh `SendWr` for every post.
fn rust_post_rebuilt(f: &FakeQp, n: u64) {
    let sges = sge();
    let qp = f.qp();
    for i in 0..n {
        // SAFETY: as in `rust_post`.
        unsafe { qp.post_send(black_box(&SendWr::send(i, &sges))) }.unwrap();
    }
}

fn c_chain(f: &FakeQp, n: u64) {
    let sges = sge();
    let mut wrs: Vec<ffi::ibv_send_wr> = (0..BATCH).map(|_| raw(SendWr::send(0, &sges))).collect();
    // SAFETY: as in `c_post`; `wrs` holds BATCH valid requests.
    let failed =
        unsafe { (c_baseline().post_chain)(f.raw().0, wrs.as_mut_ptr(), BATCH, n / BATCH as u64) };
    assert_eq!(failed, 0);
}

/// As `c_chain`: the requests built once, their ids set before each post (the links are
/// `post_send_batch`'s work).
fn rust_chain(f: &FakeQp, n: u64) {
    let sges = sge();
    let qp = f.qp();
    let mut wrs: [SendWr<'_>; BATCH] = std::array::from_fn(|_| SendWr::send(0, &sges));
    for r in 0..n / BATCH as u64 {
        for (i, wr) in wrs.iter_mut().enumerate() {
            wr.set_wr_id(r * BATCH as u64 + i as u64);
        }
        // SAFETY: as in `rust_post`.
        unsafe { qp.post_send_batch(black_box(&mut wrs)) }.unwrap();
    }
}

/// What building the requests per post costs: 32 fresh `SendWr`s for every post.
fn rust_chain_rebuilt(f: &FakeQp, n: u64) {
    let sges = sge();
    let qp = f.qp();
    let mut wrs: [SendWr<'_>; BATCH] = std::array::from_fn(|_| SendWr::send(0, &sges));
    for r in 0..n / BATCH as u64 {
        for (i, wr) in wrs.iter_mut().enumerate() {
            *wr = SendWr::send(r * BATCH as u64 + i as u64, &sges);
        }
        // SAFETY: as in `rust_post`.
        unsafe { qp.post_send_batch(black_box(&mut wrs)) }.unwrap();
    }
}

fn c_post_poll(f: &FakeQp, n: u64) {
    let sges = sge();
    let mut wr = raw(SendWr::send(0, &sges));
    let (qp, cq) = f.raw();
    // SAFETY: as in `c_post`; the fake CQ answers every poll with one completion.
    let failed = unsafe { (c_baseline().post_poll)(qp, cq, &mut wr, n) };
    assert_eq!(failed, 0);
}

/// As `c_post_poll`: one request built once, its id set before each post.
fn rust_post_poll(f: &FakeQp, n: u64) {
    let sges = sge();
    let (qp, cq) = (f.qp(), f.cq());
    let mut wr = SendWr::send(0, &sges);
    let mut wcs = [Wc::default(); 1];
    for i in 0..n {
        wr.set_wr_id(i);
        // SAFETY: as in `rust_post`.
        unsafe { qp.post_send(black_box(&wr)) }.unwrap();
        let got = cq.poll(&mut wcs).unwrap();
        black_box(got);
    }
}

/// What building a request per post costs in the pipeline step.
fn rust_post_poll_rebuilt(f: &FakeQp, n: u64) {
    let sges = sge();
    let (qp, cq) = (f.qp(), f.cq());
    let mut wcs = [Wc::default(); 1];
    for i in 0..n {
        // SAFETY: as in `rust_post`.
        unsafe { qp.post_send(black_box(&SendWr::send(i, &sges))) }.unwrap();
        let got = cq.poll(&mut wcs).unwrap();
        black_box(got);
    }
}

/// ns per WR, and instructions per WR where counters exist.
fn measure(counter: &Counter, run: impl FnOnce(), wrs: u64) -> (f64, Option<f64>) {
    counter.reset();
    let t0 = Instant::now();
    run();
    let ns = t0.elapsed().as_nanos() as f64 / wrs as f64;
    (ns, counter.read().map(|i| i as f64 / wrs as f64))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A user-space instruction counter (perf_event_open), if the machine has one.
struct Counter(Result<std::fs::File, String>);

impl Counter {
    fn open() -> Counter {
        // struct perf_event_attr, as far as needed: type, size, config, and the flag bits
        // disabled (0), exclude_kernel (5) and exclude_hv (6).
        let mut attr = [0u64; 16];
        attr[0] = 128u64 << 32; // type PERF_TYPE_HARDWARE (0) in the low half, size 128
        attr[1] = 1; // PERF_COUNT_HW_INSTRUCTIONS
        attr[5] = (1 << 0) | (1 << 5) | (1 << 6);
        // SAFETY: `attr` is a 128-byte perf_event_attr; pid 0 (this process), any CPU, no group.
        let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) };
        if fd < 0 {
            return Counter(Err(std::io::Error::last_os_error().to_string()));
        }
        use std::os::fd::FromRawFd;
        // SAFETY: a fresh descriptor that nothing else owns.
        Counter(Ok(unsafe { std::fs::File::from_raw_fd(fd as i32) }))
    }

    fn reset(&self) {
        if let Ok(f) = &self.0 {
            use std::os::fd::AsRawFd;
            // SAFETY: ioctls on our own perf event descriptor.
            unsafe {
                libc::ioctl(f.as_raw_fd(), 0x2403); // PERF_EVENT_IOC_RESET
                libc::ioctl(f.as_raw_fd(), 0x2400); // PERF_EVENT_IOC_ENABLE
            }
        }
    }

    fn read(&self) -> Option<u64> {
        use std::io::Read;
        let mut f = self.0.as_ref().ok()?;
        let mut b = [0u8; 8];
        f.read_exact(&mut b).ok()?;
        Some(u64::from_ne_bytes(b))
    }
}
