//go:build chaos

// TestChaos: three rkv-server processes, concurrent clients and a nemesis, then the checker.

package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/membership"
)

// runConfig is a run's settings, from the environment.
type runConfig struct {
	duration     time.Duration // CHAOS_DURATION, default 60s
	seed         uint64        // CHAOS_SEED, default from the clock
	clients      int           // CHAOS_CLIENTS, default 5
	keys         int           // CHAOS_KEYS, default 12
	net          string        // CHAOS_NET: auto (netns when possible), loopback, netns
	checkTimeout time.Duration // CHAOS_CHECK_TIMEOUT, default 60s
	maxFault     time.Duration // CHAOS_MAX_FAULT: the longest fault, default 5s
	retention    time.Duration // CHAOS_DEAD_RETENTION: the clients' Tuning.DeadRetention, default 1h
	out          string        // CHAOS_OUT: where failure artifacts go, default a new temporary directory
}

func loadConfig(t *testing.T) runConfig {
	cfg := runConfig{duration: 60 * time.Second, seed: uint64(time.Now().UnixNano()), clients: 5, keys: 12, net: "auto",
		checkTimeout: 60 * time.Second, maxFault: 5 * time.Second, retention: time.Hour}
	dur := func(env string, dst *time.Duration) {
		if v := os.Getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				if s, err2 := strconv.Atoi(v); err2 == nil {
					d, err = time.Duration(s)*time.Second, nil
				}
			}
			if err != nil || d <= 0 {
				t.Fatalf("%s=%q: want a positive duration (60s, 2m) or seconds", env, v)
			}
			*dst = d
		}
	}
	num := func(env string, dst *int) {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				t.Fatalf("%s=%q: want a positive integer", env, v)
			}
			*dst = n
		}
	}
	dur("CHAOS_DURATION", &cfg.duration)
	dur("CHAOS_CHECK_TIMEOUT", &cfg.checkTimeout)
	dur("CHAOS_MAX_FAULT", &cfg.maxFault)
	dur("CHAOS_DEAD_RETENTION", &cfg.retention)
	num("CHAOS_CLIENTS", &cfg.clients)
	num("CHAOS_KEYS", &cfg.keys)
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: want an unsigned integer", v)
		}
		cfg.seed = s
	}
	if v := os.Getenv("CHAOS_NET"); v != "" {
		cfg.net = v
	}
	switch cfg.net {
	case "auto", "loopback", "netns":
	default:
		t.Fatalf("CHAOS_NET=%q: want auto, loopback or netns", cfg.net)
	}
	cfg.out = os.Getenv("CHAOS_OUT")
	return cfg
}

// clientTuning detects failures faster than memberlist's local profile and
// keeps departed servers in the view for the whole run: with one replica a
// key whose server is reaped moves to another server, which is not what
// this suite checks (docs/CHAOS.md).
var clientTuning = membership.Tuning{
	ProbeInterval:       300 * time.Millisecond,
	ProbeTimeout:        150 * time.Millisecond,
	GossipInterval:      50 * time.Millisecond,
	PushPullInterval:    2 * time.Second,
	TCPTimeout:          2 * time.Second,
	SuspicionMult:       3,
	GossipToTheDeadTime: 5 * time.Second,
	DeadRetention:       time.Hour,
}

