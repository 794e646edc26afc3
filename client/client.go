// Package client is rkv's Go client library.
//
// A Client learns every server's index and arena regions (address, rkey)
// and failures either by joining the cluster's gossip as a light member
// (role client; Config.Seeds, the default) or, without gossip, by asking a
// server's control port for the servers its gossip sees (Config.Endpoints:
// one round trip instead of a gossip join, for short-lived processes such
// as the CLI). It holds the cluster map (fetched from a server, refreshed
// when a server's gossip or answer shows a newer epoch): a key's server is
// the owner of its shard in that map, never a guess from the moment's
// gossip view. While that server is down the key is unavailable
// (UnavailableError); it is never looked for elsewhere.
//
// A GET is one-sided: one RDMA_READ of the key's index neighborhood and
// one of its record (a single READ when the location cache hits),
// verified by proto.VerifyRecord; torn or stale reads are retried, never
// returned. A miss is an answer only once the server's shard word shows it
// owns the shard at the map's epoch (a third READ, on misses alone). A PUT
// writes the record into a write lease with RDMA_WRITE and commits it with
// a control RPC carrying the map epoch and an idempotency session, so a
// retried commit is applied once. Per server the client keeps a pool of
// connections (Config.ConnsPerServer), each a control session, a QP
// connected over it and a registered buffer, carrying one request at a
// time.
//
// A Client is safe for concurrent use.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// Config configures a Client. Zero fields take the defaults documented on
// each.
type Config struct {
	// Seeds are gossip addresses ("host:port") of cluster members: the
	// client joins the cluster's gossip through them. Give Seeds or
	// Endpoints.
	Seeds []string
	// Endpoints are control addresses ("host:port", a server's
	// ControlAddr) of cluster servers. With them the client does not join
	// gossip: it asks one of these servers (GetView) for the servers its
	// gossip sees, their metadata and the cluster map, in one round trip,
	// and asks again on a retryable failure, when it needs a newer map,
	// and every ViewRefresh while in use; later fetches go first to the
	// servers it learnt. Start-up costs a round trip instead of a gossip
	// join (~250 ms), but deaths and restarts are seen through a server,
	// up to ViewRefresh late. Give Seeds or Endpoints; Membership, Name's
	// gossip use and SecretKey are then unused.
	Endpoints []string
	// ViewRefresh is how old a view fetched from Endpoints may grow while
	// the client is in use before it is fetched again, in the background.
	// Default 1s.
	ViewRefresh time.Duration
	// Device is the RDMA device the client reads and writes through
	// (rdma.Open; the command or program chooses the provider; a soft
	// device is best opened with SoftLinks links). Required; the client
	// does not close it.
	Device rdma.Device
	// Name is the client's gossip name, and the name its Hellos give.
	// Default "client-<host>-<random>".
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
	// RetryAttempts bounds one operation's attempts (torn reads, broken
	// connections, server restarts, a shard's last copy in a move); the
	// attempts back off from 1 ms to 100 ms, so with the default the time
	// budget ends first. Default 32.
	RetryAttempts int
	// RetryTimeout bounds one operation when its ctx has no deadline; a
	// ctx deadline is honored as it is. Default 2s.
	RetryTimeout time.Duration
	// MoveWait is how long an operation without a ctx deadline waits,
	// from its start, for its key's shard to reach its new owner when the
	// shard is in a move's last copy (writes are refused from the freeze
	// until the new owner serves it: milliseconds, longer on a loaded
	// machine). Default 10s.
	MoveWait time.Duration
	// BufferSize is each connection's registered buffer, at least: a
	// connection to a server that takes larger records (its advertised
	// limits) gets a buffer that holds the largest. Default 2 MiB.
	BufferSize int
	// ConnsPerServer bounds the connections (each with its own QP,
	// buffer and lease) to each server, dialed as concurrent requests
	// need them: it is the client's requests in flight per server. Each
	// pins BufferSize bytes (RLIMIT_MEMLOCK). Default 4.
	ConnsPerServer int
	// AckTimeout and RetryCount are the QPs': how fast a dead server is
	// noticed on the data path. Defaults 250ms and 1.
	AckTimeout time.Duration
	RetryCount int
	// Membership configures the client's gossip (BindAddr, Tuning...).
	// Its Name, Role, Seeds and SecretKey come from the fields above.
	Membership membership.Config
	// Logger receives the client's logs. Default slog.Default().
	Logger *slog.Logger
}

