// Plan: the moves that keep every shard at its replica count and balance the replicas and primaries over the active servers.

package clustermap

import (
	"cmp"
	"slices"
	"strings"

	"github.com/rkv-io/rkv/proto"
)

// Plan returns up to budget moves that bring m closer to its replica
// count and to balance. With one replica it moves every draining server's
// shards to the others, and shards from servers above their share to
// servers below it, where a server's share is NumShards/active rounded up
// or down and its load counts the moves already heading to it. With more
// (planReplicas), replicas are replaced off draining servers first, then
// added to shards short of min(Replicas, live active servers) (the fewest
// copies first), then
// balanced per server, then primaries balanced by promotions.
//
// Only servers for which live reports true take part: a move needs its
// source to serve the copy and its target to take it. The result is
// deterministic (ties go to the smaller name and the lower shard), and
// empty when m is balanced, not bootstrapped, or nothing can move.
// Replicas beyond the count are dropped by PlanDrops instead.
func Plan(m *Map, live func(name string) bool, budget int) []proto.MoveCommand {
	if !m.Bootstrapped() || budget <= 0 {
		return nil
	}
	if m.Replicas() > 1 || m.MaxHolders() > 1 {
		return planReplicas(m, live, budget)
	}
	var targets []string
	draining := map[string]bool{}
	for _, s := range m.Servers() {
		switch {
		case s.State == proto.ServerDraining:
			draining[s.Name] = true
		case s.State == proto.ServerActive && live(s.Name):
			targets = append(targets, s.Name)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	floor, ceil := share(proto.NumShards, len(targets))
	// load: shards owned, minus those leaving, plus those arriving.
	load := map[string]int{}
	var movable []proto.Shard // shards that may start a move, by shard
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		if mv := sh.Move; mv != nil {
			load[mv.To]++
			continue
		}
		load[sh.Owner()]++
		if live(sh.Owner()) {
			movable = append(movable, proto.Shard(s))
		}
	}
	// Sources in order: draining servers first, then the most loaded.
	bySource := map[string][]proto.Shard{}
	for _, s := range movable {
		o, _ := m.Owner(s)
		bySource[o] = append(bySource[o], s)
	}
	sources := make([]string, 0, len(bySource))
	for o := range bySource {
		sources = append(sources, o)
	}
	slices.SortFunc(sources, func(a, b string) int {
		if draining[a] != draining[b] {
			if draining[a] {
				return -1
			}
			return 1
		}
		if load[a] != load[b] {
			return load[b] - load[a]
		}
		return strings.Compare(a, b)
	})
	var out []proto.MoveCommand
	for _, from := range sources {
		for _, s := range bySource[from] {
			if len(out) == budget {
				return out
			}
			to := lightest(targets, load, from)
			if to == "" {
				break
			}
			// A draining source gives everything away; an active one only
			// what it holds above its share, to a server below its own,
			// and never between loads a shard apart: a balanced map plans
			// nothing.
			if !draining[from] {
				over := load[from] > ceil || load[from] > floor && load[to] < floor
				if !over || load[to] >= ceil || load[from]-load[to] < 2 {
					break
				}
			}
			out = append(out, proto.MoveCommand{Shard: s, From: from, To: to, Kind: proto.MoveReplace})
			load[from]--
			load[to]++
		}
	}
	return out
}

// share is n items over k servers: each takes floor or ceil of them.
func share(n, k int) (floor, ceil int) {
	floor = n / k
	ceil = floor
	if n%k != 0 {
		ceil++
	}
	return floor, ceil
}

// lightest is the target with the lowest load other than not, the smaller
// name among equals; "" when there is none.
func lightest(targets []string, load map[string]int, not string) string {
	best := ""
	for _, t := range targets {
		if t != not && (best == "" || load[t] < load[best]) {
			best = t
		}
	}
	return best
}

// MaxHolders is the most servers holding one shard (Holders): above 1,
// some shard has a backup.
func (m *Map) MaxHolders() int {
	n := 0
	for _, sh := range m.pm.Shards {
		n = max(n, len(sh.Owners))
	}
	return n
}

// effectiveReplicas is how many replicas each shard should have: the
// map's count, or as many active servers as there are when fewer.
func (m *Map) effectiveReplicas() int {
	active := 0
	for _, s := range m.pm.Servers {
		if s.State == proto.ServerActive {
			active++
		}
	}
	return max(1, min(m.Replicas(), active))
}

// replicaPlanner is the state planReplicas works on: the loads as they
// will be once the moves in progress and those planned so far finish.
type replicaPlanner struct {
	m        *Map
	live     func(string) bool
	targets  []string // live active servers, by name
	zone     map[string]string
	replicas map[string]int // replicas held or arriving
	primary  map[string]int // primaries held or arriving
	busy     []bool         // by shard: a move in progress or planned
	out      []proto.MoveCommand
	budget   int
}

// planReplicas is Plan for maps of more than one replica.
func planReplicas(m *Map, live func(string) bool, budget int) []proto.MoveCommand {
	p := &replicaPlanner{m: m, live: live, zone: map[string]string{}, replicas: map[string]int{}, primary: map[string]int{},
		busy: make([]bool, proto.NumShards), budget: budget}
	draining := map[string]bool{}
	for _, s := range m.Servers() {
		p.zone[s.Name] = s.Zone
		switch {
		case s.State == proto.ServerDraining || s.State == proto.ServerActive && !live(s.Name):
			draining[s.Name] = s.State == proto.ServerDraining
		case s.State == proto.ServerActive:
			p.targets = append(p.targets, s.Name)
		}
	}
	if len(p.targets) == 0 {
		return nil
	}
	want := m.effectiveReplicas()
	shards := make([]Shard, proto.NumShards)
	for s := range shards {
		sh := m.Shard(proto.Shard(s))
		shards[s] = sh
		for _, o := range sh.Owners {
			p.replicas[o]++
		}
		p.primary[sh.Owner()]++
		if mv := sh.Move; mv != nil {
			p.busy[s] = true
			switch mv.Kind {
			case proto.MoveReplace:
				p.replicas[mv.From]--
				p.replicas[mv.To]++
				if mv.From == sh.Owner() {
					p.primary[mv.From]--
					p.primary[mv.To]++
				}
			case proto.MoveAddReplica:
				p.replicas[mv.To]++
			case proto.MovePromote:
				p.primary[mv.From]--
				p.primary[mv.To]++
			}
		}
	}
	// 1. Replicas off draining servers.
	for s, sh := range shards {
		for _, o := range sh.Owners {
			if draining[o] && p.canMove(s, sh) {
				p.add(s, sh, proto.MoveReplace, o, p.target(sh, o))
			}
		}
	}
	// 2. Shards short of replicas, those with the fewest copies first: a
	// failover leaves its shards with one, and the next failure of that
	// one's server would make them unavailable.
	short := make([]int, 0, len(shards))
	for s, sh := range shards {
		if len(sh.Owners) < want {
			short = append(short, s)
		}
	}
	slices.SortStableFunc(short, func(a, b int) int { return len(shards[a].Owners) - len(shards[b].Owners) })
	for _, s := range short {
		if sh := shards[s]; p.canMove(s, sh) {
			p.add(s, sh, proto.MoveAddReplica, sh.Owner(), p.target(sh, ""))
		}
	}
	// 2b. Shards in fewer zones than they could be: a replica in a zone
	// another replica uses moves to a zone none does.
	allZones := map[string]bool{}
	for _, t := range p.targets {
		allZones[p.zone[t]] = true
	}
	for s, sh := range shards {
		if p.zones(sh.Owners) >= min(len(allZones), len(sh.Owners)) {
			continue
		}
		for i := len(sh.Owners) - 1; i >= 0; i-- { // backups first
			o := sh.Owners[i]
			if !p.canMove(s, sh) || p.zones(without(sh.Owners, o)) < p.zones(sh.Owners) {
				continue // o's zone is its own: moving it gains nothing
			}
			if to := p.target(sh, o); to != "" && p.zones(replaced(sh.Owners, o, to)) > p.zones(sh.Owners) {
				p.add(s, sh, proto.MoveReplace, o, to)
			}
		}
	}
	// 3. Replicas from servers above their share to servers below it
	// (backups first: a primary's replacement costs a handover), never
	// into fewer zones.
	total := 0
	for _, t := range p.targets {
		total += p.replicas[t]
	}
	rFloor, rCeil := share(total, len(p.targets))
	for _, backupsOnly := range []bool{true, false} {
		for s, sh := range shards {
			for i, o := range sh.Owners {
				if backupsOnly && i == 0 || !p.canMove(s, sh) || draining[o] {
					continue
				}
				to := p.target(sh, o)
				if to == "" || !(p.replicas[o] > rCeil || p.replicas[o] > rFloor && p.replicas[to] < rFloor) ||
					p.replicas[to] >= rCeil || p.replicas[o]-p.replicas[to] < 2 ||
					p.zones(replaced(sh.Owners, o, to)) < p.zones(sh.Owners) {
					continue
				}
				p.add(s, sh, proto.MoveReplace, o, to)
			}
		}
	}
	// 4. Primaries, by promoting a backup with at least two primaries
	// fewer, from a server above its share (or at it, to one below): each
	// promotion lowers the sum of squares of the primary counts, so the
	// planning ends, and a target may go one above its share, so that
	// chains of promotions carry primaries from a server to one that
	// backs up none of its shards.
	pFloor, pCeil := share(proto.NumShards, len(p.targets))
	for s, sh := range shards {
		from := sh.Owner()
		if !p.canMove(s, sh) || len(sh.Owners) < 2 {
			continue
		}
		var to string
		for _, b := range sh.Owners[1:] {
			if slices.Contains(p.targets, b) && (to == "" || p.primary[b] < p.primary[to]) {
				to = b
			}
		}
		over := p.primary[from] > pCeil || p.primary[from] > pFloor && p.primary[to] < pFloor
		if to == "" || !over || p.primary[from]-p.primary[to] < 2 {
			continue
		}
		p.add(s, sh, proto.MovePromote, from, to)
	}
	return p.out
}

// zones is how many distinct zones servers are in ("" is one too).
func (p *replicaPlanner) zones(servers []string) int {
	seen := map[string]bool{}
	for _, s := range servers {
		seen[p.zone[s]] = true
	}
	return len(seen)
}

func without(list []string, x string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(s string) bool { return s == x })
}

