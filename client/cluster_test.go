package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startCluster(t *testing.T, n int) *testcluster.Cluster {
	return testcluster.Start(t, n, testcluster.Options{})
}

func newClient(t *testing.T, c *testcluster.Cluster) *client.Client { return c.Client(t, nil) }

// handled is the control requests each running server has handled.
// handled is the requests each server handled, but the servers' read
// lease renewals (which the leader takes every second).
func handled(c *testcluster.Cluster) map[string]uint64 {
	out := map[string]uint64{}
	for _, s := range c.Running() {
		st := s.Stats()
		out[s.Name()] = st.Total() - st.Handled[proto.MsgRenewReadLease]
	}
	return out
}

func waitFor(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	testcluster.WaitFor(t, d, "the condition", cond)
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
	// Every commit came on a write QP, in the PUT's one round trip.
	var commits, onQP uint64
	for _, s := range c.Running() {
		st := s.Stats()
		commits, onQP = commits+st.Handled[proto.MsgCommit], onQP+st.CommitsOnQP
	}
	if commits < n || onQP != commits {
		t.Fatalf("%d puts: %d commits, %d of them on a write QP; want every one", n, commits, onQP)
	}
	// Every key lies where the map says, and nowhere else.
	m := c.Map()
	for i := range n {
		owner, _ := m.Owner(proto.ShardOf(key(i)))
		if o, err := cl.Owner(key(i)); err != nil || o != owner {
			t.Fatalf("key %d: the client says %q (%v), the map %q", i, o, err, owner)
		}
		perServer[owner]++
		for _, s := range c.Running() {
			v, err := s.Store().Get(key(i))
			if s.Name() == owner && (err != nil || string(v) != string(value(i))) {
				t.Fatalf("key %d on its owner %s: %q, %v", i, owner, v, err)
			}
			if s.Name() != owner && !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("key %d on %s, which does not own it: %v", i, s.Name(), err)
			}
		}
	}
	t.Logf("keys per server: %v", perServer)
	if len(perServer) != 3 {
		t.Fatalf("keys on %d servers: %v", len(perServer), perServer)
	}

	// GETs are one-sided: the servers handle no request meanwhile.
	before := handled(c)
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
	if after := handled(c); fmt.Sprint(after) != fmt.Sprint(before) {
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
	kvs, err := cl.Scan(ctx, key(10), key(40))
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
	if kvs, err := cl.Scan(ctx, nil, nil, client.WithLimit(5)); err != nil || len(kvs) != 5 || string(kvs[0].Key) != string(key(1)) {
		t.Fatalf("limited scan: %d keys, %v", len(kvs), err)
	}

	// Per-call options.
	reads := cl.Reads()
	kvs, err = cl.Scan(ctx, []byte("key-001"), nil, client.WithPrefix(), client.WithKeysOnly())
	if err != nil || len(kvs) == 0 {
		t.Fatalf("keys-only prefix scan: %d keys, %v", len(kvs), err)
	}
	for _, kv := range kvs {
		if !bytes.HasPrefix(kv.Key, []byte("key-001")) || kv.Value != nil {
			t.Fatalf("keys-only prefix scan of key-001: %q = %q", kv.Key, kv.Value)
		}
	}
	if got := cl.Reads(); got != reads {
		t.Fatalf("a keys-only scan posted %d RDMA_READs", got-reads)
	}
	for name, call := range map[string]func() error{
		"Get with a limit":     func() error { _, err := cl.Get(ctx, key(1), client.WithLimit(1)); return err },
		"a negative timeout":   func() error { return cl.Put(ctx, key(1), value(1), client.WithTimeout(-time.Second)) },
		"a prefix and an end":  func() error { _, err := cl.Scan(ctx, []byte("a"), []byte("b"), client.WithPrefix()); return err },
		"MultiGet keys-only":   func() error { _, err := cl.MultiGet(ctx, [][]byte{key(1)}, client.WithKeysOnly()); return err },
		"Delete with a prefix": func() error { return cl.Delete(ctx, key(1), client.WithPrefix()) },
	} {
		if err := call(); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := cl.Get(ctx, key(1), client.WithTimeout(time.Nanosecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a Get given 1 ns: %v, want context.DeadlineExceeded", err)
	}
	if v, err := cl.Get(ctx, key(1), client.WithTimeout(5*time.Second)); err != nil || string(v) != string(value(1)) {
		t.Errorf("a Get given 5 s: %q, %v", v, err)
	}
}

// A GET whose cached location another client's write superseded falls
// back to the index: one READ for the stale record, then the neighborhood
// and the current record. A warm GET is the one READ.
func TestGetFallsBackFromAStaleLocation(t *testing.T) {
	c := startCluster(t, 1)
	reader, writer := newClient(t, c), newClient(t, c)
	ctx := context.Background()
	k := []byte("stale")
	get := func(want string, reads uint64) {
		t.Helper()
		before := reader.Reads()
		if v, err := reader.Get(ctx, k); err != nil || string(v) != want {
			t.Fatalf("Get = %q, %v; want %q", v, err, want)
		}
		if got := reader.Reads() - before; got != reads {
			t.Fatalf("Get of %q took %d READs, want %d", want, got, reads)
		}
	}
	if err := writer.Put(ctx, k, []byte("one")); err != nil {
		t.Fatal(err)
	}
	get("one", 2) // cold: neighborhood and record
	get("one", 1) // warm: the cached location
	if err := writer.Put(ctx, k, []byte("two")); err != nil {
		t.Fatal(err)
	}
	get("two", 3)
	get("two", 1)
	if err := writer.Delete(ctx, k); err != nil {
		t.Fatal(err)
	}
	before := reader.Reads()
	if _, err := reader.Get(ctx, k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Get after the delete: %v", err)
	}
	// The stale record, the neighborhood, then word, neighborhood, word.
	if got := reader.Reads() - before; got != 5 {
		t.Fatalf("Get of the deleted key took %d READs, want 5", got)
	}
}

// Keys whose hashes collide share a location-cache entry: a GET or a
// MultiGet of one that finds the other's location there reads that record,
// sees it is not its key's, and falls back to the index.
func TestKeysSharingACacheEntry(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c)
	ctx := context.Background()
	a, b := []byte("alpha"), []byte("bravo")
	for _, k := range [][]byte{a, b} {
		if err := cl.Put(ctx, k, append([]byte("value of "), k...)); err != nil {
			t.Fatal(err)
		}
	}
	get := func(k []byte, reads uint64) {
		t.Helper()
		before := cl.Reads()
		if v, err := cl.Get(ctx, k); err != nil || string(v) != "value of "+string(k) {
			t.Fatalf("Get(%s) = %q, %v", k, v, err)
		}
		if got := cl.Reads() - before; got != reads {
			t.Fatalf("Get(%s) took %d READs, want %d", k, got, reads)
		}
	}
	get(a, 1) // the puts cached both locations
	if !client.CollideInCache(cl, a, b) {
		t.Fatal("no cache entry for a key just written")
	}
	get(b, 3) // a's record, then b's neighborhood and record
	get(b, 1) // b's own location again
	get(a, 1)
	if !client.CollideInCache(cl, b, a) {
		t.Fatal("no cache entry for a key just read")
	}
	vals, err := cl.MultiGet(ctx, [][]byte{a, b})
	if err != nil || string(vals[0]) != "value of alpha" || string(vals[1]) != "value of bravo" {
		t.Fatalf("MultiGet = %q, %v", vals, err)
	}
}

func TestGetAppend(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c)
	ctx := context.Background()
	if err := cl.Put(ctx, []byte("a"), []byte("alpha")); err != nil {
		t.Fatal(err)
	}
	if err := cl.Put(ctx, []byte("empty"), nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, 64)
	buf = append(buf, "prefix:"...)
	// Cold (the index, then the record), then warm (the cached location):
	// both append after what dst holds, in dst's own array when it has
	// room.
	for _, path := range []string{"cold", "warm"} {
		got, err := cl.GetAppend(ctx, buf, []byte("a"))
		if err != nil || string(got) != "prefix:alpha" {
			t.Fatalf("%s GetAppend = %q, %v; want \"prefix:alpha\"", path, got, err)
		}
		if &got[0] != &buf[:1][0] {
			t.Errorf("%s GetAppend reallocated a buffer with room for the value", path)
		}
	}
	got, err := cl.GetAppend(ctx, buf, []byte("absent"))
	if !errors.Is(err, client.ErrNotFound) || string(got) != "prefix:" {
		t.Fatalf("GetAppend of an absent key = %q, %v; want dst unchanged and ErrNotFound", got, err)
	}
	if got, err := cl.GetAppend(ctx, nil, []byte("empty")); err != nil || len(got) != 0 {
		t.Fatalf("GetAppend of an empty value = %q, %v", got, err)
	}
	if got, err := cl.Get(ctx, []byte("empty")); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("Get of an empty value = %#v, %v; want a non-nil empty slice", got, err)
	}
	if _, err := cl.GetAppend(ctx, buf, nil); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("GetAppend of an empty key: %v, want ErrInvalid", err)
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
	oldGen := c.Server(victim).Generation()
	epoch := c.Map().Epoch()
	c.Stop(victim)
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
			var u *client.UnavailableError
			if !errors.As(err, &u) || u.Node != victim || !errors.Is(err, client.ErrUnavailable) {
				t.Fatalf("key %d of the closed server: %q, %v", i, v, err)
			}
			if d := time.Since(start); d > 100*time.Millisecond {
				t.Fatalf("key %d of the closed server took %v to fail", i, d)
			}
			// Known to be down before anything was sent: certainly not
			// applied, and the error says so.
			if err := cl.Put(ctx, key(i), []byte("x")); !errors.As(err, &u) || !errors.Is(err, client.ErrNotSent) {
				t.Fatalf("put to the closed server: %v, want ErrUnavailable and ErrNotSent", err)
			}
			if err := cl.Delete(ctx, key(i)); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, client.ErrNotSent) {
				t.Fatalf("delete on the closed server: %v, want ErrUnavailable and ErrNotSent", err)
			}
			continue
		}
		if err != nil || string(v) != string(value(i)) {
			t.Fatalf("key %d on %s while %s is down: %q, %v", i, owner[i], victim, v, err)
		}
	}
	if err := cl.Put(ctx, []byte("while-down"), []byte("ok")); err != nil && !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("put while a server is down: %v", err)
	}
	// A server down is not a map change: its shards wait for it.
	if got := c.Map().Epoch(); got != epoch {
		t.Fatalf("the map changed (epoch %d -> %d) while %s was down", epoch, got, victim)
	}

	// Restart on the same data dir: new generation, new rkeys; the
	// client recovers by itself.
	s := c.Restart(victim)
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

