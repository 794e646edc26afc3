// The requester's transmitter: sends posted requests in order, inline from PostSend when idle, else from the sender goroutine.

package soft

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// Transmitter ownership: whoever moves state from txIdle to txBusy sends
// until nothing is left. A poster finding it busy sets txMore instead, so
// the owner looks once more before going idle: no request is left behind
// and no PostSend waits for another.
const (
	txIdle int32 = iota
	txBusy
	txMore
)

const (
	// handoffSize: a request sending this much or more goes to the
	// sender goroutine, so PostSend does not block on a long write.
	handoffSize = 64 << 10
	// inlineBudget bounds the bytes one PostSend sends inline.
	inlineBudget = 256 << 10
)

type transmitter struct {
	state  atomic.Int32
	kick   chan struct{} // hands ownership to the sender goroutine
	w      frameWriter
	wqe    sendWQE // the owner's copy of the request being sent
	hdr    [requestHeaderSize]byte
	broken bool // a write failed: the receiver reports it
}

// epoch is the origin of now's monotonic clock.
var epoch = time.Now()

// now is a monotonic time in nanoseconds.
func now() int64 { return int64(time.Since(epoch)) }

var errMRGone = errors.New("a local MR was deregistered while its request was being sent")

// wireOps maps send opcodes to wire opcodes.
var wireOps = [...]uint8{
	rdma.OpWrite: wireWrite, rdma.OpWriteImm: wireWriteImm, rdma.OpSend: wireSend, rdma.OpSendImm: wireSendImm,
	rdma.OpRead: wireRead, rdma.OpCompareSwap: wireCompareSwap, rdma.OpFetchAdd: wireFetchAdd,
}

// kickTx makes sure the requests just posted get sent.
func (q *qp) kickTx() {
	for {
		switch q.tx.state.Load() {
		case txIdle:
			if q.tx.state.CompareAndSwap(txIdle, txBusy) {
				q.inline.RLock()
				if q.isClosed() {
					q.tx.state.Store(txIdle)
				} else {
					q.runTx(true)
				}
				q.inline.RUnlock()
				return
			}
		case txBusy:
			if q.tx.state.CompareAndSwap(txBusy, txMore) {
				return
			}
		default:
			return
		}
	}
}

// runTx sends as the transmitter's owner until the queue is empty, then
// gives ownership up; unless transmit passed it on.
func (q *qp) runTx(inline bool) {
	for {
		if !q.transmit(inline) {
			return
		}
		if q.tx.state.CompareAndSwap(txBusy, txIdle) {
			return
		}
		q.tx.state.Store(txBusy) // it was txMore: look again
	}
}

