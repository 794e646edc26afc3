// Package server wires one rkv server: an RDMA device, the store on it, the
// cluster map's Raft replica, the membership that advertises the store's
// regions, and the control RPC listener (proto/control.go).
//
// The server's code is on the control path only. A client connects to the
// control address, the two sides connect a QP pair over that connection
// (rdma.ConnectQP), and from then on the client READs the hash index and
// records and WRITEs records into its leases one-sidedly; the connection
// carries only leases, commits, deletes, scans, the map and stats. A GET
// never reaches this package: Stats.Handled proves it in the tests.
//
// The server serves the shards the cluster map gives it, and only those:
// the store refuses writes to any other shard (fencing), and the server
// publishes the epoch since which it owns each shard in its index region,
// so a one-sided reader can tell a miss from a server that does not own
// the key. Moving a shard is a copy the new owner pulls with RDMA_READ from
// the old owner's arenas, then a brief freeze of writes for the last
// changes, then the map's flip (migrate.go).
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/clustermap/replica"
	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

// Config configures a server. Zero fields take the defaults documented on
// each.
type Config struct {
	// Name is the server's cluster name. Required, and it must stay the
	// same across restarts: the cluster map knows the server by it (and
	// by its data directory's ID, recorded in Store.Dir).
	Name string
	// Device is the RDMA device to serve on. Required; the server does
	// not close it.
	Device rdma.Device
	// ControlAddr is where the control RPC listens. Default
	// "127.0.0.1:0". Raft's traffic runs over it too. A listener on every
	// interface (0.0.0.0 or [::]) is advertised to clients and servers
	// with the host of Membership.AdvertiseAddr, else of
	// Membership.BindAddr (default 127.0.0.1); New refuses it when those
	// are unspecified too: a client needs one address it can reach.
	ControlAddr string
	// Store configures the store; Store.Dir is required. Store.Logger
	// defaults to Logger. The cluster map's Raft state lives in
	// Store.Dir/raft.
	Store store.Options
	// Membership configures gossip: BindAddr/BindPort, Seeds, SecretKey,
	// Tuning... Its Name, Role and Meta are set by the server; its Logger
	// defaults to Logger.
	Membership membership.Config
	// Bootstrap starts a new cluster of this server alone when its data
	// directory holds no cluster state; it is ignored on a restart.
	// Without it, a server with no state joins the cluster its
	// Membership.Seeds belong to and waits for the map's leader to add it.
	Bootstrap bool
	// Replicas, with Bootstrap, is how many copies of each shard the new
	// cluster keeps (the map's replica count, on distinct servers as
	// there are servers): the bootstrapping leader sets it in the new map.
	// The map is the authority after that: on a restart or a join it is
	// ignored (logged at INFO when it differs from the map's), and
	// `rkv-client replicas N` (proto.SetReplicas) changes it. Default 0:
	// one copy.
	Replicas int
	// Zone is the server's failure domain, a label such as a rack or an
	// availability zone (proto.CheckZone: printable, no spaces, at most
	// proto.MaxZoneLen bytes): it gossips it, the map's leader puts it in
	// the map, and the planner spreads a shard's replicas over distinct
	// zones first. A restart with another zone changes it in the map.
	// Default "": none.
	Zone string
	// Voters is how many servers vote in the map's Raft group: the
	// leader keeps the largest odd number of voters up to Voters among the
	// map's servers (so 1 with one or two servers, 3 from three on); the
	// others receive the log without voting. Default 3.
	Voters int
	// Raft tunes the map's Raft timing.
	Raft replica.Tuning
	// MaxMoves bounds the shard moves in progress at once. Default 32.
	MaxMoves int
	// MoveTimeout: a move whose source or target has been out of the
	// gossip view (dead or left) this long is aborted. Default 30s.
	MoveTimeout time.Duration
	// BackupTimeout: a backup out of the gossip view this long is dropped
	// from its shards' owners, so that their writes, which wait for every
	// backup, go on without it; the planner adds a replica elsewhere, or
	// on it again once it is back. Gossip declared it dead already, after
	// its suspicion time; this is the grace for a restart. Default 1s.
	BackupTimeout time.Duration
	// ForwardOnQP sends a primary's forwards to its backups on RDMA: a
	// SEND on a session's write QP, answered by one, instead of a control
	// request over TCP. Measured no faster on the soft provider (its SEND
	// takes more goroutine hand-offs than a TCP round trip) nor on rxe
	// under emulation, so it is off by default; it is for RDMA hardware,
	// where a SEND's round trip skips the kernel. Default false.
	ForwardOnQP bool
	// FailoverTimeout: a primary out of the gossip view this long loses
	// its shards to their first live backup (a failover), at a new map
	// epoch; until then, their writes and reads wait. Gossip declared it
	// dead already, after its suspicion time; this is the grace for a
	// restart, which would otherwise cost every shard a copy. Default 1s.
	FailoverTimeout time.Duration
	// ReadLease is the length of the read lease the map's leader grants
	// each server, renewed every quarter of it: a client trusts a
	// one-sided read of a server only within its lease, and the leader
	// fails a server's shards over only once its lease has ended (unless
	// its process is known gone), so a primary that is paused or cut off
	// costs its shards' reads and writes at least this long. The same on
	// every server. Default 4s.
	ReadLease time.Duration
	// MaxClockDrift bounds how much the servers' and clients' clocks may
	// run apart over a read lease: the leader waits this much longer than
	// the lease before it fails a server over. Default 500ms.
	MaxClockDrift time.Duration
	// DeadServerTimeout, when positive, removes a server that has been
	// dead this long from the map, its shards given to the others empty:
	// with one copy of each key, its keys are lost. Default 0: servers
	// leave the map only by `rkv-client forget`.
	DeadServerTimeout time.Duration
	// AuthToken, when set, must be presented by every client in its Hello
	// (compared in constant time), and by every other server too unless
	// PeerToken is set. Default: none.
	AuthToken string
	// PeerToken, when set, is the servers' own credential: a peer or Raft
	// session (migration, fences, releases, map changes, the map's Raft
	// traffic) must present it instead of AuthToken, so a client's token
	// or certificate no longer opens one, and this server presents it when
	// it dials the others. Every server of the cluster needs the same one.
	// Default: none, and those sessions take AuthToken as clients do.
	PeerToken string
	// TLS, when set, makes the control listener speak TLS only, with its
	// Certificates; set ClientCAs and ClientAuth to
	// tls.RequireAndVerifyClientCert to require client certificates
	// (mTLS). The QP handshake runs inside the tunnel; the RDMA data path
	// is not encrypted. Default: plaintext TCP.
	TLS *tls.Config
	// PeerTLS is the TLS configuration of the connections this server
	// opens to other servers (Raft, map changes, migration): RootCAs
	// verify them, Certificates is this server's for their mTLS.
	// Required with TLS.
	PeerTLS *tls.Config
	// HandshakeTimeout bounds a new connection's QP handshake and Hello.
	// Default 10s.
	HandshakeTimeout time.Duration
	// FrameTimeout bounds the arrival of a request frame once its first
	// byte has: a connection may idle between requests as long as it
	// likes, but one that sends a frame slowly (a byte at a time, holding
	// its buffer and goroutine) is closed. Default 10s.
	FrameTimeout time.Duration
	// MaxConns bounds the control connections open at once, and
	// MaxConnsPerHost those from one remote IP address: a connection over
	// either is answered with an Error (CodeUnavailable) and closed, so a
	// single misbehaving host cannot take every file descriptor. A
	// client holds Config.ConnsPerServer (4) per server, and a peer server
	// a few. Defaults 8192 and 1024.
	MaxConns, MaxConnsPerHost int
	// LeaveTimeout bounds the announcement of departure at Close.
	// Default 2s.
	LeaveTimeout time.Duration
	// Logger receives the server's logs. Default slog.Default().
	Logger *slog.Logger
	// Registrar configures the registration worker pool (Workers).
	// Default: rdma.RegistrarOptions' defaults.
	Registrar rdma.RegistrarOptions
}

