// Shard states: which shards the store may write, and handing shards over to and from other servers.

package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// The invariant everything here keeps:
//
//	A record in a server's arena is in state live only while that server
//	owns the record's shard and the record is its key's current version
//	there.
//
// So a one-sided reader that finds a live record of its key with a good
// CRC may return it, whoever owns the shard by now; and one that finds
// nothing in the index must read the shard's word (proto/shard.go) before
// it may answer "not found": the word is the epoch since which this
// server owns the shard, 0 while it does not.
//
// (Records a client wrote into a lease but never committed are written
// pending by the client and stay so: a reader that reaches one through a
// location it held from the space's earlier use does not return it.)
//
// A shard goes None -> Incoming (BeginIncoming) -> [Ingest...] -> Owned
// (ActivateShards) -> [frozen (FreezeShards)] -> Released (ReleaseShards)
// -> None (DropShards), or back to Owned from Released when a migration is
// aborted. A replica: Incoming or frozen Owned -> Backup (BeginBackup) ->
// Owned (ActivateShards: a promotion) or None (DropShards). Operations on one shard are serialized; operations on
// different shards run concurrently.

// ShardState is a shard's state in this store.
type ShardState uint8

// Shard states.
const (
	// ShardNone: the store holds nothing of the shard (the default for
	// every shard of a new store); commits are refused.
	ShardNone ShardState = iota
	// ShardIncoming: a migration is copying the shard in (Ingest); its
	// records are dead and not indexed, commits are refused.
	ShardIncoming
	// ShardOwned: the store serves the shard: its current records are
	// live and indexed, its word holds the epoch since which it is owned.
	ShardOwned
	// ShardReleased: handed over; the data stays (dead, not indexed) so
	// that an aborted migration can take it back, until DropShards.
	ShardReleased
	// ShardBackup: the store keeps a replica of the shard for its primary
	// elsewhere (replica.go): its entries and records (in state
	// RecordBackup, not indexed, no word), written by ApplyReplica and
	// DeleteReplica; client commits are refused. ActivateShards promotes
	// it.
	ShardBackup
	shardStateEnd
)

func (st ShardState) String() string {
	switch st {
	case ShardNone:
		return "none"
	case ShardIncoming:
		return "incoming"
	case ShardOwned:
		return "owned"
	case ShardReleased:
		return "released"
	case ShardBackup:
		return "backup"
	}
	return fmt.Sprintf("ShardState(%d)", uint8(st))
}

var (
	// ErrNotOwner is returned for a commit, delete, scan or freeze of a
	// shard this store does not own (state other than ShardOwned).
	ErrNotOwner = errors.New("store: shard not owned here")
	// ErrShardMoving is returned for a commit or delete of a shard that
	// is frozen for a migration (or being released): retry shortly, at
	// this server or the shard's next owner.
	ErrShardMoving = errors.New("store: shard is moving")
	// ErrShardState is returned for a shard operation the shard's state
	// does not allow (e.g. DropShards of an owned shard).
	ErrShardState = errors.New("store: shard in the wrong state")
)

// ShardStatus is one shard's state and size.
type ShardStatus struct {
	Shard proto.Shard
	State ShardState
	// Since is the epoch since which an Owned shard is owned; a Released
	// shard keeps the one it had, so that a migration aborted after the
	// release serves it again under the same epoch. 0 otherwise.
	Since uint64
	// Started is the epoch of the migration an Incoming shard is copied
	// in for (BeginIncoming); 0 otherwise.
	Started uint64
	Frozen  bool
	// Keys and LiveBytes count the shard's current records (its Pebble
	// entries) in any state: an incoming or released shard's too.
	Keys      int64
	LiveBytes int64
}

