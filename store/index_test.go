package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// fakeArena hands out locations and remembers which key each holds.
type fakeArena struct {
	mu   sync.Mutex
	keys map[uint64][]byte
	next uint64
}

func newFakeArena() *fakeArena { return &fakeArena{keys: map[uint64][]byte{}} }

func (a *fakeArena) alloc(key []byte) proto.Location {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next += 64
	a.keys[a.next] = key
	return proto.Location{Arena: 1, Offset: a.next, Length: 64}
}

func (a *fakeArena) keyAt(loc proto.Location) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keys[loc.Offset]
	if !ok {
		return nil, fmt.Errorf("no record at %d", loc.Offset)
	}
	return k, nil
}

func newTestIndex(t testing.TB, slots uint64, grace time.Duration) (*Index, *fakeArena, []byte) {
	t.Helper()
	geo := proto.IndexGeometry{Slots: slots, Neighborhood: proto.DefaultNeighborhood, Seed: 99}
	mem, err := rdma.Alloc(geo.TableBytes())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	arena := newFakeArena()
	x, err := NewIndex(mem.Bytes(), geo, arena.keyAt, grace)
	if err != nil {
		t.Fatal(err)
	}
	return x, arena, mem.Bytes()
}

func key(i int) []byte { return fmt.Appendf(nil, "key-%08d", i) }

func TestIndexAgainstAMap(t *testing.T) {
	x, arena, _ := newTestIndex(t, 1<<12, 0)
	model := map[string]proto.Location{}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50000 {
		k := key(rng.IntN(3000))
		switch rng.IntN(3) {
		case 0, 1:
			loc := arena.alloc(k)
			old, replaced, err := x.Put(k, loc)
			if err != nil {
				t.Fatal(err)
			}
			if prev, ok := model[string(k)]; ok != replaced || (ok && prev != old) {
				t.Fatalf("Put(%s) replaced %v %+v, model had %v %+v", k, replaced, old, ok, prev)
			}
			model[string(k)] = loc
		case 2:
			old, ok, err := x.Delete(k)
			if err != nil {
				t.Fatal(err)
			}
			if prev, had := model[string(k)]; had != ok || prev != old {
				t.Fatalf("Delete(%s) = %+v %v, model had %+v %v", k, old, ok, prev, had)
			}
			delete(model, string(k))
		}
	}
	if x.Len() != len(model) {
		t.Fatalf("Len %d, model %d", x.Len(), len(model))
	}
	for k, want := range model {
		got, ok, err := x.Get([]byte(k))
		if err != nil || !ok || got != want {
			t.Fatalf("Get(%s) = %+v %v %v, want %+v", k, got, ok, err, want)
		}
	}
}

// Every key must be findable by a remote reader with one neighborhood READ,
// at every load factor the table reaches.
func TestIndexKeepsKeysInTheirNeighborhood(t *testing.T) {
	const slots = 1 << 14
	x, arena, table := newTestIndex(t, slots, 0)
	n := 0
	for ; ; n++ {
		if _, _, err := x.Put(key(n), arena.alloc(key(n))); err != nil {
			if !errors.Is(err, ErrIndexFull) {
				t.Fatal(err)
			}
			break
		}
	}
	t.Logf("table of %d slots full at load %.3f after %d moves", slots, float64(n)/slots, x.Moves())
	if lf := float64(n) / slots; lf < 0.9 {
		t.Errorf("index full at load factor %.3f, want at least 0.9", lf)
	}
	geo := x.Geometry()
	for i := range n {
		h := geo.Hash(key(i))
		off := geo.NeighborhoodOffset(geo.Home(h))
		locs, err := proto.FindInNeighborhood(table[off:off+geo.NeighborhoodBytes()], h, nil)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, l := range locs {
			k, _ := arena.keyAt(l)
			found = found || string(k) == string(key(i))
		}
		if !found {
			t.Fatalf("key %d not in its neighborhood", i)
		}
	}
}

// Readers scanning neighborhoods while the writer inserts (with moves) and
// deletes must always find the keys that stay in the table.
func TestIndexConcurrentReadersNeverMissStableKeys(t *testing.T) {
	const slots = 1 << 12
	x, arena, table := newTestIndex(t, slots, 200*time.Microsecond)
	const stable = 2000
	for i := range stable {
		if _, _, err := x.Put(key(i), arena.alloc(key(i))); err != nil {
			t.Fatal(err)
		}
	}
	x.Publish()
	geo := x.Geometry()
	stop := make(chan struct{})
	var misses, reads atomic.Int64
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			nb := make([]byte, geo.NeighborhoodBytes())
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := rng.IntN(stable)
				h := geo.Hash(key(i))
				off := geo.NeighborhoodOffset(geo.Home(h))
				for j := 0; j < len(nb); j += 8 { // as a NIC would: word by word
					binary.LittleEndian.PutUint64(nb[j:], atomic.LoadUint64((*uint64)(unsafePointer(table[off+j:]))))
				}
				locs, err := proto.FindInNeighborhood(nb, h, nil)
				reads.Add(1)
				if err != nil {
					continue // torn: a real reader retries
				}
				found := false
				for _, l := range locs {
					k, _ := arena.keyAt(l)
					found = found || string(k) == string(key(i))
				}
				if !found {
					misses.Add(1)
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for i := stable; time.Now().Before(deadline) && float64(x.Len())/slots < 0.93; i++ {
		if _, _, err := x.Put(key(i), arena.alloc(key(i))); err != nil && !errors.Is(err, ErrIndexFull) {
			t.Fatal(err)
		}
		if i%3 == 0 {
			if _, _, err := x.Delete(key(i - 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d neighborhood reads during %d moves, load %.2f", reads.Load(), x.Moves(), x.LoadFactor())
	if m := misses.Load(); m != 0 {
		t.Fatalf("%d reads missed a key that was in the table", m)
	}
	if x.Moves() == 0 {
		t.Fatalf("no displacement happened: the test did not exercise moves")
	}
}
