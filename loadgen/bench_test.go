// Benchmarks of loadgen's own cost per operation, against a Target that does nothing.
package loadgen

import (
	"context"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runCPU runs o against t and reports, next to wall ns/op, the CPU time
// per operation (cpu-ns/op): on a shared machine, wall time counts the
// waits for a core, CPU time does not.
func runCPU(b *testing.B, t Target, o Options) {
	b.ReportAllocs()
	b.ResetTimer()
	c0 := cpuTime(b)
	r, err := Run(context.Background(), t, o)
	c1 := cpuTime(b)
	if err != nil || r.Ops != int64(b.N) || len(r.Errors) != 0 {
		b.Fatalf("%v: %d ops, errors %v", err, r.Ops, r.Errors)
	}
	b.ReportMetric(float64(c1-c0)/float64(b.N), "cpu-ns/op")
}

// nopTarget answers at once: a GET with a fixed value, a PUT with nothing.
type nopTarget struct{ v []byte }

func (n nopTarget) Get(context.Context, []byte) ([]byte, error) { return n.v, nil }
func (nopTarget) Put(context.Context, []byte, []byte) error     { return nil }
func (n nopTarget) MultiGet(_ context.Context, keys [][]byte) ([][]byte, error) {
	vs := make([][]byte, len(keys))
	for i := range vs {
		vs[i] = n.v
	}
	return vs, nil
}

// BenchmarkOverhead is what loadgen adds to every operation: choosing
// the op and key, making the key (and value), the clock reads, the
// per-operation timeout context, the histogram record. One goroutine,
// so ns/op is the cost per operation on one core.
func BenchmarkOverhead(b *testing.B) {
	for _, c := range []struct {
		name string
		o    Options
	}{
		{"get/zipfian", Options{Workload: WorkloadC}},
		{"get/uniform", Options{Workload: WorkloadC, Distribution: Uniform}},
		{"get/zipfian/no-timeout", Options{Workload: WorkloadC, Timeout: -1}},
		{"get/verify-1KiB", Options{Workload: WorkloadC, Verify: true}},
		{"put-1KiB", Options{Workload: WorkloadPut}},
		{"a/1KiB", Options{Workload: WorkloadA}},
		{"multiget16", Options{Workload: WorkloadMultiGet}},
	} {
		b.Run(c.name, func(b *testing.B) {
			o := c.o
			o.Concurrency, o.Ops, o.Seed = 1, b.N, 1
			v := make([]byte, DefaultValueSize)
			fillValue(v, 0, 1)
			if o.Verify {
				o.Keys = 1 // every get reads key 0, whose value v is
			}
			runCPU(b, nopTarget{v}, o)
		})
	}
}

// BenchmarkOverheadParallel is the same at 16 goroutines on however many
// cores the machine has: ns/op is wall time per operation of all of
// them, cpu-ns/op the CPU time.
func BenchmarkOverheadParallel(b *testing.B) {
	runCPU(b, nopTarget{make([]byte, 16)}, Options{Workload: WorkloadC, Concurrency: 16, Ops: b.N, Seed: 1})
}

func BenchmarkZipfianNext(b *testing.B) {
	o := Options{Keys: 1_000_000, Distribution: Zipfian, Theta: 0.99, Seed: 1}
	kc, err := newKeyChooser(&o)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	b.ResetTimer()
	var s uint64
	for range b.N {
		s += kc.next(r)
	}
	_ = s
}

// BenchmarkTimeNow is the clock read loadgen does twice per operation,
// for scale.
func BenchmarkTimeNow(b *testing.B) {
	for range b.N {
		_ = time.Now()
	}
}
