package clustermap

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/rkv-io/rkv/proto"
)

// fataler is what must needs of testing.TB and rapid.T alike.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func must(t fataler, m *Map, c *proto.MapCommand) *Map {
	t.Helper()
	next, err := Apply(m, c)
	if err != nil {
		t.Fatalf("%v: %v", c.Op, err)
	}
	return next
}

func add(name string) *proto.MapCommand {
	return &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: name, ID: "id-" + name}}
}

func alwaysLive(string) bool { return true }

// settle plans, starts, freezes and finishes moves until the plan is
// empty, as the servers would, and returns the map and the moves made.
func settle(t testing.TB, m *Map, live func(string) bool) (*Map, int) {
	t.Helper()
	m, kinds := settleCounting(t, m, live)
	moves := 0
	for _, n := range kinds {
		moves += n
	}
	return m, moves
}

// settleCounting is settle, counting the moves by kind.
func settleCounting(t testing.TB, m *Map, live func(string) bool) (*Map, map[proto.MoveKind]int) {
	t.Helper()
	kinds := map[proto.MoveKind]int{}
	for range 200 {
		plan := Plan(m, live, 64)
		if len(plan) == 0 {
			return m, kinds
		}
		for _, mv := range plan {
			kinds[mv.Kind]++
		}
		m = must(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: plan})
		var started []proto.MoveCommand
		for _, mv := range m.Moves() {
			started = append(started, mv.Command())
		}
		m = must(t, m, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: started})
		m = must(t, m, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: started})
	}
	t.Fatal("the plan never settled")
	return nil, nil
}

func checkBalanced(t testing.TB, m *Map) {
	t.Helper()
	counts := m.Counts()
	active := 0
	for _, s := range m.Servers() {
		if s.State == proto.ServerActive {
			active++
		}
	}
	floor := proto.NumShards / active
	for _, s := range m.Servers() {
		c := counts[s.Name]
		if s.State == proto.ServerDraining && c != 0 || s.State == proto.ServerActive && (c < floor || c > floor+1) {
			t.Fatalf("%s (%v) holds %d shards, share %d-%d: %v", s.Name, s.State, c, floor, floor+1, m)
		}
	}
}

func TestBootstrapAndGrow(t *testing.T) {
	m := must(t, Empty, add("node1"))
	if m.Epoch() != 1 || m.ClusterID() == 0 || len(m.Owned("node1")) != proto.NumShards {
		t.Fatalf("bootstrap: %v, cluster %x", m, m.ClusterID())
	}
	if o, since := m.Owner(7); o != "node1" || since != 1 || m.Shard(7).Origin != 0 {
		t.Fatalf("shard 7: %s since %d", o, since)
	}
	if again := must(t, m, add("node1")); again != m {
		t.Fatal("adding a server twice changed the map")
	}
	m = must(t, must(t, m, add("node2")), add("node3"))
	m, moves := settle(t, m, alwaysLive)
	checkBalanced(t, m)
	// Going from 1 to 3 servers moves exactly the shards that must move.
	if moves != proto.NumShards-proto.NumShards/3-1 {
		t.Errorf("1 -> 3 servers: %d moves, want %d", moves, proto.NumShards-proto.NumShards/3-1)
	}
	before := m.Counts()
	m = must(t, m, add("node4"))
	m, moves = settle(t, m, alwaysLive)
	checkBalanced(t, m)
	if moves != proto.NumShards/4 {
		t.Errorf("3 -> 4 servers: %d moves, want %d (before: %v)", moves, proto.NumShards/4, before)
	}
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		if sh.Owner() != "node1" && sh.Origin == 0 {
			t.Fatalf("shard %d reached %s without a move's origin", s, sh.Owner())
		}
	}
	if again, _ := settle(t, m, alwaysLive); again != m {
		t.Fatal("a balanced map planned moves")
	}
}

