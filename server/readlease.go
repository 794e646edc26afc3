// Read leases: a primary's one-sided reads are trusted only while the map's leader promises to fail none of its shards over.

package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
)

// A read lease is what lets a client trust a one-sided READ of a primary
// that may, unknown to it, have been deposed: a paused or partitioned
// primary keeps its records live, and a NIC answers READs of a stopped
// process. The map's leader grants each server a lease of ReadLease,
// counted by the server from before it asked, and fails the server's
// shards over only once the lease has ended by the leader's clock plus
// MaxClockDrift (or the server's process is known gone). A client asks the
// server what is left of its lease and trusts a READ only if it completed
// before the time it asked plus that. So a READ is trusted only while no
// backup can have been promoted, provided clocks tick at rates that differ
// by less than MaxClockDrift over a lease (docs/ARCHITECTURE.md, "Read
// leases").

// readLease is this server's own lease, as the leader granted it.
type readLease struct {
	mu sync.Mutex
	// grants are the unexpired grants, by rising end and epoch. The
	// newest may name an epoch the server's shards do not reflect yet
	// (the map changes often while shards move); an older one serves
	// meanwhile.
	grants []leaseGrant
	closed bool // the server is closing: it serves no lease again
	lapsed bool // logged as lapsed, and not renewed since
	// noRenew, set by tests, stops the renewals (Isolate).
	noRenew atomic.Bool
}

// leaseGrants is the leader's record of the leases it granted.
type leaseGrants struct {
	// mu is held by a grant from its record to its reply's epoch, and by a
	// failover or forced removal from its check of the lease to the
	// commit: so a server granted a lease meanwhile is either seen as
	// holding it, or gets the map that took its shards, which it must
	// apply before it serves the lease.
	mu      sync.Mutex
	since   time.Time            // when this server began to lead; zero while it does not
	granted map[string]time.Time // by server ID: when the last renewal request arrived
}

// leaseGrant is one grant of a read lease.
type leaseGrant struct {
	until time.Time // local, monotonic: from before the request was sent
	epoch uint64    // the leader's map epoch at the grant
}

// leaseLeft is what is left of this server's read lease: of the latest
// grant whose map its shards reflect; zero when there is none.
func (s *Server) leaseLeft() time.Duration {
	l := &s.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.left(s.saved.Load().Epoch())
}

// left is what is left of the latest grant at an epoch up to applied.
// Call it with l.mu held.
func (l *readLease) left(applied uint64) time.Duration {
	if l.closed {
		return 0
	}
	var left time.Duration
	for _, g := range l.grants {
		if g.epoch <= applied {
			left = max(left, time.Until(g.until))
		}
	}
	return left
}

// add records a grant, and forgets those that ended or that it outlasts
// at no later epoch. Call it with l.mu held.
func (l *readLease) add(g leaseGrant) {
	now := time.Now()
	kept := l.grants[:0]
	for _, o := range l.grants {
		if o.until.After(now) && !(o.epoch >= g.epoch && !o.until.After(g.until)) {
			kept = append(kept, o)
		}
	}
	l.grants = append(kept, g)
}

// until is the end of the latest grant. Call it with l.mu held.
func (l *readLease) until() time.Time {
	var u time.Time
	for _, g := range l.grants {
		if g.until.After(u) {
			u = g.until
		}
	}
	return u
}

// endReadLease stops serving the lease: the server is closing.
func (s *Server) endReadLease() {
	s.lease.mu.Lock()
	s.lease.closed = true
	s.lease.mu.Unlock()
}

// renewReadLease keeps this server's read lease: it asks the leader every
// quarter of the lease, and every 100 ms while a request fails.
func (s *Server) renewReadLease() {
	defer s.wg.Done()
	for {
		wait := 100 * time.Millisecond
		if s.lease.noRenew.Load() {
			select {
			case <-s.stop:
				return
			case <-time.After(wait):
			}
			continue
		}
		asked := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ReadLease/2)
		r, err := s.askReadLease(ctx)
		cancel()
		l := &s.lease
		l.mu.Lock()
		switch {
		case err == nil:
			l.add(leaseGrant{until: asked.Add(r.TTL), epoch: r.Epoch})
			if l.lapsed {
				s.log.Info("read lease renewed", "epoch", r.Epoch)
				l.lapsed = false
			}
			wait = s.cfg.ReadLease / 4
		case time.Now().After(l.until()) && !l.lapsed && len(l.grants) > 0:
			s.log.Warn("read lease lapsed: clients trust no read of this server's shards until the map's leader renews it", "err", err)
			l.lapsed = true
		}
		l.mu.Unlock()
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
	}
}

// askReadLease asks the map's leader (this server, when it leads) for a
// read lease.
func (s *Server) askReadLease(ctx context.Context) (*proto.ReadLeaseReply, error) {
	if s.node.IsLeader() {
		return s.grantReadLease(&proto.RenewReadLease{ServerID: s.id})
	}
	id, addr := s.node.Leader()
	if id == "" {
		return nil, errors.New("no map leader known")
	}
	lid, ctl, err := splitRaftAddr(addr)
	if err != nil {
		return nil, err
	}
	if lid == s.id {
		return nil, errors.New("this server's replica names it the leader, but it does not lead")
	}
	r, err := s.peers.call(ctx, lid, ctl, &proto.RenewReadLease{ServerID: s.id})
	if err != nil {
		return nil, err
	}
	return r.(*proto.ReadLeaseReply), nil
}

