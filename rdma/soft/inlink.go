// The responding end of a link: a peer device's connection, served by one responder goroutine for every QP attached to it.

package soft

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/internal/rawsock"
	"github.com/rkv-io/rkv/rdma"
)

// handshakeTimeout bounds the wait of an attach for its QP to reach RTR,
// and, by default, how long a link may go without a QP attached to it:
// the hello and the first attach must come within it, as a link is no
// use to a peer that cannot attach a QP.
const handshakeTimeout = 10 * time.Second

// inLink is a link a peer device dialed: its requests, for any of this
// device's QPs attached to it, come in on it, and the answers go back.
type inLink struct {
	dev  *device
	conn *net.TCPConn
	sock rawsock.Reader // reads conn, under br
	br   *bufio.Reader
	w    linkWriter
	done chan struct{} // closed when the link ends

	// attachedOnce: a QP was attached; until then the link must get one
	// by base, the read deadline between frames (zero after).
	attachedOnce atomic.Bool

	// Owned by the responder goroutine.
	base time.Time
	hdr  [requestHeaderSize]byte
	left int // bytes of the current request's payload not read yet
	// The answers not handed to the writer yet, and the write counters of
	// the QPs with answers among them. A QP's counter is in from when its
	// rsp.gen is gen.
	out  []byte
	from []*atomic.Uint64
	gen  uint64
	held heldAcks
	// The successful RECV completions the read being served brought for
	// CQs with a RecvHandler, and their handlers: handed over once the
	// read is served (runHandlers).
	recvs    []rdma.Recv
	handlers []rdma.RecvHandler
	cqs      []*cq    // of recvs, for those declined
	qpns     []uint32 // of recvs, which a handler may move

	mu      sync.Mutex // the fields below
	qps     map[uint32]*qp
	waiting map[uint32]uint32 // attaches waiting for their QP's RTR: QP -> requester
	closed  bool
	view    atomic.Pointer[map[uint32]*qp]
}

// handshake serves one accepted connection: the hello, then the link.
func (d *device) handshake(c *net.TCPConn) {
	defer d.wg.Done()
	defer d.forget(c)
	_ = c.SetNoDelay(true)
	within := time.Duration(d.attachWithin.Load())
	base := time.Now().Add(within)
	_ = c.SetReadDeadline(base)
	var b [helloSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		// A requester that gave up before saying hello (its QPs were
		// destroyed while connecting) looks like this too.
		d.log.Debug("rdma/soft: link closed before its hello", "device", d.name, "remote", c.RemoteAddr(), "err", err)
		_ = c.Close()
		return
	}
	if err := decodeHello(b[:]); err != nil {
		d.reject(c, "malformed hello", err)
		return
	}
	l := &inLink{dev: d, conn: c, done: make(chan struct{}),
		out: make([]byte, 0, answerBatch), gen: 1, qps: map[uint32]*qp{}, base: base}
	_ = l.sock.Init(c) // cannot fail for a TCPConn
	l.br = bufio.NewReaderSize(&l.sock, readBufSize)
	l.view.Store(&map[uint32]*qp{})
	l.w.init(c, func(error) { _ = c.Close() }, &d.wg)
	d.mu.Lock()
	d.ins[l] = struct{}{}
	d.mu.Unlock()
	fatal, err := l.serve()
	l.end(fatal, err)
	d.mu.Lock()
	delete(d.ins, l)
	d.mu.Unlock()
}

func (d *device) reject(c *net.TCPConn, what string, err error) {
	select {
	case <-d.closing:
	default:
		d.log.Warn("rdma/soft: dropped a data connection", "device", d.name, "remote", c.RemoteAddr(), "stage", what, "err", err)
	}
	_ = c.Close()
}

