package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// Raising the replica count copies every shard to the other server as a
// backup (add-replica moves: copy, freeze, fence, final copy, finish, the
// primary keeping its shards) while a writer goes on; from the finish the
// primaries forward every write, so the backups hold what the primaries
// do. Then two backups are promoted, and writes and deletes go on through
// the new primaries.
func TestReplicasAddedForwardedAndPromoted(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers and 1024 shard copies")
	}
	c, cl := twoServers(t)
	ctx := context.Background()
	const nkeys = 400
	a := newAcked()
	keys := putKeys(t, cl, a, nkeys)
	leader := mapLeader(t, c)

	// A writer through the whole copy.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			put(t, cl, a, keys[i%nkeys])
		}
	})
	if _, err := leader.MapNode().Propose(ctx, &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	c.WaitSettled(60 * time.Second)
	m := c.Map()
	if m.Replicas() != 2 {
		t.Fatalf("replicas %d after setting 2", m.Replicas())
	}
	waitRoles(t, c, m)
	time.Sleep(200 * time.Millisecond) // forwarded writes too
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := sameReplicas(t, c, m); n != nkeys {
		t.Fatalf("%d keys on the replicas, want %d", n, nkeys)
	}
	readAll(t, cl, a, keys, "after the copies")

	// Promote the backup of one shard of each primary (the primaries stay
	// balanced, so the planner leaves them): no copy, the primary fenced and
	// made a backup, the backup serving.
	var promotions []proto.MoveCommand
	for _, primary := range []string{"s1", "s2"} {
		for i := range proto.NumShards {
			if info := m.Shard(proto.Shard(i)); info.Owner() == primary {
				promotions = append(promotions, proto.MoveCommand{Shard: proto.Shard(i), From: primary, To: info.Owners[1], Kind: proto.MovePromote})
				break
			}
		}
	}
	if _, err := leader.MapNode().Propose(ctx, &proto.MapCommand{Op: proto.MapStartMoves, Moves: promotions}); err != nil {
		t.Fatal(err)
	}
	c.WaitSettled(60 * time.Second)
	after := c.Map()
	for _, p := range promotions {
		if got := after.Shard(p.Shard).Owners; !slices.Equal(got, []string{p.To, p.From}) {
			t.Fatalf("shard %d after its promotion: owners %v, want [%s %s]", p.Shard, got, p.To, p.From)
		}
	}
	waitRoles(t, c, after)
	readAll(t, cl, a, keys, "after the promotions")
	for _, k := range keys {
		put(t, cl, a, k)
	}
	for _, k := range keys[:nkeys/4] {
		if err := cl.Delete(ctx, []byte(k)); err != nil {
			t.Fatalf("delete %s: %v", k, err)
		}
	}
	if n := sameReplicas(t, c, after); n != nkeys-nkeys/4 {
		t.Fatalf("%d keys on the replicas after deleting a quarter, want %d", n, nkeys-nkeys/4)
	}
	readAll(t, cl, a, keys[nkeys/4:], "after the writes")
}

// twoServers starts two servers at one replica, with small stores, and a
// client, once the map settled.
func twoServers(t *testing.T) (*testcluster.Cluster, *client.Client) {
	t.Helper()
	c := testcluster.Start(t, 2, testcluster.Options{Store: store.Options{ArenaSize: 16 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 64 << 10}})
	c.WaitSettled(30 * time.Second)
	return c, c.Client(t, nil)
}

// replicatedMaxMoves is the move budget of replicated's servers. Their
// shards are empty while the cluster forms, so a group of moves costs its
// map proposals, not its copies: at the default of 32 (groups of 8 per
// server), forming three servers at three replicas, 2,048 copies, took 22 s
// of a 46 s test under the race detector, and 3.3-3.9 s at 256. The
// default's small groups are what the cluster tests and the chaos suite
// run.
const replicatedMaxMoves = 256

// replicated starts n servers configured by mod, the first bootstrapping
// the cluster with r replicas (Config.Replicas), with a client, and waits
// until the cluster settled with r copies of every shard. It returns the
// map's leader too.
func replicated(t *testing.T, n, r int, mod func(*server.Config)) (*testcluster.Cluster, *client.Client, *server.Server) {
	t.Helper()
	c := testcluster.Start(t, n, testcluster.Options{
		Store: store.Options{ArenaSize: 16 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 64 << 10},
		Server: func(cfg *server.Config) {
			cfg.Replicas = r
			cfg.MaxMoves = replicatedMaxMoves
			mod(cfg)
		},
		Settle: 90 * time.Second, // every shard copied r-1 times
	})
	if m := c.Map(); m.Replicas() != r || m.Holders(0) != r || m.Holders(proto.NumShards-1) != r {
		t.Fatalf("bootstrapped with %d replicas, settled at %d, shards held %d and %d times", r, m.Replicas(), m.Holders(0), m.Holders(proto.NumShards-1))
	}
	return c, c.Client(t, nil), mapLeader(t, c)
}

