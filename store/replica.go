// Backups: a replica of a shard whose primary is another server, written by that primary's forwarded commits.

package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// ErrNotBackup is returned for a replica's write (ApplyReplica,
// DeleteReplica) to a shard this store is not a backup of.
var ErrNotBackup = errors.New("store: shard not a backup here")

// ApplyReplica applies, to a shard this store backs up (ShardBackup), the
// record at offset off of lease id's region, length bytes long, which its
// primary applied as version version: the client wrote the same bytes
// into a lease at the primary and one here, and the primary forwards the
// commit. It checks the record as Commit does (key, CRC, size, pending),
// and that its version is version (the primary's, so that the replicas
// agree; this store's later leases take versions above it). The entry is
// applied with that version and w's session, durable under the sync
// policy when it returns; the record stays in state RecordBackup, not
// indexed (reads go to the primary). A retry of w is answered as Commit
// answers one. A shard not backed up here fails with ErrNotBackup.
//
// The caller applies a key's writes in the primary's order: the primary
// forwards a key's next write only once this one returned.
func (s *Store) ApplyReplica(ctx context.Context, id uint64, off, length int64, version uint64, w proto.Write) (Committed, error) {
	if version == 0 {
		return Committed{}, fmt.Errorf("%w: a replica's write of version 0 (versions start at 1)", ErrRecord)
	}
	return s.commit(ctx, id, off, length, w, version, nil)
}

// DeleteReplica deletes key from a shard this store backs up, as its
// primary did; as Delete otherwise.
func (s *Store) DeleteReplica(ctx context.Context, key []byte, w proto.Write) error {
	return s.delete(ctx, key, w, true, nil)
}

// BeginBackup makes shards backups, held for their primary elsewhere since
// epoch since (persisted, synced, before it returns): from ShardNone (a
// replica given empty), from ShardIncoming (a replica's copy, complete),
// or from ShardOwned once frozen (the
// primary handing over: its word is cleared and its keys unindexed, so
// that no reader takes a record of it for an answer any more, and its
// records kept); a backup with another since takes the new one. Every
// record of the shards is then in state RecordBackup. Any other state
// fails with ErrShardState and changes nothing.
func (s *Store) BeginBackup(shards []proto.Shard, since uint64) error {
	list, end, err := s.beginSinceOp("BeginBackup", shards, since)
	if err != nil {
		return err
	}
	defer end()
	var todo, demote []proto.Shard
	s.mu.Lock()
	for _, sh := range list {
		switch info := &s.shards[sh]; {
		case info.state == ShardIncoming, info.state == ShardNone, info.state == ShardBackup && info.since != since:
			todo = append(todo, sh)
		case info.state == ShardBackup:
		case info.state == ShardOwned && info.frozen && info.busy == 0:
			demote = append(demote, sh)
		default:
			st, frozen := info.state, info.frozen
			s.mu.Unlock()
			return fmt.Errorf("%w: BeginBackup of %v, which is %v here (frozen %v): a backup is made of an incoming copy or of a frozen, drained primary", ErrShardState, sh, st, frozen)
		}
	}
	s.mu.Unlock()
	all := append(slices.Clone(todo), demote...)
	if len(all) == 0 {
		return nil
	}
	unindexed := 0
	for _, sh := range demote {
		s.setWord(sh, 0) // before the unindexing: no miss is confirmed meanwhile
		n, err := s.unindexShard(sh)
		unindexed += n
		if err != nil {
			return fmt.Errorf("store: making %v a backup: %w", sh, err)
		}
	}
	for _, sh := range all {
		if err := s.eachEntry(sh, func(_ []byte, e entry) error {
			s.arena(e.loc.Arena).setState(e.loc.Offset, proto.RecordBackup)
			return nil
		}); err != nil {
			return err
		}
	}
	if err := s.persistShards(all, ShardBackup, func(proto.Shard) uint64 { return since }); err != nil {
		return err
	}
	s.mu.Lock()
	for _, sh := range all {
		info := &s.shards[sh]
		info.state, info.since, info.frozen = ShardBackup, since, false
	}
	s.mu.Unlock()
	s.stats.keys.Add(-int64(unindexed))
	return nil
}

// quiesceBackups freezes the backups among shards (replica writes and the
// cleaner's moves of their records are refused) and waits for the ones
// admitted before to be applied, for a promotion; it returns the shards it
// froze, for the caller to unfreeze.
func (s *Store) quiesceBackups(shards []proto.Shard) ([]proto.Shard, error) {
	var frozen []proto.Shard
	s.mu.Lock()
	for _, sh := range shards {
		if info := &s.shards[sh]; info.state == ShardBackup && !info.frozen {
			frozen = append(frozen, sh)
		}
	}
	wait := s.freezeLocked(frozen)
	s.mu.Unlock()
	// Close waits for every admitted write before it stops the commit
	// loop, so these end.
	return frozen, awaitDrained(context.Background(), wait)
}

// entryOf returns key's entry in shard sh, if it has one.
func (s *Store) entryOf(sh proto.Shard, key []byte) (entry, bool, error) {
	s.mu.Lock()
	p, ok := s.pendingEntryLocked(sh, key)
	s.mu.Unlock()
	if ok {
		return p.e, !p.deleted, nil
	}
	v, closer, err := s.db.Get(shardDataKey(sh, key))
	if errors.Is(err, pebble.ErrNotFound) {
		return entry{}, false, nil
	}
	if err != nil {
		return entry{}, false, fmt.Errorf("store: reading the entry of %q: %w", key, err)
	}
	defer closer.Close()
	e, err := decodeEntry(v)
	if err != nil {
		return entry{}, false, fmt.Errorf("store: the entry of %q: %w", key, err)
	}
	return e, true, nil
}
