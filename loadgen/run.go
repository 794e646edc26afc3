// Load and Run: the worker goroutines, the phases and the progress ticker.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Defaults of Options.
const (
	DefaultKeys         = 10_000
	DefaultKeyPrefix    = "bench/"
	DefaultValueSize    = 1024
	DefaultDistribution = Zipfian
	DefaultTheta        = 0.99
	DefaultBatchSize    = 16
	DefaultConcurrency  = 16
	DefaultDuration     = 10 * time.Second
	DefaultTimeout      = 5 * time.Second
	DefaultProgressTick = time.Second
)

// withDefaults returns o with its zero fields defaulted, or an error
// naming the first invalid field.
func (o Options) withDefaults() (Options, error) {
	if o.Keys == 0 {
		o.Keys = DefaultKeys
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	if o.ValueSize == 0 {
		o.ValueSize = DefaultValueSize
	}
	if o.Distribution == "" {
		o.Distribution = DefaultDistribution
	}
	if o.Theta == 0 {
		o.Theta = DefaultTheta
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Duration == 0 && o.Ops == 0 {
		o.Duration = DefaultDuration
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.ProgressTick == 0 {
		o.ProgressTick = DefaultProgressTick
	}
	if o.Classify == nil {
		o.Classify = DefaultClassify
	}
	if o.Seed == 0 {
		o.Seed = int64(rand.Uint64() >> 1)
	}
	if o.Workload == (Workload{}) {
		o.Workload = WorkloadC
	}
	w := o.Workload
	switch {
	case o.Keys < 1:
		return o, fmt.Errorf("loadgen: Keys %d: must be at least 1", o.Keys)
	case o.ValueSize < 0:
		return o, fmt.Errorf("loadgen: ValueSize %d: must not be negative", o.ValueSize)
	case o.BatchSize < 1:
		return o, fmt.Errorf("loadgen: BatchSize %d: must be at least 1", o.BatchSize)
	case o.Concurrency < 1:
		return o, fmt.Errorf("loadgen: Concurrency %d: must be at least 1", o.Concurrency)
	case o.Ops < 0 || o.Duration < 0 || o.Warmup < 0:
		return o, fmt.Errorf("loadgen: Ops %d, Duration %v, Warmup %v: must not be negative", o.Ops, o.Duration, o.Warmup)
	case w.Read < 0 || w.Update < 0 || w.MultiGet < 0 || w.MultiPut < 0 || math.Abs(w.Read+w.Update+w.MultiGet+w.MultiPut-1) > 1e-9:
		return o, fmt.Errorf("loadgen: workload %q: fractions %v+%v+%v+%v must be non-negative and add up to 1",
			w.Name, w.Read, w.Update, w.MultiGet, w.MultiPut)
	}
	return o, nil
}

// histogram bounds: nanoseconds, 1ns to 60s, 3 significant digits.
const (
	histMin     = 1
	histMax     = int64(60 * time.Second)
	histSigFigs = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histSigFigs) }

// op kinds, indexes of histShard.h.
const (
	opGet = iota
	opPut
	opMultiGet
	opMultiPut
	numOps
)

var opKinds = [numOps]string{KindGet, KindPut, KindMultiGet, KindMultiPut}

// worker is one goroutine's state. Only its goroutine touches it, but
// for done and errs, which the progress ticker reads.
type worker struct {
	done atomic.Int64
	errs atomic.Int64

	id      int
	t       Target
	mg      MultiGetter
	mp      MultiPutter
	o       *Options
	keys    keyChooser
	rng     *rand.Rand
	seq     uint64 // puts issued, for versions
	key     []byte
	batch   [][]byte // MultiGet and MultiPut keys
	batchIx []uint64
	val     []byte
	vals    [][]byte // MultiPut values

	measure bool
	last    time.Time // when the last operation ended (or the phase began)

	// The operations' context, with a deadline, reused while at least
	// 99% of Options.Timeout remains (see opContext).
	opCtx     context.Context
	opCancel  context.CancelFunc
	deadline  time.Time
	hists     *histShard // shared with other workers: a histogram is 220 KB
	errKinds  map[string]int64
	errSample map[string]string
	failedOps [numOps]int64

	_ [64]byte // keep the next worker's counters off this cache line
}

// newWorkers makes o.Concurrency workers over t; measured ones get a
// histogram for each op kind of o.Workload.
func newWorkers(t Target, o *Options, keys keyChooser, measured bool) ([]*worker, error) {
	ws := make([]*worker, o.Concurrency)
	wt, split := t.(WorkerTargets)
	for i := range ws {
		w := &worker{
			id: i, t: t, o: o, keys: keys,
			rng:       rand.New(rand.NewPCG(uint64(o.Seed), uint64(i))),
			key:       make([]byte, 0, len(o.KeyPrefix)+20),
			val:       make([]byte, o.ValueSize),
			errKinds:  map[string]int64{},
			errSample: map[string]string{},
		}
		if split {
			if w.t = wt.ForWorker(i); w.t == nil {
				return nil, fmt.Errorf("loadgen: %T.ForWorker(%d) returned no Target", t, i)
			}
		}
		w.mg, _ = w.t.(MultiGetter)
		w.mp, _ = w.t.(MultiPutter)
		if o.Workload.MultiGet > 0 && w.mg == nil {
			return nil, fmt.Errorf("loadgen: workload %q does MultiGets but the Target (%T) has no MultiGet method",
				o.Workload.Name, w.t)
		}
		if o.Workload.MultiPut > 0 {
			if w.mp == nil {
				return nil, fmt.Errorf("loadgen: workload %q does MultiPuts but the Target (%T) has no MultiPut method",
					o.Workload.Name, w.t)
			}
			w.vals = make([][]byte, o.BatchSize)
			for j := range w.vals {
				w.vals[j] = make([]byte, o.ValueSize)
			}
		}
		if o.Workload.MultiGet > 0 || o.Workload.MultiPut > 0 {
			w.batch = make([][]byte, o.BatchSize)
			w.batchIx = make([]uint64, o.BatchSize)
			for j := range w.batch {
				w.batch[j] = make([]byte, 0, len(o.KeyPrefix)+20)
			}
		}
		ws[i] = w
	}
	if measured {
		// Workers share histograms, a shard for every few: memory grows
		// with the cores, not with Concurrency, and a shard's lock is
		// rarely contended.
		shards := make([]*histShard, min(o.Concurrency, 2*runtime.GOMAXPROCS(0)))
		for i := range shards {
			shards[i] = &histShard{}
			for k, frac := range [numOps]float64{o.Workload.Read, o.Workload.Update, o.Workload.MultiGet, o.Workload.MultiPut} {
				if frac > 0 {
					shards[i].h[k] = newHist()
				}
			}
		}
		for i, w := range ws {
			w.hists = shards[i%len(shards)]
		}
	}
	return ws, nil
}

// histShard is the latency histograms of some workers, by op kind.
type histShard struct {
	mu sync.Mutex
	h  [numOps]*hdrhistogram.Histogram
	_  [64]byte // keep the next shard's lock off this cache line
}

func (s *histShard) record(kind int, lat time.Duration) {
	s.mu.Lock()
	s.h[kind].RecordValue(min(int64(lat), histMax))
	s.mu.Unlock()
}

// prepPut makes w.key and w.val key index k's name and value at a new
// version (unique per worker; the worker's id is its low 16 bits).
func (w *worker) prepPut(k uint64) {
	w.seq++
	fillValue(w.val, k, w.seq<<16|uint64(w.id&0xffff))
	w.key = appendKey(w.key[:0], w.o.KeyPrefix, k)
}

// op does one operation of the workload's mix and returns its kind and
// latency. The latency covers the Target call only (and Verify), not
// the choice of key or the making of the value.
func (w *worker) op(ctx context.Context) (int, time.Duration, error) {
	kind := opGet
	wl := &w.o.Workload
	if wl.Read < 1 {
		switch f := w.rng.Float64(); {
		case f < wl.Read:
		case f < wl.Read+wl.Update:
			kind = opPut
		case wl.MultiPut == 0 || wl.MultiGet > 0 && f < wl.Read+wl.Update+wl.MultiGet:
			kind = opMultiGet
		default:
			kind = opMultiPut
		}
	}
	if w.o.Timeout > 0 {
		ctx = w.opContext(ctx)
	}
	var start time.Time
	var err error
	switch kind {
	case opGet:
		k := w.keys.next(w.rng)
		w.key = appendKey(w.key[:0], w.o.KeyPrefix, k)
		start = time.Now()
		var v []byte
		if v, err = w.t.Get(ctx, w.key); err == nil && w.o.Verify {
			err = checkValue(v, k, w.o.ValueSize)
		}
		if err != nil {
			err = fmt.Errorf("get %s: %w", w.key, err)
		}
	case opPut:
		w.prepPut(w.keys.next(w.rng))
		start = time.Now()
		if err = w.t.Put(ctx, w.key, w.val); err != nil {
			err = fmt.Errorf("put %s: %w", w.key, err)
		}
	case opMultiGet:
		for j := range w.batch {
			w.batchIx[j] = w.keys.next(w.rng)
			w.batch[j] = appendKey(w.batch[j][:0], w.o.KeyPrefix, w.batchIx[j])
		}
		start = time.Now()
		var vs [][]byte
		if vs, err = w.mg.MultiGet(ctx, w.batch); err == nil {
			err = w.checkBatch(vs)
		} else {
			err = fmt.Errorf("multiget of %d keys from %s: %w", len(w.batch), w.batch[0], err)
		}
	case opMultiPut:
		for j := range w.batch {
			k := w.keys.next(w.rng)
			w.seq++
			fillValue(w.vals[j], k, w.seq<<16|uint64(w.id&0xffff))
			w.batch[j] = appendKey(w.batch[j][:0], w.o.KeyPrefix, k)
		}
		start = time.Now()
		if err = w.mp.MultiPut(ctx, w.batch, w.vals); err != nil {
			err = fmt.Errorf("multiput of %d keys from %s: %w", len(w.batch), w.batch[0], err)
		}
	}
	w.last = time.Now()
	return kind, w.last.Sub(start), err
}

// opContext returns a context derived from parent with a deadline
// between 0.99 and 1 times Options.Timeout after the last operation's
// end: the worker's current one while it leaves at least 99% of
// Timeout and has not ended, else a new one. Making a context with a
// deadline per operation (a timer and 4 allocations) would be most of
// loadgen's cost per operation.
func (w *worker) opContext(parent context.Context) context.Context {
	if w.opCtx == nil || w.opCtx.Err() != nil || w.deadline.Sub(w.last) < w.o.Timeout-w.o.Timeout/100 {
		w.release()
		w.deadline = w.last.Add(w.o.Timeout)
		w.opCtx, w.opCancel = context.WithDeadline(parent, w.deadline)
	}
	return w.opCtx
}

// release cancels the worker's operation context, if any.
func (w *worker) release() {
	if w.opCancel != nil {
		w.opCancel()
		w.opCtx, w.opCancel = nil, nil
	}
}

// checkBatch checks a MultiGet's values: one per key, none absent, and
// (with Verify) each written for its key.
func (w *worker) checkBatch(vs [][]byte) error {
	if len(vs) != len(w.batch) {
		return fmt.Errorf("multiget of %d keys returned %d values", len(w.batch), len(vs))
	}
	for j, v := range vs {
		if v == nil {
			return fmt.Errorf("multiget %s: %w", w.batch[j], ErrNotFound)
		}
		if w.o.Verify {
			if err := checkValue(v, w.batchIx[j], w.o.ValueSize); err != nil {
				return fmt.Errorf("multiget %s: %w", w.batch[j], err)
			}
		}
	}
	return nil
}

func (w *worker) failed(kind int, err error) {
	w.errs.Add(1)
	if !w.measure {
		return
	}
	w.failedOps[kind]++
	k := w.o.Classify(err)
	if w.errKinds[k] == 0 {
		w.errSample[k] = err.Error()
	}
	w.errKinds[k]++
}

// phase is one timed or counted stretch of a run: the workers' loops and
// the progress ticker.
type phase struct {
	name    string
	o       *Options
	ws      []*worker
	ops     int64         // operations to do, or 0
	dur     time.Duration // when ops is 0
	claimed atomic.Int64
	start   time.Time
}

func (p *phase) snapshot(prevDone int64, prevAt time.Time, now time.Time, final bool) Snapshot {
	s := Snapshot{Phase: p.name, Elapsed: now.Sub(p.start), Total: p.ops, Final: final}
	if p.ops == 0 {
		s.Planned = p.dur
	}
	for _, w := range p.ws {
		s.Done += w.done.Load()
		s.Errors += w.errs.Load()
	}
	if d := now.Sub(prevAt).Seconds(); d > 0 {
		s.OpsPerS = float64(s.Done-prevDone) / d
	}
	return s
}

// run runs every worker's loop, body, until the phase ends (ops claimed
// or time up) or ctx does, and returns the phase's wall time. body
// returns false to stop its worker.
func (p *phase) run(ctx context.Context, body func(w *worker, i int64) bool) time.Duration {
	p.start = time.Now()
	for _, w := range p.ws {
		w.done.Store(0)
		w.errs.Store(0)
		w.last = p.start
	}
	deadline := p.start.Add(p.dur)
	var wg sync.WaitGroup
	for _, w := range p.ws {
		wg.Go(func() {
			defer w.release()
			for ctx.Err() == nil {
				var i int64
				if p.ops > 0 {
					if i = p.claimed.Add(1) - 1; i >= p.ops {
						return
					}
				} else if !w.last.Before(deadline) {
					return
				}
				if !body(w, i) {
					return
				}
			}
		})
	}
	stop := make(chan struct{})
	var ticker sync.WaitGroup
	if p.o.Progress != nil {
		ticker.Go(func() {
			t := time.NewTicker(p.o.ProgressTick)
			defer t.Stop()
			prevAt, prevDone := p.start, int64(0)
			for {
				select {
				case <-stop:
					return
				case now := <-t.C:
					s := p.snapshot(prevDone, prevAt, now, false)
					p.o.Progress(s)
					prevAt, prevDone = now, s.Done
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(p.start)
	close(stop)
	ticker.Wait()
	if p.o.Progress != nil {
		p.o.Progress(p.snapshot(0, p.start, p.start.Add(el), true))
	}
	return el
}

// Load fills keys 0..o.Keys-1 with values of o.ValueSize bytes, each
// encoding its key and a version (so a later Run with Verify can check
// what it reads), from o.Concurrency goroutines. It calls o.Progress
// with Phase "load". It stops at the first failed put and returns its
// error, naming the key; or ctx's error if ctx ended first.
func Load(ctx context.Context, t Target, o Options) error {
	o.Workload = WorkloadPut // Load only puts; the mix is Run's
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	ws, err := newWorkers(t, &o, nil, false)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	var first error
	p := &phase{name: "load", o: &o, ws: ws, ops: int64(o.Keys)}
	p.run(ctx, func(w *worker, i int64) bool {
		octx := ctx
		if o.Timeout > 0 {
			var c context.CancelFunc
			octx, c = context.WithTimeout(ctx, o.Timeout)
			defer c()
		}
		w.prepPut(uint64(i))
		err := w.t.Put(octx, w.key, w.val)
		if err != nil {
			if ctx.Err() == nil {
				once.Do(func() { first = fmt.Errorf("loadgen: load: put %s: %w", w.key, err); cancel() })
			}
			w.errs.Add(1)
			return false
		}
		w.done.Add(1)
		return true
	})
	if first != nil {
		return first
	}
	return context.Cause(ctx)
}

// Run drives o.Workload against t: o.Warmup of unmeasured operations,
// then the measured phase (o.Ops operations, or o.Duration), each of
// o.Concurrency goroutines with one request in flight. A failed
// operation is counted (Result.Errors, by o.Classify) and the run goes
// on; Run returns an error with the Result if every measured operation
// failed, or if the options are invalid (among them a MultiGet or MultiPut
// workload on a Target that is no MultiGetter or MultiPutter). If ctx ends, Run returns what was
// measured so far and ctx's error; operations it interrupted are not
// counted.
func Run(ctx context.Context, t Target, o Options) (Result, error) {
	o, err := o.withDefaults()
	if err != nil {
		return Result{}, err
	}
	keys, err := newKeyChooser(&o)
	if err != nil {
		return Result{}, err
	}
	ws, err := newWorkers(t, &o, keys, true)
	if err != nil {
		return Result{}, err
	}
	body := func(w *worker, _ int64) bool {
		kind, lat, err := w.op(ctx)
		if err != nil && ctx.Err() != nil {
			return false // interrupted, not failed
		}
		w.done.Add(1)
		if err != nil {
			w.failed(kind, err)
		} else if w.measure {
			w.hists.record(kind, lat)
		}
		return true
	}
	if o.Warmup > 0 {
		(&phase{name: "warmup", o: &o, ws: ws, dur: o.Warmup}).run(ctx, body)
	}
	for _, w := range ws {
		w.measure = true
	}
	count := countersOf(t, o.Counters)
	before := count()
	p := &phase{name: "run", o: &o, ws: ws, ops: int64(o.Ops)}
	if o.Ops == 0 {
		p.dur = o.Duration
	}
	el := p.run(ctx, body)
	res := result(&o, ws, p.start, el)
	for k, v := range count() {
		res.Extra[k] = float64(v - before[k])
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	var failed int64
	for _, n := range res.Errors {
		failed += n
	}
	if res.Ops > 0 && failed == res.Ops {
		kinds := make([]string, 0, len(res.Errors))
		for k := range res.Errors {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		return res, fmt.Errorf("loadgen: all %d operations failed; first %s error: %s", res.Ops, kinds[0], res.ErrorSamples[kinds[0]])
	}
	if res.Ops == 0 {
		return res, errors.New("loadgen: no operation completed")
	}
	return res, nil
}

// result merges the workers' histograms and error counts.
func result(o *Options, ws []*worker, start time.Time, el time.Duration) Result {
	r := Result{
		Workload: o.Workload.Name, Options: *o, Start: start, Seconds: el.Seconds(),
		Latency: map[string]Latency{}, CDF: map[string][]Point{},
		Failed: map[string]int64{}, Errors: map[string]int64{}, ErrorSamples: map[string]string{}, Extra: map[string]float64{},
	}
	shards := map[*histShard]bool{}
	for _, w := range ws {
		shards[w.hists] = true
	}
	all := newHist()
	for k := range numOps {
		var h *hdrhistogram.Histogram
		for s := range shards {
			if s.h[k] == nil {
				continue
			}
			if h == nil {
				h = newHist()
			}
			h.Merge(s.h[k])
		}
		if h == nil {
			continue
		}
		all.Merge(h)
		r.Latency[opKinds[k]] = summarize(h)
		r.CDF[opKinds[k]] = cdf(h)
	}
	r.Latency[KindAll] = summarize(all)
	r.CDF[KindAll] = cdf(all)
	for _, w := range ws {
		r.Ops += w.done.Load()
		for k, n := range w.failedOps {
			if n > 0 {
				r.Failed[opKinds[k]] += n
			}
		}
		for k, n := range w.errKinds {
			if r.Errors[k] == 0 {
				r.ErrorSamples[k] = w.errSample[k]
			}
			r.Errors[k] += n
		}
	}
	if r.Seconds > 0 {
		r.OpsPerS = float64(r.Ops) / r.Seconds
	}
	return r
}

// countersOf returns a reader of t's Counters, if it has them, and of
// extra, if set, together (t's count wins a name both have); what it
// reads is nil when neither counts.
func countersOf(t Target, extra func() map[string]uint64) func() map[string]uint64 {
	own, _ := t.(Counters)
	return func() map[string]uint64 {
		var m map[string]uint64
		if extra != nil {
			m = extra()
		}
		if own == nil {
			return m
		}
		if m == nil {
			return own.Counters()
		}
		maps.Copy(m, own.Counters())
		return m
	}
}
