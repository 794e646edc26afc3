// Control connections: the handshake (Hello, then a QP), and the requests each kind of session may make.

package server

import (
	"bufio"
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
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

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
		c := &conn{s: s, nc: nc, host: remoteHost(nc), leases: map[uint64]struct{}{}}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		var over string
		switch {
		case len(s.conns) >= s.cfg.MaxConns:
			over = fmt.Sprintf("this server has %d control connections open, its limit", len(s.conns))
		case s.perHost[c.host] >= s.cfg.MaxConnsPerHost:
			over = fmt.Sprintf("%s has %d control connections open to this server, the limit per host", c.host, s.perHost[c.host])
		}
		if over != "" {
			s.wg.Add(1)
			s.mu.Unlock()
			go s.turnAway(nc, over)
			continue
		}
		s.conns[c] = struct{}{}
		s.perHost[c.host]++
		s.wg.Add(1)
		s.mu.Unlock()
		s.connections.Add(1)
		go c.serve()
	}
}

// turnAway tells a connection over a limit why, and closes it. It writes
// from a goroutine of its own, with a short deadline: the peer may not
// read, and a TLS connection writes a handshake first.
func (s *Server) turnAway(nc net.Conn, why string) {
	defer s.wg.Done()
	defer nc.Close()
	s.refused[proto.CodeUnavailable].Add(1)
	s.refusals.note("connection limit", slog.LevelWarn, "control connection refused: over the limit", "remote", nc.RemoteAddr().String(), "reason", why)
	_ = nc.SetDeadline(time.Now().Add(time.Second))
	_ = proto.WriteFrame(nc, 0, &proto.Error{Code: proto.CodeUnavailable, Message: "connection refused: " + why})
}

// remoteHost is the IP address a connection comes from ("" if unknown):
// the unit of MaxConnsPerHost.
func remoteHost(nc net.Conn) string {
	host, _, err := net.SplitHostPort(nc.RemoteAddr().String())
	if err != nil {
		return ""
	}
	return host
}

// conn is one control connection and its QPs: qp, in the server's PD, for
// the client's READs of the arenas and the index; wqp, in the connection's
// own PD, for its WRITEs into its leases.
type conn struct {
	s      *Server
	nc     net.Conn
	qp     rdma.QP
	wqp    rdma.QP
	wcq    rdma.CQ    // wqp's, for the commits sent on it
	lpd    *leasePD   // nil for a session without QPs: it gets no lease
	qpc    *qpCommits // the commits sent on wqp; nil without QPs
	host   string     // remote IP address
	client string
	kind   proto.SessionKind
	// mu guards leases: the commits on the write QP are served on a
	// goroutine of their own.
	mu     sync.Mutex
	leases map[uint64]struct{} // granted on this connection, not yet ended
	// fwd forwards the control request being served to the backups of
	// its key's shard, if it has any (the connection's goroutine serves
	// one at a time).
	fwd forwarder
}

