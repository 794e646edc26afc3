// Package client is rkv's Go client library.
//
// A Client joins the cluster's gossip as a light member (role client), so it
// learns every server's index and arena regions (address, rkey) and failures
// without asking anyone. A key's server is chosen by rendezvous placement.
//
// A GET is one-sided: one RDMA_READ of the key's index neighborhood and one
// of its record (a single READ when the location cache hits), verified by
// proto.VerifyRecord; torn or stale reads are retried, never returned. A
// PUT writes the record into a write lease with RDMA_WRITE and commits it
// with a control RPC. Per server the client keeps one lazily dialed
// connection: the control TCP connection, one QP connected over it, and a
// registered buffer; requests on one server are serialized.
//
// A Client is safe for concurrent use.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft" // the default provider
)

// Config configures a Client. Zero fields take the defaults documented on
// each.
type Config struct {
	// Seeds are gossip addresses ("host:port") of cluster members.
	// Required.
	Seeds []string
	// Name is the client's gossip name. Default "client-<host>-<random>".
	Name string
	// SecretKey is the cluster's gossip key, if it has one.
	SecretKey []byte
	// AuthToken is presented in every Hello (servers with an AuthToken
	// require it).
	AuthToken string
	// TLS, when set, secures the control connections to servers started
	// with server.Config.TLS: RootCAs verify the servers, Certificates is
	// the client's own for mTLS. Default: plaintext TCP.
	TLS *tls.Config
	// Provider and Device select the RDMA device. Defaults "soft" and "".
	Provider, Device string
	// DataAddr is the soft provider's data endpoint. Default
	// "127.0.0.1:0".
	DataAddr string
	// Replicas is the replication factor (placement's R). Only 1 is
	// supported today. Default 1.
	Replicas int
	// RetryAttempts and RetryTimeout bound one operation's retries (torn
	// reads, broken connections, server restarts): whichever ends first.
	// Defaults 8 and 2s.
	RetryAttempts int
	RetryTimeout  time.Duration
	// BufferSize is each connection's registered buffer: it bounds the
	// largest record. Default 2 MiB.
	BufferSize int
	// ConnsPerServer bounds the connections (each with its own QP,
	// buffer and lease) to each server, dialed as concurrent requests
	// need them: it is the client's requests in flight per server. Each
	// pins BufferSize bytes (RLIMIT_MEMLOCK). Default 4.
	ConnsPerServer int
	// QP sets the QPs' AckTimeout and RetryCount: how fast a dead server
	// is noticed on the data path. Defaults 250ms and 1.
	QP rdma.QPConfig
	// Membership configures the client's gossip (BindAddr, Tuning...).
	// Its Name, Role, Seeds and SecretKey come from the fields above.
	// Tuning.DeadRetention is how long a departed server's keys report
	// ErrUnavailable before they are placed on the remaining servers
	// (default 1 h: see membership.Tuning).
	Membership membership.Config
	// Logger receives the client's logs. Default slog.Default().
	Logger *slog.Logger
}

// Errors.
var (
	// ErrNotFound: the key has no value.
	ErrNotFound = errors.New("rkv: key not found")
	// ErrTooLarge: the key or value does not fit a record, a lease or
	// the client's buffer.
	ErrTooLarge = errors.New("rkv: key or value too large")
	// ErrFull: the server has no space (or no index slot) for the write.
	ErrFull = errors.New("rkv: server full")
	// ErrInvalid: the server refused the request (bad key, record).
	ErrInvalid = errors.New("rkv: invalid request")
	// ErrUnauthenticated: the server refused the auth token.
	ErrUnauthenticated = errors.New("rkv: unauthenticated")
	// ErrClosed: the client is closed.
	ErrClosed = errors.New("rkv: client closed")
)

// ErrUnavailable is returned when the server that holds a key is dead,
// has left, or cannot be reached within the retry budget.
type ErrUnavailable struct {
	Node   string // the server's name
	Reason string
	Err    error // the last error, if any
}

