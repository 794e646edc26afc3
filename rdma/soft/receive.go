// The requester's receiving side: reads a link's frames, lands READ data in place, and completes each QP's requests in order.

package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// receiver is a QP's part in reading its link.
type receiver struct {
	// eager: the QP's send CQ serves other QPs too, so its link's
	// goroutine must read (an inline Wait would not see their completions).
	eager atomic.Bool
}

// testHookLand, when set by a test, runs before a response's data is
// landed in the request's buffers.
var testHookLand func(inline bool)

var (
	// errBadResponse marks protocol violations by the peer (BAD_RESP_ERR).
	errBadResponse = errors.New("bad response")
	// errInterrupted: an inline reader stops to let its Wait return.
	errInterrupted = errors.New("interrupted")
	// errQPGone: the QP left RTS (or was closed) meanwhile.
	errQPGone = errors.New("QP left RTS")
)

// readFrame reads one frame and hands it to its QP. For an inline reader
// (c not nil) pushed says a completion reached c and idle that the frame's
// QP has nothing left on the wire; an inline reader may be interrupted
// between frames.
func (l *outLink) readFrame(c *cq) (pushed, idle bool, err error) {
	if err := l.readTimed(l.hdr[:], c, true); err != nil {
		if err == errInterrupted {
			return false, false, err
		}
		return false, false, l.readError(err)
	}
	switch l.hdr[4] {
	case respAttachAck:
		a, err := decodeAttachAck(l.hdr[:])
		if err != nil {
			return false, false, fmt.Errorf("%w: %w", errBadResponse, err)
		}
		return false, false, l.acked(a)
	case respGone:
		p, err := decodeGone(l.hdr[:])
		if err != nil {
			return false, false, fmt.Errorf("%w: %w", errBadResponse, err)
		}
		return l.peerGone(p, c)
	}
	r, err := decodeResponse(l.hdr[:])
	if err != nil {
		return false, false, fmt.Errorf("%w: %w", errBadResponse, err)
	}
	q := l.view.Load().lookup(r.dst)
	if q == nil {
		// A QP that left the link: its responses are read and dropped.
		return false, false, l.discard(int(r.length))
	}
	pushed, idle, err = q.onResponse(l, &r, c)
	l.noteBunched(q)
	// Another QP's being idle is no reason for an inline reader to stop.
	return pushed, idle && q.sendCQ == c, err
}

// noteBunched counts a response read for q, and when the read buffer is
// empty says whether its read brought responses for more than one QP.
func (l *outLink) noteBunched(q *qp) {
	if q != l.bunchedLast {
		l.bunchedQPs++
		l.bunchedLast = q
	}
	if l.br.Buffered() == 0 {
		if b := l.bunchedQPs > 1; b != l.bunched.Load() {
			l.bunched.Store(b)
		}
		l.bunchedQPs, l.bunchedLast = 0, nil
	}
}

func (l *outLink) readError(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("peer device %s stalled in mid-frame", l.key.addr)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("peer device %s closed the link", l.key.addr)
	}
	return fmt.Errorf("link to %s: %w", l.key.addr, err)
}

// acked hands an attach acknowledgement to the QP waiting for it.
func (l *outLink) acked(a attachAck) error {
	q := l.view.Load().lookup(a.dst)
	if q == nil {
		return nil // it gave up waiting
	}
	if a.src != q.remote.QPNum {
		return fmt.Errorf("%w: QP %d acknowledged the attach of QP %d to QP %d", errBadResponse, a.src, a.dst, q.remote.QPNum)
	}
	select {
	case q.ackc <- attachResult{code: a.code}:
	default:
	}
	return nil
}

// peerGone handles the peer's word that q's peer QP left RTS: q's
// outstanding requests fail with RETRY_EXC_ERR at once, as against a dead
// QP, or, with nothing posted, the next one does. q leaves the link.
func (l *outLink) peerGone(p qpEnds, c *cq) (pushed, idle bool, err error) {
	q := l.view.Load().lookup(p.dst)
	if q == nil {
		return false, false, nil
	}
	if p.src != q.remote.QPNum {
		return false, false, fmt.Errorf("%w: QP %d said it left, QP %d is connected to QP %d", errBadResponse, p.src, p.dst, q.remote.QPNum)
	}
	s := &q.sq
	s.mu.Lock()
	flipped := false
	switch {
	case q.gone():
	case s.head < s.tail:
		flipped = q.failSendLocked(rdma.StatusRetryExcErr)
		pushed = q.sendCQ == c
	default:
		s.linkDown = errPeerGone
	}
	s.mu.Unlock()
	q.leaveOut(false)
	if flipped {
		q.finishError(fmt.Errorf("peer QP %d left RTS", p.src))
	}
	return pushed, q.sendCQ == c, nil
}