func (c *conn) serve() {
	s := c.s
	handedOff := false
	defer func() {
		if c.qpc != nil {
			c.qpc.close() // before the leases end: it may be committing in one
		}
		for id := range c.leases {
			_ = s.st.EndLease(id) // revokes the write rkey
		}
		if !handedOff {
			c.nc.Close()
		}
		if c.qp != nil {
			_ = c.qp.Close()
		}
		if c.wqp != nil {
			_ = c.wqp.Close()
		}
		if c.wcq != nil {
			_ = c.wcq.Close()
		}
		if c.qpc != nil {
			if err := c.qpc.free(); err != nil {
				s.log.Error("freeing a connection's commit slots", "remote", c.nc.RemoteAddr().String(), "err", err)
			}
		}
		if c.lpd != nil {
			// After the leases ended: it waits for their regions to be
			// deregistered, by EndLease above or by an expiry racing it.
			if err := c.lpd.Close(); err != nil {
				s.log.Error("closing a connection's PD", "remote", c.nc.RemoteAddr().String(), "err", err)
			} else {
				s.leasePDs.Add(-1)
			}
		}
		s.connections.Add(-1)
		s.mu.Lock()
		delete(s.conns, c)
		if s.perHost[c.host]--; s.perHost[c.host] <= 0 {
			delete(s.perHost, c.host)
		}
		s.mu.Unlock()
		s.wg.Done()
	}()
	log := s.log.With("remote", c.nc.RemoteAddr().String())
	if err := c.handshake(); err != nil {
		log.Warn("control connection refused", "err", err)
		return
	}
	if c.kind == proto.SessionRaft {
		// Raft's transport owns the connection from here on.
		handedOff = s.raft.offer(c.nc)
		return
	}
	log = log.With("client", c.client, "kind", c.kind.String())
	if c.qpc != nil {
		ctx, stop := context.WithCancel(context.Background())
		c.qpc.stop = stop
		go c.qpc.serve(ctx)
	}
	var buf []byte
	fr := newFrameReader(c.nc, s.cfg.FrameTimeout)
	for {
		fr.next()
		id, m, b, err := proto.ReadFrame(fr.br, buf)
		buf = b
		if err != nil {
			switch {
			case badFrame(err):
				log.Warn("bad control frame: closing", "err", err)
				c.refuse(err)
			case fr.timedOut(err):
				log.Warn("control frame not received within the frame timeout: closing", "timeout", s.cfg.FrameTimeout, "err", err)
				c.refuse(fmt.Errorf("a frame begun and not finished within %v", s.cfg.FrameTimeout))
			}
			return
		}
		reply := c.handle(m)
		s.handled[m.Type()].Add(1)
		if e, ok := reply.(*proto.Error); ok {
			s.refused[e.Code].Add(1)
			s.logRefusal(m, e)
		}
		if drop := s.dropReply.Load(); drop != nil && (*drop)(m) {
			return // tests: the reply lost, as in a crash of the connection
		}
		if err := proto.WriteFrame(c.nc, id, reply); err != nil {
			log.Debug("writing reply", "err", err)
			return
		}
	}
}

// frameReader reads a connection's frames: waiting for a frame's first
// byte has no deadline (a session may idle), the rest of the frame must
// follow within timeout, so that a peer trickling a frame cannot hold the
// connection's buffer and goroutine for ever. Frames are read through br,
// so that one read takes a small frame's length and body together.
type frameReader struct {
	nc      net.Conn
	timeout time.Duration
	armed   bool
	br      *bufio.Reader // over the frameReader's own Read
}

func newFrameReader(nc net.Conn, timeout time.Duration) *frameReader {
	r := &frameReader{nc: nc, timeout: timeout}
	r.br = bufio.NewReaderSize(r, frameBufferSize)
	return r
}

// frameBufferSize is the read buffer of a control connection: a commit,
// a forward and their replies take a few hundred bytes.
const frameBufferSize = 4 << 10

// next readies the reader for the next frame: without a deadline, unless
// the last read brought the start of it already.
func (r *frameReader) next() {
	if r.br.Buffered() > 0 {
		r.arm()
		return
	}
	r.armed = false
	_ = r.nc.SetReadDeadline(time.Time{})
}

func (r *frameReader) arm() {
	r.armed = true
	_ = r.nc.SetReadDeadline(time.Now().Add(r.timeout))
}

// Read is the connection's, arming the frame's deadline at its first
// bytes.
func (r *frameReader) Read(p []byte) (int, error) {
	n, err := r.nc.Read(p)
	if n > 0 && !r.armed {
		r.arm()
	}
	return n, err
}

// timedOut reports whether err is the frame timeout striking.
func (r *frameReader) timedOut(err error) bool {
	var ne net.Error
	return r.armed && errors.As(err, &ne) && ne.Timeout()
}

