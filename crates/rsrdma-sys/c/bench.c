/*
 * The C side of `cargo xtask bench overhead` (compiled by the bench at run time, through
 * `rsrdma_sys::c_side`): what a C program does to post work requests
 * with libibverbs' static-inline verbs, compiled at -O2 like the shim. The Rust side makes the
 * same calls through rsrdma; both run against a do-nothing provider, so the difference is what
 * the Rust layer adds per work request.
 */
#include <stdint.h>
#include <infiniband/verbs.h>

/* Posts `wr` `n` times, one ibv_post_send each (wr_id = the iteration). Returns the failures. */
uint64_t rsrdma_bench_c_post(struct ibv_qp *qp, struct ibv_send_wr *wr, uint64_t n)
{
	struct ibv_send_wr *bad;
	uint64_t failed = 0;

	for (uint64_t i = 0; i < n; i++) {
		wr->wr_id = i;
		failed += ibv_post_send(qp, wr, &bad) != 0;
	}
	return failed;
}

/* Posts `rounds` chains of the `batch` requests in `wrs`, one ibv_post_send per chain. */
uint64_t rsrdma_bench_c_post_chain(struct ibv_qp *qp, struct ibv_send_wr *wrs, size_t batch,
				   uint64_t rounds)
{
	struct ibv_send_wr *bad;
	uint64_t failed = 0;

	for (uint64_t r = 0; r < rounds; r++) {
		for (size_t i = 0; i < batch; i++) {
			wrs[i].wr_id = r * batch + i;
			wrs[i].next = i + 1 < batch ? &wrs[i + 1] : NULL;
		}
		failed += ibv_post_send(qp, wrs, &bad) != 0;
	}
	return failed;
}

/* A pipeline step per request: post one, then poll the CQ for one completion. */
uint64_t rsrdma_bench_c_post_poll(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_send_wr *wr,
				  uint64_t n)
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	uint64_t failed = 0;

	for (uint64_t i = 0; i < n; i++) {
		wr->wr_id = i;
		failed += ibv_post_send(qp, wr, &bad) != 0;
		failed += ibv_poll_cq(cq, 1, &wc) != 1;
	}
	return failed;
}
