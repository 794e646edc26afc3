// Corked posts: what RecvHandlers and holds post leaves in one write per link once they end.

package soft

import (
	"sync"
	"sync/atomic"

	"github.com/rkv-io/rkv/rdma"
)

var _ rdma.PostHolding = (*device)(nil)

// corks holds a device's posts while a RecvHandler runs (or a hold,
// rdma.PostHolding, is taken): the frames go to
// their link writer's pending buffer, the writer's flusher role taken if
// it was free, and leave when a handler returns. So the replies a handler
// posts to many QPs of one peer leave in one write, as the requests that
// brought them came in one read. Other goroutines' posts meanwhile are
// held as well, until the next handler returns (RecvHandler: soon). Every
// return writes all that is held, not only the last of overlapping ones:
// handlers of many links could otherwise overlap for ever.
type corks struct {
	running atomic.Bool // n > 0, read without the lock

	mu     sync.Mutex
	n      int           // handlers running
	writer []*linkWriter // writers whose role a cork took, to drain
	spare  []*linkWriter
}

// HoldPosts implements rdma.PostHolding: a cork, as a handler's run.
func (d *device) HoldPosts() { d.cork() }

// ReleasePosts implements rdma.PostHolding.
func (d *device) ReleasePosts() { d.uncork() }

// cork begins a handler's run, or a hold.
func (d *device) cork() {
	c := &d.corks
	c.mu.Lock()
	c.n++
	c.running.Store(true)
	c.mu.Unlock()
}

// uncork ends a handler's run, or a hold: the corked writers write what
// is pending, without blocking (the caller may be a link's reader).
func (d *device) uncork() {
	c := &d.corks
	c.mu.Lock()
	c.n--
	c.running.Store(c.n > 0)
	ws := c.writer
	c.writer, c.spare = c.spare[:0], nil
	c.mu.Unlock()
	for _, w := range ws {
		w.drainNoWait()
	}
	clear(ws)
	c.mu.Lock()
	if c.spare == nil {
		c.spare = ws[:0]
	}
	c.mu.Unlock()
}

// corked hands b, whole frames counted by from, to w's pending buffer if a
// handler is running; it reports whether it did. The caller checked
// corks.running first, the cheap test.
func (d *device) corked(w *linkWriter, b []byte, from *atomic.Uint64) bool {
	c := &d.corks
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return false
	}
	held, took := w.hold(b, from)
	if took {
		c.writer = append(c.writer, w)
	}
	return held
}

// hold appends b to the pending frames, taking the flusher role if nobody
// holds it (then the caller must release it: drainNoWait). It reports
// whether b was taken (not after a write error: submit reports that) and
// whether the role was.
func (w *linkWriter) hold(b []byte, from *atomic.Uint64) (held, took bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return false, false
	}
	w.pending = append(w.pending, b...)
	w.addFromLocked(from)
	if w.flushing {
		return true, false // its holder writes them
	}
	w.flushing = true
	return true, true
}

// writeNoWait writes as much of p as the socket takes at once. A full
// socket buffer is no error: it returns what was written.
func (w *linkWriter) writeNoWait(p []byte) (int, error) {
	return w.sock.WriteOnce(p)
}
