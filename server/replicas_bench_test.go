package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// BenchmarkReplicatedPut measures, on three servers (sync none) with one
// copy of each key and then with three, in one run: one client's PUT and
// GET p50 of 1 KiB, and the PUT throughput of 16 clients (each its own
// Client, one goroutine each; one joins gossip, the others use
// Endpoints). b.N is the operations of each measurement, and of the
// throughput's warm-up; at 20,000 the throughput runs take seconds:
//
//	go test -run '^$' -bench ReplicatedPut -benchtime 20000x ./server/
//
// Every process here shares this machine's cores, the backups' forwarding
// included, so the R=3 throughput is a floor of what separate machines
// give. Its second form has the primaries forward on QPs
// (server.Config.ForwardOnQP). The third, forwards=unwaited, is no way to
// run a cluster: its primaries forward as the first does but acknowledge
// without waiting for the backups (AckBeforeBackups), so that R=3 costs
// here only the work of the copies and forwards, none of the waiting: a
// bound that no protocol which waits for its backups can beat on this
// machine. The three run one after the other.
func BenchmarkReplicatedPut(b *testing.B) {
	for _, form := range []string{"control", "qp", "unwaited"} {
		b.Run("forwards="+form, func(b *testing.B) { benchReplicatedPut(b, form) })
	}
}

func benchReplicatedPut(b *testing.B, form string) {
	c := testcluster.Start(b, 3, testcluster.Options{Store: store.Options{ArenaSize: 256 << 20, ArenaCount: 1,
		IndexSlots: 1 << 12, LeaseSize: 4 << 20, Sync: store.SyncNone},
		Server: func(cfg *server.Config) { cfg.ForwardOnQP = form == "qp" }})
	for _, s := range c.Running() {
		server.AckBeforeBackups(s, form == "unwaited")
	}
	ctx := context.Background()
	v := make([]byte, 1024)
	keys := make([][]byte, 256)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "rput-%03d", i)
	}
	// One client in gossip; the others take the view from a server
	// (Endpoints), as 15 more gossip members would load this machine.
	clients := []*client.Client{c.Client(b, nil)}
	for range 15 {
		clients = append(clients, c.Client(b, func(cfg *client.Config) { cfg.Seeds, cfg.Endpoints = nil, c.ControlAddrs() }))
	}
	cl := clients[0]
	warm := func() { // leases, connections, and a write at the current count
		for _, k := range keys {
			testcluster.WaitFor(b, 10*time.Second, "a PUT", func() error { return cl.Put(ctx, k, v) })
		}
		for _, x := range clients[1:] {
			if err := x.Put(ctx, keys[0], v); err != nil {
				b.Fatal(err)
			}
		}
	}
	latency := func(op func(k []byte) error) time.Duration {
		d := make([]time.Duration, 0, b.N)
		for i := range b.N {
			t0 := time.Now()
			if err := op(keys[i%len(keys)]); err != nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(t0))
		}
		return percentile(d, 50)
	}
	putsPerSecond := func() float64 {
		puts := func() time.Duration {
			var wg sync.WaitGroup
			t0 := time.Now()
			for j, x := range clients {
				wg.Go(func() {
					for i := range b.N / len(clients) {
						if err := x.Put(ctx, keys[(j*31+i)%len(keys)], v); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			return time.Since(t0)
		}
		// Once unmeasured: each client's leases start at 16 KiB and
		// double as it uses them up, and a short run measured those
		// grants (R=1 at a quarter of its rate at 2,000x).
		puts()
		return float64(b.N/len(clients)*len(clients)) / puts().Seconds()
	}
	type result struct {
		put, get time.Duration
		putRate  float64
	}
	run := func() result {
		warm()
		b.StartTimer()
		var r result
		r.put = latency(func(k []byte) error { return cl.Put(ctx, k, v) })
		r.get = latency(func(k []byte) error { _, err := cl.Get(ctx, k); return err })
		r.putRate = putsPerSecond()
		b.StopTimer()
		return r
	}
	b.StopTimer()
	one := run()
	if _, err := cl.SetReplicas(ctx, 3); err != nil {
		b.Fatal(err)
	}
	c.WaitSettled(120 * time.Second)
	three := run()
	for _, m := range []struct {
		name   string
		r1, r3 float64
	}{
		{"put-p50-µs", float64(one.put.Microseconds()), float64(three.put.Microseconds())},
		{"get-p50-µs", float64(one.get.Microseconds()), float64(three.get.Microseconds())},
		{"puts/s-16-clients", one.putRate, three.putRate},
	} {
		b.ReportMetric(m.r1, "r1-"+m.name)
		b.ReportMetric(m.r3, "r3-"+m.name)
		b.ReportMetric(m.r3/m.r1, "r3/r1-"+m.name)
	}
}

// percentile is the pct-th percentile of d.
func percentile(d []time.Duration, pct int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*pct/100]
}
