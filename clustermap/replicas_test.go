// Tests of maps with more than one replica a shard: placement, balance, drains, losses.

package clustermap

import (
	"errors"
	"slices"
	"testing"

	"github.com/rkv-io/rkv/proto"
)

func addIn(name, zone string) *proto.MapCommand {
	c := add(name)
	c.Server.Zone = zone
	return c
}

func setReplicas(n int) *proto.MapCommand {
	return &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: n}
}

// checkReplicas checks that every shard has want replicas on distinct
// active servers, in at least min(zones, want) zones, and with balanced
// set, that replicas are balanced within one over the active servers, and
// primaries within one of their share on either side (a promotion needs a
// backup on the server short of primaries, and the replicas' placement
// does not always offer one). Zones of unequal sizes make balance
// impossible: a zone of one server among three takes a replica of every
// shard.
func checkReplicas(t testing.TB, m *Map, want int, balanced bool) {
	t.Helper()
	var active []Server
	zones := map[string]bool{}
	for _, s := range m.Servers() {
		if s.State == proto.ServerActive {
			active = append(active, s)
			zones[s.Zone] = true
		}
	}
	replicas, primaries := map[string]int{}, map[string]int{}
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		if len(sh.Owners) != want {
			t.Fatalf("shard %d has %d replicas %v, want %d", s, len(sh.Owners), sh.Owners, want)
		}
		inZones := map[string]bool{}
		for _, o := range sh.Owners {
			srv, _ := m.Server(o)
			if srv.State != proto.ServerActive {
				t.Fatalf("shard %d has a replica on %s, %v", s, o, srv.State)
			}
			inZones[srv.Zone] = true
			replicas[o]++
		}
		if len(inZones) < min(len(zones), want) {
			t.Fatalf("shard %d's replicas %v are in %d zones of %d", s, sh.Owners, len(inZones), len(zones))
		}
		primaries[sh.Owner()]++
	}
	if !balanced {
		return
	}
	rFloor, _ := share(want*proto.NumShards, len(active))
	pFloor, _ := share(proto.NumShards, len(active))
	for _, s := range active {
		if r, p := replicas[s.Name], primaries[s.Name]; r < rFloor || r > rFloor+1 || p < pFloor-1 || p > pFloor+2 {
			t.Fatalf("%s holds %d replicas (share %d-%d) and %d primaries (share %d-%d)", s.Name, r, rFloor, rFloor+1, p, pFloor, pFloor+1)
		}
	}
}

// A cluster set to three replicas grows from one server to eight: each
// new server gets copies added (every shard on every server while there
// are at most three), then primaries handed to it by promotions, then from
// the fourth on replicas replaced onto it; every step ends balanced.
func TestReplicasFollowTheServers(t *testing.T) {
	m := must(t, Empty, add("a"))
	m = must(t, m, setReplicas(3))
	if m.Replicas() != 3 || m.effectiveReplicas() != 1 {
		t.Fatalf("replicas %d, effective %d with one server", m.Replicas(), m.effectiveReplicas())
	}
	if plan := Plan(m, alwaysLive, 64); len(plan) != 0 {
		t.Fatalf("one server, three replicas wanted: planned %v", plan)
	}
	for i, step := range []struct {
		name  string
		want  int
		kinds map[proto.MoveKind]int
	}{
		{"b", 2, map[proto.MoveKind]int{proto.MoveAddReplica: 1024, proto.MovePromote: 512}},
		{"c", 3, map[proto.MoveKind]int{proto.MoveAddReplica: 1024, proto.MovePromote: 341}},
		{"d", 3, map[proto.MoveKind]int{proto.MoveReplace: 768, proto.MovePromote: 256}},
		{"e", 3, nil}, {"f", 3, nil}, {"g", 3, nil}, {"h", 3, nil},
	} {
		m = must(t, m, add(step.name))
		var kinds map[proto.MoveKind]int
		m, kinds = settleCounting(t, m, alwaysLive)
		checkReplicas(t, m, step.want, true)
		if step.kinds != nil && !equalKinds(kinds, step.kinds) {
			t.Errorf("step %d (%s joins): moves %v, want %v", i, step.name, kinds, step.kinds)
		}
		t.Logf("%s joins: %v; %v", step.name, kinds, m)
	}
	if _, err := Decode(mustEncode(t, m)); err != nil {
		t.Fatal(err)
	}
}

