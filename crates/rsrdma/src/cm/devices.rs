//! A reference on librdmacm's device contexts, so that a [`Context`](crate::Context) taken from
//! a CM id outlives the id.
//!
//! librdmacm opens each device's context itself and counts the ids (and device lists) using
//! it; when a device is removed, its context is closed once that count reaches zero. A context
//! handed out from an id therefore holds a reference of its own: the one `rdma_get_devices`
//! takes, released by `rdma_free_devices` after the last object made from the context.

use crate::error::{Error, Result};
use crate::ffi;

/// A device list from `rdma_get_devices`, holding a reference on every device in it (null
/// for the soft device, whose CM context lives as long as the process).
pub(super) struct DeviceListRef {
    list: *mut *mut ffi::ibv_context,
}

// SAFETY: the list is only read (under no lock: it is ours alone) and freed once;
// rdma_free_devices takes librdmacm's own lock.
unsafe impl Send for DeviceListRef {}
// SAFETY: as above.
unsafe impl Sync for DeviceListRef {}

impl DeviceListRef {
    /// Takes a reference on librdmacm's devices, checking that `verbs` is among them.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming `rdma_get_devices` (ENODEV when `verbs` is not listed: the
    /// device was removed).
    pub(super) fn holding(verbs: *mut ffi::ibv_context) -> Result<DeviceListRef> {
        // SAFETY: `verbs` is a live context (the id's).
        if unsafe { crate::soft::is_context(verbs) } {
            return Ok(DeviceListRef {
                list: std::ptr::null_mut(),
            });
        }
        // SAFETY: no preconditions; a null count pointer is allowed.
        let list = unsafe { ffi::rdma_get_devices(std::ptr::null_mut()) };
        if list.is_null() {
            return Err(Error::last_os("rdma_get_devices"));
        }
        let held = DeviceListRef { list };
        if !held.contains(verbs) {
            return Err(Error::Verbs {
                op: "rdma_get_devices",
                errno: libc::ENODEV,
            });
        }
        Ok(held)
    }

    fn contains(&self, verbs: *mut ffi::ibv_context) -> bool {
        let mut at = self.list;
        loop {
            // SAFETY: the list is NULL-terminated and lives until we free it.
            let entry = unsafe { *at };
            if entry.is_null() {
                return false;
            }
            if entry == verbs {
                return true;
            }
            // SAFETY: `entry` was not the terminator, so the next slot exists.
            at = unsafe { at.add(1) };
        }
    }
}

impl Drop for DeviceListRef {
    fn drop(&mut self) {
        if self.list.is_null() {
            return;
        }
        // SAFETY: the list came from rdma_get_devices and is freed once.
        unsafe { ffi::rdma_free_devices(self.list) }
    }
}
