package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// A shard released, taken back, released and dropped, checked the way a
// one-sided reader sees it (index, record state words, shard word) and on
// the server (Get, counts), across restarts.
func TestShardActivateReleaseDrop(t *testing.T) { underEachSyncPolicy(t, testShardActivateReleaseDrop) }

func testShardActivateReleaseDrop(t *testing.T, sync SyncPolicy) {
	sv := newServer(t, syncOptions(sync))
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	w := c.newWriter()
	const moved, stays = proto.Shard(5), proto.Shard(900)
	locs := map[string]proto.Location{}
	put := func(keys [][]byte) {
		for _, k := range keys {
			cm, err := w.put(k, append([]byte("value of "), k...))
			if err != nil {
				t.Fatal(err)
			}
			locs[string(k)] = cm.Location
		}
	}
	mk, sk := keysIn(moved, "k", 20), keysIn(stays, "k", 20)
	put(mk)
	put(sk)
	// Overwrite one: its first record must stay dead through everything.
	superseded := locs[string(mk[0])]
	put(mk[:1])

	owned := func(stage string, keys [][]byte, since uint64) {
		t.Helper()
		if got := proto.ShardWordSince(c.shardWord(proto.ShardOf(keys[0]))); got != since {
			t.Fatalf("%s: word of %v is %d, want %d", stage, proto.ShardOf(keys[0]), got, since)
		}
		for _, k := range keys {
			if v, r := c.read(k, since); r != readFound || !bytes.Equal(v, append([]byte("value of "), k...)) {
				t.Fatalf("%s: one-sided read of %s: %q, %v", stage, k, v, r)
			}
			if st := c.recordState(locs[string(k)]); st != proto.RecordLive {
				t.Fatalf("%s: record of %s in state %d, want live", stage, k, st)
			}
			if _, err := sv.s.Get(k); err != nil {
				t.Fatalf("%s: Get(%s): %v", stage, k, err)
			}
		}
		if st := c.recordState(superseded); st != proto.RecordDead {
			t.Fatalf("%s: superseded record in state %d", stage, st)
		}
	}
	notOwned := func(stage string, keys [][]byte) {
		t.Helper()
		sh := proto.ShardOf(keys[0])
		if got := c.shardWord(sh); got != 0 {
			t.Fatalf("%s: word of %v is %d, want 0", stage, sh, got)
		}
		for _, k := range keys {
			// Whatever epoch the reader's map has, it must not
			// conclude "not found".
			if v, r := c.read(k, 1); r != readRefresh {
				t.Fatalf("%s: one-sided read of %s: %q, %v; want a refresh", stage, k, v, r)
			}
			if st := c.recordState(locs[string(k)]); st != proto.RecordDead {
				t.Fatalf("%s: record of %s in state %d, want dead", stage, k, st)
			}
			if _, err := sv.s.Get(k); !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s: Get(%s): %v, want ErrNotFound", stage, k, err)
			}
		}
		if _, err := w.put(keys[0], []byte("x")); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("%s: commit to %v: %v, want ErrNotOwner", stage, sh, err)
		}
		if err := sv.s.Delete(context.Background(), keys[0], proto.Write{}); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("%s: delete in %v: %v, want ErrNotOwner", stage, sh, err)
		}
		if _, err := sv.s.Scan([]proto.Shard{sh}, nil, nil, 0); !errors.Is(err, ErrNotOwner) {
			t.Fatalf("%s: scan of %v: %v, want ErrNotOwner", stage, sh, err)
		}
	}
	state := func(stage string, sh proto.Shard, want ShardState, keys int64) {
		t.Helper()
		st := sv.s.Shards()[sh]
		if st.State != want || st.Keys != keys {
			t.Fatalf("%s: %v is %+v, want %v with %d keys", stage, sh, st, want, keys)
		}
		checkAccounting(t, sv.s)
	}

	owned("start", mk, 1)
	owned("start", sk, 1)
	state("start", moved, ShardOwned, 20)

	if err := sv.s.ReleaseShards([]proto.Shard{moved}); err != nil {
		t.Fatal(err)
	}
	notOwned("released", mk)
	owned("released", sk, 1)
	state("released", moved, ShardReleased, 20) // the data stays
	if st := sv.s.Stats(); st.Keys != 20 {
		t.Fatalf("released: %d keys indexed, want 20", st.Keys)
	}
	if err := sv.s.ReleaseShards([]proto.Shard{moved}); err != nil {
		t.Fatalf("releasing a released shard: %v", err)
	}

	// Restart, with the released records' state words live in the arena
	// files as if the dead flips never reached the disk: the rebuild
	// marks them dead again.
	if err := sv.s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, k := range mk {
		loc := locs[string(k)]
		f, err := os.OpenFile(arenaPath(sv.opts.Dir, int(loc.Arena)), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(binary.LittleEndian.AppendUint32(nil, proto.RecordLive), int64(loc.Offset)+proto.RecordStateOffset); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	sv.open()
	waitArenas(t, sv.s, 2)
	w = c.newWriter()
	notOwned("released, restarted", mk)
	owned("released, restarted", sk, 1)
	state("released, restarted", moved, ShardReleased, 20)

	// An aborted migration: the shard comes back with its data.
	if err := sv.s.ActivateShards([]proto.Shard{moved}, 7); err != nil {
		t.Fatal(err)
	}
	owned("activated", mk, 7)
	state("activated", moved, ShardOwned, 20)
	if err := sv.s.ActivateShards([]proto.Shard{moved}, 8); err != nil {
		t.Fatal(err)
	}
	owned("activated again", mk, 8)
	if st := sv.s.ShardState(moved); st.State != ShardOwned || st.Since != 8 {
		t.Fatalf("ShardState = %+v", st)
	}
	sv.restart()
	waitArenas(t, sv.s, 2)
	w = c.newWriter()
	owned("activated, restarted", mk, 8)
	state("activated, restarted", moved, ShardOwned, 20)

	// Wrong states are refused and change nothing.
	if err := sv.s.DropShards([]proto.Shard{moved}); !errors.Is(err, ErrShardState) {
		t.Fatalf("drop of an owned shard: %v", err)
	}
	if err := sv.s.BeginIncoming([]proto.Shard{moved}, 1); !errors.Is(err, ErrShardState) {
		t.Fatalf("BeginIncoming of an owned shard: %v", err)
	}
	if err := sv.s.ActivateShards([]proto.Shard{moved}, 0); err == nil {
		t.Fatal("activation since epoch 0 accepted")
	}
	if err := sv.s.ReleaseShards([]proto.Shard{stays, proto.NumShards}); err == nil {
		t.Fatal("release of a shard out of range accepted")
	}
	owned("after refused operations", mk, 8)

	// Released, then dropped: gone for good, the bytes dead.
	deadBefore := totalDead(sv.s)
	if err := sv.s.ReleaseShards([]proto.Shard{moved}); err != nil {
		t.Fatal(err)
	}
	if err := sv.s.ReleaseShards([]proto.Shard{0, moved}); err != nil { // 0 owned, moved released: both fine
		t.Fatal(err)
	}
	if err := sv.s.DropShards([]proto.Shard{moved, 1023}); !errors.Is(err, ErrShardState) {
		t.Fatalf("drop of a released and an owned shard: %v, want ErrShardState", err)
	}
	if err := sv.s.DropShards([]proto.Shard{moved}); err != nil {
		t.Fatal(err)
	}
	state("dropped", moved, ShardNone, 0)
	if e, _, err := sv.s.ShardEntries(moved, nil, 0); err != nil || len(e) != 0 {
		t.Fatalf("dropped shard lists %d entries, %v", len(e), err)
	}
	var liveBytes int64
	for _, k := range mk {
		liveBytes += int64(locs[string(k)].Length)
	}
	if got := totalDead(sv.s) - deadBefore; got != liveBytes {
		t.Fatalf("drop counted %d bytes dead, the shard held %d", got, liveBytes)
	}
	if err := sv.s.DropShards([]proto.Shard{moved}); err != nil {
		t.Fatalf("dropping a dropped shard: %v", err)
	}
	sv.restart()
	waitArenas(t, sv.s, 2)
	state("dropped, restarted", moved, ShardNone, 0)
	if err := sv.s.ActivateShards([]proto.Shard{moved}, 9); err != nil {
		t.Fatal(err)
	}
	for _, k := range mk {
		if v, r := c.read(k, 9); r != readNotFound {
			t.Fatalf("dropped key %s, shard active again: %q, %v; want not found", k, v, r)
		}
	}
	owned("end", sk, 1)
}

func totalDead(s *Store) int64 {
	var n int64
	for _, a := range s.Stats().Arenas {
		n += a.Dead
	}
	return n
}

// A new store owns nothing: every write is refused until its shard is
// activated, and then only that shard's.
func TestCommitsRefusedOutsideOwnedShards(t *testing.T) {
	sv := newBareServer(t, smallOptions())
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	w := c.newWriter()
	const sh = proto.Shard(77)
	mine, other := keysIn(sh, "k", 1)[0], keysIn(sh+1, "k", 1)[0]
	refused := func(stage, state string) {
		t.Helper()
		_, err := w.put(mine, []byte("v"))
		wantErr(t, err, ErrNotOwner, "shard 77 is "+state)
		err = sv.s.Delete(context.Background(), mine, proto.Write{Session: 1, Seq: 1})
		wantErr(t, err, ErrNotOwner, "shard 77 is "+state)
	}
	refused("new", "none")
	if got, err := sv.s.Scan(nil, nil, nil, 0); err != nil || len(got) != 0 {
		t.Fatalf("scan of a store owning nothing: %v, %v", got, err)
	}
	if err := sv.s.BeginIncoming([]proto.Shard{sh, sh}, 1); err != nil {
		t.Fatal(err)
	}
	refused("incoming", "incoming")
	if err := sv.s.ActivateShards([]proto.Shard{sh}, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := w.put(mine, []byte("v")); err != nil {
		t.Fatalf("commit to an owned shard: %v", err)
	}
	if _, err := w.put(other, []byte("v")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("commit to a shard not owned: %v", err)
	}
	if err := sv.s.ReleaseShards([]proto.Shard{sh}); err != nil {
		t.Fatal(err)
	}
	refused("released", "released")
	if st := sv.s.Stats(); st.CommitsRejected != 4 || st.Commits != 1 {
		t.Fatalf("stats: %d rejected, %d committed; want 4 and 1", st.CommitsRejected, st.Commits)
	}
}

// FreezeShards returns only once the commits admitted before it are
// applied (here one held in the commit loop behind a slow sync and one
// queued behind it), refuses new ones at once, and leaves other shards
// alone.
func TestFreezeDrainsAdmittedCommits(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 2)
	const frozen, open = proto.Shard(10), proto.Shard(11)
	fk, ok := keysIn(frozen, "k", 3), keysIn(open, "k", 1)
	var hold atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // a failing test must not leave the commit loop held
	sv.s.testHookApply = func() {
		if hold.CompareAndSwap(true, false) {
			entered <- struct{}{}
			<-release
		}
	}
	type result struct {
		cm  Committed
		err error
	}
	commit := func(k []byte) chan result {
		w := newClient(t, sv).newWriter()
		off, n := w.write(k, []byte("before the freeze"))
		out := make(chan result, 1)
		go func() {
			cm, err := sv.s.Commit(context.Background(), w.lease.ID, off, n, proto.Write{})
			out <- result{cm, err}
		}()
		return out
	}
	busy := func(sh proto.Shard) int {
		sv.s.mu.Lock()
		defer sv.s.mu.Unlock()
		return sv.s.shards[sh].busy
	}
	hold.Store(true)
	first := commit(fk[0])
	<-entered // applying: past admission, before the sync
	second := commit(fk[1])
	for busy(frozen) != 2 { // admitted, queued behind the first
		time.Sleep(time.Millisecond)
	}
	froze := make(chan error, 1)
	go func() { froze <- sv.s.FreezeShards(context.Background(), []proto.Shard{frozen}) }()
	select {
	case err := <-froze:
		t.Fatalf("FreezeShards returned (%v) while 2 admitted commits were not applied", err)
	case <-time.After(100 * time.Millisecond):
	}
	// New writes to the frozen shard are refused at once, wherever they
	// come from; other shards are admitted (and queue).
	w := newClient(t, sv).newWriter()
	if _, err := w.put(fk[2], []byte("after")); !errors.Is(err, ErrShardMoving) {
		t.Fatalf("commit to a frozen shard: %v, want ErrShardMoving", err)
	}
	if err := sv.s.Delete(context.Background(), fk[0], proto.Write{}); !errors.Is(err, ErrShardMoving) {
		t.Fatalf("delete in a frozen shard: %v, want ErrShardMoving", err)
	}
	other := commit(ok[0])
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err := sv.s.FreezeShards(ctx, []proto.Shard{frozen})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("FreezeShards with a short deadline while draining: %v", err)
	}
	unblock()
	if err := <-froze; err != nil {
		t.Fatal(err)
	}
	if busy(frozen) != 0 {
		t.Fatalf("FreezeShards returned with %d commits to the shard not applied", busy(frozen))
	}
	for i, r := range []result{<-first, <-second, <-other} {
		if r.err != nil {
			t.Fatalf("commit %d admitted before the freeze: %v", i, r.err)
		}
	}
	for _, k := range [][]byte{fk[0], fk[1], ok[0]} {
		if v, err := sv.s.Get(k); err != nil || string(v) != "before the freeze" {
			t.Fatalf("Get(%s) = %q, %v", k, v, err)
		}
	}
	// Nothing in flight: it returns at once. Reads go on while frozen.
	if err := sv.s.FreezeShards(context.Background(), []proto.Shard{frozen}); err != nil {
		t.Fatal(err)
	}
	if !sv.s.Shards()[frozen].Frozen {
		t.Fatal("shard not reported frozen")
	}
	if v, ok := newClient(t, sv).mustGet(fk[0]); !ok || string(v) != "before the freeze" {
		t.Fatalf("one-sided read of a frozen shard: %q, %v", v, ok)
	}
	if err := sv.s.UnfreezeShards([]proto.Shard{frozen}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.put(fk[2], []byte("after")); err != nil {
		t.Fatalf("commit after UnfreezeShards: %v", err)
	}
	if err := sv.s.FreezeShards(context.Background(), []proto.Shard{frozen, 1000}); err != nil {
		t.Fatal(err)
	}
	// A frozen shard can be released; a shard not owned cannot be frozen.
	if err := sv.s.ReleaseShards([]proto.Shard{frozen}); err != nil {
		t.Fatal(err)
	}
	if err := sv.s.FreezeShards(context.Background(), []proto.Shard{frozen}); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("freeze of a released shard: %v, want ErrNotOwner", err)
	}
	if _, err := w.put(keysIn(1000, "k", 1)[0], []byte("v")); !errors.Is(err, ErrShardMoving) {
		t.Fatalf("commit to shard 1000, frozen: %v", err)
	}
	// A restart unfreezes (freezing is not persisted).
	sv.restart()
	waitArenas(t, sv.s, 2)
	if _, err := newClient(t, sv).newWriter().put(keysIn(1000, "k", 1)[0], []byte("v")); err != nil {
		t.Fatalf("commit to shard 1000 after a restart: %v", err)
	}
}

