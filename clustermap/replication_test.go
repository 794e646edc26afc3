package clustermap

import (
	"maps"
	"slices"
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
	if r := m.Replication(); r != (Replication{Replicas: 1, Target: 1, InSync: proto.NumShards}) {
		t.Fatalf("two servers at one replica: %+v", r)
	}
	m = must(t, m, setReplicas(3)) // more than there are servers: two copies
	if r := m.Replication(); r != (Replication{Replicas: 3, Target: 2, UnderReplicated: proto.NumShards}) {
		t.Fatalf("set to 3 on two servers: %+v", r)
	}
	plan := Plan(m, alwaysLive, 10)
	m = must(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: plan})
	if r := m.Replication(); r.UnderReplicated != proto.NumShards || r.Adding != len(plan) || r.CatchingUp != len(plan) || r.InSync != 0 || len(plan) == 0 {
		t.Fatalf("%d add-replica moves started: %+v", len(plan), r)
	}
	m, _ = settle(t, m, alwaysLive)
	if r := m.Replication(); r != (Replication{Replicas: 3, Target: 2, InSync: proto.NumShards}) {
		t.Fatalf("settled: %+v", r)
	}
	primaries, backups := m.Counts(), m.Backups()
	for _, s := range []string{"a", "b"} {
		if primaries[s]+backups[s] != proto.NumShards || primaries[s] != proto.NumShards/2 {
			t.Fatalf("%s: primary of %d, backs up %d; want %d and %d", s, primaries[s], backups[s], proto.NumShards/2, proto.NumShards/2)
		}
	}
	m = must(t, m, setReplicas(1))
	if r := m.Replication(); r != (Replication{Replicas: 1, Target: 1, OverReplicated: proto.NumShards, InSync: proto.NumShards}) {
		t.Fatalf("lowered to 1: %+v", r)
	}
	drops := PlanDrops(m)
	m = must(t, m, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: drops})
	if r := m.Replication(); r != (Replication{Replicas: 1, Target: 1, InSync: proto.NumShards}) || len(drops) != proto.NumShards || !m.Settled() {
		t.Fatalf("after %d drops: %+v, settled %v", len(drops), m.Replication(), m.Settled())
	}
}

// A shard's backups are in sync, the target of a move that copies it
// (add-replica, replace of a backup or of the primary) is catching up
// until the move finishes, and a promotion's target, a backup, catches
// nothing up. Four servers at three replicas, d holding nothing yet.
func TestShardReplicasInSyncAndCatchingUp(t *testing.T) {
	m := threeReplicasOn(t, "a", "b", "c")
	m = must(t, m, add("d"))
	before := [4]Shard{m.Shard(0), m.Shard(1), m.Shard(2), m.Shard(3)}
	m = must(t, m, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: []proto.MoveCommand{{Shard: 3, From: before[3].Owners[2]}}})
	start := []proto.MoveCommand{
		{Shard: 0, Kind: proto.MoveReplace, From: before[0].Owners[1], To: "d"},
		{Shard: 1, Kind: proto.MoveReplace, From: before[1].Owner(), To: "d"},
		{Shard: 2, Kind: proto.MovePromote, From: before[2].Owner(), To: before[2].Owners[1]},
		{Shard: 3, Kind: proto.MoveAddReplica, From: before[3].Owner(), To: "d"},
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: start})
	for i, want := range []struct {
		inSync     []string
		catchingUp string
		kind       proto.MoveKind
	}{
		{before[0].Owners[1:], "d", proto.MoveReplace},
		{before[1].Owners[1:], "d", proto.MoveReplace},
		{before[2].Owners[1:], "", proto.MovePromote},
		{before[3].Owners[1:2], "d", proto.MoveAddReplica},
	} {
		r := m.ShardReplicas(proto.Shard(i))
		if r.Shard != proto.Shard(i) || r.Primary != before[i].Owner() || !slices.Equal(r.InSync, want.inSync) || r.CatchingUp != want.catchingUp ||
			r.Move == nil || r.Move.Kind != want.kind {
			t.Errorf("shard %d (owners %v) with a %v move: %+v; want in sync %v, catching up %q", i, before[i].Owners, want.kind, r, want.inSync, want.catchingUp)
		}
	}
	if r := m.ShardReplicas(4); r.CatchingUp != "" || r.Move != nil || len(r.InSync) != 2 {
		t.Errorf("shard 4, no move: %+v", r)
	}
	if got, want := m.CatchingUp(), map[string]int{"a": 0, "b": 0, "c": 0, "d": 3}; !maps.Equal(got, want) {
		t.Errorf("catching up: %v, want %v", got, want)
	}
	if r := m.Replication(); r != (Replication{Replicas: 3, Target: 3, UnderReplicated: 1, Adding: 1, InSync: proto.NumShards - 1, CatchingUp: 3}) {
		t.Errorf("with the moves in progress: %+v", r)
	}

	// The add-replica finished, d is in sync; the replacement of shard 0's
	// backup aborted, d no longer catches it up.
	mvs := m.Moves()
	m = must(t, m, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: []proto.MoveCommand{mvs[3].Command()}})
	m = must(t, m, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: []proto.MoveCommand{mvs[3].Command()}})
	m = must(t, m, &proto.MapCommand{Op: proto.MapAbortMoves, Moves: []proto.MoveCommand{mvs[0].Command()}})
	if r := m.ShardReplicas(3); !slices.Equal(r.InSync, []string{before[3].Owners[1], "d"}) || r.CatchingUp != "" || r.Move != nil {
		t.Errorf("shard 3 after its add-replica finished: %+v", r)
	}
	if r := m.ShardReplicas(0); !slices.Equal(r.InSync, before[0].Owners[1:]) || r.CatchingUp != "" || r.Move != nil {
		t.Errorf("shard 0 after its replacement aborted: %+v", r)
	}
	if got := m.CatchingUp()["d"]; got != 1 {
		t.Errorf("d catches up %d shards, want 1 (shard 1)", got)
	}
	if r := m.Replication(); r != (Replication{Replicas: 3, Target: 3, InSync: proto.NumShards, CatchingUp: 1}) {
		t.Errorf("after the finish and the abort: %+v", r)
	}
}
