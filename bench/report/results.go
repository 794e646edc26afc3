// Package report holds the comparison's raw results (JSON), summarizes
// repeated runs into medians and spreads, and renders them: PNG plots
// with gonum/plot and docs/BENCHMARKS.md from a template.
package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/rkv-io/rkv/loadgen"
)

// Systems and operations as they appear in Point.
const (
	SystemRKV   = "rkv"
	SystemRedis = "redis"
	SystemEcho  = "echo"

	OpGet = loadgen.KindGet
	OpPut = loadgen.KindPut
	// OpMultiGet and OpMultiPut are batches of Config.Batch keys: rkv's
	// client.MultiGet and MultiPut, Redis pipelines of as many GETs or
	// SETs.
	OpMultiGet = loadgen.KindMultiGet
	OpMultiPut = loadgen.KindMultiPut
)

// CleanerMovedBytes is the name, in an rkv point's Result.Extra, of the
// bytes the servers' cleaners copied during its measured phase.
const CleanerMovedBytes = "cleaner_moved_bytes"

// CPUIdleEntries is the name, in a point's Result.Extra, of the times the
// machine's CPUs entered an idle state that halts them during its
// measured phase: at one request in flight, each such entry between a
// request's steps puts a CPU's wake-up on its latency.
const CPUIdleEntries = "cpu_idle_entries"

// Point is one measured configuration: a system, an operation, a value
// size and a concurrency (loadgen workers, each with one request in
// flight), at a durability, on some server processes.
type Point struct {
	System      string `json:"system"`
	Op          string `json:"op"`
	ValueSize   int    `json:"value_size"`
	Concurrency int    `json:"concurrency"`
	// Durable is rkv's sync=always and Redis's appendfsync always;
	// otherwise rkv runs sync=none and Redis appendonly no. The echo is
	// never durable.
	Durable bool `json:"durable"`
	// CrashSafe, beside a Durable false, is a PUT that survives a crash of
	// the server's process but not of the machine: Redis's appendonly yes
	// with appendfsync no, against rkv's sync=none, which is that already
	// (its point measures the same configuration as the one without).
	CrashSafe bool `json:"crash_safe,omitempty"`
	// Cleaning is a PUT measured while rkv's cleaner works: its keys
	// loaded first into arenas of Config.CleaningArenaBytes each, a few
	// times smaller than what the point writes, so the cleaner copies
	// live records out of dead segments throughout, as in a store that
	// has run for a while. rkv runs sync=none, Redis appendonly no, as
	// without.
	Cleaning bool `json:"cleaning,omitempty"`
	// Servers is the system's server processes, the keys spread over
	// them (rkv by its cluster map, Redis by the client's hash: see
	// comparison 4). 0 is the session's standard: Config.RKVServers
	// rkv-servers, one redis-server, one echo server.
	Servers int `json:"servers,omitempty"`
}

func (p Point) String() string {
	d := ""
	switch {
	case p.Durable:
		d = " durable"
	case p.CrashSafe:
		d = " crash-safe"
	}
	if p.Cleaning {
		d += " cleaning"
	}
	if p.Servers > 0 {
		d += fmt.Sprintf(" on %d", p.Servers)
	}
	return fmt.Sprintf("%s %s %dB c=%d%s", p.System, p.Op, p.ValueSize, p.Concurrency, d)
}

// ScaledServers is Point.Servers for n server processes of each system,
// with rkvServers (Config.RKVServers) in the standard ones: 0 when n is
// the standard for both (one rkv-server, one redis-server), so the
// scaling comparison's first point is the standard one, measured once.
func ScaledServers(rkvServers, n int) int {
	if n == 1 && rkvServers == 1 {
		return 0
	}
	return n
}

// Measurement is one run of one Point.
type Measurement struct {
	Point
	// Run is the repetition, from 1.
	Run    int            `json:"run"`
	Result loadgen.Result `json:"result"`
}

// Registration is one measured start of an rkv-server, all times from the
// process's start.
type Registration struct {
	Run        int   `json:"run"`
	Arenas     int   `json:"arenas"`
	ArenaBytes int64 `json:"arena_bytes"`
	// Fresh: the start created the arena files, in an empty data
	// directory. Otherwise the directory held a key, and Cold says whether
	// the arena files were dropped from the page cache before the start,
	// so registration faulted every page in (as after a reboot), or were
	// cached from the previous start.
	Fresh bool `json:"fresh,omitempty"`
	Cold  bool `json:"cold"`
	// Ready is when the server's /readyz first answered 200 (polled
	// every 2 ms): it serves, an arena registered and in the cluster map.
	// Results older than rkv_arena_registration_seconds took it from the
	// server's "ready" log line (store open, listening, in the cluster),
	// which could come before the first arena.
	Ready time.Duration `json:"ready_ns"`
	// FirstArena is when the first arena's registration was complete,
	// as the server's metrics say (rkv_store_open_time_seconds plus the
	// least rkv_arena_registration_seconds).
	FirstArena time.Duration `json:"first_arena_ns"`
	// FirstGet is when a client's GET of the key first succeeded: found,
	// or in a fresh start, absent.
	FirstGet time.Duration `json:"first_get_ns"`
	// Registered is when the last arena's registration was complete (by
	// the metrics, as FirstArena): a server that served only once all its
	// memory was registered (the synchronous baseline) could serve no
	// earlier.
	Registered time.Duration `json:"registered_ns"`
}

