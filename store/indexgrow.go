// Growing the hash index while serving: a table twice the size, filled while both take every change, then switched to.

package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// IndexGrowLoad is the load factor at which the index starts to grow: far
// enough below MaxIndexLoad that writers rarely reach that limit while the
// copy runs.
const IndexGrowLoad = 0.6

// indexFullWait is how long the writer waits for a growth when the
// index reached MaxIndexLoad, before it refuses the batch's new keys.
// activateIndexWait is the same for an activation of shards (a
// migration's end), which may need several growths.
const (
	indexFullWait     = 10 * time.Second
	activateIndexWait = time.Minute
)

// indexCopyChunk is how many slots a growth copies per hold of the
// index's lock, so that commits interleave with the copy.
const indexCopyChunk = 4096

// indexRegion is a registered index region: the table, then one word per
// shard (proto.ShardWord).
type indexRegion struct {
	mem   *rdma.Memory
	reg   *rdma.Registration
	geo   proto.IndexGeometry
	words []uint64
}

func newIndexRegion(geo proto.IndexGeometry) (*indexRegion, error) {
	mem, err := rdma.Alloc(geo.RegionBytes())
	if err != nil {
		return nil, fmt.Errorf("store: index region of %d slots (%d bytes): %w", geo.Slots, geo.RegionBytes(), err)
	}
	r := &indexRegion{mem: mem, geo: geo, words: shardWordsOf(mem.Bytes(), geo)}
	for i := range r.words {
		atomic.StoreUint64(&r.words[i], 0)
	}
	return r, nil
}

func (r *indexRegion) table() []byte { return r.mem.Bytes()[:r.geo.TableBytes()] }

// release deregisters the region and frees its memory.
func (r *indexRegion) release() error {
	var errs []error
	if r.reg != nil {
		if err := r.reg.Release(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, r.mem.Close())...)
}

// indexSlotsAtOpen is the size the index opens with: IndexSlots, or what
// it grew to before (the keys of a store that grew would not fit the
// configured size again).
func (s *Store) indexSlotsAtOpen() (uint64, error) {
	slots := s.opts.IndexSlots
	v, closer, err := s.db.Get(metaIndexSlotsKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return slots, nil
	case err != nil:
		return 0, fmt.Errorf("store: reading the index size: %w", err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("store: index size record of %d bytes: corrupt", len(v))
	}
	return max(slots, binary.LittleEndian.Uint64(v)), nil
}

// maybeGrowIndex asks the grower for a larger index once the load reaches
// IndexGrowLoad. It never blocks.
func (s *Store) maybeGrowIndex(load float64) {
	if load >= IndexGrowLoad {
		s.askIndexGrowth()
	}
}

func (s *Store) askIndexGrowth() {
	select {
	case s.indexGrow <- struct{}{}:
	default:
	}
}

// indexCanGrow reports whether the index may double once more.
func (s *Store) indexCanGrow() bool { return s.index.Geometry().Slots*2 <= s.opts.MaxIndexSlots }

// waitIndexGrown asks for a growth and waits, up to timeout, for the next
// one to finish. It reports whether one did; false at once when the index
// is at MaxIndexSlots.
func (s *Store) waitIndexGrown(timeout time.Duration) bool {
	if !s.indexCanGrow() {
		return false
	}
	s.mu.Lock()
	done := s.indexGrown
	s.mu.Unlock()
	s.askIndexGrowth()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
	case <-s.stop:
	}
	return false
}

// fitIndex makes room in the index for extra more keys, growing it as
// often as needed (within timeout), for an activation of shards.
func (s *Store) fitIndex(extra int, timeout time.Duration) error {
	s.indexExtra.Add(int64(extra))
	defer s.indexExtra.Add(-int64(extra))
	deadline := time.Now().Add(timeout)
	for {
		slots := s.index.Geometry().Slots
		limit := int(MaxIndexLoad * float64(slots))
		if s.index.Len()+extra <= limit {
			return nil
		}
		if !s.indexCanGrow() || !s.waitIndexGrown(time.Until(deadline)) {
			return fmt.Errorf("%w: %d more keys would take the index past %d keys (load %.2f of %d slots); %s",
				ErrIndexFull, extra, limit, MaxIndexLoad, slots, s.indexHint())
		}
	}
}

// indexHint says how far the index may still grow, for ErrIndexFull's
// message.
func (s *Store) indexHint() string {
	if s.indexCanGrow() {
		return fmt.Sprintf("it is growing (up to %d slots)", s.opts.MaxIndexSlots)
	}
	return fmt.Sprintf("it is at its maximum: raise MaxIndexSlots (rkv-server --max-index-slots), now %d", s.opts.MaxIndexSlots)
}

// indexGrowLoop grows the index while its keys (and those an activation
// waits to add) reach IndexGrowLoad and it may.
func (s *Store) indexGrowLoop() {
	defer s.wg.Done()
	var failedAt time.Time
	warned := false
	for {
		select {
		case <-s.stop:
			return
		case <-s.indexGrow:
		}
		for {
			geo := s.index.Geometry()
			if float64(s.index.Len()+int(s.indexExtra.Load())) < IndexGrowLoad*float64(geo.Slots) {
				break
			}
			if !s.indexCanGrow() {
				if !warned {
					s.log.Warn("the hash index cannot grow: it is at MaxIndexSlots (rkv-server --max-index-slots); new keys are refused at its load limit",
						"slots", geo.Slots, "keys", s.index.Len(), "max_slots", s.opts.MaxIndexSlots, "limit", MaxIndexLoad)
					warned = true
				}
				break
			}
			if !failedAt.IsZero() && time.Since(failedAt) < 10*time.Second {
				break // failed a moment ago: give its cause time to pass
			}
			if err := s.growIndex(geo); err != nil {
				if !errors.Is(err, ErrClosed) {
					s.log.Error("growing the hash index failed; the current one serves on", "slots", geo.Slots, "keys", s.index.Len(), "err", err)
				}
				failedAt = time.Now()
				break
			}
			failedAt = time.Time{}
		}
	}
}