// shardInfo is a shard's in-memory state, guarded by Store.mu.
type shardInfo struct {
	state ShardState
	// since is ShardStatus.Since for an Owned or Released shard and
	// ShardStatus.Started for an Incoming one; it is persisted with the
	// state.
	since  uint64
	frozen bool // FreezeShards
	moving bool // ReleaseShards is draining it
	// busy counts the commits and deletes admitted and not yet applied;
	// idle, made when someone waits for that (drained), is closed when it
	// drops to 0.
	busy int
	idle chan struct{}
	keys int64
	live int64
}

func (sh *shardInfo) admit() { sh.busy++ }

func (sh *shardInfo) applied() {
	if sh.busy--; sh.busy == 0 && sh.idle != nil {
		close(sh.idle)
		sh.idle = nil
	}
}

// drained returns a channel closed once no commit or delete is in flight
// to the shard, or nil when none is now. It is made here, for the rare
// waiter, rather than by every commit that finds the shard idle.
func (sh *shardInfo) drained() chan struct{} {
	if sh.busy == 0 {
		return nil
	}
	if sh.idle == nil {
		sh.idle = make(chan struct{})
	}
	return sh.idle
}

// writableLocked says why a commit or delete to shard sh is refused, or
// nil.
func (s *Store) writableLocked(sh proto.Shard) error {
	info := &s.shards[sh]
	if info.state != ShardOwned {
		return fmt.Errorf("%w: %v is %v on this server", ErrNotOwner, sh, info.state)
	}
	if info.frozen || info.moving {
		return fmt.Errorf("%w: %v is frozen for a migration; retry in a moment", ErrShardMoving, sh)
	}
	return nil
}

// AllShards returns every shard, 0 to NumShards-1.
func AllShards() []proto.Shard {
	out := make([]proto.Shard, proto.NumShards)
	for i := range out {
		out[i] = proto.Shard(i)
	}
	return out
}

// normShards returns shards sorted, without duplicates, checked.
func normShards(shards []proto.Shard) ([]proto.Shard, error) {
	out := slices.Clone(shards)
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > 0 && out[len(out)-1] >= proto.NumShards {
		return nil, fmt.Errorf("store: shard %d does not exist (0 to %d)", out[len(out)-1], proto.NumShards-1)
	}
	return out, nil
}

// beginShardOp is the prologue of a shard transition: it checks and sorts
// shards, enters the store (ErrClosed once closed) and takes the shards'
// operation locks. end undoes both.
func (s *Store) beginShardOp(shards []proto.Shard) (list []proto.Shard, end func(), err error) {
	if list, err = normShards(shards); err != nil {
		return nil, nil, err
	}
	if err := s.enter(); err != nil {
		return nil, nil, err
	}
	unlock := s.lockShards(list)
	return list, func() { unlock(); s.exit() }, nil
}

// lockShards takes the operation locks of shards (sorted, so that
// concurrent callers cannot deadlock) and returns the unlock.
func (s *Store) lockShards(shards []proto.Shard) func() {
	for _, sh := range shards {
		s.shardOps[sh].Lock()
	}
	return func() {
		for _, sh := range shards {
			s.shardOps[sh].Unlock()
		}
	}
}

// shardWordsOf returns the shard words at the end of the index region.
func shardWordsOf(region []byte, geo proto.IndexGeometry) []uint64 {
	w := region[geo.TableBytes():geo.RegionBytes()]
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(w))), proto.NumShards)
}

// setWord publishes shard sh's word (proto.ShardWord) with one aligned
// 8-byte store, in the growing index region too, if any.
func (s *Store) setWord(sh proto.Shard, v uint64) {
	s.wordsMu.Lock()
	defer s.wordsMu.Unlock()
	atomic.StoreUint64(&s.region.Load().words[sh], v)
	if s.nextWords != nil {
		atomic.StoreUint64(&s.nextWords[sh], v)
	}
}

func (s *Store) word(sh proto.Shard) uint64 { return atomic.LoadUint64(&s.region.Load().words[sh]) }

