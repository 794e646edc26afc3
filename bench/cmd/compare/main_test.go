// Tests of the command's flags, plan and report step (the measuring itself runs in CI as --quick).

package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/bench/report"
)

func TestParseFlagsDefaults(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.runs != 3 || o.duration != 4*time.Second || o.keys != 10000 || o.arenaBytes != 1<<30 ||
		!slices.Equal(o.arenas, []int{1, 2, 4, 8}) || !slices.Equal(o.concurrency, []int{1, 2, 4, 8, 16, 32, 64}) ||
		!slices.Equal(o.sizes, []int{64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}) {
		t.Fatalf("defaults: %+v", o)
	}
	q, err := parseFlags([]string{"--quick", "--runs", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if q.runs != 2 || q.duration != 300*time.Millisecond || q.arenaBytes != 64<<20 || !slices.Equal(q.concurrency, []int{1, 16}) {
		t.Fatalf("--quick --runs 2: %+v", q)
	}
	if !slices.Equal(o.scaleServers, []int{1, 2, 4}) || o.batch != 16 || !slices.Equal(o.batchOps, []string{report.OpMultiGet, report.OpMultiPut}) {
		t.Fatalf("defaults: %d server processes, batches of %d %v", o.scaleServers, o.batch, o.batchOps)
	}
	// Durable PUT points run long enough to hold an rkv checkpoint.
	put := report.Point{Op: report.OpPut, ValueSize: 1024, Concurrency: 16}
	durable := put
	durable.Durable = true
	for _, tc := range []struct {
		o             *options
		plain, stored time.Duration
	}{{o, 4 * time.Second, 12 * time.Second}, {q, 300 * time.Millisecond, 300 * time.Millisecond}} {
		s := &systems{o: tc.o}
		if got, gotDurable := s.options(put, 1).Duration, s.options(durable, 1).Duration; got != tc.plain || gotDurable != tc.stored {
			t.Errorf("quick %v: PUT points %v, durable ones %v; want %v and %v", tc.o.quick, got, gotDurable, tc.plain, tc.stored)
		}
	}
	if s, err := parseFlags([]string{"--scale-servers", "1,3", "--only", "servers"}); err != nil || !slices.Equal(s.scaleServers, []int{1, 3}) {
		t.Fatalf("--scale-servers 1,3: %v, %v", s, err)
	}
	for _, bad := range [][]string{{"--sizes", "1,x"}, {"--arena-size", "0"}, {"--distribution", "normal"}, {"extra"}, {"--concurrency", "-1"},
		{"--scale-servers", "0"}, {"--only", "echo"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) succeeded", bad)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"64": 64, "4KiB": 4096, "1MiB": 1 << 20, "2GiB": 2 << 30} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "KiB", "1.5MiB", "-3", "1kb"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) succeeded", in)
		}
	}
}

