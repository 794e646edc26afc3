// Full-state exchanges with the servers, so that a restart or a departure reaches them over TCP, not by gossip alone.

package membership

import (
	"bytes"
	"context"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/memberlist"
)

// maxSyncTargets bounds the servers one syncServers round exchanges state
// with; in a larger cluster the rest learn by gossip from those, and by
// push/pull.
const maxSyncTargets = 8

// maxAnnounceRounds bounds announce's rounds: two suffice (one to deliver
// this node's record, one whose answers show it merged), a third covers a
// refutation caused by the second.
const maxAnnounceRounds = 3

// settle runs after a join, so that the servers hold this node's current
// incarnation.
//
// A node restarted under its name (same address) starts memberlist with a
// low incarnation number, which members still holding its previous
// incarnation, alive, suspect or dead, ignore. Its join shows it that
// record (NotifyMerge notes it in staleSelf), and memberlist refutes it
// with a higher number, but only by gossip: a UDP broadcast sent to
// random members a few times, which can miss a member (the more so when
// dead members not yet detected are among those picked), that then keeps
// the old incarnation, old generation and old control address until a
// push/pull happens to pair it with a member that knows better (15 s to
// minutes). The seed it joined through is the first such member, and
// everyone who joins through it inherits its view.
//
// So settle announces this node's record to the alive servers when the
// join showed an old one, and on a server always, since the seed it
// joined through may have forgotten its previous incarnation when another
// server has not.
func (m *Membership) settle() {
	stale := m.staleSelf.Load()
	if !stale && !m.isServer() {
		return
	}
	if stale {
		m.s.Logger.Log(context.Background(), m.changeLevel(), "the cluster holds a previous incarnation of this node: announcing this one to the servers")
	}
	m.announce(time.Now().Add(maxAnnounceRounds * m.s.ml.TCPTimeout))
}

// announce exchanges full state (memberlist's push/pull, over TCP) with
// the alive servers, in rounds, until their answers show this node's
// current record (or none answers, or deadline passes), and returns how
// many servers the last round tried and how many answered. A server
// sends its answer before it merges what it received, so the first
// round's answers show the record as it was and a second round
// confirms; and an exchange that delivers a refutation can itself show
// an old record elsewhere, and cause another.
func (m *Membership) announce(deadline time.Time) (tried, answered int) {
	for range maxAnnounceRounds {
		m.staleSelf.Store(false)
		round := time.Now().Add(m.s.ml.TCPTimeout)
		if deadline.Before(round) {
			round = deadline
		}
		tried, answered = m.syncServers(round)
		if answered == 0 || !m.staleSelf.Load() || time.Now().After(deadline) {
			return tried, answered
		}
	}
	return tried, answered
}

// syncServers exchanges full state (memberlist's push/pull, over TCP)
// with up to maxSyncTargets alive servers other than this node, chosen at
// random, all at once, and returns how many it tried and how many
// answered by deadline. An
// exchange still running at deadline goes on in the background, bounded by
// Tuning.TCPTimeout; Shutdown waits for it.
func (m *Membership) syncServers(deadline time.Time) (tried, answered int) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return 0, 0
	}
	var targets []string
	for name, mb := range m.members {
		if name != m.name && mb.IsServer() {
			targets = append(targets, mb.Addr.String())
		}
	}
	rand.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	targets = targets[:min(len(targets), maxSyncTargets)]
	m.syncs.Add(len(targets))
	m.mu.Unlock()

	answers := make(chan int, len(targets))
	for _, addr := range targets {
		go func() {
			defer m.syncs.Done()
			// Join is memberlist's one way to push/pull with a given
			// address; with a member it already knows it merges state
			// both ways and nothing else.
			n, err := m.ml.Join([]string{addr})
			if err != nil {
				m.s.Logger.Debug("exchanging state", "with", addr, "err", err)
			}
			answers <- n
		}()
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for range targets {
		select {
		case n := <-answers:
			answered += n
		case <-timer.C:
			return len(targets), answered
		}
	}
	return len(targets), answered
}

// noteRecords looks, in the member list of a node this one joins or
// exchanges state with (or that joins it), for a record of this node, at
// this node's address, that is not its current one: not alive, or with
// other metadata. Such a record is a previous incarnation (or an older
// announcement of this one) that memberlist is about to refute.
func (m *Membership) noteRecords(peers []*memberlist.Node) {
	m.mu.Lock()
	raw := m.localRaw
	var self Member
	if me := m.members[m.name]; me != nil {
		self = *me
	}
	m.mu.Unlock()
	for _, p := range peers {
		if p.Name != m.name || nodeAddr(p) != self.Addr {
			continue // another node, or a name conflict (NotifyConflict)
		}
		if p.State != memberlist.StateAlive || !bytes.Equal(p.Meta, raw) {
			m.staleSelf.Store(true)
		}
	}
}

// NotifyMerge receives the member list of a node this one joins (Join,
// syncServers) or that joins this one, before memberlist merges it. It
// never refuses a merge.
func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	d.m.noteRecords(peers)
	return nil
}

// refreshGap is the least time between two of Refresh's exchanges with one
// member: the retries of a burst of operations share one, and a member's
// record changes no faster.
const refreshGap = 10 * time.Millisecond

// Refresh exchanges full state with the member named name (memberlist's
// push/pull, over TCP), in the background, so that its current record
// reaches this node now rather than by gossip: a gossip round comes every
// GossipInterval (100 ms in ProfileLocal, 200 ms in ProfileLAN) and may
// miss this node. A caller that finds a member's record behind what the
// member itself shows (a server that answers with a newer generation,
// that serves arenas or an index its record does not show yet) calls it
// and tries again shortly. Refresh does not block and is safe for
// concurrent use; a call while an exchange with the same member runs (a
// dead host's lasts up to Tuning.TCPTimeout) or within refreshGap of the
// last, or for a member not in the view, does nothing. The record arrives
// as an EventUpdate, as by gossip.
func (m *Membership) Refresh(name string) {
	m.mu.Lock()
	mb := m.members[name]
	now := time.Now()
	r, seen := m.refreshed[name]
	if m.closed || mb == nil || name == m.name || seen && (r.running || now.Sub(r.at) < refreshGap) {
		m.mu.Unlock()
		return
	}
	m.refreshed[name] = refresh{at: now, running: true}
	addr := mb.Addr.String()
	m.syncs.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.syncs.Done()
		// Join with a member this node knows merges state both ways and
		// nothing else (see syncServers).
		if _, err := m.ml.Join([]string{addr}); err != nil {
			m.s.Logger.Debug("exchanging state", "with", addr, "err", err)
		}
		m.mu.Lock()
		if r, ok := m.refreshed[name]; ok {
			r.running = false
			m.refreshed[name] = r
		}
		m.mu.Unlock()
	}()
}

// refresh is the last of Refresh's exchanges with a member.
type refresh struct {
	at      time.Time
	running bool
}
