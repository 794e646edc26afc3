package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// BenchmarkReplicatedPut measures one client's PUT p50 of 1 KiB on two
// servers (sync none), first with one copy of each key, then with two
// (every PUT written to both, the commit forwarded by the primary), in one
// run:
//
//	go test -run '^$' -bench ReplicatedPut -benchtime 2000x ./client/
func BenchmarkReplicatedPut(b *testing.B) {
	c := testcluster.Start(b, 2, testcluster.Options{Store: store.Options{ArenaSize: 256 << 20, ArenaCount: 1,
		IndexSlots: 1 << 12, LeaseSize: 4 << 20, Sync: store.SyncNone}})
	cl := c.Client(b, nil)
	ctx := context.Background()
	v := make([]byte, 1024)
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "rput-%02d", i)
	}
	measure := func() time.Duration {
		d := make([]time.Duration, 0, b.N)
		for i := range b.N {
			t0 := time.Now()
			if err := cl.Put(ctx, keys[i%len(keys)], v); err != nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(t0))
		}
		return p(d, 50)
	}
	for _, k := range keys { // warm: leases and connections
		if err := cl.Put(ctx, k, v); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	one := measure()
	b.StopTimer()
	for _, s := range c.Running() {
		if s.MapNode().IsLeader() {
			if _, err := s.MapNode().Propose(ctx, &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: 2}); err != nil {
				b.Fatal(err)
			}
		}
	}
	c.WaitSettled(60 * time.Second)
	for _, k := range keys {
		testcluster.WaitFor(b, 10*time.Second, "a PUT at two replicas", func() error { return cl.Put(ctx, k, v) })
	}
	b.StartTimer()
	two := measure()
	b.ReportMetric(float64(one.Nanoseconds())/1e3, "put-r1-p50-µs")
	b.ReportMetric(float64(two.Nanoseconds())/1e3, "put-r2-p50-µs")
	b.ReportMetric(two.Seconds()/one.Seconds(), "r2/r1-p50")
}
