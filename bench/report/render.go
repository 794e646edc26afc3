// Rendering docs/BENCHMARKS.md: tables of medians and spreads, the targets, from a template.

package report

import (
	_ "embed"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/rkv-io/rkv/loadgen"
)

//go:embed BENCHMARKS.md.tmpl
var markdownTemplate string

// Table is a markdown table.
type Table struct {
	Header []string
	Rows   [][]string
}

// Markdown renders t as a GitHub-flavoured markdown table.
func (t Table) Markdown() string {
	if len(t.Rows) == 0 {
		return "_(not measured in this session)_\n"
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	line(t.Header)
	sep := make([]string, len(t.Header))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "---:"
		}
	}
	line(sep)
	for _, r := range t.Rows {
		line(r)
	}
	return b.String()
}

// Target is one of the performance targets with its measured ratio.
type Target struct {
	Name     string // what is compared
	Want     string // the target, e.g. "≤ 1.25×"
	Measured Stat   // the ratio, within runs
	Met      bool   // the median meets the target
	// Always: every run meets it (the spread does not cross the line);
	// Some: at least one run does.
	Always, Some bool
}

// Verdict is "met", "not met", or says that only the median met it.
func (t Target) Verdict() string {
	switch {
	case t.Measured.N == 0:
		return "not measured"
	case t.Met && t.Always:
		return "**met**"
	case t.Met:
		return "**met** (median; not in every run)"
	case t.Some:
		return "**not met** (median; met in some runs)"
	}
	return "**not met**"
}

// target evaluates a ratio against a bound: at most (le) or at least.
func target(name string, s Stat, bound float64, le bool) Target {
	op := "≥"
	ok := func(x float64) bool { return x >= bound }
	if le {
		op = "≤"
		ok = func(x float64) bool { return x <= bound }
	}
	return Target{Name: name, Want: fmt.Sprintf("%s %s×", op, trimFloat(bound)), Measured: s,
		Met: s.N > 0 && ok(s.Median), Always: s.N > 0 && ok(s.Min) && ok(s.Max), Some: s.N > 0 && (ok(s.Min) || ok(s.Max))}
}

// RenderOptions configure Render.
type RenderOptions struct {
	// PlotDir is the plots' directory relative to the markdown file.
	// Default "bench".
	PlotDir string
	// Plots lists the plot files written (base names), embedded when
	// present.
	Plots []string
	// RXE is the contents of docs/bench/rxe.md, if it exists.
	RXE string
	// ResultsFile is the raw JSON's path relative to the markdown file.
	ResultsFile string
}

// View is what the template renders.
type View struct {
	R                                     *Results
	Env                                   Env
	Config                                Config
	Targets                               []Target
	Echo, Redis, Registration, Conc, Size Table
	Batch, Servers                        Table
	Errors                                []string
	// Points is the configurations measured, each in every run.
	Points int
	// BatchDescs say what each batched comparison compares.
	BatchDescs []string
	// Cleaning is the PUT point measured while rkv's cleaner works, if
	// there is one.
	Cleaning *Cleaning
	// MaxServers is the most server processes of comparison 4.
	MaxServers int
	// HottestShare is the percentage of the operations that go to the
	// hottest key under the zipfian distribution (0 under another).
	HottestShare float64
	Plots        map[string]string // base name without .png -> path
	RXE          string
	ResultsFile  string
	MaxArenas    int
}

// Cleaning is what rkv's cleaner cost the PUT point measured while it
// works (Point.Cleaning).
type Cleaning struct {
	// Moved is the bytes the cleaner copied per byte of value PUT.
	Moved string
	// Throughput is the point's PUTs/s over those of the same PUTs on
	// arenas the point never fills, run by run.
	Throughput string
}

