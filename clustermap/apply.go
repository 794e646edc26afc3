// Apply: the deterministic transition each map command makes.

package clustermap

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/rkv-io/rkv/proto"
)

// Errors of Apply. Each leaves the map as it was.
var (
	// ErrIDMismatch: a server with the name is in the map under another
	// data directory ID (it lost its data, or another server took its
	// name); or the ID is in the map under another name.
	ErrIDMismatch = errors.New("clustermap: server ID does not match the map")
	// ErrUnknownServer: no server of that name in the map.
	ErrUnknownServer = errors.New("clustermap: no such server")
	// ErrServerBusy: the server still owns shards or takes part in a
	// move; drain it first.
	ErrServerBusy = errors.New("clustermap: server still holds shards")
	// ErrLastServer: the change would leave no active server.
	ErrLastServer = errors.New("clustermap: no other active server")
	// ErrRemoved: the server was removed from the map; its data directory
	// cannot rejoin (the name can, with an empty one).
	ErrRemoved = errors.New("clustermap: server removed from the cluster")
	// ErrBadMove: a move command that does not match the map (owner,
	// target, phase or start epoch).
	ErrBadMove = errors.New("clustermap: move does not match the map")
	// ErrNotBootstrapped: a shard command before the first server joined.
	ErrNotBootstrapped = errors.New("clustermap: the map is not bootstrapped")
)

// Apply returns the map after command c, with an epoch one higher; or m
// itself when c changes nothing (adding a server that is already there,
// draining one that is draining, removing one that is removed or was never
// there, aborting moves that ended); or an error, and the map unchanged.
// A removed server stays in the map, holding nothing, so that its data
// directory is never taken back: its name rejoins with another one. It is a pure function
// of m and c, so every replica of the log computes the same maps.
//
// The first AddServer bootstraps the map: epoch 1, one replica, that
// server the owner of every shard, the cluster ID derived from its ID. A
// shard changes primary only by FinishMoves (a replacement of the
// primary: to the target that copied it, Origin = the move's start; a
// promotion: to the backup named, with its copy) or by a forced
// RemoveServer of its primary (to its first backup, with that backup's
// copy; with none, to the least loaded active server, Origin 0: empty).
// A primary found dead is replaced by FailOver (to a backup named, with
// its copy, as the shard's only owner until replicas are added again).
// Replicas are added (an add-replica move's finish) and replaced by
// moves, dropped by DropReplicas; SetReplicas sets how many there should
// be (Plan and PlanDrops get there).
func Apply(m *Map, c *proto.MapCommand) (*Map, error) {
	d := newDraft(m)
	var changed bool
	var err error
	switch c.Op {
	case proto.MapAddServer:
		changed, err = d.addServer(c.Server.Name, c.Server.ID, c.Server.Zone)
	case proto.MapDrainServer:
		changed, err = d.drainServer(c.Server.Name)
	case proto.MapRemoveServer:
		changed, err = d.removeServer(c.Server.Name, c.Force)
	case proto.MapStartMoves:
		changed, err = d.startMoves(c.Moves)
	case proto.MapFreezeMoves:
		changed, err = d.freezeMoves(c.Moves)
	case proto.MapFinishMoves:
		changed, err = d.finishMoves(c.Moves)
	case proto.MapAbortMoves:
		changed, err = d.abortMoves(c.Moves)
	case proto.MapSetReplicas:
		changed, err = d.setReplicas(c.Replicas)
	case proto.MapDropReplicas:
		changed, err = d.dropReplicas(c.Moves)
	case proto.MapFailOver:
		changed, err = d.failOver(c.Moves)
	default:
		err = fmt.Errorf("clustermap: unknown map op %v", c.Op)
	}
	if err != nil || !changed {
		return m, err
	}
	return d.build()
}

// draft is a map being changed, with names instead of indexes.
type draft struct {
	epoch, cluster uint64 // epoch is the new map's
	replicas       int
	servers        []proto.MapServer
	shards         []draftShard
}

type draftShard struct {
	owners  []string
	origins []uint64 // parallel to owners
	since   uint64
	move    *Move
}

