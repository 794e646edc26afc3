package client_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/race"
	"github.com/rkv-io/rkv/store"
)

// TestSteadyStateAllocs counts the allocations of a warm GetAppend and PUT,
// client, server and soft provider together (AllocsPerRun counts every
// goroutine's), under a context without a deadline and under one that can
// be cancelled. Neither allocates: the store's pending commits are pooled
// (2 allocations a PUT when each was new). AllocsPerRun divides in
// integers, so what is left of less than one a PUT passes: the read error
// (net.OpError) of an inline Wait that a completion pushed by the other
// link interrupts, the client reading for its SEND's ACK when the reply
// comes first, one commit in session.SignalEvery. (The other commits and
// all replies are unsignaled, and their Waits do not read for held ACKs: a
// PUT allocated 4 to 5 times while every one did.) A MultiGet's budget is
// below.
func TestSteadyStateAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocations are counted without the race detector: make test-allocs")
	}
	cl := benchCluster(t, store.SyncNone)
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	k, v := []byte("allocs-key"), make([]byte, 1024)
	dst := make([]byte, 0, 2048)
	for _, ctx := range []struct {
		name string
		ctx  context.Context
	}{{"background", context.Background()}, {"cancellable", cancellable}} {
		put := func() {
			if err := cl.Put(ctx.ctx, k, v); err != nil {
				t.Fatal(err)
			}
		}
		get := func() {
			got, err := cl.GetAppend(ctx.ctx, dst[:0], k)
			if err != nil || len(got) != len(v) {
				t.Fatalf("GetAppend: %d bytes, %v", len(got), err)
			}
		}
		for range 200 { // leases grown, locations cached
			put()
			get()
		}
		if n := leastAllocs(get); n != 0 {
			t.Errorf("%s: a GetAppend allocates %.1f times", ctx.name, n)
		}
		if n := leastAllocs(put); n != 0 {
			t.Errorf("%s: a PUT allocates %.1f times, client and server together", ctx.name, n)
		}
	}
	// A MultiGet of cached keys allocates its values (16) and its own
	// bookkeeping (the result, the groups by server and the retry loop's
	// closures: 11 here), nothing per key besides: its READs carry no
	// callback of their own (68 in all when they did).
	keys := make([][]byte, 16)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "allocs-multi-%d", i)
		if err := cl.Put(context.Background(), keys[i], v); err != nil {
			t.Fatal(err)
		}
	}
	multiGet := func() {
		if vals, err := cl.MultiGet(context.Background(), keys); err != nil || len(vals) != len(keys) || len(vals[0]) != len(v) {
			t.Fatalf("MultiGet: %d values, %v", len(vals), err)
		}
	}
	for range 200 {
		multiGet()
	}
	n := leastAllocs(multiGet)
	t.Logf("a MultiGet of 16 allocates %.1f times", n)
	if n > 12 {
		t.Errorf("a MultiGet of 16 cached keys allocates %.1f times; the budget is 12", n)
	}
	// A MultiPut of 16 to one server allocates nothing per pair: its own
	// bookkeeping (the keys, sessions, groups, the retry loop's closures),
	// the batch's commits and results on both sides, and their frames'
	// decoding: 25 here. It allocated 66 when it kept a set of the keys
	// given (a copy of each) and started a goroutine for the one server.
	kvs := make([]client.KV, len(keys))
	for i, k := range keys {
		kvs[i] = client.KV{Key: k, Value: v}
	}
	multiPut := func() {
		if err := cl.MultiPut(context.Background(), kvs); err != nil {
			t.Fatalf("MultiPut: %v", err)
		}
	}
	for range 200 {
		multiPut()
	}
	n = leastAllocs(multiPut)
	t.Logf("a MultiPut of 16 allocates %.1f times", n)
	if n > 32 {
		t.Errorf("a MultiPut of 16 allocates %.1f times, client and server together; the budget is 32", n)
	}
}

// leastAllocs is the fewest allocations per call of f in a few rounds of
// 200. AllocsPerRun counts every goroutine's: a round that Raft's
// heartbeats, gossip or a read lease renewal fell into counts theirs too,
// and on a loaded machine, where the calls take longer, more of them fall
// in (a CI run counted 8 per PUT where 4 is usual).
func leastAllocs(f func()) float64 {
	least := math.Inf(1)
	for range 3 {
		least = min(least, testing.AllocsPerRun(200, f))
	}
	return least
}
