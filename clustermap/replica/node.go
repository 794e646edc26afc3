// Package replica is one server's replica of the cluster map, kept by
// hashicorp/raft: the log in a Pebble database of its own, file snapshots,
// Propose for the leader, and for everyone the current map, applied as the
// log commits. The data path never waits on it: readers and writers use
// the map they already hold.
package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
)

// Config configures a Node. Zero fields take the defaults documented on
// each.
type Config struct {
	// Dir holds the Raft state: the log and stable store (Dir/log, a
	// Pebble database) and snapshots (Dir/snapshots). Required.
	Dir string
	// ID is this node's Raft server ID: the server's data directory ID,
	// never its name, so that a server that lost its data comes back as
	// a stranger rather than as a voter with an empty log. Required.
	ID string
	// Addr is the address other nodes reach this one at, as the
	// transport understands it. Required unless Transport is given.
	Addr string
	// Bootstrap creates a cluster of this node alone when Dir holds no
	// Raft state; ignored when it does (a restart).
	Bootstrap bool
	// Stream carries Raft's connections (raft.NewNetworkTransport runs
	// over it). Its Close must close every connection it accepted, which
	// the transport's handlers wait on. AddrOf, when set, tells the
	// current address of a server ID, taking precedence over the address
	// recorded in the Raft configuration (servers whose address changes
	// across restarts). Required unless Transport is given.
	Stream raft.StreamLayer
	AddrOf func(id string) (addr string, ok bool)
	// Transport replaces Stream (tests: raft.NewInmemTransport).
	Transport raft.Transport
	// Tuning sets Raft's timing.
	Tuning Tuning
	// Logger receives the node's and Raft's logs. Default slog.Default().
	Logger *slog.Logger
}

// Tuning sets Raft's timing; zero fields take the defaults. Failure
// detection and elections need a few heartbeats: with the defaults a new
// leader takes over 1-3 s after the old one died.
type Tuning struct {
	HeartbeatTimeout   time.Duration // default 1s
	ElectionTimeout    time.Duration // default 1s
	LeaderLeaseTimeout time.Duration // default 500ms
	CommitTimeout      time.Duration // default 50ms
	// SnapshotThreshold is how many log entries trigger a snapshot.
	// Default 1024: the map changes rarely, a snapshot is ~10 KiB.
	SnapshotThreshold uint64
}

func (t Tuning) withDefaults() Tuning {
	if t.HeartbeatTimeout <= 0 {
		t.HeartbeatTimeout = time.Second
	}
	if t.ElectionTimeout <= 0 {
		t.ElectionTimeout = time.Second
	}
	if t.LeaderLeaseTimeout <= 0 {
		t.LeaderLeaseTimeout = min(500*time.Millisecond, t.HeartbeatTimeout)
	}
	if t.CommitTimeout <= 0 {
		t.CommitTimeout = 50 * time.Millisecond
	}
	if t.SnapshotThreshold == 0 {
		t.SnapshotThreshold = 1024
	}
	return t
}

// Errors of a Node.
var (
	// ErrNotLeader: Propose and the membership calls run on the leader
	// only. The error is a *NotLeaderError naming the leader, if known.
	ErrNotLeader = errors.New("clustermap: not the Raft leader")
	// ErrClosed: the node is closed.
	ErrClosed = errors.New("clustermap: node closed")
)

