package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/store"
)

// BenchmarkGrow loads three servers with RKV_BENCH_GROW_KEYS keys (default
// 1e6) of 1 KiB, then adds a fourth, which takes a quarter of the shards
// and their keys while two goroutines GET and one PUTs. It reports the
// migration's rate and the load's throughput before and during it
// (make bench-grow):
//
//	go test -run '^$' -bench Grow -benchtime 1x -timeout 30m ./server/
func BenchmarkGrow(b *testing.B) {
	nkeys := 1000000
	if v := os.Getenv("RKV_BENCH_GROW_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("RKV_BENCH_GROW_KEYS=%q: want a positive integer", v)
		}
		nkeys = n
	}
	const size = 1024
	for range b.N {
		c, cl := growCluster(b, nkeys, size)
		key := func(i int) []byte { return []byte(fmt.Sprintf("grow-%08d", i)) }
		value := make([]byte, size)
		ctx := context.Background()
		loaded := putParallel(b, cl, nkeys, key, value)
		if b.Failed() {
			return
		}
		b.Logf("loaded %d keys of %d bytes in %v", nkeys, size, loaded.Round(time.Millisecond))
		var wg sync.WaitGroup

		// The load counts its operations; a phase reads the counters at
		// its ends.
		var gets, puts, errs atomic.Int64
		lctx, stop := context.WithCancel(ctx)
		worker := func(seed uint64, op func(k []byte) error, n *atomic.Int64) {
			rng := rand.New(rand.NewPCG(seed, 1))
			for lctx.Err() == nil {
				if err := op(key(rng.IntN(nkeys))); err != nil {
					if lctx.Err() == nil {
						errs.Add(1)
						b.Log(err)
					}
					continue
				}
				n.Add(1)
			}
		}
		for r := range 2 {
			wg.Go(func() {
				worker(uint64(r), func(k []byte) error { _, err := cl.Get(lctx, k); return err }, &gets)
			})
		}
		wg.Go(func() { worker(9, func(k []byte) error { return cl.Put(lctx, k, value) }, &puts) })
		const warm = 5 * time.Second
		time.Sleep(warm)
		g0, p0 := gets.Load(), puts.Load()

		b.ResetTimer()
		t1 := time.Now()
		c.Add("s4")
		c.WaitSettled(20 * time.Minute)
		took := time.Since(t1)
		b.StopTimer()
		g1, p1 := gets.Load()-g0, puts.Load()-p0
		stop()
		wg.Wait()
		if n := errs.Load(); n > 0 {
			b.Fatalf("%d operations failed during the move", n)
		}
		st, err := cl.Stats(ctx, "s4")
		if err != nil {
			b.Fatal(err)
		}
		mib := float64(st.CopiedBytes) / (1 << 20)
		rate := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() }
		b.Logf("s4 took %d shards, %d keys, %.1f MiB in %v (copy time %v); GETs %.0f/s before, %.0f/s during; PUTs %.0f/s before, %.0f/s during",
			st.ShardsMovedIn, st.CopiedKeys, mib, took.Round(time.Millisecond), st.CopyTime.Round(time.Millisecond),
			rate(g0, warm), rate(g1, took), rate(p0, warm), rate(p1, took))
		b.ReportMetric(mib/took.Seconds(), "MiB/s")
		b.ReportMetric(rate(int64(st.CopiedKeys), took), "keys/s")
		b.ReportMetric(took.Seconds(), "s-to-settle")
		b.ReportMetric(rate(g0, warm), "gets/s-before")
		b.ReportMetric(rate(g1, took), "gets/s-during")
		b.ReportMetric(rate(p0, warm), "puts/s-before")
		b.ReportMetric(rate(p1, took), "puts/s-during")
	}
}

// growCluster starts three servers with room for nkeys values of size
// bytes, a fourth server's share copied in, and the overwrites of a run:
// space of overwritten records is not reclaimed yet.
func growCluster(b *testing.B, nkeys, size int) (*testcluster.Cluster, *client.Client) {
	const arena = 256 << 20
	perServer := int64(nkeys) * int64(size+128) / 3
	count := int(perServer*3/2/arena) + 2
	slots := uint64(1 << 12)
	for slots < 2*uint64(nkeys)/3 {
		slots <<= 1
	}
	c := testcluster.Start(b, 3, testcluster.Options{Store: store.Options{ArenaSize: arena, ArenaCount: count,
		IndexSlots: slots, LeaseSize: 4 << 20, Sync: store.SyncNone}})
	return c, c.Client(b, nil)
}

// putParallel puts keys key(0) to key(n-1), each with value, from 8
// goroutines sharing cl, and returns how long it took; a failed put fails
// tb and stops its goroutine.
func putParallel(tb testing.TB, cl *client.Client, n int, key func(int) []byte, value []byte) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := cl.Put(ctx, key(i), value); err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(t0)
}
