// The server's part in the cluster map: each new map applied to the store's shards, the leader's duties, changes proposed from any server.

package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/clustermap/replica"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// raftAddrOf tells Raft where the server with data directory ID id is now:
// its control address as it gossips it. Servers whose control port
// changes across restarts stay reachable.
func (s *Server) raftAddrOf(id string) (string, bool) {
	ml := s.mlReady.Load()
	if ml == nil {
		return "", false
	}
	for _, mb := range ml.View().Servers() {
		if mb.Meta.ServerID == id && mb.Meta.ControlAddr != "" {
			return raftAddr(id, mb.Meta.ControlAddr), true
		}
	}
	return "", false
}

// watchMap applies every new map: to the store's shards (reconcile), to
// the migrations into this server, and to the epoch it gossips.
func (s *Server) watchMap() {
	defer s.wg.Done()
	gossiped := uint64(0)
	for {
		changed := s.node.Changed()
		m := s.Map()
		s.reconcile(m)
		s.moves.sync(m)
		if m.Epoch() != gossiped {
			if err := s.setMeta(func(meta *proto.NodeMeta) { meta.MapEpoch, meta.ClusterID = m.Epoch(), m.ClusterID() }); err != nil {
				s.log.Warn("gossiping the map epoch", "err", err)
			} else {
				gossiped = m.Epoch()
			}
			s.log.Info("cluster map", "epoch", m.Epoch(), "map", m.String())
		}
		if !m.Bootstrapped() {
			s.checkAdmission()
		}
		select {
		case <-s.stop:
			return
		case <-changed:
		case <-time.After(time.Second): // retry what failed
		}
	}
}

// checkAdmission is what a server waiting to be added does: it asks a
// live server for the map, and if that map knows this server's name under
// another data directory (this one lost its data, or took another's name)
// it reports itself refused (Err) instead of waiting forever.
func (s *Server) checkAdmission() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, mb := range s.ml.View().Servers() {
		if mb.Name == s.cfg.Name || mb.Meta.MapEpoch == 0 || mb.Meta.ServerID == "" {
			continue
		}
		r, err := s.peers.call(ctx, mb.Meta.ServerID, mb.Meta.ControlAddr, &proto.GetMap{})
		if err != nil {
			continue
		}
		m, err := clustermap.Decode(r.(*proto.MapReply).Map)
		if err != nil {
			continue
		}
		if srv, ok := m.Server(s.cfg.Name); ok && srv.ID != s.id && srv.State != proto.ServerRemoved {
			s.replacing(m, srv, mb.Name)
		}
		if _, ok := m.ServerByID(s.id); ok {
			if srv, _ := m.ServerByID(s.id); srv.State == proto.ServerRemoved {
				s.fatal(fmt.Errorf("%w (map epoch %d): this data directory (%s) cannot rejoin; start on an empty one", ErrRemoved, m.Epoch(), s.id))
			}
		}
		return
	}
}

// replacing is checkAdmission's answer to a map, from the server named
// from, that knows this server's name under another data directory, srv.
// When every shard srv holds has a copy elsewhere (R > 1), the map's
// leader swaps it for this server once its shards failed over and its
// backups were dropped: this server waits for that, up to replaceWait.
// Otherwise, or after that, it is refused.
func (s *Server) replacing(m *clustermap.Map, srv clustermap.Server, from string) {
	me := s.cfg.Name
	h := m.Holding(me)
	first, waited := s.replaceSeen.LoadOrStore(srv.ID, time.Now())
	if h.Sole == 0 && time.Since(first.(time.Time)) < replaceWait {
		if !waited {
			s.log.Warn("the cluster map knows this server's name with another data directory, whose shards all have copies elsewhere: waiting for the map's leader to swap it for this one",
				"server", me, "map_id", srv.ID, "this_id", s.id, "shards", h.Shards, "for_at_most", replaceWait)
		}
		return
	}
	why := fmt.Sprintf("it was not swapped for this one within %v", replaceWait)
	if h.Sole > 0 {
		why = fmt.Sprintf("%d of its shards have their only copy there", h.Sole)
	}
	s.fatal(fmt.Errorf("server: the cluster map (epoch %d, from %s) knows %s with data directory ID %s, and this data directory is %s: refused (%s). If %s lost its data, remove it first (rkv-client forget %s --force), then start this one again",
		m.Epoch(), from, me, srv.ID, s.id, why, me, me))
}

// replaceWait bounds how long a server whose name the map knows under
// another data directory waits to be swapped for it: the failover and the
// drop of the old one's backups take seconds, a move it was in up to
// MoveTimeout.
const replaceWait = time.Minute

// mapFile holds the newest map whose shard changes the store has made.
// After a restart the replica's map may lag (Raft replays the log once the
// leader confirms it): the server serves this one until the replica
// catches up, and never applies an older map than it (which would undo a
// hand-over). Maps of one cluster form one history, so the one of the
// higher epoch is the newer.
const mapFile = "cluster.map"

func (s *Server) loadSavedMap() error {
	b, err := os.ReadFile(filepath.Join(s.cfg.Store.Dir, mapFile))
	if errors.Is(err, os.ErrNotExist) {
		s.saved.Store(clustermap.Empty)
		return nil
	}
	if err != nil {
		return fmt.Errorf("server: reading the saved cluster map: %w", err)
	}
	m, err := clustermap.Decode(b)
	if err != nil {
		return fmt.Errorf("server: %s: %w (remove it only if the data directory is not in use: the server then waits for the map's replica)", mapFile, err)
	}
	s.saved.Store(m)
	return nil
}