// ShardState returns shard sh's status.
func (s *Store) ShardState(sh proto.Shard) ShardStatus {
	if sh >= proto.NumShards {
		return ShardStatus{Shard: sh}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statusLocked(sh)
}

func (s *Store) statusLocked(sh proto.Shard) ShardStatus {
	info := &s.shards[sh]
	st := ShardStatus{Shard: sh, State: info.state, Since: info.since, Frozen: info.frozen, Keys: info.keys, LiveBytes: info.live}
	if info.state == ShardIncoming {
		st.Since, st.Started = 0, info.since
	}
	return st
}

// Shards returns every shard's status, in shard order.
func (s *Store) Shards() []ShardStatus {
	out := make([]ShardStatus, proto.NumShards)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range out {
		out[i] = s.statusLocked(proto.Shard(i))
	}
	return out
}

// loadShards reads the persisted shard states (Open).
func (s *Store) loadShards() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: metaShardsKey, UpperBound: metaShardsEnd})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		if len(k) != len(metaShardsKey)+2 {
			return fmt.Errorf("store: shard record key %q: corrupt", k)
		}
		sh := proto.Shard(k[len(k)-2])<<8 | proto.Shard(k[len(k)-1])
		if sh >= proto.NumShards {
			return fmt.Errorf("store: shard record key %q: shard %d does not exist", k, sh)
		}
		st, since, err := decodeShardRecord(it.Value())
		if err != nil {
			return fmt.Errorf("store: %v: %w", sh, err)
		}
		s.shards[sh].state, s.shards[sh].since = st, since
	}
	return it.Error()
}

// persistShards writes the shards' states in one synced batch, each with
// its since (sinceOf; nil: 0).
func (s *Store) persistShards(shards []proto.Shard, st ShardState, sinceOf func(proto.Shard) uint64) error {
	b := s.db.NewBatch()
	defer b.Close()
	for _, sh := range shards {
		var err error
		var since uint64
		if sinceOf != nil {
			since = sinceOf(sh)
		}
		if st == ShardNone {
			err = b.Delete(shardStateKey(sh), nil)
		} else {
			err = b.Set(shardStateKey(sh), encodeShardRecord(st, since), nil)
		}
		if err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("store: recording %d shards %v: %w", len(shards), st, err)
	}
	return nil
}

// BeginIncoming marks shards as being copied in by the migration that
// started at epoch started: from ShardNone to ShardIncoming{started},
// persisted (synced) before it returns; a shard already Incoming for that
// migration is left as it is. Any other state, an Incoming shard of
// another migration included (drop it first), fails with ErrShardState and
// changes nothing. It does not block on commits.
func (s *Store) BeginIncoming(shards []proto.Shard, started uint64) error {
	list, end, err := s.beginShardOp(shards)
	if err != nil {
		return err
	}
	defer end()
	var todo []proto.Shard
	s.mu.Lock()
	for _, sh := range list {
		switch info := &s.shards[sh]; {
		case info.state == ShardNone:
			todo = append(todo, sh)
		case info.state == ShardIncoming && info.since == started:
		case info.state == ShardIncoming:
			s.mu.Unlock()
			return fmt.Errorf("%w: BeginIncoming of %v for the migration of epoch %d, which comes in for the migration of epoch %d: drop it first", ErrShardState, sh, started, info.since)
		default:
			st := info.state
			s.mu.Unlock()
			return fmt.Errorf("%w: BeginIncoming of %v, which is %v here (only a shard with no data here can come in)", ErrShardState, sh, st)
		}
	}
	s.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if err := s.persistShards(todo, ShardIncoming, func(proto.Shard) uint64 { return started }); err != nil {
		return err
	}
	s.mu.Lock()
	for _, sh := range todo {
		s.shards[sh].state, s.shards[sh].since = ShardIncoming, started
	}
	s.mu.Unlock()
	return nil
}

