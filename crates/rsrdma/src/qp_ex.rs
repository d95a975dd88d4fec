//! The extended work-request API (`ibv_create_qp_ex`, `ibv_wr_start` … `ibv_wr_complete`):
//! requests are written straight into the provider's send queue by one call per field, with
//! no `ibv_send_wr` list for the provider to walk, which newer providers (mlx5, efa) need for
//! their newer operations and where posting is cheapest. perftest uses it by default where the
//! device has it (`--use_old_post_send` turns it off).
//!
//! A QP made by [`QpBuilder::build_ex`] is an ordinary [`Qp`] (state machine, receives, the
//! classic `post_send`) that can also post through [`Qp::wr_batch`]: a [`WrBatch`] takes the
//! same [`SendWr`] values `post_send` takes, so code moves between the two paths without
//! building requests differently, and posts them all with one [`WrBatch::complete`]. A batch
//! dropped without `complete` is aborted: nothing of it is posted.
//!
//! Devices without it (soft0) refuse `build_ex` with [`Error::Unsupported`]; rxe has it.
//! Inline requests go through `ibv_wr_set_inline_data_list`; the VM's rxe (rdma-core 44)
//! delivers those with no bytes (its provider's `resid` bug), so that one case is not
//! verified by the project's tests: prefer SGEs on rxe.

use crate::cq::Cq;
use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::Pd;
use crate::qp::{Qp, QpBuilder};
use crate::wr::SendWr;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;

/// The most SGEs an inline request may gather on this path (inline data is small).
const MAX_INLINE_SGES: usize = 16;

/// The operations an extended QP may post (`ibv_qp_create_send_ops_flags`), asked for when it
/// is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendOps(u64);

impl SendOps {
    /// SEND.
    pub const SEND: SendOps =
        SendOps(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND.0 as u64);
    /// SEND with immediate data.
    pub const SEND_WITH_IMM: SendOps =
        SendOps(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM.0 as u64);
    /// RDMA WRITE.
    pub const RDMA_WRITE: SendOps =
        SendOps(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0 as u64);
    /// RDMA WRITE with immediate data.
    pub const RDMA_WRITE_WITH_IMM: SendOps =
        SendOps(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0 as u64);
    /// RDMA READ.
    pub const RDMA_READ: SendOps =
        SendOps(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0 as u64);
    /// Compare-and-swap.
    pub const ATOMIC_CMP_AND_SWP: SendOps =
        SendOps(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0 as u64);
    /// Fetch-and-add.
    pub const ATOMIC_FETCH_AND_ADD: SendOps =
        SendOps(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0 as u64);

    /// Every operation above.
    pub const ALL: SendOps = SendOps(
        Self::SEND.0
            | Self::SEND_WITH_IMM.0
            | Self::RDMA_WRITE.0
            | Self::RDMA_WRITE_WITH_IMM.0
            | Self::RDMA_READ.0
            | Self::ATOMIC_CMP_AND_SWP.0
            | Self::ATOMIC_FETCH_AND_ADD.0,
    );
}

crate::flags::flag_set!(SendOps, u64);

