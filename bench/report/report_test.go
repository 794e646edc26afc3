// Tests of the summaries, the report and the plots, from a fixed results file.

package report

import (
	"bytes"
	"flag"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/loadgen"
)

var update = flag.Bool("update", false, "rewrite testdata/results.json from fixture()")

// fixture is a small session with numbers chosen to land on each side of
// the targets.
func fixture() *Results {
	us := func(x float64) time.Duration { return time.Duration(x * 1e3) }
	r := &Results{
		Env: Env{Date: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), CPU: "Test CPU @ 2.0GHz", NProc: 2,
			MemTotalBytes: 24 << 30, MemAvailableBytes: 20 << 30, Kernel: "6.1.0-test", GoVersion: "go1.26.8",
			Redis: "Redis server v=7.0.15", Commit: "abc1234", CPUIdle: "haltpoll, an idle CPU halts at once (guest_halt_poll_ns 0)"},
		Config: Config{Runs: 3, Duration: 4 * time.Second, Warmup: time.Second, Keys: 10000, Distribution: "zipfian",
			RKVServers: 1, BaseSize: 1024, BaseConcurrency: 16, EchoSizes: []int{64, 1024}, Concurrencies: []int{1, 16},
			Sizes: []int{64, 1024}, Arenas: []int{1, 8}, ArenaBytes: 1 << 30,
			Batch: 16, BatchOps: []string{OpMultiGet}, ScaleServers: []int{1, 2, 4},
			CleaningArenas: 2, CleaningArenaBytes: 32 << 20},
		Notes:   []string{"a note from the session"},
		Elapsed: 11*time.Minute + 30*time.Second,
	}
	add := func(p Point, run int, ops float64, p50, p99 float64, extra map[string]float64, errs map[string]int64) {
		n := int64(ops * 4)
		var o loadgen.Options
		if p.Op == OpMultiGet {
			o.BatchSize = 16
		}
		r.Measurements = append(r.Measurements, Measurement{Point: p, Run: run, Result: loadgen.Result{
			Options: o, Ops: n, Seconds: 4, OpsPerS: ops,
			Latency: map[string]loadgen.Latency{p.Op: {Count: n, P50: us(p50), P99: us(p99), Max: us(p99 * 2)}},
			CDF: map[string][]loadgen.Point{p.Op: {{Latency: us(p50 / 2), Fraction: 0.01}, {Latency: us(p50), Fraction: 0.5},
				{Latency: us(p99), Fraction: 0.99}, {Latency: us(p99 * 2), Fraction: 1}}},
			Extra: extra, Errors: errs,
		}})
	}
	for run := 1; run <= 3; run++ {
		f := 1 + 0.01*float64(run) // a little drift per run
		for _, s := range []struct {
			size       int
			rkv, echo  float64
			reads      float64
			putR, putE float64
		}{{64, 30, 25, 1.0, 60, 26}, {1024, 40, 30, 1.5, 70, 31}} {
			g := Point{System: SystemRKV, Op: OpGet, ValueSize: s.size, Concurrency: 1}
			ops := 1e6 / (s.rkv * f)
			rkvExtra, echoExtra := map[string]float64{"rdma_reads": s.reads * ops * 4}, map[string]float64(nil)
			if s.size == 64 { // the CPUs' halts were counted at 64 B only: 1 and 1.5 a GET
				rkvExtra[CPUIdleEntries] = ops * 4
				echoExtra = map[string]float64{CPUIdleEntries: 1.5 * 4e6 / (s.echo * f)}
			}
			add(g, run, ops, s.rkv*f, s.rkv*3, rkvExtra, nil)
			g.System = SystemEcho
			add(g, run, 1e6/(s.echo*f), s.echo*f, s.echo*2, echoExtra, nil)
			pt := Point{System: SystemRKV, Op: OpPut, ValueSize: s.size, Concurrency: 1}
			add(pt, run, 1e6/s.putR, s.putR, s.putR*3, nil, nil)
			pt.System = SystemEcho
			add(pt, run, 1e6/s.putE, s.putE, s.putE*2, nil, nil)
		}
		g := Point{System: SystemRKV, Op: OpGet, ValueSize: 1024, Concurrency: 16}
		add(g, run, 60000*f, 200, 900, map[string]float64{"rdma_reads": 60000 * f * 4}, nil)
		g.System = SystemRedis
		add(g, run, 30000*f, 500, 1500, nil, nil)
		rkvDurable := []float64{900, 900, 1100}[run-1]
		pd := Point{System: SystemRKV, Op: OpPut, ValueSize: 1024, Concurrency: 16, Durable: true}
		add(pd, run, rkvDurable, 15000, 30000, nil, map[string]int64{"timeout": 2})
		pd.System = SystemRedis
		add(pd, run, 1000, 14000, 28000, nil, nil)
		pn := Point{System: SystemRKV, Op: OpPut, ValueSize: 1024, Concurrency: 16}
		add(pn, run, 20000, 700, 2000, nil, nil)
		pn.System = SystemRedis
		add(pn, run, 25000, 600, 1800, nil, nil)
		pc := Point{System: SystemRKV, Op: OpPut, ValueSize: 1024, Concurrency: 16, CrashSafe: true}
		add(pc, run, 20000, 700, 2000, nil, nil)
		pc.System = SystemRedis
		add(pc, run, 22000, 650, 1900, nil, nil)
		// While the cleaner works: 16000 PUTs/s of 1 KiB, the cleaner
		// copying a quarter of a byte per byte PUT.
		pw := Point{System: SystemRKV, Op: OpPut, ValueSize: 1024, Concurrency: 16, Cleaning: true}
		add(pw, run, 16000, 800, 2500, map[string]float64{CleanerMovedBytes: 16000 * 4 * 1024 / 4}, nil)
		pw.System = SystemRedis
		add(pw, run, 25000, 600, 1800, nil, nil)
		// Batches of 16: rkv 5000f MultiGets/s (2 READs a key), Redis 4000f
		// pipelines/s.
		mg := Point{System: SystemRKV, Op: OpMultiGet, ValueSize: 1024, Concurrency: 16}
		add(mg, run, 5000*f, 3000, 9000, map[string]float64{"rdma_reads": 5000 * f * 4 * 16 * 2}, nil)
		mg.System = SystemRedis
		add(mg, run, 4000*f, 4000, 8000, nil, nil)
		// 2 and 4 server processes each (1 is the standard points above).
		for _, s := range []struct {
			n                                  int
			rkvGet, redisGet, rkvPut, redisPut float64
		}{{2, 50000, 40000, 15000, 30000}, {4, 45000, 38000, 12000, 28000}} {
			for _, x := range []struct {
				sys, op string
				ops     float64
			}{{SystemRKV, OpGet, s.rkvGet}, {SystemRedis, OpGet, s.redisGet}, {SystemRKV, OpPut, s.rkvPut}, {SystemRedis, OpPut, s.redisPut}} {
				add(Point{System: x.sys, Op: x.op, ValueSize: 1024, Concurrency: 16, Servers: s.n}, run, x.ops*f, 300, 1000, nil, nil)
			}
		}
		for _, n := range []int{1, 8} {
			reg := time.Duration(n) * 150 * time.Millisecond
			r.Registrations = append(r.Registrations, Registration{Run: run, Arenas: n, ArenaBytes: 1 << 30, Fresh: true,
				Ready: 40 * time.Millisecond, FirstArena: 300 * time.Millisecond, FirstGet: 100 * time.Millisecond, Registered: 4 * reg},
				Registration{Run: run, Arenas: n, ArenaBytes: 1 << 30, Cold: true,
					Ready: 30 * time.Millisecond, FirstArena: 60 * time.Millisecond, FirstGet: 100 * time.Millisecond, Registered: reg + 50*time.Millisecond},
				Registration{Run: run, Arenas: n, ArenaBytes: 1 << 30,
					Ready: 30 * time.Millisecond, FirstArena: 40 * time.Millisecond, FirstGet: 100 * time.Millisecond, Registered: 120 * time.Millisecond})
		}
	}
	return r
}

