// Security tests against a running server: the auth token, the handshake timeout, read-only advertised rkeys, the gossip key, TLS.

package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/internal/testpki"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

// wantHungUp checks that the server closed nc within d (what it sent
// first, such as its half of the QP handshake, is skipped).
func wantHungUp(t *testing.T, nc net.Conn, what string, d time.Duration) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(d))
	n, err := io.Copy(io.Discard, io.LimitReader(nc, 1<<16))
	var ne net.Error
	if err == nil && n < 1<<16 {
		return // EOF
	}
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the connection is still open after %v (read %d bytes, %v)", what, d, n, err)
	}
}

// TestAuthToken: with an AuthToken, a peer that does not present it gets
// CodeUnauthenticated, is hung up on and never gets a QP or a lease; so
// does a peer that skips the Hello. A peer that stalls in the handshake is
// dropped after HandshakeTimeout.
func TestAuthToken(t *testing.T) {
	noLeaks(t)
	const token, timeout = "sesame", 1500 * time.Millisecond
	s := startServer(t, func(c *Config) { c.AuthToken, c.HandshakeTimeout = token, timeout })
	cl := newClient(t, s, token, nil)
	healthy(t, cl, "start")
	granted := s.Store().Stats().LeasesGranted

	for _, c := range []struct {
		name  string
		first proto.Message
		want  string
	}{
		{"a Hello without a token", &proto.Hello{Client: "c"}, "wrong auth token"},
		{"a Hello with a wrong token", &proto.Hello{Client: "c", Token: []byte("sesamE")}, "wrong auth token"},
		{"a Hello with a prefix of the token", &proto.Hello{Client: "c", Token: []byte("sesam")}, "wrong auth token"},
		// The longest Hello fits the pre-auth frame bound (MaxHelloFrame).
		{"the longest Hello, with a wrong token", &proto.Hello{Client: strings.Repeat("c", proto.MaxControlName),
			Token: bytes.Repeat([]byte("t"), proto.MaxControlToken)}, "wrong auth token"},
		{"a GrantLease instead of a Hello", &proto.GrantLease{}, "the first request must be Hello"},
	} {
		nc := dial(t, s)
		e, ok := call(t, nc, 1, c.first).(*proto.Error)
		if !ok || e.Code != proto.CodeUnauthenticated || !strings.Contains(e.Message, c.want) {
			t.Fatalf("%s: answered %#v, want an unauthenticated Error saying %q", c.name, e, c.want)
		}
		// The lease request that follows gets no answer: the server hung up.
		_ = proto.WriteFrame(nc, 2, &proto.GrantLease{})
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, m, _, err := proto.ReadFrame(nc, nil); err == nil {
			t.Fatalf("%s: a GrantLease after it was answered: %#v", c.name, m)
		}
		healthy(t, cl, c.name)
	}
	if n := s.Store().Stats().LeasesGranted; n != granted {
		t.Fatalf("%d leases granted to unauthenticated peers", n-granted)
	}

	// The client library says what is wrong, at once: it cannot even
	// fetch the cluster map.
	for _, tok := range []string{"", "wrong"} {
		_, err := dialClient(t, s, client.Config{AuthToken: tok})
		if !errors.Is(err, client.ErrUnauthenticated) || !strings.Contains(err.Error(), "wrong auth token") {
			t.Fatalf("a client with token %q: %v, want ErrUnauthenticated", tok, err)
		}
	}

	// Stalling before the Hello, or between the Hello and the QP
	// handshake, costs the peer its connection after HandshakeTimeout.
	silent := dial(t, s)
	helloOnly := dial(t, s)
	if _, ok := call(t, helloOnly, 1, &proto.Hello{Client: "c", Token: []byte(token)}).(*proto.HelloReply); !ok {
		t.Fatal("hello with the token refused")
	}
	start := time.Now()
	wantHungUp(t, silent, "a peer silent before its Hello", 4*timeout)
	wantHungUp(t, helloOnly, "a peer silent after its Hello", 4*timeout)
	if took := time.Since(start); took < timeout/2 {
		t.Fatalf("stalled peers dropped after %v, before the %v handshake timeout", took, timeout)
	}
	healthy(t, cl, "stalled handshakes")
}

