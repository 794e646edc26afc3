// Raft's connections, carried by the control port: authenticated like any session, and addressed to a server ID.

package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/proto"
)

// Raft addresses are "serverID@host:port": the control address, and the ID
// of the server meant there. The dialer puts the ID in its Hello and the
// server refuses a Hello for another ID, so a server restarted on a reused
// address with an empty data directory never takes Raft traffic (or
// votes) meant for its predecessor.
func raftAddr(id, controlAddr string) string { return id + "@" + controlAddr }

func splitRaftAddr(a string) (id, controlAddr string, err error) {
	id, controlAddr, ok := strings.Cut(a, "@")
	if !ok || id == "" || controlAddr == "" {
		return "", "", fmt.Errorf("server: Raft address %q: want serverID@host:port", a)
	}
	return id, controlAddr, nil
}

// raftStream is raft.StreamLayer over the control listener: the control
// connections whose Hello asked for a Raft session are handed to it, and it
// dials others the same way. Close closes what it accepted, which raft's
// connection handlers wait on.
type raftStream struct {
	local   raftAddrType
	dial    session.Config
	handoff chan net.Conn
	done    chan struct{}

	mu       sync.Mutex
	closed   bool
	accepted map[net.Conn]struct{}
}

type raftAddrType string

func (a raftAddrType) Network() string { return "rkv-raft" }
func (a raftAddrType) String() string  { return string(a) }

func newRaftStream(local string, dial session.Config) *raftStream {
	dial.Kind = proto.SessionRaft
	dial.PD, dial.Device = nil, nil
	return &raftStream{local: raftAddrType(local), dial: dial, handoff: make(chan net.Conn), done: make(chan struct{}), accepted: map[net.Conn]struct{}{}}
}

// offer hands an authenticated Raft connection to the transport; false if
// the stream is closed (the caller closes the connection).
func (r *raftStream) offer(nc net.Conn) bool {
	tc := &trackedConn{Conn: nc, r: r}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return false
	}
	r.accepted[tc] = struct{}{}
	r.mu.Unlock()
	select {
	case r.handoff <- tc:
		return true
	case <-r.done:
		// No handler took it: out of the set Close waits to drain (the
		// caller closes the connection).
		r.mu.Lock()
		delete(r.accepted, tc)
		r.mu.Unlock()
		return false
	}
}

// trackedConn leaves the stream's set when closed.
type trackedConn struct {
	net.Conn
	r    *raftStream
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.r.mu.Lock()
		delete(c.r.accepted, c)
		c.r.mu.Unlock()
	})
	return c.Conn.Close()
}

// Accept waits for the next Raft connection.
func (r *raftStream) Accept() (net.Conn, error) {
	select {
	case nc := <-r.handoff:
		return nc, nil
	case <-r.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept, closes every accepted connection, and waits (up to
// handlerDrain) for raft's handler of each to return, which closes it
// too: a handler may be applying a heartbeat to the log store, which the
// node closes after the transport, and Pebble panics on a closed DB.
func (r *raftStream) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	close(r.done)
	for nc := range r.accepted {
		nc.(*trackedConn).Conn.Close() // the handler's own Close then finds it gone
	}
	r.mu.Unlock()
	deadline := time.Now().Add(handlerDrain)
	for {
		r.mu.Lock()
		left := len(r.accepted)
		r.mu.Unlock()
		switch {
		case left == 0:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("server: %d Raft connection handlers still running %v after their connections closed", left, handlerDrain)
		}
		time.Sleep(time.Millisecond)
	}
}

// handlerDrain bounds how long Close waits for raft's connection handlers.
const handlerDrain = 5 * time.Second

// Addr is this server's Raft address.
func (r *raftStream) Addr() net.Addr { return r.local }

// Dial opens a Raft session to address ("id@host:port").
func (r *raftStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	id, ctl, err := splitRaftAddr(string(address))
	if err != nil {
		return nil, err
	}
	select {
	case <-r.done:
		return nil, errors.New("server: Raft stream closed")
	default:
	}
	cfg := r.dial
	cfg.DialTimeout = timeout
	c, err := session.Dial(context.Background(), ctl, id, cfg)
	if err != nil {
		return nil, err
	}
	_ = c.NC.SetDeadline(time.Time{})
	return c.NC, nil
}
