// Command ab measures two builds of rkv side by side: both servers up at
// once, each loaded by its own build's rkv-client, the runs alternating
// A B B A A B ..., so that the machine's drift (on a shared host, minutes
// of it can move throughput by half) falls on both builds alike. It
// prints each pair and the median ratio of B to A with its range.
//
//	cd bench && go run ./cmd/ab --a /tmp/old/bin --b ../bin --workload put --pairs 8
//
// Each of --a and --b is a directory holding rkv-server and rkv-client
// (make build writes them to bin/; make bench-ab builds a git revision's
// beside the working tree's and runs this).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rkv-io/rkv/bench/target"
)

type options struct {
	a, b        string
	workload    string
	concurrency int
	valueSize   int
	keys        int
	pairs       int
	duration    time.Duration
	warmup      time.Duration
	sync        string
	arenaSize   int64
	arenaCount  int
	work        string
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "ab:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ab:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("ab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.a, "a", "", "directory of build A's rkv-server and rkv-client (the baseline; required)")
	fs.StringVar(&o.b, "b", "", "directory of build B's rkv-server and rkv-client (required)")
	fs.StringVar(&o.workload, "workload", "put", "rkv-client bench --workload: a, b, c, put, multiget or multiput")
	fs.IntVar(&o.concurrency, "concurrency", 16, "rkv-client bench --concurrency")
	fs.IntVar(&o.valueSize, "value-size", 1024, "rkv-client bench --value-size, in bytes")
	fs.IntVar(&o.keys, "keys", 10000, "rkv-client bench --keys")
	fs.IntVar(&o.pairs, "pairs", 8, "pairs of runs, one of each build")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured length of each run")
	fs.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "unmeasured start of each run")
	fs.StringVar(&o.sync, "sync", "none", "both servers' --sync")
	fs.Int64Var(&o.arenaSize, "arena-size", 1<<30, "both servers' --arena-size, in bytes")
	fs.IntVar(&o.arenaCount, "arena-count", 4, "both servers' --arena-count")
	fs.StringVar(&o.work, "work", "", "directory for the servers' data and logs (default: a temporary one, removed after)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, d := range []struct{ flag, dir string }{{"--a", o.a}, {"--b", o.b}} {
		if d.dir == "" {
			return nil, fmt.Errorf("%s is required: a directory holding rkv-server and rkv-client", d.flag)
		}
		for _, bin := range []string{"rkv-server", "rkv-client"} {
			if _, err := os.Stat(filepath.Join(d.dir, bin)); err != nil {
				return nil, fmt.Errorf("%s %s: no %s there (make build writes both to bin/): %w", d.flag, d.dir, bin, err)
			}
		}
	}
	if o.pairs < 1 || o.concurrency < 1 || o.valueSize < 1 || o.keys < 1 || o.duration <= 0 || o.warmup < 0 || o.arenaSize <= 0 || o.arenaCount < 1 {
		return nil, errors.New("--pairs, --concurrency, --value-size, --keys, --duration, --arena-size and --arena-count must be positive, --warmup not negative")
	}
	return o, nil
}

// build is one side: its binaries' directory and its running server.
type build struct {
	name, dir string
	cluster   *target.Cluster
	runs      []result
}

// result is what one rkv-client bench run reports.
type result struct {
	OpsPerS float64 `json:"ops_per_s"`
	Latency struct {
		All struct {
			P50 int64 `json:"p50_ns"`
		} `json:"all"`
	} `json:"latency"`
	Errors map[string]int64 `json:"errors"` // by kind
}