// handshake takes the Hello, then connects the two QP pairs (sessions
// without QPs, Raft's among them, have none): first the read QP, in the
// server's PD, then the write QP, in a PD of the connection's own.
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
	// holds the arenas, or a PD of its own.
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
		c.refuseHello(id, &proto.Error{Code: proto.CodeUnauthenticated, Message: "the first request must be Hello"})
		return fmt.Errorf("first request %v, not Hello", m.Type())
	}
	if tok, name := s.helloToken(h.Kind); tok != "" && !tokenMatches(tok, h.Token) {
		msg := "wrong " + name
		if name == "peer token" {
			msg = fmt.Sprintf("wrong peer token: a %s session is for servers, which present their --peer-token (a client's auth token does not open one)", h.Kind)
		}
		c.refuseHello(id, &proto.Error{Code: proto.CodeUnauthenticated, Message: msg})
		return fmt.Errorf("%s session from %q: wrong %s", h.Kind, h.Client, name)
	}
	if h.Target != "" && h.Target != s.id {
		// A peer that means the server this address used to be.
		c.refuseHello(id, &proto.Error{Code: proto.CodeBadRequest,
			Message: fmt.Sprintf("this is server %s with data directory ID %s, not %s", s.cfg.Name, s.id, h.Target)})
		return fmt.Errorf("%s session from %q for server ID %s, not this one", h.Kind, h.Client, h.Target)
	}
	c.client, c.kind = h.Client, h.Kind
	noQP := c.kind == proto.SessionRaft || h.NoQP
	reply := &proto.HelloReply{Server: s.cfg.Name, Generation: s.gen, ServerID: s.id, MapEpoch: s.Map().Epoch()}
	if !noQP {
		reply.CommitSlot = proto.CommitSlotSize
		if n := s.commitSlot.Load(); n != 0 {
			reply.CommitSlot = n // tests
		}
	}
	if err := proto.WriteFrame(c.nc, id, reply); err != nil {
		return err
	}
	if noQP {
		_ = c.nc.SetDeadline(time.Time{})
		return nil
	}
	qp, err := s.pd.CreateQP(rdma.QPConfig{SendCQ: s.cq, RecvCQ: s.cq})
	if err != nil {
		return err
	}
	c.qp = qp
	if _, err := rdma.ConnectQP(ctx, c.nc, qp); err != nil {
		return err
	}
	if c.lpd, err = newLeasePD(s.dev); err != nil {
		return err
	}
	s.leasePDs.Add(1)
	// The server posts nothing on the read QP, so it shares the server's
	// one CQ; the write QP takes commits (qpcommit.go) and has its own.
	if c.wcq, err = s.dev.CreateCQ(2 * (commitRecvs + 1)); err != nil {
		return err
	}
	if c.wqp, err = c.lpd.CreateQP(rdma.QPConfig{SendCQ: c.wcq, RecvCQ: c.wcq}); err != nil {
		return err
	}
	if _, err := rdma.ConnectQP(ctx, c.nc, c.wqp); err != nil {
		return fmt.Errorf("connecting the write QP: %w", err)
	}
	// Posted before the connection's first reply, so every commit the
	// client can send (it needs a lease first) finds a RECV.
	if c.qpc, err = newQPCommits(c, c.wqp, c.wcq); err != nil {
		return err
	}
	_ = c.nc.SetDeadline(time.Time{})
	return nil
}

