//! Work requests: what is posted to a send or receive queue.
//!
//! [`SendWr`] and [`RecvWr`] are laid out exactly as `ibv_send_wr` / `ibv_recv_wr`, so posting
//! one, or a slice of them, hands the caller's memory to the provider with no conversion and
//! no allocation. They borrow the scatter/gather list (and the address handle, for UD) they
//! name, so those cannot be dropped while the request is being built or posted. The memory the
//! SGEs point at is another matter: see the `# Safety` contract of the posting calls.

use crate::ah::Ah;
use crate::error::{Error, Result};
use crate::ffi;
use crate::mr::{AccessFlags, Mr};
use crate::mw::Mw;
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::ptr;

/// A scatter/gather entry: `length` bytes at `addr`, in the memory region whose local key is
/// `lkey`. Make one with [`crate::Mr::sge`] (bounds-checked) or [`Sge::new`].
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct Sge(ffi::ibv_sge);

impl PartialEq for Sge {
    #[inline]
    fn eq(&self, other: &Sge) -> bool {
        (self.0.addr, self.0.length, self.0.lkey) == (other.0.addr, other.0.length, other.0.lkey)
    }
}

impl Eq for Sge {}

impl Sge {
    /// An entry from raw parts.
    #[inline]
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge(ffi::ibv_sge { addr, length, lkey })
    }

    /// An entry over plain memory, for [`SendWr::inline`] sends: the provider copies inline
    /// data at post time, so it needs no registration (the key is ignored).
    #[inline]
    pub fn inline(data: &[u8]) -> Sge {
        Sge::new(data.as_ptr() as u64, data.len() as u32, 0)
    }

    /// Start address.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.0.addr
    }

    /// Length in bytes.
    #[inline]
    pub fn length(&self) -> u32 {
        self.0.length
    }

    /// Local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.0.lkey
    }
}

impl fmt::Debug for Sge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Sge({:#x}+{}, lkey {:#x})",
            self.0.addr, self.0.length, self.0.lkey
        )
    }
}

/// A send-queue work request. Build it with one of the opcode constructors, then adjust flags:
///
/// ```no_run
/// # fn f(mr: &rsrdma::Mr, peer: rsrdma::RemoteMemory) -> rsrdma::Result<()> {
/// use rsrdma::SendWr;
/// let sge = [mr.sge(0, 4096)?];
/// let wr = SendWr::rdma_write(7, &sge, peer.addr, peer.rkey).unsignaled();
/// # let _ = wr; Ok(()) }
/// ```
///
/// Requests are signaled by default (a completion is generated); [`SendWr::unsignaled`]
/// turns that off for selective signaling.
///
/// Invariant: the C struct's `next` is null, except inside a batch post (which links the
/// slice, posts it and unlinks it). So a single post hands the request to the provider in
/// place, without a copy.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct SendWr<'a> {
    raw: ffi::ibv_send_wr,
    _borrows: PhantomData<(&'a [Sge], &'a Ah)>,
}

// SAFETY: the raw pointers inside point at the borrowed SGE slice and AH, which are Sync.
unsafe impl Send for SendWr<'_> {}
// SAFETY: as above.
unsafe impl Sync for SendWr<'_> {}

impl<'a> SendWr<'a> {
    #[inline]
    fn with(wr_id: u64, opcode: ffi::ibv_wr_opcode, sges: &'a [Sge]) -> Self {
        // Zeroed in place rather than through bindgen's `Default`, which is not inlined across
        // crates: building a request is on the hot path (see `cargo xtask bench overhead`).
        // SAFETY: `ibv_send_wr` is plain C data; all-zero is a valid value of every field.
        let mut raw: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        raw.wr_id = wr_id;
        raw.sg_list = sges.as_ptr() as *mut ffi::ibv_sge;
        // More SGEs than an i32 holds would be refused by any device; saturate so the provider
        // reports it instead of wrapping to a small count.
        raw.num_sge = i32::try_from(sges.len()).unwrap_or(i32::MAX);
        raw.opcode = opcode;
        raw.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        SendWr {
            raw,
            _borrows: PhantomData,
        }
    }

