//! The extended completion queue (`ibv_create_cq_ex`, `ibv_start_poll` / `ibv_next_poll` /
//! `ibv_end_poll`): completions are read field by field from the provider's own entry, with
//! no `ibv_wc` filled in, and can carry what `ibv_wc` has no room for (a completion
//! timestamp). The fields a CQ offers are chosen when it is made ([`WcFields`]); `wr_id` and
//! the status always come.
//!
//! A CQ made by [`Cq::new_ex`] is an ordinary [`Cq`] (QPs use it, channels arm it,
//! [`Cq::poll`] works on it) that can also be polled with [`Cq::poll_ex`]. Devices without it
//! (soft0) refuse `new_ex` with [`Error::Unsupported`]; rxe has it.

use crate::context::Context;
use crate::cq::{CompChannel, Cq};
use crate::error::{Error, Result};
use crate::ffi;
use crate::wc::{WcOpcode, WcStatus};
use std::marker::PhantomData;

/// The fields an extended CQ's completions carry beyond `wr_id` and the status
/// (`ibv_create_cq_wc_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WcFields(u64);

impl WcFields {
    /// The length of a receive (or READ) completion.
    pub const BYTE_LEN: WcFields =
        WcFields(ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN.0 as u64);
    /// Immediate data.
    pub const IMM: WcFields = WcFields(ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM.0 as u64);
    /// The local QP number.
    pub const QP_NUM: WcFields =
        WcFields(ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_QP_NUM.0 as u64);
    /// The source QP of a UD receive.
    pub const SRC_QP: WcFields =
        WcFields(ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP.0 as u64);
    /// The device's completion timestamp (in its own clock's ticks).
    pub const COMPLETION_TIMESTAMP: WcFields =
        WcFields(ffi::ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0 as u64);

    /// What an `ibv_wc` has that matters to most programs: length, immediate data, QP
    /// number and source QP.
    pub const STANDARD: WcFields =
        WcFields(Self::BYTE_LEN.0 | Self::IMM.0 | Self::QP_NUM.0 | Self::SRC_QP.0);
}

crate::flags::flag_set!(WcFields, u64);

impl Cq {
    /// Creates an extended CQ (`ibv_create_cq_ex`) whose completions carry `fields`, attached
    /// to `channel` if given.
    ///
    /// # Errors
    /// As [`Cq::new`]; [`Error::Unsupported`] naming `ibv_create_cq_ex` where the device has
    /// no extended CQs (soft0) or not the fields asked for.
    pub fn new_ex(
        ctx: &Context,
        cqe: u32,
        channel: Option<&CompChannel>,
        fields: WcFields,
    ) -> Result<Cq> {
        Cq::check_size(ctx, cqe)?;
        Cq::check_channel(ctx, channel)?;
        let mut attr = ffi::ibv_cq_init_attr_ex {
            cqe,
            channel: channel.map_or(std::ptr::null_mut(), CompChannel::raw),
            wc_flags: fields.0,
            ..Default::default()
        };
        // SAFETY: the context is open; the channel (if any) is a live channel of the same
        // device that the CQ keeps alive (`Cq::created` stores its clone).
        let ex = unsafe { ffi::ibv_create_cq_ex(ctx.inner.raw, &mut attr) };
        if ex.is_null() {
            return Err(Error::last_os("ibv_create_cq_ex"));
        }
        let cq = Cq::created(ffi::ibv_cq_ex_to_cq(ex), ex, ctx, channel);
        // The poll entries must be there: the header would call null ones.
        // SAFETY: the live extended CQ just made.
        let e = unsafe { &*ex };
        if e.start_poll.is_none() || e.next_poll.is_none() || e.end_poll.is_none() {
            return Err(Error::from_errno("ibv_create_cq_ex", libc::EOPNOTSUPP));
        }
        Ok(cq)
    }

