// The requester's receiving side: reads responses, lands READ data in place, and completes requests in order.

package soft

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// receiver is the QP's read side of its requester connection; whoever holds
// the reader token (reader.go) uses it.
type receiver struct {
	conn     *net.TCPConn
	br       *bufio.Reader
	hdr      [responseHeaderSize]byte
	got      int          // bytes read since the last completion or deadline check
	progress atomic.Int64 // now() of the last sign of life of the peer

	owner        atomic.Int32
	eager        atomic.Bool
	pending      atomic.Bool   // requests on the wire and nobody reading
	pendingSince atomic.Int64  // now() when pending was set
	kick         chan struct{} // the goroutine should look at owner

	// The inline reader's CQ and context; set only while it holds the token.
	inline *cq
	ctx    context.Context
}

// testHookLand, when set by a test, runs before a response's data is
// landed in the request's buffers.
var testHookLand func(inline bool)

var (
	// errBadResponse marks protocol violations by the peer (BAD_RESP_ERR).
	errBadResponse = errors.New("bad response")
	// errInterrupted: an inline reader stops to let its Wait return.
	errInterrupted = errors.New("interrupted")
)

// rxFail settles the send queue after the connection failed or closed:
// RETRY_EXC_ERR or BAD_RESP_ERR for the oldest request and a flush of the
// rest, or, with nothing posted, a link marked down. The caller holds the
// token, which dies.
func (q *qp) rxFail(err error) {
	q.rx.owner.Store(rxDead)
	q.kickRx()
	_ = q.rx.conn.Close()
	s := &q.sq
	s.mu.Lock()
	s.readerActive = false
	flipped := false
	switch st := rdma.QPState(q.state.Load()); {
	case st == rdma.QPStateError:
		q.flushSendLocked()
	case st == stateClosed:
	case errors.Is(err, errBadResponse):
		flipped = q.failSendLocked(rdma.StatusBadRespErr)
	case s.head < s.tail:
		flipped = q.failSendLocked(rdma.StatusRetryExcErr)
	default:
		s.linkDown = err
	}
	s.mu.Unlock()
	if flipped {
		q.finishError(err)
	}
}

// readFrame reads one response and completes its request. pushed says a
// completion reached the CQ, idle that nothing is left on the wire. An
// inline reader may be interrupted between frames.
func (q *qp) readFrame(inline bool) (pushed, idle bool, err error) {
	if err := q.readTimed(q.rx.hdr[:], inline); err != nil {
		if err == errInterrupted {
			return false, false, err
		}
		return false, false, q.readError(err)
	}
	r, err := decodeResponse(q.rx.hdr[:])
	if err != nil {
		return false, false, fmt.Errorf("%w: %w", errBadResponse, err)
	}
	s := &q.sq
	s.mu.Lock()
	outstanding := s.head < s.sent
	i := s.head
	s.mu.Unlock()
	if !outstanding {
		return false, false, fmt.Errorf("%w: response %d with no request outstanding", errBadResponse, r.seq)
	}
	// Only the token holder completes [head, sent): w stays put.
	w := s.at(i)
	if r.seq != q.seqOf(i) {
		return false, false, fmt.Errorf("%w: response %d, expected %d", errBadResponse, r.seq, q.seqOf(i))
	}
	if testHookLand != nil {
		testHookLand(inline)
	}
	st, err := q.land(w, &r)
	if err != nil {
		return false, false, err
	}
	pushed, idle = q.completeHead(st, inline)
	if st != rdma.StatusSuccess {
		return pushed, idle, fmt.Errorf("peer answered request %d (%v) with %v", w.id, w.op, st)
	}
	return pushed, idle, nil
}

func (q *qp) readError(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("peer QP %d did not answer within %v", q.remote.QPNum, q.budget)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("peer QP %d closed the connection", q.remote.QPNum)
	}
	return fmt.Errorf("connection to peer QP %d: %w", q.remote.QPNum, err)
}

