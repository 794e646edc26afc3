// The Store: opening a data directory (and refusing one it cannot use), closing it, the rebuild at start.

package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/sys/unix"

	"github.com/rkv-io/rkv/internal/pebblelog"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

var (
	// ErrFull is returned when no arena has room for another lease.
	ErrFull = errors.New("store: full")
	// ErrNotFound is returned for a key that has no live record.
	ErrNotFound = errors.New("store: key not found")
	// ErrLease is returned for a commit against an unknown, expired or
	// exhausted lease, or outside its region.
	ErrLease = errors.New("store: invalid lease")
	// ErrRecord is returned for a commit whose record fails verification.
	ErrRecord = errors.New("store: invalid record")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("store: closed")
)

// Store is one server's data. It is safe for concurrent use.
type Store struct {
	opts       Options
	log        *slog.Logger
	pd         rdma.PD
	registrar  *rdma.Registrar
	lock       *os.File // the data directory's lock
	db         *pebble.DB
	generation uint64
	opened     time.Time             // when Open began: the zero of ArenaStats.Registration
	fatal      atomic.Pointer[error] // set once Pebble reported a fatal error

	// region is the index region clients READ: the hash table, then one
	// word per shard. A growth replaces it (indexgrow.go); the words are
	// written under wordsMu, in the growing region's too (nextWords).
	region    atomic.Pointer[indexRegion]
	index     *Index
	wordsMu   sync.Mutex
	nextWords []uint64
	// indexGrow asks the grower for a larger index; indexGrown is closed
	// (and replaced, under mu) when a growth finishes; indexMoved
	// delivers the new region; indexExtra counts the keys activations
	// wait to add; retiring holds the regions replaced and not yet freed
	// (under mu).
	indexGrow  chan struct{}
	indexGrown chan struct{}
	indexMoved chan IndexInfo
	indexExtra atomic.Int64
	retiring   []*indexRegion
	// activations numbers the activations of shards, for their words
	// (proto.ShardWord).
	activations atomic.Uint64

	// arenas is the list of arenas, replaced whole when one is added
	// (grow.go), so that readers take no lock: arenaList, arena.
	arenas  atomic.Pointer[[]*arena]
	growing bool           // an arena is being added; guarded by mu
	ready   chan ArenaInfo // each arena unit once, as its registration completes

	// shardOps serializes the operations on each shard (shards.go,
	// Ingest); they take them in shard order.
	shardOps [proto.NumShards]sync.Mutex

	mu          sync.Mutex
	closed      bool
	nextVersion uint64
	leases      map[uint64]*lease
	nextLeaseID uint64
	segments    []*segment    // every arena's, in arena order (space.go)
	openSeg     *segment      // the segment the writers' carves take space from
	freeing     []*segment    // empty, in their grace period
	freed       chan struct{} // closed (and replaced) when segments come free
	shards      [proto.NumShards]shardInfo
	sess        sessionTable
	turns       keyTurns   // the keys whose writes are being forwarded
	ingest      fillRegion // where Ingest copies records
	cleaner     cleanerState

	// spaceWaiters counts the requests waiting for a free segment
	// (takeRegion): what comes free above the reserve is theirs before
	// the cleaner's.
	spaceWaiters int

	// The write queue (commit.go): admitted commits, deletes, Ingest and
	// relocation batches wait in queue for the writer, the one goroutine
	// at a time that applies them, holding writer: a committer alone
	// (lead), else the commit loop, kicked.
	qmu        sync.Mutex
	queue      []*pendingCommit
	applying   []*pendingCommit // the writer's batch, its buffer reused
	writer     sync.Mutex       // the one writer of the journal and of session entries
	kick       chan struct{}    // cap 1: the commit loop has queued work
	committers atomic.Int32     // goroutines in submit or CommitBatch, from queueing to their answer
	// inflight counts the commits, deletes and Ingest batches admitted
	// and not yet finished: Close waits for them before it stops the
	// commit loop.
	inflight sync.WaitGroup
	// The journal of the cleaner and Ingest: entries below journalNext
	// are committed, those below journalTrimmed (guarded by flushMu)
	// deleted; journalBytes were journaled since the last checkpoint;
	// journalFull asks for one.
	journalNext    atomic.Uint64
	journalTrimmed uint64
	journalBytes   atomic.Int64
	journalFull    chan struct{}
	// The index log (indexlog.go), set by Open. pending holds what was
	// published since the last flush began, flushing what a flush is
	// writing; logEnd is where the log ended when pending was last added
	// to; keyBuf builds their keys. All guarded by mu; flushMu serializes
	// the flushes, indexHalf asks for one once flushAt bytes are logged.
	ilog              *indexLog
	logReplayed       int // entries the last Open replayed
	pending, flushing pendingIndex
	logEnd            logPos
	keyBuf            []byte
	flushMu           sync.Mutex
	flushAt           uint64
	indexHalf         chan struct{}
	stop              chan struct{}
	wg                sync.WaitGroup

	stats statsCounters

	// testHookApply, when set, runs in the writer before each batch
	// of commits is written (tests).
	testHookApply func()
	// testHookReclaimSync, when set, runs before the index's sync that
	// frees segments (reclaim).
	testHookReclaimSync func()
	// fullWait and fullWaitMost bound a wait for space (takeRegion):
	// defaultFullWait and defaultFullWaitMost, shortened by tests.
	fullWait, fullWaitMost time.Duration
}