func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		return c, errors.New("server: Config.Name is required")
	}
	if c.Device == nil {
		return c, errors.New("server: Config.Device is required (rdma.Open)")
	}
	if c.Store.Dir == "" {
		return c, errors.New("server: Config.Store.Dir is required")
	}
	if c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil {
		return c, errors.New("server: Config.TLS has no certificate")
	}
	if c.PeerToken != "" && c.PeerToken == c.AuthToken {
		return c, errors.New("server: Config.PeerToken equals AuthToken, which every client holds: give the servers a token of their own")
	}
	if c.TLS != nil && c.PeerTLS == nil {
		return c, errors.New("server: Config.TLS needs Config.PeerTLS, for the connections to other servers")
	}
	if c.Replicas < 0 || c.Replicas > proto.MaxShardOwners {
		return c, fmt.Errorf("server: Config.Replicas %d: must be 0 to %d", c.Replicas, proto.MaxShardOwners)
	}
	if c.Bootstrap && len(c.Membership.Seeds) > 0 {
		return c, errors.New("server: Bootstrap starts a new cluster and Membership.Seeds join an existing one: give one")
	}
	if err := proto.CheckZone(c.Zone); err != nil {
		return c, fmt.Errorf("server: Config.Zone: %w", err)
	}
	if c.ControlAddr == "" {
		c.ControlAddr = "127.0.0.1:0"
	}
	if c.Voters <= 0 {
		c.Voters = 3
	}
	if c.MaxMoves <= 0 {
		c.MaxMoves = 32
	}
	if c.MoveTimeout <= 0 {
		c.MoveTimeout = 30 * time.Second
	}
	if c.BackupTimeout <= 0 {
		c.BackupTimeout = time.Second
	}
	if c.FailoverTimeout <= 0 {
		c.FailoverTimeout = time.Second
	}
	if c.ReadLease <= 0 {
		c.ReadLease = 4 * time.Second
	}
	if c.MaxClockDrift <= 0 {
		c.MaxClockDrift = 500 * time.Millisecond
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.FrameTimeout <= 0 {
		c.FrameTimeout = 10 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 8192
	}
	if c.MaxConnsPerHost <= 0 {
		c.MaxConnsPerHost = 1024
	}
	if c.LeaveTimeout <= 0 {
		c.LeaveTimeout = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = c.Logger.With("server", c.Name)
	if c.Store.Logger == nil {
		c.Store.Logger = c.Logger
	}
	if c.Membership.Logger == nil {
		c.Membership.Logger = c.Logger
	}
	return c, nil
}

// Server is one running rkv server.
type Server struct {
	cfg     Config
	log     *slog.Logger
	id      string // the data directory's server ID
	dev     rdma.Device
	pd      rdma.PD
	cq      rdma.CQ
	reg     *rdma.Registrar
	st      *store.Store
	ln      net.Listener
	ctlAddr string // the advertised control address (ControlAddr)
	ml      *membership.Membership
	node    *replica.Node
	raft    *raftStream
	peers   *peers // control sessions to other servers
	// forwards are the sessions to backups for the forwards: on their
	// write QPs with Config.ForwardOnQP, else as control requests.
	forwards *peers
	gen      uint64

	metaMu sync.Mutex
	meta   proto.NodeMeta // guarded by metaMu

	// shardMu serializes what changes the store's shard states against
	// the map: reconcile, FenceShards, ReleaseShards.
	shardMu sync.Mutex
	// replaceSeen: since when a peer's map has shown this server's name
	// with another data directory's ID (by that ID), while it waits to be
	// swapped for it (replacing).
	replaceSeen sync.Map

	mapCache atomic.Pointer[encodedMap]
	mlReady  atomic.Pointer[membership.Membership] // ml, once made: Raft asks it for addresses from the start
	saved    atomic.Pointer[clustermap.Map]        // the newest map applied to the store (mapFile)
	moves    *mover
	errs     chan error // fatal conditions after the start (Err)

	lease  readLease                    // this server's read lease
	grants leaseGrants                  // the leases this server granted, while it leads
	watch  atomic.Pointer[processWatch] // of every server while this one leads the map, of its leader otherwise

	mu      sync.Mutex
	closed  bool
	conns   map[*conn]struct{}
	perHost map[string]int // open connections by remote IP
	wg      sync.WaitGroup
	stop    chan struct{}

	handled     [proto.NumMsgTypes]atomic.Uint64
	refused     [proto.NumErrorCodes]atomic.Uint64 // requests answered with an Error, by code
	refusals    *refusalLog
	connections atomic.Int64
	commitsOnQP atomic.Uint64
	fwdsOnQP    atomic.Uint64
	// readLeasesRefused counts GetReadLeases answered with no lease.
	readLeasesRefused atomic.Uint64
	batcher           *qpBatcher
	leasePDs          atomic.Int64 // connections' own PDs open (tests)

	// dropReply, set by tests, closes a connection instead of sending the
	// reply to a request it reports true for.
	dropReply atomic.Pointer[func(proto.Message) bool]
	// ackBeforeBackups, set by benchmarks (AckBeforeBackups), has a
	// primary's forwards go in the background, not waited for.
	ackBeforeBackups atomic.Bool
	// commitSlot, set by tests, is the CommitSlot new sessions are
	// offered instead of proto.CommitSlotSize.
	commitSlot atomic.Uint32
	// isolated, set by tests (Isolate), makes GetView report every other
	// server dead, as the gossip of a server cut off from them would.
	isolated atomic.Bool
}

// New starts a server: it opens the store and the control listener, the
// map's Raft replica (bootstrapping a new cluster, restarting from disk,
// or waiting to be added), joins the cluster's gossip as a server, and
// advertises the index and each arena as its registration completes. ctx
// bounds the start only.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, dev: cfg.Device, conns: map[*conn]struct{}{}, perHost: map[string]int{}, stop: make(chan struct{}), errs: make(chan error, 1),
		refusals: newRefusalLog(cfg.Logger, refusalLogEvery)}
	var undo []func() error
	defer func() {
		if err != nil {
			s.refusals.close()
			for i := len(undo) - 1; i >= 0; i-- {
				_ = undo[i]()
			}
		}
	}()
	if s.id, err = loadIdentity(cfg.Store.Dir, cfg.Name); err != nil {
		return nil, err
	}
	if err := s.loadSavedMap(); err != nil {
		return nil, err
	}
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	undo = append(undo, s.pd.Close)
	// One CQ for every connection's QP: the server posts nothing on
	// client connections, so only flushes of nothing could land in it.
	if s.cq, err = s.dev.CreateCQ(1024); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	undo = append(undo, s.cq.Close)
	endpoint, err := s.endpoint()
	if err != nil {
		return nil, err
	}
	s.reg = rdma.NewRegistrar(s.pd, cfg.Registrar)
	undo = append(undo, s.reg.Close)
	if s.ln, err = net.Listen("tcp", cfg.ControlAddr); err != nil {
		return nil, fmt.Errorf("server: control listener: %w", err)
	}
	if cfg.TLS != nil {
		s.ln = tls.NewListener(s.ln, cfg.TLS.Clone())
	}
	undo = append(undo, s.ln.Close)
	controlAddr, err := advertisedControlAddr(s.ln.Addr().String(), cfg.Membership)
	if err != nil {
		return nil, err
	}
	s.ctlAddr = controlAddr
	s.peers = newPeers(s.peerConfig())
	undo = append(undo, func() error { s.peers.close(); return nil })
	s.forwards = newPeers(s.forwardConfig())
	undo = append(undo, func() error { s.forwards.close(); return nil })
	// The map's replica opens while the store does, once the store holds
	// the directory's lock: each opens a Pebble of its own, and a start
	// waited for the two one after the other (about 30 ms each on a warm
	// start, the replica's more while the arenas were faulted in on a
	// cold one).
	s.raft = newRaftStream(raftAddr(s.id, controlAddr), s.peerConfig())
	opened := make(chan error, 1)
	replicaOpening := false
	storeOpts := cfg.Store
	storeOpts.Locked = func() {
		replicaOpening = true
		go func() {
			var err error
			s.node, err = replica.Open(replica.Config{
				Dir:       filepath.Join(cfg.Store.Dir, "raft"),
				ID:        s.id,
				Addr:      raftAddr(s.id, controlAddr),
				Bootstrap: cfg.Bootstrap,
				Stream:    s.raft,
				AddrOf:    s.raftAddrOf,
				Tuning:    cfg.Raft,
				Logger:    s.log,
			})
			opened <- err
		}()
	}
	idx, err := s.openStore(ctx, storeOpts)
	if !replicaOpening {
		s.raft.Close() // the store failed before it held the directory
	} else if rerr := <-opened; rerr == nil {
		undo = append(undo, s.node.Close)
	} else {
		if err == nil {
			_ = s.st.Close()
			err = fmt.Errorf("server: %w", rerr)
		} // else the store's error says more: a bad directory fails both
		s.raft.Close()
	}
	if err != nil {
		return nil, err
	}
	undo = append(undo, s.st.Close)
	s.batcher = newQPBatcher(s, s.st.Options().Sync)
	s.gen = idx.Generation
	m := s.Map()
	if !s.node.HasState() && !cfg.Bootstrap && len(cfg.Membership.Seeds) == 0 {
		return nil, fmt.Errorf("server: %s holds no cluster state and there is nothing to join: start the first server of a new cluster with Bootstrap (--bootstrap), the others with Membership.Seeds (--join)", cfg.Store.Dir)
	}
	s.meta = proto.NodeMeta{
		Role:        proto.RoleServer,
		RKVVersion:  "dev",
		ControlAddr: controlAddr,
		Provider:    s.dev.Provider(),
		Endpoint:    endpoint,
		Generation:  s.gen,
		Index:       &proto.IndexRegion{Addr: idx.Addr, RKey: idx.RKey, Geometry: idx.Geometry},
		Arenas:      arenaRegions(s.st.Arenas()),
		ServerID:    s.id,
		ClusterID:   m.ClusterID(),
		MapEpoch:    m.Epoch(),
		Limits:      proto.RecordLimits{MaxKeyLen: uint32(s.st.Options().MaxKeyLen), MaxValueLen: uint32(s.st.Options().MaxValueLen)},
		Zone:        cfg.Zone,
	}
	// The arenas register while the listener and the replica start. A
	// server none of whose arenas registers has nothing to serve: it
	// fails here with the reason (RLIMIT_MEMLOCK, typically, and how to
	// raise it) instead of joining the cluster and leaving its clients
	// to time out waiting for a lease. One arena is enough to serve; the
	// store logs each that fails.
	if err := s.st.WaitArena(ctx); err != nil {
		return nil, noArenaError(cfg.Store.Dir, err)
	}
	mc := cfg.Membership
	mc.Name, mc.Role, mc.Meta = cfg.Name, proto.RoleServer, s.meta
	if s.ml, err = membership.CreateContext(ctx, mc); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.mlReady.Store(s.ml)
	s.moves = newMover(s)
	s.log.Info("server started", "id", s.id, "control", controlAddr, "data", endpoint.String(), "generation", s.gen,
		"gossip", s.ml.LocalNode().Addr.String(), "map", m.String())
	s.wg.Add(5)
	go s.renewReadLease()
	go s.advertise()
	go s.acceptLoop()
	go s.watchMap()
	go s.lead()
	if cfg.Replicas != 0 && !(cfg.Bootstrap && !s.node.HasState()) {
		// Not a new cluster: the map's count stands (replicas.go).
		s.wg.Add(1)
		go s.noteReplicasIgnored()
	}
	return s, nil
}

