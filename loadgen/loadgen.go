// Package loadgen drives a YCSB-style key-value workload against a Target
// and measures it with HDR histograms.
//
// It is shared by rkv-client bench (Target: an rkv client) and the
// comparison tool in bench/ (Targets: rkv, Redis, a raw TCP echo), so
// that every system is measured by the same code.
//
// Load writes keys 0..Keys-1 once; Run then drives a Workload (a mix of
// GETs, PUTs, MultiGets and MultiPuts over keys drawn uniformly or from a
// scrambled zipfian) from Concurrency goroutines, each with one request in flight
// (a closed loop), and returns a Result: throughput, latency percentiles
// and a CDF per operation kind, and errors by kind. Every value written
// encodes its key and a version, so Options.Verify can check that a read
// returned a value written for the key it asked for.
package loadgen

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is what a Target returns from Get for an absent key.
// Run counts it as an error of kind "notfound" (a loaded key should be
// present).
var ErrNotFound = errors.New("loadgen: key not found")

// ErrWrongValue is the error Verify reports (wrapped, with the key) when
// a read returned a value that was not written for the key read: another
// key's, a torn or corrupted one, or one of the wrong size. Its kind is
// "wrong-value".
var ErrWrongValue = errors.New("loadgen: wrong value")

// Target is the store under test. Run wraps the errors its methods
// return with the operation and key ("get bench/12: ..."). Its methods are called concurrently
// from Options.Concurrency goroutines; each call may block until ctx
// ends. The key and value slices belong to the caller and are not
// modified; a Target must not retain them after returning (loadgen
// reuses them for the next operation). The slice Get returns belongs to
// the caller.
type Target interface {
	Get(ctx context.Context, key []byte) ([]byte, error)
	Put(ctx context.Context, key, value []byte) error
}

// MultiGetter is implemented by Targets with a batched read; the
// multiget workload requires it. Values are returned in key order, nil
// for an absent key.
type MultiGetter interface {
	MultiGet(ctx context.Context, keys [][]byte) ([][]byte, error)
}

// MultiPutter is implemented by Targets with a batched write; the
// multiput workload requires it. values[i] is keys[i]'s value; both
// slices and what they hold belong to the caller, as with Put.
type MultiPutter interface {
	MultiPut(ctx context.Context, keys, values [][]byte) error
}

// WorkerTargets is implemented by Targets that give each worker
// goroutine its own Target (its own connection, or one of several
// clients): Load and Run call ForWorker(i) once for each goroutine
// i in 0..Concurrency-1, before starting any, and that goroutine then
// uses only the returned Target (and its MultiGetter and MultiPutter,
// if any). The
// returned Targets are not closed by loadgen.
type WorkerTargets interface {
	ForWorker(i int) Target
}

// Counters is implemented by Targets that count things worth reporting
// next to the latencies (RDMA READs posted, retries). Run reads the
// counters just before and just after the measured phase and stores
// each one's growth in Result.Extra under its name. Counters must be
// safe to call concurrently with the Target's operations, and its
// values must not decrease.
type Counters interface {
	Counters() map[string]uint64
}

// Workload is an operation mix. The fractions add up to 1.
type Workload struct {
	Name     string  `json:"name"`               // "a", "b", "c", "put", "multiget", "multiput"
	Read     float64 `json:"read"`               // fraction of single-key GETs
	Update   float64 `json:"update"`             // fraction of PUTs of an existing key
	MultiGet float64 `json:"multiget"`           // fraction of MultiGets of BatchSize keys
	MultiPut float64 `json:"multiput,omitempty"` // fraction of MultiPuts of BatchSize keys
}

// The standard workloads (YCSB's core workloads A, B, C, plus a pure-put,
// a multi-get and a multi-put load).
var (
	WorkloadA        = Workload{Name: "a", Read: 0.5, Update: 0.5}
	WorkloadB        = Workload{Name: "b", Read: 0.95, Update: 0.05}
	WorkloadC        = Workload{Name: "c", Read: 1}
	WorkloadPut      = Workload{Name: "put", Update: 1}
	WorkloadMultiGet = Workload{Name: "multiget", MultiGet: 1}
	WorkloadMultiPut = Workload{Name: "multiput", MultiPut: 1}
)

// Workloads lists the standard workloads, by name: the ones rkv-client
// bench offers.
var Workloads = map[string]Workload{
	"a": WorkloadA, "b": WorkloadB, "c": WorkloadC, "put": WorkloadPut, "multiget": WorkloadMultiGet, "multiput": WorkloadMultiPut,
}

// Operation kinds: the keys of Result.Latency and Result.CDF.
const (
	KindGet      = "get"
	KindPut      = "put"
	KindMultiGet = "multiget"
	KindMultiPut = "multiput"
	KindAll      = "all" // every successful operation, whatever its kind
)

// Error kinds of the default Classify.
const (
	ErrKindTimeout    = "timeout"     // context.DeadlineExceeded: Options.Timeout ran out
	ErrKindNotFound   = "notfound"    // ErrNotFound, or a nil value from MultiGet
	ErrKindWrongValue = "wrong-value" // ErrWrongValue, from Verify
	ErrKindOther      = "other"       // anything else
)

// Distributions of keys.
const (
	Uniform = "uniform"
	Zipfian = "zipfian"
)