// SoftLinks is how many links (rdma.Options.Links) a client's soft device
// is best opened with: the pool gives concurrent requests connections
// whose read QPs ride distinct links (rdma.Multilink), so that their GETs
// read their own answers, and every write QP rides one (the session's
// write lane), so that commits reach a server together. rkv-client's
// --soft-links defaults to it. Side by side with one link (a pool of up
// to 64 connections, 5 to 8 pairs): GETs 1.55x at two goroutines, 1.16x
// at four and at sixteen, 1.03x at one; PUTs 1.08x, durable PUTs 0.95x.
const SoftLinks = 3

// VerbsSpin is how long a client's verbs device is best opened to poll a
// CQ before it sleeps on the completion channel (rdma.Options.Spin): a
// GET waits for one READ, which a NIC completes in a few microseconds,
// and a PUT for the server's reply, some ten more, where sleeping adds an
// interrupt and a wake-up to each. rkv-client's --verbs-spin defaults to
// it. It is chosen from those latencies, not measured on a NIC; under
// rxe's emulation, whose completions take 0.1-1 ms, it costs a PUT no
// more than the spin.
const VerbsSpin = 20 * time.Microsecond

// Errors. Every error an operation returns for one of these reasons wraps
// it, for errors.Is.
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
	// ErrUnauthenticated: the server refused the auth token or the TLS
	// session.
	ErrUnauthenticated = errors.New("rkv: unauthenticated")
	// ErrUnavailable: the key's server is down, has left or cannot be
	// reached within the retry budget; the error is an *UnavailableError
	// saying which and why.
	ErrUnavailable = errors.New("rkv: unavailable")
	// ErrClosed: the client is closed.
	ErrClosed = errors.New("rkv: client closed")
	// ErrNotSent: the operation failed before any attempt of it left the
	// client (its server is known to be down, not in the map...), so a
	// Put or Delete that fails with it certainly did not take effect.
	// Without it, a failed write may or may not have been applied. It
	// comes with the reason: ErrNotSent and ErrUnavailable, say.
	ErrNotSent = errors.New("rkv: not sent")
	// ErrNotControlPort: every address New asked (Config.Endpoints)
	// accepted the connection and closed it without answering the Hello,
	// as a gossip port does: none is a server's control port.
	ErrNotControlPort = errors.New("rkv: not a control port")
)

// UnavailableError is returned when the server that holds a key is dead,
// has left, or cannot be reached within the retry budget. It is
// ErrUnavailable for errors.Is.
type UnavailableError struct {
	Node   string // the server's name
	Reason string
	Err    error // the last error, if any
}

