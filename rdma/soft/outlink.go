// The requesting end of a link: one TCP connection to a peer device carrying the requests of every QP connected to a QP there.

package soft

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/internal/rawsock"
	"github.com/rkv-io/rkv/rdma"
)

// outLink is one of this device's links to the device at key.addr: its QPs'
// requests go out on it and their responses come back on it. It is dialed
// by the first QP that needs it and closed when the last leaves; a QP
// leaves when it closes or goes to ERR.
type outLink struct {
	dev *device
	key linkKey // the peer's address, and which of the links to it
	w   linkWriter
	up  chan struct{} // closed once dialed (conn set) or failed (dialErr set)
	// life is done when the link closes, for whatever reason: close does it.
	life  context.Context
	close context.CancelFunc

	mu        sync.Mutex // the fields below; taken after dev.outMu
	conn      *net.TCPConn
	sock      rawsock.Reader // reads conn, under br
	dialErr   error
	members   map[uint32]member
	attaching int  // members waiting for the peer's attach acknowledgement
	closed    bool // no member may join any more
	view      atomic.Pointer[qpView]
	eager     atomic.Bool           // the link's goroutine reads: several QPs, or a QP whose CQ is shared
	werr      atomic.Pointer[error] // why a write failed, which broke the link

	linkReader
}

// linkKey names one of a device's links: the peer device's address and
// the link's index among the Options.Links to it.
type linkKey struct {
	addr  string
	index uint32
}

// linkFor is the key of the link to addr that carries q: its lane's
// (QPConfig.Lane), or else the one its number picks (QP numbers are
// consecutive, so QPs made one after another take different links).
func (d *device) linkFor(q *qp, addr string) linkKey {
	if lane := q.cfg.Lane; lane > 0 {
		return linkKey{addr: addr, index: uint32(lane-1) % d.links}
	}
	return linkKey{addr: addr, index: q.num % d.links}
}

type member struct {
	q        *qp
	attached bool // the peer acknowledged its attach
}

// qpView is an immutable snapshot of a link's QPs, so that the reader
// finds a frame's QP without a lock.
type qpView struct {
	all  []*qp
	byN  map[uint32]*qp
	sole *qp // the only QP, if there is one
}

var emptyView = &qpView{}

func (v *qpView) lookup(n uint32) *qp {
	if v.sole != nil {
		if v.sole.num == n {
			return v.sole
		}
		return nil
	}
	return v.byN[n]
}

// attachResult is what the sender goroutine learns of its attach.
type attachResult struct {
	code     uint8
	err      error // the link failed, or the attach timed out
	linkDied bool
}

var (
	errLinkClosed = errors.New("link closed")
	errPeerGone   = errors.New("peer QP left RTS")
)

func newOutLink(d *device, key linkKey) *outLink {
	l := &outLink{dev: d, key: key, up: make(chan struct{}), members: map[uint32]member{}}
	l.life, l.close = context.WithCancel(context.Background())
	l.view.Store(emptyView)
	l.kick = make(chan struct{}, 1)
	l.br = bufio.NewReaderSize(nil, readBufSize)
	return l
}

// connect attaches q, which has just reached RTS, to the peer QP remote
// over the device's link to the peer's device, dialing it if needed. An
// attach on a link that dies before the acknowledgement (the peer restarted
// since the link was made, and nobody noticed yet) is tried once more on a
// new link.
func (q *qp) connect(ctx context.Context, remote rdma.QPInfo) error {
	timeout := max(q.budget, time.Second)
	for retried := false; ; retried = true {
		l, dialed, err := q.dev.joinOut(ctx, q, remote.Addr, timeout)
		if err != nil {
			return err
		}
		res := q.attach(ctx, l, remote, timeout)
		switch {
		case res.err == nil && res.code == ackOK:
			if q.attached(l) {
				return nil
			}
			res.err = errQPGone
		case res.err == nil:
			res.err = fmt.Errorf("peer refused the attach: %s", ackReasons[res.code])
		}
		// A timed-out attach may still be acknowledged: tell the peer.
		q.leaveOut(res.timedOut())
		if res.linkDied && !dialed && !retried && ctx.Err() == nil {
			continue
		}
		return res.err
	}
}

func (r attachResult) timedOut() bool { return r.err != nil && !r.linkDied }