func (s *Server) saveMap(m *clustermap.Map) error {
	b, err := m.Encode()
	if err != nil {
		return err
	}
	path := filepath.Join(s.cfg.Store.Dir, mapFile)
	if err := writeSynced(path+".tmp", b); err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	s.saved.Store(m)
	return nil
}

// Map is the cluster map this server holds now: its replica's, or the one
// it saved when that is newer (just after a restart).
func (s *Server) Map() *clustermap.Map {
	m, saved := s.node.Map(), s.saved.Load()
	if saved.Epoch() > m.Epoch() {
		return saved
	}
	return m
}

// shardActions is what one reconcile asks of the store.
type shardActions struct {
	release, drop, unfreeze []proto.Shard
	activate                map[uint64][]proto.Shard // by since
	incoming                map[uint64][]proto.Shard // by the move's start
	backup                  map[uint64][]proto.Shard // by the primary's since
}

// reconcile brings the store's shard states to what map m says of this
// server (see docs/ARCHITECTURE.md, "Shards on a server"):
//
//   - a shard it owns is served: from its own data (Owned), from the copy
//     a finished move brought (Incoming whose move start is the shard's
//     Origin), from its data again after a move away was aborted
//     (Released with the same Since), or empty when the map gave it empty
//     (Origin 0: the bootstrap, a forced removal);
//   - a shard moving to it is Incoming, for that move;
//   - a shard it is a backup of is a backup (ShardBackup): from the copy
//     a finished move brought (Incoming whose move start is its origin),
//     or empty when the map gave it empty (origin 0);
//   - any other shard it holds is released and dropped.
//
// It never applies a map older than one it applied before.
func (s *Server) reconcile(m *clustermap.Map) {
	s.shardMu.Lock()
	defer s.shardMu.Unlock()
	if !m.Bootstrapped() || m.Epoch() < s.saved.Load().Epoch() {
		return
	}
	me := s.cfg.Name
	switch srv, ok := m.Server(me); {
	case ok && srv.ID == s.id && srv.State == proto.ServerRemoved:
		// Removed: it gives everything up below, and has nothing to
		// serve after.
		s.fatal(fmt.Errorf("%w (map epoch %d): %s serves nothing any more (to rejoin, start it on an empty data directory)", ErrRemoved, m.Epoch(), me))
	case ok && srv.ID != s.id && srv.State != proto.ServerRemoved:
		// The map reached this server's replica before the leader swapped
		// the old data directory's entry for it: it waits for the swap as
		// admission does, or is refused.
		s.replacing(m, srv, "this server's replica")
		return
	}
	states := s.st.Shards()
	a := shardActions{activate: map[uint64][]proto.Shard{}, incoming: map[uint64][]proto.Shard{}, backup: map[uint64][]proto.Shard{}}
	var takenAway []proto.Shard
	for i := range proto.NumShards {
		sh, st := proto.Shard(i), states[i]
		info := m.Shard(sh)
		if info.Owner() == me {
			s.ownShard(&a, sh, info, st)
			continue
		}
		i := slices.Index(info.Owners, me)
		if mv := info.Move; mv != nil && mv.To == me && i < 0 { // a copy in (a promotion's target already holds one)
			switch {
			case st.State == store.ShardIncoming && st.Started == mv.Started:
			case st.State == store.ShardNone:
				a.incoming[mv.Started] = append(a.incoming[mv.Started], sh)
			default: // a stale copy, or data of an earlier ownership
				a.dropFirst(sh, st)
				a.incoming[mv.Started] = append(a.incoming[mv.Started], sh)
			}
			continue
		}
		if i > 0 {
			s.backShard(&a, sh, info, info.Origins[i], st)
			continue
		}
		if st.State != store.ShardNone {
			if st.State == store.ShardOwned {
				takenAway = append(takenAway, sh)
			}
			a.dropFirst(sh, st)
		}
	}
	if len(takenAway) > 0 {
		// A failover or a forced removal while this server was paused or
		// cut off: it served them until this map.
		s.log.Warn("the map gives shards this server serves to others: dropping them", "count", len(takenAway), "epoch", m.Epoch(), "shards", shardList(takenAway))
	}
	if failed := s.apply(&a); !failed && m.Epoch() > s.saved.Load().Epoch() {
		if err := s.saveMap(m); err != nil {
			s.log.Error("saving the map applied", "epoch", m.Epoch(), "err", err)
		}
	}
}

