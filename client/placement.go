// Where a key lives: the cluster map the client holds, refreshed from the servers, and the owner it names.

package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
)

// mapHolder is the client's cluster map: replaced whole, read without a
// lock, refreshed by one fetch at a time.
type mapHolder struct {
	cur atomic.Pointer[clustermap.Map]

	mu       sync.Mutex
	fetching chan struct{} // closed when the fetch in flight ends; nil when none
}

func (h *mapHolder) init()                     { h.cur.Store(clustermap.Empty) }
func (h *mapHolder) load() *clustermap.Map     { return h.cur.Load() }
func (h *mapHolder) epoch() uint64             { return h.cur.Load().Epoch() }
func (h *mapHolder) install(m *clustermap.Map) { h.cur.Store(m) }

// refreshMap fetches the map until the client holds epoch atLeast or later
// (1: any bootstrapped map), from the servers that gossip the highest
// epochs first. Concurrent callers share one fetch.
func (c *Client) refreshMap(ctx context.Context, atLeast uint64) error {
	for {
		if c.maps.epoch() >= atLeast {
			return nil
		}
		c.maps.mu.Lock()
		if ch := c.maps.fetching; ch != nil {
			c.maps.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		ch := make(chan struct{})
		c.maps.fetching = ch
		c.maps.mu.Unlock()
		err := c.fetchMap(ctx, atLeast)
		c.maps.mu.Lock()
		c.maps.fetching = nil
		close(ch)
		c.maps.mu.Unlock()
		return err
	}
}

func (c *Client) fetchMap(ctx context.Context, atLeast uint64) error {
	if c.pv != nil {
		return c.refreshView(ctx, atLeast) // GetView brings the map
	}
	var servers []membership.Member
	for _, mb := range c.ml.View().Servers() {
		if mb.Meta.Index != nil && mb.Meta.MapEpoch > 0 {
			servers = append(servers, mb)
		} else {
			c.ml.Refresh(mb.Name) // its record in the view may be older than its map: ask it
		}
	}
	if len(servers) == 0 {
		return errors.New("no server with a map in the gossip view yet")
	}
	slices.SortFunc(servers, func(a, b membership.Member) int { return cmp.Compare(b.Meta.MapEpoch, a.Meta.MapEpoch) })
	var last error
	for _, mb := range servers[:min(3, len(servers))] {
		have := c.maps.load()
		var reply *proto.MapReply
		// A server that is stopped (SIGSTOP, a hung machine) accepts
		// connections and never answers: give each a short while.
		actx, cancel := context.WithTimeout(ctx, mapFetchTimeout)
		err := c.withConn(actx, mb.Name, func(sc *serverConn) error {
			r, err := sc.call(actx, &mb, &proto.GetMap{Have: have.Epoch()})
			if err == nil {
				reply = r.(*proto.MapReply)
			}
			return err
		})
		cancel()
		if err != nil {
			last = err
			continue
		}
		if len(reply.Map) > 0 {
			m, err := clustermap.Decode(reply.Map)
			if err != nil {
				last = fmt.Errorf("the map from %s: %w", mb.Name, err)
				continue
			}
			if have.Epoch() > 0 && m.ClusterID() != have.ClusterID() {
				last = fmt.Errorf("%s belongs to another cluster (%x, this client's is %x)", mb.Name, m.ClusterID(), have.ClusterID())
				continue
			}
			if m.Epoch() > c.maps.epoch() {
				c.maps.install(m)
				c.log.Debug("cluster map", "epoch", m.Epoch(), "from", mb.Name)
			}
		}
		if c.maps.epoch() >= atLeast {
			return nil
		}
		last = fmt.Errorf("%s holds map epoch %d, want %d", mb.Name, reply.Epoch, atLeast)
	}
	return last
}

// mapFetchTimeout bounds the map fetch from one server.
const mapFetchTimeout = time.Second

// target is a server requests go to, as of one map and one gossip view.
// Targets are built once per (map, view) pair (routes) and shared by every
// operation until either changes: read them, never modify them.
type target struct {
	m      *clustermap.Map
	name   string
	member *membership.Member // in the view
	epoch  uint64
	// newer is the map epoch the server gossips when it is past m's, else 0.
	newer uint64
	// err is why requests cannot go to the server now (it is down, or not
	// the one the map knows), or nil.
	err error
}

// since is the epoch since which the target owns shard s in the map, or 0
// when it does not.
func (t *target) since(s proto.Shard) uint64 {
	o, since := t.m.Owner(s)
	if o != t.name {
		return 0
	}
	return since
}

// newTarget is server name as map m and view v know it: alive, with the
// data directory the map knows. A server that is down is unavailable: with
// one copy, no other server has its keys, and the client never asks one
// that would answer "not found".
func newTarget(m *clustermap.Map, v *membership.View, name string) *target {
	t := &target{m: m, name: name, epoch: m.Epoch()}
	srv, ok := m.Server(name)
	if !ok || srv.State == proto.ServerRemoved {
		t.err = &UnavailableError{Node: name, Reason: fmt.Sprintf("not in the cluster map (epoch %d)", m.Epoch())}
		return t
	}
	mb := v.Lookup(name)
	switch {
	case mb == nil:
		t.err = &UnavailableError{Node: name, Reason: "not in the gossip view"}
	case mb.MetaErr != nil:
		t.err = &UnavailableError{Node: name, Reason: "its metadata cannot be read", Err: mb.MetaErr}
	case mb.State != membership.StateAlive:
		t.err = &UnavailableError{Node: name, Reason: fmt.Sprintf("the key's server is %s (since %v)", mb.State, mb.Since.Format(time.RFC3339Nano))}
	case mb.Meta.ServerID != srv.ID:
		t.err = &UnavailableError{Node: name, Reason: fmt.Sprintf("it runs on data directory %s, the map knows %s (it lost its data?)", mb.Meta.ServerID, srv.ID)}
	default:
		t.member = mb
		if mb.Meta.MapEpoch > t.epoch {
			t.newer = mb.Meta.MapEpoch
		}
	}
	return t
}

// routes is every shard's target as of one map and one gossip view: what
// an operation would otherwise work out per key from both (the owner's
// name in the map, its member in the view, the checks above).
type routes struct {
	m       *clustermap.Map
	v       *membership.View
	byShard [proto.NumShards]*target
	byName  map[string]*target // every server of the map's
}

// server is the target of the map's server name (a shard's backup).
func (r *routes) server(name string) *target {
	if t := r.byName[name]; t != nil {
		return t
	}
	return &target{m: r.m, name: name, err: &UnavailableError{Node: name, Reason: fmt.Sprintf("not in the cluster map (epoch %d)", r.m.Epoch())}}
}

var notBootstrapped = &target{err: &UnavailableError{Node: "(none)", Reason: "the cluster map is not bootstrapped"}}

func newRoutes(m *clustermap.Map, v *membership.View) *routes {
	r := &routes{m: m, v: v}
	if !m.Bootstrapped() {
		for s := range r.byShard {
			r.byShard[s] = notBootstrapped
		}
		return r
	}
	r.byName = map[string]*target{}
	for _, srv := range m.Servers() {
		r.byName[srv.Name] = newTarget(m, v, srv.Name)
	}
	failing := map[string]*target{}
	for s := range r.byShard {
		name, _ := m.Owner(proto.Shard(s))
		t := r.server(name)
		if t.err != nil && m.Holders(proto.Shard(s)) > 1 {
			t = failingOver(failing, t)
		}
		r.byShard[s] = t
	}
	return r
}

// failingOver is down target t as the primary of shards with backups:
// the map's leader will hand them to a backup, so operations on them wait
// for a newer map as for a move, instead of failing at once.
func failingOver(cache map[string]*target, t *target) *target {
	if f := cache[t.name]; f != nil {
		return f
	}
	f := *t
	f.err = retryMoving(t.name, "%s, the primary of shards with backups, is unavailable (%w): waiting for a failover", t.name, t.err)
	cache[t.name] = &f
	return &f
}

// routes returns the routes of the client's map and view, built anew when
// either changed since the last call.
func (c *Client) routes() *routes {
	m, v := c.maps.load(), c.view()
	if r := c.route.Load(); r != nil && r.m == m && r.v == v {
		return r
	}
	r := newRoutes(m, v)
	c.route.Store(r)
	return r
}

// use returns t's error, or nil; when the server knows a newer map it
// fetches that, without holding the request up (the server refuses what
// it no longer owns).
func (c *Client) use(t *target) error {
	if t.err != nil {
		return t.err
	}
	if t.newer != 0 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.RetryTimeout)
			defer cancel()
			_ = c.refreshMap(ctx, t.newer)
		}()
	}
	return nil
}

