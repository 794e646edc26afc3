// rkv-server processes started for a comparison, and the rkv client as a loadgen target.

package target

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/freeport"
	"github.com/rkv-io/rkv/loadgen/rkvtarget"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft" // the comparison runs on the soft provider
)

// BuildRKV builds cmd/rkv-server of the rkv module this module depends
// on (its replace directory) into outDir and returns the binary's path.
func BuildRKV(ctx context.Context, outDir string) (string, error) {
	if err := BuildCommands(ctx, outDir, "rkv-server"); err != nil {
		return "", err
	}
	return filepath.Join(outDir, "rkv-server"), nil
}

// BuildCommands builds the named commands (cmd/<name>) of the rkv module
// this module depends on into outDir. It builds inside that module, so
// the commands are linked with the main module's own dependency versions.
func BuildCommands(ctx context.Context, outDir string, names ...string) error {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/rkv-io/rkv").Output()
	if err != nil {
		return fmt.Errorf("locating the rkv module: go list -m: %w", err)
	}
	root := strings.TrimSpace(string(out))
	args := []string{"build", "-o", outDir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s in %s: %w\n%s", strings.Join(args, " "), root, err, b)
	}
	return nil
}

// ServerOptions configure one rkv-server process (see rkv-server
// --help for the flags they become).
type ServerOptions struct {
	// Binary is the rkv-server executable. Required.
	Binary string
	// Name is the server's cluster name. Required.
	Name string
	// Dir holds the server's data directory (Dir/data) and log
	// (Dir/server.log). Required; created if missing.
	Dir string
	// Join is gossip addresses to join (none: a new cluster).
	Join []string
	// Sync is --sync: "always", "batch" or "none". Default "always".
	Sync string
	// ArenaSize and ArenaCount are --arena-size (bytes) and
	// --arena-count. Defaults 256 MiB and 4.
	ArenaSize  int64
	ArenaCount int
	// IndexSlots is --index-slots. Default 1<<16.
	IndexSlots uint64
	// LeaseSize is --lease-size. Default 2 MiB (a 1 MiB value fits).
	LeaseSize int64
}

func (o *ServerOptions) defaults() error {
	if o.Binary == "" || o.Name == "" || o.Dir == "" {
		return fmt.Errorf("rkv-server: Binary, Name and Dir are required (got %q, %q, %q)", o.Binary, o.Name, o.Dir)
	}
	if o.Sync == "" {
		o.Sync = "always"
	}
	if o.ArenaSize <= 0 {
		o.ArenaSize = 256 << 20
	}
	if o.ArenaCount <= 0 {
		o.ArenaCount = 4
	}
	if o.IndexSlots == 0 {
		o.IndexSlots = 1 << 16
	}
	if o.LeaseSize <= 0 {
		o.LeaseSize = 2 << 20
	}
	return nil
}

// Server is a running rkv-server process.
type Server struct {
	// Name is its cluster name; Gossip its gossip address, the seed
	// others join through; Metrics its --metrics-addr, which serves
	// /readyz and /metrics.
	Name, Gossip, Metrics string
	arenas                int // --arena-count: WaitRegistered waits for each
	proc                  *Process
}

// StartServer starts an rkv-server on free loopback ports (soft
// provider, JSON logs) and returns at once: WaitReady and
// WaitRegistered wait for its start.
func StartServer(opts ServerOptions) (*Server, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("rkv-server %s: %w", opts.Name, err)
	}
	var ports [2]int
	for i := range ports {
		for ports[i] == 0 || i > 0 && ports[i] == ports[0] { // a port freed may be handed out again
			p, err := freeport.Loopback()
			if err != nil {
				return nil, err
			}
			ports[i] = p
		}
	}
	gossip, metrics := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	args := []string{"--name", opts.Name, "--data-dir", filepath.Join(opts.Dir, "data"), "--provider", "soft",
		"--gossip-addr", gossip, "--metrics-addr", metrics, "--sync", opts.Sync, "--log-format", "json",
		"--arena-size", fmt.Sprint(opts.ArenaSize), "--arena-count", fmt.Sprint(opts.ArenaCount),
		"--index-slots", fmt.Sprint(opts.IndexSlots), "--lease-size", fmt.Sprint(opts.LeaseSize)}
	if len(opts.Join) > 0 {
		args = append(args, "--join", strings.Join(opts.Join, ","))
	} else {
		args = append(args, "--bootstrap", "--replicas", "1") // one copy, as the single Redis it is compared with keeps
	}
	p, err := StartProcess("rkv-server "+opts.Name, filepath.Join(opts.Dir, "server.log"), opts.Binary, args...)
	if err != nil {
		return nil, err
	}
	return &Server{Name: opts.Name, Gossip: gossip, Metrics: metrics, arenas: opts.ArenaCount, proc: p}, nil
}