func load(t *testing.T) *Results {
	t.Helper()
	path := filepath.Join("testdata", "results.json")
	if *update {
		if err := fixture().Save(path); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want Stat
	}{
		{nil, Stat{}},
		{[]float64{3}, Stat{3, 3, 3, 1}},
		{[]float64{5, 1, 3}, Stat{3, 1, 5, 3}},
		{[]float64{4, 1, 2, 10}, Stat{3, 1, 10, 4}},
	} {
		if got := Summarize(c.xs); got != c.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", c.xs, got, c.want)
		}
	}
}

func TestRatioPairsRuns(t *testing.T) {
	a := Point{System: SystemRKV, Op: OpGet, ValueSize: 1, Concurrency: 1}
	b := a
	b.System = SystemRedis
	r := &Results{Measurements: []Measurement{
		{Point: a, Run: 1, Result: loadgen.Result{OpsPerS: 10}},
		{Point: a, Run: 2, Result: loadgen.Result{OpsPerS: 30}},
		{Point: b, Run: 2, Result: loadgen.Result{OpsPerS: 10}},
		{Point: b, Run: 3, Result: loadgen.Result{OpsPerS: 1}},
	}}
	// Only run 2 has both: 30/10.
	if got := r.Ratio(a, b, Throughput); got != (Stat{3, 3, 3, 1}) {
		t.Fatalf("Ratio = %+v, want 3 from run 2 alone", got)
	}
}

