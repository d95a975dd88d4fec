//! Work requests and completions, as the core sees them: plain values, with libibverbs'
//! numbers for statuses and opcodes so the device can write `ibv_wc` as they are.

use crate::access::Access;
use crate::wire::Payload;

/// A scatter/gather entry: `len` bytes at `addr`, in the region with key `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// The first address.
    pub addr: u64,
    /// The length.
    pub len: u32,
    /// The local key of the region it lies in.
    pub lkey: u32,
}

/// A work request's scatter/gather list: up to [`Sges::IN_PLACE`] entries in the list itself,
/// so that posting a request (a send of one or two entries, a receive of one) allocates
/// nothing; a longer list lives on the heap.
#[derive(Clone)]
pub struct Sges(SgesRepr);

#[derive(Clone)]
enum SgesRepr {
    InPlace {
        len: u8,
        sges: [Sge; Sges::IN_PLACE],
    },
    Heap(Vec<Sge>),
}

const NO_SGE: Sge = Sge {
    addr: 0,
    len: 0,
    lkey: 0,
};

impl Sges {
    /// Entries kept in the list itself.
    pub const IN_PLACE: usize = 2;

    /// A list of `n` entries, the `i`-th `at(i)`, made in place (no copy through another
    /// list).
    #[inline]
    pub fn from_fn(n: usize, mut at: impl FnMut(usize) -> Sge) -> Sges {
        if n <= Self::IN_PLACE {
            let mut list = Sges(SgesRepr::InPlace {
                len: n as u8,
                sges: [NO_SGE; Self::IN_PLACE],
            });
            if let SgesRepr::InPlace { sges, .. } = &mut list.0 {
                for (i, to) in sges[..n].iter_mut().enumerate() {
                    *to = at(i);
                }
            }
            list
        } else {
            Sges(SgesRepr::Heap((0..n).map(at).collect()))
        }
    }

    /// A list of a copy of `sges`.
    pub fn from_slice(sges: &[Sge]) -> Sges {
        Sges::from_fn(sges.len(), |i| sges[i])
    }
}

impl Default for Sges {
    fn default() -> Self {
        Sges::from_slice(&[])
    }
}

impl std::ops::Deref for Sges {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        match &self.0 {
            SgesRepr::InPlace { len, sges } => &sges[..usize::from(*len)],
            SgesRepr::Heap(v) => v,
        }
    }
}

impl From<Vec<Sge>> for Sges {
    fn from(v: Vec<Sge>) -> Self {
        if v.len() <= Self::IN_PLACE {
            Sges::from_slice(&v)
        } else {
            Sges(SgesRepr::Heap(v))
        }
    }
}

impl<const N: usize> From<[Sge; N]> for Sges {
    fn from(a: [Sge; N]) -> Self {
        Sges::from_slice(&a)
    }
}

impl std::fmt::Debug for Sges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Sges {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Sges {}

/// What a window bind asks for (`IBV_WR_BIND_MW`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bind {
    /// The window's present key (`ibv_mw.rkey`: its last bind's, or the one it was allocated
    /// with); it names the window and must be exactly its key.
    pub mw_key: u32,
    /// The key the window gets: only its low 8 bits (the tag) count, the index stays the
    /// window's.
    pub new_key: u32,
    /// The local key of the region it is bound to.
    pub mr_key: u32,
    /// The first address it covers, in the region.
    pub addr: u64,
    /// How many bytes it covers (more than 0).
    pub len: u64,
    /// What it grants a peer (remote read, write, atomic).
    pub access: Access,
}

/// What a send request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: consumes a receive at the peer.
    Send {
        /// Immediate data, delivered with the peer's receive completion.
        imm: Option<u32>,
    },
    /// SEND with invalidate (RC only): consumes a receive at the peer and invalidates the
    /// peer's window `rkey`, which must be bound to the receiving QP.
    SendWithInv {
        /// The key of the peer's window to invalidate.
        rkey: u32,
    },
    /// RDMA WRITE into the peer's memory; with immediate data it also consumes a receive.
    Write {
        /// Where, in the peer's memory.
        remote_addr: u64,
        /// The peer's key for it.
        rkey: u32,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// RDMA READ of the peer's memory into the local SGEs.
    Read {
        /// Where, in the peer's memory.
        remote_addr: u64,
        /// The peer's key for it.
        rkey: u32,
    },
    /// 8-byte compare-and-swap; the old value lands in the (8-byte) local SGE.
    CompareSwap {
        /// The word, 8-byte aligned.
        remote_addr: u64,
        /// The peer's key for it.
        rkey: u32,
        /// Swapped only if the word equals this.
        compare: u64,
        /// The new value.
        swap: u64,
    },
    /// 8-byte fetch-and-add; the old value lands in the (8-byte) local SGE.
    FetchAdd {
        /// The word, 8-byte aligned.
        remote_addr: u64,
        /// The peer's key for it.
        rkey: u32,
        /// What to add.
        add: u64,
    },
    /// Binds a type-2 window to a range of a local region, on this QP (a local operation:
    /// nothing goes to the peer).
    BindMw(Bind),
    /// Invalidates the local window with key `rkey` (a local operation).
    LocalInv {
        /// The window's present key.
        rkey: u32,
    },
}

