// Refusing a second node under a name a live member already has.

package membership

import (
	"fmt"

	"github.com/hashicorp/memberlist"
)

// NotifyConflict is memberlist's report that it refused an alive message
// for a name it knows at another address, alive or not yet dead: existing
// is its record of the name, other the refused claim. memberlist keeps
// the record and drops the claim. It runs under memberlist's node lock.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) { d.m.conflict(existing, other) }

// conflict handles a refused claim to a name. Three cases:
//
//   - the name is another node's: that node stays, the claimant is
//     refused, logged at ERROR;
//   - the name is this node's, and this node is joining in Create: it is
//     the newcomer, and the cluster's record (other) is the live member
//     that has the name; Create fails with nameErr;
//   - the name is this node's, and this node is past Create: another node
//     claims it, logged at ERROR.
func (m *Membership) conflict(existing, other *memberlist.Node) {
	ea, oa := nodeAddr(existing), nodeAddr(other)
	if existing.Name != m.name {
		m.s.Logger.Error("duplicate node name refused: a node claims the name of a member", "name", existing.Name,
			"member_addr", ea.String(), "claimed_from", oa.String())
		return
	}
	m.mu.Lock()
	creating := m.creating
	if creating && m.nameErr == nil {
		m.nameErr = fmt.Errorf("membership: the name %q is in use by a live member at %s (this node is at %s): give this node another name, or stop that one",
			m.name, oa, ea)
	}
	m.mu.Unlock()
	if creating {
		m.s.Logger.Debug("this node's name is in use by a live member", "name", m.name, "member_addr", oa.String())
		return
	}
	m.s.Logger.Error("duplicate node name refused: a node claims this node's name", "name", m.name,
		"addr", ea.String(), "claimed_from", oa.String())
}
