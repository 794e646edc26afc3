// Tests of the server's control path: Hello and its token, leases, commits, the handled counters.

package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServerControlPath(t *testing.T) {
	s := testServer(t, "sesame")
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	meta := s.Meta()
	if meta.Index == nil || meta.ControlAddr != s.ControlAddr() || meta.Endpoint.Addr == "" || meta.Generation != 1 {
		t.Fatalf("meta %+v", meta)
	}

	// Wrong token: refused and hung up on, before any QP exists for it.
	nc := dial(t, s)
	if r, ok := call(t, nc, 1, &proto.Hello{Client: "c", Token: []byte("wrong")}).(*proto.Error); !ok || r.Code != proto.CodeUnauthenticated {
		t.Fatalf("wrong token: %#v", r)
	}
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := nc.Read(make([]byte, 1)); err == nil {
		t.Fatalf("connection with a wrong token still open (read %d bytes)", n)
	}
	// Not Hello first: refused.
	nc = dial(t, s)
	if r, ok := call(t, nc, 1, &proto.Stats{}).(*proto.Error); !ok || r.Code != proto.CodeUnauthenticated {
		t.Fatalf("stats before hello: %#v", r)
	}

	nc = dial(t, s)
	if r, ok := call(t, nc, 1, &proto.Hello{Client: "c", Token: []byte("sesame")}).(*proto.HelloReply); !ok || r.Server != "s1" || r.Generation != 1 {
		t.Fatalf("hello: %#v", r)
	}
	connectQP(t, nc)
	lr, ok := call(t, nc, 2, &proto.GrantLease{}).(*proto.LeaseReply)
	if !ok || lr.Size != 256<<10 || lr.TTL <= 0 {
		t.Fatalf("lease: %#v", lr)
	}
	// A commit of nothing written is refused as an invalid record.
	if r, ok := call(t, nc, 3, &proto.Commit{LeaseID: lr.ID, Offset: 0, Length: 48}).(*proto.Error); !ok || r.Code != proto.CodeRecordInvalid {
		t.Fatalf("commit of garbage: %#v", r)
	}
	if r, ok := call(t, nc, 4, &proto.Commit{LeaseID: 999, Offset: 0, Length: 48}).(*proto.Error); !ok || r.Code != proto.CodeLeaseInvalid {
		t.Fatalf("commit on a foreign lease: %#v", r)
	}
	if _, ok := call(t, nc, 5, &proto.Delete{Key: []byte("k")}).(*proto.Ack); !ok {
		t.Fatal("delete")
	}
	if r, ok := call(t, nc, 6, &proto.Scan{Start: []byte{}}).(*proto.ScanReply); !ok || len(r.Entries) != 0 {
		t.Fatalf("scan: %#v", r)
	}
	if r, ok := call(t, nc, 7, &proto.Ack{}).(*proto.Error); !ok || r.Code != proto.CodeBadRequest {
		t.Fatalf("a reply as request: %#v", r)
	}
	st, ok := call(t, nc, 8, &proto.Stats{}).(*proto.StatsReply)
	if !ok || st.LeasesActive != 1 || st.Generation != 1 {
		t.Fatalf("stats: %#v", st)
	}
	got := s.Stats()
	if got.Handled[proto.MsgHello] != 2 || got.Handled[proto.MsgStats] != 2 || got.Handled[proto.MsgCommit] != 2 || got.Handled[proto.MsgGrantLease] != 1 {
		t.Fatalf("handled %v", got.Handled)
	}
	// Closing the connection ends its lease.
	nc.Close()
	deadline := time.Now().Add(5 * time.Second)
	for s.Store().Stats().LeasesActive != 0 {
		if time.Now().After(deadline) {
			t.Fatal("lease of a closed connection still active")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A bad frame is answered with the reason, then the connection closes
	// (server/hostile_test.go has the other hostile frames).
	nc = dial(t, s)
	_, _ = nc.Write([]byte{0, 0, 0, 1, 0xc1})
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, r, _, err := proto.ReadFrame(nc, nil); err != nil {
		t.Fatalf("no answer to a bad frame: %v", err)
	} else if e, ok := r.(*proto.Error); !ok || e.Code != proto.CodeBadRequest {
		t.Fatalf("answer to a bad frame: %#v", r)
	}
	if _, err := nc.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection survived a bad frame")
	}
}

func TestServerConfig(t *testing.T) {
	if _, err := New(context.Background(), Config{Store: store.Options{Dir: t.TempDir()}}); err == nil {
		t.Fatal("server without a name")
	}
	if _, err := New(context.Background(), Config{Name: "x"}); err == nil {
		t.Fatal("server without a data directory")
	}
	if _, err := New(context.Background(), Config{Name: "x", Store: store.Options{Dir: t.TempDir()}, Logger: slog.New(slog.DiscardHandler)}); err == nil {
		t.Fatal("server without a device")
	}
	dev := testDevice(t)
	_, err := New(context.Background(), Config{Name: "x", Device: dev, Store: store.Options{Dir: t.TempDir()}, Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "--bootstrap") {
		t.Fatalf("a server with no cluster state and nothing to join: %v", err)
	}
	_, err = New(context.Background(), Config{Name: "x", Device: dev, Bootstrap: true, Membership: membership.Config{Seeds: []string{"127.0.0.1:1"}},
		Store: store.Options{Dir: t.TempDir()}, Logger: slog.New(slog.DiscardHandler)})
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("bootstrap and seeds together: %v", err)
	}
}
