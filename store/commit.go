// Commit: verify a record written into a lease, make it durable, index it, retire its predecessor.

package store

import (
	"context"
	"fmt"
	"sync"
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

// pendingCommit is one write on its way through the writer, or an Ingest
// or cleaner batch. A commit's or delete's is pooled (newPending,
// recycle): a PUT's path on the server allocates nothing of its own.
type pendingCommit struct {
	key    []byte // a copy: keyBuf's when the key fits it
	keyBuf [shortKey]byte
	shard  proto.Shard
	write  proto.Write
	delete bool
	entry  entry
	arena  *arena // where the record lies; nil for a delete
	rec    []byte // the verified record, to journal (durable policies only): recBuf's when pooled
	recBuf []byte
	result error
	// done takes one token when the writer is through with the commit
	// (signal); its owner alone takes it (await). A retry of the same
	// write waits on a retryWait of its own instead (retries).
	done chan struct{}
	// Set by the owner: queued, the commit was handed to the writer;
	// awaited, the owner took done's token since. A commit queued and
	// not awaited (its owner's ctx ended first) is left to the garbage
	// collector: the writer may still signal it.
	queued, awaited bool
	// retries wait for this write's outcome: its session's retries that
	// came while it was in flight. Guarded by Store.mu.
	retries []*retryWait
	// job is set for an Ingest call's batch instead of a commit, reloc
	// for a batch of the cleaner's.
	job   *ingestJob
	reloc *relocateJob
	// replica: an ApplyReplica or DeleteReplica, to a backup shard (not
	// indexed, its records in state RecordBackup); old is the key's entry
	// before it, read by the writer (had: there was one).
	replica bool
	old     entry
	had     bool
	// logSeq is the seq of its index log entry (SyncNone).
	logSeq uint64
}

// shortKey is the room a pending commit has for its key's copy: a key no
// longer than that costs its commit no allocation of its own.
const shortKey = 32

// keptRecord is the largest record copy (journaled) a pooled pending
// commit keeps for its next use; a larger one goes with the commit.
const keptRecord = 64 << 10

var pendingPool = sync.Pool{New: func() any { return &pendingCommit{done: make(chan struct{}, 1)} }}

// newPending returns a pending commit or delete of key, which it copies:
// a commit's key lies in a lease the client can still write to. Its owner
// hands it back with recycle.
func newPending(key []byte, w proto.Write, replica bool) *pendingCommit {
	return pendingPool.Get().(*pendingCommit).init(key, w, replica)
}

// init makes c, fresh from the pool, a write of key.
func (c *pendingCommit) init(key []byte, w proto.Write, replica bool) *pendingCommit {
	c.shard, c.write, c.replica = proto.ShardOf(key), w, replica
	if len(key) <= len(c.keyBuf) {
		c.key = append(c.keyBuf[:0], key...)
	} else {
		c.key = append([]byte(nil), key...)
	}
	return c
}

// newJob returns the pending item of an Ingest or cleaner batch: not
// pooled, and signalled like a commit.
func newJob(sh proto.Shard, job *ingestJob, reloc *relocateJob) *pendingCommit {
	return &pendingCommit{shard: sh, job: job, reloc: reloc, done: make(chan struct{}, 1)}
}

// recycle hands c, a commit or delete from newPending, back to the pool
// once nothing refers to it: its owner is done with it, and the writer
// too, unless it was never queued or the owner took its token. Retries
// read their outcome from a retryWait, never from c.
func recycle(c *pendingCommit) {
	if c == nil || c.queued && !c.awaited || len(c.done) != 0 {
		return
	}
	rec := c.recBuf
	if cap(rec) > keptRecord {
		rec = nil
	}
	*c = pendingCommit{done: c.done, recBuf: rec[:0]}
	pendingPool.Put(c)
}

// signal tells c's owner that the writer is through with c: the writer's
// last touch of it.
func (c *pendingCommit) signal() { c.done <- struct{}{} }

// retryWait is what a retry of a write in flight waits on: the first
// attempt's outcome, filled in and closed when it finishes
// (finishLocked). The attempt itself goes back to the pool with its
// owner, so the retry reads nothing of it afterwards.
type retryWait struct {
	done    chan struct{}
	version uint64 // the attempt's record version (0 for a delete), known when it was admitted
	result  error
	delete  bool
	entry   entry
}

// waitLocked returns a retryWait for c's outcome. The caller holds
// Store.mu, as finishLocked does.
func (c *pendingCommit) waitLocked() *retryWait {
	w := &retryWait{done: make(chan struct{}), version: c.entry.version}
	c.retries = append(c.retries, w)
	return w
}

// Commit commits the record a client wrote at offset off of lease id's
// region, length bytes long (its RecordSize). It returns once the record is
// durable under the sync policy and visible to readers.
//
// The record's key must be of a shard the store owns, else the commit
// fails with ErrNotOwner; of a frozen shard, with ErrShardMoving.
//
// w makes the commit idempotent (w.Session 0: no idempotency). The store
// keeps the last write each (shard, session) applied, persisted with the
// write itself (see sessions.go). For a commit whose (Session, Seq) is
//
//   - the last applied: nothing is applied again; the first result is
//     returned: Committed{Version, Location} while that version is still
//     the key's current record here, else the Version with a zero
//     Location (Length 0: superseded since, or moved here by a
//     migration). The retry may come through the same lease offset or a
//     new record in another lease (only its key is read).
//   - one in flight (queued, not yet applied): Commit waits for it and
//     returns its result.
//   - lower than one applied or in flight in the key's shard: an error
//     wrapping ErrSuperseded. (Entries are kept per shard, so that they
//     move with it: a seq is compared with the session's writes to the
//     same shard only, which is where a retry of it would go.)
//   - higher (or unknown): applied.
//
// A retry is only recognised within Options.SessionTTL of the first
// attempt, which is far longer than a writer retries.
func (s *Store) Commit(ctx context.Context, id uint64, off, length int64, w proto.Write) (Committed, error) {
	return s.commit(ctx, id, off, length, w, 0, nil)
}

// commit is Commit, CommitForwarded with f, or ApplyReplica when version
// is not 0.
func (s *Store) commit(ctx context.Context, id uint64, off, length int64, w proto.Write, version uint64, f Forwarder) (Committed, error) {
	c, v, err := s.prepareCommit(id, off, length, w, version)
	if err != nil {
		s.stats.commitsRejected.Add(1)
		return Committed{}, err
	}
	defer recycle(c)
	return s.completeCommit(ctx, c, v, f)
}

// completeCommit answers an admitted commit c's retry from its session,
// or forwards it if f says so and applies it.
func (s *Store) completeCommit(ctx context.Context, c *pendingCommit, v sessionVerdict, f Forwarder) (Committed, error) {
	if v.dup != nil || v.wait != nil {
		return s.answer(ctx, c.key, v) // a forwarded first attempt was forwarded before it applied
	}
	if err := s.forward(ctx, c, f); err != nil {
		return Committed{}, err
	}
	return Committed{Location: c.entry.loc, Version: c.entry.version}, nil
}

// answer answers a retry from its session's entry, or waits for the write
// in flight.
func (s *Store) answer(ctx context.Context, key []byte, v sessionVerdict) (Committed, error) {
	if w := v.wait; w != nil {
		select {
		case <-w.done:
		case <-ctx.Done():
			return Committed{}, ctx.Err()
		}
		s.stats.duplicates.Add(1)
		if w.result != nil || w.delete {
			return Committed{}, w.result
		}
		return Committed{Location: w.entry.loc, Version: w.entry.version}, nil
	}
	s.stats.duplicates.Add(1)
	out := Committed{Version: v.dup.version}
	if v.dup.loc.Length != 0 {
		if loc, ok, err := s.index.Get(key); err == nil && ok && loc == v.dup.loc {
			out.Location = loc
		}
	}
	return out, nil
}

// prepareCommit checks and admits a commit; replica, when not 0, makes it
// an ApplyReplica of that version.
func (s *Store) prepareCommit(id uint64, off, length int64, w proto.Write, replica uint64) (_ *pendingCommit, _ sessionVerdict, err error) {
	var none sessionVerdict
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, none, ErrClosed
	}
	if err := s.brokenErr(); err != nil {
		return nil, none, err
	}
	l, err := s.liveLeaseLocked(id)
	if err != nil {
		return nil, none, err
	}
	if off < 0 || length < proto.RecordHeaderSize || off > l.Size || length > l.Size-off {
		return nil, none, fmt.Errorf("%w: commit of %d bytes at %d in lease %d: outside [%d, %d)", ErrLease, length, off, id, l.next, l.Size)
	}
	a := l.region.arena()
	at := l.region.off + off
	rec := a.mem.Bytes()[at : at+length]
	state := recordState(rec)
	c := pendingPool.Get().(*pendingCommit)
	defer func() {
		if err != nil {
			recycle(c) // never admitted
		}
	}()
	if s.journaled() {
		// Verify and journal one snapshot: the client can still write to
		// its lease. The journal holds it as committed: live.
		c.recBuf = append(c.recBuf[:0], rec...)
		rec = c.recBuf
		putState(rec, proto.RecordLive)
	}
	r, err := proto.ParseRecord(rec)
	switch {
	case err != nil:
		return nil, none, fmt.Errorf("%w: lease %d offset %d: %w", ErrRecord, id, off, err)
	case int64(proto.RecordSize(r.KeyLen, r.ValueLen)) != length:
		return nil, none, fmt.Errorf("%w: record of key %d and value %d bytes takes %d bytes, commit says %d", ErrRecord, r.KeyLen, r.ValueLen, proto.RecordSize(r.KeyLen, r.ValueLen), length)
	case r.KeyLen > s.opts.MaxKeyLen || r.ValueLen > s.opts.MaxValueLen:
		return nil, none, fmt.Errorf("%w: key %d bytes (max %d), value %d bytes (max %d)", ErrRecord, r.KeyLen, s.opts.MaxKeyLen, r.ValueLen, s.opts.MaxValueLen)
	case r.Tombstone():
		return nil, none, fmt.Errorf("%w: deletes are committed with Delete, not as records", ErrRecord)
	}
	c.init(r.Key, w, replica != 0)
	if v, err := s.admissibleLocked(c, replica); err != nil {
		return nil, none, err
	} else if v.dup != nil || v.wait != nil {
		return c, v, nil
	}
	switch {
	case off < l.next:
		return nil, none, fmt.Errorf("%w: commit of %d bytes at %d in lease %d: outside [%d, %d)", ErrLease, length, off, id, l.next, l.Size)
	case state != proto.RecordPending:
		// Not a retry of an applied write, so a first attempt: a record
		// that is live or dead here was committed before.
		return nil, none, fmt.Errorf("%w: lease %d offset %d: state word %d: a record is written pending (%d); is the client older than the server?",
			ErrRecord, id, off, state, proto.RecordPending)
	case replica != 0 && r.Version != replica:
		return nil, none, fmt.Errorf("%w: the record in lease %d at %d has version %d, its primary applied version %d", ErrRecord, id, off, r.Version, replica)
	case replica == 0 && (r.Version < l.nextVersion || r.Version >= l.VersionBase+l.VersionCount):
		return nil, none, fmt.Errorf("%w: version %d outside the lease's remaining range [%d, %d)", ErrRecord, r.Version, l.nextVersion, l.VersionBase+l.VersionCount)
	}
	if gap := off - l.next; gap > 0 { // skipped by the client
		s.wasteLocked(proto.Location{Arena: a.id, Offset: uint64(l.region.off + l.next), Length: uint32(gap)})
	}
	l.next = off + length
	if replica == 0 {
		l.nextVersion = r.Version + 1
	} else {
		// The primary's versions: this store's leases go on above them,
		// so that after a promotion its versions keep growing.
		s.nextVersion = max(s.nextVersion, r.Version+1)
	}
	c.entry = entry{loc: proto.Location{Arena: a.id, Offset: uint64(at), Length: uint32(length)}, version: r.Version}
	c.arena = a
	if s.journaled() {
		c.rec = rec
	}
	s.admitLocked(c)
	s.holdLocked(c.entry.loc)
	return c, none, nil
}

