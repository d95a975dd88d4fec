//! What the tools' device tests share: the device under test as the VM names it.

// Each test binary uses its own subset.
#![allow(dead_code)]

/// The device under test; fails the test (never skips it) when the device is missing.
pub fn device() -> String {
    let d = std::env::var("RSRDMA_TEST_DEVICE").unwrap_or_else(|_| "rxe0".into());
    // The software device has no sysfs entry.
    assert!(
        d == "soft0" || std::path::Path::new(&format!("/sys/class/infiniband/{d}")).exists(),
        "RDMA device {d} is not present: these tests need the soft-RoCE VM (`cargo xtask test`)"
    );
    d
}

/// The GID index to pass as `-x`.
pub fn gid_index() -> String {
    std::env::var("RSRDMA_TEST_GID_INDEX").unwrap_or_else(|_| "1".into())
}

/// The device's address, which rdma_cm clients connect to (over rxe rdma_cm cannot use
/// 127.0.0.1).
pub fn ip() -> String {
    std::env::var("RSRDMA_TEST_IP").unwrap_or_else(|_| "10.77.0.1".into())
}