// ownShard decides what serving shard sh, which map entry info gives to
// this server, takes from its state st.
func (s *Server) ownShard(a *shardActions, sh proto.Shard, info clustermap.Shard, st store.ShardStatus) {
	frozen := info.Move != nil && info.Move.Phase == proto.MoveFrozen
	switch st.State {
	case store.ShardOwned:
		if st.Since == info.Since {
			if st.Frozen && !frozen {
				a.unfreeze = append(a.unfreeze, sh) // the move was aborted or restarted
			}
			return
		}
		// Owned under another Since: not a hand-over this server took part
		// in. Start over from what the map says.
		a.dropFirst(sh, st)
	case store.ShardReleased:
		if st.Since == info.Since {
			if !frozen { // the move away was aborted: serve the data again
				a.activate[info.Since] = append(a.activate[info.Since], sh)
			}
			return // frozen: the target is finishing
		}
		a.dropFirst(sh, st)
	case store.ShardIncoming:
		if info.Move == nil && info.Origin != 0 && st.Started == info.Origin {
			a.activate[info.Since] = append(a.activate[info.Since], sh) // the move in finished
			return
		}
		a.dropFirst(sh, st)
	case store.ShardBackup:
		if frozen && info.Move.Kind == proto.MovePromote {
			return // made a backup for a promotion of another replica, which is finishing
		}
		// Promoted (its replica is the shard's data now: a promotion, a
		// forced removal of the primary), or a promotion away aborted.
		// Also under a frozen move of another kind: a failover made this
		// backup the primary, and a move away froze before this server
		// served it; the move's fence here needs it owned, and waits.
		a.activate[info.Since] = append(a.activate[info.Since], sh)
		return
	}
	if info.Origin != 0 {
		s.log.Error("the map gives this server a shard from a copy it does not hold: not serving it", "shard", sh, "origin", info.Origin)
		return
	}
	a.activate[info.Since] = append(a.activate[info.Since], sh) // given empty
}

// backShard decides what backing up shard sh, which map entry info gives
// to this server from the copy of the move started at origin (0: empty),
// takes from its state st.
func (s *Server) backShard(a *shardActions, sh proto.Shard, info clustermap.Shard, origin uint64, st store.ShardStatus) {
	switch {
	case st.State == store.ShardBackup:
		if st.Since != info.Since {
			a.backup[info.Since] = append(a.backup[info.Since], sh) // another primary: the same data, under its since
		}
		return
	case st.State == store.ShardIncoming && origin != 0 && st.Started == origin:
		a.backup[info.Since] = append(a.backup[info.Since], sh) // the copy an added replica made
		return
	}
	a.dropFirst(sh, st)
	if origin != 0 {
		s.log.Error("the map makes this server a backup from a copy it does not hold: not backing it up", "shard", sh, "origin", origin)
		return
	}
	a.backup[info.Since] = append(a.backup[info.Since], sh) // given empty
}

func (a *shardActions) dropFirst(sh proto.Shard, st store.ShardStatus) {
	if st.State == store.ShardOwned {
		a.release = append(a.release, sh)
	}
	if st.State != store.ShardNone {
		a.drop = append(a.drop, sh)
	}
}

// apply carries out a reconcile's actions; it reports whether any failed
// (the next reconcile retries).
func (s *Server) apply(a *shardActions) (failed bool) {
	try := func(what string, shards []proto.Shard, f func([]proto.Shard) error) {
		if len(shards) == 0 {
			return
		}
		if err := f(shards); err != nil {
			s.log.Error("applying the cluster map to the store", "action", what, "shards", len(shards), "err", err)
			failed = true
			return
		}
		s.log.Info("shards "+what, "count", len(shards), "shards", shardList(shards))
	}
	try("released", a.release, s.st.ReleaseShards)
	try("dropped", a.drop, s.st.DropShards)
	for started, shards := range a.incoming {
		try("incoming", shards, func(sh []proto.Shard) error { return s.st.BeginIncoming(sh, started) })
	}
	for since, shards := range a.activate {
		try("served", shards, func(sh []proto.Shard) error { return s.st.ActivateShards(sh, since) })
	}
	for since, shards := range a.backup {
		try("backed up", shards, func(sh []proto.Shard) error { return s.st.BeginBackup(sh, since) })
	}
	try("unfrozen", a.unfreeze, func(sh []proto.Shard) error { s.st.UnfreezeShards(sh); return nil })
	return failed
}

