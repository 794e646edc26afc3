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
	// InSync is how many shards have at least Target holders (owners:
	// the primary and its backups, each holding every acknowledged
	// write); the others are UnderReplicated.
	InSync int
	// CatchingUp is how many shards have a copying move in progress
	// (ShardReplicas.CatchingUp): add-replica moves (Adding) and
	// replacements, of a primary or of a backup.
	CatchingUp int
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
		if len(sh.Owners) >= r.Target {
			r.InSync++
		}
		if sh.Move != nil && sh.Move.Kind == proto.MoveAddReplica {
			r.Adding++
		}
		if sh.Move != nil && Copies(sh.Move.Kind) {
			r.CatchingUp++
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

// ShardReplicas is one shard's replicas by how far each is with the
// primary's writes, as the map says.
type ShardReplicas struct {
	Shard   proto.Shard
	Primary string
	// InSync are the backups: the other owners, in the owner list's
	// order. The primary applies and acknowledges a write only once each
	// of them has applied it, so each holds every acknowledged write (a
	// backup that is down stalls the shard's writes until the leader
	// drops it from the owners).
	InSync []string
	// CatchingUp is the target of a move that copies the shard to a new
	// replica (add-replica, or replace of the primary or of a backup), ""
	// when there is none. It is not an owner: no write waits for it, and
	// it gets the shard's writes by the move's copy passes, the last one
	// with the shard frozen; the move's finish makes it an owner.
	CatchingUp string
	// Move is the shard's move in progress, nil when none. A promotion's
	// target is a backup already (in InSync) and catches nothing up.
	Move *Move
}

// Copies reports whether a move of kind k copies the shard to its
// target: every kind but a promotion, whose target holds a copy already.
func Copies(k proto.MoveKind) bool { return k != proto.MovePromote }

// ShardReplicas returns shard s's replicas by their state. It panics, as Shard
// does, on a map that is not bootstrapped or a shard out of range.
func (m *Map) ShardReplicas(s proto.Shard) ShardReplicas {
	sh := m.Shard(s)
	r := ShardReplicas{Shard: s, Primary: sh.Owner(), InSync: sh.Owners[1:], Move: sh.Move}
	if mv := sh.Move; mv != nil && Copies(mv.Kind) {
		r.CatchingUp = mv.To
	}
	return r
}

// CatchingUp returns how many shards each server is catching up on: the
// shards it is the target of a copying move of (ShardReplicas.CatchingUp;
// servers with none included, at 0).
func (m *Map) CatchingUp() map[string]int {
	out := make(map[string]int, len(m.pm.Servers))
	for _, s := range m.pm.Servers {
		out[s.Name] = 0
	}
	for _, sh := range m.pm.Shards {
		if mv := sh.Move; mv != nil && Copies(mv.Kind) {
			out[m.pm.Servers[mv.To].Name]++
		}
	}
	return out
}
