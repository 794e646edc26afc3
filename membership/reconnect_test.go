// Tests of reconnecting to servers declared dead that are alive after all (a partition that healed).

package membership

import (
	"fmt"
	"testing"
	"time"
)

// withTuning replaces the test tuning.
func withTuning(t Tuning) nodeOpt { return func(c *Config) { c.Tuning = t } }

// A server cut off longer than memberlist gossips to the dead (here by a
// gossip key the others do not hold) is dead to the others and they to
// it; once the cut heals, the view converges again within a few reconnect
// intervals: without reconnecting, nobody would ever contact a node it
// holds dead again.
func TestPartitionLongerThanGossipToTheDeadHeals(t *testing.T) {
	tuning := fast
	tuning.DeadRetention = time.Minute // the servers stay in the view, dead
	tuning.ReconnectInterval = 200 * time.Millisecond
	servers, metas := startCluster(t, 3, 1, withKey(keyA), withTuning(tuning))
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	cut := servers[2]
	for _, step := range []func() error{
		func() error { return cut.InstallKey(keyB) },
		func() error { return cut.UseKey(keyB) },
		func() error { return cut.RemoveKey(keyA) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "the cut server dead to the others and they to it", func() error {
		if mb, _ := servers[0].View().Member("s3"); mb.State == StateAlive {
			return fmt.Errorf("s1 sees s3 %v", mb.State)
		}
		for _, name := range []string{"s1", "s2"} {
			if mb, _ := cut.View().Member(name); mb.State == StateAlive {
				return fmt.Errorf("s3 sees %s %v", name, mb.State)
			}
		}
		return nil
	})
	time.Sleep(2 * tuning.GossipToTheDeadTime) // and past memberlist's gossip to the dead
	if err := cut.InstallKey(keyA); err != nil {
		t.Fatal(err)
	}
	if err := cut.UseKey(keyA); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 10*time.Second, "convergence after the cut healed", func() error { return converged(servers, metas) })
	t.Logf("converged %v after the cut healed", took)
}
