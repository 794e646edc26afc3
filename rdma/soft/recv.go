// SEND and WRITE_WITH_IMM at the responder: consuming RECVs, scattering payloads, and RNR.

package soft

import (
	"time"

	"github.com/rkv-io/rkv/rdma"
)

func (q *qp) doSend(req *request) (rdma.Status, string, error) {
	w, st, err := q.peekRecv()
	if w == nil {
		return st, "no RECV posted", err
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
		if !e.m.lock() {
			q.failRecv(w, rdma.StatusLocProtErr)
			return rdma.StatusRemOpErr, "RECV's MR deregistered", nil
		}
		err := q.readPayload(e.m.buf[e.off : e.off+n])
		e.m.unlock()
		if err != nil {
			return 0, "", err // the RECV stays posted and is flushed
		}
		left -= n
	}
	wc := rdma.Completion{Op: rdma.OpRecv, ByteLen: req.length}
	if req.op == wireSendImm {
		wc.Imm, wc.HasImm = req.imm, true
	}
	q.popRecv(w, wc)
	return rdma.StatusSuccess, "", q.respond(respAck, 0, req.seq, 0)
}

// peekRecv returns the oldest posted RECV without consuming it, waiting
// up to the RNR budget for one to be posted. It returns nil and
// RNR_RETRY_EXC_ERR when none comes, or nil and errQPGone when the QP
// leaves RTS meanwhile.
//
// Only the responder consumes RECVs and a flush waits for it to stop, so
// the RECV stays put until popRecv.
func (q *qp) peekRecv() (*recvWQE, rdma.Status, error) {
	r := &q.rq
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		r.mu.Lock()
		if r.head < r.tail {
			w := r.at(r.head)
			r.mu.Unlock()
			return w, 0, nil
		}
		r.mu.Unlock()
		if t == nil {
			if q.rsp.rnr <= 0 {
				return nil, rdma.StatusRNRRetryExcErr, nil
			}
			// Earlier answers must not wait behind this one.
			if err := q.rsp.w.flush(); err != nil {
				return nil, 0, err
			}
			t = time.NewTimer(q.rsp.rnr)
		}
		select {
		case <-r.posted:
		case <-t.C:
			return nil, rdma.StatusRNRRetryExcErr, nil
		case <-q.dead:
			return nil, 0, errQPGone
		}
	}
}

// failRecv moves the QP to ERR, so that whoever polls the error finds it
// there, and completes the RECV peekRecv returned with st. The responder
// then NAKs the request and serve finishes the move to ERR.
func (q *qp) failRecv(w *recvWQE, st rdma.Status) {
	if q.toError() {
		q.rsp.flipped = true
	}
	q.popRecv(w, rdma.Completion{Status: st, Op: rdma.OpRecv})
}

// popRecv completes the RECV peekRecv returned and removes it.
func (q *qp) popRecv(w *recvWQE, wc rdma.Completion) {
	q.pushRecv(w, wc)
	r := &q.rq
	r.mu.Lock()
	r.head++
	r.mu.Unlock()
}
