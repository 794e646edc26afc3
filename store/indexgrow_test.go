// Tests of the hash index growing while one-sided readers read it.

package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

func growOptions() Options {
	opts := cleanerOptions()
	opts.ArenaSize, opts.ArenaCount = 8<<20, 2
	opts.IndexSlots, opts.MaxIndexSlots = 1<<10, 1<<16
	opts.IndexRetireDelay = 300 * time.Millisecond
	return opts
}

// readAt is a one-sided GET through the index region idx, which the
// reader may hold from before a growth, as a client whose gossip view lags
// does: READ of the neighborhood, of the candidates' records, and on a
// miss of the shard's word (the miss counts only if the word says the
// shard is served since epoch 1). It returns the status of a READ that
// failed.
func (c *client) readAt(idx IndexInfo, key []byte) (value []byte, res readerResult, torn bool, st rdma.Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	geo := idx.Geometry
	h := geo.Hash(key)
	nb := geo.NeighborhoodBytes()
	if st := c.do(rdma.OpRead, 0, nb, idx.Addr+uint64(geo.NeighborhoodOffset(geo.Home(h))), idx.RKey); st != rdma.StatusSuccess {
		return nil, 0, false, st
	}
	locs, err := proto.FindInNeighborhood(c.mem.Bytes()[:nb], h, nil)
	if err != nil {
		return nil, 0, true, rdma.StatusSuccess
	}
	for _, loc := range locs {
		a, ok := unitOf(c.sv.s, loc)
		if !ok {
			return nil, 0, true, rdma.StatusSuccess
		}
		if st := c.do(rdma.OpRead, nb, int(loc.Length), a.Addr+loc.Offset-uint64(a.Offset), a.RKey); st != rdma.StatusSuccess {
			return nil, 0, false, st
		}
		r, err := proto.VerifyRecord(c.mem.Bytes()[nb:nb+int(loc.Length)], key, 0)
		if errors.Is(err, proto.ErrStaleRecord) {
			continue // another key's record (a fingerprint collision), or one replaced
		}
		if err != nil {
			return nil, 0, true, rdma.StatusSuccess
		}
		return append([]byte(nil), r.Value...), readFound, false, rdma.StatusSuccess
	}
	word := idx.Addr + uint64(geo.ShardWordOffset(proto.ShardOf(key)))
	if st := c.do(rdma.OpRead, 0, proto.ShardWordSize, word, idx.RKey); st != rdma.StatusSuccess {
		return nil, 0, false, st
	}
	if proto.ShardWordSince(proto.DecodeShardWord(c.mem.Bytes()[:proto.ShardWordSize])) == 1 {
		return nil, readNotFound, false, rdma.StatusSuccess
	}
	return nil, readRefresh, false, rdma.StatusSuccess
}

// laggingRegion is the index region as a reader whose gossip view lags
// knows it: fetched again only once it is 50 ms old.
type laggingRegion struct {
	s   *Store
	idx IndexInfo
	at  time.Time
}

// get returns the region the reader holds and when it learnt it.
func (l *laggingRegion) get() (IndexInfo, time.Time) {
	if time.Since(l.at) > 50*time.Millisecond {
		l.refresh()
	}
	return l.idx, l.at
}

// refresh learns the current region.
func (l *laggingRegion) refresh() {
	if idx, err := l.s.IndexRegion(context.Background()); err == nil {
		l.idx, l.at = idx, time.Now()
	}
}

// acknowledged yields, until stop is closed, how many keys are
// acknowledged (at least one: it waits for the first).
func acknowledged(stop <-chan struct{}, committed *atomic.Int64) func(yield func(int64) bool) {
	return func(yield func(int64) bool) {
		for {
			select {
			case <-stop:
				return
			default:
			}
			upto := committed.Load()
			if upto == 0 {
				time.Sleep(time.Millisecond)
				continue
			}
			if !yield(upto) {
				return
			}
		}
	}
}

func growValue(i int) []byte { return fmt.Appendf(nil, "value-%d", i) }
func growKey(i int) []byte   { return fmt.Appendf(nil, "key-%08d", i) }

