//! libibverbs and librdmacm, loaded when first called (`dlopen`), not linked.
//!
//! Why: a program built on rsrdma must build on a machine with no rdma-core (no `-dev`
//! package, no header, no library) and run there with the software device; NCCL and UCX
//! load the verbs the same way. Each function of [`crate::dynamic_fns`] (generated from the
//! headers by `cargo xtask regen-bindings`) has its C name and signature; its first call
//! resolves the symbol (`dlsym`, the library's default version, as the link editor would
//! bind it) and keeps the address, so later calls cost one atomic load and an indirect call.
//!
//! When the library or the symbol is missing, the call sets `errno` to `ENOSYS` and returns
//! a failure: a null pointer, `-1`, or nothing. No object of rdma-core can exist then, so
//! only the entry points reach this: `ibv_get_device_list` and `rdma_create_event_channel`
//! (null, ENOSYS: "no RDMA stack"), `rdma_get_devices`, `ibv_fork_init`, the `*_str`
//! helpers (null).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

/// A library handle from `dlopen` (never closed: symbols stay valid for the process).
#[derive(Debug, Clone, Copy)]
struct Handle(*mut c_void);

// SAFETY: a dlopen handle is a process-wide token; dlsym may be called with it from any thread.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

/// One of the two libraries: its file names, tried in order, and the handle once opened.
pub(crate) struct Library {
    names: &'static [&'static CStr],
    handle: OnceLock<Option<Handle>>,
}

/// libibverbs (the versioned name of rdma-core's ABI first: the unversioned one exists only
/// with the `-dev` package).
pub(crate) static IBVERBS: Library = Library::new(&[c"libibverbs.so.1", c"libibverbs.so"]);
/// librdmacm.
pub(crate) static RDMACM: Library = Library::new(&[c"librdmacm.so.1", c"librdmacm.so"]);

impl Library {
    const fn new(names: &'static [&'static CStr]) -> Library {
        Library {
            names,
            handle: OnceLock::new(),
        }
    }

    fn handle(&self) -> Option<Handle> {
        *self.handle.get_or_init(|| {
            self.names.iter().find_map(|name| {
                // SAFETY: a NUL-terminated name; dlopen runs the library's constructors,
                // which rdma-core's libraries allow at any time.
                let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                (!h.is_null()).then_some(Handle(h))
            })
        })
    }

    /// Whether the library could be loaded.
    pub(crate) fn loaded(&self) -> bool {
        self.handle().is_some()
    }
}

/// Whether libibverbs is installed and loads (its devices, if any, can then be listed).
pub fn ibverbs_loaded() -> bool {
    IBVERBS.loaded()
}

/// Whether librdmacm is installed and loads.
pub fn rdmacm_loaded() -> bool {
    RDMACM.loaded()
}

/// Whether the installed librdmacm exports `name`: for a function newer than some
/// librdmacm still in use (`rdma_establish`, rdma-core 23), whose absence changes how a
/// caller goes about it rather than failing it.
pub fn rdmacm_exports(name: &CStr) -> bool {
    RDMACM.handle().is_some_and(|h| {
        // SAFETY: a live handle and a NUL-terminated name.
        !unsafe { libc::dlsym(h.0, name.as_ptr()) }.is_null()
    })
}

/// The address of one function, resolved once.
pub(crate) struct Symbol {
    name: &'static CStr,
    /// `UNRESOLVED` until the first call; then the address, or null when missing.
    addr: AtomicPtr<c_void>,
}

/// A value no symbol has (odd, unlike any function address).
const UNRESOLVED: *mut c_void = 1 as *mut c_void;

impl Symbol {
    pub(crate) const fn new(name: &'static CStr) -> Symbol {
        Symbol {
            name,
            addr: AtomicPtr::new(UNRESOLVED),
        }
    }

    /// The function's address, or `None` (with errno set to ENOSYS) when the library or the
    /// symbol is missing.
    #[inline]
    pub(crate) fn get(&self, lib: &Library) -> Option<*mut c_void> {
        let mut addr = self.addr.load(Ordering::Acquire);
        if addr == UNRESOLVED {
            addr = match lib.handle() {
                // SAFETY: a live handle and a NUL-terminated name.
                Some(h) => unsafe { libc::dlsym(h.0, self.name.as_ptr()) },
                None => std::ptr::null_mut(),
            };
            self.addr.store(addr, Ordering::Release);
        }
        if addr.is_null() {
            crate::inline::set_errno(libc::ENOSYS);
            return None;
        }
        Some(addr)
    }
}

/// What a call returns when its function is missing.
pub(crate) trait Missing {
    fn missing() -> Self;
}

impl<T> Missing for *mut T {
    fn missing() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> Missing for *const T {
    fn missing() -> Self {
        std::ptr::null()
    }
}

impl Missing for () {
    fn missing() -> Self {}
}

macro_rules! missing_is_minus_one {
    ($($t:ty),*) => {$(
        impl Missing for $t {
            fn missing() -> Self {
                -1
            }
        }
    )*};
}
missing_is_minus_one!(i32, isize);

impl Missing for u64 {
    fn missing() -> Self {
        0
    }
}

/// Defines each function as a call through its resolved address (see the module docs).
macro_rules! dynamic_functions {
    ($($lib:ident: fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`, loaded from ", stringify!($lib), " when first called.")]
        ///
        /// # Safety
        /// As the C function. When the library is missing, sets errno to ENOSYS and returns
        /// a failure (null, -1 or nothing: see [`crate::dynamic`]).
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
        pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            static SYM: $crate::dynamic::Symbol = $crate::dynamic::Symbol::new(
                // SAFETY: the literal ends in its only NUL.
                unsafe { ::std::ffi::CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) },
            );
            let lib = dynamic_functions!(@lib $lib);
            match SYM.get(lib) {
                Some(addr) => {
                    // SAFETY: the symbol of this name in rdma-core's library has this
                    // signature (both come from the same header, through bindgen).
                    let f: unsafe extern "C" fn($($ty),*) $(-> $ret)? =
                        unsafe { ::std::mem::transmute::<*mut ::std::ffi::c_void, _>(addr) };
                    // SAFETY: the caller's contract, as for the C function.
                    unsafe { f($($arg),*) }
                }
                None => $crate::dynamic::Missing::missing(),
            }
        }
    )*};
    (@lib ibverbs) => { &$crate::dynamic::IBVERBS };
    (@lib rdmacm) => { &$crate::dynamic::RDMACM };
}
pub(crate) use dynamic_functions;