func (e *ErrUnavailable) Error() string {
	s := fmt.Sprintf("rkv: server %s unavailable: %s", e.Node, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *ErrUnavailable) Unwrap() error { return e.Err }

// KV is one key and value of a scan.
type KV struct {
	Key, Value []byte
}

// Client is a connection to an rkv cluster.
type Client struct {
	cfg Config
	log *slog.Logger
	dev rdma.Device
	pd  rdma.PD
	ml  *membership.Membership

	mu      sync.Mutex
	closed  bool
	servers map[string]*serverPool

	cacheMu sync.Mutex
	cache   map[string]cachedLoc

	reads   atomic.Uint64 // RDMA_READs posted
	retries retryCounters // retried attempts by operation (Retries)
}

// Reads is the number of one-sided RDMA_READs the client has posted: GETs
// cost two on a location-cache miss and one on a hit.
func (c *Client) Reads() uint64 { return c.reads.Load() }

// cachedLoc is where a key's record was last found.
type cachedLoc struct {
	node string
	gen  uint64
	loc  proto.Location
}

const maxCache = 1 << 16

// New joins the cluster and waits (bounded by ctx) until it knows at least
// one server whose index is registered.
func New(ctx context.Context, cfg Config) (_ *Client, err error) {
	if len(cfg.Seeds) == 0 {
		return nil, errors.New("rkv: Config.Seeds is empty")
	}
	if cfg.Provider == "" {
		cfg.Provider = "soft"
	}
	if cfg.DataAddr == "" {
		cfg.DataAddr = "127.0.0.1:0"
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Replicas != 1 {
		return nil, fmt.Errorf("rkv: Replicas %d: only 1 is supported", cfg.Replicas)
	}
	if cfg.RetryAttempts <= 0 {
		cfg.RetryAttempts = 8
	}
	if cfg.RetryTimeout <= 0 {
		cfg.RetryTimeout = 2 * time.Second
	}
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = 2 << 20
	}
	if cfg.ConnsPerServer <= 0 {
		cfg.ConnsPerServer = 4
	}
	if cfg.QP.AckTimeout == 0 {
		cfg.QP.AckTimeout = 250 * time.Millisecond
	}
	if cfg.QP.RetryCount == 0 {
		cfg.QP.RetryCount = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, log: cfg.Logger, servers: map[string]*serverPool{}, cache: map[string]cachedLoc{}}
	if c.dev, err = rdma.Open(cfg.Provider, cfg.Device, rdma.Options{ListenAddr: cfg.DataAddr}); err != nil {
		return nil, fmt.Errorf("rkv: opening RDMA device: %w", err)
	}
	if c.pd, err = c.dev.AllocPD(); err != nil {
		_ = c.dev.Close()
		return nil, fmt.Errorf("rkv: %w", err)
	}
	mc := cfg.Membership
	mc.Name, mc.Role, mc.Seeds, mc.SecretKey = cfg.Name, proto.RoleClient, cfg.Seeds, cfg.SecretKey
	mc.Meta = proto.NodeMeta{}
	if mc.Logger == nil {
		mc.Logger = cfg.Logger
	}
	if c.ml, err = membership.Create(mc); err != nil {
		_ = c.pd.Close()
		_ = c.dev.Close()
		return nil, fmt.Errorf("rkv: joining the cluster: %w", err)
	}
	for {
		for _, m := range c.ml.View().Servers() {
			if m.Meta.Index != nil {
				return c, nil
			}
		}
		select {
		case <-ctx.Done():
			_ = c.Close()
			return nil, fmt.Errorf("rkv: no server with a registered index in the cluster yet: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Close leaves the cluster and releases every connection. Operations in
// flight may fail.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	servers := c.servers
	c.servers = nil
	c.mu.Unlock()
	var errs []error
	for _, p := range servers {
		errs = append(errs, p.close())
	}
	if err := c.ml.Leave(time.Second); err != nil && !errors.Is(err, membership.ErrClosed) {
		c.log.Debug("leaving the cluster", "err", err)
	}
	errs = append(errs, c.ml.Shutdown(), c.pd.Close(), c.dev.Close())
	return errors.Join(errs...)
}

// Membership is the client's view of the cluster.
func (c *Client) Membership() *membership.Membership { return c.ml }

// Owner returns the name of the server that holds key in the current view.
func (c *Client) Owner(key []byte) (string, error) {
	m, err := c.owner(key)
	return m.Name, err
}

// owner is the key's server by membership.Owner: when it is dead or has
// left, the key is unavailable (with R=1 no other server has it).
func (c *Client) owner(key []byte) (membership.Member, error) {
	best, found := membership.Owner(c.ml.View(), key)
	if !found {
		return best, &ErrUnavailable{Node: "(none)", Reason: "no server in the cluster view"}
	}
	if best.State != membership.StateAlive {
		return best, &ErrUnavailable{Node: best.Name, Reason: fmt.Sprintf("the key's server is %s (since %v)", best.State, best.Since.Format(time.RFC3339Nano))}
	}
	return best, nil
}

func (c *Client) cacheGet(key []byte) (cachedLoc, bool) {
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	l, ok := c.cache[string(key)]
	return l, ok
}

func (c *Client) cachePut(key []byte, l cachedLoc) {
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	if len(c.cache) >= maxCache {
		clear(c.cache)
	}
	c.cache[string(key)] = l
}

func (c *Client) cacheDrop(key []byte) {
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	delete(c.cache, string(key))
}

// retryable marks errors worth another attempt from a fresh view.
type retryable struct{ err error }

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

func retry(format string, args ...any) error { return &retryable{fmt.Errorf(format, args...)} }

// do runs op against key's server until it succeeds, fails for good, or
// the retry budget is spent.
func (c *Client) do(ctx context.Context, what string, key []byte, op func(ctx context.Context, sc *serverConn, m membership.Member) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RetryTimeout)
	defer cancel()
	var last error
	var node string
	for attempt := 0; attempt < c.cfg.RetryAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return c.giveUp(what, key, node, attempt, last, ctx.Err())
			case <-time.After(min(time.Millisecond<<attempt, 100*time.Millisecond)):
			}
		}
		m, err := c.owner(key)
		if err != nil {
			return err
		}
		node = m.Name
		err = c.withConn(ctx, m.Name, func(sc *serverConn) error { return op(ctx, sc, m) })
		var r *retryable
		if err == nil || !errors.As(err, &r) {
			return err
		}
		last = err
		c.retries.add(what)
		c.log.Debug("retrying", "op", what, "server", m.Name, "attempt", attempt+1, "err", err)
		if ctx.Err() != nil {
			return c.giveUp(what, key, node, attempt+1, last, ctx.Err())
		}
	}
	return c.giveUp(what, key, node, c.cfg.RetryAttempts, last, nil)
}

