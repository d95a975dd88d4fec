//! Memory another device exports as a DMA-BUF, registered for RDMA (`ibv_reg_dmabuf_mr`):
//! GPU memory, above all, so that a NIC reads and writes it with no copy through host memory
//! (GPUDirect RDMA over the kernel's dma-buf framework, no vendor peer-memory module).
//!
//! The exporter gives the file descriptor: CUDA's `cuMemGetHandleForAddressRange` with
//! `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD` (the range page-aligned), ROCm's
//! `hsa_amd_portable_export_dmabuf`, or `/dev/udmabuf` over a memfd. perftest's
//! `--use_cuda_dmabuf` does the same. The region has no host address: its work requests name
//! it by `iova` (the address the NIC is told the first byte has), so [`DmabufMr::sge`] and
//! [`DmabufMr::remote`] count from there, and nothing here reads or writes its bytes from
//! the CPU.
//!
//! Devices without it refuse with [`Error::Unsupported`] (rxe, soft0; mlx5 supports it from
//! rdma-core 34 and Linux 5.12).

use crate::error::{Error, Result};
use crate::ffi;
use crate::mr::{AccessFlags, RemoteMemory};
use crate::pd::Pd;
use crate::wr::Sge;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A registered DMA-BUF region. Keeps its [`Pd`] alive; deregistered on drop.
pub struct DmabufMr {
    raw: *mut ffi::ibv_mr,
    iova: u64,
    len: usize,
    access: AccessFlags,
    pd: Pd,
}

// SAFETY: an immutable verbs handle; the memory behind it is not reachable from here.
unsafe impl Send for DmabufMr {}
// SAFETY: as above.
unsafe impl Sync for DmabufMr {}

impl DmabufMr {
    /// Registers `len` bytes at `offset` in the DMA-BUF `fd`, which work requests then name by
    /// addresses from `iova` on, with `access`. The kernel holds its own reference on the
    /// DMA-BUF, so `fd` may be closed afterwards.
    ///
    /// # Safety
    /// The exporter's memory behind `offset..offset+len` must stay allocated (the GPU
    /// allocation not freed) until this region is dropped and every work request naming it
    /// has completed: the NIC reads and writes it outside Rust's view. Nothing may rely on
    /// its contents while a peer with `REMOTE_WRITE` access may write it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero length, an offset range past `u64`, or access
    /// flags the verbs refuse; [`Error::Unsupported`] naming `ibv_reg_dmabuf_mr` where the
    /// device, its provider or the kernel cannot register DMA-BUFs (EOPNOTSUPP/ENOSYS);
    /// [`Error::Verbs`] for the rest (EBADF: not a DMA-BUF; EINVAL: a range past its end).
    pub unsafe fn register(
        pd: &Pd,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DmabufMr> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a DMA-BUF region needs at least one byte".into(),
            ));
        }
        if offset.checked_add(len as u64).is_none() || iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument(format!(
                "a DMA-BUF region of {len} bytes at offset {offset} (iova {iova:#x}) runs past \
                 the 64-bit range"
            )));
        }
        access.validate()?;
        // SAFETY: a live PD; the caller keeps the exported memory allocated for the region's
        // life; the fd is open for the call (borrowed).
        let raw = unsafe {
            ffi::ibv_reg_dmabuf_mr(
                pd.inner.raw,
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access.bits() as i32,
            )
        };
        if raw.is_null() {
            return Err(Error::last_os("ibv_reg_dmabuf_mr"));
        }
        Ok(DmabufMr {
            raw,
            iova,
            len,
            access,
            pd: pd.clone(),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address work requests give its first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live registration.
        unsafe { (*self.raw).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: a live registration.
        unsafe { (*self.raw).rkey }
    }

    /// The access it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain it is registered in.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The descriptor a peer needs for one-sided access (from [`DmabufMr::iova`]).
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.iova,
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is outside the region or longer than 4 GiB.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        crate::mr::region_sge(self.iova, self.len, self.lkey(), offset, len)
    }

    /// The raw `ibv_mr`.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw
    }
}

impl Drop for DmabufMr {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once.
        let rc = unsafe { ffi::ibv_dereg_mr(self.raw) };
        if rc != 0 {
            tracing::error!(
                rc,
                iova = self.iova,
                "ibv_dereg_mr of a DMA-BUF region failed"
            );
        }
    }
}

impl fmt::Debug for DmabufMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmabufMr")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}