// shardList abbreviates a shard list for a log line.
func shardList(shards []proto.Shard) string {
	var b strings.Builder
	for i, sh := range shards {
		if i == 8 {
			fmt.Fprintf(&b, " ... (%d more)", len(shards)-i)
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprint(&b, uint16(sh))
	}
	return b.String()
}

// lead does the map leader's duties while this server leads.
func (s *Server) lead() {
	defer s.wg.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	l := &leader{s: s, down: map[string]time.Time{}, warned: map[string]time.Time{}, watch: newProcessWatch(s.peerConfig())}
	s.watch.Store(l.watch)
	defer l.watch.stop()
	for {
		// A map change wakes the leader at once, as well as the tick: the
		// next group of moves starts as soon as one finishes (waiting for
		// the tick cost a re-replication about a quarter second per group
		// of 32 shards, whatever their size). So does winning or losing
		// the lead: a new leader starts its duties (and a server that
		// bootstrapped a cluster its first map) without waiting for the
		// tick.
		select {
		case <-s.stop:
			return
		case <-tick.C:
		case <-s.node.LeadershipChanged():
		case <-s.node.Changed():
			if !l.active {
				continue
			}
		}
		if !s.node.IsLeader() {
			if l.active {
				s.stopLeading()
			}
			l.active = false
			l.watchLeader()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if !l.active {
			// A new leader's replica may lag the log it now leads.
			if err := s.node.Barrier(ctx); err != nil {
				cancel()
				continue
			}
			l.active = true
			s.startLeading()
			s.log.Info("leading the cluster map", "map", s.node.Map().String())
		}
		l.duties(ctx)
		cancel()
	}
}

// leader is the state of the leader's duties.
type leader struct {
	s      *Server
	active bool
	down   map[string]time.Time // since when a map server has been out of the gossip view, or its process gone
	warned map[string]time.Time // rate limit of repeated warnings
	watch  *processWatch        // of every map server while active, of the leader otherwise
}

// watchLeader points the process watch at the map's leader alone, and
// keeps it on the last one known while an election finds none: if the
// leader's process dies, the server elected next knows since when, and
// fails its shards over once FailoverTimeout has passed since then, not
// since it began to lead (it also need not wait out their read lease).
func (l *leader) watchLeader() {
	id, _ := l.s.node.Leader()
	if id == "" || id == l.s.id {
		return
	}
	want := map[string][2]string{}
	for _, srv := range l.s.node.Map().Servers() {
		if srv.ID != id {
			continue
		}
		if mb := l.s.ml.View().Lookup(srv.Name); mb != nil && mb.MetaErr == nil && mb.Meta.ServerID == id && mb.Meta.ControlAddr != "" {
			want[srv.Name] = [2]string{id, mb.Meta.ControlAddr}
		}
	}
	if len(want) > 0 {
		l.watch.sync(want)
	}
}

// watchServers points the process watch at the map's servers other than
// this one, at the control address they last gossiped: a server that
// left, or died before this server led, is watched all the same (a
// server that moved to another address gossips it, alive).
func (l *leader) watchServers(m *clustermap.Map, view *membership.View) {
	want := map[string][2]string{}
	for _, srv := range m.Servers() {
		if srv.State == proto.ServerRemoved || srv.Name == l.s.cfg.Name {
			continue
		}
		if mb := view.Lookup(srv.Name); mb != nil && mb.MetaErr == nil && mb.Meta.ServerID == srv.ID && mb.Meta.ControlAddr != "" {
			want[srv.Name] = [2]string{srv.ID, mb.Meta.ControlAddr}
		}
	}
	l.watch.sync(want)
}

func (l *leader) warn(key, msg string, args ...any) {
	if t, ok := l.warned[key]; ok && time.Since(t) < time.Minute {
		return
	}
	l.warned[key] = time.Now()
	l.s.log.Warn(msg, args...)
}

func (l *leader) propose(ctx context.Context, c *proto.MapCommand) *clustermap.Map {
	m, err := l.s.proposeLocal(ctx, c)
	if err != nil {
		l.s.log.Warn("map change refused", "op", c.Op.String(), "err", err)
		return nil
	}
	return m
}

// duties: bootstrap the map, add servers that joined, keep the Raft
// voters, abort stalled moves, plan moves, remove drained and long-dead
// servers.
func (l *leader) duties(ctx context.Context) {
	s := l.s
	m := s.node.Map()
	if !m.Bootstrapped() {
		if l.propose(ctx, &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: s.cfg.Name, ID: s.id, Zone: s.cfg.Zone}}) != nil && s.cfg.Replicas > 1 {
			if next := l.propose(ctx, &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: s.cfg.Replicas}); next != nil {
				s.log.Info("new cluster: replicas set", "replicas", next.Replicas(), "epoch", next.Epoch())
			}
		}
		return
	}
	view := s.ml.View()
	l.watchServers(m, view)
	alive := func(name string) bool {
		srv, ok := m.Server(name)
		mb, in := view.Member(name)
		_, gone := l.watch.goneSince(name)
		return ok && in && mb.IsServer() && mb.Meta.ServerID == srv.ID && !gone
	}
	now := time.Now()
	for _, srv := range m.Servers() {
		if srv.State == proto.ServerRemoved {
			continue
		}
		if alive(srv.Name) {
			delete(l.down, srv.Name)
		} else if _, ok := l.down[srv.Name]; !ok {
			since := now
			if t, gone := l.watch.goneSince(srv.Name); gone {
				since = t
				s.log.Info("a server's process is gone: its session with this server ended and its control address refuses connections", "server", srv.Name)
			}
			l.down[srv.Name] = since
		}
	}
	for _, mb := range view.Servers() {
		if mb.Meta.ServerID == "" {
			continue
		}
		if mb.Meta.ClusterID != 0 && mb.Meta.ClusterID != m.ClusterID() {
			l.warn("cluster/"+mb.Name, "a gossip member belongs to another cluster: ignored", "member", mb.Name, "its_cluster", fmt.Sprintf("%x", mb.Meta.ClusterID), "ours", fmt.Sprintf("%x", m.ClusterID()))
			continue
		}
		switch srv, ok := m.Server(mb.Name); {
		case ok && srv.State == proto.ServerRemoved && srv.ID == mb.Meta.ServerID:
			l.warn("removed/"+mb.Name, "a server removed from the cluster still runs: stop it", "server", mb.Name, "id", srv.ID)
		case !ok, srv.State == proto.ServerRemoved: // new, or the name rejoining on an empty data directory
			if next := l.propose(ctx, &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: mb.Name, ID: mb.Meta.ServerID, Zone: mb.Meta.Zone}}); next != nil {
				s.log.Info("server added to the cluster map", "server", mb.Name, "id", mb.Meta.ServerID, "zone", mb.Meta.Zone, "epoch", next.Epoch())
				m = next
			}
		case srv.ID == mb.Meta.ServerID && srv.Zone != mb.Meta.Zone: // restarted with another zone: AddServer relabels it
			if next := l.propose(ctx, &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: mb.Name, ID: mb.Meta.ServerID, Zone: mb.Meta.Zone}}); next != nil {
				s.log.Info("server's zone changed in the cluster map", "server", mb.Name, "zone", mb.Meta.Zone, "was", srv.Zone, "epoch", next.Epoch())
				m = next
			}
		case srv.ID != mb.Meta.ServerID:
			// The name back on another data directory (a disk lost and
			// replaced). Once the old one holds nothing, because its
			// shards failed over and its backups were dropped (R > 1),
			// it is removed, losslessly, and the new one added next.
			h := m.Holding(srv.Name)
			if h.Shards > 0 || h.Moves > 0 {
				if h.Sole > 0 {
					l.warn("id/"+mb.Name, "refusing a server whose data directory is not the one the map knows (did it lose its data?); forget the old one first",
						"server", mb.Name, "its_id", mb.Meta.ServerID, "map_id", srv.ID, "shards_only_there", h.Sole)
				}
				continue
			}
			if next := l.propose(ctx, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: srv.Name}}); next != nil {
				s.log.Warn("a server came back on another data directory: the old one, whose shards have their copies elsewhere, is removed, and the new one joins empty",
					"server", srv.Name, "old_id", srv.ID, "new_id", mb.Meta.ServerID, "epoch", next.Epoch())
				m = next
			}
		}
	}
	l.voters(ctx, m, alive)
	m = l.abortStalled(ctx, s.node.Map())
	m = l.failOver(ctx, m, alive)
	m = l.dropDeadBackups(ctx, m)
	m = l.dropSurplus(ctx, m)
	// New moves start in batches of at least half the budget: a worker runs
	// the moves started together as one group, and topping the budget up by
	// the one or two moves that just finished would split the work into
	// one-shard groups, each paying for its own copy, freeze, fence and two
	// map proposals (1,024 shards took minutes to place that way).
	if budget := s.cfg.MaxMoves - len(m.Moves()); budget > 0 && 2*budget >= s.cfg.MaxMoves {
		if plan := clustermap.Plan(m, alive, budget); len(plan) > 0 {
			if next := l.propose(ctx, &proto.MapCommand{Op: proto.MapStartMoves, Moves: plan}); next != nil {
				s.log.Info("shard moves started", "moves", len(plan), "epoch", next.Epoch(), "map", next.String())
				m = next
			}
		}
	}
	l.removeServers(ctx, m)
}