func run(ctx context.Context, o *options, out io.Writer) (err error) {
	work := o.work
	if work == "" {
		if work, err = os.MkdirTemp("", "rkv-ab-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	builds := []*build{{name: "A", dir: o.a}, {name: "B", dir: o.b}}
	defer func() {
		for _, b := range builds {
			if b.cluster != nil {
				err = errors.Join(err, b.cluster.Close())
			}
		}
	}()
	for _, b := range builds {
		fmt.Fprintf(out, "starting %s's rkv-server (%s), --sync %s, %d arenas of %d bytes\n", b.name, b.dir, o.sync, o.arenaCount, o.arenaSize)
		b.cluster, err = target.StartCluster(ctx, target.ClusterOptions{Server: target.ServerOptions{
			Binary: filepath.Join(b.dir, "rkv-server"), Dir: filepath.Join(work, b.name), Sync: o.sync,
			ArenaSize: o.arenaSize, ArenaCount: o.arenaCount, IndexSlots: 1 << 17,
		}})
		if err != nil {
			return fmt.Errorf("build %s: %w", b.name, err)
		}
	}
	fmt.Fprintf(out, "%d pairs of %v runs: rkv-client bench --workload %s --concurrency %d --value-size %d --keys %d\n",
		o.pairs, o.duration, o.workload, o.concurrency, o.valueSize, o.keys)
	fmt.Fprintf(out, "%-5s %12s %10s %12s %10s %9s\n", "pair", "A ops/s", "A p50", "B ops/s", "B p50", "B/A ops")
	for i := range o.pairs {
		order := builds
		if i%2 == 1 {
			order = []*build{builds[1], builds[0]}
		}
		for _, b := range order {
			r, err := bench(ctx, o, b)
			if err != nil {
				return err
			}
			b.runs = append(b.runs, r)
		}
		a, bb := builds[0].runs[i], builds[1].runs[i]
		fmt.Fprintf(out, "%-5d %12.0f %10v %12.0f %10v %9.3f\n", i+1, a.OpsPerS, time.Duration(a.Latency.All.P50),
			bb.OpsPerS, time.Duration(bb.Latency.All.P50), bb.OpsPerS/a.OpsPerS)
	}
	ops := ratios(builds, func(r result) float64 { return r.OpsPerS })
	p50 := ratios(builds, func(r result) float64 { return float64(r.Latency.All.P50) })
	fmt.Fprintf(out, "B/A throughput: %s; B/A p50: %s (median, min-max of %d pairs)\n", ops, p50, o.pairs)
	return nil
}

// bench runs b's rkv-client against b's server.
func bench(ctx context.Context, o *options, b *build) (result, error) {
	args := []string{"--join", strings.Join(b.cluster.Seeds(), ","), "bench", "--workload", o.workload,
		"--concurrency", fmt.Sprint(o.concurrency), "--value-size", fmt.Sprint(o.valueSize), "--keys", fmt.Sprint(o.keys),
		"--duration", o.duration.String(), "--warmup", o.warmup.String(), "-q", "--output", "json"}
	cmd := exec.CommandContext(ctx, filepath.Join(b.dir, "rkv-client"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return result{}, fmt.Errorf("build %s: rkv-client %s: %w\n%s", b.name, strings.Join(args, " "), err, stderr.Bytes())
	}
	var r result
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return result{}, fmt.Errorf("build %s: rkv-client bench's output: %w\n%s", b.name, err, stdout.Bytes())
	}
	if r.OpsPerS <= 0 {
		return result{}, fmt.Errorf("build %s: rkv-client bench measured no operations (errors: %v)\n%s", b.name, r.Errors, stderr.Bytes())
	}
	return r, nil
}

// spread is a median with its range.
type spread struct{ median, lo, hi float64 }

func (s spread) String() string { return fmt.Sprintf("%.3f (%.3f-%.3f)", s.median, s.lo, s.hi) }

// ratios is the spread of B's value over A's, pair by pair.
func ratios(builds []*build, value func(result) float64) spread {
	var rs []float64
	for i, a := range builds[0].runs {
		rs = append(rs, value(builds[1].runs[i])/value(a))
	}
	slices.Sort(rs)
	n := len(rs)
	med := rs[n/2]
	if n%2 == 0 {
		med = (rs[n/2-1] + rs[n/2]) / 2
	}
	return spread{med, rs[0], rs[n-1]}
}
