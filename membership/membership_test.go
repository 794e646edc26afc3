package membership

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/internal/testlog"
	"github.com/rkv-io/rkv/proto"
)

// TestMain checks that no goroutine outlives the tests. memberlist's
// Shutdown does not wait for a probe in flight, which ends within its
// probe interval scaled by memberlist's awareness of its own health (up to
// 8 times, on loaded cores): such goroutines get that long to end.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(8*250*time.Millisecond + time.Second) // patient probes every 250 ms
		err := goleak.Find()
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fast makes a loopback cluster converge in tens of milliseconds and
// declare a silent node dead within a second or two, with margins for two
// loaded cores under the race detector.
var fast = Tuning{
	ProbeInterval:       100 * time.Millisecond,
	ProbeTimeout:        80 * time.Millisecond,
	GossipInterval:      20 * time.Millisecond,
	PushPullInterval:    300 * time.Millisecond,
	TCPTimeout:          time.Second,
	SuspicionMult:       3,
	GossipToTheDeadTime: time.Second,
	DeadRetention:       time.Second,
}

var (
	keyA = bytes.Repeat([]byte{0xa1}, 32)
	keyB = bytes.Repeat([]byte{0xb2}, 16)
	keyC = bytes.Repeat([]byte{0xc3}, 24)
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func serverMeta(i, arenas int) proto.NodeMeta {
	m := proto.NodeMeta{
		Role:        proto.RoleServer,
		RKVVersion:  "test",
		ControlAddr: fmt.Sprintf("127.0.0.1:%d", 7400+i),
		Provider:    "soft",
		Endpoint:    proto.Endpoint{Addr: fmt.Sprintf("127.0.0.1:%d", 7500+i)},
		Generation:  uint64(100 + i),
		Index: &proto.IndexRegion{
			Addr:     0x7f00_0000_0000 + uint64(i)<<36,
			RKey:     uint32(0x1000 + i),
			Geometry: proto.IndexGeometry{Slots: 1 << 16, Neighborhood: proto.DefaultNeighborhood, Seed: uint64(i) * 0x9e3779b97f4a7c15},
		},
	}
	for a := range arenas {
		m.Arenas = append(m.Arenas, proto.ArenaRegion{
			ID:     uint16(a),
			Addr:   0x7e00_0000_0000 + uint64(i)<<36 + uint64(a)<<30,
			Length: 1 << 30,
			RKey:   uint32(i)<<16 | uint32(a),
		})
	}
	return m
}

type nodeOpt func(*Config)

func withKey(primary []byte, extra ...[]byte) nodeOpt {
	return func(c *Config) { c.SecretKey, c.ExtraKeys = primary, extra }
}

func withSeeds(seeds ...*Membership) nodeOpt {
	return func(c *Config) {
		for _, s := range seeds {
			c.Seeds = append(c.Seeds, s.LocalNode().Addr.String())
		}
	}
}

func testConfig(name string, role proto.Role, meta proto.NodeMeta, opts ...nodeOpt) Config {
	c := Config{Name: name, Role: role, Meta: meta, Logger: quiet(), Tuning: fast}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// start creates a node that the test shuts down at its end.
func start(t *testing.T, name string, role proto.Role, meta proto.NodeMeta, opts ...nodeOpt) *Membership {
	t.Helper()
	m, err := Create(testConfig(name, role, meta, opts...))
	if err != nil {
		t.Fatalf("creating %s: %v", name, err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	return m
}

// startCluster starts servers s1..sN, each with the index and arenas
// arenas, joined through s1, and returns them with their metadata.
func startCluster(t *testing.T, n, arenas int, opts ...nodeOpt) ([]*Membership, map[string]proto.NodeMeta) {
	t.Helper()
	var nodes []*Membership
	metas := map[string]proto.NodeMeta{}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("s%d", i)
		o := opts
		if i > 1 {
			o = append(slices.Clone(opts), withSeeds(nodes[0]))
		}
		metas[name] = serverMeta(i, arenas)
		nodes = append(nodes, start(t, name, proto.RoleServer, metas[name], o...))
	}
	return nodes, metas
}

// waitFor polls cond until it returns nil, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	begin := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(begin)
		}
		if time.Since(begin) > d {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sameMeta(got, want proto.NodeMeta) bool {
	got.ArenaSet, want.ArenaSet = proto.ArenaSet{}, proto.ArenaSet{}
	if len(got.Arenas) == 0 && len(want.Arenas) == 0 {
		got.Arenas, want.Arenas = nil, nil
	}
	return reflect.DeepEqual(got, want)
}

// waitSeenAs waits until every observer has seen member name in state at
// least once. Not necessarily all at the same moment: an observer that
// learned early may already have reaped the member (DeadRetention) by the
// time the last one learns.
func waitSeenAs(t *testing.T, d time.Duration, observers []*Membership, name string, state State) time.Duration {
	t.Helper()
	seen := map[string]bool{}
	return waitFor(t, d, fmt.Sprintf("%s seen %v", name, state), func() error {
		var err error
		for _, n := range observers { // every one, every time: a state may last only DeadRetention
			mb, ok := n.View().Member(name)
			if ok && mb.State == state {
				seen[n.Name()] = true
			}
			if !seen[n.Name()] && err == nil {
				err = fmt.Errorf("%s sees %s %v (present %v)", n.Name(), name, mb.State, ok)
			}
		}
		return err
	})
}

// converged checks that every node sees exactly the members of want,
// alive, with that metadata, arena lists complete.
func converged(nodes []*Membership, want map[string]proto.NodeMeta) error {
	for _, n := range nodes {
		v := n.View()
		var alive []string
		for _, mb := range v.Members() {
			if mb.State == StateAlive {
				alive = append(alive, mb.Name)
			}
		}
		if len(alive) != len(want) {
			return fmt.Errorf("%s sees %v alive, want %d members", n.Name(), alive, len(want))
		}
		for name, meta := range want {
			mb, ok := v.Member(name)
			switch {
			case !ok || mb.State != StateAlive:
				return fmt.Errorf("%s sees %s as %v (present %v)", n.Name(), name, mb.State, ok)
			case mb.MetaErr != nil:
				return fmt.Errorf("%s: metadata of %s: %v", n.Name(), name, mb.MetaErr)
			case mb.ArenasPending:
				return fmt.Errorf("%s: arenas of %s pending (%d of %d)", n.Name(), name, len(mb.Meta.Arenas), mb.Meta.ArenaSet.Count)
			case !sameMeta(mb.Meta, meta):
				return fmt.Errorf("%s sees %s with %d arenas, generation %d; want %d, %d", n.Name(), name, len(mb.Meta.Arenas), mb.Meta.Generation, len(meta.Arenas), meta.Generation)
			}
		}
	}
	return nil
}

func TestClusterConverges(t *testing.T) {
	servers, metas := startCluster(t, 3, 3)
	client := start(t, "c1", proto.RoleClient, proto.NodeMeta{RKVVersion: "test"}, withSeeds(servers[1]))
	metas["c1"] = proto.NodeMeta{Role: proto.RoleClient, RKVVersion: "test"}
	nodes := append(slices.Clone(servers), client)
	took := waitFor(t, 10*time.Second, "convergence", func() error { return converged(nodes, metas) })
	t.Logf("3 servers and a client converged in %v", took)

	// Every node sees the same servers, and only them as servers.
	for _, n := range nodes {
		s := n.View().Servers()
		names := make([]string, len(s))
		for i, m := range s {
			names[i] = m.Name
		}
		if !slices.Equal(names, []string{"s1", "s2", "s3"}) {
			t.Errorf("%s sees servers %v", n.Name(), names)
		}
	}
	if me := client.LocalNode(); me.Name != "c1" || me.Meta.Role != proto.RoleClient || me.State != StateAlive {
		t.Errorf("client's LocalNode: %v", me)
	}
	if got := servers[2].LocalNode().Addr; !got.Addr().IsLoopback() || got.Port() == 0 {
		t.Errorf("gossip address %v", got)
	}
}

func TestMetaUpdatePropagates(t *testing.T) {
	servers, metas := startCluster(t, 3, 1)
	client := start(t, "c1", proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[0]))
	metas["c1"] = proto.NodeMeta{Role: proto.RoleClient}
	nodes := append(slices.Clone(servers), client)
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(nodes, metas) })

	events, cancel := client.Subscribe()
	defer cancel()
	// s2 registers three more arenas, one at a time.
	for a := 2; a <= 4; a++ {
		m := serverMeta(2, a)
		if err := servers[1].SetMeta(m); err != nil {
			t.Fatal(err)
		}
		metas["s2"] = m
		if me := servers[1].LocalNode(); !sameMeta(me.Meta, m) {
			t.Fatalf("s2's own view has %d arenas after SetMeta, want %d", len(me.Meta.Arenas), a)
		}
	}
	took := waitFor(t, 10*time.Second, "metadata update", func() error { return converged(nodes, metas) })
	t.Logf("update seen everywhere in %v", took)
	for {
		ev := <-events
		if ev.Kind == EventUpdate && ev.Member.Name == "s2" && len(ev.Member.Meta.Arenas) == 4 {
			break
		}
	}
	if err := servers[1].SetMeta(proto.NodeMeta{Role: proto.RoleClient}); err == nil {
		t.Error("a server set client metadata")
	}
	bad := serverMeta(2, 1)
	bad.Index.Geometry.Slots = 3
	if err := servers[1].SetMeta(bad); !errors.Is(err, proto.ErrBadMeta) {
		t.Errorf("bad geometry: %v", err)
	}
}