// Render writes the markdown report for r.
func Render(w io.Writer, r *Results, opts RenderOptions) error {
	if opts.PlotDir == "" {
		opts.PlotDir = "bench"
	}
	v := BuildView(r)
	v.RXE = strings.TrimSpace(opts.RXE)
	v.ResultsFile = opts.ResultsFile
	v.Plots = map[string]string{}
	for _, p := range opts.Plots {
		v.Plots[strings.TrimSuffix(p, ".png")] = opts.PlotDir + "/" + p
	}
	t, err := template.New("BENCHMARKS.md").Funcs(template.FuncMap{
		"dur":     func(d time.Duration) string { return fmtDur(d.Seconds()) },
		"elapsed": fmtElapsed,
		"bytes":   fmtBytes,
		"membytes": func(n any) string {
			switch x := n.(type) {
			case uint64:
				return fmtBytes(int64(x))
			case int64:
				return fmtBytes(x)
			}
			return fmt.Sprint(n)
		},
		"size": fmtSize,
		"ints": joinInts,
		"sizes": func(xs []int) string {
			var s []string
			for _, x := range xs {
				s = append(s, fmtSize(x))
			}
			return strings.Join(s, ", ")
		},
	}).Parse(markdownTemplate)
	if err != nil {
		return fmt.Errorf("parsing the report template: %w", err)
	}
	if err := t.Execute(w, v); err != nil {
		return fmt.Errorf("rendering the report: %w", err)
	}
	return nil
}

