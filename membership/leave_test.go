package membership

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// clientMembers lists the members of n's view that are not servers.
func clientMembers(n *Membership) []string {
	var out []string
	for _, mb := range n.View().Members() {
		if mb.MetaErr != nil || mb.Meta.Role != proto.RoleServer {
			out = append(out, fmt.Sprintf("%s(%v)", mb.Name, mb.State))
		}
	}
	return out
}

// departures records, per member name, the kinds of the events that took
// it out of n's view: EventLeave or EventFail, then EventReap.
func departures(t *testing.T, n *Membership) func() map[string][]EventKind {
	events, cancel := n.Subscribe()
	var mu sync.Mutex
	got := map[string][]EventKind{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range events {
			switch ev.Kind {
			case EventLeave, EventFail, EventReap:
				mu.Lock()
				got[ev.Member.Name] = append(got[ev.Member.Name], ev.Kind)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() map[string][]EventKind {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]EventKind{}
		for k, v := range got {
			out[k] = append([]EventKind(nil), v...)
		}
		return out
	}
}

// patient keeps longMemory and detects failures slowly, so that no
// running node is declared dead on two loaded cores under the race
// detector: departures must come from leaving.
func patient(c *Config) {
	longMemory(c)
	c.Tuning.ProbeInterval = 250 * time.Millisecond // memberlist's probes outlive Shutdown by up to this: goleak
	c.Tuning.ProbeTimeout = 200 * time.Millisecond
	c.Tuning.SuspicionMult = 6
	c.Tuning.TCPTimeout = 5 * time.Second
}

// closeClient does what client.Close does with its membership: Leave,
// whose error (nothing confirmed the departure within the second) it only
// logs, then Shutdown, which waits for the exchanges Leave started.
func closeClient(t *testing.T, m *Membership) error {
	if err := m.Leave(time.Second); err != nil {
		t.Logf("%s: %v", m.Name(), err)
	}
	return m.Shutdown()
}

// TestClosedClientsLeave: clients that leave (as client.Close does), one
// after another as a CLI session's do, or all together, so that the gossip
// of each one's departure also goes to others leaving at the same time,
// are recorded by every server as having left, not as dead, and are gone
// from the servers' views at once.
func TestClosedClientsLeave(t *testing.T) {
	// Room for every event, should the recorder fall behind.
	servers, metas := startCluster(t, 3, 1, patient, func(c *Config) { c.EventBuffer = 4096 })
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	var seen []func() map[string][]EventKind
	for _, s := range servers {
		seen = append(seen, departures(t, s))
	}
	var clients []*Membership
	bound := 300 * time.Millisecond
	gone := func(what string) {
		t.Helper()
		for begin := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			var err error
			for _, s := range servers {
				if got := clientMembers(s); len(got) > 0 && err == nil {
					err = fmt.Errorf("%s still has %d: %s", s.Name(), len(got), strings.Join(got, " "))
				}
			}
			if err == nil {
				t.Logf("gone from every server's view %v %s", time.Since(begin), what)
				return
			}
			if time.Since(begin) > bound {
				t.Errorf("%s: not within %v: %v", what, bound, err)
				return
			}
		}
	}

	// One after another.
	begin := time.Now()
	for i := range 20 {
		c := start(t, fmt.Sprintf("seq%02d", i), proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[i%3]), patient)
		clients = append(clients, c)
		if err := closeClient(t, c); err != nil {
			t.Errorf("closing %s: %v", c.Name(), err)
		}
	}
	t.Logf("20 clients created and closed in turn in %v", time.Since(begin))
	gone("after the last closed")

	// All together.
	var batch []*Membership
	for i := range 6 {
		batch = append(batch, start(t, fmt.Sprintf("all%d", i), proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[i%3]), patient))
	}
	waitFor(t, 10*time.Second, "clients seen", func() error {
		for _, s := range servers {
			if got := clientMembers(s); len(got) != len(batch) {
				return fmt.Errorf("%s sees %s", s.Name(), strings.Join(got, " "))
			}
		}
		return nil
	})
	begin = time.Now()
	var wg sync.WaitGroup
	for _, c := range batch {
		wg.Go(func() {
			if err := closeClient(t, c); err != nil {
				t.Errorf("closing %s: %v", c.Name(), err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d clients closed together in %v", len(batch), time.Since(begin))
	gone("after they all closed")

	// Should a client be declared dead while it runs (and refute), its
	// last departure counts.
	for i, s := range servers {
		got := seen[i]()
		for _, c := range append(clients, batch...) {
			kinds := slices.DeleteFunc(got[c.Name()], func(k EventKind) bool { return k == EventReap })
			if len(kinds) == 0 || kinds[len(kinds)-1] != EventLeave {
				t.Errorf("%s saw %s go as %v, want it to leave", s.Name(), c.Name(), kinds)
			}
		}
	}
}

// TestDeadClientsReapedQuickly: clients that stop without leaving are
// declared dead by failure detection, and then dropped from every view at
// once rather than after memberlist's GossipToTheDeadTime (15 s here, as
// in the local profile); a dead server stays.
func TestDeadClientsReapedQuickly(t *testing.T) {
	servers, metas := startCluster(t, 3, 1, longMemory)
	waitFor(t, 10*time.Second, "convergence", func() error { return converged(servers, metas) })
	live := start(t, "live", proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[0]), longMemory)
	var gone []*Membership
	for i := range 5 {
		gone = append(gone, start(t, fmt.Sprintf("c%d", i), proto.RoleClient, proto.NodeMeta{}, withSeeds(servers[i%3]), longMemory))
	}
	observers := append(servers[:2:2], live)
	waitFor(t, 10*time.Second, "clients seen", func() error {
		for _, s := range observers {
			if got := clientMembers(s); len(got) != 6 {
				return fmt.Errorf("%s sees %v", s.Name(), got)
			}
		}
		return nil
	})
	begin := time.Now()
	for _, c := range append(gone, servers[2]) {
		if err := c.Shutdown(); err != nil {
			t.Fatal(err)
		}
	}
	bound := 5 * time.Second // a probe round over 10 members, then up to 6x the suspicion timeout
	waitFor(t, bound, "dead clients reaped", func() error {
		for _, s := range observers {
			if got := clientMembers(s); len(got) != 1 { // live itself
				return fmt.Errorf("%s still has %s", s.Name(), strings.Join(got, " "))
			}
		}
		return nil
	})
	t.Logf("5 clients shut down without leaving: reaped from every view in %v (probe interval %v)", time.Since(begin), fast.ProbeInterval)
	// The server that went with them is declared dead too, and stays.
	waitSeenAs(t, 10*time.Second, observers, "s3", StateDead)
	for _, s := range observers {
		if mb, ok := s.View().Member("s3"); !ok || mb.State != StateDead {
			t.Errorf("%s: dead server s3 is %v (present %v), want kept dead", s.Name(), mb.State, ok)
		}
	}
}