// Open opens (or creates) the store in opts.Dir: it locks the directory,
// opens Pebble, checks the on-disk format, rebuilds the hash index of the
// shards it owns, maps the arenas, and starts registering them with
// registrar (which must register with pd). It returns before the arenas
// are registered; Ready delivers each as it becomes usable.
//
// A store that cannot start returns an error saying why and what to do (a
// directory in use, not writable, of another format, or made with other
// ArenaSize or more arenas), having released everything it took.
func Open(ctx context.Context, pd rdma.PD, registrar *rdma.Registrar, opts Options) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Store{
		opts: opts, log: opts.Logger, pd: pd, registrar: registrar,
		fullWait: defaultFullWait, fullWaitMost: defaultFullWaitMost,
		leases:      map[uint64]*lease{},
		ready:       make(chan ArenaInfo, int64(opts.MaxArenaCount)*opts.UnitsPerArena()),
		kick:        make(chan struct{}, 1),
		journalFull: make(chan struct{}, 1),
		indexHalf:   make(chan struct{}, 1),
		stop:        make(chan struct{}),
		sess:        newSessionTable(opts.SessionTTL, opts.MaxSessions),
		cleaner:     cleanerState{kick: make(chan struct{}, 1)},
		freed:       make(chan struct{}),
		indexGrow:   make(chan struct{}, 1),
		indexGrown:  make(chan struct{}),
		indexMoved:  make(chan IndexInfo, 1),
	}
	if err := s.open(ctx); err != nil {
		if cerr := s.closeResources(); cerr != nil {
			s.log.Warn("releasing a store that failed to open", "dir", opts.Dir, "err", cerr)
		}
		return nil, err
	}
	return s, nil
}