func (e *UnavailableError) Error() string {
	s := fmt.Sprintf("rkv: server %s unavailable: %s", e.Node, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// Is makes an UnavailableError match ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// KV is one key and value of a scan.
type KV struct {
	Key, Value []byte
}

// Client is a connection to an rkv cluster.
type Client struct {
	cfg   Config
	log   *slog.Logger
	dev   rdma.Device
	lanes int // the device's links to each server (rdma.Multilink), for the pools' read lanes
	pd    rdma.PD
	name  string
	ml    *membership.Membership // with Config.Seeds; nil with Endpoints
	pv    *polledView            // with Config.Endpoints; nil with Seeds
	maps  mapHolder
	route atomic.Pointer[routes] // of maps' map and ml's view, built on use
	ids   sessions
	// deadlines bounds the operations whose ctx has no deadline.
	deadlines sharedDeadlines
	// liveChecks bounds each wait for a commit's reply on a write QP
	// (liveCheckEvery), for operations under a shared deadline.
	liveChecks sharedDeadlines

	mu      sync.Mutex
	closed  bool
	servers map[poolKey]*serverPool

	// The location cache, keyed by cacheKey. Neither its keys nor its
	// values hold a pointer, so the garbage collector, which a client
	// reading many values keeps busy, never scans it.
	cacheMu   sync.Mutex
	cache     map[uint64]cachedLoc
	cacheSeed maphash.Seed

	reads   atomic.Uint64 // RDMA_READs posted
	retries retryCounters // retried attempts by operation (Retries)
}

// Reads is the number of one-sided RDMA_READs the client has posted: GETs
// cost two on a location-cache miss and one on a hit (and one more to
// confirm a miss).
func (c *Client) Reads() uint64 { return c.reads.Load() }

// cachedLoc is where a key's record was last found: in the server whose
// name hashes to node (serverConn.node), at its generation gen. The zero
// cachedLoc stands for none: no record is empty.
type cachedLoc struct {
	node uint64
	gen  uint64
	loc  proto.Location
}

const maxCache = 1 << 16

// New joins the cluster (or, with Config.Endpoints, asks a server for its
// view) and waits (bounded by ctx) until it holds the cluster map.
func New(ctx context.Context, cfg Config) (_ *Client, err error) {
	switch {
	case len(cfg.Seeds) == 0 && len(cfg.Endpoints) == 0:
		return nil, errors.New("rkv: Config.Seeds (gossip addresses) or Config.Endpoints (control addresses) is required")
	case len(cfg.Seeds) > 0 && len(cfg.Endpoints) > 0:
		return nil, errors.New("rkv: Config.Seeds joins gossip and Config.Endpoints asks servers instead: give one")
	}
	if cfg.Device == nil {
		return nil, errors.New("rkv: Config.Device is required (rdma.Open)")
	}
	if cfg.RetryAttempts <= 0 {
		cfg.RetryAttempts = 32
	}
	if cfg.RetryTimeout <= 0 {
		cfg.RetryTimeout = 2 * time.Second
	}
	if cfg.MoveWait <= 0 {
		cfg.MoveWait = 10 * time.Second
	}
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = 2 << 20
	}
	if cfg.ConnsPerServer <= 0 {
		cfg.ConnsPerServer = 4
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 250 * time.Millisecond
	}
	if cfg.RetryCount <= 0 {
		cfg.RetryCount = 1
	}
	if cfg.ViewRefresh <= 0 {
		cfg.ViewRefresh = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Name == "" {
		cfg.Name = defaultName()
	}
	c := &Client{name: cfg.Name, cfg: cfg, log: cfg.Logger, dev: cfg.Device, servers: map[poolKey]*serverPool{}, cache: map[uint64]cachedLoc{}, cacheSeed: maphash.MakeSeed(),
		deadlines: sharedDeadlines{timeout: cfg.RetryTimeout}, liveChecks: sharedDeadlines{timeout: liveCheckEvery}}
	c.maps.init()
	if ml, ok := c.dev.(rdma.Multilink); ok {
		c.lanes = ml.Links()
	}
	if c.pd, err = c.dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("rkv: %w", err)
	}
	if len(cfg.Endpoints) > 0 {
		c.pv = newPolledView(cfg.Endpoints, cfg.ViewRefresh)
	} else {
		mc := cfg.Membership
		mc.Name, mc.Role, mc.Seeds, mc.SecretKey = cfg.Name, proto.RoleClient, cfg.Seeds, cfg.SecretKey
		mc.Meta = proto.NodeMeta{}
		if mc.Logger == nil {
			mc.Logger = cfg.Logger
		}
		if c.ml, err = membership.Create(mc); err != nil {
			_ = c.pd.Close()
			return nil, fmt.Errorf("rkv: joining the cluster: %w", err)
		}
	}
	for {
		if m := c.maps.load(); m.Bootstrapped() {
			return c, nil
		}
		err := c.refreshMap(ctx, 1)
		switch {
		case err == nil:
			continue
		case errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrNotControlPort):
			_ = c.Close()
			return nil, err // no retry can fix it
		}
		select {
		case <-ctx.Done():
			_ = c.Close()
			return nil, fmt.Errorf("rkv: no cluster map from any server yet (%v): %w", err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
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
	if c.ml != nil {
		if err := c.ml.Leave(time.Second); err != nil && !errors.Is(err, membership.ErrClosed) {
			c.log.Debug("leaving the cluster", "err", err)
		}
		errs = append(errs, c.ml.Shutdown())
	}
	if c.pv != nil {
		errs = append(errs, c.pv.close())
	}
	errs = append(errs, c.pd.Close())
	return errors.Join(errs...)
}

// Membership is the client's gossip membership, or nil for a client made
// with Config.Endpoints, which does not join gossip: View is the view
// either way.
func (c *Client) Membership() *membership.Membership { return c.ml }

// View is the client's view of the servers: its gossip view, or with
// Config.Endpoints the last one a server answered with (a read of it
// counts as use, for Config.ViewRefresh).
func (c *Client) View() *membership.View {
	c.touchView()
	return c.view()
}

// Name is the client's name in gossip and in its Hellos.
func (c *Client) Name() string { return c.name }

// defaultName is a client's name when Config.Name is empty, as
// membership makes it for a gossip client.
func defaultName() string {
	host, _ := os.Hostname()
	var r [4]byte
	_, _ = rand.Read(r[:])
	return "client-" + host + "-" + hex.EncodeToString(r[:])
}

// Map is the cluster map the client holds now.
func (c *Client) Map() *clustermap.Map { return c.maps.load() }

// Owner returns the name of the server that holds key in the client's
// map.
func (c *Client) Owner(key []byte) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	name, _ := c.maps.load().Owner(proto.ShardOf(key))
	if name == "" {
		return "", &UnavailableError{Node: "(none)", Reason: "the cluster map is not bootstrapped"}
	}
	return name, nil
}

// Limits returns the largest key and value the server that owns key takes,
// as it advertises them (zero when it does not, or is not in the view): a
// writer with a value to read checks it before reading it all.
func (c *Client) Limits(key []byte) (proto.RecordLimits, error) {
	name, err := c.Owner(key)
	if err != nil {
		return proto.RecordLimits{}, err
	}
	mb, ok := c.view().Member(name)
	if !ok {
		return proto.RecordLimits{}, nil
	}
	return mb.Meta.Limits, nil
}

func checkKey(key []byte) error {
	switch {
	case len(key) == 0:
		return fmt.Errorf("%w: empty key: a key is 1 byte or more", ErrInvalid)
	case len(key) > proto.MaxKeyLen:
		return fmt.Errorf("%w: key too long: %d bytes, at most %d", ErrTooLarge, len(key), proto.MaxKeyLen)
	}
	return nil
}

// cacheKey is key's entry in the location cache: a hash, so that two keys
// may share an entry. That costs only a READ: a record read at a cached
// location is verified to be key's (proto.VerifyRecord) before it is used,
// and one that is not drops the entry.
func (c *Client) cacheKey(key []byte) uint64 { return maphash.Bytes(c.cacheSeed, key) }

// cacheGet is key's entry: the zero cachedLoc if it has none.
func (c *Client) cacheGet(key []byte) cachedLoc {
	h := c.cacheKey(key)
	c.cacheMu.Lock()
	l := c.cache[h]
	c.cacheMu.Unlock()
	return l
}

// cacheGetAll sets dst (grown and reused) to the entries of keys, as
// cacheGet would, under one lock.
func (c *Client) cacheGetAll(keys [][]byte, dst []cachedLoc) []cachedLoc {
	dst = slices.Grow(dst[:0], len(keys))[:len(keys)]
	hashes := make([]uint64, 0, 32) // on the stack for up to 32 keys
	for _, k := range keys {
		hashes = append(hashes, c.cacheKey(k))
	}
	c.cacheMu.Lock()
	for i, h := range hashes {
		dst[i] = c.cache[h]
	}
	c.cacheMu.Unlock()
	return dst
}

func (c *Client) cachePut(key []byte, l cachedLoc) {
	h := c.cacheKey(key)
	c.cacheMu.Lock()
	defer c.cacheMu.Unlock()
	if _, ok := c.cache[h]; !ok && len(c.cache) >= maxCache {
		clear(c.cache)
	}
	c.cache[h] = l
}

func (c *Client) cacheDrop(key []byte) {
	h := c.cacheKey(key)
	c.cacheMu.Lock()
	delete(c.cache, h)
	c.cacheMu.Unlock()
}

// Get returns key's value, read one-sidedly from its server's memory,
// in a new slice. The value is copied out of the connection's registered
// buffer into that slice: for large values, read often, GetAppend into a
// buffer the caller reuses saves the allocation and the copy into memory
// not in cache, which at 64 KiB made a warm GET take about 1.5 times as
// long (docs/ARCHITECTURE.md). It takes WithTimeout.
func (c *Client) Get(ctx context.Context, key []byte, opts ...OpOption) ([]byte, error) {
	v, err := c.GetAppend(ctx, nil, key, opts...)
	if err == nil && v == nil {
		v = []byte{} // an empty value: found, unlike nil
	}
	return v, err
}

// GetAppend appends key's value to dst and returns the extended slice,
// as Get reads it: a caller that passes a buffer with room for the value
// reads a warm key without an allocation. dst is returned unchanged with
// the error when the key is absent (ErrNotFound) or the read fails. It
// takes WithTimeout.
func (c *Client) GetAppend(ctx context.Context, dst, key []byte, opts ...OpOption) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return dst, err
	}
	ctx, cancel, err := callContext(ctx, "Get", opts)
	if err != nil {
		return dst, err
	}
	defer cancel()
	out := dst
	err = c.doKey(ctx, "GET", key, func(ctx context.Context, sc *serverConn, t *target) error {
		if err := checkLimits(sc.name, t.member.Meta.Limits, key, nil); err != nil {
			return err
		}
		v, found, err := sc.get(ctx, t, dst, key)
		if err == nil && !found {
			err = ErrNotFound
		}
		out = v
		return err
	})
	if err != nil {
		return dst, err
	}
	return out, nil
}

