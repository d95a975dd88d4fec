//! The data path of the software device allocates nothing in a steady state for small
//! or large messages: posting a receive, posting a send (inline, from a region with two SGEs,
//! and long ones up to 64 KiB) and reaping their completions, between two queue pairs of
//! soft0 in this process.
//!
//! Each work request used to become a request with its own `Vec` of SGEs (and one of inline
//! bytes), so every post allocated and every completion freed (two allocations a round trip
//! of `rs_send_lat -s 8`, about 8% of its instructions). A payload longer than
//! `rsrdma_soft::INLINE_PAYLOAD` (40 bytes) takes a shared buffer (kept for a resend after
//! an RNR NAK), which was allocated per request below 4 KiB, and its shared box at every
//! size: buffers and boxes are now reused (`rsrdma_soft::PayloadBuf`), by the sender and by
//! a link's reader.

mod soft_peer;

use rsrdma::{AccessFlags, ConnectOptions, Cq, Mr, Pd, Qp, QpCaps, QpType, RecvWr, SendWr};
use soft_peer::{child_end, end_child, parent_end, poll_len, spawn_child};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts the allocations of the threads that ask it to.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: a thread being torn down has no locals any more.
    let counting = COUNTING.try_with(Cell::get).unwrap_or(false);
    if counting {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every call goes to `System` unchanged; the bookkeeping touches only thread-locals
// of `Cell`s (no allocation, no lock).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations this thread made while running `f`.
fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

/// The tests run one at a time: the device's spare payload buffers are the process's, and
/// another test's traffic taking them meanwhile would show here as allocations.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn posting_and_reaping_on_soft0_allocate_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let ctx = rsrdma::open("soft0").unwrap();
    let pd = Pd::new(&ctx).unwrap();
    let cq_a = Cq::new(&ctx, 64, None).unwrap();
    let cq_b = Cq::new(&ctx, 64, None).unwrap();
    let caps = QpCaps::default()
        .max_send_wr(16)
        .max_recv_wr(16)
        .max_send_sge(4)
        .max_recv_sge(4)
        .max_inline_data(64);
    let a = Qp::builder(QpType::Rc)
        .caps(caps)
        .build(&pd, &cq_a, &cq_a)
        .unwrap();
    let b = Qp::builder(QpType::Rc)
        .caps(caps)
        .build(&pd, &cq_b, &cq_b)
        .unwrap();
    let opts = ConnectOptions::default().gid_index(Some(1));
    let ea = a.endpoint(1, Some(1), 0x1000).unwrap();
    let eb = b.endpoint(1, Some(1), 0x2000).unwrap();
    a.connect(&opts, ea.psn, &eb).unwrap();
    b.connect(&opts, eb.psn, &ea).unwrap();

    let src = Mr::new(&pd, 1 << 16, AccessFlags::NONE).unwrap();
    let dst = Mr::new(&pd, 1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    let message = *b"8 bytes!";
    let inline = [rsrdma::Sge::inline(&message)];
    let two: Vec<_> = (0..2).map(|i| src.sge(i * 16, 8).unwrap()).collect();
    let recv = [dst.sge(0, 1 << 16).unwrap()];
    let round_trip = |send: &SendWr<'_>| {
        // SAFETY: `dst` and `src` outlive the requests, which complete before the next.
        unsafe {
            b.post_recv(&RecvWr::new(1, &recv)).unwrap();
            a.post_send(&send.signaled(true)).unwrap();
        }
        poll_len(&cq_b);
        poll_len(&cq_a);
    };
    let sizes = [41, 1024, 4096, 1 << 16];
    let long: Vec<_> = sizes.iter().map(|&n| [src.sge(0, n).unwrap()]).collect();
    let inline_send = SendWr::send(2, &inline).inline();
    let gathered = SendWr::send(2, &two);
    let mut sends = vec![&inline_send, &gathered];
    let long_sends: Vec<_> = long.iter().map(|l| SendWr::send(2, l)).collect();
    sends.extend(long_sends.iter());
    // Queues grow to their size, pools fill, lazy state is made.
    for i in 0..200 {
        round_trip(sends[i % sends.len()]);
    }
    // Each size in its steady state: a few round trips first, as its buffers settle.
    let counts: Vec<u64> = sends
        .iter()
        .map(|s| {
            (0..20).for_each(|_| round_trip(s));
            allocations_in(|| (0..500).for_each(|_| round_trip(s)))
        })
        .collect();
    assert_eq!(
        counts,
        vec![0; sends.len()],
        "allocations in 500 round trips: 8 inline bytes, 2 SGEs of 8 bytes, then {sizes:?} bytes"
    );
}

