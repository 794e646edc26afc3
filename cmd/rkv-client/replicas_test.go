package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// replicas shows the count and sets it; members, status and map show each
// server's primaries and backups, its zone and the map's count, in the
// table and in JSON.
func TestReplicasCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers and 1024 shard copies")
	}
	zones := map[string]string{"s1": "zone-a", "s2": "zone-b"}
	c := testcluster.Start(t, 2, testcluster.Options{
		Store:  store.Options{ArenaSize: 16 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 64 << 10},
		Server: func(cfg *server.Config) { cfg.Zone = zones[cfg.Name] },
	})
	env := map[string]string{"RKV_ENDPOINTS": strings.Join(c.ControlAddrs(), ","), "RKV_TIMEOUT": "30s"}
	must := func(args ...string) string {
		t.Helper()
		out, errs, code := runCLI(env, args...)
		if code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errs)
		}
		return out
	}
	contains := func(what, out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Fatalf("%s: %q lacks %q", what, out, w)
			}
		}
	}

	contains("replicas", must("replicas"), "replicas: 1 (map epoch ", "copies of each shard: 1 (2 active servers)\n", "under-replicated shards: 0\n",
		"shards in sync at 1: 1024\n", "shards catching up (a copy to a new replica in progress): 0\n")
	for _, arg := range []string{"0", "17", "-1", "two"} {
		if _, errs, code := runCLI(env, "replicas", "--", arg); code != exitUsage || !strings.Contains(errs, "the replica count is a number from 1 to 16") {
			t.Errorf("replicas %s: exit %d, %q; want a usage error", arg, code, errs)
		}
	}
	if _, _, code := runCLI(env, "replicas", "2", "3"); code != exitUsage {
		t.Errorf("replicas 2 3: exit %d, want %d", code, exitUsage)
	}
	before := c.Map().Epoch()
	var r replicationJSON
	if err := json.Unmarshal([]byte(must("-o", "json", "replicas", "2")), &r); err != nil {
		t.Fatal(err)
	}
	if r.Replicas != 2 || r.Target != 2 || r.ActiveServers != 2 || r.MapEpoch <= before {
		t.Fatalf("replicas 2: %+v (the map was at epoch %d)", r, before)
	}
	c.WaitSettled(120 * time.Second)
	out := must("replicas")
	contains("replicas at 2", out, "replicas: 2 (map epoch ", "copies of each shard: 2 (2 active servers)\n", "under-replicated shards: 0\n", "add-replica moves in progress: 0\n")

	// A server drops a copy's progress once its mover has seen the move
	// finish in the map, a moment after the map settled.
	var rows []statusJSON
	testcluster.WaitFor(t, 10*time.Second, "no copy in progress in status", func() error {
		rows = nil
		if err := json.Unmarshal([]byte(must("-o", "json", "status")), &rows); err != nil || len(rows) != 2 {
			t.Fatalf("status -o json: %v, %d rows", err, len(rows))
		}
		for _, row := range rows {
			if row.CatchUp != (catchUpJSON{}) {
				return fmt.Errorf("%s catching up: %+v", row.Name, row.CatchUp)
			}
		}
		return nil
	})
	for _, row := range rows {
		if row.Zone != zones[row.Name] || row.ShardsPrimary+row.ShardsBackup != proto.NumShards || row.ShardsBackup == 0 || row.ShardsPrimary == 0 ||
			row.MapReplicas != 2 || row.MapUnderReplicated != 0 || row.MapInSync != proto.NumShards || row.MapCatchingUp != 0 || row.ShardsCatchingUp != 0 ||
			row.CatchUp != (catchUpJSON{}) {
			t.Fatalf("status of %s: %+v", row.Name, row)
		}
	}
	contains("status", must("status"), "ZONE", "PRIMARY", "BACKUP", "CATCHING UP", "zone-a", "zone-b",
		": replicas: 2 wanted (2 copies a shard with 2 active servers), 1024 shards in sync at 2, 0 under-replicated, 0 catching up\n")

	var members []memberJSON
	if err := json.Unmarshal([]byte(must("-o", "json", "members")), &members); err != nil || len(members) != 2 {
		t.Fatalf("members -o json: %v, %d rows", err, len(members))
	}
	for _, m := range members {
		if m.Zone != zones[m.Name] || m.ShardsPrimary+m.ShardsBackup != proto.NumShards || m.ShardsBackup == 0 || m.MapReplicas != 2 {
			t.Fatalf("members row of %s: %+v", m.Name, m)
		}
	}
	contains("members", must("members"), "ZONE", "PRIMARY", "BACKUP", "CATCHING UP", "zone-b", "1024 shards in sync at 2, 0 under-replicated, 0 catching up\n")

	// The shards view: nothing to list, all of them, two of them.
	contains("shards", must("shards"), ": all 1024 shards have 2 copies in sync, no move in progress\n(--all lists every shard)\n")
	var sv shardsOutJSON
	if err := json.Unmarshal([]byte(must("-o", "json", "shards", "--all")), &sv); err != nil || len(sv.Shards) != proto.NumShards || !sv.Healthy || sv.Target != 2 {
		t.Fatalf("shards --all -o json: %v, %d shards, %+v", err, len(sv.Shards), sv)
	}
	for _, j := range sv.Shards {
		if len(j.InSync) != 1 || j.InSync[0] == j.Primary || j.CatchingUp != "" || j.Move != nil || j.State != "in sync" {
			t.Fatalf("shards --all: %+v", j)
		}
	}
	if out := must("shards", "3", "1000"); strings.Count(out, "\n") != 4 || !strings.Contains(out, "\n3 ") || !strings.Contains(out, "\n1000 ") {
		t.Fatalf("shards 3 1000: %q", out)
	}

	var mj struct {
		Replicas int             `json:"replicas"`
		Servers  []mapServerJSON `json:"servers"`
	}
	if err := json.Unmarshal([]byte(must("-o", "json", "map")), &mj); err != nil || mj.Replicas != 2 || len(mj.Servers) != 2 {
		t.Fatalf("map -o json: %+v, %v", mj, err)
	}
	for _, s := range mj.Servers {
		if s.Zone != zones[s.Name] || s.Shards+s.Backups != proto.NumShards {
			t.Fatalf("map's %s: %+v", s.Name, s)
		}
	}

	// Back to one: the leader drops a backup of every shard.
	contains("replicas 1", must("replicas", "1"), "replica count set to 1 at map epoch ")
	c.WaitSettled(60 * time.Second)
	contains("replicas at 1", must("replicas"), "replicas: 1 (map epoch ", "copies of each shard: 1 (2 active servers)\n", "under-replicated shards: 0\n")
	if err := json.Unmarshal([]byte(must("-o", "json", "status")), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("status -o json: %v, %d rows", err, len(rows))
	}
	for _, row := range rows {
		if row.ShardsBackup != 0 || row.MapReplicas != 1 {
			t.Fatalf("status of %s at one replica: %+v", row.Name, row)
		}
	}
}
