package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fast converges in tens of milliseconds and declares a stopped server
// dead within about two seconds, yet a live server on a loaded machine
// (two cores, race detector, other packages' tests) is not suspected
// just because it answered a probe late: a suspect has a second to
// refute.
var fast = membership.Tuning{
	ProbeInterval:       250 * time.Millisecond,
	ProbeTimeout:        200 * time.Millisecond,
	GossipInterval:      20 * time.Millisecond,
	PushPullInterval:    300 * time.Millisecond,
	TCPTimeout:          time.Second,
	SuspicionMult:       4,
	GossipToTheDeadTime: time.Second,
	DeadRetention:       time.Minute, // departed servers' keys stay unavailable for the test
}

func quiet() *slog.Logger {
	if os.Getenv("RKV_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// cluster is n servers on loopback, each with its own data directory.
type cluster struct {
	t       *testing.T
	root    string
	servers map[string]*server.Server
	ports   map[string]int
}

func serverConfig(root, name string, port int, seeds []string) server.Config {
	tuning := fast
	tuning.DeadRetention = time.Second
	return server.Config{
		Name: name,
		Store: store.Options{
			Dir: filepath.Join(root, name), ArenaSize: 4 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 256 << 10,
		},
		Membership: membership.Config{BindPort: port, Seeds: seeds, Tuning: tuning},
		Logger:     quiet(),
	}
}

func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{t: t, root: t.TempDir(), servers: map[string]*server.Server{}, ports: map[string]int{}}
	var seeds []string
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("s%d", i)
		s, err := server.New(context.Background(), serverConfig(c.root, name, 0, seeds))
		if err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		c.servers[name] = s
		c.ports[name] = int(s.Membership().LocalNode().Addr.Port())
		seeds = append(seeds, s.GossipAddr())
	}
	t.Cleanup(func() {
		for _, s := range c.servers {
			if s != nil {
				_ = s.Close()
			}
		}
	})
	return c
}

func (c *cluster) seeds() []string {
	var out []string
	for _, s := range c.servers {
		if s != nil {
			out = append(out, s.GossipAddr())
		}
	}
	return out
}

// restart starts a closed server again on its data directory and gossip
// port.
func (c *cluster) restart(name string) *server.Server {
	c.t.Helper()
	s, err := server.New(context.Background(), serverConfig(c.root, name, c.ports[name], c.seeds()))
	if err != nil {
		c.t.Fatalf("restarting %s: %v", name, err)
	}
	c.servers[name] = s
	return s
}

func (c *cluster) handled() map[string]uint64 {
	out := map[string]uint64{}
	for n, s := range c.servers {
		out[n] = s.Stats().Total()
	}
	return out
}