// MultiGet returns the values of keys, in order, with nil for a key that
// does not exist (an empty value is a non-nil empty slice). Keys on one
// server are read together: one post of index READs, then one of record
// READs, so a batch costs about two round trips per server instead of two
// per key; the servers are read in parallel. The values are the caller's
// (appending to one never touches another), but small ones (records up to
// 4 KiB) read from one server at once share an allocation: keeping one
// keeps the others' bytes in memory too. It takes WithTimeout.
func (c *Client) MultiGet(ctx context.Context, keys [][]byte, opts ...OpOption) ([][]byte, error) {
	for i, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
	}
	ctx, cancel, err := callContext(ctx, "MultiGet", opts)
	if err != nil {
		return nil, err
	}
	defer cancel()
	return c.multiGet(ctx, keys)
}

func (c *Client) multiGet(ctx context.Context, keys [][]byte) ([][]byte, error) {
	vals := make([][]byte, len(keys))
	pending := make([]int, len(keys))
	for i := range pending {
		pending[i] = i
	}
	err := c.do(ctx, "GET", func(ctx context.Context) error {
		groups, err := c.groupByOwner(keys, pending)
		if err != nil {
			return err
		}
		results := make([]error, len(groups))
		left := make([][]int, len(groups)) // the keys of a group still to read
		readGroup := func(gi int) {
			g := groups[gi]
			sub := make([][]byte, len(g.idx))
			for j, i := range g.idx {
				sub[j] = keys[i]
			}
			left[gi] = g.idx
			results[gi] = c.withConn(ctx, g.t.name, func(sc *serverConn) error {
				got, done, err := sc.read(ctx, g.t, sub)
				if got == nil {
					return err
				}
				left[gi] = nil
				for j, i := range g.idx {
					if done == nil || done[j] {
						vals[i] = got[j]
					} else {
						left[gi] = append(left[gi], i)
					}
				}
				return err
			})
		}
		inParallel(len(groups), readGroup)
		var again []int
		var first error
		for gi, err := range results {
			var r *retryable
			switch {
			case err == nil:
			case errors.As(err, &r):
				again = append(again, left[gi]...)
				if first == nil {
					first = err
				}
			default:
				return err
			}
		}
		pending = again
		return first
	})
	if err != nil {
		return nil, err
	}
	return vals, nil
}

