//! Access rights of a memory region or of a queue pair's responder (`ibv_access_flags`).

use std::ops::BitOr;

/// Access rights, with libibverbs' bit values, so the device passes them through unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    /// No access beyond local read.
    pub const NONE: Access = Access(0);
    /// The NIC may write the memory for local operations (a receive, a READ's response).
    pub const LOCAL_WRITE: Access = Access(1);
    /// A peer may RDMA WRITE it.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// A peer may RDMA READ it.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// A peer may run atomics on it.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Memory windows may be bound to the region.
    pub const MW_BIND: Access = Access(1 << 4);
    /// A window's addresses count from its start, not the region's virtual addresses (which
    /// soft0 does not do: a bind asking for it fails).
    pub const ZERO_BASED: Access = Access(1 << 5);

    /// Whether every right of `other` is in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any right of `other` is in `self`.
    pub fn intersects(self, other: Access) -> bool {
        self.0 & other.0 != 0
    }
}

impl BitOr for Access {
    type Output = Access;

    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}