// Process is the server's process.
func (s *Server) Process() *Process { return s.proc }

// readyPoll is how often WaitReady asks: the resolution of its time.
const readyPoll = 2 * time.Millisecond

// probeClient asks the servers' metrics addresses.
var probeClient = &http.Client{Timeout: 5 * time.Second}

// WaitReady polls the server's /readyz until it answers 200 (the server
// serves: an arena is registered and the cluster map holds it) and
// returns when that answer arrived. Called right after StartServer, that
// is when the server became ready, to within readyPoll and a loopback
// HTTP round trip.
func (s *Server) WaitReady(ctx context.Context) (time.Time, error) {
	var at time.Time
	err := s.poll(ctx, "/readyz answering 200", readyPoll, func(ctx context.Context) (bool, error) {
		code, body, err := s.get(ctx, "/readyz")
		if err != nil {
			return false, err
		}
		if code != http.StatusOK {
			return false, fmt.Errorf("/readyz: %d %s", code, strings.TrimSpace(string(body)))
		}
		at = time.Now()
		return true, nil
	})
	return at, err
}

// WaitRegistered polls the server's /metrics until every arena is
// registered and returns when the store opened and each arena registered,
// as the server measured them.
func (s *Server) WaitRegistered(ctx context.Context) (Registration, error) {
	var r Registration
	err := s.poll(ctx, fmt.Sprintf("%d arenas registered", s.arenas), 20*time.Millisecond, func(ctx context.Context) (bool, error) {
		body, err := s.metrics(ctx)
		if err != nil {
			return false, err
		}
		if r, err = ReadRegistration(bytes.NewReader(body)); err != nil {
			return false, fmt.Errorf("/metrics: %w", err)
		}
		if len(r.Arenas) < s.arenas {
			return false, fmt.Errorf("%d of %d arenas registered", len(r.Arenas), s.arenas)
		}
		return true, nil
	})
	return r, err
}

// Metric returns the sum of the samples of the counter or gauge name on
// the server's /metrics (0 when it has none yet).
func (s *Server) Metric(ctx context.Context, name string) (float64, error) {
	body, err := s.metrics(ctx)
	if err != nil {
		return 0, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("/metrics of %s: %w", s.Name, err)
	}
	sum := 0.0
	for _, m := range fams[name].GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum, nil
}

// metrics is the body of the server's /metrics.
func (s *Server) metrics(ctx context.Context) ([]byte, error) {
	code, body, err := s.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics of %s: %d %s", s.Name, code, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// get asks the server's metrics address for path.
func (s *Server) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Metrics+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// poll calls probe every interval until it reports done, failing when
// ctx ends or the process exits first (with probe's last error).
func (s *Server) poll(ctx context.Context, what string, interval time.Duration, probe func(context.Context) (bool, error)) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		done, last := probe(ctx)
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s of %s: %w (last: %v); log %s:\n%s", what, s.proc.Name, ctx.Err(), last, s.proc.LogPath, s.proc.LogTail(20))
		case <-s.proc.Exited():
			return fmt.Errorf("%s exited while waiting for %s: %v (last: %v); log %s:\n%s", s.proc.Name, what, s.proc.err, last, s.proc.LogPath, s.proc.LogTail(20))
		case <-tick.C:
		}
	}
}

// Registration is when a server's store opened and each of its arenas
// registered, from its metrics rkv_store_open_time_seconds and
// rkv_arena_registration_seconds{arena}.
type Registration struct {
	Opened time.Time
	// Arenas is the time from Opened to each registered arena's
	// registration, by arena ID.
	Arenas map[int]time.Duration
}

