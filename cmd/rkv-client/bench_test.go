// Tests of rkv-client bench: flag checks without a cluster, and runs against an in-process server.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/loadgen"
)

func TestBenchFlagErrorsAreUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--workload", "z"}, {"--keys", "0"}, {"--distribution", "pareto"}, {"--theta", "1"},
		{"--concurrency", "0"}, {"--clients", "5", "--concurrency", "4"}, {"--ops", "-1"},
		{"--duration", "0"}, {"--batch", "0"}, {"--load", "--no-load"}, {"--value-size", "0"},
	} {
		// No --join: a usage error even so, from the flag check, before connecting.
		args = append([]string{"--join", "127.0.0.1:1", "bench"}, args...)
		_, errs, code := runCLI(nil, args...)
		if code != exitUsage || !strings.Contains(errs, "--") {
			t.Errorf("%v: exit %d, stderr %q; want %d naming the flag", args, code, errs, exitUsage)
		}
	}
}

func TestBenchClassify(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("get k: %w", context.DeadlineExceeded):                          loadgen.ErrKindTimeout,
		fmt.Errorf("get k: %w", loadgen.ErrNotFound):                               loadgen.ErrKindNotFound,
		fmt.Errorf("get k: %w", &client.UnavailableError{Node: "n1", Reason: "x"}): errKindUnavailable,
		fmt.Errorf("put k: %w", client.ErrFull):                                    errKindFull,
		fmt.Errorf("put k: %w", client.ErrUnauthenticated):                         errKindRefused,
		errors.New("?"): loadgen.ErrKindOther,
	} {
		if got := benchClassify(err); got != want {
			t.Errorf("benchClassify(%v) = %q, want %q", err, got, want)
		}
	}
}

func TestBenchConns(t *testing.T) {
	for _, c := range []struct{ conc, clients, want int }{{16, 1, 16}, {16, 3, 6}, {1, 1, 1}, {1000, 2, 64}} {
		if got := benchConns(c.conc, c.clients); got != c.want {
			t.Errorf("benchConns(%d, %d) = %d, want %d", c.conc, c.clients, got, c.want)
		}
	}
}

func TestProgressLines(t *testing.T) {
	l := progressLine(loadgen.Snapshot{Phase: "load", Done: 250, Total: 1000, OpsPerS: 50})
	if !strings.Contains(l, "250/1000 keys") || !strings.Contains(l, " 25%") || !strings.Contains(l, "ETA 15s") ||
		!strings.Contains(l, "[#######.") {
		t.Errorf("load line %q", l)
	}
	l = progressLine(loadgen.Snapshot{Phase: "run", Elapsed: 2 * time.Second, Planned: 10 * time.Second, Done: 500, OpsPerS: 250, Errors: 3})
	if !strings.Contains(l, "2.0s/10s") || !strings.Contains(l, "500 ops") || !strings.Contains(l, "250 ops/s") || !strings.Contains(l, "3 errors") {
		t.Errorf("run line %q", l)
	}
	var b strings.Builder
	p := newProgress(&b) // not a terminal: a line at most every 2s, and the final one
	p.show(loadgen.Snapshot{Phase: "run", Done: 1})
	p.show(loadgen.Snapshot{Phase: "run", Done: 2})
	p.last = time.Time{}
	p.show(loadgen.Snapshot{Phase: "run", Done: 3, Total: 3}) // the phase's end: its final line follows
	p.show(loadgen.Snapshot{Phase: "run", Done: 3, Total: 3, Final: true})
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != 2 || strings.Contains(b.String(), "\r") {
		t.Errorf("progress on a non-terminal: %q", b.String())
	}
}

func TestBenchAgainstAServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	join := startServerWith(t, nil, nil)
	env := map[string]string{"RKV_JOIN": join}

	// The old bench: put every key, get them back and check them.
	out, errs, code := runCLI(env, "bench", "--workload", "c", "--verify", "--keys", "200", "--ops", "1000",
		"--value-size", "64", "--concurrency", "4", "--clients", "2")
	if code != 0 {
		t.Fatalf("bench: exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"workload c", "loaded 200 keys", "get  1000", "errors: none", "RDMA READs per key read:", "retries:"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errs, "load   [####") || !strings.Contains(errs, "run ") {
		t.Errorf("progress on stderr: %q", errs)
	}

	// JSON: the whole Result, with counters from the clients.
	out, errs, code = runCLI(env, "--output", "json", "bench", "--workload", "multiget", "--batch", "4", "--no-load",
		"--keys", "200", "--ops", "100", "--verify", "--quiet", "--value-size", "64")
	if code != 0 || errs != "" {
		t.Fatalf("bench json: exit %d\n%s\n%s", code, out, errs)
	}
	var r loadgen.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Ops != 100 || r.Latency[loadgen.KindMultiGet].Count != 100 || len(r.CDF[loadgen.KindMultiGet]) == 0 {
		t.Fatalf("result %+v", r)
	}
	// A batch of 4 keys of one server: at least one READ per key.
	if rpg := r.Extra["rdma_reads_per_get"]; rpg < 1 || rpg > 3 {
		t.Fatalf("rdma_reads_per_get %v (extra %v)", rpg, r.Extra)
	}

	// MultiPuts of 8 pairs (400 writes over 20 keys: each written), then
	// every key read back and checked.
	out, errs, code = runCLI(env, "bench", "--workload", "multiput", "--batch", "8", "--no-load", "--prefix", "mput/",
		"--keys", "20", "--ops", "50", "--quiet", "--value-size", "64", "--distribution", "uniform")
	if code != 0 || !strings.Contains(out, "multiput of 8 pairs") || !regexp.MustCompile(`multiput +50 `).MatchString(out) {
		t.Fatalf("bench multiput: exit %d\n%s\n%s", code, out, errs)
	}
	out, errs, code = runCLI(env, "bench", "--no-load", "--verify", "--prefix", "mput/", "--keys", "20", "--ops", "300",
		"--quiet", "--distribution", "uniform", "--value-size", "64")
	if code != 0 || strings.Contains(out, "notfound") {
		t.Fatalf("the multiput keys read back: exit %d\n%s\n%s", code, out, errs)
	}

	// --verify over keys never loaded: the report, then exit 4.
	out, _, code = runCLI(env, "bench", "--no-load", "--verify", "--prefix", "absent/", "--keys", "50", "--ops", "200",
		"--quiet", "--concurrency", "2")
	if code != exitOther || !strings.Contains(out, "notfound 200") {
		t.Fatalf("verify of absent keys: exit %d\n%s", code, out)
	}
}
