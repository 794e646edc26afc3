// Tests of servers in a cluster: the map grows and shrinks under load, a server that lost its data is refused.

package server_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// acked remembers, per key, the values written and the last one
// acknowledged, so that a read can be judged: it must return the last
// acknowledged value or one written after it, never anything older, and
// never "not found" for a key that was acknowledged.
type acked struct {
	mu      sync.Mutex
	version map[string]int // of the value written, per key: "key@version"
	done    map[string]int // the highest acknowledged
}

func newAcked() *acked { return &acked{version: map[string]int{}, done: map[string]int{}} }

func (a *acked) next(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.version[key]++
	return a.version[key]
}

func (a *acked) ack(key string, v int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done[key] = max(a.done[key], v)
}

// floor returns the acknowledged versions as of now.
func (a *acked) floor() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int, len(a.done))
	for k, v := range a.done {
		out[k] = v
	}
	return out
}

// explain says where key stands on every server, for a failure.
func explain(c *testcluster.Cluster, cl *client.Client, key string) string {
	sh := proto.ShardOf([]byte(key))
	var b strings.Builder
	owner, since := cl.Map().Owner(sh)
	fmt.Fprintf(&b, "  %s is in %v; the client's map (epoch %d) says %s since %d\n", key, sh, cl.Map().Epoch(), owner, since)
	for _, s := range c.Running() {
		v, err := s.Store().Get([]byte(key))
		o, os := s.Map().Owner(sh)
		fmt.Fprintf(&b, "  %s: map epoch %d says %s since %d; store: %+v; get: %q %v\n", s.Name(), s.Map().Epoch(), o, os, s.Store().ShardState(sh), v, err)
	}
	return b.String()
}

func value(key string, v int) []byte { return fmt.Appendf(nil, "%s@%d", key, v) }

// check judges a read of key made after floor was taken.
func check(key string, floor int, got []byte) error {
	if got == nil {
		return fmt.Errorf("%s: not found, acknowledged at version %d", key, floor)
	}
	var k string
	var v int
	if n, _ := fmt.Sscanf(strings.Replace(string(got), "@", " ", 1), "%s %d", &k, &v); n != 2 || k != key {
		return fmt.Errorf("%s: read %q, not a value of the key", key, got)
	}
	if v < floor {
		return fmt.Errorf("%s: read version %d, version %d was acknowledged before the read", key, v, floor)
	}
	return nil
}

