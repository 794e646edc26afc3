// Completion queues: a fixed ring, a non-blocking Poll, and a Wait that reads a lone QP's responses itself.

package soft

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
)

type cq struct {
	dev  *device
	life life.Lifetime // children: the QPs using the CQ

	mu      sync.Mutex
	ring    []rdma.Completion // capacity a power of two
	head    int               // index of the oldest completion
	n       int               // completions in the ring
	overrun bool
	closed  bool // set by Close: Poll and Wait return ErrClosed
	waiters int  // Waits parked on wake; push signals only for them

	// lazy is the CQ's only QP while it is the send CQ of that QP alone:
	// then Wait reads the QP's responses itself while the QP is alone on
	// its link too (see reader.go), and direct is set while it is blocked
	// doing so.
	lazy   *qp
	direct *qp

	// wake holds a token while completions may be waiting for a parked
	// Wait: push leaves one, Wait takes it. One slot suffices, so a push
	// never blocks or allocates.
	wake chan struct{}

	// recvHandler takes the successful RECV completions, once set.
	recvHandler atomic.Pointer[recvHandling]
}

// recvHandling is a CQ's RecvHandler and the tag of its completions.
type recvHandling struct {
	h   rdma.RecvHandler
	tag any
}

var _ rdma.RecvHandling = (*cq)(nil)

// SetRecvHandler implements rdma.RecvHandling: the links that complete
// the CQ's RECVs hand them to h once they have served the read that
// brought them (inLink.handOver).
func (c *cq) SetRecvHandler(h rdma.RecvHandler, tag any) {
	c.recvHandler.Store(&recvHandling{h: h, tag: tag})
}

func newCQ(d *device, size int) *cq {
	c := 1
	for c < size {
		c <<= 1
	}
	q := &cq{dev: d, ring: make([]rdma.Completion, c), wake: make(chan struct{}, 1)}
	q.life.InitCQ("rdma/soft: CQ")
	return q
}

// push adds a completion. A full CQ overruns and stays unusable, as in
// verbs; completions for a closed CQ are dropped. A Wait reading a QP's
// link inline is interrupted unless it pushed the completion itself.
func (c *cq) push(wc *rdma.Completion, fromInline bool) {
	c.mu.Lock()
	switch {
	case c.closed || c.overrun:
	case c.n == len(c.ring):
		c.overrun = true
	default:
		c.ring[(c.head+c.n)&(len(c.ring)-1)] = *wc
		c.n++
	}
	var d *qp
	if !fromInline {
		d = c.direct
	}
	waiters := c.waiters
	c.mu.Unlock()
	if waiters > 0 {
		c.signal()
	}
	if d != nil {
		d.interruptRx()
	}
}

func (c *cq) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *cq) Poll(wc []rdma.Completion) (int, error) {
	n, lazy, err := c.poll(wc)
	if n == 0 && err == nil && lazy != nil {
		// A busy-polling caller will not read lazy's responses itself:
		// let its link's goroutine do it now.
		lazy.nudgeRx()
	}
	return n, err
}

// poll moves completions out; with none, it also returns the lazy QP.
func (c *cq) poll(wc []rdma.Completion) (int, *qp, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, nil, rdma.ErrClosed
	}
	if c.overrun {
		c.mu.Unlock()
		return 0, nil, fmt.Errorf("rdma/soft: CQ of %d entries: %w", len(c.ring), rdma.ErrCQOverrun)
	}
	k := min(len(wc), c.n)
	for i := range k {
		wc[i] = c.ring[(c.head+i)&(len(c.ring)-1)]
	}
	c.head = (c.head + k) & (len(c.ring) - 1)
	c.n -= k
	left, lazy, waiters := c.n, c.lazy, c.waiters
	c.mu.Unlock()
	if left > 0 && k > 0 && waiters > 0 {
		c.signal() // another waiter may take the rest
	}
	return k, lazy, nil
}

// Wait polls; on an empty CQ it reads the lazy QP's responses itself when
// it can (one wakeup per response, as a plain socket read), and otherwise
// parks until a push.
func (c *cq) Wait(ctx context.Context, wc []rdma.Completion) (int, error) {
	for {
		n, lazy, err := c.poll(wc)
		if n > 0 || err != nil || len(wc) == 0 {
			return n, err
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if lazy != nil && lazy.waitInline(ctx, c) {
			continue
		}
		if !c.park() {
			continue
		}
		select {
		case <-c.wake:
			c.unpark()
		case <-ctx.Done():
			c.unpark()
			// A completion may have raced the cancellation.
			if n, _, err := c.poll(wc); n > 0 || err != nil {
				return n, err
			}
			return 0, ctx.Err()
		}
	}
}

// park counts a Wait about to block on wake, unless completions arrived.
func (c *cq) park() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n > 0 || c.closed {
		return false
	}
	c.waiters++
	return true
}

func (c *cq) unpark() {
	c.mu.Lock()
	c.waiters--
	c.mu.Unlock()
}

// hasWaiters reports whether a Wait is parked on wake.
func (c *cq) hasWaiters() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiters > 0
}

// setDirect records that q's link is about to be read inline for this CQ,
// unless completions are already waiting.
func (c *cq) setDirect(q *qp) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n > 0 || c.closed {
		return false
	}
	c.direct = q
	return true
}

func (c *cq) clearDirect() {
	c.mu.Lock()
	c.direct = nil
	c.mu.Unlock()
}

// nonEmpty reports whether completions are waiting.
func (c *cq) nonEmpty() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n > 0 || c.closed || c.overrun
}

func (c *cq) Close() error {
	return c.life.Close(func() error {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.signal() // wake a Wait so it returns ErrClosed
		c.dev.life.Release(life.DeviceCQs)
		return nil
	})
}

// attach counts q as a user. A lazy QP loses the CQ to itself: its link's
// goroutine must read for it from now on. The count goes up before
// the lazy QP is looked at, so a claimLazy either sees two users or is
// demoted here.
func (c *cq) attach(q *qp) error {
	if err := c.life.Acquire(life.CQQPs); err != nil {
		return err
	}
	c.mu.Lock()
	demote := c.lazy
	c.lazy = nil
	c.mu.Unlock()
	if demote != nil {
		demote.setEager()
	}
	return nil
}

func (c *cq) detach(q *qp) {
	c.mu.Lock()
	if c.lazy == q {
		c.lazy = nil
	}
	c.mu.Unlock()
	c.life.Release(life.CQQPs)
}

// claimLazy makes q the CQ's lazy QP if q is its only user.
func (c *cq) claimLazy(q *qp) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life.Count(life.CQQPs) != 1 || c.closed {
		return false
	}
	c.lazy = q
	return true
}
