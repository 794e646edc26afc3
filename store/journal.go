// Journal: the records the cleaner and Ingest copy, kept in Pebble beside their entries until a checkpoint.

package store

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// Under SyncAlways and SyncBatch, each record the cleaner relocates or
// Ingest copies is also written, in the same Pebble batch as its index
// entry, under a journal key: the batch's one WAL sync is then all it
// needs, not a sync of the arenas it wrote. (A commit's record goes into
// the index log with its entry instead: indexlog.go.) The arenas are
// written back later, by the index log's flushes, which are checkpoints:
// sync every arena, then delete the journal up to where the sync began.
// Open replays what is left, so a record the crash kept from its arena is
// copied there from the journal before anything reads it.
//
// Replaying a suffix of the journal in sequence order can only rewrite
// records with their own bytes or with later ones: a segment is reused
// only after a flush (reclaim), which trims the journal of every record
// in it. Replayed records are left dead; the rebuild that follows sets
// live exactly the current records of the shards the store owns.

var (
	journalPrefix = []byte{'j'}
	journalEnd    = []byte{'j' + 1}
)

func journalKey(seq uint64) []byte { return binary.BigEndian.AppendUint64([]byte{'j'}, seq) }

// journalHeaderSize is what a journal value holds before its record.
const journalHeaderSize = 11

// appendJournalEntry appends a record's journal value to b: format,
// arena, offset, the record's bytes.
func appendJournalEntry(b []byte, loc proto.Location, rec []byte) []byte {
	b = append(b, 1)
	b = binary.LittleEndian.AppendUint16(b, loc.Arena)
	b = binary.LittleEndian.AppendUint64(b, loc.Offset)
	return append(b, rec...)
}

// setJournalEntry adds to b the journal entry seq of rec, written at loc,
// encoded in place: b.Set would copy an encoding made on the heap first,
// an allocation of the record's size per commit.
func setJournalEntry(b *pebble.Batch, seq uint64, loc proto.Location, rec []byte) error {
	op := b.SetDeferred(1+8, journalHeaderSize+len(rec))
	binary.BigEndian.AppendUint64(append(op.Key[:0], 'j'), seq)
	appendJournalEntry(op.Value[:0], loc, rec)
	return op.Finish()
}

func decodeJournalEntry(b []byte) (arena uint16, off uint64, rec []byte, err error) {
	if len(b) < journalHeaderSize+proto.RecordHeaderSize || b[0] != 1 {
		return 0, 0, nil, fmt.Errorf("store: journal entry of %d bytes, format %v: corrupt or from a newer version", len(b), b[:min(1, len(b))])
	}
	return binary.LittleEndian.Uint16(b[1:]), binary.LittleEndian.Uint64(b[3:]), b[journalHeaderSize:], nil
}

// journaled reports whether records are journaled: in the index log for
// commits, in the journal for the cleaner and Ingest.
func (s *Store) journaled() bool { return s.opts.Sync != SyncNone }

// replayJournal copies every journaled record into its arena, syncs the
// arenas and empties the journal. Open calls it before the index is
// rebuilt, since the rebuild reads keys from the arenas.
func (s *Store) replayJournal() (int, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: journalPrefix, UpperBound: journalEnd})
	if err != nil {
		return 0, err
	}
	n := 0
	for it.First(); it.Valid(); it.Next() {
		id, off, rec, err := decodeJournalEntry(it.Value())
		switch {
		case err == nil && int(id) >= len(s.arenaList()):
			err = fmt.Errorf("store: a journaled record lies in arena %d, but ArenaCount is %d: the directory was made with more arenas. "+
				"Start with ArenaCount %d or more (rkv-server --arena-count)", id, len(s.arenaList()), id+1)
		case err == nil && (off%proto.RecordAlign != 0 || off+uint64(len(rec)) > uint64(s.opts.ArenaSize)):
			err = fmt.Errorf("store: journal entry for arena %d offset %d (%d bytes) lies outside an arena of %d bytes: corrupt, or ArenaSize changed",
				id, off, len(rec), s.opts.ArenaSize)
		}
		if err != nil {
			err = fmt.Errorf("store: replaying journal entry %x: %w", it.Key(), err)
			it.Close()
			return n, err
		}
		copy(s.arena(id).mem.Bytes()[off:], rec)
		// Dead until the rebuild says otherwise: the journal holds the
		// record as committed (live), and it may have been superseded
		// or its shard handed over since.
		s.arena(id).setState(off, proto.RecordDead)
		n++
	}
	if err := it.Close(); err != nil {
		return n, fmt.Errorf("store: reading the journal: %w", err)
	}
	if n == 0 {
		return 0, nil
	}
	// This trim must be durable: this run may reuse the space of records
	// deleted in the last one, and a stale entry replayed after the next
	// crash would overwrite their new contents.
	return n, s.checkpoint(^uint64(0) >> 1)
}

// checkpoint makes the arenas durable, then drops the journal entries
// below upTo, whose records were in the arenas before the sync began,
// durably. Open calls it after the journal's replay; while serving,
// flushIndex checkpoints.
func (s *Store) checkpoint(upTo uint64) error {
	if err := s.syncArenas(); err != nil {
		return err
	}
	if err := s.db.DeleteRange(journalPrefix, journalKey(upTo), pebble.Sync); err != nil {
		return fmt.Errorf("store: trimming the journal below %d: %w", upTo, err)
	}
	s.stats.checkpoints.Add(1)
	return nil
}

// syncArenas writes every arena back to the disk.
func (s *Store) syncArenas() error {
	for _, a := range s.arenaList() {
		if err := a.sync(); err != nil {
			return err
		}
	}
	return nil
}
