package server_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// A client raises two servers, each in a zone of its own, to two
// replicas: the map takes the count, the leader adds a replica of every
// shard on the other server, and each shard ends with two holders, the
// primary serving it and the other backing it up. Counts out of range are
// refused by the client before anything is sent. Lowered to one again,
// the leader drops the backups.
func TestClientSetsReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers and 1024 shard copies")
	}
	zones := map[string]string{"s1": "zone-a", "s2": "zone-b"}
	c := testcluster.Start(t, 2, testcluster.Options{
		Store:  store.Options{ArenaSize: 16 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 64 << 10},
		Server: func(cfg *server.Config) { cfg.Zone = zones[cfg.Name] },
	})
	m := c.Map()
	for name, zone := range zones {
		if srv, _ := m.Server(name); srv.Zone != zone {
			t.Fatalf("%s in the map with zone %q, want %q (from its gossip)", name, srv.Zone, zone)
		}
	}
	if m.Replicas() != 1 {
		t.Fatalf("a new cluster at %d replicas, want the default 1", m.Replicas())
	}
	cl := c.Client(t, nil)
	handled := func() (n uint64) {
		for _, s := range c.Running() {
			n += s.Stats().Handled[proto.MsgSetReplicas]
		}
		return n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range []int{0, -1, proto.MaxShardOwners + 1} {
		if _, err := cl.SetReplicas(ctx, n); !errors.Is(err, client.ErrInvalid) {
			t.Fatalf("SetReplicas(%d): %v, want ErrInvalid", n, err)
		}
	}
	if n := handled(); n != 0 {
		t.Fatalf("%d SetReplicas reached a server for counts out of range", n)
	}

	epoch, err := cl.SetReplicas(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if epoch <= m.Epoch() || handled() != 1 {
		t.Fatalf("SetReplicas(2): epoch %d (from %d), %d requests handled", epoch, m.Epoch(), handled())
	}
	if got := cl.Map(); got.Epoch() < epoch || got.Replicas() != 2 {
		t.Fatalf("the client's map after SetReplicas(2): epoch %d, %d replicas; want %d or later, 2", got.Epoch(), got.Replicas(), epoch)
	}
	c.WaitSettled(120 * time.Second)
	m = c.Map()
	if r := m.Replication(); r != (clustermap.Replication{Replicas: 2, Target: 2, InSync: proto.NumShards}) {
		t.Fatalf("settled at 2 replicas: %+v", r)
	}
	waitRoles(t, c, m) // every shard: two holders, the primary serving, the other a backup
	primaries, backups := m.Counts(), m.Backups()
	for name := range zones {
		if primaries[name]+backups[name] != proto.NumShards || primaries[name] == 0 {
			t.Fatalf("%s: primary of %d shards, backs up %d; want every shard, some as primary", name, primaries[name], backups[name])
		}
	}

	// More than there are servers is taken; back to 2 is no drop; 1
	// drops a backup of every shard.
	for _, n := range []int{3, 2, 1} {
		if _, err := cl.SetReplicas(ctx, n); err != nil {
			t.Fatalf("SetReplicas(%d) on two servers: %v", n, err)
		}
		c.WaitSettled(30 * time.Second)
		if r := c.Map().Replication(); r != (clustermap.Replication{Replicas: n, Target: min(n, 2), InSync: proto.NumShards}) {
			t.Fatalf("at %d replicas on two servers: %+v", n, r)
		}
	}
	if b := c.Map().Backups(); b["s1"]+b["s2"] != 0 {
		t.Fatalf("at one replica, backups %v", b)
	}
}