    /// A send: the peer consumes a receive request.
    #[inline]
    pub fn send(wr_id: u64, sges: &'a [Sge]) -> Self {
        Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_SEND, sges)
    }

    /// A send carrying 32 bits of immediate data (host order) to the receiver's completion.
    #[inline]
    pub fn send_with_imm(wr_id: u64, sges: &'a [Sge], imm: u32) -> Self {
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, sges);
        wr.raw.__bindgen_anon_1.imm_data = imm.to_be();
        wr
    }

    /// A one-sided write of the local SGEs to `remote_addr` in the peer's region `rkey`.
    #[inline]
    pub fn rdma_write(wr_id: u64, sges: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE, sges);
        wr.raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        wr
    }

    /// A one-sided write that also consumes a receive request at the peer and delivers `imm`
    /// (host order) in its completion.
    #[inline]
    pub fn rdma_write_with_imm(
        wr_id: u64,
        sges: &'a [Sge],
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    ) -> Self {
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, sges);
        wr.raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        wr.raw.__bindgen_anon_1.imm_data = imm.to_be();
        wr
    }

    /// A one-sided read of the peer's memory into the local SGEs.
    #[inline]
    pub fn rdma_read(wr_id: u64, sges: &'a [Sge], remote_addr: u64, rkey: u32) -> Self {
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_RDMA_READ, sges);
        wr.raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        wr
    }

    /// Binds type-2 window `mw` to `len` bytes at `addr` of region `mr` (registered with
    /// [`crate::AccessFlags::MW_BIND`]) under the new key `rkey` ([`Mw::next_rkey`]), granting
    /// `access` (remote read and/or write) to requests arriving on the queue pair this is posted
    /// on. Later requests on that queue pair are processed after the bind; after posting it,
    /// record the key with [`Mw::set_rkey`].
    ///
    /// A window may grant no more than its region could itself: remote write or atomic access
    /// is refused unless the region was registered remotely writable (so that safe code never
    /// holds a reference to bytes a peer can change through a window; see
    /// [`Mr::remotely_writable`]).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] when `mr` was not registered with `MW_BIND`, when the
    /// range is not inside `mr`, or when `access` grants remote write or atomics on a region
    /// that is not remotely writable.
    #[inline]
    pub fn bind_mw(
        wr_id: u64,
        mw: &'a Mw,
        rkey: u32,
        mr: &'a Mr,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> crate::Result<Self> {
        let refuse = |why: String| Err(crate::Error::InvalidArgument(format!("bind_mw: {why}")));
        if !mr.access().contains(AccessFlags::MW_BIND) {
            return refuse("the region was not registered with MW_BIND".into());
        }
        let start = mr.addr();
        let inside = addr >= start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= start + mr.len() as u64);
        if !inside {
            return refuse(format!(
                "{addr:#x}+{len} is not inside the region at {start:#x} of {} bytes",
                mr.len()
            ));
        }
        let writes = access.contains(AccessFlags::REMOTE_WRITE)
            || access.contains(AccessFlags::REMOTE_ATOMIC);
        if writes && !mr.remotely_writable() {
            return refuse(
                "remote write or atomic access through a window needs a region registered \
                 remotely writable (REMOTE_WRITE or REMOTE_ATOMIC): safe code may hold \
                 references to this region's bytes"
                    .into(),
            );
        }
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_BIND_MW, &[]);
        wr.raw.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw: mw.as_raw(),
            rkey,
            bind_info: ffi::ibv_mw_bind_info {
                mr: mr.as_raw().unwrap_or(std::ptr::null_mut()),
                addr,
                length: len,
                mw_access_flags: access.bits(),
            },
        };
        Ok(wr)
    }

    /// Invalidates the window (or fast-registered region) whose present key is `rkey`: from its
    /// completion on, requests naming the key fail, and a window may be bound again.
    #[inline]
    pub fn local_inv(wr_id: u64, rkey: u32) -> Self {
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_LOCAL_INV, &[]);
        wr.raw.__bindgen_anon_1.invalidate_rkey = rkey;
        wr
    }

    /// Atomic compare-and-swap of the 8 bytes at `remote_addr` (8-byte aligned): if they equal
    /// `compare` they become `swap`. The original value lands in the 8-byte local SGE.
    #[inline]
    pub fn atomic_cmp_swap(
        wr_id: u64,
        sge: &'a [Sge],
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    ) -> Self {
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, sge);
        wr.raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr,
            compare_add: compare,
            swap,
            rkey,
        };
        wr
    }

    /// Atomic fetch-and-add of `add` to the 8 bytes at `remote_addr` (8-byte aligned). The
    /// original value lands in the 8-byte local SGE.
    #[inline]
    pub fn atomic_fetch_add(
        wr_id: u64,
        sge: &'a [Sge],
        remote_addr: u64,
        rkey: u32,
        add: u64,
    ) -> Self {
        let mut wr = Self::with(wr_id, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, sge);
        wr.raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr,
            compare_add: add,
            swap: 0,
            rkey,
        };
        wr
    }

    /// Addresses a UD send: the destination's address handle, QP number and Q_Key.
    #[inline]
    pub fn ud(mut self, ah: &'a Ah, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.raw.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: ah.raw_ptr(),
            remote_qpn,
            remote_qkey,
        };
        self
    }

    #[inline]
    fn set_flag(mut self, flag: ffi::ibv_send_flags, on: bool) -> Self {
        if on {
            self.raw.send_flags |= flag.0;
        } else {
            self.raw.send_flags &= !flag.0;
        }
        self
    }

    /// No completion unless it fails (selective signaling). The send queue still needs a
    /// signaled request now and then, or its slots are never freed.
    #[inline]
    pub fn unsignaled(self) -> Self {
        self.set_flag(ffi::ibv_send_flags::IBV_SEND_SIGNALED, false)
    }

    /// Generate a completion (the default).
    #[inline]
    pub fn signaled(self, on: bool) -> Self {
        self.set_flag(ffi::ibv_send_flags::IBV_SEND_SIGNALED, on)
    }

    /// Copy the payload into the work request at post time (small sends; the SGE memory needs
    /// no registration and may be reused as soon as the post returns).
    #[inline]
    pub fn inline(self) -> Self {
        self.set_flag(ffi::ibv_send_flags::IBV_SEND_INLINE, true)
    }

    /// Wake a peer that armed its CQ for solicited events only.
    #[inline]
    pub fn solicited(self) -> Self {
        self.set_flag(ffi::ibv_send_flags::IBV_SEND_SOLICITED, true)
    }

    /// Wait for earlier RDMA reads and atomics to finish before this one starts.
    #[inline]
    pub fn fence(self) -> Self {
        self.set_flag(ffi::ibv_send_flags::IBV_SEND_FENCE, true)
    }

    /// The id completions will carry.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    /// Changes the id (reusing a built request in a loop).
    #[inline]
    pub fn set_wr_id(&mut self, wr_id: u64) {
        self.raw.wr_id = wr_id;
    }

    /// True if a completion will be generated.
    #[inline]
    pub fn is_signaled(&self) -> bool {
        self.raw.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0
    }

    /// True if the payload is sent inline.
    #[inline]
    pub fn is_inline(&self) -> bool {
        self.raw.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0
    }

    /// Total payload bytes over all SGEs.
    #[inline]
    pub fn payload_len(&self) -> u64 {
        self.sges().iter().map(|s| u64::from(s.length())).sum()
    }

    /// The scatter/gather list.
    #[inline]
    pub fn sges(&self) -> &'a [Sge] {
        if self.raw.num_sge <= 0 || self.raw.sg_list.is_null() {
            return &[];
        }
        // SAFETY: sg_list/num_sge were set from a `&'a [Sge]` (Sge is repr(transparent) over
        // ibv_sge).
        unsafe {
            std::slice::from_raw_parts(self.raw.sg_list as *const Sge, self.raw.num_sge as usize)
        }
    }

    #[cfg(test)]
    #[inline]
    pub(crate) fn opcode(&self) -> ffi::ibv_wr_opcode {
        self.raw.opcode
    }

    /// The raw `ibv_send_wr`.
    #[inline]
    pub fn as_raw(&self) -> &ffi::ibv_send_wr {
        &self.raw
    }
}

