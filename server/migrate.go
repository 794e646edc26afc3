// Shard moves into this server: the copy pulled with RDMA_READ from the owner's arenas, the freeze, the hand-over. And the owner's side.

package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

// A move of shards from their owner A to this server B (docs/ARCHITECTURE.md,
// "Migration") goes:
//
//  1. The leader starts the moves (phase copying); B's reconcile makes the
//     shards Incoming here. A keeps serving reads and writes.
//  2. B copies: it lists each shard's entries from A (ShardScan), READs the
//     records that differ from its copy out of A's arenas one-sidedly,
//     verifies each (key, CRC, version) and ingests them (not yet live
//     here); keys B holds that A no longer lists are deleted. A second
//     pass catches what changed meanwhile.
//  3. B has the moves frozen in the map; B asks A to fence the shards
//     (FenceShards: A waits until its map shows the freeze, then until
//     every write it admitted is applied, and answers with its
//     generation). A still serves reads.
//  4. B copies once more, now of a shard nobody writes, with its
//     idempotency sessions.
//  5. B asks A to release the shards (ReleaseShards, with A's
//     generation: a restarted A may have taken writes before its map
//     caught up, and is fenced again). A stops serving them: their
//     records dead, their keys out of its index, their shard words 0.
//  6. B finishes the moves in the map; its reconcile then serves the
//     shards (records live, indexed, shard words set), and A's drops its
//     copy.
//
// A move that adds a replica, or replaces a backup, copies from the shard's
// primary the same way but skips step 5: the primary keeps serving, and
// unfreezes when its map shows the move finished; B's reconcile then makes
// its copy a backup.
//
// Until step 6 commits, the moves can be aborted (a server down longer
// than MoveTimeout): A serves its data again, B drops its copy. Writes to
// a shard are refused only between steps 3 and 6, reads only between 5
// and the readers' next map: milliseconds for a shard whose last pass is
// small.

// mover runs the moves into this server, one worker per group of moves
// from one source started together.
type mover struct {
	s *Server

	mu      sync.Mutex
	stopped bool
	running map[moveGroup]context.CancelFunc
	copying map[moveGroup]*copyProgress // the groups that copy, while their worker runs
	wg      sync.WaitGroup
	done    moveStats
	// pulledKeys and pulledBytes count every record (and delete) and
	// record byte any copy pass brought, of moves finished, running or
	// aborted: a counter that only grows, for rates.
	pulledKeys, pulledBytes atomic.Uint64
	// loseFinishes, in tests, is how many promotion finishes still to
	// drop before they are proposed, as a Raft leader change would.
	loseFinishes atomic.Int32
}

// copyProgress is how far one group's copy has come, from its worker's
// start to its end, across its attempts.
type copyProgress struct {
	start       time.Time
	keys, bytes atomic.Uint64

	mu     sync.Mutex
	shards []proto.Shard        // the group's moves still in the map at the last attempt
	copied map[proto.Shard]bool // shards a pass copied completely
}

func newCopyProgress(shards []proto.Shard) *copyProgress {
	return &copyProgress{start: time.Now(), shards: shards, copied: map[proto.Shard]bool{}}
}

func (c *copyProgress) attempt(shards []proto.Shard) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shards = shards
}

// shardCopied records that a pass copied shard sh completely.
func (c *copyProgress) shardCopied(sh proto.Shard) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.copied[sh] = true
}

// addTo adds this group's progress to p, Elapsed as of now.
func (c *copyProgress) addTo(p *proto.CopyProgress, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p.Groups++
	p.Shards += uint64(len(c.shards))
	for _, sh := range c.shards {
		if c.copied[sh] {
			p.Copied++
		}
	}
	p.Keys += c.keys.Load()
	p.Bytes += c.bytes.Load()
	p.Elapsed = max(p.Elapsed, now.Sub(c.start))
}

// moveGroup names the moves one worker runs: those started together whose
// source is one server, the shards' primary, and what the source does
// with the shards at the end.
type moveGroup struct {
	from    string
	started uint64
	mode    moveMode
}