// land checks a response against its request and moves its data, if any,
// into the request's local SGEs. It returns the completion status, or an
// error when the connection cannot go on.
func (q *qp) land(w *sendWQE, r *response) (rdma.Status, error) {
	switch r.kind {
	case respNAK:
		return r.status, nil
	case respAck:
		if w.op == rdma.OpRead || w.op.IsAtomic() {
			break
		}
		return rdma.StatusSuccess, nil
	case respReadData:
		if w.op != rdma.OpRead || r.length != w.length {
			break
		}
		return q.landRead(w)
	case respAtomic:
		if !w.op.IsAtomic() {
			break
		}
		e := w.sgl[0]
		if !e.m.lock() {
			return rdma.StatusLocProtErr, nil
		}
		binary.NativeEndian.PutUint64(e.m.buf[e.off:e.off+8], r.value)
		e.m.unlock()
		return rdma.StatusSuccess, nil
	}
	return 0, fmt.Errorf("%w: response kind %d of %d bytes to %v request %d of %d bytes",
		errBadResponse, r.kind, r.length, w.op, w.id, w.length)
}

// landRead reads READ data from the socket straight into the target SGEs.
func (q *qp) landRead(w *sendWQE) (rdma.Status, error) {
	st := rdma.StatusSuccess
	for _, e := range w.sgl {
		if e.n == 0 {
			continue
		}
		if !e.m.lock() {
			// Deregistered since the post: drop the data, fail the request.
			st = rdma.StatusLocProtErr
			if err := q.discardTimed(e.n); err != nil {
				return 0, q.readError(err)
			}
			continue
		}
		err := q.readTimed(e.m.buf[e.off:e.off+e.n], false)
		e.m.unlock()
		if err != nil {
			return 0, q.readError(err)
		}
	}
	return st, nil
}

// completeHead completes the oldest request with st, moving the QP to ERR
// when st is an error. It reports whether a completion reached the CQ and
// whether nothing is left on the wire.
func (q *qp) completeHead(st rdma.Status, inline bool) (pushed, idle bool) {
	s := &q.sq
	s.mu.Lock()
	w := s.at(s.head)
	// An error moves the QP to ERR before its completion is visible.
	flipped := st != rdma.StatusSuccess && q.toError()
	pushed = q.pushSend(w, st, inline)
	s.head++
	q.rx.progress.Store(now())
	q.rx.got = 0
	var reason error
	switch {
	case st != rdma.StatusSuccess:
		if flipped {
			reason = fmt.Errorf("peer answered request %d (%v) with %v", w.id, w.op, st)
		}
	case s.head < s.sent && s.at(s.head).localErr != 0:
		reason = q.completeLocalErrLocked()
		pushed = true
	case s.fenced && s.head == s.sent:
		s.fenced = false
		q.tx.kick <- struct{}{} // the parked owner's turn; never blocks
	}
	idle = s.head == s.sent
	s.mu.Unlock()
	if reason != nil {
		q.finishError(reason)
	}
	return pushed, idle
}

// readTimed fills p, waiting as long as the peer shows signs of life. An
// inline reader that has read nothing of p yet returns errInterrupted when
// its CQ has completions or its context is done.
func (q *qp) readTimed(p []byte, inline bool) error {
	fresh := true
	for len(p) > 0 {
		n, err := q.rx.br.Read(p)
		p = p[n:]
		q.rx.got += n
		fresh = fresh && n == 0
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !q.stillWaiting() {
			return err
		}
		if inline && fresh && (q.rx.inline.nonEmpty() || q.rx.ctx.Err() != nil) {
			return errInterrupted
		}
	}
	return nil
}

func (q *qp) discardTimed(n int) error {
	for n > 0 {
		k, err := q.rx.br.Discard(n)
		n -= k
		q.rx.got += k
		if err != nil && !(errors.Is(err, os.ErrDeadlineExceeded) && q.stillWaiting()) {
			return err
		}
	}
	return nil
}

// stillWaiting runs when the read deadline passes (or an interruption set
// it in the past): with nothing outstanding it disarms the deadline;
// otherwise it reports whether the peer showed life within the budget, and
// sets the deadline again if so.
func (q *qp) stillWaiting() bool {
	s := &q.sq
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == s.sent {
		s.armed = false
		_ = q.rx.conn.SetReadDeadline(time.Time{})
		return true
	}
	if q.rx.got > 0 {
		q.rx.got = 0
		q.rx.progress.Store(now())
	}
	deadline := q.rx.progress.Load() + int64(q.budget)
	if now() >= deadline {
		return false
	}
	_ = q.rx.conn.SetReadDeadline(epoch.Add(time.Duration(deadline)))
	s.armed = true
	return true
}