// refuseHello answers a Hello (or what came instead of one) with e, and
// counts it with the refused requests.
func (c *conn) refuseHello(id uint64, e *proto.Error) {
	c.s.refused[e.Code].Add(1)
	_ = proto.WriteFrame(c.nc, id, e)
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

// handler serves one type of request on a control session.
type handler struct {
	serve func(c *conn, m proto.Message) proto.Message
	// req is the type serve takes, which must be its key in handlers
	// (a test checks: serve's type assertion would panic otherwise).
	req proto.MsgType
	// peerOnly: a request between servers (migration, map changes),
	// refused on a client session.
	peerOnly bool
}

// on makes the handler of requests of type M from f.
func on[M proto.Message](f func(c *conn, m M) proto.Message) handler {
	var zero M // a nil pointer, whose Type() is M's
	return handler{serve: func(c *conn, m proto.Message) proto.Message { return f(c, m.(M)) }, req: zero.Type()}
}

// peer makes the handler of a request of type M that only other servers
// may make, from a method of the Server.
func peer[M proto.Message](f func(s *Server, m M) proto.Message) handler {
	return peerSession(func(c *conn, m M) proto.Message { return f(c.s, m) })
}

// peerSession is peer for a handler that needs the session (its peer's
// name).
func peerSession[M proto.Message](f func(c *conn, m M) proto.Message) handler {
	h := on(f)
	h.peerOnly = true
	return h
}

// handlers is every request the server takes after the Hello (which
// handshake takes), by type: a new control message is a row in proto's
// msgTable and one here.
var handlers = [proto.NumMsgTypes]handler{
	proto.MsgGrantLease:  on((*conn).grantLease),
	proto.MsgCommit:      on((*conn).commit),
	proto.MsgCommitBatch: on((*conn).commitBatch),
	proto.MsgDelete:      on((*conn).delete),
	proto.MsgScan:        on((*conn).scan),
	proto.MsgEndLease:    on((*conn).endLease),
	proto.MsgStats:       on(func(c *conn, _ *proto.Stats) proto.Message { return c.s.statsReply() }),
	proto.MsgGetMap:      on(func(c *conn, m *proto.GetMap) proto.Message { return c.s.mapReply(m.Have) }),
	proto.MsgGetView:     on(func(c *conn, m *proto.GetView) proto.Message { return c.s.viewReply(m.Have) }),
	proto.MsgForget:      on(func(c *conn, m *proto.Forget) proto.Message { return c.s.forget(m) }),

	proto.MsgSetReplicas: on(func(c *conn, m *proto.SetReplicas) proto.Message { return c.s.setReplicas(m) }), // authenticated as forget is
	proto.MsgGetReadLease: on(func(c *conn, _ *proto.GetReadLease) proto.Message {
		left := c.s.leaseLeft()
		if left <= 0 {
			c.s.readLeasesRefused.Add(1)
		}
		return &proto.ReadLeaseReply{TTL: left, Epoch: c.s.saved.Load().Epoch()}
	}),
	proto.MsgRenewReadLease: peer((*Server).renewReadLeaseReply),

	proto.MsgMapChange:     peer((*Server).mapChange),
	proto.MsgShardScan:     peer((*Server).shardScan),
	proto.MsgFenceShards:   peer((*Server).fenceShards),
	proto.MsgReleaseShards: peer((*Server).releaseShards),
	proto.MsgReplicaCommit: peerSession((*conn).replicaCommit),
	proto.MsgReplicaDelete: peerSession((*conn).replicaDelete),
}

// handle answers one request of the session.
func (c *conn) handle(m proto.Message) proto.Message {
	t := m.Type()
	if int(t) >= len(handlers) || handlers[t].serve == nil {
		return notTaken(m)
	}
	h := &handlers[t]
	if h.peerOnly && c.kind != proto.SessionPeer {
		return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("%v is a request between servers", t)}
	}
	return h.serve(c, m)
}