func newDraft(m *Map) *draft {
	d := &draft{epoch: m.Epoch() + 1, cluster: m.ClusterID(), replicas: m.Replicas(), servers: m.Servers()}
	if m.Bootstrapped() {
		d.shards = make([]draftShard, proto.NumShards)
		for s := range d.shards {
			sh := m.Shard(proto.Shard(s))
			d.shards[s] = draftShard{owners: sh.Owners, origins: sh.Origins, since: sh.Since, move: sh.Move}
		}
	}
	return d
}

func (d *draft) build() (*Map, error) {
	pm := &proto.ClusterMap{Epoch: d.epoch, ClusterID: d.cluster, Replicas: d.replicas, Servers: d.servers}
	slices.SortFunc(pm.Servers, func(a, b proto.MapServer) int { return strings.Compare(a.Name, b.Name) })
	index := make(map[string]uint16, len(pm.Servers))
	for i, s := range pm.Servers {
		index[s.Name] = uint16(i)
	}
	if d.shards != nil {
		pm.Shards = make([]proto.MapShard, len(d.shards))
		for s, sh := range d.shards {
			ps := proto.MapShard{Owners: make([]uint16, len(sh.owners)), Origins: slices.Clone(sh.origins), Since: sh.since}
			for i, o := range sh.owners {
				ps.Owners[i] = index[o]
			}
			if mv := sh.move; mv != nil {
				ps.Move = &proto.ShardMove{Kind: mv.Kind, From: index[mv.From], To: index[mv.To], Phase: mv.Phase, Started: mv.Started}
			}
			pm.Shards[s] = ps
		}
	}
	m, err := FromProto(pm)
	if err != nil {
		// Apply's own checks should make this unreachable.
		return nil, fmt.Errorf("clustermap: internal error: the new map is invalid: %w", err)
	}
	return m, nil
}

func (d *draft) server(name string) *proto.MapServer {
	for i := range d.servers {
		if d.servers[i].Name == name {
			return &d.servers[i]
		}
	}
	return nil
}

func (d *draft) addServer(name, id, zone string) (bool, error) {
	if name == "" || id == "" {
		return false, fmt.Errorf("clustermap: adding a server needs a name and an ID (got %q, %q)", name, id)
	}
	for _, s := range d.servers {
		if s.ID == id && s.State == proto.ServerRemoved {
			return false, fmt.Errorf("%w: the data directory %s of %s was removed from the cluster; to rejoin, start the server on an empty data directory", ErrRemoved, id, s.Name)
		}
		if s.ID == id && s.Name != name {
			return false, fmt.Errorf("%w: data directory ID %s belongs to %s, not %s (a server's name must not change)", ErrIDMismatch, id, s.Name, name)
		}
	}
	if s := d.server(name); s != nil {
		switch {
		case s.State == proto.ServerRemoved: // the name rejoins, empty
			*s = proto.MapServer{Name: name, ID: id, State: proto.ServerActive, Added: d.epoch, Zone: zone}
			return true, nil
		case s.ID != id:
			return false, fmt.Errorf("%w: %s is in the map with data directory ID %s, not %s (a server that lost its data dir must be forgotten first)", ErrIDMismatch, name, s.ID, id)
		case s.Zone != zone: // a label: restarted with another --zone
			s.Zone = zone
			return true, nil
		}
		return false, nil
	}
	d.servers = append(d.servers, proto.MapServer{Name: name, ID: id, State: proto.ServerActive, Added: d.epoch, Zone: zone})
	if d.shards == nil { // the bootstrap
		d.cluster = xxhash.Sum64String(id+"/"+name) | 1
		d.shards = make([]draftShard, proto.NumShards)
		for s := range d.shards {
			d.shards[s] = draftShard{owners: []string{name}, origins: []uint64{0}, since: d.epoch}
		}
	}
	return true, nil
}

// setReplicas sets how many copies of each shard the cluster keeps; the
// planner then adds or drops replicas.
func (d *draft) setReplicas(n int) (bool, error) {
	if n < 1 || n > proto.MaxShardOwners {
		return false, fmt.Errorf("clustermap: %d replicas: must be 1 to %d", n, proto.MaxShardOwners)
	}
	changed := d.replicas != n
	d.replicas = n
	return changed, nil
}

