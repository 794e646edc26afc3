// Tests of SyncNone's index log: what Pebble had not received comes back from the log after a crash.

package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// loggedOptions are a SyncNone store's whose log is never flushed by its
// timer: only a full log, a reader of Pebble or a clean Close flush it.
func loggedOptions() Options {
	opts := smallOptions()
	opts.Sync = SyncNone
	opts.IndexFlushInterval = time.Hour
	return opts
}

// newLogged opens a store of opts with its arenas registered, and a
// client and a writer of it.
func newLogged(t *testing.T, opts Options) (*server, *client, *writer) {
	t.Helper()
	sv := newServer(t, opts)
	waitArenas(t, sv.s, opts.ArenaCount)
	c := newClient(t, sv)
	return sv, c, c.newWriter()
}

// pebbleEntry reads key's entry from Pebble itself, not the log.
func pebbleEntry(t *testing.T, s *Store, key []byte) (entry, bool) {
	t.Helper()
	v, closer, err := s.db.Get(dataKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return entry{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	e, err := decodeEntry(v)
	if err != nil {
		t.Fatal(err)
	}
	return e, true
}

// TestIndexLogReplaysAfterACrash commits puts, overwrites and deletes in
// sessions under SyncNone, checks that Pebble got none of them, stops as
// a crash would, and expects the restarted store to have every value,
// none of the deleted keys, and every session's last write: a retry of it
// is answered, not applied again.
func TestIndexLogReplaysAfterACrash(t *testing.T) {
	opts := loggedOptions()
	sv, c, w := newLogged(t, opts)
	ctx := context.Background()
	const n = 40
	want := map[int][]byte{}
	seq := map[uint64]uint64{}
	write := func(session uint64) proto.Write {
		seq[session]++
		return proto.Write{Session: session, Seq: seq[session]}
	}
	for round := range 3 {
		for i := range n {
			v := fmt.Appendf(nil, "value %d of round %d", i, round)
			if _, err := w.putW(key(i), v, write(uint64(1+i%4))); err != nil {
				t.Fatal(err)
			}
			want[i] = v
		}
	}
	for i := 0; i < n; i += 5 {
		if err := sv.s.Delete(ctx, key(i), write(9)); err != nil {
			t.Fatal(err)
		}
		delete(want, i)
	}
	last, err := w.putW(key(1), []byte("the last"), write(1))
	if err != nil {
		t.Fatal(err)
	}
	want[1] = []byte("the last")
	if _, ok := pebbleEntry(t, sv.s, key(1)); ok {
		t.Fatalf("Pebble holds key 1 before any flush: the commits did not go through the log")
	}
	if st := sv.s.Stats(); st.IndexFlushes != 0 {
		t.Fatalf("%d flushes before the crash; want none", st.IndexFlushes)
	}
	if err := sv.s.close(false); err != nil {
		t.Fatal(err)
	}
	sv.open()
	for i := range n {
		v, err := sv.s.Get(key(i))
		switch {
		case want[i] == nil && !errors.Is(err, ErrNotFound):
			t.Errorf("deleted key %d after the replay: %q, %v", i, v, err)
		case want[i] != nil && (err != nil || !bytes.Equal(v, want[i])):
			t.Errorf("key %d after the replay: %q, %v; want %q", i, v, err, want[i])
		}
	}
	if e, ok := pebbleEntry(t, sv.s, key(1)); !ok || e.loc != last.Location {
		t.Errorf("Pebble's entry of key 1 after the replay: %+v, %v; want at %+v", e, ok, last.Location)
	}
	// The retry of session 1's last write is recognised: answered with
	// the write's own version, not applied a second time.
	again, err := c.newWriter().putW(key(1), []byte("the last, retried"), proto.Write{Session: 1, Seq: seq[1]})
	if err != nil || again.Version != last.Version {
		t.Fatalf("retry of the last write after the replay: %+v, %v; want version %d", again, err, last.Version)
	}
	if _, err := c.newWriter().putW(key(1), []byte("older"), proto.Write{Session: 1, Seq: seq[1] - 1}); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("an older write of session 1 after the replay: %v, want ErrSuperseded", err)
	}
	checkAccounting(t, sv.s)
	// A clean stop flushes: the next start replays nothing.
	sv.restart()
	if e, ok := pebbleEntry(t, sv.s, key(1)); !ok || e.loc != last.Location {
		t.Errorf("Pebble's entry of key 1 after a clean restart: %+v, %v", e, ok)
	}
}

// TestIndexLogWrapsAndFlushes writes many times a small log's size, so
// that it wraps and fills past half (which asks for a flush), then
// crashes: every value comes back.
func TestIndexLogWrapsAndFlushes(t *testing.T) {
	opts := loggedOptions()
	opts.IndexLogSize = 1 << 20
	opts.SegmentGrace = time.Hour // freeing segments would flush the log too
	sv, c, w := newLogged(t, opts)
	const keys = 300
	want := map[int]string{}
	for i := range 120 * keys { // about 100 bytes of log each: 3 times round
		if w.off+256 > w.lease.Size {
			w = c.newWriter()
		}
		k := i % keys
		v := fmt.Sprintf("v%d", i)
		if _, err := w.putW(key(k), []byte(v), proto.Write{Session: uint64(k%7 + 1), Seq: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	st := sv.s.Stats()
	if st.IndexFlushes == 0 {
		t.Fatalf("stats %+v: want flushes asked for by a log half full", st)
	}
	if st.IndexFlushedEntries >= st.Commits {
		t.Errorf("%d entries flushed for %d commits of %d keys: repeated keys were not written once", st.IndexFlushedEntries, st.Commits, keys)
	}
	if sv.s.ilog.next.total < 2*uint64(opts.IndexLogSize) {
		t.Fatalf("the log took %d bytes, not twice round its %d", sv.s.ilog.next.total, opts.IndexLogSize)
	}
	if err := sv.s.close(false); err != nil {
		t.Fatal(err)
	}
	sv.open()
	for k, v := range want {
		if got, err := sv.s.Get(key(k)); err != nil || string(got) != v {
			t.Fatalf("key %d after the replay: %q, %v; want %q", k, got, err, v)
		}
	}
}

// TestIndexLogVoidSkipsAnEntry: an entry voided (its commit's
// publication failed) is not replayed; the others are.
func TestIndexLogVoidSkipsAnEntry(t *testing.T) {
	opts := loggedOptions()
	sv, _, w := newLogged(t, opts)
	kept, err := w.put(key(1), []byte("kept"))
	if err != nil {
		t.Fatal(err)
	}
	// A second entry, of a record written and never published, voided.
	off, n := w.write(key(2), []byte("voided"))
	sv.s.mu.Lock()
	loc := proto.Location{Arena: w.lease.Arena, Offset: uint64(sv.s.leases[w.lease.ID].region.off + off), Length: uint32(n)}
	sv.s.mu.Unlock()
	sv.s.writer.Lock()
	seq := sv.s.ilog.append(&logEntry{kind: logPut, shard: proto.ShardOf(key(2)), key: key(2), loc: loc, version: w.version - 1})
	sv.s.ilog.append(&logEntry{kind: logVoid, version: seq})
	sv.s.writer.Unlock()
	if err := sv.s.close(false); err != nil {
		t.Fatal(err)
	}
	sv.open()
	if v, err := sv.s.Get(key(1)); err != nil || string(v) != "kept" {
		t.Errorf("key 1 after the replay: %q, %v", v, err)
	}
	if v, err := sv.s.Get(key(2)); !errors.Is(err, ErrNotFound) {
		t.Errorf("the voided key after the replay: %q, %v; want ErrNotFound", v, err)
	}
	if e, ok := pebbleEntry(t, sv.s, key(1)); !ok || e.loc != kept.Location {
		t.Errorf("Pebble's entry of key 1: %+v, %v", e, ok)
	}
}

// TestIndexLogScanSeesEveryCommit: a scan reads Pebble, which flushes the
// log first.
func TestIndexLogScanSeesEveryCommit(t *testing.T) {
	opts := loggedOptions()
	sv, _, w := newLogged(t, opts)
	sh := proto.Shard(7)
	keys := keysIn(sh, "scan", 20)
	for _, k := range keys {
		if _, err := w.put(k, k); err != nil {
			t.Fatal(err)
		}
	}
	got, err := sv.s.Scan([]proto.Shard{sh}, nil, nil, 0)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("scan of %v: %d entries, %v; want %d", sh, len(got), err, len(keys))
	}
}

// TestIndexLogReplaysUnderAnotherPolicyOrSize: a log left by a crash is
// replayed by a start at another IndexLogSize, and by one under another
// policy, which then removes it.
func TestIndexLogReplaysUnderAnotherPolicyOrSize(t *testing.T) {
	opts := loggedOptions()
	sv, c, w := newLogged(t, opts)
	crashAfter := func(tag string) {
		t.Helper()
		for i := range 10 {
			if _, err := w.put(key(i), []byte(tag)); err != nil {
				t.Fatal(err)
			}
		}
		if err := sv.s.close(false); err != nil {
			t.Fatal(err)
		}
	}
	check := func(tag string) {
		t.Helper()
		for i := range 10 {
			if v, err := sv.s.Get(key(i)); err != nil || string(v) != tag {
				t.Fatalf("key %d: %q, %v; want %q", i, v, err, tag)
			}
		}
	}
	crashAfter("first")
	sv.opts.IndexLogSize = 2 << 20
	sv.open()
	check("first")
	if st, err := os.Stat(filepath.Join(sv.opts.Dir, indexLogName)); err != nil || st.Size() != 2<<20 {
		t.Fatalf("the log after a start at 2 MiB: %v, %v", st, err)
	}
	c = newClient(t, sv)
	w = c.newWriter()
	crashAfter("second")
	sv.opts.Sync = SyncAlways
	sv.open()
	check("second")
	if _, err := os.Stat(filepath.Join(sv.opts.Dir, indexLogName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the log after a start under SyncAlways: %v; want it removed", err)
	}
}