// Scan merges the shards' ranges into one key order, over the shards
// asked for (all owned by default), refusing shards not owned.
func TestScanAcrossShards(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 2)
	w := newClient(t, sv).newWriter()
	model := map[string]Committed{}
	for i := range 400 {
		k := fmt.Appendf(nil, "key-%05d", (i*7919)%1000)
		if i%3 == 0 {
			k = fmt.Appendf(nil, "other-%d", i)
		}
		cm, err := w.put(k, []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		model[string(k)] = cm
	}
	sorted := func(keep func(k string) bool) []string {
		var out []string
		for k := range model {
			if keep(k) {
				out = append(out, k)
			}
		}
		sort.Strings(out)
		return out
	}
	check := func(name string, got []ScanEntry, want []string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d entries, want %d", name, len(got), len(want))
		}
		for i, e := range got {
			cm := model[want[i]]
			if string(e.Key) != want[i] || e.Version != cm.Version || e.Location != cm.Location {
				t.Fatalf("%s: entry %d is %s v%d at %+v, want %s v%d at %+v", name, i, e.Key, e.Version, e.Location, want[i], cm.Version, cm.Location)
			}
		}
	}
	all := func(string) bool { return true }
	got, err := sv.s.Scan(nil, nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	check("everything", got, sorted(all))
	got, _ = sv.s.Scan(nil, []byte("key-00100"), []byte("key-00500"), 0)
	check("a range", got, sorted(func(k string) bool { return k >= "key-00100" && k < "key-00500" }))
	got, _ = sv.s.Scan(nil, []byte("key-"), proto.PrefixEnd([]byte("key-")), 17)
	check("a prefix, limited", got, sorted(func(k string) bool { return k >= "key-" && k < "key." })[:17])
	got, _ = sv.s.Scan(nil, []byte("z"), []byte("a"), 0)
	check("an empty range", got, nil)

	// Page through everything 7 at a time.
	var paged []ScanEntry
	for start := []byte(nil); ; {
		page, err := sv.s.Scan(nil, start, nil, 7)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, page...)
		if len(page) < 7 {
			break
		}
		start = append(slices.Clone(page[len(page)-1].Key), 0)
	}
	check("paged", paged, sorted(all))

	// Some shards only.
	some := map[proto.Shard]bool{}
	for k := range model {
		if sh := proto.ShardOf([]byte(k)); len(some) < 40 && sh%2 == 0 {
			some[sh] = true
		}
	}
	var list []proto.Shard
	for sh := range some {
		list = append(list, sh, sh) // duplicates are fine
	}
	inSome := func(k string) bool { return some[proto.ShardOf([]byte(k))] }
	got, err = sv.s.Scan(list, nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	check("40 shards", got, sorted(inSome))

	// A released shard is out of the default set and refused by name.
	gone := list[0]
	if err := sv.s.ReleaseShards([]proto.Shard{gone}); err != nil {
		t.Fatal(err)
	}
	got, _ = sv.s.Scan(nil, nil, nil, 0)
	check("without a released shard", got, sorted(func(k string) bool { return proto.ShardOf([]byte(k)) != gone }))
	if _, err := sv.s.Scan(list, nil, nil, 0); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("scan including a released shard: %v, want ErrNotOwner", err)
	}
	if _, err := sv.s.Scan([]proto.Shard{proto.NumShards}, nil, nil, 0); err == nil {
		t.Fatal("scan of a shard out of range accepted")
	}

	// ShardEntries pages through one shard in key order, in any state.
	want := sorted(func(k string) bool { return proto.ShardOf([]byte(k)) == gone })
	var entries []ScanEntry
	for after := []byte(nil); ; {
		page, more, err := sv.s.ShardEntries(gone, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, page...)
		if !more {
			break
		}
		after = page[len(page)-1].Key
	}
	check("ShardEntries of a released shard", entries, want)
}