type moveMode uint8

const (
	// handOver: the target copies the shards and the source releases
	// them (a primary replaced).
	handOver moveMode = iota
	// keepServing: the target copies the shards and the source keeps
	// serving them (a replica added, a backup replaced).
	keepServing
	// promote: the target, a backup, already holds a copy; the source
	// becomes a backup of the shards, and the target their primary.
	promote
)

// groupOf is the group move x of map m runs in.
func groupOf(m *clustermap.Map, x clustermap.Move) moveGroup {
	g := moveGroup{from: x.From, started: x.Started}
	switch owner := m.Shard(x.Shard).Owner(); {
	case x.Kind == proto.MovePromote:
		g.mode = promote
	case x.Kind == proto.MoveAddReplica:
		g.mode = keepServing
	case owner != x.From: // a backup replaced: the copy comes from the primary
		g.from, g.mode = owner, keepServing
	}
	return g
}

func (m moveMode) String() string {
	return [...]string{handOver: "hand-over", keepServing: "keep-serving", promote: "promote"}[m]
}

// moveStats is what the moves into this server copied.
type moveStats struct {
	shards, keys, bytes uint64
	took                time.Duration
}

func newMover(s *Server) *mover {
	return &mover{s: s, running: map[moveGroup]context.CancelFunc{}, copying: map[moveGroup]*copyProgress{}}
}

// sync starts a worker for each group of moves into this server in m and
// stops those whose moves ended.
func (mv *mover) sync(m *clustermap.Map) {
	want := map[moveGroup]bool{}
	for _, x := range m.Moves() {
		if x.To == mv.s.cfg.Name {
			want[groupOf(m, x)] = true
		}
	}
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if mv.stopped {
		return
	}
	for g, cancel := range mv.running {
		if !want[g] {
			cancel()
			delete(mv.running, g)
		}
	}
	for g := range want {
		if _, ok := mv.running[g]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		mv.running[g] = cancel
		mv.wg.Add(1)
		go func() {
			defer mv.wg.Done()
			mv.run(ctx, g)
			mv.mu.Lock()
			delete(mv.running, g)
			mv.mu.Unlock()
		}()
	}
}

// stop cancels every worker and waits for them.
func (mv *mover) stop() {
	mv.mu.Lock()
	mv.stopped = true
	for _, cancel := range mv.running {
		cancel()
	}
	mv.mu.Unlock()
	mv.wg.Wait()
}

func (mv *mover) stats() moveStats {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return mv.done
}

// progress sums the copies running now.
func (mv *mover) progress() proto.CopyProgress {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	var p proto.CopyProgress
	now := time.Now()
	for _, c := range mv.copying {
		c.addTo(&p, now)
	}
	return p
}

// MoveStats is what the moves into a server copy: those running now and,
// since the server started, those that finished.
type MoveStats struct {
	// Copying is the moves that copy shards to this server now (every
	// kind but a promotion): it is catching up on Copying.Shards shards.
	Copying proto.CopyProgress
	// ShardsMovedIn is the shards of the finished moves (promotions
	// included), CopiedKeys and CopiedBytes what they copied, CopyTime
	// how long their groups took from start to finish.
	ShardsMovedIn, CopiedKeys, CopiedBytes uint64
	CopyTime                               time.Duration
	// PulledKeys and PulledBytes are what every copy pass brought since
	// the start, of the moves finished, running or aborted: they only
	// grow.
	PulledKeys, PulledBytes uint64
}

// MoveStats returns what the moves into this server copy and copied.
func (s *Server) MoveStats() MoveStats {
	d := s.moves.stats()
	return MoveStats{Copying: s.moves.progress(), ShardsMovedIn: d.shards, CopiedKeys: d.keys, CopiedBytes: d.bytes, CopyTime: d.took,
		PulledKeys: s.moves.pulledKeys.Load(), PulledBytes: s.moves.pulledBytes.Load()}
}

func (mv *mover) add(d moveStats) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	mv.done.shards += d.shards
	mv.done.keys += d.keys
	mv.done.bytes += d.bytes
	mv.done.took += d.took
}