// openStore opens the store and registers its index.
func (s *Server) openStore(ctx context.Context, opts store.Options) (store.IndexInfo, error) {
	var err error
	if s.st, err = store.Open(ctx, s.pd, s.reg, opts); err != nil {
		return store.IndexInfo{}, fmt.Errorf("server: %w", err)
	}
	idx, err := s.st.IndexRegion(ctx)
	if err != nil {
		_ = s.st.Close()
		return store.IndexInfo{}, fmt.Errorf("server: registering the index: %w", err)
	}
	return idx, nil
}

// advertisedControlAddr is the control address to advertise for a
// listener on listen: listen itself, unless it listens on every interface,
// whose wildcard no peer can dial; then the gossip address's host, the one
// other nodes already reach this server at.
func advertisedControlAddr(listen string, mc membership.Config) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("server: control listener address %q: %w", listen, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsUnspecified() {
		return listen, nil
	}
	h := mc.AdvertiseAddr
	if h == "" {
		h = mc.BindAddr
	}
	if h == "" {
		h = "127.0.0.1" // membership's default
	}
	if a, err := netip.ParseAddr(h); err != nil || !a.IsUnspecified() {
		return net.JoinHostPort(h, port), nil
	}
	return "", fmt.Errorf("server: the control listener is on every interface (%s) and the gossip address is unspecified too (%q): "+
		"no address to advertise that clients can reach; give ControlAddr or Membership.AdvertiseAddr a specific IP", listen, h)
}