// First is when the first arena registered, All when the last did (the
// zero time when none has).
func (r Registration) First() time.Time {
	if len(r.Arenas) == 0 {
		return time.Time{}
	}
	return r.Opened.Add(slices.Min(slices.Collect(maps.Values(r.Arenas))))
}

// All: see First.
func (r Registration) All() time.Time {
	if len(r.Arenas) == 0 {
		return time.Time{}
	}
	return r.Opened.Add(slices.Max(slices.Collect(maps.Values(r.Arenas))))
}

// ReadRegistration reads a Registration from a /metrics body (the
// Prometheus text format).
func ReadRegistration(metrics io.Reader) (Registration, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(metrics)
	if err != nil {
		return Registration{}, err
	}
	r := Registration{Arenas: map[int]time.Duration{}}
	open := fams["rkv_store_open_time_seconds"]
	if len(open.GetMetric()) != 1 {
		return Registration{}, fmt.Errorf("%d rkv_store_open_time_seconds series, want 1", len(open.GetMetric()))
	}
	sec, frac := math.Modf(open.GetMetric()[0].GetGauge().GetValue())
	r.Opened = time.Unix(int64(sec), int64(frac*1e9))
	for _, m := range fams["rkv_arena_registration_seconds"].GetMetric() {
		var id string
		for _, l := range m.GetLabel() {
			if l.GetName() == "arena" {
				id = l.GetValue()
			}
		}
		n, err := strconv.Atoi(id)
		if err != nil {
			return Registration{}, fmt.Errorf("rkv_arena_registration_seconds with arena label %q: %w", id, err)
		}
		r.Arenas[n] = time.Duration(m.GetGauge().GetValue() * float64(time.Second))
	}
	return r, nil
}

// Close stops the server (SIGTERM, then SIGKILL after 20s) and reports
// an unclean exit.
func (s *Server) Close() error { return s.proc.Stop(20 * time.Second) }

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	// Server is every server's options; Name, Dir and Join are set per
	// server (Dir becomes Server.Dir/<name>).
	Server ServerOptions
	// Servers is the number of servers. Default 1.
	Servers int
	// Timeout bounds the start. Default 2m.
	Timeout time.Duration
}

// Cluster is a set of running rkv-server processes.
type Cluster struct {
	// Servers are its servers, the first one the seed the others joined.
	Servers []*Server
}

// PortTaken reports whether err is a server's exit because a port picked
// for it (freeport.Loopback) was taken before it bound it: any process's
// outgoing connection may take a free port. Such a start is worth doing
// again on other ports, up to StartAttempts times.
func PortTaken(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
}

// StartAttempts bounds the starts of a server whose ports were taken.
const StartAttempts = 3

// StartCluster starts opts.Servers servers, the later ones joining the
// first, and waits until each has registered every arena. A cluster one
// of whose servers found a port taken is started again from empty data
// directories (PortTaken).
func StartCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, opts)
		if !PortTaken(err) || attempt == StartAttempts {
			return c, err
		}
		if err := os.RemoveAll(opts.Server.Dir); err != nil {
			return nil, err
		}
	}
}