impl QpBuilder {
    /// Makes the queue pair through `ibv_create_qp_ex`, able to post `ops` through
    /// [`Qp::wr_batch`] as well as [`Qp::post_send`].
    ///
    /// # Errors
    /// As [`QpBuilder::build`]; [`Error::Unsupported`] naming `ibv_create_qp_ex` where the
    /// device has no extended QPs (soft0), or gives a QP without the entries `ops` needs.
    pub fn build_ex(&self, pd: &Pd, send_cq: &Cq, recv_cq: &Cq, ops: SendOps) -> Result<Qp> {
        self.check_one_context(pd, send_cq, recv_cq)?;
        self.validate(pd)?;
        let base = self.init_attr(send_cq, recv_cq);
        let mut attr = ffi::ibv_qp_init_attr_ex {
            qp_context: base.qp_context,
            send_cq: base.send_cq,
            recv_cq: base.recv_cq,
            srq: base.srq,
            cap: base.cap,
            qp_type: base.qp_type,
            sq_sig_all: base.sq_sig_all,
            comp_mask: ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
                | ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0,
            pd: pd.inner.raw,
            send_ops_flags: ops.0,
            ..Default::default()
        };
        // SAFETY: a live PD and CQs of one device (the QP keeps them); `attr` is valid.
        let raw = unsafe { ffi::ibv_create_qp_ex(pd.context().inner.raw, &mut attr) };
        if raw.is_null() {
            return Err(Error::last_os("ibv_create_qp_ex"));
        }
        // SAFETY: a new QP this call owns; `Qp` destroys it.
        let mut qp = unsafe { Qp::from_parts(raw, self, attr.cap, pd, send_cq, recv_cq, None) };
        // SAFETY: a QP made by ibv_create_qp_ex with send ops.
        let ex = unsafe { ffi::ibv_qp_to_qp_ex(raw) };
        if ex.is_null() {
            return Err(Error::last_os("ibv_qp_to_qp_ex"));
        }
        // SAFETY: the provider's extended QP, live while `qp` is.
        let e = unsafe { &*ex };
        let needed = [
            (
                true,
                e.wr_start.is_some() && e.wr_complete.is_some() && e.wr_abort.is_some(),
            ),
            (true, e.wr_set_sge_list.is_some()),
            (ops.contains(SendOps::SEND), e.wr_send.is_some()),
            (
                ops.contains(SendOps::SEND_WITH_IMM),
                e.wr_send_imm.is_some(),
            ),
            (ops.contains(SendOps::RDMA_WRITE), e.wr_rdma_write.is_some()),
            (
                ops.contains(SendOps::RDMA_WRITE_WITH_IMM),
                e.wr_rdma_write_imm.is_some(),
            ),
            (ops.contains(SendOps::RDMA_READ), e.wr_rdma_read.is_some()),
            (
                ops.contains(SendOps::ATOMIC_CMP_AND_SWP),
                e.wr_atomic_cmp_swp.is_some(),
            ),
            (
                ops.contains(SendOps::ATOMIC_FETCH_AND_ADD),
                e.wr_atomic_fetch_add.is_some(),
            ),
        ];
        if needed.iter().any(|(asked, has)| *asked && !has) {
            return Err(Error::from_errno("ibv_create_qp_ex", libc::EOPNOTSUPP));
        }
        qp.set_ex(ex);
        qp.check_inline_granted(self.requested_inline())?;
        Ok(qp)
    }
}

impl Qp {
    /// Opens a batch of requests on an extended QP ([`QpBuilder::build_ex`]). One batch per
    /// QP may be open at a time, over every thread and every clone of the `Qp`: the
    /// provider keeps one batch state per QP, and a second open on the thread that holds the
    /// first would spin on the provider's lock for ever. A second open is refused instead;
    /// so is one while another thread's batch is open (wait for it, or post through
    /// [`Qp::post_send`], which the provider serialises). Do not call [`Qp::post_send`] on
    /// the thread that holds an open batch of the same QP: the provider's lock is held.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a QP not made by `build_ex`, or while a batch of the
    /// QP is open.
    pub fn wr_batch(&self) -> Result<WrBatch<'_>> {
        let ex = self.ex();
        if ex.is_null() {
            return Err(Error::InvalidArgument(
                "wr_batch needs a QP made by QpBuilder::build_ex".into(),
            ));
        }
        if self.batch_flag().swap(true, Ordering::Acquire) {
            return Err(Error::InvalidArgument(
                "wr_batch: a batch of this QP is already open (one at a time per QP)".into(),
            ));
        }
        // SAFETY: the live extended QP of `self`.
        unsafe { ffi::ibv_wr_start(ex) };
        Ok(WrBatch {
            qp: self,
            ex,
            count: 0,
            done: false,
            _not_send: PhantomData,
        })
    }
}

/// An open batch of requests on an extended QP: [`WrBatch::post`] adds one,
/// [`WrBatch::complete`] posts them all; dropped without `complete`, nothing is posted.
/// Only one batch per QP may be open at a time (the provider's state): it borrows the QP
/// and is neither `Send` nor `Sync`.
pub struct WrBatch<'q> {
    qp: &'q Qp,
    ex: *mut ffi::ibv_qp_ex,
    count: usize,
    done: bool,
    _not_send: PhantomData<*mut ()>,
}

