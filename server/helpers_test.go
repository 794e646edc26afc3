// Test helpers shared by the server's tests: servers, raw control connections, raw RDMA sessions.

package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap/replica"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

var fastGossip = membership.Tuning{ProbeInterval: 100 * time.Millisecond, GossipInterval: 20 * time.Millisecond}

func testLogger() *slog.Logger {
	if os.Getenv("RKV_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// testDevice opens a soft RDMA device on loopback, closed at the end of
// the test (after the servers registered later).
func testDevice(t testing.TB) rdma.Device {
	t.Helper()
	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// newTestServer starts a small server on loopback, a cluster of its own,
// and waits until it serves every shard; mod, if not nil, adjusts its
// configuration first. The caller closes it.
func newTestServer(t *testing.T, mod func(*Config)) *Server {
	t.Helper()
	cfg := testConfig(t, t.TempDir())
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitServing(t, s, proto.NumShards)
	return s
}

// testConfig is the configuration of a small server on loopback, a
// cluster of its own, with its data in dir.
func testConfig(t *testing.T, dir string) Config {
	return Config{
		Name:       "s1",
		Device:     testDevice(t),
		Store:      store.Options{Dir: dir, ArenaSize: 4 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 256 << 10},
		Membership: membership.Config{Tuning: fastGossip},
		Bootstrap:  true,
		Raft:       fastRaft,
		Logger:     testLogger(),
	}
}

var fastRaft = replica.Tuning{HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
	LeaderLeaseTimeout: 150 * time.Millisecond, CommitTimeout: 5 * time.Millisecond}

// waitServing waits until s serves n shards.
func waitServing(t testing.TB, s *Server, n int) {
	t.Helper()
	waitFor(t, 20*time.Second, s.Name()+" serving its shards", func() error {
		owned := 0
		for _, sh := range s.Store().Shards() {
			if sh.State == store.ShardOwned {
				owned++
			}
		}
		if owned != n {
			return fmt.Errorf("%d shards served, want %d (map %v)", owned, n, s.Map())
		}
		return nil
	})
}

func testServer(t *testing.T, token string) *Server {
	t.Helper()
	return newTestServer(t, func(c *Config) { c.AuthToken = token })
}

// startServer is newTestServer closed at the end of the test, after
// everything registered later (cleanups run last in, first out), with every
// arena advertised.
func startServer(t *testing.T, mod func(*Config)) *Server {
	t.Helper()
	s := newTestServer(t, mod)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the server: %v", err)
		}
	})
	o := s.Store().Options()
	want := o.ArenaCount * int(o.UnitsPerArena())
	waitFor(t, 20*time.Second, "arenas advertised", func() error {
		if n := len(s.Meta().Arenas); n != want {
			return fmt.Errorf("%d of %d arena regions advertised", n, want)
		}
		return nil
	})
	return s
}

// waitFor polls cond until it returns nil, failing the test after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dial opens a control connection to the server.
func dial(t *testing.T, s *Server) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", s.ControlAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// connectQP connects the QPs to the server over nc after a successful
// Hello, as a client does.
func connectQP(t *testing.T, nc net.Conn) {
	t.Helper()
	newRDMASession(t, nc)
}

