// Sessions to other servers for requests (replica forwards, map changes forwarded to the leader, fences, releases), a few per peer, reused.

package server

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/proto"
)

// peers keeps sessions to each server this one talks to, dialed on first
// use and again after they break: up to maxPeerSessions to one peer, so
// that the forwards of concurrent client writes reach a backup together
// (where its commit loop applies them in one batch) rather than one round
// trip after another. Sessions carry control requests only, unless cfg
// has a PD and QPCalls: then each has QPs, and what the peer takes on its
// write QP (a replica's commits and deletes) goes there, a SEND each way
// instead of a control round trip.
type peers struct {
	cfg session.Config

	mu     sync.Mutex
	closed bool
	conns  map[string]*peerConns // by server ID
}

// maxPeerSessions bounds the sessions to one peer, so the requests in
// flight to it: a call beyond it waits for one to end.
const maxPeerSessions = 8

// peerConns is the sessions to one peer.
type peerConns struct {
	slots chan struct{} // one per call in flight; a ctx can give up waiting

	mu   sync.Mutex
	idle []*session.Conn
}

func newPeers(cfg session.Config) *peers {
	return &peers{cfg: cfg, conns: map[string]*peerConns{}}
}

// errPeersClosed: the server is closing.
var errPeersClosed = errors.New("server: closing")

// call sends req to the server id at its control address addr and returns
// the reply, the server's *proto.Error, or a transport error. A kept
// session that turns out broken is dialed again and the request sent once
// more: every peer request is safe to repeat (map commands that already
// applied are refused or change nothing, replica commits carry their
// idempotency session, fences and releases are idempotent). Calls to one
// peer run in parallel, up to maxPeerSessions; call is safe for
// concurrent use.
func (p *peers) call(ctx context.Context, id, addr string, req proto.Message) (proto.Message, error) {
	pc, err := p.slot(ctx, id)
	if err != nil {
		return nil, err
	}
	defer func() { <-pc.slots }()
	c := pc.take(addr)
	defer func() { p.put(pc, c) }()
	for reused := c != nil; ; reused = false {
		if c == nil {
			var err error
			if c, err = session.Dial(ctx, addr, id, p.cfg); err != nil {
				return nil, err
			}
		}
		r, err := p.send(ctx, c, req)
		// A session kept from before the peer restarted on the same
		// address breaks at its first use: dial the new process once.
		if reused && errors.Is(err, session.ErrBroken) && ctx.Err() == nil {
			c.Close()
			c = nil
			continue
		}
		return r, err
	}
}

// slot takes one of the call slots of the server id, waiting while all
// are taken; the caller gives it back (<-pc.slots).
func (p *peers) slot(ctx context.Context, id string) (*peerConns, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errPeersClosed
	}
	pc := p.conns[id]
	if pc == nil {
		pc = &peerConns{slots: make(chan struct{}, maxPeerSessions)}
		p.conns[id] = pc
	}
	p.mu.Unlock()
	select {
	case pc.slots <- struct{}{}:
		return pc, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// peerRequest is one request of a callEach: req for the server ID at its
// control address Addr.
type peerRequest struct {
	ID, Addr string
	Req      proto.Message
}

// callEach sends each request as call does, but every one before it
// waits for any reply, all from the calling goroutine: a primary's
// forward to its backups costs one wait, not a goroutine and a wait per
// backup. It returns each request's error, in order (the replies, which
// a forward does not need, are dropped); safe for concurrent use.
func (p *peers) callEach(ctx context.Context, reqs []peerRequest) []error {
	errs := make([]error, len(reqs))
	if len(reqs) == 0 {
		return errs
	}
	if p.cfg.QPCalls || len(reqs) == 1 {
		// A call on a QP waits on the session's own CQ: one goroutine
		// each.
		var wg sync.WaitGroup
		for i := range reqs[1:] {
			r := &reqs[i+1]
			wg.Go(func() { _, errs[i+1] = p.call(ctx, r.ID, r.Addr, r.Req) })
		}
		_, errs[0] = p.call(ctx, reqs[0].ID, reqs[0].Addr, reqs[0].Req)
		wg.Wait()
		return errs
	}
	type sent struct {
		pc      *peerConns
		c       *session.Conn
		reused  bool
		pending session.Pending
		ok      bool
	}
	out := make([]sent, len(reqs))
	// Slots are taken in the order of the peers' IDs: two callers taking
	// them in other orders could each hold the last slot the other waits
	// for.
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(reqs[a].ID, reqs[b].ID) })
	for _, i := range order {
		r, o := &reqs[i], &out[i]
		if o.pc, errs[i] = p.slot(ctx, r.ID); errs[i] != nil {
			continue
		}
		if o.c = o.pc.take(r.Addr); o.c != nil {
			o.reused = true
		} else if o.c, errs[i] = session.Dial(ctx, r.Addr, r.ID, p.cfg); errs[i] != nil {
			continue
		}
		o.pending, errs[i] = o.c.Send(ctx, r.Req)
		o.ok = errs[i] == nil
	}
	for i := range out {
		if out[i].ok {
			_, errs[i] = out[i].pending.Reply()
		}
	}
	for i := range out {
		o := &out[i]
		if o.pc == nil {
			continue
		}
		// As in call: a kept session that broke is dialed again once.
		again := o.reused && errors.Is(errs[i], session.ErrBroken) && ctx.Err() == nil
		if again {
			o.c.Close()
			o.c = nil
		}
		p.put(o.pc, o.c)
		<-o.pc.slots
		if again {
			_, errs[i] = p.call(ctx, reqs[i].ID, reqs[i].Addr, reqs[i].Req)
		}
	}
	return errs
}

// send sends req on c's write QP when it can go there, else as a control
// request.
func (p *peers) send(ctx context.Context, c *session.Conn, req proto.Message) (proto.Message, error) {
	if p.cfg.QPCalls {
		switch req.(type) {
		case *proto.ReplicaCommit, *proto.ReplicaDelete:
			r, err := c.CallOnQP(ctx, req)
			if !errors.Is(err, session.ErrNoQPCall) {
				return r, err
			}
		}
	}
	return c.Call(ctx, req)
}

// take returns an idle session to addr, or nil (dial one), closing the
// idle sessions that broke or lead to an address the peer left.
func (pc *peerConns) take(addr string) *session.Conn {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for len(pc.idle) > 0 {
		c := pc.idle[len(pc.idle)-1]
		pc.idle = pc.idle[:len(pc.idle)-1]
		if !c.Broken() && c.Addr() == addr {
			return c
		}
		c.Close()
	}
	return nil
}

// put keeps session c (nil: none) for the next call, unless it broke or
// the peers are closed.
func (p *peers) put(pc *peerConns, c *session.Conn) {
	if c == nil {
		return
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed || c.Broken() {
		c.Close()
		return
	}
	pc.mu.Lock()
	pc.idle = append(pc.idle, c)
	pc.mu.Unlock()
}

// close closes every session, waiting for the calls in flight; calls
// after it fail.
func (p *peers) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[string]*peerConns{}
	p.mu.Unlock()
	for _, pc := range conns {
		for range maxPeerSessions {
			pc.slots <- struct{}{}
		}
		pc.mu.Lock()
		for _, c := range pc.idle {
			c.Close()
		}
		pc.idle = nil
		pc.mu.Unlock()
	}
}
