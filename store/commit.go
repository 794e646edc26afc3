// Commit: verify a record written into a lease, make it durable, index it, retire its predecessor.

package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// MaxIndexLoad is the load factor above which new keys are refused: the
// index is rebuilt at every start in another insertion order, and below
// this load a rebuild fits with a wide margin (see docs/ARCHITECTURE.md).
const MaxIndexLoad = 0.85

// Committed describes an acknowledged commit.
type Committed struct {
	Location proto.Location
	Version  uint64
}

type pendingCommit struct {
	key     []byte
	delete  bool
	entry   entry
	arena   *arena // where the record lies; nil for a delete
	rec     []byte // the verified record, to journal
	result  error
	oldLoc  proto.Location
	removed bool
	done    chan struct{}
}

// Commit commits the record a client wrote at offset off of lease id's
// region, length bytes long (its RecordSize). It returns once the record is
// durable under the sync policy and visible to readers.
func (s *Store) Commit(ctx context.Context, id uint64, off, length int64) (Committed, error) {
	c, err := s.prepareCommit(id, off, length)
	if err != nil {
		s.stats.commitsRejected.Add(1)
		return Committed{}, err
	}
	if err := s.submit(ctx, c); err != nil {
		return Committed{}, err
	}
	return Committed{Location: c.entry.loc, Version: c.entry.version}, nil
}

func (s *Store) prepareCommit(id uint64, off, length int64) (*pendingCommit, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if err := s.brokenErr(); err != nil {
		return nil, err
	}
	l, err := s.liveLeaseLocked(id)
	if err != nil {
		return nil, err
	}
	if off < l.next || length < proto.RecordHeaderSize || off+length > l.Size {
		return nil, fmt.Errorf("%w: commit of %d bytes at %d in lease %d: outside [%d, %d)", ErrLease, length, off, id, l.next, l.Size)
	}
	a := l.region.arena
	at := l.region.offset + off
	rec := a.mem.Bytes()[at : at+length]
	if s.journaled() {
		// Verify and journal one snapshot: the client can still write to
		// its lease.
		rec = append([]byte(nil), rec...)
	}
	r, err := proto.VerifyRecord(rec, nil, 0)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: lease %d offset %d: %w", ErrRecord, id, off, err)
	case int64(proto.RecordSize(r.KeyLen, r.ValueLen)) != length:
		return nil, fmt.Errorf("%w: record of key %d and value %d bytes takes %d bytes, commit says %d", ErrRecord, r.KeyLen, r.ValueLen, proto.RecordSize(r.KeyLen, r.ValueLen), length)
	case r.KeyLen > s.opts.MaxKeyLen || r.ValueLen > s.opts.MaxValueLen:
		return nil, fmt.Errorf("%w: key %d bytes (max %d), value %d bytes (max %d)", ErrRecord, r.KeyLen, s.opts.MaxKeyLen, r.ValueLen, s.opts.MaxValueLen)
	case r.Tombstone():
		return nil, fmt.Errorf("%w: deletes are committed with Delete, not as records", ErrRecord)
	case r.Version < l.nextVersion || r.Version >= l.VersionBase+l.VersionCount:
		return nil, fmt.Errorf("%w: version %d outside the lease's remaining range [%d, %d)", ErrRecord, r.Version, l.nextVersion, l.VersionBase+l.VersionCount)
	}
	a.dead += off - l.next // a gap the client skipped
	l.next = off + length
	l.nextVersion = r.Version + 1
	return &pendingCommit{
		key:   append([]byte(nil), r.Key...),
		entry: entry{loc: proto.Location{Arena: a.id, Offset: uint64(at), Length: uint32(length)}, version: r.Version},
		arena: a,
		rec:   rec,
		done:  make(chan struct{}),
	}, nil
}

// Delete removes key. Deleting an absent key is not an error.
func (s *Store) Delete(ctx context.Context, key []byte) error {
	if len(key) == 0 || len(key) > s.opts.MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes (1 to %d)", ErrRecord, len(key), s.opts.MaxKeyLen)
	}
	if err := s.brokenErr(); err != nil {
		return err
	}
	return s.submit(ctx, &pendingCommit{key: append([]byte(nil), key...), delete: true, done: make(chan struct{})})
}

