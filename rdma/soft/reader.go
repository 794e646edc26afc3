// The reader token: who reads a QP's responses, an inline Wait or the receiver goroutine.

package soft

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// Who reads a QP's responses: the reader role is a token. A Wait on the
// QP's send CQ takes it when it can ("inline": the waiting goroutine itself
// sleeps in the socket read and is woken by the response, with no hand-off
// between goroutines); the receiver goroutine takes it otherwise. A QP
// whose send CQ serves other QPs too is "eager": its goroutine keeps the
// token for good.
const (
	rxFree      int32 = iota // nobody reads; with requests on the wire, the sweeper watches
	rxGoroutine              // the receiver goroutine reads
	rxInline                 // a Wait reads
	rxDead                   // the connection failed: nobody reads again
)

// lazyDelay is how long responses may wait for a Wait to read them before
// the device's sweeper hands them to the receiver goroutine (see sweep.go).
const lazyDelay = 500 * time.Microsecond

// startReceiver attaches conn as the QP's requester connection and starts
// the receiver goroutine, unless the QP left RTS meanwhile.
func (q *qp) startReceiver(conn *net.TCPConn) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.state.Load() != uint32(rdma.QPStateRTS) {
		_ = conn.Close()
		return fmt.Errorf("QP left RTS while connecting")
	}
	q.reqConn = conn
	q.tx.w.conn = conn
	q.rx.conn = conn
	q.rx.br.Reset(conn)
	if q.sendCQ.claimLazy(q) {
		q.rx.owner.Store(rxFree)
	} else {
		q.rx.eager.Store(true)
		q.rx.owner.Store(rxGoroutine)
	}
	q.sq.mu.Lock()
	q.sq.readerActive = true
	q.sq.mu.Unlock()
	q.wg.Add(1)
	go q.receive()
	return nil
}

// receive is the receiver goroutine: it reads whenever it holds the token.
func (q *qp) receive() {
	defer q.wg.Done()
	for {
		switch q.rx.owner.Load() {
		case rxDead:
			return
		case rxGoroutine:
			if err := q.readResponses(); err != nil {
				q.rxFail(err)
				return
			}
			continue
		}
		select {
		case <-q.rx.kick:
		case <-q.dead:
			// An inline reader fails on the closed connection and
			// settles the queue itself.
			if q.rx.owner.CompareAndSwap(rxFree, rxGoroutine) {
				q.rxFail(errQPGone)
			}
			return
		}
	}
}

// readResponses reads until the QP is idle (lazy) or the connection fails.
func (q *qp) readResponses() error {
	for {
		if _, _, err := q.readFrame(false); err != nil {
			return err
		}
		if q.gone() {
			return errQPGone
		}
		if !q.rx.eager.Load() && q.releaseIfIdle() {
			return nil
		}
	}
}

// takeRx gives the token to the goroutine if it is free and needed.
func (q *qp) takeRx() {
	s := &q.sq
	s.mu.Lock()
	if s.head < s.sent && q.rx.owner.CompareAndSwap(rxFree, rxGoroutine) {
		q.rx.pending.Store(false)
	}
	s.mu.Unlock()
}

// nudgeRx hands a free token to the goroutine at once: for Poll, whose
// caller will not read responses itself, and for the sweeper.
func (q *qp) nudgeRx() {
	if !q.rx.pending.Load() {
		return
	}
	q.takeRx()
	q.kickRx()
}

func (q *qp) kickRx() {
	select {
	case q.rx.kick <- struct{}{}:
	default:
	}
}

// releaseIfIdle frees the goroutine's token once nothing is on the wire.
func (q *qp) releaseIfIdle() bool {
	s := &q.sq
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head != s.sent || q.rx.eager.Load() {
		return false
	}
	return q.rx.owner.CompareAndSwap(rxGoroutine, rxFree)
}

// setEager makes the goroutine the reader for good: the send CQ now
// serves other QPs, whose completions an inline reader would not see.
func (q *qp) setEager() {
	q.rx.eager.Store(true)
	s := &q.sq
	s.mu.Lock()
	took := q.rx.owner.CompareAndSwap(rxFree, rxGoroutine)
	s.mu.Unlock()
	if took {
		q.rx.pending.Store(false)
		q.kickRx()
	}
}

// needReaderLocked runs when requests go on an idle wire: someone must
// read their responses. With the token free, a parked Wait is woken to
// read inline, and the sweeper will give the token to the goroutine if
// nobody takes it within lazyDelay.
func (q *qp) needReaderLocked(t int64) {
	if q.rx.owner.Load() != rxFree {
		return
	}
	q.markPendingLocked(t)
	if q.sendCQ.hasWaiters() {
		q.sendCQ.signal()
	}
}

func (q *qp) markPendingLocked(t int64) {
	q.rx.pendingSince.Store(t)
	q.rx.pending.Store(true)
	q.dev.sweepSoon(t)
}

// waitInline reads q's responses from the calling Wait until a completion
// lands in c. It reports false when it cannot take the token.
func (q *qp) waitInline(ctx context.Context, c *cq) bool {
	s := &q.sq
	s.mu.Lock()
	ok := s.readerActive && s.head < s.sent && !q.rx.eager.Load() && q.rx.owner.CompareAndSwap(rxFree, rxInline)
	if ok {
		q.rx.pending.Store(false)
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	q.inline.RLock()
	defer q.inline.RUnlock()
	if q.isClosed() {
		q.rxFail(errQPGone)
		return true
	}
	var err error
	if c.setDirect(q) {
		var stop func() bool
		if ctx.Done() != nil {
			stop = context.AfterFunc(ctx, q.interruptRx)
		}
		q.rx.inline, q.rx.ctx = c, ctx
		for {
			var pushed, idle bool
			pushed, idle, err = q.readFrame(true)
			if err != nil || idle || pushed && q.rx.br.Buffered() < responseHeaderSize {
				break
			}
		}
		q.rx.inline, q.rx.ctx = nil, nil
		c.clearDirect()
		if stop != nil {
			stop()
		}
	}
	if err != nil && err != errInterrupted {
		q.rxFail(err)
		return true
	}
	if q.gone() {
		// The QP went to ERR meanwhile; the goroutine left the queue
		// to the token holder.
		q.rxFail(errQPGone)
		return true
	}
	s.mu.Lock()
	switch {
	case q.rx.eager.Load():
		q.rx.owner.Store(rxGoroutine)
		q.kickRx()
	default:
		q.rx.owner.Store(rxFree)
		if s.head < s.sent {
			q.markPendingLocked(now())
		}
	}
	s.mu.Unlock()
	return true
}

// interruptRx makes an inline reader's blocked read return, so its Wait
// can look at the CQ or its context.
func (q *qp) interruptRx() { _ = q.rx.conn.SetReadDeadline(time.Unix(1, 0)) }
