// Benchmarks every provider can run: the server-shaped registration case.

package rdmatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// BenchmarkRegistrar measures the server-shaped case: arenas buffers of
// size bytes each. It reports the time until the first MR is usable through
// a Registrar with the given workers, the time until all are, and the time
// to register them all one after another without it, and the ratio
// first/sequential (the goal is at most 1/arenas). Run it with
// -benchtime=1x: each iteration pins arenas*size bytes twice.
func BenchmarkRegistrar(b *testing.B, cfg Config, arenas, size, workers int) {
	dev, err := rdma.Open(cfg.Provider, cfg.DeviceA, cfg.OptionsA)
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	defer pd.Close()
	var first, all, sequential time.Duration
	for range b.N {
		// Fresh memory each time, so every run pays for the first touch.
		mems := allocArenas(b, arenas, size)
		start := time.Now()
		mrs := make([]rdma.MR, 0, arenas)
		for _, m := range mems {
			mr, err := pd.Register(m.Bytes(), rdma.AccessRemoteRead)
			if err != nil {
				b.Fatal(err)
			}
			mrs = append(mrs, mr)
		}
		sequential += time.Since(start)
		for _, mr := range mrs {
			_ = mr.Deregister()
		}
		freeArenas(mems)

		mems = allocArenas(b, arenas, size)
		reg := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: workers})
		reqs := make([]rdma.RegisterRequest, arenas)
		for i, m := range mems {
			reqs[i] = rdma.RegisterRequest{Buf: m.Bytes(), Access: rdma.AccessRemoteRead}
		}
		start = time.Now()
		futures := reg.RegisterBatch(context.Background(), reqs)
		<-futures[0].Done()
		first += time.Since(start)
		for _, f := range futures {
			if _, err := f.Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		all += time.Since(start)
		if err := reg.Close(); err != nil {
			b.Fatal(err)
		}
		freeArenas(mems)
	}
	n := float64(b.N)
	b.ReportMetric(first.Seconds()*1e3/n, "first-ms")
	b.ReportMetric(all.Seconds()*1e3/n, "all-ms")
	b.ReportMetric(sequential.Seconds()*1e3/n, "sequential-ms")
	b.ReportMetric(first.Seconds()/sequential.Seconds(), "first/sequential")
}

func allocArenas(b *testing.B, n, size int) []*rdma.Memory {
	mems := make([]*rdma.Memory, n)
	for i := range mems {
		m, err := rdma.Alloc(size)
		if err != nil {
			b.Fatal(fmt.Errorf("arena %d: %w", i, err))
		}
		mems[i] = m
	}
	return mems
}

func freeArenas(mems []*rdma.Memory) {
	for _, m := range mems {
		_ = m.Close()
	}
}