// With zones, every shard's replicas spread over as many zones as there
// are (up to three) at every step, a zone's servers sharing its replicas;
// with zones of equal sizes the replicas are balanced too.
func TestReplicasSpreadOverZones(t *testing.T) {
	m := must(t, Empty, addIn("a", "z1"))
	m = must(t, m, setReplicas(3))
	for i, srv := range [][2]string{{"b", "z2"}, {"c", "z3"}, {"d", "z1"}, {"e", "z2"}, {"f", "z3"}} {
		m = must(t, m, addIn(srv[0], srv[1]))
		m, _ = settleCounting(t, m, alwaysLive)
		checkReplicas(t, m, min(3, i+2), i == 1 || i == 4)
	}
}

func equalKinds(a, b map[proto.MoveKind]int) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

func threeReplicasOn(t *testing.T, names ...string) *Map {
	t.Helper()
	m := must(t, Empty, add(names[0]))
	m = must(t, m, setReplicas(3))
	for _, n := range names[1:] {
		m = must(t, m, add(n))
	}
	m, _ = settleCounting(t, m, alwaysLive)
	checkReplicas(t, m, min(3, len(names)), true)
	return m
}

// A draining server's replicas, backups and primaries, are replaced on
// the others; it then holds nothing and can be removed.
func TestDrainWithReplicas(t *testing.T) {
	m := threeReplicasOn(t, "a", "b", "c", "d")
	m = must(t, m, &proto.MapCommand{Op: proto.MapDrainServer, Server: proto.MapServer{Name: "b"}})
	m, kinds := settleCounting(t, m, alwaysLive)
	if kinds[proto.MoveReplace] == 0 {
		t.Fatalf("draining b replaced nothing: %v", kinds)
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: "b"}})
	checkReplicas(t, m, 3, true)
}

// A server lost for good (a forced removal): each shard it was the primary
// of goes to a backup, with the backup's copy (its origin kept, a new
// since), as its only copy (the other backup may disagree with it about
// the removed primary's last writes); none starts empty; the shards it
// backed up keep their other two copies; re-replication then restores
// three copies when a server joins.
func TestForcedRemovalPromotesBackups(t *testing.T) {
	m := threeReplicasOn(t, "a", "b", "c")
	before := map[proto.Shard]Shard{}
	for s := range proto.NumShards {
		before[proto.Shard(s)] = m.Shard(proto.Shard(s))
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: "b"}, Force: true})
	promoted := 0
	for s, was := range before {
		is := m.Shard(s)
		want := 2
		if was.Owner() == "b" {
			want = 1
		}
		if slices.Contains(is.Owners, "b") || len(is.Owners) != want {
			t.Fatalf("shard %d after b's removal: %v (was %v)", s, is.Owners, was.Owners)
		}
		if was.Owner() != "b" {
			if is.Owner() != was.Owner() || is.Since != was.Since {
				t.Fatalf("shard %d, primary %s: changed to %s since %d", s, was.Owner(), is.Owner(), is.Since)
			}
			continue
		}
		promoted++
		i := slices.Index(was.Owners, is.Owner())
		if i < 1 || is.Origin != was.Origins[i] || is.Since != m.Epoch() {
			t.Fatalf("shard %d: b's primary place went to %s (origin %d, since %d), was %+v", s, is.Owner(), is.Origin, is.Since, was)
		}
	}
	if promoted == 0 {
		t.Fatal("b was the primary of nothing")
	}
	m = must(t, m, add("d"))
	m, kinds := settleCounting(t, m, alwaysLive)
	checkReplicas(t, m, 3, true)
	if kinds[proto.MoveAddReplica] != proto.NumShards+promoted {
		t.Fatalf("re-replication onto d: %v, want %d replicas added (one for each shard, another for each of the %d promoted)", kinds, proto.NumShards+promoted, promoted)
	}
}

