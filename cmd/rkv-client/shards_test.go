package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
)

func apply(t *testing.T, m *clustermap.Map, c *proto.MapCommand) *clustermap.Map {
	t.Helper()
	next, err := clustermap.Apply(m, c)
	if err != nil {
		t.Fatalf("%v: %v", c.Op, err)
	}
	return next
}

// twoReplicasOnThree is a map of servers a, b, c at two replicas, the
// planner's moves all made.
func twoReplicasOnThree(t *testing.T) *clustermap.Map {
	t.Helper()
	m := clustermap.Empty
	for i, name := range []string{"a", "b", "c"} {
		m = apply(t, m, &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: name, ID: "id-" + name}})
		if i == 0 {
			m = apply(t, m, &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: 2})
		}
	}
	for range 200 {
		plan := clustermap.Plan(m, func(string) bool { return true }, 256)
		if len(plan) == 0 {
			return m
		}
		m = apply(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: plan})
		var started []proto.MoveCommand
		for _, mv := range m.Moves() {
			started = append(started, mv.Command())
		}
		m = apply(t, m, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: started})
		m = apply(t, m, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: started})
	}
	t.Fatal("the plan never settled")
	return nil
}

// notOwner is a server of a, b, c that does not hold sh.
func notOwner(t *testing.T, sh clustermap.Shard) string {
	for _, s := range []string{"a", "b", "c"} {
		if !strings.Contains(strings.Join(sh.Owners, " "), s) {
			return s
		}
	}
	t.Fatalf("owners %v: every server", sh.Owners)
	return ""
}

