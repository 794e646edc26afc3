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
	"strconv"
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

// config is what a group measures, but for the system.
type config struct {
	op       string
	size     int
	conc     int
	durable  durability
	cleaning bool // report.Point.Cleaning
	// servers is report.Point.Servers: 0 for the session's standard
	// systems, else the server processes of each (comparison 4).
	servers int
}

// group is one configuration measured for several systems back to back.
type group struct {
	config
	systems []string
	// parts are the parts of the session (--only) that need the group.
	parts []string
}

func (g group) point(system string) report.Point {
	return report.Point{System: system, Op: g.op, ValueSize: g.size, Concurrency: g.conc,
		Durable: g.durable == durable, CrashSafe: g.durable == crashSafe, Cleaning: g.cleaning, Servers: g.servers}
}

// durability is what a PUT survives before it is acknowledged
// (report.Point's Durable and CrashSafe).
type durability int

const (
	notDurable durability = iota // rkv sync=none, Redis appendonly no
	crashSafe                    // a crash of the process: rkv sync=none, Redis appendfsync no
	durable                      // a crash of the machine: rkv sync=always, Redis appendfsync always
)

// Parts of the throughput comparisons that --only can pick alone.
const (
	partBatch   = "batch"
	partServers = "servers"
)

// plan lists the session's groups, each configuration once, with the
// systems every comparison that needs it wants; with --only batch or
// servers, only that part's groups.
func plan(o *options) []group {
	var gs []group
	add := func(part string, c config, systems ...string) {
		for i := range gs {
			g := &gs[i]
			if g.config == c {
				for _, s := range systems {
					if !slices.Contains(g.systems, s) {
						g.systems = append(g.systems, s)
					}
				}
				if !slices.Contains(g.parts, part) {
					g.parts = append(g.parts, part)
				}
				return
			}
		}
		gs = append(gs, group{config: c, systems: systems, parts: []string{part}})
	}
	rkv, redis, echo := report.SystemRKV, report.SystemRedis, report.SystemEcho
	get, put := report.OpGet, report.OpPut
	// 1. rkv against the echo, one request at a time.
	for _, size := range o.echoSizes {
		add("echo", config{op: get, size: size, conc: 1}, rkv, echo)
		add("echo", config{op: put, size: size, conc: 1}, rkv, echo)
	}
	// 2. rkv against Redis at each durability, and while rkv's cleaner
	// works; then batches against Redis pipelines of as many commands
	// (not durable, as a MultiPut would be compared with SETs to Redis
	// without an append-only file).
	base := config{size: o.baseSize, conc: o.baseConc}
	with := func(c config, op string, d durability) config {
		c.op, c.durable = op, d
		return c
	}
	add("redis", with(base, get, notDurable), rkv, redis)
	add("redis", with(base, put, durable), rkv, redis)
	add("redis", with(base, put, notDurable), rkv, redis)
	add("redis", with(base, put, crashSafe), rkv, redis)
	cleaning := with(base, put, notDurable)
	cleaning.cleaning = true
	add("redis", cleaning, rkv, redis)
	for _, op := range o.batchOps {
		add(partBatch, with(base, op, notDurable), rkv, redis)
	}
	// 4. Scaling: concurrency, value size, then server processes, each
	// count's groups together (measure starts their servers for them).
	for _, c := range o.concurrency {
		add("concurrency", config{op: get, size: o.baseSize, conc: c}, rkv, redis)
	}
	for _, size := range o.sizes {
		add("sizes", config{op: get, size: size, conc: 1}, rkv)
	}
	for _, n := range o.scaleServers {
		scaled := base
		scaled.servers = report.ScaledServers(o.rkvServers, n)
		add(partServers, with(scaled, get, notDurable), rkv, redis)
		add(partServers, with(scaled, put, notDurable), rkv, redis)
	}
	if o.only != partBatch && o.only != partServers {
		return gs
	}
	return slices.DeleteFunc(gs, func(g group) bool { return !slices.Contains(g.parts, o.only) })
}