func (s *Store) open(ctx context.Context) error {
	opts := s.opts
	start := time.Now()
	s.opened = start
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return fmt.Errorf("store: creating the data directory %s: %w: make its parent writable by this user, or choose another directory (rkv-server --data-dir)", opts.Dir, err)
	}
	if err := s.lockDir(); err != nil {
		return err
	}
	if opts.Locked != nil {
		opts.Locked()
	}
	var err error
	popts := &pebble.Options{Logger: s.pebbleLogger()}
	if opts.Sync == SyncNone {
		popts.WithFSDefaults()
		popts.FS = flushOnlyWAL{popts.FS}
	}
	if s.db, err = pebble.Open(filepath.Join(opts.Dir, "index"), popts); err != nil {
		return fmt.Errorf("store: opening the Pebble index in %s: %w", opts.Dir, err)
	}
	if err := s.brokenErr(); err != nil {
		return err
	}
	if err := s.checkFormat(); err != nil {
		return err
	}
	if err := s.loadGeneration(); err != nil {
		return err
	}
	count := s.arenasOnDisk()
	if err := checkArenaSpace(opts.Dir, count, opts.ArenaSize); err != nil {
		return err
	}
	var arenas []*arena
	for i := range count {
		a, err := openArena(opts.Dir, i, opts.ArenaSize, opts.RegistrationUnit)
		if err != nil {
			s.arenas.Store(&arenas) // for closeResources
			return err
		}
		arenas = append(arenas, a)
	}
	s.arenas.Store(&arenas)
	s.newSegments()
	slots, err := s.indexSlotsAtOpen()
	if err != nil {
		return err
	}
	geo := proto.IndexGeometry{Slots: slots, Neighborhood: proto.DefaultNeighborhood, Seed: rand.Uint64()}
	if err := geo.Validate(); err != nil {
		return fmt.Errorf("store: IndexSlots: %w", err)
	}
	region, err := newIndexRegion(geo)
	if err != nil {
		return err
	}
	s.region.Store(region)
	if s.index, err = NewIndex(region.table(), geo, s.keyAt, opts.IndexGrace); err != nil {
		return err
	}
	replayed, err := s.replayJournal()
	if err != nil {
		return err
	}
	if s.logReplayed, err = s.openIndex(); err != nil {
		return err
	}
	if err := s.loadShards(); err != nil {
		return err
	}
	if err := s.loadSessions(); err != nil {
		return err
	}
	keys, err := s.rebuild()
	if err != nil {
		return err
	}
	s.index.Publish()
	// The index first: nothing is readable without it. Then the first
	// arena's first unit alone, so that it serves after one unit's
	// pinning rather than after sharing the workers, the disk and the
	// cores with the others; then the rest (registerRest), in the
	// background, at a lower priority than serving: the start they slowed
	// is over. Each unit is announced as its own registration completes.
	region.reg = s.registrar.Register(ctx, region.mem.Bytes(), rdma.AccessRemoteRead)
	s.arena(0).registerUnit(ctx, s.registrar, 0, false)
	s.wg.Add(1)
	go s.registerRest(ctx, s.registrar, s.arenaList()) // not those added while serving: they register themselves
	owned := 0
	for i := range s.shards {
		if s.shards[i].state == ShardOwned {
			owned++
		}
	}
	s.log.Info("store opened", "dir", opts.Dir, "keys", keys, "shards_owned", owned, "sessions", s.sess.byAge.Len(),
		"arenas", opts.ArenaCount, "arena_bytes", opts.ArenaSize,
		"generation", s.generation, "sync", opts.Sync, "journal_replayed", replayed, "index_log_replayed", s.logReplayed, "took", time.Since(start))
	s.wg.Add(1)
	go s.commitLoop()
	if opts.Sync == SyncBatch {
		s.wg.Add(1)
		go s.syncLoop()
	}
	s.wg.Add(1)
	go s.indexFlushLoop()
	s.wg.Add(1)
	go s.cleanLoop()
	s.wg.Add(1)
	go s.indexGrowLoop()
	s.maybeGrowIndex(s.index.LoadFactor())
	return nil
}