// inParallel runs f(0) .. f(n-1) at once and returns when all have
// returned. The last runs on the calling goroutine: a batch for one server,
// the usual case, starts no goroutine (whose stack would grow anew down the
// whole put or read path each time).
func inParallel(n int, f func(i int)) {
	switch n {
	case 0:
		return
	case 1:
		f(0) // before the WaitGroup, which the goroutines' closures put on the heap
		return
	}
	var wg sync.WaitGroup
	for i := range n - 1 {
		wg.Go(func() { f(i) })
	}
	f(n - 1)
	wg.Wait()
}

// Put stores value under key: an RDMA_WRITE into a lease and a commit.
// It returns once the server acknowledged the write (durable under the
// server's sync policy). A commit retried after a lost reply is applied
// once. It takes WithTimeout.
func (c *Client) Put(ctx context.Context, key, value []byte, opts ...OpOption) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ctx, cancel, err := callContext(ctx, "Put", opts)
	if err != nil {
		return err
	}
	defer cancel()
	w := c.ids.next(proto.ShardOf(key))
	defer c.ids.done(w)
	return c.doKey(ctx, "PUT", key, func(ctx context.Context, sc *serverConn, t *target) error {
		return sc.put(ctx, t, key, value, w.Write)
	})
}

// Delete removes key. Deleting an absent key is not an error. It takes
// WithTimeout.
func (c *Client) Delete(ctx context.Context, key []byte, opts ...OpOption) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ctx, cancel, err := callContext(ctx, "Delete", opts)
	if err != nil {
		return err
	}
	defer cancel()
	c.cacheDrop(key)
	w := c.ids.next(proto.ShardOf(key))
	defer c.ids.done(w)
	return c.doKey(ctx, "DELETE", key, func(ctx context.Context, sc *serverConn, t *target) error {
		if err := checkLimits(sc.name, t.member.Meta.Limits, key, nil); err != nil {
			return err
		}
		_, err := sc.call(ctx, t.member, &proto.Delete{Key: key, Epoch: t.epoch, Write: w.Write})
		return err
	})
}

