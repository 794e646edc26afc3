package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
)

// While the replica count is raised from one to two, each server is the
// target of add-replica moves of the other's shards: the map shows it
// catching those up (not among their in-sync backups), and its Stats say
// how far its copy has come (shards, bytes, time). Once the moves finish,
// every shard's other server is an in-sync backup, nothing catches up, and
// the copy progress is back to zero with the finished moves counted.
func TestCatchingUpThenInSync(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers and 1024 shard copies")
	}
	c, cl := twoServers(t)
	ctx := context.Background()
	const nkeys = 2000
	value := make([]byte, 2048)
	for i := range nkeys {
		if err := cl.Put(ctx, fmt.Appendf(nil, "catchup-%05d", i), value); err != nil {
			t.Fatal(err)
		}
	}

	// Watch the map and both servers' Stats while the copies run.
	type sample struct {
		server  string
		copying proto.CopyProgress
	}
	var (
		mu         sync.Mutex
		seenMap    string // a shard seen catching up, described
		seenStats  []sample
		mapProblem string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			m := c.Map()
			for i := range proto.NumShards {
				r := m.ShardReplicas(proto.Shard(i))
				if r.CatchingUp == "" {
					continue
				}
				mu.Lock()
				switch {
				case r.Move == nil || r.Move.Kind != proto.MoveAddReplica || r.Move.To != r.CatchingUp:
					mapProblem = fmt.Sprintf("shard %d at epoch %d: %+v, move %+v", i, m.Epoch(), r, r.Move)
				case r.CatchingUp == r.Primary || slices.Contains(r.InSync, r.CatchingUp):
					mapProblem = fmt.Sprintf("shard %d at epoch %d: %s catching up and an owner: %+v", i, m.Epoch(), r.CatchingUp, r)
				case seenMap == "" && len(r.InSync) == 0:
					seenMap = fmt.Sprintf("shard %d at epoch %d: primary %s, %s catching up", i, m.Epoch(), r.Primary, r.CatchingUp)
				}
				mu.Unlock()
			}
			for _, name := range []string{"s1", "s2"} {
				st, err := cl.Stats(ctx, name)
				if err != nil {
					continue
				}
				if st.Copying != (proto.CopyProgress{}) {
					mu.Lock()
					seenStats = append(seenStats, sample{name, st.Copying})
					mu.Unlock()
				}
			}
		}
	})
	if _, err := cl.SetReplicas(ctx, 2); err != nil {
		t.Fatal(err)
	}
	c.WaitSettled(90 * time.Second)
	close(stop)
	wg.Wait()

	if mapProblem != "" {
		t.Fatal(mapProblem)
	}
	if seenMap == "" {
		t.Fatal("no shard was seen with a replica catching up while the count went from 1 to 2")
	}
	t.Logf("seen in the map: %s", seenMap)
	var withBytes int
	for _, s := range seenStats {
		p := s.copying
		if p.Groups == 0 || p.Shards == 0 || p.Shards > 32*p.Groups || p.Copied > p.Shards || p.Elapsed <= 0 {
			t.Fatalf("%s's copy progress: %+v", s.server, p)
		}
		if p.Bytes > 0 && p.Keys > 0 {
			withBytes++
		}
	}
	if len(seenStats) == 0 || withBytes == 0 {
		t.Fatalf("%d samples of a copy in progress in Stats, %d with bytes copied", len(seenStats), withBytes)
	}
	t.Logf("%d samples of a copy in progress, %d with bytes copied; one: %s %+v", len(seenStats), withBytes, seenStats[len(seenStats)/2].server, seenStats[len(seenStats)/2].copying)

	m := c.Map()
	for i := range proto.NumShards {
		r := m.ShardReplicas(proto.Shard(i))
		if other := map[string]string{"s1": "s2", "s2": "s1"}[r.Primary]; !slices.Equal(r.InSync, []string{other}) || r.CatchingUp != "" || r.Move != nil {
			t.Fatalf("settled at two replicas, shard %d: %+v; want %s in sync", i, r, other)
		}
	}
	if r := m.Replication(); r.InSync != proto.NumShards || r.CatchingUp != 0 || r.UnderReplicated != 0 {
		t.Fatalf("settled: %+v", r)
	}
	for name, n := range m.CatchingUp() {
		if n != 0 {
			t.Fatalf("settled, %s catches up %d shards", name, n)
		}
	}
	var movedIn uint64
	testcluster.WaitFor(t, 10*time.Second, "the copy progress back to zero", func() error {
		movedIn = 0
		for _, s := range c.Running() {
			ms := s.MoveStats()
			if ms.Copying != (proto.CopyProgress{}) {
				return fmt.Errorf("%s still copying: %+v", s.Name(), ms.Copying)
			}
			if ms.CopiedBytes == 0 || ms.PulledBytes < ms.CopiedBytes {
				return fmt.Errorf("%s: %+v", s.Name(), ms)
			}
			movedIn += ms.ShardsMovedIn
		}
		return nil
	})
	if movedIn < proto.NumShards {
		t.Fatalf("%d shards moved in, want at least %d (an add-replica move each, and any promotions)", movedIn, proto.NumShards)
	}
}
