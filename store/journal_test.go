// Tests of the commit journal: records the arenas lost come back from it.

package store

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
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

// TestJournalRestoresRecordsTheArenasLost commits under SyncAlways with
// checkpoints held off, stops as a crash would, wipes every record from
// the arena files (as if their pages never reached the disk), and expects
// every value back after the restart.
func TestJournalRestoresRecordsTheArenasLost(t *testing.T) {
	opts := smallOptions()
	opts.CheckpointInterval, opts.CheckpointBytes = time.Hour, 1<<40
	sv := newServer(t, opts)
	waitArenas(t, sv.s, opts.ArenaCount)
	c := newClient(t, sv)
	w := c.newWriter()
	const n = 50
	var locs []Committed
	for i := range n {
		cm, err := w.put(key(i), fmt.Appendf(nil, "journaled value %d", i))
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, cm)
	}
	if got := journalEntries(t, sv.s); got != n {
		t.Fatalf("journal holds %d entries after %d commits", got, n)
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
	if got := journalEntries(t, sv.s); got != 0 {
		t.Errorf("journal holds %d entries after the replay", got)
	}
	for i := range n {
		v, err := sv.s.Get(key(i))
		if want := fmt.Appendf(nil, "journaled value %d", i); err != nil || !bytes.Equal(v, want) {
			t.Fatalf("key %d after replay: %q, %v; want %q", i, v, err, want)
		}
	}
	// A clean Close checkpoints: nothing is left to replay.
	sv.restart()
	if got := journalEntries(t, sv.s); got != 0 {
		t.Errorf("journal holds %d entries after a clean restart", got)
	}
}

// TestCheckpointTrimsTheJournal: once CheckpointBytes were journaled, a
// checkpoint writes the arenas back and empties the journal while the
// store keeps serving.
func TestCheckpointTrimsTheJournal(t *testing.T) {
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
	for sv.s.Stats().Checkpoints == 0 || journalEntries(t, sv.s) >= 20 {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 KiB journaled: %d checkpoints, %d journal entries", sv.s.Stats().Checkpoints, journalEntries(t, sv.s))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