func TestDrainAndRemove(t *testing.T) {
	m, _ := settle(t, must(t, must(t, must(t, Empty, add("a")), add("b")), add("c")), alwaysLive)
	if _, err := Apply(m, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: "b"}}); !errors.Is(err, ErrServerBusy) {
		t.Fatalf("removing a server that owns shards: %v", err)
	}
	m = must(t, m, &proto.MapCommand{Op: proto.MapDrainServer, Server: proto.MapServer{Name: "b"}})
	m, moves := settle(t, m, alwaysLive)
	if len(m.Owned("b")) != 0 || moves != 341 {
		t.Fatalf("after draining b: it owns %d, %d moves", len(m.Owned("b")), moves)
	}
	checkBalanced(t, m)
	m = must(t, m, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: "b"}})
	if srv, ok := m.Server("b"); !ok || srv.State != proto.ServerRemoved || m.Member("b") || !m.Member("a") {
		t.Fatalf("b after its removal: %+v in %v", srv, m)
	}
	// Its data directory never comes back; its name does, on a new one.
	if _, err := Apply(m, add("b")); !errors.Is(err, ErrRemoved) {
		t.Fatalf("re-adding a removed data directory: %v", err)
	}
	if _, err := Apply(m, &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: "z", ID: "id-b"}}); !errors.Is(err, ErrRemoved) {
		t.Fatalf("a removed data directory under another name: %v", err)
	}
	if !m.Settled() {
		t.Fatalf("a map whose removed server holds nothing is not settled: %v", m)
	}
	back := must(t, m, &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: "b", ID: "id-b2"}})
	if srv, _ := back.Server("b"); srv.State != proto.ServerActive || srv.ID != "id-b2" || srv.Added != back.Epoch() {
		t.Fatalf("b rejoining on an empty data directory: %+v", srv)
	}
	if again := must(t, m, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: "b"}}); again != m {
		t.Fatal("removing a removed server changed the map")
	}
	if _, err := Apply(m, &proto.MapCommand{Op: proto.MapDrainServer, Server: proto.MapServer{Name: "zz"}}); !errors.Is(err, ErrUnknownServer) {
		t.Fatalf("draining an unknown server: %v", err)
	}
	one := must(t, Empty, add("solo"))
	if _, err := Apply(one, &proto.MapCommand{Op: proto.MapDrainServer, Server: proto.MapServer{Name: "solo"}}); !errors.Is(err, ErrLastServer) {
		t.Fatalf("draining the only server: %v", err)
	}
}

func TestForcedRemovalGivesShardsEmpty(t *testing.T) {
	m, _ := settle(t, must(t, must(t, must(t, Empty, add("a")), add("b")), add("c")), alwaysLive)
	// A move into c is under way when b dies and is forced out.
	var fromB proto.Shard
	for _, s := range m.Owned("b") {
		fromB = s
		break
	}
	aShard := m.Owned("a")[0]
	m = must(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: fromB, From: "b", To: "c"}, {Shard: aShard, From: "a", To: "b"}}})
	m = must(t, m, &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: "b"}, Force: true})
	if len(m.Moves()) != 0 {
		t.Fatalf("moves from or to a removed server survive: %v", m.Moves())
	}
	for s := range proto.NumShards {
		sh := m.Shard(proto.Shard(s))
		if sh.Owner() == "b" {
			t.Fatalf("shard %d still owned by b", s)
		}
		if proto.Shard(s) == fromB && (sh.Origin != 0 || sh.Since != m.Epoch()) {
			t.Fatalf("b's shard %d went to %s with origin %d since %d: it must start empty, now", s, sh.Owner(), sh.Origin, sh.Since)
		}
	}
	if o, _ := m.Owner(aShard); o != "a" {
		t.Fatalf("a's shard moving to b went to %s", o)
	}
}