// noArenaError explains a start none of whose arenas registered, from
// store.WaitArena's error: the first arena's failure says why (the others
// fail alike, and the store logs each).
func noArenaError(dir string, err error) error {
	var ae *store.ArenaError
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok || !errors.As(err, &ae) {
		return fmt.Errorf("server: waiting for an arena of %s to register: %w", dir, err)
	}
	return fmt.Errorf("server: none of the %d arenas of %s could be registered, so this server has nothing to serve: %w", len(joined.Unwrap()), dir, ae)
}

// peerConfig is how this server opens sessions to other servers.
func (s *Server) peerConfig() session.Config {
	tok, _ := s.helloToken(proto.SessionPeer)
	return session.Config{Name: s.cfg.Name, Token: []byte(tok), Kind: proto.SessionPeer, TLS: s.cfg.PeerTLS}
}

// forwardConfig is how this server opens sessions to its backups for the
// forwards: with Config.ForwardOnQP, with QPs (in the server's PD, as a
// migration's are), so that a forward is a SEND on the write QP,
// answered by one; else as any other peer session.
func (s *Server) forwardConfig() session.Config {
	cfg := s.peerConfig()
	if !s.cfg.ForwardOnQP {
		return cfg
	}
	cfg.Device, cfg.PD, cfg.QPCalls = s.dev, s.pd, true
	cfg.CQSize = 1 // the read QP's: nothing is posted on it
	cfg.QP = rdma.QPConfig{AckTimeout: 250 * time.Millisecond, RetryCount: 3}
	return cfg
}