// desiredVoters is the largest odd number of voters up to want among n
// servers.
func desiredVoters(n, want int) int {
	v := min(n, want)
	if v%2 == 0 {
		v--
	}
	return max(v, 1)
}

// voters adds the map's live servers to the Raft group, as voters while
// there are fewer than desired, and removes those the map no longer has.
func (l *leader) voters(ctx context.Context, m *clustermap.Map, alive func(string) bool) {
	s := l.s
	members, err := s.node.Members()
	if err != nil {
		return
	}
	in := map[string]replica.Member{}
	voters := 0
	for _, mem := range members {
		in[mem.ID] = mem
		if mem.Voter {
			voters++
		}
	}
	var servers []clustermap.Server
	for _, srv := range m.Servers() {
		if srv.State != proto.ServerRemoved {
			servers = append(servers, srv)
		}
	}
	want := desiredVoters(len(servers), s.cfg.Voters)
	for _, srv := range servers {
		addr, ok := s.raftAddrOf(srv.ID)
		if !ok || !alive(srv.Name) {
			continue
		}
		mem, known := in[srv.ID]
		switch {
		case known && mem.Voter:
		case voters < want:
			if err := s.node.AddVoter(ctx, srv.ID, addr); err != nil {
				s.log.Warn("adding a Raft voter", "server", srv.Name, "err", err)
				continue
			}
			voters++
			s.log.Info("Raft voter added", "server", srv.Name, "voters", voters)
		case !known:
			if err := s.node.AddNonvoter(ctx, srv.ID, addr); err != nil {
				s.log.Warn("adding a Raft nonvoter", "server", srv.Name, "err", err)
				continue
			}
			s.log.Info("Raft nonvoter added", "server", srv.Name)
		}
	}
	l.replaceDeadVoters(ctx, m, in, alive)
	for id := range in {
		if srv, ok := m.ServerByID(id); (!ok || srv.State == proto.ServerRemoved) && id != s.id {
			if err := s.node.RemoveMember(ctx, id); err != nil {
				s.log.Warn("removing a Raft member", "id", id, "err", err)
			} else {
				s.log.Info("Raft member removed", "id", id)
			}
		}
	}
}