func (s *Store) submit(ctx context.Context, c *pendingCommit) error {
	select {
	case s.commits <- c:
	case <-s.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	// Once queued the commit happens; ctx only stops the wait for it.
	select {
	case <-c.done:
		return c.result
	case <-ctx.Done():
		return ctx.Err()
	}
}

// commitLoop applies queued commits in batches: one sync and one Pebble
// write for everything that queued up while the previous batch was syncing.
func (s *Store) commitLoop() {
	defer s.wg.Done()
	batch := make([]*pendingCommit, 0, 256)
	expiry := time.NewTicker(min(s.opts.LeaseTTL/4, time.Second))
	defer expiry.Stop()
	for {
		select {
		case c := <-s.commits:
			batch = append(batch[:0], c)
		drain:
			for len(batch) < cap(batch) {
				select {
				case c := <-s.commits:
					batch = append(batch, c)
				default:
					break drain
				}
			}
			s.apply(batch)
		case now := <-expiry.C:
			s.expireLeases(now)
		case <-s.stop:
			for { // finish what was queued before Close
				select {
				case c := <-s.commits:
					s.apply([]*pendingCommit{c})
				default:
					return
				}
			}
		}
	}
}

func (s *Store) apply(batch []*pendingCommit) {
	start := time.Now()
	fail := func(err error) {
		for _, c := range batch {
			c.result = err
			close(c.done)
		}
	}
	// Refuse new keys the index could not take back at the next start.
	for _, c := range batch {
		if c.delete || s.index.LoadFactor() < MaxIndexLoad {
			continue
		}
		if _, exists, _ := s.index.Get(c.key); !exists {
			c.result = fmt.Errorf("%w: load %.2f reached the limit %.2f with %d keys; raise IndexSlots (%d)",
				ErrIndexFull, s.index.LoadFactor(), MaxIndexLoad, s.index.Len(), s.opts.IndexSlots)
		}
	}
	b := s.db.NewBatch()
	defer b.Close()
	seq, journaled := s.journalNext.Load(), int64(0)
	for _, c := range batch {
		var err error
		switch {
		case c.result != nil:
			continue
		case c.delete:
			err = b.Delete(dataKey(c.key), nil)
		default:
			err = b.Set(dataKey(c.key), c.entry.encode(), nil)
			if err == nil && s.journaled() {
				err = b.Set(journalKey(seq), journalEntry(c.entry.loc, c.rec), nil)
				seq++
				journaled += int64(len(c.rec))
			}
		}
		if err != nil {
			fail(err)
			return
		}
	}
	if err := s.brokenErr(); err != nil {
		fail(err) // write nothing more
		return
	}
	opts := pebble.NoSync
	if s.opts.Sync == SyncAlways {
		opts = pebble.Sync
	}
	if err := b.Commit(opts); err != nil {
		fail(fmt.Errorf("store: writing the index: %w", err))
		return
	}
	// Pebble reports some failures of a commit only to its logger.
	if err := s.brokenErr(); err != nil {
		fail(err)
		return
	}
	synced := time.Since(start)
	s.journalNext.Store(seq)
	if s.journalBytes.Add(journaled) >= s.opts.CheckpointBytes {
		select {
		case s.journalFull <- struct{}{}:
		default:
		}
	}
	for _, c := range batch {
		if c.result == nil {
			c.result = s.publish(c)
		}
		close(c.done)
	}
	s.stats.observeBatch(len(batch), synced)
}

// publish points the hash index at a durable commit and retires the
// record it replaces.
func (s *Store) publish(c *pendingCommit) error {
	var old proto.Location
	var had bool
	var err error
	if c.delete {
		old, had, err = s.index.Delete(c.key)
	} else {
		old, had, err = s.index.Put(c.key, c.entry.loc)
	}
	if err != nil {
		// Undo the durable entry so the next start agrees with readers.
		undo := s.db.Delete(dataKey(c.key), pebble.Sync)
		if had {
			undo = s.db.Set(dataKey(c.key), entry{loc: old}.encode(), pebble.Sync)
		}
		return errors.Join(err, undo)
	}
	s.mu.Lock()
	if had {
		a := s.arenas[old.Arena]
		a.markDead(old.Offset)
		a.live -= int64(old.Length)
		a.dead += int64(old.Length)
	}
	if !c.delete {
		c.arena.live += int64(c.entry.loc.Length)
	}
	s.mu.Unlock()
	switch {
	case c.delete && had:
		s.stats.keys.Add(-1)
	case !c.delete && !had:
		s.stats.keys.Add(1)
	}
	if c.delete {
		s.stats.deletes.Add(1)
	} else {
		s.stats.commits.Add(1)
	}
	return nil
}

// syncLoop is SyncBatch's background sync: every window, Pebble's WAL,
// and with it the journaled records, reach the disk.
func (s *Store) syncLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.SyncWindow)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := s.db.LogData(nil, pebble.Sync); err != nil {
				s.log.Error("syncing the Pebble WAL", "err", err)
			}
		case <-s.stop:
			return
		}
	}
}