// checkArenaSpace refuses to create the arena files of a store of count
// arenas of size bytes in dir, those not there yet, when the file system
// has less room for them: the files are reserved whole (openArena), and a
// start that filled the disk on the way would leave it full.
func checkArenaSpace(dir string, count int, size int64) error {
	missing := 0
	for i := range count {
		if st, err := os.Stat(arenaPath(dir, i)); err != nil || st.Size() == 0 {
			missing++
		}
	}
	if missing == 0 {
		return nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return nil // openArena's reservation says what fails, if anything does
	}
	need, free := int64(missing)*size, int64(fs.Bavail)*fs.Bsize
	if need > free {
		return fmt.Errorf("store: %s needs %d MiB for its new arena files (%d of %d bytes) and its file system has %d MiB free: "+
			"free some space, or start with fewer or smaller arenas (rkv-server --arena-count, --arena-size)",
			dir, need>>20, missing, size, free>>20)
	}
	return nil
}

// lockDir takes an exclusive lock on the data directory (flock of
// rkv.lock, which holds the owner's pid), so that a second store on the
// same directory, in this process or another, fails at once.
func (s *Store) lockDir() error {
	path := filepath.Join(s.opts.Dir, "rkv.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: data directory %s is not usable: %w: make it writable by this user, or choose another directory (rkv-server --data-dir)", s.opts.Dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("store: data directory %s is in use by another store (process %s): stop that server first, "+
				"or give this one a directory of its own (rkv-server --data-dir)", s.opts.Dir, strings.TrimSpace(string(pid)))
		}
		return fmt.Errorf("store: locking the data directory %s: %w", s.opts.Dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	s.lock = f
	return nil
}

// enter admits an operation that uses Pebble or the arenas: it fails
// after Close, and Close waits for it (exit) before closing them.
func (s *Store) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.inflight.Add(1)
	return nil
}

func (s *Store) exit() { s.inflight.Done() }

// registerRest announces the first arena's first unit once it is
// registered (or failed), then submits every other unit, unless the store
// closes first. Announcing the first here, before the others are
// submitted, keeps it first on Ready. The others go round the arenas (the
// first unit of each, then the second...), so that the workers pin units
// of different arenas at once: soft locks a mapping while it pins a chunk
// of it, so in arena order the workers took one arena's units one at a
// time (8 GiB took 1.0 s cold and 100 ms warm, against 0.75 s and 55 ms
// whole, when a unit was one chunk).
func (s *Store) registerRest(ctx context.Context, registrar *rdma.Registrar, arenas []*arena) {
	defer s.wg.Done()
	first := arenas[0]
	select {
	case <-first.registration(0).Done():
	case <-s.stop:
		return
	}
	s.announce(first, 0)
	for u := range first.units { // every arena has as many
		for _, a := range arenas {
			if a != first || u > 0 {
				a.registerUnit(ctx, registrar, u, true)
			}
		}
	}
	for _, a := range arenas {
		from := 0
		if a == first {
			from = 1
		}
		go s.announceUnits(a, from)
	}
}

// announceUnits announces a's units from from on, in order, as each
// registration completes.
func (s *Store) announceUnits(a *arena, from int) {
	for i := from; i < len(a.units); i++ {
		s.announce(a, i)
	}
}