func newClient(t *testing.T, c *cluster) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := client.New(ctx, client.Config{
		Seeds: c.seeds(), Logger: quiet(),
		Membership: membership.Config{Tuning: fast},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	// Wait until every server and its arenas are in the client's view.
	waitFor(t, 20*time.Second, func() error {
		servers := cl.Membership().View().Servers()
		if len(servers) != len(c.servers) {
			return fmt.Errorf("%d servers in the view", len(servers))
		}
		for _, m := range servers {
			if m.Meta.Index == nil || len(m.Meta.Arenas) != 2 {
				return fmt.Errorf("%s: index %v, %d arenas", m.Name, m.Meta.Index != nil, len(m.Meta.Arenas))
			}
		}
		return nil
	})
	return cl
}

func waitFor(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func key(i int) []byte   { return fmt.Appendf(nil, "key-%04d", i) }
func value(i int) []byte { return fmt.Appendf(nil, "value-%d-%s", i, string(make([]byte, i%300))) }

func TestClusterPutGetDeleteScan(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c)
	ctx := context.Background()
	const n = 150
	perServer := map[string]int{}
	for i := range n {
		if err := cl.Put(ctx, key(i), value(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	// Every key lies where placement says, and nowhere else.
	view := cl.Membership().View()
	for i := range n {
		owner := membership.Placement(view, key(i), 1)[0].Name
		perServer[owner]++
		for name, s := range c.servers {
			v, err := s.Store().Get(key(i))
			if name == owner && (err != nil || string(v) != string(value(i))) {
				t.Fatalf("key %d on its owner %s: %q, %v", i, name, v, err)
			}
			if name != owner && !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("key %d on %s, which does not own it: %v", i, name, err)
			}
		}
	}
	t.Logf("keys per server: %v", perServer)
	if len(perServer) != 3 {
		t.Fatalf("keys on %d servers: %v", len(perServer), perServer)
	}

	// GETs are one-sided: the servers handle no request meanwhile.
	before := c.handled()
	for round := range 2 { // the second round hits the location cache
		for i := range n {
			v, err := cl.Get(ctx, key(i))
			if err != nil || string(v) != string(value(i)) {
				t.Fatalf("round %d get %d: %q, %v", round, i, v, err)
			}
		}
	}
	if _, err := cl.Get(ctx, []byte("absent")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("absent key: %v", err)
	}
	if after := c.handled(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("servers handled requests during %d GETs: %v -> %v", 2*n+1, before, after)
	}

	// Overwrite: the cached location goes stale and the client falls back.
	if err := cl.Put(ctx, key(7), []byte("new")); err != nil {
		t.Fatal(err)
	}
	if v, err := cl.Get(ctx, key(7)); err != nil || string(v) != "new" {
		t.Fatalf("after overwrite: %q, %v", v, err)
	}

	// Delete.
	for i := 0; i < n; i += 10 {
		if err := cl.Delete(ctx, key(i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		_, err := cl.Get(ctx, key(i))
		if (i%10 == 0) != errors.Is(err, client.ErrNotFound) {
			t.Fatalf("key %d after deletes: %v", i, err)
		}
	}

	// Scan across the three servers, in order, limited.
	kvs, err := cl.Scan(ctx, key(10), key(40), 0)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 10; i < 40; i++ {
		if i%10 != 0 {
			want = append(want, string(key(i)))
		}
	}
	var got []string
	for _, kv := range kvs {
		got = append(got, string(kv.Key))
		if i := 0; true {
			_, _ = fmt.Sscanf(string(kv.Key), "key-%d", &i)
			wantV := value(i)
			if i == 7 {
				wantV = []byte("new")
			}
			if string(kv.Value) != string(wantV) {
				t.Fatalf("scan value of %s: %q", kv.Key, kv.Value)
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("scan: %v, want %v", got, want)
	}
	if kvs, err := cl.Scan(ctx, nil, nil, 5); err != nil || len(kvs) != 5 || string(kvs[0].Key) != string(key(1)) {
		t.Fatalf("limited scan: %d keys, %v", len(kvs), err)
	}
}

func TestClusterServerFailureAndRestart(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c)
	ctx := context.Background()
	const n = 90
	for i := range n {
		if err := cl.Put(ctx, key(i), value(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	owner := map[int]string{}
	for i := range n {
		o, err := cl.Owner(key(i))
		if err != nil {
			t.Fatal(err)
		}
		owner[i] = o
		if _, err := cl.Get(ctx, key(i)); err != nil {
			t.Fatal(err)
		}
	}
	victim := "s2"
	oldGen := c.servers[victim].Generation()
	if err := c.servers[victim].Close(); err != nil {
		t.Fatalf("closing %s: %v", victim, err)
	}
	c.servers[victim] = nil
	delete(c.servers, victim)
	waitFor(t, 10*time.Second, func() error {
		if m, ok := cl.Membership().View().Member(victim); !ok || m.State == membership.StateAlive {
			return fmt.Errorf("%s still alive in the client's view", victim)
		}
		return nil
	})
	for i := range n {
		start := time.Now()
		v, err := cl.Get(ctx, key(i))
		if owner[i] == victim {
			var u *client.ErrUnavailable
			if !errors.As(err, &u) || u.Node != victim {
				t.Fatalf("key %d of the closed server: %q, %v", i, v, err)
			}
			if d := time.Since(start); d > 100*time.Millisecond {
				t.Fatalf("key %d of the closed server took %v to fail", i, d)
			}
			if err := cl.Put(ctx, key(i), []byte("x")); !errors.As(err, &u) {
				t.Fatalf("put to the closed server: %v", err)
			}
			continue
		}
		if err != nil || string(v) != string(value(i)) {
			t.Fatalf("key %d on %s while %s is down: %q, %v", i, owner[i], victim, v, err)
		}
	}
	if err := cl.Put(ctx, []byte("while-down"), []byte("ok")); err != nil {
		var u *client.ErrUnavailable
		if !errors.As(err, &u) {
			t.Fatalf("put while a server is down: %v", err)
		}
	}

	// Restart on the same data dir: new generation, new rkeys; the
	// client recovers by itself.
	s := c.restart(victim)
	if s.Generation() != oldGen+1 {
		t.Fatalf("generation %d after restart, was %d", s.Generation(), oldGen)
	}
	waitFor(t, 10*time.Second, func() error {
		m, ok := cl.Membership().View().Member(victim)
		if !ok || m.State != membership.StateAlive || m.Meta.Generation != s.Generation() || len(m.Meta.Arenas) != 2 {
			return fmt.Errorf("client's view of %s: %v", victim, m)
		}
		return nil
	})
	for i := range n {
		v, err := cl.Get(ctx, key(i))
		if err != nil || string(v) != string(value(i)) {
			t.Fatalf("key %d (on %s) after the restart: %q, %v", i, owner[i], v, err)
		}
	}
	for i := range n {
		if owner[i] == victim {
			if err := cl.Put(ctx, key(i), []byte("after")); err != nil {
				t.Fatalf("put to the restarted server: %v", err)
			}
			if v, err := cl.Get(ctx, key(i)); err != nil || string(v) != "after" {
				t.Fatalf("get after put to the restarted server: %q, %v", v, err)
			}
		}
	}
}

// MultiGet reads many keys across servers in batches, one-sidedly: values
// in order, nil for absent keys, an empty value as empty, and no server
// handler runs.
func TestClusterMultiGet(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c)
	ctx := context.Background()
	const n = 150
	for i := range n {
		if err := cl.Put(ctx, key(i), value(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Put(ctx, []byte("empty"), nil); err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for i := range n + 50 { // 50 absent keys
		keys = append(keys, key(i))
	}
	keys = append(keys, []byte("empty"))
	// A fresh client: nothing in its location cache.
	cold := newClient(t, c)
	before, reads := c.handled(), cold.Reads()
	vals, err := cold.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	// Batched: one index READ per key and one record READ per present key;
	// a key that fell back to Get alone would add more.
	if got, want := cold.Reads()-reads, uint64(len(keys)+n+1); got != want {
		t.Errorf("cold MultiGet of %d keys (%d present) posted %d READs, want %d", len(keys), n+1, got, want)
	}
	// The fresh client's only requests were one Hello per server.
	for name, n := range c.handled() {
		if n > before[name]+1 {
			t.Errorf("cold MultiGet: %s handled %d requests, more than a Hello", name, n-before[name])
		}
	}
	// Warm (the puts cached every location): one record READ per present
	// key, one index READ per absent one.
	before, reads = c.handled(), cl.Reads()
	warm, err := cl.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cl.Reads()-reads, uint64(len(keys)); got != want {
		t.Errorf("warm MultiGet of %d keys posted %d READs, want %d", len(keys), got, want)
	}
	if fmt.Sprint(warm) != fmt.Sprint(vals) {
		t.Fatalf("warm and cold MultiGets differ")
	}
	if after := c.handled(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("MultiGet ran server handlers: %v -> %v", before, after)
	}
	for i, v := range vals[:n+50] {
		switch {
		case i < n && string(v) != string(value(i)):
			t.Fatalf("key %d: %q, want %q", i, v, value(i))
		case i >= n && v != nil:
			t.Fatalf("absent key %d: %q, want nil", i, v)
		}
	}
	if v := vals[n+50]; v == nil || len(v) != 0 {
		t.Fatalf("empty value read as %#v, want an empty non-nil slice", v)
	}
	if _, err := cl.MultiGet(ctx, [][]byte{{}}); !errors.Is(err, client.ErrTooLarge) {
		t.Fatalf("MultiGet of an empty key: %v", err)
	}
}

// A lease revoked under the client (its rkey deregistered) makes the next
// PUT's RDMA_WRITE fail with REM_ACCESS_ERR; the client reconnects, takes
// a new lease and succeeds without being recreated.
func TestClusterPutRecoversFromRevokedLease(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c)
	ctx := context.Background()
	if err := cl.Put(ctx, []byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	st := c.servers["s1"].Store()
	granted := st.Stats().LeasesGranted
	revoked := 0
	for id := uint64(1); id <= granted+8; id++ { // lease IDs count from 1
		if st.EndLease(id) == nil {
			revoked++
		}
	}
	if revoked == 0 {
		t.Fatal("no active lease to revoke")
	}
	if err := cl.Put(ctx, []byte("b"), []byte("2")); err != nil {
		t.Fatalf("PUT after its lease was revoked: %v", err)
	}
	if got := st.Stats().LeasesGranted; got <= granted {
		t.Fatalf("no new lease was granted (%d before, %d after)", granted, got)
	}
	for k, want := range map[string]string{"a": "1", "b": "2"} {
		if v, err := cl.Get(ctx, []byte(k)); err != nil || string(v) != want {
			t.Fatalf("GET %s = %q, %v; want %q", k, v, err, want)
		}
	}
}
