// Tests of links: one connection per pair of devices, shared by their QPs, and what each QP keeps to itself.

package soft

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

// links returns a device's links to peers and the number of links peers
// made to it.
func links(d rdma.Device) (out []*outLink, in int) {
	dev := d.(*device)
	dev.outMu.Lock()
	for _, l := range dev.outs {
		out = append(out, l)
	}
	dev.outMu.Unlock()
	dev.mu.Lock()
	in = len(dev.conns)
	dev.mu.Unlock()
	return out, in
}

// eventually retries check until it returns nil, for up to 5 s.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// With Options.Links 1, every QP between two devices shares one link each way.
func TestQPsShareOneLink(t *testing.T) {
	const n = 8
	p := newDevicePair(t, n, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, q := range p.qps {
		if err := q.roundTrip(ctx, i, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []rdma.Device{p.dx, p.dy} {
		out, in := links(d)
		if len(out) != 1 || in != 1 {
			t.Fatalf("%d links out and %d in for %d QP pairs, want one each way", len(out), in, n)
		}
		out[0].mu.Lock()
		members := len(out[0].members)
		out[0].mu.Unlock()
		if members != n {
			t.Errorf("link carries %d QPs, want %d", members, n)
		}
	}
	l := p.qps[0].x.(*qp).out.Load()
	for i, q := range p.qps {
		if got := q.x.(*qp).out.Load(); got != l {
			t.Errorf("QP %d on link %p, QP 0 on %p", i, got, l)
		}
	}
}

// With Options.Links, a device's QPs to one peer are spread over that
// many links, QPs made one after another on different ones, all in use
// at once; a link that breaks fails its own QPs only.
func TestQPsSpreadOverLinks(t *testing.T) {
	const nLinks, n = 3, 6
	p := newDevicePairWith(t, rdma.Options{Links: nLinks}, n, 256, func(int) rdma.QPConfig { return rdma.QPConfig{} })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if p.roundTripsAtOnce(t, ctx, 100); t.Failed() {
		return
	}
	out, _ := links(p.dx)
	if _, in := links(p.dy); len(out) != nLinks || in != nLinks {
		t.Fatalf("%d links out and %d in for %d QP pairs, want %d each way", len(out), in, n, nLinks)
	}
	for _, l := range out {
		l.mu.Lock()
		members := len(l.members)
		l.mu.Unlock()
		if members != n/nLinks {
			t.Errorf("a link carries %d QPs, want %d", members, n/nLinks)
		}
	}
	for i := 1; i < n; i++ {
		if p.qps[i].x.(*qp).out.Load() == p.qps[i-1].x.(*qp).out.Load() {
			t.Errorf("QPs %d and %d, made one after the other, share a link", i-1, i)
		}
	}

	broken := p.qps[0].x.(*qp).out.Load()
	onBroken := map[int]bool{}
	for i, q := range p.qps {
		onBroken[i] = q.x.(*qp).out.Load() == broken
	}
	broken.mu.Lock()
	_ = broken.conn.Close()
	broken.mu.Unlock()
	for i, q := range p.qps {
		err := q.roundTrip(ctx, i, 100)
		if onBroken[i] && err == nil {
			t.Errorf("QP %d, on the broken link, completed a round trip", i)
		}
		if !onBroken[i] && err != nil {
			t.Errorf("QP %d, on another link: %v", i, err)
		}
	}
}

// The QPs of a lane above 0 share its link whatever their numbers, while
// those of lane 0 spread by number: a session's read QP (lane 0) and write
// QP (lane 1), made one after the other.
func TestLanesKeepQPsTogether(t *testing.T) {
	const nLinks, n = 3, 6
	lane := func(pair int) int { return pair % 2 }
	p := newDevicePairWith(t, rdma.Options{Links: nLinks}, n, 256, func(pair int) rdma.QPConfig { return rdma.QPConfig{Lane: lane(pair)} })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if p.roundTripsAtOnce(t, ctx, 100); t.Failed() {
		return
	}
	spread := map[*outLink]bool{}
	for i, q := range p.qps {
		l := q.x.(*qp).out.Load()
		if lane(i) == 0 {
			spread[l] = true
		} else if l.key.index != 0 {
			t.Errorf("QP %d of lane 1 is on link %d, want 0", i, l.key.index)
		}
	}
	if len(spread) != nLinks {
		t.Errorf("the %d QPs of lane 0 ride %d links, want %d", n/2, len(spread), nLinks)
	}
}

// Lanes 1 to Links ride distinct links, as rdma.Multilink promises: lane
// k the link k-1, lane Links+1 the first again.
func TestLanesAboveZeroRideDistinctLinks(t *testing.T) {
	const nLinks, n = 3, 4
	p := newDevicePairWith(t, rdma.Options{Links: nLinks}, n, 256, func(pair int) rdma.QPConfig { return rdma.QPConfig{Lane: 1 + pair} })
	if ml, ok := p.dx.(rdma.Multilink); !ok || ml.Links() != nLinks {
		t.Fatalf("a soft device with Options.Links %d: Multilink %v", nLinks, ok)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if p.roundTripsAtOnce(t, ctx, 10); t.Failed() {
		return
	}
	for i, q := range p.qps {
		if got := int(q.x.(*qp).out.Load().key.index); got != i%nLinks {
			t.Errorf("the QP of lane %d is on link %d, want %d", 1+i, got, i%nLinks)
		}
	}
}

func TestLaneMustNotBeNegative(t *testing.T) {
	d := openDevWith(t, rdma.Options{})
	cq := createCQ(t, d, 4)
	if q, err := allocPD(t, d).CreateQP(rdma.QPConfig{SendCQ: cq, RecvCQ: cq, Lane: -1}); err == nil || !strings.Contains(err.Error(), "Lane:-1") {
		if q != nil {
			q.Close()
		}
		t.Fatalf("CreateQP with Lane -1: %v; want an error naming it", err)
	}
}

func TestLinksMustNotBeNegative(t *testing.T) {
	if d, err := rdma.Open("soft", "", rdma.Options{Links: -1}); err == nil || !strings.Contains(err.Error(), "Links -1") {
		if d != nil {
			d.Close()
		}
		t.Fatalf("Open with Links -1: %v; want an error naming it", err)
	}
}

// Frames of many QPs that are ready while the link is being written leave
// together in the next write.
// newIdlePair is newDevicePair with every QP attached, its link up, and
// its transmitter idle.
func newIdlePair(t *testing.T, n int) *devicePair {
	t.Helper()
	p := newDevicePair(t, n, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, q := range p.qps {
		if err := q.roundTrip(ctx, i, 0); err != nil {
			t.Fatal(err)
		}
	}
	for i, q := range p.qps {
		// The sender goroutine may still be giving the transmitter up
		// after sending what was posted while the QP attached.
		waitTxIdle(t, q.x, fmt.Sprintf("QP %d", i))
	}
	return p
}

// waitTxIdle waits until q's transmitter is idle, so that its next post
// is sent by the poster.
func waitTxIdle(t *testing.T, q rdma.QP, name string) {
	t.Helper()
	eventually(t, name+"'s transmitter idle", func() error {
		if st := q.(*qp).tx.state.Load(); st != txIdle {
			return fmt.Errorf("state %d", st)
		}
		return nil
	})
}

// readOf is a signaled 8-byte READ of q's remote slot.
func readOf(q *qpPair, id uint64) rdma.SendWR {
	return rdma.SendWR{ID: id, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 8), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()}
}

func TestFramesOfManyQPsLeaveInOneWrite(t *testing.T) {
	const n = 8
	p := newIdlePair(t, n)
	l := p.qps[0].x.(*qp).out.Load()
	w := &l.w
	// Hold the flusher role, as a writer busy in a syscall would.
	w.mu.Lock()
	w.flushing = true
	w.mu.Unlock()
	writes0 := w.writes.Load()
	qpWrites := make([]uint64, n)
	for i, q := range p.qps {
		qpWrites[i] = q.x.(*qp).tx.w.writes.Load()
		post(t, q.x, readOf(q, 7))
	}
	if got := w.writes.Load() - writes0; got != 0 {
		t.Fatalf("%d writes while the role was held", got)
	}
	if err := w.drain(nil); err != nil {
		t.Fatal(err)
	}
	if got := w.writes.Load() - writes0; got != 1 {
		t.Errorf("%d QPs' requests left in %d writes, want 1", n, got)
	}
	for i, q := range p.qps {
		expectStatus(t, q.cx, 7, rdma.StatusSuccess)
		if got := q.x.(*qp).tx.w.writes.Load() - qpWrites[i]; got != 1 {
			t.Errorf("QP %d: its request left in %d writes, want 1", i, got)
		}
	}
}

// The responses of one read for several QPs mark the link bunched; a read
// bringing one QP's clears the mark.
func TestBunchedResponsesMarkTheLink(t *testing.T) {
	const n = 8
	p := newIdlePair(t, n)
	l := p.qps[0].x.(*qp).out.Load()
	for round := 0; ; round++ {
		// The READs leave in one write, the peer reads them in one read
		// and answers them in one write: unless TCP splits a few hundred
		// bytes, they come back in one read.
		l.w.mu.Lock()
		l.w.flushing = true
		l.w.mu.Unlock()
		for _, q := range p.qps {
			post(t, q.x, readOf(q, 1))
		}
		if err := l.w.drain(nil); err != nil {
			t.Fatal(err)
		}
		for _, q := range p.qps {
			expectStatus(t, q.cx, 1, rdma.StatusSuccess)
		}
		// The mark is set after the last response's completion.
		deadline := time.Now().Add(time.Second)
		for !l.bunched.Load() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if l.bunched.Load() {
			break
		}
		if round == 9 {
			t.Fatalf("%d rounds of %d READs answered together: link never marked bunched", round+1, n)
		}
	}
	q := p.qps[0]
	post(t, q.x, readOf(q, 2))
	expectStatus(t, q.cx, 2, rdma.StatusSuccess)
	eventually(t, "the mark cleared by a lone response", func() error {
		if l.bunched.Load() {
			return errors.New("still bunched")
		}
		return nil
	})
}

// A READ posted on a bunched link, while the goroutines woken with its
// poster are about to post theirs, waits for them: all leave in one write.
// Posted on a link that is not bunched, each leaves in its own. One P makes
// the schedule repeatable: the others run exactly when the poster yields.
func TestReadsPostedTogetherLeaveInOneWrite(t *testing.T) {
	const n = 8
	for _, bunched := range []bool{true, false} {
		t.Run(fmt.Sprintf("bunched=%v", bunched), func(t *testing.T) {
			p := newIdlePair(t, n)
			l := p.qps[0].x.(*qp).out.Load()
			procs := runtime.GOMAXPROCS(1)
			defer runtime.GOMAXPROCS(procs)
			l.bunched.Store(bunched)
			writes0 := l.w.writes.Load()
			start := make(chan struct{})
			errs := make(chan error, n)
			var wg sync.WaitGroup
			for _, q := range p.qps[1:] {
				wg.Go(func() {
					<-start
					errs <- q.x.PostSend([]rdma.SendWR{readOf(q, 3)})
				})
			}
			close(start)
			post(t, p.qps[0].x, readOf(p.qps[0], 3))
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			got := l.w.writes.Load() - writes0
			runtime.GOMAXPROCS(procs)
			for _, q := range p.qps {
				expectStatus(t, q.cx, 3, rdma.StatusSuccess)
			}
			// The scheduler runs a goroutine of the global queue, where
			// the poster yields to, once in 61 turns: it may then write
			// before the last of the others posted, and one of those
			// writes the rest.
			if bunched && got > 3 {
				t.Errorf("%d READs posted together on a bunched link left in %d writes, want at most 3", n, got)
			}
			if !bunched && got < n-1 {
				t.Errorf("%d READs posted together on a link not bunched left in %d writes, want one each", n, got)
			}
			t.Logf("bunched=%v: %d READs in %d writes", bunched, n, got)
		})
	}
}

// A QP connected while the link to its peer's device is up and busy joins
// that link; the QPs on it do not notice.
func TestAttachToLinkAlreadyUp(t *testing.T) {
	p := newDevicePair(t, 2, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := busy(ctx, p.qps, stop)
	time.Sleep(20 * time.Millisecond)
	l := p.qps[1].x.(*qp).out.Load()
	for i := range 8 {
		q := &qpPair{cx: createCQ(t, p.dx, 64), cy: createCQ(t, p.dy, 64), slotSize: 256}
		q.x = createQP(t, p.px, rdma.QPConfig{SendCQ: q.cx, RecvCQ: q.cx})
		q.y = createQP(t, p.py, rdma.QPConfig{SendCQ: q.cy, RecvCQ: q.cy})
		rdmatest.Connect(t, q.x, q.y)
		q.local, q.remote = register(t, p.px, 256, rw), register(t, p.py, 256, rw)
		if err := q.roundTrip(ctx, 100+i, 0); err != nil {
			t.Fatal(err)
		}
		if got := q.x.(*qp).out.Load(); got != l {
			t.Fatalf("new QP %d on link %p, the busy QP on %p", i, got, l)
		}
	}
	checkNeighbours(t, stop, done, "while QPs attached to their link")
	if out, in := links(p.dx); len(out) != 1 || in != 1 {
		t.Fatalf("%d links out and %d in, want one each way", len(out), in)
	}
}

// A link whose QPs each have a CQ of their own is read inline by the Wait
// of the QP with requests on the wire, an idle QP beside it or not (a
// client's write QP beside its read QP); with a QP on it whose CQ is
// shared, by the link's goroutine; without that QP, inline again.
func TestInlineWhileTheOtherQPsAreIdle(t *testing.T) {
	var inline, goroutine atomic.Int64
	testHookLand = func(in bool) {
		if in {
			inline.Add(1)
		} else {
			goroutine.Add(1)
		}
	}
	defer func() { testHookLand = nil }()
	p := newDevicePair(t, 1, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rounds := func(q *qpPair, id int) (in, byGoroutine int64) {
		t.Helper()
		i0, g0 := inline.Load(), goroutine.Load()
		for r := range 50 {
			if err := q.roundTrip(ctx, id, r); err != nil {
				t.Fatal(err)
			}
		}
		return inline.Load() - i0, goroutine.Load() - g0
	}
	first := p.qps[0]
	if in, g := rounds(first, 0); in < 40 {
		t.Errorf("alone on its link: %d of 50 READs read inline, %d by the goroutine", in, g)
	}
	pair := func(cx, cy rdma.CQ) *qpPair {
		q := &qpPair{cx: cx, cy: cy, slotSize: 256}
		q.x = createQP(t, p.px, rdma.QPConfig{SendCQ: cx, RecvCQ: cx})
		q.y = createQP(t, p.py, rdma.QPConfig{SendCQ: cy, RecvCQ: cy})
		rdmatest.Connect(t, q.x, q.y)
		q.local, q.remote = register(t, p.px, 256, rw), register(t, p.py, 256, rw)
		return q
	}
	idle := pair(createCQ(t, p.dx, 64), createCQ(t, p.dy, 64))
	if in, g := rounds(first, 0); in < 40 {
		t.Errorf("beside an idle QP: %d of 50 READs read inline, %d by the goroutine", in, g)
	}
	if in, g := rounds(idle, 1); in < 40 {
		t.Errorf("the other QP, the first idle: %d of 50 READs read inline, %d by the goroutine", in, g)
	}
	shared := createCQ(t, p.dx, 64)
	sharing := []*qpPair{pair(shared, createCQ(t, p.dy, 64)), pair(shared, createCQ(t, p.dy, 64))}
	if in, g := rounds(first, 0); in != 0 {
		t.Errorf("beside QPs sharing a CQ: %d of 50 READs read inline, %d by the goroutine", in, g)
	}
	for _, q := range sharing {
		if err := q.x.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if in, g := rounds(first, 0); in < 40 {
		t.Errorf("without them again: %d of 50 READs read inline, %d by the goroutine", in, g)
	}
}

// QPs of one lazy link busy at once, each with its own Wait: whoever reads
// inline hands the others' responses to them, and hands the link over
// when it stops, so that none waits for ever or for the sweeper.
func TestLazyLinkQPsBusyTogether(t *testing.T) {
	const qps, rounds = 4, 500
	p := newDevicePair(t, qps, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, qps)
	t0 := time.Now()
	for i, q := range p.qps {
		go func() {
			for r := range rounds {
				// Uneven pauses, so that each QP is sometimes alone on
				// the wire and sometimes not.
				if r%(i+2) == 0 {
					time.Sleep(time.Duration(i*50) * time.Microsecond)
				}
				if err := q.roundTrip(ctx, i, r); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range qps {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d QPs x %d round trips in %v", qps, rounds, time.Since(t0))
}

// A SEND that finds no RECV does not hold the link: the other QPs on it
// keep completing while it is retried, and it completes once a RECV is
// posted.
func TestRNRDoesNotHoldTheLink(t *testing.T) {
	const n = 4
	p := newDevicePair(t, n, 256, slowCfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := busy(ctx, p.qps, stop)
	q := p.qps[0]
	copy(q.local.Bytes(), "rnr")
	post(t, q.x, rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 3)},
		rdma.SendWR{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(q.local, 8, 3), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()})
	time.Sleep(100 * time.Millisecond)
	checkNeighbours(t, stop, done, "while a SEND waited for a RECV")
	expectNone(t, q.cx, time.Millisecond)
	postRecv(t, q.y, rdma.RecvWR{ID: 9, SGL: sgl(q.remote, 100, 8)})
	expectStatus(t, q.cx, 1, rdma.StatusSuccess)
	expectStatus(t, q.cx, 2, rdma.StatusSuccess)
	if wc := expectStatus(t, q.cy, 9, rdma.StatusSuccess); wc.ByteLen != 3 || string(q.remote.Bytes()[100:103]) != "rnr" {
		t.Fatalf("RECV %+v holds %q", wc, q.remote.Bytes()[100:103])
	}
	if q.x.State() != rdma.QPStateRTS || q.y.State() != rdma.QPStateRTS {
		t.Fatalf("after the RNR: QPs in %v and %v", q.x.State(), q.y.State())
	}
}

// A QP whose completions are taken slowly, with much data in flight, does
// not hold up the other QPs' completions: the link's goroutine reads on.
func TestSlowReaderBlocksNoOther(t *testing.T) {
	const n, reads, size = 4, 64, 64 << 10
	p := newDevicePair(t, n, 256, rdma.QPConfig{MaxSendWR: reads})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := p.qps[0]
	local := register(t, p.px, reads*size, rw)
	remote := register(t, p.py, size, rw)
	wrs := make([]rdma.SendWR, reads)
	for i := range wrs {
		wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, i*size, size), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	}
	stop := make(chan struct{})
	done := busy(ctx, p.qps, stop)
	post(t, q.x, wrs...)
	slow := make(chan error, 1)
	go func() {
		wc := make([]rdma.Completion, 1)
		for i := range reads {
			time.Sleep(2 * time.Millisecond) // a reader that takes its time
			if _, err := q.cx.Wait(ctx, wc); err != nil || wc[0].ID != uint64(i) || wc[0].Status != rdma.StatusSuccess {
				slow <- fmt.Errorf("completion %d: %+v, %v", i, wc[0], err)
				return
			}
		}
		slow <- nil
	}()
	time.Sleep(50 * time.Millisecond) // the slow reader is far from done
	checkNeighbours(t, stop, done, "next to a slow reader")
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
}

// When the last QP using a link leaves it, the link closes, at both ends.
// The peers of the closed QPs fail their next request (a lazily read link
// notices the peer's going only then), and their link closes in turn.
func TestLinkClosedWithLastQP(t *testing.T) {
	const n = 4
	p := newDevicePair(t, n, 256, fastFail)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, q := range p.qps {
		if err := q.roundTrip(ctx, i, 0); err != nil {
			t.Fatal(err)
		}
	}
	for i, q := range p.qps {
		if out, _ := links(p.dx); len(out) != 1 {
			t.Fatalf("%d links out with %d QPs left", len(out), n-i)
		}
		if err := q.x.Close(); err != nil {
			t.Fatal(err)
		}
	}
	closed := func(what string, d rdma.Device, outs, ins bool) {
		t.Helper()
		eventually(t, what, func() error {
			out, in := links(d)
			if outs && len(out) != 0 || ins && in != 0 {
				return fmt.Errorf("%d links out and %d in", len(out), in)
			}
			return nil
		})
	}
	closed("the closed QPs' link, at their end", p.dx, true, false)
	closed("the closed QPs' link, at the peer's end", p.dy, false, true)
	for _, q := range p.qps {
		if st := q.y.State(); st != rdma.QPStateRTS {
			t.Fatalf("peer of a closed QP in %v, want RTS until its next request", st)
		}
		post(t, q.y, rdma.SendWR{ID: 3, Op: rdma.OpRead, SGL: sgl(q.remote, 0, 8), RemoteAddr: q.local.Addr(), RKey: q.local.RKey()})
		expectStatus(t, q.cy, 3, rdma.StatusRetryExcErr)
	}
	closed("the peers' link, at their end", p.dy, true, false)
	closed("the peers' link, at the closed QPs' end", p.dx, false, true)
}

// A peer device that goes away, in order (its QPs, then the device) or at
// once (its links cut, as when its process dies): QPs with requests
// outstanding fail them with RETRY_EXC_ERR, idle QPs fail their next one,
// within the budget, and a QP connected to a new device works.
func TestPeerDeviceGoes(t *testing.T) {
	for _, abrupt := range []bool{false, true} {
		t.Run(fmt.Sprintf("abrupt=%v", abrupt), func(t *testing.T) {
			const n = 4
			p := newDevicePair(t, n, 1<<20, fastFail)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for i, q := range p.qps {
				if err := q.roundTrip(ctx, i, 0); err != nil {
					t.Fatal(err)
				}
			}
			busyQ := p.qps[0]
			wrs := make([]rdma.SendWR, 8)
			for i := range wrs {
				wrs[i] = rdma.SendWR{ID: uint64(10 + i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(busyQ.local, 0, 1<<20), RemoteAddr: busyQ.remote.Addr(), RKey: busyQ.remote.RKey()}
			}
			post(t, busyQ.x, wrs...)
			start := time.Now()
			if abrupt {
				cutLinks(p.dy)
			} else {
				for _, q := range p.qps {
					if err := q.y.Close(); err != nil {
						t.Fatal(err)
					}
				}
			}
			failed := false
			for i := range wrs {
				wc := wait(t, busyQ.cx)
				switch {
				case wc.ID != uint64(10+i):
					t.Fatalf("completion of %d, want %d", wc.ID, 10+i)
				case failed && wc.Status != rdma.StatusWRFlushErr, !failed && wc.Status != rdma.StatusSuccess && wc.Status != rdma.StatusRetryExcErr:
					t.Fatalf("completion %+v", wc)
				}
				failed = failed || wc.Status != rdma.StatusSuccess
			}
			if !failed {
				t.Log("every READ finished before the peer went")
			}
			for i, q := range p.qps[1:] {
				post(t, q.x, rdma.SendWR{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 8), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()})
				if wc := wait(t, q.cx); wc.Status != rdma.StatusRetryExcErr {
					t.Fatalf("idle QP %d: next request %+v, want RETRY_EXC_ERR", i+1, wc)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v for the QPs to see the peer gone", d)
			}
			// A new device: a new link.
			fresh := &qpPair{cx: createCQ(t, p.dx, 64), slotSize: 256}
			dz := openDev(t)
			pz := allocPD(t, dz)
			fresh.cy = createCQ(t, dz, 64)
			fresh.x = createQP(t, p.px, rdma.QPConfig{SendCQ: fresh.cx, RecvCQ: fresh.cx})
			fresh.y = createQP(t, pz, rdma.QPConfig{SendCQ: fresh.cy, RecvCQ: fresh.cy})
			rdmatest.Connect(t, fresh.x, fresh.y)
			fresh.local, fresh.remote = register(t, p.px, 256, rw), register(t, pz, 256, rw)
			if err := fresh.roundTrip(ctx, 99, 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// cutLinks closes every connection of d, as the death of its process
// would, leaving its QPs as they are.
func cutLinks(d rdma.Device) {
	dev := d.(*device)
	dev.mu.Lock()
	for c := range dev.conns {
		_ = c.Close()
	}
	dev.mu.Unlock()
	dev.outMu.Lock()
	for _, l := range dev.outs {
		l.mu.Lock()
		if l.conn != nil {
			_ = l.conn.Close()
		}
		l.mu.Unlock()
	}
	dev.outMu.Unlock()
}

// A malformed frame ends its link: every QP attached to it goes to ERR,
// and the QPs on the device's other links do not notice.
func TestMalformedFrameEndsItsLinkOnly(t *testing.T) {
	p := newDevicePair(t, 2, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := busy(ctx, p.qps, stop)
	const fakePSN = 5
	var victims []rdma.QP
	conn := dialDevice(t, p.dy)
	conn.Write(linkOpening(1, 2, 3)[:helloSize])
	cy := createCQ(t, p.dy, 16)
	for i := range 3 {
		v := createQP(t, p.py, rdma.QPConfig{SendCQ: cy, RecvCQ: cy})
		bringUpTo(t, v, rdma.QPInfo{Provider: "soft", QPNum: uint32(100 + i), PSN: fakePSN, Addr: "127.0.0.1:1"})
		postRecv(t, v, rdma.RecvWR{ID: uint64(i)})
		var a [requestHeaderSize]byte
		encodeAttach(a[:], attach{dst: v.Num(), src: uint32(100 + i), psn: fakePSN})
		conn.Write(a[:])
		victims = append(victims, v)
	}
	got := make([]byte, 3*responseHeaderSize)
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("this is not a frame, nor the start of one, and it goes on long enough"))
	seen := map[uint64]bool{}
	for range victims {
		wc := wait(t, cy)
		if wc.Status != rdma.StatusWRFlushErr || seen[wc.ID] {
			t.Fatalf("victim's RECV: %+v", wc)
		}
		seen[wc.ID] = true
	}
	for i, v := range victims {
		if v.State() != rdma.QPStateError {
			t.Errorf("victim %d in %v", i, v.State())
		}
	}
	checkNeighbours(t, stop, done, "while another link broke")
	for _, q := range p.qps {
		if q.x.State() != rdma.QPStateRTS || q.y.State() != rdma.QPStateRTS {
			t.Fatalf("a QP on another link in %v/%v", q.x.State(), q.y.State())
		}
	}
}

// Requests behind an RNR-NAKed SEND, a fenced one among them, are sent
// again with it, in order, and the fence still waits for the SEND.
func TestRNRWithFence(t *testing.T) {
	p := newDevicePair(t, 1, 4096, slowCfg)
	q := p.qps[0]
	copy(q.remote.Bytes()[1024:], "fenced")
	copy(q.local.Bytes(), "sent")
	post(t, q.x,
		rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 4)},
		rdma.SendWR{ID: 2, Op: rdma.OpWrite, SGL: sgl(q.local, 0, 4), RemoteAddr: q.remote.Addr() + 2048, RKey: q.remote.RKey()},
		rdma.SendWR{ID: 3, Op: rdma.OpRead, Flags: rdma.Signaled | rdma.Fence, SGL: sgl(q.local, 100, 6), RemoteAddr: q.remote.Addr() + 1024, RKey: q.remote.RKey()})
	time.Sleep(30 * time.Millisecond) // a few RNR NAKs and retries
	expectNone(t, q.cx, time.Millisecond)
	if string(q.remote.Bytes()[2048:2052]) == "sent" {
		t.Fatal("the WRITE behind the RNR-NAKed SEND was executed before it")
	}
	postRecv(t, q.y, rdma.RecvWR{ID: 9, SGL: sgl(q.remote, 0, 64)})
	expectStatus(t, q.cx, 1, rdma.StatusSuccess)
	expectStatus(t, q.cx, 3, rdma.StatusSuccess)
	expectStatus(t, q.cy, 9, rdma.StatusSuccess)
	if string(q.local.Bytes()[100:106]) != "fenced" || string(q.remote.Bytes()[2048:2052]) != "sent" {
		t.Fatalf("after the retries: READ brought %q, WRITE left %q", q.local.Bytes()[100:106], q.remote.Bytes()[2048:2052])
	}
}

// The link writer keeps each writer's frames in order and whole, whatever
// mix of small frames, posted frames and large frames the writers hand it
// at once.
func TestLinkWriterKeepsOrder(t *testing.T) {
	c, server := tcpPair(t)
	var spawned sync.WaitGroup
	var w linkWriter
	w.init(c.(*net.TCPConn), func(error) { c.Close() }, &spawned)

	const writers, frames = 8, 400
	// A frame: writer u8 | sequence u32 | payload length u32 | payload,
	// every payload byte the writer's number plus the sequence.
	frame := func(src, seq, n int) (hdr, payload []byte) {
		hdr = []byte{byte(src), 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(hdr[1:], uint32(seq))
		binary.BigEndian.PutUint32(hdr[5:], uint32(n))
		payload = bytes.Repeat([]byte{byte(src + seq)}, n)
		return hdr, payload
	}
	read := make(chan error, 1)
	go func() {
		br := bufio.NewReader(server)
		next := make([]int, writers)
		hdr := make([]byte, 9)
		for total := 0; total < writers*frames; total++ {
			if _, err := io.ReadFull(br, hdr); err != nil {
				read <- err
				return
			}
			src, seq, n := int(hdr[0]), int(binary.BigEndian.Uint32(hdr[1:])), int(binary.BigEndian.Uint32(hdr[5:]))
			if src >= writers || seq != next[src] {
				read <- fmt.Errorf("frame %d of writer %d, want %d", seq, src, next[src])
				return
			}
			next[src]++
			p := make([]byte, n)
			if _, err := io.ReadFull(br, p); err != nil {
				read <- err
				return
			}
			if !bytes.Equal(p, bytes.Repeat([]byte{byte(src + seq)}, n)) {
				read <- fmt.Errorf("frame %d of writer %d torn", seq, src)
				return
			}
		}
		read <- nil
	}()
	var wg sync.WaitGroup
	for src := range writers {
		wg.Go(func() {
			var count writeCount
			for seq := range frames {
				switch seq % 7 {
				case 3: // large, straight from "registered memory"
					hdr, payload := frame(src, seq, 20<<10+seq)
					if err := w.writeFrame(hdr, &count.writes, nil, [][]byte{payload[:1000], payload[1000:]}, nil); err != nil {
						return // the test failed, and closed the connection
					}
				case 5:
					hdr, payload := frame(src, seq, seq%100)
					w.post(append(hdr, payload...))
				default:
					hdr, payload := frame(src, seq, seq%300)
					if err := w.submit(append(hdr, payload...), &count.writes); err != nil {
						return
					}
				}
			}
		})
	}
	select {
	case err := <-read:
		if err != nil {
			c.Close() // unblocks the writers
			wg.Wait()
			spawned.Wait()
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		c.Close()
		wg.Wait()
		spawned.Wait()
		t.Fatal("the reader did not get every frame")
	}
	wg.Wait()
	spawned.Wait()
	if w.writes.Load() >= writers*frames {
		t.Errorf("%d frames in %d writes: none coalesced", writers*frames, w.writes.Load())
	}
	t.Logf("%d frames in %d writes", writers*frames, w.writes.Load())
}

// A peer that stops reading while a large request is on its way leaves the
// writer blocked: the device's watchdog breaks the link once a write has
// made no progress for the link's timeout, so a Close waiting for its
// QP's frame returns, and the link's other QPs learn it is gone.
func TestStuckWriterBreaksLink(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// The hello and two attaches, both acknowledged; then nothing
		// more is read.
		if _, err := io.ReadFull(c, make([]byte, helloSize)); err != nil {
			return
		}
		for range 2 {
			b := make([]byte, requestHeaderSize)
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			a, err := decodeAttach(b)
			if err != nil {
				t.Errorf("fake peer: %v", err)
				return
			}
			ack := make([]byte, responseHeaderSize)
			encodeAttachAck(ack, attachAck{qpEnds: qpEnds{dst: a.src, src: a.dst}, code: ackOK})
			c.Write(ack)
		}
		<-release
	}()
	defer func() { close(release); <-served }()

	a := newSide(t, rdma.QPConfig{})
	idleCQ := createCQ(t, a.dev, 16)
	idle := createQP(t, a.pd, rdma.QPConfig{SendCQ: idleCQ, RecvCQ: idleCQ})
	peer := rdma.QPInfo{Provider: "soft", QPNum: 99, Addr: ln.Addr().String()}
	bringUp(t, idle, peer)
	// The second attach goes out once the first is acknowledged.
	eventually(t, "the first QP attached", func() error {
		if idle.(*qp).out.Load() == nil {
			return errors.New("not yet")
		}
		return nil
	})
	peer.QPNum = 98
	bringUp(t, a.qp, peer)
	const size = 4 << 20
	src := register(t, a.pd, size, rw)
	wrs := make([]rdma.SendWR, 16)
	for i := range wrs {
		wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpWrite, SGL: sgl(src, 0, size), RemoteAddr: 1, RKey: 1}
	}
	post(t, a.qp, wrs...) // 64 MiB for a peer that reads none of it
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := a.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Close took %v", d)
	}
	post(t, idle, rdma.SendWR{ID: 1, Op: rdma.OpWrite, SGL: sgl(src, 0, 8), RemoteAddr: 1, RKey: 1})
	if wc := wait(t, idleCQ); wc.Status != rdma.StatusRetryExcErr {
		t.Fatalf("the link's other QP: %+v, want RETRY_EXC_ERR", wc)
	}
}

// Sends posted on several QPs during a hold (rdma.PostHolding) leave in
// one write when it is released, and not before.
func TestHeldPostsLeaveTogether(t *testing.T) {
	const n = 4
	p := newIdlePair(t, n)
	w := &p.qps[0].x.(*qp).out.Load().w
	for i, q := range p.qps {
		postRecv(t, q.y, rdma.RecvWR{ID: 100 + uint64(i), SGL: sgl(q.remote, 0, 64)})
	}
	writes0 := w.writes.Load()
	h := p.dx.(rdma.PostHolding)
	h.HoldPosts()
	for _, q := range p.qps {
		post(t, q.x, rdma.SendWR{ID: 7, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 16)})
	}
	expectNone(t, p.qps[0].cy, 50*time.Millisecond)
	if got := w.writes.Load() - writes0; got != 0 {
		t.Fatalf("%d writes during the hold", got)
	}
	h.ReleasePosts()
	for i, q := range p.qps {
		if wc := expectStatus(t, q.cy, 100+uint64(i), rdma.StatusSuccess); wc.ByteLen != 16 {
			t.Errorf("QP %d: RECV of %d bytes, want 16", i, wc.ByteLen)
		}
		expectStatus(t, q.cx, 7, rdma.StatusSuccess)
	}
	if got := w.writes.Load() - writes0; got != 1 {
		t.Errorf("%d QPs' SENDs left in %d writes, want 1", n, got)
	}
}

// A holder may post a payload too large to copy into a batch, which
// must wait for the writer's role, the hold's: the post returns at once
// (the QP's sender goroutine waits), and the WRITE lands after the
// release.
func TestHeldLargePostLeavesAtRelease(t *testing.T) {
	p := newIdlePair(t, 1)
	q := p.qps[0]
	const size = 16 << 10
	src := register(t, p.px, size, rw)
	dst := register(t, p.py, size, rw)
	copy(src.Bytes(), bytes.Repeat([]byte{'h'}, size))
	postRecv(t, q.y, rdma.RecvWR{ID: 100, SGL: sgl(q.remote, 0, 64)})
	h := p.dx.(rdma.PostHolding)
	posted := make(chan error, 1)
	h.HoldPosts()
	go func() {
		// A small frame first, which the hold keeps (taking the role).
		if err := q.x.PostSend([]rdma.SendWR{{ID: 2, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 16)}}); err != nil {
			posted <- err
			return
		}
		posted <- q.x.PostSend([]rdma.SendWR{{ID: 3, Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: sgl(src, 0, size), RemoteAddr: dst.Addr(), RKey: dst.RKey()}})
	}()
	select {
	case err := <-posted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a post of 16 KiB during a hold did not return")
	}
	// Both wait: the SEND in the hold, the WRITE (given to the QP's
	// sender goroutine) for the writer's role, which the hold has.
	expectNone(t, q.cx, 50*time.Millisecond)
	h.ReleasePosts()
	expectStatus(t, q.cx, 2, rdma.StatusSuccess)
	expectStatus(t, q.cx, 3, rdma.StatusSuccess)
	expectStatus(t, q.cy, 100, rdma.StatusSuccess)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("the WRITE's bytes did not land")
	}
}
