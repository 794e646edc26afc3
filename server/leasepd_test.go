// Each connection's leases in a PD of its own (issue 15): rkeys that work on their connection only, PDs released at close.

package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// TestLeaseRKeyWorksOnItsOwnConnectionOnly: a second client that learns
// the first one's lease (address and rkey) cannot write it, on either of
// its QPs: REM_ACCESS_ERR, and the lease's bytes do not change. Its own
// lease it writes; the first client still writes and commits, and its
// value reads back.
func TestLeaseRKeyWorksOnItsOwnConnectionOnly(t *testing.T) {
	noLeaks(t)
	s := startServer(t, nil)
	cl := newClient(t, s, "", nil)
	first, second := openSession(t, s, ""), openSession(t, s, "")
	l := first.lease()
	var arena proto.ArenaRegion
	for _, a := range s.Meta().Arenas {
		if a.ID == l.Arena {
			arena = a
		}
	}
	key, value := []byte("first/key"), []byte("the first client's value")
	n := first.writeRecord(l, 0, l.VersionBase, key, value, -1)
	leaseBytes := func() []byte { // the record as the server holds it
		reader := openSession(t, s, "")
		reader.mustPost(rdma.OpRead, 0, n, l.Addr, arena.RKey)
		return bytes.Clone(reader.mem.Bytes()[:n])
	}
	written := leaseBytes()

	own := second.lease()
	second.writeRecord(own, 0, own.VersionBase, []byte("second/key"), []byte("its own lease works"), -1)
	for i := range second.mem.Bytes()[:64] {
		second.mem.Bytes()[i] = 0xee
	}
	for _, w := range []qpOf{readQP, writeQP} {
		what := "the second client's WRITE with the first's lease rkey"
		wantRemoteAccessErrorOn(t, second, w, what, second.postOn(w, rdma.OpWrite, 0, 64, l.Addr, l.RKey))
		if got := leaseBytes(); !bytes.Equal(got, written) {
			t.Fatalf("after %s on its %v: the first client's lease changed from %x to %x", what, w, written, got)
		}
	}

	if r, ok := first.call(&proto.Commit{LeaseID: l.ID, Offset: 0, Length: uint64(n)}).(*proto.CommitReply); !ok {
		t.Fatalf("the first client's commit: %#v", r)
	}
	n2 := first.writeRecord(l, uint64(n), l.VersionBase+1, []byte("first/again"), []byte("and again"), -1)
	if r, ok := first.call(&proto.Commit{LeaseID: l.ID, Offset: uint64(n), Length: uint64(n2)}).(*proto.CommitReply); !ok {
		t.Fatalf("the first client's second commit: %#v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for k, v := range map[string]string{string(key): string(value), "first/again": "and again"} {
		if got, err := cl.Get(ctx, []byte(k)); err != nil || string(got) != v {
			t.Fatalf("GET %q: %q, %v; want %q", k, got, err, v)
		}
	}
	healthy(t, cl, "the foreign writes")
}

// TestClosingAConnectionReleasesItsPD: a connection's own PD is closed
// with it, its leases' regions deregistered first, also when the leases
// expire as it closes; and once the server is closed nothing of it is
// left on the device.
func TestClosingAConnectionReleasesItsPD(t *testing.T) {
	noLeaks(t)
	const ttl = 300 * time.Millisecond
	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	s := newTestServer(t, func(c *Config) { c.Device, c.Store.LeaseTTL = dev, ttl })
	cl, err := dialClient(t, s, client.Config{})
	if err != nil {
		t.Fatal(err)
	}
	healthy(t, cl, "start")
	if n := s.leasePDs.Load(); n < 1 {
		t.Fatalf("%d connection PDs open with a client connected, want at least 1", n)
	}
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	waitPDs := func(what string) {
		t.Helper()
		waitFor(t, 10*time.Second, what, func() error {
			if n, a := s.leasePDs.Load(), s.Store().Stats().LeasesActive; n != 0 || a != 0 {
				return fmt.Errorf("%d connection PDs open, %d leases active", n, a)
			}
			return nil
		})
	}
	waitPDs("the client library's connections' PDs released")

	// Connections closed at moments around their leases' expiry, so that
	// the expirer deregisters some of the regions as the connection ends
	// the others.
	expired := s.Store().Stats().LeasesExpired
	var wg sync.WaitGroup
	for i := range 8 {
		ss := openSession(t, s, "")
		for range 3 {
			l := ss.lease()
			ss.writeRecord(l, 0, l.VersionBase, []byte("k"), []byte("v"), -1)
		}
		wg.Go(func() {
			time.Sleep(ttl - 60*time.Millisecond + time.Duration(i)*35*time.Millisecond)
			ss.nc.Close()
		})
	}
	wg.Wait()
	waitPDs("the raw sessions' PDs released")
	// The last ones closed well after the expirer's ticks (TTL/4).
	if n := s.Store().Stats().LeasesExpired - expired; n == 0 || n == 24 {
		t.Errorf("%d of the 24 leases expired: the closes did not straddle the expiry", n)
	} else {
		t.Logf("%d of the 24 leases expired, the others ended by their connection's close", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatalf("closing the device after the server: %v (a PD left open?)", err)
	}
}

// TestLeasePDCloseWaitsForDeregistration: Close waits for an MR that
// another goroutine deregisters (an expiring lease), and then closes the
// PD; a Register after Close fails.
func TestLeasePDCloseWaitsForDeregistration(t *testing.T) {
	dev := testDevice(t)
	p, err := newLeasePD(dev)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := rdma.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	mr, err := p.Register(mem.Bytes(), rdma.AccessLocalWrite|rdma.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v with an MR still registered", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close after the deregistration: %v", err)
	}
	if err := mr.Deregister(); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("second Deregister: %v, want ErrClosed", err)
	}
	if _, err := p.Register(mem.Bytes(), rdma.AccessLocalWrite); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Register after Close: %v, want ErrClosed", err)
	}
}

// TestNoLeaseWithoutQPs: a session without QPs has no PD of its own and
// no write QP, so it could only write a lease through another connection's
// QP: it gets none.
func TestNoLeaseWithoutQPs(t *testing.T) {
	noLeaks(t)
	s := startServer(t, nil)
	nc := dial(t, s)
	if r, ok := call(t, nc, 1, &proto.Hello{Client: t.Name(), NoQP: true}).(*proto.HelloReply); !ok {
		t.Fatalf("hello: %#v", r)
	}
	granted := s.Store().Stats().LeasesGranted
	e, ok := call(t, nc, 2, &proto.GrantLease{}).(*proto.Error)
	if !ok || e.Code != proto.CodeBadRequest || !strings.Contains(e.Message, "without QPs") {
		t.Fatalf("GrantLease on a session without QPs: %#v, want a CodeBadRequest Error", e)
	}
	if n := s.Store().Stats().LeasesGranted; n != granted || s.leasePDs.Load() != 0 {
		t.Fatalf("%d leases granted, %d connection PDs open", n-granted, s.leasePDs.Load())
	}
	if _, ok := call(t, nc, 3, &proto.Stats{}).(*proto.StatsReply); !ok {
		t.Fatal("the session is not usable after the refusal")
	}
}