func TestTargets(t *testing.T) {
	v := BuildView(load(t))
	want := map[string]string{
		"warm GET p50, rkv / raw TCP echo, 64 B, concurrency 1":                                     "**met**",
		"warm GET p50, rkv / raw TCP echo, 1 KiB, concurrency 1":                                    "**not met**",
		"GET throughput, rkv / Redis, 1 KiB, concurrency 16":                                        "**met**",
		"PUT throughput at equal durability (fsync before ack), rkv / Redis, 1 KiB, concurrency 16": "**not met** (median; met in some runs)",
		"PUT throughput without fsync, rkv / Redis, 1 KiB, concurrency 16":                          "**not met**",
		"MultiGet of 16 / Redis pipelined 16, keys/s, 1 KiB, concurrency 16":                        "**met**",
		"time to first GET / total registration time, 8 arenas of 1 GiB, fresh start":               "**met**",
		"time to first GET / total registration time, 8 arenas of 1 GiB, cold start":                "**met**",
		"time to first GET / total registration time, 8 arenas of 1 GiB, warm start":                "**not met**",
	}
	if len(v.Targets) != len(want) {
		t.Errorf("%d targets, want %d: %+v", len(v.Targets), len(want), v.Targets)
	}
	for _, tg := range v.Targets {
		w, ok := want[tg.Name]
		if !ok {
			t.Errorf("unexpected target %q", tg.Name)
			continue
		}
		if tg.Verdict() != w {
			t.Errorf("%s: %s (measured %+v), want %s", tg.Name, tg.Verdict(), tg.Measured, w)
		}
	}
	// GET ratio: 60000f / 30000f = 2 in every run.
	for _, tg := range v.Targets {
		if strings.HasPrefix(tg.Name, "GET throughput") && (tg.Measured.Median != 2 || tg.Measured.N != 3) {
			t.Errorf("GET throughput ratio %+v, want 2 over 3 runs", tg.Measured)
		}
	}
}