// admissibleLocked checks that c's shard takes writes and judges it by its
// session: an error, a retry to answer, or a zero verdict (admit it).
// replica is the version a backup's primary applies c at (0 for a
// delete, and for anything but a backup's write).
func (s *Store) admissibleLocked(c *pendingCommit, replica uint64) (sessionVerdict, error) {
	info := &s.shards[c.shard]
	switch {
	case c.replica && info.state != ShardBackup:
		return sessionVerdict{}, fmt.Errorf("%w: a replica's write to %v, which is %v on this server, not a backup", ErrNotBackup, c.shard, info.state)
	case !c.replica && info.state != ShardOwned:
		return sessionVerdict{}, fmt.Errorf("%w: %v is %v on this server", ErrNotOwner, c.shard, info.state)
	}
	if c.write.Session != 0 {
		// A retry of a write already applied is answered even while the
		// shard is frozen: it changes nothing.
		v, err := s.sess.check(c.shard, c.write)
		if err == nil && c.replica {
			v, err = mirrorPrimary(c, v, replica)
		}
		if err != nil || v.dup != nil || v.wait != nil {
			return v, err
		}
	}
	if info.frozen || info.moving {
		return sessionVerdict{}, fmt.Errorf("%w: %v is frozen for a migration; retry in a moment", ErrShardMoving, c.shard)
	}
	return sessionVerdict{}, nil
}

