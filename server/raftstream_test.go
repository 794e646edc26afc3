package server

import (
	"net"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/session"
)

// Close returns only once the handler of every accepted connection has
// closed it: a handler still applying a heartbeat would otherwise write to
// the log store the node closes next.
func TestRaftStreamCloseWaitsForHandlers(t *testing.T) {
	r := newRaftStream("n1@127.0.0.1:1", session.Config{})
	a, b := net.Pipe()
	defer b.Close()
	offered := make(chan bool, 1)
	go func() { offered <- r.offer(a) }()
	conn, err := r.Accept() // as raft's transport does, handing it to a handler
	if err != nil {
		t.Fatal(err)
	}
	if !<-offered {
		t.Fatal("offer refused with the stream open")
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while the connection's handler was still running", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := conn.Close(); err != nil { // the handler returns
		t.Logf("the handler's Close: %v", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waiting after the handler closed its connection")
	}
	// A connection offered after Close is refused, and not waited for.
	c, d := net.Pipe()
	defer d.Close()
	if r.offer(c) {
		t.Fatal("offer accepted a connection after Close")
	}
	c.Close()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}
