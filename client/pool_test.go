// Tests of the per-server connection pool.

package client

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestServerPoolBoundsRequestsInFlight(t *testing.T) {
	p := newServerPool(&Client{}, "s1", 3)
	ctx := context.Background()
	held := map[*serverConn]bool{}
	for range 3 {
		sc, err := p.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if held[sc] {
			t.Fatal("one connection handed to two requests")
		}
		held[sc] = true
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if sc, err := p.acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fourth request with three in flight got %p, %v; want it to wait out its context", sc, err)
	}
	var one *serverConn
	for sc := range held {
		one = sc
		break
	}
	p.release(one)
	if sc, err := p.acquire(ctx); err != nil || sc != one {
		t.Fatalf("after a release: %p, %v; want the released connection %p", sc, err, one)
	}
	if len(p.all) != 3 {
		t.Errorf("pool made %d connections, want 3", len(p.all))
	}
	if err := p.close(); err != nil {
		t.Fatal(err)
	}
}

// A goroutine's next request gets the connection it released last.
func TestServerPoolGivesTheLastReleasedFirst(t *testing.T) {
	p := newServerPool(&Client{}, "s1", 3)
	ctx := context.Background()
	var scs []*serverConn
	for range 3 {
		sc, err := p.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		scs = append(scs, sc)
	}
	for _, sc := range scs {
		p.release(sc)
	}
	for round := range 3 {
		sc, err := p.acquire(ctx)
		if err != nil || sc != scs[2] {
			t.Fatalf("round %d: %p, %v; want the connection released last, %p", round, sc, err, scs[2])
		}
		p.release(sc)
	}
}

// On a device with three links, concurrent requests take connections of
// distinct lanes, while a lone goroutine keeps the connection it released
// last.
func TestServerPoolSpreadsRequestsOverLanes(t *testing.T) {
	p := newServerPool(&Client{lanes: 3}, "s1", 6)
	ctx := context.Background()
	var scs []*serverConn
	for i := range 6 {
		sc, err := p.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if sc.lane != i%3 || sc.readLane() != 2+i%3 {
			t.Fatalf("connection %d: lane %d, read QP's lane %d; want %d and %d", i, sc.lane, sc.readLane(), i%3, 2+i%3)
		}
		scs = append(scs, sc)
	}
	// Released in this order, their lanes 1, 2, 1, 2, 0, 0: two of lane 0
	// on top.
	for _, i := range []int{4, 5, 1, 2, 0, 3} {
		p.release(scs[i])
	}
	held, err := p.acquire(ctx)
	if err != nil || held != scs[3] {
		t.Fatalf("the first request got %p, %v; want the connection released last, %p", held, err, scs[3])
	}
	for round := range 3 {
		// scs[0] (lane 0, released before scs[3]) is on top now, but a
		// request holds lane 0: the next takes lane 2's scs[2].
		sc, err := p.acquire(ctx)
		if err != nil || sc != scs[2] {
			t.Fatalf("round %d, with a lane-0 connection held: %p (lane %d), %v; want lane 2's released last, %p", round, sc, sc.lane, err, scs[2])
		}
		p.release(sc)
	}
	p.release(held)
	if sc, _ := p.acquire(ctx); sc != scs[3] {
		t.Fatalf("a lone request after the others: %p; want the connection released last, %p", sc, scs[3])
	}
	if p.busy[0] != 1 || p.busy[1] != 0 || p.busy[2] != 0 {
		t.Fatalf("requests holding each lane: %v; want [1 0 0]", p.busy)
	}
}

// A released connection goes to the request waiting longest that has not
// given up.
func TestServerPoolWaitersInOrder(t *testing.T) {
	p := newServerPool(&Client{}, "s1", 1)
	ctx := context.Background()
	sc, err := p.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gaveUp, cancel := context.WithCancel(ctx)
	quit := make(chan error, 1)
	go func() {
		_, err := p.acquire(gaveUp)
		quit <- err
	}()
	got := make(chan *serverConn, 1)
	waitUntil(t, func() bool { return p.waiters() == 1 })
	go func() {
		c, err := p.acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	waitUntil(t, func() bool { return p.waiters() == 2 })
	cancel()
	if err := <-quit; !errors.Is(err, context.Canceled) {
		t.Fatalf("the request that gave up: %v", err)
	}
	p.release(sc)
	select {
	case c := <-got:
		if c != sc {
			t.Fatalf("the waiting request got %p, want %p", c, sc)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the connection released while a request waited never reached it")
	}
}

func (p *serverPool) waiters() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting)
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
	}
}

// Requests that give up while connections are released lose none of them.
func TestServerPoolKeepsConnectionsOfRequestsThatGiveUp(t *testing.T) {
	const size = 2
	p := newServerPool(&Client{}, "s1", size)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration((g+i)%50)*time.Microsecond)
				sc, err := p.acquire(ctx)
				cancel()
				if err == nil {
					runtime.Gosched()
					p.release(sc)
				}
			}
		})
	}
	wg.Wait()
	for i := range size {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := p.acquire(ctx)
		cancel()
		if err != nil {
			t.Fatalf("connection %d of %d after the requests that gave up: %v", i+1, size, err)
		}
	}
}