func replaced(list []string, x, y string) []string {
	out := slices.Clone(list)
	if i := slices.Index(out, x); i >= 0 {
		out[i] = y
	}
	return out
}

// canMove reports whether shard s may start a move now: none in progress
// or planned, budget left, its primary live (every kind copies from it or
// hands over with it).
func (p *replicaPlanner) canMove(s int, sh Shard) bool {
	return !p.busy[s] && len(p.out) < p.budget && p.live(sh.Owner())
}

// target is the server a replica of sh should go to (replacing the one on
// not, or added when not is ""): a live active server without one,
// in a zone the other replicas do not use if there is such a server, the
// least loaded, the smaller name among equals; "" when none qualifies.
func (p *replicaPlanner) target(sh Shard, not string) string {
	used := map[string]bool{}
	for _, o := range sh.Owners {
		if o != not {
			used[p.zone[o]] = true
		}
	}
	if mv := sh.Move; mv != nil {
		used[p.zone[mv.To]] = true
	}
	var best string
	better := func(t string) bool {
		if best == "" {
			return true
		}
		if fresh, bestFresh := !used[p.zone[t]], !used[p.zone[best]]; fresh != bestFresh {
			return fresh
		}
		return cmp.Or(cmp.Compare(p.replicas[t], p.replicas[best]), strings.Compare(t, best)) < 0
	}
	for _, t := range p.targets {
		if !slices.Contains(sh.Owners, t) && (sh.Move == nil || sh.Move.To != t) && better(t) {
			best = t
		}
	}
	return best
}

