// Package server wires one rkv server: an RDMA device, the store on it, the
// membership that advertises the store's regions, and the control RPC
// listener (proto/control.go).
//
// The server's code is on the control path only. A client connects to the
// control address, the two sides connect a QP pair over that connection
// (rdma.ConnectQP), and from then on the client READs the hash index and
// records and WRITEs records into its leases one-sidedly; the connection
// carries only Hello, GrantLease, Commit, Delete, Scan, EndLease and Stats.
// A GET never reaches this package: Stats.Handled proves it in the tests.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft" // the default provider
	"github.com/rkv-io/rkv/store"
)

// Config configures a server. Zero fields take the defaults documented on
// each.
type Config struct {
	// Name is the server's cluster name. Required, and it must stay the
	// same across restarts: placement hashes it.
	Name string
	// ControlAddr is where the control RPC listens. Default
	// "127.0.0.1:0".
	ControlAddr string
	// Provider and Device select the RDMA device (rdma.Open). Defaults
	// "soft" and "" (the provider's first device).
	Provider, Device string
	// DataAddr is the soft provider's data endpoint (rdma.Options.
	// ListenAddr). Default "127.0.0.1:0".
	DataAddr string
	// RDMA holds the remaining device options (verbs Port, GID);
	// ListenAddr is taken from DataAddr.
	RDMA rdma.Options
	// Store configures the store; Store.Dir is required. Store.Logger
	// defaults to Logger.
	Store store.Options
	// Membership configures gossip: BindAddr/BindPort, Seeds, SecretKey,
	// Tuning... Its Name, Role and Meta are set by the server; its Logger
	// defaults to Logger.
	Membership membership.Config
	// AuthToken, when set, must be presented by every client in its Hello
	// (compared in constant time). Default: none.
	AuthToken string
	// TLS, when set, makes the control listener speak TLS only, with its
	// Certificates; set ClientCAs and ClientAuth to
	// tls.RequireAndVerifyClientCert to require client certificates
	// (mTLS). The QP handshake runs inside the tunnel; the RDMA data path
	// is not encrypted. Default: plaintext TCP.
	TLS *tls.Config
	// HandshakeTimeout bounds a new connection's QP handshake and Hello.
	// Default 10s.
	HandshakeTimeout time.Duration
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
	if c.Store.Dir == "" {
		return c, errors.New("server: Config.Store.Dir is required")
	}
	if c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil {
		return c, errors.New("server: Config.TLS has no certificate")
	}
	if c.ControlAddr == "" {
		c.ControlAddr = "127.0.0.1:0"
	}
	if c.Provider == "" {
		c.Provider = "soft"
	}
	if c.DataAddr == "" {
		c.DataAddr = "127.0.0.1:0"
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
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
	cfg   Config
	log   *slog.Logger
	dev   rdma.Device
	pd    rdma.PD
	cq    rdma.CQ
	reg   *rdma.Registrar
	st    *store.Store
	ln    net.Listener
	ml    *membership.Membership
	gen   uint64
	meta  proto.NodeMeta // guarded by metaMu
	metaM sync.Mutex

	mu     sync.Mutex
	closed bool
	conns  map[*conn]struct{}
	wg     sync.WaitGroup
	stop   chan struct{}

	handled     [proto.NumMsgTypes]atomic.Uint64
	connections atomic.Int64
}

// New starts a server: it opens the device, the store and the control
// listener, joins the cluster as a server, and advertises the index and
// each arena as its registration completes. ctx bounds the start only.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, conns: map[*conn]struct{}{}, stop: make(chan struct{})}
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				_ = undo[i]()
			}
		}
	}()
	opts := cfg.RDMA
	opts.ListenAddr = cfg.DataAddr
	if s.dev, err = rdma.Open(cfg.Provider, cfg.Device, opts); err != nil {
		return nil, fmt.Errorf("server: opening RDMA device: %w", err)
	}
	undo = append(undo, s.dev.Close)
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	undo = append(undo, s.pd.Close)
	// One CQ for every connection's QP: the server posts nothing, so only
	// flushes of nothing could ever land in it.
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
	if s.st, err = store.Open(ctx, s.pd, s.reg, cfg.Store); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	undo = append(undo, s.st.Close)
	idx, err := s.st.IndexRegion(ctx)
	if err != nil {
		return nil, fmt.Errorf("server: registering the index: %w", err)
	}
	s.gen = idx.Generation
	if s.ln, err = net.Listen("tcp", cfg.ControlAddr); err != nil {
		return nil, fmt.Errorf("server: control listener: %w", err)
	}
	if cfg.TLS != nil {
		s.ln = tls.NewListener(s.ln, cfg.TLS.Clone())
	}
	undo = append(undo, s.ln.Close)
	s.meta = proto.NodeMeta{
		Role:        proto.RoleServer,
		RKVVersion:  "dev",
		ControlAddr: s.ln.Addr().String(),
		Provider:    s.dev.Provider(),
		Endpoint:    endpoint,
		Generation:  s.gen,
		Index:       &proto.IndexRegion{Addr: idx.Addr, RKey: idx.RKey, Geometry: idx.Geometry},
		Arenas:      arenaRegions(s.st.Arenas()),
	}
	mc := cfg.Membership
	mc.Name, mc.Role, mc.Meta = cfg.Name, proto.RoleServer, s.meta
	if s.ml, err = membership.Create(mc); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.log.Info("server started", "control", s.meta.ControlAddr, "data", endpoint.String(), "generation", s.gen,
		"gossip", s.ml.LocalNode().Addr.String())
	s.wg.Add(2)
	go s.advertise()
	go s.acceptLoop()
	return s, nil
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
		out = append(out, proto.ArenaRegion{ID: a.ID, Addr: a.Addr, Length: uint64(a.Length), RKey: a.RKey})
	}
	return proto.SortArenas(out)
}

