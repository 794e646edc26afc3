package server_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// Raising the replica count copies every shard to the other server as a
// backup (add-replica moves: copy, freeze, fence, final copy, finish, the
// primary keeping its shards), while the primaries go on serving; then two
// backups are promoted. Forwarding writes to the backups is not built yet
// (docs/ARCHITECTURE.md, "Replication"), so the backups are compared with
// their primaries before anything else is written.
func TestReplicasAddedAndPromoted(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers and 1024 shard copies")
	}
	c := testcluster.Start(t, 2, testcluster.Options{Store: store.Options{ArenaSize: 16 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 64 << 10}})
	c.WaitSettled(30 * time.Second)
	cl := c.Client(t, nil)
	ctx := context.Background()
	const nkeys = 400
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%03d", i) }
	for i := range nkeys {
		if err := cl.Put(ctx, key(i), value(string(key(i)), 1)); err != nil {
			t.Fatal(err)
		}
	}
	var leader *server.Server
	for _, s := range c.Running() {
		if s.MapNode().IsLeader() {
			leader = s
		}
	}
	if leader == nil {
		t.Fatal("no leader")
	}
	if _, err := leader.MapNode().Propose(ctx, &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	c.WaitSettled(60 * time.Second)

	m := c.Map()
	if m.Replicas() != 2 {
		t.Fatalf("replicas %d after setting 2", m.Replicas())
	}
	// Each server applies the finished map on its own (reconcile): wait
	// for the stores to say what the map does.
	waitRoles(t, c, m)
	copied := 0
	for i := range proto.NumShards {
		sh := proto.Shard(i)
		info := m.Shard(sh)
		primary, backup := c.Server(info.Owners[0]).Store(), c.Server(info.Owners[1]).Store()
		pe, _, err := primary.ShardEntries(sh, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		be, _, err := backup.ShardEntries(sh, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		same := slices.EqualFunc(pe, be, func(a, b store.ScanEntry) bool { return string(a.Key) == string(b.Key) && a.Version == b.Version })
		if !same {
			t.Fatalf("shard %d: the primary's entries %v, the backup's %v", i, pe, be)
		}
		copied += len(be)
	}
	if copied != nkeys {
		t.Fatalf("%d keys backed up, want %d", copied, nkeys)
	}
	for i := range nkeys {
		got, err := cl.Get(ctx, key(i))
		if err == nil {
			err = check(string(key(i)), 1, got)
		}
		if err != nil {
			t.Fatalf("after the copies: %s: %v", key(i), err)
		}
	}

	// Promote the backup of one shard of each primary (the primaries stay
	// balanced, so the planner leaves them): no copy, the primary fenced and
	// made a backup, the backup serving.
	var promotions []proto.MoveCommand
	for _, primary := range []string{"s1", "s2"} {
		for i := range proto.NumShards {
			if info := m.Shard(proto.Shard(i)); info.Owner() == primary {
				promotions = append(promotions, proto.MoveCommand{Shard: proto.Shard(i), From: primary, To: info.Owners[1], Kind: proto.MovePromote})
				break
			}
		}
	}
	if _, err := leader.MapNode().Propose(ctx, &proto.MapCommand{Op: proto.MapStartMoves, Moves: promotions}); err != nil {
		t.Fatal(err)
	}
	c.WaitSettled(60 * time.Second)
	after := c.Map()
	for _, p := range promotions {
		if got := after.Shard(p.Shard).Owners; !slices.Equal(got, []string{p.To, p.From}) {
			t.Fatalf("shard %d after its promotion: owners %v, want [%s %s]", p.Shard, got, p.To, p.From)
		}
	}
	waitRoles(t, c, after)
	for i := range nkeys {
		k := key(i)
		got, err := cl.Get(ctx, k)
		if err == nil {
			err = check(string(k), 1, got)
		}
		if err != nil {
			t.Fatalf("after the promotions: %s: %v", k, err)
		}
		if err := cl.Put(ctx, k, value(string(k), 2)); err != nil {
			t.Fatalf("after the promotions: put %s: %v", k, err)
		}
		if got, err := cl.Get(ctx, k); err != nil || check(string(k), 2, got) != nil {
			t.Fatalf("after the promotions: %s read %q, %v after its put", k, got, err)
		}
	}
}

// waitRoles waits until every shard is owned, unfrozen, by its primary in
// m and backed up by its other owner.
func waitRoles(t *testing.T, c *testcluster.Cluster, m *clustermap.Map) {
	t.Helper()
	testcluster.WaitFor(t, 30*time.Second, "every shard owned by its primary and backed up by the other", func() error {
		for i := range proto.NumShards {
			sh := proto.Shard(i)
			info := m.Shard(sh)
			if len(info.Owners) != 2 || info.Owners[0] == info.Owners[1] {
				return fmt.Errorf("shard %d owners %v, want two servers", i, info.Owners)
			}
			if st := c.Server(info.Owners[0]).Store().ShardState(sh); st.State != store.ShardOwned || st.Since != info.Since || st.Frozen {
				return fmt.Errorf("shard %d on its primary %s: %+v, want owned since %d, not frozen", i, info.Owners[0], st, info.Since)
			}
			if st := c.Server(info.Owners[1]).Store().ShardState(sh); st.State != store.ShardBackup || st.Since != info.Since {
				return fmt.Errorf("shard %d on its backup %s: %+v, want a backup since %d", i, info.Owners[1], st, info.Since)
			}
		}
		return nil
	})
}
