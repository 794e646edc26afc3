// Store options and their defaults.

package store

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// SyncPolicy says when committed bytes reach stable storage.
type SyncPolicy int

const (
	// SyncAlways makes the record's bytes and the index entry durable
	// before a commit is acknowledged: both are appended to the index log
	// (indexlog.go), which the arenas are checkpointed from, and
	// concurrent commits share its one fdatasync (group commit). The
	// default.
	SyncAlways SyncPolicy = iota
	// SyncBatch acknowledges at once and syncs every SyncWindow: a crash
	// may lose the last window of acknowledged writes.
	SyncBatch
	// SyncNone never syncs explicitly: each commit is written to the
	// kernel before it is acknowledged, and the kernel writes back when it
	// likes. A process crash loses nothing; a machine crash may lose
	// acknowledged writes.
	SyncNone
)

func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "always"
	case SyncBatch:
		return "batch"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncPolicy(%d)", int(p))
}

// ParseSyncPolicy parses "always", "batch" or "none".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	for _, p := range []SyncPolicy{SyncAlways, SyncBatch, SyncNone} {
		if strings.EqualFold(s, p.String()) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("store: unknown sync policy %q (want always, batch or none)", s)
}

// Options configures a Store. Zero fields take the defaults noted.
type Options struct {
	// Dir is the data directory. Required.
	Dir string
	// ArenaSize is the size of each arena file in bytes, a multiple of
	// SegmentSize. Default 64 MiB.
	ArenaSize int64
	// ArenaCount is the number of arenas a new store starts with. Default
	// 4.
	ArenaCount int
	// MaxArenaCount is how many arenas the store may have: it adds one
	// while serving when free space runs short with most of the capacity
	// live (grow.go), and opens at start those it added before. Default
	// ArenaCount: no growth.
	MaxArenaCount int
	// IndexSlots is the number of home slots the hash index starts with,
	// a power of two. The index doubles while serving when its load
	// reaches IndexGrowLoad, up to MaxIndexSlots, and a store that grew
	// opens at its grown size. Default 1<<18 (4 MiB of table).
	IndexSlots uint64
	// MaxIndexSlots bounds the index's growth: at this size new keys are
	// refused once its load reaches MaxIndexLoad (about 0.85 keys a
	// slot). Each slot is 16 bytes of registered memory, and a growth
	// holds the old table and the new one (three times the old size) for
	// IndexRetireDelay. A power of two. Default 1<<26 (1 GiB of table,
	// some 57 million keys); IndexSlots if that is larger.
	MaxIndexSlots uint64
	// IndexRetireDelay is how long the index region a growth replaced
	// stays registered, so that readers that have not learnt of the new
	// one yet (gossip takes a moment) are not cut off. Default 5s.
	IndexRetireDelay time.Duration
	// IndexGrace is how long a slot vacated by an index move stays intact
	// before reuse. Default DefaultIndexGrace.
	IndexGrace time.Duration
	// LeaseSize is the largest write lease, and so bounds a record. A
	// writer asks for the size it needs, rounded up to 4 KiB. A multiple
	// of 4096. Default 1 MiB.
	LeaseSize int64
	// LeaseTTL is how long a lease lasts: the client takes a new one when
	// it is 90% spent. A lease is not renewed: a writer that outlives it
	// takes another, sized to what it wrote in this one.
	// Default 30s.
	LeaseTTL time.Duration
	// SegmentSize is the unit the arenas are cut into, carved into leases
	// and cleaned (space.go): a multiple of 4096, at least LeaseSize, and
	// a divisor of ArenaSize. Default 4 LeaseSize (or LeaseSize when that
	// does not divide ArenaSize).
	SegmentSize int64
	// RegistrationUnit is how much of an arena one registration covers:
	// each unit is its own memory region and its own advertised region
	// (proto.ArenaRegion), so that the first unit serves while the rest
	// are still being pinned (0.15 s per GiB here, 1.8 s cold). A
	// multiple of SegmentSize; one larger than ArenaSize registers each
	// arena whole, and an arena's last unit is shorter when it does not
	// divide ArenaSize. Default 128 MiB, rounded down to a multiple of
	// SegmentSize (at least one segment).
	RegistrationUnit int64
	// SegmentGrace is how long an emptied segment waits before reuse, for
	// one-sided readers that read a location just before its record died
	// (they would retry anyway: a reused location fails their checks).
	// Default 100ms.
	SegmentGrace time.Duration
	// CleanDeadRatio starts the cleaner early: it runs while dead bytes
	// are at least this fraction of the arenas' capacity, as well as
	// whenever free segments run short (under 1/32 of them, or 3). Cleaning
	// later costs less (the segments it empties are deader), so the
	// default is 0.5; a negative value cleans only when free segments run
	// short.
	CleanDeadRatio float64
	// CleanRate bounds the bytes per second the cleaner copies, so that it
	// does not starve commits. Default 256 MiB/s.
	CleanRate int64
	// MaxKeyLen and MaxValueLen bound a record. Defaults 1 KiB and the
	// lease size minus the record header and key.
	MaxKeyLen   int
	MaxValueLen int
	// Sync is the durability policy. Default SyncAlways.
	Sync SyncPolicy
	// SyncWindow is SyncBatch's interval. Default 10ms.
	SyncWindow time.Duration
	// CheckpointInterval and CheckpointBytes say how often, under
	// SyncAlways and SyncBatch, the records the index log and the journal
	// hold are written back to the arenas (one fdatasync each) and the
	// log flushed into Pebble: every interval, or as soon as that many
	// bytes were logged (or half the log). They bound the replay at the
	// next start. Each checkpoint also costs the writers a page fault per
	// page they write again, and writes back again every page a record's
	// death dirtied since the last one, so checkpoints are spaced out:
	// durable PUTs ran 1.06x as fast at 5s, and 1.21x at 10s, as at 1s.
	// Defaults 10s and half the index log, at least 16 MiB.
	CheckpointInterval time.Duration
	CheckpointBytes    int64
	// IndexLogSize is the size of the index log (indexlog.go): the file
	// commits append their index entries to and, under SyncAlways and
	// SyncBatch, their records. Under those it must hold four leases
	// (4 LeaseSize). IndexFlushInterval is how often, under SyncNone, the
	// log is written into Pebble, which a half-full log also forces; a
	// longer interval writes a key updated often fewer times (the durable
	// policies flush at each checkpoint instead). Defaults 32 MiB, and
	// under the durable policies, whose records pass through the log, a
	// sixteenth of the arenas up to 256 MiB (at least 32 MiB and 4
	// LeaseSize); and 1s (at 100ms, MultiPuts over 10,000 zipfian keys
	// wrote a third of their commits into Pebble, at 1s a fifth: see
	// docs/ARCHITECTURE.md). A new log is filled with zeros when made,
	// in the background (256 MiB took 0.23s here; commits wait for it),
	// so that its syncs write no metadata.
	IndexLogSize       int64
	IndexFlushInterval time.Duration
	// SessionTTL is how long the last write of an idempotency session is
	// remembered, and MaxSessions how many (shard, session) entries are
	// at most (the oldest beyond it are forgotten early, which
	// Stats.SessionsEvictedEarly counts). A retry is recognised only
	// while its session's entry is kept: see sessions.go for why the TTL
	// is safe. Defaults 10 minutes and 1<<18.
	SessionTTL  time.Duration
	MaxSessions int
	// Logger receives the store's logs, Pebble's included. Default
	// slog.Default().
	Logger *slog.Logger
	// Locked, if not nil, is called by Open, on its goroutine, once it
	// holds the data directory's lock and before it opens anything in
	// it: a caller that keeps more in the directory (the server's map
	// replica) may open that from then on, alongside the rest of Open,
	// knowing no other store uses the directory. Not called when Open
	// fails before. (server.New sets its own.)
	Locked func()
}