// advertise republishes the metadata as each arena becomes ready.
func (s *Server) advertise() {
	defer s.wg.Done()
	want := s.st.Options().ArenaCount
	for {
		s.metaM.Lock()
		have := len(s.meta.Arenas)
		s.metaM.Unlock()
		if have >= want {
			return
		}
		select {
		case <-s.stop:
			return
		case <-s.st.Ready():
		}
		s.metaM.Lock()
		s.meta.Arenas = arenaRegions(s.st.Arenas())
		meta := s.meta
		s.metaM.Unlock()
		if err := s.ml.SetMeta(meta); err != nil {
			s.log.Error("advertising arenas", "err", err)
			return
		}
		s.log.Debug("advertised arenas", "count", len(meta.Arenas))
	}
}

// Name is the server's cluster name.
func (s *Server) Name() string { return s.cfg.Name }

// ControlAddr is the control listener's address.
func (s *Server) ControlAddr() string { return s.ln.Addr().String() }

// GossipAddr is the membership address clients and servers use as a seed.
func (s *Server) GossipAddr() string { return s.ml.LocalNode().Addr.String() }

// Generation is the store's generation of this start.
func (s *Server) Generation() uint64 { return s.gen }

// Store is the server's store (for tests and tools: reads through it are
// the control path).
func (s *Server) Store() *store.Store { return s.st }

// Membership is the server's membership.
func (s *Server) Membership() *membership.Membership { return s.ml }

// Meta is the metadata the server advertises now.
func (s *Server) Meta() proto.NodeMeta {
	s.metaM.Lock()
	defer s.metaM.Unlock()
	return s.meta
}

// Stats counts the control requests a server handled.
type Stats struct {
	// Handled[t] is the number of requests of type t handled (answered
	// or failed), proto.MsgHello through proto.MsgStats.
	Handled     [proto.NumMsgTypes]uint64
	Connections int64 // open control connections
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
	st.Connections = s.connections.Load()
	return st
}

// Close stops accepting connections, leaves the cluster, closes the
// connections (ending their leases), then the store, the registrar, the PD
// and the device.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("server: already closed")
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	var errs []error
	errs = append(errs, ignoreClosed(s.ln.Close()))
	if err := s.ml.Leave(s.cfg.LeaveTimeout); err != nil {
		s.log.Warn("leaving the cluster", "err", err)
	}
	errs = append(errs, s.ml.Shutdown())
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close() // the connection's goroutine cleans up
	}
	s.mu.Unlock()
	s.wg.Wait()
	errs = append(errs, s.st.Close(), s.reg.Close(), s.cq.Close(), s.pd.Close(), s.dev.Close())
	s.log.Info("server closed")
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.stop:
			default:
				s.log.Error("control listener failed", "err", err)
			}
			return
		}
		c := &conn{s: s, nc: nc, leases: map[uint64]struct{}{}}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.connections.Add(1)
		go c.serve()
	}
}