// growIndex replaces the index by one of twice the slots, while serving:
//
//  1. A region twice the size is allocated and registered (in the
//     background), its shard words copied from the current ones; from now
//     on a word is set in both.
//  2. Every Put and Delete goes to both tables, and the entries that were
//     in the current table before are copied, a chunk of slots at a time
//     (Index.CopyForGrow).
//  3. The new size is recorded in Pebble; then, under the index's lock,
//     the current region's shard words are cleared and the new table
//     becomes the current one. A reader that still uses the old region
//     finds records it may trust (a live record of its key is the current
//     value, wherever the slot that led to it was), but cannot confirm a
//     miss there: its word says the shard is not served, so it retries
//     until gossip brings it the new region.
//  4. The new region is advertised (IndexMoved); the old one is
//     deregistered after IndexRetireDelay, when readers have had time to
//     learn of the new one (a reader that still reads it then gets an
//     rkey error and reconnects).
func (s *Store) growIndex(old proto.IndexGeometry) error {
	start := time.Now()
	geo := proto.IndexGeometry{Slots: old.Slots * 2, Neighborhood: old.Neighborhood, Seed: rand.Uint64()}
	r, err := newIndexRegion(geo)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	r.reg = s.registrar.Register(ctx, r.mem.Bytes(), rdma.AccessRemoteRead)
	cur := s.region.Load()
	s.wordsMu.Lock()
	for i := range r.words {
		atomic.StoreUint64(&r.words[i], atomic.LoadUint64(&cur.words[i]))
	}
	s.nextWords = r.words
	s.wordsMu.Unlock()
	abort := func(err error) error {
		s.index.AbortGrow()
		s.wordsMu.Lock()
		s.nextWords = nil
		s.wordsMu.Unlock()
		return errors.Join(err, r.release())
	}
	if err := s.index.BeginGrow(r.table(), geo); err != nil {
		return abort(err)
	}
	s.log.Info("growing the hash index", "slots", old.Slots, "to", geo.Slots, "keys", s.index.Len(), "region_bytes", geo.RegionBytes())
	lastLog := time.Now()
	total := uint64(old.Slots) + uint64(old.Neighborhood) - 1
	for from, done := uint64(0), false; !done; {
		if from, done, err = s.index.CopyForGrow(from, indexCopyChunk); err != nil {
			return abort(err)
		}
		select {
		case <-s.stop:
			return abort(ErrClosed)
		default:
		}
		if time.Since(lastLog) >= 5*time.Second {
			s.log.Info("growing the hash index: copying", "done_pct", 100*from/total, "slots", geo.Slots, "keys", s.index.Len())
			lastLog = time.Now()
		}
	}
	mr, err := r.reg.Wait(ctx)
	if err != nil {
		return abort(fmt.Errorf("registering the new index region: %w", err))
	}
	// The new size is recorded before the switch: once it is made, keys
	// past what the old size holds may be admitted, and a start after a
	// crash must open the index large enough for them. (A growth that
	// fails from here on leaves the next start a larger index than it
	// needs, which is harmless.)
	if err := s.db.Set(metaIndexSlotsKey, binary.LittleEndian.AppendUint64(nil, geo.Slots), pebble.Sync); err != nil {
		return abort(fmt.Errorf("recording the index size: %w", err))
	}
	keys, err := s.index.FinishGrow(func() {
		s.wordsMu.Lock()
		for i := range cur.words {
			atomic.StoreUint64(&cur.words[i], 0)
		}
		s.region.Store(r)
		s.nextWords = nil
		s.wordsMu.Unlock()
	})
	if err != nil {
		return abort(err)
	}
	s.stats.indexGrowths.Add(1)
	s.mu.Lock()
	close(s.indexGrown)
	s.indexGrown = make(chan struct{})
	s.retiring = append(s.retiring, cur)
	s.mu.Unlock()
	select {
	case <-s.indexMoved:
	default:
	}
	s.indexMoved <- IndexInfo{Geometry: geo, Addr: mr.Addr(), RKey: mr.RKey(), Generation: s.generation}
	s.log.Info("grew the hash index", "slots", geo.Slots, "keys", keys, "load", float64(keys)/float64(geo.Slots), "took", time.Since(start).Round(time.Millisecond))
	s.wg.Add(1)
	go s.retire(cur)
	return nil
}

// retire frees an index region IndexRetireDelay after it stopped being the
// current one (Close frees it sooner).
func (s *Store) retire(r *indexRegion) {
	defer s.wg.Done()
	select {
	case <-time.After(s.opts.IndexRetireDelay):
	case <-s.stop:
		return // Close frees it
	}
	s.mu.Lock()
	for i, x := range s.retiring {
		if x == r {
			s.retiring = append(s.retiring[:i], s.retiring[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	if err := r.release(); err != nil {
		s.log.Error("freeing the old index region", "slots", r.geo.Slots, "err", err)
	}
}

// IndexMoved delivers the index region each time the index grows, for the
// server to advertise. Only the newest is kept.
func (s *Store) IndexMoved() <-chan IndexInfo { return s.indexMoved }