// dropReplicas removes each move's From from its shard's backups. A
// primary is never dropped (promote another first), nor an owner a move
// of the shard involves.
func (d *draft) dropReplicas(drops []proto.MoveCommand) (bool, error) {
	if d.shards == nil {
		return false, ErrNotBootstrapped
	}
	for _, mc := range drops {
		sh := &d.shards[mc.Shard]
		i := slices.Index(sh.owners, mc.From)
		switch {
		case i < 0:
			return false, fmt.Errorf("%w: shard %d has no replica on %s to drop", ErrBadMove, mc.Shard, mc.From)
		case i == 0:
			return false, fmt.Errorf("%w: shard %d: %s is its primary, which is never dropped", ErrBadMove, mc.Shard, mc.From)
		case sh.move != nil && (sh.move.From == mc.From || sh.move.To == mc.From):
			return false, fmt.Errorf("%w: shard %d: %s takes part in its %v move", ErrBadMove, mc.Shard, mc.From, sh.move.Kind)
		}
	}
	for _, mc := range drops {
		sh := &d.shards[mc.Shard]
		if i := slices.Index(sh.owners, mc.From); i > 0 {
			sh.owners = slices.Delete(slices.Clone(sh.owners), i, i+1)
			sh.origins = slices.Delete(slices.Clone(sh.origins), i, i+1)
		}
	}
	return len(drops) > 0, nil
}

// failOver makes each move's To, a backup of its shard, the shard's only
// owner (with its copy, since the new epoch) in place of From, its
// primary, which the caller found dead. The shard's other backups are
// dropped with it: the dead primary may have forwarded its last writes to
// some backups and not others, so they may differ from the new primary by
// those (unacknowledged) writes, and the planner adds replicas again by
// copying from it. A move of the shard ends: every move copies from or
// hands over with the primary.
func (d *draft) failOver(moves []proto.MoveCommand) (bool, error) {
	if d.shards == nil {
		return false, ErrNotBootstrapped
	}
	seen := map[proto.Shard]bool{}
	for _, mc := range moves {
		sh := &d.shards[mc.Shard]
		switch {
		case seen[mc.Shard]:
			return false, fmt.Errorf("%w: shard %d twice", ErrBadMove, mc.Shard)
		case sh.owners[0] != mc.From:
			return false, fmt.Errorf("%w: shard %d's primary is %s, not %s", ErrBadMove, mc.Shard, sh.owners[0], mc.From)
		case !slices.Contains(sh.owners[1:], mc.To):
			return false, fmt.Errorf("%w: shard %d: %s is not a backup of it to fail over to (owners %v)", ErrBadMove, mc.Shard, mc.To, sh.owners)
		}
		seen[mc.Shard] = true
	}
	for _, mc := range moves {
		sh := &d.shards[mc.Shard]
		i := slices.Index(sh.owners, mc.To)
		sh.owners, sh.origins = []string{mc.To}, []uint64{sh.origins[i]}
		sh.since, sh.move = d.epoch, nil
	}
	return len(moves) > 0, nil
}

func (d *draft) drainServer(name string) (bool, error) {
	s := d.server(name)
	if s == nil {
		return false, fmt.Errorf("%w: %s", ErrUnknownServer, name)
	}
	switch s.State {
	case proto.ServerDraining:
		return false, nil
	case proto.ServerRemoved:
		return false, fmt.Errorf("%w: %s", ErrRemoved, name)
	}
	if d.activeExcept(name) == 0 {
		return false, fmt.Errorf("%w: %s is the only active server; add another before draining it", ErrLastServer, name)
	}
	s.State = proto.ServerDraining
	return true, nil
}

func (d *draft) activeExcept(name string) int {
	n := 0
	for _, s := range d.servers {
		if s.Name != name && s.State == proto.ServerActive {
			n++
		}
	}
	return n
}