// announce waits for unit i of a to be registered and announces it: on
// Ready, and to the writers waiting for space to carve in.
func (s *Store) announce(a *arena, i int) {
	if _, err := a.registration(i).Wait(context.Background()); err != nil {
		s.log.Error("arena registration failed", "arena", a.id, "offset", a.units[i].off, "bytes", a.units[i].n, "err", err)
		return
	}
	a.registeredBytes.Add(a.units[i].n)
	if int(a.announced.Add(1)) == len(a.units) {
		a.registered.Store(int64(max(time.Since(s.opened), 1))) // never 0, which means not yet
	}
	info := a.info(i, s.generation)
	s.log.Debug("arena unit ready", "arena", a.id, "offset", info.Offset, "addr", fmt.Sprintf("%#x", info.Addr), "rkey", fmt.Sprintf("%#x", info.RKey))
	if a.ready() {
		s.log.Info("arena ready", "arena", a.id, "units", len(a.units), "took", time.Duration(a.registered.Load()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.ready <- info // buffered for every unit: never blocks
		close(s.freed)  // writers waiting for a registered segment carve again
		s.freed = make(chan struct{})
	}
}

// Ready delivers each arena unit once, as soon as its registration
// completes.
func (s *Store) Ready() <-chan ArenaInfo { return s.ready }

// Arenas returns the arena units registered so far, in arena and offset
// order.
func (s *Store) Arenas() []ArenaInfo {
	var out []ArenaInfo
	for _, a := range s.arenaList() {
		for i := range a.units {
			if a.unitReady(i) {
				out = append(out, a.info(i, s.generation))
			}
		}
	}
	return out
}

// IndexInfo is what a reader needs to read the hash index one-sidedly.
type IndexInfo struct {
	Geometry   proto.IndexGeometry
	Addr       uint64
	RKey       uint32
	Generation uint64
}

// IndexRegion waits for the index region's registration and describes it:
// the hash table (Geometry.TableBytes), then the shard words
// (proto.ShardWordsBytes), Geometry.RegionBytes in all.
//
// The index grows while serving: IndexMoved delivers each new region.
func (s *Store) IndexRegion(ctx context.Context) (IndexInfo, error) {
	r := s.region.Load()
	mr, err := r.reg.Wait(ctx)
	if err != nil {
		return IndexInfo{}, err
	}
	return IndexInfo{Geometry: r.geo, Addr: mr.Addr(), RKey: mr.RKey(), Generation: s.generation}, nil
}

// Options returns the options in force, defaults filled in.
func (s *Store) Options() Options { return s.opts }

func (s *Store) keyAt(loc proto.Location) ([]byte, error) {
	if int(loc.Arena) >= len(s.arenaList()) {
		return nil, fmt.Errorf("store: arena %d does not exist", loc.Arena)
	}
	b, err := s.arena(loc.Arena).record(loc)
	if err != nil {
		return nil, err
	}
	h, err := proto.DecodeRecordHeader(b)
	if err != nil || proto.RecordHeaderSize+h.KeyLen > len(b) {
		return nil, fmt.Errorf("store: record at %+v: %w", loc, errors.Join(err, ErrRecord))
	}
	return b[proto.RecordHeaderSize : proto.RecordHeaderSize+h.KeyLen], nil
}

// Get returns a copy of key's value, read and verified on the server (the
// control path; clients read one-sidedly).
func (s *Store) Get(key []byte) ([]byte, error) {
	loc, ok, err := s.index.Get(key)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrNotFound
	}
	b, err := s.arena(loc.Arena).record(loc)
	if err != nil {
		return nil, err
	}
	r, err := proto.VerifyRecord(b, key, 0)
	if err != nil {
		return nil, fmt.Errorf("store: record of %q at %+v: %w", key, loc, err)
	}
	return append([]byte(nil), r.Value...), nil
}

// Close stops taking commits, finishes the admitted ones (and Ingest
// calls), deregisters the arenas and the index, and closes Pebble. The
// Registrar stays open.
func (s *Store) Close() error { return s.close(true) }

// close is Close; without checkpoint it leaves the journal as a crash
// would (tests).
func (s *Store) close(checkpoint bool) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	leases := s.leases
	s.leases = nil
	s.mu.Unlock()
	s.inflight.Wait() // the writers apply what was admitted
	close(s.stop)
	s.wg.Wait()
	var errs []error
	if checkpoint && s.brokenErr() == nil {
		// A clean stop leaves nothing to replay, and a position an older
		// rkv reads. (A broken store leaves the log to the next start's
		// replay: what it holds is all that is known to be durable.)
		err := s.flushIndex()
		if err == nil && s.logFormat() != logFormatEntries {
			err = s.db.Set(metaIndexLogKey, s.logEnd.encode(logFormatEntries), pebble.Sync)
		}
		errs = append(errs, err)
	}
	for _, l := range leases {
		_ = l.region.reg.Release()
	}
	return errors.Join(append(errs, s.closeResources())...)
}

