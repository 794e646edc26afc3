// MultiPut: many puts, one RDMA_WRITE and one commit batch per server.

package client

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// MultiPut stores each pair of kvs as Put would, and returns once every
// one is acknowledged. Pairs whose keys one server is primary of, of
// shards without backups, go together: their records into the server's
// lease in one RDMA_WRITE and their commits in one CommitBatch right after
// it on the same QP, which the server applies at once (one group commit:
// one sync under --sync always). Pairs of shards with backups are put one
// by one, ConnsPerServer at a time per server (their commits are forwarded
// to the backups, whose leases take a client's copies in order: a batch's
// forwards would race). The servers are written in parallel. MultiPut is
// not atomic: when it fails, any of the pairs may have been stored, as a
// failed Put may have been, but a pair that a server's advertised limits
// refuse (ErrTooLarge) fails it before anything is sent. A key given twice
// is stored once, with its last value. It takes WithTimeout.
func (c *Client) MultiPut(ctx context.Context, kvs []KV, opts ...OpOption) error {
	keys := make([][]byte, len(kvs))
	for i, kv := range kvs {
		if err := checkKey(kv.Key); err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
		keys[i] = kv.Key
	}
	ctx, cancel, err := callContext(ctx, "MultiPut", opts)
	if err != nil {
		return err
	}
	defer cancel()
	pending := lastOfEachKey(keys)
	ws := make([]*writeSession, len(kvs))
	for _, i := range pending {
		ws[i] = c.ids.next(proto.ShardOf(keys[i])) // each put a session of its own: a retry of any is answered once
	}
	defer func() {
		for _, w := range ws {
			if w != nil {
				c.ids.done(w)
			}
		}
	}()
	return c.do(ctx, "PUT", func(ctx context.Context) error {
		groups, err := c.groupByOwner(keys, pending)
		if err != nil {
			return &notSentError{err}
		}
		for _, g := range groups { // all of them before any is sent
			for _, i := range g.idx {
				if err := checkLimits(g.t.name, g.t.member.Meta.Limits, kvs[i].Key, kvs[i].Value); err != nil {
					return fmt.Errorf("key %d: %w", i, err)
				}
			}
		}
		var mu sync.Mutex
		var again []int
		var first, fatal error
		// done notes what a put of the pairs at idx left undone.
		done := func(t *target, idx, left []int, err error) {
			r, retry := errors.AsType[*retryable](err)
			if retry && r.lost && backedUpBy(t, keys, idx, r.node) {
				r.moving = true // as doKey does: wait for the map's leader to fail it over
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
			case retry:
				again = append(again, left...)
				first = cmp.Or(first, err)
			default:
				fatal = cmp.Or(fatal, err)
			}
		}
		var tasks []func()
		for _, g := range groups {
			batched, single := splitBackedUp(g, keys)
			if len(batched) > 0 {
				tasks = append(tasks, func() {
					left := batched
					err := c.withConn(ctx, g.t.name, func(sc *serverConn) error {
						var err error
						left, err = sc.putBatch(ctx, g.t, kvs, batched, ws)
						return err
					})
					done(g.t, batched, left, err)
				})
			}
			if len(single) == 0 {
				continue
			}
			queue := make(chan int, len(single))
			for _, i := range single {
				queue <- i
			}
			close(queue)
			for range min(len(single), c.cfg.ConnsPerServer) {
				tasks = append(tasks, func() {
					for i := range queue {
						err := c.withConn(ctx, g.t.name, func(sc *serverConn) error {
							return sc.put(ctx, g.t, kvs[i].Key, kvs[i].Value, ws[i].Write)
						})
						done(g.t, []int{i}, []int{i}, err)
					}
				})
			}
		}
		inParallel(len(tasks), func(i int) { tasks[i]() })
		if fatal != nil {
			return fatal
		}
		pending = again
		return first
	})
}

// backedUpBy reports whether node holds a replica of the shard of one of
// the keys at idx, of which there is more than one.
func backedUpBy(t *target, keys [][]byte, idx []int, node string) bool {
	for _, i := range idx {
		if sh := proto.ShardOf(keys[i]); t.m.Holders(sh) > 1 && slices.Contains(t.m.Shard(sh).Owners, node) {
			return true
		}
	}
	return false
}

// lastOfEachKey returns the indexes of keys, in order, that no later key
// equals: a key given twice is put once, with its last value. It sorts
// instead of keeping a set, which would copy every key.
func lastOfEachKey(keys [][]byte) []int {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Or(bytes.Compare(keys[a], keys[b]), cmp.Compare(a, b)) })
	kept := idx[:0]
	for j, i := range idx {
		if j+1 == len(idx) || !bytes.Equal(keys[i], keys[idx[j+1]]) {
			kept = append(kept, i) // the last one given of its key: the sort put it last
		}
	}
	slices.Sort(kept)
	return kept
}