func TestPlan(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	gs := plan(o)
	seen := map[report.Point]bool{}
	for _, g := range gs {
		for _, s := range g.systems {
			p := g.point(s)
			if seen[p] {
				t.Errorf("%s planned twice", p)
			}
			seen[p] = true
		}
	}
	// Every comparison's points are there, each configuration once.
	want := []report.Point{
		{System: "rkv", Op: "get", ValueSize: 64, Concurrency: 1},
		{System: "echo", Op: "get", ValueSize: 64 << 10, Concurrency: 1},
		{System: "echo", Op: "put", ValueSize: 1 << 10, Concurrency: 1},
		{System: "redis", Op: "get", ValueSize: 1 << 10, Concurrency: 1},
		{System: "redis", Op: "put", ValueSize: 1 << 10, Concurrency: 16, Durable: true},
		{System: "redis", Op: "put", ValueSize: 1 << 10, Concurrency: 16, CrashSafe: true},
		{System: "rkv", Op: "put", ValueSize: 1 << 10, Concurrency: 16, CrashSafe: true},
		{System: "rkv", Op: "put", ValueSize: 1 << 10, Concurrency: 16},
		{System: "rkv", Op: "put", ValueSize: 1 << 10, Concurrency: 16, Cleaning: true},
		{System: "redis", Op: "put", ValueSize: 1 << 10, Concurrency: 16, Cleaning: true},
		{System: "redis", Op: "get", ValueSize: 1 << 10, Concurrency: 64},
		{System: "rkv", Op: "get", ValueSize: 1 << 20, Concurrency: 1},
		{System: "rkv", Op: "multiget", ValueSize: 1 << 10, Concurrency: 16},
		{System: "redis", Op: "multiget", ValueSize: 1 << 10, Concurrency: 16},
		{System: "rkv", Op: "multiput", ValueSize: 1 << 10, Concurrency: 16},
		{System: "redis", Op: "multiput", ValueSize: 1 << 10, Concurrency: 16},
		{System: "rkv", Op: "get", ValueSize: 1 << 10, Concurrency: 16, Servers: 2},
		{System: "redis", Op: "put", ValueSize: 1 << 10, Concurrency: 16, Servers: 4},
	}
	for _, p := range want {
		if !seen[p] {
			t.Errorf("%s not planned", p)
		}
	}
	// 3 sizes x 2 ops x 2 systems against the echo, + redis GET at c=1,
	// 2 + 8 against Redis (GET, PUT at three durabilities and while
	// rkv's cleaner works), 2 x 2 batched, 5 more concurrencies x 2, 5
	// more sizes, 2 server counts (1 is the standard) x GET and PUT x 2.
	if want := 12 + 1 + 10 + 4 + 10 + 5 + 8; len(seen) != want {
		t.Errorf("%d points planned, want %d", len(seen), want)
	}
	// One server process each is the standard point, not measured twice.
	for p := range seen {
		if p.Servers == 1 {
			t.Errorf("%s planned beside the standard point", p)
		}
	}
	// The groups on more server processes come together, by count (each
	// count's Redis processes are started once a run).
	var runs []int
	for _, g := range gs {
		if len(runs) == 0 || runs[len(runs)-1] != g.servers {
			runs = append(runs, g.servers)
		}
	}
	if want := []int{0, 2, 4}; !slices.Equal(runs, want) {
		t.Errorf("groups by server processes, in plan order: %v, want %v", runs, want)
	}
	if got := getSizes(gs); !slices.Equal(got, o.sizes) {
		t.Errorf("GET data sets %v, want %v", got, o.sizes)
	}
}

// --only batch or servers plans that part's points alone, the standard
// ones it shares included.
func TestPlanOnlyPart(t *testing.T) {
	points := func(args ...string) []string {
		t.Helper()
		o, err := parseFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		var ps []string
		for _, g := range plan(o) {
			for _, s := range g.systems {
				ps = append(ps, g.point(s).String())
			}
		}
		return ps
	}
	if got, want := points("--only", "batch"), []string{"rkv multiget 1024B c=16", "redis multiget 1024B c=16",
		"rkv multiput 1024B c=16", "redis multiput 1024B c=16"}; !slices.Equal(got, want) {
		t.Errorf("--only batch: %q, want %q", got, want)
	}
	want := []string{"rkv get 1024B c=16", "redis get 1024B c=16", "rkv put 1024B c=16", "redis put 1024B c=16",
		"rkv get 1024B c=16 on 2", "redis get 1024B c=16 on 2", "rkv put 1024B c=16 on 2", "redis put 1024B c=16 on 2"}
	if got := points("--only", "servers", "--scale-servers", "1,2"); !slices.Equal(got, want) {
		t.Errorf("--only servers: %q, want %q", got, want)
	}
	// With two standard rkv-servers, one of each is a point of its own;
	// the standard systems then load nothing.
	o, err := parseFlags([]string{"--only", "servers", "--scale-servers", "1", "--rkv-servers", "2"})
	if err != nil {
		t.Fatal(err)
	}
	gs := plan(o)
	if len(gs) != 2 || gs[0].servers != 1 || len(getSizes(gs)) != 0 {
		t.Errorf("--rkv-servers 2, one process each: %+v", gs)
	}
}

