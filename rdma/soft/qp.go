// Queue pairs: the state shared by the post path, the requester and the responder.

package soft

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// stateClosed is the state of a destroyed QP, beyond rdma's states.
const stateClosed = rdma.QPStateError + 1

// pathMTU is what Info reports; frames are not cut into packets.
const pathMTU = 4096

type qp struct {
	dev    *device
	pd     *pd
	num    uint32
	psn    uint32
	cfg    rdma.QPConfig
	sendCQ *cq
	recvCQ *cq
	budget time.Duration // AckTimeout*(RetryCount+1): how long a silent peer is given

	state atomic.Uint32 // rdma.QPState, or stateClosed

	mu     sync.Mutex // transitions; the fields below
	remote rdma.QPInfo
	outl   *outLink // the link of q's requests, from its attach until it leaves
	in     *inLink  // the link q's responder serves, once attached
	cancel context.CancelFunc
	closed bool
	reason error         // why the QP went to ERR
	rtr    chan struct{} // closed on reaching RTR
	dead   chan struct{} // closed on entering ERR or on Close
	once   sync.Once
	wg     sync.WaitGroup // the sender goroutine

	// out is outl once the peer acknowledged the attach: the link whose
	// reader delivers q's responses. Atomic for the paths that look at it
	// without q.mu.
	out atomic.Pointer[outLink]
	// ackc carries the attach's acknowledgement, or the link's failure,
	// to the sender goroutine.
	ackc chan attachResult

	// inline is held shared by a PostSend sending inline and by whoever
	// lands data in the buffers of q's requests (the reader of q's link, or
	// a responder filling a RECV); Close takes it once q left its links, so
	// it returns only when nothing touches those buffers any more. Readers
	// of a link only try it: failing means Close is under way.
	inline sync.RWMutex

	sq  sendQueue
	tx  transmitter
	rx  receiver
	rq  recvQueue
	rsp responder
}

func newQP(p *pd, cfg rdma.QPConfig, scq, rcq *cq) *qp {
	q := &qp{
		dev:    p.dev,
		pd:     p,
		psn:    rand.Uint32() & 0xffffff,
		cfg:    cfg,
		sendCQ: scq,
		recvCQ: rcq,
		budget: cfg.AckTimeout * time.Duration(cfg.RetryCount+1),
		rtr:    make(chan struct{}),
		dead:   make(chan struct{}),
		ackc:   make(chan attachResult, 1),
	}
	q.sq.init(cfg.MaxSendWR, cfg.MaxSGE)
	q.rq.init(cfg.MaxRecvWR, cfg.MaxSGE)
	q.tx.kick = make(chan struct{}, 1)
	q.tx.wqe.sgl = make([]sge, 0, cfg.MaxSGE)
	q.tx.w.buf = make([]byte, 0, batchSize)
	return q
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) State() rdma.QPState {
	s := rdma.QPState(q.state.Load())
	if s == stateClosed {
		return rdma.QPStateError
	}
	return s
}

func (q *qp) Info() rdma.QPInfo {
	return rdma.QPInfo{Provider: ProviderName, QPNum: q.num, PSN: q.psn, MTU: pathMTU, Addr: q.dev.addr}
}

// rnrBudget is how long the requester retries a request the peer answered
// with RNR (no RECV posted) before completing it with RNR_RETRY_EXC_ERR:
// half its budget, as a responder waiting out an RNR used to have.
func (q *qp) rnrBudget() time.Duration { return min(q.budget/2, maxRNRBudget) }

// maxRNRBudget caps the RNR budget.
const maxRNRBudget = time.Minute

// seqOf is the wire sequence number of the send queue's i-th request.
func (q *qp) seqOf(i uint64) uint32 { return q.psn + uint32(i) }

// gone reports whether the QP is in ERR or closed: it takes no part in
// its links any more.
func (q *qp) gone() bool {
	s := q.state.Load()
	return s == uint32(rdma.QPStateError) || s == uint32(stateClosed)
}
