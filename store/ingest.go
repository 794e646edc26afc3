// Ingest: taking in a shard's records copied from another server's arenas, for a migration.

package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// A migration's target reads the source's records one-sidedly (RDMA_READ
// at the locations the source's ShardEntries lists) and hands them to
// Ingest. Ingested records are copied into server-side regions carved from
// the arenas like lease regions (no registration of their own: the arena's
// REMOTE_READ registration covers them), with their state word DEAD: the
// shard is not ours yet. ActivateShards later indexes them and sets them
// live.
//
// Durability: the records are journaled, as commits are, in the same
// Pebble batch as their entries (under SyncAlways and SyncBatch), rather
// than the arena synced before the batch. One sequential WAL write is the
// cheaper sync (the arena's fdatasync would also write back every
// client's dirty lease pages, see journal.go), crash recovery is the code
// commits already rely on (replay, then rebuild), and the checkpoints that
// write commits back write ingested records back too. The cost is that an
// Ingest call's records pass through Pebble's WAL and memtable once: keep
// calls to a few MiB of records.

// ingestJob is one Ingest call's Pebble batch, applied by the writer (the
// one writer of the journal and of sessions).
type ingestJob struct {
	shard    proto.Shard
	puts     []ingestPut
	deletes  []ingestDelete
	sessions []proto.SessionEntry
	// Space carved for puts, counted dead if the batch fails.
	carved []proto.Location
}

type ingestPut struct {
	key   []byte
	entry entry
	rec   []byte // as copied into the arena (state dead), to journal
	old   *entry // the entry it replaces
}

type ingestDelete struct {
	key []byte
	old entry
}

