// The throughput and latency comparisons: the servers, the plan of points, and measuring each.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rkv-io/rkv/bench/report"
	"github.com/rkv-io/rkv/bench/target"
	"github.com/rkv-io/rkv/internal/freeport"
	"github.com/rkv-io/rkv/loadgen"
)

// dataPerSize bounds the values loaded for one value size.
const dataPerSize = 64 << 20

// keysFor is the key space for values of size bytes: o.keys, fewer for
// large values so that a size's data stays within dataPerSize.
func keysFor(o *options, size int) int {
	return max(16, min(o.keys, dataPerSize/size))
}

func keyPrefix(size int) string { return fmt.Sprintf("s%d/", size) }

// group is one configuration measured for several systems back to back.
type group struct {
	op      string
	size    int
	conc    int
	durable bool
	systems []string
}

func (g group) point(system string) report.Point {
	return report.Point{System: system, Op: g.op, ValueSize: g.size, Concurrency: g.conc, Durable: g.durable}
}

// plan lists the session's groups, each configuration once, with the
// systems every comparison that needs it wants.
func plan(o *options) []group {
	var gs []group
	add := func(op string, size, conc int, durable bool, systems ...string) {
		for i := range gs {
			g := &gs[i]
			if g.op == op && g.size == size && g.conc == conc && g.durable == durable {
				for _, s := range systems {
					if !slices.Contains(g.systems, s) {
						g.systems = append(g.systems, s)
					}
				}
				return
			}
		}
		gs = append(gs, group{op: op, size: size, conc: conc, durable: durable, systems: systems})
	}
	rkv, redis, echo := report.SystemRKV, report.SystemRedis, report.SystemEcho
	// 1. rkv against the echo, one request at a time.
	for _, size := range o.echoSizes {
		add(report.OpGet, size, 1, false, rkv, echo)
		add(report.OpPut, size, 1, false, rkv, echo)
	}
	// 2. rkv against Redis at equal durability.
	add(report.OpGet, o.baseSize, o.baseConc, false, rkv, redis)
	add(report.OpPut, o.baseSize, o.baseConc, true, rkv, redis)
	add(report.OpPut, o.baseSize, o.baseConc, false, rkv, redis)
	// 4. Scaling.
	for _, c := range o.concurrency {
		add(report.OpGet, o.baseSize, c, false, rkv, redis)
	}
	for _, size := range o.sizes {
		add(report.OpGet, size, 1, false, rkv)
	}
	return gs
}

// getSizes are the value sizes some GET reads: the data sets to load.
func getSizes(gs []group) []int {
	var sizes []int
	for _, g := range gs {
		if g.op == report.OpGet && !slices.Contains(sizes, g.size) {
			sizes = append(sizes, g.size)
		}
	}
	slices.Sort(sizes)
	return sizes
}

// systems are the servers that live for the whole session: the echo,
// the rkv cluster that serves GETs (sync=none, loaded once), and the two
// Redis servers. PUTs to rkv get a fresh cluster each (see putRKV).
type systems struct {
	o         *options
	work, bin string
	echo      *target.Process
	echoAddr  string
	rkv       *target.Cluster
	rkvGet    *target.RKV
	redisND   *target.Redis // appendonly no
	redisD    *target.Redis // appendonly yes, appendfsync always
	puts      int           // rkv PUT clusters started
	groups    []group
}

// clientLogger is the rkv clients' logger: errors only (the cluster runs
// without a gossip key on purpose).
var clientLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

