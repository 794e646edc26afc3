// The reader token of a link: who reads its responses, an inline Wait or the link's goroutine.

package soft

import (
	"bufio"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Who reads a link's responses: the reader role is a token. While every
// QP on the link is the only user of its send CQ, a Wait on one of those
// CQs takes the token when it can ("inline": the waiting goroutine itself
// sleeps in the socket read and is woken by the response, with no hand-off
// between goroutines, as a plain TCP client). An inline reader hands the
// frames of the link's other QPs to them as the goroutine would, and when
// it stops while another QP has requests on the wire, it gives the token
// to the goroutine: so a client's idle QPs beside a busy one (its write
// QP beside its read QP) cost it nothing. Otherwise the link is "eager":
// its goroutine keeps the token and hands every frame to its QP, whose
// Waits it wakes.
const (
	rxFree      int32 = iota // nobody reads; with requests on the wire, the sweeper watches
	rxGoroutine              // the link's goroutine reads
	rxInline                 // a Wait reads
	rxDead                   // the link failed: nobody reads again
)

// lazyDelay is how long responses may wait for a Wait to read them before
// the device's sweeper hands them to the link's goroutine, at its next tick
// (see sweep.go).
const lazyDelay = 500 * time.Microsecond

// linkReader is the read side of an outLink.
type linkReader struct {
	owner        atomic.Int32
	pending      atomic.Bool   // requests on the wire and nobody reading
	pendingSince atomic.Int64  // now() when pending was set
	kick         chan struct{} // the goroutine should look at owner

	// Owned by the holder of the token.
	br      *bufio.Reader
	hdr     [responseHeaderSize]byte
	got     int // bytes read since the last liveness check
	inline  *cq // an inline reader's CQ and context
	ctx     context.Context
	expired []*qp // scratch of stillWaiting

	// bunched says that the last read of the socket brought responses
	// for more than one QP: a batch of READs posted meanwhile yields
	// before its write (flushTx). bunchedQPs counts the QPs of the read
	// under way, bunchedLast is the last of them; the token's holder owns
	// both.
	bunched     atomic.Bool
	bunchedQPs  int
	bunchedLast *qp

	// progress is now() of the last sign of life of the peer: a byte read,
	// or a chunk of a large request written.
	progress atomic.Int64

	// interrupts is the registration that interrupts an inline read when
	// its Wait's context ends, kept for the next inline Wait under a
	// context with the same Done channel (a caller's ctx, shared by its
	// operations): one per Wait cost a lone READ three allocations.
	interrupts atomic.Pointer[interruptOn]

	dmu      sync.Mutex   // serializes changes of the read deadline
	deadline atomic.Int64 // now() of the read deadline in force; 0: none
}

// run is the link's goroutine: it reads whenever it holds the token.
func (l *outLink) run() {
	for {
		switch l.owner.Load() {
		case rxDead:
			return
		case rxGoroutine:
			if err := l.readLoop(); err != nil {
				l.fail(err)
				return
			}
			continue
		}
		select {
		case <-l.kick:
		case <-l.life.Done():
			// An inline reader fails on the closed connection and
			// settles the link itself.
			if l.owner.CompareAndSwap(rxFree, rxGoroutine) {
				l.fail(errLinkClosed)
			}
			return
		}
	}
}

// readLoop reads until the link is lazy and idle, or fails. Idleness,
// which takes every QP's lock to tell, is looked at only once the frames
// read together are handled: while bytes are buffered there is more to
// read anyway.
func (l *outLink) readLoop() error {
	for {
		if _, _, err := l.readFrame(nil); err != nil && err != errInterrupted {
			return err
		}
		if !l.eager.Load() && l.br.Buffered() == 0 && l.releaseIfIdle() {
			return nil
		}
	}
}

// releaseIfIdle frees the goroutine's token once the lazy link's QPs have
// nothing on the wire.
func (l *outLink) releaseIfIdle() bool {
	if l.busy(nil) || !l.owner.CompareAndSwap(rxGoroutine, rxFree) {
		return false
	}
	return !l.keepReading(nil)
}

// busy reports whether a QP of the link other than except has requests on
// the wire.
func (l *outLink) busy(except *qp) bool {
	for _, q := range l.view.Load().all {
		if q == except {
			continue
		}
		s := &q.sq
		s.mu.Lock()
		busy := s.head != s.sent
		s.mu.Unlock()
		if busy {
			return true
		}
	}
	return false
}

// keepReading runs after the token was freed: a QP other than except that
// has requests on the wire (put there before the token was free, so its
// needReaderLocked saw it taken) gets the goroutine as its reader again.
// A QP that posts after the token was freed calls for a reader itself.
// It reports whether the goroutine has the token.
func (l *outLink) keepReading(except *qp) bool {
	if l.eager.Load() || l.busy(except) {
		if l.owner.CompareAndSwap(rxFree, rxGoroutine) {
			l.pending.Store(false)
			l.kickRx()
			return true
		}
	}
	return false
}

func (l *outLink) kickRx() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// nudge hands a free token to the goroutine at once when responses wait:
// for Poll, whose caller will not read them itself, and for the sweeper.
func (l *outLink) nudge() {
	if l.pending.Load() && l.owner.CompareAndSwap(rxFree, rxGoroutine) {
		l.pending.Store(false)
		l.kickRx()
	}
}

// nudgeRx is nudge for q's link.
func (q *qp) nudgeRx() {
	if l := q.out.Load(); l != nil {
		l.nudge()
	}
}

// setEager makes the link's goroutine q's reader for good: q's send CQ now
// serves other QPs, whose completions an inline reader would not see.
func (q *qp) setEager() {
	q.rx.eager.Store(true)
	if l := q.out.Load(); l != nil {
		l.mu.Lock()
		l.setEagerLocked()
		l.mu.Unlock()
	}
}

// needReaderLocked runs, under q.sq.mu, when q's requests go on an idle
// wire: someone must read their responses. With the token free, a parked
// Wait is woken to read inline, and the sweeper will give the token to the
// goroutine if nobody takes it within lazyDelay.
func (l *outLink) needReaderLocked(q *qp, t int64) {
	if l.owner.Load() != rxFree {
		return
	}
	l.markPending(t)
	if q.sendCQ.hasWaiters() {
		q.sendCQ.signal()
	}
}

func (l *outLink) markPending(t int64) {
	l.pendingSince.Store(t)
	l.pending.Store(true)
	l.dev.sweepSoon(t)
}

// waitInline reads q's link from the calling Wait until a completion
// lands in c. It reports false when it cannot take the token.
func (q *qp) waitInline(ctx context.Context, c *cq) bool {
	l := q.out.Load()
	if l == nil {
		return false
	}
	s := &q.sq
	s.mu.Lock()
	// Held ACKs come late, or with another QP's answers: for them alone
	// the Wait parks, to be woken by whatever completes first (a RECV,
	// typically), and the link's goroutine reads them.
	ok := s.awaitsPromptAnswer() && !l.eager.Load() && l.owner.CompareAndSwap(rxFree, rxInline)
	if ok {
		l.pending.Store(false)
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	var err error
	if c.setDirect(q) {
		l.interruptWhenDone(ctx)
		l.inline, l.ctx = c, ctx
		for {
			var pushed, idle bool
			pushed, idle, err = l.readFrame(c)
			if err != nil || idle || pushed && l.br.Buffered() < responseHeaderSize || l.eager.Load() {
				break
			}
		}
		l.inline, l.ctx = nil, nil
		c.clearDirect()
	}
	if err != nil && err != errInterrupted {
		l.fail(err)
		return true
	}
	s.mu.Lock()
	if l.eager.Load() {
		l.owner.Store(rxGoroutine)
		l.kickRx()
	} else {
		l.owner.Store(rxFree)
		if s.head < s.sent {
			l.markPending(now())
		}
	}
	s.mu.Unlock()
	l.keepReading(q)
	return true
}

// interrupt makes an inline reader's blocked read return, so its Wait can
// look at the CQ, its context, or hand the link over.
func (l *outLink) interrupt() { _ = l.conn.SetReadDeadline(time.Unix(1, 0)) }

// interruptOn is a registration of interrupt for when a Done channel
// closes.
type interruptOn struct {
	done <-chan struct{}
	stop func() bool
}

// interruptWhenDone makes sure the link is interrupted when ctx ends,
// reusing the registration for the last inline Wait's context when ctx has
// the same Done channel. A registration outliving its Wait fires at worst
// into a later read, which then looks at its CQ and context and reads on
// (readTimed), as after any interrupt. Only the holder of the reader token
// calls it; the link's close stops what is registered (stopInterrupts).
func (l *outLink) interruptWhenDone(ctx context.Context) {
	done := ctx.Done()
	if done == nil {
		return
	}
	if cur := l.interrupts.Load(); cur != nil && cur.done == done {
		return
	}
	old := l.interrupts.Swap(&interruptOn{done: done, stop: context.AfterFunc(ctx, l.interrupt)})
	if old != nil {
		old.stop()
	}
	if l.life.Err() != nil { // closed meanwhile: stopInterrupts may have run
		l.stopInterrupts()
	}
}

// stopInterrupts drops the registration, when the link closes.
func (l *outLink) stopInterrupts() {
	if old := l.interrupts.Swap(nil); old != nil {
		old.stop()
	}
}

// interruptRx is interrupt for q's link.
func (q *qp) interruptRx() {
	if l := q.out.Load(); l != nil {
		l.interrupt()
	}
}