// mirrorPrimary judges a backup's retry of a write by what its primary
// applies: the record of version, or a delete. An attempt of the same
// write that this backup applied under another record (its forward failed
// at another backup, so the primary applied nothing, and the client wrote
// the record again) is replaced, not answered: answered, it would leave
// this backup at the old record while the primary and the others go on at
// the new one, and a write of another session applied between the two
// attempts would stay here in the key's place. For the same reason a
// delete applied before is applied again: deleting twice changes nothing
// else, as the primary's turn for the key keeps other writes of it from
// coming between a forward and its resend.
func mirrorPrimary(c *pendingCommit, v sessionVerdict, version uint64) (sessionVerdict, error) {
	switch {
	case v.dup != nil && (c.delete || v.dup.version != version):
		return sessionVerdict{}, nil
	case v.wait != nil && !c.delete && v.wait.version != version:
		return sessionVerdict{}, fmt.Errorf("%w: session %#x seq %d in %v: an earlier attempt at version %d is being applied here; retry",
			ErrShardMoving, c.write.Session, c.write.Seq, c.shard, v.wait.version)
	}
	return v, nil
}

// admitLocked counts c in its shard (FreezeShards waits for it), in its
// session, and in the store (Close waits for it).
func (s *Store) admitLocked(c *pendingCommit) {
	s.shards[c.shard].admit()
	if c.write.Session != 0 {
		s.sess.begin(c)
	}
	s.inflight.Add(1)
}

