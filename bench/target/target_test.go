// Tests of the targets: each against a real server of its kind.

package target

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/loadgen"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEchoRoundTrips(t *testing.T) {
	s, err := ListenEcho("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := NewEcho(ctx, EchoOptions{Addr: s.Addr(), ValueSize: 70000, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for i := range 3 {
		w := e.ForWorker(i)
		// Sizes across the server's read buffer and the client's frame reuse.
		for _, n := range []int{0, 1, 9, 300 << 10, 17} {
			v, err := w.Get(ctx, bytes.Repeat([]byte{'k'}, n))
			if err != nil {
				t.Fatalf("worker %d: get with a %d-byte key: %v", i, n, err)
			}
			if len(v) != 70000 {
				t.Fatalf("worker %d: get returned %d bytes, want 70000", i, len(v))
			}
			if err := w.Put(ctx, []byte("key"), make([]byte, n)); err != nil {
				t.Fatalf("worker %d: put of %d bytes: %v", i, n, err)
			}
		}
	}
	if e.ForWorker(0) == e.ForWorker(1) {
		t.Fatal("workers 0 and 1 share a connection")
	}
	// A request the server refuses closes the connection: the next
	// round trip fails instead of hanging.
	w := e.ForWorker(2).(*echoWorker)
	if err := w.roundTrip(ctx, 'X', nil, nil, make([]byte, 1)); err == nil {
		t.Fatal("a bad op got an answer")
	}
}

func TestEchoDeadline(t *testing.T) {
	s, err := ListenEcho("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := NewEcho(context.Background(), EchoOptions{Addr: s.Addr(), ValueSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// Announce a payload longer than what follows: the server waits for
	// bytes that never come, so no reply comes and the deadline ends the
	// read.
	w := e.ForWorker(0).(*echoWorker)
	hdr := []byte{EchoGet, 0, 0, 0, 100, 0, 0, 0, 0}
	if _, err := w.conn.Write(hdr); err != nil {
		t.Fatal(err)
	}
	if err := w.roundTrip(ctx, EchoGet, nil, nil, make([]byte, 12)); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("round trip past its deadline: %v, want a timeout", err)
	}
}

func TestNewEchoRejectsBadOptions(t *testing.T) {
	for _, o := range []EchoOptions{{ValueSize: 1}, {Addr: "127.0.0.1:1"}, {Addr: "127.0.0.1:1", ValueSize: echoMaxFrame + 1}} {
		if _, err := NewEcho(context.Background(), o); err == nil {
			t.Errorf("NewEcho(%+v) succeeded", o)
		}
	}
}

func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed (apt-get install redis-server)")
	}
}

func TestRedis(t *testing.T) {
	needRedis(t)
	for _, persist := range []RedisPersistence{RedisMemoryOnly, RedisAOFNoFsync, RedisAOFAlways} {
		t.Run(persist.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dir := t.TempDir()
			r, err := StartRedis(ctx, RedisOptions{Dir: dir, Persistence: persist})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := r.Close(); err != nil {
					t.Error(err)
				}
			}()
			tg, err := r.NewTarget(ctx, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer tg.Close()
			if _, err := tg.Get(ctx, []byte("absent")); !errors.Is(err, loadgen.ErrNotFound) {
				t.Fatalf("get of an absent key: %v, want loadgen.ErrNotFound", err)
			}
			if err := tg.Put(ctx, []byte("k"), []byte("value")); err != nil {
				t.Fatal(err)
			}
			if v, err := tg.Get(ctx, []byte("k")); err != nil || string(v) != "value" {
				t.Fatalf("get: %q, %v", v, err)
			}
			// The persistence is what was asked for.
			info, err := tg.shards[0].Info(ctx, "persistence").Result()
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]string{false: "aof_enabled:0", true: "aof_enabled:1"}[persist != RedisMemoryOnly]
			if !strings.Contains(info, want) {
				t.Fatalf("INFO persistence lacks %q:\n%s", want, info)
			}
			fsync, err := tg.shards[0].ConfigGet(ctx, "appendfsync").Result()
			if err != nil {
				t.Fatal(err)
			}
			wantFsync := map[RedisPersistence]string{RedisAOFNoFsync: "no", RedisAOFAlways: "always"}[persist]
			if wantFsync != "" && fsync["appendfsync"] != wantFsync {
				t.Fatalf("appendfsync = %q, want %s", fsync["appendfsync"], wantFsync)
			}
			save, err := tg.shards[0].ConfigGet(ctx, "save").Result()
			if err != nil || save["save"] != "" {
				t.Fatalf("save = %q (%v), want none", save["save"], err)
			}
			// With an append-only file, the acknowledged write is in it
			// already: a crash of the process would keep it.
			aof, _ := filepath.Glob(filepath.Join(dir, "appendonlydir", "*.incr.aof"))
			var written []byte
			for _, f := range aof {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				written = append(written, b...)
			}
			if got := bytes.Contains(written, []byte("value")); got != (persist != RedisMemoryOnly) {
				t.Fatalf("the acknowledged SET in the append-only files %v: %v, want %v", aof, got, persist != RedisMemoryOnly)
			}
		})
	}
	if _, err := StartRedis(context.Background(), RedisOptions{Dir: t.TempDir(), Persistence: RedisAOFAlways + 1}); err == nil || !strings.Contains(err.Error(), "unknown persistence") {
		t.Fatalf("StartRedis with an unknown persistence: %v, want an error naming it", err)
	}
}

