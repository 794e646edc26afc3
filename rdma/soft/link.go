// The write side of a link, shared by its QPs: frames ready together leave in one write (doorbell batching).

package soft

import (
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/internal/rawsock"
)

const (
	batchSize = 16 << 10 // a QP's transmitter batch
	// readBufSize is the read buffer of each end of a link: one read takes
	// a whole responder's batch (answerBatch), such as the answers to four
	// MultiGets of 16 KiB each (at 16 KiB it took 1.2 reads a MultiGet, at
	// 64 KiB 0.4, and MultiGets/s rose 2-8%), yet a payload of 64 KiB or
	// more is read straight into registered memory (a bufio.Reader reads
	// directly into a destination at least its size once it is empty).
	readBufSize = 64 << 10
	answerBatch = 64 << 10 // the responder's batch
	copyMax     = 4 << 10  // payloads up to this size are copied into batches
	chunkSize   = 1 << 20  // large payloads are written, and their progress noted, per chunk
)

// writeCount counts the link writes that carried a QP's frames: what tests
// look at to see that frames ready together leave in one write. An atomic,
// as any QP's goroutine may make the write that carries another's frames.
type writeCount struct{ writes atomic.Uint64 }

// frameBatch is where a QP's transmitter encodes its frames before handing
// them to the link writer in one piece.
type frameBatch struct {
	writeCount
	buf []byte
}

// linkWriter is the write side of a link. Writers hand it whole frames;
// whoever holds the flusher role writes, and a writer that finds the role
// taken appends its frames to the pending buffer and returns: the holder
// writes them next, with all else that arrived meanwhile, in one call.
// Large payloads take the role and leave by writev straight from
// registered memory.
type linkWriter struct {
	conn *net.TCPConn
	// onError runs once, after the first failed write, on the goroutine
	// that saw it: it closes the link.
	onError func(error)
	// async writes what post left pending, on a goroutine of its own
	// that the link's owner waits for (wg): made once, so that a post
	// allocates nothing.
	async func()
	wg    *sync.WaitGroup
	// timeout (ns) bounds how long one write may block, that is how long
	// the peer may read nothing while we have bytes for it; 0 means no
	// bound. The device's watchdog enforces it (stuck): a deadline would
	// cost a clock reading per write, 1% of a lone READ.
	timeout atomic.Int64

	mu        sync.Mutex
	turn      sync.Cond // signalled when the role is released while large writers wait
	flushing  bool      // the flusher role is held; pending is non-empty only then, or while a large frame takes the role
	waiters   int
	pending   []byte
	spare     []byte
	from      []*atomic.Uint64 // write counters of the QPs with frames in pending
	fromSpare []*atomic.Uint64
	err       error // the first write error: everything after is dropped

	// Owned by the holder of the flusher role.
	iov  [3][]byte
	sock rawsock.Writer

	// writes counts the write and writev calls begun, settled those that
	// returned: a write is under way while they differ.
	writes, settled atomic.Uint64
	// Owned by the watchdog: the writes count it last saw, and when.
	seenWrites uint64
	seenAt     int64
}

// init readies w to write to c; wg counts the goroutines post starts.
func (w *linkWriter) init(c *net.TCPConn, onError func(error), wg *sync.WaitGroup) {
	w.conn, w.onError, w.wg = c, onError, wg
	_ = w.sock.Init(c) // cannot fail for a TCPConn
	w.async = func() {
		defer w.wg.Done()
		_ = w.drain(nil)
	}
	w.turn.L = &w.mu
}