// replaceDeadVoters gives the vote of each voter down longer than
// FailoverTimeout to a live nonvoter, so that the group keeps its quorum
// through another loss: with three voters among five servers, two voters
// lost one after the other would stop the map (no failover, no read lease)
// though three servers live. The nonvoter is promoted first (one voter
// more for a moment, the quorum still in reach with one of them down),
// then the dead one demoted; back, it votes again only if a vote is free.
// in is the Raft configuration by ID; it is updated.
func (l *leader) replaceDeadVoters(ctx context.Context, m *clustermap.Map, in map[string]replica.Member, alive func(string) bool) {
	s := l.s
	for id, mem := range in {
		dead, ok := m.ServerByID(id)
		if !mem.Voter || id == s.id || !ok || alive(dead.Name) || l.downFor(dead.Name) <= s.cfg.FailoverTimeout {
			continue
		}
		var sub clustermap.Server
		for _, srv := range m.Servers() {
			if c, known := in[srv.ID]; known && !c.Voter && srv.State == proto.ServerActive && alive(srv.Name) {
				sub = srv
				break
			}
		}
		if sub.ID == "" {
			return // no live nonvoter: nothing to give the vote to
		}
		if err := s.node.AddVoter(ctx, sub.ID, in[sub.ID].Addr); err != nil {
			s.log.Warn("promoting a Raft nonvoter in place of a dead voter", "server", sub.Name, "dead", dead.Name, "err", err)
			return
		}
		in[sub.ID] = replica.Member{ID: sub.ID, Addr: in[sub.ID].Addr, Voter: true}
		if err := s.node.DemoteVoter(ctx, id); err != nil {
			s.log.Warn("demoting a dead Raft voter", "server", dead.Name, "err", err)
			return
		}
		in[id] = replica.Member{ID: id, Addr: mem.Addr}
		s.log.Warn("Raft vote moved from a server down to a live one", "from", dead.Name, "down_for", l.downFor(dead.Name).Round(time.Millisecond), "to", sub.Name)
	}
}

// abortStalled aborts moves whose source or target has been down longer
// than MoveTimeout, and moves to servers being drained.
func (l *leader) abortStalled(ctx context.Context, m *clustermap.Map) *clustermap.Map {
	var stalled []proto.MoveCommand
	for _, mv := range m.Moves() {
		to, _ := m.Server(mv.To)
		if to.State == proto.ServerDraining || l.downFor(mv.From) > l.s.cfg.MoveTimeout || l.downFor(mv.To) > l.s.cfg.MoveTimeout {
			stalled = append(stalled, mv.Command())
		}
	}
	if len(stalled) == 0 {
		return m
	}
	next := l.propose(ctx, &proto.MapCommand{Op: proto.MapAbortMoves, Moves: stalled})
	if next == nil {
		return m
	}
	l.s.log.Warn("shard moves aborted: a server they need is down or draining", "moves", len(stalled), "epoch", next.Epoch())
	return next
}

// failOver hands each shard whose primary has been down longer than
// FailoverTimeout to its first live backup (clustermap's MapFailOver: the
// backup becomes the shard's only owner, and the planner adds replicas
// again). A shard with no live backup stays unavailable, as at one
// replica.
func (l *leader) failOver(ctx context.Context, m *clustermap.Map, alive func(string) bool) *clustermap.Map {
	var moves []proto.MoveCommand
	dead := map[string]int{}
	for i := range proto.NumShards {
		sh := proto.Shard(i)
		// Holders and Owner allocate nothing, Shard does: this runs every
		// tick of the leader.
		if owner, _ := m.Owner(sh); m.Holders(sh) < 2 || l.downFor(owner) <= l.s.cfg.FailoverTimeout {
			continue
		}
		info := m.Shard(sh)
		if left := l.s.leaseLeftAtLeader(m, info.Owner()); left > 0 {
			l.warn("lease/"+info.Owner(), "primary down: its shards fail over once its read lease ends", "server", info.Owner(), "in", left.Round(time.Millisecond))
			continue
		}
		for _, b := range info.Owners[1:] {
			if alive(b) {
				moves = append(moves, proto.MoveCommand{Shard: sh, From: info.Owner(), To: b})
				dead[info.Owner()]++
				break
			}
		}
	}
	if len(moves) == 0 {
		return m
	}
	next := l.propose(ctx, &proto.MapCommand{Op: proto.MapFailOver, Moves: moves})
	if next == nil {
		return m
	}
	for name, n := range dead {
		_, gone := l.watch.goneSince(name)
		l.s.log.Warn("primary down: its shards failed over to their backups", "server", name, "shards", n, "down_for", l.downFor(name).Round(time.Millisecond),
			"process_gone", gone, "epoch", next.Epoch())
	}
	return next
}

// dropDeadBackups drops from their shards' owners the backups that have
// been down longer than BackupTimeout (and take part in no move of the
// shard): a write waits for every backup, and would wait for them.
func (l *leader) dropDeadBackups(ctx context.Context, m *clustermap.Map) *clustermap.Map {
	if m.Replicas() < 2 {
		return m
	}
	var drops []proto.MoveCommand
	dead := map[string]bool{}
	for i := range proto.NumShards {
		sh := proto.Shard(i)
		if m.Holders(sh) < 2 {
			continue
		}
		info := m.Shard(sh)
		for _, b := range info.Owners[1:] {
			if info.Move != nil && (info.Move.From == b || info.Move.To == b) {
				continue
			}
			if l.downFor(b) > l.s.cfg.BackupTimeout {
				drops = append(drops, proto.MoveCommand{Shard: sh, From: b})
				dead[b] = true
			}
		}
	}
	if len(drops) == 0 {
		return m
	}
	next := l.propose(ctx, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: drops})
	if next == nil {
		return m
	}
	l.s.log.Warn("backups dropped from their shards: their servers are down", "servers", slices.Sorted(maps.Keys(dead)), "replicas", len(drops), "epoch", next.Epoch())
	return next
}

