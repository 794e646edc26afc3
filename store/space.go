// Space: arenas cut into segments, regions carved from them to fit, and segments freed once nothing in them is live.

package store

import (
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// Every arena is a row of SegmentSize segments. Leases, the ingest region
// and the cleaner's region are carved from the one open segment, in order,
// each to the size asked; when a carve does not fit, the open segment is
// sealed and a free one opened. A region's unused tail goes back to its
// segment when it ends, if nothing was carved after it (the common case of
// a short-lived writer); otherwise it counts dead.
//
// A sealed segment only loses live bytes (superseded, deleted, moved or
// dropped records). When it has none left and no region is open in it, it
// waits out Options.SegmentGrace and one Pebble sync, and is free again:
// the grace covers a one-sided reader that read a location just before
// the record died, and the sync makes sure that no index entry that a
// crash could bring back still points into it. A reader that still holds
// a location into a reused segment finds another record there, a pending
// one, or a torn one, and retries from the index (proto.VerifyRecord);
// none of them is live for its key unless it is its key's current record.
//
// Sealed segments whose records are partly dead are emptied by the
// cleaner (cleaner.go). Nothing of this is persisted: Open computes every
// segment's live bytes from the index entries, and a segment without any
// is free.

// segmentState is where a segment is in its cycle.
type segmentState uint8

const (
	segmentFree    segmentState = iota // empty: the next carve may open it
	segmentOpen                        // carves take its space from head on
	segmentSealed                      // carving is over; it only loses live bytes
	segmentFreeing                     // empty, waiting out the grace period
)

// segment is one SegmentSize stretch of an arena. Guarded by Store.mu.
type segment struct {
	arena *arena
	start int64 // offset of its first byte in the arena
	state segmentState
	// head is how many bytes from start are carved; live and dead are
	// the bytes of current records and of bytes nothing will read (dead
	// records, tails given up, gaps); pending the bytes of records
	// written and not yet committed or refused (a commit, an Ingest or a
	// move in flight); the rest of head is in open regions.
	head, live, dead, pending int64
	// sealTail is the part of dead that was never carved: the tail left
	// when it was sealed, too short for the request that sealed it.
	sealTail int64
	regions  int       // carved regions not yet ended
	freedAt  time.Time // when it became segmentFreeing
	// cleaning is set while the cleaner works on it; stuckLive is what a
	// cleaning pass left live (records of shards not owned here, which
	// only a DropShards frees): the cleaner picks it again only once it
	// holds less.
	cleaning  bool
	stuckLive int64
}

// empty puts an emptied segment in state st with nothing carved or
// counted in it.
func (sg *segment) empty(st segmentState) {
	sg.state, sg.head, sg.live, sg.dead, sg.sealTail, sg.stuckLive = st, 0, 0, 0, 0, -1
}

// region is space carved from a segment: [off, off+size) of its arena.
type region struct {
	seg       *segment
	off, size int64
}

func (r region) arena() *arena { return r.seg.arena }

// fillRegion is a region the server fills itself, record by record (the
// ingest region, the cleaner's), guarded by Store.mu.
type fillRegion struct {
	region
	used int64
}

// fillLocked takes n bytes for a record from r, carving r anew when it is
// full (want bytes, or what the open segment has left if at least n). The
// old region's unused tail goes back.
func (s *Store) fillLocked(r *fillRegion, n, want int64, forCleaner bool) (proto.Location, error) {
	if r.seg == nil || r.used+n > r.size {
		if n > s.opts.SegmentSize {
			return proto.Location{}, fmt.Errorf("%w: a record of %d bytes is larger than a segment (%d)", ErrRecord, n, s.opts.SegmentSize)
		}
		s.endFillLocked(r)
		fresh, err := s.carveLocked(n, min(max(n, want), s.opts.SegmentSize), forCleaner)
		if err != nil {
			return proto.Location{}, err
		}
		*r = fillRegion{region: fresh}
	}
	loc := proto.Location{Arena: r.arena().id, Offset: uint64(r.off + r.used), Length: uint32(n)}
	r.used += n
	s.holdLocked(loc)
	return loc, nil
}

// endFillLocked ends r, if it has a region: its unused tail goes back.
func (s *Store) endFillLocked(r *fillRegion) {
	if r.seg != nil {
		s.endRegionLocked(r.region, r.used)
		*r = fillRegion{}
	}
}

// leaseGranularity is the unit leases are carved in.
const leaseGranularity = 4096

// newSegments cuts the arenas into segments, all free.
func (s *Store) newSegments() {
	for _, a := range s.arenaList() {
		s.addSegmentsLocked(a)
	}
}

// addSegmentsLocked cuts arena a, the last one, into free segments.
func (s *Store) addSegmentsLocked(a *arena) {
	for i := range s.opts.ArenaSize / s.opts.SegmentSize {
		s.segments = append(s.segments, &segment{arena: a, start: i * s.opts.SegmentSize, stuckLive: -1})
	}
}

// segmentOf returns the segment holding loc.
func (s *Store) segmentOf(loc proto.Location) *segment {
	per := s.opts.ArenaSize / s.opts.SegmentSize
	return s.segments[int64(loc.Arena)*per+int64(loc.Offset)/s.opts.SegmentSize]
}

// reserveSegments is how many free segments only the cleaner may open: it
// needs room to copy into to make room.
func (s *Store) reserveSegments() int {
	if len(s.segments) < 4 {
		return 0
	}
	return 1
}

// carveLocked carves want bytes (multiples of RecordAlign, at most
// SegmentSize) from the open segment, or less, not less than need, when
// that is what it has left; it opens a free segment of a registered arena
// when it has not even need. So a segment is sealed with less than need
// unused. The cleaner (forCleaner) carves from an open segment of its own,
// and only it may open the last reserveSegments: a segment it empties then
// needs at most the rest of its open segment and one free segment, which
// the writers cannot have taken (they take from its open segment, when
// none is free for them, only what the segment being emptied will not
// need). It returns errNoReadyArena when only arenas still registering
// have free segments, and ErrFull when none has.
func (s *Store) carveLocked(need, want int64, forCleaner bool) (region, error) {
	open := &s.openSeg
	if forCleaner {
		open = &s.cleaner.openSeg
	}
	if r, ok := s.carveOpenLocked(*open, need, want, 0); ok {
		return r, nil
	}
	if o := *open; o != nil {
		// Sealed now, not once a free segment is found, so that the
		// cleaner may empty it: with none free, the writers' open
		// segment held most of the dead bytes, out of its reach.
		s.sealLocked(o)
	}
	size := want
	var pick *segment
	free, waiting := 0, false
	freeIn := map[*arena]int{}
	for _, sg := range s.segments {
		if sg.state != segmentFree {
			continue
		}
		free++
		if !sg.arena.readyAt(sg.start) {
			waiting = true
			continue
		}
		freeIn[sg.arena]++
		// The arena with the most free segments: writes spread over
		// arenas, and so over their pages and syncs.
		if pick == nil || freeIn[sg.arena] > freeIn[pick.arena] {
			pick = sg
		}
	}
	switch {
	case pick == nil && waiting:
		return region{}, errNoReadyArena
	case pick == nil || !forCleaner && free <= s.reserveSegments(),
		// A writer waits for space: what comes free above the reserve
		// is its, or a cleaner that consumes each segment it frees (as
		// it does at a high utilization) starves the writers for ever.
		forCleaner && s.spaceWaiters > 0 && free > s.reserveSegments():
		if !forCleaner {
			// The rest of the cleaner's segment, beyond what the segment
			// it empties still has to place there: what its copies
			// freed, which it would not use before its next victim.
			if r, ok := s.carveOpenLocked(s.cleaner.openSeg, need, want, s.cleaner.owed); ok {
				return r, nil
			}
		}
		s.kickCleaner()
		s.maybeGrowLocked()
		return region{}, fmt.Errorf("%w: no free segment for %d bytes (%s; %s)", ErrFull, size, s.spaceLocked(), s.growHint())
	}
	pick.empty(segmentOpen)
	pick.head, pick.regions = size, 1
	*open = pick
	return region{seg: pick, off: pick.start, size: size}, nil
}

// carveOpenLocked carves want bytes, or less, not less than need, from
// open segment o (nil: none), if it has need left beyond keep bytes.
func (s *Store) carveOpenLocked(o *segment, need, want, keep int64) (region, bool) {
	if o == nil || o.head+keep+need > s.opts.SegmentSize {
		return region{}, false
	}
	size := min(want, s.opts.SegmentSize-o.head-keep)
	r := region{seg: o, off: o.start + o.head, size: size}
	o.head += size
	o.regions++
	return r, true
}

// cleaningLocked reports whether the cleaner is emptying a segment.
func (s *Store) cleaningLocked() bool {
	return slices.ContainsFunc(s.segments, func(sg *segment) bool { return sg.cleaning })
}

// sealLocked ends carving from sg: the space above its head counts dead.
func (s *Store) sealLocked(sg *segment) {
	sg.sealTail = s.opts.SegmentSize - sg.head
	sg.dead += sg.sealTail
	sg.head = s.opts.SegmentSize
	sg.state = segmentSealed
	if s.openSeg == sg {
		s.openSeg = nil
	}
	if s.cleaner.openSeg == sg {
		s.cleaner.openSeg = nil
	}
	s.maybeFreeLocked(sg)
}

// endRegionLocked ends a region whose first used bytes hold records (live
// or not, they are accounted by their commits): the rest goes back to the
// segment if nothing was carved after it, else it counts dead.
func (s *Store) endRegionLocked(r region, used int64) {
	sg := r.seg
	tail := r.size - used
	if sg.state == segmentOpen && r.off+r.size == sg.start+sg.head {
		sg.head -= tail
	} else {
		sg.dead += tail
	}
	sg.regions--
	s.maybeFreeLocked(sg)
}

// holdLocked counts a record written and on its way to be committed: its
// segment is not freed before settleLocked says what became of it.
func (s *Store) holdLocked(loc proto.Location) {
	s.segmentOf(loc).pending += int64(loc.Length)
}

// settleLocked counts a held record current, or dead (refused, failed,
// superseded before it was applied).
func (s *Store) settleLocked(loc proto.Location, current bool) {
	sg := s.segmentOf(loc)
	sg.pending -= int64(loc.Length)
	if current {
		sg.live += int64(loc.Length)
	} else {
		sg.dead += int64(loc.Length)
	}
	s.maybeFreeLocked(sg)
}

// liveLocked counts a current record found at Open.
func (s *Store) liveLocked(loc proto.Location) {
	s.segmentOf(loc).live += int64(loc.Length)
}

// deadLocked counts a current record that is current no more.
func (s *Store) deadLocked(loc proto.Location) {
	sg := s.segmentOf(loc)
	sg.live -= int64(loc.Length)
	sg.dead += int64(loc.Length)
	s.maybeFreeLocked(sg)
}

// wasteLocked counts carved bytes that will never hold a record (a gap a
// writer skipped).
func (s *Store) wasteLocked(loc proto.Location) {
	s.segmentOf(loc).dead += int64(loc.Length)
}

// maybeFreeLocked starts sg's grace period once nothing in it is live,
// pending or carved.
func (s *Store) maybeFreeLocked(sg *segment) {
	if sg.state == segmentSealed && sg.regions == 0 && sg.live == 0 && sg.pending == 0 {
		sg.state, sg.freedAt = segmentFreeing, time.Now()
		s.freeing = append(s.freeing, sg)
	}
}

// reclaim frees the segments whose grace period is over, after one Pebble
// sync: the entries that made their records dead are then durable, so no
// crash brings back an entry pointing into reused space. It reports how
// many it freed.
func (s *Store) reclaim(now time.Time) (int, error) {
	s.mu.Lock()
	due := 0
	for _, sg := range s.freeing {
		if now.Sub(sg.freedAt) >= s.opts.SegmentGrace {
			due++
		}
	}
	s.mu.Unlock()
	if due == 0 {
		return 0, nil
	}
	if err := s.flushIndex(); err != nil { // the log past every entry naming them (a checkpoint under the durable policies)
		return 0, fmt.Errorf("store: flushing the index log before freeing segments: %w", err)
	}
	if s.opts.Sync != SyncAlways { // the checkpoint above synced Pebble under SyncAlways (and SyncBatch, where this sync is redundant)
		// Counted on the disk until the segments are freed: a waiting
		// writer that saw the sync end before its space came free
		// counted the moment between as a stall, which a loaded machine
		// stretched past fullWait in a test.
		s.cleaner.onDisk.Add(1)
		defer s.cleaner.onDisk.Add(-1)
		if s.testHookReclaimSync != nil {
			s.testHookReclaimSync()
		}
		if err := s.db.LogData(nil, pebble.Sync); err != nil {
			return 0, fmt.Errorf("store: syncing the index before freeing segments: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	kept, n := s.freeing[:0], 0
	for _, sg := range s.freeing {
		if now.Sub(sg.freedAt) < s.opts.SegmentGrace || sg.state != segmentFreeing {
			kept = append(kept, sg)
			continue
		}
		sg.empty(segmentFree)
		n++
	}
	clear(s.freeing[len(kept):])
	s.freeing = kept
	s.stats.segmentsFreed.Add(uint64(n))
	if n > 0 {
		close(s.freed) // wake the writers waiting for space
		s.freed = make(chan struct{})
	}
	return n, nil
}

// rebuildSegments sets every segment's state from the live bytes the
// rebuild counted in it: one with live records is sealed, every other one
// is free.
func (s *Store) rebuildSegments() {
	for _, sg := range s.segments {
		if sg.live > 0 {
			sg.state, sg.head, sg.dead = segmentSealed, s.opts.SegmentSize, s.opts.SegmentSize-sg.live
		} else {
			sg.state, sg.head, sg.dead = segmentFree, 0, 0
		}
	}
	s.openSeg, s.cleaner.openSeg = nil, nil
}

// space is the store's space: live, dead and free bytes.
type space struct {
	live, dead, free, capacity int64
	freeSegments               int
}

func (s *Store) spaceNowLocked() space {
	sp := space{capacity: int64(len(s.segments)) * s.opts.SegmentSize}
	for _, sg := range s.segments {
		sp.live += sg.live
		sp.dead += sg.dead
		switch sg.state {
		case segmentFree:
			sp.free += s.opts.SegmentSize
			sp.freeSegments++
		case segmentOpen:
			sp.free += s.opts.SegmentSize - sg.head
		}
	}
	return sp
}

func (s *Store) spaceLocked() string {
	sp := s.spaceNowLocked()
	return fmt.Sprintf("%d bytes live, %d dead, %d free of %d; %d of %d segments free",
		sp.live, sp.dead, sp.free, sp.capacity, sp.freeSegments, len(s.segments))
}
