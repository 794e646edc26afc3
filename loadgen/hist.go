// Latency summaries and CDFs from HDR histograms.
package loadgen

import (
	"math"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

func summarize(h *hdrhistogram.Histogram) Latency {
	if h.TotalCount() == 0 {
		return Latency{}
	}
	q := func(p float64) time.Duration { return time.Duration(h.ValueAtPercentile(p)) }
	return Latency{
		Count: h.TotalCount(),
		P50:   q(50), P90: q(90), P99: q(99), P999: q(99.9),
		Max:  time.Duration(h.Max()),
		Min:  time.Duration(h.Min()),
		Mean: time.Duration(math.Round(h.Mean())),
	}
}

// cdfFractions are the points of a CDF: every 2% up to 90%, then
// logarithmically closer to 1 (ten per decade, to 1-1e-5), then 1 (the
// maximum) — 87 points that show both the body and the tail.
var cdfFractions = func() []float64 {
	var fs []float64
	for i := 0; i <= 45; i++ {
		fs = append(fs, float64(i)/50)
	}
	for d := 11; d <= 50; d++ { // 1 - 10^(-d/10): 0.9206 .. 0.99999
		fs = append(fs, 1-math.Pow(10, -float64(d)/10))
	}
	return append(fs, 1)
}()

// cdf samples h's cumulative distribution at cdfFractions, dropping
// points that repeat the previous one's latency (a CDF of few
// operations, or of one latency, is short). The first point is the
// minimum, the last the maximum.
func cdf(h *hdrhistogram.Histogram) []Point {
	if h.TotalCount() == 0 {
		return nil
	}
	ps := make([]float64, len(cdfFractions))
	for i, f := range cdfFractions {
		ps[i] = f * 100
	}
	vals := h.ValueAtPercentilesSlice(ps)
	out := make([]Point, 0, len(vals))
	for i, v := range vals {
		lat := time.Duration(v)
		switch cdfFractions[i] {
		case 0:
			lat = time.Duration(h.Min())
		case 1:
			lat = time.Duration(h.Max())
		}
		if n := len(out); n > 0 && out[n-1].Latency >= lat {
			out[n-1].Fraction = cdfFractions[i]
			continue
		}
		out = append(out, Point{Latency: lat, Fraction: cdfFractions[i]})
	}
	return out
}