func (c *Client) giveUp(what string, key []byte, node string, attempts int, last, ctxErr error) error {
	if m, err := c.owner(key); err != nil {
		return err // the server is gone meanwhile: say so
	} else if m.Name != node {
		node = m.Name
	}
	reason := fmt.Sprintf("%s %q failed after %d attempts", what, key, attempts)
	if ctxErr != nil {
		reason += " (" + ctxErr.Error() + ")"
	}
	return &ErrUnavailable{Node: node, Reason: reason, Err: last}
}

// Get returns key's value, read one-sidedly from its server's memory.
func (c *Client) Get(ctx context.Context, key []byte) ([]byte, error) {
	if len(key) == 0 || len(key) > proto.MaxKeyLen {
		return nil, fmt.Errorf("%w: key of %d bytes", ErrTooLarge, len(key))
	}
	var out []byte
	err := c.do(ctx, "GET", key, func(ctx context.Context, sc *serverConn, m membership.Member) error {
		v, err := sc.get(ctx, m, key)
		out = v
		return err
	})
	return out, err
}

// MultiGet returns the values of keys, in order, with nil for a key that
// does not exist (an empty value is a non-nil empty slice). Keys on one server are read together: one post of index
// READs, then one of record READs, so a batch costs about two round trips
// per server instead of two per key. A key whose batched read was torn or
// stale is then read alone, as Get does.
func (c *Client) MultiGet(ctx context.Context, keys [][]byte) ([][]byte, error) {
	byServer := map[string][]int{}
	members := map[string]membership.Member{}
	for i, k := range keys {
		if len(k) == 0 || len(k) > proto.MaxKeyLen {
			return nil, fmt.Errorf("%w: key %d of %d bytes", ErrTooLarge, i, len(k))
		}
		m, err := c.owner(k)
		if err != nil {
			return nil, err
		}
		byServer[m.Name] = append(byServer[m.Name], i)
		members[m.Name] = m
	}
	vals := make([][]byte, len(keys))
	var single []int
	for name, idx := range byServer {
		sub := make([][]byte, len(idx))
		for j, i := range idx {
			sub[j] = keys[i]
		}
		var got [][]byte
		var alone []int
		err := c.withConn(ctx, name, func(sc *serverConn) (err error) {
			got, alone, err = sc.multiGet(ctx, members[name], sub)
			return err
		})
		if errors.Is(err, ErrClosed) {
			return nil, err
		}
		if err != nil {
			single = append(single, idx...) // the connection failed: Get retries each
			continue
		}
		for j, i := range idx {
			vals[i] = got[j]
		}
		for _, j := range alone {
			single = append(single, idx[j])
		}
	}
	for _, i := range single {
		v, err := c.Get(ctx, keys[i])
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, err
		case v == nil:
			vals[i] = []byte{}
		default:
			vals[i] = v
		}
	}
	return vals, nil
}