// TestManyArenas: 64 arenas do not fit in the 512-byte metadata; the list
// reaches every node, including a client that joins later through a server
// that only relays it.
func TestManyArenas(t *testing.T) {
	servers, metas := startCluster(t, 3, 2)
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	begin := time.Now()
	for a := 3; a <= 64; a++ {
		m := serverMeta(1, a)
		if err := servers[0].SetMeta(m); err != nil {
			t.Fatalf("%d arenas: %v", a, err)
		}
		metas["s1"] = m
	}
	took := waitFor(t, 10*time.Second, "64 arenas", func() error { return converged(servers, metas) })
	t.Logf("62 arena registrations announced and seen everywhere in %v (last %v)", time.Since(begin), took)
	me := servers[0].LocalNode()
	if !me.Meta.Detached() || me.Meta.ArenaSet.Count != 64 {
		t.Fatalf("s1's metadata is not detached: %+v", me.Meta.ArenaSet)
	}
	client := start(t, "c1", proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[2]))
	metas["c1"] = proto.NodeMeta{Role: proto.RoleClient}
	waitFor(t, 10*time.Second, "late client", func() error {
		return converged(append(slices.Clone(servers), client), metas)
	})
}

// TestArenasByPushPull: with direct pushes off, push/pull anti-entropy
// alone carries the arena list.
func TestArenasByPushPull(t *testing.T) {
	servers, metas := startCluster(t, 3, 0)
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	servers[0].pushDisabled.Store(true)
	metas["s1"] = serverMeta(1, 40)
	if err := servers[0].SetMeta(metas["s1"]); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 15*time.Second, "40 arenas by push/pull", func() error { return converged(servers, metas) })
	t.Logf("40 arenas by push/pull in %v (push/pull every %v)", took, fast.PushPullInterval)
}

