package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/store"
)

// BenchmarkLatency measures one client's warm GET, GET of an absent key
// and PUT (and PUT without idempotency sessions, by a second client, to
// tell their cost from the rest) against one server on the soft provider
// over loopback, next to a raw TCP echo of the same payload in the same
// run, and reports p50/p99 of each:
//
//	go test -run '^$' -bench Latency -benchtime 2000x ./client/
func BenchmarkLatency(b *testing.B) {
	for _, sync := range []store.SyncPolicy{store.SyncNone, store.SyncAlways} {
		for _, size := range []int{64, 1024, 64 << 10} {
			b.Run(fmt.Sprintf("sync=%v/%dB", sync, size), func(b *testing.B) {
				c := benchClusterOf(b, sync)
				cl, plain := c.Client(b, nil), c.Client(b, nil)
				client.DisableWriteSessions(plain)
				ctx := context.Background()
				k, v, absent, plainKey := []byte("bench-key"), make([]byte, size), []byte("bench-absent"), []byte("bench-key-plain")
				if err := cl.Put(ctx, k, v); err != nil {
					b.Fatal(err)
				}
				get := make([]time.Duration, 0, b.N)
				miss := make([]time.Duration, 0, b.N)
				put := make([]time.Duration, 0, b.N)
				plainPut := make([]time.Duration, 0, b.N)
				echo := make([]time.Duration, 0, b.N)
				e := newEcho(b, size)
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					got, err := cl.Get(ctx, k)
					get = append(get, time.Since(t0))
					if err != nil || len(got) != size {
						b.Fatalf("Get: %d bytes, %v", len(got), err)
					}
					t0 = time.Now()
					if _, err := cl.Get(ctx, absent); !errors.Is(err, client.ErrNotFound) {
						b.Fatalf("Get of an absent key: %v", err)
					}
					miss = append(miss, time.Since(t0))
					t0 = time.Now()
					if err := cl.Put(ctx, k, v); err != nil {
						b.Fatal(err)
					}
					put = append(put, time.Since(t0))
					t0 = time.Now()
					if err := plain.Put(ctx, plainKey, v); err != nil { // its own key: cl's cached location stays good
						b.Fatal(err)
					}
					plainPut = append(plainPut, time.Since(t0))
					echo = append(echo, e.roundTrip(b))
				}
				b.StopTimer()
				report(b, "get", get)
				report(b, "miss", miss)
				report(b, "put", put)
				report(b, "put-nosession", plainPut)
				report(b, "echo", echo)
				b.ReportMetric(p(get, 50).Seconds()/p(echo, 50).Seconds(), "get/echo-p50")
			})
		}
	}
}

func p(d []time.Duration, pct int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*pct/100]
}

func report(b *testing.B, what string, d []time.Duration) {
	b.ReportMetric(float64(p(d, 50).Nanoseconds())/1e3, what+"-p50-µs")
	b.ReportMetric(float64(p(d, 99).Nanoseconds())/1e3, what+"-p99-µs")
}

func benchCluster(b testing.TB, sync store.SyncPolicy) *client.Client {
	b.Helper()
	return benchClusterOf(b, sync).Client(b, nil)
}

// benchClusterOf is one server with room for a benchmark's writes.
func benchClusterOf(b testing.TB, sync store.SyncPolicy) *testcluster.Cluster {
	b.Helper()
	return testcluster.Start(b, 1, testcluster.Options{Store: store.Options{ArenaSize: 256 << 20, ArenaCount: 1,
		IndexSlots: 1 << 12, LeaseSize: 4 << 20, Sync: sync}})
}

// echo is a raw TCP echo of size bytes on loopback: the transport's floor.
type echo struct {
	conn net.Conn
	buf  []byte
}

func newEcho(b *testing.B, size int) *echo {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = io.Copy(c, c)
		c.Close()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); ln.Close() })
	return &echo{conn: c, buf: make([]byte, size)}
}

func (e *echo) roundTrip(b *testing.B) time.Duration {
	t0 := time.Now()
	if _, err := e.conn.Write(e.buf); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(e.conn, e.buf); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}