// ActivateShards makes the store the owner of shards since epoch since
// (which must not be 0). It accepts shards in any state: from ShardNone,
// ShardIncoming or ShardReleased it indexes every entry of the shard,
// sets each entry's record live, sets the shard's word to since, and
// persists Owned{since} (synced) before the shard takes commits; a shard
// already Owned only has its since (word and persisted state) updated, so
// the call is idempotent. Frozen shards stay frozen.
//
// It blocks on nothing but its own work (and other operations on the same
// shards). If the index cannot take the shards' keys it fails with
// ErrIndexFull and changes nothing; on any error the shards keep the state
// they had.
func (s *Store) ActivateShards(shards []proto.Shard, since uint64) error {
	list, end, err := s.beginSinceOp("ActivateShards", shards, since)
	if err != nil {
		return err
	}
	defer end()
	var todo, update []proto.Shard
	var keys int64
	s.mu.Lock()
	for _, sh := range list {
		switch info := &s.shards[sh]; {
		case info.state != ShardOwned:
			todo = append(todo, sh)
			keys += info.keys
		case info.since != since:
			update = append(update, sh)
		}
	}
	s.mu.Unlock()
	if len(todo) == 0 && len(update) == 0 {
		return nil
	}
	if err := s.fitIndex(int(keys), activateIndexWait); err != nil {
		return fmt.Errorf("activating %d shards: %w", len(todo), err)
	}
	// A backup's replica writes and the cleaner's moves of its records
	// must not straddle its promotion (a move applied after the indexing
	// would leave the index at the old copy): stop them and wait for
	// those admitted.
	promoted, err := s.quiesceBackups(todo)
	defer s.UnfreezeShards(promoted)
	if err != nil {
		return err
	}
	indexed := 0
	var done []proto.Shard
	old := make(map[proto.Shard]uint64, len(update))
	for _, sh := range update {
		old[sh] = s.word(sh)
	}
	undo := func() {
		for _, sh := range done {
			s.setWord(sh, 0)
			_, _ = s.unindexShard(sh)
		}
		for _, sh := range update {
			s.setWord(sh, old[sh])
		}
	}
	for _, sh := range todo {
		done = append(done, sh) // undo a partial shard too
		n, err := s.indexShard(sh)
		indexed += n
		if err != nil {
			undo()
			return fmt.Errorf("store: activating %v: %w", sh, err)
		}
	}
	// Every key indexed: publish the words, with a new activation number
	// (proto.ShardWord), so a reader sees this ownership as a new one.
	w := proto.ShardWord(since, s.activations.Add(1))
	for _, sh := range append(slices.Clone(todo), update...) {
		s.setWord(sh, w)
	}
	if err := s.persistShards(append(slices.Clone(todo), update...), ShardOwned, func(proto.Shard) uint64 { return since }); err != nil {
		undo()
		return err
	}
	s.mu.Lock()
	for _, sh := range append(todo, update...) {
		s.shards[sh].state, s.shards[sh].since = ShardOwned, since
	}
	s.mu.Unlock()
	s.stats.keys.Add(int64(indexed))
	return nil
}

// beginSinceOp is beginShardOp for an operation that records an epoch
// since: one from 1 (a shard word of 0 means not owned) to MaxShardSince.
func (s *Store) beginSinceOp(what string, shards []proto.Shard, since uint64) ([]proto.Shard, func(), error) {
	if since == 0 || since > proto.MaxShardSince {
		return nil, nil, fmt.Errorf("store: %s since epoch %d: epochs run from 1 (a shard word of 0 means not owned) to %d", what, since, uint64(proto.MaxShardSince))
	}
	return s.beginShardOp(shards)
}