func quietLogger() *slog.Logger {
	if os.Getenv("RKV_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func newClient(ctx context.Context, c *cluster, name string, retention time.Duration) (*client.Client, error) {
	ip := c.net.clientIP()
	tuning := clientTuning
	tuning.DeadRetention = retention
	return client.New(ctx, client.Config{
		Seeds:      c.seeds(),
		Name:       name,
		DataAddr:   ip + ":0",
		Membership: membership.Config{BindAddr: ip, Tuning: tuning},
		Logger:     quietLogger(),
	})
}

const opTimeout = 3 * time.Second

// worker issues random operations on a few keys until ctx ends.
func worker(ctx context.Context, id int, cl *client.Client, keys []string, rng *rand.Rand, h *History) {
	seq := 0
	for ctx.Err() == nil {
		key := keys[rng.IntN(len(keys))]
		kind := Get
		switch r := rng.IntN(100); {
		case r < 50:
			kind = Put
		case r < 60:
			kind = Delete
		}
		if kind == Delete {
			// A delete that fails is Unknown forever, and those make
			// the check expensive: skip deletes the client already
			// knows cannot be served. Nothing is sent, so nothing is
			// recorded.
			if _, err := cl.Owner([]byte(key)); err != nil {
				kind = Get
			}
		}
		op := Op{Client: id, Kind: kind, Key: key}
		if kind == Put {
			seq++
			op.Value = fmt.Sprintf("c%d-%d", id, seq)
		}
		octx, cancel := context.WithTimeout(context.Background(), opTimeout)
		var v []byte
		var err error
		op.Call = h.Now()
		switch kind {
		case Get:
			v, err = cl.Get(octx, []byte(key))
		case Put:
			err = cl.Put(octx, []byte(key), []byte(op.Value))
		case Delete:
			err = cl.Delete(octx, []byte(key))
		}
		op.Return = h.Now()
		cancel()
		op.Outcome, op.Found = Classify(kind, err)
		if kind == Get && op.Found {
			op.Value = string(v)
		}
		if op.Outcome != OK {
			op.Err = err.Error()
		}
		h.Add(op)
		if err != nil && !errors.Is(err, client.ErrNotFound) {
			hold(ctx, time.Duration(20+rng.IntN(80))*time.Millisecond)
		}
	}
}

// waitRecovered waits until cl sees every server alive with its index
// and arenas advertised.
func waitRecovered(ctx context.Context, c *cluster, cl *client.Client) error {
	for {
		alive := 0
		for _, m := range cl.Membership().View().Servers() {
			if m.State == membership.StateAlive && m.Meta.Index != nil && len(m.Meta.Arenas) == 2 {
				alive++
			}
		}
		if alive == len(c.nodes) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d servers alive with their regions: %w", alive, len(c.nodes), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// finalReads reads every key once the cluster has recovered, retrying
// failures until a deadline; each key's successful read (or its last
// failure) goes into the history as Final.
func finalReads(cl *client.Client, id int, keys []string, h *History, deadline time.Time) {
	for _, key := range keys {
		for {
			octx, cancel := context.WithTimeout(context.Background(), opTimeout)
			op := Op{Client: id, Kind: Get, Key: key, Final: true, Call: h.Now()}
			v, err := cl.Get(octx, []byte(key))
			op.Return = h.Now()
			cancel()
			op.Outcome, op.Found = Classify(Get, err)
			if op.Found {
				op.Value = string(v)
			}
			if err != nil && op.Outcome != OK {
				op.Err = err.Error()
				if time.Now().Before(deadline) {
					time.Sleep(200 * time.Millisecond)
					continue
				}
			}
			h.Add(op)
			break
		}
	}
}

func TestChaos(t *testing.T) {
	cfg := loadConfig(t)
	if os.Getenv("RKV_TEST_LOG") == "" {
		// rdma/soft logs every QP a fault breaks to the default logger.
		prev := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
		t.Cleanup(func() { slog.SetDefault(prev) })
	}
	t.Logf("chaos: seed %d (CHAOS_SEED=%d reproduces the schedule), duration %v, %d clients, %d keys, faults up to %v, clients' dead retention %v",
		cfg.seed, cfg.seed, cfg.duration, cfg.clients, cfg.keys, cfg.maxFault, cfg.retention)

	nw, netNote := chooseNetwork(t, cfg)
	t.Cleanup(func() {
		if err := nw.close(); err != nil {
			t.Errorf("removing the %s network: %v", nw.name(), err)
		}
	})
	kinds := append([]string{faultKill, faultPause}, nw.faultKinds()...)

	server := buildServer(t, t.TempDir())
	c := newCluster(t, server, nw, 3)
	t.Cleanup(c.stopAll)
	for _, n := range c.nodes {
		if err := c.start(n); err != nil {
			t.Fatalf("%v\n%s", err, c.logTail(30))
		}
	}

	ctx0, cancel0 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel0()
	var clients []*client.Client
	defer func() {
		for _, cl := range clients {
			_ = cl.Close()
		}
	}()
	for i := range cfg.clients {
		cl, err := newClient(ctx0, c, fmt.Sprintf("chaos-client-%d", i), cfg.retention)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		clients = append(clients, cl)
	}
	if err := waitRecovered(ctx0, c, clients[0]); err != nil {
		t.Fatalf("the cluster did not come up: %v\n%s", err, c.logTail(30))
	}
	keys := make([]string, cfg.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}

	h := NewHistory()
	nm := &nemesis{c: c, h: h, rng: rand.New(rand.NewPCG(cfg.seed, 1)), logf: t.Logf,
		cfg: nemesisConfig{kinds: kinds, minFault: min(500*time.Millisecond, cfg.maxFault), maxFault: cfg.maxFault, minGap: time.Second, maxGap: 3 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func(r *rand.Rand) {
			defer wg.Done()
			worker(ctx, i, cl, keys, r, h)
		}(rand.New(rand.NewPCG(cfg.seed, uint64(100+i))))
	}
	nemDone := make(chan struct{})
	go func() { defer close(nemDone); nm.run(ctx) }()
	<-ctx.Done()
	<-nemDone
	wg.Wait()
	runEnd := h.Now()

	// Heal, recover, read every key.
	t0 := time.Now()
	if err := nm.healAll(); err != nil {
		t.Fatalf("healing: %v\n%s", err, c.logTail(30))
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	fin, err := newClient(rctx, c, "chaos-final", cfg.retention)
	if err != nil {
		t.Fatalf("final client: %v\n%s", err, c.logTail(30))
	}
	clients = append(clients, fin)
	if err := waitRecovered(rctx, c, fin); err != nil {
		t.Fatalf("recovery: %v\n%s", err, c.logTail(30))
	}
	finalReads(fin, cfg.clients, keys, h, time.Now().Add(30*time.Second))
	recovered := time.Since(t0)
	died := c.exited()

	ops := h.Ops()
	faults, nemErrs := nm.report()
	t1 := time.Now()
	res := Check(ops, CheckOptions{Timeout: cfg.checkTimeout})
	checkTook := time.Since(t1)

	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary: seed %d, %v of faults and load, network %s\n", cfg.seed, runEnd.Round(time.Millisecond), nw.name())
	if netNote != "" {
		fmt.Fprintf(&b, "  NOTE: %s\n", netNote)
	}
	writeOpTable(&b, ops)
	writeFaultTable(&b, faults, kinds, nw.name())
	fmt.Fprintf(&b, "  recovery: healed, every server alive and every key read in %v\n", recovered.Round(time.Millisecond))
	fmt.Fprintf(&b, "  check: porcupine %s over %d operations in %v\n", res.Linearizability, res.Checked, checkTook.Round(time.Millisecond))
	fmt.Fprintf(&b, "  anomalies: %d\n", len(res.Anomalies))
	for _, a := range res.Anomalies {
		fmt.Fprintf(&b, "    %v\n", a)
	}
	for _, d := range died {
		fmt.Fprintf(&b, "  SERVER DIED: %s\n", d)
	}
	for _, e := range nemErrs {
		fmt.Fprintf(&b, "  NEMESIS ERROR: %v\n", e)
	}
	t.Log(b.String())

	if len(res.Anomalies) > 0 || len(died) > 0 || len(nemErrs) > 0 {
		dir := saveArtifacts(t, cfg, c, ops, faults, &res)
		t.Fatalf("chaos run failed (seed %d): %d anomalies, %d servers died, %d nemesis errors; history, visualization and server logs in %s",
			cfg.seed, len(res.Anomalies), len(died), len(nemErrs), dir)
	}
}

// writeOpTable prints operations by kind and outcome.
func writeOpTable(b *strings.Builder, ops []Op) {
	type row struct{ ok, found, notFound, failed, unknown int }
	rows := map[Kind]*row{Get: {}, Put: {}, Delete: {}}
	final := 0
	for _, op := range ops {
		if op.Final {
			final++
			continue
		}
		r := rows[op.Kind]
		switch op.Outcome {
		case OK:
			r.ok++
			if op.Kind == Get && op.Found {
				r.found++
			} else if op.Kind == Get {
				r.notFound++
			}
		case Failed:
			r.failed++
		case Unknown:
			r.unknown++
		}
	}
	fmt.Fprintf(b, "  ops: %d by the workers, %d final reads\n", len(ops)-final, final)
	fmt.Fprintf(b, "    %-7s %7s %7s %7s\n", "KIND", "OK", "FAILED", "UNKNOWN")
	for _, k := range []Kind{Get, Put, Delete} {
		r := rows[k]
		extra := ""
		if k == Get {
			extra = fmt.Sprintf("   (found %d, not found %d)", r.found, r.notFound)
		}
		fmt.Fprintf(b, "    %-7s %7d %7d %7d%s\n", k, r.ok, r.failed, r.unknown, extra)
	}
}

// writeFaultTable prints the faults injected by kind.
func writeFaultTable(b *strings.Builder, faults []Fault, kinds []string, netName string) {
	count := map[string]int{}
	var total time.Duration
	for _, f := range faults {
		count[f.Kind]++
		total += f.End - f.Start
	}
	fmt.Fprintf(b, "  faults: %d, %v in all\n", len(faults), total.Round(time.Millisecond))
	all := []string{faultKill, faultPause, faultPartition, faultNetem}
	for _, k := range all {
		enabled := false
		for _, e := range kinds {
			enabled = enabled || e == k
		}
		if enabled {
			fmt.Fprintf(b, "    %-10s %d\n", k, count[k])
		} else {
			fmt.Fprintf(b, "    %-10s NOT RUN (unavailable on network %s: see NOTE)\n", k, netName)
		}
	}
}

// saveArtifacts writes the history, the faults, porcupine's visualization
// and the server logs to a directory that outlives the test.
func saveArtifacts(t *testing.T, cfg runConfig, c *cluster, ops []Op, faults []Fault, res *Result) string {
	dir := cfg.out
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", fmt.Sprintf("rkv-chaos-%d-", cfg.seed))
	} else {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		t.Errorf("artifact directory: %v", err)
		return "(nowhere)"
	}
	sorted := append([]Op(nil), ops...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	var hist strings.Builder
	for _, op := range sorted {
		fmt.Fprintln(&hist, op)
	}
	for _, f := range faults {
		fmt.Fprintln(&hist, "fault", f)
	}
	if err := os.WriteFile(filepath.Join(dir, "history.txt"), []byte(hist.String()), 0o644); err != nil {
		t.Errorf("writing the history: %v", err)
	}
	if err := res.WriteVisualization(filepath.Join(dir, "linearizability.html"), faults); err != nil {
		t.Errorf("%v", err)
	}
	for _, n := range c.nodes {
		if b, err := os.ReadFile(n.log); err == nil {
			_ = os.WriteFile(filepath.Join(dir, n.name+".log"), b, 0o644)
		}
	}
	return dir
}