// isWrite reports whether op writes: its rkv points need a cluster of
// their own (see ownRKV).
func isWrite(op string) bool { return op == report.OpPut || op == report.OpMultiPut }

// getSizes are the value sizes the standard systems read: the data sets
// to load into them.
func getSizes(gs []group) []int {
	var sizes []int
	for _, g := range gs {
		if !isWrite(g.op) && g.servers == 0 && !slices.Contains(sizes, g.size) {
			sizes = append(sizes, g.size)
		}
	}
	slices.Sort(sizes)
	return sizes
}

// systems are the servers that live for the whole session: the echo,
// the rkv cluster that serves GETs (sync=none, loaded once), and the three
// Redis servers. PUTs to rkv, and GETs on more server processes, get a
// fresh cluster each (see ownRKV); the more Redis processes live for a
// run's points on them (see scaleTo).
type systems struct {
	o         *options
	work, bin string
	echo      *target.Process
	echoAddr  string
	rkv       *target.Cluster
	rkvGet    *target.RKV
	redisND   *target.Redis // appendonly no
	redisCS   *target.Redis // appendonly yes, appendfsync no
	redisD    *target.Redis // appendonly yes, appendfsync always
	clusters  int           // rkv clusters started for a point (ownRKV)
	groups    []group
	// redisN is comparison 4's redis-servers on more processes, while
	// its groups are measured.
	redisN *redisN
	// idle counts the CPUs' halts over each point (idleCounter; nil
	// where the kernel does not say).
	idle func() map[string]uint64
}

// clientLogger is the rkv clients' logger: errors only (the cluster runs
// without a gossip key on purpose).
var clientLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

func startSystems(ctx context.Context, o *options, work, bin string) (_ *systems, err error) {
	s := &systems{o: o, work: work, bin: bin, groups: plan(o), idle: idleCounter(cpuSysfs)}
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
	logf("starting redis-server three times (%v; %v; %v)", target.RedisMemoryOnly, target.RedisAOFNoFsync, target.RedisAOFAlways)
	if s.redisND, err = target.StartRedis(ctx, target.RedisOptions{Dir: filepath.Join(work, "redis")}); err != nil {
		return nil, err
	}
	if s.redisCS, err = target.StartRedis(ctx, target.RedisOptions{Dir: filepath.Join(work, "redis-aof"), Persistence: target.RedisAOFNoFsync}); err != nil {
		return nil, err
	}
	if s.redisD, err = target.StartRedis(ctx, target.RedisOptions{Dir: filepath.Join(work, "redis-durable"), Persistence: target.RedisAOFAlways}); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *systems) close() error {
	var errs []error
	if s.redisN != nil {
		errs = append(errs, s.redisN.close())
		s.redisN = nil
	}
	if s.rkvGet != nil {
		errs = append(errs, s.rkvGet.Close())
	}
	if s.rkv != nil {
		errs = append(errs, s.rkv.Close())
	}
	for _, r := range []*target.Redis{s.redisND, s.redisCS, s.redisD} {
		if r != nil {
			errs = append(errs, r.Close())
		}
	}
	if s.echo != nil {
		errs = append(errs, s.echo.Stop(5*time.Second))
	}
	return errors.Join(errs...)
}

// workloads are the loadgen workloads of the points' operations.
var workloads = map[string]loadgen.Workload{
	report.OpGet: loadgen.WorkloadC, report.OpPut: loadgen.WorkloadPut,
	report.OpMultiGet: loadgen.WorkloadMultiGet, report.OpMultiPut: loadgen.WorkloadMultiPut,
}