// waitWritable puts k until a put is acknowledged, for at most 30 s.
func waitWritable(t *testing.T, cl *client.Client, a *acked, k, what string) {
	t.Helper()
	testcluster.WaitFor(t, 30*time.Second, what, func() error {
		v := a.next(k)
		if err := cl.Put(context.Background(), []byte(k), value(k, v)); err != nil {
			return err
		}
		a.ack(k, v)
		return nil
	})
}

func put(t *testing.T, cl *client.Client, a *acked, k string) {
	t.Helper()
	v := a.next(k)
	if err := cl.Put(context.Background(), []byte(k), value(k, v)); err != nil {
		t.Errorf("put %s: %v", k, err)
		return
	}
	a.ack(k, v)
}

func readAll(t *testing.T, cl *client.Client, a *acked, keys []string, when string) {
	t.Helper()
	floor := a.floor()
	for _, k := range keys {
		got, err := cl.Get(context.Background(), []byte(k))
		if err == nil {
			err = check(k, floor[k], got)
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", when, k, err)
		}
	}
}

func mapLeader(t *testing.T, c *testcluster.Cluster) *server.Server {
	if s := mapLeaderOf(c); s != nil {
		return s
	}
	t.Fatal("no map leader")
	return nil
}

// sameReplicas checks that every shard's backups hold the keys its
// primary does, at the same versions, and returns how many keys there are.
func sameReplicas(t *testing.T, c *testcluster.Cluster, m *clustermap.Map) int {
	t.Helper()
	n := 0
	for i := range proto.NumShards {
		sh := proto.Shard(i)
		info := m.Shard(sh)
		pe, _, err := c.Server(info.Owners[0]).Store().ShardEntries(sh, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range info.Owners[1:] {
			be, _, err := c.Server(b).Store().ShardEntries(sh, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(pe, be, func(a, b store.ScanEntry) bool { return string(a.Key) == string(b.Key) && a.Version == b.Version }) {
				t.Fatalf("shard %d: the primary %s holds %v, the backup %s %v", i, info.Owners[0], pe, b, be)
			}
		}
		n += len(pe)
	}
	return n
}

// waitRoles waits until every shard is owned, unfrozen, by its primary in
// m and backed up by its other owners, m.Replicas() distinct servers.
func waitRoles(t *testing.T, c *testcluster.Cluster, m *clustermap.Map) {
	t.Helper()
	for i := range proto.NumShards {
		info := m.Shard(proto.Shard(i))
		distinct := map[string]bool{}
		for _, o := range info.Owners {
			distinct[o] = true
		}
		if len(info.Owners) != m.Replicas() || len(distinct) != len(info.Owners) {
			t.Fatalf("shard %d owners %v, want %d servers", i, info.Owners, m.Replicas())
		}
	}
	waitReplicaStates(t, c, m)
}

// A backup that is down is dropped from its shards after BackupTimeout, so
// that their writes, which wait for every backup, go on; back, it is added
// again by a copy, and the replicas agree.
func TestDeadBackupIsDroppedAndAddedBack(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers, a stop and 1024 shard copies twice")
	}
	c, cl, leader := replicated(t, 2, 2, func(cfg *server.Config) { cfg.BackupTimeout = 500 * time.Millisecond })
	waitRoles(t, c, c.Map())

	// The keys the leader is primary of, which stay writable.
	var keys []string
	for i := 0; len(keys) < 100; i++ {
		k := fmt.Sprintf("key-%04d", i)
		if o, _ := c.Map().Owner(proto.ShardOf([]byte(k))); o == leader.Name() {
			keys = append(keys, k)
		}
	}
	other := "s1"
	if leader.Name() == "s1" {
		other = "s2"
	}
	c.Stop(other)
	a := newAcked()
	waitWritable(t, cl, a, keys[0], "a write to a shard whose backup is down")
	for _, k := range keys {
		put(t, cl, a, k)
	}
	if t.Failed() {
		return
	}
	if info := leader.Map().Shard(proto.ShardOf([]byte(keys[0]))); len(info.Owners) != 1 {
		t.Fatalf("owners %v with the backup down, want the primary alone", info.Owners)
	}

	c.Restart(other)
	c.WaitSettled(60 * time.Second)
	m := c.Map()
	waitRoles(t, c, m)
	sameReplicas(t, c, m)
	readAll(t, cl, a, keys, "with the backup back")
}

// TestForwardsSurviveABackupRestart: a primary's kept sessions to a
// backup that restarts on the same address are broken; its forwards dial
// it again, and every write reaches every replica. With ForwardOnQP (two
// servers), on a write QP still; with control forwards to two backups
// (three servers), sent together on the kept sessions, where the broken
// one is dialed again alone.
func TestForwardsSurviveABackupRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a restart and 1024 shard copies per backup")
	}
	for _, onQP := range []bool{true, false} {
		t.Run(map[bool]string{true: "qp", false: "control"}[onQP], func(t *testing.T) {
			n := map[bool]int{true: 2, false: 3}[onQP]
			c, cl, leader := replicated(t, n, n, func(cfg *server.Config) {
				cfg.ForwardOnQP, cfg.BackupTimeout = onQP, 500*time.Millisecond
			})
			waitRoles(t, c, c.Map())
			a := newAcked()
			keys := putKeys(t, cl, a, 200)
			other := "s1"
			if leader.Name() == "s1" {
				other = "s2"
			}
			if server.IdleForwardSessions(leader)[other] == 0 {
				t.Fatalf("%s keeps no forward session to %s after 200 puts", leader.Name(), other)
			}
			c.Stop(other)
			back := c.Restart(other)
			c.WaitSettled(60 * time.Second)
			m := c.Map()
			waitRoles(t, c, m)
			before := back.Stats().ForwardsOnQP
			for _, k := range keys {
				put(t, cl, a, k)
			}
			if t.Failed() {
				return
			}
			if n := sameReplicas(t, c, m); n != len(keys) {
				t.Fatalf("%d keys on the replicas after the restart, want %d", n, len(keys))
			}
			if got := back.Stats().ForwardsOnQP - before; onQP && got < uint64(len(keys))/4 {
				t.Fatalf("%s took %d forwards on a write QP after its restart, for %d puts", other, got, len(keys))
			}
			readAll(t, cl, a, keys, "after the backup's restart")
		})
	}
}