func call(t *testing.T, nc net.Conn, id uint64, m proto.Message) proto.Message {
	t.Helper()
	if err := proto.WriteFrame(nc, id, m); err != nil {
		t.Fatal(err)
	}
	rid, r, _, err := proto.ReadFrame(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rid != id {
		t.Fatalf("reply id %d, want %d", rid, id)
	}
	return r
}

// rawSession is a hand-driven client: a control connection past its Hello,
// its two QPs connected to the server over it (qp, whose server end is in
// the server's PD with the arenas, and wqp, whose server end is in the
// connection's own PD with its leases), and a registered buffer, so a test
// can post any RDMA request and send any control frame.
type rawSession struct {
	t   *testing.T
	nc  net.Conn
	dev rdma.Device
	pd  rdma.PD
	cq  rdma.CQ
	qp  rdma.QP
	wcq rdma.CQ
	wqp rdma.QP
	mem *rdma.Memory
	mr  rdma.MR
	id  uint64 // the last request id used
}

// qpOf names one of a session's QPs.
type qpOf int

const (
	readQP  qpOf = iota // the one in the server's PD: arenas and index
	writeQP             // the one in the connection's PD: its leases
)

func (w qpOf) String() string { return [...]string{"read QP", "write QP"}[w] }

func (ss *rawSession) qpAndCQ(w qpOf) (rdma.QP, rdma.CQ) {
	if w == writeQP {
		return ss.wqp, ss.wcq
	}
	return ss.qp, ss.cq
}

// openSession dials s, says Hello with token and connects a QP.
func openSession(t *testing.T, s *Server, token string) *rawSession {
	t.Helper()
	nc := dial(t, s)
	if r, ok := call(t, nc, 1, &proto.Hello{Client: t.Name(), Token: []byte(token)}).(*proto.HelloReply); !ok {
		t.Fatalf("hello: %#v", r)
	}
	ss := newRDMASession(t, nc)
	ss.id = 1
	return ss
}

// newRDMASession connects the QPs over nc, which has passed its Hello.
func newRDMASession(t *testing.T, nc net.Conn) *rawSession {
	t.Helper()
	ss := &rawSession{t: t, nc: nc}
	var err error
	if ss.dev, err = rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ss.close)
	if ss.pd, err = ss.dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if ss.cq, err = ss.dev.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	if ss.wcq, err = ss.dev.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	if ss.mem, err = rdma.Alloc(1 << 16); err != nil {
		t.Fatal(err)
	}
	if ss.mr, err = ss.pd.Register(ss.mem.Bytes(), rdma.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	// Short timeouts: a request the server never answers fails fast.
	if ss.qp, err = ss.pd.CreateQP(rdma.QPConfig{SendCQ: ss.cq, RecvCQ: ss.cq, AckTimeout: time.Second, RetryCount: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rdma.ConnectQP(ctx, nc, ss.qp); err != nil {
		t.Fatal(err)
	}
	if ss.wqp, err = ss.pd.CreateQP(rdma.QPConfig{SendCQ: ss.wcq, RecvCQ: ss.wcq, AckTimeout: time.Second, RetryCount: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := rdma.ConnectQP(ctx, nc, ss.wqp); err != nil {
		t.Fatal(err)
	}
	return ss
}

// close releases everything; safe on a partly built session.
func (ss *rawSession) close() {
	ss.nc.Close()
	if ss.qp != nil {
		ss.qp.Close()
	}
	if ss.wqp != nil {
		ss.wqp.Close()
	}
	if ss.mr != nil {
		ss.mr.Deregister()
	}
	if ss.mem != nil {
		ss.mem.Close()
	}
	if ss.cq != nil {
		ss.cq.Close()
	}
	if ss.wcq != nil {
		ss.wcq.Close()
	}
	if ss.pd != nil {
		ss.pd.Close()
	}
	ss.dev.Close()
}

// call sends one control request and returns its reply.
func (ss *rawSession) call(m proto.Message) proto.Message {
	ss.t.Helper()
	ss.id++
	return call(ss.t, ss.nc, ss.id, m)
}

// lease asks for a write lease.
func (ss *rawSession) lease() *proto.LeaseReply {
	ss.t.Helper()
	lr, ok := ss.call(&proto.GrantLease{}).(*proto.LeaseReply)
	if !ok {
		ss.t.Fatalf("GrantLease: %#v", lr)
	}
	return lr
}

// post runs one signaled request on the read QP, on [off, off+n) of the
// buffer against (raddr, rkey), and returns its completion.
func (ss *rawSession) post(op rdma.Opcode, off, n int, raddr uint64, rkey uint32) rdma.Completion {
	ss.t.Helper()
	return ss.postOn(readQP, op, off, n, raddr, rkey)
}

// postOn is post on the QP w.
func (ss *rawSession) postOn(w qpOf, op rdma.Opcode, off, n int, raddr uint64, rkey uint32) rdma.Completion {
	ss.t.Helper()
	qp, cq := ss.qpAndCQ(w)
	wr := rdma.SendWR{Op: op, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: ss.mr, Offset: off, Length: n}}, RemoteAddr: raddr, RKey: rkey}
	if err := qp.PostSend([]rdma.SendWR{wr}); err != nil {
		ss.t.Fatalf("posting %v of %d bytes to %#x rkey %#x on the %v: %v", op, n, raddr, rkey, w, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]rdma.Completion
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		ss.t.Fatalf("waiting for %v to %#x on the %v: %v", op, raddr, w, err)
	}
	return wc[0]
}

// mustPost is post that fails the test unless the request succeeds.
func (ss *rawSession) mustPost(op rdma.Opcode, off, n int, raddr uint64, rkey uint32) {
	ss.t.Helper()
	ss.mustPostOn(readQP, op, off, n, raddr, rkey)
}

// mustPostOn is mustPost on the QP w.
func (ss *rawSession) mustPostOn(w qpOf, op rdma.Opcode, off, n int, raddr uint64, rkey uint32) {
	ss.t.Helper()
	if wc := ss.postOn(w, op, off, n, raddr, rkey); wc.Status != rdma.StatusSuccess {
		ss.t.Fatalf("%v of %d bytes at %#x rkey %#x on the %v: %v", op, n, raddr, rkey, w, wc.Status)
	}
}

// writeRecord encodes a record into the buffer and RDMA_WRITEs its first
// n bytes (all of it when n < 0) at offset off of the lease, on the write
// QP, as a client does. It returns the record's full size.
func (ss *rawSession) writeRecord(l *proto.LeaseReply, off uint64, version uint64, key, value []byte, n int) int {
	ss.t.Helper()
	size, err := proto.EncodeRecord(ss.mem.Bytes(), version, 0, key, value)
	if err != nil {
		ss.t.Fatal(err)
	}
	if n < 0 {
		n = size
	}
	ss.mustPostOn(writeQP, rdma.OpWrite, 0, n, l.Addr+off, l.RKey)
	return size
}

// newClient starts a client library instance against s.
func newClient(t *testing.T, s *Server, token string, key []byte) *client.Client {
	t.Helper()
	return newClientWith(t, s, client.Config{AuthToken: token, SecretKey: key})
}

// dialClient starts a client library instance against s; its seeds,
// device, logger and gossip tuning are set here.
func dialClient(t *testing.T, s *Server, cfg client.Config) (*client.Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg.Seeds, cfg.Logger, cfg.Membership = []string{s.GossipAddr()}, testLogger(), membership.Config{Tuning: fastGossip}
	cfg.Device = testDevice(t)
	return client.New(ctx, cfg)
}

// newClientWith is newClient with more of the configuration (see
// dialClient).
func newClientWith(t *testing.T, s *Server, cfg client.Config) *client.Client {
	t.Helper()
	cl, err := dialClient(t, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Close(); err != nil {
			t.Errorf("closing the client: %v", err)
		}
	})
	o := s.Store().Options()
	want := o.ArenaCount * int(o.UnitsPerArena())
	waitFor(t, 20*time.Second, "the client's view of the arenas", func() error {
		for _, m := range cl.Membership().View().Servers() {
			if m.Meta.Index != nil && len(m.Meta.Arenas) == want {
				return nil
			}
		}
		return errors.New("no server with its index and every arena in the view")
	})
	return cl
}

// healthy checks that the server still serves a well-behaved client: a PUT
// and a GET of a key named after what just happened.
func healthy(t *testing.T, cl *client.Client, after string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key, value := []byte("healthy/"+after), []byte("value after "+after)
	if err := cl.Put(ctx, key, value); err != nil {
		t.Fatalf("after %s: a well-behaved PUT failed: %v", after, err)
	}
	got, err := cl.Get(ctx, key)
	if err != nil || string(got) != string(value) {
		t.Fatalf("after %s: a well-behaved GET returned %q, %v", after, got, err)
	}
}