// Scan returns the keys in [start, end) (end nil: no upper bound) with
// their values, in key order, from every server. It takes WithLimit,
// WithKeysOnly, WithPrefix (start is a prefix, end nil) and WithTimeout.
// It fails with ErrUnavailable while a server that owns shards is down
// (its keys would be missing).
func (c *Client) Scan(ctx context.Context, start, end []byte, opts ...OpOption) ([]KV, error) {
	o, err := applyOptions("Scan", true, opts)
	if err != nil {
		return nil, err
	}
	if o.prefix {
		if end != nil {
			return nil, fmt.Errorf("%w: Scan: WithPrefix takes no end (got %q)", ErrInvalid, end)
		}
		end = PrefixEnd(start)
	}
	ctx, cancel := o.context(ctx)
	defer cancel()
	var keys [][]byte
	err = c.do(ctx, "SCAN", func(ctx context.Context) error {
		var err error
		keys, err = c.scanKeys(ctx, start, end, o.limit)
		return err
	})
	if err != nil {
		return nil, err
	}
	if o.keysOnly {
		out := make([]KV, len(keys))
		for i, k := range keys {
			out[i] = KV{Key: k}
		}
		return out, nil
	}
	vals, err := c.multiGet(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make([]KV, 0, len(keys))
	for i, k := range keys {
		if vals[i] != nil { // deleted since the listing otherwise
			out = append(out, KV{Key: k, Value: vals[i]})
		}
	}
	return out, nil
}

// scanKeys lists the keys of a scan from every owner of shards in the
// map, each asked for the shards the map gives it.
func (c *Client) scanKeys(ctx context.Context, start, end []byte, limit int) ([][]byte, error) {
	r := c.routes()
	byOwner := map[*target][]proto.Shard{}
	for s, t := range r.byShard {
		byOwner[t] = append(byOwner[t], proto.Shard(s))
	}
	var all [][]byte
	for t, shards := range byOwner {
		if err := c.use(t); err != nil {
			return nil, err
		}
		name := t.name
		from := start
		if from == nil {
			from = []byte{}
		}
		for {
			var reply *proto.ScanReply
			err := c.withConn(ctx, name, func(sc *serverConn) error {
				r, err := sc.call(ctx, t.member, &proto.Scan{Start: from, End: end, Limit: uint32(min(limit, 1<<32-1)), Epoch: t.epoch, Shards: shards})
				if err == nil {
					reply = r.(*proto.ScanReply)
				}
				return err
			})
			if err != nil {
				return nil, err
			}
			n := 0
			for _, e := range reply.Entries {
				all = append(all, e.Key)
				n++
			}
			if !reply.More || len(reply.Entries) == 0 || (limit > 0 && n >= limit) {
				break
			}
			from = append(slices.Clone(reply.Entries[len(reply.Entries)-1].Key), 0)
		}
	}
	slices.SortFunc(all, bytes.Compare)
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// ServerStats is a server's counters, as Stats returns them.
type ServerStats struct {
	Generation   uint64
	Keys         uint64
	Commits      uint64
	Deletes      uint64
	LeasesActive uint64
	Connections  uint64
	Handled      uint64 // control requests handled, all types
	MapEpoch     uint64 // the epoch of the map the server holds
	ShardsOwned  uint64
	// Migration into the server: shards being copied in now, shards
	// moved in since it started, and what their copies took.
	ShardsIncoming uint64
	ShardsMovedIn  uint64
	CopiedKeys     uint64
	CopiedBytes    uint64
	CopyTime       time.Duration
	// Space: bytes of current records, of dead ones (the cleaner's work)
	// and free, of the arenas' capacity; what the cleaner did.
	LiveBytes, DeadBytes, FreeBytes, CapacityBytes uint64
	SegmentsCleaned, CleanerMovedBytes             uint64
	// Requests counts the control requests the server handled, by type
	// name (those it handled at least once).
	Requests map[string]uint64
	// NotReady is why the server does not serve yet; "" once it does.
	NotReady string
	// IndexSlots is the size of its hash index (it grows while serving).
	IndexSlots uint64
	// Copying is the moves copying shards into the server now (it is
	// catching up on Copying.Shards shards), zero when none runs.
	Copying proto.CopyProgress
}

// Stats asks the named server for its counters over the control RPC.
func (c *Client) Stats(ctx context.Context, node string) (ServerStats, error) {
	var st ServerStats
	err := c.doNode(ctx, node, func(ctx context.Context, sc *serverConn, mb *membership.Member) error {
		r, err := sc.call(ctx, mb, &proto.Stats{})
		if err != nil {
			return err
		}
		sr := r.(*proto.StatsReply)
		st = ServerStats{Generation: sr.Generation, Keys: sr.Keys, Commits: sr.Commits, Deletes: sr.Deletes,
			LeasesActive: sr.LeasesActive, Connections: sr.Connections, Handled: sr.Handled, MapEpoch: sr.MapEpoch,
			ShardsOwned: sr.ShardsOwned, ShardsIncoming: sr.ShardsIncoming, ShardsMovedIn: sr.ShardsMovedIn,
			CopiedKeys: sr.CopiedKeys, CopiedBytes: sr.CopiedBytes, CopyTime: sr.CopyTime, Requests: map[string]uint64{},
			LiveBytes: sr.LiveBytes, DeadBytes: sr.DeadBytes, FreeBytes: sr.FreeBytes, CapacityBytes: sr.CapacityBytes,
			SegmentsCleaned: sr.SegmentsCleaned, CleanerMovedBytes: sr.CleanerMovedBytes,
			NotReady: sr.NotReady, IndexSlots: sr.IndexSlots, Copying: sr.Copying}
		for t, n := range sr.Requests {
			if n > 0 {
				st.Requests[proto.MsgType(t).String()] = n
			}
		}
		return nil
	})
	return st, err
}

// Forget removes a server from the cluster map: a live one is drained
// first (its shards move to the others, then the leader removes it); with
// force a dead one is removed at once, its shards given to the others
// empty (with one copy of each key, its keys are lost). It returns once the
// change is in the map, before a drain ends; the returned epoch is the
// map's after it.
func (c *Client) Forget(ctx context.Context, node string, force bool) (uint64, error) {
	return c.changeMap(ctx, &proto.Forget{Node: node, Force: force})
}

// changeMap sends req, a request answered by MapChangeReply, to any
// server, and fetches the map of the epoch the reply names.
func (c *Client) changeMap(ctx context.Context, req proto.Message) (uint64, error) {
	var epoch uint64
	err := c.doAny(ctx, func(ctx context.Context, sc *serverConn, mb *membership.Member) error {
		r, err := sc.call(ctx, mb, req)
		if err != nil {
			return err
		}
		epoch = r.(*proto.MapChangeReply).Epoch
		return nil
	})
	if err == nil {
		_ = c.refreshMap(ctx, epoch)
	}
	return epoch, err
}

// SetReplicas asks the cluster to keep n copies of each shard, 1 to
// proto.MaxShardOwners (16): the map's leader then adds a replica to each
// shard with fewer, up to the number of active servers, copying it from
// the primary while reads and writes go on. It returns once the count is
// in the map, before the copies are made (Map().Replication() shows their
// progress); the returned epoch is the map's after it. An n out of range
// fails with ErrInvalid before anything is sent; a server's refusal comes
// back as its error (ErrInvalid for a change the map refused,
// ErrUnavailable when no map leader answered in time).
func (c *Client) SetReplicas(ctx context.Context, n int) (uint64, error) {
	if n < 1 || n > proto.MaxShardOwners {
		return 0, fmt.Errorf("%w: SetReplicas(%d): the replica count is 1 to %d", ErrInvalid, n, proto.MaxShardOwners)
	}
	return c.changeMap(ctx, &proto.SetReplicas{Replicas: n})
}

// PrefixEnd returns the smallest key greater than every key with prefix,
// or nil if there is none (the prefix is all 0xff): Scan(prefix,
// PrefixEnd(prefix), n) lists the keys with that prefix.
func PrefixEnd(prefix []byte) []byte { return proto.PrefixEnd(prefix) }