// BuildView computes the tables and targets of r.
func BuildView(r *Results) View {
	c := r.Config
	v := View{R: r, Env: r.Env, Config: c}
	if c.Distribution == loadgen.Zipfian && c.Keys > 0 {
		// loadgen's zipfian draws rank k with probability k^-θ / ζ(Keys, θ).
		zeta := 0.0
		for k := 1; k <= c.Keys; k++ {
			zeta += math.Pow(float64(k), -loadgen.DefaultTheta)
		}
		v.HottestShare = 100 / zeta
	}
	rkv := func(op string, size, conc int, durable bool) Point {
		return Point{System: SystemRKV, Op: op, ValueSize: size, Concurrency: conc, Durable: durable}
	}
	other := func(sys string, p Point) Point { p.System = sys; return p }

	// 1. rkv against the echo, concurrency 1.
	v.Echo.Header = []string{"size", "op", "rkv p50", "echo p50", "p50 ratio", "rkv p99", "echo p99", "p99 ratio", "READs/GET", "CPU idles/op, rkv / echo"}
	for _, size := range c.EchoSizes {
		for _, op := range []string{OpGet, OpPut} {
			a := rkv(op, size, 1, false)
			b := other(SystemEcho, a)
			if len(r.Runs(a)) == 0 {
				continue
			}
			reads := "–"
			if op == OpGet {
				reads = fmtStat(r.Stat(a, ReadsPerGet), plainUnit)
			}
			ratio := r.Ratio(a, b, P50)
			v.Echo.Rows = append(v.Echo.Rows, []string{fmtSize(size), op,
				fmtStat(r.Stat(a, P50), durUnit), fmtStat(r.Stat(b, P50), durUnit), fmtStat(ratio, ratioUnit),
				fmtStat(r.Stat(a, P99), durUnit), fmtStat(r.Stat(b, P99), durUnit), fmtStat(r.Ratio(a, b, P99), ratioUnit), reads,
				fmtIdles(r.Stat(a, IdleEntriesPerOp)) + " / " + fmtIdles(r.Stat(b, IdleEntriesPerOp))})
			if op == OpGet {
				v.Targets = append(v.Targets, target(fmt.Sprintf("warm GET p50, rkv / raw TCP echo, %s, concurrency 1", fmtSize(size)), ratio, 1.25, true))
			}
		}
	}

	// 2. rkv against Redis.
	v.Redis.Header = []string{"operation", "rkv ops/s", "Redis ops/s", "ratio", "rkv p50", "Redis p50", "rkv p99", "Redis p99"}
	rows := []struct {
		name               string
		op                 string
		durable, crashSafe bool
		cleaning           bool
		target             string // none: the row informs, it has no target
	}{
		{"GET", OpGet, false, false, false, "GET throughput, rkv / Redis"},
		{"PUT, durable (rkv sync=always, Redis appendfsync always)", OpPut, true, false, false, "PUT throughput at equal durability (fsync before ack), rkv / Redis"},
		{"PUT, not durable (rkv sync=none, Redis appendonly no)", OpPut, false, false, false, "PUT throughput without fsync, rkv / Redis"},
		{"PUT, safe from a process crash (rkv sync=none, Redis appendfsync no)", OpPut, false, true, false, ""},
		{"PUT, not durable, while rkv's cleaner works (small arenas)", OpPut, false, false, true, ""},
	}
	for _, row := range rows {
		a := rkv(row.op, c.BaseSize, c.BaseConcurrency, row.durable)
		a.CrashSafe, a.Cleaning = row.crashSafe, row.cleaning
		b := other(SystemRedis, a)
		if len(r.Runs(a)) == 0 {
			continue
		}
		ratio := r.Ratio(a, b, Throughput)
		v.Redis.Rows = append(v.Redis.Rows, []string{row.name,
			fmtStat(r.Stat(a, Throughput), rateUnit), fmtStat(r.Stat(b, Throughput), rateUnit), fmtStat(ratio, ratioUnit),
			fmtStat(r.Stat(a, P50), durUnit), fmtStat(r.Stat(b, P50), durUnit),
			fmtStat(r.Stat(a, P99), durUnit), fmtStat(r.Stat(b, P99), durUnit)})
		if row.cleaning {
			plain := a
			plain.Cleaning = false
			v.Cleaning = &Cleaning{Moved: fmtStat(r.Stat(a, CleanerMovedPerPut), plainUnit),
				Throughput: fmtStat(r.Ratio(a, plain, Throughput), ratioUnit)}
		}
		if row.target == "" {
			continue
		}
		bound := 1.0
		if row.op == OpGet {
			bound = 1.5
		}
		v.Targets = append(v.Targets, target(fmt.Sprintf("%s, %s, concurrency %d", row.target, fmtSize(c.BaseSize), c.BaseConcurrency), ratio, bound, false))
	}

	// 2b. Batches against Redis pipelines of as many commands, in keys/s.
	v.Batch.Header = []string{"operation", "rkv keys/s", "Redis keys/s", "ratio", "rkv p50", "Redis p50", "rkv p99", "Redis p99", "rkv READs/key"}
	for _, op := range c.BatchOps {
		a := rkv(op, c.BaseSize, c.BaseConcurrency, false)
		b := other(SystemRedis, a)
		if len(r.Runs(a)) == 0 {
			continue
		}
		names, ok := batchNames[op]
		if !ok {
			names = [2]string{op, op}
		}
		v.BatchDescs = append(v.BatchDescs, fmt.Sprintf("rkv's `%s` of %d keys against a Redis pipeline of %d %ss", names[0], c.Batch, c.Batch, names[1]))
		reads := "–"
		if op == OpMultiGet {
			reads = fmtStat(r.Stat(a, ReadsPerKey), plainUnit)
		}
		ratio := r.Ratio(a, b, KeysPerS)
		v.Batch.Rows = append(v.Batch.Rows, []string{fmt.Sprintf("%s of %d / pipeline of %d %ss", names[0], c.Batch, c.Batch, names[1]),
			fmtStat(r.Stat(a, KeysPerS), rateUnit), fmtStat(r.Stat(b, KeysPerS), rateUnit), fmtStat(ratio, ratioUnit),
			fmtStat(r.Stat(a, P50), durUnit), fmtStat(r.Stat(b, P50), durUnit),
			fmtStat(r.Stat(a, P99), durUnit), fmtStat(r.Stat(b, P99), durUnit), reads})
		if bound, ok := batchTargets[op]; ok {
			v.Targets = append(v.Targets, target(fmt.Sprintf("%s of %d / Redis pipelined %d, keys/s, %s, concurrency %d",
				names[0], c.Batch, c.Batch, fmtSize(c.BaseSize), c.BaseConcurrency), ratio, bound, false))
		}
	}

	// 3. Registration.
	v.Registration.Header = []string{"arenas", "memory", "start", "ready", "first arena registered", "first GET", "all registered (sync. baseline)", "first GET / all registered"}
	firstOverAll := func(g Registration) float64 { return g.FirstGet.Seconds() / g.Registered.Seconds() }
	for _, n := range c.Arenas {
		for _, start := range Starts {
			ratio := r.RegistrationStat(n, start, firstOverAll)
			if ratio.N == 0 {
				continue // a start older results did not measure
			}
			v.MaxArenas = n
			v.Registration.Rows = append(v.Registration.Rows, []string{fmt.Sprint(n), fmtBytes(int64(n) * c.ArenaBytes), string(start),
				fmtStat(r.RegistrationStat(n, start, func(g Registration) float64 { return g.Ready.Seconds() }), durUnit),
				fmtStat(r.RegistrationStat(n, start, func(g Registration) float64 { return g.FirstArena.Seconds() }), durUnit),
				fmtStat(r.RegistrationStat(n, start, func(g Registration) float64 { return g.FirstGet.Seconds() }), durUnit),
				fmtStat(r.RegistrationStat(n, start, func(g Registration) float64 { return g.Registered.Seconds() }), durUnit),
				fmtStat(ratio, ratioUnit)})
		}
	}
	if n := v.MaxArenas; n > 0 {
		for _, start := range Starts {
			if ratio := r.RegistrationStat(n, start, firstOverAll); ratio.N > 0 {
				v.Targets = append(v.Targets, target(fmt.Sprintf("time to first GET / total registration time, %d arenas of %s, %s start",
					n, fmtBytes(c.ArenaBytes), start), ratio, 0.125, true))
			}
		}
	}

	// 4. Scaling.
	v.Conc.Header = []string{"concurrency", "rkv GET ops/s", "Redis GET ops/s", "ratio", "rkv p99", "Redis p99"}
	for _, n := range c.Concurrencies {
		a := rkv(OpGet, c.BaseSize, n, false)
		b := other(SystemRedis, a)
		if len(r.Runs(a)) == 0 {
			continue
		}
		v.Conc.Rows = append(v.Conc.Rows, []string{fmt.Sprint(n),
			fmtStat(r.Stat(a, Throughput), rateUnit), fmtStat(r.Stat(b, Throughput), rateUnit), fmtStat(r.Ratio(a, b, Throughput), ratioUnit),
			fmtStat(r.Stat(a, P99), durUnit), fmtStat(r.Stat(b, P99), durUnit)})
	}
	v.Size.Header = []string{"value size", "rkv GET ops/s", "MiB/s", "p50", "p99", "READs/GET"}
	for _, size := range c.Sizes {
		a := rkv(OpGet, size, 1, false)
		if len(r.Runs(a)) == 0 {
			continue
		}
		mib := func(m Measurement) float64 { return m.Result.OpsPerS * float64(size) / (1 << 20) }
		v.Size.Rows = append(v.Size.Rows, []string{fmtSize(size),
			fmtStat(r.Stat(a, Throughput), rateUnit), fmtStat(r.Stat(a, mib), plainUnit),
			fmtStat(r.Stat(a, P50), durUnit), fmtStat(r.Stat(a, P99), durUnit), fmtStat(r.Stat(a, ReadsPerGet), plainUnit)})
	}

	// Server processes, each system's keys spread over them.
	v.Servers.Header = []string{"servers", "rkv GET ops/s", "Redis GET ops/s", "GET ratio", "rkv PUT ops/s", "Redis PUT ops/s", "PUT ratio"}
	for _, n := range c.ScaleServers {
		row := []string{fmt.Sprint(n)}
		measured := false
		for _, op := range []string{OpGet, OpPut} {
			a := ScaledPoint(c, SystemRKV, op, n)
			b := ScaledPoint(c, SystemRedis, op, n)
			measured = measured || len(r.Runs(a)) > 0
			row = append(row, fmtStat(r.Stat(a, Throughput), rateUnit), fmtStat(r.Stat(b, Throughput), rateUnit), fmtStat(r.Ratio(a, b, Throughput), ratioUnit))
		}
		if measured {
			v.Servers.Rows = append(v.Servers.Rows, row)
			v.MaxServers = max(v.MaxServers, n)
		}
	}

	// Errors, by point.
	seen := map[Point]bool{}
	for _, m := range r.Measurements {
		if seen[m.Point] {
			continue
		}
		seen[m.Point] = true
		v.Points++
		errs := r.Errors(m.Point)
		var kinds []string
		for k, n := range errs {
			if n > 0 {
				kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
			}
		}
		if len(kinds) > 0 {
			sort.Strings(kinds)
			v.Errors = append(v.Errors, fmt.Sprintf("%s: %s", m.Point, strings.Join(kinds, ", ")))
		}
	}
	return v
}