// grantLease grants a lease registered in the connection's own PD, which
// only its write QP reaches. A session without QPs has no such PD, and
// could only write a lease through another connection's QP: it gets none.
func (c *conn) grantLease(m *proto.GrantLease) proto.Message {
	if c.lpd == nil {
		return &proto.Error{Code: proto.CodeBadRequest, Message: "GrantLease on a session without QPs (its Hello said NoQP): a lease is written through the session's own write QP"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.s.st.GrantLeaseIn(ctx, c.lpd, int64(min(m.Size, 1<<62)), int64(min(m.Min, 1<<62)))
	if err != nil {
		return errorReply(err)
	}
	c.mu.Lock()
	c.leases[l.ID] = struct{}{}
	c.mu.Unlock()
	return &proto.LeaseReply{ID: l.ID, Arena: l.Arena, Addr: l.Addr, Size: uint64(l.Size), RKey: l.RKey,
		TTL: max(time.Until(l.Expires), 0), VersionBase: l.VersionBase, VersionCount: l.VersionCount}
}

func (c *conn) commit(m *proto.Commit) proto.Message {
	return c.commitWith(m, &c.fwd, &proto.CommitReply{})
}

// commitWith commits m, forwarding it through fwd, which is the caller's
// goroutine's own, and returns reply, filled in, or an Error.
func (c *conn) commitWith(m *proto.Commit, fwd *forwarder, reply *proto.CommitReply) proto.Message {
	if e := c.refuseCommit(m); e != nil {
		return e
	}
	b := c.batchCommit(m, fwd)
	b.Result, b.Err = c.s.st.CommitForwarded(context.Background(), b.Lease, b.Off, b.Length, b.Write, b.Forwarder)
	return c.s.commitReply(m.Epoch, &b, reply)
}

// refuseCommit is the Error that refuses m before the store sees it: a
// lease not granted on this connection, or a range no lease has.
func (c *conn) refuseCommit(m *proto.Commit) *proto.Error {
	if !c.hasLease(m.LeaseID) {
		return &proto.Error{Code: proto.CodeLeaseInvalid, Message: fmt.Sprintf("lease %d was not granted on this connection", m.LeaseID)}
	}
	if m.Offset > 1<<62 || m.Length > 1<<62 {
		return &proto.Error{Code: proto.CodeLeaseInvalid, Message: fmt.Sprintf("commit of %d bytes at offset %d in lease %d: out of range", m.Length, m.Offset, m.LeaseID)}
	}
	return nil
}

// batchCommit is m as a record of a store.CommitBatch, forwarded through
// fwd.
func (c *conn) batchCommit(m *proto.Commit, fwd *forwarder) store.BatchCommit {
	*fwd = forwarder{s: c.s, epoch: m.Epoch, write: m.Write, copies: m.Copies}
	return store.BatchCommit{Lease: m.LeaseID, Off: int64(m.Offset), Length: int64(m.Length), Write: m.Write, Forwarder: fwd}
}

// commitReply answers a commit of a client at map epoch with b's outcome:
// reply, filled in, or an Error.
func (s *Server) commitReply(epoch uint64, b *store.BatchCommit, reply *proto.CommitReply) proto.Message {
	if b.Err != nil {
		return s.fenceReply(epoch, b.Err)
	}
	r := b.Result
	*reply = proto.CommitReply{Arena: r.Location.Arena, Offset: r.Location.Offset, Length: r.Location.Length, Version: r.Version}
	return reply
}

func (c *conn) delete(m *proto.Delete) proto.Message {
	c.fwd = forwarder{s: c.s, epoch: m.Epoch, write: m.Write}
	if err := c.s.st.DeleteForwarded(context.Background(), m.Key, m.Write, &c.fwd); err != nil {
		return c.s.fenceReply(m.Epoch, err)
	}
	return &proto.Ack{}
}

// commitBatch commits the commits of m, records of one lease of this
// connection in the order of their offsets, at once (store.CommitBatch),
// so that the store's group commit takes them together.
func (c *conn) commitBatch(m *proto.CommitBatch) proto.Message {
	reply := &proto.CommitBatchReply{Results: make([]proto.CommitResult, len(m.Commits))}
	if len(m.Commits) == 0 {
		return reply
	}
	lease := m.Commits[0].LeaseID
	if !c.hasLease(lease) {
		return &proto.Error{Code: proto.CodeLeaseInvalid, Message: fmt.Sprintf("lease %d was not granted on this connection", lease)}
	}
	fwds := make([]forwarder, len(m.Commits))
	batch := make([]store.BatchCommit, len(m.Commits))
	for i := range m.Commits {
		cm := &m.Commits[i]
		if cm.LeaseID != lease || cm.Offset > 1<<62 || cm.Length > 1<<62 {
			return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("commit %d of a batch in lease %d: %d bytes at offset %d in lease %d (one lease, in range)", i, lease, cm.Length, cm.Offset, cm.LeaseID)}
		}
		batch[i] = c.batchCommit(cm, &fwds[i])
	}
	c.s.st.CommitBatch(context.Background(), batch)
	for i := range batch {
		r := c.s.commitReply(m.Commits[i].Epoch, &batch[i], &reply.Results[i].Reply)
		if e, ok := r.(*proto.Error); ok {
			reply.Results[i].Err = e
			c.s.refused[e.Code].Add(1)
			c.s.logRefusal(m, e)
		}
	}
	return reply
}

// hasLease reports whether lease id was granted on this connection and
// not ended.
func (c *conn) hasLease(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.leases[id]
	return ok
}

func (c *conn) endLease(m *proto.EndLease) proto.Message {
	c.mu.Lock()
	_, ok := c.leases[m.ID]
	delete(c.leases, m.ID)
	c.mu.Unlock()
	if !ok {
		return &proto.Error{Code: proto.CodeLeaseInvalid, Message: fmt.Sprintf("lease %d was not granted on this connection", m.ID)}
	}
	if err := c.s.st.EndLease(m.ID); err != nil {
		return errorReply(err)
	}
	return &proto.Ack{}
}

func notTaken(m proto.Message) *proto.Error {
	return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("%v is not a request this server takes", m.Type())}
}

