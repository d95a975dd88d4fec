//! A do-nothing provider, for measuring what rsrdma adds per work request
//! (`cargo xtask bench overhead`): a fake `ibv_context` whose `post_send` returns at once and
//! whose `poll_cq` reports one successful completion, with a real [`Qp`] and [`Cq`] on top, so
//! the measured Rust path is exactly the one applications run. Compiled only with the
//! `bench-support` feature; never for production.

use crate::context::Context;
use crate::cq::Cq;
use crate::ffi;
use crate::pd::{Pd, PdInner};
use crate::qp::{Qp, QpCaps, QpType};
use std::mem::ManuallyDrop;
use std::os::raw::c_int;
use std::sync::Arc;

/// The provider's post: accepts everything, does nothing.
unsafe extern "C" fn post_send_nop(
    _qp: *mut ffi::ibv_qp,
    _wr: *mut ffi::ibv_send_wr,
    _bad: *mut *mut ffi::ibv_send_wr,
) -> c_int {
    0
}

/// The provider's poll: one successful completion each call, the way a busy CQ answers.
unsafe extern "C" fn poll_cq_one(_cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
    if n < 1 {
        return 0;
    }
    // SAFETY: the caller passes room for `n >= 1` completions.
    unsafe { (*wc).status = ffi::ibv_wc_status::IBV_WC_SUCCESS };
    1
}

/// The fake C objects, boxed so their addresses stay put.
struct Fakes {
    ctx: ffi::ibv_context,
    pd: ffi::ibv_pd,
    cq: ffi::ibv_cq,
    qp: ffi::ibv_qp,
}

/// An RC [`Qp`] and its [`Cq`] on the do-nothing provider. The handles are never dropped (that
/// would call the provider's destroy verbs on fakes): dropping a `FakeQp` leaks them, and the
/// fake objects with them.
pub struct FakeQp {
    qp: ManuallyDrop<Qp>,
    cq: ManuallyDrop<Cq>,
    fakes: ManuallyDrop<Box<Fakes>>,
}

impl FakeQp {
    /// Builds the provider and a QP with `max_send_wr` send entries.
    pub fn new(max_send_wr: u32) -> FakeQp {
        // SAFETY: these C structs are plain data for which all-zero is a valid value (null
        // pointers, `None` function pointers, zero integers and enum newtypes).
        let mut fakes: Box<Fakes> = Box::new(unsafe { std::mem::zeroed() });
        fakes.ctx.ops.post_send = Some(post_send_nop);
        fakes.ctx.ops.poll_cq = Some(poll_cq_one);
        let ctx_raw: *mut ffi::ibv_context = &mut fakes.ctx;
        fakes.pd.context = ctx_raw;
        fakes.cq.context = ctx_raw;
        fakes.cq.cqe = 4096;
        fakes.qp.context = ctx_raw;
        fakes.qp.qp_num = 0x42;
        fakes.qp.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        fakes.qp.state = ffi::ibv_qp_state::IBV_QPS_RTS;
        // SAFETY: the fakes are boxed (stable addresses) and never freed (ManuallyDrop), and
        // the handles made on them are never dropped.
        let (qp, cq) = unsafe {
            let ctx = Context::wrap_fake(ctx_raw, "fake0");
            let pd = Pd {
                inner: Arc::new(PdInner {
                    raw: &mut fakes.pd,
                    ctx: ctx.clone(),
                }),
            };
            let cq = Cq::wrap_fake(&mut fakes.cq, &ctx);
            let caps = QpCaps::default().max_send_wr(max_send_wr);
            let granted = ffi::ibv_qp_cap {
                max_send_wr,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            };
            let qp = Qp::from_parts(
                &mut fakes.qp,
                &Qp::builder(QpType::Rc).caps(caps),
                granted,
                &pd,
                &cq,
                &cq,
                None,
            );
            (qp, cq)
        };
        FakeQp {
            qp: ManuallyDrop::new(qp),
            cq: ManuallyDrop::new(cq),
            fakes: ManuallyDrop::new(fakes),
        }
    }

    /// The queue pair (posts go to the do-nothing provider).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// Its completion queue (each poll reports one successful completion).
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    /// The raw QP and CQ, for the C baseline.
    pub fn raw(&self) -> (*mut ffi::ibv_qp, *mut ffi::ibv_cq) {
        let f: &Fakes = &self.fakes;
        (
            std::ptr::from_ref(&f.qp).cast_mut(),
            std::ptr::from_ref(&f.cq).cast_mut(),
        )
    }
}
