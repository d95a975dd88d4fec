//! C compiled when it is needed, not at build time: the checks and benches that compare with
//! what a C program sees (the layout probes, the overhead bench's C baseline) compile their C
//! file into a shared object with the system's C compiler and load it. The crate's build
//! then needs no C compiler and no rdma-core header; these checks need both (they say so
//! when either is missing).

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A C file compiled into a shared object and loaded (kept loaded for the process).
#[derive(Debug)]
pub struct CLibrary {
    handle: *mut c_void,
    path: PathBuf,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for CLibrary {}
// SAFETY: as above.
unsafe impl Sync for CLibrary {}

/// The C files of this crate (`c/`): `layout_probe.c`, `bench.c`.
pub fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("c").join(name)
}

/// Compiles `source` with `$CC` (default `cc`) at `-O2` into a shared object in the temporary
/// directory and loads it.
///
/// # Errors
/// The compiler's own message (no compiler; rdma-core's headers missing: install
/// `libibverbs-dev` and `librdmacm-dev`), or dlopen's.
pub fn compile(source: &Path) -> Result<CLibrary, String> {
    let stem = source
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| format!("{}: not a C file name", source.display()))?;
    let out = std::env::temp_dir().join(format!("rsrdma-{stem}-{}.so", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let run = Command::new(&cc)
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(source)
        .output()
        .map_err(|e| format!("running the C compiler `{cc}`: {e}"))?;
    if !run.status.success() {
        return Err(format!(
            "compiling {} failed (rdma-core's headers: libibverbs-dev, librdmacm-dev):\n{}",
            source.display(),
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let path = std::ffi::CString::new(out.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a NUL in the path", out.display()))?;
    // SAFETY: a NUL-terminated path of the object just built; its constructors are the C
    // runtime's only.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    // The mapping keeps the object alive; the file is no longer needed.
    let _ = std::fs::remove_file(&out);
    if handle.is_null() {
        return Err(format!("dlopen of {} failed", out.display()));
    }
    Ok(CLibrary { handle, path: out })
}

impl CLibrary {
    /// The address of `name`, as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be an `unsafe extern "C" fn` type matching the C function's signature.
    ///
    /// # Errors
    /// The symbol is not in the object.
    pub unsafe fn function<F: Copy>(&self, name: &CStr) -> Result<F, String> {
        assert_eq!(
            std::mem::size_of::<F>(),
            std::mem::size_of::<*mut c_void>(),
            "F must be a function pointer"
        );
        // SAFETY: a live handle and a NUL-terminated name.
        let addr = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if addr.is_null() {
            return Err(format!("{name:?} is not in {}", self.path.display()));
        }
        // SAFETY: `F` is a function pointer of the symbol's signature (the caller's contract)
        // and has the size of an address (checked above).
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&addr) })
    }
}