// fenceReply answers a write the store refused; a refusal for a shard this
// server does not own (or that is moving) names the server's map epoch, so
// that a client holding an older map knows to fetch this one.
func (s *Server) fenceReply(clientEpoch uint64, err error) *proto.Error {
	var e *proto.Error
	if !errors.As(err, &e) { // a forward's refusal is one already
		e = errorReply(err)
	}
	if e.Code == proto.CodeNotOwner || e.Code == proto.CodeShardMoving {
		e.Message = fmt.Sprintf("%s (this server's map epoch %d, the request's %d)", e.Message, s.Map().Epoch(), clientEpoch)
	}
	return e
}

// scanBudget keeps a scan reply under proto.MaxFrame.
const scanBudget = proto.MaxFrame - 64

func (c *conn) scan(m *proto.Scan) proto.Message {
	limit := int(m.Limit)
	if limit == 0 || limit > proto.MaxScanEntries {
		limit = proto.MaxScanEntries
	}
	if len(m.Shards) == 0 {
		return &proto.ScanReply{}
	}
	entries, err := c.s.st.Scan(m.Shards, m.Start, m.End, limit)
	if err != nil {
		return c.s.fenceReply(m.Epoch, err)
	}
	out, cut := scanEntries(entries, 0)
	return &proto.ScanReply{Entries: out, More: cut || len(entries) == limit}
}

// scanEntries converts store entries for a reply that already holds used
// bytes, as many as fit under scanBudget; cut says some did not.
func scanEntries(entries []store.ScanEntry, used int) (_ []proto.ScanEntry, cut bool) {
	out := make([]proto.ScanEntry, 0, len(entries))
	for _, e := range entries {
		if used += proto.ScanEntrySize(len(e.Key)); used > scanBudget {
			return out, true
		}
		out = append(out, proto.ScanEntry{Key: e.Key, Arena: e.Location.Arena, Offset: e.Location.Offset, Length: e.Location.Length, Version: e.Version})
	}
	return out, false
}

// storeErrorCodes maps store errors to control error codes, first match
// wins; anything else is CodeInternal.
var storeErrorCodes = []struct {
	err  error
	code proto.ErrorCode
}{
	{store.ErrNotFound, proto.CodeNotFound},
	{store.ErrLease, proto.CodeLeaseInvalid},
	{store.ErrRecord, proto.CodeRecordInvalid},
	{store.ErrFull, proto.CodeFull},
	{store.ErrIndexFull, proto.CodeIndexFull},
	{store.ErrNotOwner, proto.CodeNotOwner},
	{store.ErrShardMoving, proto.CodeShardMoving},
	{store.ErrSuperseded, proto.CodeSuperseded},
}

// errorReply maps a store error to a control Error.
func errorReply(err error) *proto.Error {
	code := proto.CodeInternal
	for _, m := range storeErrorCodes {
		if errors.Is(err, m.err) {
			code = m.code
			break
		}
	}
	return &proto.Error{Code: code, Message: err.Error()}
}
