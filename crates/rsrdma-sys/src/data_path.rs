//! The data-path verbs that `verbs.h` defines `static inline`, written in Rust: each is one
//! call through the context's operation table (`ibv_context_ops`), exactly as the header's
//! body. The `*__extern` wrappers do the same from C, but a call into them is one more call
//! and return per work request and per poll, on the path a busy-polling loop runs millions of
//! times a second (measured: `cargo xtask bench overhead`). The table's layout is
//! libibverbs' ABI and is checked field by field by bindgen's layout assertions in
//! [`crate::bindings`].
//!
//! A missing entry (a provider without the operation) returns `EOPNOTSUPP` for the posts
//! and `-EOPNOTSUPP` for the poll (its error convention: a negative value), where the header
//! would call a null pointer.

use crate::{ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_srq, ibv_wc};
use std::os::raw::c_int;

/// `ibv_post_send`.
///
/// # Safety
/// As the C function: `qp` is a live QP of a live context; `wr` is a valid request list;
/// `bad_wr` is writable.
#[inline(always)]
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller vouches for `qp`, so its context pointer and op table are valid.
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: the provider's own entry, called with the arguments the caller vouches for.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv`.
///
/// # Safety
/// As [`ibv_post_send`].
#[inline(always)]
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as in `ibv_post_send`.
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: as in `ibv_post_send`.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_srq_recv`.
///
/// # Safety
/// As [`ibv_post_send`], for a live SRQ.
#[inline(always)]
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as in `ibv_post_send`.
    match unsafe { (*(*srq).context).ops.post_srq_recv } {
        // SAFETY: as in `ibv_post_send`.
        Some(f) => unsafe { f(srq, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq`.
///
/// # Safety
/// `cq` is a live CQ of a live context; `wc` has room for `num_entries` completions.
#[inline(always)]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: as in `ibv_post_send`.
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: as in `ibv_post_send`.
        Some(f) => unsafe { f(cq, num_entries, wc) },
        None => -libc::EOPNOTSUPP,
    }
}
