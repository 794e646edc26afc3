package session

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// PeerGone tells a server that is there and silent from one that closed
// the connection, without waiting, and leaves a live session usable.
func TestPeerGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hang := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		for range 2 { // the Hello, then one Stats
			id, _, _, err := proto.ReadFrame(nc, nil)
			if err != nil {
				return
			}
			var reply proto.Message = &proto.HelloReply{Server: "s1"}
			if id == 2 {
				reply = &proto.StatsReply{}
			}
			if proto.WriteFrame(nc, id, reply) != nil {
				return
			}
		}
		<-hang
	}()
	c, err := Dial(context.Background(), ln.Addr().String(), "", Config{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if c.PeerGone() {
		t.Fatal("a live, silent server taken for gone")
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("PeerGone took %v", d)
	}
	if _, err := c.Call(context.Background(), &proto.Stats{}); err != nil {
		t.Fatalf("a call after PeerGone: %v", err)
	}
	close(hang)
	<-served
	deadline := time.Now().Add(5 * time.Second)
	for !c.PeerGone() {
		if time.Now().After(deadline) {
			t.Fatal("a server that closed the connection not seen gone within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	if !c.Broken() {
		t.Fatal("a session whose server is gone not marked broken")
	}
}
