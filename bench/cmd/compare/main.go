// Command compare measures rkv side by side with a raw TCP echo and with
// Redis, on this machine, and writes docs/BENCHMARKS.md, its plots and
// the raw results.
//
//	cd bench && go run ./cmd/compare --out ../docs     (make bench-compare)
//	cd bench && go run ./cmd/compare --quick --out /tmp/bench
//
// Every system is driven through loadgen. Within each run, every point
// (an operation, value size, concurrency and durability) is measured for
// each system back to back, the order alternating from run to run, so
// that the machine's drift hits all alike; the report gives the median
// and spread over runs of the ratios taken within a run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rkv-io/rkv/bench/report"
	"github.com/rkv-io/rkv/bench/target"
)

// options are the command's flags.
type options struct {
	out             string
	quick           bool
	runs            int
	duration        time.Duration
	durableDuration time.Duration // durable PUT points' (durablePoint; the duration with --quick)
	warmup          time.Duration
	keys            int
	rkvServers      int
	arenas          []int
	arenaBytes      int64
	concurrency     []int
	sizes           []int
	echoSizes       []int
	baseSize        int
	baseConc        int
	batch           int
	batchOps        []string
	scaleServers    []int
	distribution    string
	work            string
	keep            bool
	serveEcho       string
	from            string
	only            string
	idlePoll        time.Duration // --idle-poll; 0: the machine's setting stays
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		os.Exit(2)
	}
	if o.serveEcho != "" {
		os.Exit(serveEcho(o.serveEcho))
	}
	// Libraries' warnings (a probing client refused while its server
	// starts) are expected here; errors still show.
	slog.SetDefault(clientLogger)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := run
	if o.from != "" {
		run = rerender
	}
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "compare: %v\n", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.StringVar(&o.out, "out", "../docs", "output directory: BENCHMARKS.md there, results.json and the plots in its bench/")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: 1 run, short points, fewer of them, small arenas (CI)")
	fs.IntVar(&o.runs, "runs", 0, "repetitions of every point (default 3; 1 with --quick)")
	fs.DurationVar(&o.duration, "duration", 0, "measured phase per point (default 4s; 300ms with --quick)")
	fs.DurationVar(&o.warmup, "warmup", 0, "unmeasured phase before each point (default 1s; 100ms with --quick)")
	fs.IntVar(&o.keys, "keys", 0, "key space (default 10000; 1000 with --quick); at most 64 MiB of values per size")
	fs.IntVar(&o.rkvServers, "rkv-servers", 1, "rkv-server processes in the measured cluster (1: the same as one redis-server)")
	arenas := fs.String("arenas", "", "arena counts of the registration comparison (default 1,2,4,8; 1,2 with --quick)")
	arenaSize := fs.String("arena-size", "", "arena size of the registration comparison (default 1GiB; 64MiB with --quick)")
	conc := fs.String("concurrency", "", "concurrencies of the GET scaling comparison (default 1,2,4,8,16,32,64; 1,16 with --quick)")
	servers := fs.String("scale-servers", "", "server processes of each system in the GET and PUT scaling comparison (default 1,2,4)")
	sizes := fs.String("sizes", "", "value sizes of the GET scaling comparison (default 64,256,1KiB..1MiB by 4; 64,1KiB,64KiB with --quick)")
	fs.StringVar(&o.distribution, "distribution", "zipfian", "key distribution: zipfian or uniform")
	fs.StringVar(&o.work, "work", "", "working directory for binaries, data and logs (default: a new temporary directory)")
	fs.BoolVar(&o.keep, "keep", false, "keep the working directory (logs) at the end")
	fs.StringVar(&o.only, "only", "", "measure only this part: throughput (comparisons 1, 2, 4), registration (3), batch (2's batches against Redis pipelines) or servers (4's server processes)")
	fs.StringVar(&o.from, "from", "", "measure nothing: render the report and plots into --out from this results.json")
	fs.DurationVar(&o.idlePoll, "idle-poll", 0, "in a guest whose cpuidle driver is haltpoll, have idle CPUs poll up to this long before they halt during the session, restoring the setting after (root; 0: leave it)")
	fs.StringVar(&o.serveEcho, "serve-echo", "", "internal: serve the raw TCP echo on this address")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	def := func(p *int, full, quick int) {
		if *p <= 0 {
			*p = map[bool]int{false: full, true: quick}[o.quick]
		}
	}
	defDur := func(p *time.Duration, full, quick time.Duration) {
		if *p <= 0 {
			*p = map[bool]time.Duration{false: full, true: quick}[o.quick]
		}
	}
	def(&o.runs, 3, 1)
	def(&o.keys, 10000, 1000)
	defDur(&o.duration, 4*time.Second, 300*time.Millisecond)
	defDur(&o.warmup, time.Second, 100*time.Millisecond)
	o.durableDuration = durablePoint
	if o.quick {
		o.durableDuration = o.duration
	}
	pick := func(s *string, full, quick string) {
		if *s == "" {
			*s = map[bool]string{false: full, true: quick}[o.quick]
		}
	}
	pick(arenas, "1,2,4,8", "1,2")
	pick(arenaSize, "1GiB", "64MiB")
	pick(conc, "1,2,4,8,16,32,64", "1,16")
	pick(servers, "1,2,4", "1,2,4")
	pick(sizes, "64,256,1KiB,4KiB,16KiB,64KiB,256KiB,1MiB", "64,1KiB,64KiB")
	var err error
	if o.arenas, err = parseList(*arenas, "--arenas"); err != nil {
		return nil, err
	}
	if o.concurrency, err = parseList(*conc, "--concurrency"); err != nil {
		return nil, err
	}
	if o.sizes, err = parseList(*sizes, "--sizes"); err != nil {
		return nil, err
	}
	if o.scaleServers, err = parseList(*servers, "--scale-servers"); err != nil {
		return nil, err
	}
	ab, err := parseSize(*arenaSize)
	if err != nil {
		return nil, fmt.Errorf("--arena-size: %w", err)
	}
	o.arenaBytes = int64(ab)
	if !slices.Contains([]string{"", "throughput", "registration", partBatch, partServers}, o.only) {
		return nil, fmt.Errorf("--only %q: want throughput, registration, %s or %s", o.only, partBatch, partServers)
	}
	if o.idlePoll < 0 {
		return nil, fmt.Errorf("--idle-poll %v: want a duration of 0 or more", o.idlePoll)
	}
	if o.distribution != "zipfian" && o.distribution != "uniform" {
		return nil, fmt.Errorf("--distribution %q: want zipfian or uniform", o.distribution)
	}
	o.echoSizes = []int{64, 1 << 10, 64 << 10}
	o.baseSize, o.baseConc = 1<<10, 16
	// Batches of 16 against Redis pipelines of 16 commands.
	o.batch, o.batchOps = 16, []string{report.OpMultiGet, report.OpMultiPut}
	return o, nil
}