/// A send request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// The caller's id, given back in the completion.
    pub wr_id: u64,
    /// What it does.
    pub op: SendOp,
    /// The local memory it sends from (SEND, WRITE) or lands in (READ, atomics).
    pub sges: Sges,
    /// Inline data: the bytes, copied at posting, instead of the SGEs (SEND, WRITE only).
    pub inline: Option<Payload>,
    /// Ask for a completion on success (errors always complete).
    pub signaled: bool,
    /// Fence: it starts (its bytes are gathered, its packet leaves) only once every READ and
    /// atomic posted before it has completed.
    pub fence: bool,
    /// Solicited event: the receive it consumes at the peer (a SEND, a WRITE with immediate
    /// data) wakes a CQ armed for solicited completions only.
    pub solicited: bool,
}

/// A receive request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// The caller's id, given back in the completion.
    pub wr_id: u64,
    /// Where a SEND's bytes land, in order.
    pub sges: Sges,
}

/// A completion's status (`enum ibv_wc_status`: the same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// Done.
    Success = 0,
    /// A received message was longer than the receive's buffers.
    LocLenErr = 1,
    /// A local operation could not be done (an invalidation of a key that names no bound
    /// window).
    LocQpOpErr = 2,
    /// A local key, range or right was wrong.
    LocProtErr = 4,
    /// Flushed: the QP went to ERROR before this request ran.
    WrFlushErr = 5,
    /// A window bind broke a rule (see [`crate::MrTable`]).
    MwBindErr = 6,
    /// The peer refused the request (an access right missing on its QP, a misaligned atomic,
    /// a receive buffer too short).
    RemInvReqErr = 9,
    /// The peer refused the remote key or range.
    RemAccessErr = 10,
    /// The peer could not execute the request.
    RemOpErr = 11,
    /// The peer did not answer (the link broke).
    RetryExcErr = 12,
    /// The peer had no receive posted, after every allowed retry.
    RnrRetryExcErr = 13,
    /// The peer answered a request with a response of another kind (a READ response to a
    /// SEND, an ACK past a READ): as rxe, the request fails and the QP goes to ERROR.
    FatalErr = 19,
}

/// What a completion is for (`enum ibv_wc_opcode`: the same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND.
    Send = 0,
    /// An RDMA WRITE.
    RdmaWrite = 1,
    /// An RDMA READ.
    RdmaRead = 2,
    /// A compare-and-swap.
    CompSwap = 3,
    /// A fetch-and-add.
    FetchAdd = 4,
    /// A window bind.
    BindMw = 5,
    /// A local invalidation.
    LocalInv = 6,
    /// A receive that took a SEND.
    Recv = 128,
    /// A receive that took an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

/// One completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: Status,
    /// What it was (meaningful on success; a flushed request gives its own kind anyway).
    pub opcode: WcOpcode,
    /// Bytes received (receives), read (READ) or 8 (atomics).
    pub byte_len: u32,
    /// Immediate data that came with a receive.
    pub imm: Option<u32>,
    /// The key a receive's SEND with invalidate invalidated.
    pub invalidated_rkey: Option<u32>,
    /// The QP it completed on.
    pub qp_num: u32,
    /// A UD receive: the sender's QP number (0 otherwise).
    pub src_qp: u32,
    /// A UD receive: the sender's LID (0 otherwise).
    pub slid: u16,
    /// A UD receive: its first 40 bytes are a GRH.
    pub grh: bool,
    /// It wakes a CQ armed for solicited completions only: a receive whose sender asked for
    /// it, or one that failed (as rxe posts them).
    pub solicited: bool,
}

impl SendWr {
    /// The completion opcode of this request.
    pub(crate) fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            SendOp::Send { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }

    /// Whether it carries the caller's bytes to the peer (SEND, SEND with invalidate, WRITE).
    pub(crate) fn moves_data(&self) -> bool {
        matches!(
            self.op,
            SendOp::Send { .. } | SendOp::SendWithInv { .. } | SendOp::Write { .. }
        )
    }

    /// Whether the peer answers it with data (a READ response, an atomic's old value), not
    /// with an ACK.
    pub(crate) fn wants_response(&self) -> bool {
        matches!(
            self.op,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// The bytes its local SGEs hold in total.
    pub(crate) fn sge_len(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.len)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(i: usize) -> Sge {
        Sge {
            addr: 0x1000 * i as u64,
            len: i as u32 + 1,
            lkey: 7,
        }
    }

    /// Short and long lists hold the same entries whichever way they were made, and compare
    /// by their entries only.
    #[test]
    fn sges_in_place_and_on_the_heap_hold_their_entries() {
        for n in 0..=Sges::IN_PLACE + 3 {
            let want: Vec<Sge> = (0..n).map(sge).collect();
            let made = [
                Sges::from_fn(n, sge),
                Sges::from_slice(&want),
                Sges::from(want.clone()),
            ];
            for list in &made {
                assert_eq!(&**list, &want[..], "{n} entries");
                assert_eq!(list, &made[0]);
            }
        }
        assert!(Sges::default().is_empty());
        assert_ne!(Sges::from([sge(1)]), Sges::from([sge(2)]));
    }
}
