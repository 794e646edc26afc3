package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

type benchResult struct {
	Op      string  `json:"op"`
	Ops     int     `json:"ops"`
	Seconds float64 `json:"seconds"`
	OpsPerS float64 `json:"ops_per_second"`
	P50     string  `json:"p50"`
	P99     string  `json:"p99"`
	Max     string  `json:"max"`
}

func benchCmd(g *globals) *cobra.Command {
	var ops, valueSize, conc int
	var prefix string
	cmd := &cobra.Command{
		Use:   "bench [--ops N] [--value-size S] [--concurrency C]",
		Short: "a small put-then-get load: ops/s and p50/p99 latency per operation",
		Long: `bench puts N keys (PREFIX0 .. PREFIX<N-1>) of S bytes each, then gets them
all back one-sidedly and checks every value, from C goroutines of one client.
Each operation is bounded by --timeout. The keys are left in place.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ops < 1 || valueSize < 0 || conc < 1 {
				return fmt.Errorf("--ops, --concurrency must be at least 1 and --value-size at least 0")
			}
			c, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			key := func(i int) []byte { return fmt.Appendf(nil, "%s%d", prefix, i) }
			value := func(i int) []byte {
				v := bytes.Repeat([]byte{byte('a' + i%26)}, valueSize)
				if valueSize >= 8 {
					copy(v, fmt.Appendf(nil, "%08d", i%100000000))
				}
				return v
			}
			var results []benchResult
			for _, op := range []string{"put", "get"} {
				r, err := runBench(cmd.Context(), op, ops, conc, g.timeout, func(ctx context.Context, i int) error {
					if op == "put" {
						return c.Put(ctx, key(i), value(i))
					}
					v, err := c.Get(ctx, key(i))
					if err != nil {
						return err
					}
					if !bytes.Equal(v, value(i)) {
						return fmt.Errorf("get %s: wrong value (%d bytes, want %d)", key(i), len(v), valueSize)
					}
					return nil
				})
				if err != nil {
					return classify(fmt.Errorf("bench %s: %w", op, err))
				}
				results = append(results, r)
			}
			out := cmd.OutOrStdout()
			if g.output == "json" {
				return writeJSON(out, results)
			}
			for _, r := range results {
				fmt.Fprintf(out, "%-3s %6d ops of %d bytes in %.2fs: %8.0f ops/s  p50 %-10s p99 %-10s max %s\n",
					r.Op, r.Ops, valueSize, r.Seconds, r.OpsPerS, r.P50, r.P99, r.Max)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&ops, "ops", 1000, "operations of each kind")
	f.IntVar(&valueSize, "value-size", 100, "value size in bytes")
	f.IntVar(&conc, "concurrency", 1, "goroutines issuing operations")
	f.StringVar(&prefix, "prefix", "bench/", "key prefix")
	return cmd
}

func runBench(ctx context.Context, op string, n, conc int, timeout time.Duration, do func(context.Context, int) error) (benchResult, error) {
	lat := make([]time.Duration, n)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	next := make(chan int)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for i := range next {
				octx, cancel := context.WithTimeout(ctx, timeout)
				t := time.Now()
				err := do(octx, i)
				lat[i] = time.Since(t)
				cancel()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		return benchResult{}, first
	}
	el := time.Since(start)
	slices.Sort(lat)
	q := func(p float64) string {
		return lat[min(len(lat)-1, int(float64(len(lat))*p))].Round(time.Microsecond).String()
	}
	return benchResult{Op: op, Ops: n, Seconds: el.Seconds(), OpsPerS: float64(n) / el.Seconds(), P50: q(0.50), P99: q(0.99), Max: lat[len(lat)-1].Round(time.Microsecond).String()}, nil
}