// serve reads and executes frames until the link ends. It reports why,
// and whether the link broke in a way that is its QPs' end: a malformed
// frame, or one cut short.
func (l *inLink) serve() (fatal bool, err error) {
	for {
		blocking := false
		if l.br.Buffered() < requestHeaderSize {
			// The next read may wait: the answers go out first.
			if l.held.due.Load() {
				if err := l.takeHeld(); err != nil {
					return false, err
				}
			}
			if err := l.flush(); err != nil {
				return false, err
			}
			// After the answers: an ACK its requester waits for leaves
			// before the RECV completes (see doSend).
			l.runHandlers()
			blocking = l.beforeBlocking()
		}
		if !l.base.IsZero() && l.attachedOnce.Load() {
			l.base = time.Time{}
			_ = l.conn.SetReadDeadline(l.base)
		}
		n, err := io.ReadFull(l.br, l.hdr[:])
		if blocking {
			l.afterBlocking()
		}
		if err != nil {
			if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
				if l.attachedOnce.Load() {
					continue // attached meanwhile, from another goroutine
				}
				return false, fmt.Errorf("no QP attached within %v of the hello", time.Duration(l.dev.attachWithin.Load()))
			}
			return n > 0, err
		}
		switch l.hdr[4] {
		case wireAttach:
			var a attach
			if a, err = decodeAttach(l.hdr[:]); err == nil {
				l.attach(a)
			}
		case wireDetach:
			var p qpEnds
			if p, err = decodeDetach(l.hdr[:]); err == nil {
				l.detach(p)
			}
		default:
			var req request
			if req, err = decodeRequest(l.hdr[:]); err == nil {
				if err := l.serveRequest(&req); err != nil {
					return true, err
				}
			}
		}
		if err != nil {
			return true, fmt.Errorf("malformed frame: %w", err)
		}
	}
}

// end closes the link. Its QPs lose their requester and stay as they are,
// unless the link broke in mid-frame or on a malformed frame: then they
// go to ERR.
func (l *inLink) end(fatal bool, err error) {
	_ = l.conn.Close()
	l.runHandlers() // their RECVs were consumed
	l.dropHeld()
	l.mu.Lock()
	l.closed = true
	qps := l.qps
	l.qps = map[uint32]*qp{}
	l.waiting = nil
	l.view.Store(&map[uint32]*qp{})
	l.mu.Unlock()
	close(l.done)
	for _, q := range qps {
		q.mu.Lock()
		if q.in == l {
			q.in = nil
		}
		q.mu.Unlock()
		if fatal {
			q.enterError(fmt.Errorf("responder: link from %s: %w", l.conn.RemoteAddr(), err))
		}
	}
	switch {
	case l.dev.isClosing():
	case fatal:
		l.dev.log.Warn("rdma/soft: link ended", "device", l.dev.name, "remote", l.conn.RemoteAddr(), "qps", len(qps), "err", err)
	default:
		l.dev.log.Debug("rdma/soft: link ended", "device", l.dev.name, "remote", l.conn.RemoteAddr(), "qps", len(qps), "err", err)
	}
}

func (l *inLink) lookup(n uint32) *qp { return (*l.view.Load())[n] }

// publishLocked makes the QPs visible to the responder goroutine.
func (l *inLink) publishLocked() {
	m := make(map[uint32]*qp, len(l.qps))
	for n, q := range l.qps {
		m[n] = q
	}
	l.view.Store(&m)
}

// remove takes q off the link; it reports whether q was on it.
func (l *inLink) remove(q *qp) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.qps[q.num] != q {
		return false
	}
	delete(l.qps, q.num)
	l.publishLocked()
	return !l.closed
}

// attach answers an attach: at once when its QP reached RTR, otherwise
// from a goroutine that waits (bounded) for it, so the link serves on.
func (l *inLink) attach(a attach) {
	q := l.dev.lookupQP(a.dst)
	if q == nil {
		l.ack(a, ackNoQP, false)
		return
	}
	select {
	case <-q.rtr:
		l.ack(a, q.attachResponder(l, a), false)
		return
	default:
	}
	l.mu.Lock()
	if l.waiting == nil {
		l.waiting = map[uint32]uint32{}
	}
	l.waiting[a.dst] = a.src
	l.mu.Unlock()
	l.dev.spawn(func() { l.attachLater(q, a) })
}

func (l *inLink) attachLater(q *qp, a attach) {
	t := time.NewTimer(handshakeTimeout)
	defer t.Stop()
	code := ackNotReady
	select {
	case <-q.rtr:
		code = ackOK
	case <-q.dead:
	case <-l.done:
	case <-l.dev.closing:
	case <-t.C:
	}
	l.mu.Lock()
	src, still := l.waiting[a.dst]
	delete(l.waiting, a.dst)
	l.mu.Unlock()
	if !still || src != a.src {
		return // detached meanwhile, or the link ended
	}
	if code == ackOK {
		code = q.attachResponder(l, a)
	}
	l.ack(a, code, true)
}

