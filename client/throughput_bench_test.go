package client_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/store"
)

// BenchmarkThroughput measures one client's GETs and PUTs per second with
// 8 x GOMAXPROCS goroutines sharing it, on 1000 warm keys of 1 KiB, one
// server on the soft provider (sync none: the store, not the disk).
// get-append is GET into a buffer the goroutine reuses (GetAppend);
// put-nosession is PUT with idempotency sessions off (a second client), to
// tell their cost from the rest; multiget16 and multiput16 are MultiGet
// and MultiPut of 16 random keys (keys/s counts the keys):
//
//	go test -run '^$' -bench Throughput -benchtime 20000x ./client/
func BenchmarkThroughput(b *testing.B) {
	const nkeys, size = 1000, 1024
	c := benchClusterOf(b, store.SyncNone)
	cl := c.Client(b, nil)
	plain := c.Client(b, nil)
	client.DisableWriteSessions(plain)
	ctx := context.Background()
	keys := make([][]byte, nkeys) // made once: allocs/op is the client's and the server's
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "tput-%04d", i)
	}
	v := make([]byte, size)
	for _, k := range keys {
		if err := cl.Put(ctx, k, v); err != nil {
			b.Fatal(err)
		}
	}
	for _, op := range []string{"get", "get-append", "put", "put-nosession", "multiget16", "multiput16"} {
		b.Run(op, func(b *testing.B) {
			var seed atomic.Uint64
			b.SetParallelism(8) // x GOMAXPROCS goroutines
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				rng := rand.New(rand.NewPCG(seed.Add(1), 2))
				buf := make([]byte, 0, size)
				batch := make([]client.KV, 16)
				getKeys := make([][]byte, 16)
				for pb.Next() {
					k := keys[rng.IntN(nkeys)]
					var err error
					switch op {
					case "get":
						_, err = cl.Get(ctx, k)
					case "get-append":
						buf, err = cl.GetAppend(ctx, buf[:0], k)
					case "put":
						err = cl.Put(ctx, k, v)
					case "multiget16":
						for j := range getKeys {
							getKeys[j] = keys[rng.IntN(nkeys)]
						}
						_, err = cl.MultiGet(ctx, getKeys)
					case "multiput16":
						for j := range batch {
							batch[j] = client.KV{Key: keys[rng.IntN(nkeys)], Value: v}
						}
						err = cl.MultiPut(ctx, batch)
					default:
						err = plain.Put(ctx, k, v)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			if op == "multiget16" || op == "multiput16" {
				b.ReportMetric(16*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
			}
		})
	}
}
