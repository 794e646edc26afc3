// Counters the server exports as metrics.

package store

import (
	"sync/atomic"
	"time"
)

type statsCounters struct {
	keys            atomic.Int64
	commits         atomic.Uint64
	deletes         atomic.Uint64
	commitsRejected atomic.Uint64
	batches         atomic.Uint64
	batchedCommits  atomic.Uint64
	syncNanos       atomic.Uint64 // summed duration of batches' sync + write
	leasesGranted   atomic.Uint64
	leasesExpired   atomic.Uint64
	checkpoints     atomic.Uint64
	duplicates      atomic.Uint64
	committedBytes  atomic.Uint64 // record bytes of acknowledged puts
	leasesRefused   atomic.Uint64 // for want of space
	segmentsFreed   atomic.Uint64
	segmentsCleaned atomic.Uint64 // emptied by the cleaner
	cleanerMoved    atomic.Uint64 // record bytes the cleaner copied
	indexGrowths    atomic.Uint64
	indexFlushes    atomic.Uint64
	indexFlushed    atomic.Uint64 // entries written by flushes
	indexFlushTime  atomic.Int64  // ns
	indexLogFull    atomic.Uint64
}

func (c *statsCounters) observeBatch(n int, took time.Duration) {
	c.batches.Add(1)
	c.batchedCommits.Add(uint64(n))
	c.syncNanos.Add(uint64(took))
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	Keys            int64  // keys of the shards owned (those in the hash index)
	Commits         uint64 // puts acknowledged
	Deletes         uint64
	CommitsRejected uint64 // refused at validation: bad lease or record, shard not owned or moving, superseded
	Batches         uint64 // group commits; Commits+Deletes per batch is the grouping factor
	SyncTime        time.Duration
	LeasesActive    int
	LeasesGranted   uint64
	LeasesExpired   uint64
	Checkpoints     uint64 // write-backs of the arenas, so that the index log and the journal let go of their records (SyncAlways, SyncBatch)
	// Idempotency: retried commits and deletes answered without applying
	// them again, session entries held, and entries forgotten before
	// SessionTTL because of MaxSessions (a retry of those would apply
	// twice: raise MaxSessions if this grows).
	Duplicates           uint64
	Sessions             int
	SessionsEvictedEarly uint64
	// The hash index: its load (keys / slots), its slots, the
	// displacements it made and the times it grew.
	IndexLoad    float64
	IndexSlots   uint64
	IndexMoves   uint64
	IndexGrowths uint64
	// The index log's flushes into Pebble (under the durable policies,
	// each with a checkpoint), the entries
	// they wrote (fewer than the commits logged when keys repeat), their
	// summed time, and the flushes a full log forced on a commit (raise
	// IndexLogSize if this grows).
	IndexFlushes, IndexFlushedEntries uint64
	IndexFlushTime                    time.Duration
	IndexLogFull                      uint64
	// Space, over all arenas: bytes of current records, bytes nothing
	// reads any more (the cleaner's work), and bytes free for leases, of
	// Capacity; segments free of all; and what it took: leases refused
	// for want of space, segments freed (emptied by overwrites, deletes,
	// drops or the cleaner) and emptied by the cleaner, and the record
	// bytes the cleaner copied next to those acknowledged puts wrote
	// (their ratio is the cleaner's write amplification).
	Live, Dead, Free, Capacity int64
	FreeSegments, Segments     int
	LeasesRefused              uint64
	SegmentsFreed              uint64
	SegmentsCleaned            uint64
	CleanerMovedBytes          uint64
	CommittedBytes             uint64
	Arenas                     []ArenaStats
	// Opened is when this start of the store began opening.
	Opened time.Time
}

// ArenaStats is one arena's space.
type ArenaStats struct {
	ID         uint16
	Registered bool // every unit
	Live, Dead int64
	Size       int64
	// RegisteredBytes counts the bytes of the units registered so far:
	// Size once Registered.
	RegisteredBytes int64
	// Registration is the time from Stats.Opened to the registration of
	// the arena's last unit completing (as the store announced it); 0
	// until then.
	Registration time.Duration
}

// Stats returns the current counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Keys: s.stats.keys.Load(), Commits: s.stats.commits.Load(), Deletes: s.stats.deletes.Load(),
		CommitsRejected: s.stats.commitsRejected.Load(), Batches: s.stats.batches.Load(),
		SyncTime:      time.Duration(s.stats.syncNanos.Load()),
		LeasesGranted: s.stats.leasesGranted.Load(), LeasesExpired: s.stats.leasesExpired.Load(),
		Checkpoints: s.stats.checkpoints.Load(), Duplicates: s.stats.duplicates.Load(),
		IndexLoad: s.index.LoadFactor(), IndexSlots: s.index.Geometry().Slots, IndexMoves: s.index.Moves(),
		IndexGrowths: s.stats.indexGrowths.Load(), Opened: s.opened,
		IndexFlushes: s.stats.indexFlushes.Load(), IndexFlushedEntries: s.stats.indexFlushed.Load(),
		IndexFlushTime: time.Duration(s.stats.indexFlushTime.Load()), IndexLogFull: s.stats.indexLogFull.Load(),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st.LeasesActive = len(s.leases)
	st.Sessions, st.SessionsEvictedEarly = s.sess.byAge.Len(), s.sess.early
	sp := s.spaceNowLocked()
	st.Live, st.Dead, st.Free, st.Capacity = sp.live, sp.dead, sp.free, sp.capacity
	st.FreeSegments, st.Segments = sp.freeSegments, len(s.segments)
	st.LeasesRefused, st.SegmentsFreed = s.stats.leasesRefused.Load(), s.stats.segmentsFreed.Load()
	st.SegmentsCleaned, st.CleanerMovedBytes = s.stats.segmentsCleaned.Load(), s.stats.cleanerMoved.Load()
	st.CommittedBytes = s.stats.committedBytes.Load()
	for _, a := range s.arenaList() {
		as := ArenaStats{ID: a.id, Registered: a.ready(), Registration: time.Duration(a.registered.Load()), Size: s.opts.ArenaSize,
			RegisteredBytes: a.registeredBytes.Load()}
		for _, sg := range s.segments {
			if sg.arena == a {
				as.Live += sg.live
				as.Dead += sg.dead
			}
		}
		st.Arenas = append(st.Arenas, as)
	}
	return st
}