// add plans a move of shard s, when there is a target, and counts it in
// the loads.
func (p *replicaPlanner) add(s int, sh Shard, kind proto.MoveKind, from, to string) {
	if to == "" {
		return
	}
	p.out = append(p.out, proto.MoveCommand{Shard: proto.Shard(s), Kind: kind, From: from, To: to})
	p.busy[s] = true
	switch kind {
	case proto.MoveReplace:
		p.replicas[from]--
		p.replicas[to]++
		if from == sh.Owner() {
			p.primary[from]--
			p.primary[to]++
		}
	case proto.MoveAddReplica:
		p.replicas[to]++
	case proto.MovePromote:
		p.primary[from]--
		p.primary[to]++
	}
}

// PlanDrops returns the backups to drop (a MapDropReplicas command's
// moves, From set) from shards that hold more replicas than the map's
// count: those on the servers holding the most replicas, and never a
// shard with a move in progress.
func PlanDrops(m *Map) []proto.MoveCommand {
	if !m.Bootstrapped() {
		return nil
	}
	want := m.Replicas()
	if !slices.ContainsFunc(m.pm.Shards, func(sh proto.MapShard) bool { return len(sh.Owners) > want }) {
		return nil // the common case, every tick of the leader: no allocation
	}
	load := map[string]int{}
	for s := range proto.NumShards {
		for _, o := range m.Shard(proto.Shard(s)).Owners {
			load[o]++
		}
	}
	var out []proto.MoveCommand
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		if sh.Move != nil {
			continue
		}
		backups := slices.Clone(sh.Owners[1:])
		slices.SortFunc(backups, func(a, b string) int { return cmp.Or(load[b]-load[a], strings.Compare(a, b)) })
		for i := 0; i < len(sh.Owners)-want; i++ {
			out = append(out, proto.MoveCommand{Shard: proto.Shard(s), From: backups[i], Kind: proto.MoveReplace})
			load[backups[i]]--
		}
	}
	return out
}

// Settled reports whether m has no move in progress and none to plan with
// every server live: the shards are where they will stay until a server
// is added, drained or removed.
func (m *Map) Settled() bool {
	return m.Bootstrapped() && len(m.Moves()) == 0 && len(Plan(m, func(string) bool { return true }, 1)) == 0 && len(PlanDrops(m)) == 0
}
