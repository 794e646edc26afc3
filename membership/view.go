package membership

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// State is a member's state as this node sees it.
type State uint8

// States. memberlist also has a "suspect" state (probes failed, the node
// may yet refute), but v0.7.0 does not expose it: its EventDelegate has no
// suspect callback, and Members() returns pointers into records it mutates
// under its own lock. A suspect member therefore stays StateAlive here
// until memberlist declares it dead.
const (
	StateAlive State = iota + 1
	StateDead        // failed: stopped answering probes
	StateLeft        // left on purpose (Leave)
)

func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Member is one node of a View.
type Member struct {
	Name  string
	Addr  netip.AddrPort // gossip address
	State State
	Since time.Time // when this node saw State begin

	// Meta is the member's decoded metadata. When its arena list
	// travels detached (Meta.ArenaSet), Meta.Arenas is the list received
	// out of band. The slices are shared by every copy of the view: read
	// them, never modify them.
	Meta proto.NodeMeta

	// ArenasPending is set while a detached arena list that matches
	// Meta.ArenaSet has not arrived. Meta.Arenas is then the last list
	// received for the same Meta.Generation (whose rkeys are still valid:
	// they change only with the generation), or nil.
	ArenasPending bool

	// MetaErr is set when the metadata could not be decoded (corrupt, or
	// of another proto.MetaVersion); Meta is then zero and the member is
	// never placed.
	MetaErr error
}

// IsServer reports whether placement may choose m: an alive server whose
// metadata decoded.
func (m *Member) IsServer() bool {
	return m.State == StateAlive && m.MetaErr == nil && m.Meta.Role == proto.RoleServer
}

func (m Member) String() string {
	role := "?"
	if m.MetaErr == nil {
		role = m.Meta.Role.String()
	}
	return fmt.Sprintf("%s(%s %s %s)", m.Name, role, m.Addr, m.State)
}

// View is an immutable snapshot of the cluster as one node sees it. Every
// change makes a new View with Version one higher; versions are local to
// the node and mean nothing to other nodes. A View is safe for concurrent
// use.
type View struct {
	version uint64
	members []Member // sorted by name
	servers []int    // indexes of the members that IsServer, sorted by name
}

func newView(version uint64, members []Member) *View {
	v := &View{version: version, members: members}
	slices.SortFunc(v.members, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	for i := range v.members {
		if v.members[i].IsServer() {
			v.servers = append(v.servers, i)
		}
	}
	return v
}

// NewView makes a View of members, for a view learnt elsewhere than from
// this node's own gossip (a client that does not join gossip builds its
// view from a server's answer, proto.ViewReply). version numbers it, as
// Version reports; the members are copied, and IsServer decides which of
// them Servers returns, as in a gossip view.
func NewView(version uint64, members []Member) *View {
	return newView(version, slices.Clone(members))
}

// Version is the view's number, one more than the view it replaced.
func (v *View) Version() uint64 { return v.version }

// Len is the number of members, in any state.
func (v *View) Len() int { return len(v.members) }

// Members returns the members in any state, sorted by name, as a new
// slice.
func (v *View) Members() []Member { return slices.Clone(v.members) }

// Member returns the member called name.
func (v *View) Member(name string) (Member, bool) {
	if m := v.Lookup(name); m != nil {
		return *m, true
	}
	return Member{}, false
}

// Lookup returns the member called name, or nil: a pointer into the view,
// shared by every reader of it (read it, never modify it), for hot paths
// that would otherwise copy the whole Member.
func (v *View) Lookup(name string) *Member {
	i, ok := slices.BinarySearchFunc(v.members, name, func(m Member, name string) int { return strings.Compare(m.Name, name) })
	if !ok {
		return nil
	}
	return &v.members[i]
}

// Servers returns the alive servers whose metadata decoded, sorted by
// name, as a new slice.
func (v *View) Servers() []Member {
	out := make([]Member, len(v.servers))
	for j, i := range v.servers {
		out[j] = v.members[i]
	}
	return out
}

// EventKind says what changed.
type EventKind uint8

// Event kinds.
const (
	EventJoin   EventKind = iota + 1 // a member appeared or came back (StateAlive)
	EventUpdate                      // a member's metadata changed, or its detached arena list arrived
	EventLeave                       // a member left on purpose (StateLeft)
	EventFail                        // a member was declared dead (StateDead)
	EventReap                        // a dead or left member was dropped from the view
)

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventFail:
		return "fail"
	case EventReap:
		return "reap"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is one change of the view.
type Event struct {
	Kind   EventKind
	Member Member // the member, as of this event
	// View is the view this event produced: View.Version() is one more
	// than the previous event's. A subscriber that sees a gap missed
	// events (its buffer overflowed) and should reread the View.
	View *View
}

func (e Event) String() string {
	return fmt.Sprintf("%s %s (view %d)", e.Kind, e.Member, e.View.Version())
}
