// Map: an immutable cluster map and the questions placement asks it.

package clustermap

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rkv-io/rkv/proto"
)

// Map is one epoch of the cluster map. It is immutable and safe for
// concurrent use; Apply makes the next one. The zero epoch is the empty
// map of a cluster not bootstrapped yet: no servers, no shards.
type Map struct {
	pm     proto.ClusterMap
	byName map[string]int
}

// Empty is the map before the first server bootstraps the cluster.
var Empty = &Map{pm: proto.ClusterMap{Replicas: 1}, byName: map[string]int{}}

// Server is one server of the map.
type Server = proto.MapServer

// Shard is one shard's assignment, with server names.
type Shard struct {
	Owners []string // the replicas, primary first
	Since  uint64   // the epoch that made Owners[0] the primary: its shard word while it serves
	Origin uint64   // the primary's origin: the Started of the move it copied the shard in by; 0: it got it empty
	// Origins are every owner's, parallel to Owners (Origins[0] is
	// Origin).
	Origins []uint64
	Move    *Move // nil, or the move in progress
}

// Owner is the shard's primary.
func (s Shard) Owner() string { return s.Owners[0] }

// Move is a shard's move in progress.
type Move struct {
	Shard proto.Shard
	Kind  proto.MoveKind
	// From is the owner the move is about: the one a replacement
	// replaces, the primary otherwise (that an added replica copies from,
	// that a promotion demotes).
	From    string
	To      string
	Phase   proto.MovePhase
	Started uint64
}

// Command returns the move command naming m.
func (m Move) Command() proto.MoveCommand {
	return proto.MoveCommand{Shard: m.Shard, Kind: m.Kind, From: m.From, To: m.To, Started: m.Started}
}

// FromProto makes a Map of a decoded map, after checking it.
func FromProto(pm *proto.ClusterMap) (*Map, error) {
	if err := pm.Validate(); err != nil {
		return nil, err
	}
	m := &Map{pm: *pm, byName: make(map[string]int, len(pm.Servers))}
	for i, s := range pm.Servers {
		m.byName[s.Name] = i
	}
	return m, nil
}

// Decode decodes an encoded map (proto.EncodeClusterMap).
func Decode(b []byte) (*Map, error) {
	pm, err := proto.DecodeClusterMap(b)
	if err != nil {
		return nil, err
	}
	return FromProto(pm)
}

// Encode encodes the map.
func (m *Map) Encode() ([]byte, error) { return proto.EncodeClusterMap(&m.pm) }

// Epoch is the map's epoch: 0 for Empty, one more at every change.
func (m *Map) Epoch() uint64 { return m.pm.Epoch }

// ClusterID identifies the cluster (0 for Empty).
func (m *Map) ClusterID() uint64 { return m.pm.ClusterID }

// Bootstrapped reports whether the map assigns the shards yet.
func (m *Map) Bootstrapped() bool { return len(m.pm.Shards) != 0 }

// Servers returns the map's servers, sorted by name, as a new slice.
func (m *Map) Servers() []Server { return slices.Clone(m.pm.Servers) }

// Server returns the server called name.
func (m *Map) Server(name string) (Server, bool) {
	i, ok := m.byName[name]
	if !ok {
		return Server{}, false
	}
	return m.pm.Servers[i], true
}

// Member reports whether name is a server of the map that was not removed.
func (m *Map) Member(name string) bool {
	s, ok := m.Server(name)
	return ok && s.State != proto.ServerRemoved
}

// ServerByID returns the server whose data directory has id.
func (m *Map) ServerByID(id string) (Server, bool) {
	for _, s := range m.pm.Servers {
		if s.ID == id {
			return s, true
		}
	}
	return Server{}, false
}

// Shard returns shard s's assignment. It panics on a map that is not
// bootstrapped or a shard out of range, as indexing would.
func (m *Map) Shard(s proto.Shard) Shard {
	sh := &m.pm.Shards[s]
	out := Shard{Owners: make([]string, len(sh.Owners)), Since: sh.Since, Origin: sh.Origins[0], Origins: slices.Clone(sh.Origins)}
	for i, o := range sh.Owners {
		out.Owners[i] = m.pm.Servers[o].Name
	}
	out.Move = m.move(s)
	return out
}

// Holders is the number of servers shard s has a replica on: 1 without
// backups. Unlike Shard, it allocates nothing.
func (m *Map) Holders(s proto.Shard) int { return len(m.pm.Shards[s].Owners) }

// move is shard s's move, nil when none.
func (m *Map) move(s proto.Shard) *Move {
	mv := m.pm.Shards[s].Move
	if mv == nil {
		return nil
	}
	return &Move{Shard: s, Kind: mv.Kind, From: m.pm.Servers[mv.From].Name, To: m.pm.Servers[mv.To].Name, Phase: mv.Phase, Started: mv.Started}
}

// Replicas is how many copies of each shard the cluster keeps, where it
// has that many servers.
func (m *Map) Replicas() int { return m.pm.Replicas }

// Owner returns the name of shard s's primary, and the epoch since which
// it owns it; "" before the bootstrap.
func (m *Map) Owner(s proto.Shard) (name string, since uint64) {
	if !m.Bootstrapped() {
		return "", 0
	}
	sh := &m.pm.Shards[s]
	return m.pm.Servers[sh.Owners[0]].Name, sh.Since
}

// Owned returns the shards whose primary is name, in order.
func (m *Map) Owned(name string) []proto.Shard {
	i, ok := m.byName[name]
	if !ok {
		return nil
	}
	var out []proto.Shard
	for s, sh := range m.pm.Shards {
		if int(sh.Owners[0]) == i {
			out = append(out, proto.Shard(s))
		}
	}
	return out
}

// Holds returns how many shards name holds a replica of.
func (m *Map) Holds(name string) int {
	i, ok := m.byName[name]
	if !ok {
		return 0
	}
	n := 0
	for _, sh := range m.pm.Shards {
		if slices.Contains(sh.Owners, uint16(i)) {
			n++
		}
	}
	return n
}

// Moves returns the moves in progress, by shard.
func (m *Map) Moves() []Move {
	var out []Move
	for s := range m.pm.Shards {
		if mv := m.move(proto.Shard(s)); mv != nil {
			out = append(out, *mv)
		}
	}
	return out
}

// Counts returns how many shards each server is primary of (servers with
// none included, at 0).
func (m *Map) Counts() map[string]int {
	out := make(map[string]int, len(m.pm.Servers))
	for _, s := range m.pm.Servers {
		out[s.Name] = 0
	}
	for _, sh := range m.pm.Shards {
		out[m.pm.Servers[sh.Owners[0]].Name]++
	}
	return out
}

// String summarizes the map for logs: epoch, servers with their shard
// counts, moves.
func (m *Map) String() string {
	if !m.Bootstrapped() {
		return fmt.Sprintf("epoch %d, not bootstrapped", m.Epoch())
	}
	counts := m.Counts()
	parts := make([]string, 0, len(m.pm.Servers))
	for _, s := range m.pm.Servers {
		p := fmt.Sprintf("%s:%d", s.Name, counts[s.Name])
		if s.State != proto.ServerActive {
			p += "(" + s.State.String() + ")"
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("epoch %d, shards %s, %d moving", m.Epoch(), strings.Join(parts, " "), len(m.Moves()))
}
