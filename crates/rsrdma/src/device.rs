//! Finding RDMA devices.
//!
//! [`devices`] lists them; [`open`] opens one by name. A machine with no RDMA stack gives
//! [`Error::Unsupported`] (libibverbs reports ENOSYS), never an empty list that hides why.
//!
//! The software device `soft0` (queue pairs between processes of one machine; see the guide) opens by name
//! anywhere, and is listed after the hardware ones when `RSRDMA_SOFT_DEVICE=1` (then a machine
//! without an RDMA stack lists it alone).

use crate::context::Context;
use crate::error::{Error, Result};
use crate::ffi;
use std::ffi::CStr;
use std::ptr::NonNull;

/// The list of RDMA devices, as `ibv_get_device_list` returns it. Freed on drop; contexts
/// opened from its devices stay valid after that (libibverbs refcounts the device).
pub struct DeviceList {
    /// libibverbs' list (`None` without an RDMA stack, when only `soft0` is listed).
    list: Option<NonNull<*mut ffi::ibv_device>>,
    len: usize,
    /// `soft0` is listed after libibverbs' devices.
    soft: bool,
}

// SAFETY: the list is an immutable array of device pointers; libibverbs' device objects are
// safe to read and open from any thread.
unsafe impl Send for DeviceList {}
// SAFETY: as above, nothing in it is mutated after creation.
unsafe impl Sync for DeviceList {}

/// One device of a [`DeviceList`].
#[derive(Clone, Copy)]
pub struct Device<'list> {
    raw: *mut ffi::ibv_device,
    _list: std::marker::PhantomData<&'list DeviceList>,
}

/// Lists the RDMA devices.
///
/// # Errors
/// [`Error::Unsupported`] when the machine has no RDMA stack (ENOSYS/ENODEV), with a hint to
/// the VM command; [`Error::Verbs`] for any other failure.
pub fn devices() -> Result<DeviceList> {
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-pointer; the call returns an owned array or NULL.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    let soft = crate::soft::listed();
    match NonNull::new(list) {
        Some(list) => Ok(DeviceList {
            list: Some(list),
            len: n.max(0) as usize,
            soft,
        }),
        None => {
            let e = Error::last_os("ibv_get_device_list");
            if soft {
                return Ok(DeviceList {
                    list: None,
                    len: 0,
                    soft,
                });
            }
            Err(e)
        }
    }
}

/// Opens the device called `name` (e.g. `mlx5_0`, `rxe0`).
///
/// # Errors
/// [`Error::NoDevice`] naming the devices that do exist, or the errors of [`devices`] and
/// [`Context::open`].
pub fn open(name: &str) -> Result<Context> {
    if name.as_bytes() == crate::soft::DEVICE_NAME.to_bytes() {
        return Context::open(&Device {
            raw: crate::soft::device_ptr(),
            _list: std::marker::PhantomData,
        });
    }
    let list = devices()?;
    let dev = list.find(name).ok_or_else(|| Error::NoDevice {
        name: name.to_owned(),
        available: list
            .iter()
            .map(|d| d.name().to_owned())
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    Context::open(&dev)
}

impl DeviceList {
    /// How many devices there are.
    pub fn len(&self) -> usize {
        self.len + usize::from(self.soft)
    }

    /// True when the stack is there but has no device.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The devices, in the library's order (then `soft0`, when it is listed).
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        let hardware = self.list.into_iter().flat_map(move |list| {
            (0..self.len).map(move |i| Device {
                // SAFETY: i < len, the number of entries ibv_get_device_list reported.
                raw: unsafe { *list.as_ptr().add(i) },
                _list: std::marker::PhantomData,
            })
        });
        let soft = self.soft.then(|| Device {
            raw: crate::soft::device_ptr(),
            _list: std::marker::PhantomData,
        });
        hardware.chain(soft)
    }

    /// The device called `name`, if any.
    pub fn find(&self, name: &str) -> Option<Device<'_>> {
        self.iter().find(|d| d.name() == name)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if let Some(list) = self.list {
            // SAFETY: the list came from ibv_get_device_list and is freed once.
            unsafe { ffi::ibv_free_device_list(list.as_ptr()) }
        }
    }
}

impl<'list> Device<'list> {
    /// The kernel name of the device (`mlx5_0`, `rxe0`).
    pub fn name(&self) -> &'list str {
        // SAFETY: the device lives as long as the list; its name is a NUL-terminated string
        // inside it.
        let name = unsafe { ffi::ibv_get_device_name(self.raw) };
        if name.is_null() {
            return "";
        }
        // SAFETY: non-null, NUL-terminated, lives as long as the list.
        unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("")
    }

    /// The node GUID, in host byte order.
    pub fn guid(&self) -> u64 {
        // SAFETY: the device is valid for the list's lifetime.
        u64::from_be(unsafe { ffi::ibv_get_device_guid(self.raw) })
    }

    /// Where the device sits and what its ports are (NUMA node, PCI address and path, per
    /// port link layer, state, speed, network devices, MTU and addresses), from sysfs, as
    /// [`crate::topology::topology`] lists them; `None` for a device sysfs does not describe
    /// (the software device `soft0`).
    pub fn topology(&self) -> Option<crate::topology::DeviceTopology> {
        crate::topology::of_device(self.name())
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_device {
        self.raw
    }
}

impl std::fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .field("guid", &format_args!("{:016x}", self.guid()))
            .finish()
    }
}

impl std::fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The environment decides what must happen, independently of what `devices()` says:
    /// without an RDMA stack (development machines, CI's host) the list is an `Unsupported`
    /// error carrying the VM hint; with one (the VM), the list opens and an unknown name is
    /// `NoDevice` naming the devices that exist.
    #[test]
    fn no_stack_or_unknown_device_is_a_clean_error() {
        if crate::error::rdma_stack_present() {
            let list = devices().expect("an RDMA stack with devices lists them");
            assert!(!list.is_empty());
            match open("no-such-device") {
                Err(Error::NoDevice { name, available }) => {
                    assert_eq!(name, "no-such-device");
                    assert!(!available.is_empty());
                }
                other => panic!("expected NoDevice, got {other:?}"),
            }
        } else {
            let e = devices().expect_err("no RDMA stack, yet a device list");
            assert!(e.is_unsupported(), "unexpected error kind: {e}");
            assert!(e.to_string().contains("cargo xtask vm"), "{e}");
            assert!(matches!(open("nope0"), Err(ref e) if e.is_unsupported()));
        }
    }
}