// The index doubles six times under a writer adding keys, while readers
// holding the region they learnt up to 50 ms before (a lagging view) read
// keys already acknowledged: every read returns the right value, or asks
// to retry or refresh; none reports a committed key absent. After a
// restart the store opens the index at its grown size.
func TestIndexGrowsWhileReadersRead(t *testing.T) {
	opts := growOptions()
	sv := newServer(t, opts)
	const n = 30000
	var committed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, retries, refreshed atomic.Int64
	for r := range 2 {
		c := newClient(t, sv)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			region := &laggingRegion{s: sv.s}
			for upto := range acknowledged(stop, &committed) {
				idx, at := region.get()
				i := rng.IntN(int(upto))
				if rng.IntN(2) == 0 { // the newest keys: those a lagging region may lack
					i = int(upto) - 1 - rng.IntN(int(min(upto, 100)))
				}
				v, res, torn, st := c.readAt(idx, growKey(i))
				reads.Add(1)
				switch {
				case st != rdma.StatusSuccess:
					t.Errorf("READ through the index of %d slots learnt %v ago: %v", idx.Geometry.Slots, time.Since(at), st)
					return
				case torn:
					retries.Add(1)
				case res == readRefresh:
					refreshed.Add(1)
				case res == readNotFound:
					t.Errorf("key %d, acknowledged, read as absent through the index of %d slots", i, idx.Geometry.Slots)
					return
				case string(v) != string(growValue(i)):
					t.Errorf("key %d read %q", i, v)
					return
				}
			}
		})
	}
	w := &leaseWriter{c: newClient(t, sv), ask: 64 << 10}
	for i := range n {
		if _, err := w.put(growKey(i), growValue(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		committed.Store(int64(i + 1))
	}
	w.end()
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	st := sv.s.Stats()
	t.Logf("%d keys: %d slots after %d growths; readers: %d reads, %d torn, %d misses left to a refresh", n, st.IndexSlots, st.IndexGrowths, reads.Load(), retries.Load(), refreshed.Load())
	if st.IndexSlots != 1<<16 || st.IndexGrowths != 6 {
		t.Fatalf("index of %d slots after %d growths, want %d after 6", st.IndexSlots, st.IndexGrowths, 1<<16)
	}
	if reads.Load() == 0 {
		t.Fatal("the readers read nothing")
	}
	checkGrown(t, newClient(t, sv), n, "after growing")
	sv.restart()
	if got := sv.s.Stats().IndexSlots; got != 1<<16 {
		t.Fatalf("reopened with an index of %d slots, want the %d it grew to", got, 1<<16)
	}
	checkGrown(t, newClient(t, sv), n, "after a restart")
}

func checkGrown(t *testing.T, c *client, n int, when string) {
	t.Helper()
	for i := range n {
		v, ok := c.mustGet(growKey(i))
		if !ok || string(v) != string(growValue(i)) {
			t.Fatalf("%s: key %d: %q, %v", when, i, v, ok)
		}
	}
}

// After a growth the old region confirms no miss (its words are cleared),
// and once IndexRetireDelay has passed it is deregistered: a reader still
// using it gets an rkey error, never the freed memory.
func TestReplacedIndexRegionIsRetired(t *testing.T) {
	opts := growOptions()
	opts.MaxIndexSlots = 1 << 11
	sv := newServer(t, opts)
	c := newClient(t, sv)
	old, err := sv.s.IndexRegion(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if w := c.shardWord(0); proto.ShardWordSince(w) != 1 {
		t.Fatalf("shard 0's word %#x before growing, want since 1", w)
	}
	w := &leaseWriter{c: c, ask: 64 << 10}
	for i := range int(0.7 * float64(opts.IndexSlots)) { // past IndexGrowLoad
		if _, err := w.put(growKey(i), growValue(i)); err != nil {
			t.Fatal(err)
		}
	}
	w.end()
	var moved IndexInfo
	select {
	case moved = <-sv.s.IndexMoved():
	case <-time.After(10 * time.Second):
		t.Fatalf("no growth of an index of %d slots at load 0.7", opts.IndexSlots)
	}
	if moved.Geometry.Slots != 2*old.Geometry.Slots || moved.RKey == old.RKey {
		t.Fatalf("moved to %+v from %+v", moved, old)
	}
	if _, res, _, st := c.readAt(old, []byte("never-written")); st != rdma.StatusSuccess || res != readRefresh {
		t.Fatalf("a miss through the replaced region: %v, %v; want a refresh (its words cleared)", res, st)
	}
	if _, res, _, st := c.readAt(moved, []byte("never-written")); st != rdma.StatusSuccess || res != readNotFound {
		t.Fatalf("a miss through the new region: %v, %v; want not found", res, st)
	}
	time.Sleep(opts.IndexRetireDelay + 200*time.Millisecond)
	if _, _, _, st := c.readAt(old, []byte("never-written")); st == rdma.StatusSuccess {
		t.Fatal("a READ of the replaced region succeeded after IndexRetireDelay")
	}
}

// At MaxIndexSlots the index stops growing, and new keys are refused at
// MaxIndexLoad with a message naming the flag to raise; keys it holds are
// still updated.
func TestIndexAtItsMaximumRefusesNewKeys(t *testing.T) {
	opts := growOptions()
	opts.MaxIndexSlots = 1 << 11
	sv := newServer(t, opts)
	w := &leaseWriter{c: newClient(t, sv), ask: 64 << 10}
	var err error
	i := 0
	for ; err == nil; i++ {
		_, err = w.put(growKey(i), growValue(i))
	}
	if !errors.Is(err, ErrIndexFull) || !strings.Contains(err.Error(), "--max-index-slots") {
		t.Fatalf("put %d: %v, want ErrIndexFull naming --max-index-slots", i, err)
	}
	if limit := int(MaxIndexLoad * float64(opts.MaxIndexSlots)); i-1 < limit {
		t.Fatalf("refused after %d keys, below the limit of %d", i-1, limit)
	}
	if _, err := w.put(growKey(0), []byte("updated")); err != nil {
		t.Fatalf("updating a key of a full index: %v", err)
	}
	w.end()
}

const growChildEnv = "RKV_STORE_GROW_CHILD"

// growChild adds keys to a store whose index starts at 1024 slots, so that
// it grows again and again, printing "ack N" after each acknowledged put
// of key N, until killed.
func growChild() {
	t := &childT{}
	opts := growOptions()
	opts.Dir = os.Getenv(growChildEnv)
	opts.Sync = SyncAlways
	sv := newServer(t, opts)
	lw := &leaseWriter{c: newClient(t, sv), ask: 64 << 10}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	round, _ := strconv.Atoi(os.Getenv("RKV_CRASH_ROUND"))
	for n := round * 1_000_000; ; n++ {
		if _, err := lw.put(growKey(n), growValue(n)); err != nil {
			fmt.Fprintln(os.Stderr, "put:", err)
			os.Exit(3)
		}
		fmt.Fprintf(out, "ack %d\n", n)
		out.Flush()
	}
}

// kill -9 while the index grows loses no acknowledged key, and each
// restart opens the index large enough for every key it finds.
func TestIndexGrowthSurvivesKill9(t *testing.T) {
	dir := t.TempDir()
	var acked []int
	// At least 3 kills, and as many as it takes to write more keys than
	// the first index holds: on a loaded machine a child acknowledges only
	// a few hundred keys before its kill, too few for the index to grow.
	for round := 0; round < 3 || uint64(len(acked)) <= growOptions().IndexSlots; round++ {
		if round == 30 {
			t.Fatalf("%d keys acknowledged in 30 rounds, fewer than the %d slots the index starts with", len(acked), growOptions().IndexSlots)
		}
		n := len(acked)
		runKilledChild(t, round, []string{growChildEnv + "=" + dir}, func(f []string) {
			if len(f) == 2 && f[0] == "ack" {
				v, _ := strconv.Atoi(f[1])
				acked = append(acked, v)
			}
		})
		if len(acked) == n {
			t.Fatalf("round %d: nothing acknowledged before the kill", round)
		}
	}
	opts := growOptions()
	opts.Dir, opts.Sync = dir, SyncAlways
	sv := newServer(t, opts)
	st := sv.s.Stats()
	t.Logf("%d keys acknowledged over the kills; reopened with %d keys in %d slots (load %.2f)", len(acked), st.Keys, st.IndexSlots, st.IndexLoad)
	if st.IndexSlots <= opts.IndexSlots || st.IndexLoad > MaxIndexLoad {
		t.Fatalf("reopened at %d slots, load %.2f", st.IndexSlots, st.IndexLoad)
	}
	c := newClient(t, sv)
	for _, n := range acked {
		if v, ok := c.mustGet(growKey(n)); !ok || string(v) != string(growValue(n)) {
			t.Fatalf("key %d, acknowledged, after kill -9: %q, %v", n, v, ok)
		}
	}
}