// conn is one client's control connection and its QP.
type conn struct {
	s      *Server
	nc     net.Conn
	qp     rdma.QP
	client string
	leases map[uint64]struct{} // granted on this connection, not yet ended
}

func (c *conn) serve() {
	s := c.s
	defer func() {
		for id := range c.leases {
			_ = s.st.EndLease(id) // revokes the write rkey
		}
		c.nc.Close()
		if c.qp != nil {
			_ = c.qp.Close()
		}
		s.connections.Add(-1)
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	log := s.log.With("remote", c.nc.RemoteAddr().String())
	if err := c.handshake(); err != nil {
		log.Warn("control connection refused", "err", err)
		return
	}
	log = log.With("client", c.client)
	var buf []byte
	for {
		id, m, b, err := proto.ReadFrame(c.nc, buf)
		buf = b
		if err != nil {
			if badFrame(err) {
				log.Warn("bad control frame: closing", "err", err)
				c.refuse(err)
			}
			return
		}
		reply := c.handle(m)
		s.handled[m.Type()].Add(1)
		if err := proto.WriteFrame(c.nc, id, reply); err != nil {
			log.Debug("writing reply", "err", err)
			return
		}
	}
}

// handshake takes the Hello, then connects the QP pair.
func (c *conn) handshake() error {
	s := c.s
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	select {
	case <-s.stop:
		return errors.New("server closing")
	default:
	}
	// Hello first: only an authenticated client gets a QP on the PD that
	// holds the arenas.
	id, m, _, err := proto.ReadFrameMax(c.nc, nil, proto.MaxHelloFrame)
	if err != nil {
		var plain tls.RecordHeaderError
		switch {
		case badFrame(err):
			c.refuse(err)
		case errors.As(err, &plain) && plain.Conn != nil:
			// A plaintext peer: tell it in plaintext.
			_ = plain.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			_ = proto.WriteFrame(plain.Conn, 0, &proto.Error{Code: proto.CodeUnauthenticated, Message: "this control port speaks TLS only"})
		}
		return err
	}
	s.handled[m.Type()].Add(1)
	h, ok := m.(*proto.Hello)
	if !ok {
		_ = proto.WriteFrame(c.nc, id, &proto.Error{Code: proto.CodeUnauthenticated, Message: "the first request must be Hello"})
		return fmt.Errorf("first request %v, not Hello", m.Type())
	}
	if tok := s.cfg.AuthToken; tok != "" && !tokenMatches(tok, h.Token) {
		_ = proto.WriteFrame(c.nc, id, &proto.Error{Code: proto.CodeUnauthenticated, Message: "wrong auth token"})
		return fmt.Errorf("client %q: wrong auth token", h.Client)
	}
	c.client = h.Client
	if err := proto.WriteFrame(c.nc, id, &proto.HelloReply{Server: s.cfg.Name, Generation: s.gen}); err != nil {
		return err
	}
	qp, err := s.pd.CreateQP(rdma.QPConfig{SendCQ: s.cq, RecvCQ: s.cq})
	if err != nil {
		return err
	}
	c.qp = qp
	if _, err := rdma.ConnectQP(ctx, c.nc, qp); err != nil {
		return err
	}
	_ = c.nc.SetDeadline(time.Time{})
	return nil
}

// tokenMatches compares a presented token with the server's in time that
// depends on neither: subtle.ConstantTimeCompare alone returns at once on
// a length mismatch, which would tell a prober the token's length.
func tokenMatches(want string, got []byte) bool {
	w, g := sha256.Sum256([]byte(want)), sha256.Sum256(got)
	return subtle.ConstantTimeCompare(w[:], g[:]) == 1
}

// badFrame reports whether a ReadFrame error is the peer's fault: a
// malformed or oversized frame, or one cut off by the peer's close.
func badFrame(err error) bool {
	return errors.Is(err, proto.ErrBadMessage) || errors.Is(err, io.ErrUnexpectedEOF)
}

// refuse tells the peer, before it is disconnected, which of its frames was
// refused and why: an Error with request id 0, since the frame's own id
// could not be trusted. A peer that does not read is not waited for long.
func (c *conn) refuse(err error) {
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_ = proto.WriteFrame(c.nc, 0, &proto.Error{Code: proto.CodeBadRequest, Message: "bad frame: " + err.Error()})
}

func (c *conn) handle(m proto.Message) proto.Message {
	s := c.s
	ctx := context.Background()
	switch m := m.(type) {
	case *proto.GrantLease:
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l, err := s.st.GrantLease(ctx)
		if err != nil {
			return errorReply(err)
		}
		c.leases[l.ID] = struct{}{}
		return &proto.LeaseReply{ID: l.ID, Arena: l.Arena, Addr: l.Addr, Size: uint64(l.Size), RKey: l.RKey,
			TTL: max(time.Until(l.Expires), 0), VersionBase: l.VersionBase, VersionCount: l.VersionCount}
	case *proto.Commit:
		if _, ok := c.leases[m.LeaseID]; !ok {
			return &proto.Error{Code: proto.CodeLeaseInvalid, Message: fmt.Sprintf("lease %d was not granted on this connection", m.LeaseID)}
		}
		if m.Offset > 1<<62 || m.Length > 1<<62 {
			return &proto.Error{Code: proto.CodeLeaseInvalid, Message: fmt.Sprintf("commit of %d bytes at offset %d in lease %d: out of range", m.Length, m.Offset, m.LeaseID)}
		}
		r, err := s.st.Commit(ctx, m.LeaseID, int64(m.Offset), int64(m.Length))
		if err != nil {
			return errorReply(err)
		}
		return &proto.CommitReply{Arena: r.Location.Arena, Offset: r.Location.Offset, Length: r.Location.Length, Version: r.Version}
	case *proto.Delete:
		if err := s.st.Delete(ctx, m.Key); err != nil {
			return errorReply(err)
		}
		return &proto.Ack{}
	case *proto.Scan:
		return c.scan(m)
	case *proto.EndLease:
		if _, ok := c.leases[m.ID]; !ok {
			return &proto.Error{Code: proto.CodeLeaseInvalid, Message: fmt.Sprintf("lease %d was not granted on this connection", m.ID)}
		}
		delete(c.leases, m.ID)
		if err := s.st.EndLease(m.ID); err != nil {
			return errorReply(err)
		}
		return &proto.Ack{}
	case *proto.Stats:
		st := s.st.Stats()
		return &proto.StatsReply{Generation: s.gen, Keys: uint64(max(st.Keys, 0)), Commits: st.Commits, Deletes: st.Deletes,
			LeasesActive: uint64(st.LeasesActive), Connections: uint64(max(s.connections.Load(), 0)), Handled: s.Stats().Total()}
	}
	return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("%v is not a request this server takes", m.Type())}
}

