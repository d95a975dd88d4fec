//! The committed bindings against the installed headers: `c/layout_probe.c`, compiled now
//! by the system's C compiler, reports sizes, alignments and offsets of the structs the hot
//! path reads as C sees them. Needs a C compiler and rdma-core's headers (CI has both).

use rsrdma_sys::c_side;
use rsrdma_sys::*;
use std::os::raw::c_int;
use std::sync::OnceLock;

type Probe = unsafe extern "C" fn(c_int, *mut rsrdma_layout) -> c_int;

fn layout_probe() -> Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    *PROBE.get_or_init(|| {
        let lib =
            c_side::compile(&c_side::source("layout_probe.c")).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: the C function's signature (c/layout_probe.c).
        unsafe { lib.function::<Probe>(c"rsrdma_layout_probe") }.unwrap()
    })
}

use std::mem::{align_of, offset_of, size_of};

fn probe(which: i32) -> rsrdma_layout {
    let mut l = rsrdma_layout::default();
    // SAFETY: `l` is a valid, writable rsrdma_layout; the probe only writes it.
    let found = unsafe { layout_probe()(which, &mut l) };
    assert_eq!(found, 1, "probe {which} missing from the shim");
    l
}

fn check(which: i32, name: &str, size: usize, align: usize, offsets: &[usize]) {
    let c = probe(which);
    assert_eq!(c.size, size, "{name}: size differs between C and Rust");
    assert_eq!(
        c.align, align,
        "{name}: alignment differs between C and Rust"
    );
    assert_eq!(
        &c.offsets[..offsets.len()],
        offsets,
        "{name}: field offsets differ"
    );
}

#[test]
fn ibv_sge_matches_c() {
    check(
        0,
        "ibv_sge",
        size_of::<ibv_sge>(),
        align_of::<ibv_sge>(),
        &[
            offset_of!(ibv_sge, addr),
            offset_of!(ibv_sge, length),
            offset_of!(ibv_sge, lkey),
        ],
    );
}

#[test]
fn ibv_send_wr_matches_c() {
    let wr = offset_of!(ibv_send_wr, wr);
    let rdma = wr + offset_of!(ibv_send_wr__bindgen_ty_2, rdma);
    let atomic = wr + offset_of!(ibv_send_wr__bindgen_ty_2, atomic);
    let ud = wr + offset_of!(ibv_send_wr__bindgen_ty_2, ud);
    check(
        1,
        "ibv_send_wr",
        size_of::<ibv_send_wr>(),
        align_of::<ibv_send_wr>(),
        &[
            offset_of!(ibv_send_wr, wr_id),
            offset_of!(ibv_send_wr, next),
            offset_of!(ibv_send_wr, sg_list),
            offset_of!(ibv_send_wr, num_sge),
            offset_of!(ibv_send_wr, opcode),
            offset_of!(ibv_send_wr, send_flags),
            offset_of!(ibv_send_wr, __bindgen_anon_1),
            rdma + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_1, remote_addr),
            rdma + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_1, rkey),
            atomic + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_2, compare_add),
            atomic + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_2, swap),
            atomic + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_2, rkey),
            ud + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_3, ah),
            ud + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_3, remote_qpn),
            ud + offset_of!(ibv_send_wr__bindgen_ty_2__bindgen_ty_3, remote_qkey),
        ],
    );
}

#[test]
fn ibv_recv_wr_matches_c() {
    check(
        2,
        "ibv_recv_wr",
        size_of::<ibv_recv_wr>(),
        align_of::<ibv_recv_wr>(),
        &[
            offset_of!(ibv_recv_wr, wr_id),
            offset_of!(ibv_recv_wr, next),
            offset_of!(ibv_recv_wr, sg_list),
            offset_of!(ibv_recv_wr, num_sge),
        ],
    );
}

#[test]
fn ibv_wc_matches_c() {
    check(
        3,
        "ibv_wc",
        size_of::<ibv_wc>(),
        align_of::<ibv_wc>(),
        &[
            offset_of!(ibv_wc, wr_id),
            offset_of!(ibv_wc, status),
            offset_of!(ibv_wc, opcode),
            offset_of!(ibv_wc, vendor_err),
            offset_of!(ibv_wc, byte_len),
            offset_of!(ibv_wc, __bindgen_anon_1),
            offset_of!(ibv_wc, qp_num),
            offset_of!(ibv_wc, src_qp),
            offset_of!(ibv_wc, wc_flags),
            offset_of!(ibv_wc, pkey_index),
            offset_of!(ibv_wc, slid),
            offset_of!(ibv_wc, sl),
            offset_of!(ibv_wc, dlid_path_bits),
        ],
    );
}

#[test]
fn ibv_qp_attr_matches_c() {
    check(
        4,
        "ibv_qp_attr",
        size_of::<ibv_qp_attr>(),
        align_of::<ibv_qp_attr>(),
        &[
            offset_of!(ibv_qp_attr, qp_state),
            offset_of!(ibv_qp_attr, path_mtu),
            offset_of!(ibv_qp_attr, rq_psn),
            offset_of!(ibv_qp_attr, sq_psn),
            offset_of!(ibv_qp_attr, dest_qp_num),
            offset_of!(ibv_qp_attr, cap),
            offset_of!(ibv_qp_attr, ah_attr),
            offset_of!(ibv_qp_attr, max_rd_atomic),
            offset_of!(ibv_qp_attr, max_dest_rd_atomic),
            offset_of!(ibv_qp_attr, min_rnr_timer),
            offset_of!(ibv_qp_attr, timeout),
            offset_of!(ibv_qp_attr, retry_cnt),
            offset_of!(ibv_qp_attr, rnr_retry),
        ],
    );
}

#[test]
fn ibv_port_attr_matches_c() {
    check(
        5,
        "ibv_port_attr",
        size_of::<ibv_port_attr>(),
        align_of::<ibv_port_attr>(),
        &[
            offset_of!(ibv_port_attr, state),
            offset_of!(ibv_port_attr, max_mtu),
            offset_of!(ibv_port_attr, active_mtu),
            offset_of!(ibv_port_attr, gid_tbl_len),
            offset_of!(ibv_port_attr, lid),
            offset_of!(ibv_port_attr, link_layer),
            offset_of!(ibv_port_attr, flags),
            offset_of!(ibv_port_attr, port_cap_flags2),
        ],
    );
}

#[test]
fn unknown_probe_is_refused() {
    let mut l = rsrdma_layout::default();
    // SAFETY: as above; an unknown index leaves `l` untouched.
    assert_eq!(unsafe { layout_probe()(99, &mut l) }, 0);
}