// The shards view and the replication line, of a map crafted with a
// backup dropped and being added again (shard 5), a backup being replaced
// (7) and a promotion (9): those three listed by default, with their
// catching-up targets and move kinds; a healthy map says so and lists
// nothing; --all and shard arguments list what they name.
func TestShardsView(t *testing.T) {
	m := twoReplicasOnThree(t)
	res := shardsView(m, nil, false)
	var out bytes.Buffer
	if err := writeShards(&out, res, m.Replication(), false); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("map epoch %d: all 1024 shards have 2 copies in sync, no move in progress\n(--all lists every shard)\n", m.Epoch()); out.String() != want || !res.Healthy {
		t.Fatalf("healthy map: %q (healthy %v), want %q", out.String(), res.Healthy, want)
	}
	if res := shardsView(m, nil, true); len(res.Shards) != proto.NumShards || len(res.Shards[1023].InSync) != 1 || res.Shards[1023].State != "in sync" {
		t.Fatalf("--all: %d shards, the last %+v", len(res.Shards), res.Shards[len(res.Shards)-1])
	}

	s5, s7, s9 := m.Shard(5), m.Shard(7), m.Shard(9)
	m = apply(t, m, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: []proto.MoveCommand{{Shard: 5, From: s5.Owners[1]}}})
	m = apply(t, m, &proto.MapCommand{Op: proto.MapStartMoves, Moves: []proto.MoveCommand{
		{Shard: 5, Kind: proto.MoveAddReplica, From: s5.Owner(), To: notOwner(t, s5)},
		{Shard: 7, Kind: proto.MoveReplace, From: s7.Owners[1], To: notOwner(t, s7)},
		{Shard: 9, Kind: proto.MovePromote, From: s9.Owner(), To: s9.Owners[1]},
	}})
	started := m.Moves()[0].Started
	res = shardsView(m, nil, false)
	if res.Healthy || len(res.Shards) != 3 {
		t.Fatalf("with a dropped backup and three moves: healthy %v, %d shards listed: %+v", res.Healthy, len(res.Shards), res.Shards)
	}
	want := []shardJSON{
		{Shard: 5, Primary: s5.Owner(), InSync: []string{}, CatchingUp: notOwner(t, s5), State: "under-replicated",
			Move: &mapMoveJSON{Shard: 5, Kind: "add-replica", From: s5.Owner(), To: notOwner(t, s5), Phase: "copying", Started: started}},
		{Shard: 7, Primary: s7.Owner(), InSync: s7.Owners[1:], CatchingUp: notOwner(t, s7), State: "in sync",
			Move: &mapMoveJSON{Shard: 7, Kind: "replace", From: s7.Owners[1], To: notOwner(t, s7), Phase: "copying", Started: started}},
		{Shard: 9, Primary: s9.Owner(), InSync: s9.Owners[1:], State: "in sync",
			Move: &mapMoveJSON{Shard: 9, Kind: "promote", From: s9.Owner(), To: s9.Owners[1], Phase: "copying", Started: started}},
	}
	got, _ := json.Marshal(res.Shards)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(got, wantJSON) {
		t.Fatalf("shards listed:\n%s\nwant\n%s", got, wantJSON)
	}
	out.Reset()
	if err := writeShards(&out, res, m.Replication(), false); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, w := range []string{
		fmt.Sprintf("map epoch %d: replicas: 2 wanted (2 copies a shard now), 1023 shards in sync at 2, 1 under-replicated, 2 catching up\n", m.Epoch()),
		"SHARD  STATE             PRIMARY  IN SYNC  CATCHING UP  MOVE\n",
		fmt.Sprintf("5      under-replicated  %s        -        %s            add-replica %s->%s, copying since epoch %d\n", s5.Owner(), notOwner(t, s5), s5.Owner(), notOwner(t, s5), started),
		fmt.Sprintf("9      in sync           %s        %s        -            promote %s->%s, copying since epoch %d\n", s9.Owner(), s9.Owners[1], s9.Owner(), s9.Owners[1], started),
	} {
		if !strings.Contains(text, w) {
			t.Errorf("shards output lacks %q:\n%s", w, text)
		}
	}
	if n := strings.Count(text, "\n"); n != 5 {
		t.Errorf("%d lines, want a header, the column names and 3 shards:\n%s", n, text)
	}
	if res := shardsView(m, []proto.Shard{9, 0}, false); len(res.Shards) != 2 || res.Shards[0].Shard != 9 || res.Shards[1].Shard != 0 || res.Healthy {
		t.Fatalf("shards 9 0: %+v", res)
	}

	// members' and status's line, and their rows' counts.
	if got, want := replicationLine(m), fmt.Sprintf("map epoch %d: replicas: 2 wanted (2 copies a shard with 3 active servers), 1023 shards in sync at 2, 1 under-replicated, 2 catching up", m.Epoch()); got != want {
		t.Errorf("replication line %q, want %q", got, want)
	}
	roles := shardRoles(m)
	catching := 0
	for _, s := range []string{"a", "b", "c"} {
		j := roles(s)
		catching += j.ShardsCatchingUp
		if j.MapInSync != proto.NumShards-1 || j.MapCatchingUp != 2 || j.MapUnderReplicated != 1 {
			t.Errorf("%s's row: %+v", s, j)
		}
	}
	if catching != 2 || roles(notOwner(t, s5)).ShardsCatchingUp == 0 {
		t.Errorf("%d shards catching up over the rows, want 2, one on %s", catching, notOwner(t, s5))
	}
}

// Shard arguments outside 0 to 1023 are a usage error, before any
// connection.
func TestShardsArguments(t *testing.T) {
	env := map[string]string{"RKV_ENDPOINTS": "127.0.0.1:1"}
	for _, arg := range []string{"1024", "-1", "x"} {
		if _, errs, code := runCLI(env, "shards", "--", arg); code != exitUsage || !strings.Contains(errs, "a shard is a number from 0 to 1023") {
			t.Errorf("shards %s: exit %d, %q; want a usage error", arg, code, errs)
		}
	}
}

// A copy in progress, for status.
func TestCatchUpLine(t *testing.T) {
	j := toCatchUpJSON(proto.CopyProgress{Groups: 2, Shards: 12, Copied: 4, Keys: 1200, Bytes: 41 << 20, Elapsed: 2e9})
	if got, want := catchUpLine(j), "12 shards (4 copied), 41.0 MiB and 1200 keys copied, 20.5 MiB/s over 2.0 s (2 move groups)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