// Options configure Load and Run. Zero fields take the defaults given.
// Durations marshal to JSON as nanoseconds.
type Options struct {
	Workload     Workload      `json:"workload"`
	Keys         int           `json:"keys"`          // key space: keys 0..Keys-1. Default 10,000.
	KeyPrefix    string        `json:"key_prefix"`    // keys are KeyPrefix + decimal index. Default "bench/".
	ValueSize    int           `json:"value_size"`    // bytes. Default 1024. Verify checks versions from 24 bytes, keys from 2.
	Distribution string        `json:"distribution"`  // "uniform" or "zipfian". Default "zipfian".
	Theta        float64       `json:"theta"`         // zipfian skew, in (0, 1). Default 0.99.
	BatchSize    int           `json:"batch_size"`    // keys per MultiGet. Default 16.
	Concurrency  int           `json:"concurrency"`   // goroutines, each with one request in flight. Default 16.
	Duration     time.Duration `json:"duration_ns"`   // measured phase, unless Ops is set. Default 10s.
	Ops          int           `json:"ops"`           // measured operations (overrides Duration).
	Warmup       time.Duration `json:"warmup_ns"`     // unmeasured phase before. Default 0.
	Timeout      time.Duration `json:"timeout_ns"`    // per operation (0.99x to 1x of it: see below). Default 5s; negative: none.
	Verify       bool          `json:"verify"`        // check every value read (values encode their key and version)
	Seed         int64         `json:"seed"`          // random seed; 0 picks one (Result.Options shows it)
	ProgressTick time.Duration `json:"progress_tick"` // interval between Progress calls. Default 1s.

	// Each operation's context carries a deadline from 0.99*Timeout to
	// Timeout after the operation starts: a worker reuses one context
	// while that holds, as a new timer per operation would cost more
	// than the rest of loadgen's work.

	// Progress, if set, is called about every ProgressTick from a single
	// goroutine with the phase's state so far, and once more when a phase
	// ends (Snapshot.Final); it must not block for long.
	Progress func(Snapshot) `json:"-"`

	// Classify names the kind of a failed operation's error, for
	// Result.Errors. Default DefaultClassify. It is called concurrently.
	Classify func(error) string `json:"-"`

	// Counters, if set, counts things outside the Target worth reporting
	// beside the latencies (the machine's CPUs going idle, a server's
	// metrics). Run reads it as it reads a Target's Counters (just before
	// and just after the measured phase) and stores each count's growth
	// in Result.Extra; a name the Target counts too is the Target's.
	Counters func() map[string]uint64 `json:"-"`
}

// Snapshot is a run's (or a load's) state so far.
type Snapshot struct {
	Phase   string        // "load", "warmup", "run"
	Elapsed time.Duration // since the phase started
	Done    int64         // operations completed (failed ones included)
	Total   int64         // operations planned, 0 when the phase is timed
	Planned time.Duration // the phase's length when it is timed, else 0
	Errors  int64
	OpsPerS float64 // over the last interval (over the whole phase when Final)
	Final   bool    // the phase is over: this is its last Snapshot
}

// Latency summarizes one operation kind's latency histogram. Durations
// marshal to JSON as nanoseconds.
type Latency struct {
	Count int64         `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P90   time.Duration `json:"p90_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p999_ns"`
	Max   time.Duration `json:"max_ns"`
	Min   time.Duration `json:"min_ns"`
	Mean  time.Duration `json:"mean_ns"`
}

// Point is one point of a latency CDF: Fraction of the operations took
// at most Latency.
type Point struct {
	Latency  time.Duration `json:"latency_ns"`
	Fraction float64       `json:"fraction"`
}

// Result is a measured run. It marshals to JSON as is: durations in
// nanoseconds (fields named _ns), rates per second.
type Result struct {
	Workload string    `json:"workload"`
	Options  Options   `json:"options"` // the options run with, defaults filled in
	Start    time.Time `json:"start"`   // when the measured phase began
	// Ops counts the measured operations completed, failed ones
	// included; a MultiGet is one operation.
	Ops     int64   `json:"ops"`
	Seconds float64 `json:"seconds"` // the measured phase's wall time
	OpsPerS float64 `json:"ops_per_s"`
	// Latency and CDF are by kind ("get", "put", "multiget", "multiput",
	// and "all"), over successful operations only.
	Latency map[string]Latency `json:"latency"`
	CDF     map[string][]Point `json:"cdf"`
	// Failed counts failed operations by operation kind ("get", "put",
	// "multiget", "multiput"): with Latency[kind].Count, every operation
	// of the kind.
	Failed map[string]int64 `json:"failed"`
	// Errors counts failed operations by kind of error (Options.Classify):
	// "timeout", "notfound", "wrong-value", "other", or the Target's own.
	Errors map[string]int64 `json:"errors"`
	// ErrorSamples holds, for each kind in Errors, the first error's text.
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	// Extra holds target-specific numbers: the growth of the Target's
	// Counters over the measured phase, and whatever the caller adds
	// (e.g. "rdma_reads_per_get").
	Extra map[string]float64 `json:"extra,omitempty"`
}

// DefaultClassify is the default Options.Classify: "timeout" for
// context.DeadlineExceeded, "notfound" for ErrNotFound, "wrong-value"
// for ErrWrongValue, else "other".
func DefaultClassify(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ErrKindTimeout
	case errors.Is(err, ErrNotFound):
		return ErrKindNotFound
	case errors.Is(err, ErrWrongValue):
		return ErrKindWrongValue
	}
	return ErrKindOther
}