// helloToken is the token a session of kind must present ("": none) and
// what it is called in a refusal: sessions between servers take the peer
// token when there is one, so a client's token cannot open them.
func (s *Server) helloToken(kind proto.SessionKind) (token, name string) {
	if kind != proto.SessionClient && s.cfg.PeerToken != "" {
		return s.cfg.PeerToken, "peer token"
	}
	return s.cfg.AuthToken, "auth token"
}

// endpoint reads the device's data endpoint from a throwaway QP's info,
// which works for every provider.
func (s *Server) endpoint() (proto.Endpoint, error) {
	qp, err := s.pd.CreateQP(rdma.QPConfig{SendCQ: s.cq, RecvCQ: s.cq})
	if err != nil {
		return proto.Endpoint{}, fmt.Errorf("server: %w", err)
	}
	info := qp.Info()
	if err := qp.Close(); err != nil {
		return proto.Endpoint{}, fmt.Errorf("server: %w", err)
	}
	return proto.Endpoint{Addr: info.Addr, GID: info.GID, LID: info.LID}, nil
}

func arenaRegions(infos []store.ArenaInfo) []proto.ArenaRegion {
	out := make([]proto.ArenaRegion, 0, len(infos))
	for _, a := range infos {
		out = append(out, proto.ArenaRegion{ID: a.ID, Addr: a.Addr, Length: uint64(a.Length), RKey: a.RKey, Offset: uint64(a.Offset)})
	}
	return proto.SortArenas(out)
}