// A commit whose map is ahead of the primary's (its client learned first
// that a dead backup was dropped, and wrote no copy there) waits for the
// primary's map to catch up, then applies; one whose epoch the primary's
// map does not reach is refused as a moving shard, which the client
// retries with the map fetched again, never as a bad request.
func TestCommitFromANewerMapWaitsForIt(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers, a stop, and a commit refused after waiting 5s")
	}
	c, _, leader := replicated(t, 2, 2, func(cfg *server.Config) { cfg.BackupTimeout = 500 * time.Millisecond })
	waitRoles(t, c, c.Map())
	var keys [][]byte
	for i := 0; len(keys) < 2; i++ {
		k := fmt.Appendf(nil, "ahead-%d", i)
		if o, _ := leader.Map().Owner(proto.ShardOf(k)); o == leader.Name() {
			keys = append(keys, k)
		}
	}

	r := server.CommitAtEpoch(t, leader, nil, leader.Map().Epoch()+1000, keys[0], []byte("v"))
	if pe, ok := r.(*proto.Error); !ok || pe.Code != proto.CodeShardMoving {
		t.Fatalf("a commit at an epoch the map never reaches, naming no copy: %v, want a CodeShardMoving refusal", r)
	}

	other := "s1"
	if leader.Name() == "s1" {
		other = "s2"
	}
	c.Stop(other)
	next := leader.Map().Epoch() + 1 // the one dropping the stopped backup
	if r := server.CommitAtEpoch(t, leader, nil, next, keys[1], []byte("v")); r.Type() != proto.MsgCommitReply {
		t.Fatalf("a commit at the epoch that drops the stopped backup, naming no copy for it: %v, want it applied", r)
	}
	if info := leader.Map().Shard(proto.ShardOf(keys[1])); len(info.Owners) != 1 {
		t.Fatalf("owners %v once the commit applied, want the primary alone", info.Owners)
	}
}