// indexShard indexes every entry of shard sh and sets its records live,
// and fills in the locations of the shard's sessions that lack one
// (ingested) from the entries of their versions.
func (s *Store) indexShard(sh proto.Shard) (int, error) {
	s.mu.Lock()
	unresolved := s.sess.unresolved(sh)
	s.mu.Unlock()
	resolved := map[uint64]proto.Location{}
	n := 0
	err := s.eachEntry(sh, func(key []byte, e entry) error {
		s.arena(e.loc.Arena).setState(e.loc.Offset, proto.RecordLive)
		if _, _, err := s.index.Put(append([]byte(nil), key...), e.loc); err != nil {
			s.arena(e.loc.Arena).setState(e.loc.Offset, proto.RecordDead)
			return err
		}
		if _, ok := unresolved[e.version]; ok {
			resolved[e.version] = e.loc
		}
		n++
		return nil
	})
	if len(resolved) > 0 {
		s.mu.Lock()
		for v, loc := range resolved {
			if ss := unresolved[v]; ss.version == v && ss.loc.Length == 0 {
				ss.loc = loc
			}
		}
		s.mu.Unlock()
	}
	return n, err
}

// unindexShard removes shard sh's keys from the index and marks their
// records dead.
func (s *Store) unindexShard(sh proto.Shard) (int, error) {
	n := 0
	err := s.eachEntry(sh, func(key []byte, e entry) error {
		if loc, ok, err := s.index.Get(key); err == nil && ok && loc == e.loc {
			if _, _, err := s.index.Delete(key); err != nil {
				return err
			}
			n++
		}
		s.arena(e.loc.Arena).setState(e.loc.Offset, proto.RecordDead)
		return nil
	})
	return n, err
}

