// PNG plots of a session's results, with gonum/plot.

package report

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Colors of the systems, the same in every plot.
var (
	colorRKV   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colorRedis = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colorEcho  = color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}
	colorExtra = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
)

// WritePlots renders every plot r has data for into dir and returns the
// base names of the files written.
func WritePlots(r *Results, dir string) ([]string, error) {
	plots := []struct {
		name string
		make func(*Results) (*plot.Plot, error)
	}{
		{"cdf-get.png", plotCDFGet},
		{"cdf-put.png", plotCDFPut},
		{"throughput-concurrency.png", plotConcurrency},
		{"throughput-servers.png", plotServers},
		{"latency-size.png", plotSize},
		{"registration.png", plotRegistration},
	}
	var written []string
	for _, pl := range plots {
		p, err := pl.make(r)
		if errors.Is(err, errNoData) {
			continue
		}
		if err != nil {
			return written, fmt.Errorf("plot %s: %w", pl.name, err)
		}
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, pl.name)); err != nil {
			return written, fmt.Errorf("saving plot %s: %w", pl.name, err)
		}
		written = append(written, pl.name)
	}
	return written, nil
}

var errNoData = errors.New("no data")

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p
}

// logAxis makes a a log axis with ticks at powers of 10 and labels
// without exponents.
func logAxis(a *plot.Axis) {
	a.Scale = plot.LogScale{}
	a.Tick.Marker = plot.LogTicks{Prec: -1}
}

// pow2Axis makes a a log2 axis with a tick at each of xs.
func pow2Axis(a *plot.Axis, xs []int, label func(int) string) {
	a.Scale = plot.LogScale{}
	var ticks plot.ConstantTicks
	for _, x := range xs {
		ticks = append(ticks, plot.Tick{Value: float64(x), Label: label(x)})
	}
	a.Tick.Marker = ticks
}

func addLine(p *plot.Plot, name string, xys plotter.XYs, c color.Color, dashed, points bool) error {
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	}
	p.Add(l)
	if points {
		s, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		s.Color = c
		s.Shape = draw.CircleGlyph{}
		p.Add(s)
	}
	p.Legend.Add(name, l)
	return nil
}

// spread is medians with min-max error bars.
type spread struct {
	plotter.XYs
	plotter.YErrors
}

// hasData reports whether any of ss summarizes a run.
func hasData(ss ...[]Stat) bool {
	for _, s := range ss {
		for _, x := range s {
			if x.N > 0 {
				return true
			}
		}
	}
	return false
}

func addSpread(p *plot.Plot, name string, xs []float64, ss []Stat, c color.Color, dashed bool) error {
	var sp spread
	for i, s := range ss {
		if s.N == 0 {
			continue
		}
		sp.XYs = append(sp.XYs, plotter.XY{X: xs[i], Y: s.Median})
		sp.YErrors = append(sp.YErrors, struct{ Low, High float64 }{s.Median - s.Min, s.Max - s.Median})
	}
	if len(sp.XYs) == 0 {
		return nil
	}
	if err := addLine(p, name, sp.XYs, c, dashed, true); err != nil {
		return err
	}
	eb, err := plotter.NewYErrorBars(sp)
	if err != nil {
		return err
	}
	eb.Color = c
	p.Add(eb)
	return nil
}

// cdf converts a measurement's CDF of its operation to µs.
func cdf(m Measurement) plotter.XYs {
	var xys plotter.XYs
	for _, pt := range m.Result.CDF[m.Op] {
		if pt.Latency <= 0 {
			continue
		}
		xys = append(xys, plotter.XY{X: pt.Latency.Seconds() * 1e6, Y: pt.Fraction})
	}
	return xys
}

func cdfPlot(r *Results, title string, lines []cdfLine) (*plot.Plot, error) {
	p := newPlot(title, "latency (µs, log)", "fraction of operations ≤ latency")
	logAxis(&p.X)
	p.Y.Min, p.Y.Max = 0, 1.02
	n := 0
	minX := math.Inf(1)
	for _, l := range lines {
		m, ok := r.MedianRun(l.p, Throughput)
		if !ok {
			continue
		}
		xys := cdf(m)
		if len(xys) == 0 {
			continue
		}
		if err := addLine(p, l.name, xys, l.color, l.dashed, false); err != nil {
			return nil, err
		}
		minX = math.Min(minX, xys[0].X)
		n++
	}
	if n == 0 {
		return nil, errNoData
	}
	// Room on the left for the legend, above the curves' feet.
	p.X.Min = minX / 8
	return p, nil
}

