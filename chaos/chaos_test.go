//go:build chaos

// TestChaos: three rkv-server processes, concurrent clients and a nemesis, then the checker.

package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft"
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
	out          string        // CHAOS_OUT: where failure artifacts go, default a new temporary directory
}

func loadConfig(t *testing.T) runConfig {
	cfg := runConfig{duration: 60 * time.Second, seed: uint64(time.Now().UnixNano()), clients: 5, keys: 12, net: "auto",
		checkTimeout: 60 * time.Second, maxFault: 5 * time.Second}
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

// clientTuning detects failures faster than memberlist's local profile.
var clientTuning = membership.Tuning{
	ProbeInterval:       300 * time.Millisecond,
	ProbeTimeout:        150 * time.Millisecond,
	GossipInterval:      50 * time.Millisecond,
	PushPullInterval:    2 * time.Second,
	TCPTimeout:          2 * time.Second,
	SuspicionMult:       3,
	GossipToTheDeadTime: 5 * time.Second,
}

func quietLogger() *slog.Logger {
	if os.Getenv("RKV_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// chaosClient is a client and the RDMA device it runs on.
type chaosClient struct {
	*client.Client
	dev rdma.Device
}

func (cc *chaosClient) Close() error { return errors.Join(cc.Client.Close(), cc.dev.Close()) }

func newClient(ctx context.Context, c *cluster, name string) (*chaosClient, error) {
	ip := c.net.clientIP()
	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: ip + ":0"})
	if err != nil {
		return nil, err
	}
	cl, err := client.New(ctx, client.Config{
		Seeds:      c.seeds(),
		Name:       name,
		Device:     dev,
		Membership: membership.Config{BindAddr: ip, Tuning: clientTuning},
		Logger:     quietLogger(),
	})
	if err != nil {
		_ = dev.Close()
		return nil, err
	}
	return &chaosClient{Client: cl, dev: dev}, nil
}

const opTimeout = 3 * time.Second

// mix is a workload's share of puts and deletes, in percent; the rest
// are gets.
type mix struct{ put, delete int }

// keyPicker chooses the index of a worker's next key.
type keyPicker func(rng *rand.Rand) int

// uniformKeys picks each of n keys alike.
func uniformKeys(n int) keyPicker { return func(rng *rand.Rand) int { return rng.IntN(n) } }

// weightedKeys picks key i with probability weights[i] (they sum to 1).
func weightedKeys(weights []float64) keyPicker {
	cdf := make([]float64, len(weights))
	sum := 0.0
	for i, w := range weights {
		sum += w
		cdf[i] = sum
	}
	return func(rng *rand.Rand) int {
		return min(sort.SearchFloat64s(cdf, rng.Float64()*sum), len(cdf)-1)
	}
}

// worker issues random operations on a few keys until ctx ends.
func worker(ctx context.Context, id int, cl *client.Client, keys []string, pick keyPicker, m mix, rng *rand.Rand, h *History) {
	seq := 0
	for ctx.Err() == nil {
		key := keys[pick(rng)]
		kind := Get
		switch r := rng.IntN(100); {
		case r < m.put:
			kind = Put
		case r < m.put+m.delete:
			kind = Delete
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
// and arenas advertised, and holds a map of every server with no move in
// progress.
func waitRecovered(ctx context.Context, c *cluster, cl *client.Client) error {
	for {
		alive := 0
		for _, m := range cl.Membership().View().Servers() {
			if m.State == membership.StateAlive && m.Meta.Index != nil && len(m.Meta.Arenas) == 2 {
				alive++
			}
		}
		m := cl.Map()
		if alive == len(c.nodes) && len(m.Servers()) == len(c.nodes) && m.Settled() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d servers alive with their regions, map %v: %w", alive, len(c.nodes), m, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		_ = cl.WaitMap(ctx, m.Epoch()+1, 100*time.Millisecond)
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

// scenario is one chaos run's workload and faults.
type scenario struct {
	seed     uint64
	duration time.Duration
	clients  int // client.Clients, each its own gossip member
	workers  int // goroutines per client, sharing it
	keys     int
	mix      mix
	kinds    []string // fault kinds
	// netFaults: the scenario wants the network's faults (partitions,
	// netem), where the network has them.
	netFaults bool
	// A fault lasts between minFault and maxFault, with a pause of
	// between minGap and maxGap before the next.
	minFault, maxFault, minGap, maxGap time.Duration
	// serverArgs are more flags for every server.
	serverArgs []string
	// servers is how many servers run (default 3).
	servers int
	// weights, when set, is each key's share of the operations (hot
	// keys); by default the workers pick keys uniformly.
	weights []float64
	// schedule, when set, injects the faults instead of the random
	// nemesis (kinds, minFault... are then unused), and the load stops
	// when it is done; duration only bounds it.
	schedule schedule
	// recoveryTimeout bounds the wait, once healed, for every server alive
	// and a settled map (default 60s).
	recoveryTimeout time.Duration
}

// schedule is a scripted nemesis: it decides its faults from what the
// cluster map says rather than at random.
type schedule interface {
	fmt.Stringer
	// run injects the faults into nm's cluster, recording each with
	// nm.record, and returns once it is done or ctx ends; obs is a client
	// that does no operations, for reading the cluster map.
	run(ctx context.Context, nm *nemesis, obs *client.Client) error
	// report writes what the faults did to the workload, from the
	// history, and returns the failures it saw.
	report(b *strings.Builder, ops []Op) []string
}

func (sc scenario) String() string {
	if sc.schedule != nil {
		return fmt.Sprintf("seed %d (CHAOS_SEED=%d reproduces the schedule's draws), at most %v, %d servers, %d clients x %d goroutines, %d keys, %d%% put %d%% delete, %v",
			sc.seed, sc.seed, sc.duration, max(sc.servers, 3), sc.clients, sc.workers, sc.keys, sc.mix.put, sc.mix.delete, sc.schedule)
	}
	return fmt.Sprintf("seed %d (CHAOS_SEED=%d reproduces the schedule), %v, %d clients x %d goroutines, %d keys, %d%% put %d%% delete, faults %v of %v-%v every %v-%v",
		sc.seed, sc.seed, sc.duration, sc.clients, sc.workers, sc.keys, sc.mix.put, sc.mix.delete, sc.kinds, sc.minFault, sc.maxFault, sc.minGap, sc.maxGap)
}

// quietSoft keeps rdma/soft's warnings about the QPs a fault breaks out of
// the test's output.
func quietSoft(t *testing.T) {
	if os.Getenv("RKV_TEST_LOG") == "" {
		prev := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
		t.Cleanup(func() { slog.SetDefault(prev) })
	}
}

// runScenario starts sc.servers servers (three by default) on nw, runs sc's workers and nemesis,
// heals, reads every key and checks the history; it fails the test on an
// anomaly, a server that died on its own or a nemesis error, saving the
// artifacts. It returns the summary.
func runScenario(t *testing.T, cfg runConfig, server string, nw network, netNote string, sc scenario) string {
	t.Helper()
	n := sc.servers
	if n == 0 {
		n = 3
	}
	c := newCluster(t, server, nw, n)
	c.args = sc.serverArgs
	defer c.stopAll()
	up := time.Now()
	for _, n := range c.nodes {
		if err := c.start(n); err != nil {
			t.Fatalf("%v\n%s", err, c.logTail(30))
		}
	}
	ctx0, cancel0 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel0()
	var clients []*chaosClient
	defer func() {
		for _, cl := range clients {
			_ = cl.Close()
		}
	}()
	for i := range sc.clients {
		cl, err := newClient(ctx0, c, fmt.Sprintf("chaos-client-%d", i))
		if err != nil {
			t.Fatalf("client %d: %v\n%s", i, err, c.logTail(30))
		}
		clients = append(clients, cl)
	}
	var err error
	if err = waitRecovered(ctx0, c, clients[0].Client); err != nil {
		t.Fatalf("the cluster did not come up: %v\n%s", err, c.logTail(30))
	}
	// Placing the replicas takes most of a run's set-up: say how long.
	t.Logf("cluster up: %d servers started, the map settled (epoch %d) in %v", n, clients[0].Map().Epoch(), time.Since(up).Round(time.Millisecond))
	keys := make([]string, sc.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%02d", i)
	}

	pick := uniformKeys(len(keys))
	if sc.weights != nil {
		pick = weightedKeys(sc.weights)
	}
	var obs *chaosClient
	if sc.schedule != nil {
		if obs, err = newClient(ctx0, c, "chaos-observer"); err != nil {
			t.Fatalf("observer client: %v\n%s", err, c.logTail(30))
		}
		clients = append(clients, obs)
	}

	h := NewHistory()
	nm := &nemesis{c: c, h: h, rng: rand.New(rand.NewPCG(sc.seed, 1)), logf: t.Logf,
		cfg: nemesisConfig{kinds: sc.kinds, minFault: sc.minFault, maxFault: sc.maxFault, minGap: sc.minGap, maxGap: sc.maxGap}}
	ctx, cancel := context.WithTimeout(context.Background(), sc.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i, cl := range clients[:sc.clients] {
		for w := range sc.workers {
			id := i*sc.workers + w
			wg.Go(func() {
				worker(ctx, id, cl.Client, keys, pick, sc.mix, rand.New(rand.NewPCG(sc.seed, uint64(100+id))), h)
			})
		}
	}
	nemDone := make(chan struct{})
	go func() {
		defer close(nemDone)
		if sc.schedule == nil {
			nm.run(ctx)
			return
		}
		if err := sc.schedule.run(ctx, nm, obs.Client); err != nil {
			nm.record(Fault{}, fmt.Errorf("schedule: %w", err))
		}
		cancel() // the schedule is done: so is the load
	}()
	<-ctx.Done()
	<-nemDone
	wg.Wait()
	runEnd := h.Now()

	// Heal, recover, read every key.
	t0 := time.Now()
	if err := nm.healAll(); err != nil {
		t.Fatalf("healing: %v\n%s", err, c.logTail(30))
	}
	rctx, rcancel := context.WithTimeout(context.Background(), cmp.Or(sc.recoveryTimeout, 60*time.Second))
	defer rcancel()
	fin, err := newClient(rctx, c, "chaos-final")
	if err != nil {
		t.Fatalf("final client: %v\n%s", err, c.logTail(30))
	}
	clients = append(clients, fin)
	if err := waitRecovered(rctx, c, fin.Client); err != nil {
		t.Fatalf("recovery (seed %d): %v; server logs in %s\n%s", sc.seed, err, saveLogs(t, cfg, c), c.logTail(30))
	}
	finalReads(fin.Client, sc.clients*sc.workers, keys, h, time.Now().Add(30*time.Second))
	recovered := time.Since(t0)
	died := c.exited()

	ops := h.Ops()
	faults, nemErrs := nm.report()
	t1 := time.Now()
	res := Check(ops, CheckOptions{Timeout: cfg.checkTimeout})
	checkTook := time.Since(t1)

	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary: seed %d, %v of faults and load, network %s\n", sc.seed, runEnd.Round(time.Millisecond), nw.name())
	if netNote != "" {
		fmt.Fprintf(&b, "  NOTE: %s\n", netNote)
	}
	writeOpTable(&b, ops)
	writeFaultTable(&b, faults, sc, nw)
	var schedFails []string
	if sc.schedule != nil {
		schedFails = sc.schedule.report(&b, ops)
	} else {
		writeFaultToWrite(&b, ops, faults, faultKill)
		writeFaultToWrite(&b, ops, faults, faultPause)
	}
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
	for _, f := range schedFails {
		fmt.Fprintf(&b, "  SCHEDULE FAILURE: %s\n", f)
	}
	t.Log(b.String())

	if len(res.Anomalies) > 0 || len(died) > 0 || len(nemErrs) > 0 || len(schedFails) > 0 {
		dir := saveArtifacts(t, cfg, c, ops, faults, &res, fin.Client.Map(), keys)
		t.Fatalf("chaos run failed (seed %d): %d anomalies, %d servers died, %d nemesis errors, %d schedule failures; history, visualization and server logs in %s",
			sc.seed, len(res.Anomalies), len(died), len(nemErrs), len(schedFails), dir)
	}
	return b.String()
}

// TestChaos: five clients on twelve keys under every fault the network
// allows.
func TestChaos(t *testing.T) {
	cfg := loadConfig(t)
	quietSoft(t)
	nw, netNote := chooseNetwork(t, cfg)
	t.Cleanup(func() {
		if err := nw.close(); err != nil {
			t.Errorf("removing the %s network: %v", nw.name(), err)
		}
	})
	sc := scenario{seed: cfg.seed, duration: cfg.duration, clients: cfg.clients, workers: 1, keys: cfg.keys, mix: mix{put: 50, delete: 10},
		kinds: append([]string{faultKill, faultPause}, nw.faultKinds()...), netFaults: true,
		minFault: min(500*time.Millisecond, cfg.maxFault), maxFault: cfg.maxFault, minGap: time.Second, maxGap: 3 * time.Second}
	t.Logf("chaos: %v", sc)
	runScenario(t, cfg, buildServer(t, t.TempDir()), nw, netNote, sc)
}

// TestChaosRestarts: the case that lost acknowledged writes before the
// cluster map (issue 11): one client shared by six goroutines on 60 keys,
// 50% get, 40% put, 10% delete, and a server killed with SIGKILL and
// restarted on its data directory and ports, or stopped with SIGSTOP for
// 0.3-2 s, every 2-5 s. CHAOS_RESTART_RUNS runs (default 5) of
// CHAOS_DURATION each, with seeds CHAOS_SEED, CHAOS_SEED+1, ...; the
// even-numbered runs' servers run --sync none, which must lose nothing to
// a kill -9 either (it did, until each commit was written out before its
// acknowledgement).
func TestChaosRestarts(t *testing.T) {
	cfg := loadConfig(t)
	runs := 5
	if v := os.Getenv("CHAOS_RESTART_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("CHAOS_RESTART_RUNS=%q: want a positive integer", v)
		}
		runs = n
	}
	quietSoft(t)
	nw := loopback{}
	server := buildServer(t, t.TempDir())
	var summaries []string
	for run := range runs {
		sync := "always"
		if run%2 == 1 {
			sync = "none"
		}
		sc := scenario{seed: cfg.seed + uint64(run), duration: cfg.duration, clients: 1, workers: 6, keys: 60, mix: mix{put: 40, delete: 10},
			kinds: []string{faultKill, faultPause}, minFault: 300 * time.Millisecond, maxFault: 2 * time.Second, minGap: 2 * time.Second, maxGap: 5 * time.Second,
			serverArgs: []string{"--sync", sync}}
		t.Logf("restart run %d of %d, --sync %s: %v", run+1, runs, sync, sc)
		summaries = append(summaries, fmt.Sprintf("run %d, %s", run+1, runScenario(t, cfg, server, nw, "", sc)))
	}
	t.Logf("%d restart runs, 0 anomalies:\n%s", runs, strings.Join(summaries, "\n"))
}

// TestChaosReplicated: three servers keeping three copies of every key
// (--replicas 3), one client shared by six goroutines on 60 keys, and a
// server killed with SIGKILL, or paused with SIGSTOP, for 6-9 s, longer
// than gossip's verdict, its read lease and the failover take, then
// restarted on its data directory or resumed: its shards fail over to a
// backup, are copied back onto the others, and again onto it once it is
// back; a resumed primary finds its shards gone and serves no read of them
// (its read lease ended before the failover).
func TestChaosReplicated(t *testing.T) {
	cfg := loadConfig(t)
	quietSoft(t)
	sc := scenario{seed: cfg.seed, duration: cfg.duration, clients: 1, workers: 6, keys: 60, mix: mix{put: 40, delete: 10},
		kinds: []string{faultKill, faultPause}, minFault: 6 * time.Second, maxFault: 9 * time.Second, minGap: 3 * time.Second, maxGap: 6 * time.Second,
		serverArgs: []string{"--replicas", "3"}}
	t.Logf("chaos at three replicas: %v", sc)
	runScenario(t, cfg, buildServer(t, t.TempDir()), loopback{}, "", sc)
}

// TestChaosReplicatedOnQP is TestChaosReplicated with the primaries'
// forwards on QPs (--forward-on-qp): a backup killed or paused with a
// forward's SEND in flight, a primary whose kept QP sessions lead to a
// process that restarted.
func TestChaosReplicatedOnQP(t *testing.T) {
	cfg := loadConfig(t)
	quietSoft(t)
	sc := scenario{seed: cfg.seed, duration: cfg.duration, clients: 1, workers: 6, keys: 60, mix: mix{put: 40, delete: 10},
		kinds: []string{faultKill, faultPause}, minFault: 6 * time.Second, maxFault: 9 * time.Second, minGap: 3 * time.Second, maxGap: 6 * time.Second,
		serverArgs: []string{"--replicas", "3", "--forward-on-qp"}}
	t.Logf("chaos at three replicas, forwards on QPs: %v", sc)
	runScenario(t, cfg, buildServer(t, t.TempDir()), loopback{}, "", sc)
}

// TestChaosPausedThroughFailover: TestChaosReplicated with pauses only, of
// 4.8-5.6 s, which end about when the paused server's shards fail over
// (gossip's verdict and the failover timeout, and the read lease 4.5 s
// after its last grant): the server resumes with commits queued while its
// Raft replica applies the failover a few milliseconds before its store
// gives the shards up. A commit applied in between, with no backup in the
// new map to forward it to, was acknowledged and lost (a CI run of
// TestChaosReplicated, 2026-12-06; this scenario found it again in 2 of
// 8 runs of 120 s).
func TestChaosPausedThroughFailover(t *testing.T) {
	cfg := loadConfig(t)
	quietSoft(t)
	sc := scenario{seed: cfg.seed, duration: cfg.duration, clients: 1, workers: 6, keys: 60, mix: mix{put: 40, delete: 10},
		kinds: []string{faultPause}, minFault: 4800 * time.Millisecond, maxFault: 5600 * time.Millisecond, minGap: 2 * time.Second, maxGap: 4 * time.Second,
		serverArgs: []string{"--replicas", "3"}}
	t.Logf("chaos at three replicas, pauses through the failover: %v", sc)
	runScenario(t, cfg, buildServer(t, t.TempDir()), loopback{}, "", sc)
}

// TestChaosReplicatedFive: five servers keeping three copies of every
// key, the same client and mix, and a server killed or paused for 6-9 s
// every 8-12 s: long enough apart that the previous fault's shards have
// their three copies again (re-replication takes a second or two here)
// before the next fault, which may hit another server, so that every
// fault meets a fully replicated cluster. Its servers run --sync none:
// the index log, replayed after each kill, under backups and failovers
// (the other replicated scenarios run --sync always).
func TestChaosReplicatedFive(t *testing.T) {
	cfg := loadConfig(t)
	quietSoft(t)
	sc := scenario{seed: cfg.seed, duration: cfg.duration, clients: 1, workers: 6, keys: 60, mix: mix{put: 40, delete: 10},
		kinds: []string{faultKill, faultPause}, minFault: 6 * time.Second, maxFault: 9 * time.Second, minGap: 8 * time.Second, maxGap: 12 * time.Second,
		serverArgs: []string{"--replicas", "3", "--sync", "none"}, servers: 5}
	t.Logf("chaos on five servers at three replicas, --sync none: %v", sc)
	runScenario(t, cfg, buildServer(t, t.TempDir()), loopback{}, "", sc)
}

// writeFaultToWrite prints, for each fault of kind (a kill, a pause), how
// long after it every key had a put acknowledged again (the slowest key is
// one of the faulty server's: its time is the fault to the first write
// after a failover, or after the restart or resumption), and the median
// and maximum over those faults.
func writeFaultToWrite(b *strings.Builder, ops []Op, faults []Fault, kind string) {
	var waits []time.Duration
	for _, f := range faults {
		if f.Kind != kind {
			continue
		}
		first := map[string]time.Duration{}
		keys := map[string]bool{}
		for _, op := range ops {
			if op.Kind != Put || op.Final {
				continue
			}
			keys[op.Key] = true
			if op.Outcome == OK && op.Call >= f.Start {
				if d, ok := first[op.Key]; !ok || op.Return-f.Start < d {
					first[op.Key] = op.Return - f.Start
				}
			}
		}
		if len(first) < len(keys) {
			fmt.Fprintf(b, "  %s of %s at %v: %d of %d keys had no put acknowledged after it\n", kind, f.Node, f.Start.Round(time.Millisecond), len(keys)-len(first), len(keys))
			continue
		}
		slowest := slices.Max(slices.Collect(maps.Values(first)))
		waits = append(waits, slowest)
		fmt.Fprintf(b, "  %s of %s at %v (%s): every key written again %v after it\n", kind, f.Node, f.Start.Round(time.Millisecond), f.Detail, slowest.Round(time.Millisecond))
	}
	if len(waits) > 0 {
		slices.Sort(waits)
		fmt.Fprintf(b, "  %s to every key written again: p50 %v, max %v over %d\n", kind, waits[len(waits)/2].Round(time.Millisecond), waits[len(waits)-1].Round(time.Millisecond), len(waits))
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
func writeFaultTable(b *strings.Builder, faults []Fault, sc scenario, nw network) {
	count := map[string]int{}
	var total time.Duration
	for _, f := range faults {
		count[f.Kind]++
		total += f.End - f.Start
	}
	fmt.Fprintf(b, "  faults: %d, %v in all\n", len(faults), total.Round(time.Millisecond))
	all := []string{faultKill, faultPause, faultPartition, faultNetem}
	for _, k := range all {
		switch {
		case slices.Contains(sc.kinds, k):
			fmt.Fprintf(b, "    %-10s %d\n", k, count[k])
		case !sc.netFaults || k == faultKill || k == faultPause || slices.Contains(nw.faultKinds(), k):
			fmt.Fprintf(b, "    %-10s not in this scenario\n", k)
		default:
			fmt.Fprintf(b, "    %-10s NOT RUN (unavailable on network %s: see NOTE)\n", k, nw.name())
		}
	}
}

// saveArtifacts writes the history, the faults, porcupine's visualization,
// the server logs and, from the final map m, each key's shard and owners to
// a directory that outlives the test.
func saveArtifacts(t *testing.T, cfg runConfig, c *cluster, ops []Op, faults []Fault, res *Result, m *clustermap.Map, keys []string) string {
	dir := saveLogs(t, cfg, c)
	if dir == "" {
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
	// The shards' owners the servers' logs name, key by key: what a lost
	// write's diagnosis starts from.
	var owners strings.Builder
	fmt.Fprintf(&owners, "final map: %v\n", m)
	for _, k := range keys {
		if !m.Bootstrapped() {
			break
		}
		sh := proto.ShardOf([]byte(k))
		info := m.Shard(sh)
		fmt.Fprintf(&owners, "%s: %v, owners %v since epoch %d", k, sh, info.Owners, info.Since)
		if info.Move != nil {
			fmt.Fprintf(&owners, ", moving: %+v", *info.Move)
		}
		owners.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "keys.txt"), []byte(owners.String()), 0o644); err != nil {
		t.Errorf("writing the keys' shards: %v", err)
	}
	return dir
}

// saveLogs copies the servers' logs into CHAOS_OUT, or a new directory
// under the system's temporary one, and returns it ("" if it could not).
func saveLogs(t *testing.T, cfg runConfig, c *cluster) string {
	dir := cfg.out
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", fmt.Sprintf("rkv-chaos-%d-", cfg.seed))
	} else {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		t.Errorf("artifact directory: %v", err)
		return ""
	}
	for _, n := range c.nodes {
		if b, err := os.ReadFile(n.log); err == nil {
			_ = os.WriteFile(filepath.Join(dir, n.name+".log"), b, 0o644)
		}
	}
	return dir
}
