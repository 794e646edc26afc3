// Ordered scans of the durable index across shards, and a shard's entries in order for migrations.

package store

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// ScanEntry is one key of a scan and where its record lies.
type ScanEntry struct {
	Key      []byte
	Location proto.Location
	Version  uint64
}

// Scan returns up to limit keys in [start, end) in key order (end nil: no
// upper bound; limit 0: no limit), merged across shards (nil: every shard
// the store owns). A shard in the list that the store does not own fails
// the scan with ErrNotOwner. Use proto.PrefixEnd(prefix) as end for a prefix
// scan.
//
// Pebble orders keys by shard first, so the scan merges one sorted run
// per shard: a heap of the shards' next keys, each shard read through one
// shared iterator (a consistent snapshot). Without a limit each shard is
// read in one run (one seek); with one, in runs that double from 4 to 256
// entries per seek, so a scan with a small limit costs about one seek per
// shard and reads at most about twice what it returns. Then a heap step
// per key (BenchmarkScan).
func (s *Store) Scan(shards []proto.Shard, start, end []byte, limit int) ([]ScanEntry, error) {
	list, err := s.ownedShards(shards)
	if err != nil {
		return nil, err
	}
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.exit()
	if end != nil && bytes.Compare(start, end) >= 0 {
		return nil, nil
	}
	if err := s.flushPending(); err != nil { // every commit acknowledged so far
		return nil, err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: keyPrefix, UpperBound: keyEnd})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	h := make(scanHeap, 0, len(list))
	for _, sh := range list {
		// Without a limit every entry is returned: read each shard in
		// one run (one seek). With one, read ahead little at first.
		r := &shardRun{shard: sh, end: end, runLen: math.MaxInt}
		if limit > 0 {
			r.runLen = min(4, limit)
		}
		if err := r.fill(it, start); err != nil {
			return nil, err
		}
		if len(r.buf) > 0 {
			h = append(h, r)
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
	out := make([]ScanEntry, 0, s.scanSizeHint(list, limit))
	for len(h) > 0 && (limit == 0 || len(out) < limit) {
		r := h[0]
		out = append(out, r.buf[r.pos])
		if r.pos++; r.pos == len(r.buf) {
			if !r.done {
				last := r.buf[len(r.buf)-1].Key
				if err := r.fill(it, append(last[:len(last):len(last)], 0)); err != nil {
					return out, err
				}
			}
			if r.pos == len(r.buf) { // nothing more in the shard
				h[0] = h[len(h)-1]
				h = h[:len(h)-1]
			}
		}
		if len(h) > 0 {
			h.down(0)
		}
	}
	return out, nil
}

// scanSizeHint bounds the entries a scan of shards returns, for its
// first allocation.
func (s *Store) scanSizeHint(shards []proto.Shard, limit int) int {
	s.mu.Lock()
	var n int64
	for _, sh := range shards {
		n += s.shards[sh].keys
	}
	s.mu.Unlock()
	if limit > 0 {
		n = min(n, int64(limit))
	}
	return int(min(n, 1<<20))
}

// ownedShards returns shards sorted and checked to be owned, or every
// owned shard for nil.
func (s *Store) ownedShards(shards []proto.Shard) ([]proto.Shard, error) {
	list, err := normShards(shards)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if shards == nil {
		for i := range s.shards {
			if s.shards[i].state == ShardOwned {
				list = append(list, proto.Shard(i))
			}
		}
		return list, nil
	}
	for _, sh := range list {
		if st := s.shards[sh].state; st != ShardOwned {
			return nil, fmt.Errorf("%w: scan of %v, which is %v here", ErrNotOwner, sh, st)
		}
	}
	return list, nil
}

// maxRun bounds the read-ahead of a limited scan per shard and seek.
const maxRun = 256

// shardRun is one shard's next entries in a merge.
type shardRun struct {
	shard  proto.Shard
	end    []byte // nil: the shard's end
	buf    []ScanEntry
	pos    int
	runLen int
	done   bool // the shard has nothing after buf
}

// fill reads the shard's next run, from key from on.
func (r *shardRun) fill(it *pebble.Iterator, from []byte) error {
	upper := shardUpper(r.shard)
	if r.end != nil {
		upper = shardDataKey(r.shard, r.end)
	}
	r.buf, r.pos = r.buf[:0], 0
	var keys []byte // one allocation for the run's keys
	for ok := it.SeekGE(shardDataKey(r.shard, from)); ok; ok = it.Next() {
		k := it.Key()
		if bytes.Compare(k, upper) >= 0 {
			break
		}
		if len(r.buf) == r.runLen {
			r.runLen = min(2*r.runLen, maxRun)
			return nil
		}
		e, err := decodeEntry(it.Value())
		if err != nil {
			return fmt.Errorf("store: key %q: %w", k[dataKeyPrefixN:], err)
		}
		if keys == nil {
			keys = make([]byte, 0, min(r.runLen, maxRun)*(len(k)-dataKeyPrefixN+8))
		}
		n := len(keys)
		keys = append(keys, k[dataKeyPrefixN:]...)
		r.buf = append(r.buf, ScanEntry{Key: keys[n:len(keys):len(keys)], Location: e.loc, Version: e.version})
	}
	r.done = true
	return it.Error()
}

// scanHeap is a min-heap of runs by their next key (container/heap's
// sift-down, without its interface calls: a full scan does one per key).
type scanHeap []*shardRun

func (r *shardRun) head() []byte { return r.buf[r.pos].Key }

func (h scanHeap) down(i int) {
	n := len(h)
	x := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && bytes.Compare(h[c+1].head(), h[c].head()) < 0 {
			c++
		}
		if bytes.Compare(x.head(), h[c].head()) <= 0 {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}

// ShardEntries returns shard sh's entries in key order after after (nil:
// from the first), up to limit of them (0: all), and whether the shard has
// more: the listing a migration's source serves and its target compares
// its copy with. Any state.
func (s *Store) ShardEntries(sh proto.Shard, after []byte, limit int) (entries []ScanEntry, more bool, err error) {
	if sh >= proto.NumShards {
		return nil, false, fmt.Errorf("store: shard %d does not exist (0 to %d)", sh, proto.NumShards-1)
	}
	if err := s.enter(); err != nil {
		return nil, false, err
	}
	defer s.exit()
	lower := shardLower(sh)
	if after != nil {
		lower = shardDataKey(sh, append(append([]byte(nil), after...), 0))
	}
	if err := s.flushPending(); err != nil {
		return nil, false, err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: shardUpper(sh)})
	if err != nil {
		return nil, false, err
	}
	for it.First(); it.Valid(); it.Next() {
		if limit > 0 && len(entries) == limit {
			more = true
			break
		}
		e, err := decodeEntry(it.Value())
		if err != nil {
			it.Close()
			return entries, false, fmt.Errorf("store: key %q: %w", it.Key()[dataKeyPrefixN:], err)
		}
		entries = append(entries, ScanEntry{Key: append([]byte(nil), it.Key()[dataKeyPrefixN:]...), Location: e.loc, Version: e.version})
	}
	return entries, more, errors.Join(it.Error(), it.Close())
}
