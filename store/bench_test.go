package store

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// BenchmarkCommit measures commit throughput per sync policy and number of
// concurrent committers (each with its own client and lease), and reports
// how many commits each group commit carried.
//
// The +sessions variants give each committer an idempotency session (a
// write numbered like a client's), which adds a session entry to each
// commit's batch.
func BenchmarkCommit(b *testing.B) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncBatch, SyncNone} {
		for _, committers := range []int{1, 4, 16} {
			for _, sessions := range []bool{false, true} {
				name := fmt.Sprintf("sync=%v/committers=%d", policy, committers)
				if sessions {
					name += "+sessions"
				}
				b.Run(name, func(b *testing.B) { benchmarkCommit(b, policy, committers, sessions) })
			}
		}
	}
}

func benchmarkCommit(b *testing.B, policy SyncPolicy, committers int, sessions bool) {
	opts := benchOptions()
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
			var wr proto.Write
			if sessions {
				wr.Session = uint64(i + 1)
			}
			for j := i; j < b.N; j += committers {
				if w.off+2048 > w.lease.Size {
					w = w.c.newWriter()
				}
				if sessions {
					wr.Seq++
				}
				if _, err := w.putW(fmt.Appendf(nil, "k%d", j), value, wr); err != nil {
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
			opts := benchOptions()
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

// BenchmarkScan measures Scan's merge across shards over 100k keys spread
// over all 1024 shards: a full scan, a scan of the first 100 keys (about
// one seek per shard), and for comparison the alternative for a full
// scan: one pass over Pebble's key order (shard first) and a sort.
func BenchmarkScan(b *testing.B) {
	const n = 100_000
	opts := benchOptions()
	opts.Sync, opts.ArenaSize, opts.ArenaCount, opts.LeaseSize = SyncNone, 64<<20, 1, 1<<20
	opts.IndexSlots = 1 << 18
	sv := newBareServer(b, opts)
	s := sv.s
	if err := s.BeginIncoming(AllShards(), 1); err != nil {
		b.Fatal(err)
	}
	byShard := make([][][]byte, proto.NumShards)
	for i := range n {
		k := key(i)
		rec := make([]byte, proto.RecordSize(len(k), 8))
		if _, err := proto.EncodeRecord(rec, uint64(i+1), 0, k, []byte("8 bytes!")); err != nil {
			b.Fatal(err)
		}
		sh := proto.ShardOf(k)
		byShard[sh] = append(byShard[sh], rec)
	}
	for sh, recs := range byShard {
		if err := s.Ingest(context.Background(), proto.Shard(sh), recs, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.ActivateShards(AllShards(), 1); err != nil {
		b.Fatal(err)
	}
	// Measure the steady state of a store that has run a while: the
	// entries in compacted sstables, not in the memtable.
	if err := s.db.Compact(context.Background(), keyPrefix, keyEnd, true); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.Run("full", func(b *testing.B) {
		for range b.N {
			got, err := s.Scan(nil, nil, nil, 0)
			if err != nil || len(got) != n {
				b.Fatalf("%d keys, %v", len(got), err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
	})
	b.Run("limit=100", func(b *testing.B) {
		for range b.N {
			if got, err := s.Scan(nil, nil, nil, 100); err != nil || len(got) != 100 {
				b.Fatalf("%d keys, %v", len(got), err)
			}
		}
	})
	b.Run("baseline-pass-and-sort", func(b *testing.B) {
		for range b.N {
			it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: keyPrefix, UpperBound: keyEnd})
			if err != nil {
				b.Fatal(err)
			}
			var out []ScanEntry
			for it.First(); it.Valid(); it.Next() {
				e, _ := decodeEntry(it.Value())
				out = append(out, ScanEntry{Key: append([]byte(nil), it.Key()[dataKeyPrefixN:]...), Location: e.loc, Version: e.version})
			}
			it.Close()
			slices.SortFunc(out, func(x, y ScanEntry) int { return bytes.Compare(x.Key, y.Key) })
			if len(out) != n {
				b.Fatal(len(out))
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
	})
}

// benchOptions is smallOptions with the default registration unit: the
// benchmarks' arenas are larger, with larger segments, than the 2 MiB
// units of the tests' small ones allow.
func benchOptions() Options {
	opts := smallOptions()
	opts.RegistrationUnit = 0
	return opts
}
