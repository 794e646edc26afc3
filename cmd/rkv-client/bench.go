// The bench command: a YCSB-style workload against the cluster, driven and measured by loadgen.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/loadgen"
	"github.com/rkv-io/rkv/loadgen/rkvtarget"
)

// benchFlags are the bench command's flags.
type benchFlags struct {
	workload     string
	keys         int
	valueSize    int
	prefix       string
	distribution string
	theta        float64
	batch        int
	concurrency  int
	duration     time.Duration
	ops          int
	warmup       time.Duration
	load, noLoad bool
	verify       bool
	seed         int64
	clients      int
	quiet        bool
}

// options checks the flags and turns them into loadgen options.
func (f *benchFlags) options(timeout time.Duration) (loadgen.Options, error) {
	w, ok := loadgen.Workloads[f.workload]
	if !ok {
		return loadgen.Options{}, fmt.Errorf("--workload %q: want a, b, c, put, multiget or multiput", f.workload)
	}
	switch {
	case f.keys < 1:
		return loadgen.Options{}, fmt.Errorf("--keys %d: must be at least 1", f.keys)
	case f.valueSize < 1:
		return loadgen.Options{}, fmt.Errorf("--value-size %d: must be at least 1", f.valueSize)
	case f.prefix == "":
		return loadgen.Options{}, errors.New("--prefix: must not be empty")
	case f.distribution != loadgen.Uniform && f.distribution != loadgen.Zipfian:
		return loadgen.Options{}, fmt.Errorf("--distribution %q: want uniform or zipfian", f.distribution)
	case !(f.theta > 0 && f.theta < 1):
		return loadgen.Options{}, fmt.Errorf("--theta %v: must be in (0, 1)", f.theta)
	case f.batch < 1:
		return loadgen.Options{}, fmt.Errorf("--batch %d: must be at least 1", f.batch)
	case f.concurrency < 1:
		return loadgen.Options{}, fmt.Errorf("--concurrency %d: must be at least 1", f.concurrency)
	case f.clients < 1 || f.clients > f.concurrency:
		return loadgen.Options{}, fmt.Errorf("--clients %d: must be between 1 and --concurrency (%d)", f.clients, f.concurrency)
	case f.ops < 0:
		return loadgen.Options{}, fmt.Errorf("--ops %d: must not be negative", f.ops)
	case f.ops == 0 && f.duration <= 0:
		return loadgen.Options{}, fmt.Errorf("--duration %v: must be positive (or give --ops)", f.duration)
	case f.warmup < 0:
		return loadgen.Options{}, fmt.Errorf("--warmup %v: must not be negative", f.warmup)
	}
	o := loadgen.Options{
		Workload: w, Keys: f.keys, KeyPrefix: f.prefix, ValueSize: f.valueSize,
		Distribution: f.distribution, Theta: f.theta, BatchSize: f.batch, Concurrency: f.concurrency,
		Duration: f.duration, Ops: f.ops, Warmup: f.warmup, Timeout: timeout, Verify: f.verify, Seed: f.seed,
		Classify: benchClassify,
	}
	if o.Ops > 0 {
		o.Duration = 0 // not used: keep it out of the report
	}
	return o, nil
}