// setTimeout raises the bound on a blocked write to at least d.
func (w *linkWriter) setTimeout(d time.Duration) {
	for {
		cur := w.timeout.Load()
		if int64(d) <= cur || w.timeout.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// busy reports whether someone holds the flusher role: a hint for a
// poster deciding whether a large payload would make it wait.
func (w *linkWriter) busy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flushing
}

// addFromLocked notes that pending carries frames counted by c.
func (w *linkWriter) addFromLocked(c *atomic.Uint64) {
	if c == nil {
		return
	}
	for _, x := range w.from {
		if x == c {
			return
		}
	}
	w.from = append(w.from, c)
}

// submit hands b, whole frames, to the link, counted by from (may be nil).
// When nobody is writing, the caller writes b itself, and then whatever
// others left meanwhile, until nothing is pending; otherwise b is copied
// to the pending buffer and submit returns at once. It returns the link's
// write error, if it has one; b may be reused when submit returns.
func (w *linkWriter) submit(b []byte, from *atomic.Uint64) error {
	return w.enqueue(b, from, nil, false)
}

// submitYielding is submit for a poster that expects others to post in a
// moment (see enqueue).
func (w *linkWriter) submitYielding(b []byte, from *atomic.Uint64) error {
	return w.enqueue(b, from, nil, true)
}

// submitMany is submit for frames counted by several QPs: the responder's
// batch.
func (w *linkWriter) submitMany(b []byte, from []*atomic.Uint64) error {
	return w.enqueue(b, nil, from, false)
}

// enqueue is the body of the submits: b counted by one and by each of
// many, as write counts them. A yielding caller that finds nobody writing
// lets the goroutines that are ready run before it writes, so that their
// frames leave in its write.
func (w *linkWriter) enqueue(b []byte, one *atomic.Uint64, many []*atomic.Uint64, yield bool) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	if w.flushing || len(w.pending) > 0 || yield {
		// Behind what is pending: frames of one QP must not pass each
		// other. (Pending frames with nobody flushing wait for a large
		// frame that was given the role, or for this caller.)
		w.pending = append(w.pending, b...)
		w.addFromLocked(one)
		for _, c := range many {
			w.addFromLocked(c)
		}
		if w.flushing {
			w.mu.Unlock()
			return nil
		}
		w.flushing = true
		w.mu.Unlock()
		if yield {
			runtime.Gosched()
		}
		return w.drain(nil)
	}
	w.flushing = true
	w.mu.Unlock()
	return w.drain(w.write(b, one, many))
}

// post hands b to the link without ever blocking on the socket: the frames
// are left pending, and when nobody is writing a goroutine is started to
// write them. Readers of a link use it, as do QPs leaving one: a reader
// blocked in a write could wait for a peer that waits for it.
func (w *linkWriter) post(b []byte) {
	w.mu.Lock()
	if w.err != nil {
		w.mu.Unlock()
		return
	}
	w.pending = append(w.pending, b...)
	if w.flushing {
		w.mu.Unlock()
		return
	}
	w.flushing = true
	w.mu.Unlock()
	w.wg.Add(1)
	go w.async()
}

// drain writes what is pending until nothing is, then gives the role up;
// or gives it up at once to a large frame waiting for it, which writes
// what is pending first (else a stream of small frames could keep it
// waiting). err is the caller's write error, if any.
func (w *linkWriter) drain(err error) error { return w.drainWaiting(err, true) }

// drainNoWait is drain for a caller that must not block on the socket (a
// link's reader, which the peer may wait for): what the socket does not
// take at once is written by a goroutine, which then drains.
func (w *linkWriter) drainNoWait() { _ = w.drainWaiting(nil, false) }

func (w *linkWriter) drainWaiting(err error, wait bool) error {
	for {
		w.mu.Lock()
		failed := err != nil && w.err == nil
		if failed {
			w.err = err
		}
		if w.err != nil || len(w.pending) == 0 || w.waiters > 0 {
			w.flushing = false
			if w.err != nil {
				w.pending = w.pending[:0]
				clear(w.from)
				w.from = w.from[:0]
			}
			if w.waiters > 0 {
				// All: after an error, every waiter must see it.
				w.turn.Broadcast()
			}
			e := w.err
			w.mu.Unlock()
			if failed {
				w.onError(err)
			}
			return e
		}
		out, from := w.pending, w.from
		w.pending, w.spare = w.spare[:0], out
		w.from, w.fromSpare = w.fromSpare[:0], from
		w.mu.Unlock()
		if wait {
			err = w.write(out, nil, from)
			clear(from)
			continue
		}
		w.count(nil, from)
		clear(from)
		var n int
		if n, err = w.writeNoWait(out); err == nil && n < len(out) {
			w.wg.Add(1)
			go w.writeRest(out[n:])
			return nil
		}
		w.settled.Add(1)
	}
}