impl fmt::Debug for SendWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.raw.wr_id)
            .field("opcode", &self.raw.opcode.0)
            .field("send_flags", &format_args!("{:#x}", self.raw.send_flags))
            .field("sges", &self.sges())
            .finish()
    }
}

/// A receive-queue work request: where the next incoming send (or write with immediate) lands.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct RecvWr<'a> {
    raw: ffi::ibv_recv_wr,
    _borrows: PhantomData<&'a [Sge]>,
}

// SAFETY: the raw pointer inside points at the borrowed SGE slice, which is Sync.
unsafe impl Send for RecvWr<'_> {}
// SAFETY: as above.
unsafe impl Sync for RecvWr<'_> {}

impl<'a> RecvWr<'a> {
    /// A receive into `sges` (which may be empty for a write-with-immediate that carries no
    /// payload here). On UD the first 40 bytes receive the GRH.
    #[inline]
    pub fn new(wr_id: u64, sges: &'a [Sge]) -> Self {
        RecvWr {
            raw: ffi::ibv_recv_wr {
                wr_id,
                next: std::ptr::null_mut(),
                sg_list: sges.as_ptr() as *mut ffi::ibv_sge,
                num_sge: i32::try_from(sges.len()).unwrap_or(i32::MAX),
            },
            _borrows: PhantomData,
        }
    }