func TestPutArenas(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for servers, want := range map[int]int{1: 4, 2: 4, 3: 3, 4: 2} {
		if size, count := putArenas(o, servers); size != 512<<20 || count != want {
			t.Errorf("%d servers: %d arenas of %d MiB, want %d of 512", servers, count, size>>20, want)
		}
	}
	// 16 arenas at most, whatever the duration.
	o.duration = time.Minute
	if _, count := putArenas(o, 1); count != 16 {
		t.Errorf("a minute of PUTs: %d arenas, want 16", count)
	}
}

func TestKeysFor(t *testing.T) {
	o := &options{keys: 10000}
	for size, want := range map[int]int{64: 10000, 4 << 10: 10000, 64 << 10: 1024, 1 << 20: 64, 64 << 20: 16} {
		if got := keysFor(o, size); got != want {
			t.Errorf("keysFor(%d) = %d, want %d", size, got, want)
		}
	}
}

func TestRerender(t *testing.T) {
	out := t.TempDir()
	if err := os.MkdirAll(filepath.Join(out, "bench"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "bench", "rxe.md"), []byte("numbers from the VM"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := &options{out: out, from: filepath.Join("..", "..", "report", "testdata", "results.json")}
	if err := rerender(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "## On Soft-RoCE (rxe)\n\nnumbers from the VM") {
		t.Errorf("rxe.md not included:\n%s", md)
	}
	for _, p := range []string{"cdf-get.png", "throughput-concurrency.png", "throughput-servers.png", "registration.png"} {
		if _, err := os.Stat(filepath.Join(out, "bench", p)); err != nil {
			t.Error(err)
		}
		if !strings.Contains(string(md), "bench/"+p) {
			t.Errorf("%s not embedded", p)
		}
	}
}

// fakeCPUs writes a CPU sysfs tree: per CPU, a POLL state and a halting
// one, with usage counts.
func fakeCPUs(t *testing.T, usage map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for _, cpu := range []string{"cpu0", "cpu1"} {
		for state, name := range map[string]string{"state0": "POLL", "state1": "haltpoll idle"} {
			dir := filepath.Join(root, cpu, "cpuidle", state)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "name"), []byte(name+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "usage"), []byte(usage[cpu+"/"+state]+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func TestIdleCounterCountsHaltsOnly(t *testing.T) {
	root := fakeCPUs(t, map[string]string{"cpu0/state0": "1000", "cpu0/state1": "7", "cpu1/state0": "2000", "cpu1/state1": "5"})
	count := idleCounter(root)
	if count == nil {
		t.Fatal("no counter over a tree with idle states")
	}
	if got := count()[report.CPUIdleEntries]; got != 12 {
		t.Fatalf("halts %d, want 12 (the POLL states left out)", got)
	}
	// An unreadable counter stops the counting for good: a later sum
	// without it would look like a decrease.
	if err := os.Remove(filepath.Join(root, "cpu1", "cpuidle", "state1", "usage")); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != nil {
		t.Fatalf("counts %v with a counter gone, want none", got)
	}
	if err := os.WriteFile(filepath.Join(root, "cpu1", "cpuidle", "state1", "usage"), []byte("9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := count(); got != nil {
		t.Fatalf("counts %v once a counter failed, want none", got)
	}
	if idleCounter(t.TempDir()) != nil {
		t.Fatal("a counter over a tree without cpuidle")
	}
}

func TestSetIdlePollRestores(t *testing.T) {
	path := filepath.Join(t.TempDir(), "guest_halt_poll_ns")
	if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	restore, err := setIdlePoll(path, 200*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "200000" {
		t.Fatalf("set to %q, want 200000", b)
	}
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "0\n" {
		t.Fatalf("restored to %q, want the old %q", b, "0\n")
	}
	if _, err := setIdlePoll(filepath.Join(t.TempDir(), "none"), time.Millisecond); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a kernel without haltpoll: %v, want os.ErrNotExist", err)
	}
	if _, err := parseFlags([]string{"--idle-poll", "-1ms"}); err == nil || !strings.Contains(err.Error(), "--idle-poll") {
		t.Fatalf("a negative --idle-poll: %v", err)
	}
}