// ack answers an attach, in the responder's batch or, from another
// goroutine, posted.
func (l *inLink) ack(a attach, code uint8, posted bool) {
	var b [responseHeaderSize]byte
	encodeAttachAck(b[:], attachAck{qpEnds: qpEnds{dst: a.src, src: a.dst}, code: code})
	if posted {
		l.w.post(b[:])
		return
	}
	if len(l.out)+responseHeaderSize > cap(l.out) {
		_ = l.flush()
	}
	l.out = append(l.out, b[:]...)
}

// attachResponder makes q's responder serve the requester an attach names,
// if q is ready and connected to exactly that QP and PSN. A QP serves one
// requester in its life: a second attach, even after the first ended, is
// refused, so old requests cannot be replayed into it.
func (q *qp) attachResponder(l *inLink, a attach) uint8 {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.state.Load()
	switch {
	case q.closed || st != uint32(rdma.QPStateRTR) && st != uint32(rdma.QPStateRTS):
		return ackNotReady
	case q.remote.QPNum != a.src || q.remote.PSN != a.psn:
		return ackWrongPeer
	case q.rsp.attached:
		return ackBusy
	}
	q.rsp.expect, q.rsp.peer = a.psn, a.src
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ackNotReady
	}
	q.rsp.attached = true
	q.in = l
	l.attachedOnce.Store(true)
	l.qps[q.num] = q
	l.publishLocked()
	l.w.setTimeout(max(q.budget, time.Second))
	return ackOK
}

// detach forgets the requester that left: its QP stays as it is, with its
// RECVs posted.
func (l *inLink) detach(p qpEnds) {
	l.mu.Lock()
	if src, ok := l.waiting[p.dst]; ok && src == p.src {
		delete(l.waiting, p.dst)
	}
	q := l.qps[p.dst]
	if q == nil || q.remote.QPNum != p.src {
		l.mu.Unlock()
		return
	}
	delete(l.qps, p.dst)
	l.publishLocked()
	l.mu.Unlock()
	q.mu.Lock()
	if q.in == l {
		q.in = nil
	}
	q.mu.Unlock()
}

// serveRequest executes one request and queues its answer. Requests for a
// QP not on the link (it left, or its requester did) or no longer in RTS
// are dropped; so are those after an RNR NAK, until the NAKed one comes
// again. It returns an error only when the link cannot go on.
func (l *inLink) serveRequest(req *request) error {
	l.left = 0
	if hasPayload(req.op) {
		l.left = int(req.length)
	}
	q := l.lookup(req.dst)
	if q == nil || q.gone() {
		return l.skip(handshakeTimeout)
	}
	r := &q.rsp
	if req.seq != r.expect {
		if r.rnrHold && int32(req.seq-r.expect) > 0 {
			return l.skip(q.budget)
		}
		if err := l.flush(); err != nil {
			return err
		}
		q.enterError(fmt.Errorf("responder: request sequence number %d, expected %d", req.seq, r.expect))
		return l.skip(q.budget)
	}
	r.rnrHold = false
	st, why, err := q.execute(l, req)
	if err == nil {
		err = l.skip(q.budget) // what a refused request did not read
	}
	if err != nil {
		return err
	}
	if st == rdma.StatusSuccess {
		r.expect++
		return nil
	}
	if err := l.respond(q, respNAK, st, req.seq, 0); err != nil {
		return err
	}
	if st == rdma.StatusRNRRetryExcErr {
		// The requester sends this request again, after a delay; what it
		// sent behind it is dropped until then.
		r.rnrHold = true
		return nil
	}
	// After any other NAK the QP is in ERR; the requester learns from
	// the NAK, so no gone follows, and its later requests are dropped.
	r.nakd.Store(true)
	if err := l.flush(); err != nil {
		return err
	}
	reason := fmt.Errorf("responder: answered request %d with %v: %s", req.seq, st, why)
	if r.flipped {
		q.finishError(reason)
	} else {
		q.enterError(reason)
	}
	return nil
}

// respond queues an answer for q.
func (l *inLink) respond(q *qp, kind uint8, st rdma.Status, seq uint32, value uint64) error {
	r := response{kind: kind, status: st, dst: q.rsp.peer, seq: seq, value: value}
	return l.respondHeader(q, &r)
}

