// Package testcluster runs rkv servers in the test's process, on loopback
// and the soft provider: the first bootstraps the cluster map, the others
// join, and Start returns once the map holds them all with the shards
// balanced. Tests of the client, the commands and the servers' cluster
// behaviour share it.
package testcluster

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/clustermap/replica"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft" // the provider of the tests
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// Gossip declares a stopped server dead within about two seconds and
// converges in tens of milliseconds, yet a live server on a loaded machine
// (two cores, race detector, other packages' tests) is not suspected just
// because it answered a probe late: a suspect has a second to refute.
var Gossip = membership.Tuning{
	ProbeInterval:       250 * time.Millisecond,
	ProbeTimeout:        200 * time.Millisecond,
	GossipInterval:      20 * time.Millisecond,
	PushPullInterval:    300 * time.Millisecond,
	TCPTimeout:          time.Second,
	SuspicionMult:       4,
	GossipToTheDeadTime: time.Second,
}

// Raft elects a leader in a few hundred milliseconds.
var Raft = replica.Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
	LeaderLeaseTimeout: 150 * time.Millisecond, CommitTimeout: 5 * time.Millisecond}

// Logger is quiet unless RKV_TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("RKV_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// Options adjusts the cluster.
type Options struct {
	// Store is each server's store (Dir is set per server). Default: two
	// arenas of 4 MiB, 4096 index slots, 256 KiB leases.
	Store store.Options
	// Server, if set, adjusts each server's configuration last.
	Server func(*server.Config)
	// Settle bounds Start's wait for the cluster to settle. Default 30s.
	Settle time.Duration
}

// Cluster is servers in this process.
type Cluster struct {
	T    testing.TB
	Root string
	opts Options

	mu      sync.Mutex
	servers map[string]*Node
	order   []string
}

// Node is one server and its device; Server is nil while it is stopped.
type Node struct {
	Name       string
	Server     *server.Server
	dev        rdma.Device
	gossipPort int
	ctlAddr    string
}

// Start runs n servers named s1..sn and waits until the map holds them
// all, balanced. The cluster stops with the test.
func Start(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	if opts.Store.ArenaSize == 0 {
		opts.Store = store.Options{ArenaSize: 4 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 256 << 10}
	}
	c := &Cluster{T: t, Root: t.TempDir(), opts: opts, servers: map[string]*Node{}}
	t.Cleanup(c.stopAll)
	for i := 1; i <= n; i++ {
		c.Add(fmt.Sprintf("s%d", i))
	}
	c.WaitSettled(cmp.Or(opts.Settle, 30*time.Second))
	return c
}

func (c *Cluster) config(nd *Node, seeds []string) server.Config {
	st := c.opts.Store
	st.Dir = filepath.Join(c.Root, nd.Name)
	tuning := Gossip
	tuning.DeadRetention = time.Hour
	cfg := server.Config{
		Name:        nd.Name,
		Device:      nd.dev,
		ControlAddr: nd.ctlAddr,
		Store:       st,
		Membership:  membership.Config{BindPort: nd.gossipPort, Seeds: seeds, Tuning: tuning},
		Bootstrap:   len(seeds) == 0,
		Raft:        Raft,
		MoveTimeout: 5 * time.Second,
		Logger:      Logger(),
	}
	if c.opts.Server != nil {
		c.opts.Server(&cfg)
	}
	return cfg
}

// Add starts a new server: the first bootstraps the cluster, the others
// join it.
func (c *Cluster) Add(name string) *server.Server {
	c.T.Helper()
	nd := &Node{Name: name, ctlAddr: "127.0.0.1:0"}
	c.mu.Lock()
	c.servers[name] = nd
	c.order = append(c.order, name)
	c.mu.Unlock()
	c.start(nd, c.Seeds())
	return nd.Server
}

func (c *Cluster) start(nd *Node, seeds []string) {
	c.T.Helper()
	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		c.T.Fatal(err)
	}
	nd.dev = dev
	s, err := server.New(context.Background(), c.config(nd, seeds))
	if err != nil {
		_ = dev.Close()
		c.T.Fatalf("starting %s: %v", nd.Name, err)
	}
	c.mu.Lock()
	nd.Server = s
	nd.gossipPort = int(s.Membership().LocalNode().Addr.Port())
	nd.ctlAddr = s.ControlAddr()
	c.mu.Unlock()
}

// Seeds are the gossip addresses of the servers running.
func (c *Cluster) Seeds() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, name := range c.order {
		if s := c.servers[name].Server; s != nil {
			out = append(out, s.GossipAddr())
		}
	}
	return out
}