// errMoveGone: the group's moves are no longer in the map (finished or
// aborted).
var errMoveGone = errors.New("server: the moves are no longer in the map")

// run retries the group's moves until they finish, are aborted, or the
// server closes.
func (mv *mover) run(ctx context.Context, g moveGroup) {
	log := mv.s.log.With("from", g.from, "move_started", g.started)
	var prog *copyProgress
	if g.mode != promote {
		prog = newCopyProgress(shardsOf(mv.groupMoves(mv.s.Map(), g)))
		mv.mu.Lock()
		mv.copying[g] = prog
		mv.mu.Unlock()
		defer func() {
			mv.mu.Lock()
			delete(mv.copying, g)
			mv.mu.Unlock()
		}()
	}
	backoff := 100 * time.Millisecond
	for {
		err := mv.attempt(ctx, g, prog)
		switch {
		case err == nil, errors.Is(err, errMoveGone), ctx.Err() != nil:
			return
		}
		log.Warn("shard move: retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// groupMoves returns the group's moves still in m, by shard.
func (mv *mover) groupMoves(m *clustermap.Map, g moveGroup) []clustermap.Move {
	var out []clustermap.Move
	for _, x := range m.Moves() {
		if x.To == mv.s.cfg.Name && groupOf(m, x) == g {
			out = append(out, x)
		}
	}
	return out
}

func commands(moves []clustermap.Move) []proto.MoveCommand {
	out := make([]proto.MoveCommand, len(moves))
	for i, x := range moves {
		out[i] = x.Command()
	}
	return out
}

func shardsOf(moves []clustermap.Move) []proto.Shard {
	out := make([]proto.Shard, len(moves))
	for i, x := range moves {
		out[i] = x.Shard
	}
	return out
}

// attempt runs the protocol above from wherever the group's moves stand,
// counting what it copies into prog (nil for a promotion).
func (mv *mover) attempt(ctx context.Context, g moveGroup, prog *copyProgress) error {
	s := mv.s
	m := s.Map()
	moves := mv.groupMoves(m, g)
	if len(moves) == 0 {
		return errMoveGone
	}
	shards := shardsOf(moves)
	copying := g.mode != promote
	if prog != nil {
		prog.attempt(shards)
	}
	if !copying {
		if err := mv.backsUp(shards); err != nil {
			return err
		}
	} else if err := mv.waitIncoming(ctx, shards, g.started); err != nil {
		return err
	}
	src, err := s.dialPuller(ctx, m, g.from)
	if err != nil {
		return err
	}
	defer src.close()
	src.prog = prog
	log := s.log.With("from", g.from, "shards", len(shards), "mode", g.mode)
	start := time.Now()
	var total moveStats
	frozen := moves[0].Phase == proto.MoveFrozen
	if !frozen {
		log.Info("shard move: copying", "list", shardList(shards))
		for pass := 1; copying && pass <= 2; pass++ {
			st, err := src.copyShards(ctx, shards, false)
			if err != nil {
				return err
			}
			total.keys, total.bytes = total.keys+st.keys, total.bytes+st.bytes
			log.Info("shard move: copy pass done", "pass", pass, "keys", st.keys, "bytes", st.bytes, "took", st.took.Round(time.Millisecond),
				"MiB_per_s", rate(st.bytes, st.took))
			if st.keys == 0 {
				break
			}
		}
		if m, err = s.propose(ctx, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: commands(moves)}); err != nil {
			return mv.gone(g, fmt.Errorf("freezing the moves: %w", err))
		}
	}
	freezeAt := time.Now()
	gen, err := src.fence(ctx, shards, m.Epoch())
	if err != nil {
		return mv.gone(g, err)
	}
	if copying {
		st, err := src.copyShards(ctx, shards, true)
		if err != nil {
			return err
		}
		total.keys, total.bytes = total.keys+st.keys, total.bytes+st.bytes
	}
	if g.mode != keepServing {
		if err := src.release(ctx, shards, gen, g.mode == promote); err != nil {
			return mv.gone(g, err)
		}
	}
	if g.mode == promote && mv.loseFinishes.Load() > 0 && mv.loseFinishes.Add(-1) >= 0 {
		return errors.New("finishing the moves: dropped by the test")
	}
	if m, err = s.propose(ctx, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: commands(moves)}); err != nil {
		err = mv.gone(g, fmt.Errorf("finishing the moves: %w", err))
		if errors.Is(err, errMoveGone) && mv.holdsAll(shards) {
			// The finish was committed, its answer lost (a timeout, a
			// leader change): the moves finished all the same.
			total.shards, total.took = uint64(len(shards)), time.Since(start)
			mv.add(total)
		}
		return err
	}
	total.shards, total.took = uint64(len(shards)), time.Since(start)
	mv.add(total)
	log.Info("shard move: done", "epoch", m.Epoch(), "keys", total.keys, "bytes", total.bytes, "took", total.took.Round(time.Millisecond),
		"MiB_per_s", rate(total.bytes, total.took), "writes_frozen_for", time.Since(freezeAt).Round(time.Millisecond))
	return nil
}

// gone is err, or errMoveGone when the moves ended meanwhile (an abort
// makes the freeze, fence, release and finish fail).
func (mv *mover) gone(g moveGroup, err error) error {
	if len(mv.groupMoves(mv.s.Map(), g)) == 0 {
		return errMoveGone
	}
	return err
}

// holdsAll reports whether the map gives this server a copy of every one
// of shards.
func (mv *mover) holdsAll(shards []proto.Shard) bool {
	m := mv.s.Map()
	for _, sh := range shards {
		if !slices.Contains(m.Shard(sh).Owners, mv.s.cfg.Name) {
			return false
		}
	}
	return true
}

// backsUp checks that this server backs up the shards a promotion gives
// it, from a copy of its own.
func (mv *mover) backsUp(shards []proto.Shard) error {
	for _, sh := range shards {
		if st := mv.s.st.ShardState(sh); st.State != store.ShardBackup {
			return fmt.Errorf("server: promoting %v here, which is %v here, not a backup", sh, st.State)
		}
	}
	return nil
}

// waitIncoming waits until reconcile has made the shards Incoming for this
// move.
func (mv *mover) waitIncoming(ctx context.Context, shards []proto.Shard, started uint64) error {
	for {
		ready := true
		for _, sh := range shards {
			if st := mv.s.st.ShardState(sh); st.State != store.ShardIncoming || st.Started != started {
				ready = false
				break
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func rate(bytes uint64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(bytes)/(1<<20)/d.Seconds())
}

// puller is this server's session to a move's source, with a QP and a
// registered buffer the source's records are READ into.
type puller struct {
	s     *Server
	id    string // the source's server ID
	meta  proto.NodeMeta
	c     *session.Conn
	mem   *rdma.Memory
	mr    rdma.MR
	wc    [1]rdma.Completion
	wrs   []rdma.SendWR
	sges  []rdma.SGE
	pages int
	prog  *copyProgress // where the copy counts its progress, if anywhere
}

// pullBuffer is the registered buffer a batch of records is READ into;
// a record (at most a lease) always fits.
const (
	pullBuffer = 4 << 20
	pullBatch  = 64 // READs per post
	pullPage   = 1024
)

func (s *Server) dialPuller(ctx context.Context, m *clustermap.Map, from string) (*puller, error) {
	srv, ok := m.Server(from)
	if !ok {
		return nil, errMoveGone
	}
	mb, in := s.ml.View().Member(from)
	if !in || !mb.IsServer() || mb.Meta.ServerID != srv.ID || mb.Meta.Index == nil {
		return nil, fmt.Errorf("server: the move's source %s is not alive in the gossip view", from)
	}
	p := &puller{s: s, id: srv.ID, meta: mb.Meta}
	var err error
	if p.mem, err = rdma.Alloc(pullBuffer); err != nil {
		return nil, err
	}
	if p.mr, err = s.pd.Register(p.mem.Bytes(), rdma.AccessLocalWrite); err != nil {
		p.mem.Close()
		return nil, err
	}
	cfg := s.peerConfig()
	cfg.Device, cfg.PD, cfg.CQSize = s.dev, s.pd, 2*pullBatch
	cfg.QP = rdma.QPConfig{AckTimeout: 250 * time.Millisecond, RetryCount: 3}
	if p.c, err = session.Dial(ctx, mb.Meta.ControlAddr, srv.ID, cfg); err != nil {
		p.close()
		return nil, fmt.Errorf("server: connecting to the move's source %s: %w", from, err)
	}
	if p.c.Hello.Generation != mb.Meta.Generation {
		p.close()
		return nil, fmt.Errorf("server: the move's source %s is at generation %d, the view shows %d", from, p.c.Hello.Generation, mb.Meta.Generation)
	}
	return p, nil
}

func (p *puller) close() {
	if p.c != nil {
		p.c.Close()
	}
	if p.mr != nil {
		_ = p.mr.Deregister()
	}
	if p.mem != nil {
		_ = p.mem.Close()
	}
}

// copyShards brings the copy of each shard up to the source's: it
// returns how much it copied. In the final pass (the shards fenced) a
// record that fails verification is an error; before, it was overwritten
// meanwhile and the next pass gets it.
func (p *puller) copyShards(ctx context.Context, shards []proto.Shard, final bool) (moveStats, error) {
	var st moveStats
	start := time.Now()
	for _, sh := range shards {
		if err := p.copyShard(ctx, sh, final, &st); err != nil {
			return st, fmt.Errorf("shard %d: %w", sh, err)
		}
		if p.prog != nil {
			p.prog.shardCopied(sh)
		}
	}
	st.took = time.Since(start)
	return st, nil
}

func (p *puller) copyShard(ctx context.Context, sh proto.Shard, final bool, st *moveStats) error {
	s := p.s
	local, err := s.localVersions(sh)
	if err != nil {
		return err
	}
	var after []byte
	first := true
	for {
		r, err := p.c.Call(ctx, &proto.ShardScan{Shard: sh, After: after, Limit: pullPage, Sessions: final && first})
		if err != nil {
			return err
		}
		reply := r.(*proto.ShardScanReply)
		var need []proto.ScanEntry
		for _, e := range reply.Entries {
			v, ok := local[string(e.Key)]
			delete(local, string(e.Key))
			if !ok || v != e.Version {
				need = append(need, e)
			}
		}
		records, err := p.read(ctx, need, final)
		if err != nil {
			return err
		}
		if len(records) > 0 || len(reply.Sessions) > 0 {
			if err := s.st.Ingest(ctx, sh, records, reply.Sessions, nil); err != nil {
				return err
			}
		}
		var n uint64
		for _, rec := range records {
			n += uint64(len(rec))
		}
		st.keys, st.bytes = st.keys+uint64(len(records)), st.bytes+n
		if p.prog != nil {
			p.prog.keys.Add(uint64(len(records)))
			p.prog.bytes.Add(n)
		}
		s.moves.pulledKeys.Add(uint64(len(records)))
		s.moves.pulledBytes.Add(n)
		if !reply.More || len(reply.Entries) == 0 {
			break
		}
		after, first = reply.Entries[len(reply.Entries)-1].Key, false
	}
	if len(local) == 0 {
		return nil
	}
	// What the copy holds and the source no longer lists was deleted.
	deletes := make([][]byte, 0, len(local))
	for k := range local {
		deletes = append(deletes, []byte(k))
	}
	slices.SortFunc(deletes, bytes.Compare)
	st.keys += uint64(len(deletes))
	if p.prog != nil {
		p.prog.keys.Add(uint64(len(deletes)))
	}
	s.moves.pulledKeys.Add(uint64(len(deletes)))
	return s.st.Ingest(ctx, sh, nil, nil, deletes)
}

// localVersions is the version of each key of this server's copy of sh.
func (s *Server) localVersions(sh proto.Shard) (map[string]uint64, error) {
	out := map[string]uint64{}
	var after []byte
	for {
		entries, more, err := s.st.ShardEntries(sh, after, pullPage)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out[string(e.Key)] = e.Version
		}
		if !more || len(entries) == 0 {
			return out, nil
		}
		after = entries[len(entries)-1].Key
	}
}

// read READs the records of entries out of the source's arenas, in posts
// of up to pullBatch that fit the buffer, and returns the verified ones
// (copies).
func (p *puller) read(ctx context.Context, entries []proto.ScanEntry, final bool) ([][]byte, error) {
	var out [][]byte
	buf := p.mem.Bytes()
	for len(entries) > 0 {
		p.wrs, p.sges = p.wrs[:0], p.sges[:0]
		off, n := 0, 0
		for n < len(entries) && n < pullBatch && off+int(entries[n].Length) <= len(buf) {
			e := entries[n]
			a, ok := proto.LocateRecord(p.meta.Arenas, proto.Location{Arena: e.Arena, Offset: e.Offset, Length: e.Length})
			if !ok || e.Length < proto.RecordHeaderSize {
				return nil, fmt.Errorf("server: the source's record of %q at arena %d offset %d (%d bytes) is outside its advertised arena regions", e.Key, e.Arena, e.Offset, e.Length)
			}
			p.sges = append(p.sges, rdma.SGE{MR: p.mr, Offset: off, Length: int(e.Length)})
			p.wrs = append(p.wrs, rdma.SendWR{ID: uint64(n), Op: rdma.OpRead, RemoteAddr: a.RemoteAddr(e.Offset), RKey: a.RKey})
			off += int(e.Length)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("server: a record of %d bytes does not fit the %d-byte pull buffer", entries[0].Length, len(buf))
		}
		for i := range p.wrs {
			p.wrs[i].SGL = p.sges[i : i+1]
		}
		p.wrs[n-1].Flags = rdma.Signaled
		if err := p.c.QP.PostSend(p.wrs); err != nil {
			return nil, err
		}
		if _, err := p.c.CQ.Wait(ctx, p.wc[:]); err != nil {
			return nil, err
		}
		if err := p.wc[0].Err(); err != nil {
			return nil, fmt.Errorf("server: READ from the move's source: %w", err)
		}
		for i := range n {
			e, sg := entries[i], p.sges[i]
			rec := buf[sg.Offset : sg.Offset+sg.Length]
			r, err := proto.VerifyRecord(rec, e.Key, 0)
			if err == nil && r.Version != e.Version {
				err = fmt.Errorf("version %d, listed %d", r.Version, e.Version)
			}
			if err != nil {
				if final {
					return nil, fmt.Errorf("server: the fenced source's record of %q: %w", e.Key, err)
				}
				continue // overwritten meanwhile: the next pass gets it
			}
			out = append(out, append([]byte(nil), rec...))
		}
		entries = entries[n:]
	}
	return out, nil
}

func (p *puller) fence(ctx context.Context, shards []proto.Shard, epoch uint64) (uint64, error) {
	r, err := p.c.Call(ctx, &proto.FenceShards{Shards: shards, Epoch: epoch})
	if err != nil {
		return 0, fmt.Errorf("server: fencing the shards at the source: %w", err)
	}
	return r.(*proto.FenceReply).Generation, nil
}

func (p *puller) release(ctx context.Context, shards []proto.Shard, gen uint64, asBackup bool) error {
	if _, err := p.c.Call(ctx, &proto.ReleaseShards{Shards: shards, Generation: gen, Backup: asBackup}); err != nil {
		return fmt.Errorf("server: releasing the shards at the source: %w", err)
	}
	return nil
}

// ---- the source's side ----

// shardScan lists a shard's entries for a move's target.
func (s *Server) shardScan(req *proto.ShardScan) proto.Message {
	limit := int(min(max(req.Limit, 1), 4096))
	entries, more, err := s.st.ShardEntries(req.Shard, req.After, limit)
	if err != nil {
		return errorReply(err)
	}
	out := &proto.ShardScanReply{More: more}
	size := 64
	if req.Sessions {
		out.Sessions = s.st.ShardSessions(req.Shard)
		size += 40 * len(out.Sessions)
	}
	var cut bool
	out.Entries, cut = scanEntries(entries, size)
	out.More = out.More || cut
	return out
}

// frozenHere checks that map m freezes moves of every shard away from this
// server.
func (s *Server) frozenHere(m *clustermap.Map, shards []proto.Shard) error {
	for _, sh := range shards {
		info := m.Shard(sh)
		if info.Owner() != s.cfg.Name || info.Move == nil || info.Move.Phase != proto.MoveFrozen {
			return fmt.Errorf("shard %d is not frozen for a move away from %s at map epoch %d", sh, s.cfg.Name, m.Epoch())
		}
	}
	return nil
}

// madeBackupsFor reports whether this server, the primary of shards in m,
// already made every one of them a backup for its promotion: only a
// promotion's release leaves a primary's shard in backup state.
func (s *Server) madeBackupsFor(m *clustermap.Map, shards []proto.Shard) bool {
	for _, sh := range shards {
		info := m.Shard(sh)
		if info.Move == nil || info.Move.Kind != proto.MovePromote || s.st.ShardState(sh).State != store.ShardBackup {
			return false
		}
	}
	return len(shards) > 0
}

// fenceShards stops writes to shards a move is taking from this server.
func (s *Server) fenceShards(req *proto.FenceShards) proto.Message {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.waitEpoch(ctx, req.Epoch)
	if err != nil {
		return &proto.Error{Code: proto.CodeUnavailable, Message: err.Error()}
	}
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	if err := s.frozenHere(m, req.Shards); err != nil {
		return &proto.Error{Code: proto.CodeBadRequest, Message: err.Error()}
	}
	if s.madeBackupsFor(m, req.Shards) {
		// A promotion retried after this server made them backups (its
		// finish failed: a leader change): fenced since.
		s.log.Info("shards already made backups for a promotion: fenced", "shards", len(req.Shards), "epoch", m.Epoch())
		return &proto.FenceReply{Generation: s.gen}
	}
	if err := s.st.FreezeShards(ctx, req.Shards); err != nil {
		return errorReply(err)
	}
	s.log.Info("shards fenced for a move", "shards", len(req.Shards), "epoch", m.Epoch())
	return &proto.FenceReply{Generation: s.gen}
}

// releaseShards hands fenced shards over.
func (s *Server) releaseShards(req *proto.ReleaseShards) proto.Message {
	if req.Generation != s.gen {
		return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("fenced at generation %d, this server restarted since (generation %d): fence again", req.Generation, s.gen)}
	}
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	if err := s.frozenHere(s.Map(), req.Shards); err != nil {
		return &proto.Error{Code: proto.CodeBadRequest, Message: err.Error()}
	}
	for _, sh := range req.Shards {
		if st := s.st.ShardState(sh); st.State == store.ShardOwned && !st.Frozen {
			return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("shard %d is not fenced here: fence again", sh)}
		}
	}
	if req.Backup {
		// A promotion of a backup: keep the data as a backup, under the
		// since the shards have until the promotion finishes (the next
		// map's reconcile gives them the new primary's).
		m := s.Map()
		for _, sh := range req.Shards {
			if s.st.ShardState(sh).State == store.ShardBackup {
				continue // made a backup by an earlier attempt of the promotion
			}
			since := m.Shard(sh).Since
			if err := s.st.BeginBackup([]proto.Shard{sh}, since); err != nil {
				return errorReply(err)
			}
		}
		s.log.Info("shards made backups for a promotion", "shards", len(req.Shards), "list", shardList(req.Shards))
		return &proto.Ack{}
	}
	if err := s.st.ReleaseShards(req.Shards); err != nil {
		return errorReply(err)
	}
	s.log.Info("shards released to a move", "shards", len(req.Shards), "list", shardList(req.Shards))
	return &proto.Ack{}
}
