// Tests of the per-server connection pool.

package client

import (
	"context"
	"errors"
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