func (l *inLink) respondHeader(q *qp, r *response) error {
	if l.held.pending.Load() {
		if err := l.takeHeld(); err != nil {
			return err
		}
	}
	if len(l.out)+responseHeaderSize > cap(l.out) {
		if err := l.flush(); err != nil {
			return err
		}
	}
	n := len(l.out)
	l.out = l.out[:n+responseHeaderSize]
	encodeResponse(l.out[n:], r)
	if q.rsp.gen != l.gen {
		q.rsp.gen = l.gen
		l.from = append(l.from, &q.rsp.w.writes)
	}
	return nil
}

// flush hands the queued answers to the writer.
func (l *inLink) flush() error {
	if len(l.out) == 0 {
		return nil
	}
	err := l.w.submitMany(l.out, l.from)
	l.resetBatch()
	return err
}

func (l *inLink) resetBatch() {
	l.out = l.out[:0]
	clear(l.from)
	l.from = l.from[:0]
	l.gen++
}

// writeLarge writes the queued answers and then p, a READ's data, straight
// from registered memory.
func (l *inLink) writeLarge(p []byte) error {
	pieces := [1][]byte{p}
	err := l.w.writeFrame(l.out, nil, l.from, pieces[:], nil)
	l.resetBatch()
	return err
}

// readPayload reads request data straight into registered memory. A
// requester that stalls mid-payload gets budget per chunk, so a Deregister
// waiting for this copy is not held for ever.
func (l *inLink) readPayload(p []byte, budget time.Duration) error {
	for len(p) > 0 {
		n := min(len(p), chunkSize)
		timed := n > l.br.Buffered()
		if timed {
			if err := l.flush(); err != nil {
				return err
			}
			_ = l.conn.SetReadDeadline(time.Now().Add(budget))
		}
		_, err := io.ReadFull(l.br, p[:n])
		if timed {
			_ = l.conn.SetReadDeadline(l.base)
		}
		l.left -= n
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// skip drops what is left of the current request's payload, giving a
// stalling requester budget per chunk.
func (l *inLink) skip(budget time.Duration) error {
	for l.left > 0 {
		n := min(l.left, chunkSize)
		timed := n > l.br.Buffered()
		if timed {
			if err := l.flush(); err != nil {
				return err
			}
			_ = l.conn.SetReadDeadline(time.Now().Add(budget))
		}
		k, err := l.br.Discard(n)
		if timed {
			_ = l.conn.SetReadDeadline(l.base)
		}
		l.left -= k
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("requester stalled in mid-payload for %v", budget)
			}
			return err
		}
	}
	return nil
}

// handOver queues a successful RECV completion for its CQ's handler.
func (l *inLink) handOver(c *cq, h *recvHandling, wc rdma.Completion) {
	l.recvs = append(l.recvs, rdma.Recv{Tag: h.tag, Completion: wc})
	l.handlers = append(l.handlers, h.h)
	l.cqs = append(l.cqs, c)
	l.qpns = append(l.qpns, wc.QPNum)
}

// runHandlers hands the queued RECV completions to their handlers, each
// run of one handler's in one call, with the device's posts corked
// meanwhile: the sends the handlers post leave in one write per link once
// they have returned.
func (l *inLink) runHandlers() {
	if len(l.recvs) == 0 {
		return
	}
	l.dev.cork()
	for i := 0; i < len(l.recvs); {
		j := i + 1
		for j < len(l.recvs) && l.handlers[j] == l.handlers[i] {
			j++
		}
		// What it declines goes to the CQs: each its own, found by QP
		// among the run's (a CQ may serve several of them).
		qpns := l.qpns[i:j]
		for _, r := range l.handlers[i].HandleRecvs(l.recvs[i:j]) {
			for k, n := range qpns {
				if n == r.QPNum {
					l.cqs[i+k].push(&r.Completion, false)
					break
				}
			}
		}
		i = j
	}
	l.dev.uncork()
	clear(l.recvs)
	clear(l.handlers)
	clear(l.cqs)
	l.recvs, l.handlers, l.cqs, l.qpns = l.recvs[:0], l.handlers[:0], l.cqs[:0], l.qpns[:0]
}