    /// The id the completion will carry.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    /// Changes the id.
    #[inline]
    pub fn set_wr_id(&mut self, wr_id: u64) {
        self.raw.wr_id = wr_id;
    }

    /// The scatter/gather list.
    #[inline]
    pub fn sges(&self) -> &'a [Sge] {
        if self.raw.num_sge <= 0 || self.raw.sg_list.is_null() {
            return &[];
        }
        // SAFETY: set from a `&'a [Sge]`.
        unsafe {
            std::slice::from_raw_parts(self.raw.sg_list as *const Sge, self.raw.num_sge as usize)
        }
    }

    /// The raw `ibv_recv_wr`.
    #[inline]
    pub fn as_raw(&self) -> &ffi::ibv_recv_wr {
        &self.raw
    }
}

impl fmt::Debug for RecvWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvWr")
            .field("wr_id", &self.raw.wr_id)
            .field("sges", &self.sges())
            .finish()
    }
}

/// A request type that posts as a C list linked through `next`.
pub(crate) trait Linked: Sized {
    /// The C struct (`ibv_send_wr`, `ibv_recv_wr`).
    type Raw;

    /// Sets the `next` pointer of the request at `wr`.
    ///
    /// # Safety
    /// `wr` points to a live, writable request.
    unsafe fn set_next(wr: *mut Self, next: *mut Self);
}

impl Linked for SendWr<'_> {
    type Raw = ffi::ibv_send_wr;

    #[inline(always)]
    unsafe fn set_next(wr: *mut Self, next: *mut Self) {
        // SAFETY: the caller vouches for `wr`; SendWr is repr(transparent) over the C struct.
        unsafe { (*wr).raw.next = next.cast() }
    }
}

impl Linked for RecvWr<'_> {
    type Raw = ffi::ibv_recv_wr;

    #[inline(always)]
    unsafe fn set_next(wr: *mut Self, next: *mut Self) {
        // SAFETY: as for SendWr.
        unsafe { (*wr).raw.next = next.cast() }
    }
}