// grantReadLease is the leader's answer to a renewal: the grant recorded
// first (a recorded grant that is never answered only delays a failover),
// then the leadership confirmed with a quorum, so that a leader elected
// since, which knows nothing of this grant, was elected after the request
// arrived and waits out a full lease from then.
func (s *Server) grantReadLease(req *proto.RenewReadLease) (*proto.ReadLeaseReply, error) {
	g := &s.grants
	g.mu.Lock()
	if !s.node.IsLeader() {
		g.mu.Unlock()
		return nil, &proto.Error{Code: proto.CodeNotLeader, Message: "read lease: not the map's leader"}
	}
	if g.granted == nil {
		g.granted = map[string]time.Time{}
	}
	g.granted[req.ServerID] = time.Now()
	epoch := s.node.Map().Epoch()
	g.mu.Unlock()
	if err := s.node.VerifyLeader(); err != nil {
		return nil, &proto.Error{Code: proto.CodeNotLeader, Message: fmt.Sprintf("read lease: %v", err)}
	}
	return &proto.ReadLeaseReply{TTL: s.cfg.ReadLease, Epoch: epoch}, nil
}

// renewReadLeaseReply is grantReadLease as a request handler.
func (s *Server) renewReadLeaseReply(req *proto.RenewReadLease) proto.Message {
	r, err := s.grantReadLease(req)
	if err != nil {
		return err.(*proto.Error)
	}
	return r
}

// leaseEnds is when, by this leader's clock, the read lease of the server
// with data directory ID id has surely ended: a full lease and the drift
// after its last grant, or after this server began to lead (a grant of an
// earlier leader is unknown to it; while it has not begun, from now).
// Call it with g.mu held.
func (s *Server) leaseEnds(id string) time.Time {
	g := &s.grants
	from := g.since
	if from.IsZero() {
		from = time.Now()
	}
	if t := g.granted[id]; t.After(from) {
		from = t
	}
	return from.Add(s.cfg.ReadLease + s.cfg.MaxClockDrift)
}

// leaseLeftAtLeader is how long the leader still counts the read lease of
// the server named name in map m as held: zero when it has ended, or the
// server's process is known gone.
func (s *Server) leaseLeftAtLeader(m *clustermap.Map, name string) time.Duration {
	srv, ok := m.Server(name)
	if !ok || s.processGone(name) {
		return 0
	}
	s.grants.mu.Lock()
	defer s.grants.mu.Unlock()
	return max(time.Until(s.leaseEnds(srv.ID)), 0)
}

// startLeading records when this server began to lead, for leaseEnds.
func (s *Server) startLeading() {
	s.grants.mu.Lock()
	s.grants.since = time.Now()
	s.grants.mu.Unlock()
}

// stopLeading forgets that this server leads: a later term starts afresh.
func (s *Server) stopLeading() {
	s.grants.mu.Lock()
	s.grants.since = time.Time{}
	s.grants.mu.Unlock()
}

// proposeLocal proposes c to this server's replica (the leader's). A
// change that takes shards from their primary without its consent (a
// failover, a forced removal) waits first, up to ctx, for the read lease
// of each primary it deposes to end, unless its process is known gone.
func (s *Server) proposeLocal(ctx context.Context, c *proto.MapCommand) (*clustermap.Map, error) {
	g := &s.grants
	for {
		g.mu.Lock()
		var wait time.Duration
		for _, srv := range deposed(s.node.Map(), c) {
			if !s.processGone(srv.Name) {
				wait = max(wait, time.Until(s.leaseEnds(srv.ID)))
			}
		}
		if wait <= 0 {
			m, err := s.node.Propose(ctx, c)
			g.mu.Unlock()
			return m, err
		}
		g.mu.Unlock()
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			return nil, fmt.Errorf("%w: %v would wait %v for it", errLeaseHeld, c.Op, wait.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// errLeaseHeld: a change that deposes a primary waits for its read lease
// to end.
var errLeaseHeld = errors.New("server: a deposed primary's read lease holds")

// deposed lists the servers change c would take primaries from without
// their consent, in map m: a failover's sources, and a server removed by
// force while primary of a shard with a backup (without one, the shard
// starts empty, and its keys are lost anyway).
func deposed(m *clustermap.Map, c *proto.MapCommand) []clustermap.Server {
	names := map[string]bool{}
	switch {
	case c.Op == proto.MapFailOver:
		for _, mv := range c.Moves {
			names[mv.From] = true
		}
	case c.Op == proto.MapRemoveServer && c.Force:
		for i := range proto.NumShards {
			if info := m.Shard(proto.Shard(i)); len(info.Owners) > 1 && info.Owner() == c.Server.Name {
				names[c.Server.Name] = true
				break
			}
		}
	}
	var out []clustermap.Server
	for name := range names {
		if srv, ok := m.Server(name); ok {
			out = append(out, srv)
		}
	}
	return out
}

// processGone reports whether the leader's process watch knows the named
// server's process gone (it can serve no READ).
func (s *Server) processGone(name string) bool {
	w := s.watch.Load()
	if w == nil {
		return false
	}
	_, gone := w.goneSince(name)
	return gone
}
