package server

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// hello opens a control connection from local (an address of 127/8, or
// "" for any), says Hello without a QP, and returns the connection and the
// answer: a HelloReply, or the Error the server turned it away with.
func hello(t *testing.T, s *Server, local string) (net.Conn, proto.Message) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	nc, err := d.Dial("tcp", s.ControlAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := proto.WriteFrame(nc, 1, &proto.Hello{Client: "t", NoQP: true}); err != nil {
		t.Fatal(err)
	}
	_, m, _, err := proto.ReadFrame(nc, nil)
	if err != nil {
		t.Fatalf("Hello from %s: %v", local, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, m
}

// Connections over MaxConnsPerHost from one address, or over MaxConns in
// all, are answered with an Error saying which limit, and closed; a
// connection closed makes room again.
func TestConnectionLimits(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxConnsPerHost, c.MaxConns = 2, 3 })
	if n := s.Stats().Connections; n != 0 {
		t.Fatalf("%d connections open before the test's", n)
	}
	a1, m := hello(t, s, "127.0.0.1")
	if m.Type() != proto.MsgHelloReply {
		t.Fatalf("first connection: %v", m)
	}
	if _, m = hello(t, s, "127.0.0.1"); m.Type() != proto.MsgHelloReply {
		t.Fatalf("second connection: %v", m)
	}
	_, m = hello(t, s, "127.0.0.1")
	if e, ok := m.(*proto.Error); !ok || e.Code != proto.CodeUnavailable || !strings.Contains(e.Message, "127.0.0.1 has 2 control connections open to this server, the limit per host") {
		t.Fatalf("a third connection from 127.0.0.1: %v; want the per-host limit", m)
	}
	if _, m = hello(t, s, "127.0.0.2"); m.Type() != proto.MsgHelloReply {
		t.Fatalf("a connection from another host: %v", m)
	}
	_, m = hello(t, s, "127.0.0.3")
	if e, ok := m.(*proto.Error); !ok || e.Code != proto.CodeUnavailable || !strings.Contains(e.Message, "3 control connections open, its limit") {
		t.Fatalf("a fourth connection in all: %v; want the total limit", m)
	}
	if got := s.Stats().Refused[proto.CodeUnavailable]; got != 2 {
		t.Fatalf("%d refusals counted, want 2", got)
	}
	a1.Close()
	waitFor(t, 5*time.Second, "the closed connection's slot", func() error {
		if n := s.Stats().Connections; n != 2 {
			return fmt.Errorf("%d connections open", n)
		}
		return nil
	})
	if _, m = hello(t, s, "127.0.0.1"); m.Type() != proto.MsgHelloReply {
		t.Fatalf("a connection after one closed: %v", m)
	}
}

// A connection may idle between frames for as long as it likes, but a
// frame begun must arrive within FrameTimeout: a peer trickling one is
// told so and disconnected.
func TestSlowFrameTimesOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s := startServer(t, func(c *Config) { c.FrameTimeout = timeout })
	nc, m := hello(t, s, "")
	if m.Type() != proto.MsgHelloReply {
		t.Fatalf("Hello: %v", m)
	}
	time.Sleep(2 * timeout) // idle: no frame begun
	if err := proto.WriteFrame(nc, 2, &proto.GetMap{}); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, m, _, err := proto.ReadFrame(nc, nil); err != nil || m.Type() != proto.MsgMapReply {
		t.Fatalf("a request after idling: %v, %v", m, err)
	}
	// Half a frame, then nothing.
	frame, err := proto.AppendFrame(nil, 3, &proto.GetMap{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := nc.Write(frame[:len(frame)/2]); err != nil {
		t.Fatal(err)
	}
	id, m, _, err := proto.ReadFrame(nc, nil)
	e, ok := m.(*proto.Error)
	if err != nil || !ok || id != 0 || !strings.Contains(e.Message, "not finished within 300ms") {
		t.Fatalf("after half a frame: %v, %v; want an Error saying the frame timed out", m, err)
	}
	if d := time.Since(start); d < timeout || d > timeout+3*time.Second {
		t.Fatalf("the slow frame was cut after %v, want about %v", d, timeout)
	}
	if _, _, _, err := proto.ReadFrame(nc, nil); err == nil {
		t.Fatal("the connection is still open after the timeout")
	}

	// A whole frame and half the next in one write: the server reads them
	// together, and the half frame is timed from then.
	nc, m = hello(t, s, "")
	if m.Type() != proto.MsgHelloReply {
		t.Fatalf("Hello: %v", m)
	}
	whole, err := proto.AppendFrame(nil, 2, &proto.GetMap{})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if _, err := nc.Write(append(whole, frame[:len(frame)/2]...)); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, m, _, err := proto.ReadFrame(nc, nil); err != nil || m.Type() != proto.MsgMapReply {
		t.Fatalf("the whole frame: %v, %v", m, err)
	}
	id, m, _, err = proto.ReadFrame(nc, nil)
	if e, ok := m.(*proto.Error); err != nil || !ok || id != 0 || !strings.Contains(e.Message, "not finished within 300ms") {
		t.Fatalf("after half a frame read with a whole one: %v, %v; want an Error saying the frame timed out", m, err)
	}
	if d := time.Since(start); d < timeout || d > timeout+3*time.Second {
		t.Fatalf("the slow frame was cut after %v, want about %v", d, timeout)
	}
}