// Fewer replicas wanted: PlanDrops names the surplus backups, from the
// most loaded servers, and dropping them leaves the map balanced.
func TestFewerReplicasDropsBackups(t *testing.T) {
	m := threeReplicasOn(t, "a", "b", "c", "d")
	m = must(t, m, setReplicas(2))
	drops := PlanDrops(m)
	if len(drops) != proto.NumShards {
		t.Fatalf("%d drops from 3 replicas to 2, want %d", len(drops), proto.NumShards)
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: drops})
	m, _ = settleCounting(t, m, alwaysLive)
	checkReplicas(t, m, 2, true)
	if !m.Settled() {
		t.Fatalf("not settled: %v", m)
	}
}

func TestReplicaCommandsMustMatch(t *testing.T) {
	m := threeReplicasOn(t, "a", "b", "c")
	m = must(t, m, add("d"))
	sh := m.Shard(0)
	backup := sh.Owners[1]
	for name, c := range map[string]*proto.MapCommand{
		"promote a stranger":    {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 0, Kind: proto.MovePromote, From: sh.Owner(), To: "d"}}},
		"promote from a backup": {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 0, Kind: proto.MovePromote, From: backup, To: sh.Owners[2]}}},
		"add an owner":          {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 0, Kind: proto.MoveAddReplica, From: sh.Owner(), To: backup}}},
		"replace a stranger":    {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 0, Kind: proto.MoveReplace, From: "d", To: "d"}}},
		"drop the primary":      {Op: proto.MapDropReplicas, Moves: []proto.MoveCommand{{Shard: 0, From: sh.Owner()}}},
		"drop a stranger":       {Op: proto.MapDropReplicas, Moves: []proto.MoveCommand{{Shard: 0, From: "d"}}},
		"0 replicas":            {Op: proto.MapSetReplicas},
		"17 replicas":           {Op: proto.MapSetReplicas, Replicas: proto.MaxShardOwners + 1},
	} {
		if next, err := Apply(m, c); err == nil || next != m {
			t.Errorf("%s: applied (%v)", name, err)
		}
	}
	// A finish must name the move's kind too.
	m = must(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 0, Kind: proto.MoveReplace, From: backup, To: "d"}}})
	mv := m.Moves()[0].Command()
	m = must(t, m, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: []proto.MoveCommand{mv}})
	wrong := mv
	wrong.Kind = proto.MoveAddReplica
	if _, err := Apply(m, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: []proto.MoveCommand{wrong}}); !errors.Is(err, ErrBadMove) {
		t.Fatalf("a finish of another kind: %v", err)
	}
	if _, err := Apply(m, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: []proto.MoveCommand{{Shard: 0, From: backup}}}); !errors.Is(err, ErrBadMove) {
		t.Fatalf("dropping a replica a move replaces: %v", err)
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: []proto.MoveCommand{mv}})
	if got := m.Shard(0); !slices.Equal(got.Owners, []string{sh.Owner(), "d", sh.Owners[2]}) || got.Since != sh.Since || got.Origins[1] != mv.Started {
		t.Fatalf("after replacing backup %s by d: %+v (was %+v)", backup, got, sh)
	}
}