type cdfLine struct {
	name   string
	p      Point
	color  color.Color
	dashed bool
}

func plotCDFGet(r *Results) (*plot.Plot, error) {
	c := r.Config
	pt := Point{Op: OpGet, ValueSize: c.BaseSize, Concurrency: c.BaseConcurrency}
	rkv, redis := pt, pt
	rkv.System, redis.System = SystemRKV, SystemRedis
	return cdfPlot(r, fmt.Sprintf("GET latency, %s values, %d clients", fmtSize(c.BaseSize), c.BaseConcurrency),
		[]cdfLine{{"rkv", rkv, colorRKV, false}, {"Redis", redis, colorRedis, false}})
}

func plotCDFPut(r *Results) (*plot.Plot, error) {
	c := r.Config
	mk := func(sys string, durable bool) Point {
		return Point{System: sys, Op: OpPut, ValueSize: c.BaseSize, Concurrency: c.BaseConcurrency, Durable: durable}
	}
	return cdfPlot(r, fmt.Sprintf("PUT latency, %s values, %d clients", fmtSize(c.BaseSize), c.BaseConcurrency), []cdfLine{
		{"rkv sync=always", mk(SystemRKV, true), colorRKV, false},
		{"Redis appendfsync always", mk(SystemRedis, true), colorRedis, false},
		{"rkv sync=none", mk(SystemRKV, false), colorRKV, true},
		{"Redis appendonly no", mk(SystemRedis, false), colorRedis, true},
	})
}

func plotConcurrency(r *Results) (*plot.Plot, error) {
	c := r.Config
	if len(c.Concurrencies) == 0 {
		return nil, errNoData
	}
	p := newPlot(fmt.Sprintf("GET throughput, %s values (median, min–max of %d runs)", fmtSize(c.BaseSize), c.Runs),
		"concurrent clients", "operations per second")
	pow2Axis(&p.X, c.Concurrencies, strconv.Itoa)
	var xs []float64
	var rkv, redis []Stat
	for _, n := range c.Concurrencies {
		xs = append(xs, float64(n))
		pt := Point{System: SystemRKV, Op: OpGet, ValueSize: c.BaseSize, Concurrency: n}
		rkv = append(rkv, r.Stat(pt, Throughput))
		pt.System = SystemRedis
		redis = append(redis, r.Stat(pt, Throughput))
	}
	if !hasData(rkv, redis) {
		return nil, errNoData
	}
	if err := addSpread(p, "rkv", xs, rkv, colorRKV, false); err != nil {
		return nil, err
	}
	if err := addSpread(p, "Redis", xs, redis, colorRedis, false); err != nil {
		return nil, err
	}
	p.Y.Min = 0
	p.Y.Tick.Marker = rateTicks{}
	return p, nil
}

// plotServers is GET and PUT throughput against the server processes
// of each system.
func plotServers(r *Results) (*plot.Plot, error) {
	c := r.Config
	if len(c.ScaleServers) == 0 {
		return nil, errNoData
	}
	p := newPlot(fmt.Sprintf("Throughput against server processes (%s, %d clients; median, min–max of %d runs)",
		fmtSize(c.BaseSize), c.BaseConcurrency, c.Runs), "server processes of each system", "operations per second")
	pow2Axis(&p.X, c.ScaleServers, strconv.Itoa)
	lines := []struct {
		name    string
		sys, op string
		color   color.Color
		dashed  bool
	}{
		{"rkv GET", SystemRKV, OpGet, colorRKV, false},
		{"Redis GET", SystemRedis, OpGet, colorRedis, false},
		{"rkv PUT", SystemRKV, OpPut, colorRKV, true},
		{"Redis PUT", SystemRedis, OpPut, colorRedis, true},
	}
	var xs []float64
	for _, n := range c.ScaleServers {
		xs = append(xs, float64(n))
	}
	stats := make([][]Stat, len(lines))
	for i, l := range lines {
		for _, n := range c.ScaleServers {
			stats[i] = append(stats[i], r.Stat(ScaledPoint(c, l.sys, l.op, n), Throughput))
		}
	}
	if !hasData(stats...) {
		return nil, errNoData
	}
	top := 0.0
	for i, l := range lines {
		if err := addSpread(p, l.name, xs, stats[i], l.color, l.dashed); err != nil {
			return nil, err
		}
		top = math.Max(top, maxStat(stats[i]))
	}
	// Room at the top for the legend: the lines may fall to the right as
	// well as rise.
	p.Y.Min, p.Y.Max = 0, top*1.35
	p.Y.Tick.Marker = rateTicks{}
	return p, nil
}