func TestMovesMustMatch(t *testing.T) {
	m := must(t, must(t, Empty, add("a")), add("b"))
	start := &proto.MapCommand{Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 3, From: "a", To: "b"}}}
	for name, c := range map[string]*proto.MapCommand{
		"wrong owner":  {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 3, From: "b", To: "a"}}},
		"to unknown":   {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 3, From: "a", To: "x"}}},
		"to itself":    {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 3, From: "a", To: "a"}}},
		"shard twice":  {Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: 3, From: "a", To: "b"}, {Shard: 3, From: "a", To: "b"}}},
		"freeze none":  {Op: proto.MapFreezeMoves, Moves: []proto.MoveCommand{{Shard: 3, From: "a", To: "b", Started: 2}}},
		"finish none":  {Op: proto.MapFinishMoves, Moves: []proto.MoveCommand{{Shard: 3, From: "a", To: "b", Started: 2}}},
		"id of a":      {Op: proto.MapAddServer, Server: proto.MapServer{Name: "c", ID: "id-a"}},
		"a's new disk": {Op: proto.MapAddServer, Server: proto.MapServer{Name: "a", ID: "other"}},
	} {
		if _, err := Apply(m, c); err == nil {
			t.Errorf("%s: applied", name)
		}
	}
	m = must(t, m, start)
	started := m.Shard(3).Move.Started
	mc := proto.MoveCommand{Shard: 3, From: "a", To: "b", Started: started}
	if _, err := Apply(m, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: []proto.MoveCommand{mc}}); !errors.Is(err, ErrBadMove) {
		t.Fatalf("finishing a move that is not frozen: %v", err)
	}
	if _, err := Apply(m, start); !errors.Is(err, ErrBadMove) {
		t.Fatalf("starting a move twice: %v", err)
	}
	// An abort, then a new move of the same shard: a late freeze or finish
	// of the first one matches nothing.
	m = must(t, m, &proto.MapCommand{Op: proto.MapAbortMoves, Moves: []proto.MoveCommand{mc}})
	m = must(t, m, start)
	if _, err := Apply(m, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: []proto.MoveCommand{mc}}); !errors.Is(err, ErrBadMove) {
		t.Fatalf("a freeze of an aborted move: %v", err)
	}
	if again := must(t, m, &proto.MapCommand{Op: proto.MapAbortMoves, Moves: []proto.MoveCommand{mc}}); again != m {
		t.Fatal("aborting an ended move changed the map")
	}
	mc.Started = m.Shard(3).Move.Started
	m = must(t, m, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: []proto.MoveCommand{mc}})
	m = must(t, m, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: []proto.MoveCommand{mc}})
	if sh := m.Shard(3); sh.Owner() != "b" || sh.Since != m.Epoch() || sh.Origin != mc.Started || sh.Move != nil {
		t.Fatalf("after the finish: %+v", sh)
	}
}

func TestPlanSkipsDeadServers(t *testing.T) {
	m, _ := settle(t, must(t, must(t, Empty, add("a")), add("b")), alwaysLive)
	m = must(t, m, add("c"))
	deadB := func(n string) bool { return n != "b" }
	for _, mv := range Plan(m, deadB, 1000) {
		if mv.From == "b" || mv.To == "b" {
			t.Fatalf("a move involving dead b: %+v", mv)
		}
	}
	if len(Plan(m, func(string) bool { return false }, 10)) != 0 {
		t.Fatal("a plan with nobody alive")
	}
}

