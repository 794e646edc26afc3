// Tests of many QPs between the same two devices: frames that are ready
// together leave in one write, and one QP's error, death of the peer or
// unpolled CQ stays that QP's business. They are what carrying many QPs
// over one connection (issue 14) must keep true.

package soft

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

// qpPair is one connected QP pair of a devicePair, each QP with its own CQ.
type qpPair struct {
	x, y     rdma.QP
	cx, cy   rdma.CQ
	local    rdma.MR // on x's side
	remote   rdma.MR // on y's side
	slotSize int
}

// devicePair is two devices joined by n QP pairs.
type devicePair struct {
	dx, dy rdma.Device
	px, py rdma.PD
	qps    []*qpPair
}

func newDevicePair(t *testing.T, n, slot int, cfg rdma.QPConfig) *devicePair {
	t.Helper()
	return newDevicePairWith(t, rdma.Options{Links: 1}, n, slot, func(int) rdma.QPConfig { return cfg })
}

// newDevicePairWith is newDevicePair of devices opened with opts
// (newDevicePair's have every QP between them on one link).
func newDevicePairWith(t *testing.T, opts rdma.Options, n, slot int, cfgOf func(pair int) rdma.QPConfig) *devicePair {
	t.Helper()
	p := &devicePair{dx: openDevWith(t, opts), dy: openDevWith(t, opts)}
	p.px, p.py = allocPD(t, p.dx), allocPD(t, p.dy)
	for i := range n {
		q := &qpPair{cx: createCQ(t, p.dx, 64), cy: createCQ(t, p.dy, 64), slotSize: slot}
		cx, cy := cfgOf(i), cfgOf(i)
		cx.SendCQ, cx.RecvCQ = q.cx, q.cx
		cy.SendCQ, cy.RecvCQ = q.cy, q.cy
		q.x, q.y = createQP(t, p.px, cx), createQP(t, p.py, cy)
		rdmatest.Connect(t, q.x, q.y)
		q.local, q.remote = register(t, p.px, slot, rw), register(t, p.py, slot, rw)
		p.qps = append(p.qps, q)
	}
	return p
}

// roundTrip WRITEs a value unique to (QP, round) and READs it back, on
// one post: a READ after a WRITE on the same QP sees it.
func (q *qpPair) roundTrip(ctx context.Context, id, round int) error {
	half := q.slotSize / 2
	src, dst := q.local.Bytes()[:half], q.local.Bytes()[half:]
	for i := range src {
		src[i] = byte(id*31 + round + i)
	}
	wrs := []rdma.SendWR{
		{ID: 1, Op: rdma.OpWrite, SGL: sgl(q.local, 0, half), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()},
		{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(q.local, half, half), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()},
	}
	if err := q.x.PostSend(wrs); err != nil {
		return err
	}
	wc := make([]rdma.Completion, 1)
	if _, err := q.cx.Wait(ctx, wc); err != nil {
		return err
	}
	if wc[0].ID != 2 || wc[0].Status != rdma.StatusSuccess {
		return fmt.Errorf("QP %d round %d: completion %+v", id, round, wc[0])
	}
	for i := range dst {
		if dst[i] != src[i] {
			return fmt.Errorf("QP %d round %d: byte %d read back %d, wrote %d", id, round, i, dst[i], src[i])
		}
	}
	return nil
}

