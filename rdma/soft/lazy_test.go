// Tests of who reads a QP's responses: inline Waits, Poll, the sweeper, and the switch to the receiver goroutine.

package soft

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

// slowSend posts a SEND the peer has no RECV for: it stays outstanding
// until the peer posts one (or the long RNR budget runs out).
var slowCfg = rdma.QPConfig{AckTimeout: 5 * time.Second, RetryCount: 1}

func TestPollOnlyCompletes(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	local := register(t, a.pd, 64, rw)
	remote := register(t, b.pd, 64, rw)
	wc := make([]rdma.Completion, 1)
	for i := range 50 {
		post(t, a.qp, rdma.SendWR{ID: uint64(i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := a.cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("Poll never saw the completion")
			}
		}
		if wc[0].ID != uint64(i) || wc[0].Status != rdma.StatusSuccess {
			t.Fatalf("%+v", wc[0])
		}
	}
}

// Responses nobody waits for are read by the receiver goroutine once the
// sweeper notices, freeing the send queue.
func TestSweeperReadsUnwatchedResponses(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{MaxSendWR: 4})
	local := register(t, a.pd, 64, rw)
	remote := register(t, b.pd, 64, rw)
	w := rdma.SendWR{Op: rdma.OpWrite, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	for range 100 {
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := a.qp.PostSend([]rdma.SendWR{w})
			if err == nil {
				break
			}
			if !errors.Is(err, rdma.ErrQueueFull) || time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	w.Flags = rdma.Signaled
	for a.qp.PostSend([]rdma.SendWR{w}) != nil {
		time.Sleep(100 * time.Microsecond)
	}
	time.Sleep(50 * time.Millisecond)
	wc := make([]rdma.Completion, 2)
	if n, _, _ := a.cq.(*cq).poll(wc); n != 1 || wc[0].Status != rdma.StatusSuccess {
		t.Fatalf("after 50 ms: %d completions %+v", n, wc[:n])
	}
}

func TestWaitContextWhileInline(t *testing.T) {
	a, b := newPair(t, slowCfg)
	src := register(t, a.pd, 64, rw)
	dst := register(t, b.pd, 64, rw)
	unansweredSendOutlivesWait(t, a, b, src, dst, 1)
}

// unansweredSendOutlivesWait posts a SEND (ID id) that b has no RECV for,
// checks that a Wait for it ends with its context (50 ms), then posts the
// RECV (ID id+1): the SEND, still alive, completes.
func unansweredSendOutlivesWait(t *testing.T, a, b *side, src, dst rdma.MR, id uint64) {
	t.Helper()
	post(t, a.qp, rdma.SendWR{ID: id, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(src, 0, 8)})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	wc := make([]rdma.Completion, 1)
	if n, err := a.cq.Wait(ctx, wc); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %d %v", n, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancelled Wait returned after %v", d)
	}
	postRecv(t, b.qp, rdma.RecvWR{ID: id + 1, SGL: sgl(dst, 0, 8)})
	expectStatus(t, a.cq, id, rdma.StatusSuccess)
	expectStatus(t, b.cq, id+1, rdma.StatusSuccess)
}

// TestInlineWaitsShareTheirInterrupt: inline Waits under one cancellable
// context register its interrupt once, not once per Wait, so a READ and
// its Wait allocate nothing; a Wait under another context is still
// interrupted when that one ends, and the first context's registration,
// replaced, does not stop the link from serving.
func TestInlineWaitsShareTheirInterrupt(t *testing.T) {
	a, b := newPair(t, slowCfg)
	src := register(t, a.pd, 64, rw)
	dst := register(t, b.pd, 64, rw)
	wr := []rdma.SendWR{{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(src, 0, 64), RemoteAddr: dst.Addr(), RKey: dst.RKey()}}
	ctx, cancel := context.WithCancel(context.Background())
	wc := make([]rdma.Completion, 1)
	read := func() {
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if n, err := a.cq.Wait(ctx, wc); n != 1 || err != nil || wc[0].Status != rdma.StatusSuccess {
			t.Fatalf("READ: %d %v %v", n, err, wc[0].Status)
		}
	}
	read()
	if allocs := testing.AllocsPerRun(200, read); allocs != 0 {
		t.Errorf("a READ and its inline Wait under one cancellable context allocate %.1f times", allocs)
	}
	cancel() // fires the kept registration into an idle link

	unansweredSendOutlivesWait(t, a, b, src, dst, 2) // under another context
	wr[0].ID = 4
	ctx = context.Background()
	read()
}

