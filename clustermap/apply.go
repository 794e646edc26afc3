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
// The first AddServer bootstraps the map: epoch 1, that server the owner
// of every shard, the cluster ID derived from its ID. A shard changes
// owner only by FinishMoves (to the target that copied it, Origin = the
// move's start) or by a forced RemoveServer of its owner (to the least
// loaded active server, Origin 0: empty).
func Apply(m *Map, c *proto.MapCommand) (*Map, error) {
	d := newDraft(m)
	var changed bool
	var err error
	switch c.Op {
	case proto.MapAddServer:
		changed, err = d.addServer(c.Server.Name, c.Server.ID)
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
	servers        []proto.MapServer
	shards         []draftShard
}

type draftShard struct {
	owners        []string
	since, origin uint64
	move          *Move // From unused: the owner is owners[0]
}

func newDraft(m *Map) *draft {
	d := &draft{epoch: m.Epoch() + 1, cluster: m.ClusterID(), servers: m.Servers()}
	if m.Bootstrapped() {
		d.shards = make([]draftShard, proto.NumShards)
		for s := range d.shards {
			sh := m.Shard(proto.Shard(s))
			d.shards[s] = draftShard{owners: sh.Owners, since: sh.Since, origin: sh.Origin, move: sh.Move}
		}
	}
	return d
}

func (d *draft) build() (*Map, error) {
	pm := &proto.ClusterMap{Epoch: d.epoch, ClusterID: d.cluster, Servers: d.servers}
	slices.SortFunc(pm.Servers, func(a, b proto.MapServer) int { return strings.Compare(a.Name, b.Name) })
	index := make(map[string]uint16, len(pm.Servers))
	for i, s := range pm.Servers {
		index[s.Name] = uint16(i)
	}
	if d.shards != nil {
		pm.Shards = make([]proto.MapShard, len(d.shards))
		for s, sh := range d.shards {
			ps := proto.MapShard{Owners: make([]uint16, len(sh.owners)), Since: sh.since, Origin: sh.origin}
			for i, o := range sh.owners {
				ps.Owners[i] = index[o]
			}
			if mv := sh.move; mv != nil {
				ps.Move = &proto.ShardMove{To: index[mv.To], Phase: mv.Phase, Started: mv.Started}
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

func (d *draft) addServer(name, id string) (bool, error) {
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
			*s = proto.MapServer{Name: name, ID: id, State: proto.ServerActive, Added: d.epoch}
			return true, nil
		case s.ID != id:
			return false, fmt.Errorf("%w: %s is in the map with data directory ID %s, not %s (a server that lost its data dir must be forgotten first)", ErrIDMismatch, name, s.ID, id)
		}
		return false, nil
	}
	d.servers = append(d.servers, proto.MapServer{Name: name, ID: id, State: proto.ServerActive, Added: d.epoch})
	if d.shards == nil { // the bootstrap
		d.cluster = xxhash.Sum64String(id+"/"+name) | 1
		d.shards = make([]draftShard, proto.NumShards)
		for s := range d.shards {
			d.shards[s] = draftShard{owners: []string{name}, since: d.epoch}
		}
	}
	return true, nil
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
		if sh.move != nil && (sh.move.To == name || sh.owners[0] == name) {
			moving++
		}
	}
	if (owned > 0 || moving > 0) && !force {
		return false, fmt.Errorf("%w: %s owns %d shards and takes part in %d moves: drain it first, or force its removal (its shards then start empty elsewhere)", ErrServerBusy, name, owned, moving)
	}
	if owned > 0 && d.activeExcept(name) == 0 {
		return false, fmt.Errorf("%w: the shards of %s would have nowhere to go", ErrLastServer, name)
	}
	d.server(name).State = proto.ServerRemoved
	counts := d.counts()
	for s := range d.shards {
		sh := &d.shards[s]
		if sh.move != nil && (sh.move.To == name || sh.owners[0] == name) {
			sh.move = nil
		}
		if !slices.Contains(sh.owners, name) {
			continue
		}
		sh.owners = slices.DeleteFunc(slices.Clone(sh.owners), func(o string) bool { return o == name })
		if len(sh.owners) == 0 {
			to := d.leastLoaded(counts)
			counts[to]++
			sh.owners = []string{to}
		}
		sh.since, sh.origin = d.epoch, 0
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
		switch {
		case seen[mc.Shard]:
			return false, fmt.Errorf("%w: shard %d twice", ErrBadMove, mc.Shard)
		case sh.owners[0] != mc.From:
			return false, fmt.Errorf("%w: shard %d is owned by %s, not %s", ErrBadMove, mc.Shard, sh.owners[0], mc.From)
		case sh.move != nil:
			return false, fmt.Errorf("%w: shard %d is already moving to %s", ErrBadMove, mc.Shard, sh.move.To)
		case to == nil || to.State != proto.ServerActive:
			return false, fmt.Errorf("%w: shard %d: target %q is not an active server", ErrBadMove, mc.Shard, mc.To)
		case slices.Contains(sh.owners, mc.To):
			return false, fmt.Errorf("%w: shard %d: %s already holds it", ErrBadMove, mc.Shard, mc.To)
		}
		seen[mc.Shard] = true
	}
	for _, mc := range moves {
		d.shards[mc.Shard].move = &Move{Shard: mc.Shard, To: mc.To, Phase: proto.MoveCopying, Started: d.epoch}
	}
	return len(moves) > 0, nil
}

// matching returns the shard of a freeze, finish or abort command if the
// move it names is in progress, exactly.
func (d *draft) matching(mc proto.MoveCommand) (*draftShard, error) {
	if d.shards == nil {
		return nil, ErrNotBootstrapped
	}
	sh := &d.shards[mc.Shard]
	if mv := sh.move; mv == nil || sh.owners[0] != mc.From || mv.To != mc.To || mv.Started != mc.Started {
		return nil, fmt.Errorf("%w: no move of shard %d from %s to %s started at epoch %d", ErrBadMove, mc.Shard, mc.From, mc.To, mc.Started)
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
		sh.owners, sh.since, sh.origin, sh.move = []string{mc.To}, d.epoch, mc.Started, nil
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
