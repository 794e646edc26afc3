// The cleaner: copying the live records out of mostly dead segments, so that the segments come free.

package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// The cleaner wakes every cleanInterval (or when a carve found no free
// segment), frees the segments whose grace period is over (space.go), and
// then, while free segments run short or dead bytes reach
// Options.CleanDeadRatio of the capacity, empties the sealed segment with
// the most dead bytes:
//
//  1. It walks the segment's bytes for records whose state word is live
//     (the invariant of shards.go: those are exactly the current records
//     of the shards owned here).
//  2. It copies a batch of them into its own region, pending, and hands
//     the batch to the writer (commit.go), which, for each record that is still
//     its key's current one in a shard owned and not frozen, writes the
//     entry at the new location (and journals the copy) in one Pebble
//     batch, as a commit does; then makes the copy live, points the index
//     at it, and marks the old record dead. A record superseded meanwhile
//     is not moved; its copy stays pending, unreachable.
//  3. Once its last live record is moved, the segment starts its grace
//     period like any emptied segment.
//
// A one-sided reader holding the old location finds a dead record and
// retries from the index, which points at the copy; one that read the
// index just before the move reads the old record, live and of the same
// version, which is right. Records of shards not owned here (incoming,
// released) are dead in the arenas though their entries hold them, so a
// segment with such records cannot be emptied until DropShards: the
// cleaner notes what it left (stuckLive) and does not pick the segment
// again until that shrinks.
//
// The cleaner copies at most Options.CleanRate bytes per second.

const (
	cleanInterval = 100 * time.Millisecond
	// cleanBatch bounds the record bytes of one relocation batch: one
	// Pebble batch, journaled under SyncAlways and SyncBatch.
	cleanBatch = 1 << 20
)

// cleanerState is the cleaner's. kick and moved need no lock; region is
// guarded by Store.mu.
type cleanerState struct {
	kick    chan struct{} // buffered: clean now
	region  fillRegion    // where moved records go
	openSeg *segment      // the segment region is carved from (carveLocked); under Store.mu
	// owed is the live bytes the segment being emptied still has to
	// place, which the writers leave in openSeg (carveLocked); under
	// Store.mu.
	owed int64
	// writeRate is the bytes committed per second (a moving average the
	// cleaner samples each round), for the free segments to keep ahead of
	// the writers (headroomLocked); sampled and sampledBytes are the last
	// sample's.
	writeRate    float64
	sampled      time.Time
	sampledBytes uint64
	// onDisk counts the cleaner's waits on the disk in progress (the
	// index's sync before segments are freed, the commit of its moves):
	// a writer waiting for space does not take that time for a stall
	// (takeRegion), as a sync on a busy disk can take seconds.
	onDisk atomic.Int32
}

// kickCleaner wakes the cleaner without waiting. Safe under Store.mu.
func (s *Store) kickCleaner() {
	select {
	case s.cleaner.kick <- struct{}{}:
	default:
	}
}

// relocation is a record the cleaner moves.
type relocation struct {
	key      []byte
	shard    proto.Shard
	version  uint64
	from, to proto.Location
	rec      []byte // the copy, live, for the journal
	admitted bool   // counted in its shard (FreezeShards waits for it)
	backup   bool   // of a backup shard: not indexed, the copy stays RecordBackup
	moved    bool
}

// relocateJob is one batch of relocations, applied by the writer.
type relocateJob struct{ moves []relocation }

func (s *Store) cleanLoop() {
	defer s.wg.Done()
	t := time.NewTimer(cleanInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.cleaner.kick:
		case <-s.stop:
			return
		}
		s.cleanRound()
		t.Reset(s.nextCleanRound())
	}
}

// cleanRound frees the segments whose grace is over and cleans while
// cleaning is due.
func (s *Store) cleanRound() {
	s.sampleWriteRate(time.Now())
	for {
		if _, err := s.reclaim(time.Now()); err != nil {
			s.log.Error("freeing segments failed; will retry", "err", err)
			return
		}
		sg := s.pickVictim()
		if sg == nil {
			return
		}
		if err := s.clean(sg); err != nil {
			switch {
			case errors.Is(err, ErrFull): // room left to waiting writers, or none: the next round goes on
				s.log.Debug("cleaning a segment: no room to move records into", "arena", sg.arena.id, "offset", sg.start, "err", err)
			case !errors.Is(err, ErrClosed):
				s.log.Warn("cleaning a segment", "arena", sg.arena.id, "offset", sg.start, "err", err)
			}
			return
		}
	}
}

