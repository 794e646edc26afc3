package membership

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testlog"
	"github.com/rkv-io/rkv/proto"
)

// TestDuplicateNameRefused: a node that takes the name of a live member
// at another address fails to start, naming the name and the member's
// address; the members it joined through refuse it and log that at ERROR,
// and the member keeps its name.
func TestDuplicateNameRefused(t *testing.T) {
	var s1buf, s2buf, c1buf testlog.Buffer
	s1 := start(t, "s1", proto.RoleServer, serverMeta(1, 1), capture(&s1buf))
	s2 := start(t, "s2", proto.RoleServer, serverMeta(2, 1), withSeeds(s1), capture(&s2buf))
	c1 := start(t, "c1", proto.RoleClient, proto.NodeMeta{}, withSeeds(s1), capture(&c1buf))
	metas := map[string]proto.NodeMeta{"s1": serverMeta(1, 1), "s2": serverMeta(2, 1), "c1": {Role: proto.RoleClient}}
	nodes := []*Membership{s1, s2, c1}
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(nodes, metas) })
	live := s2.LocalNode().Addr.String()

	for _, c := range []struct {
		role  proto.Role
		meta  proto.NodeMeta
		seeds []*Membership
	}{
		{proto.RoleServer, serverMeta(9, 1), []*Membership{s1}},     // a second s2, through s1
		{proto.RoleClient, proto.NodeMeta{}, []*Membership{c1, s1}}, // a client named s2, through c1 first
		{proto.RoleServer, serverMeta(8, 1), []*Membership{s2}},     // through s2 itself
	} {
		cfg := testConfig("s2", c.role, c.meta, withSeeds(c.seeds...))
		m, err := Create(cfg)
		if err == nil {
			_ = m.Shutdown()
			t.Fatalf("a second s2 (%v) was created", c.role)
		}
		if !strings.Contains(err.Error(), `"s2"`) || !strings.Contains(err.Error(), live) {
			t.Errorf("a second s2 (%v): %v; want the name and the live member's address %s", c.role, err, live)
		} else {
			t.Logf("a second s2 (%v): %v", c.role, err)
		}
	}
	for name, buf := range map[string]*testlog.Buffer{"s1": &s1buf, "c1": &c1buf, "s2": &s2buf} {
		want := "duplicate node name refused: a node claims the name of a member"
		if name == "s2" {
			want = "duplicate node name refused: a node claims this node's name"
		}
		waitFor(t, 5*time.Second, name+" logs the refusal", func() error {
			for _, l := range strings.Split(buf.String(), "\n") {
				if strings.Contains(l, "level=ERROR") && strings.Contains(l, want) && strings.Contains(l, "name=s2") {
					t.Logf("%s: %s", name, l)
					return nil
				}
			}
			return fmt.Errorf("no ERROR line about s2 in:\n%s", buf.String())
		})
	}
	// Nobody took the newcomer for s2.
	time.Sleep(5 * fast.ProbeInterval)
	if err := converged(nodes, metas); err != nil {
		t.Error(err)
	}
	for _, n := range nodes {
		if mb, _ := n.View().Member("s2"); mb.Addr.String() != live {
			t.Errorf("%s sees s2 at %v, want %s", n.Name(), mb.Addr, live)
		}
	}
}