// batchNames name a batched operation for rkv and the command Redis
// pipelines for it.
var batchNames = map[string][2]string{OpMultiGet: {"MultiGet", "GET"}, OpMultiPut: {"MultiPut", "SET"}}

// batchTargets are the targets of the batched operations' keys/s, rkv /
// Redis.
var batchTargets = map[string]float64{OpMultiGet: 1}

// ScaledPoint is comparison 4's point of sys's op (c.BaseSize,
// c.BaseConcurrency, not durable) on n server processes of each system.
func ScaledPoint(c Config, sys, op string, n int) Point {
	return Point{System: sys, Op: op, ValueSize: c.BaseSize, Concurrency: c.BaseConcurrency, Servers: ScaledServers(c.RKVServers, n)}
}

// Formatting.

func fmtStat(s Stat, f unitFormat) string {
	if s.N == 0 {
		return "–"
	}
	m, unit := f(s.Median, s.Median)
	lo, _ := f(s.Min, s.Median)
	hi, _ := f(s.Max, s.Median)
	if s.N == 1 || lo == hi {
		return m + unit
	}
	return fmt.Sprintf("%s%s (%s–%s)", m, unit, lo, hi)
}

// unitFormat formats x in the unit that suits ref (so a spread shares
// its median's unit), returning the number and the unit.
type unitFormat func(x, ref float64) (num, unit string)