// A primary paused through its failover resumes with writes queued: its
// Raft replica applies the map that gave its shards to their backups a
// few milliseconds before its store releases them. A commit or a delete
// in between is refused. It was applied there, as the map named no backup
// to forward it to, and acknowledged, and lost, as the new primary never
// had it: a chaos run's put acknowledged 30 ms after its primary resumed,
// then read as not found.
func TestDeposedPrimaryRefusesCommitsBeforeItsStoreCatchesUp(t *testing.T) {
	if testing.Short() {
		t.Skip("two servers, 1024 shard copies and a failover")
	}
	c, cl, leader := replicated(t, 2, 2, func(cfg *server.Config) {
		cfg.ReadLease = time.Second
		cfg.MaxClockDrift = 100 * time.Millisecond
	})
	waitRoles(t, c, c.Map())
	var deposed *server.Server
	for _, s := range c.Running() {
		if s != leader {
			deposed = s
		}
	}
	var key []byte
	for i := 0; key == nil; i++ {
		if k := fmt.Appendf(nil, "deposed-%d", i); c.Map().Shard(proto.ShardOf(k)).Owner() == deposed.Name() {
			key = k
		}
	}
	sh := proto.ShardOf(key)
	if err := cl.Put(context.Background(), key, []byte("before")); err != nil {
		t.Fatal(err)
	}

	server.StopRenewingReadLease(deposed)
	release := server.HoldShardStates(deposed)
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	epoch, err := server.FailOver(ctx, leader, []proto.Shard{sh}, deposed.Name(), leader.Name())
	if err != nil {
		t.Fatalf("failing %v over from %s to %s: %v", sh, deposed.Name(), leader.Name(), err)
	}
	testcluster.WaitFor(t, 10*time.Second, "the deposed primary's replica at the failover's map", func() error {
		if e := deposed.Map().Epoch(); e < epoch {
			return fmt.Errorf("at epoch %d, want %d", e, epoch)
		}
		return nil
	})
	if owners := deposed.Map().Shard(sh).Owners; !slices.Equal(owners, []string{leader.Name()}) {
		t.Fatalf("%v's owners after the failover: %v, want %s alone", sh, owners, leader.Name())
	}
	if st := server.ShardState(deposed, sh); st.State != store.ShardOwned {
		t.Fatalf("%v on the deposed primary's store, held: %v, want still owned", sh, st.State)
	}
	r := server.CommitWithCopies(t, deposed, []*server.Server{leader}, key, []byte("lost"))
	if pe, ok := r.(*proto.Error); !ok || pe.Code != proto.CodeNotOwner {
		t.Fatalf("a commit at the deposed primary, whose store still owns %v: %v, want a CodeNotOwner refusal", sh, r)
	}
	if r := server.DeleteAt(t, deposed, key); r.Type() != proto.MsgError || r.(*proto.Error).Code != proto.CodeNotOwner {
		t.Fatalf("a delete at the deposed primary: %v, want a CodeNotOwner refusal", r)
	}
	release()

	testcluster.WaitFor(t, 10*time.Second, "the new primary's value", func() error {
		got, err := cl.Get(context.Background(), key)
		if err != nil {
			return err
		}
		if string(got) != "before" {
			t.Fatalf("%s after the refused commit: %q, want %q", key, got, "before")
		}
		return nil
	})
}

// The map's leader, the primary of a third of the shards, stops while a
// writer runs, at three replicas on three servers: another voter leads,
// fails its shards over to their backups, and every key is readable at
// its last acknowledged value and writable again; replicas are copied
// back from the new primaries onto the survivor; back, the old leader is
// given replicas again, and all three agree.
func TestDeadPrimaryFailsOver(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers, a stop and thousands of shard copies")
	}
	c, cl, dead := replicated(t, 3, 3, func(cfg *server.Config) { cfg.FailoverTimeout = 200 * time.Millisecond })
	const nkeys = 300
	a := newAcked()
	keys := make([]string, nkeys)
	var theirs []string // the keys dead is primary of
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
		put(t, cl, a, keys[i])
		if o, _ := c.Map().Owner(proto.ShardOf([]byte(keys[i]))); o == dead.Name() {
			theirs = append(theirs, keys[i])
		}
	}
	if len(theirs) == 0 {
		t.Fatalf("%s is the primary of none of %d keys", dead.Name(), nkeys)
	}

	// A writer through the failover: a put to a shard without a primary
	// waits for the failover (up to MoveWait) rather than failing, and what
	// it was told is acknowledged stays.
	w := startWriter(cl, a, keys)
	time.Sleep(100 * time.Millisecond)
	stopped := time.Now()
	c.Stop(dead.Name())
	waitWritable(t, cl, a, theirs[0], "a write to a shard of the stopped primary")
	t.Logf("from the stop to the first write acknowledged by the new primary: %v (the writer's puts that failed: %d)", time.Since(stopped).Round(time.Millisecond), w.failed.Load())
	m := c.Map()
	for _, k := range theirs {
		if info := m.Shard(proto.ShardOf([]byte(k))); slices.Contains(info.Owners, dead.Name()) || info.Since <= 1 {
			t.Fatalf("%s's shard after the failover: %+v", k, info)
		}
	}
	readAll(t, cl, a, keys, "after the failover")
	w.stopAndCheck(t, "through the failover")
	for _, k := range keys {
		put(t, cl, a, k)
	}
	if t.Failed() {
		return
	}

	// Re-replication onto the survivors: two copies of every shard.
	testcluster.WaitFor(t, 60*time.Second, "two replicas of every shard", func() error {
		m := c.Map()
		for i := range proto.NumShards {
			if n := m.Holders(proto.Shard(i)); n != 2 || m.Shard(proto.Shard(i)).Move != nil {
				return fmt.Errorf("shard %d: %+v", i, m.Shard(proto.Shard(i)))
			}
		}
		return nil
	})
	waitReplicaStates(t, c, c.Map())
	if n := sameReplicas(t, c, c.Map()); n != nkeys {
		t.Fatalf("%d keys on the replicas, want %d", n, nkeys)
	}

	c.Restart(dead.Name())
	c.WaitSettled(120 * time.Second)
	m = c.Map()
	waitReplicaStates(t, c, m)
	if n := sameReplicas(t, c, m); n != nkeys {
		t.Fatalf("%d keys on the three replicas, want %d", n, nkeys)
	}
	readAll(t, cl, a, keys, "with the old primary back")
}