// writeRest writes what writeNoWait left of a write, as the holder of the
// flusher role, then drains.
func (w *linkWriter) writeRest(p []byte) {
	defer w.wg.Done()
	_, err := w.sock.Write(p)
	w.settled.Add(1)
	_ = w.drain(err)
}

// write writes p, counting the call for one and many. The caller holds the
// flusher role.
func (w *linkWriter) write(p []byte, one *atomic.Uint64, many []*atomic.Uint64) error {
	w.count(one, many)
	_, err := w.sock.Write(p)
	w.settled.Add(1)
	return err
}

func (w *linkWriter) count(one *atomic.Uint64, many []*atomic.Uint64) {
	w.writes.Add(1)
	if one != nil {
		one.Add(1)
	}
	for _, c := range many {
		c.Add(1)
	}
}

// stuck reports whether one write has been under way for the timeout or
// longer, as far as calls at t (now()) at least a second apart can tell:
// the peer read nothing all that time. The device's watchdog calls it.
func (w *linkWriter) stuck(t int64) bool {
	timeout := w.timeout.Load()
	begun := w.writes.Load()
	if timeout <= 0 || begun == w.settled.Load() {
		w.seenWrites, w.seenAt = 0, 0
		return false
	}
	if begun != w.seenWrites {
		w.seenWrites, w.seenAt = begun, t
		return false
	}
	return t-w.seenAt >= timeout
}

// writeFrame writes the pending frames, then batch (counted by one and
// many) and pieces, without copying the pieces, by writev in chunks; it
// waits for the flusher role and holds it until the last piece is out, so
// no other frame comes between. After each chunk it stores now() in
// progress, if not nil: the peer is reading. A chunk that does not leave
// within the link's timeout breaks the link (stuck, the watchdog's), as
// any write does.
func (w *linkWriter) writeFrame(batch []byte, one *atomic.Uint64, many []*atomic.Uint64, pieces [][]byte, progress *atomic.Int64) error {
	w.mu.Lock()
	for w.flushing && w.err == nil {
		w.waiters++
		w.turn.Wait()
		w.waiters--
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.flushing = true
	pend, pfrom := w.pending, w.from
	w.pending, w.spare = w.spare[:0], pend
	w.from, w.fromSpare = w.fromSpare[:0], pfrom
	w.mu.Unlock()

	var err error
	first := true
	for _, p := range pieces {
		for len(p) > 0 && err == nil {
			n := min(len(p), chunkSize)
			if first {
				w.iov = [3][]byte{pend, batch, p[:n]}
				w.count(one, many)
				for _, c := range pfrom {
					c.Add(1)
				}
				clear(pfrom)
			} else {
				w.iov = [3][]byte{p[:n]}
				w.count(nil, nil)
			}
			first = false
			_, err = w.sock.WriteBuffers(w.iov[:])
			w.settled.Add(1)
			w.iov = [3][]byte{}
			p = p[n:]
			if err == nil && progress != nil {
				progress.Store(now())
			}
		}
	}
	if first && err == nil {
		w.iov = [3][]byte{pend, batch}
		w.count(one, many)
		for _, c := range pfrom {
			c.Add(1)
		}
		clear(pfrom)
		_, err = w.sock.WriteBuffers(w.iov[:2])
		w.settled.Add(1)
		w.iov = [3][]byte{}
	}
	return w.drain(err)
}
