package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/bench/target"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseFlagsRefusesBadInput(t *testing.T) {
	bins := t.TempDir()
	for _, b := range []string{"rkv-server", "rkv-client"} {
		if err := os.WriteFile(filepath.Join(bins, b), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	half := t.TempDir()
	if err := os.WriteFile(filepath.Join(half, "rkv-server"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--b", bins}, "--a is required"},
		{[]string{"--a", bins}, "--b is required"},
		{[]string{"--a", bins, "--b", half}, "no rkv-client there"},
		{[]string{"--a", bins, "--b", bins, "--pairs", "0"}, "must be positive"},
		{[]string{"--a", bins, "--b", bins, "--warmup", "-1s"}, "not negative"},
		{[]string{"--a", bins, "--b", bins, "extra"}, "unexpected arguments"},
	} {
		_, err := parseFlags(c.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	o, err := parseFlags([]string{"--a", bins, "--b", bins}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.workload != "put" || o.concurrency != 16 || o.pairs != 8 || o.sync != "none" {
		t.Errorf("defaults %+v", o)
	}
}

func TestRatios(t *testing.T) {
	mk := func(ops ...float64) *build {
		b := &build{}
		for _, v := range ops {
			b.runs = append(b.runs, result{OpsPerS: v})
		}
		return b
	}
	ops := func(r result) float64 { return r.OpsPerS }
	// B/A pair by pair: 2, 0.5, 1, 1.5: the median of an even count is
	// the mean of the middle two.
	got := ratios([]*build{mk(10, 10, 10, 10), mk(20, 5, 10, 15)}, ops)
	if got != (spread{1.25, 0.5, 2}) {
		t.Errorf("ratios = %+v, want median 1.25 in 0.5-2", got)
	}
	if got := ratios([]*build{mk(10, 10, 10), mk(30, 10, 20)}, ops); got != (spread{2, 1, 3}) {
		t.Errorf("ratios = %+v, want median 2 in 1-3", got)
	}
}

// The whole tool on one build against itself: two servers, runs in both
// orders, a summary.
func TestRunOneBuildAgainstItself(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two rkv-servers (-short)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bins := t.TempDir()
	if err := target.BuildCommands(ctx, bins, "rkv-server", "rkv-client"); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--a", bins, "--b", bins, "--pairs", "2", "--duration", "300ms", "--warmup", "50ms",
		"--concurrency", "2", "--keys", "100", "--arena-size", "67108864", "--arena-count", "2", "--work", t.TempDir()}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(ctx, o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	pairs := regexp.MustCompile(`(?m)^[12] +\d+ +\S+ +\d+ +\S+ +\d+\.\d{3}$`).FindAllString(out.String(), -1)
	summary := regexp.MustCompile(`B/A throughput: \d+\.\d{3} \(\d+\.\d{3}-\d+\.\d{3}\); B/A p50: .* of 2 pairs\)`)
	if len(pairs) != 2 || !summary.MatchString(out.String()) {
		t.Errorf("want two pairs and the summary:\n%s", out.String())
	}
}