// minLogLeases is how many of the largest records the index log of a
// durable policy holds at least: a batch of commits is cut to a quarter
// of the log (Store.apply), so that one record of a lease's size always
// fits beside a batch that fills what was free.
const minLogLeases = 4

// maxDefaultLogSize bounds the default IndexLogSize of the durable
// policies, and so the log replayed after a crash (about half of it).
const maxDefaultLogSize = 256 << 20

// defaultRegistrationUnit is RegistrationUnit's default: registering one
// takes about 20 ms here, so the first serves that soon after the index.
const defaultRegistrationUnit = 128 << 20

// UnitsPerArena is how many units (registrations, advertised regions) an
// arena registers in: meaningful on resolved options (Store.Options).
func (o Options) UnitsPerArena() int64 {
	return (o.ArenaSize + o.RegistrationUnit - 1) / o.RegistrationUnit
}

func (o Options) withDefaults() (Options, error) {
	if o.Dir == "" {
		return o, fmt.Errorf("store: Options.Dir is required")
	}
	if o.ArenaSize == 0 {
		o.ArenaSize = 64 << 20
	}
	if o.ArenaCount == 0 {
		o.ArenaCount = 4
	}
	if o.MaxArenaCount == 0 {
		o.MaxArenaCount = o.ArenaCount
	}
	if o.IndexSlots == 0 {
		o.IndexSlots = 1 << 18
	}
	if o.MaxIndexSlots == 0 {
		o.MaxIndexSlots = max(1<<26, o.IndexSlots)
	}
	if o.IndexRetireDelay == 0 {
		o.IndexRetireDelay = 5 * time.Second
	}
	if o.IndexGrace == 0 {
		o.IndexGrace = DefaultIndexGrace
	}
	if o.LeaseSize == 0 {
		o.LeaseSize = 1 << 20
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 30 * time.Second
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = 4 * o.LeaseSize
		if o.ArenaSize%o.SegmentSize != 0 || o.SegmentSize > o.ArenaSize {
			o.SegmentSize = o.LeaseSize
		}
	}
	if o.RegistrationUnit == 0 && o.SegmentSize > 0 {
		o.RegistrationUnit = max(defaultRegistrationUnit/o.SegmentSize, 1) * o.SegmentSize
	}
	if o.RegistrationUnit > o.ArenaSize && o.RegistrationUnit%o.SegmentSize == 0 {
		o.RegistrationUnit = o.ArenaSize // a multiple of SegmentSize too, checked below
	}
	if o.SegmentGrace == 0 {
		o.SegmentGrace = 100 * time.Millisecond
	}
	if o.CleanDeadRatio == 0 {
		o.CleanDeadRatio = 0.5
	}
	if o.CleanRate == 0 {
		o.CleanRate = 256 << 20
	}
	if o.MaxKeyLen == 0 {
		o.MaxKeyLen = 1024
	}
	if o.MaxValueLen == 0 {
		o.MaxValueLen = int(o.LeaseSize) - proto.RecordHeaderSize - o.MaxKeyLen
	}
	if o.SyncWindow == 0 {
		o.SyncWindow = 10 * time.Millisecond
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = 10 * time.Second
	}
	if o.IndexLogSize == 0 {
		o.IndexLogSize = 32 << 20
		if o.Sync != SyncNone {
			arenas := min(o.ArenaSize*int64(o.ArenaCount)/16, maxDefaultLogSize) &^ 4095
			o.IndexLogSize = max(o.IndexLogSize, arenas, minLogLeases*o.LeaseSize)
		}
	}
	if o.CheckpointBytes == 0 {
		o.CheckpointBytes = max(16<<20, o.IndexLogSize/2)
	}
	if o.IndexFlushInterval == 0 {
		o.IndexFlushInterval = time.Second
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 10 * time.Minute
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = 1 << 18
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.ArenaCount < 1 || o.ArenaCount > proto.MaxArenas:
		return o, fmt.Errorf("store: ArenaCount %d: must be 1 to %d", o.ArenaCount, proto.MaxArenas)
	case o.MaxArenaCount < o.ArenaCount || o.MaxArenaCount > proto.MaxArenas:
		return o, fmt.Errorf("store: MaxArenaCount %d: must be ArenaCount (%d) to %d", o.MaxArenaCount, o.ArenaCount, proto.MaxArenas)
	case o.IndexSlots&(o.IndexSlots-1) != 0 || o.IndexSlots > 1<<40:
		return o, fmt.Errorf("store: IndexSlots %d: must be a power of two up to 2^40", o.IndexSlots)
	case o.MaxIndexSlots&(o.MaxIndexSlots-1) != 0 || o.MaxIndexSlots < o.IndexSlots || o.MaxIndexSlots > 1<<40:
		return o, fmt.Errorf("store: MaxIndexSlots %d: must be a power of two, IndexSlots (%d) to 2^40", o.MaxIndexSlots, o.IndexSlots)
	case o.LeaseSize < 4096 || o.LeaseSize%4096 != 0:
		return o, fmt.Errorf("store: LeaseSize %d: must be a positive multiple of 4096", o.LeaseSize)
	case o.SegmentSize < o.LeaseSize || o.SegmentSize%4096 != 0:
		return o, fmt.Errorf("store: SegmentSize %d: must be a multiple of 4096, at least LeaseSize %d", o.SegmentSize, o.LeaseSize)
	case o.ArenaSize < o.SegmentSize || o.ArenaSize%o.SegmentSize != 0 || o.ArenaSize > proto.MaxArenaOffset:
		return o, fmt.Errorf("store: ArenaSize %d: must be a multiple of SegmentSize %d (and of LeaseSize %d), at most 1 TiB", o.ArenaSize, o.SegmentSize, o.LeaseSize)
	case o.RegistrationUnit < o.SegmentSize || o.RegistrationUnit%o.SegmentSize != 0:
		return o, fmt.Errorf("store: RegistrationUnit %d: must be a positive multiple of SegmentSize %d", o.RegistrationUnit, o.SegmentSize)
	case int64(o.MaxArenaCount)*o.UnitsPerArena() > proto.MaxArenaRegions:
		return o, fmt.Errorf("store: %d arenas of %d units (ArenaSize %d, RegistrationUnit %d) would advertise more than %d regions: raise RegistrationUnit",
			o.MaxArenaCount, o.UnitsPerArena(), o.ArenaSize, o.RegistrationUnit, proto.MaxArenaRegions)
	case o.SegmentGrace < 0 || o.CleanRate < 0 || o.CleanDeadRatio >= 1:
		return o, fmt.Errorf("store: SegmentGrace %v, CleanRate %d, CleanDeadRatio %v: must not be negative, and the ratio below 1", o.SegmentGrace, o.CleanRate, o.CleanDeadRatio)
	case o.MaxKeyLen < 1 || o.MaxKeyLen > proto.MaxKeyLen:
		return o, fmt.Errorf("store: MaxKeyLen %d: must be 1 to %d", o.MaxKeyLen, proto.MaxKeyLen)
	case o.MaxValueLen < 0 || proto.RecordSize(o.MaxKeyLen, o.MaxValueLen) > int(o.LeaseSize):
		return o, fmt.Errorf("store: MaxValueLen %d with MaxKeyLen %d does not fit a %d-byte lease", o.MaxValueLen, o.MaxKeyLen, o.LeaseSize)
	case o.CheckpointInterval < 0 || o.CheckpointBytes < 0:
		return o, fmt.Errorf("store: CheckpointInterval %v, CheckpointBytes %d: must not be negative", o.CheckpointInterval, o.CheckpointBytes)
	case o.IndexLogSize < 1<<20 || o.IndexLogSize%4096 != 0 || o.IndexFlushInterval < 0:
		return o, fmt.Errorf("store: IndexLogSize %d, IndexFlushInterval %v: the size must be a multiple of 4096, at least 1 MiB, and the interval not negative", o.IndexLogSize, o.IndexFlushInterval)
	case o.Sync != SyncNone && o.IndexLogSize < minLogLeases*o.LeaseSize:
		return o, fmt.Errorf("store: IndexLogSize %d under sync %v: must hold %d leases (LeaseSize %d), at least %d bytes", o.IndexLogSize, o.Sync, minLogLeases, o.LeaseSize, minLogLeases*o.LeaseSize)
	case o.SessionTTL < 0 || o.MaxSessions < 0:
		return o, fmt.Errorf("store: SessionTTL %v, MaxSessions %d: must not be negative", o.SessionTTL, o.MaxSessions)
	case o.Sync < SyncAlways || o.Sync > SyncNone:
		return o, fmt.Errorf("store: unknown sync policy %d", o.Sync)
	}
	return o, nil
}