// TestPeerToken: with a PeerToken, a session between servers (peer or
// Raft) must present it: the clients' auth token is refused with an Error
// that says why, before any QP, and the connection is closed; the peer
// token opens a peer session (a ShardScan is served) but not a client's.
// Clients go on with the auth token.
func TestPeerToken(t *testing.T) {
	noLeaks(t)
	const token, peerToken = "sesame", "servers only"
	s := startServer(t, func(c *Config) { c.AuthToken, c.PeerToken = token, peerToken })
	cl := newClient(t, s, token, nil)
	healthy(t, cl, "start")
	open := s.Stats().Connections

	for _, c := range []struct {
		name  string
		hello *proto.Hello
		want  string
	}{
		{"a peer Hello with the auth token", &proto.Hello{Client: "c", Kind: proto.SessionPeer, Token: []byte(token), NoQP: true}, "wrong peer token: a peer session is for servers"},
		{"a peer Hello asking for a QP with the auth token", &proto.Hello{Client: "c", Kind: proto.SessionPeer, Token: []byte(token)}, "wrong peer token"},
		{"a Raft Hello with the auth token", &proto.Hello{Client: "c", Kind: proto.SessionRaft, Token: []byte(token)}, "wrong peer token: a raft session is for servers"},
		{"a peer Hello without a token", &proto.Hello{Client: "c", Kind: proto.SessionPeer}, "wrong peer token"},
		{"a client Hello with the peer token", &proto.Hello{Client: "c", Token: []byte(peerToken)}, "wrong auth token"},
	} {
		nc := dial(t, s)
		e, ok := call(t, nc, 1, c.hello).(*proto.Error)
		if !ok || e.Code != proto.CodeUnauthenticated || !strings.Contains(e.Message, c.want) {
			t.Fatalf("%s: answered %#v, want an unauthenticated Error saying %q", c.name, e, c.want)
		}
		// Refused before a QP: the server sends nothing more (no half
		// of a QP exchange, no answer to a peer request) and hangs up.
		_ = proto.WriteFrame(nc, 2, &proto.ShardScan{Shard: 0, Limit: 1})
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		// (A reset is a close too: the server may be gone before the
		// ShardScan arrives.)
		if rest, err := io.ReadAll(nc); len(rest) != 0 || err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("%s: after the refusal, %d bytes and %v; want the connection closed without a word", c.name, len(rest), err)
		}
	}
	healthy(t, cl, "refused peer sessions")

	// What a server dials with: the peer token opens a peer session, and
	// its peer requests are served.
	peer, err := session.Dial(context.Background(), s.ControlAddr(), s.ID(), s.peerConfig())
	if err != nil {
		t.Fatalf("a peer session with the peer token: %v", err)
	}
	defer peer.Close()
	if r, err := peer.Call(context.Background(), &proto.ShardScan{Shard: 0, Limit: 1}); err != nil {
		t.Fatalf("ShardScan on a peer session: %v", err)
	} else if _, ok := r.(*proto.ShardScanReply); !ok {
		t.Fatalf("ShardScan on a peer session: %#v", r)
	}
	// The same with the clients' token, as session.Dial reports it.
	withClientToken := s.peerConfig()
	withClientToken.Token = []byte(token)
	if _, err := session.Dial(context.Background(), s.ControlAddr(), s.ID(), withClientToken); !errors.Is(err, session.ErrRefused) || !strings.Contains(err.Error(), "wrong peer token") {
		t.Fatalf("a peer session with the auth token: %v, want ErrRefused saying wrong peer token", err)
	}
	peer.Close()
	waitFor(t, 5*time.Second, "the refused connections closed", func() error {
		if n := s.Stats().Connections; n > open {
			return fmt.Errorf("%d control connections open, %d before the refused ones", n, open)
		}
		return nil
	})
}

// TestAdvertisedRKeysAreReadOnly: what a server gossips (the index and
// every arena) carries read-only rkeys only, never a lease's write rkey,
// and each refuses WRITE and atomics.
func TestAdvertisedRKeysAreReadOnly(t *testing.T) {
	noLeaks(t)
	s := startServer(t, nil)
	cl := newClient(t, s, "", nil)
	ss := openSession(t, s, "")
	var writeKeys []uint32
	for range 3 {
		writeKeys = append(writeKeys, ss.lease().RKey)
	}
	healthy(t, cl, "start") // the client holds a lease too

	servers := cl.Membership().View().Servers()
	if len(servers) != 1 {
		t.Fatalf("the client sees %d servers", len(servers))
	}
	gossiped, local := servers[0].Meta, s.Meta()
	if gossiped.Index == nil || *gossiped.Index != *local.Index || !slices.Equal(gossiped.Arenas, local.Arenas) {
		t.Fatalf("gossiped metadata %+v differs from the server's %+v", gossiped, local)
	}
	type region struct {
		name string
		addr uint64
		rkey uint32
	}
	regions := []region{{"the index", gossiped.Index.Addr, gossiped.Index.RKey}}
	for _, a := range gossiped.Arenas {
		regions = append(regions, region{fmt.Sprintf("arena %d", a.ID), a.Addr, a.RKey})
	}
	for _, r := range regions {
		if slices.Contains(writeKeys, r.rkey) {
			t.Fatalf("%s is advertised with a lease's write rkey %#x", r.name, r.rkey)
		}
		reader := openSession(t, s, "")
		reader.mustPost(rdma.OpRead, 0, 8, r.addr, r.rkey)
		before := bytes.Clone(reader.mem.Bytes()[:8])
		for _, op := range []rdma.Opcode{rdma.OpWrite, rdma.OpCompareSwap, rdma.OpFetchAdd} {
			ss := openSession(t, s, "")
			what := fmt.Sprintf("%v on %s with its advertised rkey", op, r.name)
			wantRemoteAccessError(t, ss, what, ss.post(op, 0, 8, r.addr, r.rkey))
			check := openSession(t, s, "")
			check.mustPost(rdma.OpRead, 0, 8, r.addr, r.rkey)
			if got := check.mem.Bytes()[:8]; !bytes.Equal(got, before) {
				t.Fatalf("%s: the bytes changed from %x to %x", what, before, got)
			}
		}
	}
	healthy(t, cl, "writes with read-only rkeys")
}