// TestApplyProperties drives random command sequences and checks what the
// rest of the system relies on: every change raises the epoch by exactly
// one and every map validates; a shard's owner changes only by a finished
// move (Origin = its start, Since = that epoch) or a forced removal
// (Origin 0); Since never goes back.
func TestApplyProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := []string{"a", "b", "c", "d", "e"}
		m := must(t, Empty, add("a"))
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			var c *proto.MapCommand
			switch rapid.IntRange(0, 8).Draw(t, "op") {
			case 7:
				c = setReplicas(rapid.IntRange(1, 4).Draw(t, "replicas"))
			case 8:
				c = &proto.MapCommand{Op: proto.MapDropReplicas, Moves: PlanDrops(m)}
			case 0:
				c = add(rapid.SampledFrom(names).Draw(t, "name"))
			case 1:
				c = &proto.MapCommand{Op: proto.MapDrainServer, Server: proto.MapServer{Name: rapid.SampledFrom(names).Draw(t, "name")}}
			case 2:
				c = &proto.MapCommand{Op: proto.MapRemoveServer, Server: proto.MapServer{Name: rapid.SampledFrom(names).Draw(t, "name")}, Force: rapid.Bool().Draw(t, "force")}
			case 3:
				c = &proto.MapCommand{Op: proto.MapStartMoves, Moves: Plan(m, alwaysLive, rapid.IntRange(1, 300).Draw(t, "budget"))}
			default:
				ops := []proto.MapOp{proto.MapFreezeMoves, proto.MapFinishMoves, proto.MapAbortMoves}
				c = &proto.MapCommand{Op: rapid.SampledFrom(ops).Draw(t, "moveop")}
				for _, mv := range m.Moves() {
					if rapid.Bool().Draw(t, fmt.Sprint("pick", mv.Shard)) {
						c.Moves = append(c.Moves, mv.Command())
					}
				}
			}
			next, err := Apply(m, c)
			if err != nil {
				if next != m {
					t.Fatalf("%v failed (%v) but changed the map", c.Op, err)
				}
				continue
			}
			if next == m {
				continue
			}
			if next.Epoch() != m.Epoch()+1 {
				t.Fatalf("%v: epoch %d -> %d", c.Op, m.Epoch(), next.Epoch())
			}
			if _, err := Decode(mustEncode(t, next)); err != nil {
				t.Fatalf("%v: the new map does not round-trip: %v", c.Op, err)
			}
			for s := range proto.NumShards {
				was, is := m.Shard(proto.Shard(s)), next.Shard(proto.Shard(s))
				if is.Since < was.Since {
					t.Fatalf("shard %d: since went back %d -> %d", s, was.Since, is.Since)
				}
				if was.Owner() == is.Owner() {
					continue
				}
				// The new primary's copy: the one it had as a backup, or
				// the one the move copied, or none.
				origin := uint64(0)
				if i := slices.Index(was.Owners, is.Owner()); i > 0 {
					origin = was.Origins[i]
				}
				switch {
				case c.Op == proto.MapFinishMoves && was.Move != nil && was.Move.Kind == proto.MoveReplace:
					if was.Move.From != was.Owner() || was.Move.To != is.Owner() || is.Origin != was.Move.Started || is.Since != next.Epoch() {
						t.Fatalf("shard %d: %s -> %s by a finish, was %+v, is %+v", s, was.Owner(), is.Owner(), was.Move, is)
					}
				case c.Op == proto.MapFinishMoves && was.Move != nil && was.Move.Kind == proto.MovePromote:
					if was.Move.To != is.Owner() || is.Origin != origin || is.Since != next.Epoch() || !slices.Contains(is.Owners, was.Owner()) {
						t.Fatalf("shard %d: %s -> %s by a promotion, was %+v, is %+v", s, was.Owner(), is.Owner(), was, is)
					}
				case c.Op == proto.MapRemoveServer && c.Force && was.Owner() == c.Server.Name:
					if is.Origin != origin || is.Since != next.Epoch() {
						t.Fatalf("shard %d: forced to %s with origin %d, want %d (its copy)", s, is.Owner(), is.Origin, origin)
					}
				default:
					t.Fatalf("shard %d changed owner %s -> %s by %v", s, was.Owner(), is.Owner(), c.Op)
				}
			}
			m = next
		}
	})
}

func mustEncode(t fataler, m *Map) []byte {
	b, err := m.Encode()
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}