// drain empties c of what it holds now.
func drain[T any](c <-chan T) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// setMeta changes the advertised metadata and gossips it.
func (s *Server) setMeta(change func(*proto.NodeMeta)) error {
	s.metaMu.Lock()
	change(&s.meta)
	meta := s.meta
	s.metaMu.Unlock()
	return s.ml.SetMeta(meta)
}

// advertise republishes the metadata as arena units become ready, those
// the store adds while serving included, and each time the index grows.
func (s *Server) advertise() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case <-s.st.Ready():
			drain(s.st.Ready()) // units registered together are gossiped once
			if err := s.setMeta(func(m *proto.NodeMeta) { m.Arenas = arenaRegions(s.st.Arenas()) }); err != nil {
				s.log.Error("advertising arenas", "err", err)
				return
			}
		case idx := <-s.st.IndexMoved():
			if err := s.setMeta(func(m *proto.NodeMeta) {
				m.Index = &proto.IndexRegion{Addr: idx.Addr, RKey: idx.RKey, Geometry: idx.Geometry}
			}); err != nil {
				s.log.Error("advertising the grown index", "err", err)
				return
			}
		}
	}
}

// Name is the server's cluster name.
func (s *Server) Name() string { return s.cfg.Name }

// ID is the server's data directory ID.
func (s *Server) ID() string { return s.id }

