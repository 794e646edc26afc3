// Plan: the moves that balance the shards over the active servers.

package clustermap

import (
	"slices"
	"strings"

	"github.com/rkv-io/rkv/proto"
)

// Plan returns up to budget moves that bring m closer to balance: every
// draining server's shards to the others, and shards from servers above
// their share to servers below it, where a server's share is
// NumShards/active rounded up or down and its load counts the moves
// already heading to it. Only servers for which live reports true take
// part: a move needs its source to serve the copy and its target to take
// it. The result is deterministic (ties go to the smaller name and the
// lower shard), and empty when m is balanced, not bootstrapped, or
// nothing can move.
func Plan(m *Map, live func(name string) bool, budget int) []proto.MoveCommand {
	if !m.Bootstrapped() || budget <= 0 {
		return nil
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
	floor := proto.NumShards / len(targets)
	ceil := floor
	if proto.NumShards%len(targets) != 0 {
		ceil++
	}
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
			out = append(out, proto.MoveCommand{Shard: s, From: from, To: to})
			load[from]--
			load[to]++
		}
	}
	return out
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

// Settled reports whether m has no move in progress and none to plan with
// every server live: the shards are where they will stay until a server
// is added, drained or removed.
func (m *Map) Settled() bool {
	return m.Bootstrapped() && len(m.Moves()) == 0 && len(Plan(m, func(string) bool { return true }, 1)) == 0
}
