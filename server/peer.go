// Sessions to other servers for requests (map changes forwarded to the leader, fences, releases), one per peer, reused.

package server

import (
	"context"
	"errors"
	"sync"

	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/proto"
)

// peers keeps one control session (without a QP) to each server this one
// talks to, dialed on first use and again after it breaks. Requests to one
// peer are serialized; to different peers they run in parallel.
type peers struct {
	cfg session.Config

	mu     sync.Mutex
	closed bool
	conns  map[string]*peerConn // by server ID
}

type peerConn struct {
	mu   chan struct{} // a lock a ctx can give up on
	addr string
	c    *session.Conn
}

func newPeers(cfg session.Config) *peers {
	cfg.PD, cfg.Device = nil, nil
	return &peers{cfg: cfg, conns: map[string]*peerConn{}}
}

// errPeersClosed: the server is closing.
var errPeersClosed = errors.New("server: closing")

// call sends req to the server id at its control address addr and returns
// the reply, the server's *proto.Error, or a transport error. A kept
// session that turns out broken is dialed again and the request sent once
// more: every peer request is safe to repeat (map commands that already
// applied are refused or change nothing, replica commits carry their
// idempotency session, fences and releases are idempotent).
func (p *peers) call(ctx context.Context, id, addr string, req proto.Message) (proto.Message, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errPeersClosed
	}
	pc := p.conns[id]
	if pc == nil {
		pc = &peerConn{mu: make(chan struct{}, 1)}
		p.conns[id] = pc
	}
	p.mu.Unlock()
	select {
	case pc.mu <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-pc.mu }()
	for reused := pc.c != nil; ; reused = false {
		if pc.c != nil && (pc.c.Broken() || pc.addr != addr) {
			pc.c.Close()
			pc.c = nil
		}
		if pc.c == nil {
			c, err := session.Dial(ctx, addr, id, p.cfg)
			if err != nil {
				return nil, err
			}
			pc.c, pc.addr = c, addr
		}
		r, err := pc.c.Call(ctx, req)
		// A session kept from before the peer restarted on the same
		// address breaks at its first use: dial the new process once.
		if reused && errors.Is(err, session.ErrBroken) && ctx.Err() == nil {
			continue
		}
		return r, err
	}
}

// close closes every session; calls after it fail.
func (p *peers) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[string]*peerConn{}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.mu <- struct{}{}
		if pc.c != nil {
			pc.c.Close()
		}
		<-pc.mu
	}
}