// waitReplicaStates waits until every shard's primary in m serves it and
// each of its backups backs it up, under m's since.
func waitReplicaStates(t *testing.T, c *testcluster.Cluster, m *clustermap.Map) {
	t.Helper()
	testcluster.WaitFor(t, 30*time.Second, "every shard served by its primary and backed up by the others", func() error {
		for i := range proto.NumShards {
			sh := proto.Shard(i)
			info := m.Shard(sh)
			if st := c.Server(info.Owners[0]).Store().ShardState(sh); st.State != store.ShardOwned || st.Since != info.Since || st.Frozen {
				return fmt.Errorf("shard %d on its primary %s: %+v, want owned since %d, not frozen", i, info.Owners[0], st, info.Since)
			}
			for _, b := range info.Owners[1:] {
				if st := c.Server(b).Store().ShardState(sh); st.State != store.ShardBackup || st.Since != info.Since {
					return fmt.Errorf("shard %d on its backup %s: %+v, want a backup since %d", i, b, st, info.Since)
				}
			}
		}
		return nil
	})
}

// writer puts the keys round and round from one goroutine, as an
// application would through a change, until stopAndCheck.
type writer struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	failed   atomic.Int64
	firstErr atomic.Pointer[error]
}

func startWriter(cl *client.Client, a *acked, keys []string) *writer {
	w := &writer{stop: make(chan struct{})}
	w.wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			k := keys[i%len(keys)]
			v := a.next(k)
			if err := cl.Put(context.Background(), []byte(k), value(k, v)); err != nil {
				w.failed.Add(1)
				w.firstErr.CompareAndSwap(nil, &err)
				continue
			}
			a.ack(k, v)
		}
	})
	return w
}

// stopAndCheck stops the writer and fails t if any of its puts failed.
func (w *writer) stopAndCheck(t *testing.T, during string) {
	t.Helper()
	close(w.stop)
	w.wg.Wait()
	if n := w.failed.Load(); n > 0 {
		t.Errorf("%d of the writer's puts failed %s, the first: %v", n, during, *w.firstErr.Load())
	}
}

// Lowered from three replicas to two and then to one under a writer, the
// leader drops the surplus backups: each shard ends with the count's
// holders, the servers dropped from a shard hold nothing of it, no put
// fails (a forward to a backup being dropped is retried by the client on
// the new map), and every acknowledged write reads back.
func TestLoweredReplicaCountDropsBackups(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers and 2048 shard copies")
	}
	c, cl, _ := replicated(t, 3, 3, func(*server.Config) {})
	const nkeys = 300
	a := newAcked()
	keys := putKeys(t, cl, a, nkeys)
	w := startWriter(cl, a, keys)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, r := range []int{2, 1} {
		before, start := c.Map(), time.Now()
		if _, err := cl.SetReplicas(ctx, r); err != nil {
			t.Fatalf("SetReplicas(%d): %v", r, err)
		}
		c.WaitSettled(60 * time.Second)
		m := c.Map()
		t.Logf("lowered to %d replicas: settled in %v, at epoch %d (from %d)", r, time.Since(start).Round(time.Millisecond), m.Epoch(), before.Epoch())
		for i := range proto.NumShards {
			sh := proto.Shard(i)
			info := m.Shard(sh)
			if len(info.Owners) != r || info.Owners[0] != before.Shard(sh).Owners[0] {
				t.Fatalf("at %d replicas, shard %d: %+v (before: %+v); want %d holders, the primary kept", r, i, info, before.Shard(sh), r)
			}
		}
		waitReplicaStates(t, c, m)
		testcluster.WaitFor(t, 10*time.Second, "the dropped copies gone", func() error {
			for _, s := range c.Running() {
				for i := range proto.NumShards {
					sh := proto.Shard(i)
					if st := s.Store().ShardState(sh); !slices.Contains(m.Shard(sh).Owners, s.Name()) && st.State != store.ShardNone {
						return fmt.Errorf("%s, dropped from shard %d, holds it %+v", s.Name(), i, st)
					}
				}
			}
			return nil
		})
		if r := m.Replication(); r.OverReplicated != 0 || r.UnderReplicated != 0 {
			t.Fatalf("settled: %+v", r)
		}
	}
	w.stopAndCheck(t, "while the backups were dropped")
	readAll(t, cl, a, keys, "at one replica")
	if n := sameReplicas(t, c, c.Map()); n != nkeys {
		t.Fatalf("%d keys in the shards, want %d", n, nkeys)
	}
}