// A post of several requests leaves in one write, and the responder
// answers what it read together in one write.
func TestPostLeavesInOneWrite(t *testing.T) {
	const n, size = 16, 512
	a, b := newPair(t, rdma.QPConfig{MaxSendWR: n})
	local := register(t, a.pd, n*size, rw)
	remote := register(t, b.pd, n*size, rw)
	// A first round trip: both connections are up before the counters
	// are looked at.
	post(t, a.qp, rdma.SendWR{ID: n - 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	expectStatus(t, a.cq, n-1, rdma.StatusSuccess)
	req, resp := &a.qp.(*qp).tx.w, &b.qp.(*qp).rsp.w
	for round := range 3 {
		wrs := make([]rdma.SendWR, n)
		for i := range wrs {
			op := rdma.OpRead
			if i%2 == round%2 {
				op = rdma.OpWrite
			}
			off := i * size
			wrs[i] = rdma.SendWR{ID: uint64(i), Op: op, SGL: sgl(local, off, size), RemoteAddr: remote.Addr() + uint64(off), RKey: remote.RKey()}
		}
		wrs[n-1].Flags = rdma.Signaled
		req0, resp0 := req.writes.Load(), resp.writes.Load()
		post(t, a.qp, wrs...)
		expectStatus(t, a.cq, n-1, rdma.StatusSuccess)
		if got := req.writes.Load() - req0; got != 1 {
			t.Errorf("round %d: %d requests left in %d writes, want 1", round, n, got)
		}
		if got := resp.writes.Load() - resp0; got != 1 {
			t.Errorf("round %d: %d responses left in %d writes, want 1", round, n, got)
		}
	}
}

// Many QPs between two devices, all busy at once, each with its own data.
func TestManyQPsBetweenTwoDevices(t *testing.T) {
	const n, rounds = 32, 50
	p := newDevicePair(t, n, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.roundTripsAtOnce(t, ctx, rounds)
}

// roundTripsAtOnce runs rounds round trips on every QP of p, all QPs at
// once, and fails t on the first error of each.
func (p *devicePair) roundTripsAtOnce(t *testing.T, ctx context.Context, rounds int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(p.qps))
	for i, q := range p.qps {
		wg.Go(func() {
			for r := range rounds {
				if err := q.roundTrip(ctx, i, r); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// busy runs round trips on the QPs from index 1 on until stop, and
// returns how many each did and the first error.
// checkNeighbours stops the load busy started and checks that QPs 1 and
// up, the neighbours of the QP a test troubles, each did round trips
// (when, in the message: while what happened to QP 0).
func checkNeighbours(t *testing.T, stop chan struct{}, wait func() ([]int, error), when string) {
	t.Helper()
	close(stop)
	counts, err := wait()
	if err != nil {
		t.Fatalf("another QP failed: %v", err)
	}
	for i, c := range counts[1:] {
		if c == 0 {
			t.Errorf("QP %d did no round trip %s", i+1, when)
		}
	}
}

func busy(ctx context.Context, qps []*qpPair, stop <-chan struct{}) (wait func() ([]int, error)) {
	var wg sync.WaitGroup
	counts := make([]int, len(qps))
	var first atomic.Pointer[error]
	for i := 1; i < len(qps); i++ {
		wg.Go(func() {
			for r := 0; ; r++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := qps[i].roundTrip(ctx, i, r); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
				counts[i]++
			}
		})
	}
	return func() ([]int, error) {
		wg.Wait()
		if e := first.Load(); e != nil {
			return counts, *e
		}
		return counts, nil
	}
}

// One QP's REM_ACCESS_ERR moves that QP, and its peer, to ERR and flushes
// its requests only; the other QPs between the same devices, busy all the
// while, see nothing of it.
func TestErrorStaysOnItsQP(t *testing.T) {
	const n = 8
	p := newDevicePair(t, n, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := busy(ctx, p.qps, stop)
	time.Sleep(20 * time.Millisecond)

	q := p.qps[0]
	bad := rdma.SendWR{ID: 0, Op: rdma.OpRead, SGL: sgl(q.local, 0, 8), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey() ^ 0x5a5a}
	good := rdma.SendWR{Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 8), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()}
	wrs := []rdma.SendWR{bad, good, good, good}
	for i := range wrs {
		wrs[i].ID = uint64(i)
	}
	post(t, q.x, wrs...)
	expectStatus(t, q.cx, 0, rdma.StatusRemAccessErr)
	if st := q.x.State(); st != rdma.QPStateError {
		t.Fatalf("QP with the failed request in %v", st)
	}
	for i := 1; i < len(wrs); i++ {
		expectStatus(t, q.cx, uint64(i), rdma.StatusWRFlushErr)
	}
	time.Sleep(50 * time.Millisecond) // the others keep working meanwhile
	checkNeighbours(t, stop, done, "while QP 0 failed")
	deadline := time.Now().Add(5 * time.Second)
	for q.y.State() != rdma.QPStateError && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := q.y.State(); st != rdma.QPStateError {
		t.Errorf("the peer of the QP that NAKed is in %v, want ERR", st)
	}
	for i, o := range p.qps[1:] {
		if o.x.State() != rdma.QPStateRTS || o.y.State() != rdma.QPStateRTS {
			t.Errorf("QP pair %d in %v/%v after another's error", i+1, o.x.State(), o.y.State())
		}
		if err := o.roundTrip(ctx, i+1, -1); err != nil {
			t.Error(err)
		}
	}
}

// When the peer's device goes away, every QP with requests outstanding
// fails them with RETRY_EXC_ERR, in order, within bounded time.
func TestPeerDeathSeenByEveryQP(t *testing.T) {
	const n = 8
	p := newDevicePair(t, n, 1<<20, fastFail)
	for _, q := range p.qps {
		wrs := make([]rdma.SendWR, 4)
		for i := range wrs {
			wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 1<<20), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()}
		}
		post(t, q.x, wrs...)
	}
	start := time.Now()
	// The peer process dies: its QPs, MRs and device go at once.
	for _, q := range p.qps {
		if err := q.y.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i, q := range p.qps {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			failed := false
			wc := make([]rdma.Completion, 1)
			for id := range 4 {
				if _, err := q.cx.Wait(ctx, wc); err != nil {
					t.Errorf("QP %d: waiting for request %d: %v", i, id, err)
					return
				}
				c := wc[0]
				switch {
				case c.ID != uint64(id):
					t.Errorf("QP %d: completion of %d, want %d", i, c.ID, id)
				case failed && c.Status != rdma.StatusWRFlushErr, !failed && c.Status != rdma.StatusSuccess && c.Status != rdma.StatusRetryExcErr:
					t.Errorf("QP %d: completion %+v", i, c)
				}
				failed = failed || c.Status != rdma.StatusSuccess
			}
			if q.x.State() != rdma.QPStateError && failed {
				t.Errorf("QP %d in %v after RETRY_EXC_ERR", i, q.x.State())
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v for every QP to see the peer gone", d)
	}
}

// A QP whose CQ nobody polls does not hold up the completions of the
// other QPs between the same devices: its responses are read (and its
// CQ overruns) while the others keep completing.
func TestUnpolledCQBlocksNoOther(t *testing.T) {
	const n = 4
	p := newDevicePair(t, n, 256, rdma.QPConfig{MaxSendWR: 256})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	done := busy(ctx, p.qps, stop)

	// QP 0 posts signaled requests that nobody polls for: more than its
	// 64-entry CQ holds.
	q := p.qps[0]
	w := rdma.SendWR{Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 8), RemoteAddr: q.remote.Addr(), RKey: q.remote.RKey()}
	for range 4 {
		wrs := make([]rdma.SendWR, 64)
		for i := range wrs {
			wrs[i] = w
		}
		post(t, q.x, wrs...)
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	checkNeighbours(t, stop, done, "next to an unpolled CQ")
	// The unpolled QP's responses were read all the same: its CQ overran.
	wc := make([]rdma.Completion, 1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := q.cx.Poll(wc)
		if errors.Is(err, rdma.ErrCQOverrun) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unpolled CQ did not overrun: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// Closing every QP between two devices leaves no goroutine behind and the
// devices closable (TestMain checks for leaks).
func TestLastQPCloseTearsDown(t *testing.T) {
	const n = 8
	base := goleak.IgnoreCurrent()
	p := newDevicePair(t, n, 256, rdma.QPConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, q := range p.qps {
		if err := q.roundTrip(ctx, i, 0); err != nil {
			t.Fatal(err)
		}
	}
	for i, q := range p.qps {
		// Closing one side first, then the other, with the rest still up.
		if err := q.x.Close(); err != nil {
			t.Fatal(err)
		}
		if err := q.y.Close(); err != nil {
			t.Fatal(err)
		}
		for j, o := range p.qps[i+1:] {
			if err := o.roundTrip(ctx, i+1+j, 1); err != nil {
				t.Fatalf("after closing pair %d: %v", i, err)
			}
		}
	}
	// Only the devices' own goroutines are left: no QP's, nor any
	// connection's.
	goleak.VerifyNone(t, base,
		goleak.IgnoreAnyFunction("github.com/rkv-io/rkv/rdma/soft.(*device).acceptLoop"),
		goleak.IgnoreAnyFunction("github.com/rkv-io/rkv/rdma/soft.(*device).sweeper"))
}