// Start is how a registration start found its arena files.
type Start string

const (
	StartFresh Start = "fresh" // created them: the first start on the data directory
	StartCold  Start = "cold"  // on disk, not in the page cache
	StartWarm  Start = "warm"  // in the page cache
)

// Starts lists the starts in the order a run measures them.
var Starts = []Start{StartFresh, StartCold, StartWarm}

// Start is how g's start found its arena files.
func (g Registration) Start() Start {
	switch {
	case g.Fresh:
		return StartFresh
	case g.Cold:
		return StartCold
	}
	return StartWarm
}

// Env describes the machine and software of a session.
type Env struct {
	Date              time.Time `json:"date"`
	CPU               string    `json:"cpu"`
	NProc             int       `json:"nproc"`
	MemTotalBytes     uint64    `json:"mem_total_bytes"`
	MemAvailableBytes uint64    `json:"mem_available_bytes"` // at the start of the session
	Kernel            string    `json:"kernel"`
	GoVersion         string    `json:"go_version"`
	Redis             string    `json:"redis"`
	Commit            string    `json:"commit"` // the rkv commit measured, "+dirty" if modified

	// CPUIdle is the kernel's cpuidle driver and, in a guest with the
	// haltpoll driver, how long an idle CPU polls before it halts: what a
	// CPU's wake-up from idle costs depends on both ("" without cpuidle).
	CPUIdle string `json:"cpu_idle,omitempty"`
}

// Config is what a session ran.
type Config struct {
	Quick    bool          `json:"quick"`
	Runs     int           `json:"runs"`
	Duration time.Duration `json:"duration_ns"` // measured phase per point
	Warmup   time.Duration `json:"warmup_ns"`   // unmeasured phase before it
	// DurableDuration, if longer, is the measured phase of the durable
	// PUT points: long enough to hold what a durable server pays now and
	// then (an rkv checkpoint), not only its first seconds.
	DurableDuration time.Duration `json:"durable_duration_ns,omitempty"`
	Keys            int           `json:"keys"` // key space (fewer for large values: see KeysFor)
	Distribution    string        `json:"distribution"`
	RKVServers      int           `json:"rkv_servers"`
	// BaseSize and BaseConcurrency are the comparisons' value size and
	// concurrency against Redis.
	BaseSize        int   `json:"base_size"`
	BaseConcurrency int   `json:"base_concurrency"`
	EchoSizes       []int `json:"echo_sizes"`    // comparison 1, at concurrency 1
	Concurrencies   []int `json:"concurrencies"` // comparison 4, GET
	Sizes           []int `json:"sizes"`         // comparison 4, rkv GET at concurrency 1
	Arenas          []int `json:"arenas"`        // comparison 3
	ArenaBytes      int64 `json:"arena_bytes"`   // comparison 3
	// Batch is the keys of a batched operation, BatchOps the batched
	// operations compared with Redis pipelines (comparison 2).
	Batch    int      `json:"batch,omitempty"`
	BatchOps []string `json:"batch_ops,omitempty"`
	// ScaleServers are the server process counts of comparison 4's GETs
	// and PUTs.
	ScaleServers []int `json:"scale_servers,omitempty"`
	// CleaningArenas of CleaningArenaBytes each are rkv's arenas in the
	// PUT point measured while the cleaner works (Point.Cleaning).
	CleaningArenas     int   `json:"cleaning_arenas,omitempty"`
	CleaningArenaBytes int64 `json:"cleaning_arena_bytes,omitempty"`
}

// Results is everything a session measured; it is what the JSON file
// holds, and what the report and plots are rendered from.
type Results struct {
	Env           Env            `json:"env"`
	Config        Config         `json:"config"`
	Measurements  []Measurement  `json:"measurements"`
	Registrations []Registration `json:"registrations"`
	// Notes are things the session had to change or noticed (memory
	// too short for the largest arena count, errors), printed in the
	// report.
	Notes []string `json:"notes,omitempty"`
	// Elapsed is the session's wall time.
	Elapsed time.Duration `json:"elapsed_ns,omitempty"`
}

// Load reads results written by Save.
func Load(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading results: %w", err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decoding results %s: %w", path, err)
	}
	return &r, nil
}

// Save writes r as JSON, compact (the CDFs make it large).
func (r *Results) Save(path string) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	return nil
}

// Runs returns p's measurements, by run.
func (r *Results) Runs(p Point) []Measurement {
	var ms []Measurement
	for _, m := range r.Measurements {
		if m.Point == p {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b Measurement) int { return a.Run - b.Run })
	return ms
}