    /// Polls an extended CQ ([`Cq::new_ex`]): hands up to `max` completions, one at a time,
    /// to `each`, and returns how many there were (0 when the CQ is empty). Allocates
    /// nothing. `each` must not poll this CQ again: the provider holds the CQ for the whole
    /// poll (a nested `ibv_start_poll` may deadlock in it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a CQ not made by `new_ex`; [`Error::Verbs`] naming
    /// `ibv_start_poll` or `ibv_next_poll` for a provider error (the completions handed
    /// before it stay taken).
    pub fn poll_ex(&self, max: usize, mut each: impl FnMut(&WcEx<'_>)) -> Result<usize> {
        let ex = self.inner.ex;
        if ex.is_null() {
            return Err(Error::InvalidArgument(
                "poll_ex needs a CQ made by Cq::new_ex".into(),
            ));
        }
        if max == 0 {
            return Ok(0);
        }
        let mut attr = ffi::ibv_poll_cq_attr::default();
        // SAFETY: the live extended CQ of `self`; `attr` is valid.
        let rc = unsafe { ffi::ibv_start_poll(ex, &mut attr) };
        if rc == libc::ENOENT {
            return Ok(0);
        }
        if rc != 0 {
            return Err(Error::from_errno("ibv_start_poll", rc));
        }
        let mut n = 0;
        let result = loop {
            each(&WcEx {
                cq: ex,
                _poll: PhantomData,
            });
            n += 1;
            if n == max {
                break Ok(n);
            }
            // SAFETY: inside the poll that `ibv_start_poll` opened.
            match unsafe { ffi::ibv_next_poll(ex) } {
                0 => {}
                libc::ENOENT => break Ok(n),
                rc => break Err(Error::from_errno("ibv_next_poll", rc)),
            }
        };
        // SAFETY: closes the poll `ibv_start_poll` opened.
        unsafe { ffi::ibv_end_poll(ex) };
        self.note_polled(n);
        result
    }
}

/// The current completion of an extended CQ's poll ([`Cq::poll_ex`]), valid only inside the
/// callback it is handed to.
pub struct WcEx<'p> {
    cq: *mut ffi::ibv_cq_ex,
    _poll: PhantomData<&'p ()>,
}

impl WcEx<'_> {
    /// The work request's id.
    pub fn wr_id(&self) -> u64 {
        // SAFETY: the current completion of an open poll.
        unsafe { (*self.cq).wr_id }
    }

    /// Its status.
    pub fn status(&self) -> WcStatus {
        // SAFETY: as above.
        WcStatus(unsafe { (*self.cq).status }.0)
    }

    /// Its opcode.
    pub fn opcode(&self) -> WcOpcode {
        // SAFETY: as above.
        WcOpcode(unsafe { ffi::ibv_wc_read_opcode(self.cq) }.0)
    }

    /// The byte length (asked for with [`WcFields::BYTE_LEN`]).
    pub fn byte_len(&self) -> u32 {
        // SAFETY: as above.
        unsafe { ffi::ibv_wc_read_byte_len(self.cq) }
    }

    /// The immediate data, when the completion carries some (asked for with
    /// [`WcFields::IMM`]).
    pub fn imm_data(&self) -> Option<u32> {
        // SAFETY: as above.
        let flags = unsafe { ffi::ibv_wc_read_wc_flags(self.cq) };
        (flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
            // SAFETY: as above.
            .then(|| u32::from_be(unsafe { ffi::ibv_wc_read_imm_data(self.cq) }))
    }

    /// The local QP number (asked for with [`WcFields::QP_NUM`]).
    pub fn qp_num(&self) -> u32 {
        // SAFETY: as above.
        unsafe { ffi::ibv_wc_read_qp_num(self.cq) }
    }

    /// The source QP of a UD receive (asked for with [`WcFields::SRC_QP`]).
    pub fn src_qp(&self) -> u32 {
        // SAFETY: as above.
        unsafe { ffi::ibv_wc_read_src_qp(self.cq) }
    }

    /// The device's completion timestamp (asked for with
    /// [`WcFields::COMPLETION_TIMESTAMP`]).
    pub fn completion_ts(&self) -> u64 {
        // SAFETY: as above.
        unsafe { ffi::ibv_wc_read_completion_ts(self.cq) }
    }
}