// ControlAddrs are the control addresses of the servers running, for a
// client made with client.Config.Endpoints.
func (c *Cluster) ControlAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, name := range c.order {
		if s := c.servers[name].Server; s != nil {
			out = append(out, s.ControlAddr())
		}
	}
	return out
}

// Server returns a running server, or nil.
func (c *Cluster) Server(name string) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nd := c.servers[name]; nd != nil {
		return nd.Server
	}
	return nil
}

// Running returns the servers running, by name.
func (c *Cluster) Running() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*server.Server
	for _, name := range c.order {
		if s := c.servers[name].Server; s != nil {
			out = append(out, s)
		}
	}
	return out
}

// Stop closes a server (a clean stop: it stays in the map).
func (c *Cluster) Stop(name string) {
	c.T.Helper()
	c.mu.Lock()
	nd := c.servers[name]
	s := nd.Server
	nd.Server = nil
	c.mu.Unlock()
	if s == nil {
		return
	}
	if err := s.Close(); err != nil {
		c.T.Errorf("closing %s: %v", name, err)
	}
	_ = nd.dev.Close()
}

// Restart starts a stopped server again on its data directory, gossip
// port and control address.
func (c *Cluster) Restart(name string) *server.Server {
	c.T.Helper()
	c.mu.Lock()
	nd := c.servers[name]
	c.mu.Unlock()
	c.start(nd, c.Seeds())
	return nd.Server
}

func (c *Cluster) stopAll() {
	c.mu.Lock()
	names := slices.Clone(c.order)
	c.mu.Unlock()
	for _, n := range names {
		c.Stop(n)
	}
}

// Map is the newest map any running server holds.
func (c *Cluster) Map() *clustermap.Map {
	var best *clustermap.Map
	for _, s := range c.Running() {
		if m := s.Map(); best == nil || m.Epoch() > best.Epoch() {
			best = m
		}
	}
	if best == nil {
		c.T.Fatal("no server running")
	}
	return best
}

// WaitSettled waits until every running server holds the same map, which
// names them all, with no move in progress and the shards balanced, and
// every server advertises its arenas.
func (c *Cluster) WaitSettled(d time.Duration) {
	c.T.Helper()
	WaitFor(c.T, d, "the cluster to settle", func() error {
		running := c.Running()
		m := running[0].Map()
		for _, s := range running {
			if srv, ok := m.Server(s.Name()); ok && srv.State == proto.ServerRemoved && srv.ID == s.ID() {
				continue // forgotten, not stopped yet
			}
			if got := s.Map().Epoch(); got != m.Epoch() {
				return fmt.Errorf("%s holds map epoch %d, %s %d", s.Name(), got, running[0].Name(), m.Epoch())
			}
			if !m.Member(s.Name()) {
				return fmt.Errorf("%s is not in the map: %v", s.Name(), m)
			}
			if o := s.Store().Options(); int64(len(s.Meta().Arenas)) != int64(o.ArenaCount)*o.UnitsPerArena() {
				return fmt.Errorf("%s advertises %d arena regions, want %d arenas of %d units", s.Name(), len(s.Meta().Arenas), o.ArenaCount, o.UnitsPerArena())
			}
		}
		if !m.Settled() {
			return fmt.Errorf("not settled: %v", m)
		}
		return nil
	})
}

// Client connects a client to the cluster; mod, if set, adjusts its
// configuration. It closes with the test.
func (c *Cluster) Client(t testing.TB, mod func(*client.Config)) *client.Client {
	t.Helper()
	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := client.Config{Seeds: c.Seeds(), Device: dev, Logger: Logger(), Membership: membership.Config{Tuning: Gossip}}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := client.New(ctx, cfg)
	if err != nil {
		_ = dev.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Close()
		_ = dev.Close()
	})
	// Wait until every running server and its arenas are in the
	// client's view, and the client holds the cluster's map.
	WaitFor(t, 20*time.Second, "the client's view", func() error {
		for _, s := range c.Running() {
			mb, ok := cl.View().Member(s.Name())
			if !ok || !mb.IsServer() || mb.Meta.Generation != s.Generation() || int64(len(mb.Meta.Arenas)) != int64(len(s.Store().Stats().Arenas))*s.Store().Options().UnitsPerArena() {
				return fmt.Errorf("%s not in the client's view with its generation and arenas", s.Name())
			}
		}
		if e, want := cl.Map().Epoch(), c.Map().Epoch(); e < want {
			return fmt.Errorf("the client holds map epoch %d, the cluster %d", e, want)
		}
		return nil
	})
	return cl
}

// WaitFor polls cond until it returns nil, failing the test after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