// transmit sends the requests waiting in the send queue. It returns false
// when it passed ownership on: to the sender goroutine (a large request
// met inline), or to the receiver (a fence waiting for earlier requests).
func (q *qp) transmit(inline bool) bool {
	s := &q.sq
	sentInline := 0
	for {
		s.mu.Lock()
		if q.state.Load() != uint32(rdma.QPStateRTS) || s.sent == s.tail {
			s.mu.Unlock()
			break
		}
		if s.linkDown != nil {
			// The receiver is gone and nothing is outstanding: the peer
			// cannot answer, as when a real requester exhausts its retries.
			reason := s.linkDown
			flipped := q.failSendLocked(rdma.StatusRetryExcErr)
			s.mu.Unlock()
			if flipped {
				q.finishError(fmt.Errorf("no connection to the peer: %w", reason))
			}
			break
		}
		if q.tx.broken || s.blocked {
			s.mu.Unlock()
			break
		}
		w := s.at(s.sent)
		if w.localErr == 0 && w.length > 0 && !sglAlive(w.sgl) {
			w.localErr = rdma.StatusLocProtErr
		}
		if w.localErr != 0 {
			// Nothing after it is sent; it completes once all before it have.
			s.blocked = true
			s.sent++
			var reason error
			if s.head == s.sent-1 {
				reason = q.completeLocalErrLocked()
			}
			s.mu.Unlock()
			if reason != nil {
				q.finishError(reason)
			}
			break
		}
		if w.fence && s.head < s.sent {
			// Flush what is batched (the requests to wait for may be in
			// it), then park unless they completed meanwhile: once
			// fenced is set, completeHead may hand ownership to the
			// sender goroutine at any moment.
			s.mu.Unlock()
			_ = q.flushTx()
			s.mu.Lock()
			if s.head < s.sent {
				s.fenced = true
				s.mu.Unlock()
				return false
			}
			s.mu.Unlock()
			continue
		}
		p := w.payload()
		if inline && (p >= handoffSize || sentInline+p > inlineBudget) {
			s.mu.Unlock()
			_ = q.flushTx()
			q.tx.kick <- struct{}{} // never blocks: only the owner kicks, once
			return false
		}
		sentInline += p
		q.tx.wqe.copyFrom(w)
		seq := q.seqOf(s.sent)
		if s.head == s.sent {
			q.armLocked()
		}
		s.sent++
		s.mu.Unlock()
		if err := q.writeRequest(&q.tx.wqe, seq); err != nil {
			if errors.Is(err, errMRGone) {
				q.enterError(fmt.Errorf("request %d: %w", q.tx.wqe.id, err))
			} else {
				q.tx.broken = true // the receiver sees the connection fail and reports it
			}
			return true
		}
	}
	_ = q.flushTx()
	return true
}

func sglAlive(sgl []sge) bool {
	for i := range sgl {
		if sgl[i].n > 0 && sgl[i].m.dead.Load() {
			return false
		}
	}
	return true
}

func (q *qp) flushTx() error {
	if q.tx.broken || q.tx.w.conn == nil {
		return nil
	}
	if err := q.tx.w.flush(); err != nil {
		q.tx.broken = true
		return err
	}
	return nil
}

// armLocked notes that the pipeline, empty until now, has a request on the
// wire: the peer has q.budget from now to answer.
func (q *qp) armLocked() {
	t := now()
	q.rx.progress.Store(t)
	if !q.sq.armed {
		q.sq.armed = true
		_ = q.rx.conn.SetReadDeadline(epoch.Add(time.Duration(t) + q.budget))
	}
	q.needReaderLocked(t)
}

// completeLocalErrLocked completes the head request, which failed locally,
// and moves the QP to ERR. It returns the reason to pass to finishError,
// or nil when the caller need not call it.
func (q *qp) completeLocalErrLocked() error {
	w := q.sq.at(q.sq.head)
	reason := fmt.Errorf("request %d (%v) failed locally with %v", w.id, w.op, w.localErr)
	if !q.failSendLocked(w.localErr) {
		return nil
	}
	return reason
}

// writeRequest writes one request frame: header, then payload straight
// from the registered memory.
func (q *qp) writeRequest(w *sendWQE, seq uint32) error {
	r := request{
		op: wireOps[w.op], seq: seq, rkey: w.rkey, addr: w.raddr, length: w.length,
		imm: w.imm, compareAdd: w.compareAdd, swap: w.swap,
	}
	encodeRequest(q.tx.hdr[:], &r)
	if err := q.tx.w.write(q.tx.hdr[:]); err != nil {
		return err
	}
	if !hasPayload(r.op) {
		return nil
	}
	for _, e := range w.sgl {
		if e.n == 0 {
			continue
		}
		if !e.m.lock() {
			return errMRGone
		}
		var err error
		if e.n <= copyMax {
			err = q.tx.w.write(e.m.buf[e.off : e.off+e.n])
		} else {
			err = q.tx.w.writeLarge(e.m.buf[e.off:e.off+e.n], &q.rx.progress)
		}
		e.m.unlock()
		if err != nil {
			return err
		}
	}
	return nil
}