/// The longest message the echo takes.
const ECHO_MAX: usize = 1 << 16;

/// The other process of `sends_between_processes_allocate_nothing`: sends back every message
/// it gets, until an empty one.
#[test]
#[ignore = "runs as the child process of sends_between_processes_allocate_nothing"]
fn echo_child() {
    let e = child_end();
    let mr = Mr::new(&e.pd, ECHO_MAX, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [mr.sge(0, ECHO_MAX).unwrap()];
    // SAFETY: `mr` outlives the receive; it completes (or the QP goes) before `mr` is dropped.
    unsafe { e.qp.post_recv(&RecvWr::new(1, &recv)).unwrap() };
    println!("READY");
    loop {
        // Each message is sent back before the next receive can be used: one is posted
        // ahead, so the peer never meets an empty receive queue.
        let len = poll_len(&e.cq) as usize;
        if len == 0 {
            break;
        }
        let back = [mr.sge(0, len).unwrap()];
        // SAFETY: as above; the send completes before the region is reused (it is polled
        // next, and the peer's next message waits for this one).
        unsafe {
            e.qp.post_recv(&RecvWr::new(1, &recv)).unwrap();
            e.qp.post_send(&SendWr::send(2, &back).signaled(true))
                .unwrap();
        }
        assert_eq!(poll_len(&e.cq), 0, "the echo's send completes");
    }
}

/// The same between two processes: the sends leave through a link to the other process's
/// device (shared-memory rings, or TCP with `RSRDMA_SOFT_SHM=0`) and the answers are read from
/// it by this thread's polls. Counted on this thread: posting, gathering, polling and reading
/// the rings (what a link's own threads do is not counted).
#[test]
fn sends_between_processes_allocate_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (mut child, mut lines) = spawn_child("echo_child");
    let e = parent_end(&mut child, &mut lines);
    lines.next_with("READY");

    let src = Mr::new(&e.pd, ECHO_MAX, AccessFlags::NONE).unwrap();
    let dst = Mr::new(&e.pd, ECHO_MAX, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = [dst.sge(0, ECHO_MAX).unwrap()];
    let round_trip = |len: usize| {
        let sge = [src.sge(0, len).unwrap()];
        // SAFETY: `src` and `dst` outlive the requests; both complete before the next.
        unsafe {
            e.qp.post_recv(&RecvWr::new(1, &recv)).unwrap();
            e.qp.post_send(&SendWr::send(2, &sge).signaled(true))
                .unwrap();
        }
        // The send's completion and the echo's, in either order.
        let lens = [poll_len(&e.cq), poll_len(&e.cq)];
        assert!(lens.contains(&(len as u32)), "{lens:?} for {len}");
    };
    let sizes = [8, 41, 1024, 4096, ECHO_MAX];
    for i in 0..200 {
        round_trip(sizes[i % sizes.len()]);
    }
    let counts: Vec<u64> = sizes
        .iter()
        .map(|&n| {
            (0..20).for_each(|_| round_trip(n));
            allocations_in(|| (0..500).for_each(|_| round_trip(n)))
        })
        .collect();
    // The end: an empty message.
    end_child(&e, &mut child);
    // A link's writer thread may hold a payload a little longer now and then (over TCP
    // above all): the buffers then grow by one (two allocations: the bytes and their box),
    // which stays. Before the buffers were reused: 3 to 5 a round trip (2,500 at 41 bytes).
    assert!(
        counts.iter().all(|&n| n <= 4),
        "allocations in 500 round trips between processes, of {sizes:?} bytes: {counts:?}"
    );
}
