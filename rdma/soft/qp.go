// Queue pairs: the state shared by the post path, the requester and the responder.

package soft

import (
	"bufio"
	"context"
	"math/rand/v2"
	"net"
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

	mu       sync.Mutex // transitions; the fields below
	remote   rdma.QPInfo
	reqConn  *net.TCPConn // our requester to the peer's responder
	respConn *net.TCPConn // the peer's requester to our responder
	cancel   context.CancelFunc
	closed   bool
	reason   error         // why the QP went to ERR
	rtr      chan struct{} // closed on reaching RTR
	dead     chan struct{} // closed on entering ERR or on Close
	deadOnce sync.Once
	wg       sync.WaitGroup // the QP's goroutines: sender, receiver, responder

	// inline is held shared by a PostSend sending and by a CQ.Wait reading
	// the QP's connection on their own goroutines, which wg does not
	// count; Close takes it once the connections are closed, so it returns
	// only when nothing touches the QP's buffers any more.
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
	}
	q.sq.init(cfg.MaxSendWR, cfg.MaxSGE)
	q.rq.init(cfg.MaxRecvWR, cfg.MaxSGE)
	q.tx.kick = make(chan struct{}, 1)
	q.tx.wqe.sgl = make([]sge, 0, cfg.MaxSGE)
	q.tx.w.buf = make([]byte, 0, frameBufSize)
	q.rx.br = bufio.NewReaderSize(nil, readBufSize)
	q.rx.kick = make(chan struct{}, 1)
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

// rnrBudget is how long the peer's responder may wait for a RECV before
// answering RNR: half the requester's budget, so the RNR NAK arrives
// before the requester gives the peer up as dead.
func (q *qp) rnrBudget() time.Duration { return min(q.budget/2, maxRNRBudget) }

// seqOf is the wire sequence number of the send queue's i-th request.
func (q *qp) seqOf(i uint64) uint32 { return q.psn + uint32(i) }