// A server whose data directory is lost (as if its disk died) and that
// comes back empty under its name is rebuilt from the others: at R=3 its
// old entry's shards fail over and its backups are dropped, the leader
// then swaps the old entry for the new one instead of refusing it, and the
// planner copies every shard to it again. Nothing acknowledged is lost, and
// its copies agree with the primaries'.
func TestLostDataDirIsRebuiltFromTheReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers and thousands of shard copies, twice")
	}
	c, cl, leader := replicated(t, 3, 3, func(cfg *server.Config) {
		cfg.FailoverTimeout, cfg.BackupTimeout = 200*time.Millisecond, 200*time.Millisecond
	})
	const nkeys = 300
	a := newAcked()
	// Written by 16 goroutines sharing a client with one connection per
	// server (so one copy connection to each backup), each holding a
	// PUT's copy connections until its commit is answered, on shards that
	// list their two backups in either order.
	keys := putKeysAtOnce(t, c.Client(t, func(cfg *client.Config) { cfg.ConnsPerServer = 1 }), a, nkeys, 16)
	lost := "s3"
	if leader.Name() == lost {
		lost = "s2"
	}
	oldID := c.Server(lost).ID()
	c.Stop(lost)
	if err := os.RemoveAll(filepath.Join(c.Root, lost)); err != nil {
		t.Fatal(err)
	}
	back := c.Restart(lost)
	if back.ID() == oldID {
		t.Fatalf("%s kept its ID %s on an empty data directory", lost, oldID)
	}
	testcluster.WaitFor(t, 60*time.Second, "the new "+lost+" in the map", func() error {
		select {
		case err := <-back.Err():
			t.Fatalf("the new %s was refused: %v", lost, err)
		default:
		}
		if srv, ok := c.Map().Server(lost); !ok || srv.ID != back.ID() || srv.State != proto.ServerActive {
			return fmt.Errorf("%s in the map: %+v", lost, srv)
		}
		return nil
	})
	c.WaitSettled(120 * time.Second)
	m := c.Map()
	if r := m.Replication(); r.UnderReplicated != 0 || r.Target != 3 {
		t.Fatalf("after the rebuild: %+v", r)
	}
	if h := m.Holding(lost); h.Shards != proto.NumShards {
		t.Fatalf("the new %s holds %d shards, want all %d", lost, h.Shards, proto.NumShards)
	}
	waitReplicaStates(t, c, m)
	if n := sameReplicas(t, c, m); n != nkeys {
		t.Fatalf("%d keys in the shards, want %d", n, nkeys)
	}
	readAll(t, cl, a, keys, "after the rebuild")
}

// putKeysAtOnce puts n keys, key-000 on, from writers goroutines sharing
// cl, and returns them.
func putKeysAtOnce(t *testing.T, cl *client.Client, a *acked, n, writers int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				put(t, cl, a, keys[i])
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return keys
}

// putKeys puts n keys, key-000 on, and returns them.
func putKeys(t *testing.T, cl *client.Client, a *acked, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
		put(t, cl, a, keys[i])
	}
	return keys
}

