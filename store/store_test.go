package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// smallOptions registers each arena in two units (of two segments), so
// that every test reads and writes across units as a large store does.
func smallOptions() Options {
	return Options{ArenaSize: 4 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 256 << 10, LeaseTTL: time.Minute,
		RegistrationUnit: 2 << 20, Logger: slog.New(slog.DiscardHandler)}
}

// syncOptions are smallOptions under sync.
func syncOptions(sync SyncPolicy) Options {
	o := smallOptions()
	o.Sync = sync
	return o
}

// underEachSyncPolicy runs test under SyncAlways (the journal) and
// SyncNone (the index log), which keep a commit's entries apart.
func underEachSyncPolicy(t *testing.T, test func(*testing.T, SyncPolicy)) {
	for _, sync := range []SyncPolicy{SyncAlways, SyncNone} {
		t.Run(sync.String(), func(t *testing.T) { test(t, sync) })
	}
}

// waitArenas waits until n arenas are registered whole.
func waitArenas(t testing.TB, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		registered := 0
		for _, a := range s.Stats().Arenas {
			if a.Registered {
				registered++
			}
		}
		if registered >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d arenas registered after 30s", registered, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPutGetDeleteAcrossRestart(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	w := c.newWriter()
	for i := range 100 {
		if _, err := w.put(key(i), fmt.Appendf(nil, "value %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.put(key(7), []byte("seven, again")); err != nil {
		t.Fatal(err)
	}
	if err := sv.s.Delete(context.Background(), key(8), proto.Write{}); err != nil {
		t.Fatal(err)
	}
	w.write(key(200), []byte("written, never committed"))
	check := func(stage string) {
		t.Helper()
		for i := range 100 {
			want := fmt.Appendf(nil, "value %d", i)
			if i == 7 {
				want = []byte("seven, again")
			}
			v, ok := c.mustGet(key(i))
			switch {
			case i == 8 && ok:
				t.Fatalf("%s: deleted key %d reads %q", stage, i, v)
			case i != 8 && (!ok || !bytes.Equal(v, want)):
				t.Fatalf("%s: key %d reads %q (found %v), want %q", stage, i, v, ok, want)
			}
			if sv, err := sv.s.Get(key(i)); i != 8 && (err != nil || !bytes.Equal(sv, want)) {
				t.Fatalf("%s: server-side Get(%d) = %q, %v", stage, i, sv, err)
			}
		}
		if v, ok := c.mustGet(key(200)); ok {
			t.Fatalf("%s: uncommitted record visible: %q", stage, v)
		}
		if st := sv.s.Stats(); st.Keys != 99 {
			t.Fatalf("%s: %d keys, want 99", stage, st.Keys)
		}
	}
	check("before restart")
	genBefore := sv.s.Arenas()[0].Generation
	sv.restart()
	waitArenas(t, sv.s, 2)
	if g := sv.s.Arenas()[0].Generation; g != genBefore+1 {
		t.Errorf("generation %d after restart, want %d", g, genBefore+1)
	}
	check("after restart")
	entries, err := sv.s.Scan(nil, key(10), key(20), 0)
	if err != nil || len(entries) != 10 || !bytes.Equal(entries[0].Key, key(10)) {
		t.Fatalf("Scan = %d entries, %v", len(entries), err)
	}
	if entries, _ := sv.s.Scan(nil, []byte("key-"), proto.PrefixEnd([]byte("key-")), 5); len(entries) != 5 {
		t.Fatalf("prefix scan with limit 5 returned %d", len(entries))
	}
}

func TestCommitRejectsBadRecords(t *testing.T) {
	opts := smallOptions()
	opts.MaxKeyLen = 16
	sv := newServer(t, opts)
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	w := c.newWriter()
	commit := func(off, n int64) error {
		_, err := sv.s.Commit(context.Background(), w.lease.ID, off, n, proto.Write{})
		return err
	}
	off, n := w.write([]byte("k"), []byte("v"))
	// Corrupt one byte of the value in place, through the lease.
	c.mem.Bytes()[0] = 'X'
	if st := c.do(rdma.OpWrite, 0, 1, w.lease.Addr+uint64(off)+proto.RecordHeaderSize+1, w.lease.RKey); st != rdma.StatusSuccess {
		t.Fatal(st)
	}
	if err := commit(off, n); !errors.Is(err, ErrRecord) {
		t.Errorf("corrupt record: %v, want ErrRecord", err)
	}
	off, n = w.write([]byte("a key longer than sixteen"), []byte("v"))
	if err := commit(off, n); !errors.Is(err, ErrRecord) {
		t.Errorf("oversized key: %v, want ErrRecord", err)
	}
	off, n = w.write([]byte("k"), []byte("v"))
	if err := commit(off, n+8); !errors.Is(err, ErrRecord) {
		t.Errorf("wrong length: %v, want ErrRecord", err)
	}
	if err := commit(w.lease.Size-8, 64); !errors.Is(err, ErrLease) {
		t.Errorf("outside the lease: %v, want ErrLease", err)
	}
	if _, err := sv.s.Commit(context.Background(), 999, 0, 64, proto.Write{}); !errors.Is(err, ErrLease) {
		t.Errorf("unknown lease: %v, want ErrLease", err)
	}
	if err := commit(off, n); err != nil {
		t.Fatalf("a good record after the bad ones: %v", err)
	}
	if err := commit(off, n); !errors.Is(err, ErrLease) {
		t.Errorf("the same record twice: %v, want ErrLease", err)
	}
	// A record with a version from before the lease's range.
	w.version = w.lease.VersionBase
	off, n = w.write([]byte("k2"), []byte("v"))
	if err := commit(off, n); !errors.Is(err, ErrRecord) {
		t.Errorf("reused version: %v, want ErrRecord", err)
	}
	if st := sv.s.Stats(); st.CommitsRejected != 7 || st.Commits != 1 {
		t.Errorf("stats %+v: want 7 rejected, 1 committed", st)
	}
}

func TestEndedLeaseRevokesItsRKey(t *testing.T) {
	opts := smallOptions()
	opts.LeaseTTL = 300 * time.Millisecond
	sv := newServer(t, opts)
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	w := c.newWriter()
	if _, err := w.put([]byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := sv.s.EndLease(w.lease.ID); err != nil {
		t.Fatal(err)
	}
	if st := c.do(rdma.OpWrite, 0, 8, w.lease.Addr, w.lease.RKey); st != rdma.StatusRemAccessErr {
		t.Fatalf("WRITE with an ended lease's rkey: %v, want REM_ACCESS_ERR", st)
	}

	c2 := newClient(t, sv)
	w2 := c2.newWriter()
	deadline := time.Now().Add(10 * time.Second)
	for sv.s.Stats().LeasesExpired == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := sv.s.Commit(context.Background(), w2.lease.ID, 0, 64, proto.Write{}); !errors.Is(err, ErrLease) {
		t.Errorf("commit on an expired lease: %v, want ErrLease", err)
	}
	if st := c2.do(rdma.OpWrite, 0, 8, w2.lease.Addr, w2.lease.RKey); st != rdma.StatusRemAccessErr {
		t.Fatalf("WRITE with an expired lease's rkey: %v, want REM_ACCESS_ERR", st)
	}
	// The arena's read rkey never allowed writing in the first place.
	a := sv.s.Arenas()[0]
	c3 := newClient(t, sv)
	if st := c3.do(rdma.OpWrite, 0, 8, a.Addr, a.RKey); st != rdma.StatusRemAccessErr {
		t.Fatalf("WRITE with an arena's read rkey: %v, want REM_ACCESS_ERR", st)
	}
}

func TestFullStoreRefusesLeases(t *testing.T) {
	opts := smallOptions()
	opts.ArenaSize, opts.ArenaCount, opts.LeaseSize = 256<<10, 1, 128<<10
	sv := newServer(t, opts)
	waitArenas(t, sv.s, 1)
	for i := 0; ; i++ {
		_, err := sv.s.GrantLease(context.Background(), 0, 0)
		if errors.Is(err, ErrFull) {
			if i != 2 {
				t.Fatalf("full after %d leases, want 2", i)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestArenasAnnouncedAsTheyRegister(t *testing.T) {
	opts := smallOptions()
	opts.ArenaSize, opts.ArenaCount, opts.RegistrationUnit = 8<<20, 3, 3<<20 // units of 3, 3 and 2 MiB
	sv := newServer(t, opts)
	type unit struct {
		arena  uint16
		offset int64
	}
	seen := map[unit]ArenaInfo{}
	for i := range 9 {
		select {
		case a := <-sv.s.Ready():
			// The first arena's first unit registers alone, ahead of
			// the others.
			if i == 0 && (a.ID != 0 || a.Offset != 0) {
				t.Fatalf("arena %d's unit at %d announced first, want arena 0's first", a.ID, a.Offset)
			}
			u := unit{a.ID, a.Offset}
			if _, dup := seen[u]; dup || a.RKey == 0 && a.Addr == 0 {
				t.Fatalf("unit %+v announced twice or empty", a)
			}
			if want := min(3<<20, opts.ArenaSize-a.Offset); a.Offset%(3<<20) != 0 || a.Length != want {
				t.Fatalf("unit %+v: want one of %d bytes at a multiple of 3 MiB", a, want)
			}
			seen[u] = a
		case <-time.After(30 * time.Second):
			t.Fatal("timed out")
		}
	}
	// Each unit is its own registration of the arena's own bytes.
	for u, a := range seen {
		if base := seen[unit{u.arena, 0}]; a.Addr != base.Addr+uint64(a.Offset) {
			t.Errorf("unit %+v is not at its arena's address %#x plus its offset", a, base.Addr)
		}
		if u.offset != 0 && a.RKey == seen[unit{u.arena, 0}].RKey {
			t.Errorf("unit %+v shares its rkey with the arena's first", a)
		}
	}
	got := sv.s.Arenas()
	if len(got) != 9 || !slices.IsSortedFunc(got, func(a, b ArenaInfo) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Offset, b.Offset))
	}) {
		t.Fatalf("Arenas: %+v, want 9 units in arena and offset order", got)
	}
	for _, a := range sv.s.Stats().Arenas {
		if !a.Registered || a.RegisteredBytes != opts.ArenaSize || a.Registration <= 0 {
			t.Errorf("arena stats %+v: want registered whole", a)
		}
	}
}

// TestPendingCommitCopiesItsKey: a pending commit's key is its own, short
// or long: the record it came from lies in a lease its client can still
// write to.
func TestPendingCommitCopiesItsKey(t *testing.T) {
	for _, n := range []int{1, shortKey, shortKey + 1, 200} {
		key := bytes.Repeat([]byte{'k'}, n)
		c := newPending(key, proto.Write{}, false)
		key[0] = 'X'
		if len(c.key) != n || c.key[0] != 'k' || c.shard != proto.ShardOf(bytes.Repeat([]byte{'k'}, n)) {
			t.Errorf("a key of %d bytes, changed after: the pending commit holds %q", n, c.key)
		}
	}
}