func startSystems(ctx context.Context, o *options, work, bin string) (_ *systems, err error) {
	s := &systems{o: o, work: work, bin: bin, groups: plan(o)}
	defer func() {
		if err != nil {
			_ = s.close()
		}
	}()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	port, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	s.echoAddr = fmt.Sprintf("127.0.0.1:%d", port)
	if s.echo, err = target.StartProcess("echo server", filepath.Join(work, "echo.log"), self, "--serve-echo", s.echoAddr); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.echo.WaitLog(wctx, "echo listening", func(l string) bool { return strings.HasPrefix(l, "echo listening") }); err != nil {
		return nil, err
	}

	logf("starting %d rkv-server(s) (sync=none) for the GETs", o.rkvServers)
	arenaSize := int64(512 << 20)
	if o.quick {
		arenaSize = 64 << 20
	}
	if s.rkv, err = target.StartCluster(ctx, target.ClusterOptions{Servers: o.rkvServers, Server: target.ServerOptions{
		Binary: bin, Dir: filepath.Join(work, "rkv-get"), Sync: "none", ArenaSize: arenaSize, ArenaCount: 4, IndexSlots: 1 << 17,
	}}); err != nil {
		return nil, err
	}
	conns := 16 // Load's writers
	for _, g := range s.groups {
		conns = max(conns, g.conc)
	}
	if s.rkvGet, err = target.NewRKV(ctx, target.RKVOptions{Seeds: s.rkv.Seeds(), Conns: conns,
		Servers: o.rkvServers, Arenas: 4, Logger: clientLogger}); err != nil {
		return nil, err
	}
	logf("starting redis-server twice (appendonly no; appendonly yes + appendfsync always)")
	if s.redisND, err = target.StartRedis(ctx, target.RedisOptions{Dir: filepath.Join(work, "redis")}); err != nil {
		return nil, err
	}
	if s.redisD, err = target.StartRedis(ctx, target.RedisOptions{Dir: filepath.Join(work, "redis-durable"), Durable: true}); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *systems) close() error {
	var errs []error
	if s.rkvGet != nil {
		errs = append(errs, s.rkvGet.Close())
	}
	if s.rkv != nil {
		errs = append(errs, s.rkv.Close())
	}
	for _, r := range []*target.Redis{s.redisND, s.redisD} {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	if s.echo != nil {
		errs = append(errs, s.echo.Stop(5*time.Second))
	}
	return errors.Join(errs...)
}

// options returns the loadgen options of p in run.
func (s *systems) options(p report.Point, run int) loadgen.Options {
	w := loadgen.WorkloadC
	if p.Op == report.OpPut {
		w = loadgen.WorkloadPut
	}
	return loadgen.Options{Workload: w, Keys: keysFor(s.o, p.ValueSize), KeyPrefix: keyPrefix(p.ValueSize),
		ValueSize: p.ValueSize, Distribution: s.o.distribution, Concurrency: p.Concurrency,
		Duration: s.o.duration, Warmup: s.o.warmup, Seed: int64(run)}
}

// measure loads the GET data sets, then measures every group in every
// run, systems back to back in alternating order.
func (s *systems) measure(ctx context.Context, res *report.Results) error {
	rt, err := s.redisND.NewTarget(ctx, 16)
	if err != nil {
		return err
	}
	defer rt.Close()
	for _, size := range getSizes(s.groups) {
		o := s.options(report.Point{Op: report.OpGet, ValueSize: size, Concurrency: 16}, 0)
		logf("loading %d keys of %d bytes into rkv and Redis", o.Keys, size)
		for _, t := range []loadgen.Target{s.rkvGet, rt} {
			if err := loadgen.Load(ctx, t, o); err != nil {
				return fmt.Errorf("loading %d-byte values: %w", size, err)
			}
		}
	}
	// Dial the GET client's connections up to the highest concurrency
	// (the pool grows as requests need it) before anything is measured.
	top := 1
	for _, g := range s.groups {
		top = max(top, g.conc)
	}
	o := s.options(report.Point{Op: report.OpGet, ValueSize: s.o.baseSize, Concurrency: top}, 0)
	o.Duration, o.Warmup = max(time.Second, s.o.warmup), 0
	if _, err := loadgen.Run(ctx, s.rkvGet, o); err != nil {
		return fmt.Errorf("warming the rkv client up: %w", err)
	}
	points := 0
	for _, g := range s.groups {
		points += len(g.systems)
	}
	for run := 1; run <= s.o.runs; run++ {
		n := 0
		for gi, g := range s.groups {
			order := slices.Clone(g.systems)
			if (run+gi)%2 == 0 {
				slices.Reverse(order)
			}
			for _, sys := range order {
				n++
				p := g.point(sys)
				r, err := s.measurePoint(ctx, p, run)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err != nil {
					note := fmt.Sprintf("run %d, %s: %v", run, p, err)
					logf("%s", note)
					res.Notes = append(res.Notes, note)
					if r.Ops == 0 {
						continue
					}
				}
				// The "all" kind repeats the one operation's: keep the file small.
				delete(r.CDF, loadgen.KindAll)
				delete(r.Latency, loadgen.KindAll)
				res.Measurements = append(res.Measurements, report.Measurement{Point: p, Run: run, Result: r})
				lat := r.Latency[p.Op]
				extra := ""
				if p.System == report.SystemRKV && p.Op == report.OpGet && lat.Count > 0 {
					extra = fmt.Sprintf(" READs/GET %.2f", r.Extra[target.CounterReads]/float64(lat.Count))
				}
				var errs int64
				for _, e := range r.Errors {
					errs += e
				}
				logf("run %d/%d %3d/%d  %-28s %9.0f ops/s  p50 %-9v p99 %-9v errors %d%s", run, s.o.runs, n, points, p,
					r.OpsPerS, lat.P50, lat.P99, errs, extra)
			}
		}
	}
	return nil
}

// measurePoint runs p once.
func (s *systems) measurePoint(ctx context.Context, p report.Point, run int) (loadgen.Result, error) {
	o := s.options(p, run)
	switch {
	case p.System == report.SystemRKV && p.Op == report.OpGet:
		return loadgen.Run(ctx, s.rkvGet, o)
	case p.System == report.SystemRKV:
		return s.putRKV(ctx, p, o)
	case p.System == report.SystemRedis:
		r := s.redisND
		if p.Durable {
			r = s.redisD
		}
		t, err := r.NewTarget(ctx, p.Concurrency)
		if err != nil {
			return loadgen.Result{}, err
		}
		defer t.Close()
		return loadgen.Run(ctx, t, o)
	case p.System == report.SystemEcho:
		t, err := target.NewEcho(ctx, target.EchoOptions{Addr: s.echoAddr, ValueSize: p.ValueSize, Workers: p.Concurrency})
		if err != nil {
			return loadgen.Result{}, err
		}
		defer t.Close()
		return loadgen.Run(ctx, t, o)
	}
	return loadgen.Result{}, fmt.Errorf("no system %q", p.System)
}

// putRKV measures rkv PUTs on a cluster of its own, started for the
// point and removed after it: rkv does not compact yet, so the arenas of
// a long-lived cluster would fill.
func (s *systems) putRKV(ctx context.Context, p report.Point, o loadgen.Options) (_ loadgen.Result, err error) {
	s.puts++
	dir := filepath.Join(s.work, fmt.Sprintf("rkv-put-%d", s.puts))
	sync := "none"
	if p.Durable {
		sync = "always"
	}
	// 2 GiB of arenas per 5 s of PUTs (quick: 256 MiB), at most 8 GiB.
	arenaSize := int64(512 << 20)
	if s.o.quick {
		arenaSize = 64 << 20
	}
	count := min(16, 4*int(math.Ceil((s.o.duration+s.o.warmup).Seconds()/5)))
	c, err := target.StartCluster(ctx, target.ClusterOptions{Servers: s.o.rkvServers, Server: target.ServerOptions{
		Binary: s.bin, Dir: dir, Sync: sync, ArenaSize: arenaSize, ArenaCount: count,
	}})
	if err != nil {
		return loadgen.Result{}, err
	}
	defer func() {
		err = errors.Join(err, c.Close(), os.RemoveAll(dir))
	}()
	t, err := target.NewRKV(ctx, target.RKVOptions{Seeds: c.Seeds(), Conns: p.Concurrency, Servers: s.o.rkvServers, Arenas: count, Logger: clientLogger})
	if err != nil {
		return loadgen.Result{}, err
	}
	defer t.Close()
	return loadgen.Run(ctx, t, o)
}
