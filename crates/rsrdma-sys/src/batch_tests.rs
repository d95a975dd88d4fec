//! Host tests of the batch-post helpers against a fake provider: `ibv_post_send` and its twins
//! call through `context->ops`, so a context whose ops are Rust functions stands in for a
//! device and shows the chain the shim built and how it reports a rejected request.

use super::*;
use std::os::raw::c_int;
use std::ptr;

/// The fake provider's state, reached through the queue's user context pointer.
#[derive(Default)]
struct Fake {
    /// Reject the request with this wr_id (as `bad`), or fail naming none when `u64::MAX`.
    reject: Option<u64>,
    /// The wr_ids of the chain, in order, from every call.
    seen: Vec<u64>,
    calls: usize,
}

const EINVAL: c_int = 22;
/// More links than any test posts: a chain this long has no NULL end.
const MAX_CHAIN: usize = 1000;
/// What the fake returns for a chain without an end (no test expects it; a panic here could
/// not unwind out of the `extern "C"` function).
const ENDLESS: c_int = -1;

/// Walks a chain as a provider would; `link` reads a request's wr_id and `next`.
///
/// # Safety
///
/// `first` must start a chain of valid requests ending in NULL (or be caught by the length
/// limit), and `bad` must be writable.
unsafe fn walk<W>(
    fake: &mut Fake,
    first: *mut W,
    link: fn(&W) -> (u64, *mut W),
    bad: *mut *mut W,
) -> c_int {
    fake.calls += 1;
    let mut wr = first;
    while !wr.is_null() {
        if fake.seen.len() == MAX_CHAIN {
            return ENDLESS;
        }
        // SAFETY: the caller promises a chain of valid requests.
        let (id, next) = link(unsafe { &*wr });
        fake.seen.push(id);
        if fake.reject == Some(id) {
            // SAFETY: the caller promises `bad` is writable.
            unsafe { *bad = wr };
            return EINVAL;
        }
        wr = next;
    }
    if fake.reject == Some(u64::MAX) {
        // SAFETY: as above.
        unsafe { *bad = ptr::null_mut() };
        return EINVAL;
    }
    0
}

unsafe extern "C" fn fake_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the tests set qp_context to a live Fake and post well-formed arrays.
    unsafe {
        let fake = &mut *((*qp).qp_context as *mut Fake);
        walk(fake, wr, |w| (w.wr_id, w.next), bad)
    }
}

unsafe extern "C" fn fake_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as fake_post_send.
    unsafe {
        let fake = &mut *((*qp).qp_context as *mut Fake);
        walk(fake, wr, |w| (w.wr_id, w.next), bad)
    }
}

unsafe extern "C" fn fake_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as fake_post_send, with srq_context.
    unsafe {
        let fake = &mut *((*srq).srq_context as *mut Fake);
        walk(fake, wr, |w| (w.wr_id, w.next), bad)
    }
}

fn fake_context() -> Box<ibv_context> {
    let mut ctx = Box::<ibv_context>::default();
    ctx.ops.post_send = Some(fake_post_send);
    ctx.ops.post_recv = Some(fake_post_recv);
    ctx.ops.post_srq_recv = Some(fake_post_srq_recv);
    ctx
}

/// `n` send requests with wr_ids 0..n, each `next` pointing back at the array's start: a
/// helper that forgot to end the chain would make it a loop.
fn send_wrs(n: usize) -> Vec<ibv_send_wr> {
    let mut wrs: Vec<ibv_send_wr> = (0..n as u64)
        .map(|id| ibv_send_wr {
            wr_id: id,
            ..Default::default()
        })
        .collect();
    let start = wrs.as_mut_ptr();
    wrs.iter_mut().for_each(|w| w.next = start);
    wrs
}

fn recv_wrs(n: usize) -> Vec<ibv_recv_wr> {
    let mut wrs: Vec<ibv_recv_wr> = (0..n as u64)
        .map(|id| ibv_recv_wr {
            wr_id: id,
            ..Default::default()
        })
        .collect();
    let start = wrs.as_mut_ptr();
    wrs.iter_mut().for_each(|w| w.next = start);
    wrs
}

/// Posts `wrs` to a fake QP's send queue; returns the result, the bad index and the fake.
fn post_send(wrs: &mut [ibv_send_wr], reject: Option<u64>) -> (c_int, usize, Fake) {
    let mut ctx = fake_context();
    let mut fake = Fake {
        reject,
        ..Default::default()
    };
    let mut qp = ibv_qp {
        context: &mut *ctx,
        qp_context: (&mut fake as *mut Fake).cast(),
        ..Default::default()
    };
    let mut bad_index = usize::MAX;
    // SAFETY: qp's context has the fake's ops and qp_context points to `fake`, both alive for
    // the call; wrs is a valid, writable array of wrs.len() requests.
    let rc =
        unsafe { rsrdma_post_send_batch(&mut qp, wrs.as_mut_ptr(), wrs.len(), &mut bad_index) };
    (rc, bad_index, fake)
}

#[test]
fn a_send_batch_is_one_chain_in_array_order() {
    let mut wrs = send_wrs(64);
    let (rc, bad_index, fake) = post_send(&mut wrs, None);
    assert_eq!((rc, fake.calls), (0, 1));
    assert_eq!(fake.seen, (0..64).collect::<Vec<u64>>());
    assert_eq!(bad_index, usize::MAX, "untouched on success");
    // Unlinked after posting: each request can be posted alone, in place.
    assert!(wrs.iter().all(|w| w.next.is_null()));
}

#[test]
fn a_rejected_send_is_reported_by_index() {
    let mut wrs = send_wrs(64);
    let (rc, bad_index, _) = post_send(&mut wrs, Some(37));
    assert_eq!((rc, bad_index), (EINVAL, 37));
    let (rc, bad_index, _) = post_send(&mut wrs, Some(u64::MAX));
    assert_eq!((rc, bad_index), (EINVAL, 64), "no bad request named: n");
}

#[test]
fn an_empty_batch_posts_nothing() {
    let (rc, _, fake) = post_send(&mut [], Some(0));
    assert_eq!((rc, fake.calls), (0, 0));
}

#[test]
fn receive_batches_go_to_the_qp_and_the_srq() {
    let mut ctx = fake_context();
    let mut fake = Fake {
        reject: Some(5),
        ..Default::default()
    };
    let mut qp = ibv_qp {
        context: &mut *ctx,
        qp_context: (&mut fake as *mut Fake).cast(),
        ..Default::default()
    };
    let mut wrs = recv_wrs(8);
    let mut bad_index = 0;
    // SAFETY: as in post_send.
    let rc = unsafe { rsrdma_post_recv_batch(&mut qp, wrs.as_mut_ptr(), 8, &mut bad_index) };
    assert_eq!((rc, bad_index), (EINVAL, 5));
    assert_eq!(fake.seen, [0, 1, 2, 3, 4, 5]);

    let mut srq_fake = Fake::default();
    let mut srq = ibv_srq {
        context: &mut *ctx,
        srq_context: (&mut srq_fake as *mut Fake).cast(),
        ..Default::default()
    };
    let mut wrs = recv_wrs(3);
    // SAFETY: as in post_send; a null bad_index is allowed.
    let rc = unsafe { rsrdma_post_srq_recv_batch(&mut srq, wrs.as_mut_ptr(), 3, ptr::null_mut()) };
    assert_eq!(rc, 0);
    assert_eq!(srq_fake.seen, [0, 1, 2]);
    assert_eq!(fake.calls, 1, "the SRQ batch went to the SRQ only");
}
