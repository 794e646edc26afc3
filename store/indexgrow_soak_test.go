//go:build soak

package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// Ten million keys of 16 bytes with 16-byte values into one store that
// starts with the default index (2^18 slots): the index grows while they
// are written, no write is refused, and a one-sided reader GETs random
// keys already acknowledged throughout, every one right. The GET p50 and
// the READs per GET are reported before the first growth, during the
// growths and after the last (make test-soak).
func TestTenMillionKeysGrowTheIndex(t *testing.T) {
	const n = 10_000_000
	opts := smallOptions()
	opts.ArenaSize, opts.ArenaCount, opts.LeaseSize = 256<<20, 3, 1<<20
	opts.IndexSlots, opts.MaxIndexSlots, opts.RegistrationUnit = 0, 0, 0 // the defaults: 128 MiB units, two an arena
	opts.Sync = SyncNone
	opts.Logger = nil
	sv := newServer(t, opts)
	waitArenas(t, sv.s, opts.ArenaCount)
	start := time.Now()
	var committed atomic.Int64 // keys 0..committed-1 are acknowledged
	var next atomic.Int64
	const writers = 16
	const chunk = 4096 // keys a writer takes at a time
	// inflight[w] is at most the first key writer w has not acknowledged
	// (MaxInt64 when it holds none).
	var inflight [writers]atomic.Int64
	for w := range inflight {
		inflight[w].Store(math.MaxInt64)
	}
	errc := make(chan error, writers+1)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			key := make([]byte, 16)
			val := make([]byte, 16)
			var l Lease
			var mem []byte
			var off int64
			var version uint64
			for {
				inflight[w].Store(next.Load()) // before taking a chunk: a bound below it
				first := next.Add(chunk) - chunk
				if first >= n {
					inflight[w].Store(math.MaxInt64)
					return
				}
				inflight[w].Store(first)
				for i := first; i < min(first+chunk, n); i++ {
					binary.BigEndian.PutUint64(key, uint64(i))
					binary.BigEndian.PutUint64(key[8:], uint64(i)*0x9e3779b97f4a7c15)
					binary.BigEndian.PutUint64(val, uint64(i))
					binary.BigEndian.PutUint64(val[8:], ^uint64(i))
					size := int64(proto.RecordSize(len(key), len(val)))
					if mem == nil || off+size > l.Size {
						if mem != nil {
							_ = sv.s.EndLease(l.ID)
						}
						var err error
						if l, err = sv.s.GrantLease(context.Background(), 0, size); err != nil {
							errc <- err
							return
						}
						mem, off, version = leaseBytes(sv.s, l.ID), 0, l.VersionBase
					}
					version++
					if _, err := proto.EncodeRecord(mem[off:], version, 0, key, val); err != nil {
						errc <- err
						return
					}
					if _, err := sv.s.Commit(context.Background(), l.ID, off, size, proto.Write{}); err != nil {
						errc <- fmt.Errorf("key %d: %w", i, err)
						return
					}
					off += size
				}
			}
		})
	}
	// committed: every key below it is acknowledged (the lowest chunk
	// still being written bounds it).
	stop := make(chan struct{})
	var progress sync.WaitGroup
	progress.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		lastLog := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			low := next.Load()
			for w := range writers {
				low = min(low, inflight[w].Load())
			}
			committed.Store(min(low, n))
			if time.Since(lastLog) > 10*time.Second {
				st := sv.s.Stats()
				t.Logf("%v: %d keys, index %d slots (load %.2f, %d growths)", time.Since(start).Round(time.Second), st.Keys, st.IndexSlots, st.IndexLoad, st.IndexGrowths)
				lastLog = time.Now()
			}
		}
	})
	type sample struct {
		took  time.Duration
		reads int
	}
	phases := map[string][]sample{}
	var readerWG sync.WaitGroup
	readerDone := make(chan struct{})
	c := newClient(t, sv)
	readerWG.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		key := make([]byte, 16)
		want := make([]byte, 16)
		region := &laggingRegion{s: sv.s}
		for upto := range acknowledged(readerDone, &committed) {
			idx, _ := region.get()
			i := rng.Int64N(upto)
			binary.BigEndian.PutUint64(key, uint64(i))
			binary.BigEndian.PutUint64(key[8:], uint64(i)*0x9e3779b97f4a7c15)
			binary.BigEndian.PutUint64(want, uint64(i))
			binary.BigEndian.PutUint64(want[8:], ^uint64(i))
			phase := "before"
			switch {
			case sv.s.index.Growing():
				phase = "during"
			case sv.s.stats.indexGrowths.Load() > 0:
				phase = "between/after"
			}
			t0 := time.Now()
			reads := 0
			for attempt := 0; ; attempt++ {
				v, res, torn, rs := c.readAt(idx, key)
				reads += 2
				if res == readRefresh || res == readNotFound {
					reads++ // the word
				}
				if rs != rdma.StatusSuccess {
					errc <- fmt.Errorf("key %d: READ: %v", i, rs)
					return
				}
				if torn || res == readRefresh {
					if attempt > 1000 {
						errc <- fmt.Errorf("key %d: no answer after 1000 attempts", i)
						return
					}
					region.refresh()
					idx, _ = region.get()
					continue
				}
				if res != readFound || !slices.Equal(v, want) {
					errc <- fmt.Errorf("key %d, acknowledged: %v, %x", i, res, v)
					return
				}
				break
			}
			phases[phase] = append(phases[phase], sample{time.Since(t0), reads})
		}
	})
	wg.Wait()
	close(stop)
	progress.Wait()
	committed.Store(n)
	time.Sleep(time.Second) // reads after the last growth
	close(readerDone)
	readerWG.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := sv.s.Stats()
	t.Logf("%d keys in %v: index of %d slots (load %.2f) after %d growths, %d displacements", st.Keys, time.Since(start).Round(time.Second), st.IndexSlots, st.IndexLoad, st.IndexGrowths, st.IndexMoves)
	if st.Keys != n || st.IndexGrowths < 5 {
		t.Fatalf("%d keys, %d growths: want %d keys and at least 5 growths (2^18 slots to 2^23 or more)", st.Keys, st.IndexGrowths, n)
	}
	for _, ph := range []string{"before", "during", "between/after"} {
		ss := phases[ph]
		if len(ss) == 0 {
			t.Fatalf("no GET %s a growth", ph)
		}
		slices.SortFunc(ss, func(a, b sample) int { return int(a.took - b.took) })
		reads := 0
		for _, s := range ss {
			reads += s.reads
		}
		t.Logf("GETs %s a growth: %d, p50 %v, p99 %v, %.2f READs per GET", ph, len(ss), ss[len(ss)/2].took, ss[len(ss)*99/100].took, float64(reads)/float64(len(ss)))
	}
}

// leaseBytes is the memory of lease id's region, for writers in this
// process (a client writes it with RDMA_WRITE).
func leaseBytes(s *Store, id uint64) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.leases[id].region
	return r.arena().mem.Bytes()[r.off : r.off+r.size]
}