func (d *draft) removeServer(name string, force bool) (bool, error) {
	if s := d.server(name); s == nil || s.State == proto.ServerRemoved {
		return false, nil
	}
	var owned, moving int
	for _, sh := range d.shards {
		if slices.Contains(sh.owners, name) {
			owned++
		}
		if sh.move != nil && (sh.move.To == name || sh.move.From == name) {
			moving++
		}
	}
	if (owned > 0 || moving > 0) && !force {
		return false, fmt.Errorf("%w: %s holds %d shards and takes part in %d moves: drain it first, or force its removal (a shard it was the primary of then goes to a backup, as its only copy until the others are copied back, or starts empty elsewhere if it has none)", ErrServerBusy, name, owned, moving)
	}
	if owned > 0 && d.activeExcept(name) == 0 {
		return false, fmt.Errorf("%w: the shards of %s would have nowhere to go", ErrLastServer, name)
	}
	d.server(name).State = proto.ServerRemoved
	counts := d.counts()
	for s := range d.shards {
		sh := &d.shards[s]
		if sh.move != nil && (sh.move.To == name || sh.move.From == name) {
			sh.move = nil
		}
		i := slices.Index(sh.owners, name)
		if i < 0 {
			continue
		}
		sh.owners = slices.Delete(slices.Clone(sh.owners), i, i+1)
		sh.origins = slices.Delete(slices.Clone(sh.origins), i, i+1)
		switch {
		case len(sh.owners) == 0: // its only copy is lost
			to := d.leastLoaded(counts)
			counts[to]++
			sh.owners, sh.origins, sh.since = []string{to}, []uint64{0}, d.epoch
		case i == 0:
			// A backup takes over, with its copy, and the other backups
			// go, as in a failover: the removed primary may have forwarded
			// its last, unacknowledged writes to some of them and not to
			// others, and a write the new primary then gives the same
			// version would be taken for one they hold. The planner copies
			// them back from the new primary.
			sh.since = d.epoch
			sh.owners, sh.origins = sh.owners[:1], sh.origins[:1]
		}
		if i == 0 {
			sh.move = nil // every move copies from or hands over with the primary
		}
	}
	return true, nil
}

// counts is how many shards each server is primary of.
func (d *draft) counts() map[string]int {
	c := map[string]int{}
	for _, sh := range d.shards {
		c[sh.owners[0]]++
	}
	return c
}

// leastLoaded is the active server with the fewest shards, the smaller
// name first among equals.
func (d *draft) leastLoaded(counts map[string]int) string {
	best := ""
	for _, s := range d.servers {
		if s.State != proto.ServerActive {
			continue
		}
		if best == "" || counts[s.Name] < counts[best] || counts[s.Name] == counts[best] && s.Name < best {
			best = s.Name
		}
	}
	return best
}

func (d *draft) startMoves(moves []proto.MoveCommand) (bool, error) {
	if d.shards == nil {
		return false, ErrNotBootstrapped
	}
	seen := map[proto.Shard]bool{}
	for _, mc := range moves {
		sh := &d.shards[mc.Shard]
		to := d.server(mc.To)
		kind := moveKind(mc)
		switch {
		case seen[mc.Shard]:
			return false, fmt.Errorf("%w: shard %d twice", ErrBadMove, mc.Shard)
		case sh.move != nil:
			return false, fmt.Errorf("%w: shard %d is already moving to %s", ErrBadMove, mc.Shard, sh.move.To)
		case to == nil || to.State != proto.ServerActive:
			return false, fmt.Errorf("%w: shard %d: target %q is not an active server", ErrBadMove, mc.Shard, mc.To)
		case kind == proto.MoveReplace && !slices.Contains(sh.owners, mc.From):
			return false, fmt.Errorf("%w: shard %d has no replica on %s to replace (owners %v)", ErrBadMove, mc.Shard, mc.From, sh.owners)
		case kind != proto.MoveReplace && sh.owners[0] != mc.From:
			return false, fmt.Errorf("%w: shard %d's primary is %s, not %s", ErrBadMove, mc.Shard, sh.owners[0], mc.From)
		case kind == proto.MovePromote && !slices.Contains(sh.owners[1:], mc.To):
			return false, fmt.Errorf("%w: shard %d: %s is not a backup of it to promote (owners %v)", ErrBadMove, mc.Shard, mc.To, sh.owners)
		case kind != proto.MovePromote && slices.Contains(sh.owners, mc.To):
			return false, fmt.Errorf("%w: shard %d: %s already holds it", ErrBadMove, mc.Shard, mc.To)
		case kind == proto.MoveAddReplica && len(sh.owners) >= proto.MaxShardOwners:
			return false, fmt.Errorf("%w: shard %d has %d replicas already", ErrBadMove, mc.Shard, len(sh.owners))
		}
		seen[mc.Shard] = true
	}
	for _, mc := range moves {
		d.shards[mc.Shard].move = &Move{Shard: mc.Shard, Kind: moveKind(mc), From: mc.From, To: mc.To, Phase: proto.MoveCopying, Started: d.epoch}
	}
	return len(moves) > 0, nil
}