// rateTicks are the default ticks labelled as rates: 25k, 1.5M.
type rateTicks struct{}

func (rateTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = fmtRate(ts[i].Value)
		}
	}
	return ts
}

func plotSize(r *Results) (*plot.Plot, error) {
	c := r.Config
	if len(c.Sizes) == 0 {
		return nil, errNoData
	}
	p := newPlot("GET latency against value size, concurrency 1", "value size", "latency (µs, log)")
	pow2Axis(&p.X, c.Sizes, fmtSize)
	logAxis(&p.Y)
	us := func(m Measurement) float64 { return P50(m) * 1e6 }
	us99 := func(m Measurement) float64 { return P99(m) * 1e6 }
	var xs []float64
	var p50, p99 []Stat
	for _, size := range c.Sizes {
		xs = append(xs, float64(size))
		pt := Point{System: SystemRKV, Op: OpGet, ValueSize: size, Concurrency: 1}
		p50 = append(p50, r.Stat(pt, us))
		p99 = append(p99, r.Stat(pt, us99))
	}
	var exs []float64
	var e50 []Stat
	for _, size := range c.EchoSizes {
		exs = append(exs, float64(size))
		e50 = append(e50, r.Stat(Point{System: SystemEcho, Op: OpGet, ValueSize: size, Concurrency: 1}, us))
	}
	if !hasData(p50, e50) {
		return nil, errNoData
	}
	for _, s := range []struct {
		name   string
		xs     []float64
		ss     []Stat
		c      color.Color
		dashed bool
	}{{"rkv p50", xs, p50, colorRKV, false}, {"rkv p99", xs, p99, colorRKV, true}, {"raw TCP echo p50", exs, e50, colorEcho, false}} {
		if err := addSpread(p, s.name, s.xs, s.ss, s.c, s.dashed); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func plotRegistration(r *Results) (*plot.Plot, error) {
	c := r.Config
	var ns []int
	for _, n := range c.Arenas {
		if r.RegistrationStat(n, StartCold, func(Registration) float64 { return 0 }).N+
			r.RegistrationStat(n, StartWarm, func(Registration) float64 { return 0 }).N > 0 {
			ns = append(ns, n)
		}
	}
	if len(ns) == 0 {
		return nil, errNoData
	}
	p := newPlot(fmt.Sprintf("Start with arenas of %s: time from process start", fmtBytes(c.ArenaBytes)), "arenas", "seconds")
	pow2Axis(&p.X, ns, strconv.Itoa)
	top := 0.0
	// Fresh starts are in the table only: their seconds of creating files
	// would flatten the others' lines.
	for _, start := range []Start{StartCold, StartWarm} {
		var xs []float64
		var first, all []Stat
		for _, n := range ns {
			xs = append(xs, float64(n))
			first = append(first, r.RegistrationStat(n, start, func(g Registration) float64 { return g.FirstGet.Seconds() }))
			all = append(all, r.RegistrationStat(n, start, func(g Registration) float64 { return g.Registered.Seconds() }))
		}
		warm := start == StartWarm
		if err := addSpread(p, "all arenas registered (synchronous baseline), "+string(start), xs, all, colorRedis, warm); err != nil {
			return nil, err
		}
		if err := addSpread(p, "first GET served (rkv), "+string(start), xs, first, colorRKV, warm); err != nil {
			return nil, err
		}
		top = math.Max(top, math.Max(maxStat(all), maxStat(first)))
	}
	p.Y.Min = 0
	if top > 0 {
		p.Y.Max = top * 1.1
	}
	return p, nil
}

func maxStat(ss []Stat) float64 {
	m := 0.0
	for _, s := range ss {
		m = math.Max(m, s.Max)
	}
	return m
}