// fmtElapsed formats a session's length: 42 s, 11 min 30 s.
func fmtElapsed(d time.Duration) string {
	d = d.Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%d s", int(d.Seconds()))
	}
	return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
}

// fmtDur formats seconds in µs, ms or s with three significant digits.
func fmtDur(sec float64) string { n, u := durUnit(sec, sec); return n + u }

func durUnit(sec, ref float64) (string, string) {
	switch {
	case ref < 1e-3:
		return sig3(sec * 1e6), " µs"
	case ref < 1:
		return sig3(sec * 1e3), " ms"
	}
	return sig3(sec), " s"
}

func fmtRate(x float64) string { n, u := rateUnit(x, x); return n + u }

func rateUnit(x, ref float64) (string, string) {
	switch {
	case ref >= 1e6:
		return sig3(x / 1e6), "M"
	case ref >= 1e3:
		return sig3(x / 1e3), "k"
	}
	return sig3(x), ""
}

func fmtRatio(x float64) string { return sig3(x) + "×" }

func ratioUnit(x, _ float64) (string, string) { return sig3(x), "×" }

func plainUnit(x, _ float64) (string, string) { return sig3(x), "" }

// fmtIdles formats CPU idles per operation: the median to two decimals,
// which says whether a system let the CPUs halt about once a request or
// hardly ever, without the spread that would crowd the column.
func fmtIdles(s Stat) string {
	if s.N == 0 {
		return "–"
	}
	return strconv.FormatFloat(s.Median, 'f', 2, 64)
}

// sig3 formats x with three significant digits (no exponent).
func sig3(x float64) string {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 3, 64), 64)
	a := math.Abs(r)
	switch {
	case a == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(r, 'f', 0, 64)
	}
	return strconv.FormatFloat(r, 'f', 2-int(math.Floor(math.Log10(a))), 64)
}

func trimFloat(x float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", x), "0"), ".")
}

// fmtSize formats a value size: 64 B, 1 KiB, 64 KiB, 1 MiB.
func fmtSize(n int) string { return fmtBytes(int64(n)) }

func fmtBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	x, u := float64(n), 0
	for x >= 1024 && u < len(units)-1 {
		x /= 1024
		u++
	}
	if x == math.Trunc(x) {
		return fmt.Sprintf("%.0f %s", x, units[u])
	}
	return fmt.Sprintf("%.1f %s", x, units[u])
}

func joinInts(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, ", ")
}
