package server_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// A voter of the map's Raft group that stays down gives its vote to a
// live nonvoter, so that five servers with three voters keep a quorum
// after two voters are lost one after the other: without it the second
// loss stops the map (no failover, no read lease, no map change).
func TestDeadVotersGiveTheirVotes(t *testing.T) {
	if testing.Short() {
		t.Skip("five servers, two stopped one after the other")
	}
	c := testcluster.Start(t, 5, testcluster.Options{
		Store:  store.Options{ArenaSize: 4 << 20, ArenaCount: 1, IndexSlots: 1 << 12, LeaseSize: 256 << 10},
		Server: func(cfg *server.Config) { cfg.FailoverTimeout, cfg.MaxMoves = 200*time.Millisecond, replicatedMaxMoves },
		Settle: 90 * time.Second,
	})
	// voters are the names of the Raft voters the leader's configuration
	// has, and whether all of them are running.
	voters := func() ([]string, bool, error) {
		leader := mapLeaderOf(c)
		if leader == nil {
			return nil, false, errors.New("no map leader")
		}
		members, err := leader.MapNode().Members()
		if err != nil {
			return nil, false, err
		}
		var names []string
		live := true
		for _, mem := range members {
			if !mem.Voter {
				continue
			}
			srv, _ := leader.Map().ServerByID(mem.ID)
			names = append(names, srv.Name)
			live = live && c.Server(srv.Name) != nil
		}
		slices.Sort(names)
		return names, live, nil
	}
	stopVoter := func() string {
		names, _, err := voters()
		if err != nil || len(names) != 3 {
			t.Fatalf("voters %v, %v; want 3", names, err)
		}
		for _, n := range names {
			if !c.Server(n).MapNode().IsLeader() {
				c.Stop(n)
				return n
			}
		}
		t.Fatalf("no voter but the leader among %v", names)
		return ""
	}
	for round := 1; round <= 2; round++ {
		stopped := stopVoter()
		testcluster.WaitFor(t, 30*time.Second, fmt.Sprintf("the vote of %s (stopped) given to a live server", stopped), func() error {
			names, live, err := voters()
			switch {
			case err != nil:
				return err
			case len(names) != 3 || !live:
				return fmt.Errorf("voters %v", names)
			}
			return nil
		})
	}
	// The map still takes changes: a replica count set through the leader.
	leader := mapLeaderOf(c)
	if _, err := leader.MapNode().Propose(t.Context(), &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: 2}); err != nil {
		t.Fatalf("a map change with two of the first three voters down: %v", err)
	}
}

// mapLeaderOf is the running server that leads the map's Raft group, or
// nil.
// The map leader's process ends: the server elected next knows since when
// from the watch it held on the leader while it followed, not only from
// the moment it began to lead, so the dead leader's shards fail over once
// FailoverTimeout has passed since the death, with the election counted
// in it.
func TestNextLeaderKnowsSinceWhenTheLeaderIsGone(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers, the leader stopped")
	}
	c, _, old := replicated(t, 3, 3, func(*server.Config) {})
	waitReplicaStates(t, c, c.Map())
	time.Sleep(300 * time.Millisecond) // the followers' watches on the leader
	stopped := time.Now()
	c.Stop(old.Name())
	var next *server.Server
	testcluster.WaitFor(t, 30*time.Second, "a new map leader that failed the old one's shards over", func() error {
		if next = mapLeaderOf(c); next == nil {
			return errors.New("no map leader")
		}
		if n := len(next.Map().Owned(old.Name())); n > 0 {
			return fmt.Errorf("%s is still primary of %d shards in %s's map", old.Name(), n, next.Name())
		}
		return nil
	})
	since, gone := server.ProcessGoneSince(next, old.Name())
	leading := server.LeadingSince(next)
	if !gone || !since.Before(leading) || since.Sub(stopped) > time.Second {
		t.Fatalf("%s, leading %v after the stop, knows %s's process gone %v, %v after the stop; want it known gone since about the stop, before it led",
			next.Name(), leading.Sub(stopped), old.Name(), gone, since.Sub(stopped))
	}
	t.Logf("%s led %v after the stop, and knew %s gone %v after it", next.Name(), leading.Sub(stopped).Round(time.Millisecond), old.Name(), since.Sub(stopped).Round(time.Millisecond))
}

func mapLeaderOf(c *testcluster.Cluster) *server.Server {
	for _, s := range c.Running() {
		if s.MapNode().IsLeader() {
			return s
		}
	}
	return nil
}
