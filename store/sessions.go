// Idempotency sessions: the last write each (shard, session) applied, so that a retried commit or delete is applied once.

package store

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// A writer picks a random session and numbers its operations 1, 2, 3...
// (proto.Write), one at a time; a retry carries the same pair. The store
// keeps, per (shard, session), the last applied seq with the write's
// version and location, persisted in the same Pebble batch as the entry
// the write changed, so that a retry after a crash, a reconnection or a
// migration (Ingest carries a shard's sessions) is still recognised.
//
// The table is bounded: entries older than Options.SessionTTL, and the
// oldest beyond Options.MaxSessions, are dropped from memory and deleted
// from Pebble in a later batch. The TTL is safe because a writer retries
// one operation for seconds at most (the client's RetryTimeout, 2 s by
// default, or MoveWait, 10 s, while a shard moves) and then reports the
// failure: a retry can only arrive within that window of the first
// attempt, and ten minutes leave a margin of sixty times over for clocks,
// queues and slow networks. Dropping
// an entry early (the cap) is the unsafe direction: a retry of it would
// be applied a second time. Those evictions are counted
// (Stats.SessionsEvictedEarly): if the counter moves, raise MaxSessions.

// ErrSuperseded is returned for a commit or delete whose seq is lower
// than one its session already applied (or has in flight) to the shard:
// the writer has moved on, and this is a stale retry.
var ErrSuperseded = errors.New("store: write superseded by a later one of its session")

type sessKey struct {
	shard   proto.Shard
	session uint64
}

// session is one (shard, session)'s entry.
type session struct {
	key sessKey
	// The last applied write, when applied is set.
	applied bool
	sessionRecord
	// pending is the latest write of the session admitted and not yet
	// applied, if any.
	pending *pendingCommit
	hidx    int // in the table's heap; -1 when not in it
	// aged is the time the heap orders the entry by: its time when it was
	// pushed or last re-sorted, which lags behind a session applying again
	// (see evict).
	aged int64
}

// sessionTable is guarded by Store.mu.
type sessionTable struct {
	m      map[sessKey]*session
	byAge  sessionHeap // applied entries, by aged: oldest first
	doomed map[sessKey]struct{}
	ttl    time.Duration
	max    int
	early  uint64 // entries evicted younger than the TTL
}

func newSessionTable(ttl time.Duration, max int) sessionTable {
	return sessionTable{m: map[sessKey]*session{}, doomed: map[sessKey]struct{}{}, ttl: ttl, max: max}
}

type sessionHeap []*session

func (h sessionHeap) Len() int           { return len(h) }
func (h sessionHeap) Less(i, j int) bool { return h[i].aged < h[j].aged }
func (h sessionHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}
func (h *sessionHeap) Push(x any) {
	ss := x.(*session)
	ss.hidx = len(*h)
	*h = append(*h, ss)
}
func (h *sessionHeap) Pop() any {
	old := *h
	ss := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	ss.hidx = -1
	return ss
}

// sessionVerdict is what the table says of an incoming write.
type sessionVerdict struct {
	dup  *sessionRecord // applied before: answer with this
	wait *retryWait     // in flight: wait for it and answer with its result
}

// check judges write w to shard sh. An error wraps ErrSuperseded; a zero
// verdict means apply it.
func (t *sessionTable) check(sh proto.Shard, w proto.Write) (sessionVerdict, error) {
	ss := t.m[sessKey{sh, w.Session}]
	if ss == nil {
		return sessionVerdict{}, nil
	}
	if ss.pending != nil && ss.pending.write.Seq == w.Seq {
		return sessionVerdict{wait: ss.pending.waitLocked()}, nil
	}
	if ss.applied && ss.seq == w.Seq {
		r := ss.sessionRecord
		return sessionVerdict{dup: &r}, nil
	}
	top := uint64(0)
	if ss.applied {
		top = ss.seq
	}
	if ss.pending != nil {
		top = max(top, ss.pending.write.Seq)
	}
	if w.Seq < top {
		return sessionVerdict{}, fmt.Errorf("%w: session %#x seq %d in %v: seq %d was already applied or is in flight", ErrSuperseded, w.Session, w.Seq, sh, top)
	}
	return sessionVerdict{}, nil
}

// begin records c as its session's write in flight.
func (t *sessionTable) begin(c *pendingCommit) {
	k := sessKey{c.shard, c.write.Session}
	ss := t.m[k]
	if ss == nil {
		ss = &session{key: k, hidx: -1}
		t.m[k] = ss
	}
	ss.pending = c
}

// finish records the outcome of c, which began: applied at time now, or
// not (failed).
func (t *sessionTable) finish(c *pendingCommit, applied bool, now int64) {
	k := sessKey{c.shard, c.write.Session}
	ss := t.m[k]
	if ss == nil { // evicted meanwhile and the pending write with it: impossible, see evict
		return
	}
	if ss.pending == c {
		ss.pending = nil
	}
	if applied && (!ss.applied || c.write.Seq >= ss.seq) {
		t.set(ss, c.sessionRecord(now))
	}
	if !ss.applied && ss.pending == nil {
		delete(t.m, k)
	}
}