// splitBackedUp splits g's keys into those of shards without backups,
// which go in batches, and the rest, which are put one by one. Without
// backups anywhere in g, batched is g.idx itself.
func splitBackedUp(g keyGroup, keys [][]byte) (batched, single []int) {
	backedUp := func(i int) bool { return g.t.m.Holders(proto.ShardOf(keys[i])) > 1 }
	if !slices.ContainsFunc(g.idx, backedUp) {
		return g.idx, nil
	}
	for _, i := range g.idx {
		if backedUp(i) {
			single = append(single, i)
		} else {
			batched = append(batched, i)
		}
	}
	return batched, single
}

// putBatch puts the pairs of kvs at idx, whose keys sc's server is
// primary of, in batches as large as the lease, the buffer and
// proto.MaxBatchCommits allow, and returns those not acknowledged.
func (sc *serverConn) putBatch(ctx context.Context, t *target, kvs []KV, idx []int, ws []*writeSession) (left []int, _ error) {
	if err := sc.lock(ctx); err != nil {
		return idx, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, t.member); err != nil {
		return idx, err
	}
	for len(idx) > 0 {
		batch, err := sc.writeBatch(ctx, t, kvs, idx, ws)
		if err != nil {
			return append(left, idx...), err
		}
		idx = idx[len(batch.done):]
		for j, ok := range batch.done {
			if !ok {
				left = append(left, batch.idx[j])
			}
		}
		if batch.err != nil {
			return append(left, idx...), batch.err
		}
	}
	return left, nil
}

// batchResult is what one CommitBatch did: done[j] for the pair at
// idx[j]; err, the first refusal (the others are retried with it).
type batchResult struct {
	idx  []int
	done []bool
	err  error
}

// writeBatch encodes the first pairs at idx that fit the lease and the
// buffer into the buffer, one after another, writes them into the lease
// in one RDMA_WRITE and commits them in one CommitBatch.
func (sc *serverConn) writeBatch(ctx context.Context, t *target, kvs []KV, idx []int, ws []*writeSession) (batchResult, error) {
	first := kvs[idx[0]]
	l, err := sc.leaseFor(ctx, t, uint64(proto.RecordSize(len(first.Key), len(first.Value))))
	if err != nil {
		return batchResult{}, err
	}
	buf := sc.buf()
	commits := make([]proto.Commit, 0, min(len(idx), proto.MaxBatchCommits))
	used := 0
	for _, i := range idx[:min(len(idx), proto.MaxBatchCommits)] {
		kv := kvs[i]
		size := proto.RecordSize(len(kv.Key), len(kv.Value))
		version := l.version + uint64(len(commits))
		if used+size > len(buf) || l.off+uint64(used+size) > l.Size || version >= l.VersionBase+l.VersionCount {
			break
		}
		n, err := proto.EncodeRecord(buf[used:], version, 0, kv.Key, kv.Value)
		if err != nil {
			return batchResult{}, fmt.Errorf("%w: key %d: %w", ErrTooLarge, i, err)
		}
		commits = append(commits, proto.Commit{LeaseID: l.ID, Offset: l.off + uint64(used), Length: uint64(n), Epoch: t.epoch, Write: ws[i].Write})
		used += n
	}
	if len(commits) == 0 { // leaseFor made room for the first, and the buffer holds any record
		return batchResult{}, fmt.Errorf("rkv: internal error: a record of %d bytes fits neither the lease nor the buffer", proto.RecordSize(len(first.Key), len(first.Value)))
	}
	b := batchResult{idx: idx[:len(commits)], done: make([]bool, len(commits))}
	l.off += uint64(used)
	l.version += uint64(len(commits))
	sc.sges = append(sc.sges[:0], rdma.SGE{MR: sc.mr, Length: used})
	write := rdma.SendWR{Op: rdma.OpWrite, SGL: sc.sges[:1], RemoteAddr: l.Addr + commits[0].Offset, RKey: l.RKey}
	req := &proto.CommitBatch{Commits: commits}
	var r proto.Message
	sent := false
	if sc.s.Hello.CommitSlot > 0 {
		r, sent, err = sc.commitOnQP(ctx, req, &write)
	}
	if !sent && err == nil {
		if err = sc.post(ctx, rdma.OpWrite, 0, used, write.RemoteAddr, write.RKey); err == nil {
			r, err = sc.rpc(ctx, req)
		}
	}
	if err != nil {
		sc.lease = nil // start a fresh lease: how much of this one the server took is unknown
		return batchResult{}, err
	}
	reply := r.(*proto.CommitBatchReply)
	if len(reply.Results) != len(commits) {
		sc.drop()
		return batchResult{}, retryLost(sc.name, "a CommitBatch of %d answered with %d results", len(commits), len(reply.Results))
	}
	for j, res := range reply.Results {
		kv := kvs[b.idx[j]]
		if res.Err != nil {
			if b.err == nil {
				b.err = serverError(sc.name, proto.MsgCommit, res.Err)
			}
			sc.c.cacheDrop(kv.Key)
			continue
		}
		b.done[j] = true
		if res.Reply.Length != 0 {
			sc.c.cachePut(kv.Key, sc.located(proto.Location{Arena: res.Reply.Arena, Offset: res.Reply.Offset, Length: res.Reply.Length}))
		} else {
			sc.c.cacheDrop(kv.Key) // a retry answered from the first attempt, since superseded
		}
	}
	return b, nil
}
