//! The data path of the software device allocates nothing in a steady state for small
//! messages: posting a receive, posting a send (inline, and from a region, with up to two
//! SGEs) and reaping their completions, between two queue pairs of soft0 in this process.
//!
//! Each work request used to become a request with its own `Vec` of SGEs (and one of inline
//! bytes), so every post allocated and every completion freed (two allocations a round trip
//! of `rs_send_lat -s 8`, about 8% of its instructions). A payload longer than
//! `rsrdma_soft::INLINE_PAYLOAD` (40 bytes) still takes a shared buffer (kept for a resend
//! after an RNR NAK): reused from 4 KiB up, allocated below.

use rsrdma::{AccessFlags, ConnectOptions, Cq, Mr, Pd, Qp, QpCaps, QpType, RecvWr, SendWr, Wc};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

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

fn poll_one(cq: &Cq) {
    let mut wcs = [Wc::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if cq.poll(&mut wcs).unwrap() == 1 {
            assert!(wcs[0].is_ok(), "{:?}", wcs[0].status());
            return;
        }
        assert!(Instant::now() < deadline, "no completion");
    }
}

#[test]
fn posting_and_reaping_on_soft0_allocate_nothing() {
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

    let src = Mr::new(&pd, 4096, AccessFlags::NONE).unwrap();
    let dst = Mr::new(&pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let message = *b"8 bytes!";
    let inline = [rsrdma::Sge::inline(&message)];
    let two: Vec<_> = (0..2).map(|i| src.sge(i * 16, 8).unwrap()).collect();
    let recv = [dst.sge(0, 4096).unwrap()];
    let round_trip = |inline_send: bool| {
        // SAFETY: `dst` and `src` outlive the requests, which complete before the next.
        unsafe {
            b.post_recv(&RecvWr::new(1, &recv)).unwrap();
            let send = match inline_send {
                true => SendWr::send(2, &inline).inline(),
                false => SendWr::send(2, &two),
            };
            a.post_send(&send.signaled(true)).unwrap();
        }
        poll_one(&cq_b);
        poll_one(&cq_a);
    };
    // Queues grow to their size, pools fill, lazy state is made.
    for i in 0..200 {
        round_trip(i % 2 == 0);
    }
    let inline_allocations = allocations_in(|| (0..500).for_each(|_| round_trip(true)));
    let gathered_allocations = allocations_in(|| (0..500).for_each(|_| round_trip(false)));
    assert_eq!(
        (inline_allocations, gathered_allocations),
        (0, 0),
        "allocations in 500 round trips (8 inline bytes, 2 SGEs of 8 bytes)"
    );
}