// NotLeaderError says who leads, when this node knows.
type NotLeaderError struct {
	LeaderID, LeaderAddr string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "clustermap: not the Raft leader, and no leader is known (no quorum?)"
	}
	return fmt.Sprintf("clustermap: not the Raft leader; the leader is %s at %s", e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// Node is this server's replica of the map. Its methods are safe for
// concurrent use.
type Node struct {
	cfg   Config
	log   *slog.Logger
	raft  *raft.Raft
	store *logStore
	trans raft.Transport
	safe  *safeCommitTransport // trans as Raft uses it
	fsm   *fsm
	state bool // Dir held Raft state at Open

	closeOnce sync.Once
	closeErr  error
}

// Open starts the node: it opens the log, restores the latest snapshot and
// replays the log it holds (the map it reaches may lag the cluster's until
// the leader's next heartbeat), and joins Raft. With Bootstrap and no
// state in Dir, it makes a cluster of itself; without either it waits for
// a leader to add it (AddVoter, AddNonvoter).
func Open(cfg Config) (*Node, error) {
	if cfg.Dir == "" || cfg.ID == "" {
		return nil, errors.New("clustermap: Config.Dir and Config.ID are required")
	}
	if cfg.Transport == nil && (cfg.Stream == nil || cfg.Addr == "") {
		return nil, errors.New("clustermap: Config.Stream and Config.Addr (or Config.Transport) are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tune := cfg.Tuning.withDefaults()
	n := &Node{cfg: cfg, log: cfg.Logger, fsm: newFSM(cfg.Logger)}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("clustermap: %w", err)
	}
	var err error
	if n.store, err = openLogStore(filepath.Join(cfg.Dir, "log"), cfg.Logger); err != nil {
		return nil, err
	}
	hlog := newRaftLogger(cfg.Logger)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, hlog)
	if err != nil {
		n.store.Close()
		return nil, fmt.Errorf("clustermap: snapshot store in %s: %w", cfg.Dir, err)
	}
	if n.trans = cfg.Transport; n.trans == nil {
		tcfg := &raft.NetworkTransportConfig{Stream: cfg.Stream, MaxPool: 3, Timeout: 10 * time.Second, Logger: hlog}
		if cfg.AddrOf != nil {
			tcfg.ServerAddressProvider = addrProvider{self: cfg.ID, addr: cfg.Addr, of: cfg.AddrOf}
		}
		n.trans = raft.NewNetworkTransportWithConfig(tcfg)
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = hlog
	rc.HeartbeatTimeout, rc.ElectionTimeout = tune.HeartbeatTimeout, tune.ElectionTimeout
	rc.LeaderLeaseTimeout, rc.CommitTimeout = tune.LeaderLeaseTimeout, tune.CommitTimeout
	rc.SnapshotThreshold = tune.SnapshotThreshold
	rc.TrailingLogs = 256
	existing, err := raft.HasExistingState(n.store, n.store, snaps)
	if err != nil {
		n.closeTransport()
		n.store.Close()
		return nil, fmt.Errorf("clustermap: reading the Raft state in %s: %w", cfg.Dir, err)
	}
	n.state = existing
	if n.safe, err = newSafeCommitTransport(n.trans); err != nil {
		n.closeTransport()
		n.store.Close()
		return nil, err
	}
	if n.raft, err = raft.NewRaft(rc, n.fsm, n.store, n.store, snaps, n.safe); err != nil {
		n.safe.close()
		n.closeTransport()
		n.store.Close()
		return nil, fmt.Errorf("clustermap: starting Raft: %w", err)
	}
	switch {
	case existing:
		n.log.Info("cluster map: restarting from the Raft state on disk", "dir", cfg.Dir, "epoch", n.Map().Epoch())
	case cfg.Bootstrap:
		boot := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.ID), Address: n.trans.LocalAddr()}}}
		if err := n.raft.BootstrapCluster(boot).Error(); err != nil {
			_ = n.Close()
			return nil, fmt.Errorf("clustermap: bootstrapping a new cluster: %w", err)
		}
		n.log.Info("cluster map: bootstrapped a new cluster of this server alone", "id", cfg.ID)
	default:
		n.log.Info("cluster map: no Raft state yet: waiting for the leader to add this server", "id", cfg.ID)
	}
	if n.soleVoter() {
		n.campaign()
	}
	return n, nil
}

// soleVoter reports whether this node is the only voter of its latest
// Raft configuration: a cluster it bootstrapped, or one that never grew.
func (n *Node) soleVoter() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	voters, me := 0, false
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
			me = me || s.ID == raft.ServerID(n.cfg.ID)
		}
	}
	return voters == 1 && me
}

// campaign has a sole voter elect itself now. Raft's follower campaigns
// only once a heartbeat timeout (1-2 s by default) passed without word
// from a leader, even with no one to hear from, so a one-server cluster
// served that much later after a bootstrap and after every restart. A
// shorter timeout set at run time makes the follower look at once
// (ReloadConfig notifies it, and it finds it never heard from a leader);
// the timeout is set back right away, before a leader could matter.
func (n *Node) campaign() {
	rc := n.raft.ReloadableConfig()
	short := rc
	short.HeartbeatTimeout--
	if err := n.raft.ReloadConfig(short); err != nil {
		n.log.Debug("cluster map: could not hasten the first election; Raft holds it after its heartbeat timeout", "err", err)
		return
	}
	if err := n.raft.ReloadConfig(rc); err != nil {
		n.log.Warn("cluster map: restoring Raft's heartbeat timeout", "timeout", rc.HeartbeatTimeout, "err", err)
	}
}