// TestGrowAndShrinkUnderLoad adds a fourth and a fifth server and removes
// one while writers and a reader run: at no moment is an acknowledged key
// unreadable or older than acknowledged, and none is lost after.
func TestGrowAndShrinkUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("five servers and their migrations")
	}
	// Arenas with room for the run's writes and moves: space of
	// overwritten records is not reclaimed yet.
	c := testcluster.Start(t, 3, testcluster.Options{Store: store.Options{ArenaSize: 16 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 64 << 10}})
	cl := c.Client(t, nil)
	const nkeys = 300
	a := newAcked()
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
		v := a.next(keys[i])
		if err := cl.Put(context.Background(), []byte(keys[i]), value(keys[i], v)); err != nil {
			t.Fatal(err)
		}
		a.ack(keys[i], v)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var writes, reads, sweeps, slowest atomic.Int64
	errs := make(chan error, 16)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	const writers = 3
	for w := range writers {
		wg.Go(func() {
			// Each key has one writer, so its acknowledged versions are
			// in order: a read after an acknowledgement may not go back.
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for ctx.Err() == nil {
				k := keys[rng.IntN(nkeys/writers)*writers+w]
				v := a.next(k)
				if err := cl.Put(ctx, []byte(k), value(k, v)); err != nil {
					if ctx.Err() == nil {
						report(fmt.Errorf("put %s: %w", k, err))
					}
					return
				}
				a.ack(k, v)
				writes.Add(1)
			}
		})
	}
	wg.Go(func() { // sweeps of every key
		bkeys := make([][]byte, nkeys)
		for i, k := range keys {
			bkeys[i] = []byte(k)
		}
		for ctx.Err() == nil {
			floor := a.floor()
			// A budget for a loaded CI machine: the read of a shard in
			// the last moments of its move waits for the new owner.
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			t0 := time.Now()
			vals, err := cl.MultiGet(sctx, bkeys)
			scancel()
			if d := int64(time.Since(t0)); d > slowest.Load() {
				slowest.Store(d)
			}
			if err != nil {
				if ctx.Err() == nil {
					report(fmt.Errorf("sweep: %w", err))
				}
				return
			}
			for i, k := range keys {
				if err := check(k, floor[k], vals[i]); err != nil {
					report(fmt.Errorf("%w\n%s", err, explain(c, cl, k)))
					return
				}
			}
			reads.Add(nkeys)
			sweeps.Add(1)
		}
	})
	fail := func(format string, args ...any) {
		cancel()
		wg.Wait()
		t.Fatalf(format, args...)
	}
	step := func(what string, do func()) {
		t0 := time.Now()
		w0, s0 := writes.Load(), sweeps.Load()
		do()
		c.WaitSettled(60 * time.Second)
		select {
		case err := <-errs:
			fail("while %s: %v", what, err)
		default:
		}
		t.Logf("%s: settled in %v (map %v), %d writes and %d full sweeps meanwhile", what, time.Since(t0).Round(time.Millisecond),
			c.Map(), writes.Load()-w0, sweeps.Load()-s0)
	}
	step("adding s4", func() { c.Add("s4") })
	step("adding s5", func() { c.Add("s5") })
	step("draining s2", func() {
		if _, err := cl.Forget(ctx, "s2", false); err != nil {
			fail("forget s2: %v", err)
		}
		testcluster.WaitFor(t, 60*time.Second, "s2 out of the map", func() error {
			if c.Map().Member("s2") {
				return fmt.Errorf("s2 still in the map: %v", c.Map())
			}
			return nil
		})
	})
	c.Stop("s2")
	time.Sleep(500 * time.Millisecond)
	cancel()
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if srv, _ := c.Map().Server("s2"); srv.State != proto.ServerRemoved || c.Map().Counts()["s2"] != 0 {
		t.Fatalf("after the drain: %v", c.Map())
	}
	// Nothing lost: every key reads back at its last acknowledged version
	// or later, from a new client too.
	fresh := c.Client(t, nil)
	floor := a.floor()
	for _, k := range keys {
		v, err := fresh.Get(context.Background(), []byte(k))
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("get %s at the end: %v", k, err)
		}
		if err := check(k, floor[k], v); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d writes, %d reads in %d sweeps (the slowest %v), 0 anomalies", writes.Load(), reads.Load(), sweeps.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
}

// TestWipedDataDirIsRefused: a server restarted under its name with an
// empty data directory is not taken for the one the map knows: it says it
// is refused, its keys stay unavailable (never "not found"), and once the
// old one is forgotten the new one joins, empty.
func TestWipedDataDirIsRefused(t *testing.T) {
	c := testcluster.Start(t, 3, testcluster.Options{})
	cl := c.Client(t, nil)
	ctx := context.Background()
	var onS2 []byte
	for i := 0; onS2 == nil; i++ {
		k := fmt.Appendf(nil, "k%d", i)
		if err := cl.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if o, _ := cl.Owner(k); o == "s2" {
			onS2 = k
		}
	}
	epoch := c.Map().Epoch()
	c.Stop("s2")
	if err := os.RemoveAll(filepath.Join(c.Root, "s2")); err != nil {
		t.Fatal(err)
	}
	s2 := c.Restart("s2")
	select {
	case err := <-s2.Err():
		if !strings.Contains(err.Error(), "forget s2") {
			t.Fatalf("the refusal does not say what to do: %v", err)
		}
		t.Logf("the new s2 says: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("a server under a known name with another data directory was not refused")
	}
	if got := c.Map(); got.Epoch() != epoch {
		t.Fatalf("the map changed: epoch %d -> %d: %v", epoch, got.Epoch(), got)
	}
	if _, err := cl.Get(ctx, onS2); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("a key of the refused server: %v, want unavailable", err)
	}
	// The new s2 is alive under the name, but not with the map's data
	// directory: forget --force drops the old one.
	if _, err := cl.Forget(ctx, "s2", true); err != nil {
		t.Fatalf("forget --force of the lost s2: %v", err)
	}
	testcluster.WaitFor(t, 30*time.Second, "the new s2 in the map", func() error {
		m := c.Map()
		srv, ok := m.Server("s2")
		if !ok || srv.ID != s2.ID() {
			return fmt.Errorf("map %v", m)
		}
		return nil
	})
	c.WaitSettled(60 * time.Second)
	// Its shards started empty elsewhere (and may have moved to the new
	// s2 since): the forced removal lost the key, as it says.
	if _, err := cl.Get(ctx, onS2); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a key of the forgotten s2, after its shards started empty: %v, want not found", err)
	}
}