func startCluster(ctx context.Context, opts ClusterOptions) (_ *Cluster, err error) {
	if opts.Servers <= 0 {
		opts.Servers = 1
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	c := &Cluster{}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	root := opts.Server.Dir
	for i := range opts.Servers {
		so := opts.Server
		so.Name = fmt.Sprintf("node%d", i+1)
		so.Dir = filepath.Join(root, so.Name)
		if i > 0 {
			so.Join = []string{c.Servers[0].Gossip}
		}
		s, err := StartServer(so)
		if err != nil {
			return nil, err
		}
		c.Servers = append(c.Servers, s)
		if i == 0 {
			if _, err := s.WaitReady(ctx); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range c.Servers {
		if _, err := s.WaitRegistered(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Seeds are the servers' gossip addresses.
func (c *Cluster) Seeds() []string {
	var s []string
	for _, srv := range c.Servers {
		s = append(s, srv.Gossip)
	}
	return s
}

// Close stops every server.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.Servers {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// RKVOptions configure an RKV target.
type RKVOptions struct {
	// Seeds are gossip addresses of the cluster. Required.
	Seeds []string
	// Conns is the client's connections per server
	// (client.Config.ConnsPerServer): its requests in flight per server.
	// Set it to the loadgen concurrency, as a Redis client's pool has a
	// connection per worker. Default 1.
	Conns int
	// Servers and Arenas: NewRKV waits until the client's view has
	// Servers servers advertising Arenas arenas each. Defaults 1 and 1.
	Servers, Arenas int
	// Logger receives the client's logs. Default: warnings and errors
	// to stderr.
	Logger *slog.Logger
}

// RKV is a loadgen target on one rkv client (client.Client, safe for
// concurrent use); Counters reports the RDMA READs it posted and the
// attempts it retried.
type RKV struct {
	c   *client.Client
	t   rkvtarget.Target
	dev rdma.Device
}

// OpenDevice opens the soft RDMA device a client of the comparison runs
// on (loopback).
func OpenDevice() (rdma.Device, error) {
	return rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0", Links: client.SoftLinks})
}

// NewRKV creates the client and waits for its view (bounded by ctx).
func NewRKV(ctx context.Context, opts RKVOptions) (*RKV, error) {
	if len(opts.Seeds) == 0 {
		return nil, errors.New("rkv target: no seeds")
	}
	if opts.Conns <= 0 {
		opts.Conns = 1
	}
	if opts.Servers <= 0 {
		opts.Servers = 1
	}
	if opts.Arenas <= 0 {
		opts.Arenas = 1
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	dev, err := OpenDevice()
	if err != nil {
		return nil, fmt.Errorf("rkv target: %w", err)
	}
	c, err := client.New(ctx, client.Config{Seeds: opts.Seeds, Device: dev, ConnsPerServer: opts.Conns, Logger: opts.Logger})
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("rkv target: joining %v: %w", opts.Seeds, err)
	}
	r := &RKV{c: c, t: rkvtarget.Target{Clients: []*client.Client{c}}, dev: dev}
	if err := WaitView(ctx, c, opts.Servers, opts.Arenas); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Client is the target's client.
func (r *RKV) Client() *client.Client { return r.c }

// WaitView waits until c sees at least servers servers, each
// advertising at least arenas arenas, and holds a map of them with no
// shard move in progress (a measurement during moves would measure them).
func WaitView(ctx context.Context, c *client.Client, servers, arenas int) error {
	for {
		n := 0
		for _, s := range c.Membership().View().Servers() {
			if len(s.Meta.Arenas) >= arenas {
				n++
			}
		}
		m := c.Map()
		if n >= servers && len(m.Servers()) >= servers && m.Settled() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rkv target: waiting for %d servers with %d arenas each in the view (have %d) and a settled map (%v): %w", servers, arenas, n, m, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		_ = c.WaitMap(ctx, m.Epoch()+1, 50*time.Millisecond)
	}
}

// Get reads key; an absent key is loadgen.ErrNotFound.
func (r *RKV) Get(ctx context.Context, key []byte) ([]byte, error) { return r.t.Get(ctx, key) }

// Put writes key.
func (r *RKV) Put(ctx context.Context, key, value []byte) error { return r.t.Put(ctx, key, value) }

// MultiGet reads keys with one client.MultiGet (loadgen.MultiGetter); an
// absent key's value is nil.
func (r *RKV) MultiGet(ctx context.Context, keys [][]byte) ([][]byte, error) {
	return rkvtarget.Client{C: r.c}.MultiGet(ctx, keys)
}

// MultiPut writes keys with one client.MultiPut (loadgen.MultiPutter).
func (r *RKV) MultiPut(ctx context.Context, keys, values [][]byte) error {
	return rkvtarget.Client{C: r.c}.MultiPut(ctx, keys, values)
}

// CounterReads is the Counters name of the RDMA READs posted.
const CounterReads = rkvtarget.CounterReads

// Counters reports the RDMA READs the client has posted (CounterReads)
// and the attempts it retried ("retries_get", "retries_put", ...)
// (loadgen.Counters).
func (r *RKV) Counters() map[string]uint64 { return r.t.Counters() }

// Close closes the client.
func (r *RKV) Close() error { return errors.Join(r.c.Close(), r.dev.Close()) }
