package clustermap

import (
	"testing"

	"github.com/rkv-io/rkv/proto"
)

// Replication and Backups follow a cluster raised from one replica to
// two, while the copies are made and once they are, and lowered again.
func TestReplicationSummary(t *testing.T) {
	if r := Empty.Replication(); r != (Replication{Replicas: 1}) {
		t.Fatalf("before the bootstrap: %+v", r)
	}
	m := must(t, Empty, add("a"))
	m = must(t, m, add("b"))
	m, _ = settle(t, m, alwaysLive)
	if r := m.Replication(); r != (Replication{Replicas: 1, Target: 1}) {
		t.Fatalf("two servers at one replica: %+v", r)
	}
	m = must(t, m, setReplicas(3)) // more than there are servers: two copies
	if r := m.Replication(); r != (Replication{Replicas: 3, Target: 2, UnderReplicated: proto.NumShards}) {
		t.Fatalf("set to 3 on two servers: %+v", r)
	}
	plan := Plan(m, alwaysLive, 10)
	m = must(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: plan})
	if r := m.Replication(); r.UnderReplicated != proto.NumShards || r.Adding != len(plan) || len(plan) == 0 {
		t.Fatalf("%d add-replica moves started: %+v", len(plan), r)
	}
	m, _ = settle(t, m, alwaysLive)
	if r := m.Replication(); r != (Replication{Replicas: 3, Target: 2}) {
		t.Fatalf("settled: %+v", r)
	}
	primaries, backups := m.Counts(), m.Backups()
	for _, s := range []string{"a", "b"} {
		if primaries[s]+backups[s] != proto.NumShards || primaries[s] != proto.NumShards/2 {
			t.Fatalf("%s: primary of %d, backs up %d; want %d and %d", s, primaries[s], backups[s], proto.NumShards/2, proto.NumShards/2)
		}
	}
	m = must(t, m, setReplicas(1))
	if r := m.Replication(); r != (Replication{Replicas: 1, Target: 1, OverReplicated: proto.NumShards}) {
		t.Fatalf("lowered to 1: %+v", r)
	}
	drops := PlanDrops(m)
	m = must(t, m, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: drops})
	if r := m.Replication(); r != (Replication{Replicas: 1, Target: 1}) || len(drops) != proto.NumShards || !m.Settled() {
		t.Fatalf("after %d drops: %+v, settled %v", len(drops), m.Replication(), m.Settled())
	}
}
