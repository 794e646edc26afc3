// Completions, the move to ERR, and flushing the work queues.

package soft

import (
	"errors"

	"github.com/rkv-io/rkv/rdma"
)

// errModifyToError is the reason of a QP moved to ERR by its owner.
var errModifyToError = errors.New("ModifyToError")

// completionOps maps send opcodes to the ibv_wc_opcode set the requester
// reports: the immediate variants complete as their plain forms.
var completionOps = [...]rdma.Opcode{
	rdma.OpWrite: rdma.OpWrite, rdma.OpWriteImm: rdma.OpWrite, rdma.OpSend: rdma.OpSend, rdma.OpSendImm: rdma.OpSend,
	rdma.OpRead: rdma.OpRead, rdma.OpCompareSwap: rdma.OpCompareSwap, rdma.OpFetchAdd: rdma.OpFetchAdd,
}

// pushSend reports the completion of a send-queue request: always on
// error, on success only when signaled. It reports whether it did.
// fromInline says the caller is a Wait on the send CQ reading inline.
func (q *qp) pushSend(w *sendWQE, st rdma.Status, fromInline bool) bool {
	if st == rdma.StatusSuccess && !w.signaled || q.state.Load() == uint32(stateClosed) {
		return false
	}
	wc := rdma.Completion{ID: w.id, Status: st, Op: completionOps[w.op], QPNum: q.num}
	if st == rdma.StatusSuccess {
		wc.ByteLen = w.length
	}
	q.sendCQ.push(&wc, fromInline)
	return true
}

func (q *qp) pushRecv(w *recvWQE, wc rdma.Completion) {
	if q.state.Load() == uint32(stateClosed) {
		return
	}
	wc.ID, wc.QPNum = w.id, q.num
	q.recvCQ.push(&wc, false)
}

// toError moves the QP to ERR. It reports whether this call did, in which
// case the caller must call finishError once it holds no queue lock.
func (q *qp) toError() bool {
	for {
		s := q.state.Load()
		if s == uint32(rdma.QPStateError) || s == uint32(stateClosed) {
			return false
		}
		if q.state.CompareAndSwap(s, uint32(rdma.QPStateError)) {
			return true
		}
	}
}

// finishError completes the move to ERR: the QP leaves its links (the
// peer's requests then fail as against a QP in ERR on a real fabric), its
// sender goroutine stops, and the queues are flushed, but for a request
// whose data is landing, which the lander flushes after it.
func (q *qp) finishError(reason error) {
	q.mu.Lock()
	q.reason = reason
	cancel := q.cancel
	q.mu.Unlock()
	q.kill()
	if errors.Is(reason, errModifyToError) {
		q.dev.log.Debug("rdma/soft: QP moved to ERR", "device", q.dev.name, "qp", q.num, "reason", reason)
	} else {
		q.dev.log.Warn("rdma/soft: QP moved to ERR", "device", q.dev.name, "qp", q.num, "reason", reason)
	}
	q.leaveLinks()
	if cancel != nil {
		cancel()
	}
	q.sq.mu.Lock()
	q.stopRNRLocked()
	if !q.sq.landing {
		q.flushSendLocked()
	}
	q.sq.mu.Unlock()
	q.rq.mu.Lock()
	if !q.rq.busy {
		q.flushRecvLocked()
	}
	q.rq.mu.Unlock()
}

// leaveLinks takes q off both its links: its requests' link (telling the
// peer's responder), and the link its responder serves (telling the
// peer's requester, whose outstanding requests then fail at once, unless
// the responder already NAKed it into ERR).
func (q *qp) leaveLinks() {
	q.mu.Lock()
	in := q.in
	q.in = nil
	q.mu.Unlock()
	if in != nil && in.remove(q) && !q.rsp.nakd.Load() {
		var b [responseHeaderSize]byte
		encodeGone(b[:], qpEnds{dst: q.remote.QPNum, src: q.num})
		in.w.post(b[:])
	}
	q.leaveOut(true)
}

// kill closes q.dead, once: goroutines waiting for the peer's RTR or a
// kick give up.
func (q *qp) kill() { q.once.Do(func() { close(q.dead) }) }

// enterError moves the QP to ERR for reason, unless it is there already.
func (q *qp) enterError(reason error) {
	if q.toError() {
		q.finishError(reason)
	}
}

// flushSendLocked completes every request left with WR_FLUSH_ERR.
func (q *qp) flushSendLocked() {
	s := &q.sq
	for ; s.head < s.tail; s.head++ {
		q.pushSend(s.at(s.head), rdma.StatusWRFlushErr, false)
	}
	s.sent = s.tail
	s.fenced = false
}

// failSendLocked moves the QP to ERR, completes the oldest request with st
// and, unless its link's reader is landing a response, flushes the rest.
// It reports whether the caller must call finishError. The state moves
// first: whoever polls an error completion finds the QP in ERR.
func (q *qp) failSendLocked(st rdma.Status) bool {
	s := &q.sq
	flipped := q.toError()
	if s.head < s.tail {
		q.pushSend(s.at(s.head), st, false)
		s.head++
		s.sent = max(s.sent, s.head)
	}
	if !s.landing {
		q.flushSendLocked()
	}
	return flipped
}

// flushRecvLocked completes every posted RECV with WR_FLUSH_ERR.
func (q *qp) flushRecvLocked() {
	r := &q.rq
	for ; r.head < r.tail; r.head++ {
		q.pushRecv(r.at(r.head), rdma.Completion{Status: rdma.StatusWRFlushErr, Op: rdma.OpRecv})
	}
}