// eachEntry calls f for each entry of shard sh, in key order; key is only
// valid during the call.
func (s *Store) eachEntry(sh proto.Shard, f func(key []byte, e entry) error) error {
	if err := s.flushIndex(); err != nil {
		return err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: shardLower(sh), UpperBound: shardUpper(sh)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		key := it.Key()[dataKeyPrefixN:]
		e, err := decodeEntry(it.Value())
		if err == nil {
			err = s.checkLocation(key, e.loc)
		}
		if err == nil {
			err = f(key, e)
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("store: key %q of %v: %w", key, sh, err)
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// FreezeShards stops writes to owned shards for a migration's last copy:
// from the moment it takes the lock, Commit and Delete of their keys fail
// with ErrShardMoving (the check and a commit's admission happen under
// the same lock, so none slips between). It then blocks until every
// commit and delete admitted to those shards before the call has been
// applied (durable and published in the index), or until ctx ends (its
// error is returned; the shards stay frozen). Freezing is idempotent and
// not persisted: a restart unfreezes. Every shard must be Owned, else it
// fails with ErrNotOwner and freezes none.
func (s *Store) FreezeShards(ctx context.Context, shards []proto.Shard) error {
	list, err := normShards(shards)
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, sh := range list {
		if st := s.shards[sh].state; st != ShardOwned {
			s.mu.Unlock()
			return fmt.Errorf("%w: FreezeShards of %v, which is %v here", ErrNotOwner, sh, st)
		}
	}
	wait := s.freezeLocked(list)
	s.mu.Unlock()
	if err := awaitDrained(ctx, wait); err != nil {
		return fmt.Errorf("store: waiting for the commits to %d frozen shards to drain: %w", len(list), err)
	}
	return nil
}

// freezeLocked freezes shards (their writes are refused from now on) and
// returns, for those with writes admitted, the channels that close once
// those are applied. The caller holds mu.
func (s *Store) freezeLocked(shards []proto.Shard) []chan struct{} {
	var wait []chan struct{}
	for _, sh := range shards {
		info := &s.shards[sh]
		info.frozen = true
		if c := info.drained(); c != nil {
			wait = append(wait, c)
		}
	}
	return wait
}

// awaitDrained waits for what freezeLocked returned, or for ctx.
func awaitDrained(ctx context.Context, wait []chan struct{}) error {
	for _, c := range wait {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// UnfreezeShards lets Commit and Delete into shards again (those Owned).
// Idempotent; it accepts shards in any state and never blocks.
func (s *Store) UnfreezeShards(shards []proto.Shard) error {
	list, err := normShards(shards)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range list {
		s.shards[sh].frozen = false
	}
	return nil
}

// ReleaseShards hands owned shards over: it refuses new commits to them
// (ErrShardMoving), waits for those already admitted to be applied, sets
// each shard's word to 0, removes its keys from the hash index, marks its
// records dead, and then persists Released (synced). The data stays in
// Pebble and the arenas: ActivateShards takes the shards back (an aborted
// migration), DropShards deletes them. It accepts Owned shards, frozen or
// not, and Released ones (a no-op, but the state is persisted again, so a
// call that failed to persist can be retried); any other state fails with
// ErrShardState and releases none. It blocks until the drain is done,
// which takes as long as one group commit.
func (s *Store) ReleaseShards(shards []proto.Shard) error {
	list, end, err := s.beginShardOp(shards)
	if err != nil {
		return err
	}
	defer end()
	var owned []proto.Shard
	var wait []chan struct{}
	s.mu.Lock()
	for _, sh := range list {
		if st := s.shards[sh].state; st != ShardOwned && st != ShardReleased {
			s.mu.Unlock()
			return fmt.Errorf("%w: ReleaseShards of %v, which is %v here", ErrShardState, sh, st)
		}
	}
	for _, sh := range list {
		info := &s.shards[sh]
		if info.state != ShardOwned {
			continue
		}
		owned = append(owned, sh)
		info.moving = true
		if c := info.drained(); c != nil {
			wait = append(wait, c)
		}
	}
	s.mu.Unlock()
	for _, c := range wait {
		<-c // the writer applies everything admitted
	}
	var errs []error
	removed := 0
	for _, sh := range owned {
		s.setWord(sh, 0)
		n, err := s.unindexShard(sh)
		removed += n
		errs = append(errs, err)
	}
	s.stats.keys.Add(-int64(removed))
	// Not serving them any more, whether or not the state persists: a
	// retry persists it, a restart before that takes them back as Owned.
	s.mu.Lock()
	for _, sh := range owned {
		info := &s.shards[sh]
		info.state, info.frozen, info.moving = ShardReleased, false, false // since stays
	}
	sinces := make(map[proto.Shard]uint64, len(list))
	for _, sh := range list {
		sinces[sh] = s.shards[sh].since
	}
	s.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("store: releasing %d shards: %w", len(owned), err)
	}
	return s.persistShards(list, ShardReleased, func(sh proto.Shard) uint64 { return sinces[sh] })
}

// DropShards deletes shards' data: their Pebble range (one synced
// DeleteRange) and their idempotency sessions; their records' bytes count
// dead, and the state becomes ShardNone. It accepts Released, Incoming and
// None shards (idempotent); an Owned shard fails with ErrShardState and
// nothing is dropped. It does not block on commits (none are admitted to
// such shards).
func (s *Store) DropShards(shards []proto.Shard) error {
	list, end, err := s.beginShardOp(shards)
	if err != nil {
		return err
	}
	defer end()
	s.mu.Lock()
	for _, sh := range list {
		if st := s.shards[sh].state; st == ShardOwned {
			s.mu.Unlock()
			return fmt.Errorf("%w: DropShards of %v, which is owned here: release it first", ErrShardState, sh)
		}
	}
	s.mu.Unlock()
	var dead []proto.Location
	b := s.db.NewBatch()
	defer b.Close()
	for _, sh := range list {
		if err := s.eachEntry(sh, func(_ []byte, e entry) error {
			dead = append(dead, e.loc)
			return nil
		}); err != nil {
			return err
		}
		if err := errors.Join(
			b.DeleteRange(shardLower(sh), shardUpper(sh), nil),
			b.DeleteRange(sessionShardLower(sh), sessionShardUpper(sh), nil),
			b.Delete(shardStateKey(sh), nil),
		); err != nil {
			return err
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("store: dropping %d shards: %w", len(list), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, loc := range dead {
		s.deadLocked(loc)
	}
	for _, sh := range list {
		info := &s.shards[sh]
		info.state, info.since, info.frozen, info.keys, info.live = ShardNone, 0, false, 0, 0
		s.sess.dropShard(sh)
	}
	return nil
}
