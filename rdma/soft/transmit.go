// The requester's transmitter: sends posted requests in order onto the QP's link, inline from PostSend when idle, else from the sender goroutine.

package soft

import (
	"context"
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
	w      frameBatch    // requests encoded, not yet handed to the link
	wqe    sendWQE       // the owner's copy of the request being sent
	dst    uint32        // the peer QP, which every request names
	hdr    [requestHeaderSize]byte
	pieces [][]byte // scratch: the SGEs of a large request
	broken bool     // a write failed: the link's reader reports it
	// nonRead: the batch holds a request other than a READ.
	nonRead bool
}

// epoch is the origin of now's monotonic clock.
var epoch = time.Now()

// now is a monotonic time in nanoseconds.
func now() int64 { return int64(time.Since(epoch)) }

// wireOps maps send opcodes to wire opcodes.
var wireOps = [...]uint8{
	rdma.OpWrite: wireWrite, rdma.OpWriteImm: wireWriteImm, rdma.OpSend: wireSend, rdma.OpSendImm: wireSendImm,
	rdma.OpRead: wireRead, rdma.OpCompareSwap: wireCompareSwap, rdma.OpFetchAdd: wireFetchAdd,
}

// sender is the QP's sender goroutine: it attaches the QP to its peer,
// then sends whatever PostSend hands it.
func (q *qp) sender(ctx context.Context, remote rdma.QPInfo) {
	defer q.wg.Done()
	if err := q.connect(ctx, remote); err != nil {
		if ctx.Err() == nil && !q.gone() {
			q.dev.log.Warn("rdma/soft: cannot connect QP", "device", q.dev.name, "qp", q.num,
				"peer", remote.Addr, "peer_qp", remote.QPNum, "err", err)
		}
		q.sq.mu.Lock()
		q.sq.linkDown = err
		q.sq.mu.Unlock()
	}
	q.runTx(false)
	for {
		select {
		case <-q.tx.kick:
			q.runTx(false)
		case <-q.dead:
			return
		}
	}
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

// kickTxAsync is kickTx for callers that must not send themselves (a
// timer): an idle transmitter is handed to the sender goroutine.
func (q *qp) kickTxAsync() {
	for {
		switch q.tx.state.Load() {
		case txIdle:
			if q.tx.state.CompareAndSwap(txIdle, txBusy) {
				q.tx.kick <- struct{}{} // never blocks: only the owner kicks, once
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
// met inline), or to the reader (a fence waiting for earlier requests).
func (q *qp) transmit(inline bool) bool {
	s := &q.sq
	l := q.out.Load()
	sentInline := 0
	for {
		s.mu.Lock()
		if q.state.Load() != uint32(rdma.QPStateRTS) || s.sent == s.tail {
			s.mu.Unlock()
			break
		}
		if s.linkDown != nil {
			// No link and nothing outstanding: the peer cannot answer, as
			// when a real requester exhausts its retries.
			reason := s.linkDown
			flipped := q.failSendLocked(rdma.StatusRetryExcErr)
			s.mu.Unlock()
			if flipped {
				q.finishError(fmt.Errorf("no link to the peer: %w", reason))
			}
			break
		}
		if l == nil || q.tx.broken || s.blocked || s.rnrWait {
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
		if w.fence && s.dataInFlight() {
			// Flush what is batched (the requests to wait for may be in
			// it), then park unless they completed meanwhile: once
			// fenced is set, completeHead may hand ownership to the
			// sender goroutine at any moment.
			s.mu.Unlock()
			q.flushTx(l)
			s.mu.Lock()
			if s.dataInFlight() {
				s.fenced = true
				s.mu.Unlock()
				return false
			}
			s.mu.Unlock()
			continue
		}
		p := w.payload()
		if inline && (p >= handoffSize || sentInline+p > inlineBudget || p > copyMax && l.w.busy()) {
			// Long writes, and waits for another's, are the sender
			// goroutine's.
			s.mu.Unlock()
			q.flushTx(l)
			q.tx.kick <- struct{}{} // never blocks: only the owner kicks, once
			return false
		}
		if p > 0 && !lockSGL(w.sgl) {
			// The frame must leave whole, as other QPs' frames share the
			// link: the payload's MRs are held until it has. One being
			// deregistered fails the request, as at post time.
			w.localErr = rdma.StatusLocProtErr
			s.mu.Unlock()
			continue
		}
		sentInline += p
		// Nobody waits for an unsignaled WRITE's or SEND's ACK: the peer
		// may hold it back, unless the ring is half full of requests on
		// the wire, whose slots the ACKs free.
		w.ackMayWait = !w.signaled && w.pushes() && s.sent-s.head < uint64(len(s.ring)/2)
		q.tx.wqe.copyFrom(w)
		seq := q.seqOf(s.sent)
		if s.head == s.sent {
			q.armLocked(l)
		}
		s.sent++
		s.mu.Unlock()
		if err := q.writeRequest(l, &q.tx.wqe, seq); err != nil {
			q.tx.broken = true // the link's reader sees it fail and reports it
			return true
		}
	}
	q.flushTx(l)
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

// flushTx hands the batch to the link.
func (q *qp) flushTx(l *outLink) {
	if len(q.tx.w.buf) == 0 {
		return
	}
	if l != nil && !q.tx.broken {
		var err error
		if q.dev.corks.running.Load() && q.dev.corked(&l.w, q.tx.w.buf, &q.tx.w.writes) {
			// A RecvHandler runs: the frame leaves with what it posts.
		} else if !q.tx.nonRead && l.bunched.Load() {
			// Doorbell batching across QPs: the goroutines woken with
			// this one by the link's last batch of responses run while
			// it yields, and their READs leave in its write.
			err = l.w.submitYielding(q.tx.w.buf, &q.tx.w.writes)
		} else {
			err = l.w.submit(q.tx.w.buf, &q.tx.w.writes)
		}
		if err != nil {
			q.tx.broken = true
		}
	}
	q.tx.w.buf = q.tx.w.buf[:0]
	q.tx.nonRead = false
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

// writeRequest writes one request frame: the header, then the payload
// from registered memory, copied into the batch when small, else by writev
// straight from it. The caller locked the payload's MRs; writeRequest
// unlocks them.
func (q *qp) writeRequest(l *outLink, w *sendWQE, seq uint32) error {
	r := request{
		op: wireOps[w.op], ackMayWait: w.ackMayWait, dst: q.tx.dst, seq: seq, rkey: w.rkey, addr: w.raddr,
		length: w.length, imm: w.imm, compareAdd: w.compareAdd, swap: w.swap,
	}
	payload := w.payload()
	if payload > 0 {
		defer unlockSGL(w.sgl)
	}
	b := &q.tx.w
	if payload <= copyMax {
		if len(b.buf)+requestHeaderSize+payload > cap(b.buf) {
			q.flushTx(l)
		}
		if w.op != rdma.OpRead {
			q.tx.nonRead = true // after the flush, which starts a new batch
		}
		n := len(b.buf)
		b.buf = b.buf[:n+requestHeaderSize]
		encodeRequest(b.buf[n:], &r)
		for _, e := range w.sgl {
			if e.n > 0 && payload > 0 {
				b.buf = append(b.buf, e.m.buf[e.off:e.off+e.n]...)
			}
		}
		return nil
	}
	encodeRequest(q.tx.hdr[:], &r)
	b.buf = append(b.buf, q.tx.hdr[:]...)
	q.tx.pieces = q.tx.pieces[:0]
	for _, e := range w.sgl {
		if e.n > 0 {
			q.tx.pieces = append(q.tx.pieces, e.m.buf[e.off:e.off+e.n])
		}
	}
	err := l.w.writeFrame(b.buf, &b.writes, nil, q.tx.pieces, &l.progress)
	clear(q.tx.pieces)
	b.buf = b.buf[:0]
	q.tx.nonRead = false
	return err
}

// lockSGL holds the MRs of an SGE list against deregistration, or holds
// nothing and reports false when one is going away. It only tries: a
// Deregister under way must not wait for a write that waits for the peer.
func lockSGL(sgl []sge) bool {
	for i := range sgl {
		if sgl[i].n > 0 && !sgl[i].m.tryLock() {
			unlockSGL(sgl[:i])
			return false
		}
	}
	return true
}

func unlockSGL(sgl []sge) {
	for i := range sgl {
		if sgl[i].n > 0 {
			sgl[i].m.unlock()
		}
	}
}