// nextCleanRound is when the cleaner should look again: at the end of the
// first grace period to end, or in cleanInterval.
func (s *Store) nextCleanRound() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := cleanInterval
	for _, sg := range s.freeing {
		next = min(next, time.Until(sg.freedAt.Add(s.opts.SegmentGrace)))
	}
	return max(next, time.Millisecond)
}

// sampleWriteRate updates the moving average of the write rate.
func (s *Store) sampleWriteRate(now time.Time) {
	bytes := s.stats.committedBytes.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.cleaner
	if dt := now.Sub(c.sampled).Seconds(); !c.sampled.IsZero() && dt >= 0.01 {
		c.writeRate = 0.5*c.writeRate + 0.5*float64(bytes-c.sampledBytes)/dt
	} else if !c.sampled.IsZero() {
		return // too soon for a sample worth its noise
	}
	c.sampled, c.sampledBytes = now, bytes
}

// headroomLocked is how many free segments the writers use up while a
// segment the cleaner empties goes through its grace period and the sync
// after it (twice that, for the cleaning itself): the cleaner keeps that
// many ahead of them, so that a writer does not wait for space. At most a
// quarter of the segments.
func (s *Store) headroomLocked() int {
	window := 2 * (s.opts.SegmentGrace + cleanInterval).Seconds()
	n := int(s.cleaner.writeRate*window/float64(s.opts.SegmentSize)) + 1
	return min(n, len(s.segments)/4)
}

// cleaningDueLocked reports whether the cleaner should run now: free
// segments are short of the writers' headroom, or dead bytes reached
// CleanDeadRatio; lowFree tells which.
func (s *Store) cleaningDueLocked() (due, lowFree bool) {
	sp := s.spaceNowLocked()
	// Segments in their grace period count as free: they soon are, and
	// cleaning more meanwhile would empty segments less dead.
	lowFree = sp.freeSegments+len(s.freeing) < max(s.reserveSegments()+2+s.headroomLocked(), len(s.segments)/32)
	due = lowFree || s.opts.CleanDeadRatio > 0 && float64(sp.dead) >= s.opts.CleanDeadRatio*float64(sp.capacity)
	return due, lowFree
}

// victimLocked is the sealed segment the cleaner should empty next, or
// nil. One with less than 1/8 dead is not worth its copy unless free
// segments are short, and one with less than 1/32 never is: copying it
// takes about the segment it frees (a store that full of live data is
// full, and says so). Only one whose live records all fit the room the
// cleaner has now (cleanerRoomLocked) is a candidate.
func (s *Store) victimLocked(lowFree bool) *segment {
	var best *segment
	room := s.cleanerRoomLocked()
	for _, sg := range s.segments {
		if sg.state != segmentSealed || sg.regions > 0 || sg.pending > 0 || sg.cleaning || sg.live == 0 ||
			sg.stuckLive >= 0 && sg.live >= sg.stuckLive || sg.live > room {
			continue
		}
		if best == nil || sg.dead-sg.sealTail > best.dead-best.sealTail {
			best = sg
		}
	}
	// What emptying it gains: its dead bytes but the tail it was sealed
	// with, which copying its records would leave again about as long
	// (records of about one size: a segment the cleaner filled, emptied
	// again and again, freed nothing).
	if best == nil {
		return nil
	}
	if gain := best.dead - best.sealTail; !lowFree && gain*8 < s.opts.SegmentSize || gain*32 < s.opts.SegmentSize {
		return nil
	}
	return best
}

// cleanerRoomLocked is how many bytes the cleaner can copy into now: the
// rest of its open segment and the free segments it may open. It empties
// a segment only when all of its live records fit: one left half moved
// would hold what it was copied into without freeing anything, and a few
// such left it no segment to copy into.
func (s *Store) cleanerRoomLocked() int64 {
	var room int64
	if o := s.cleaner.openSeg; o != nil {
		room = s.opts.SegmentSize - o.head
	}
	free := 0
	for _, sg := range s.segments {
		if sg.state == segmentFree && sg.arena.readyAt(sg.start) {
			free++
		}
	}
	if s.spaceWaiters > 0 {
		free = min(free, s.reserveSegments()) // the rest is the waiting writers' (carveLocked)
	}
	return room + int64(free)*s.opts.SegmentSize
}

