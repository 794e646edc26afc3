// Work queues: fixed rings of copied work requests, with the local checks done at post time.

package soft

import (
	"sync"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// sge is an SGE resolved to a soft MR; m is nil when the SGE named no MR
// of this provider (then the request fails with LOC_PROT_ERR).
type sge struct {
	m   *mr
	off int
	n   int
}

type sendWQE struct {
	id         uint64
	op         rdma.Opcode
	signaled   bool
	fence      bool
	sgl        []sge // backed by the slot's own array
	length     uint32
	raddr      uint64
	rkey       uint32
	imm        uint32
	compareAdd uint64
	swap       uint64
	localErr   rdma.Status // non-zero: fails with this status when its turn comes
	ackMayWait bool        // sent letting its ACK wait (transmit sets it)
}

// pushes reports whether the request sends its bytes (a WRITE or a SEND,
// with or without immediate): the peer answers it with an ACK.
func (w *sendWQE) pushes() bool {
	return w.op == rdma.OpWrite || w.op == rdma.OpWriteImm || w.op == rdma.OpSend || w.op == rdma.OpSendImm
}

// payload is the number of bytes the request sends.
func (w *sendWQE) payload() int {
	if w.pushes() {
		return int(w.length)
	}
	return 0
}

// copyFrom copies o into w, reusing w's SGE array.
func (w *sendWQE) copyFrom(o *sendWQE) {
	sgl := append(w.sgl[:0], o.sgl...)
	*w = *o
	w.sgl = sgl
}

// load copies a validated work request into the slot and checks its local
// SGEs against q's PD.
func (w *sendWQE) load(wr *rdma.SendWR, q *qp) {
	*w = sendWQE{
		id:       wr.ID,
		op:       wr.Op,
		signaled: wr.Flags&rdma.Signaled != 0 || q.cfg.SignalAll,
		fence:    wr.Flags&rdma.Fence != 0,
		sgl:      w.sgl[:0],
	}
	switch wr.Op {
	case rdma.OpWriteImm, rdma.OpSendImm:
		w.imm = wr.Imm
	case rdma.OpCompareSwap:
		w.compareAdd, w.swap = wr.CompareAdd, wr.Swap
	case rdma.OpFetchAdd:
		w.compareAdd = wr.CompareAdd
	}
	if wr.Op != rdma.OpSend && wr.Op != rdma.OpSendImm {
		w.raddr, w.rkey = wr.RemoteAddr, wr.RKey
	}
	// READ targets and atomic results are written by the NIC.
	write := wr.Op == rdma.OpRead || wr.Op.IsAtomic()
	var total int
	for _, e := range wr.SGL {
		s := sge{off: e.Offset, n: e.Length}
		s.m, _ = e.MR.(*mr)
		if e.Length > 0 && w.localErr == 0 && !q.localOK(s, write) {
			w.localErr = rdma.StatusLocProtErr
		}
		w.sgl = append(w.sgl, s)
		total += e.Length
	}
	w.length = uint32(total)
}

// localOK reports whether s names memory of an MR of q's PD, inside it,
// with local write access if the NIC is to write it.
func (q *qp) localOK(s sge, write bool) bool {
	m := s.m
	return m != nil && m.pd == q.pd && s.off <= len(m.buf)-s.n &&
		(!write || m.access&rdma.AccessLocalWrite != 0) && !m.dead.Load()
}

type sendQueue struct {
	mu   sync.Mutex
	ring []sendWQE
	// Requests [head, sent) were handed to the wire (or failed locally),
	// [sent, tail) wait for the transmitter. Counters only grow, except
	// that an RNR NAK moves sent back to head: the responder dropped
	// everything after the NAKed request, and it is all sent again.
	head, sent, tail uint64

	// landing: the reader of the QP's link is completing the head request
	// (it lands data without the lock); a flush waits for it to finish.
	landing  bool
	linkDown error // no link to the peer: the next request fails with RETRY_EXC_ERR
	blocked  bool  // a request failed locally: nothing after it is sent
	fenced   bool  // the transmitter waits for the READs and atomics of [head, sent) to complete before a fenced request
	armAt    int64 // now() when the pipeline last went from empty to busy

	// RNR: the peer had no RECV for the head request.
	rnrWait  bool        // waiting to send it again; nothing is sent meanwhile
	rnrSince int64       // now() of the first RNR NAK of the head request; 0: none
	rnrTries int         // RNR NAKs of the head request so far
	rnrTimer *time.Timer // sends it again
}

func (s *sendQueue) init(n, maxSGE int) {
	s.ring = make([]sendWQE, n)
	sgls := make([]sge, n*maxSGE)
	for i := range s.ring {
		s.ring[i].sgl = sgls[i*maxSGE : i*maxSGE : (i+1)*maxSGE]
	}
}

func (s *sendQueue) at(i uint64) *sendWQE { return &s.ring[i%uint64(len(s.ring))] }

// dataInFlight reports whether a READ or an atomic is on the wire, whose
// data has yet to land in local memory: what a fenced request waits for.
// The caller holds mu.
func (s *sendQueue) dataInFlight() bool {
	for i := s.head; i < s.sent; i++ {
		if op := s.at(i).op; op == rdma.OpRead || op.IsAtomic() {
			return true
		}
	}
	return false
}

// awaitsPromptAnswer reports whether a request on the wire will be
// answered soon: one that did not let its ACK wait. The caller holds mu.
func (s *sendQueue) awaitsPromptAnswer() bool {
	for i := s.head; i < s.sent; i++ {
		if !s.at(i).ackMayWait {
			return true
		}
	}
	return false
}

type recvWQE struct {
	id       uint64
	sgl      []sge
	length   int
	localErr rdma.Status
}

func (w *recvWQE) load(wr *rdma.RecvWR, q *qp) {
	*w = recvWQE{id: wr.ID, sgl: w.sgl[:0]}
	for _, e := range wr.SGL {
		s := sge{off: e.Offset, n: e.Length}
		s.m, _ = e.MR.(*mr)
		if e.Length > 0 && w.localErr == 0 && !q.localOK(s, true) {
			w.localErr = rdma.StatusLocProtErr
		}
		w.sgl = append(w.sgl, s)
		w.length += e.Length
	}
}

func (w *recvWQE) copyFrom(o *recvWQE) {
	sgl := append(w.sgl[:0], o.sgl...)
	*w = *o
	w.sgl = sgl
}

type recvQueue struct {
	mu         sync.Mutex
	ring       []recvWQE
	head, tail uint64
	// busy: the responder is filling the head RECV (without the lock); a
	// flush waits for it to finish.
	busy bool
}

func (r *recvQueue) init(n, maxSGE int) {
	r.ring = make([]recvWQE, n)
	sgls := make([]sge, n*maxSGE)
	for i := range r.ring {
		r.ring[i].sgl = sgls[i*maxSGE : i*maxSGE : (i+1)*maxSGE]
	}
}

func (r *recvQueue) at(i uint64) *recvWQE { return &r.ring[i%uint64(len(r.ring))] }