// onResponse checks a response against q's oldest request, lands its data
// and completes the request.
func (q *qp) onResponse(l *outLink, r *response, c *cq) (pushed, idle bool, err error) {
	if !q.inline.TryRLock() {
		return false, true, l.discard(int(r.length)) // Close is under way
	}
	defer q.inline.RUnlock()
	s := &q.sq
	s.mu.Lock()
	if q.gone() {
		s.mu.Unlock()
		return false, true, l.discard(int(r.length))
	}
	if s.head == s.sent {
		s.mu.Unlock()
		return q.badResponse(l, r, c, fmt.Errorf("response %d with no request outstanding", r.seq))
	}
	s.landing = true
	i := s.head
	s.mu.Unlock()
	// Only the reader completes [head, sent) while landing: w stays put.
	w := s.at(i)
	if r.seq != q.seqOf(i) {
		return q.badResponse(l, r, c, fmt.Errorf("response %d, expected %d", r.seq, q.seqOf(i)))
	}
	if err := matches(w, r); err != nil {
		return q.badResponse(l, r, c, err)
	}
	if testHookLand != nil {
		testHookLand(c != nil)
	}
	st, err := q.land(l, w, r)
	if err != nil {
		return false, false, err
	}
	if r.kind == respNAK && r.status == rdma.StatusRNRRetryExcErr {
		return q.rnrNAK(c)
	}
	pushed, idle = q.completeHead(st, c)
	return pushed, idle, nil
}

// matches checks that a response is one the request can have.
func matches(w *sendWQE, r *response) error {
	ok := false
	switch r.kind {
	case respNAK:
		ok = true
	case respAck:
		ok = w.op != rdma.OpRead && !w.op.IsAtomic()
	case respReadData:
		ok = w.op == rdma.OpRead && r.length == w.length
	case respAtomic:
		ok = w.op.IsAtomic()
	}
	if !ok {
		return fmt.Errorf("response kind %d of %d bytes to %v request %d of %d bytes", r.kind, r.length, w.op, w.id, w.length)
	}
	return nil
}

// badResponse fails q with BAD_RESP_ERR for a response that breaks the
// protocol in a way that leaves the link in step: the peer's fault, but
// this QP's only. The response's data is dropped.
func (q *qp) badResponse(l *outLink, r *response, c *cq, why error) (pushed, idle bool, err error) {
	s := &q.sq
	s.mu.Lock()
	s.landing = false
	flipped := q.failSendLocked(rdma.StatusBadRespErr)
	s.mu.Unlock()
	if flipped {
		q.finishError(fmt.Errorf("%w: %w", errBadResponse, why))
	}
	return q.sendCQ == c, true, l.discard(int(r.length))
}

// land moves a response's data, if any, into the request's local SGEs. It
// returns the completion status, or an error when the link cannot go on.
func (q *qp) land(l *outLink, w *sendWQE, r *response) (rdma.Status, error) {
	switch r.kind {
	case respNAK:
		return r.status, nil
	case respReadData:
		return l.landRead(w)
	case respAtomic:
		e := w.sgl[0]
		if !e.m.tryLock() {
			return rdma.StatusLocProtErr, nil
		}
		binary.NativeEndian.PutUint64(e.m.buf[e.off:e.off+8], r.value)
		e.m.unlock()
	}
	return rdma.StatusSuccess, nil
}

// landRead reads READ data from the link straight into the target SGEs.
func (l *outLink) landRead(w *sendWQE) (rdma.Status, error) {
	st := rdma.StatusSuccess
	for _, e := range w.sgl {
		if e.n == 0 {
			continue
		}
		if !e.m.tryLock() {
			// Deregistered since the post: drop the data, fail the request.
			st = rdma.StatusLocProtErr
			if err := l.discard(e.n); err != nil {
				return 0, err
			}
			continue
		}
		err := l.readTimed(e.m.buf[e.off:e.off+e.n], nil, false)
		e.m.unlock()
		if err != nil {
			return 0, l.readError(err)
		}
	}
	return st, nil
}

