// Replication's state for operators: the shards each server is primary of and backs up, and how far the map is from its replica count.

package clustermap

import (
	"slices"

	"github.com/rkv-io/rkv/proto"
)

// Backups returns how many shards each server backs up (a replica that is
// not the primary; servers with none included, at 0). Counts gives the
// primaries.
func (m *Map) Backups() map[string]int {
	out := make(map[string]int, len(m.pm.Servers))
	for _, s := range m.pm.Servers {
		out[s.Name] = 0
	}
	for _, sh := range m.pm.Shards {
		for _, o := range sh.Owners[1:] {
			out[m.pm.Servers[o].Name]++
		}
	}
	return out
}

// Replication is how far a map is from its replica count.
type Replication struct {
	// Replicas is the map's count; Target what each shard should hold
	// now: Replicas, or the number of active servers when fewer.
	Replicas, Target int
	// UnderReplicated is how many shards have fewer holders than Target;
	// Adding how many add-replica moves are in progress (each makes one
	// of them a holder more when it finishes).
	UnderReplicated, Adding int
	// OverReplicated is how many shards have more holders than Replicas:
	// after the count was lowered, until the leader drops the surplus
	// backups (PlanDrops).
	OverReplicated int
}

// Replication returns how far m is from its replica count; zero but
// Replicas before the bootstrap.
func (m *Map) Replication() Replication {
	r := Replication{Replicas: m.Replicas()}
	if !m.Bootstrapped() {
		return r
	}
	r.Target = m.effectiveReplicas()
	for _, sh := range m.pm.Shards {
		switch n := len(sh.Owners); {
		case n < r.Target:
			r.UnderReplicated++
		case n > r.Replicas:
			r.OverReplicated++
		}
		if sh.Move != nil && sh.Move.Kind == proto.MoveAddReplica {
			r.Adding++
		}
	}
	return r
}

// Holding is what a server holds in a map.
type Holding struct {
	// Shards it is an owner of (primary or backup), Sole those of them it
	// is the only owner of: lost if it is.
	Shards, Sole int
	// Moves it is the source or target of.
	Moves int
}

// Holding returns what the server named holds in m.
func (m *Map) Holding(name string) Holding {
	var h Holding
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		if slices.Contains(sh.Owners, name) {
			h.Shards++
			if len(sh.Owners) == 1 {
				h.Sole++
			}
		}
		if mv := sh.Move; mv != nil && (mv.From == name || mv.To == name) {
			h.Moves++
		}
	}
	return h
}
