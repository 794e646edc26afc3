package membership

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// longMemory keeps dead servers as production does: in the view for an
// hour, in memberlist's list for the local profile's 15 s.
func longMemory(c *Config) {
	c.Tuning.DeadRetention = time.Hour
	c.Tuning.GossipToTheDeadTime = 15 * time.Second
}

// seesGeneration checks that n sees name alive with generation gen and
// control address ctl.
func seesGeneration(n *Membership, name string, gen uint64, ctl string) error {
	mb, ok := n.View().Member(name)
	switch {
	case !ok:
		return fmt.Errorf("%s does not see %s", n.Name(), name)
	case mb.State != StateAlive || mb.Meta.Generation != gen || mb.Meta.ControlAddr != ctl:
		return fmt.Errorf("%s sees %s %v at generation %d, control %s; want alive at %d, %s",
			n.Name(), name, mb.State, mb.Meta.Generation, mb.Meta.ControlAddr, gen, ctl)
	}
	return nil
}

// TestRestartSupersedesOldIncarnation: a server shut down without leaving
// and started again under its name and gossip port, with a new generation
// and control address, replaces its old incarnation everywhere, whether
// the others had declared it dead or not. Its old incarnation number is
// higher than a fresh start's (it had announced metadata several times):
// memberlist refutes the old record when the join shows it to the node,
// and the refutation must reach the servers over TCP as part of Create,
// not by gossip alone.
func TestRestartSupersedesOldIncarnation(t *testing.T) {
	for _, dead := range []bool{false, true} {
		t.Run(map[bool]string{false: "before declared dead", true: "after declared dead"}[dead], func(t *testing.T) {
			servers, metas := startCluster(t, 3, 2, longMemory)
			c1 := start(t, "c1", proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[0]), longMemory)
			metas["c1"] = proto.NodeMeta{Role: proto.RoleClient}
			nodes := append(slices.Clone(servers), c1)
			waitFor(t, 10*time.Second, "convergence", func() error { return converged(nodes, metas) })
			// s2 registers three more arenas: three more incarnations.
			for a := 3; a <= 5; a++ {
				metas["s2"] = serverMeta(2, a)
				if err := servers[1].SetMeta(metas["s2"]); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 10*time.Second, "s2's arenas", func() error { return converged(nodes, metas) })

			port := servers[1].LocalNode().Addr.Port()
			if err := servers[1].Shutdown(); err != nil {
				t.Fatal(err)
			}
			others := []*Membership{servers[0], servers[2], c1}
			if dead {
				took := waitSeenAs(t, 15*time.Second, others, "s2", StateDead)
				t.Logf("s2 dead everywhere %v after its shutdown", took)
			}

			meta := serverMeta(2, 2)
			meta.Generation += 1000
			meta.ControlAddr = "127.0.0.1:6999"
			cfg := testConfig("s2", proto.RoleServer, meta, longMemory, withSeeds(servers[0]))
			cfg.BindPort = int(port)
			begin := time.Now()
			s2, err := Create(cfg)
			if err != nil {
				t.Fatalf("restarting s2 on port %d: %v", port, err)
			}
			t.Cleanup(func() { _ = s2.Shutdown() })
			created := time.Since(begin)
			// The servers hold the new incarnation once Create returns.
			for _, n := range []*Membership{servers[0], servers[2]} {
				if err := seesGeneration(n, "s2", meta.Generation, meta.ControlAddr); err != nil {
					t.Errorf("when Create returned (after %v): %v", created, err)
				}
			}
			// So a client that joins through s1 now learns it at once.
			c2 := start(t, "c2", proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[0]), longMemory)
			if err := seesGeneration(c2, "s2", meta.Generation, meta.ControlAddr); err != nil {
				t.Errorf("client joined through s1: %v", err)
			}
			// And every member, c1 included, within a few probe intervals.
			bound := 10 * fast.ProbeInterval
			took := waitFor(t, bound, "the new incarnation everywhere", func() error {
				for _, n := range append(others, c2, s2) {
					if err := seesGeneration(n, "s2", meta.Generation, meta.ControlAddr); err != nil {
						return err
					}
				}
				return nil
			})
			t.Logf("Create took %v; every member saw the new generation %v after it", created, took)
		})
	}
}