// Ingest takes in records, deletes and sessions of shard sh, which must be
// ShardIncoming (else ErrShardState). Each record is the raw bytes another
// server's arena held at one location (header, key, value, padding;
// intact, its state word whatever it was): it must be of shard sh, is
// copied into this store's arenas with its state word dead, and gets an
// entry with the record's own version (the store's next versions are
// raised above it, so that later commits of the key carry higher ones).
// An entry the store already has for the key is replaced (its bytes count
// dead), unless it is of the same version: then the record is the same
// one and is skipped, so a retried Ingest takes no space twice. Later
// records of a key in the same call replace earlier ones. Then deletes
// remove keys, and sessions are merged (the higher seq of a session
// wins; entries past SessionTTL are dropped).
//
// It is one Pebble batch, durable under the sync policy when it returns
// (see above). The shard is not indexed: ActivateShards does that. A ctx
// done before the batch is queued fails it; once queued the batch is
// applied and Ingest waits for it. A failed call may have taken arena space (counted
// dead) but leaves no entry: it can be retried.
func (s *Store) Ingest(ctx context.Context, sh proto.Shard, records [][]byte, sessions []proto.SessionEntry, deletes [][]byte) error {
	if sh >= proto.NumShards {
		return fmt.Errorf("store: shard %d does not exist (0 to %d)", sh, proto.NumShards-1)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Check everything before taking anything.
	type checked struct {
		key     []byte
		version uint64
		rec     []byte // a copy, state dead
	}
	var recs []checked
	latest := map[string]int{}
	for i, raw := range records {
		rec, r, err := checkIngested(raw)
		if err != nil {
			return fmt.Errorf("%w: Ingest record %d: %w", ErrRecord, i, err)
		}
		if got := proto.ShardOf(r.Key); got != sh {
			return fmt.Errorf("%w: Ingest record %d (key %q) is of %v, not %v", ErrRecord, i, r.Key, got, sh)
		}
		if int64(len(rec)) > s.opts.SegmentSize {
			return fmt.Errorf("%w: Ingest record %d of %d bytes is larger than a segment (%d): raise SegmentSize (rkv-server --segment-size)", ErrRecord, i, len(rec), s.opts.SegmentSize)
		}
		if j, ok := latest[string(r.Key)]; ok {
			recs[j].rec = nil // replaced within the call
		}
		latest[string(r.Key)] = len(recs)
		recs = append(recs, checked{key: append([]byte(nil), r.Key...), version: r.Version, rec: rec})
	}
	for i, k := range deletes {
		if len(k) == 0 || len(k) > proto.MaxKeyLen || proto.ShardOf(k) != sh {
			return fmt.Errorf("%w: Ingest delete %d: key %q of %d bytes is not a key of %v", ErrRecord, i, k, len(k), sh)
		}
		if j, ok := latest[string(k)]; ok {
			recs[j].rec = nil // deletes come after records
		}
	}
	for _, e := range sessions {
		if e.Session == 0 {
			return fmt.Errorf("store: Ingest of a session entry with session 0 (seq %d)", e.Seq)
		}
	}

	defer s.lockShards([]proto.Shard{sh})()
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case s.shards[sh].state != ShardIncoming:
		st := s.shards[sh].state
		s.mu.Unlock()
		return fmt.Errorf("%w: Ingest into %v, which is %v here (BeginIncoming first)", ErrShardState, sh, st)
	}
	s.inflight.Add(1) // Close waits for it
	s.mu.Unlock()
	job := &ingestJob{shard: sh}
	c := newJob(sh, job, nil)
	queued := false
	defer func() {
		if !queued {
			s.mu.Lock()
			job.wasteLocked(s)
			s.mu.Unlock()
			s.inflight.Done()
		}
	}()

	// The entries they replace: nothing else writes an Incoming shard's
	// entries, and its operations lock is held.
	current := func(key []byte) (*entry, error) {
		e, ok, err := s.entryOf(proto.ShardOf(key), key)
		if !ok || err != nil {
			return nil, err
		}
		return &e, nil
	}
	for _, r := range recs {
		if r.rec == nil {
			continue
		}
		old, err := current(r.key)
		if err != nil {
			return fmt.Errorf("store: Ingest: key %q: %w", r.key, err)
		}
		if old != nil && old.version == r.version {
			continue // this very record, ingested before
		}
		job.puts = append(job.puts, ingestPut{key: r.key, entry: entry{version: r.version}, rec: r.rec, old: old})
	}
	for _, k := range deletes {
		old, err := current(k)
		if err != nil {
			return fmt.Errorf("store: Ingest: key %q: %w", k, err)
		}
		if old != nil {
			job.deletes = append(job.deletes, ingestDelete{key: append([]byte(nil), k...), old: *old})
		}
	}
	// Space, then the copies: no reader knows these locations, and the
	// records are dead there.
	cutoff := time.Now().Add(-s.opts.SessionTTL).UnixNano()
	s.mu.Lock()
	bySession := map[uint64]int{}
	for _, e := range sessions {
		if ss := s.sess.m[sessKey{sh, e.Session}]; e.Time < cutoff || ss != nil && ss.applied && ss.seq >= e.Seq {
			continue
		}
		if i, ok := bySession[e.Session]; ok {
			if job.sessions[i].Seq < e.Seq {
				job.sessions[i] = e
			}
			continue
		}
		bySession[e.Session] = len(job.sessions)
		job.sessions = append(job.sessions, e)
	}
	for i := range job.puts {
		p := &job.puts[i]
		loc, err := s.fillLocked(&s.ingest, int64(len(p.rec)), s.opts.LeaseSize, false)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		p.entry.loc = loc
		job.carved = append(job.carved, loc)
		s.nextVersion = max(s.nextVersion, p.entry.version+1)
	}
	s.mu.Unlock()
	for _, p := range job.puts {
		copy(s.arena(p.entry.loc.Arena).mem.Bytes()[p.entry.loc.Offset:], p.rec)
	}

	if err := ctx.Err(); err != nil {
		return err
	}
	s.enqueue(c)
	queued = true
	s.kickLoop()
	<-c.done
	return c.result
}