// joinOut makes q a member of its link to addr (linkFor), dialing it if
// there is none, and waits (up to timeout) until it is up. dialed says
// that q's call made the link.
func (d *device) joinOut(ctx context.Context, q *qp, addr string, timeout time.Duration) (l *outLink, dialed bool, err error) {
	key := d.linkFor(q, addr)
	d.outMu.Lock()
	l = d.outs[key]
	if l == nil {
		l = newOutLink(d, key)
		d.outs[key] = l
		dialed = true
	}
	l.mu.Lock()
	l.members[q.num] = member{q: q}
	l.attaching++
	l.publishLocked()
	l.mu.Unlock()
	d.outMu.Unlock()
	l.w.setTimeout(timeout)

	q.mu.Lock()
	if q.closed || q.gone() {
		q.mu.Unlock()
		l.leave(q, false)
		return nil, false, errQPGone
	}
	q.outl = l
	q.mu.Unlock()

	if dialed {
		// The link dials on its own goroutine: its members wait for it
		// alike, and one that closes meanwhile does not wait for the dial.
		link := l // not l, which the return below may change
		d.spawn(func() { link.dial(timeout) })
	}
	t := time.NewTimer(timeout)
	select {
	case <-l.up:
		err = l.dialErr
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = fmt.Errorf("link to %s not up within %v", addr, timeout)
	}
	t.Stop()
	if err != nil {
		q.leaveOut(false)
		return nil, false, err
	}
	return l, dialed, nil
}

// dial connects to the peer device and says hello; then the link's
// reader goroutine starts. The dial is given up when every member left.
func (l *outLink) dial(timeout time.Duration) {
	c, err := l.connect(l.life, timeout)
	l.mu.Lock()
	if err == nil && l.closed {
		// Every member left while dialing.
		_ = c.Close()
		err = errLinkClosed
	}
	if err == nil {
		l.conn = c
		l.w.init(c, l.broken, &l.dev.wg)
		_ = l.sock.Init(c) // cannot fail for a TCPConn
		l.br.Reset(&l.sock)
		l.progress.Store(now())
	} else {
		l.dialErr = fmt.Errorf("dialing %s: %w", l.key.addr, err)
	}
	l.mu.Unlock()
	close(l.up)
	if err != nil {
		l.fail(l.dialErr)
		return
	}
	l.run()
}