func TestShutdownWithoutLeaveIsDead(t *testing.T) {
	servers, metas := startCluster(t, 4, 1)
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	events, cancel := servers[0].Subscribe()
	defer cancel()

	if err := servers[3].Shutdown(); err != nil {
		t.Fatal(err)
	}
	took := waitSeenAs(t, 15*time.Second, servers[:3], "s4", StateDead)
	t.Logf("s4 dead everywhere %v after its shutdown", took)
	for ev := range events {
		if ev.Member.Name == "s4" {
			if ev.Kind != EventFail || ev.Member.State != StateDead {
				t.Fatalf("event %v", ev)
			}
			break
		}
	}
	// A dead server is no server of the view any more.
	if s := servers[0].View().Servers(); len(s) != 3 {
		t.Fatalf("%d servers in the view with s4 dead", len(s))
	}
}

func TestLeave(t *testing.T) {
	servers, metas := startCluster(t, 3, 1)
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	events, cancel := servers[0].Subscribe()
	defer cancel()

	if err := servers[2].Leave(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := servers[2].SetMeta(serverMeta(3, 2)); !errors.Is(err, ErrLeft) {
		t.Errorf("SetMeta after Leave: %v", err)
	}
	if err := servers[2].Leave(time.Second); err != nil {
		t.Errorf("second Leave: %v", err)
	}
	if err := servers[2].Shutdown(); err != nil {
		t.Fatal(err)
	}
	took := waitSeenAs(t, 5*time.Second, servers[:2], "s3", StateLeft)
	t.Logf("s3 left everywhere in %v", took)
	if s := servers[0].View().Servers(); len(s) != 2 {
		t.Errorf("servers after s3 left: %v", s)
	}
	waitFor(t, 5*time.Second, "s3 reaped", func() error {
		for _, n := range servers[:2] {
			if mb, ok := n.View().Member("s3"); ok {
				return fmt.Errorf("%s still has %v", n.Name(), mb)
			}
		}
		return nil
	})
	var kinds []EventKind
	for ev := range events {
		if ev.Member.Name == "s3" {
			kinds = append(kinds, ev.Kind)
			if ev.Kind == EventReap {
				break
			}
		}
	}
	// s3's Leaving metadata may or may not be seen as its own update.
	if kinds = slices.DeleteFunc(kinds, func(k EventKind) bool { return k == EventUpdate }); !slices.Equal(kinds, []EventKind{EventLeave, EventReap}) {
		t.Errorf("events for s3: %v", kinds)
	}
}

// TestEncryption: nodes with another key, or none, can neither join an
// encrypted cluster nor learn anything from it.
func TestEncryption(t *testing.T) {
	servers, metas := startCluster(t, 2, 1, withKey(keyA))
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	if w := servers[0].Warning(); w != "" {
		t.Errorf("encrypted node warns %q", w)
	}
	events, cancel := servers[0].Subscribe()
	defer cancel()

	wrong := start(t, "wrong-key", proto.RoleClient, proto.NodeMeta{}, withKey(keyB))
	plain := start(t, "no-key", proto.RoleClient, proto.NodeMeta{})
	if plain.Warning() == "" {
		t.Error("unencrypted node gives no warning")
	}
	for _, intruder := range []*Membership{wrong, plain} {
		if n, err := intruder.Join([]string{servers[0].LocalNode().Addr.String()}); err == nil {
			t.Errorf("%s joined (%d)", intruder.Name(), n)
		}
		if _, err := Create(testConfig(intruder.Name()+"-2", proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[1]))); err == nil {
			t.Errorf("%s-2 created through a seed", intruder.Name())
		}
	}
	// Let gossip run for a while: nothing leaks either way.
	time.Sleep(10 * fast.ProbeInterval)
	for _, n := range servers {
		if v := n.View(); v.Len() != 2 {
			t.Errorf("%s sees %v", n.Name(), v.Members())
		}
	}
	for _, n := range []*Membership{wrong, plain} {
		if v := n.View(); v.Len() != 1 {
			t.Errorf("%s sees %v", n.Name(), v.Members())
		}
	}
	select {
	case ev := <-events:
		t.Errorf("event %v", ev)
	default:
	}
	// A node with the key (and another one) joins.
	ok := start(t, "ok", proto.RoleClient, proto.NodeMeta{}, withKey(keyA, keyC), withSeeds(servers[0]))
	metas["ok"] = proto.NodeMeta{Role: proto.RoleClient}
	waitFor(t, 10*time.Second, "keyed client", func() error { return converged(append(slices.Clone(servers), ok), metas) })
}