// A batch is a pipeline per server: every key lands on its own server,
// absent keys read as nil, and a MultiPut's values read back.
func TestRedisShardedPipelines(t *testing.T) {
	needRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var servers []*Redis
	defer func() {
		for _, r := range servers {
			if err := r.Close(); err != nil {
				t.Error(err)
			}
		}
	}()
	for i := range 3 {
		r, err := StartRedis(ctx, RedisOptions{Dir: t.TempDir()})
		if err != nil {
			t.Fatalf("redis-server %d: %v", i, err)
		}
		servers = append(servers, r)
	}
	tg, err := NewRedisTarget(ctx, servers, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	var keys, vals [][]byte
	for i := range 40 {
		keys = append(keys, []byte(fmt.Sprintf("k%d", i)))
		vals = append(vals, []byte(fmt.Sprintf("v%d", i)))
	}
	if err := tg.MultiPut(ctx, keys[:20], vals[:20]); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 30; i++ {
		if err := tg.Put(ctx, keys[i], vals[i]); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tg.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		want := vals[i]
		if i >= 30 {
			want = nil
		}
		if !bytes.Equal(got[i], want) || (want == nil) != (got[i] == nil) {
			t.Fatalf("MultiGet: %s = %q, want %q", keys[i], got[i], want)
		}
	}
	// Each key is on its shard's server alone, and every server has some.
	for s, c := range tg.shards {
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("server %d holds no key of 30", s)
		}
		for i := range 30 {
			_, err := c.Get(ctx, string(keys[i])).Result()
			if onIt := err == nil; onIt != (tg.shard(keys[i]) == s) {
				t.Errorf("key %s on server %d: %v; its shard is %d", keys[i], s, err, tg.shard(keys[i]))
			}
		}
	}
	if v, err := tg.Get(ctx, keys[3]); err != nil || string(v) != "v3" {
		t.Fatalf("get %s: %q, %v", keys[3], v, err)
	}
	if err := tg.MultiPut(ctx, keys[:2], vals[:1]); err == nil {
		t.Fatal("MultiPut of 2 keys with 1 value succeeded")
	}
	// A key given twice is set once, to its last value.
	if err := tg.MultiPut(ctx, [][]byte{keys[5], keys[6], keys[5]}, [][]byte{[]byte("a"), []byte("b"), []byte("c")}); err != nil {
		t.Fatal(err)
	}
	if got, err := tg.MultiGet(ctx, [][]byte{keys[5], keys[6]}); err != nil || string(got[0]) != "c" || string(got[1]) != "b" {
		t.Fatalf("after a batch setting %s twice: %q, %v; want c and b", keys[5], got, err)
	}
}

func TestRedisVersion(t *testing.T) {
	needRedis(t)
	v, err := RedisVersion("")
	if err != nil || !strings.Contains(v, "v=") {
		t.Fatalf("RedisVersion: %q, %v", v, err)
	}
	if _, err := RedisVersion("/nonexistent/redis-server"); err == nil {
		t.Fatal("RedisVersion of a missing binary succeeded")
	}
}

func TestRKVCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds rkv-server and runs a 2-process cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := BuildRKV(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := BuildCommands(ctx, t.TempDir(), "no-such-command"); err == nil || !strings.Contains(err.Error(), "./cmd/no-such-command") {
		t.Fatalf("building a command the module lacks: %v, want an error naming it", err)
	}
	c, err := StartCluster(ctx, ClusterOptions{Servers: 2, Server: ServerOptions{
		Binary: bin, Dir: t.TempDir(), Sync: "none", ArenaSize: 8 << 20, ArenaCount: 2, IndexSlots: 4096, LeaseSize: 1 << 20,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
	}()
	r, err := NewRKV(ctx, RKVOptions{Seeds: c.Seeds(), Conns: 2, Servers: 2, Arenas: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Get(ctx, []byte("absent")); !errors.Is(err, loadgen.ErrNotFound) {
		t.Fatalf("get of an absent key: %v, want loadgen.ErrNotFound", err)
	}
	before := r.Counters()[CounterReads]
	for i := range 20 {
		k := []byte(fmt.Sprintf("k%d", i))
		if err := r.Put(ctx, k, []byte(fmt.Sprintf("v%d", i))); err != nil {
			t.Fatal(err)
		}
		if v, err := r.Get(ctx, k); err != nil || string(v) != fmt.Sprintf("v%d", i) {
			t.Fatalf("get %s: %q, %v", k, v, err)
		}
	}
	// Every GET is one or two READs.
	if d := r.Counters()[CounterReads] - before; d < 20 || d > 40 {
		t.Fatalf("%d READs for 20 GETs, want 20..40", d)
	}
	// A MultiGet reads keys of both servers, nil for an absent one.
	vs, err := r.MultiGet(ctx, [][]byte{[]byte("k3"), []byte("absent"), []byte("k17"), []byte("k0")})
	if err != nil || len(vs) != 4 || string(vs[0]) != "v3" || vs[1] != nil || string(vs[2]) != "v17" || string(vs[3]) != "v0" {
		t.Fatalf("MultiGet: %q, %v", vs, err)
	}
	// A MultiPut writes keys of both servers.
	if err := r.MultiPut(ctx, [][]byte{[]byte("k3"), []byte("m1"), []byte("m2")}, [][]byte{[]byte("w3"), []byte("x1"), []byte("x2")}); err != nil {
		t.Fatal(err)
	}
	if vs, err := r.MultiGet(ctx, [][]byte{[]byte("m2"), []byte("k3"), []byte("m1")}); err != nil || string(vs[0]) != "x2" || string(vs[1]) != "w3" || string(vs[2]) != "x1" {
		t.Fatalf("MultiGet after MultiPut: %q, %v", vs, err)
	}
	if _, ok := r.Counters()["retries_get"]; !ok {
		t.Fatalf("no retries_get counter in %v", r.Counters())
	}
	// Metric sums a family's samples: the servers' gauges, the counters
	// of the PUTs above, nothing for a family a server does not have.
	committed := 0.0
	for _, s := range c.Servers {
		n, err := s.Metric(ctx, "rkv_arenas_registered")
		if err != nil || n != 2 {
			t.Fatalf("%s: rkv_arenas_registered %v, %v; want 2", s.Name, n, err)
		}
		b, err := s.Metric(ctx, "rkv_committed_bytes_total")
		if err != nil {
			t.Fatal(err)
		}
		committed += b
		if n, err := s.Metric(ctx, "rkv_no_such_metric"); err != nil || n != 0 {
			t.Fatalf("%s: rkv_no_such_metric %v, %v; want 0", s.Name, n, err)
		}
	}
	if committed < 23*3 {
		t.Fatalf("the servers count %v committed bytes for 23 PUTs of 2-3 bytes and their records' headers", committed)
	}
	// The servers' metrics carry the times the tool measures, in order:
	// the process started, its store opened, its arenas registered.
	for _, s := range c.Servers {
		if _, err := s.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		reg, err := s.WaitRegistered(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st := s.Process().Started
		if len(reg.Arenas) != 2 || reg.Opened.Before(st.Add(-time.Second)) || reg.First().Before(reg.Opened) ||
			reg.All().Before(reg.First()) || reg.All().After(time.Now()) {
			t.Fatalf("%s: started %v, store opened %v, arenas registered %v (first %v, all %v): out of order or missing",
				s.Name, st, reg.Opened, reg.Arenas, reg.First(), reg.All())
		}
	}
}

func TestReadRegistration(t *testing.T) {
	const metrics = `# HELP rkv_arena_registration_seconds Time from the store's open to each registered arena's registration.
# TYPE rkv_arena_registration_seconds gauge
rkv_arena_registration_seconds{arena="0"} 0.25
rkv_arena_registration_seconds{arena="2"} 1.5
# HELP rkv_arenas_registered Arenas registered and advertised.
# TYPE rkv_arenas_registered gauge
rkv_arenas_registered 2
# HELP rkv_store_open_time_seconds Unix time the store began opening at this start.
# TYPE rkv_store_open_time_seconds gauge
rkv_store_open_time_seconds 1.7000000001e+09
`
	r, err := ReadRegistration(strings.NewReader(metrics))
	if err != nil {
		t.Fatal(err)
	}
	opened := time.Unix(1700000000, 100000000)
	if d := r.Opened.Sub(opened).Abs(); d > time.Microsecond || len(r.Arenas) != 2 ||
		r.Arenas[0] != 250*time.Millisecond || r.Arenas[2] != 1500*time.Millisecond {
		t.Fatalf("ReadRegistration: %+v, want opened %v, arenas 0 and 2 after 0.25s and 1.5s", r, opened)
	}
	if !r.First().Equal(r.Opened.Add(250*time.Millisecond)) || !r.All().Equal(r.Opened.Add(1500*time.Millisecond)) {
		t.Fatalf("first %v, all %v, from %v", r.First(), r.All(), r.Opened)
	}
	for _, c := range []struct{ name, metrics, want string }{
		{"no open time", "rkv_arenas_registered 2\n", "0 rkv_store_open_time_seconds series"},
		{"an arena without an ID", "rkv_store_open_time_seconds 1\nrkv_arena_registration_seconds{arena=\"x\"} 1\n", `arena label "x"`},
		{"not the text format", "rkv_store_open_time_seconds one\n", "one"},
	} {
		if _, err := ReadRegistration(strings.NewReader(c.metrics)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	if r, err := ReadRegistration(strings.NewReader("rkv_store_open_time_seconds 1\n")); err != nil || len(r.Arenas) != 0 || !r.First().IsZero() {
		t.Errorf("no arena registered yet: %+v, %v", r, err)
	}
}

func TestProcessStop(t *testing.T) {
	dir := t.TempDir()
	p, err := StartProcess("sleeper", dir+"/log", "sh", "-c", "echo hello; exec sleep 60")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.WaitLog(ctx, "hello", func(l string) bool { return l == "hello" }); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(5 * time.Second); err != nil {
		t.Fatalf("stopping with SIGTERM: %v", err)
	}
	// A process ignoring SIGTERM is killed, and that is an error.
	p, err = StartProcess("stubborn", dir+"/log2", "sh", "-c", "trap '' TERM; echo up; sleep 60")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitLog(ctx, "up", func(l string) bool { return l == "up" }); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(200 * time.Millisecond); err == nil {
		t.Fatal("stopping a process that ignores SIGTERM reported success")
	}
	// A process appending to a log sees only its own lines.
	p, err = StartProcess("second", dir+"/log", "sh", "-c", "echo again; exec sleep 60")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitLog(ctx, "again", func(l string) bool { return l == "again" }); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if l, err := p.WaitLog(sctx, "hello", func(l string) bool { return l == "hello" }); err == nil {
		t.Fatalf("WaitLog found the earlier process's line %q", l)
	}
	scancel()
	if tail := p.LogTail(5); tail != "again" {
		t.Fatalf("LogTail = %q, want only this process's line", tail)
	}
	if err := p.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// A failing exit is reported, and WaitLog notices the exit.
	p, err = StartProcess("failing", dir+"/log3", "sh", "-c", "echo bye; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitLog(ctx, "never", func(string) bool { return false }); err == nil {
		t.Fatal("WaitLog on an exited process succeeded")
	}
	if err := p.Stop(time.Second); err == nil || !strings.Contains(err.Error(), "bye") {
		t.Fatalf("Stop of a failed process: %v, want its exit status and log", err)
	}
}

// A bind on a busy port is a port taken; other failures are not.
func TestPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = net.Listen("tcp", ln.Addr().String())
	if err == nil {
		t.Fatal("a second listener on a busy port")
	}
	if !PortTaken(fmt.Errorf("rkv-server node1 exited: exit status 1; log:\n%w", err)) {
		t.Fatalf("PortTaken(%v) = false", err)
	}
	if PortTaken(nil) || PortTaken(errors.New("rkv-server node1 exited: exit status 1")) {
		t.Fatal("PortTaken of nil or of another exit")
	}
}