// Put stores value under key: an RDMA_WRITE into a lease and a commit.
// It returns once the server acknowledged the write (durable under the
// server's sync policy).
func (c *Client) Put(ctx context.Context, key, value []byte) error {
	if len(key) == 0 || len(key) > proto.MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes", ErrTooLarge, len(key))
	}
	if proto.RecordSize(len(key), len(value)) > c.cfg.BufferSize {
		return fmt.Errorf("%w: a record of %d bytes exceeds the client buffer (%d)", ErrTooLarge, proto.RecordSize(len(key), len(value)), c.cfg.BufferSize)
	}
	return c.do(ctx, "PUT", key, func(ctx context.Context, sc *serverConn, m membership.Member) error {
		return sc.put(ctx, m, key, value)
	})
}

// Delete removes key. Deleting an absent key is not an error.
func (c *Client) Delete(ctx context.Context, key []byte) error {
	if len(key) == 0 || len(key) > proto.MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes", ErrTooLarge, len(key))
	}
	c.cacheDrop(key)
	return c.do(ctx, "DELETE", key, func(ctx context.Context, sc *serverConn, m membership.Member) error {
		_, err := sc.call(ctx, m, &proto.Delete{Key: key})
		return err
	})
}

// Scan returns up to limit keys (0: no limit) in [start, end) (end nil: no
// upper bound) with their values, in key order, from every server. It
// fails with ErrUnavailable while a server of the view is dead or leaving
// (its keys would be missing).
func (c *Client) Scan(ctx context.Context, start, end []byte, limit int) ([]KV, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrInvalid)
	}
	var all []KV
	for _, m := range c.ml.View().Members() {
		if m.MetaErr != nil || m.Meta.Role != proto.RoleServer {
			continue
		}
		if m.State != membership.StateAlive {
			return nil, &ErrUnavailable{Node: m.Name, Reason: "a server of the cluster is " + m.State.String() + ": a scan would miss its keys"}
		}
		kvs, err := c.scanServer(ctx, m.Name, start, end, limit)
		if err != nil {
			return nil, err
		}
		all = append(all, kvs...)
	}
	slices.SortFunc(all, func(a, b KV) int { return strings.Compare(string(a.Key), string(b.Key)) })
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

func (c *Client) scanServer(ctx context.Context, name string, start, end []byte, limit int) ([]KV, error) {
	var out []KV
	from := start
	if from == nil {
		from = []byte{}
	}
	for {
		var reply *proto.ScanReply
		err := c.doOn(ctx, name, func(ctx context.Context, sc *serverConn, m membership.Member) error {
			r, err := sc.call(ctx, m, &proto.Scan{Start: from, End: end, Limit: uint32(min(limit, 1<<32-1))})
			if err != nil {
				return err
			}
			reply = r.(*proto.ScanReply)
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, e := range reply.Entries {
			v, err := c.Get(ctx, e.Key)
			if errors.Is(err, ErrNotFound) {
				continue // deleted since
			}
			if err != nil {
				return nil, err
			}
			out = append(out, KV{Key: e.Key, Value: v})
		}
		if !reply.More || len(reply.Entries) == 0 || (limit > 0 && len(out) >= limit) {
			return out, nil
		}
		from = append(slices.Clone(reply.Entries[len(reply.Entries)-1].Key), 0)
	}
}

// doOn is do for a named server rather than a key's.
func (c *Client) doOn(ctx context.Context, name string, op func(ctx context.Context, sc *serverConn, m membership.Member) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RetryTimeout)
	defer cancel()
	var last error
	for attempt := 0; attempt < c.cfg.RetryAttempts; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return &ErrUnavailable{Node: name, Reason: ctx.Err().Error(), Err: last}
			case <-time.After(min(time.Millisecond<<attempt, 100*time.Millisecond)):
			}
		}
		m, ok := c.ml.View().Member(name)
		if !ok || m.State != membership.StateAlive {
			return &ErrUnavailable{Node: name, Reason: "not alive in the cluster view"}
		}
		err := c.withConn(ctx, name, func(sc *serverConn) error { return op(ctx, sc, m) })
		var r *retryable
		if err == nil || !errors.As(err, &r) {
			return err
		}
		last = err
	}
	return &ErrUnavailable{Node: name, Reason: fmt.Sprintf("failed after %d attempts", c.cfg.RetryAttempts), Err: last}
}

// Stats asks the named server for its counters over the control RPC.
func (c *Client) Stats(ctx context.Context, node string) (proto.StatsReply, error) {
	var reply proto.StatsReply
	err := c.doOn(ctx, node, func(ctx context.Context, sc *serverConn, m membership.Member) error {
		r, err := sc.call(ctx, m, &proto.Stats{})
		if err != nil {
			return err
		}
		reply = *r.(*proto.StatsReply)
		return nil
	})
	return reply, err
}