// A failover makes the backup named the only owner of each shard of the
// dead primary, with its copy, at the new epoch, ends the shard's move,
// and leaves every other shard alone; the planner then copies replicas
// back from the new primaries.
func TestFailOverKeepsOneBackup(t *testing.T) {
	m := threeReplicasOn(t, "a", "b", "c")
	m = must(t, m, add("d"))
	m = must(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: firstOf(t, m, "b"), Kind: proto.MoveReplace, From: "b", To: "d"}}})
	moving := m.Moves()[0].Command()
	before := map[proto.Shard]Shard{}
	var fail []proto.MoveCommand
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		before[proto.Shard(s)] = sh
		if sh.Owner() == "b" {
			fail = append(fail, proto.MoveCommand{Shard: proto.Shard(s), From: "b", To: sh.Owners[len(sh.Owners)-1]})
		}
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapFailOver, Moves: fail})
	for _, mc := range fail {
		was, is := before[mc.Shard], m.Shard(mc.Shard)
		if !slices.Equal(is.Owners, []string{mc.To}) || is.Since != m.Epoch() || is.Origin != was.Origins[slices.Index(was.Owners, mc.To)] || is.Move != nil {
			t.Fatalf("shard %d failed over from b to %s: %+v (was %+v)", mc.Shard, mc.To, is, was)
		}
	}
	for s, was := range before {
		if is := m.Shard(s); was.Owner() != "b" && (!slices.Equal(is.Owners, was.Owners) || is.Since != was.Since) {
			t.Fatalf("shard %d, not b's: %+v, was %+v", s, is, was)
		}
	}
	if m.Shard(moving.Shard).Move != nil {
		t.Fatalf("shard %d still moving after its primary failed over", moving.Shard)
	}
	for name, mc := range map[string]proto.MoveCommand{
		"from a backup":  {Shard: fail[0].Shard, From: "c", To: fail[0].To},
		"to a stranger":  {Shard: 0, From: m.Shard(0).Owner(), To: "nobody"},
		"to the primary": {Shard: 0, From: m.Shard(0).Owner(), To: m.Shard(0).Owner()},
		"from the past":  fail[0],
	} {
		if next, err := Apply(m, &proto.MapCommand{Op: proto.MapFailOver, Moves: []proto.MoveCommand{mc}}); !errors.Is(err, ErrBadMove) || next != m {
			t.Errorf("a failover %s: %v", name, err)
		}
	}
	m, kinds := settleCounting(t, m, alwaysLive)
	checkReplicas(t, m, 3, true)
	if kinds[proto.MoveAddReplica] < 2*len(fail) {
		t.Fatalf("re-replication after the failover of %d shards: %v", len(fail), kinds)
	}
}

func firstOf(t *testing.T, m *Map, primary string) proto.Shard {
	t.Helper()
	for s := range proto.NumShards {
		if m.Shard(proto.Shard(s)).Owner() == primary {
			return proto.Shard(s)
		}
	}
	t.Fatalf("%s is the primary of nothing", primary)
	return 0
}

// Shards with one copy (a failover's) get their replicas before shards
// with two (a dropped backup's), whatever their order.
func TestReplicasAddedToTheFewestCopiesFirst(t *testing.T) {
	m := threeReplicasOn(t, "a", "b", "c")
	var drops, failovers []proto.MoveCommand
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		switch {
		case s < proto.NumShards/2: // low shards: a backup dropped, two copies
			drops = append(drops, proto.MoveCommand{Shard: proto.Shard(s), From: sh.Owners[2]})
		case s%8 == 0: // a few high ones: failed over, one copy
			failovers = append(failovers, proto.MoveCommand{Shard: proto.Shard(s), From: sh.Owners[0], To: sh.Owners[1]})
		}
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: drops})
	m = must(t, m, &proto.MapCommand{Op: proto.MapFailOver, Moves: failovers})
	plan := Plan(m, alwaysLive, len(failovers))
	if len(plan) != len(failovers) {
		t.Fatalf("%d moves planned, want %d", len(plan), len(failovers))
	}
	for _, mv := range plan {
		if n := m.Holders(mv.Shard); mv.Kind != proto.MoveAddReplica || n != 1 {
			t.Fatalf("planned %+v for a shard of %d copies while %d shards have one", mv, n, len(failovers))
		}
	}
}