// finishLocked undoes admitLocked once c is applied or failed (c.result
// says which), and answers the retries waiting for it; the caller then
// signals c, if it was queued, and calls s.inflight.Done.
func (s *Store) finishLocked(c *pendingCommit, applied bool, now int64) {
	s.shards[c.shard].applied()
	if c.write.Session != 0 {
		s.sess.finish(c, applied, now)
	}
	for _, w := range c.retries {
		w.result, w.delete, w.entry = c.result, c.delete, c.entry
		close(w.done)
	}
	clear(c.retries)
	c.retries = c.retries[:0]
}

// Delete removes key. Deleting an absent key is not an error. The key's
// shard must be owned (else ErrNotOwner) and not frozen (ErrShardMoving);
// w makes it idempotent as for Commit (a retry of an applied delete
// returns nil).
func (s *Store) Delete(ctx context.Context, key []byte, w proto.Write) error {
	return s.delete(ctx, key, w, false, nil)
}

// delete is Delete, DeleteForwarded with f, or DeleteReplica.
func (s *Store) delete(ctx context.Context, key []byte, w proto.Write, replica bool, f Forwarder) error {
	c, v, err := s.prepareDelete(key, w, replica)
	defer recycle(c)
	switch {
	case err != nil:
		return err
	case v.dup != nil || v.wait != nil:
		_, err := s.answer(ctx, c.key, v)
		return err
	}
	return s.forward(ctx, c, f)
}