// ControlAddr is the control address the server advertises: the
// listener's, with a routable host when it listens on every interface.
func (s *Server) ControlAddr() string { return s.ctlAddr }

// GossipAddr is the membership address clients and servers use as a seed.
func (s *Server) GossipAddr() string { return s.ml.LocalNode().Addr.String() }

// Generation is the store's generation of this start.
func (s *Server) Generation() uint64 { return s.gen }

// Store is the server's store (for tests and tools: reads through it are
// the control path).
func (s *Server) Store() *store.Store { return s.st }

// Membership is the server's membership.
func (s *Server) Membership() *membership.Membership { return s.ml }

// MapNode is the server's replica of the map (tests, status).
func (s *Server) MapNode() *replica.Node { return s.node }

// ErrRemoved is what Err delivers once the cluster map marks this server
// removed (a drain that finished, or a forced removal): it has nothing to
// serve any more, and stopping it is the normal end.
var ErrRemoved = errors.New("server: removed from the cluster")

// Err delivers a condition that stops the server from serving after New
// returned: ErrRemoved, or a refusal (this server's name is taken in the
// map by another data directory). The command stops on it; the server is
// not closed.
func (s *Server) Err() <-chan error { return s.errs }

func (s *Server) fatal(err error) {
	select {
	case s.errs <- err:
	default:
	}
}

// Ready returns nil when the server serves: an arena registered, a
// bootstrapped cluster map that holds this server, and not closed or
// removed. Otherwise its error says what the server waits for; it is what
// a readiness probe reports.
func (s *Server) Ready() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errors.New("server: closed")
	}
	if len(s.st.Arenas()) == 0 {
		return errors.New("server: no arena is registered")
	}
	m := s.Map()
	if !m.Bootstrapped() {
		return fmt.Errorf("server: the cluster map is not bootstrapped yet (epoch %d): waiting for a --bootstrap server, or for this one's join to be accepted", m.Epoch())
	}
	srv, ok := m.Server(s.cfg.Name)
	switch {
	case !ok:
		return fmt.Errorf("server: not in the cluster map yet (epoch %d): waiting for its leader to add this server", m.Epoch())
	case srv.State == proto.ServerRemoved:
		return fmt.Errorf("%w (map epoch %d)", ErrRemoved, m.Epoch())
	case srv.ID != s.id:
		return fmt.Errorf("server: the cluster map knows %s by data directory ID %s, not this one's %s", s.cfg.Name, srv.ID, s.id)
	}
	return nil
}

// Meta is the metadata the server advertises now.
func (s *Server) Meta() proto.NodeMeta {
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	return s.meta
}