// checkIngested verifies raw as a record whatever its state word, and
// returns a copy of it with the state dead.
func checkIngested(raw []byte) ([]byte, proto.Record, error) {
	if len(raw) < proto.RecordHeaderSize {
		return nil, proto.Record{}, fmt.Errorf("%d bytes, shorter than a record header", len(raw))
	}
	rec := append([]byte(nil), raw...)
	r, err := proto.ParseRecord(rec)
	switch {
	case err != nil:
		return nil, proto.Record{}, err
	case proto.RecordSize(r.KeyLen, r.ValueLen) != len(raw):
		return nil, proto.Record{}, fmt.Errorf("record of key %d and value %d bytes takes %d bytes, got %d",
			r.KeyLen, r.ValueLen, proto.RecordSize(r.KeyLen, r.ValueLen), len(raw))
	case r.Tombstone():
		return nil, proto.Record{}, fmt.Errorf("a tombstone: deletes are ingested as keys")
	case r.Version == 0:
		return nil, proto.Record{}, fmt.Errorf("version 0")
	}
	putState(rec, proto.RecordDead)
	r.Key = rec[proto.RecordHeaderSize : proto.RecordHeaderSize+r.KeyLen]
	return rec, r, nil
}

// wasteLocked counts the job's carved space dead: its batch failed.
func (job *ingestJob) wasteLocked(s *Store) {
	for _, loc := range job.carved {
		s.settleLocked(loc, false)
	}
}

// applyIngest writes an Ingest call's batch (the writer).
func (s *Store) applyIngest(c *pendingCommit) {
	job := c.job
	defer func() {
		c.signal()
		s.inflight.Done()
	}()
	// Pebble current first: its batch would otherwise come before
	// entries the log holds of earlier writes (indexlog.go).
	flushErr := s.flushIndex()
	b := s.db.NewBatch()
	defer b.Close()
	seq, journaled := s.journalNext.Load(), int64(0)
	errs := []error{flushErr}
	for _, p := range job.puts {
		errs = append(errs, b.Set(dataKey(p.key), p.entry.encode(), nil))
		if s.journaled() {
			errs = append(errs, setJournalEntry(b, seq, p.entry.loc, p.rec))
			seq++
			journaled += int64(len(p.rec))
		}
	}
	for _, d := range job.deletes {
		errs = append(errs, b.Delete(dataKey(d.key), nil))
	}
	for _, e := range job.sessions {
		errs = append(errs, b.Set(sessionKey(job.shard, e.Session), sessionRecord{seq: e.Seq, version: e.Version, time: e.Time}.encode(), nil))
	}
	err := errors.Join(errs...)
	if err == nil {
		err = s.commitBatch(b)
	}
	if err != nil {
		c.result = fmt.Errorf("store: Ingest into %v: %w", job.shard, err)
		s.mu.Lock()
		job.wasteLocked(s)
		s.mu.Unlock()
		return
	}
	s.journalWritten(seq, journaled)
	s.mu.Lock()
	defer s.mu.Unlock()
	info := &s.shards[job.shard]
	for _, p := range job.puts {
		if p.old != nil {
			s.deadLocked(p.old.loc)
			info.live -= int64(p.old.loc.Length)
		} else {
			info.keys++
		}
		s.settleLocked(p.entry.loc, true)
		info.live += int64(p.entry.loc.Length)
	}
	for _, d := range job.deletes {
		s.deadLocked(d.old.loc)
		info.live -= int64(d.old.loc.Length)
		info.keys--
	}
	for _, e := range job.sessions {
		s.sess.upsert(sessKey{job.shard, e.Session}, sessionRecord{seq: e.Seq, version: e.Version, time: e.Time})
	}
	s.sess.evict(time.Now())
}

// RecordAt returns a copy of the bytes at loc: a record as a reader would
// READ it (tests, and a migration's source when RDMA is not at hand).
func (s *Store) RecordAt(loc proto.Location) ([]byte, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.exit()
	if int(loc.Arena) >= len(s.arenaList()) {
		return nil, fmt.Errorf("store: arena %d does not exist (%d arenas)", loc.Arena, len(s.arenaList()))
	}
	b, err := s.arena(loc.Arena).record(loc)
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), b...), nil
}
