package client_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/store"
)

// BenchmarkCleaner measures what the cleaner costs: overwrites of 1 KiB
// values by 16 goroutines sharing one client, and the GET p50 of one more
// goroutine meanwhile, on a store that is not yet full (no cleaning) and
// then on the same store once 3x its capacity has been overwritten (the
// cleaner at work), over a working set of half and of 80% of the capacity
// (64 MiB in 1 MiB segments; soft provider, sync none):
//
//	go test -run '^$' -bench Cleaner -benchtime 1x ./client/
func BenchmarkCleaner(b *testing.B) {
	for _, fill := range []float64{0.5, 0.8} {
		b.Run(fmt.Sprintf("working-set=%.0f%%", fill*100), func(b *testing.B) { benchCleaner(b, fill) })
	}
}

func benchCleaner(b *testing.B, fill float64) {
	const size, writers = 1024, 16
	for range b.N {
		c := testcluster.Start(b, 1, testcluster.Options{Store: store.Options{ArenaSize: 32 << 20, ArenaCount: 2,
			IndexSlots: 1 << 16, LeaseSize: 256 << 10, SegmentSize: 1 << 20, Sync: store.SyncNone}})
		cl := c.Client(b, nil)
		srv := c.Running()[0]
		ctx := context.Background()
		capacity := srv.Store().Stats().Capacity
		nkeys := int(fill * float64(capacity) / (size + 64))
		key := func(i int) []byte { return fmt.Appendf(nil, "clean-%06d", i) }
		v := make([]byte, size)
		for i := range nkeys {
			if err := cl.Put(ctx, key(i), v); err != nil {
				b.Fatal(err)
			}
		}
		// Each phase overwrites as many keys as fit the free space of the
		// fresh store, so that the first runs before any cleaning.
		ops := int64(float64(srv.Store().Stats().Free) / 1.3 / (size + 64))
		// phase overwrites ops keys with writers goroutines while one more
		// times GETs; it returns puts/s and the GET p50.
		phase := func() (float64, time.Duration) {
			var next atomic.Int64
			var wg sync.WaitGroup
			t0 := time.Now()
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for next.Add(1) <= ops {
						if err := cl.Put(ctx, key(rng.IntN(nkeys)), v); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			done := make(chan struct{})
			var gets []time.Duration
			go func() {
				defer close(done)
				rng := rand.New(rand.NewPCG(99, 7))
				for next.Load() < ops {
					t := time.Now()
					if _, err := cl.Get(ctx, key(rng.IntN(nkeys))); err != nil {
						b.Error(err)
						return
					}
					gets = append(gets, time.Since(t))
				}
			}()
			wg.Wait()
			took := time.Since(t0)
			<-done
			return float64(ops) / took.Seconds(), p(gets, 50)
		}
		// Before the cleaner is needed: a fresh store of the same
		// working set, overwritten less than its free space. (At a high
		// fill the cleaner starts in it already, to keep free segments
		// ahead of the writers.)
		before := srv.Store().Stats()
		freshRate, freshGet := phase()
		if st := srv.Store().Stats(); st.SegmentsCleaned != before.SegmentsCleaned {
			b.Logf("working set %.0f%%: the cleaner emptied %d segments in the fresh phase", fill*100, st.SegmentsCleaned-before.SegmentsCleaned)
		}
		for written := int64(0); written < 3*capacity; written += ops * (size + 64) {
			phase()
		}
		before = srv.Store().Stats()
		cleanRate, cleanGet := phase()
		after := srv.Store().Stats()
		if after.SegmentsCleaned == before.SegmentsCleaned {
			b.Fatal("the cleaner did not run in the phase meant to measure it")
		}
		b.ReportMetric(freshRate, "fresh-puts/s")
		b.ReportMetric(cleanRate, "cleaning-puts/s")
		b.ReportMetric(cleanRate/freshRate, "put-ratio")
		b.ReportMetric(float64(freshGet.Microseconds()), "fresh-get-p50-µs")
		b.ReportMetric(float64(cleanGet.Microseconds()), "cleaning-get-p50-µs")
		b.ReportMetric(float64(cleanGet)/float64(freshGet), "get-p50-ratio")
		moved := after.CleanerMovedBytes - before.CleanerMovedBytes
		b.ReportMetric(float64(after.CommittedBytes-before.CommittedBytes+moved)/float64(after.CommittedBytes-before.CommittedBytes), "write-amplification")
		b.ReportMetric(float64(after.Live)/float64(after.Capacity), "utilization")
	}
}