// dropSurplus drops backups from the shards that hold more replicas than
// the map's count (clustermap.PlanDrops: after the count was lowered, from
// the servers holding the most). A backup's server drops its copy when it
// applies the map; a write its primary was forwarding to it meanwhile
// fails as unavailable, and the client's retry goes by the new map.
func (l *leader) dropSurplus(ctx context.Context, m *clustermap.Map) *clustermap.Map {
	drops := clustermap.PlanDrops(m)
	if len(drops) == 0 {
		return m
	}
	next := l.propose(ctx, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: drops})
	if next == nil {
		return m
	}
	l.s.log.Info("surplus backups dropped: the shards held more copies than the map's replica count", "replicas", next.Replicas(), "dropped", len(drops), "epoch", next.Epoch())
	return next
}

func (l *leader) downFor(name string) time.Duration {
	if t, ok := l.down[name]; ok {
		return time.Since(t)
	}
	return 0
}

// removeServers removes drained servers that hold nothing, and (with
// DeadServerTimeout) servers dead that long.
func (l *leader) removeServers(ctx context.Context, m *clustermap.Map) {
	s := l.s
	busy := map[string]bool{}
	for _, mv := range m.Moves() {
		busy[mv.From], busy[mv.To] = true, true
	}
	counts := m.Counts()
	for _, srv := range m.Servers() {
		switch {
		case srv.State == proto.ServerRemoved:
		case srv.State == proto.ServerDraining && m.Holds(srv.Name) == 0 && !busy[srv.Name]:
			if next := l.propose(ctx, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: srv.Name}}); next != nil {
				s.log.Info("drained server removed from the cluster map", "server", srv.Name, "epoch", next.Epoch())
			}
		case s.cfg.DeadServerTimeout > 0 && srv.Name != s.cfg.Name && l.downFor(srv.Name) > s.cfg.DeadServerTimeout:
			if next := l.propose(ctx, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: srv.Name}, Force: true}); next != nil {
				s.log.Warn("server dead longer than DeadServerTimeout removed from the cluster map: its shards start empty elsewhere",
					"server", srv.Name, "shards", counts[srv.Name], "down_for", l.downFor(srv.Name).Round(time.Second), "epoch", next.Epoch())
			}
		}
	}
}

