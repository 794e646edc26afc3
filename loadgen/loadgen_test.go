// Tests of Load and Run against an in-memory Target with injectable latency and errors.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memTarget is an in-memory Target. Hooks, when set, run before the
// operation: a non-nil error fails it.
type memTarget struct {
	mu sync.RWMutex
	m  map[string][]byte

	gets, puts atomic.Int64
	getHook    func(key []byte) error
	putHook    func(key []byte) error
	// corrupt, if set, may replace the value Get returns.
	corrupt func(key, v []byte) []byte
}

func newMem() *memTarget { return &memTarget{m: map[string][]byte{}} }

func (t *memTarget) Get(ctx context.Context, key []byte) ([]byte, error) {
	t.gets.Add(1)
	if t.getHook != nil {
		if err := t.getHook(key); err != nil {
			return nil, err
		}
	}
	t.mu.RLock()
	v, ok := t.m[string(key)]
	t.mu.RUnlock()
	if !ok {
		return nil, ErrNotFound
	}
	v = bytes.Clone(v)
	if t.corrupt != nil {
		v = t.corrupt(key, v)
	}
	return v, nil
}

func (t *memTarget) Put(ctx context.Context, key, value []byte) error {
	t.puts.Add(1)
	if t.putHook != nil {
		if err := t.putHook(key); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.m[string(key)] = bytes.Clone(value)
	t.mu.Unlock()
	return nil
}

// multiMem adds MultiGet to memTarget.
type multiMem struct{ *memTarget }

func (t multiMem) MultiGet(ctx context.Context, keys [][]byte) ([][]byte, error) {
	vs := make([][]byte, len(keys))
	for i, k := range keys {
		v, err := t.Get(ctx, k)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		vs[i] = v
	}
	return vs, nil
}

// keyIndex parses "bench/123".
func keyIndex(t testing.TB, key []byte) int {
	i, err := strconv.Atoi(strings.TrimPrefix(string(key), DefaultKeyPrefix))
	if err != nil {
		t.Errorf("key %q: %v", key, err)
	}
	return i
}

func loaded(t *testing.T, o Options) *memTarget {
	t.Helper()
	m := newMem()
	if err := Load(context.Background(), m, o); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestLoadFillsEveryKeyWithCheckableValues(t *testing.T) {
	var phases []string
	var last Snapshot
	o := Options{Keys: 500, ValueSize: 100, Concurrency: 3, ProgressTick: time.Millisecond,
		Progress: func(s Snapshot) { phases = append(phases, s.Phase); last = s }}
	m := loaded(t, o)
	if len(m.m) != 500 || m.puts.Load() != 500 {
		t.Fatalf("%d keys, %d puts; want 500 of each", len(m.m), m.puts.Load())
	}
	for i := range 500 {
		v := m.m[fmt.Sprintf("bench/%d", i)]
		if err := checkValue(v, uint64(i), 100); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if !last.Final || last.Done != 500 || last.Total != 500 || last.Phase != "load" {
		t.Fatalf("last progress %+v, want the final load snapshot of 500/500", last)
	}
	for _, p := range phases {
		if p != "load" {
			t.Fatalf("phase %q during Load", p)
		}
	}
}

func TestLoadStopsAtTheFirstError(t *testing.T) {
	m := newMem()
	boom := errors.New("disk on fire")
	m.putHook = func(key []byte) error {
		if keyIndex(t, key) == 77 {
			return boom
		}
		return nil
	}
	err := Load(context.Background(), m, Options{Keys: 1000, Concurrency: 4})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "bench/77") {
		t.Fatalf("Load: %v; want the error of bench/77", err)
	}
	if n := m.puts.Load(); n == 1000 {
		t.Fatalf("Load went on after the error: %d puts", n)
	}
}

func TestOpsStopsAfterExactlyOps(t *testing.T) {
	o := Options{Keys: 100, ValueSize: 32, Concurrency: 7, Ops: 1234, Workload: WorkloadA, Verify: true}
	m := loaded(t, o)
	before := m.gets.Load() + m.puts.Load()
	r, err := Run(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	calls := m.gets.Load() + m.puts.Load() - before
	if r.Ops != 1234 || calls != 1234 {
		t.Fatalf("Ops %d, target calls %d; want 1234", r.Ops, calls)
	}
	g, p := r.Latency[KindGet].Count, r.Latency[KindPut].Count
	if g+p != 1234 || r.Latency[KindAll].Count != 1234 {
		t.Fatalf("get %d + put %d, all %d; want 1234", g, p, r.Latency[KindAll].Count)
	}
	// Workload A is half reads: 1234 draws, sd ~17.6.
	if g < 500 || g > 734 {
		t.Fatalf("%d gets of 1234 in workload A", g)
	}
	if len(r.Errors) != 0 {
		t.Fatalf("errors %v", r.Errors)
	}
}

func TestDurationAndWarmup(t *testing.T) {
	o := Options{Keys: 10, ValueSize: 8, Concurrency: 2, Duration: 200 * time.Millisecond, Warmup: 100 * time.Millisecond}
	m := loaded(t, o)
	var phases []string
	o.ProgressTick = 20 * time.Millisecond
	o.Progress = func(s Snapshot) {
		if len(phases) == 0 || phases[len(phases)-1] != s.Phase {
			phases = append(phases, s.Phase)
		}
	}
	// Every get takes 1ms, so the run is a few hundred operations.
	m.getHook = func([]byte) error { time.Sleep(time.Millisecond); return nil }
	start := time.Now()
	r, err := Run(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("warmup + run took %v, want at least 300ms", el)
	}
	if r.Seconds < 0.2 || r.Seconds > 5 {
		t.Fatalf("measured %.3fs, want about 0.2s", r.Seconds)
	}
	if r.Ops == 0 || m.gets.Load() <= r.Ops {
		t.Fatalf("%d measured of %d gets: the warm-up must run unmeasured operations", r.Ops, m.gets.Load())
	}
	if fmt.Sprint(phases) != "[warmup run]" {
		t.Fatalf("progress phases %v, want [warmup run]", phases)
	}
	if r.Latency[KindGet].P50 < time.Millisecond {
		t.Fatalf("p50 %v below the 1ms every get sleeps", r.Latency[KindGet].P50)
	}
}

func TestPercentilesOfAKnownMix(t *testing.T) {
	o := Options{Keys: 10, ValueSize: 8, Concurrency: 4, Ops: 1000, Distribution: Uniform}
	m := loaded(t, o)
	var n atomic.Int64
	// Every 50th get (2%) takes 20ms; the others return at once.
	m.getHook = func([]byte) error {
		if n.Add(1)%50 == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	}
	r, err := Run(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	l := r.Latency[KindGet]
	if l.Count != 1000 {
		t.Fatalf("count %d", l.Count)
	}
	if l.P50 >= 10*time.Millisecond || l.P90 >= 10*time.Millisecond {
		t.Fatalf("p50 %v, p90 %v: the fast 98%% should be well under 10ms", l.P50, l.P90)
	}
	if l.P99 < 20*time.Millisecond || l.P999 < 20*time.Millisecond || l.Max < 20*time.Millisecond {
		t.Fatalf("p99 %v, p99.9 %v, max %v: the slowest 2%% take 20ms", l.P99, l.P999, l.Max)
	}
	if l.Min > l.P50 || l.P50 > l.P90 || l.P90 > l.P99 || l.P99 > l.P999 || l.P999 > l.Max {
		t.Fatalf("percentiles out of order: %+v", l)
	}
}

func TestSummarizeAndCDFOfExactValues(t *testing.T) {
	h := newHist()
	for v := int64(1); v <= 10000; v++ {
		h.RecordValue(v * 1000) // 1µs .. 10ms, uniformly
	}
	l := summarize(h)
	near := func(name string, got time.Duration, want float64) {
		t.Helper()
		if d := float64(got) - want; d < -want*0.001 || d > want*0.001 {
			t.Errorf("%s = %v, want %v within 0.1%%", name, got, time.Duration(want))
		}
	}
	near("p50", l.P50, 5e6)
	near("p90", l.P90, 9e6)
	near("p99", l.P99, 9.9e6)
	near("p99.9", l.P999, 9.99e6)
	near("max", l.Max, 10e6)
	near("min", l.Min, 1e3)
	near("mean", l.Mean, 5.0005e6)
	c := cdf(h)
	// 87 fractions, less those above 1-1e-4 that 10,000 values cannot
	// tell apart.
	if len(c) < 60 || len(c) > 87 {
		t.Fatalf("%d CDF points, want 60..87", len(c))
	}
	if c[0].Fraction != 0 || c[0].Latency != l.Min || c[len(c)-1].Fraction != 1 || c[len(c)-1].Latency != l.Max {
		t.Fatalf("CDF ends %+v .. %+v", c[0], c[len(c)-1])
	}
	for i := 1; i < len(c); i++ {
		if c[i].Latency <= c[i-1].Latency || c[i].Fraction <= c[i-1].Fraction {
			t.Fatalf("CDF not increasing at %d: %+v %+v", i, c[i-1], c[i])
		}
		// uniform: fraction ~ latency / 10ms
		if f := float64(c[i].Latency) / 10e6; f-c[i].Fraction > 0.002 || c[i].Fraction-f > 0.002 {
			t.Fatalf("CDF point %+v: fraction should be about %.4f", c[i], f)
		}
	}
	// One repeated latency: at most two points (the histogram's lowest
	// and highest equivalents of the value).
	h1 := newHist()
	h1.RecordValues(5000, 100)
	if c := cdf(h1); len(c) > 2 || c[len(c)-1].Fraction != 1 || c[0].Latency < 4995 || c[len(c)-1].Latency > 5005 {
		t.Fatalf("CDF of one value: %+v", c)
	}
}

func TestErrorsClassifiedByKind(t *testing.T) {
	m := newMem()
	other := errors.New("boom")
	m.getHook = func(key []byte) error {
		switch keyIndex(t, key) % 3 {
		case 0:
			return fmt.Errorf("waiting: %w", context.DeadlineExceeded)
		case 1:
			return nil // absent: ErrNotFound
		}
		return other
	}
	o := Options{Keys: 300, Ops: 3000, Concurrency: 3, Distribution: Uniform}
	r, err := Run(context.Background(), m, o)
	if err == nil || !strings.Contains(err.Error(), "all 3000 operations failed") {
		t.Fatalf("Run where every op fails: %v", err)
	}
	if r.Ops != 3000 {
		t.Fatalf("Ops %d", r.Ops)
	}
	var sum int64
	for k, n := range r.Errors {
		sum += n
		if n < 800 || n > 1200 {
			t.Errorf("%d errors of kind %q, want about 1000", n, k)
		}
		if r.ErrorSamples[k] == "" {
			t.Errorf("no sample of %q", k)
		}
	}
	if sum != 3000 || len(r.Errors) != 3 || r.Errors[ErrKindTimeout] == 0 || r.Errors[ErrKindNotFound] == 0 || r.Errors[ErrKindOther] == 0 {
		t.Fatalf("errors %v", r.Errors)
	}
	if !strings.Contains(r.ErrorSamples[ErrKindOther], "boom") {
		t.Fatalf("sample %q", r.ErrorSamples[ErrKindOther])
	}
	if r.Latency[KindGet].Count != 0 || r.Failed[KindGet] != 3000 {
		t.Fatalf("failed operations in the latency histogram: %+v, failed %v", r.Latency[KindGet], r.Failed)
	}
	if !strings.HasPrefix(r.ErrorSamples[ErrKindNotFound], "get bench/") {
		t.Fatalf("the error does not name the key: %q", r.ErrorSamples[ErrKindNotFound])
	}

	// A custom classifier, and a run with some successes is no error.
	m.getHook = func(key []byte) error {
		if keyIndex(t, key)%2 == 0 {
			return other
		}
		return nil
	}
	if err := Load(context.Background(), m, o); err != nil {
		t.Fatal(err)
	}
	o.Classify = func(err error) string {
		if errors.Is(err, other) {
			return "boom"
		}
		return "?"
	}
	r, err = Run(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) != 1 || r.Errors["boom"] < 1300 || r.Errors["boom"]+r.Latency[KindGet].Count != 3000 {
		t.Fatalf("errors %v, %d gets", r.Errors, r.Latency[KindGet].Count)
	}
}

func TestVerifyCatchesWrongValues(t *testing.T) {
	o := Options{Keys: 20, ValueSize: 64, Ops: 2000, Concurrency: 2, Distribution: Uniform, Verify: true}
	m := loaded(t, o)
	r, err := Run(context.Background(), m, o)
	if err != nil || len(r.Errors) != 0 {
		t.Fatalf("clean store: %v, errors %v", err, r.Errors)
	}
	// Key 3 answers with key 4's value; key 5's value has a flipped bit;
	// key 6's is torn: its second half from another version.
	other := make([]byte, 64)
	fillValue(other, 6, 999)
	m.corrupt = func(key, v []byte) []byte {
		switch keyIndex(t, key) {
		case 3:
			return bytes.Clone(m.m["bench/4"])
		case 5:
			v[40] ^= 1
		case 6:
			copy(v[32:], other[32:])
		}
		return v
	}
	var badGets atomic.Int64
	m.getHook = func(key []byte) error {
		if k := keyIndex(t, key); k >= 3 && k <= 6 && k != 4 {
			badGets.Add(1)
		}
		return nil
	}
	r, err = Run(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	if n := r.Errors[ErrKindWrongValue]; n == 0 || n != badGets.Load() || len(r.Errors) != 1 {
		t.Fatalf("errors %v, want %d wrong-value", r.Errors, badGets.Load())
	}
	// Without Verify, the same values pass.
	o.Verify = false
	if r, err = Run(context.Background(), m, o); err != nil || len(r.Errors) != 0 {
		t.Fatalf("without Verify: %v %v", err, r.Errors)
	}
}

func TestCheckValue(t *testing.T) {
	for _, size := range []int{0, 1, 7, 15, 16, 17, 24, 100, 4096} {
		v := make([]byte, size)
		fillValue(v, 42, 7)
		if err := checkValue(v, 42, size); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if err := checkValue(v, 42, size+1); !errors.Is(err, ErrWrongValue) {
			t.Fatalf("size %d: wrong size passed", size)
		}
		if size < 2 { // one byte of fill: 1 in 256 keys share it
			continue
		}
		w := make([]byte, size)
		fillValue(w, 43, 7)
		if err := checkValue(w, 42, size); !errors.Is(err, ErrWrongValue) {
			t.Fatalf("size %d: key 43's value passed for key 42", size)
		}
		for i := range size {
			c := bytes.Clone(v)
			c[i] ^= 0x80
			if err := checkValue(c, 42, size); !errors.Is(err, ErrWrongValue) {
				t.Fatalf("size %d: byte %d flipped passed", size, i)
			}
		}
	}
}

func TestMultiGetNeedsAMultiGetter(t *testing.T) {
	o := Options{Keys: 50, ValueSize: 32, Ops: 200, Concurrency: 2, Workload: WorkloadMultiGet, BatchSize: 5, Verify: true}
	m := loaded(t, o)
	_, err := Run(context.Background(), m, o)
	if err == nil || !strings.Contains(err.Error(), "no MultiGet method") {
		t.Fatalf("multiget on a plain Target: %v", err)
	}
	before := m.gets.Load()
	r, err := Run(context.Background(), multiMem{m}, o)
	if err != nil || len(r.Errors) != 0 {
		t.Fatalf("%v %v", err, r.Errors)
	}
	if r.Latency[KindMultiGet].Count != 200 || m.gets.Load()-before != 1000 {
		t.Fatalf("%d multigets, %d keys read; want 200 of 5 keys", r.Latency[KindMultiGet].Count, m.gets.Load()-before)
	}
	// An absent key in a batch fails the MultiGet as notfound. (Batches of
	// one uniform key over twice the keys loaded: about half fail.)
	o.Keys, o.BatchSize, o.Distribution = 100, 1, Uniform
	r, err = Run(context.Background(), multiMem{m}, o)
	if n := r.Errors[ErrKindNotFound]; err != nil || n < 50 || n > 150 || n != r.Failed[KindMultiGet] {
		t.Fatalf("%v %v", err, r.Errors)
	}
}

// batchMem adds MultiGet and MultiPut to memTarget.
type batchMem struct{ multiMem }

func (t batchMem) MultiPut(ctx context.Context, keys, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("%d keys, %d values", len(keys), len(values))
	}
	for i := range keys {
		if err := t.Put(ctx, keys[i], values[i]); err != nil {
			return err
		}
	}
	return nil
}

func TestMultiPut(t *testing.T) {
	o := Options{Keys: 50, ValueSize: 32, Ops: 200, Concurrency: 2, Workload: WorkloadMultiPut, BatchSize: 5}
	m := newMem()
	_, err := Run(context.Background(), multiMem{m}, o)
	if err == nil || !strings.Contains(err.Error(), "no MultiPut method") {
		t.Fatalf("multiput on a Target without MultiPut: %v", err)
	}
	r, err := Run(context.Background(), batchMem{multiMem{m}}, o)
	if err != nil || len(r.Errors) != 0 {
		t.Fatalf("%v %v", err, r.Errors)
	}
	if r.Latency[KindMultiPut].Count != 200 || m.puts.Load() != 1000 || r.Workload != "multiput" {
		t.Fatalf("%d multiputs, %d keys written; want 200 of 5 keys", r.Latency[KindMultiPut].Count, m.puts.Load())
	}
	// Every value written is its key's, so a verified read accepts it.
	for k, v := range m.m {
		if err := checkValue(v, uint64(keyIndex(t, []byte(k))), 32); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
	}
	// A mix of both batched kinds does both, in about the proportion asked.
	o.Workload = Workload{Name: "mix", MultiGet: 0.5, MultiPut: 0.5}
	o.Ops, o.Keys, o.Verify = 2000, 50, true
	r, err = Run(context.Background(), batchMem{multiMem{loaded(t, o)}}, o)
	if err != nil || len(r.Errors) != 0 {
		t.Fatalf("%v %v", err, r.Errors)
	}
	if g, p := r.Latency[KindMultiGet].Count, r.Latency[KindMultiPut].Count; g+p != 2000 || g < 800 || p < 800 {
		t.Fatalf("%d multigets and %d multiputs, want about 1000 of each", g, p)
	}
}

func TestContextCancelStopsRun(t *testing.T) {
	o := Options{Keys: 10, ValueSize: 8, Concurrency: 4, Duration: time.Minute}
	m := loaded(t, o)
	m.getHook = func([]byte) error { time.Sleep(100 * time.Microsecond); return nil }
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	r, err := Run(ctx, m, o)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Fatalf("Run after its context ended: %v after %v", err, time.Since(start))
	}
	if r.Ops == 0 || len(r.Errors) != 0 {
		t.Fatalf("partial result: %d ops, errors %v", r.Ops, r.Errors)
	}
}

func TestTimeoutPerOperation(t *testing.T) {
	o := Options{Keys: 10, ValueSize: 8, Concurrency: 2, Ops: 20, Timeout: 5 * time.Millisecond}
	m := loaded(t, o)
	blocking := &ctxTarget{m}
	r, err := Run(context.Background(), blocking, o)
	if err == nil || r.Errors[ErrKindTimeout] != 20 {
		t.Fatalf("%v %v", err, r.Errors)
	}
}

// ctxTarget blocks every Get until its context ends.
type ctxTarget struct{ *memTarget }

func (c *ctxTarget) Get(ctx context.Context, _ []byte) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// splitTarget hands each worker its own memTarget over a shared map and
// counts its RDMA-like reads.
type splitTarget struct {
	*memTarget
	mu      sync.Mutex
	workers map[int]int
	reads   atomic.Uint64
}

func (s *splitTarget) ForWorker(i int) Target {
	s.mu.Lock()
	s.workers[i]++
	s.mu.Unlock()
	return countingTarget{s}
}

func (s *splitTarget) Counters() map[string]uint64 {
	return map[string]uint64{"reads": s.reads.Load()}
}

type countingTarget struct{ s *splitTarget }

func (c countingTarget) Get(ctx context.Context, k []byte) ([]byte, error) {
	c.s.reads.Add(2)
	return c.s.memTarget.Get(ctx, k)
}

func (c countingTarget) Put(ctx context.Context, k, v []byte) error {
	return c.s.memTarget.Put(ctx, k, v)
}

func TestWorkerTargetsAndCounters(t *testing.T) {
	s := &splitTarget{memTarget: newMem(), workers: map[int]int{}}
	o := Options{Keys: 30, ValueSize: 16, Concurrency: 5, Ops: 300, Warmup: 20 * time.Millisecond}
	if err := Load(context.Background(), s, o); err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.workers) != 5 {
		t.Fatalf("ForWorker calls %v, want 0..4", s.workers)
	}
	for i, n := range s.workers {
		if n != 2 { // once for Load, once for Run
			t.Fatalf("ForWorker(%d) called %d times", i, n)
		}
	}
	// Counters cover the measured phase only, not the warm-up.
	if r.Extra["reads"] != 600 || s.reads.Load() <= 600 {
		t.Fatalf("reads %v over the run (%d in all), want 600", r.Extra["reads"], s.reads.Load())
	}
}

func TestOptionsCounters(t *testing.T) {
	s := &splitTarget{memTarget: newMem(), workers: map[int]int{}}
	var idles atomic.Uint64
	o := Options{Keys: 30, ValueSize: 16, Concurrency: 2, Ops: 200, Warmup: 20 * time.Millisecond,
		Counters: func() map[string]uint64 {
			// Both counts grow by 7 between reads: only the Target's
			// "reads" may stand for a name both count.
			n := idles.Add(7)
			return map[string]uint64{"idles": n, "reads": n}
		}}
	if err := Load(context.Background(), s, o); err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Extra["idles"] != 7 || r.Extra["reads"] != 400 {
		t.Fatalf("Extra %v, want idles 7 (one read before the measured phase, one after) and the Target's reads 400", r.Extra)
	}
	// Without a Target that counts, Options.Counters alone.
	r, err = Run(context.Background(), s.memTarget, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Extra) != 2 || r.Extra["idles"] != 7 {
		t.Fatalf("Extra %v, want idles 7 and reads 7", r.Extra)
	}
}

func TestResultJSON(t *testing.T) {
	o := Options{Keys: 10, ValueSize: 8, Ops: 100, Concurrency: 1, Progress: func(Snapshot) {}}
	m := loaded(t, o)
	r, err := Run(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"p99_ns":`, `"cdf":{"all":[{"latency_ns":`, `"get":`, `"ops":100`, `"workload":"c"`, `"distribution":"zipfian"`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("JSON lacks %s:\n%s", want, b)
		}
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil || back.Latency[KindAll] != r.Latency[KindAll] {
		t.Fatalf("round trip: %v %+v", err, back.Latency)
	}
}

func TestOptionErrors(t *testing.T) {
	m := newMem()
	for _, o := range []Options{
		{Keys: -1},
		{Concurrency: -2},
		{Workload: Workload{Name: "x", Read: 0.5}},
		{Distribution: "pareto"},
		{Theta: 1.5},
		{Ops: -1},
	} {
		if _, err := Run(context.Background(), m, o); err == nil || !strings.HasPrefix(err.Error(), "loadgen: ") {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// deadlineTarget records the smallest and largest time left to the
// deadline each Get sees.
type deadlineTarget struct {
	*memTarget
	mu       sync.Mutex
	min, max time.Duration
	none     int
}

func (d *deadlineTarget) Get(ctx context.Context, key []byte) ([]byte, error) {
	dl, ok := ctx.Deadline()
	left := time.Until(dl)
	d.mu.Lock()
	if !ok {
		d.none++
	}
	if d.min == 0 || left < d.min {
		d.min = left
	}
	d.max = max(d.max, left)
	d.mu.Unlock()
	return d.memTarget.Get(ctx, key)
}

func TestEveryOperationHasItsDeadline(t *testing.T) {
	o := Options{Keys: 10, ValueSize: 8, Concurrency: 3, Duration: 300 * time.Millisecond, Timeout: time.Second}
	d := &deadlineTarget{memTarget: loaded(t, o)}
	d.getHook = func([]byte) error { time.Sleep(100 * time.Microsecond); return nil }
	if _, err := Run(context.Background(), d, o); err != nil {
		t.Fatal(err)
	}
	// 0.99s to 1s, less the scheduling delay before the call (generous:
	// the machine may be busy).
	if d.none != 0 || d.min < 900*time.Millisecond || d.max > time.Second {
		t.Fatalf("time left to the deadline at each call: %v .. %v (%d without one); want 0.99s .. 1s", d.min, d.max, d.none)
	}
}

func TestManyWorkersShareFewHistograms(t *testing.T) {
	o := Options{Keys: 10, ValueSize: 8, Concurrency: 500, Ops: 2000, Workload: WorkloadA}
	m := loaded(t, o)
	r, err := Run(context.Background(), m, o)
	if err != nil || r.Latency[KindAll].Count != 2000 || r.Latency[KindGet].Count+r.Latency[KindPut].Count != 2000 {
		t.Fatalf("%v: %+v", err, r.Latency)
	}
	o, _ = o.withDefaults()
	ws, err := newWorkers(m, &o, uniformKeys{10}, true)
	if err != nil {
		t.Fatal(err)
	}
	shards := map[*histShard]bool{}
	for _, w := range ws {
		shards[w.hists] = true
	}
	if want := 2 * runtime.GOMAXPROCS(0); len(shards) != want {
		t.Fatalf("500 workers on %d histogram shards, want %d", len(shards), want)
	}
}