// Stat is a median and spread over runs.
type Stat struct {
	Median, Min, Max float64
	N                int
}

// Summarize returns the median, minimum and maximum of xs (N 0 when
// xs is empty).
func Summarize(xs []float64) Stat {
	if len(xs) == 0 {
		return Stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: med, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// Metric extracts one number from a measurement.
type Metric func(Measurement) float64

// Metrics.
var (
	Throughput Metric = func(m Measurement) float64 { return m.Result.OpsPerS }
	P50        Metric = func(m Measurement) float64 { return seconds(m.Result.Latency[m.Op].P50) }
	P99        Metric = func(m Measurement) float64 { return seconds(m.Result.Latency[m.Op].P99) }
	// KeysPerS is the keys read or written per second: Throughput times
	// the keys of a batched operation.
	KeysPerS Metric = func(m Measurement) float64 { return m.Result.OpsPerS * keysPerOp(m) }
	// ReadsPerKey is the RDMA READs rkv posted per key read, on average.
	ReadsPerKey Metric = func(m Measurement) float64 {
		n := float64(m.Result.Latency[m.Op].Count) * keysPerOp(m)
		if n == 0 {
			return 0
		}
		return m.Result.Extra["rdma_reads"] / n
	}
	// CleanerMovedPerPut is the bytes rkv's cleaner copied per byte of
	// value PUT, over the measured phase: the write amplification of
	// cleaning.
	CleanerMovedPerPut Metric = func(m Measurement) float64 {
		n := float64(m.Result.Latency[m.Op].Count) * keysPerOp(m) * float64(m.ValueSize)
		if n == 0 {
			return 0
		}
		return m.Result.Extra[CleanerMovedBytes] / n
	}
	// IdleEntriesPerOp is the times a CPU of the machine went idle, in
	// an idle state that halts it (CPUIdleEntries), per operation: NaN
	// where the run did not count them.
	IdleEntriesPerOp Metric = func(m Measurement) float64 {
		v, ok := m.Result.Extra[CPUIdleEntries]
		n := m.Result.Latency[m.Op].Count
		if !ok || n == 0 {
			return math.NaN()
		}
		return v / float64(n)
	}
	// ReadsPerGet is the RDMA READs an rkv GET posted, on average.
	ReadsPerGet Metric = func(m Measurement) float64 {
		n := m.Result.Latency[m.Op].Count
		if n == 0 {
			return 0
		}
		return m.Result.Extra["rdma_reads"] / float64(n)
	}
)

func seconds(d time.Duration) float64 { return d.Seconds() }

// keysPerOp is the keys one of m's operations reads or writes.
func keysPerOp(m Measurement) float64 {
	if (m.Op == OpMultiGet || m.Op == OpMultiPut) && m.Result.Options.BatchSize > 0 {
		return float64(m.Result.Options.BatchSize)
	}
	return 1
}

// Stat summarizes metric over p's runs, leaving out the runs where it is
// NaN (not measured).
func (r *Results) Stat(p Point, metric Metric) Stat {
	var xs []float64
	for _, m := range r.Runs(p) {
		if x := metric(m); !math.IsNaN(x) {
			xs = append(xs, x)
		}
	}
	return Summarize(xs)
}

// Ratio summarizes metric(a)/metric(b) over the runs that measured both,
// each ratio taken within one run.
func (r *Results) Ratio(a, b Point, metric Metric) Stat {
	bs := map[int]Measurement{}
	for _, m := range r.Runs(b) {
		bs[m.Run] = m
	}
	var xs []float64
	for _, m := range r.Runs(a) {
		if mb, ok := bs[m.Run]; ok && metric(mb) != 0 {
			xs = append(xs, metric(m)/metric(mb))
		}
	}
	return Summarize(xs)
}

// Errors sums p's failed operations over its runs, by kind.
func (r *Results) Errors(p Point) map[string]int64 {
	errs := map[string]int64{}
	for _, m := range r.Runs(p) {
		for k, n := range m.Result.Errors {
			errs[k] += n
		}
	}
	return errs
}

// MedianRun returns p's run whose metric is the median (the lower
// middle one for an even count), for plots that show one run.
func (r *Results) MedianRun(p Point, metric Metric) (Measurement, bool) {
	ms := r.Runs(p)
	if len(ms) == 0 {
		return Measurement{}, false
	}
	slices.SortStableFunc(ms, func(a, b Measurement) int {
		x, y := metric(a), metric(b)
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	return ms[(len(ms)-1)/2], true
}

// RegistrationStat summarizes f over the registrations of n arenas that
// started as start says.
func (r *Results) RegistrationStat(n int, start Start, f func(Registration) float64) Stat {
	var xs []float64
	for _, g := range r.Registrations {
		if g.Arenas == n && g.Start() == start {
			xs = append(xs, f(g))
		}
	}
	return Summarize(xs)
}