func (l *outLink) connect(ctx context.Context, timeout time.Duration) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", l.key.addr)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.TCPConn)
	_ = conn.SetNoDelay(true)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	var b [helloSize]byte
	encodeHello(b[:])
	if _, err := conn.Write(b[:]); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if !stop() {
		_ = conn.Close()
		return nil, ctx.Err()
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// attach introduces q to the peer QP and waits for the answer, which the
// link's reader delivers on q.ackc.
func (q *qp) attach(ctx context.Context, l *outLink, remote rdma.QPInfo, timeout time.Duration) attachResult {
	select {
	case <-q.ackc: // stale: from an earlier link
	default:
	}
	var b [requestHeaderSize]byte
	encodeAttach(b[:], attach{dst: remote.QPNum, src: q.num, psn: q.psn})
	if err := l.w.submit(b[:], nil); err != nil {
		return attachResult{err: fmt.Errorf("link to %s: %w", l.key.addr, err), linkDied: true}
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-q.ackc:
		return r
	case <-ctx.Done():
		return attachResult{err: ctx.Err()}
	case <-t.C:
		return attachResult{err: fmt.Errorf("peer QP %d did not acknowledge the attach within %v", remote.QPNum, timeout)}
	}
}

// attached makes l the link of q's responses, after the peer acknowledged
// the attach. It reports false when q or the link went away meanwhile.
func (q *qp) attached(l *outLink) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.outl != l {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.members[q.num]
	if !ok || m.q != q {
		return false
	}
	m.attached = true
	l.members[q.num] = m
	l.attaching--
	q.tx.dst = q.remote.QPNum
	if !q.sendCQ.claimLazy(q) {
		q.rx.eager.Store(true)
	}
	q.out.Store(l)
	l.publishLocked()
	return true
}

// publishLocked publishes the members for the reader and decides who
// reads: the link's goroutine, unless every QP on the link reads lazily
// (its CQ is its own) and no attach is waiting for an answer. A lazy
// link's Waits take turns reading it inline (reader.go).
func (l *outLink) publishLocked() {
	v := &qpView{byN: make(map[uint32]*qp, len(l.members))}
	for n, m := range l.members {
		v.all = append(v.all, m.q)
		v.byN[n] = m.q
	}
	if len(v.all) == 1 {
		v.sole = v.all[0]
	}
	l.view.Store(v)
	l.setEagerLocked()
}

func (l *outLink) setEagerLocked() {
	v := l.view.Load()
	eager := l.attaching > 0 || slices.ContainsFunc(v.all, func(q *qp) bool { return q.rx.eager.Load() })
	l.eager.Store(eager)
	if !eager {
		if l.owner.Load() == rxGoroutine && l.conn != nil {
			l.interrupt() // the goroutine hands the token back when idle
		}
		return
	}
	if l.owner.CompareAndSwap(rxFree, rxGoroutine) {
		l.pending.Store(false)
		l.kickRx()
	} else if l.owner.Load() == rxInline {
		l.interrupt() // the inline reader hands over
	}
}

// leaveOut takes q off its link; detach says to tell the peer, whose
// responder then forgets q.
func (q *qp) leaveOut(detach bool) {
	q.mu.Lock()
	l := q.outl
	q.outl = nil
	q.out.Store(nil)
	q.mu.Unlock()
	if l != nil {
		l.leave(q, detach)
	}
}

// leave removes q from the link, and closes the link if q was its last
// member.
func (l *outLink) leave(q *qp, detach bool) {
	d := l.dev
	d.outMu.Lock()
	l.mu.Lock()
	m, ok := l.members[q.num]
	if !ok || m.q != q {
		l.mu.Unlock()
		d.outMu.Unlock()
		return
	}
	delete(l.members, q.num)
	if !m.attached {
		l.attaching--
	}
	last := len(l.members) == 0 && !l.closed
	if last {
		l.closed = true
		if d.outs[l.key] == l {
			delete(d.outs, l.key)
		}
	}
	l.publishLocked()
	conn := l.conn
	l.mu.Unlock()
	d.outMu.Unlock()
	switch {
	case last:
		l.close()
		l.stopInterrupts()
		if conn != nil {
			_ = conn.Close()
		}
	case detach && conn != nil:
		// Also for a QP still attaching: its attach may yet be
		// acknowledged, or be waiting at the peer for its QP's RTR.
		var b [requestHeaderSize]byte
		encodeDetach(b[:], qpEnds{dst: q.remote.QPNum, src: q.num})
		l.w.post(b[:])
	}
}

// broken is the writer's onError: a write failed, so the link is useless.
// New QPs must not join it, and its members must learn: whoever reads
// next fails on the closed connection and fails them.
func (l *outLink) broken(err error) {
	l.werr.CompareAndSwap(nil, &err)
	d := l.dev
	d.outMu.Lock()
	if d.outs[l.key] == l {
		delete(d.outs, l.key)
	}
	d.outMu.Unlock()
	_ = l.conn.Close()
	if l.owner.CompareAndSwap(rxFree, rxGoroutine) {
		l.kickRx()
	}
}

// fail ends the link after it failed (or was closed): the holder of the
// reader token calls it, or the dialer. Every member learns, QPs with
// requests outstanding fail them, the others fail their next one.
func (l *outLink) fail(err error) {
	l.owner.Store(rxDead)
	l.kickRx()
	if p := l.werr.Load(); p != nil {
		err = *p
	}
	d := l.dev
	d.outMu.Lock()
	if d.outs[l.key] == l {
		delete(d.outs, l.key)
	}
	l.mu.Lock()
	wasClosed := l.closed
	l.closed = true
	members := l.members
	l.members = map[uint32]member{}
	l.attaching = 0
	l.view.Store(emptyView)
	conn := l.conn
	l.mu.Unlock()
	d.outMu.Unlock()
	l.close()
	l.stopInterrupts()
	if conn != nil {
		_ = conn.Close()
	}
	if !wasClosed && len(members) > 0 {
		log := d.log.Debug
		if errors.Is(err, errBadResponse) {
			log = d.log.Warn
		}
		log("rdma/soft: link failed", "device", d.name, "peer", l.key.addr, "qps", len(members), "err", err)
	}
	for _, m := range members {
		m.q.linkFailed(l, m.attached, err)
	}
}

// linkFailed settles q after its link failed: RETRY_EXC_ERR (BAD_RESP_ERR
// if the peer broke the protocol) for the oldest request and a flush of
// the rest, or, with nothing posted, the next request fails so. A QP still
// attaching hears it on its ackc instead.
func (q *qp) linkFailed(l *outLink, attached bool, err error) {
	q.mu.Lock()
	if q.outl == l {
		q.outl = nil
		q.out.Store(nil)
	}
	q.mu.Unlock()
	if !attached {
		select {
		case q.ackc <- attachResult{err: fmt.Errorf("link to %s: %w", l.key.addr, err), linkDied: true}:
		default:
		}
		return
	}
	s := &q.sq
	s.mu.Lock()
	s.landing = false
	flipped := false
	switch st := rdma.QPState(q.state.Load()); {
	case st == rdma.QPStateError:
		q.flushSendLocked()
	case st == stateClosed:
	case s.head == s.tail:
		s.linkDown = err
	case errors.Is(err, errBadResponse):
		flipped = q.failSendLocked(rdma.StatusBadRespErr)
	default:
		flipped = q.failSendLocked(rdma.StatusRetryExcErr)
	}
	s.mu.Unlock()
	if flipped {
		q.finishError(err)
	}
}
