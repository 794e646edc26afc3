// Tests of the index log: what Pebble had not received, and under the durable policies the records, come back from it after a crash.

package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/internal/pebblelog"
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
// crashes: every value comes back. Under SyncBatch the entries carry
// their records and are written a batch at a time, not stored through
// the mapping (SyncAlways writes the same way, with a sync per batch).
func TestIndexLogWrapsAndFlushes(t *testing.T) {
	for _, sync := range []SyncPolicy{SyncNone, SyncBatch} {
		t.Run(sync.String(), func(t *testing.T) {
			opts := loggedOptions()
			opts.Sync, opts.IndexLogSize = sync, 1<<20
			opts.SegmentGrace = time.Hour // freeing segments would flush the log too
			sv, c, w := newLogged(t, opts)
			const keys = 300
			want := map[int]string{}
			for i := range 120 * keys { // about 100 bytes of log each (200 with records): 3 (6) times round
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
			if sv.s.logReplayed == 0 {
				t.Error("the start replayed nothing")
			}
			for k, v := range want {
				if got, err := sv.s.Get(key(k)); err != nil || string(got) != v {
					t.Fatalf("key %d after the replay: %q, %v; want %q", k, got, err, v)
				}
			}
		})
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
	seq, err := sv.s.ilog.append(&logEntry{kind: logPut, shard: proto.ShardOf(key(2)), key: key(2), loc: loc, version: w.version - 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sv.s.ilog.append(&logEntry{kind: logVoid, version: seq}); err != nil {
		t.Fatal(err)
	}
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
// log first. Under SyncAlways that flush leaves the log's position (no
// checkpoint), and a crash after it replays the entries again over what
// it wrote, deletes and overwrites made since included.
func TestIndexLogScanSeesEveryCommit(t *testing.T) {
	underEachSyncPolicy(t, func(t *testing.T, sync SyncPolicy) {
		opts := loggedOptions()
		opts.Sync, opts.CheckpointInterval = sync, time.Hour
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
		if sync == SyncNone {
			return
		}
		if st := sv.s.Stats(); st.Checkpoints != 0 {
			t.Fatalf("a scan checkpointed (%d)", st.Checkpoints)
		}
		if err := sv.s.Delete(context.Background(), keys[0], proto.Write{}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.put(keys[1], []byte("again")); err != nil {
			t.Fatal(err)
		}
		if err := sv.s.close(false); err != nil {
			t.Fatal(err)
		}
		sv.open()
		if sv.s.logReplayed != len(keys)+2 {
			t.Errorf("the start replayed %d entries, want %d", sv.s.logReplayed, len(keys)+2)
		}
		if _, err := sv.s.Get(keys[0]); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleted %q after the crash: %v", keys[0], err)
		}
		mustValue(t, sv.s, keys[1], "again")
		mustValue(t, sv.s, keys[2], string(keys[2]))
	})
}

// TestIndexLogReplaysUnderAnotherPolicyOrSize: a log left by a crash is
// replayed by a start at another IndexLogSize, and by one under another
// policy, either way round.
func TestIndexLogReplaysUnderAnotherPolicyOrSize(t *testing.T) {
	opts := loggedOptions()
	sv, _, _ := newLogged(t, opts)
	// crashAndRestart writes tag to ten keys, crashes, changes the
	// options and starts again: the keys read tag.
	crashAndRestart := func(tag string, change func(*Options)) {
		t.Helper()
		w := newClient(t, sv).newWriter()
		for i := range 10 {
			if _, err := w.put(key(i), []byte(tag)); err != nil {
				t.Fatal(err)
			}
		}
		if err := sv.s.close(false); err != nil {
			t.Fatal(err)
		}
		change(&sv.opts)
		sv.open()
		for i := range 10 {
			if v, err := sv.s.Get(key(i)); err != nil || string(v) != tag {
				t.Fatalf("key %d: %q, %v; want %q", i, v, err, tag)
			}
		}
	}
	crashAndRestart("first", func(o *Options) { o.IndexLogSize = 2 << 20 })
	<-sv.s.ilog.filling // made anew, at that size
	if st, err := os.Stat(filepath.Join(sv.opts.Dir, indexLogName)); err != nil || st.Size() != 2<<20 {
		t.Fatalf("the log after a start at 2 MiB: %v, %v", st, err)
	}
	crashAndRestart("second", func(o *Options) { o.Sync = SyncAlways })
	// Under SyncAlways the log carries the records too, and a store
	// started under SyncNone after a crash replays them.
	crashAndRestart("third", func(o *Options) { o.Sync = SyncNone })
	if sv.s.logReplayed != 10 {
		t.Errorf("the start under SyncNone replayed %d entries, want the 10 of SyncAlways", sv.s.logReplayed)
	}
}

// TestIndexLogPositionSaysWhetherRecordsAreLogged: while a durable store
// runs, and after it crashes, the log's position has the format an older
// rkv refuses (it would stop its replay at the first record); a clean
// Close leaves the format it reads. An IndexLogSize that cannot hold four
// leases is refused under the durable policies.
func TestIndexLogPositionSaysWhetherRecordsAreLogged(t *testing.T) {
	format := func(dir string) byte {
		t.Helper()
		db, err := pebble.Open(filepath.Join(dir, "index"), &pebble.Options{Logger: pebblelog.Logger{Log: slog.New(slog.DiscardHandler)}})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		v, closer, err := db.Get(metaIndexLogKey)
		if err != nil {
			t.Fatal(err)
		}
		defer closer.Close()
		return v[0]
	}
	opts := smallOptions()
	sv, _, w := newLogged(t, opts)
	if _, err := w.put(key(1), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := sv.s.close(false); err != nil {
		t.Fatal(err)
	}
	if got := format(sv.opts.Dir); got != logFormatRecords {
		t.Errorf("after a crash under SyncAlways the position has format %d, want %d", got, logFormatRecords)
	}
	sv.open()
	if err := sv.s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := format(sv.opts.Dir); got != logFormatEntries {
		t.Errorf("after a clean Close the position has format %d, want %d", got, logFormatEntries)
	}
	sv.open()

	opts = Options{Dir: t.TempDir(), LeaseSize: 1 << 20, IndexLogSize: 2 << 20}
	if _, err := opts.withDefaults(); err == nil || !strings.Contains(err.Error(), "must hold 4 leases") {
		t.Errorf("IndexLogSize of 2 leases under SyncAlways: %v", err)
	}
	opts.Sync = SyncNone
	if _, err := opts.withDefaults(); err != nil {
		t.Errorf("IndexLogSize of 2 leases under SyncNone: %v", err)
	}
}

// TestIndexLogDefaultsScaleWithTheArenas: under the durable policies the
// default log, which the records pass through, grows with the arenas up
// to maxDefaultLogSize, so that checkpoints come every half log or
// CheckpointInterval; under SyncNone it holds entries alone and stays
// small. Options set stay as they are.
func TestIndexLogDefaultsScaleWithTheArenas(t *testing.T) {
	for _, tc := range []struct {
		sync                  SyncPolicy
		arenaSize             int64
		arenas                int
		logSize, checkpointAt int64
	}{
		{SyncAlways, 64 << 20, 4, 32 << 20, 16 << 20}, // the defaults
		{SyncAlways, 1 << 30, 2, 128 << 20, 64 << 20},
		{SyncBatch, 1 << 30, 8, 256 << 20, 128 << 20},
		{SyncAlways, 1 << 30, 64, 256 << 20, 128 << 20},
		{SyncNone, 1 << 30, 8, 32 << 20, 16 << 20},
	} {
		o, err := Options{Dir: t.TempDir(), Sync: tc.sync, ArenaSize: tc.arenaSize, ArenaCount: tc.arenas}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if o.IndexLogSize != tc.logSize || o.CheckpointBytes != tc.checkpointAt || o.CheckpointInterval != 10*time.Second {
			t.Errorf("%v, %d arenas of %d: log %d, checkpoints every %d bytes or %v; want %d, %d, 10s",
				tc.sync, tc.arenas, tc.arenaSize, o.IndexLogSize, o.CheckpointBytes, o.CheckpointInterval, tc.logSize, tc.checkpointAt)
		}
	}
	o, err := Options{Dir: t.TempDir(), ArenaSize: 1 << 30, LeaseSize: 128 << 20, IndexLogSize: 1 << 30, CheckpointBytes: 1 << 20}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.IndexLogSize != 1<<30 || o.CheckpointBytes != 1<<20 {
		t.Errorf("set options changed: log %d, checkpoints every %d bytes", o.IndexLogSize, o.CheckpointBytes)
	}
	if o, _ := (Options{Dir: t.TempDir(), ArenaSize: 1 << 30, LeaseSize: 128 << 20}).withDefaults(); o.IndexLogSize != 512<<20 {
		t.Errorf("leases of 128 MiB: default log %d, want 4 leases", o.IndexLogSize)
	}
}

// TestNewIndexLogFillsInTheBackground: a new store serves reads before
// its log is filled with zeros, its first commit waits for the fill, and
// the filled log is renamed into place; a store closed before then
// leaves the new file, which the next start makes again.
func TestNewIndexLogFillsInTheBackground(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	testHookLogFill = func() {
		entered <- struct{}{}
		<-release
	}
	defer func() { testHookLogFill = nil }()
	sv := newServer(t, syncOptions(SyncAlways))
	<-entered
	path := filepath.Join(sv.opts.Dir, indexLogName)
	exists := func(p string) bool {
		_, err := os.Stat(p)
		return err == nil
	}
	if exists(path) || !exists(path+newSuffix) {
		t.Fatalf("while the log fills: %s there %v, %s there %v", path, exists(path), path+newSuffix, exists(path+newSuffix))
	}
	c := newClient(t, sv)
	if _, found, _ := c.get([]byte("absent")); found {
		t.Fatal("found a key never written")
	}
	w := c.newWriter()
	off, n := w.write([]byte("k"), []byte("v"))
	done := make(chan error, 1)
	go func() {
		_, err := sv.s.Commit(context.Background(), w.lease.ID, off, n, proto.Write{})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a commit returned (%v) before the log was filled", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != sv.s.opts.IndexLogSize || exists(path+newSuffix) {
		t.Fatalf("after the fill: %s %v %v, %s there %v", path, st, err, path+newSuffix, exists(path+newSuffix))
	}

	// Closed while a new log fills: the next start makes it again.
	if err := sv.s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil { // a clean Close leaves nothing to replay
		t.Fatal(err)
	}
	entered, release = make(chan struct{}, 1), make(chan struct{})
	sv.open()
	<-entered
	stopped := sv.s.ilog.stopFill
	closed := make(chan error, 1)
	go func() { closed <- sv.s.Close() }()
	<-stopped
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if exists(path) || !exists(path+newSuffix) {
		t.Fatalf("closed while the log filled: %s there %v, %s there %v", path, exists(path), path+newSuffix, exists(path+newSuffix))
	}
	testHookLogFill = nil
	sv.open()
	if got, ok := c.mustGet([]byte("k")); !ok || string(got) != "v" {
		t.Fatalf("after the log was made again: %q, %v", got, ok)
	}
	w = c.newWriter()
	if _, err := w.put([]byte("k2"), []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if !exists(path) || exists(path+newSuffix) {
		t.Fatalf("after the second fill: %s there %v, %s there %v", path, exists(path), path+newSuffix, exists(path+newSuffix))
	}
}