// moveKind is mc's kind: a replacement when it names none (commands of
// version 1).
func moveKind(mc proto.MoveCommand) proto.MoveKind {
	if mc.Kind == 0 {
		return proto.MoveReplace
	}
	return mc.Kind
}

// matching returns the shard of a freeze, finish or abort command if the
// move it names is in progress, exactly.
func (d *draft) matching(mc proto.MoveCommand) (*draftShard, error) {
	if d.shards == nil {
		return nil, ErrNotBootstrapped
	}
	sh := &d.shards[mc.Shard]
	if mv := sh.move; mv == nil || mv.Kind != moveKind(mc) || mv.From != mc.From || mv.To != mc.To || mv.Started != mc.Started {
		return nil, fmt.Errorf("%w: no %v move of shard %d from %s to %s started at epoch %d", ErrBadMove, moveKind(mc), mc.Shard, mc.From, mc.To, mc.Started)
	}
	return sh, nil
}

func (d *draft) freezeMoves(moves []proto.MoveCommand) (bool, error) {
	changed := false
	for _, mc := range moves {
		sh, err := d.matching(mc)
		if err != nil {
			return false, err
		}
		changed = changed || sh.move.Phase != proto.MoveFrozen
	}
	for _, mc := range moves {
		d.shards[mc.Shard].move.Phase = proto.MoveFrozen
	}
	return changed, nil
}

// finishMoves ends frozen moves: a replacement puts the target in its
// owner's place (the primary's, with a new since, when it replaced the
// primary), an added replica joins the owners last, a promotion swaps the
// target and the primary. The target's origin is the move's start.
func (d *draft) finishMoves(moves []proto.MoveCommand) (bool, error) {
	for _, mc := range moves {
		sh, err := d.matching(mc)
		if err != nil {
			return false, err
		}
		if sh.move.Phase != proto.MoveFrozen {
			return false, fmt.Errorf("%w: shard %d is %v, not frozen: its owner still takes writes", ErrBadMove, mc.Shard, sh.move.Phase)
		}
	}
	for _, mc := range moves {
		sh := &d.shards[mc.Shard]
		owners, origins := slices.Clone(sh.owners), slices.Clone(sh.origins)
		switch sh.move.Kind {
		case proto.MoveReplace:
			i := slices.Index(owners, mc.From)
			owners[i], origins[i] = mc.To, mc.Started
			if i == 0 {
				sh.since = d.epoch
			}
		case proto.MoveAddReplica:
			owners, origins = append(owners, mc.To), append(origins, mc.Started)
		case proto.MovePromote:
			j := slices.Index(owners, mc.To)
			owners[0], owners[j] = owners[j], owners[0]
			origins[0], origins[j] = origins[j], origins[0]
			sh.since = d.epoch
		}
		sh.owners, sh.origins, sh.move = owners, origins, nil
	}
	return len(moves) > 0, nil
}

// abortMoves cancels the moves named that are still in progress; the
// others ended already and are left alone.
func (d *draft) abortMoves(moves []proto.MoveCommand) (bool, error) {
	changed := false
	for _, mc := range moves {
		if sh, err := d.matching(mc); err == nil {
			sh.move, changed = nil, true
		} else if errors.Is(err, ErrNotBootstrapped) {
			return false, err
		}
	}
	return changed, nil
}
