// C helpers for the verbs provider (package rdma/verbs, build tag "verbs").
//
// Everything here is static: each cgo file of the package includes this
// header. The Go side fills struct ibv_send_wr / ibv_recv_wr / ibv_sge in
// C memory itself and reads struct ibv_wc directly; the helpers below cover
// what cgo cannot express (the compat-wrapped ibv_query_port, union members,
// out parameters that would otherwise make Go values escape).

#ifndef RKV_VERBS_SHIM_H
#define RKV_VERBS_SHIM_H

#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Offsets, inside the wr union of struct ibv_send_wr, of the members the Go
// side writes through unsafe pointers.
enum {
	RKV_WR_RDMA_RADDR = offsetof(struct ibv_send_wr, wr.rdma.remote_addr) - offsetof(struct ibv_send_wr, wr),
	RKV_WR_RDMA_RKEY = offsetof(struct ibv_send_wr, wr.rdma.rkey) - offsetof(struct ibv_send_wr, wr),
	RKV_WR_ATOMIC_RADDR = offsetof(struct ibv_send_wr, wr.atomic.remote_addr) - offsetof(struct ibv_send_wr, wr),
	RKV_WR_ATOMIC_CMP = offsetof(struct ibv_send_wr, wr.atomic.compare_add) - offsetof(struct ibv_send_wr, wr),
	RKV_WR_ATOMIC_SWAP = offsetof(struct ibv_send_wr, wr.atomic.swap) - offsetof(struct ibv_send_wr, wr),
	RKV_WR_ATOMIC_RKEY = offsetof(struct ibv_send_wr, wr.atomic.rkey) - offsetof(struct ibv_send_wr, wr),
};

// ibv_query_port is a macro over a static inline compat wrapper; cgo cannot
// call it by name.
static int rkv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}

// ibv_reg_mr is a macro in rdma-core >= 30.
static struct ibv_mr *rkv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	return ibv_reg_mr(pd, addr, len, access);
}

static void rkv_set_gid(union ibv_gid *dst, const uint8_t *raw) { memcpy(dst->raw, raw, 16); }

// Result of a post: err is 0 or an errno value, bad the index (in the
// array starting at first) of the first request not posted.
struct rkv_post_ret {
	int err;
	int bad;
};

static struct rkv_post_ret rkv_post_send(struct ibv_qp *qp, struct ibv_send_wr *first) {
	struct ibv_send_wr *bad = NULL;
	struct rkv_post_ret r = {0, -1};
	r.err = ibv_post_send(qp, first, &bad);
	if (r.err != 0)
		r.bad = bad ? (int)(bad - first) : 0;
	return r;
}

static struct rkv_post_ret rkv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *first) {
	struct ibv_recv_wr *bad = NULL;
	struct rkv_post_ret r = {0, -1};
	r.err = ibv_post_recv(qp, first, &bad);
	if (r.err != 0)
		r.bad = bad ? (int)(bad - first) : 0;
	return r;
}

// Out parameters of ibv_get_cq_event, kept in C memory per CQ.
struct rkv_cq_event {
	struct ibv_cq *cq;
	void *ctx;
};

// rkv_get_cq_event takes one completion event from a non-blocking channel
// and acknowledges it. It returns 0, or an errno value (EAGAIN: none).
static int rkv_get_cq_event(struct ibv_comp_channel *ch, struct rkv_cq_event *ev) {
	if (ibv_get_cq_event(ch, &ev->cq, &ev->ctx) != 0)
		return errno ? errno : EIO;
	ibv_ack_cq_events(ev->cq, 1);
	return 0;
}

static int rkv_set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return errno;
	return 0;
}

// Accessors for the element union of struct ibv_async_event.
static struct ibv_cq *rkv_async_cq(struct ibv_async_event *e) { return e->element.cq; }
static struct ibv_qp *rkv_async_qp(struct ibv_async_event *e) { return e->element.qp; }
static int rkv_async_port(struct ibv_async_event *e) { return e->element.port_num; }

#endif
