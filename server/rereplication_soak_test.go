//go:build soak

package server_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// soakEnv is the positive integer in environment variable name, or def.
func soakEnv(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// TestReReplicationRate measures re-replication: three servers at two
// replicas hold RKV_SOAK_REREP_MIB MiB (default 128) of values of
// RKV_SOAK_REREP_VALUE bytes (default 4096); every backup one server (not
// the map's leader) holds is dropped, and the planner adds the replicas
// again by add-replica moves, copied one-sidedly from the primaries. It
// logs the copy's MiB/s from the drop until no shard is under-replicated
// (what every target pulled, over the wall time), the targets' own rates,
// and a sample of the catching-up progress status shows; then checks the
// replicas agree (make test-soak).
func TestReReplicationRate(t *testing.T) {
	mib := soakEnv(t, "RKV_SOAK_REREP_MIB", 128)
	size := soakEnv(t, "RKV_SOAK_REREP_VALUE", 4096)
	nkeys := mib << 20 / size
	const arena = 128 << 20
	perServer := int64(nkeys) * int64(size+128) * 2 / 3 // two copies over three servers
	// Room for the copies, the leases' reserve and what the cleaner has
	// not reclaimed: at twice the data, 256 MiB at 4 KiB filled the store.
	count := int(perServer*4/arena) + 2
	slots := uint64(1 << 12)
	for slots < uint64(nkeys) {
		slots <<= 1
	}
	c := testcluster.Start(t, 3, testcluster.Options{
		Store:  store.Options{ArenaSize: arena, ArenaCount: count, IndexSlots: slots, LeaseSize: 4 << 20, Sync: store.SyncNone},
		Server: func(cfg *server.Config) { cfg.Replicas = 2 },
		Settle: 120 * time.Second,
	})
	c.WaitSettled(120 * time.Second)
	cl := c.Client(t, nil)
	ctx := context.Background()
	key := func(i int) []byte { return fmt.Appendf(nil, "rerep-%08d", i) }
	value := make([]byte, size)
	loaded := putParallel(t, cl, nkeys, key, value)
	if t.Failed() {
		return
	}
	t.Logf("loaded %d keys of %d bytes (%d MiB) at two replicas in %v", nkeys, size, mib, loaded.Round(time.Millisecond))

	leader := mapLeader(t, c)
	victim := "s3"
	if leader.Name() == victim {
		victim = "s2"
	}
	m := c.Map()
	var drops []proto.MoveCommand
	for i := range proto.NumShards {
		if info := m.Shard(proto.Shard(i)); info.Owner() != victim && len(info.Owners) == 2 && info.Owners[1] == victim {
			drops = append(drops, proto.MoveCommand{Shard: proto.Shard(i), From: victim})
		}
	}
	pulled := func() (total uint64, per map[string]uint64) {
		per = map[string]uint64{}
		for _, s := range c.Running() {
			b := s.MoveStats().PulledBytes
			per[s.Name()] = b
			total += b
		}
		return total, per
	}
	before, beforePer := pulled()
	start := time.Now()
	if _, err := leader.MapNode().Propose(ctx, &proto.MapCommand{Op: proto.MapDropReplicas, Moves: drops}); err != nil {
		t.Fatal(err)
	}
	var sample string
	var peak proto.CopyProgress
	testcluster.WaitFor(t, 20*time.Minute, "the dropped replicas added again", func() error {
		for _, name := range []string{"s1", "s2", "s3"} {
			if st, err := cl.Stats(ctx, name); err == nil && st.Copying.Bytes > peak.Bytes {
				peak = st.Copying
				sample = fmt.Sprintf("%s catching up: %d shards (%d copied), %.1f MiB and %d keys copied, %.1f MiB/s over %v",
					name, st.Copying.Shards, st.Copying.Copied, float64(st.Copying.Bytes)/(1<<20), st.Copying.Keys,
					float64(st.Copying.Bytes)/(1<<20)/st.Copying.Elapsed.Seconds(), st.Copying.Elapsed.Round(time.Millisecond))
			}
		}
		if r := c.Map().Replication(); r.UnderReplicated > 0 || r.CatchingUp > 0 {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	took := time.Since(start)
	after, afterPer := pulled()
	copied := float64(after-before) / (1 << 20)
	t.Logf("dropped %d backups of %s; replicas back in %v: %.1f MiB pulled, %.1f MiB/s (%d MiB of values at two replicas: %.1f MiB expected)",
		len(drops), victim, took.Round(time.Millisecond), copied, copied/took.Seconds(), mib, float64(mib)*float64(len(drops))/proto.NumShards)
	for _, name := range []string{"s1", "s2", "s3"} {
		ms := c.Server(name).MoveStats()
		t.Logf("%s pulled %.1f MiB; since its start, %d shards moved in, %.1f MiB in %v of move groups (%.1f MiB/s)", name,
			float64(afterPer[name]-beforePer[name])/(1<<20), ms.ShardsMovedIn, float64(ms.CopiedBytes)/(1<<20), ms.CopyTime.Round(time.Millisecond),
			float64(ms.CopiedBytes)/(1<<20)/ms.CopyTime.Seconds())
	}
	t.Logf("the largest copy in progress status showed: %s", sample)
	if after == before || sample == "" {
		t.Fatalf("nothing copied (%d bytes) or no progress seen (%q)", after-before, sample)
	}
	c.WaitSettled(10 * time.Minute)
	m = c.Map()
	waitReplicaStates(t, c, m)
	if n := sameReplicas(t, c, m); n != nkeys {
		t.Fatalf("%d keys on the replicas, want %d", n, nkeys)
	}
}