// targetFor is the owner of key's shard in the client's map.
func (c *Client) targetFor(key []byte) (*target, error) {
	t := c.routes().byShard[proto.ShardOf(key)]
	return t, c.use(t)
}

// keyGroup is the keys (positions) one owner holds.
type keyGroup struct {
	t   *target
	idx []int
}

// groupByOwner splits the keys at positions idx by owner, as of the
// client's map: a group per server, in the order the keys first name
// them, each key's position in its group's idx (carved from one array).
func (c *Client) groupByOwner(keys [][]byte, idx []int) ([]keyGroup, error) {
	r := c.routes()
	var groups []keyGroup // a few: servers are few
	var counts []int      // each group's keys
	of := make([]int, len(idx))
	for j, i := range idx {
		t := r.byShard[proto.ShardOf(keys[i])]
		g := slices.IndexFunc(groups, func(g keyGroup) bool { return g.t.name == t.name })
		if g < 0 {
			if err := c.use(t); err != nil {
				return nil, err
			}
			g = len(groups)
			groups, counts = append(groups, keyGroup{t: t}), append(counts, 0)
		}
		of[j] = g
		counts[g]++
	}
	all, n := make([]int, len(idx)), 0
	for g, k := range counts {
		groups[g].idx, n = all[n:n:n+k], n+k
	}
	for j, i := range idx {
		groups[of[j]].idx = append(groups[of[j]].idx, i)
	}
	return groups, nil
}

// WaitMap fetches the cluster map until the client holds epoch or later,
// for at most timeout (and within ctx); it then fails with an error
// wrapping context.DeadlineExceeded.
func (c *Client) WaitMap(ctx context.Context, epoch uint64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if c.refreshMap(ctx, epoch) == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rkv: waiting for map epoch %d (holding %d): %w", epoch, c.maps.epoch(), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
