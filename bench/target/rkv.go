// rkv-server processes started for a comparison, and the rkv client as a loadgen target.

package target

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/freeport"
	"github.com/rkv-io/rkv/loadgen/rkvtarget"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft" // the comparison runs on the soft provider
)

// BuildRKV builds cmd/rkv-server of the rkv module this module depends
// on (its replace directory) into outDir and returns the binary's path.
// It builds inside that module, so the server is linked with the main
// module's own dependency versions.
func BuildRKV(ctx context.Context, outDir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/rkv-io/rkv").Output()
	if err != nil {
		return "", fmt.Errorf("locating the rkv module: go list -m: %w", err)
	}
	root := strings.TrimSpace(string(out))
	bin := filepath.Join(outDir, "rkv-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/rkv-server")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/rkv-server in %s: %w\n%s", root, err, b)
	}
	return bin, nil
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
	// others join through.
	Name, Gossip string
	proc         *Process
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
	port, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	gossip := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"--name", opts.Name, "--data-dir", filepath.Join(opts.Dir, "data"), "--provider", "soft",
		"--gossip-addr", gossip, "--sync", opts.Sync, "--log-format", "json",
		"--arena-size", fmt.Sprint(opts.ArenaSize), "--arena-count", fmt.Sprint(opts.ArenaCount),
		"--index-slots", fmt.Sprint(opts.IndexSlots), "--lease-size", fmt.Sprint(opts.LeaseSize)}
	if len(opts.Join) > 0 {
		args = append(args, "--join", strings.Join(opts.Join, ","))
	} else {
		args = append(args, "--bootstrap")
	}
	p, err := StartProcess("rkv-server "+opts.Name, filepath.Join(opts.Dir, "server.log"), opts.Binary, args...)
	if err != nil {
		return nil, err
	}
	return &Server{Name: opts.Name, Gossip: gossip, proc: p}, nil
}

// Process is the server's process.
func (s *Server) Process() *Process { return s.proc }

// WaitReady waits for the server's "ready" log line (it serves and has
// joined the cluster) and returns when it was logged.
func (s *Server) WaitReady(ctx context.Context) (time.Time, error) {
	return s.waitMsg(ctx, "ready")
}

// WaitRegistered waits for the "arenas registered" log line (every
// arena is registered and advertised) and returns when it was logged.
func (s *Server) WaitRegistered(ctx context.Context) (time.Time, error) {
	return s.waitMsg(ctx, "arenas registered")
}

// WaitFirstArena waits for the first "arena ready" log line (an arena
// is registered: its data can be read) and returns when it was logged.
func (s *Server) WaitFirstArena(ctx context.Context) (time.Time, error) {
	return s.waitMsg(ctx, "arena ready")
}

// waitMsg waits for the JSON log line with message msg and returns its
// time.
func (s *Server) waitMsg(ctx context.Context, msg string) (time.Time, error) {
	var at time.Time
	_, err := s.proc.WaitLog(ctx, fmt.Sprintf("log message %q", msg), func(line string) bool {
		t, ok := logLine(line, msg)
		if ok {
			at = t
		}
		return ok
	})
	return at, err
}

// logLine reports whether line is a JSON log record with message msg,
// and its time.
func logLine(line, msg string) (time.Time, bool) {
	if !strings.Contains(line, msg) {
		return time.Time{}, false
	}
	var rec struct {
		Time time.Time `json:"time"`
		Msg  string    `json:"msg"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != msg {
		return time.Time{}, false
	}
	return rec.Time, true
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

// StartCluster starts opts.Servers servers, the later ones joining the
// first, and waits until each has registered every arena.
func StartCluster(ctx context.Context, opts ClusterOptions) (_ *Cluster, err error) {
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
	return rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
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

// CounterReads is the Counters name of the RDMA READs posted.
const CounterReads = rkvtarget.CounterReads

// Counters reports the RDMA READs the client has posted (CounterReads)
// and the attempts it retried ("retries_get", "retries_put", ...)
// (loadgen.Counters).
func (r *RKV) Counters() map[string]uint64 { return r.t.Counters() }

// Close closes the client.
func (r *RKV) Close() error { return errors.Join(r.c.Close(), r.dev.Close()) }
