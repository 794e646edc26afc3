// SEND and WRITE_WITH_IMM at the responder: consuming RECVs, scattering payloads, and RNR.

package soft

import (
	"github.com/rkv-io/rkv/rdma"
)

func (q *qp) doSend(l *inLink, req *request) (rdma.Status, string, error) {
	// The RECV's buffers are the QP's requests': Close must wait for
	// the copy into them. A Close under way drops the request.
	if !q.inline.TryRLock() {
		return rdma.StatusSuccess, "", nil
	}
	defer q.inline.RUnlock()
	w := q.takeRecv()
	if w == nil {
		return rdma.StatusRNRRetryExcErr, "no RECV posted", nil
	}
	if w.localErr != 0 {
		q.failRecv(w, w.localErr)
		return rdma.StatusRemOpErr, "RECV's SGEs failed local checks", nil
	}
	if int(req.length) > w.length {
		// As InfiniBand has it: the RECV fails with LOC_LEN_ERR, the
		// sender gets REM_INV_REQ_ERR, and both QPs go to ERR.
		q.failRecv(w, rdma.StatusLocLenErr)
		return rdma.StatusRemInvReqErr, "SEND longer than the RECV's buffers", nil
	}
	left := int(req.length)
	for _, e := range w.sgl {
		if left == 0 {
			break
		}
		n := min(e.n, left)
		if n == 0 {
			continue
		}
		if !e.m.tryLock() {
			q.failRecv(w, rdma.StatusLocProtErr)
			return rdma.StatusRemOpErr, "RECV's MR deregistered", nil
		}
		err := l.readPayload(e.m.buf[e.off:e.off+n], q.budget)
		e.m.unlock()
		if err != nil {
			q.releaseRecv(w, nil) // the RECV stays posted, or is flushed
			return 0, "", err
		}
		left -= n
	}
	wc := rdma.Completion{Op: rdma.OpRecv, ByteLen: req.length}
	if req.op == wireSendImm {
		wc.Imm, wc.HasImm = req.imm, true
	}
	// An ACK the requester waits for leaves before the RECV completes:
	// the peer's answer to this SEND would otherwise often reach the
	// requester before it, and interrupt a Wait there reading for it (and
	// the requester's next request reach this side before its ACK of the
	// answer). One nobody waits for is held back.
	var err error
	if q.ackWaits(req) {
		err = l.holdAck(q, req.seq)
	} else if err = l.respond(q, respAck, 0, req.seq, 0); err == nil && l.br.Buffered() < requestHeaderSize {
		err = l.flush()
	}
	q.completeRecv(l, w, wc)
	return rdma.StatusSuccess, "", err
}

// completeRecv completes the RECV takeRecv returned, successfully: to the
// CQ's RecvHandler when it has one (l hands it over once its read is
// served), else to the CQ.
func (q *qp) completeRecv(l *inLink, w *recvWQE, wc rdma.Completion) {
	h := q.recvCQ.recvHandler.Load()
	if h == nil {
		q.releaseRecv(w, &wc)
		return
	}
	wc.ID, wc.QPNum = w.id, q.num
	l.handOver(q.recvCQ, h, wc)
	q.consumeRecv()
}

// takeRecv returns the oldest posted RECV and marks the receive queue busy,
// so that a flush leaves it to releaseRecv; nil when none is posted (the
// request is NAKed RNR at once: waiting would hold up the link) or the QP
// left RTS.
func (q *qp) takeRecv() *recvWQE {
	r := &q.rq
	r.mu.Lock()
	defer r.mu.Unlock()
	if q.gone() || r.head == r.tail {
		return nil
	}
	r.busy = true
	return r.at(r.head)
}

// releaseRecv ends what takeRecv began: with wc, the RECV completes and
// leaves the queue; without, it stays. A QP that went to ERR meanwhile is
// flushed now.
func (q *qp) releaseRecv(w *recvWQE, wc *rdma.Completion) {
	q.endRecv(w, wc, wc != nil)
}

// consumeRecv ends what takeRecv began for a RECV whose completion went to
// the CQ's RecvHandler: it leaves the queue.
func (q *qp) consumeRecv() { q.endRecv(nil, nil, true) }

// endRecv is releaseRecv and consumeRecv: the RECV leaves the queue if
// consumed, completing to the CQ with wc if not nil.
func (q *qp) endRecv(w *recvWQE, wc *rdma.Completion, consumed bool) {
	r := &q.rq
	r.mu.Lock()
	if wc != nil {
		q.pushRecv(w, *wc)
	}
	if consumed {
		r.head++
	}
	r.busy = false
	if q.state.Load() == uint32(rdma.QPStateError) {
		q.flushRecvLocked()
	}
	r.mu.Unlock()
}

// failRecv moves the QP to ERR, so that whoever polls the error finds it
// there, and completes the RECV takeRecv returned with st, flushing the
// rest. The responder then NAKs the request and serveRequest finishes the
// move to ERR.
func (q *qp) failRecv(w *recvWQE, st rdma.Status) {
	if q.toError() {
		q.rsp.flipped = true
	}
	q.releaseRecv(w, &rdma.Completion{Status: st, Op: rdma.OpRecv})
}