// options returns the loadgen options of p in run: the same keys, in
// the same order, for every system of a run.
func (s *systems) options(p report.Point, run int) loadgen.Options {
	d := s.o.duration
	if p.Durable {
		d = max(d, s.o.durableDuration)
	}
	return loadgen.Options{Workload: workloads[p.Op], Keys: keysFor(s.o, p.ValueSize), KeyPrefix: keyPrefix(p.ValueSize),
		ValueSize: p.ValueSize, Distribution: s.o.distribution, BatchSize: s.o.batch, Concurrency: p.Concurrency,
		Duration: d, Warmup: s.o.warmup, Seed: int64(run), Counters: s.idle}
}

// durablePoint is the least measured phase of a durable PUT point: an
// rkv-server checkpoints every 10 s (CheckpointInterval), or sooner when
// half its log is written, and a point of a few seconds would measure a
// durable server before its first, flattering it.
const durablePoint = 12 * time.Second

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
	top := 1
	for _, g := range s.groups {
		top = max(top, g.conc)
	}
	if slices.Contains(getSizes(s.groups), s.o.baseSize) {
		if err := s.warm(ctx, s.rkvGet, top); err != nil {
			return err
		}
	}
	points := 0
	for _, g := range s.groups {
		points += len(g.systems)
	}
	for run := 1; run <= s.o.runs; run++ {
		n := 0
		for gi, g := range s.groups {
			if err := s.scaleTo(ctx, g.servers, run); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.note(res, fmt.Sprintf("run %d: %v", run, err))
			}
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
					s.note(res, fmt.Sprintf("run %d, %s: %v", run, p, err))
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
				keys := float64(lat.Count)
				if p.Op == report.OpMultiGet || p.Op == report.OpMultiPut {
					keys *= float64(s.o.batch)
					extra = fmt.Sprintf(" %.0f keys/s", r.OpsPerS*float64(s.o.batch))
				}
				if p.System == report.SystemRKV && !isWrite(p.Op) && keys > 0 {
					extra += fmt.Sprintf(" READs/key %.2f", r.Extra[target.CounterReads]/keys)
				}
				if idles, ok := r.Extra[report.CPUIdleEntries]; ok && lat.Count > 0 {
					extra += fmt.Sprintf(" CPU idles/op %.2f", idles/float64(lat.Count))
				}
				var errs int64
				for _, e := range r.Errors {
					errs += e
				}
				logf("run %d/%d %3d/%d  %-28s %9.0f ops/s  p50 %-9v p99 %-9v errors %d%s", run, s.o.runs, n, points, p,
					r.OpsPerS, lat.P50, lat.P99, errs, extra)
			}
		}
		// The next run starts its own: idle servers would take CPU from
		// the next points.
		if err := s.scaleTo(ctx, 0, run); err != nil {
			s.note(res, fmt.Sprintf("run %d: %v", run, err))
		}
	}
	return nil
}

// note logs what went wrong and keeps it for the report.
func (s *systems) note(res *report.Results, note string) {
	logf("%s", note)
	res.Notes = append(res.Notes, note)
}

// warm runs GETs against an rkv client, unmeasured, before anything is
// measured on it: they dial its connections up to conc (the pool grows
// as requests need it) and fill its location cache.
func (s *systems) warm(ctx context.Context, t *target.RKV, conc int) error {
	o := s.options(report.Point{Op: report.OpGet, ValueSize: s.o.baseSize, Concurrency: conc}, 0)
	o.Duration, o.Warmup = max(time.Second, s.o.warmup), 0
	if _, err := loadgen.Run(ctx, t, o); err != nil {
		return fmt.Errorf("warming the rkv client up: %w", err)
	}
	return nil
}