// completeHead completes the oldest request with st, moving the QP to ERR
// when st is an error. pushed says a completion reached c, idle that
// nothing of q is left on the wire.
func (q *qp) completeHead(st rdma.Status, c *cq) (pushed, idle bool) {
	s := &q.sq
	s.mu.Lock()
	s.landing = false
	w := s.at(s.head)
	// An error moves the QP to ERR before its completion is visible.
	flipped := st != rdma.StatusSuccess && q.toError()
	pushed = q.pushSend(w, st, q.sendCQ == c) && q.sendCQ == c
	s.head++
	s.rnrSince, s.rnrTries = 0, 0
	var reason error
	switch {
	case q.gone():
		// Gone to ERR, here or while the data landed: what is left is
		// flushed, as nobody else would.
		q.flushSendLocked()
		if flipped {
			reason = fmt.Errorf("peer answered request %d (%v) with %v", w.id, w.op, st)
		}
	case s.head < s.sent && s.at(s.head).localErr != 0:
		reason = q.completeLocalErrLocked()
		pushed = pushed || q.sendCQ == c
	case s.fenced && !s.dataInFlight():
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

// RNR retries: the first after rnrFirst, each later one twice as late, up
// to rnrMax apart, until the QP's RNR budget is spent.
const (
	rnrFirst = 100 * time.Microsecond
	rnrMax   = 10 * time.Millisecond
)

// rnrNAK handles the peer's RNR NAK of the oldest request: the peer had no
// RECV for it and dropped everything after it. The requests are sent again
// from it after a delay, as a requester's rnr_retry does, or, once the RNR
// budget is spent, it completes with RNR_RETRY_EXC_ERR.
func (q *qp) rnrNAK(c *cq) (pushed, idle bool, err error) {
	s := &q.sq
	s.mu.Lock()
	t := now()
	if s.rnrSince == 0 {
		s.rnrSince = t
	}
	if q.gone() || time.Duration(t-s.rnrSince) >= q.rnrBudget() {
		s.mu.Unlock()
		pushed, idle = q.completeHead(rdma.StatusRNRRetryExcErr, c)
		return pushed, idle, nil
	}
	s.landing = false
	s.sent = s.head
	s.blocked = false // a failed request behind is met, and blocks, again
	s.rnrWait = true
	delay := rnrMax
	if s.rnrTries < 7 {
		delay = min(rnrFirst<<s.rnrTries, rnrMax)
	}
	s.rnrTries++
	if s.rnrTimer == nil {
		s.rnrTimer = time.AfterFunc(delay, q.rnrRetry)
	} else {
		s.rnrTimer.Reset(delay)
	}
	s.mu.Unlock()
	return false, true, nil
}

// rnrRetry sends the RNR-NAKed requests again.
func (q *qp) rnrRetry() {
	s := &q.sq
	s.mu.Lock()
	if !s.rnrWait || q.gone() {
		s.mu.Unlock()
		return
	}
	s.rnrWait = false
	fenced := s.fenced
	s.fenced = false
	s.mu.Unlock()
	if fenced {
		q.tx.kick <- struct{}{} // the transmitter parked at a fence; never blocks
	} else {
		q.kickTxAsync()
	}
}

// stopRNRLocked cancels an RNR retry.
func (q *qp) stopRNRLocked() {
	s := &q.sq
	s.rnrWait = false
	if s.rnrTimer != nil {
		s.rnrTimer.Stop()
	}
}

// readTimed fills p, waiting as long as the peer shows signs of life.
// between says p is a frame header: the reader is between frames, where
// QPs whose peer stays silent too long fail one by one, and where, having
// read nothing, an inline reader returns errInterrupted when its CQ has
// completions, its context is done or the link turned eager, and the
// link's goroutine when the link turned lazy. In mid-frame silence fails
// the link.
func (l *outLink) readTimed(p []byte, c *cq, between bool) error {
	fresh := true
	for len(p) > 0 {
		n, err := l.br.Read(p)
		p = p[n:]
		l.got += n
		fresh = fresh && n == 0
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || !l.stillWaiting(between && fresh) {
			return err
		}
		if !between || !fresh {
			continue
		}
		if c != nil && (c.nonEmpty() || l.eager.Load() || l.ctx.Err() != nil) || c == nil && !l.eager.Load() {
			return errInterrupted
		}
	}
	return nil
}

// discard skips n bytes of the link: data nobody wants.
func (l *outLink) discard(n int) error {
	for n > 0 {
		k, err := l.br.Discard(n)
		n -= k
		l.got += k
		if err != nil && !(errors.Is(err, os.ErrDeadlineExceeded) && l.stillWaiting(false)) {
			return l.readError(err)
		}
	}
	return nil
}

// armLocked runs, under q.sq.mu, when q's pipeline, empty until now, has a
// request on the wire: the peer has q.budget from now to answer it.
func (q *qp) armLocked(l *outLink) {
	t := now()
	q.sq.armAt = t
	l.arm(t + int64(q.budget))
	l.needReaderLocked(q, t)
}

// arm makes sure the read deadline is no later than d. Requests are armed
// when a QP's pipeline fills, not one by one, and the deadline is only
// touched when it must come earlier: in the steady state arming costs an
// atomic load.
func (l *outLink) arm(d int64) {
	if cur := l.deadline.Load(); cur != 0 && cur <= d {
		return
	}
	l.dmu.Lock()
	if cur := l.deadline.Load(); cur == 0 || d < cur {
		l.deadline.Store(d)
		_ = l.conn.SetReadDeadline(epoch.Add(time.Duration(d)))
	}
	l.dmu.Unlock()
}

// stillWaiting runs when the read deadline passes (or an interruption set
// it in the past). The responder answers in link order, so a QP whose
// requests have been outstanding for its budget while nothing at all came
// on the link will not hear from the peer: between frames such QPs fail
// with RETRY_EXC_ERR, each on its own budget, and the others wait on; in
// mid-frame it reports false, failing the link. It sets the deadline for
// the QP that is next to run out, or clears it with nothing outstanding.
func (l *outLink) stillWaiting(between bool) bool {
	t := now()
	if l.got > 0 {
		l.got = 0
		l.progress.Store(t)
	}
	next, expired := l.scanDeadlines(t)
	if len(expired) > 0 && !between {
		clear(l.expired)
		return false
	}
	l.dmu.Lock()
	l.deadline.Store(next)
	if next == 0 {
		_ = l.conn.SetReadDeadline(time.Time{})
	} else {
		_ = l.conn.SetReadDeadline(epoch.Add(time.Duration(next)))
	}
	l.dmu.Unlock()
	for _, q := range expired {
		q.expire()
	}
	clear(l.expired)
	if next == 0 {
		// A QP armed since the scan may have found the old deadline set
		// and left it: look again now that it is cleared.
		if d, _ := l.scanDeadlines(0); d != 0 {
			l.arm(d)
		}
	}
	return true
}

// scanDeadlines returns the earliest deadline of the link's QPs with
// requests outstanding that runs out after t, and (when t is not 0) those
// it ran out for. A QP's deadline is its budget after the later of the
// peer's last sign of life and the moment its pipeline filled.
func (l *outLink) scanDeadlines(t int64) (next int64, expired []*qp) {
	prog := l.progress.Load()
	l.expired = l.expired[:0]
	for _, q := range l.view.Load().all {
		s := &q.sq
		s.mu.Lock()
		busy, armAt := s.head < s.sent, s.armAt
		s.mu.Unlock()
		if !busy {
			continue
		}
		d := max(prog, armAt) + int64(q.budget)
		switch {
		case t != 0 && d <= t:
			l.expired = append(l.expired, q)
		case next == 0 || d < next:
			next = d
		}
	}
	return next, l.expired
}

// expire fails q's outstanding requests: its peer said nothing for its
// budget.
func (q *qp) expire() {
	s := &q.sq
	s.mu.Lock()
	if q.gone() || s.head == s.sent {
		s.mu.Unlock()
		return
	}
	flipped := q.failSendLocked(rdma.StatusRetryExcErr)
	s.mu.Unlock()
	if flipped {
		q.finishError(fmt.Errorf("peer QP %d did not answer within %v", q.remote.QPNum, q.budget))
	}
}
