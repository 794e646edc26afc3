package membership

import (
	"testing"

	"github.com/rkv-io/rkv/proto"
)

// Lookup finds a member by name in the view itself (what Member copies),
// nil for a name the view does not hold.
func TestViewLookup(t *testing.T) {
	v := newView(1, []Member{
		{Name: "s2", State: StateAlive, Meta: proto.NodeMeta{Role: proto.RoleServer, Generation: 2}},
		{Name: "s1", State: StateDead, Meta: proto.NodeMeta{Role: proto.RoleServer, Generation: 1}},
	})
	for _, name := range []string{"s1", "s2"} {
		mb := v.Lookup(name)
		if mb == nil || mb.Name != name {
			t.Fatalf("Lookup(%q) = %v", name, mb)
		}
		if mb != v.Lookup(name) {
			t.Fatalf("Lookup(%q) returned two different pointers: not the view's own member", name)
		}
		if cp, ok := v.Member(name); !ok || cp.Name != mb.Name || cp.State != mb.State || cp.Meta.Generation != mb.Meta.Generation {
			t.Fatalf("Member(%q) = %v, %v; Lookup has %v", name, cp, ok, mb)
		}
	}
	if mb := v.Lookup("s3"); mb != nil {
		t.Fatalf("Lookup of an absent member = %v, want nil", mb)
	}
}