// pickVictim returns the segment to clean now, marked cleaning, or nil.
func (s *Store) pickVictim() *segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	due, lowFree := s.cleaningDueLocked()
	if !due {
		return nil
	}
	sg := s.victimLocked(lowFree)
	if sg != nil {
		sg.cleaning = true
		s.cleaner.owed = sg.live
	}
	return sg
}

// cleanable reports whether waiting can bring free space to a writer
// that found the store full with arenas arenas: an arena was added since,
// or is being added, a segment is in its grace period or being cleaned,
// or a segment can be cleaned. One look under the lock: an arena added
// between a look at the arenas and one at the growth would be missed
// (TestArenasAddedWhileServing failed so about once in 40 runs, two at
// once).
func (s *Store) cleanable(arenas int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arenaList()) != arenas || s.growing || len(s.freeing) > 0 || s.victimLocked(true) != nil || s.cleaningLocked()
}

// clean moves the live records out of sg, which pickVictim marked.
func (s *Store) clean(sg *segment) error {
	s.mu.Lock()
	head := sg.head
	s.mu.Unlock()
	complete := false // every live record walked was handed to the writer
	defer func() {
		s.mu.Lock()
		sg.cleaning, s.cleaner.owed = false, 0
		switch {
		case sg.state != segmentSealed || sg.live == 0:
			s.stats.segmentsCleaned.Add(1)
		case complete:
			sg.stuckLive = sg.live // records nothing moves: of shards not owned here
		}
		s.mu.Unlock()
	}()
	mem := sg.arena.mem.Bytes()[sg.start : sg.start+head]
	var batch []relocation
	size := 0
	for off := 0; off+proto.RecordHeaderSize <= len(mem); {
		if binary.LittleEndian.Uint32(mem[off:]) != proto.RecordMagic {
			off += proto.RecordAlign
			continue
		}
		r, err := proto.ParseRecord(mem[off:])
		if err != nil {
			off += proto.RecordAlign // a torn or overwritten remnant
			continue
		}
		n := proto.RecordSize(r.KeyLen, r.ValueLen)
		if st := recordState(mem[off:]); st == proto.RecordLive || st == proto.RecordBackup {
			batch = append(batch, relocation{
				key: append([]byte(nil), r.Key...), shard: proto.ShardOf(r.Key), version: r.Version,
				from: proto.Location{Arena: sg.arena.id, Offset: uint64(sg.start) + uint64(off), Length: uint32(n)},
			})
			if size += n; size >= cleanBatch {
				if err := s.relocate(batch); err != nil {
					return err
				}
				batch, size = batch[:0], 0
			}
		}
		off += n
	}
	if len(batch) > 0 {
		if err := s.relocate(batch); err != nil {
			return err
		}
	}
	complete = true
	return nil
}

// relocate copies moves' records into the cleaner's region and has the
// writer apply them; then it waits as long as copying them at
// CleanRate takes.
func (s *Store) relocate(moves []relocation) error {
	start := time.Now()
	if err := s.enter(); err != nil {
		return err
	}
	job := &relocateJob{}
	s.mu.Lock()
	var full error
	var left int64 // bytes still to place
	for _, m := range moves {
		left += int64(m.from.Length)
	}
	for _, m := range moves {
		to, err := s.fillLocked(&s.cleaner.region, int64(m.from.Length), left, true)
		left -= int64(m.from.Length)
		if err != nil {
			full = err // move what has room; the segment stays for another pass
			break
		}
		m.to = to
		job.moves = append(job.moves, m)
		s.cleaner.owed = max(s.cleaner.owed-int64(m.from.Length), 0)
	}
	s.mu.Unlock()
	if len(job.moves) == 0 {
		s.exit()
		return fmt.Errorf("store: no room to move records into: %w", full)
	}
	var bytes int64
	for i := range job.moves {
		m := &job.moves[i]
		src := s.arena(m.from.Arena).mem.Bytes()[m.from.Offset : m.from.Offset+uint64(m.from.Length)]
		dst := s.arena(m.to.Arena).mem.Bytes()[m.to.Offset : m.to.Offset+uint64(m.to.Length)]
		copy(dst, src)
		putState(dst, proto.RecordPending)
		if s.journaled() {
			m.rec = append([]byte(nil), dst...)
			putState(m.rec, proto.RecordLive)
		}
		bytes += int64(m.to.Length)
	}
	c := newJob(0, nil, job)
	select {
	default:
		s.enqueue(c)
		s.kickLoop()
	case <-s.stop:
		s.mu.Lock()
		for _, m := range job.moves {
			s.settleLocked(m.to, false)
		}
		s.mu.Unlock()
		s.exit()
		return ErrClosed
	}
	s.cleaner.onDisk.Add(1)
	select {
	case <-c.done:
	case <-s.stop:
		s.drain() // the commit loop may have ended before c queued
		<-c.done
	}
	s.cleaner.onDisk.Add(-1)
	if c.result != nil {
		return c.result
	}
	if full != nil {
		return fmt.Errorf("store: moved %d of %d records: %w", len(job.moves), len(moves), full)
	}
	if pause := time.Duration(float64(bytes)/float64(s.opts.CleanRate)*float64(time.Second)) - time.Since(start); pause > 0 {
		select {
		case <-time.After(pause):
		case <-s.stop:
		}
	}
	return nil
}