// parseList parses "1,2,4KiB".
func parseList(s, flagName string) ([]int, error) {
	var xs []int
	for _, f := range strings.Split(s, ",") {
		x, err := parseSize(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flagName, err)
		}
		xs = append(xs, x)
	}
	return xs, nil
}

// parseSize parses a positive count with an optional KiB, MiB or GiB
// suffix.
func parseSize(s string) (int, error) {
	mult := 1
	for suffix, m := range map[string]int{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(s, suffix) {
			s, mult = strings.TrimSuffix(s, suffix), m
			break
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive size (a number with an optional KiB, MiB or GiB)", s)
	}
	return n * mult, nil
}

// serveEcho is the echo server process (--serve-echo): it serves until
// SIGTERM or SIGINT.
func serveEcho(addr string) int {
	s, err := target.ListenEcho(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("echo listening on %s\n", s.Addr())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	<-sigs
	if err := s.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		fmt.Fprintln(os.Stderr, err)
	}
	return 0
}

func run(ctx context.Context, o *options) (err error) {
	t0 := time.Now()
	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "rkv-bench-"); err != nil {
			return err
		}
		if !o.keep {
			defer os.RemoveAll(work)
		}
	}
	if work, err = filepath.Abs(work); err != nil {
		return err
	}
	benchDir := filepath.Join(o.out, "bench")
	if err := os.MkdirAll(benchDir, 0o755); err != nil {
		return err
	}
	if o.idlePoll > 0 {
		restore, perr := setIdlePoll(haltPollParam, o.idlePoll)
		switch {
		case errors.Is(perr, os.ErrNotExist):
			logf("--idle-poll: this kernel has no haltpoll cpuidle driver (%s): idle CPUs stay as they are", haltPollParam)
		case perr != nil:
			return fmt.Errorf("--idle-poll %v: %w", o.idlePoll, perr)
		default:
			defer func() { err = errors.Join(err, restore()) }()
		}
	}
	env, err := collectEnv(ctx)
	if err != nil {
		return err
	}
	logf("session: %d run(s), %v per point after %v of warm-up; working directory %s", o.runs, o.duration, o.warmup, work)
	res := &report.Results{Env: env, Config: report.Config{
		Quick: o.quick, Runs: o.runs, Duration: o.duration, DurableDuration: max(o.duration, o.durableDuration), Warmup: o.warmup, Keys: o.keys,
		Distribution: o.distribution, RKVServers: o.rkvServers, BaseSize: o.baseSize, BaseConcurrency: o.baseConc,
		EchoSizes: o.echoSizes, Concurrencies: o.concurrency, Sizes: o.sizes, Arenas: o.arenas, ArenaBytes: o.arenaBytes,
		Batch: o.batch, BatchOps: o.batchOps, ScaleServers: o.scaleServers,
	}}
	if slices.ContainsFunc(plan(o), func(g group) bool { return g.cleaning }) {
		res.Config.CleaningArenas, res.Config.CleaningArenaBytes = cleaningArenas, cleaningArenaSize
	}

	logf("building rkv-server")
	bin, err := target.BuildRKV(ctx, filepath.Join(work, "bin"))
	if err != nil {
		return err
	}
	if o.only != "registration" {
		s, err := startSystems(ctx, o, work, bin)
		if err != nil {
			return err
		}
		err = s.measure(ctx, res)
		if cerr := s.close(); cerr != nil {
			logf("stopping the servers: %v", cerr)
			err = errors.Join(err, cerr)
		}
		if err != nil {
			return err
		}
	}
	if o.only == "" || o.only == "registration" {
		if err := measureRegistration(ctx, o, work, bin, res); err != nil {
			return err
		}
	}
	res.Elapsed = time.Since(t0).Round(time.Second)

	if err := res.Save(filepath.Join(benchDir, "results.json")); err != nil {
		return err
	}
	if err := writeReport(o.out, res); err != nil {
		return err
	}
	logf("done in %v", time.Since(t0).Round(time.Second))
	return nil
}

// rerender writes the report and plots of the results in o.from
// (--from).
func rerender(_ context.Context, o *options) error {
	res, err := report.Load(o.from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(o.out, "bench"), 0o755); err != nil {
		return err
	}
	return writeReport(o.out, res)
}

// writeReport renders the plots into out/bench and out/BENCHMARKS.md,
// with out/bench/rxe.md as its rxe section when that file exists.
func writeReport(out string, res *report.Results) error {
	benchDir := filepath.Join(out, "bench")
	plots, err := report.WritePlots(res, benchDir)
	if err != nil {
		return err
	}
	rxe, err := os.ReadFile(filepath.Join(benchDir, "rxe.md"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	md := filepath.Join(out, "BENCHMARKS.md")
	f, err := os.Create(md)
	if err != nil {
		return err
	}
	if err := report.Render(f, res, report.RenderOptions{Plots: plots, RXE: string(rxe), ResultsFile: "bench/results.json"}); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	logf("wrote %s and %d plots in %s", md, len(plots), benchDir)
	for _, t := range report.BuildView(res).Targets {
		logf("target: %s %s: %s", t.Name, t.Want, strings.ReplaceAll(t.Verdict(), "*", ""))
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
