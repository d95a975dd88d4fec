/*
 * Hand-written helpers that rsrdma-sys exports next to the generated inline wrappers.
 *
 * - Batch posting: the caller hands a contiguous array of work requests; one walker links them
 *   through `next` and posts the whole chain with one ibv_post_send/ibv_post_recv/
 *   ibv_post_srq_recv call, then reports the index of the first request the provider rejected.
 *   The Rust side therefore never builds self-referential linked lists, and a batch crosses the
 *   FFI boundary once.
 * - Layout probes: sizes and offsets of the structs the hot path reads, as the C compiler sees
 *   them, so a test can catch committed bindings that drifted from the installed headers.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* The queues a batch can go to. */
enum rsrdma_queue {
	RSRDMA_SEND_QUEUE,	/* owner is a struct ibv_qp, wrs are struct ibv_send_wr */
	RSRDMA_RECV_QUEUE,	/* owner is a struct ibv_qp, wrs are struct ibv_recv_wr */
	RSRDMA_SRQ,		/* owner is a struct ibv_srq, wrs are struct ibv_recv_wr */
};

/* Links wrs[0..n) (each `stride` bytes, its `next` pointer at `next_off`) into a chain. The
 * pointer is stored with memcpy: the array is untyped here, and both WR types' `next` are
 * plain object pointers with the same representation as void *. */
static void link_chain(char *wrs, size_t n, size_t stride, size_t next_off)
{
	size_t i;

	for (i = 0; i < n; i++) {
		void *next = i + 1 < n ? wrs + (i + 1) * stride : NULL;

		memcpy(wrs + i * stride + next_off, &next, sizeof(next));
	}
}

/* Undoes link_chain once the chain is posted: every `next` is NULL again, so a request from
 * the array can later be posted alone, in place, without a copy to clear its link. */
static void unlink_chain(char *wrs, size_t n, size_t stride, size_t next_off)
{
	void *none = NULL;
	size_t i;

	for (i = 0; i + 1 < n; i++)
		memcpy(wrs + i * stride + next_off, &none, sizeof(none));
}

/* The index of `bad` in wrs[0..n), or n when it points elsewhere (or is NULL). Compared as
 * integers, so that a pointer outside the array is not undefined behaviour. */
static size_t index_of(const char *wrs, size_t n, size_t stride, const void *bad)
{
	uintptr_t off = (uintptr_t)bad - (uintptr_t)wrs;

	return off < n * stride ? off / stride : n;
}

/* The one batch walker behind the three exported helpers: links wrs[0..n) into a chain, posts
 * it to queue `q` of `owner` with one verbs call, and on failure stores the index of the first
 * rejected WR in *bad_index (n when the provider named none). Returns the verb's result.
 * Each exported helper passes a constant `q`, so the compiler specialises this per queue. */
static inline int post_batch(enum rsrdma_queue q, void *owner, void *wrs, size_t n,
			     size_t *bad_index)
{
	int send = q == RSRDMA_SEND_QUEUE;
	size_t stride = send ? sizeof(struct ibv_send_wr) : sizeof(struct ibv_recv_wr);
	size_t next_off = send ? offsetof(struct ibv_send_wr, next) : offsetof(struct ibv_recv_wr, next);
	struct ibv_send_wr *bad_send = NULL;
	struct ibv_recv_wr *bad_recv = NULL;
	int rc;

	if (n == 0)
		return 0;
	link_chain(wrs, n, stride, next_off);
	switch (q) {
	case RSRDMA_SEND_QUEUE:
		rc = ibv_post_send(owner, wrs, &bad_send);
		break;
	case RSRDMA_RECV_QUEUE:
		rc = ibv_post_recv(owner, wrs, &bad_recv);
		break;
	default:
		rc = ibv_post_srq_recv(owner, wrs, &bad_recv);
		break;
	}
	if (rc && bad_index)
		*bad_index = index_of(wrs, n, stride, send ? (void *)bad_send : (void *)bad_recv);
	unlink_chain(wrs, n, stride, next_off);
	return rc;
}

/* The exported helpers, one per queue; their Rust declarations are in src/lib.rs. */
int rsrdma_post_send_batch(struct ibv_qp *qp, struct ibv_send_wr *wrs, size_t n, size_t *bad_index)
{
	return post_batch(RSRDMA_SEND_QUEUE, qp, wrs, n, bad_index);
}

int rsrdma_post_recv_batch(struct ibv_qp *qp, struct ibv_recv_wr *wrs, size_t n, size_t *bad_index)
{
	return post_batch(RSRDMA_RECV_QUEUE, qp, wrs, n, bad_index);
}

int rsrdma_post_srq_recv_batch(struct ibv_srq *srq, struct ibv_recv_wr *wrs, size_t n, size_t *bad_index)
{
	return post_batch(RSRDMA_SRQ, srq, wrs, n, bad_index);
}

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

/* Memory windows: `ibv_alloc_mw` and `ibv_dealloc_mw` are `static inline` in verbs.h (calls
 * through the context's ops), so they are exported here. `ibv_alloc_mw` sets errno to
 * EOPNOTSUPP for a provider without memory windows. */
struct ibv_mw *rsrdma_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	return ibv_alloc_mw(pd, type);
}

int rsrdma_dealloc_mw(struct ibv_mw *mw)
{
	return ibv_dealloc_mw(mw);
}