// prepareDelete checks and admits a delete of key, as prepareCommit does a
// commit.
func (s *Store) prepareDelete(key []byte, w proto.Write, replica bool) (*pendingCommit, sessionVerdict, error) {
	if len(key) == 0 || len(key) > s.opts.MaxKeyLen {
		return nil, sessionVerdict{}, fmt.Errorf("%w: key of %d bytes (1 to %d)", ErrRecord, len(key), s.opts.MaxKeyLen)
	}
	c := newPending(key, w, replica)
	c.delete = true
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, sessionVerdict{}, ErrClosed
	}
	if err := s.brokenErr(); err != nil {
		return nil, sessionVerdict{}, err
	}
	v, err := s.admissibleLocked(c, 0)
	if err != nil {
		recycle(c)
		return nil, sessionVerdict{}, err
	}
	if v.dup == nil && v.wait == nil {
		s.admitLocked(c)
	}
	return c, v, nil
}

// abandon undoes the admission of c, which will not be queued: it failed
// with err, which is what a retry waiting for it is told.
func (s *Store) abandon(c *pendingCommit, err error) {
	s.mu.Lock()
	c.result = err
	s.finishLocked(c, false, 0)
	if c.arena != nil {
		s.settleLocked(c.entry.loc, false) // never committed
	}
	s.mu.Unlock()
	s.inflight.Done()
}

// submit queues admitted c, has it applied (lead) and waits for it. Once
// queued the write happens; ctx only stops the wait for it.
func (s *Store) submit(ctx context.Context, c *pendingCommit) error {
	s.committers.Add(1)
	defer s.committers.Add(-1)
	s.enqueue(c)
	s.lead(c)
	return s.await(ctx, c)
}

// enqueue queues admitted c (or an Ingest or relocation batch) for the
// writer, which signals it once through with it.
func (s *Store) enqueue(c *pendingCommit) {
	c.queued = true
	s.qmu.Lock()
	s.queue = append(s.queue, c)
	s.qmu.Unlock()
}

// lead has queued c applied. When the caller is the only committer and no
// one is applying, it applies the queue itself, until c is applied: a
// commit to an idle store so goes from its committer to Pebble and back
// without waking the commit loop and being woken by it (two wake-ups a
// commit, and across processes a thread's wake-up each). Otherwise the
// commit loop applies it, in a batch with the others: when committers
// contend, they queue for the loop in turn, rather than the one that just
// applied finding the writer free again before the others it woke ran,
// and applying alone (each of 16 goroutines committing in a loop then
// got the writer for bursts, and the batches that share a sync shrank).
func (s *Store) lead(c *pendingCommit) {
	if s.committers.Load() == 1 && s.writer.TryLock() {
		for !c.finished() {
			s.applyQueued()
		}
		s.release()
		return
	}
	s.kickLoop()
}

// release ends the caller's turn as the writer, and kicks the commit loop
// if anything queued meanwhile.
func (s *Store) release() {
	s.writer.Unlock()
	if s.queued() > 0 {
		s.kickLoop()
	}
}

// kickLoop tells the commit loop that something is queued.
func (s *Store) kickLoop() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Store) queued() int {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return len(s.queue)
}

// maxApplyBatch bounds the commits one Pebble batch takes.
const maxApplyBatch = 256

// applyQueued applies what is queued now (up to maxApplyBatch), in queue
// order. The caller holds writer.
func (s *Store) applyQueued() {
	s.qmu.Lock()
	n := min(len(s.queue), maxApplyBatch)
	batch := append(s.applying[:0], s.queue[:n]...)
	rest := copy(s.queue, s.queue[n:])
	clear(s.queue[rest:])
	s.queue = s.queue[:rest]
	s.qmu.Unlock()
	if len(batch) > 0 {
		s.applyAll(batch)
	}
	clear(batch)
	s.applying = batch[:0]
}