// TestGossipKey: the membership package tests that nodes without the
// cluster's key can neither join nor see members; this checks the same
// end to end, for a client library against a keyed server.
func TestGossipKey(t *testing.T) {
	noLeaks(t)
	key := bytes.Repeat([]byte{7}, 32)
	s := startServer(t, func(c *Config) { c.Membership.SecretKey = key })
	if w := s.Membership().Warning(); w != "" {
		t.Errorf("a server with a gossip key warns %q", w)
	}
	for _, k := range [][]byte{nil, bytes.Repeat([]byte{8}, 32)} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cl, err := client.New(ctx, client.Config{Seeds: []string{s.GossipAddr()}, Device: testDevice(t), SecretKey: k, Logger: testLogger(),
			Membership: membership.Config{Tuning: fastGossip}})
		cancel()
		if err == nil {
			_ = cl.Close()
			t.Fatalf("a client with gossip key %x joined a cluster keyed %x", k, key)
		}
		if !strings.Contains(err.Error(), "joining the cluster") {
			t.Fatalf("a client with gossip key %x: %v, want a join failure", k, err)
		}
	}
	healthy(t, newClient(t, s, "", key), "clients without the gossip key")
}

// TestControlTLS: a server with TLS and required client certificates
// serves a client that has both; a plaintext peer, a client without a
// certificate and a client that does not trust the server's CA are
// refused before any Hello is answered.
func TestControlTLS(t *testing.T) {
	noLeaks(t)
	pki := testpki.New(t, "127.0.0.1")
	if _, err := New(context.Background(), Config{Name: "x", Device: testDevice(t), Store: store.Options{Dir: t.TempDir()}, TLS: &tls.Config{}}); err == nil ||
		!strings.Contains(err.Error(), "no certificate") {
		t.Fatalf("a TLS config without a certificate: %v", err)
	}
	if _, err := New(context.Background(), Config{Name: "x", Device: testDevice(t), Store: store.Options{Dir: t.TempDir()}, TLS: pki.ServerConfig()}); err == nil ||
		!strings.Contains(err.Error(), "PeerTLS") {
		t.Fatalf("TLS without a configuration for the connections to other servers: %v", err)
	}
	s := startServer(t, func(c *Config) {
		c.AuthToken = "sesame"
		c.TLS, c.PeerTLS = pki.ServerConfig(), pki.ClientConfig()
	})
	good := pki.ClientConfig()
	cl := newClientWith(t, s, client.Config{AuthToken: "sesame", TLS: good})
	healthy(t, cl, "start")
	granted := s.Store().Stats().LeasesGranted

	// A plaintext Hello is not answered.
	nc := dial(t, s)
	if err := proto.WriteFrame(nc, 1, &proto.Hello{Client: "c", Token: []byte("sesame")}); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, m, _, err := proto.ReadFrame(nc, nil); err != nil {
		t.Fatalf("a plaintext Hello to a TLS server: no answer: %v", err)
	} else if e, ok := m.(*proto.Error); !ok || e.Code != proto.CodeUnauthenticated || !strings.Contains(e.Message, "TLS only") {
		t.Fatalf("a plaintext Hello to a TLS server: answered %#v", m)
	}
	wantHungUp(t, nc, "a plaintext Hello to a TLS server", 10*time.Second)

	noCert := good.Clone()
	noCert.Certificates = nil
	untrusting := good.Clone()
	untrusting.RootCAs = x509.NewCertPool()
	for _, c := range []struct {
		name string
		tls  *tls.Config
		want string
	}{
		{"a plaintext client", nil, "this control port speaks TLS only"},
		{"a client without a certificate", noCert, "certificate required"},
		{"a client that does not trust the server's CA", untrusting, "certificate signed by unknown authority"},
	} {
		// The client fails at once: it cannot even fetch the map.
		start := time.Now()
		_, err := dialClient(t, s, client.Config{AuthToken: "sesame", TLS: c.tls, RetryAttempts: 2})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: client.New returned %v, want an error saying %q", c.name, err, c.want)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: refused after %v, not at once", c.name, d)
		}
		healthy(t, cl, c.name)
	}
	if n := s.Store().Stats().LeasesGranted; n != granted {
		t.Fatalf("%d leases granted to refused clients", n-granted)
	}
}