// closeResources releases what Open took, as far as it got.
func (s *Store) closeResources() error {
	var errs []error
	if r := s.region.Load(); r != nil {
		errs = append(errs, r.release())
	}
	for _, r := range s.retiring {
		errs = append(errs, r.release())
	}
	for _, a := range s.arenaList() {
		errs = append(errs, a.close())
	}
	if s.ilog != nil {
		errs = append(errs, s.ilog.close())
	}
	if s.db != nil {
		errs = append(errs, s.db.Close())
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // and with it the flock
	}
	return errors.Join(errs...)
}

// entry is a key's durable index entry.
type entry struct {
	loc     proto.Location
	version uint64
}

const entrySize = 1 + 2 + 8 + 4 + 8

func (e entry) encode() []byte { return e.append(make([]byte, 0, entrySize)) }

func (e entry) append(b []byte) []byte {
	b = append(b, 1) // format
	b = binary.LittleEndian.AppendUint16(b, e.loc.Arena)
	b = binary.LittleEndian.AppendUint64(b, e.loc.Offset)
	b = binary.LittleEndian.AppendUint32(b, e.loc.Length)
	return binary.LittleEndian.AppendUint64(b, e.version)
}

func decodeEntry(b []byte) (entry, error) {
	if len(b) != entrySize || b[0] != 1 {
		return entry{}, fmt.Errorf("store: index entry of %d bytes, format %v: corrupt or from a newer version", len(b), b[:min(1, len(b))])
	}
	return entry{
		loc:     proto.Location{Arena: binary.LittleEndian.Uint16(b[1:]), Offset: binary.LittleEndian.Uint64(b[3:]), Length: binary.LittleEndian.Uint32(b[11:])},
		version: binary.LittleEndian.Uint64(b[15:]),
	}, nil
}

// loadGeneration bumps the generation: every start re-registers the
// arenas, so rkeys change, and readers compare generations to notice.
// Versions need no such record: the next start resumes above the highest
// committed one, and versions of records never committed may be reused.
func (s *Store) loadGeneration() error {
	v, closer, err := s.db.Get(metaGenKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return fmt.Errorf("store: reading the generation: %w", err)
	default:
		if len(v) != 8 {
			closer.Close()
			return fmt.Errorf("store: generation record of %d bytes: corrupt", len(v))
		}
		s.generation = binary.LittleEndian.Uint64(v)
		closer.Close()
	}
	s.generation++
	s.nextVersion = 1
	if err := s.db.Set(metaGenKey, binary.LittleEndian.AppendUint64(nil, s.generation), pebble.Sync); err != nil {
		return fmt.Errorf("store: recording the generation: %w", err)
	}
	return nil
}