func TestRender(t *testing.T) {
	r := load(t)
	dir := t.TempDir()
	plots, err := WritePlots(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 6 {
		t.Fatalf("wrote %v, want all 6 plots", plots)
	}
	for _, p := range plots {
		f, err := os.Open(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := png.DecodeConfig(f)
		f.Close()
		if err != nil || cfg.Width < 400 || cfg.Height < 200 {
			t.Fatalf("%s: %+v, %v: not a plot-sized PNG", p, cfg, err)
		}
	}
	var b bytes.Buffer
	if err := Render(&b, r, RenderOptions{Plots: plots, ResultsFile: "bench/results.json"}); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"Test CPU @ 2.0GHz, 2 CPUs, 24 GiB of memory",
		"Redis server v=7.0.15",
		"| 1 KiB | get | 40.8 µs (40.4–41.2) | 30.6 µs (30.3–30.9) | 1.33× |",
		// The CPUs' halts per GET where counted, a dash where not.
		"| 1.00 | 1.00 / 1.50 |\n| 64 B | put |",
		"| 1.50 | – / – |\n| 1 KiB | put |",
		"CPU idle: haltpoll, an idle CPU halts at once (guest_halt_poll_ns 0).",
		"| GET | 61.2k (60.6–61.8) | 30.6k (30.3–30.9) | 2.00× |",
		// The crash-safe row informs: it is no target (TestTargets).
		"| PUT, safe from a process crash (rkv sync=none, Redis appendfsync no) | 20.0k | 22.0k | 0.909× |",
		// So does the row measured while the cleaner works, with what it
		// cost against the row without.
		"| PUT, not durable, while rkv's cleaner works (small arenas) | 16.0k | 25.0k | 0.640× |",
		"it copied 0.250 bytes of live records for every byte of value PUT, and\nrkv did 0.800× the PUTs/s",
		"the cluster has\n  2 arenas of 32 MiB",
		"| 8 | 8 GiB | fresh | 40.0 ms | 300 ms | 100 ms | 4.80 s | 0.0208× |",
		"| 8 | 8 GiB | cold | 30.0 ms | 60.0 ms | 100 ms | 1.25 s | 0.0800× |",
		"| 8 | 8 GiB | warm | 30.0 ms | 40.0 ms | 100 ms | 120 ms | 0.833× |",
		"![GET latency CDF](bench/cdf-get.png)",
		"![GET throughput against concurrency](bench/throughput-concurrency.png)",
		"rkv put 1024B c=16 durable: 6 timeout",
		"a note from the session",
		"Not run in this session",
		"| 64 B | 32.7k (32.4–33.0) |",
		// Batches in keys/s: 5000f and 4000f batches of 16, 2 READs a key.
		"| MultiGet of 16 / pipeline of 16 GETs | 81.6k (80.8–82.4) | 65.3k (64.6–65.9) | 1.25× | 3.00 ms | 4.00 ms | 9.00 ms | 8.00 ms | 2.00 |",
		"rkv's `MultiGet` of 16 keys against a Redis pipeline of 16 GETs",
		// Server processes: 1 is the standard GET and non-durable PUT.
		"| 1 | 61.2k (60.6–61.8) | 30.6k (30.3–30.9) | 2.00× | 20.0k | 25.0k | 0.800× |",
		"| 4 | 45.9k (45.5–46.4) | 38.8k (38.4–39.1) | 1.18× | 12.2k (12.1–12.4) | 28.6k (28.3–28.8) | 0.429× |",
		"![throughput against server processes](bench/throughput-servers.png)",
		"more server processes mostly share the same 2 CPUs",
		"the hottest of the 10000 zipfian keys alone\ndraws 9.8% of them",
		"This session took 11 min 30 s\n(28 points x 3 runs",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(md, "<no value>") || strings.Contains(md, "%!") {
		t.Errorf("report has template or format debris:\n%s", md)
	}
	if t.Failed() {
		t.Log(md)
	}
	// The rxe section takes the VM's file when there is one.
	b.Reset()
	if err := Render(&b, r, RenderOptions{RXE: "measured in the VM\n"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "## On Soft-RoCE (rxe)\n\nmeasured in the VM") || strings.Contains(b.String(), "Not run in this session") {
		t.Errorf("rxe section without its file's contents:\n%s", b.String())
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtDur(12.345e-6), "12.3 µs"}, {fmtDur(0.0015), "1.50 ms"}, {fmtDur(2), "2.00 s"}, {fmtDur(345e-6), "345 µs"},
		{fmtRate(61234), "61.2k"}, {fmtRate(1.5e6), "1.50M"}, {fmtRate(900), "900"},
		{fmtSize(64), "64 B"}, {fmtSize(1024), "1 KiB"}, {fmtSize(1 << 20), "1 MiB"}, {fmtSize(1536), "1.5 KiB"},
		{fmtStat(Stat{2, 1, 3, 3}, ratioUnit), "2.00× (1.00–3.00)"}, {fmtStat(Stat{}, ratioUnit), "–"},
		{fmtStat(Stat{2e-3, 0.5e-3, 3e-3, 3}, durUnit), "2.00 ms (0.500–3.00)"}, {fmtStat(Stat{1, 0.9999, 1.0001, 3}, plainUnit), "1.00"}, {sig3(0.012345), "0.0123"}, {sig3(99.96), "100"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// Results from before the batched and scaling comparisons and the fresh
// starts render without them, and without debris.
func TestRenderOlderResults(t *testing.T) {
	r := load(t)
	r.Config.Batch, r.Config.BatchOps, r.Config.ScaleServers, r.Elapsed = 0, nil, nil, 0
	r.Registrations = slices.DeleteFunc(r.Registrations, func(g Registration) bool { return g.Fresh })
	plots, err := WritePlots(r, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(plots, "throughput-servers.png") || len(plots) != 5 {
		t.Errorf("plots %v, want the 5 of the older comparisons", plots)
	}
	var b bytes.Buffer
	if err := Render(&b, r, RenderOptions{Plots: plots}); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, absent := range []string{"MultiGet", "pipelined", "**Batches.**", "**Server processes.**", "against server processes", "This session took", "| fresh |", "<no value>", "%!"} {
		if strings.Contains(md, absent) {
			t.Errorf("report of older results has %q:\n%s", absent, md)
		}
	}
	if v := BuildView(r); len(v.Targets) != 7 {
		t.Errorf("%d targets, want the 7 older ones", len(v.Targets))
	}
}

func TestScaledPoints(t *testing.T) {
	c := Config{RKVServers: 1, BaseSize: 1024, BaseConcurrency: 16}
	// One server each is the standard point; more are points of their own.
	if p := ScaledPoint(c, SystemRedis, OpGet, 1); p != (Point{System: SystemRedis, Op: OpGet, ValueSize: 1024, Concurrency: 16}) {
		t.Errorf("1 server: %+v, want the standard point", p)
	}
	if p := ScaledPoint(c, SystemRKV, OpPut, 4); p.Servers != 4 || p.String() != "rkv put 1024B c=16 on 4" {
		t.Errorf("4 servers: %+v (%s)", p, p)
	}
	// With a standard rkv cluster of 2, one of each is not the standard.
	c.RKVServers = 2
	if p := ScaledPoint(c, SystemRKV, OpGet, 1); p.Servers != 1 {
		t.Errorf("1 server with 2 standard rkv-servers: %+v", p)
	}
	m := Measurement{Point: Point{Op: OpMultiGet}, Result: loadgen.Result{OpsPerS: 10, Options: loadgen.Options{BatchSize: 16},
		Latency: map[string]loadgen.Latency{OpMultiGet: {Count: 40}}, Extra: map[string]float64{"rdma_reads": 960}}}
	if KeysPerS(m) != 160 || ReadsPerKey(m) != 1.5 {
		t.Errorf("batch of 16: %v keys/s, %v READs/key; want 160 and 1.5", KeysPerS(m), ReadsPerKey(m))
	}
	m.Op = OpGet
	if KeysPerS(m) != 10 {
		t.Errorf("GET: %v keys/s, want 10", KeysPerS(m))
	}
}

// A session that measured only some parts plots only those.
func TestWritePlotsPartial(t *testing.T) {
	r := load(t)
	r.Measurements = nil
	plots, err := WritePlots(r, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) != 1 || plots[0] != "registration.png" {
		t.Fatalf("plots of a registration-only session: %v", plots)
	}
	var b bytes.Buffer
	if err := Render(&b, r, RenderOptions{Plots: plots}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "_(not measured in this session)_") {
		t.Errorf("empty tables not marked as such:\n%s", b.String())
	}
}
