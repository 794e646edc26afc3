// Tests of the commit journal: records the arenas lost come back from it.

package store

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/rkv-io/rkv/proto"
)

func journalEntries(t *testing.T, s *Store) int {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: journalPrefix, UpperBound: journalEnd})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	return n
}

// logEntries counts the entries the index log holds past its flushed
// position: those a start would replay.
func logEntries(s *Store) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries, _ := s.ilog.entriesFrom(s.ilog.flushed)
	return len(entries)
}

// TestIndexLogRestoresRecordsTheArenasLost commits under SyncAlways with
// checkpoints held off, stops as a crash would, wipes every record from
// the arena files (as if their pages never reached the disk), and expects
// every value back after the restart: the log carried the records.
func TestIndexLogRestoresRecordsTheArenasLost(t *testing.T) {
	opts := smallOptions()
	opts.CheckpointInterval, opts.CheckpointBytes = time.Hour, 1<<40
	sv := newServer(t, opts)
	waitArenas(t, sv.s, opts.ArenaCount)
	c := newClient(t, sv)
	w := c.newWriter()
	const n = 50
	var locs []Committed
	for i := range n {
		cm, err := w.put(key(i), fmt.Appendf(nil, "logged value %d", i))
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, cm)
	}
	if got := logEntries(sv.s); got != n {
		t.Fatalf("the index log holds %d entries after %d commits", got, n)
	}
	if err := sv.s.close(false); err != nil {
		t.Fatal(err)
	}
	for _, cm := range locs {
		f, err := os.OpenFile(arenaPath(sv.opts.Dir, int(cm.Location.Arena)), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(make([]byte, cm.Location.Length), int64(cm.Location.Offset)); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	sv.open()
	if sv.s.logReplayed != n {
		t.Errorf("the start replayed %d entries of the log, want %d", sv.s.logReplayed, n)
	}
	for i := range n {
		v, err := sv.s.Get(key(i))
		if want := fmt.Appendf(nil, "logged value %d", i); err != nil || !bytes.Equal(v, want) {
			t.Fatalf("key %d after replay: %q, %v; want %q", i, v, err, want)
		}
	}
	// A clean Close checkpoints: nothing is left to replay.
	sv.restart()
	if sv.s.logReplayed != 0 || journalEntries(t, sv.s) != 0 {
		t.Errorf("after a clean restart: %d log entries replayed, %d journal entries", sv.s.logReplayed, journalEntries(t, sv.s))
	}
}

// TestCheckpointFlushesTheLog: once CheckpointBytes were logged, a
// checkpoint writes the arenas back and flushes the index log into
// Pebble while the store keeps serving.
func TestCheckpointFlushesTheLog(t *testing.T) {
	opts := smallOptions()
	opts.CheckpointInterval, opts.CheckpointBytes = time.Hour, 4<<10
	sv := newServer(t, opts)
	waitArenas(t, sv.s, opts.ArenaCount)
	c := newClient(t, sv)
	w := c.newWriter()
	for i := range 20 {
		if _, err := w.put(key(i), bytes.Repeat([]byte{'v'}, 1024)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for sv.s.Stats().Checkpoints == 0 || logEntries(sv.s) >= 20 {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 KiB logged: %d checkpoints, %d log entries", sv.s.Stats().Checkpoints, logEntries(sv.s))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, ok := pebbleEntry(t, sv.s, key(0)); !ok {
		t.Error("after a checkpoint Pebble lacks the first key's entry")
	}
}

// TestDurableCommitRestoresTheVerifiedRecord: under the durable policies a
// commit writes the copy it verified back over its record through the
// mapping (arena.restore), so that a checkpoint writes every page of the
// record back even where an RDMA device wrote it around the page tables,
// and what the lease's holder writes over it after the check does not
// stay.
func TestDurableCommitRestoresTheVerifiedRecord(t *testing.T) {
	for _, sync := range []SyncPolicy{SyncAlways, SyncBatch} {
		t.Run(sync.String(), func(t *testing.T) {
			sv := newServer(t, syncOptions(sync))
			c := newClient(t, sv)
			w := c.newWriter()
			key, value := []byte("spans-pages"), bytes.Repeat([]byte("v"), 6000)
			off, n := w.write(key, value)
			sv.s.mu.Lock()
			at := sv.s.leases[w.lease.ID].region.off + off
			sv.s.mu.Unlock()
			rec := sv.s.arena(w.lease.Arena).mem.Bytes()[at : at+n]
			sv.s.testHookApply = func() { clear(rec[n-200:]) } // after the check
			if _, err := sv.s.Commit(context.Background(), w.lease.ID, off, n, proto.Write{}); err != nil {
				t.Fatal(err)
			}
			sv.s.testHookApply = nil
			if got, ok := c.mustGet(key); !ok || !bytes.Equal(got, value) {
				t.Fatalf("after the record was overwritten past its check: %d bytes, found %v", len(got), ok)
			}
			if _, err := proto.VerifyRecord(rec, key, 0); err != nil {
				t.Fatalf("the arena does not hold the verified record: %v", err)
			}
		})
	}
}
