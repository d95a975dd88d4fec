//! Tests against a real RDMA device: rxe0 inside the VM (`cargo xtask test`), or the device
//! named by `RSRDMA_TEST_DEVICE` (GID index `RSRDMA_TEST_GID_INDEX`). They fail, never skip,
//! when the device is missing.

mod common;

mod cm;
mod cm_local;
mod data;
mod differential;
mod drops;
mod events;
mod processes;
mod qp_ex;
mod queries;
mod soundness;
mod ud_srq;
mod windows;