// addrProvider tells Raft's transport where a server is: this node at
// its own Addr, others where AddrOf says. AddrOf may not know this node
// yet (a server's gossip starts after Raft), and Raft encodes its own
// address in its votes: each miss was a warning in a fresh server's log.
type addrProvider struct {
	self, addr string
	of         func(id string) (string, bool)
}

func (p addrProvider) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if string(id) == p.self {
		return raft.ServerAddress(p.addr), nil
	}
	if a, ok := p.of(string(id)); ok {
		return raft.ServerAddress(a), nil
	}
	return "", fmt.Errorf("clustermap: no address known for server %s", id)
}

// HasState reports whether Dir held Raft state when the node opened: a
// restart, rather than a bootstrap or a first join.
func (n *Node) HasState() bool { return n.state }

// LeadershipChanged returns the channel Raft signals on when this node
// gains the lead (true) or loses it (false). A signal that finds the last
// one unread replaces it, so a reader sees the latest transition, not
// every one. It is one channel: one goroutine reads it.
func (n *Node) LeadershipChanged() <-chan bool { return n.raft.LeaderCh() }

// Map returns the latest map this node applied; clustermap.Empty before the first.
// It never blocks.
func (n *Node) Map() *clustermap.Map { return n.fsm.current() }

// Changed returns a channel closed at the next change of Map.
func (n *Node) Changed() <-chan struct{} { return n.fsm.changed() }

// Propose commits a map command through the Raft log and returns the map
// it produced (the same map when the command changed nothing), or Apply's
// error, or ErrNotLeader (a *NotLeaderError) on a node that does not lead.
// It blocks until the command is committed and applied here, or ctx ends.
func (n *Node) Propose(ctx context.Context, c *proto.MapCommand) (*clustermap.Map, error) {
	b, err := proto.EncodeMapCommand(c)
	if err != nil {
		return nil, err
	}
	f := n.raft.Apply(b, timeoutOf(ctx))
	if err := n.futureErr(f); err != nil {
		return nil, err
	}
	res, ok := f.Response().(applyResult)
	if !ok {
		return nil, fmt.Errorf("clustermap: internal error: FSM answered %T", f.Response())
	}
	return res.m, res.err
}

func timeoutOf(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return 10 * time.Second
}

// futureErr maps Raft's leadership errors to a *NotLeaderError.
func (n *Node) futureErr(f raft.Future) error {
	err := f.Error()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		id, addr := n.Leader()
		return fmt.Errorf("%w (%v)", &NotLeaderError{LeaderID: id, LeaderAddr: addr}, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	}
	return fmt.Errorf("clustermap: %w", err)
}

// Barrier waits until this node has applied every entry committed before
// the call (leader only): a new leader calls it before acting on its map.
func (n *Node) Barrier(ctx context.Context) error { return n.futureErr(n.raft.Barrier(timeoutOf(ctx))) }

// VerifyLeader confirms that this node led the Raft group at some time
// after the call began: a quorum answered its heartbeats, sent after the
// call, as their leader, so any leader after it is elected after the call
// began (a server's read lease rests on this). It blocks for
// a round trip to a quorum, or until the node steps down (a partitioned
// leader, after LeaderLeaseTimeout); the error is then a *NotLeaderError.
func (n *Node) VerifyLeader() error { return n.futureErr(n.raft.VerifyLeader()) }

// IsLeader reports whether this node leads the Raft group now.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the leader's ID and address as this node knows them;
// empty when it knows none.
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}

// Member is one server of the Raft configuration.
type Member struct {
	ID, Addr string
	Voter    bool
}

// Members returns the Raft configuration as this node knows it.
func (n *Node) Members() ([]Member, error) {
	f := n.raft.GetConfiguration()
	if err := n.futureErr(f); err != nil {
		return nil, err
	}
	var out []Member
	for _, s := range f.Configuration().Servers {
		out = append(out, Member{ID: string(s.ID), Addr: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}

// AddVoter adds a server as a voter, or promotes a nonvoter (leader only;
// it blocks until the configuration change commits or ctx ends).
func (n *Node) AddVoter(ctx context.Context, id, addr string) error {
	return n.futureErr(n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeoutOf(ctx)))
}

// AddNonvoter adds a server that receives the log but does not vote
// (leader only).
func (n *Node) AddNonvoter(ctx context.Context, id, addr string) error {
	return n.futureErr(n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, timeoutOf(ctx)))
}

// DemoteVoter makes a voter a nonvoter (leader only; it blocks until the
// configuration change commits or ctx ends).
func (n *Node) DemoteVoter(ctx context.Context, id string) error {
	return n.futureErr(n.raft.DemoteVoter(raft.ServerID(id), 0, timeoutOf(ctx)))
}

// RemoveMember removes a server from the Raft configuration (leader only).
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	return n.futureErr(n.raft.RemoveServer(raft.ServerID(id), 0, timeoutOf(ctx)))
}