// propose commits a map change from any server: on the leader directly,
// elsewhere forwarded to it. It returns this server's map once it holds
// the change.
func (s *Server) propose(ctx context.Context, c *proto.MapCommand) (*clustermap.Map, error) {
	for {
		m, err := s.proposeLocal(ctx, c)
		var nl *replica.NotLeaderError
		if !errors.As(err, &nl) {
			return m, err
		}
		if id, ctl, serr := splitRaftAddr(nl.LeaderAddr); serr == nil && id != s.id {
			m, err := s.forward(ctx, id, ctl, c)
			var pe *proto.Error
			if !errors.As(err, &pe) || pe.Code != proto.CodeNotLeader {
				return m, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("server: proposing %v: no leader reached: %w", c.Op, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// errChangeRefused wraps the leader's refusal of a forwarded change.
var errChangeRefused = errors.New("server: map change refused")

func (s *Server) forward(ctx context.Context, id, ctl string, c *proto.MapCommand) (*clustermap.Map, error) {
	b, err := proto.EncodeMapCommand(c)
	if err != nil {
		return nil, err
	}
	r, err := s.peers.call(ctx, id, ctl, &proto.MapChange{Command: b})
	if err != nil {
		var pe *proto.Error
		if errors.As(err, &pe) && pe.Code == proto.CodeBadRequest {
			return nil, fmt.Errorf("%w: %s", errChangeRefused, pe.Message)
		}
		return nil, err
	}
	return s.waitEpoch(ctx, r.(*proto.MapChangeReply).Epoch)
}

// waitEpoch waits until this server's map is at epoch or later.
func (s *Server) waitEpoch(ctx context.Context, epoch uint64) (*clustermap.Map, error) {
	for {
		changed := s.node.Changed()
		if m := s.Map(); m.Epoch() >= epoch {
			return m, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("server: waiting for map epoch %d (at %d): %w", epoch, s.Map().Epoch(), ctx.Err())
		}
	}
}

// mapChange is the leader's side of a forwarded change.
func (s *Server) mapChange(req *proto.MapChange) proto.Message {
	c, err := proto.DecodeMapCommand(req.Command)
	if err != nil {
		return &proto.Error{Code: proto.CodeBadRequest, Message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.proposeLocal(ctx, c)
	switch {
	case errors.Is(err, replica.ErrNotLeader):
		return &proto.Error{Code: proto.CodeNotLeader, Message: err.Error()}
	case err != nil:
		return &proto.Error{Code: proto.CodeBadRequest, Message: err.Error()}
	}
	return &proto.MapChangeReply{Epoch: m.Epoch()}
}

// forget starts a server's removal: a live one is drained (the leader
// removes it once its shards moved), a dead one with Force is dropped.
func (s *Server) forget(req *proto.Forget) proto.Message {
	m := s.Map()
	srv, ok := m.Server(req.Node)
	if !ok || srv.State == proto.ServerRemoved {
		return &proto.Error{Code: proto.CodeNotFound, Message: fmt.Sprintf("no server %q in the cluster map (epoch %d), or it was removed already", req.Node, m.Epoch())}
	}
	mb, in := s.ml.View().Member(req.Node)
	up := in && mb.State == membership.StateAlive && mb.Meta.ServerID == srv.ID
	c := &proto.MapCommand{Op: proto.MapDrainServer, Server: proto.MapServer{Name: req.Node}}
	switch {
	case req.Force && up:
		return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("%s is alive: forget it without --force, which moves its shards to the other servers first", req.Node)}
	case req.Force:
		c = &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: req.Node}, Force: true}
	case !up:
		return &proto.Error{Code: proto.CodeUnavailable, Message: fmt.Sprintf("%s is down, so its %d shards cannot be copied: bring it back, or forget it with --force to drop them (with one copy of each key, their keys are lost)",
			req.Node, m.Counts()[req.Node])}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, err := s.propose(ctx, c)
	if err != nil {
		return &proto.Error{Code: proto.CodeBadRequest, Message: err.Error()}
	}
	s.log.Info("forget requested", "server", req.Node, "force", req.Force, "epoch", next.Epoch())
	return &proto.MapChangeReply{Epoch: next.Epoch()}
}

// encodedMap caches the current map's encoding for GetMap.
type encodedMap struct {
	epoch uint64
	b     []byte
}

func (s *Server) mapReply(have uint64) proto.Message {
	m := s.Map()
	if m.Epoch() <= have {
		return &proto.MapReply{Epoch: m.Epoch()}
	}
	if c := s.mapCache.Load(); c != nil && c.epoch == m.Epoch() {
		return &proto.MapReply{Epoch: m.Epoch(), Map: c.b}
	}
	b, err := m.Encode()
	if err != nil {
		return &proto.Error{Code: proto.CodeInternal, Message: err.Error()}
	}
	s.mapCache.Store(&encodedMap{epoch: m.Epoch(), b: b})
	return &proto.MapReply{Epoch: m.Epoch(), Map: b}
}

// viewReply answers GetView: the servers of this server's gossip view,
// each with its metadata and arena list, and the map as mapReply gives it.
// Clients in the view are left out: nothing places keys on them, and a
// cluster's many short-lived CLI members would only fatten the reply.
func (s *Server) viewReply(have uint64) proto.Message {
	reply := s.mapReply(have)
	mr, ok := reply.(*proto.MapReply)
	if !ok {
		return reply // an Error
	}
	now := time.Now()
	r := &proto.ViewReply{Epoch: mr.Epoch, Map: mr.Map}
	for _, mb := range s.ml.View().Members() {
		if mb.MetaErr != nil || mb.Meta.Role != proto.RoleServer {
			continue
		}
		meta := mb.Meta
		if mb.ArenasPending && len(meta.Arenas) > 0 {
			// The list held is the generation's last, not the one the
			// summary describes: send it inline (its rkeys are valid)
			// without the summary it would contradict.
			meta.ArenaSet = proto.ArenaSet{}
		}
		vm := proto.ViewMember{Name: mb.Name, State: uint8(mb.State), ArenasPending: mb.ArenasPending, Meta: meta}
		if s.isolated.Load() && mb.Name != s.cfg.Name {
			vm.State = uint8(membership.StateDead) // what its gossip would conclude
		}
		if !mb.Since.IsZero() {
			vm.Age = max(now.Sub(mb.Since), 0)
		}
		if mb.Addr.IsValid() {
			vm.Addr = mb.Addr.String()
		}
		r.Members = append(r.Members, vm)
	}
	return r
}

func (s *Server) statsReply() *proto.StatsReply {
	st := s.st.Stats()
	r := &proto.StatsReply{Generation: s.gen, Keys: uint64(max(st.Keys, 0)), Commits: st.Commits, Deletes: st.Deletes,
		LeasesActive: uint64(st.LeasesActive), Connections: uint64(max(s.connections.Load(), 0)), Handled: s.Stats().Total(),
		MapEpoch: s.Map().Epoch()}
	for _, sh := range s.st.Shards() {
		switch sh.State {
		case store.ShardOwned:
			r.ShardsOwned++
		case store.ShardIncoming:
			r.ShardsIncoming++
		}
	}
	r.LiveBytes, r.DeadBytes, r.FreeBytes, r.CapacityBytes = uint64(st.Live), uint64(st.Dead), uint64(st.Free), uint64(st.Capacity)
	r.SegmentsCleaned, r.CleanerMovedBytes = st.SegmentsCleaned, st.CleanerMovedBytes
	ms := s.moves.stats()
	r.ShardsMovedIn, r.CopiedKeys, r.CopiedBytes, r.CopyTime = ms.shards, ms.keys, ms.bytes, ms.took
	handled := s.Stats().Handled
	r.Requests = handled[:]
	if err := s.Ready(); err != nil {
		r.NotReady = err.Error()
	}
	r.IndexSlots = st.IndexSlots
	r.Copying = s.moves.progress()
	return r
}