// TestRestartSeenWithoutGossip: a client whose GET finds a restarted
// server at another generation than its view shows asks that server for
// its record (membership.Refresh) rather than wait for gossip, which here
// and probes are slowed to a round a minute (production gossips every
// 100-200 ms, and a round may miss the client): the GETs succeed at once.
func TestRestartSeenWithoutGossip(t *testing.T) {
	slow := func(tn *membership.Tuning) { // no gossip, no probe (whose acks carry gossip) during the test
		tn.GossipInterval, tn.ProbeInterval, tn.PushPullInterval = time.Minute, time.Minute, time.Hour
	}
	c := testcluster.Start(t, 1, testcluster.Options{Server: func(cfg *server.Config) { slow(&cfg.Membership.Tuning) }})
	cl := c.Client(t, func(cfg *client.Config) { slow(&cfg.Membership.Tuning) })
	ctx := context.Background()
	const n = 20
	for i := range n {
		if err := cl.Put(ctx, key(i), value(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	c.Stop("s1")
	s := c.Restart("s1")
	start := time.Now()
	for i := range n {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		v, err := cl.Get(gctx, key(i))
		cancel()
		if err != nil || string(v) != string(value(i)) {
			t.Fatalf("key %d after the restart (no gossip), %v after it: %q, %v", i, time.Since(start), v, err)
		}
	}
	if m, _ := cl.Membership().View().Member("s1"); m.Meta.Generation != s.Generation() {
		t.Fatalf("the client's view shows generation %d of s1, which is at %d", m.Meta.Generation, s.Generation())
	}
	t.Logf("%d GETs after the restart took %v", n, time.Since(start))
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
	// The absent keys' shards: a miss costs one shard word READ per
	// shard.
	absentShards := map[proto.Shard]bool{}
	for i := n; i < n+50; i++ {
		absentShards[proto.ShardOf(key(i))] = true
	}
	// A fresh client: nothing in its location cache.
	cold := newClient(t, c)
	before, reads := handled(c), cold.Reads()
	vals, err := cold.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	// Batched: one index READ per key, one record READ per present key,
	// and to confirm a miss the shard's word before and after a second
	// READ of the key's neighborhood; a key read again would add more.
	misses := uint64(2*len(absentShards) + 50)
	if got, want := cold.Reads()-reads, uint64(len(keys)+n+1)+misses; got != want {
		t.Errorf("cold MultiGet of %d keys (%d present, %d absent shards) posted %d READs, want %d", len(keys), n+1, len(absentShards), got, want)
	}
	// The fresh client's only requests were one Hello per server.
	for name, n := range handled(c) {
		if n > before[name]+1 {
			t.Errorf("cold MultiGet: %s handled %d requests, more than a Hello", name, n-before[name])
		}
	}
	// Warm (the puts cached every location): one record READ per present
	// key, one index READ per absent one, and the misses' check.
	before, reads = handled(c), cl.Reads()
	warm, err := cl.MultiGet(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cl.Reads()-reads, uint64(len(keys))+misses; got != want {
		t.Errorf("warm MultiGet of %d keys posted %d READs, want %d", len(keys), got, want)
	}
	if fmt.Sprint(warm) != fmt.Sprint(vals) {
		t.Fatalf("warm and cold MultiGets differ")
	}
	// The small values of a warm read share one buffer: each is still the
	// caller's own to append to, and a present empty one is non-nil.
	if v := warm[n+50]; v == nil || len(v) != 0 {
		t.Fatalf("empty value read warm as %#v, want an empty non-nil slice", v)
	}
	for i := range n {
		warm[i] = append(warm[i], '!')
	}
	for i := range n {
		if string(warm[i]) != string(value(i))+"!" {
			t.Fatalf("key %d after appending to every value: %q", i, warm[i])
		}
	}
	if after := handled(c); fmt.Sprint(after) != fmt.Sprint(before) {
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
	// Alone (no shared buffer) the empty value is still present.
	if one, err := cl.MultiGet(ctx, [][]byte{[]byte("empty")}); err != nil || one[0] == nil || len(one[0]) != 0 {
		t.Fatalf("MultiGet of the empty value alone: %#v, %v", one, err)
	}
	if _, err := cl.MultiGet(ctx, [][]byte{{}}); !errors.Is(err, client.ErrInvalid) {
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
	st := c.Server("s1").Store()
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

// MultiPut stores pairs across servers in batches: every value readable
// after, a key given more than once stored with its last value, the servers
// taking CommitBatches (one per lease and buffer's worth, not one commit
// per pair), from goroutines sharing one client; bad keys and values
// are refused before anything is sent.
func TestClusterMultiPut(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c)
	ctx := context.Background()
	const n = 300
	kvs := make([]client.KV, 0, n+1)
	for i := range n {
		kvs = append(kvs, client.KV{Key: key(i), Value: append(value(i), make([]byte, 2048)...)})
	}
	kvs[7].Value = nil // an empty value
	kvs = append(kvs, client.KV{Key: key(5), Value: []byte("not this")}, client.KV{Key: key(9), Value: []byte("nine again")},
		client.KV{Key: key(5), Value: []byte("the last")}) // keys 5 and 9 again, 5 twice
	count := func() (commits, batches uint64) {
		for _, s := range c.Running() {
			st := s.Stats()
			commits, batches = commits+st.Handled[proto.MsgCommit], batches+st.Handled[proto.MsgCommitBatch]
		}
		return
	}
	commits, batches := count()
	if err := cl.MultiPut(ctx, kvs); err != nil {
		t.Fatal(err)
	}
	afterCommits, afterBatches := count()
	if afterCommits != commits || afterBatches-batches == 0 || afterBatches-batches > n/4 {
		t.Fatalf("MultiPut of %d pairs (600 KiB): %d commits and %d batches; want none and at most %d", n, afterCommits-commits, afterBatches-batches, n/4)
	}
	t.Logf("%d pairs in %d batches", n, afterBatches-batches)
	for i := range n {
		v, err := cl.Get(ctx, key(i))
		want := kvs[i].Value
		switch i {
		case 5:
			want = []byte("the last")
		case 9:
			want = []byte("nine again")
		}
		if err != nil || string(v) != string(want) || (i == 7 && (v == nil || len(v) != 0)) {
			t.Fatalf("key %d after MultiPut: %d bytes, %v; want %d", i, len(v), err, len(want))
		}
	}

	// Goroutines sharing the client.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for g := range errs {
		wg.Go(func() {
			batch := make([]client.KV, 50)
			for j := range batch {
				batch[j] = client.KV{Key: fmt.Appendf(nil, "g%d-%d", g, j), Value: fmt.Appendf(nil, "%d-%d", g, j)}
			}
			errs[g] = cl.MultiPut(ctx, batch)
		})
	}
	wg.Wait()
	for g, err := range errs {
		if err != nil {
			t.Fatalf("goroutine %d: %v", g, err)
		}
		for j := range 50 {
			if v, err := cl.Get(ctx, fmt.Appendf(nil, "g%d-%d", g, j)); err != nil || string(v) != fmt.Sprintf("%d-%d", g, j) {
				t.Fatalf("goroutine %d's key %d: %q, %v", g, j, v, err)
			}
		}
	}

	// Refused before anything is sent.
	commits, batches = count()
	if err := cl.MultiPut(ctx, []client.KV{{Key: []byte("fine")}, {Key: nil}}); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "key 1") {
		t.Fatalf("MultiPut with an empty key: %v", err)
	}
	if err := cl.MultiPut(ctx, []client.KV{{Key: []byte("fine")}, {Key: []byte("huge"), Value: make([]byte, 1<<20)}}); !errors.Is(err, client.ErrTooLarge) {
		t.Fatalf("MultiPut with a value larger than a lease: %v", err)
	}
	if c2, b2 := count(); c2 != commits || b2 != batches {
		t.Fatalf("refused MultiPuts sent %d commits and %d batches", c2-commits, b2-batches)
	}
	if err := cl.MultiPut(ctx, nil); err != nil {
		t.Fatalf("MultiPut of nothing: %v", err)
	}
}

// TestWriteSessionsStayPerShard: a client takes its write sessions per
// shard, so the servers' tables of the last write of each (shard,
// session) hold about the shards written times the writes a shard has at
// once, not the client's concurrency times the shards. 16 goroutines
// doing MultiPuts of 16 over every shard once filled a table of 8,192 and
// evicted entries before their TTL (a retry of theirs would apply twice);
// here it holds a few thousand, and evicts none.
func TestWriteSessionsStayPerShard(t *testing.T) {
	c := testcluster.Start(t, 1, testcluster.Options{Store: store.Options{ArenaSize: 64 << 20, ArenaCount: 2,
		IndexSlots: 1 << 14, LeaseSize: 1 << 20, Sync: store.SyncNone, MaxSessions: 8192}})
	cl := c.Client(t, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for b := range 40 {
				kvs := make([]client.KV, 16)
				for i := range kvs {
					kvs[i] = client.KV{Key: fmt.Appendf(nil, "sess-%d-%d-%d", g, b, i), Value: []byte("v")}
				}
				if err := cl.MultiPut(ctx, kvs); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	st := c.Server("s1").Store().Stats()
	t.Logf("10,240 puts in MultiPuts of 16 from 16 goroutines: %d session entries, %d evicted early", st.Sessions, st.SessionsEvictedEarly)
	if st.SessionsEvictedEarly != 0 || st.Sessions > 4096 {
		t.Fatalf("%d session entries, %d evicted before their TTL: want at most 4,096, none evicted", st.Sessions, st.SessionsEvictedEarly)
	}
}