func TestKeyRotation(t *testing.T) {
	servers, metas := startCluster(t, 2, 1, withKey(keyA))
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	for _, step := range []func(*Membership) error{
		func(m *Membership) error { return m.InstallKey(keyB) },
		func(m *Membership) error { return m.UseKey(keyB) },
		func(m *Membership) error { return m.RemoveKey(keyA) },
	} {
		for _, n := range servers {
			if err := step(n); err != nil {
				t.Fatal(err)
			}
		}
	}
	metas["s1"] = serverMeta(1, 5)
	if err := servers[0].SetMeta(metas["s1"]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "update under the new key", func() error { return converged(servers, metas) })
	old := start(t, "old-key", proto.RoleClient, proto.NodeMeta{}, withKey(keyA))
	if _, err := old.Join([]string{servers[0].LocalNode().Addr.String()}); err == nil {
		t.Error("a node with the removed key joined")
	}
	if err := servers[0].RemoveKey(keyB); err == nil {
		t.Error("removed the primary key")
	}
	plain := start(t, "plain", proto.RoleClient, proto.NodeMeta{})
	if err := plain.InstallKey(keyA); !errors.Is(err, ErrNotEncrypted) {
		t.Errorf("InstallKey without encryption: %v", err)
	}
	if err := servers[0].InstallKey([]byte("short")); err == nil {
		t.Error("installed a 5-byte key")
	}
}

