//! Work-request ids, decoded in one place: the kind must be in the id, since a failed
//! completion has no valid opcode. Send WR ids are the protocol core's sequence numbers
//! (below [`POOL_TAG`]); receive ids carry [`RECV_TAG`] and the slot they fill.

/// Receive WR ids carry this bit; send WR ids are the core's sequence numbers. The kind must
/// be in the id: a failed completion has no valid opcode.
pub(crate) const RECV_TAG: u64 = 1 << 63;
/// Receive WR ids of pool slots carry this bit too, with the pool slot below it; those of a
/// connection's own slots carry the slot number.
pub(crate) const POOL_TAG: u64 = 1 << 62;
/// The WR id of an rdma_cm authentication proof's send (`establish::cm_auth`), posted before
/// the core starts: below the receive tags, and far above any core sequence number the
/// connection reaches. The driver reaps and ignores its completion.
pub(crate) const AUTH_WR_ID: u64 = POOL_TAG - 1;

/// The WR id of a receive into own slot `slot`.
pub(crate) fn recv_wr_id(slot: u16) -> u64 {
    RECV_TAG | u64::from(slot)
}

/// The pool slot a pool receive's WR id names.
pub(crate) fn pool_slot_of(wr_id: u64) -> Option<u32> {
    (wr_id & (RECV_TAG | POOL_TAG) == RECV_TAG | POOL_TAG).then_some(wr_id as u32)
}