// measurePoint runs p once.
func (s *systems) measurePoint(ctx context.Context, p report.Point, run int) (loadgen.Result, error) {
	o := s.options(p, run)
	switch {
	case p.System == report.SystemRKV && (isWrite(p.Op) || p.Servers != 0):
		return s.ownRKV(ctx, p, o)
	case p.System == report.SystemRKV:
		return loadgen.Run(ctx, s.rkvGet, o)
	case p.System == report.SystemRedis:
		servers := []*target.Redis{s.redisND}
		switch {
		case p.Servers != 0:
			if s.redisN == nil || s.redisN.n != p.Servers {
				return loadgen.Result{}, fmt.Errorf("no %d redis-servers running", p.Servers)
			}
			if s.redisN.err != nil {
				return loadgen.Result{}, fmt.Errorf("not measured: the %d redis-servers did not start", p.Servers)
			}
			servers = s.redisN.servers
		case p.Durable:
			servers = []*target.Redis{s.redisD}
		case p.CrashSafe:
			servers = []*target.Redis{s.redisCS}
		}
		t, err := target.NewRedisTarget(ctx, servers, p.Concurrency)
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

// ownRKV measures p on an rkv cluster of its own, started for the point
// and removed after it. A PUT's (or MultiPut's), on arenas larger than
// all it writes, so that its cleaner has nothing to do and no point
// inherits another's dead records; or, for the point measured while the
// cleaner works, on small arenas holding the point's keys, loaded first
// (cleaningArenas). A GET's on more server processes (comparison 4),
// loaded and warmed up first, so that no idle cluster takes CPU from the
// other points (four idle rkv-servers take an eighth of a CPU).
func (s *systems) ownRKV(ctx context.Context, p report.Point, o loadgen.Options) (_ loadgen.Result, err error) {
	s.clusters++
	dir := filepath.Join(s.work, fmt.Sprintf("rkv-%s-%d", p.Op, s.clusters))
	sync := "none"
	if p.Durable {
		sync = "always"
	}
	servers := s.o.rkvServers
	if p.Servers != 0 {
		servers = p.Servers
	}
	so := target.ServerOptions{Binary: s.bin, Dir: dir, Sync: sync}
	switch {
	case p.Cleaning:
		so.ArenaSize, so.ArenaCount = cleaningArenaSize, cleaningArenas
	case isWrite(p.Op):
		so.ArenaSize, so.ArenaCount = putArenas(s.o, servers)
	default:
		// Only the point's data set: at most dataPerSize.
		so.ArenaSize, so.ArenaCount, so.IndexSlots = dataPerSize, 4, 1<<17
	}
	c, err := target.StartCluster(ctx, target.ClusterOptions{Servers: servers, Server: so})
	if err != nil {
		return loadgen.Result{}, err
	}
	defer func() {
		err = errors.Join(err, c.Close(), os.RemoveAll(dir))
	}()
	t, err := target.NewRKV(ctx, target.RKVOptions{Seeds: c.Seeds(), Conns: p.Concurrency, Servers: servers, Arenas: so.ArenaCount, Logger: clientLogger})
	if err != nil {
		return loadgen.Result{}, err
	}
	defer t.Close()
	if !isWrite(p.Op) || p.Cleaning {
		if err := loadgen.Load(ctx, t, o); err != nil {
			return loadgen.Result{}, fmt.Errorf("loading %d keys of %d bytes: %w", o.Keys, o.ValueSize, err)
		}
	}
	if !isWrite(p.Op) {
		if err := s.warm(ctx, t, p.Concurrency); err != nil {
			return loadgen.Result{}, err
		}
	}
	if p.Cleaning {
		return loadgen.Run(ctx, &cleanerCounted{RKV: t, servers: c.Servers}, o)
	}
	return loadgen.Run(ctx, t, o)
}

// The arenas of each rkv-server in the PUT point measured while the
// cleaner works: 64 MiB, where the 10,000 keys of 1 KiB loaded first
// take a sixth and a point of 5 s writes twice as much at 25k PUTs/s
// (this machine's rate on 2 CPUs).
const (
	cleaningArenas    = 2
	cleaningArenaSize = 32 << 20
)

// cleanerCounted is an rkv target whose counters include the bytes the
// servers' cleaners copied (report.CleanerMovedBytes), from their
// metrics.
type cleanerCounted struct {
	*target.RKV
	servers []*target.Server
}

// Counters adds the cleaners' count to the client's. A server that does
// not answer leaves it out, and the report shows it unmeasured.
func (c *cleanerCounted) Counters() map[string]uint64 {
	m := c.RKV.Counters()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	moved := 0.0
	for _, srv := range c.servers {
		n, err := srv.Metric(ctx, "rkv_cleaner_moved_bytes_total")
		if err != nil {
			logf("reading the cleaner's count of %s: %v", srv.Name, err)
			return m
		}
		moved += n
	}
	m[report.CleanerMovedBytes] = uint64(moved)
	return m
}

// putArenas is the arena size and count of each of servers rkv-servers
// taking a PUT point: 2 GiB of arenas per 5 s of PUTs (quick: 256 MiB),
// at most 8 GiB, on one or two servers; on more, twice each one's even
// share of that, which the zipfian's hottest keys, all on one server,
// stay well within, and which keeps four servers at half the memory
// pinned.
func putArenas(o *options, servers int) (size int64, count int) {
	size = 512 << 20
	if o.quick {
		size = 64 << 20
	}
	count = min(16, 4*int(math.Ceil((o.duration+o.warmup).Seconds()/5)))
	if servers > 2 {
		count = (2*count + servers - 1) / servers
	}
	return size, count
}

// redisN is n redis-servers without persistence, loaded, for one run of
// comparison 4 (rkv's points there start clusters of their own).
type redisN struct {
	n       int
	dir     string
	servers []*target.Redis
	err     error // why they are not running
}

// scaleTo makes s.redisN n redis-servers (none for 0), stopping the
// current ones if they are not n. It returns what failed to stop or
// start; if the new ones failed to start, s.redisN keeps the error for
// the points on them (a start is not retried within the run).
func (s *systems) scaleTo(ctx context.Context, n, run int) error {
	if s.redisN != nil && s.redisN.n == n {
		return nil
	}
	var stopErr error
	if s.redisN != nil {
		if err := s.redisN.close(); err != nil {
			stopErr = fmt.Errorf("stopping %d redis-servers: %w", s.redisN.n, err)
		}
		s.redisN = nil
	}
	if n == 0 {
		return stopErr
	}
	r, err := s.startRedisN(ctx, n, run)
	if err != nil {
		s.redisN = &redisN{n: n, err: err}
		return errors.Join(stopErr, err)
	}
	s.redisN = r
	return stopErr
}

func (s *systems) startRedisN(ctx context.Context, n, run int) (_ *redisN, err error) {
	r := &redisN{n: n, dir: filepath.Join(s.work, fmt.Sprintf("redis-%d-run-%d", n, run))}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("starting %d redis-servers: %w", n, err), r.close())
		}
	}()
	logf("starting %d redis-server(s) (appendonly no) for run %d", n, run)
	for i := range n {
		srv, err := target.StartRedis(ctx, target.RedisOptions{Dir: filepath.Join(r.dir, strconv.Itoa(i+1))})
		if err != nil {
			return nil, err
		}
		r.servers = append(r.servers, srv)
	}
	t, err := target.NewRedisTarget(ctx, r.servers, s.o.baseConc)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	o := s.options(report.Point{Op: report.OpGet, ValueSize: s.o.baseSize, Concurrency: s.o.baseConc}, 0)
	if err := loadgen.Load(ctx, t, o); err != nil {
		return nil, fmt.Errorf("loading %d keys of %d bytes: %w", o.Keys, o.ValueSize, err)
	}
	return r, nil
}

// close stops the servers and removes their directories.
func (r *redisN) close() error {
	var errs []error
	for _, srv := range r.servers {
		errs = append(errs, srv.Close())
	}
	r.servers = nil
	if r.dir != "" {
		errs = append(errs, os.RemoveAll(r.dir))
	}
	return errors.Join(errs...)
}