// applyRelocate applies a batch of relocations (the writer).
func (s *Store) applyRelocate(c *pendingCommit) {
	job := c.reloc
	defer func() {
		s.mu.Lock()
		for i := range job.moves {
			m := &job.moves[i]
			if m.admitted {
				s.shards[m.shard].applied()
			}
			if m.moved {
				s.deadLocked(m.from)
				s.settleLocked(m.to, true)
			} else {
				s.settleLocked(m.to, false)
			}
		}
		s.mu.Unlock()
		c.signal()
		s.inflight.Done()
	}()
	// Only records of shards that take writes (a frozen shard's records
	// are being copied out, a released one's are dead already), and of
	// backups.
	s.mu.Lock()
	for i := range job.moves {
		m := &job.moves[i]
		switch info := &s.shards[m.shard]; {
		case info.state == ShardOwned && !info.frozen && !info.moving:
			info.admit()
			m.admitted = true
		case info.state == ShardBackup && !info.frozen: // frozen: being promoted
			info.admit()
			m.admitted, m.backup = true, true
		}
	}
	s.mu.Unlock()
	// Pebble current first: its batch would otherwise come before
	// entries the log holds of earlier writes (indexlog.go).
	flushErr := s.flushPending()
	b := s.db.NewBatch()
	defer b.Close()
	seq, journaled := s.journalNext.Load(), int64(0)
	errs := []error{flushErr}
	for i := range job.moves {
		m := &job.moves[i]
		if !m.admitted {
			continue
		}
		current := s.index.Get
		if m.backup {
			current = func(key []byte) (proto.Location, bool, error) {
				e, ok, err := s.entryOf(m.shard, key)
				return e.loc, ok, err
			}
		}
		if loc, ok, err := current(m.key); err != nil || !ok || loc != m.from {
			continue // superseded or deleted since the walk
		}
		m.moved = true
		errs = append(errs, b.Set(shardDataKey(m.shard, m.key), entry{loc: m.to, version: m.version}.encode(), nil))
		if s.journaled() {
			errs = append(errs, setJournalEntry(b, seq, m.to, m.rec))
			seq++
			journaled += int64(len(m.rec))
		}
	}
	err := errors.Join(errs...)
	if err == nil {
		err = s.commitBatch(b)
	}
	if err != nil {
		for i := range job.moves {
			job.moves[i].moved = false
		}
		c.result = fmt.Errorf("store: moving records out of a segment: %w", err)
		return
	}
	s.journalWritten(seq, journaled)
	var moved int64
	for i := range job.moves {
		m := &job.moves[i]
		if !m.moved {
			continue
		}
		if m.backup {
			s.arena(m.to.Arena).setState(m.to.Offset, proto.RecordBackup)
			s.arena(m.from.Arena).markDead(m.from.Offset)
			moved += int64(m.to.Length)
			continue
		}
		s.arena(m.to.Arena).setState(m.to.Offset, proto.RecordLive)
		if _, _, err := s.index.Put(m.key, m.to); err != nil {
			// The key is in the index (its slot is reused), so this
			// cannot happen; should it, the entry points at the copy and
			// the next start agrees.
			s.log.Error("repointing the index at a moved record", "key", m.key, "err", err)
		}
		s.arena(m.from.Arena).markDead(m.from.Offset)
		moved += int64(m.to.Length)
	}
	s.stats.cleanerMoved.Add(uint64(moved))
}