// An inline Wait blocked on a QP's responses must still return a RECV
// completion the responder pushes into the same CQ.
func TestInlineWaitSeesOtherCompletions(t *testing.T) {
	a, b := newPair(t, slowCfg)
	abuf := register(t, a.pd, 64, rw)
	bbuf := register(t, b.pd, 64, rw)
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(abuf, 0, 8)})
	postRecv(t, a.qp, rdma.RecvWR{ID: 2, SGL: sgl(abuf, 8, 8)})
	got := make(chan rdma.Completion, 1)
	go func() {
		wc := make([]rdma.Completion, 1)
		a.cq.Wait(context.Background(), wc)
		got <- wc[0]
	}()
	time.Sleep(20 * time.Millisecond) // the Wait now reads a's connection
	post(t, b.qp, rdma.SendWR{ID: 3, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(bbuf, 0, 8)})
	select {
	case wc := <-got:
		if wc.ID != 2 || wc.Status != rdma.StatusSuccess || wc.Op != rdma.OpRecv {
			t.Fatalf("%+v", wc)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Wait missed the RECV completion")
	}
	expectStatus(t, b.cq, 3, rdma.StatusSuccess)
	postRecv(t, b.qp, rdma.RecvWR{ID: 4, SGL: sgl(bbuf, 8, 8)})
	expectStatus(t, a.cq, 1, rdma.StatusSuccess)
}

// A QP reading inline goes back to its goroutine when its CQ gets a
// second QP, even with a Wait blocked inline at that moment.
func TestLazyQPDemoted(t *testing.T) {
	a, b := newPair(t, slowCfg)
	abuf := register(t, a.pd, 64, rw)
	bbuf := register(t, b.pd, 64, rw)
	post(t, a.qp, rdma.SendWR{ID: 9, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(abuf, 0, 8), RemoteAddr: bbuf.Addr(), RKey: bbuf.RKey()})
	expectStatus(t, a.cq, 9, rdma.StatusSuccess)
	c := a.cq.(*cq)
	c.mu.Lock()
	lazy := c.lazy
	c.mu.Unlock()
	if a.qp.(*qp).rx.eager.Load() || lazy != a.qp.(*qp) {
		t.Fatal("a lone QP should read lazily")
	}
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(abuf, 0, 8)})
	got := make(chan rdma.Completion, 1)
	go func() {
		wc := make([]rdma.Completion, 1)
		a.cq.Wait(context.Background(), wc)
		got <- wc[0]
	}()
	time.Sleep(20 * time.Millisecond)
	other := createQP(t, a.pd, rdma.QPConfig{SendCQ: a.cq, RecvCQ: a.cq})
	if !a.qp.(*qp).rx.eager.Load() {
		t.Fatal("not demoted")
	}
	postRecv(t, b.qp, rdma.RecvWR{ID: 2, SGL: sgl(bbuf, 0, 8)})
	select {
	case wc := <-got:
		if wc.ID != 1 || wc.Status != rdma.StatusSuccess {
			t.Fatalf("%+v", wc)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no completion after demotion")
	}
	expectStatus(t, b.cq, 2, rdma.StatusSuccess)
	// Now a second pair on the shared CQ and the first QP both work.
	peer := createQP(t, b.pd, rdma.QPConfig{SendCQ: b.cq, RecvCQ: b.cq})
	rdmatest.Connect(t, other, peer)
	for i := range 20 {
		q := a.qp
		if i%2 == 1 {
			q = other
		}
		post(t, q, rdma.SendWR{ID: uint64(100 + i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(abuf, 0, 8), RemoteAddr: bbuf.Addr(), RKey: bbuf.RKey()})
		expectStatus(t, a.cq, uint64(100+i), rdma.StatusSuccess)
	}
}

// The sweeper slows down once Waits have read every response for
// sweepQuiet, to sweepMax, and is back at sweepEvery at the first tick
// that finds one left unread.
func TestSweepPeriodBacksOffWhileNothingIsLate(t *testing.T) {
	if got := sweepPeriod(sweepEvery, sweepQuiet/2); got != sweepEvery {
		t.Fatalf("%v after a late response: %v, want %v", sweepQuiet/2, got, sweepEvery)
	}
	p := sweepEvery
	for i := 0; i < 10; i++ {
		next := sweepPeriod(p, sweepQuiet)
		if next < p || next > sweepMax || (p < sweepMax && next == p) {
			t.Fatalf("after a tick of %v with nothing late: %v; want longer, up to %v", p, next, sweepMax)
		}
		p = next
	}
	if p != sweepMax {
		t.Fatalf("after 10 quiet ticks the period is %v, want %v", p, sweepMax)
	}
	if got := sweepPeriod(p, 0); got != sweepEvery {
		t.Fatalf("after a tick that found a late response: %v, want %v", got, sweepEvery)
	}
	// A response nobody reads waits at most a slowed tick and lazyDelay.
	if sweepMax+lazyDelay > 50*time.Millisecond {
		t.Fatalf("sweepMax %v: TestSweeperReadsUnwatchedResponses waits 50 ms", sweepMax)
	}
}
