package server

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// A control listener on every interface is advertised with the gossip
// address's host, which clients can dial, never as 0.0.0.0; with the
// gossip address unspecified too, New refuses to start.
func TestControlAddrOnEveryInterface(t *testing.T) {
	s := startServer(t, func(c *Config) {
		c.ControlAddr = "0.0.0.0:0"
		c.Membership.BindAddr = "127.0.0.1"
	})
	host, _, err := net.SplitHostPort(s.Meta().ControlAddr)
	if err != nil || host != "127.0.0.1" || s.ControlAddr() != s.Meta().ControlAddr {
		t.Fatalf("advertised control address %q (ControlAddr %q), want 127.0.0.1:PORT", s.Meta().ControlAddr, s.ControlAddr())
	}
	if mb, ok := s.Membership().View().Member(s.Name()); !ok || mb.Meta.ControlAddr != s.ControlAddr() {
		t.Fatalf("gossip carries %q, want %q", mb.Meta.ControlAddr, s.ControlAddr())
	}
	// What is advertised answers a Hello.
	nc := dial(t, s)
	if err := proto.WriteFrame(nc, 1, &proto.Hello{Client: "t", NoQP: true}); err != nil {
		t.Fatal(err)
	}
	if _, m, _, err := proto.ReadFrame(nc, nil); err != nil || m.Type() != proto.MsgHelloReply {
		t.Fatalf("Hello to the advertised address: %v, %v", m, err)
	}

	for _, ctl := range []string{"0.0.0.0:0", "[::]:0"} {
		_, err = New(context.Background(), Config{Name: "x", Device: testDevice(t), Bootstrap: true, ControlAddr: ctl,
			Membership: membership.Config{BindAddr: "0.0.0.0"}, Store: store.Options{Dir: t.TempDir()}, Logger: slog.New(slog.DiscardHandler)})
		if err == nil || !strings.Contains(err.Error(), "every interface") || !strings.Contains(err.Error(), "AdvertiseAddr") {
			t.Fatalf("control %s and gossip on every interface: %v; want a refusal saying what to set", ctl, err)
		}
	}
	got, err := advertisedControlAddr("[::]:7950", membership.Config{AdvertiseAddr: "10.0.0.7", BindAddr: "0.0.0.0"})
	if err != nil || got != "10.0.0.7:7950" {
		t.Fatalf("with an advertise address: %q, %v", got, err)
	}
	if got, err := advertisedControlAddr("10.0.0.8:7950", membership.Config{BindAddr: "0.0.0.0"}); err != nil || got != "10.0.0.8:7950" {
		t.Fatalf("a specific listener: %q, %v", got, err)
	}
}