// await waits for queued c. Once queued the commit happens; ctx only
// stops the wait for it.
func (s *Store) await(ctx context.Context, c *pendingCommit) error {
	select {
	case <-c.done:
		c.awaited = true
		return c.result
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finished reports whether the writer signalled c (applied or failed it),
// leaving the token for await.
func (c *pendingCommit) finished() bool { return len(c.done) > 0 }

// commitLoop applies what committers leave queued (lead): everything that
// queued while a writer was applying, in batches, one sync and one Pebble
// write each (under SyncNone, one append to the index log). It also expires leases and sessions, as the writer.
func (s *Store) commitLoop() {
	defer s.wg.Done()
	expiry := time.NewTicker(min(s.opts.LeaseTTL/4, time.Second))
	defer expiry.Stop()
	for {
		select {
		case <-s.kick:
			s.drain()
		case now := <-expiry.C:
			s.writer.Lock()
			s.expireLeases(now)
			s.deleteDoomedSessions()
			s.release()
		case <-s.stop:
			s.drain() // Close waited for every admitted commit: normally none is left
			return
		}
	}
}

// drain applies the queue until it is empty.
func (s *Store) drain() {
	for s.queued() > 0 {
		s.writer.Lock()
		s.applyQueued()
		s.writer.Unlock()
	}
}

// applyAll applies a run of queued items: commits together, each Ingest
// or relocation batch on its own, in queue order.
func (s *Store) applyAll(batch []*pendingCommit) {
	from := 0
	for i, c := range batch {
		if c.job == nil && c.reloc == nil {
			continue
		}
		if i > from {
			s.apply(batch[from:i])
		}
		if c.job != nil {
			s.applyIngest(c)
		} else {
			s.applyRelocate(c)
		}
		from = i + 1
	}
	if from < len(batch) {
		s.apply(batch[from:])
	}
}

// apply applies a run of commits, in parts of at most a quarter of the
// index log, so that each part finds room in it (minLogLeases).
func (s *Store) apply(batch []*pendingCommit) {
	limit, from, size := int(s.ilog.size()/4), 0, 0
	for i, c := range batch {
		n := c.logSize() + logEntrySize(0)
		if i > from && size+n > limit {
			s.applyPart(batch[from:i])
			from, size = i, 0
		}
		size += n
	}
	s.applyPart(batch[from:])
}

// applyPart applies a run of commits: their entries appended to the
// index log (and synced under SyncAlways), then published.
func (s *Store) applyPart(batch []*pendingCommit) {
	start := time.Now()
	now := start.UnixNano()
	finish := func() {
		s.mu.Lock()
		for _, c := range batch {
			s.finishLocked(c, c.result == nil, now)
			if c.result != nil && c.arena != nil {
				s.settleLocked(c.entry.loc, false) // its bytes will never be read
			}
		}
		s.sess.evict(time.Now())
		s.mu.Unlock()
		for _, c := range batch {
			c.signal()
			s.inflight.Done()
		}
		if s.opts.Sync == SyncAlways {
			s.ilog.calls.yieldBeforeSync()
		}
	}
	fail := func(err error) {
		for _, c := range batch {
			c.result = err
		}
		finish()
	}
	// Refuse new keys the index could not take back at the next start,
	// unless it grows in time: writers then wait for the copy rather
	// than fail.
	load := s.index.LoadFactor()
	s.maybeGrowIndex(load)
	for load >= MaxIndexLoad && s.waitIndexGrown(indexFullWait) {
		load = s.index.LoadFactor()
	}
	for _, c := range batch {
		if c.delete || load < MaxIndexLoad {
			continue
		}
		if _, exists, _ := s.index.Get(c.key); !exists {
			c.result = fmt.Errorf("%w: load %.2f reached the limit %.2f with %d keys; %s",
				ErrIndexFull, load, MaxIndexLoad, s.index.Len(), s.indexHint())
		}
	}
	if err := s.logBatch(batch, now); err != nil {
		fail(err)
		return
	}
	synced := time.Since(start)
	voided := false
	for _, c := range batch {
		if c.result == nil {
			c.result = s.publish(c)
			voided = voided || c.result != nil
		}
	}
	if voided {
		// A failed commit's entry must not come back after a crash: its
		// void goes where the entry went.
		_ = s.logWritten()
	}
	s.mu.Lock()
	s.logPublishedLocked(batch)
	s.mu.Unlock()
	finish()
	s.stats.observeBatch(len(batch), synced)
}

// readOld reads, for a backup's write, the entry it replaces: a backup's
// keys are not indexed. (A primary sends a key's next write only once this
// one is applied, so no two of a key share a batch.)
func (s *Store) readOld(c *pendingCommit) (err error) {
	if c.replica && c.result == nil {
		c.old, c.had, err = s.entryOf(c.shard, c.key)
	}
	return err
}

// logBatch appends the batch's entries to the index log, hands them to
// the kernel and, under SyncAlways, makes them durable.
func (s *Store) logBatch(batch []*pendingCommit, now int64) error {
	for _, c := range batch {
		if err := s.readOld(c); err != nil {
			return err
		}
	}
	if s.testHookApply != nil {
		s.testHookApply()
	}
	if err := s.brokenErr(); err != nil {
		return err
	}
	if err := s.logCommits(batch, now); err != nil {
		return err
	}
	return s.logWritten()
}

// sessionRecord is what c's session entry says once c is applied.
func (c *pendingCommit) sessionRecord(now int64) sessionRecord {
	r := sessionRecord{seq: c.write.Seq, time: now}
	if !c.delete {
		r.version, r.loc = c.entry.version, c.entry.loc
	}
	return r
}

// commitBatch commits b under the sync policy. Under SyncNone, Pebble's
// sync of the WAL only writes it out (flushOnlyWAL): the commit must reach
// the kernel before it is acknowledged.
func (s *Store) commitBatch(b *pebble.Batch) error {
	opts := pebble.Sync
	if s.opts.Sync == SyncBatch {
		opts = pebble.NoSync
	}
	if err := b.Commit(opts); err != nil {
		return fmt.Errorf("store: writing the index: %w", err)
	}
	// Pebble reports some failures of a commit only to its logger.
	return s.brokenErr()
}

// journalWritten records that journal entries below seq are committed,
// journaled bytes more of them, and asks for a checkpoint when due.
func (s *Store) journalWritten(seq uint64, journaled int64) {
	s.journalNext.Store(seq)
	if s.journalBytes.Add(journaled) >= s.opts.CheckpointBytes {
		select {
		case s.journalFull <- struct{}{}:
		default:
		}
	}
}

// publish makes a durable commit's record live, points the hash index at
// it and retires the record it replaces.
func (s *Store) publish(c *pendingCommit) error {
	var old proto.Location
	var had bool
	var err error
	if c.rec != nil {
		c.arena.restore(c.entry.loc.Offset, c.rec) // the durable policies': a checkpoint writes it back
	}
	if c.replica {
		if !c.delete {
			c.arena.setState(c.entry.loc.Offset, proto.RecordBackup)
		}
		old, had = c.old.loc, c.had
	} else if c.delete {
		old, had, err = s.index.Delete(c.key)
	} else {
		c.arena.setState(c.entry.loc.Offset, proto.RecordLive)
		if old, had, err = s.index.Put(c.key, c.entry.loc); err != nil {
			c.arena.setState(c.entry.loc.Offset, proto.RecordDead)
		}
	}
	if err != nil {
		s.logVoided(c)
		return err
	}
	s.mu.Lock()
	info := &s.shards[c.shard]
	if had {
		s.arena(old.Arena).markDead(old.Offset)
		s.deadLocked(old)
		info.live -= int64(old.Length)
	}
	switch {
	case !c.delete:
		s.settleLocked(c.entry.loc, true)
		info.live += int64(c.entry.loc.Length)
		if !had {
			info.keys++
		}
	case had:
		info.keys--
	}
	s.mu.Unlock()
	switch {
	case c.replica: // Keys counts the indexed keys
	case c.delete && had:
		s.stats.keys.Add(-1)
	case !c.delete && !had:
		s.stats.keys.Add(1)
	}
	if c.delete {
		s.stats.deletes.Add(1)
	} else {
		s.stats.commits.Add(1)
		s.stats.committedBytes.Add(uint64(c.entry.loc.Length))
	}
	return nil
}

// syncLoop is SyncBatch's background sync: every window, the index log,
// and with it the commits' records, and Pebble's WAL (the cleaner's and
// Ingest's) reach the disk.
func (s *Store) syncLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.SyncWindow)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := s.ilog.syncWritten(); err != nil { // each batch was written out
				s.breakOn(err)
			}
			if err := s.db.LogData(nil, pebble.Sync); err != nil {
				s.log.Error("syncing the Pebble WAL", "err", err)
			}
		case <-s.stop:
			return
		}
	}
}