impl WrBatch<'_> {
    /// Adds `wr` (any request [`Qp::post_send`] takes: SEND and WRITE with or without
    /// immediate data, READ, the atomics, UD with its address; inline or through SGEs).
    ///
    /// # Safety
    /// As [`Qp::post_send`]: what the request names must stay valid until its completion is
    /// reaped (an inline request's data only until [`WrBatch::complete`] returns).
    ///
    /// # Errors
    /// [`Error::Limit`] for an inline payload above the QP's inline size;
    /// [`Error::InvalidArgument`] for an operation this path does not post (a window bind,
    /// local invalidate).
    pub unsafe fn post(&mut self, wr: &SendWr<'_>) -> Result<()> {
        self.qp.check_inline(wr)?;
        let raw = wr.as_raw();
        let ex = self.ex;
        use ffi::ibv_wr_opcode as Op;
        let inline = raw.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0;
        // SAFETY: the open batch's live extended QP.
        unsafe {
            (*ex).wr_id = raw.wr_id;
            (*ex).wr_flags = raw.send_flags & !ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        // SAFETY: the open batch of a live extended QP (every call below); the fields come
        // from a valid request, whose union member its opcode names.
        unsafe {
            let rdma = raw.wr.rdma;
            let atomic = raw.wr.atomic;
            let imm = raw.__bindgen_anon_1.imm_data;
            match raw.opcode {
                Op::IBV_WR_SEND => ffi::ibv_wr_send(ex),
                Op::IBV_WR_SEND_WITH_IMM => ffi::ibv_wr_send_imm(ex, imm),
                Op::IBV_WR_RDMA_WRITE => ffi::ibv_wr_rdma_write(ex, rdma.rkey, rdma.remote_addr),
                Op::IBV_WR_RDMA_WRITE_WITH_IMM => {
                    ffi::ibv_wr_rdma_write_imm(ex, rdma.rkey, rdma.remote_addr, imm)
                }
                Op::IBV_WR_RDMA_READ => ffi::ibv_wr_rdma_read(ex, rdma.rkey, rdma.remote_addr),
                Op::IBV_WR_ATOMIC_CMP_AND_SWP => ffi::ibv_wr_atomic_cmp_swp(
                    ex,
                    atomic.rkey,
                    atomic.remote_addr,
                    atomic.compare_add,
                    atomic.swap,
                ),
                Op::IBV_WR_ATOMIC_FETCH_AND_ADD => ffi::ibv_wr_atomic_fetch_add(
                    ex,
                    atomic.rkey,
                    atomic.remote_addr,
                    atomic.compare_add,
                ),
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "WrBatch::post: opcode {} is not posted through the extended API",
                        other.0
                    )))
                }
            }
            if self.qp.qp_type() == crate::qp::QpType::Ud {
                let ud = raw.wr.ud;
                ffi::ibv_wr_set_ud_addr(ex, ud.ah, ud.remote_qpn, ud.remote_qkey);
            }
            let n = usize::try_from(raw.num_sge).unwrap_or(0);
            if inline {
                // The SGEs' addresses are the data, as for the classic inline post.
                let empty = ffi::ibv_data_buf {
                    addr: std::ptr::null_mut(),
                    length: 0,
                };
                let mut bufs = [empty; MAX_INLINE_SGES];
                if n > bufs.len() {
                    return Err(Error::InvalidArgument(format!(
                        "WrBatch::post: {n} inline SGEs (at most {MAX_INLINE_SGES})"
                    )));
                }
                for (i, b) in bufs.iter_mut().enumerate().take(n) {
                    let sge = *raw.sg_list.add(i);
                    *b = ffi::ibv_data_buf {
                        addr: sge.addr as *mut std::ffi::c_void,
                        length: sge.length as usize,
                    };
                }
                ffi::ibv_wr_set_inline_data_list(ex, n, bufs.as_ptr());
            } else {
                ffi::ibv_wr_set_sge_list(ex, n, raw.sg_list);
            }
        }
        self.count += 1;
        Ok(())
    }

    /// How many requests the batch holds.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Posts every request of the batch (`ibv_wr_complete`).
    ///
    /// # Errors
    /// [`Error::Post`] naming `ibv_wr_complete` with index 0: the provider refused the batch
    /// and posted none of it (ENOMEM: the send queue is full).
    pub fn complete(mut self) -> Result<()> {
        self.done = true;
        // SAFETY: the open batch of a live extended QP.
        let rc = unsafe { ffi::ibv_wr_complete(self.ex) };
        if rc != 0 {
            return Err(Error::Post {
                op: "ibv_wr_complete",
                index: 0,
                count: self.count,
                errno: rc,
            });
        }
        Ok(())
    }
}

impl Drop for WrBatch<'_> {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: the open batch of a live extended QP.
            unsafe { ffi::ibv_wr_abort(self.ex) };
        }
        // After the provider closed the batch (complete or abort): the next may open.
        self.qp.batch_flag().store(false, Ordering::Release);
    }
}