// TestForwardsLostAtABackup: a backup applies forwards whose answers are
// lost (the connection closed instead), often twice in a row, so that the
// primary's forward fails, it applies nothing, and the client writes the
// record again; four writers of two clients, each key written once, so
// that a replica left behind stays behind.
// Every acknowledged write is read back, and the replicas agree on every
// key's version: a backup that applied a failed attempt takes the retry's
// record, as the primary does.
func TestForwardsLostAtABackup(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers and 2048 shard copies")
	}
	c, cl, leader := replicated(t, 3, 3, func(*server.Config) {})
	waitRoles(t, c, c.Map())
	other := c.Client(t, nil)
	victim := c.Server("s1")
	if victim == leader {
		victim = c.Server("s2")
	}
	var forwards atomic.Int64
	server.DropReplies(victim, func(m proto.Message) bool {
		if _, ok := m.(*proto.ReplicaCommit); !ok {
			return false
		}
		return forwards.Add(1)%8 < 2
	})
	defer server.DropReplies(victim, nil)
	a := newAcked()
	keys := make([]string, 240)
	for i := range keys {
		keys[i] = fmt.Sprintf("lost-%03d", i)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		writer := []*client.Client{cl, other}[w%2]
		wg.Go(func() {
			for i := w; i < len(keys); i += 4 {
				put(t, writer, a, keys[i])
			}
		})
	}
	wg.Wait()
	server.DropReplies(victim, nil)
	if t.Failed() {
		return
	}
	if forwards.Load() < 40 {
		t.Fatalf("%s saw %d forwards, want most of the 240 writes", victim.Name(), forwards.Load())
	}
	readAll(t, cl, a, keys, "after the lost answers")
	if n := sameReplicas(t, c, c.Map()); n != len(keys) {
		t.Fatalf("%d keys on the replicas, want %d", n, len(keys))
	}
}

// TestForwardsToABackupRunTogether: a primary forwards concurrent writes
// to a backup over several sessions at once, not one round trip after
// another on a single session (where a backup applied one write per
// batch, and a read lease renewal queued behind the forwards), each
// forward, commit or delete, a control request or, with ForwardOnQP, a
// SEND on a session's write QP.
func TestForwardsToABackupRunTogether(t *testing.T) {
	for _, onQP := range []bool{false, true} {
		t.Run(fmt.Sprintf("ForwardOnQP=%v", onQP), func(t *testing.T) { forwardsRunTogether(t, onQP) })
	}
}

func forwardsRunTogether(t *testing.T, forwardOnQP bool) {
	c, cl, _ := replicated(t, 2, 2, func(cfg *server.Config) { cfg.ForwardOnQP = forwardOnQP })
	key := func(i int) []byte { return fmt.Appendf(nil, "together-%d", i) }
	putParallel(t, cl, 2000, key, make([]byte, 512))
	for i := range 100 {
		if err := cl.Delete(context.Background(), key(i)); err != nil {
			t.Fatalf("delete %s: %v", key(i), err)
		}
	}
	var commits, deletes, onQP uint64
	for _, s := range c.Running() {
		st := s.Stats()
		commits, deletes, onQP = commits+st.Handled[proto.MsgReplicaCommit], deletes+st.Handled[proto.MsgReplicaDelete], onQP+st.ForwardsOnQP
	}
	if want := map[bool]uint64{false: 0, true: commits + deletes}[forwardOnQP]; commits < 2000 || deletes < 100 || onQP != want {
		t.Fatalf("the backups took %d forwarded commits and %d deletes for 2,000 puts and 100 deletes, %d of them on a write QP: want %d", commits, deletes, onQP, want)
	}
	most := 0
	for _, s := range c.Running() {
		for peer, n := range server.IdleForwardSessions(s) {
			t.Logf("%s keeps %d sessions to %s", s.Name(), n, peer)
			most = max(most, n)
		}
	}
	if most < 2 {
		t.Fatalf("after 2,000 puts from 8 goroutines at two replicas, each server keeps at most %d session to the other: its forwards ran one at a time", most)
	}
	m := c.Map()
	if n := sameReplicas(t, c, m); n != 2000-100 {
		t.Fatalf("%d keys on the replicas, want 1,900", n)
	}
}

// TestPromotionRetriedAfterItsSourceMadeBackups: a promotion whose finish
// fails after its source made the shards backups (a Raft leader change
// does this) is retried, and the retry's fence and release find the
// source's shards already backups for it and go through, instead of
// being refused for good ("FreezeShards of a shard which is backup here").
func TestPromotionRetriedAfterItsSourceMadeBackups(t *testing.T) {
	c, cl, leader := replicated(t, 2, 2, func(*server.Config) {})
	ctx := context.Background()
	a := newAcked()
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprintf("retried-%03d", i)
		put(t, cl, a, keys[i])
	}
	for _, s := range c.Running() {
		server.LosePromotionFinishes(s, 1)
	}
	// Four shards are promoted each way, so that the primaries stay
	// balanced and the planner, which would promote a surplus back at once
	// and change the map under the checks below, has nothing to do.
	m := c.Map()
	var promotions []proto.MoveCommand
	from := map[string]int{}
	for i := range proto.NumShards {
		if info := m.Shard(proto.Shard(i)); from[info.Owner()] < 4 {
			from[info.Owner()]++
			promotions = append(promotions, proto.MoveCommand{Shard: proto.Shard(i), From: info.Owner(), To: info.Owners[1], Kind: proto.MovePromote})
		}
	}
	if len(promotions) != 8 {
		t.Fatalf("%d promotions planned, want four from each server: %v", len(promotions), promotions)
	}
	if _, err := leader.MapNode().Propose(ctx, &proto.MapCommand{Op: proto.MapStartMoves, Moves: promotions}); err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, 30*time.Second, "the promotions finished on their retry", func() error {
		now := c.Map()
		for _, p := range promotions {
			if got := now.Shard(p.Shard).Owners; !slices.Equal(got, []string{p.To, p.From}) {
				return fmt.Errorf("shard %d: owners %v, want [%s %s]", p.Shard, got, p.To, p.From)
			}
		}
		return nil
	})
	for _, s := range c.Running() {
		if n := server.PromotionFinishesToLose(s); n != 0 {
			t.Fatalf("%s, a promotions' target, dropped no finish (%d left to drop): nothing was retried", s.Name(), n)
		}
	}
	after := c.Map()
	waitRoles(t, c, after)
	readAll(t, cl, a, keys, "after the retried promotions")
	for _, k := range keys {
		put(t, cl, a, k)
	}
	if n := sameReplicas(t, c, after); n != len(keys) {
		t.Fatalf("%d keys on the replicas, want %d", n, len(keys))
	}
}

