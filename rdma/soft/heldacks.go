// ACKs held back by a responder: those of requests nobody waits for leave with the link's next answers.

package soft

import (
	"sync"
	"sync/atomic"
	"time"
)

const (
	// ackDelay bounds how long a responder holds back an ACK that its
	// request let wait (flagAckMayWait) when nothing else goes back on
	// the link meanwhile: the requester frees the request's slot that
	// much later. A QP whose budget is under holdMinBudget never waits.
	ackDelay      = time.Millisecond
	holdMinBudget = 16 * ackDelay
	// heldMax bounds the ACKs held at once; past it they join the
	// answers at once.
	heldMax = 4 << 10
)

// heldAcks are the ACK frames a link's responder holds back: the ACKs of
// unsignaled WRITEs and SENDs, which the requester only needs to free
// their slots. Each answer the responder queues takes them along in
// front of it (held ACKs are older than it, so each QP's answers stay in
// order), as does its last write before it blocks once ackDelay has
// passed; while it is blocked between frames, the timer writes them. So
// an unsignaled request costs neither side a write or a read of its own:
// a PUT's commit, answered by a SEND, and that SEND itself, each used to
// cost one of each.
type heldAcks struct {
	pending atomic.Bool // frames are held
	due     atomic.Bool // ackDelay passed while the responder was busy

	mu     sync.Mutex
	frames []byte
	timer  *time.Timer
	armed  bool // the timer is set
	idle   bool // the responder is blocked between frames, its answers written
	closed bool // the link ended: nothing is held or written again
}

// holdAck holds back q's ACK of request seq, or queues it with the
// answers when too many are held.
func (l *inLink) holdAck(q *qp, seq uint32) error {
	h := &l.held
	h.mu.Lock()
	if len(h.frames)+responseHeaderSize > heldMax {
		h.mu.Unlock()
		return l.respond(q, respAck, 0, seq, 0) // takes the held ones first
	}
	if h.frames == nil {
		h.frames = make([]byte, 0, heldMax)
	}
	n := len(h.frames)
	h.frames = h.frames[:n+responseHeaderSize]
	encodeResponse(h.frames[n:], &response{kind: respAck, dst: q.rsp.peer, seq: seq})
	h.pending.Store(true)
	if !h.armed {
		h.armed = true
		if h.timer == nil {
			h.timer = time.AfterFunc(ackDelay, l.heldAcksDue)
		} else {
			h.timer.Reset(ackDelay)
		}
	}
	h.mu.Unlock()
	return nil
}

// ackWaits reports whether the ACK of req, a WRITE or SEND q executed,
// may be held back.
func (q *qp) ackWaits(req *request) bool {
	return req.ackMayWait && q.budget >= holdMinBudget
}

// takeHeld moves the held ACKs to the end of the answers being batched.
// Only the responder goroutine calls it.
func (l *inLink) takeHeld() error {
	if len(l.out)+heldMax > cap(l.out) {
		if err := l.flush(); err != nil {
			return err
		}
	}
	h := &l.held
	h.mu.Lock()
	l.out = append(l.out, h.frames...)
	h.frames = h.frames[:0]
	h.pending.Store(false)
	h.due.Store(false)
	h.mu.Unlock()
	return nil
}

// beforeBlocking runs when the responder has written its answers and may
// block reading: the held ACKs, if due, are written now, and otherwise
// the timer may write them while the responder waits. It reports whether
// the caller must call afterBlocking when its read returns.
func (l *inLink) beforeBlocking() bool {
	h := &l.held
	if !h.pending.Load() {
		return false // nothing is held, and only the responder holds more
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.due.Load() {
		l.postHeldLocked()
		return false
	}
	h.idle = true
	return true
}

func (l *inLink) afterBlocking() {
	h := &l.held
	h.mu.Lock()
	h.idle = false
	h.mu.Unlock()
}

// heldAcksDue is the timer's: ackDelay has passed since an ACK was held.
// While the responder waits between frames the held ACKs go now (its
// answers are all written, so no answer of theirs is still behind);
// otherwise the responder writes them before it next blocks.
func (l *inLink) heldAcksDue() {
	h := &l.held
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = false
	switch {
	case h.closed || len(h.frames) == 0:
	case h.idle:
		l.postHeldLocked()
	default:
		h.due.Store(true)
	}
}

// postHeldLocked hands the held ACKs to the writer without blocking.
func (l *inLink) postHeldLocked() {
	h := &l.held
	if len(h.frames) > 0 && !h.closed {
		l.w.post(h.frames)
	}
	h.frames = h.frames[:0]
	h.pending.Store(false)
	h.due.Store(false)
}

// dropHeld forgets the held ACKs when the link ends.
func (l *inLink) dropHeld() {
	h := &l.held
	h.mu.Lock()
	h.closed = true
	h.frames = nil
	h.pending.Store(false)
	if h.timer != nil {
		h.timer.Stop()
	}
	h.mu.Unlock()
}
