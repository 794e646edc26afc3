package store

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// BenchmarkCommit measures commit throughput per sync policy and number of
// concurrent committers (each with its own client and lease), and reports
// how many commits each group commit carried.
func BenchmarkCommit(b *testing.B) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncBatch, SyncNone} {
		for _, committers := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("sync=%v/committers=%d", policy, committers), func(b *testing.B) {
				opts := smallOptions()
				opts.Sync, opts.ArenaSize, opts.ArenaCount, opts.LeaseSize = policy, 256<<20, 2, 4<<20
				opts.IndexSlots = 1 << 20
				sv := newServer(b, opts)
				waitArenas(b, sv.s, opts.ArenaCount)
				writers := make([]*writer, committers)
				for i := range writers {
					writers[i] = newClient(b, sv).newWriter()
				}
				value := make([]byte, 1024)
				before := sv.s.Stats()
				b.ResetTimer()
				var wg sync.WaitGroup
				for i, w := range writers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for j := i; j < b.N; j += committers {
							if w.off+2048 > w.lease.Size {
								w = w.c.newWriter()
							}
							if _, err := w.put(fmt.Appendf(nil, "k%d", j), value); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				after := sv.s.Stats()
				if batches := after.Batches - before.Batches; batches > 0 {
					b.ReportMetric(float64(after.Commits-before.Commits)/float64(batches), "commits/batch")
					b.ReportMetric((after.SyncTime-before.SyncTime).Seconds()*1e3/float64(batches), "apply-ms/batch")
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
			})
		}
	}
}

// BenchmarkLookupReads reports the RDMA_READs a GET needs at several index
// load factors: one neighborhood READ plus one record READ per fingerprint
// match (a warm location cache skips the first).
func BenchmarkLookupReads(b *testing.B) {
	for _, load := range []float64{0.5, 0.75, 0.9} {
		b.Run(fmt.Sprintf("load=%.2f", load), func(b *testing.B) {
			const slots = 1 << 16
			x, arena, table := newTestIndex(b, slots, 0)
			// Fill to the load; past ~0.89 some inserts fail (the table
			// refuses them at MaxIndexLoad anyway): skip and count those.
			var keys [][]byte
			failed := 0
			for i := 0; len(keys) < int(load*slots); i++ {
				if _, _, err := x.Put(key(i), arena.alloc(key(i))); err != nil {
					failed++
					continue
				}
				keys = append(keys, key(i))
			}
			n := len(keys)
			geo := x.Geometry()
			reads := 0
			var locs []proto.Location
			b.ResetTimer()
			for i := range b.N {
				k := keys[i%n]
				h := geo.Hash(k)
				off := geo.NeighborhoodOffset(geo.Home(h))
				var err error
				locs, err = proto.FindInNeighborhood(table[off:off+geo.NeighborhoodBytes()], h, locs[:0])
				if err != nil {
					b.Fatal(err)
				}
				reads++ // the neighborhood
				for _, l := range locs {
					reads++ // each candidate record, until the key matches
					if k2, _ := arena.keyAt(l); string(k2) == string(k) {
						break
					}
				}
			}
			b.ReportMetric(float64(reads)/float64(b.N), "READs/GET-cold")
			b.ReportMetric(float64(reads-b.N)/float64(b.N), "READs/GET-warm")
			b.ReportMetric(float64(failed), "failed-inserts")
		})
	}
}

// BenchmarkRestart measures reopening a store of n keys: Pebble scan and
// hash index rebuild (arena registration continues in the background).
func BenchmarkRestart(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			if testing.Short() && n > 100_000 {
				b.Skip("1e6 keys skipped in -short mode")
			}
			opts := smallOptions()
			opts.Sync, opts.ArenaSize, opts.ArenaCount, opts.LeaseSize = SyncNone, 1<<30, 1, 16<<20
			opts.IndexSlots = 1 << 21
			sv := newServer(b, opts)
			waitArenas(b, sv.s, 1)
			w := newClient(b, sv).newWriter()
			for i := range n {
				if w.off+128 > w.lease.Size {
					w = w.c.newWriter()
				}
				if _, err := w.put(key(i), []byte("v")); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				sv.restart()
				b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms/restart")
			}
			if got := sv.s.Stats().Keys; got != int64(n) {
				b.Fatalf("%d keys after restart, want %d", got, n)
			}
		})
	}
}
