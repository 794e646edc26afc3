package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func add(name string) *proto.MapCommand {
	return &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: name, ID: "id-" + name}}
}

func alwaysLive(string) bool { return true }

var fast = Tuning{HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond, LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 5 * time.Millisecond}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// tcpStream is Raft over plain TCP, as the server's control port carries it
// (without the Hello). Close closes the connections it accepted.
type tcpStream struct {
	net.Listener
	mu       sync.Mutex
	accepted []net.Conn
}

func (s *tcpStream) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err == nil {
		s.mu.Lock()
		s.accepted = append(s.accepted, c)
		s.mu.Unlock()
	}
	return c, err
}

func (s *tcpStream) Close() error {
	err := s.Listener.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.accepted {
		c.Close()
	}
	return err
}

func (s *tcpStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

// testNode is a node that can be stopped and started on the same dir.
type testNode struct {
	t     *testing.T
	id    string
	dir   string
	addr  string
	inmem *raft.InmemTransport // when the test cuts the network
	*Node
}

func (tn *testNode) start(bootstrap bool) {
	t := tn.t
	cfg := Config{Dir: tn.dir, ID: tn.id, Bootstrap: bootstrap, Tuning: fast, Logger: testLogger(t).With("node", tn.id)}
	if tn.inmem != nil {
		cfg.Transport = tn.inmem
	} else {
		ln, err := net.Listen("tcp", tn.addr)
		if err != nil {
			t.Fatal(err)
		}
		tn.addr = ln.Addr().String()
		cfg.Stream, cfg.Addr = &tcpStream{Listener: ln}, tn.addr
	}
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tn.Node = n
}

func (tn *testNode) stop() {
	if err := tn.Close(); err != nil {
		tn.t.Errorf("closing %s: %v", tn.id, err)
	}
	tn.Node = nil
}

func newTestNodes(t *testing.T, n int, inmem bool) []*testNode {
	nodes := make([]*testNode, n)
	for i := range nodes {
		nodes[i] = &testNode{t: t, id: fmt.Sprintf("id-n%d", i+1), dir: filepath.Join(t.TempDir(), "raft"), addr: "127.0.0.1:0"}
		if inmem {
			addr, tr := raft.NewInmemTransport(raft.ServerAddress(nodes[i].id))
			nodes[i].addr, nodes[i].inmem = string(addr), tr
		}
	}
	if inmem {
		for _, a := range nodes {
			for _, b := range nodes {
				if a != b {
					a.inmem.Connect(raft.ServerAddress(b.addr), b.inmem)
				}
			}
		}
	}
	t.Cleanup(func() {
		for _, tn := range nodes {
			if tn.Node != nil {
				tn.stop()
			}
		}
	})
	return nodes
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func leaderOf(t *testing.T, nodes []*testNode) *testNode {
	t.Helper()
	var l *testNode
	waitFor(t, "a leader", func() bool {
		for _, tn := range nodes {
			if tn.Node != nil && tn.IsLeader() {
				l = tn
				return true
			}
		}
		return false
	})
	return l
}

func propose(t *testing.T, n *testNode, c *proto.MapCommand) *clustermap.Map {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := n.Propose(ctx, c)
	if err != nil {
		t.Fatalf("proposing %v on %s: %v", c.Op, n.id, err)
	}
	return m
}

// onLeader runs the idempotent step on the leader of nodes, again on the
// next leader when leadership moved meanwhile: the fast tuning's 100 ms
// leader lease lapses on a machine starved by other tests, and the step is
// set-up, not what the test checks.
func onLeader(t *testing.T, nodes []*testNode, what string, step func(context.Context, *testNode) error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := step(ctx, leaderOf(t, nodes))
		cancel()
		switch {
		case err == nil:
			return
		case !errors.Is(err, ErrNotLeader) || time.Now().After(deadline):
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cluster3 bootstraps n1 and adds n2, n3 as voters, with the map naming
// them.
func cluster3(t *testing.T, nodes []*testNode) {
	nodes[0].start(true)
	nodes[1].start(false)
	nodes[2].start(false)
	addServer := func(name string) func(context.Context, *testNode) error {
		return func(ctx context.Context, l *testNode) error { _, err := l.Propose(ctx, add(name)); return err }
	}
	onLeader(t, nodes[:1], "adding n1 to the map", addServer("n1"))
	for i, tn := range nodes[1:] {
		onLeader(t, nodes[:i+1], "adding "+tn.id+" as a voter", func(ctx context.Context, l *testNode) error { return l.AddVoter(ctx, tn.id, tn.addr) })
		onLeader(t, nodes[:i+2], "adding "+tn.id+" to the map", addServer(tn.id[3:]))
	}
	for _, tn := range nodes {
		waitFor(t, tn.id+" to apply the map", func() bool { return len(tn.Map().Servers()) == 3 })
	}
}

func TestNodeReplicatesTheMap(t *testing.T) {
	nodes := newTestNodes(t, 3, false)
	cluster3(t, nodes)
	l := leaderOf(t, nodes)
	m := propose(t, l, &proto.MapCommand{Op: proto.MapStartMoves, Moves: clustermap.Plan(l.Map(), alwaysLive, 8)})
	if len(m.Moves()) != 8 {
		t.Fatalf("started %d moves", len(m.Moves()))
	}
	for _, tn := range nodes {
		waitFor(t, tn.id+" to reach the epoch", func() bool { return tn.Map().Epoch() == m.Epoch() })
	}
	// A follower refuses proposals, naming the leader.
	var f *testNode
	for _, tn := range nodes {
		if tn != l {
			f = tn
			break
		}
	}
	_, err := f.Propose(context.Background(), add("n9"))
	var nl *NotLeaderError
	if !errors.As(err, &nl) || !errors.Is(err, ErrNotLeader) || nl.LeaderID != l.id {
		t.Fatalf("a follower's proposal: %v", err)
	}
	// A refused command comes back as Apply's error, everywhere the same.
	if _, err := l.Propose(context.Background(), &proto.MapCommand{Op: proto.MapAddServer, Server: proto.MapServer{Name: "n2", ID: "other"}}); !errors.Is(err, clustermap.ErrIDMismatch) {
		t.Fatalf("adding n2 under another ID: %v", err)
	}
	if got := l.Map().Epoch(); got != m.Epoch() {
		t.Fatalf("a refused command moved the epoch to %d", got)
	}
	members, err := l.Members()
	if err != nil || len(members) != 3 {
		t.Fatalf("members %v, %v", members, err)
	}
	for _, tn := range nodes {
		if tn.soleVoter() {
			t.Errorf("%s counts itself the sole voter of three: it would campaign at its next start", tn.id)
		}
	}
}

// TestLeaderKilledDuringAJoin: the leader dies while a fourth server is
// being added; the survivors elect a leader, the map is intact, and the
// join completes through the new leader.
func TestLeaderKilledDuringAJoin(t *testing.T) {
	nodes := newTestNodes(t, 4, false)
	cluster3(t, nodes[:3])
	l := leaderOf(t, nodes[:3])
	before := l.Map()
	nodes[3].start(false)
	joined := make(chan error, 1)
	leader := l.Node
	go func() { joined <- leader.AddNonvoter(context.Background(), nodes[3].id, nodes[3].addr) }()
	l.stop()
	<-joined // either way: committed or not
	l2 := leaderOf(t, nodes)
	if l2 == nodes[3] {
		t.Fatal("a nonvoter became leader")
	}
	if got := l2.Map(); got.Epoch() < before.Epoch() || len(got.Servers()) != 3 {
		t.Fatalf("the new leader's map: %v (before %v)", got, before)
	}
	if err := l2.AddNonvoter(context.Background(), nodes[3].id, nodes[3].addr); err != nil {
		t.Fatal(err)
	}
	m := propose(t, l2, add("n4"))
	waitFor(t, "n4 to apply the map", func() bool { return nodes[3].Map().Epoch() == m.Epoch() })
	// The old leader comes back as a follower and catches up.
	l.start(false)
	waitFor(t, "the old leader to catch up", func() bool { return l.Map().Epoch() == m.Epoch() })
}

// TestMinorityCannotChangeTheMap: a voter cut off from the other two
// cannot commit; the majority can, and the minority learns the result
// when the partition heals.
func TestMinorityCannotChangeTheMap(t *testing.T) {
	nodes := newTestNodes(t, 3, true)
	cluster3(t, nodes)
	l := leaderOf(t, nodes)
	cut := func(on bool) {
		for _, tn := range nodes {
			if tn == l {
				continue
			}
			if on {
				l.inmem.Disconnect(raft.ServerAddress(tn.addr))
				tn.inmem.Disconnect(raft.ServerAddress(l.addr))
			} else {
				l.inmem.Connect(raft.ServerAddress(tn.addr), tn.inmem)
				tn.inmem.Connect(raft.ServerAddress(l.addr), l.inmem)
			}
		}
	}
	cut(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := l.Propose(ctx, add("n9"))
	cancel()
	if err == nil {
		t.Fatal("the isolated leader committed a change")
	}
	var majority []*testNode
	for _, tn := range nodes {
		if tn != l {
			majority = append(majority, tn)
		}
	}
	l2 := leaderOf(t, majority)
	m := propose(t, l2, add("n8"))
	if _, ok := l.Map().Server("n9"); ok {
		t.Fatal("the minority's change was applied")
	}
	cut(false)
	waitFor(t, "the old leader to learn the majority's map", func() bool { return l.Map().Epoch() >= m.Epoch() })
	if _, ok := l.Map().Server("n9"); ok {
		t.Fatal("the minority's change survived the heal")
	}
	if _, ok := l.Map().Server("n8"); !ok {
		t.Fatal("the majority's change was lost")
	}
}

// A node alone in its cluster elects itself when it opens, after its
// bootstrap and after a restart, rather than once Raft's heartbeat timeout
// (a minute here) passed without a leader. (A node of three does not count
// itself alone: TestNodeReplicatesTheMap.)
func TestSoleVoterElectsItselfAtOnce(t *testing.T) {
	slow := Tuning{HeartbeatTimeout: time.Minute, ElectionTimeout: time.Minute, LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 5 * time.Millisecond}
	dir := filepath.Join(t.TempDir(), "raft")
	open := func() *Node {
		_, tr := raft.NewInmemTransport("n1")
		n, err := Open(Config{Dir: dir, ID: "id-n1", Bootstrap: true, Transport: tr, Tuning: slow, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, when := range []string{"after its bootstrap", "after a restart"} {
		n := open()
		waitFor(t, "the sole voter to lead "+when, n.IsLeader)
		if got := n.raft.ReloadableConfig().HeartbeatTimeout; got != time.Minute {
			t.Errorf("%s: heartbeat timeout %v, want the configured minute back", when, got)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRestartKeepsTheMap: a node restarted on its directory comes back
// with the map it had, from snapshots and the log, before any leader
// speaks to it; a single-node cluster restarts on its own.
func TestRestartKeepsTheMap(t *testing.T) {
	nodes := newTestNodes(t, 1, false)
	n := nodes[0]
	n.start(true)
	l := leaderOf(t, nodes)
	propose(t, l, add("n1"))
	propose(t, l, add("n2"))
	m := l.Map()
	for range 3 { // enough moves to cross a snapshot
		plan := clustermap.Plan(m, alwaysLive, 200)
		m = propose(t, l, &proto.MapCommand{Op: proto.MapStartMoves, Moves: plan})
		var cmds []proto.MoveCommand
		for _, mv := range m.Moves() {
			cmds = append(cmds, mv.Command())
		}
		propose(t, l, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: cmds})
		m = propose(t, l, &proto.MapCommand{Op: proto.MapFinishMoves, Moves: cmds})
	}
	if err := n.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	m = propose(t, l, add("n3"))
	want, _ := m.Encode()
	n.stop()
	n.start(true) // Bootstrap is ignored on a restart
	waitFor(t, "the restarted node's map", func() bool { return n.Map().Epoch() == m.Epoch() })
	got, _ := n.Map().Encode()
	if string(got) != string(want) {
		t.Fatal("the map after a restart differs")
	}
	leaderOf(t, nodes)
	propose(t, n, add("n4"))
}

func TestLogStore(t *testing.T) {
	s, err := openLogStore(t.TempDir(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if first, _ := s.FirstIndex(); first != 0 {
		t.Fatalf("empty store: first %d", first)
	}
	at := time.Unix(1700000000, 5)
	var logs []*raft.Log
	for i := uint64(5); i <= 20; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: i / 3, Type: raft.LogCommand, Data: []byte(fmt.Sprint("cmd", i)), AppendedAt: at})
	}
	logs[3].Extensions = []byte("ext")
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	if first != 5 || last != 20 {
		t.Fatalf("first %d last %d", first, last)
	}
	var got raft.Log
	if err := s.GetLog(8, &got); err != nil || got.Term != 2 || string(got.Data) != "cmd8" || string(got.Extensions) != "ext" || !got.AppendedAt.Equal(at) {
		t.Fatalf("entry 8: %+v, %v", got, err)
	}
	if err := s.DeleteRange(5, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.GetLog(10, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("deleted entry: %v", err)
	}
	if first, _ = s.FirstIndex(); first != 11 {
		t.Fatalf("after the delete, first %d", first)
	}
	if _, err := s.GetUint64([]byte("term")); err == nil || err.Error() != "not found" {
		t.Fatalf("unset key: %v", err)
	}
	if err := s.SetUint64([]byte("term"), 42); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("term")); v != 42 || err != nil {
		t.Fatalf("term %d, %v", v, err)
	}
	for _, bad := range [][]byte{nil, {9}, encodeLog(logs[0])[:20], append(encodeLog(logs[0]), 0)} {
		if err := decodeLog(1, bad, &got); err == nil {
			t.Fatalf("decoded %x", bad)
		}
	}
}

// TestLogStoreRefusesWritesAfterPebbleFatal: Pebble's Fatalf does not exit
// the server; the log takes no writes after it, reads go on.
func TestLogStoreRefusesWritesAfterPebbleFatal(t *testing.T) {
	s, err := openLogStore(t.TempDir(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.StoreLog(&raft.Log{Index: 1, Term: 1, Data: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	s.logger.Fatalf("manifest write failed") // the default logger would exit here
	for what, err := range map[string]error{
		"StoreLog":    s.StoreLog(&raft.Log{Index: 2, Term: 1}),
		"DeleteRange": s.DeleteRange(1, 1),
		"SetUint64":   s.SetUint64([]byte("term"), 2),
	} {
		if err == nil || !strings.Contains(err.Error(), "manifest write failed") {
			t.Errorf("%s after a Pebble fatal error: %v, want refused", what, err)
		}
	}
	var got raft.Log
	if err := s.GetLog(1, &got); err != nil || string(got.Data) != "a" {
		t.Fatalf("reads go on: %+v, %v", got, err)
	}
}

// FuzzDecodeLog: the log decoder never panics and round-trips what it
// accepts.
func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(&raft.Log{Term: 3, Type: raft.LogCommand, Data: []byte("x"), Extensions: []byte("y"), AppendedAt: time.Unix(5, 0)}))
	f.Add(encodeLog(&raft.Log{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if err := decodeLog(7, b, &l); err != nil {
			return
		}
		var again raft.Log
		if err := decodeLog(7, encodeLog(&l), &again); err != nil || again.Term != l.Term || string(again.Data) != string(l.Data) {
			t.Fatalf("re-encoded %+v decodes to %+v, %v", l, again, err)
		}
	})
}

// TestOwnAddressNeedsNoLookup: a node asks AddrOf for others only. A
// server's AddrOf reads gossip, which starts after Raft: asked for the
// node itself, it missed, and Raft logged a warning for each vote and
// append it encoded (ten at every fresh start).
func TestOwnAddressNeedsNoLookup(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var asked sync.Map
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, err := Open(Config{Dir: filepath.Join(t.TempDir(), "raft"), ID: "id-n1", Addr: ln.Addr().String(), Bootstrap: true,
		Stream: &tcpStream{Listener: ln}, Tuning: fast, Logger: logger,
		AddrOf: func(id string) (string, bool) {
			asked.Store(id, true)
			return "", false
		}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sole voter to lead", n.IsLeader)
	propose(t, &testNode{t: t, id: "id-n1", Node: n}, add("n1"))
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := asked.Load("id-n1"); ok {
		t.Error("AddrOf was asked for the node's own ID")
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), "no address known") {
		t.Errorf("the log warns of an unknown address:\n%s", logs.String())
	}
}

// lockedWriter serializes writes to w: Raft logs from several goroutines.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