// Stats counts the control requests a server handled.
type Stats struct {
	// Handled[t] is the number of requests of type t handled (answered
	// or failed).
	Handled [proto.NumMsgTypes]uint64
	// Refused[c] is the number of requests answered with an Error of
	// code c (Hellos refused included).
	Refused     [proto.NumErrorCodes]uint64
	Connections int64 // open control connections
	// CommitsOnQP is how many of the Commits and CommitBatches (in
	// Handled too) came on a session's write QP, a PUT's one round trip,
	// rather than as control requests.
	CommitsOnQP uint64
	// ForwardsOnQP is how many of the ReplicaCommits and ReplicaDeletes
	// (in Handled too) this server, as a backup, took on a primary's
	// session's write QP rather than as control requests.
	ForwardsOnQP uint64
	// QPCommitBatches is how many batches the CommitsOnQP that came
	// together on the links of a provider that hands RECVs over (soft)
	// were committed in: one store.CommitBatch each. CommitsOnQP over it
	// is the commits a batch took.
	QPCommitBatches uint64
	// ReadLeasesRefused is how many GetReadLease requests this server
	// answered with no lease: its map's leader had not renewed it, as
	// when the server is cut off and its shards are about to fail over.
	// Clients then read none of its replicas' keys here.
	ReadLeasesRefused uint64
}

// Total is the number of requests handled, all types.
func (st Stats) Total() uint64 {
	var n uint64
	for _, v := range st.Handled {
		n += v
	}
	return n
}

// DeviceName is the name of the RDMA device the server opened (its
// provider is Meta().Provider).
func (s *Server) DeviceName() string { return s.dev.Name() }

// RegistrarStats returns the counters of the server's memory Registrar
// (arenas, the index and lease regions all register through it).
func (s *Server) RegistrarStats() rdma.RegistrarStats { return s.reg.Stats() }

// Stats returns the handler counters.
func (s *Server) Stats() Stats {
	var st Stats
	for i := range s.handled {
		st.Handled[i] = s.handled[i].Load()
	}
	for i := range s.refused {
		st.Refused[i] = s.refused[i].Load()
	}
	st.Connections = s.connections.Load()
	st.CommitsOnQP = s.commitsOnQP.Load()
	st.ForwardsOnQP = s.fwdsOnQP.Load()
	st.ReadLeasesRefused = s.readLeasesRefused.Load()
	if s.batcher != nil {
		st.QPCommitBatches = s.batcher.batches.Load()
	}
	return st
}

// Close stops accepting connections, leaves gossip, stops the map's
// replica and the migrations in progress, closes the connections (ending
// their leases), then the store, the registrar and the PD. A closed server
// stays in the map: restarting it brings its shards back.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("server: already closed")
	}
	s.closed = true
	s.mu.Unlock()
	s.endReadLease() // before anything closes: a client trusts nothing read here from now on
	close(s.stop)
	var errs []error
	s.moves.stop()
	// The connections, and with them their QPs, end before the listener
	// does: the leader's process watch takes a refused dial for a process
	// that serves no READ any more.
	s.closeConns()
	errs = append(errs, ignoreClosed(s.ln.Close()))
	if err := s.ml.Leave(s.cfg.LeaveTimeout); err != nil {
		s.log.Warn("leaving the cluster", "err", err)
	}
	errs = append(errs, s.ml.Shutdown())
	s.wg.Wait()
	errs = append(errs, s.node.Close())
	s.peers.close()
	s.forwards.close() // before the PD their QPs and slots are in
	s.refusals.close()
	errs = append(errs, s.st.Close(), s.reg.Close(), s.cq.Close(), s.pd.Close())
	s.log.Info("server closed")
	return errors.Join(errs...)
}

// closeConns closes every connection and waits, up to 5 s, for their
// goroutines to have closed their QPs. New ones are closed as they are
// accepted (s.closed).
func (s *Server) closeConns() {
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close() // the connection's goroutine cleans up
	}
	s.mu.Unlock()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return
		}
	}
	s.log.Warn("closing: connections still open after 5s")
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
