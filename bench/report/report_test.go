// Tests of the summaries, the report and the plots, from a fixed results file.

package report

import (
	"bytes"
	"flag"
	"image/png"
	"os"
	"path/filepath"
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
			Redis: "Redis server v=7.0.15", Commit: "abc1234"},
		Config: Config{Runs: 3, Duration: 4 * time.Second, Warmup: time.Second, Keys: 10000, Distribution: "zipfian",
			RKVServers: 1, BaseSize: 1024, BaseConcurrency: 16, EchoSizes: []int{64, 1024}, Concurrencies: []int{1, 16},
			Sizes: []int{64, 1024}, Arenas: []int{1, 8}, ArenaBytes: 1 << 30},
		Notes: []string{"a note from the session"},
	}
	add := func(p Point, run int, ops float64, p50, p99 float64, extra map[string]float64, errs map[string]int64) {
		n := int64(ops * 4)
		r.Measurements = append(r.Measurements, Measurement{Point: p, Run: run, Result: loadgen.Result{
			Ops: n, Seconds: 4, OpsPerS: ops,
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
			add(g, run, ops, s.rkv*f, s.rkv*3, map[string]float64{"rdma_reads": s.reads * ops * 4}, nil)
			g.System = SystemEcho
			add(g, run, 1e6/(s.echo*f), s.echo*f, s.echo*2, nil, nil)
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
		for _, n := range []int{1, 8} {
			reg := time.Duration(n) * 150 * time.Millisecond
			r.Registrations = append(r.Registrations, Registration{Run: run, Arenas: n, ArenaBytes: 1 << 30, Cold: true,
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
	if len(plots) != 5 {
		t.Fatalf("wrote %v, want all 5 plots", plots)
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
		"| GET | 61.2k (60.6–61.8) | 30.6k (30.3–30.9) | 2.00× |",
		"| 8 | 8 GiB | cold | 30.0 ms | 60.0 ms | 100 ms | 1.25 s | 0.0800× |",
		"| 8 | 8 GiB | warm | 30.0 ms | 40.0 ms | 100 ms | 120 ms | 0.833× |",
		"![GET latency CDF](bench/cdf-get.png)",
		"![GET throughput against concurrency](bench/throughput-concurrency.png)",
		"rkv put 1024B c=16 durable: 6 timeout",
		"a note from the session",
		"Not run in this session",
		"| 64 B | 32.7k (32.4–33.0) |",
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
