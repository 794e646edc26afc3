// Forwarding: a primary's commits and deletes go to the shard's backups before the store applies them, one at a time per key.

package store

import (
	"context"
	"sync"

	"github.com/rkv-io/rkv/proto"
)

// Forwarder sends a primary's admitted writes to the backups of their
// shard (docs/ARCHITECTURE.md, "Replication").
type Forwarder interface {
	// Forwards reports whether writes to shard sh go through Forward
	// first: to the shard's backups, or to be refused there (its error is
	// the write's), as when the caller's map no longer makes this store
	// the shard's primary. It is called for every write given a
	// Forwarder, concurrently, and must not block.
	Forwards(sh proto.Shard) bool
	// Forward sends w to every backup of its shard and returns once each
	// applied it, or with the error that stopped one. A key's writes are
	// forwarded one at a time, in the order the store then applies them
	// here: the next is forwarded only once this one is applied (or
	// failed). Forward may block; it is called concurrently for different
	// keys. w.Key is the store's: read it only during the call.
	Forward(ctx context.Context, w Forwarded) error
}

// Forwarded is a write a Forwarder sends on.
type Forwarded struct {
	Shard proto.Shard
	Key   []byte
	// Version is the record's, which the backups apply it at; 0 for a
	// delete.
	Version uint64
	Delete  bool
}

// CommitForwarded is Commit for a primary whose shard may have backups:
// when f says so, the admitted commit is forwarded (f.Forward) before it is
// applied here, and fails if the forward does.
func (s *Store) CommitForwarded(ctx context.Context, id uint64, off, length int64, w proto.Write, f Forwarder) (Committed, error) {
	return s.commit(ctx, id, off, length, w, 0, f)
}

// BatchCommit is one record of a CommitBatch: Length bytes at Off of lease
// Lease, committed under Write and forwarded through Forwarder (nil: not
// forwarded), as CommitForwarded would. CommitBatch sets Result and Err to
// what CommitForwarded would have returned.
type BatchCommit struct {
	Lease       uint64
	Off, Length int64
	Write       proto.Write
	Forwarder   Forwarder

	Result Committed
	Err    error

	queued *pendingCommit // applied by the batch's group commit
}

// CommitBatch commits the records of batch, of any leases, as
// CommitForwarded commits each, all at once: they are admitted in the
// order given (a lease's records are committed in the order of their
// offsets, so give each lease's so), then forwarded and applied together,
// so that one group commit (one sync) takes them. Each succeeds or fails
// on its own, in its Result and Err. A batch whose records are neither
// forwarded nor retries allocates nothing.
func (s *Store) CommitBatch(ctx context.Context, batch []BatchCommit) {
	var last *pendingCommit
	var each *sync.WaitGroup // the records completed on goroutines of their own
	s.committers.Add(1)
	defer s.committers.Add(-1)
	for i := range batch {
		b := &batch[i]
		b.Result, b.Err, b.queued = Committed{}, nil, nil
		c, v, err := s.prepareCommit(b.Lease, b.Off, b.Length, b.Write, 0)
		switch {
		case err != nil:
			s.stats.commitsRejected.Add(1)
			b.Err = err
		case v.dup != nil || v.wait != nil || b.Forwarder != nil && b.Forwarder.Forwards(c.shard):
			// Answered from its session, or forwarded first: each waits
			// on a goroutine of its own.
			if each == nil {
				each = new(sync.WaitGroup)
			}
			s.completeAside(ctx, b, c, v, each)
		default:
			// Straight to the queue, whose writer takes what is queued
			// together; applied and waited for below.
			s.enqueue(c)
			b.queued, last = c, c
		}
	}
	if last != nil {
		s.lead(last) // everything queued before it too
	}
	for i := range batch {
		b := &batch[i]
		c := b.queued
		if c == nil {
			continue
		}
		if b.Err = s.await(ctx, c); b.Err == nil {
			b.Result = Committed{Location: c.entry.loc, Version: c.entry.version}
		}
		b.queued = nil
		recycle(c)
	}
	if each != nil {
		each.Wait()
	}
}

// completeAside completes b's admitted commit c on a goroutine of its own,
// counted by wg.
func (s *Store) completeAside(ctx context.Context, b *BatchCommit, c *pendingCommit, v sessionVerdict, wg *sync.WaitGroup) {
	wg.Go(func() {
		b.Result, b.Err = s.completeCommit(ctx, c, v, b.Forwarder)
		recycle(c)
	})
}

// DeleteForwarded is Delete with forwarding, as CommitForwarded is Commit.
func (s *Store) DeleteForwarded(ctx context.Context, key []byte, w proto.Write, f Forwarder) error {
	return s.delete(ctx, key, w, false, f)
}

// forward forwards admitted write c if f asks for it, in its key's turn,
// then applies it.
func (s *Store) forward(ctx context.Context, c *pendingCommit, f Forwarder) error {
	if f == nil || !f.Forwards(c.shard) {
		return s.submit(ctx, c)
	}
	release, err := s.turns.take(ctx, c.key)
	if err != nil {
		s.abandon(c, err)
		return err
	}
	defer release()
	if err := f.Forward(ctx, Forwarded{Shard: c.shard, Key: c.key, Version: c.entry.version, Delete: c.delete}); err != nil {
		s.abandon(c, err)
		return err
	}
	// Applied here whatever ctx says now: every backup has it.
	return s.submit(context.WithoutCancel(ctx), c)
}

// keyTurns orders the forwarded writes of each key: one at a time.
type keyTurns struct {
	mu   sync.Mutex
	busy map[string]chan struct{} // closed when the key's turn ends
}

// take waits for key's turn, and returns what ends it.
func (t *keyTurns) take(ctx context.Context, key []byte) (release func(), err error) {
	for {
		t.mu.Lock()
		if t.busy == nil {
			t.busy = map[string]chan struct{}{}
		}
		wait, held := t.busy[string(key)]
		if !held {
			done := make(chan struct{})
			t.busy[string(key)] = done
			t.mu.Unlock()
			return func() {
				t.mu.Lock()
				delete(t.busy, string(key))
				t.mu.Unlock()
				close(done)
			}, nil
		}
		t.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
