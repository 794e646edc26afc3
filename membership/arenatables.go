// The arena-table side channel: arena lists too large for the metadata, pushed and pulled apart from it.

package membership

import (
	"fmt"
	"net"
	"slices"

	"github.com/hashicorp/memberlist"

	"github.com/rkv-io/rkv/proto"
)

// encodeLocal encodes a node's metadata for gossip, with its arena table
// when the list does not fit.
func encodeLocal(name string, meta proto.NodeMeta) ([]byte, *proto.ArenaTable, error) {
	raw, detached, err := proto.EncodeNodeMetaLimit(meta, memberlist.MetaMaxSize)
	if err != nil {
		return nil, nil, fmt.Errorf("membership: %w", err)
	}
	if !detached {
		return raw, nil, nil
	}
	return raw, &proto.ArenaTable{Node: name, Generation: meta.Generation, Arenas: proto.SortArenas(meta.Arenas)}, nil
}

func tablesEqual(a, b *proto.ArenaTable) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Node == b.Node && a.Generation == b.Generation && slices.Equal(a.Arenas, b.Arenas)
}

// push sends the local arena table to the members queued for it, over
// memberlist's reliable (TCP) user messages. Failures are left to
// push/pull anti-entropy.
func (m *Membership) push() {
	m.mu.Lock()
	table := m.localTable
	var targets []*memberlist.Node
	for name, mb := range m.members {
		_, queued := m.pushTo[name]
		if name != m.name && mb.State == StateAlive && (m.pushAll || queued) {
			targets = append(targets, &memberlist.Node{Name: name, Addr: net.IP(mb.Addr.Addr().AsSlice()), Port: mb.Addr.Port()})
		}
	}
	m.pushAll = false
	clear(m.pushTo)
	m.mu.Unlock()
	if table == nil || len(targets) == 0 || m.pushDisabled.Load() {
		return
	}
	msg, err := encodeTables([]proto.ArenaTable{*table})
	if err != nil {
		m.s.Logger.Error("encoding the arena table", "err", err)
		return
	}
	for _, n := range targets {
		select {
		case <-m.stop:
			return
		default:
		}
		if err := m.ml.SendReliable(n, msg); err != nil {
			m.s.Logger.Debug("pushing the arena table", "to", n.Name, "err", err)
		}
	}
}

// Messages between delegates start with a type byte.
const msgArenaTables byte = 1

func encodeTables(tables []proto.ArenaTable) ([]byte, error) {
	b, err := proto.EncodeArenaTables(tables)
	if err != nil {
		return nil, err
	}
	return append([]byte{msgArenaTables}, b...), nil
}

// attachArenasLocked gives mb, whose metadata carries only its arena
// list's summary, the list: this node's own table, or a pending one that
// matches; failing both, it sets ArenasPending and keeps the list of old,
// mb's previous metadata, if that was of the same generation. The caller
// holds mu.
func (m *Membership) attachArenasLocked(mb *Member, old proto.NodeMeta) {
	meta := &mb.Meta
	if mb.Name == m.name {
		if t := m.localTable; t != nil && t.Matches(meta) {
			mb.Meta.Arenas = t.Arenas
			return
		}
	}
	for _, t := range m.pending[mb.Name] {
		if t.Matches(meta) {
			mb.Meta.Arenas = t.Arenas
			delete(m.pending, mb.Name)
			return
		}
	}
	mb.ArenasPending = true
	if old.Role == meta.Role && old.Generation == meta.Generation {
		mb.Meta.Arenas = old.Arenas
	}
}

// maxPending is how many unmatched arena tables are kept per member: a
// relayed stale table must not push out the one the next metadata needs.
const maxPending = 4

func (m *Membership) keepPendingLocked(t proto.ArenaTable) {
	p := m.pending[t.Node]
	for _, x := range p {
		if tablesEqual(&x, &t) {
			return
		}
	}
	p = append([]proto.ArenaTable{t}, p[:min(len(p), maxPending-1)]...)
	m.pending[t.Node] = p
}

// mergeTables applies arena tables received from another node. Each is
// checked against the metadata memberlist delivered for its node; one
// that matches no metadata yet is kept (one per member) for the metadata
// it probably precedes. Tables of nodes unknown here are dropped: push/pull
// brings them back.
func (m *Membership) mergeTables(b []byte, from string) {
	if len(b) == 0 || b[0] != msgArenaTables {
		m.s.Logger.Debug("unknown gossip message", "from", from, "bytes", len(b))
		return
	}
	tables, err := proto.DecodeArenaTables(b[1:])
	if err != nil {
		m.s.Logger.Debug("bad arena tables", "from", from, "err", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for _, t := range tables {
		mb := m.members[t.Node]
		if t.Node == m.name || mb == nil {
			continue
		}
		switch {
		case mb.MetaErr != nil || !t.Matches(&mb.Meta):
			m.keepPendingLocked(t)
		case mb.ArenasPending:
			mb.Meta.Arenas, mb.ArenasPending = t.Arenas, false
			delete(m.pending, t.Node)
			m.publishLocked(EventUpdate, *mb)
		}
	}
}

// localState returns the arena tables this node has: its own and every
// alive member's, for push/pull.
func (m *Membership) localState() []byte {
	m.mu.Lock()
	var tables []proto.ArenaTable
	for name, mb := range m.members {
		if mb.State == StateAlive && mb.MetaErr == nil && mb.Meta.Detached() && !mb.ArenasPending {
			tables = append(tables, proto.ArenaTable{Node: name, Generation: mb.Meta.Generation, Arenas: mb.Meta.Arenas})
		}
	}
	m.mu.Unlock()
	if len(tables) == 0 {
		return nil
	}
	b, err := encodeTables(tables)
	if err != nil {
		m.s.Logger.Error("encoding arena tables", "err", err)
		return nil
	}
	return b
}

// NotifyMsg receives a user message (an arena table pushed by a server).
// memberlist reuses buf after the call: it is decoded, not kept.
func (d *delegate) NotifyMsg(buf []byte) { d.m.mergeTables(buf, "message") }

// GetBroadcasts returns nothing: arena tables are too large for gossip
// packets and go by push and push/pull instead.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState returns the arena tables this node knows, for a push/pull
// exchange or a join. memberlist sends the slice and drops it.
func (d *delegate) LocalState(join bool) []byte { return d.m.localState() }

// MergeRemoteState receives the other side's LocalState after memberlist
// merged its member list, so the tables' nodes are known. buf is decoded,
// not kept.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) > 0 {
		d.m.mergeTables(buf, "push/pull")
	}
}