// Stats is the node's Raft state, for status output.
type Stats struct {
	State        string // Leader, Follower, Candidate, Shutdown
	Term         uint64
	AppliedIndex uint64
	LastContact  time.Time // with the leader; zero on the leader
}

// Stats returns the node's Raft state.
func (n *Node) Stats() Stats {
	return Stats{State: n.raft.State().String(), Term: n.raft.CurrentTerm(), AppliedIndex: n.raft.AppliedIndex(), LastContact: n.raft.LastContact()}
}

// Close leaves Raft (without telling the others: a restart is not a
// removal), then closes the transport and the log. Close after Close
// returns the first result.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		err := n.raft.Shutdown().Error()
		n.safe.close()
		errs := []error{err, n.closeTransport(), n.store.Close()}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// closeTransport closes the network transport Open made: its pooled
// outgoing connections, then its stream (whose Close must close the
// connections it accepted: the transport's handlers only return when
// their connection does).
func (n *Node) closeTransport() error {
	nt, ok := n.trans.(*raft.NetworkTransport)
	if !ok || n.cfg.Transport != nil {
		return nil
	}
	nt.CloseStreams()
	return nt.Close()
}

// fsm is the Raft state machine: the current map.
type fsm struct {
	log *slog.Logger
	m   atomic.Pointer[clustermap.Map]

	mu sync.Mutex
	ch chan struct{} // closed at the next change
}

func newFSM(log *slog.Logger) *fsm {
	f := &fsm{log: log, ch: make(chan struct{})}
	f.m.Store(clustermap.Empty)
	return f
}

func (f *fsm) current() *clustermap.Map { return f.m.Load() }

func (f *fsm) changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ch
}

func (f *fsm) set(m *clustermap.Map) {
	f.m.Store(m)
	f.mu.Lock()
	close(f.ch)
	f.ch = make(chan struct{})
	f.mu.Unlock()
}

type applyResult struct {
	m   *clustermap.Map
	err error
}

// Apply applies one committed command. Raft calls it from one goroutine,
// in log order, on every replica.
func (f *fsm) Apply(l *raft.Log) any {
	c, err := proto.DecodeMapCommand(l.Data)
	if err != nil {
		// Every replica refuses the same bytes alike.
		f.log.Error("cluster map: undecodable command in the Raft log: skipped", "index", l.Index, "err", err)
		return applyResult{m: f.current(), err: err}
	}
	old := f.current()
	m, err := clustermap.Apply(old, c)
	if err != nil {
		f.log.Debug("cluster map: command refused", "op", c.Op.String(), "index", l.Index, "err", err)
		return applyResult{m: old, err: err}
	}
	if m != old {
		f.set(m)
	}
	return applyResult{m: m}
}

// Snapshot returns the current map; Raft persists it from another
// goroutine, which is safe since maps are immutable.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) { return mapSnapshot{f.current()}, nil }

// Restore replaces the map with a snapshot's.
func (f *fsm) Restore(r io.ReadCloser) error {
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, proto.MaxMapBytes+1))
	if err != nil {
		return fmt.Errorf("clustermap: reading a snapshot: %w", err)
	}
	m := clustermap.Empty
	if len(b) > 0 {
		if m, err = clustermap.Decode(b); err != nil {
			return fmt.Errorf("clustermap: snapshot: %w", err)
		}
	}
	f.set(m)
	return nil
}

type mapSnapshot struct{ m *clustermap.Map }

func (s mapSnapshot) Persist(sink raft.SnapshotSink) error {
	var b []byte
	if s.m.Epoch() > 0 {
		var err error
		if b, err = s.m.Encode(); err != nil {
			_ = sink.Cancel()
			return err
		}
	}
	if _, err := sink.Write(b); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (mapSnapshot) Release() {}