func benchCmd(g *globals) *cobra.Command {
	f := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench [--workload a|b|c|put|multiget|multiput] [--keys N] [--value-size S] [--duration D | --ops N] ...",
		Short: "a YCSB-style workload: throughput, latency percentiles and errors per operation",
		Long: `bench loads keys PREFIX0 .. PREFIX<keys-1> (unless --no-load), then drives a
workload from --concurrency goroutines, each with one request in flight,
spread over --clients clients, for --duration or --ops operations (after an
unmeasured --warmup). Workloads (YCSB's core mixes):
  a         50% get, 50% put
  b         95% get, 5% put
  c         100% get (the default)
  put       100% put
  multiget  100% MultiGet of --batch keys
  multiput  100% MultiPut of --batch pairs
Keys are drawn uniformly or from a zipfian law (--theta; the hot keys are
scattered over the key space). Values encode their key and a version:
--verify checks every value read, and then any wrong or missing value fails
the command (exit 4) after the report. Other errors are counted by kind
(timeout, notfound, unavailable, ...) and the run goes on; a run where every
operation failed exits 3 if they were all "unavailable", else 4.
Each operation is bounded by --timeout. The keys are left in place. Unless
--conns is given, each client opens up to concurrency/clients connections
per server (at most 64), so that every goroutine can have its request in
flight.

The report gives, per operation kind, the throughput and p50/p90/p99/p99.9/
max latency; the errors by kind; the client's RDMA READs per key read (GETs
and MultiGet keys) and its retries by operation. --output json prints the
whole result, with a latency CDF per kind (durations in nanoseconds).`,
		Example: `  rkv-client bench                                    # workload c, 10s, 1000 keys of 128 bytes
  rkv-client bench --workload a --distribution uniform --duration 30s --concurrency 32 --clients 4
  rkv-client bench --workload c --verify --keys 1000 --ops 1000    # put every key, get them back, check
  rkv-client bench --workload multiget --batch 32 --no-load --output json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options(g.timeout)
			if err != nil {
				return &exitError{exitUsage, err}
			}
			if f.noLoad {
				if cmd.Flags().Changed("load") && f.load {
					return &exitError{exitUsage, errors.New("--load and --no-load: give one")}
				}
				f.load = false
			}
			return runBench(cmd.Context(), cmd, g, f, o) // which main cancels on SIGINT and SIGTERM
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.workload, "workload", "c", "operation mix: a (50% get, 50% put), b (95/5), c (all gets), put, multiget, multiput")
	fl.IntVar(&f.keys, "keys", 1000, "key space: PREFIX0 .. PREFIX<keys-1>")
	fl.IntVar(&f.valueSize, "value-size", 128, "value size in bytes (--verify checks versions from 24 bytes)")
	fl.StringVar(&f.prefix, "prefix", "bench/", "key prefix")
	fl.StringVar(&f.distribution, "distribution", "zipfian", "key choice: uniform or zipfian")
	fl.Float64Var(&f.theta, "theta", 0.99, "zipfian skew, in (0, 1)")
	fl.IntVar(&f.batch, "batch", 16, "keys per MultiGet")
	fl.IntVar(&f.concurrency, "concurrency", 16, "goroutines, each with one request in flight")
	fl.DurationVar(&f.duration, "duration", 10*time.Second, "length of the measured phase")
	fl.IntVar(&f.ops, "ops", 0, "operations in the measured phase (instead of --duration)")
	fl.DurationVar(&f.warmup, "warmup", 0, "unmeasured phase before the measured one")
	fl.BoolVar(&f.load, "load", true, "put every key before the run")
	fl.BoolVar(&f.noLoad, "no-load", false, "skip the load: the keys are already there (or a put workload)")
	fl.BoolVar(&f.verify, "verify", false, "check every value read; a wrong or missing value fails the command")
	fl.Int64Var(&f.seed, "seed", 0, "random seed (0: a new one, shown in the report)")
	fl.IntVar(&f.clients, "clients", 1, "separate clients the goroutines are spread over")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress on stderr")
	return cmd
}

// runBench connects the clients, loads, runs and reports.
func runBench(ctx context.Context, cmd *cobra.Command, g *globals, f *benchFlags, o loadgen.Options) error {
	if g.conns == 0 {
		g.conns = benchConns(f.concurrency, f.clients)
	}
	var t rkvtarget.Target
	defer func() {
		for _, c := range t.Clients {
			_ = c.Close()
		}
	}()
	for range f.clients {
		c, err := g.connect(cmd)
		if err != nil {
			return err
		}
		t.Clients = append(t.Clients, c)
	}
	var prog *progress
	if !f.quiet {
		prog = newProgress(cmd.ErrOrStderr())
		o.Progress = prog.show
	}
	var loadSecs float64
	if f.load {
		start := time.Now()
		if err := loadgen.Load(ctx, t, o); err != nil {
			return classify(fmt.Errorf("bench: loading %d keys: %w", o.Keys, err))
		}
		loadSecs = time.Since(start).Seconds()
	}
	res, runErr := loadgen.Run(ctx, t, o)
	if runErr != nil && res.Ops == 0 {
		return classify(fmt.Errorf("bench: %w", runErr))
	}
	if f.load {
		res.Extra["load_seconds"] = loadSecs
		res.Extra["load_keys_per_s"] = float64(o.Keys) / loadSecs
	}
	gets := res.Latency[loadgen.KindGet].Count + res.Failed[loadgen.KindGet]
	multigets := res.Latency[loadgen.KindMultiGet].Count + res.Failed[loadgen.KindMultiGet]
	keysRead := float64(gets + multigets*int64(o.BatchSize))
	if keysRead > 0 {
		res.Extra["rdma_reads_per_get"] = res.Extra[rkvtarget.CounterReads] / keysRead
	}
	out := cmd.OutOrStdout()
	if g.output == "json" {
		if err := writeJSON(out, res); err != nil {
			return err
		}
	} else if err := writeBenchTable(out, f, &res); err != nil {
		return err
	}
	switch {
	case errors.Is(runErr, context.Canceled):
		return &exitError{exitOther, errors.New("bench: stopped early (the report covers the operations done)")}
	case runErr != nil: // every operation failed
		code := exitOther
		if len(res.Errors) == 1 && res.Errors[errKindUnavailable] > 0 {
			code = exitUnavailable
		}
		return &exitError{code, fmt.Errorf("bench: %w", runErr)}
	case f.verify && res.Errors[loadgen.ErrKindWrongValue]+res.Errors[loadgen.ErrKindNotFound] > 0:
		return &exitError{exitOther, fmt.Errorf("bench: --verify: %d wrong and %d missing values read",
			res.Errors[loadgen.ErrKindWrongValue], res.Errors[loadgen.ErrKindNotFound])}
	}
	return nil
}

// maxBenchConns caps the connections per server bench asks of each
// client by default: each pins a buffer (client.Config.BufferSize).
const maxBenchConns = 64

// benchConns is the connections per server each client gets unless
// --conns says: enough for all its goroutines' requests to be in flight
// at one server, up to maxBenchConns.
func benchConns(concurrency, clients int) int {
	return min((concurrency+clients-1)/clients, maxBenchConns)
}

// Error kinds bench adds to loadgen's.
const (
	errKindUnavailable = "unavailable"
	errKindFull        = "full"
	errKindTooLarge    = "too-large"
	errKindRefused     = "refused" // invalid request or unauthenticated
)

// benchClassify names a failed operation's kind of error: loadgen's
// kinds (timeout, notfound, wrong-value) first, then the client's.
func benchClassify(err error) string {
	if k := loadgen.DefaultClassify(err); k != loadgen.ErrKindOther {
		return k
	}
	switch {
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, client.ErrClosed):
		return errKindUnavailable
	case errors.Is(err, client.ErrFull):
		return errKindFull
	case errors.Is(err, client.ErrTooLarge):
		return errKindTooLarge
	case errors.Is(err, client.ErrInvalid), errors.Is(err, client.ErrUnauthenticated):
		return errKindRefused
	}
	return loadgen.ErrKindOther
}

// writeBenchTable prints the report: what ran, a line per op kind,
// errors, READs per key and retries.
func writeBenchTable(out io.Writer, f *benchFlags, r *loadgen.Result) error {
	o := &r.Options
	dist := o.Distribution
	if dist == loadgen.Zipfian {
		dist = fmt.Sprintf("zipfian θ=%g", o.Theta)
	}
	what := fmt.Sprintf("%.2fs", r.Seconds)
	if o.Ops > 0 {
		what = fmt.Sprintf("%d ops in %.2fs", o.Ops, r.Seconds)
	}
	mix := fmt.Sprintf("get %g%% put %g%%", 100*o.Workload.Read, 100*o.Workload.Update)
	if o.Workload.MultiGet > 0 {
		mix = fmt.Sprintf("multiget of %d keys", o.BatchSize)
	}
	if o.Workload.MultiPut > 0 {
		mix = fmt.Sprintf("multiput of %d pairs", o.BatchSize)
	}
	fmt.Fprintf(out, "workload %s (%s), %s over %d keys of %d bytes, %d goroutine(s) on %d client(s), %s (seed %d)\n",
		o.Workload.Name, mix, dist, o.Keys, o.ValueSize, o.Concurrency, f.clients, what, o.Seed)
	if s, ok := r.Extra["load_seconds"]; ok {
		fmt.Fprintf(out, "loaded %d keys in %.2fs (%.0f puts/s)\n", o.Keys, s, r.Extra["load_keys_per_s"])
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "OP\tOPS\tOPS/S\tP50\tP90\tP99\tP99.9\tMAX\t")
	for _, k := range []string{loadgen.KindGet, loadgen.KindPut, loadgen.KindMultiGet, loadgen.KindMultiPut, loadgen.KindAll} {
		l, ok := r.Latency[k]
		if !ok || (k == loadgen.KindAll && len(r.Latency) <= 2) { // "all" repeats a lone kind
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", k, l.Count, float64(l.Count)/r.Seconds,
			fmtLatency(l.P50), fmtLatency(l.P90), fmtLatency(l.P99), fmtLatency(l.P999), fmtLatency(l.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "errors: %s\n", fmtCounts(r.Errors))
	if rpg, ok := r.Extra["rdma_reads_per_get"]; ok {
		fmt.Fprintf(out, "RDMA READs per key read: %.2f (%.0f READs; MultiGet keys count as reads)\n", rpg, r.Extra["rdma_reads"])
	}
	retries := map[string]int64{}
	for k, v := range r.Extra {
		if op, ok := strings.CutPrefix(k, rkvtarget.RetriesPrefix); ok && v > 0 {
			retries[strings.ToUpper(op)] = int64(v)
		}
	}
	fmt.Fprintf(out, "retries: %s\n", fmtCounts(retries))
	for _, k := range sortedKeys(r.ErrorSamples) {
		fmt.Fprintf(out, "  first %s error: %s\n", k, r.ErrorSamples[k])
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// fmtCounts is "a 3, b 1", or "none".
func fmtCounts(m map[string]int64) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// fmtLatency prints d with 3 or 4 significant digits in a fitting unit.
func fmtLatency(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d)
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// progress shows loadgen's snapshots on w: rewritten in place (\r) when
// w is a terminal, else a line every 2s and at each phase's end.
type progress struct {
	w        io.Writer
	terminal bool
	last     time.Time
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal = true
		}
	}
	return p
}

// show is the Options.Progress callback (loadgen calls it from one
// goroutine at a time).
func (p *progress) show(s loadgen.Snapshot) {
	if !p.terminal && !s.Final {
		ending := (s.Planned > 0 && s.Elapsed >= s.Planned) || (s.Total > 0 && s.Done >= s.Total)
		if ending || time.Since(p.last) < 2*time.Second {
			return // the final line follows
		}
	}
	p.last = time.Now()
	line := progressLine(s)
	switch {
	case p.terminal && s.Final:
		fmt.Fprintf(p.w, "\r%s\x1b[K\n", line)
	case p.terminal:
		fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}

// progressLine renders a snapshot: a bar with keys done/total, rate and
// ETA for the load; elapsed/planned time (or ops), ops, rate and errors
// for the run and warm-up.
func progressLine(s loadgen.Snapshot) string {
	rate := s.OpsPerS
	if s.Phase == "load" {
		frac := float64(s.Done) / float64(max(s.Total, 1))
		const width = 30
		n := int(frac * width)
		eta := "-"
		if rate > 0 && s.Done < s.Total {
			eta = (time.Duration(float64(s.Total-s.Done) / rate * float64(time.Second))).Round(time.Second).String()
		}
		if s.Final {
			eta = "done"
		}
		return fmt.Sprintf("load   [%s%s] %d/%d keys %3.0f%%  %.0f keys/s  ETA %s",
			strings.Repeat("#", n), strings.Repeat(".", width-n), s.Done, s.Total, 100*frac, rate, eta)
	}
	done := fmt.Sprintf("%d ops", s.Done)
	el := fmt.Sprintf("%5.1fs", s.Elapsed.Seconds())
	switch {
	case s.Total > 0:
		done = fmt.Sprintf("%d/%d ops", s.Done, s.Total)
	case s.Planned > 0:
		el += "/" + s.Planned.String()
	}
	return fmt.Sprintf("%-6s %s  %s  %.0f ops/s  %d errors", s.Phase, el, done, rate, s.Errors)
}