// set makes r ss's applied write. An entry already in the heap keeps its
// place when its time moves on (its session applied again): re-sorting it
// at every commit would cost a heap.Fix each, and evict catches up with
// it if it ever reaches the top. Only a time moved back (upsert) re-sorts
// it now, so that aged never passes time.
func (t *sessionTable) set(ss *session, r sessionRecord) {
	ss.sessionRecord, ss.applied = r, true
	switch {
	case ss.hidx < 0:
		ss.aged = r.time
		heap.Push(&t.byAge, ss)
	case r.time < ss.aged:
		ss.aged = r.time
		heap.Fix(&t.byAge, ss.hidx)
	}
	delete(t.doomed, ss.key)
}

// upsert takes an entry another server applied (Ingest, or Open): kept
// unless the table has a higher seq for the session.
func (t *sessionTable) upsert(k sessKey, r sessionRecord) {
	ss := t.m[k]
	if ss == nil {
		ss = &session{key: k, hidx: -1}
		t.m[k] = ss
	}
	if ss.applied && ss.seq > r.seq {
		return
	}
	t.set(ss, r)
}

// evict drops entries past the TTL and the oldest beyond the cap; their
// keys wait in doomed for a batch to delete them from Pebble. No entry's
// aged is later than its time (set), so the top of the heap bounds every
// entry's age: when it is young enough, all are. A top whose session
// applied again since is first put back in its place.
func (t *sessionTable) evict(now time.Time) {
	cutoff := now.Add(-t.ttl).UnixNano()
	for t.byAge.Len() > 0 {
		ss := t.byAge[0]
		over := t.byAge.Len() > t.max
		if ss.aged >= cutoff && !over {
			return
		}
		if ss.aged != ss.time {
			ss.aged = ss.time
			heap.Fix(&t.byAge, 0)
			continue
		}
		if ss.time >= cutoff {
			t.early++ // for the cap, younger than the TTL
		}
		heap.Pop(&t.byAge)
		ss.applied = false
		t.doomed[ss.key] = struct{}{}
		if ss.pending == nil {
			delete(t.m, ss.key)
		}
	}
}

// takeDoomed returns the evicted entries not re-created since, for a
// batch that is about to be committed, and forgets them; a batch that
// fails hands them back (undoom).
func (t *sessionTable) takeDoomed() []sessKey {
	if len(t.doomed) == 0 {
		return nil
	}
	out := make([]sessKey, 0, len(t.doomed))
	for k := range t.doomed {
		if ss := t.m[k]; ss == nil || !ss.applied && ss.pending == nil {
			out = append(out, k)
		}
		delete(t.doomed, k)
	}
	return out
}

// undoom gives back entries takeDoomed returned, whose deletion failed.
func (t *sessionTable) undoom(keys []sessKey) {
	for _, k := range keys {
		t.doomed[k] = struct{}{}
	}
}

// unresolved returns the shard's applied entries of a put whose location
// is unknown (ingested), by version.
func (t *sessionTable) unresolved(sh proto.Shard) map[uint64]*session {
	out := map[uint64]*session{}
	for k, ss := range t.m {
		if k.shard == sh && ss.applied && ss.version != 0 && ss.loc.Length == 0 {
			out[ss.version] = ss
		}
	}
	return out
}

func (t *sessionTable) dropShard(sh proto.Shard) {
	for k, ss := range t.m {
		if k.shard != sh {
			continue
		}
		if ss.hidx >= 0 {
			heap.Remove(&t.byAge, ss.hidx)
		}
		delete(t.m, k)
		delete(t.doomed, k)
	}
}

func (t *sessionTable) list(sh proto.Shard) []proto.SessionEntry {
	var out []proto.SessionEntry
	for k, ss := range t.m {
		if k.shard == sh && ss.applied {
			out = append(out, proto.SessionEntry{Session: k.session, Seq: ss.seq, Version: ss.version, Time: ss.time})
		}
	}
	slices.SortFunc(out, func(a, b proto.SessionEntry) int {
		switch {
		case a.Session < b.Session:
			return -1
		case a.Session > b.Session:
			return 1
		}
		return 0
	})
	return out
}

// ShardSessions returns the idempotency sessions the store holds for
// shard sh (any state), by session: what a migration carries to the
// shard's next owner.
func (s *Store) ShardSessions(sh proto.Shard) []proto.SessionEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess.list(sh)
}

// loadSessions reads the session table at Open; entries past the TTL are
// deleted by the first batch.
func (s *Store) loadSessions() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: sessionPrefix, UpperBound: sessionEnd})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		sh, session, err := decodeSessionKey(it.Key())
		if err != nil {
			return err
		}
		r, err := decodeSessionRecord(it.Value())
		if err != nil {
			return fmt.Errorf("store: session %#x of %v: %w", session, sh, err)
		}
		s.sess.upsert(sessKey{sh, session}, r)
	}
	if err := it.Error(); err != nil {
		return err
	}
	s.sess.evict(time.Now())
	return nil
}

// deleteDoomedSessions evicts what is due and has the evicted sessions'
// entries deleted from Pebble, by a flush of the index log: their sets
// reach Pebble through it, so their deletes must too, in order (the
// commit loop, as the writer, calls it on its expiry tick). A replay
// after a crash may set some again; the next start evicts them by their
// time.
func (s *Store) deleteDoomedSessions() {
	s.mu.Lock()
	s.sess.evict(time.Now())
	due := len(s.sess.doomed) > 0
	s.mu.Unlock()
	if !due {
		return
	}
	if err := s.flushPending(); err != nil {
		s.log.Error("deleting expired sessions", "err", err)
	}
}