/// Posts `wrs` as one list with one call of `post` (the verb, given the list's head and where
/// to store the request it rejects). Each request is linked to the next in the same pass
/// that `check`s it; the list ends before the first one refused. After the call the links are
/// cleared again, so `next` is null outside this function and a single post can hand a
/// request over in place (a stale link would post a stale list).
///
/// # Errors
/// `check`'s error when it refuses the first request (nothing posted). Otherwise
/// [`Error::Post`] naming `op`, with the index of the first request not posted: the one the
/// provider rejected (the list's length when it names none), or else the first refused by
/// `check` (errno EINVAL), the requests before it having been posted.
#[inline(always)]
pub(crate) fn post_list<W: Linked>(
    op: &'static str,
    wrs: &mut [W],
    mut check: impl FnMut(&W) -> Result<()>,
    post: impl FnOnce(*mut W::Raw, &mut *mut W::Raw) -> c_int,
) -> Result<()> {
    let count = wrs.len();
    // Everything below goes through `first`, not `wrs`: the list points into the slice.
    let first = wrs.as_mut_ptr();
    // SAFETY: one past the slice's end.
    let end = unsafe { first.add(count) };
    let mut wr = first;
    while wr != end {
        // SAFETY: a request of the slice; the reference ends before the write below.
        if let Err(e) = check(unsafe { &*wr }) {
            if wr == first {
                return Err(e);
            }
            break;
        }
        // SAFETY: `wr` is in the slice, so one past it is in the slice or its end; the last
        // link is replaced by null below.
        let next = unsafe { wr.add(1) };
        // SAFETY: `wr` is in the slice.
        unsafe { W::set_next(wr, next) };
        wr = next;
    }
    // SAFETY: `wr` is in the slice or its end, not before `first`.
    let linked = unsafe { wr.offset_from(first) } as usize;
    if linked == 0 {
        return Ok(());
    }
    // SAFETY: the last request linked, in the slice.
    unsafe { W::set_next(wr.sub(1), ptr::null_mut()) };
    let mut bad = ptr::null_mut();
    let rc = post(first.cast(), &mut bad);
    for i in 0..linked - 1 {
        // SAFETY: in the slice; the provider has returned, so the list is no longer read.
        unsafe { W::set_next(first.add(i), ptr::null_mut()) };
    }
    if rc != 0 {
        // Compared as integers: a `bad` outside the list names no request of it.
        let size = std::mem::size_of::<W>();
        let offset = (bad as usize).wrapping_sub(first as usize);
        let index = if offset < linked * size {
            offset / size
        } else {
            linked
        };
        return Err(Error::Post {
            op,
            index,
            count,
            errno: rc.abs(),
        });
    }
    if linked < count {
        return Err(Error::Post {
            op,
            index: linked,
            count,
            errno: libc::EINVAL,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_the_c_structs() {
        use std::mem::size_of;
        assert_eq!(size_of::<Sge>(), size_of::<ffi::ibv_sge>());
        assert_eq!(size_of::<SendWr<'_>>(), size_of::<ffi::ibv_send_wr>());
        assert_eq!(size_of::<RecvWr<'_>>(), size_of::<ffi::ibv_recv_wr>());
    }

    #[test]
    fn send_builders_set_opcode_flags_and_remote_fields() {
        let sges = [Sge::new(0x1000, 64, 5), Sge::new(0x2000, 32, 5)];
        let wr = SendWr::rdma_write_with_imm(9, &sges, 0xdead_0000, 77, 0xabcd);
        assert_eq!(wr.opcode(), ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert!(wr.is_signaled());
        assert_eq!(wr.payload_len(), 96);
        // SAFETY: the constructor wrote the rdma view of the union and the imm view.
        unsafe {
            assert_eq!(wr.as_raw().wr.rdma.remote_addr, 0xdead_0000);
            assert_eq!(wr.as_raw().wr.rdma.rkey, 77);
            assert_eq!(u32::from_be(wr.as_raw().__bindgen_anon_1.imm_data), 0xabcd);
        }
        let wr = wr.unsignaled().inline().fence();
        assert!(!wr.is_signaled() && wr.is_inline());
        assert_eq!(
            wr.as_raw().send_flags & ffi::ibv_send_flags::IBV_SEND_FENCE.0,
            1
        );
    }

    #[test]
    fn atomics_fill_the_atomic_view() {
        let sge = [Sge::new(0x1000, 8, 1)];
        let wr = SendWr::atomic_cmp_swap(1, &sge, 0x4000, 3, 10, 20);
        // SAFETY: the constructor wrote the atomic view.
        let a = unsafe { wr.as_raw().wr.atomic };
        assert_eq!(
            (a.remote_addr, a.rkey, a.compare_add, a.swap),
            (0x4000, 3, 10, 20)
        );
        let wr = SendWr::atomic_fetch_add(2, &sge, 0x4008, 3, 5);
        // SAFETY: as above.
        let a = unsafe { wr.as_raw().wr.atomic };
        assert_eq!((a.remote_addr, a.compare_add), (0x4008, 5));
        assert_eq!(wr.opcode(), ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD);
    }

    #[test]
    fn requests_are_built_unchained() {
        // Single posts hand the request to the provider in place: `next` must be null.
        let sges = [Sge::new(1, 1, 1)];
        for wr in [
            SendWr::send(1, &sges),
            SendWr::rdma_write(2, &sges, 0x1000, 7),
            SendWr::send_with_imm(3, &sges, 9).unsignaled(),
        ] {
            assert!(wr.as_raw().next.is_null());
        }
        assert!(RecvWr::new(3, &[]).as_raw().next.is_null());
    }

    /// A provider for [`post_list`]: walks the list as one would, recording the wr_ids, and
    /// rejects the request with id `reject` (or, for `u64::MAX`, fails naming none).
    fn walk<'s, R: 's>(
        seen: &'s mut Vec<u64>,
        reject: Option<u64>,
        link: fn(&R) -> (u64, *mut R),
    ) -> impl FnOnce(*mut R, &mut *mut R) -> c_int + 's {
        move |mut wr, bad| {
            while !wr.is_null() {
                assert!(seen.len() < 1000, "a list without an end");
                // SAFETY: `post_list` hands over a list of live requests ending in null.
                let (id, next) = link(unsafe { &*wr });
                seen.push(id);
                if reject == Some(id) {
                    *bad = wr;
                    return libc::EINVAL;
                }
                wr = next;
            }
            if reject == Some(u64::MAX) {
                return libc::EINVAL;
            }
            0
        }
    }

    fn send_link(w: &ffi::ibv_send_wr) -> (u64, *mut ffi::ibv_send_wr) {
        (w.wr_id, w.next)
    }

    fn sends(sges: &[Sge], n: u64) -> Vec<SendWr<'_>> {
        (0..n).map(|id| SendWr::send(id, sges)).collect()
    }

    fn unlinked(wrs: &[SendWr<'_>]) -> bool {
        wrs.iter().all(|w| w.as_raw().next.is_null())
    }

    #[test]
    fn a_list_is_posted_once_in_slice_order_and_unlinked_after() {
        let sges = [Sge::new(1, 1, 1)];
        let mut wrs = sends(&sges, 64);
        let (mut seen, mut calls) = (vec![], 0);
        let post = walk(&mut seen, None, send_link);
        let r = post_list(
            "post",
            &mut wrs,
            |_| Ok(()),
            |l, b| {
                calls += 1;
                post(l, b)
            },
        );
        r.unwrap();
        assert_eq!(calls, 1);
        assert_eq!(seen, (0..64).collect::<Vec<u64>>());
        assert!(
            unlinked(&wrs),
            "a single post of one of them must not post a stale list"
        );
    }

    #[test]
    fn a_rejected_request_is_reported_by_index() {
        let sges = [Sge::new(1, 1, 1)];
        let mut wrs = sends(&sges, 64);
        let mut seen = vec![];
        let e = post_list(
            "post",
            &mut wrs,
            |_| Ok(()),
            walk(&mut seen, Some(37), send_link),
        );
        assert!(
            matches!(
                e,
                Err(Error::Post {
                    index: 37,
                    count: 64,
                    errno: libc::EINVAL,
                    ..
                })
            ),
            "{e:?}"
        );
        assert!(unlinked(&wrs));
        let e = post_list(
            "post",
            &mut wrs,
            |_| Ok(()),
            walk(&mut seen, Some(u64::MAX), send_link),
        );
        assert!(
            matches!(e, Err(Error::Post { index: 64, .. })),
            "no request named: the list's length, {e:?}"
        );
    }

    #[test]
    fn a_refused_request_ends_the_list_and_the_prefix_is_posted() {
        let sges = [Sge::new(1, 1, 1)];
        let refuse_5 = |w: &SendWr<'_>| match w.wr_id() {
            5 => Err(Error::InvalidArgument("no".into())),
            _ => Ok(()),
        };
        let mut wrs = sends(&sges, 8);
        let mut seen = vec![];
        let e = post_list("post", &mut wrs, refuse_5, walk(&mut seen, None, send_link));
        assert!(
            matches!(
                e,
                Err(Error::Post {
                    index: 5,
                    count: 8,
                    errno: libc::EINVAL,
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(seen, [0, 1, 2, 3, 4]);
        assert!(unlinked(&wrs));

        // The provider's rejection inside the prefix wins: the first request not posted.
        let mut seen = vec![];
        let e = post_list(
            "post",
            &mut wrs,
            refuse_5,
            walk(&mut seen, Some(2), send_link),
        );
        assert!(
            matches!(
                e,
                Err(Error::Post {
                    index: 2,
                    count: 8,
                    ..
                })
            ),
            "{e:?}"
        );
        assert!(unlinked(&wrs));

        // Refusing the first posts nothing and returns the check's own error.
        let mut calls = 0;
        let e = post_list("post", &mut wrs[5..], refuse_5, |_, _| {
            calls += 1;
            0
        });
        assert!(matches!(e, Err(Error::InvalidArgument(_))), "{e:?}");
        assert_eq!(calls, 0);
    }

    #[test]
    fn an_empty_list_posts_nothing() {
        let mut calls = 0;
        let r = post_list::<RecvWr<'_>>(
            "post",
            &mut [],
            |_| Ok(()),
            |_, _| {
                calls += 1;
                libc::EINVAL
            },
        );
        assert!(r.is_ok());
        assert_eq!(calls, 0);
    }

    #[test]
    fn receive_lists_are_linked_the_same_way() {
        let mut wrs: Vec<RecvWr<'_>> = (0..8).map(|id| RecvWr::new(id, &[])).collect();
        let mut seen = vec![];
        let link: fn(&ffi::ibv_recv_wr) -> _ = |w| (w.wr_id, w.next);
        let e = post_list("post", &mut wrs, |_| Ok(()), walk(&mut seen, Some(5), link));
        assert!(
            matches!(
                e,
                Err(Error::Post {
                    index: 5,
                    count: 8,
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
        assert!(wrs.iter().all(|w| w.as_raw().next.is_null()));
    }
}