// TestCommitsThatDoNotFitTheSlotGoByControl: a commit whose frame is
// larger than the slot the server offers on the write QP (a Commit
// naming many copies with long server names; here, a server offering 16
// bytes) goes as a control request once its WRITE completed; at two
// replicas the WRITE was posted before the copies were written, and is
// posted again and waited for (TestCommitOnTheWriteQP's fallback case has
// one replica); with ForwardOnQP, the forwards too go as control requests.
func TestCommitsThatDoNotFitTheSlotGoByControl(t *testing.T) {
	c, _, _ := replicated(t, 2, 2, func(cfg *server.Config) { cfg.ForwardOnQP = true })
	for _, s := range c.Running() {
		server.OfferCommitSlot(s, 16)
	}
	cl := c.Client(t, nil)
	before := map[string]server.Stats{}
	for _, s := range c.Running() {
		before[s.Name()] = s.Stats()
	}
	a := newAcked()
	keys := putKeys(t, cl, a, 100)
	readAll(t, cl, a, keys, "committed by control requests")
	var commits uint64
	for _, s := range c.Running() {
		st, was := s.Stats(), before[s.Name()]
		if st.CommitsOnQP != was.CommitsOnQP || st.ForwardsOnQP != was.ForwardsOnQP {
			t.Fatalf("%s took %d commits and %d forwards on a write QP offering 16 bytes", s.Name(), st.CommitsOnQP-was.CommitsOnQP, st.ForwardsOnQP-was.ForwardsOnQP)
		}
		commits += st.Handled[proto.MsgCommit] - was.Handled[proto.MsgCommit]
	}
	if commits < 100 {
		t.Fatalf("%d commits for 100 puts", commits)
	}
	if n := sameReplicas(t, c, c.Map()); n != 100 {
		t.Fatalf("%d keys on the replicas, want 100", n)
	}
}

// TestMultiPutAtTwoReplicas: the pairs of a MultiPut whose shards have
// backups are put one by one on the primaries' write QPs, each naming its
// copies (a batch's forwards would reach a backup's lease out of order),
// and the backups apply them all.
func TestMultiPutAtTwoReplicas(t *testing.T) {
	c, cl, _ := replicated(t, 2, 2, func(*server.Config) {})
	count := func() (onQP, batches uint64) {
		for _, s := range c.Running() {
			st := s.Stats()
			onQP, batches = onQP+st.CommitsOnQP, batches+st.Handled[proto.MsgCommitBatch]
		}
		return
	}
	onQP, batches := count()
	kvs := make([]client.KV, 300)
	for i := range kvs {
		k := fmt.Sprintf("multi-%03d", i)
		kvs[i] = client.KV{Key: []byte(k), Value: value(k, 1)}
	}
	if err := cl.MultiPut(context.Background(), kvs); err != nil {
		t.Fatal(err)
	}
	onQP2, batches2 := count()
	if batches2 != batches || onQP2-onQP < uint64(len(kvs)) {
		t.Fatalf("a MultiPut of %d at two replicas: %d batches, %d commits on write QPs; want none and %d", len(kvs), batches2-batches, onQP2-onQP, len(kvs))
	}
	if n := sameReplicas(t, c, c.Map()); n != len(kvs) {
		t.Fatalf("%d keys on the replicas, want %d", n, len(kvs))
	}
	for _, kv := range kvs {
		if v, err := cl.Get(context.Background(), kv.Key); err != nil || string(v) != string(kv.Value) {
			t.Fatalf("Get %s: %q, %v", kv.Key, v, err)
		}
	}
}
