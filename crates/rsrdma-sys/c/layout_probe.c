/*
 * Compiled at test time (`tests/layout.rs`, through `rsrdma_sys::c_side`), where rdma-core's
 * headers are installed: the crate itself builds no C.
 *
 * - Layout probes: sizes and offsets of the structs the hot path reads, as the C compiler sees
 *   them, so a test can catch committed bindings that drifted from the installed headers.
 */
#include <stddef.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* Layout probes: one (size, align, offsets...) table per hot struct. */
struct rsrdma_layout {
	size_t size;
	size_t align;
	size_t offsets[16];
};

#define PROBE_BEGIN(N, T) case N: { struct rsrdma_layout l = { sizeof(T), _Alignof(T), {0} }; size_t k = 0;
#define OFF(T, f) l.offsets[k++] = offsetof(T, f);
#define PROBE_END *out = l; return 1; }

/* Fills *out for probe `which` (0: ibv_sge, 1: ibv_send_wr, 2: ibv_recv_wr, 3: ibv_wc,
 * 4: ibv_qp_attr, 5: ibv_port_attr). Returns 0 for an unknown index. */
int rsrdma_layout_probe(int which, struct rsrdma_layout *out)
{
	switch (which) {
	PROBE_BEGIN(0, struct ibv_sge)
		OFF(struct ibv_sge, addr) OFF(struct ibv_sge, length) OFF(struct ibv_sge, lkey)
	PROBE_END
	PROBE_BEGIN(1, struct ibv_send_wr)
		OFF(struct ibv_send_wr, wr_id) OFF(struct ibv_send_wr, next) OFF(struct ibv_send_wr, sg_list)
		OFF(struct ibv_send_wr, num_sge) OFF(struct ibv_send_wr, opcode) OFF(struct ibv_send_wr, send_flags)
		OFF(struct ibv_send_wr, imm_data) OFF(struct ibv_send_wr, wr.rdma.remote_addr)
		OFF(struct ibv_send_wr, wr.rdma.rkey) OFF(struct ibv_send_wr, wr.atomic.compare_add)
		OFF(struct ibv_send_wr, wr.atomic.swap) OFF(struct ibv_send_wr, wr.atomic.rkey)
		OFF(struct ibv_send_wr, wr.ud.ah) OFF(struct ibv_send_wr, wr.ud.remote_qpn)
		OFF(struct ibv_send_wr, wr.ud.remote_qkey)
	PROBE_END
	PROBE_BEGIN(2, struct ibv_recv_wr)
		OFF(struct ibv_recv_wr, wr_id) OFF(struct ibv_recv_wr, next) OFF(struct ibv_recv_wr, sg_list)
		OFF(struct ibv_recv_wr, num_sge)
	PROBE_END
	PROBE_BEGIN(3, struct ibv_wc)
		OFF(struct ibv_wc, wr_id) OFF(struct ibv_wc, status) OFF(struct ibv_wc, opcode)
		OFF(struct ibv_wc, vendor_err) OFF(struct ibv_wc, byte_len) OFF(struct ibv_wc, imm_data)
		OFF(struct ibv_wc, qp_num) OFF(struct ibv_wc, src_qp) OFF(struct ibv_wc, wc_flags)
		OFF(struct ibv_wc, pkey_index) OFF(struct ibv_wc, slid) OFF(struct ibv_wc, sl)
		OFF(struct ibv_wc, dlid_path_bits)
	PROBE_END
	PROBE_BEGIN(4, struct ibv_qp_attr)
		OFF(struct ibv_qp_attr, qp_state) OFF(struct ibv_qp_attr, path_mtu) OFF(struct ibv_qp_attr, rq_psn)
		OFF(struct ibv_qp_attr, sq_psn) OFF(struct ibv_qp_attr, dest_qp_num) OFF(struct ibv_qp_attr, cap)
		OFF(struct ibv_qp_attr, ah_attr) OFF(struct ibv_qp_attr, max_rd_atomic)
		OFF(struct ibv_qp_attr, max_dest_rd_atomic) OFF(struct ibv_qp_attr, min_rnr_timer)
		OFF(struct ibv_qp_attr, timeout) OFF(struct ibv_qp_attr, retry_cnt) OFF(struct ibv_qp_attr, rnr_retry)
	PROBE_END
	PROBE_BEGIN(5, struct ibv_port_attr)
		OFF(struct ibv_port_attr, state) OFF(struct ibv_port_attr, max_mtu) OFF(struct ibv_port_attr, active_mtu)
		OFF(struct ibv_port_attr, gid_tbl_len) OFF(struct ibv_port_attr, lid) OFF(struct ibv_port_attr, link_layer)
		OFF(struct ibv_port_attr, flags) OFF(struct ibv_port_attr, port_cap_flags2)
	PROBE_END
	default:
		return 0;
	}
}