// TestSubscribeDropsOldest: a subscriber that does not read keeps the
// newest events, and sees the gap.
func TestSubscribeDropsOldest(t *testing.T) {
	cfg := testConfig("s1", proto.RoleServer, serverMeta(1, 0))
	cfg.EventBuffer = 4
	m, err := Create(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	events, cancel := m.Subscribe()
	slow, cancelSlow := m.Subscribe()
	defer cancelSlow()
	first := m.View().Version()
	for a := 1; a <= 10; a++ {
		if err := m.SetMeta(serverMeta(1, a)); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	for range 4 {
		ev := <-events
		if ev.Kind != EventUpdate || ev.Member.Name != "s1" {
			t.Fatalf("event %v", ev)
		}
		got = append(got, ev.View.Version())
	}
	want := []uint64{first + 7, first + 8, first + 9, first + 10}
	if !slices.Equal(got, want) {
		t.Fatalf("versions %v, want the newest %v", got, want)
	}
	if last := m.View(); last.Version() != first+10 || len(last.Servers()) != 1 || len(last.Servers()[0].Meta.Arenas) != 10 {
		t.Fatalf("view %d with %v", last.Version(), last.Servers())
	}
	cancel()
	cancel()
	if _, open := <-events; open {
		t.Error("channel open after cancel")
	}
	if err := m.Shutdown(); err != nil {
		t.Fatal(err)
	}
	for range slow { // drains what it holds, then ends: Shutdown closed it
	}
	if _, open := <-func() <-chan Event { c, _ := m.Subscribe(); return c }(); open {
		t.Error("Subscribe after Shutdown gives an open channel")
	}
	if err := m.SetMeta(serverMeta(1, 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("SetMeta after Shutdown: %v", err)
	}
	if _, err := m.Join([]string{"127.0.0.1:1"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Join after Shutdown: %v", err)
	}
	if err := m.Leave(time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("Leave after Shutdown: %v", err)
	}
	if err := m.Shutdown(); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

// SetMeta copies its argument; the delegate never hands memberlist more
// than it allows.
func TestSetMetaCopiesAndLimits(t *testing.T) {
	meta := serverMeta(1, 2)
	m := start(t, "s1", proto.RoleServer, meta)
	if err := m.SetMeta(meta); err != nil {
		t.Fatal(err)
	}
	meta.Arenas[0].RKey++
	meta.Index.RKey++
	if err := m.Leave(time.Second); err != nil { // re-encodes the stored metadata
		t.Fatal(err)
	}
	want := serverMeta(1, 2)
	want.Leaving = true
	if me := m.LocalNode(); !sameMeta(me.Meta, want) || me.State != StateLeft {
		t.Errorf("after Leave: %v %+v", me, me.Meta)
	}
	if b := (&delegate{m}).NodeMeta(16); b != nil {
		t.Errorf("NodeMeta(16) returned %d bytes", len(b))
	}
	if err := m.Leave(0); err == nil {
		t.Error("Leave(0) accepted")
	}
}

func TestConfigRefused(t *testing.T) {
	for name, c := range map[string]Config{
		"no role":         {Name: "x"},
		"server no name":  {Role: proto.RoleServer},
		"role mismatch":   {Name: "x", Role: proto.RoleServer, Meta: proto.NodeMeta{Role: proto.RoleClient}},
		"leaving":         {Name: "x", Role: proto.RoleClient, Meta: proto.NodeMeta{Leaving: true}},
		"bad key":         {Name: "x", Role: proto.RoleClient, SecretKey: []byte("0123456789")},
		"bad extra key":   {Name: "x", Role: proto.RoleClient, SecretKey: keyA, ExtraKeys: [][]byte{{1}}},
		"extra, no key":   {Name: "x", Role: proto.RoleClient, ExtraKeys: [][]byte{keyB}},
		"bad profile":     {Name: "x", Role: proto.RoleClient, Tuning: Tuning{Profile: "moon"}},
		"negative tuning": {Name: "x", Role: proto.RoleClient, Tuning: Tuning{ProbeInterval: -1}},
		"bad meta":        {Name: "x", Role: proto.RoleClient, Meta: proto.NodeMeta{Index: &proto.IndexRegion{}}},
		"bad address":     {Name: "x", Role: proto.RoleClient, BindAddr: "not-an-address"},
		"host name":       {Name: "x", Role: proto.RoleClient, BindAddr: "localhost"},
		"bad advertise":   {Name: "x", Role: proto.RoleClient, AdvertiseAddr: "localhost"},
		"bad port":        {Name: "x", Role: proto.RoleClient, BindPort: 70000},
		"no seed answers": {Name: "x", Role: proto.RoleClient, Seeds: []string{"127.0.0.1:1"}},
	} {
		c.Logger = quiet()
		c.Tuning.TCPTimeout = 200 * time.Millisecond
		if m, err := Create(c); err == nil {
			_ = m.Shutdown()
			t.Errorf("%s: created", name)
		}
	}
}

func TestLogging(t *testing.T) {
	var buf testlog.Buffer
	m, err := Create(Config{
		Role:   proto.RoleClient,
		Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Tuning: fast,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Shutdown(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(m.Name(), "client-") {
		t.Errorf("default client name %q", m.Name())
	}
	if !strings.Contains(out, "level=WARN msg=\"gossip is not encrypted") {
		t.Errorf("no warning about clear text in:\n%s", out)
	}
	// memberlist's own lines arrive at debug level, tagged.
	if !strings.Contains(out, "level=DEBUG msg=\"Using dynamic bind port") || !strings.Contains(out, "memberlist=DEBUG") {
		t.Errorf("memberlist's log not routed:\n%s", out)
	}
}

// TestDeadServersOutstayDeadClients: a dead client leaves the view after
// GossipToTheDeadTime, a dead server stays for DeadRetention, so its keys
// are not placed elsewhere while it reboots.
func TestDeadServersOutstayDeadClients(t *testing.T) {
	longer := func(c *Config) { c.Tuning.DeadRetention = time.Hour }
	servers, metas := startCluster(t, 3, 1, longer)
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	cl := start(t, "c1", proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[0]), longer)
	waitFor(t, 10*time.Second, "client seen", func() error {
		if _, ok := servers[0].View().Member("c1"); !ok {
			return errors.New("s1 does not see c1")
		}
		return nil
	})
	for _, m := range []*Membership{cl, servers[2]} {
		if err := m.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	waitSeenAs(t, 15*time.Second, servers[:1], "s3", StateDead)
	// Reaped after GossipToTheDeadTime (1 s in fast), not DeadRetention.
	waitFor(t, 15*time.Second, "c1 reaped", func() error {
		if mb, ok := servers[0].View().Member("c1"); ok {
			return fmt.Errorf("s1 still has %v", mb)
		}
		return nil
	})
	time.Sleep(2 * fast.GossipToTheDeadTime)
	if mb, ok := servers[0].View().Member("s3"); !ok || mb.State != StateDead {
		t.Fatalf("dead server s3 after %v: %v (present %v); want it kept dead for DeadRetention", 2*fast.GossipToTheDeadTime, mb.State, ok)
	}
}

// TestRefreshFetchesAMembersRecord: with gossip and probes (whose acks
// carry gossip) slowed to a round a minute, a server's new metadata
// reaches a client only when the client asks that server for it
// (Refresh).
func TestRefreshFetchesAMembersRecord(t *testing.T) {
	slow := func(c *Config) {
		c.Tuning.GossipInterval, c.Tuning.ProbeInterval, c.Tuning.PushPullInterval = time.Minute, time.Minute, time.Hour
	}
	meta := serverMeta(1, 1)
	srv := start(t, "s1", proto.RoleServer, meta, slow)
	cl := start(t, "c1", proto.RoleClient, proto.NodeMeta{}, slow, withSeeds(srv))
	generation := func() uint64 {
		mb, ok := cl.View().Member("s1")
		if !ok {
			t.Fatal("s1 is not in the client's view")
		}
		return mb.Meta.Generation
	}
	if g := generation(); g != meta.Generation {
		t.Fatalf("the client's view shows generation %d of s1 after its join, want %d", g, meta.Generation)
	}
	meta.Generation++
	if err := srv.SetMeta(meta); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if g := generation(); g != meta.Generation-1 {
		t.Fatalf("the client's view shows generation %d without gossip: the test does not test Refresh", g)
	}
	cl.Refresh("s1")
	took := waitFor(t, 2*time.Second, "the new generation in the client's view", func() error {
		if g := generation(); g != meta.Generation {
			return fmt.Errorf("generation %d", g)
		}
		return nil
	})
	t.Logf("the new record arrived %v after Refresh", took)
	cl.Refresh("nobody") // not in the view: nothing to do
	cl.Refresh("c1")     // itself: likewise
}