// rebuild fills the index from Pebble with the entries of the shards the
// store owns, setting their records live and every other entry's record
// dead, publishes the owned shards' words, and recomputes every arena's
// head and live bytes. Records written into a lease but never committed
// are not in Pebble, so they stay invisible, and their space lies below a
// head as dead bytes. The locations of ingested sessions are filled in
// from their versions' entries.
func (s *Store) rebuild() (int, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: keyPrefix, UpperBound: keyEnd})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	unresolved := map[sessKey]*session{} // by shard and version
	for k, ss := range s.sess.m {
		if ss.applied && ss.version != 0 && ss.loc.Length == 0 {
			unresolved[sessKey{k.shard, ss.version}] = ss
		}
	}
	n := 0
	for it.First(); it.Valid(); it.Next() {
		sh, key, err := splitDataKey(it.Key())
		if err != nil {
			return n, err
		}
		e, err := decodeEntry(it.Value())
		if err != nil {
			return n, fmt.Errorf("store: key %q: %w", key, err)
		}
		if err := s.checkLocation(key, e.loc); err != nil {
			return n, err
		}
		a := s.arena(e.loc.Arena)
		s.liveLocked(e.loc)
		s.nextVersion = max(s.nextVersion, e.version+1)
		info := &s.shards[sh]
		info.keys++
		info.live += int64(e.loc.Length)
		if info.state == ShardBackup {
			a.setState(e.loc.Offset, proto.RecordBackup)
			continue
		}
		if info.state != ShardOwned {
			a.setState(e.loc.Offset, proto.RecordDead)
			continue
		}
		a.setState(e.loc.Offset, proto.RecordLive)
		if _, _, err := s.index.Put(append([]byte(nil), key...), e.loc); err != nil {
			return n, fmt.Errorf("store: rebuilding the index: %w: raise IndexSlots (rkv-server --index-slots), now %d", err, s.index.Geometry().Slots)
		}
		if ss := unresolved[sessKey{sh, e.version}]; ss != nil {
			ss.loc = e.loc
		}
		n++
	}
	if err := it.Error(); err != nil {
		return n, err
	}
	s.rebuildSegments()
	seq := s.activations.Add(1)
	for i := range s.shards {
		if s.shards[i].state == ShardOwned {
			s.setWord(proto.Shard(i), proto.ShardWord(s.shards[i].since, seq))
		}
	}
	s.stats.keys.Store(int64(n))
	return n, nil
}

// checkLocation checks that an entry's location lies inside the arenas.
func (s *Store) checkLocation(key []byte, loc proto.Location) error {
	if int(loc.Arena) >= len(s.arenaList()) {
		return fmt.Errorf("store: the record of key %q lies in arena %d, but ArenaCount is %d: the directory was made with more arenas. "+
			"Start with ArenaCount %d or more (rkv-server --arena-count)", key, loc.Arena, len(s.arenaList()), loc.Arena+1)
	}
	if loc.Length < proto.RecordHeaderSize || loc.Offset+uint64(loc.Length) > uint64(s.opts.ArenaSize) {
		return fmt.Errorf("store: the record of key %q at %+v lies outside an arena of %d bytes: corrupt, or ArenaSize changed", key, loc, s.opts.ArenaSize)
	}
	if seg := int64(s.opts.SegmentSize); int64(loc.Offset)/seg != (int64(loc.Offset)+int64(loc.Length)-1)/seg {
		return fmt.Errorf("store: the record of key %q at %+v crosses a segment boundary: the directory was made with another SegmentSize. "+
			"Start with that size again (rkv-server --segment-size), now %d", key, loc, s.opts.SegmentSize)
	}
	return nil
}

// versionAt reads the version of the record at loc (0 if it is not one).
func (s *Store) versionAt(loc proto.Location) uint64 {
	b, err := s.RecordAt(loc)
	if err != nil {
		return 0
	}
	h, err := proto.DecodeRecordHeader(b)
	if err != nil {
		return 0
	}
	return h.Version
}

// brokenErr is the error every write fails with once Pebble reported a
// fatal error, or nil.
func (s *Store) brokenErr() error {
	if p := s.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// breakOn makes every write fail from now on, after err, a failure that
// leaves what is durable unknown (a failed sync).
func (s *Store) breakOn(err error) {
	s.log.Error("the store refuses writes until it is restarted", "err", err)
	err = fmt.Errorf("store: %w: the store takes no more writes; restart the server", err)
	s.fatal.CompareAndSwap(nil, &err)
}

// pebbleLogger routes Pebble's logs to the store's logger. After a fatal
// error (Pebble may carry on as if a failed WAL write had succeeded) the
// store refuses writes: the server stays up to say so, and a restart
// recovers from what is durable.
func (s *Store) pebbleLogger() pebblelog.Logger {
	return pebblelog.Logger{Log: s.log, OnFatal: func(msg string) {
		s.log.Error("the store refuses writes until it is restarted")
		err := fmt.Errorf("store: Pebble failed (%s): the store takes no more writes; restart the server", msg)
		s.fatal.CompareAndSwap(nil, &err)
	}}
}