// scanBudget keeps a scan reply under proto.MaxFrame: an entry costs its
// key and at most 30 bytes of framing.
const scanBudget = proto.MaxFrame - 64

func (c *conn) scan(m *proto.Scan) proto.Message {
	limit := int(m.Limit)
	if limit == 0 || limit > proto.MaxScanEntries {
		limit = proto.MaxScanEntries
	}
	entries, err := c.s.st.Scan(m.Start, m.End, limit)
	if err != nil {
		return errorReply(err)
	}
	out := &proto.ScanReply{Entries: make([]proto.ScanEntry, 0, len(entries))}
	size := 0
	for _, e := range entries {
		size += len(e.Key) + 30
		if size > scanBudget {
			out.More = true
			break
		}
		out.Entries = append(out.Entries, proto.ScanEntry{Key: e.Key, Arena: e.Location.Arena, Offset: e.Location.Offset, Length: e.Location.Length, Version: e.Version})
	}
	return out
}

// errorReply maps a store error to a control Error.
func errorReply(err error) *proto.Error {
	code := proto.CodeInternal
	switch {
	case errors.Is(err, store.ErrNotFound):
		code = proto.CodeNotFound
	case errors.Is(err, store.ErrLease):
		code = proto.CodeLeaseInvalid
	case errors.Is(err, store.ErrRecord):
		code = proto.CodeRecordInvalid
	case errors.Is(err, store.ErrFull):
		code = proto.CodeFull
	case errors.Is(err, store.ErrIndexFull):
		code = proto.CodeIndexFull
	}
	return &proto.Error{Code: code, Message: err.Error()}
}
