// Space seen from a client: arenas the store adds while serving are advertised and read one-sidedly.

package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/store"
)

// A server that starts with one arena and may grow to three takes more
// data than one holds: the arenas it adds reach the client through gossip,
// and every value reads back one-sidedly, across a restart too. Each arena
// registers in four units, each its own advertised region: the client
// finds every record's unit by its offset.
func TestGrownArenasServeReads(t *testing.T) {
	c := testcluster.Start(t, 1, testcluster.Options{Store: store.Options{ArenaSize: 2 << 20, ArenaCount: 1, MaxArenaCount: 3,
		IndexSlots: 1 << 12, LeaseSize: 128 << 10, SegmentSize: 256 << 10, RegistrationUnit: 512 << 10}})
	cl := c.Client(t, nil)
	ctx := context.Background()
	const n = 1200 // 1200 x 3 KiB: more than 1.5 arenas
	v := func(i int) []byte { return fmt.Appendf(make([]byte, 0, 3000), "%03000d", i) }
	for i := range n {
		if err := cl.Put(ctx, fmt.Appendf(nil, "grow-%d", i), v(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	srv := c.Running()[0]
	if got := len(srv.Store().Stats().Arenas); got < 2 {
		t.Fatalf("%d arenas after %d puts of 3 KB into 2 MiB arenas", got, n)
	}
	check := func(when string) {
		t.Helper()
		for i := range n {
			got, err := cl.Get(ctx, fmt.Appendf(nil, "grow-%d", i))
			if err != nil || string(got) != string(v(i)) {
				t.Fatalf("%s: get grow-%d: %d bytes, %v", when, i, len(got), err)
			}
		}
	}
	check("after growing")
	regions := srv.Meta().Arenas
	arenas := map[uint16]bool{}
	for _, r := range regions {
		arenas[r.ID] = true
		if r.Length != 512<<10 || r.Offset%(512<<10) != 0 {
			t.Fatalf("advertised region %+v: want a unit of 512 KiB", r)
		}
	}
	if len(regions) != 4*len(arenas) {
		t.Fatalf("%d regions advertised for %d arenas, want 4 units each", len(regions), len(arenas))
	}
	t.Logf("%d arenas (%d regions) after %d puts", len(arenas), len(regions), n)
	c.Stop("s1")
	c.Restart("s1")
	cl = c.Client(t, nil) // the old one gossiped with s1 alone, which left
	check("after a restart")
}

// A server whose index starts at 1024 slots doubles it five times under
// four writers, while two readers GET the newest keys through another
// client (whose location cache does not know them): every GET of an acknowledged key returns its value, none reports
// it absent, through each switch and the deregistration of the regions
// replaced (the client learns of each new region through gossip).
func TestGrownIndexServesReads(t *testing.T) {
	c := testcluster.Start(t, 1, testcluster.Options{Store: store.Options{ArenaSize: 8 << 20, ArenaCount: 2,
		IndexSlots: 1 << 10, MaxIndexSlots: 1 << 15, IndexRetireDelay: 500 * time.Millisecond, LeaseSize: 128 << 10, SegmentSize: 256 << 10}})
	cl, readers := c.Client(t, nil), c.Client(t, nil)
	ctx := context.Background()
	const writers, perWriter = 4, 4000
	key := func(w, i int) []byte { return fmt.Appendf(nil, "ix-%d-%d", w, i) }
	val := func(w, i int) []byte { return fmt.Appendf(nil, "v%d-%d", w, i) }
	var done [writers]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var gets atomic.Int64
	errs := make(chan error, writers+2)
	for r := range 2 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				w := (n + r) % writers
				upto := int(done[w].Load())
				if upto == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				i := upto - 1 - n%min(upto, 50)
				got, err := readers.Get(ctx, key(w, i))
				if err != nil || string(got) != string(val(w, i)) {
					errs <- fmt.Errorf("get %s while the index grows: %q, %v", key(w, i), got, err)
					return
				}
				gets.Add(1)
			}
		})
	}
	var pw sync.WaitGroup
	for w := range writers {
		pw.Go(func() {
			for i := range perWriter {
				if err := cl.Put(ctx, key(w, i), val(w, i)); err != nil {
					errs <- fmt.Errorf("put %s: %v", key(w, i), err)
					return
				}
				done[w].Store(int64(i + 1))
			}
		})
	}
	pw.Wait()
	time.Sleep(time.Second) // the readers go on past the last retirement
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := c.Running()[0].Store().Stats()
	t.Logf("%d keys: index of %d slots after %d growths; %d GETs meanwhile, retries %v", writers*perWriter, st.IndexSlots, st.IndexGrowths, gets.Load(), readers.Retries())
	if st.IndexGrowths != 5 || st.IndexSlots != 1<<15 {
		t.Fatalf("index of %d slots after %d growths, want %d after 5", st.IndexSlots, st.IndexGrowths, 1<<15)
	}
	if gets.Load() == 0 {
		t.Fatal("no GET ran while the index grew")
	}
	for w := range writers {
		for i := range perWriter {
			if got, err := cl.Get(ctx, key(w, i)); err != nil || string(got) != string(val(w, i)) {
				t.Fatalf("get %s after growing: %q, %v", key(w, i), got, err)
			}
		}
	}
}
