// Servers with a peer token of their own: a pair that shares one moves shards and changes the map; one with another is kept out.

package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

const clientToken = "sesame"

// peerTokens gives every server clientToken for clients, and the peer
// token peerToken returns for it.
func peerTokens(peerToken func(name string) string) testcluster.Options {
	return testcluster.Options{Server: func(c *server.Config) { c.AuthToken, c.PeerToken = clientToken, peerToken(c.Name) }}
}

func refusedHellos(s *server.Server) uint64 { return s.Stats().Refused[proto.CodeUnauthenticated] }

// TestServersWithAPeerToken: two servers sharing a peer token form a
// cluster: the second is added to the map and its Raft group, and half
// the shards migrate to it (testcluster.Start waits for all of it), with
// no Hello refused on either side, so each dialed the other with the peer
// token. A client with the clients' token reads and writes on both.
func TestServersWithAPeerToken(t *testing.T) {
	c := testcluster.Start(t, 2, peerTokens(func(string) string { return "servers only" }))
	for _, s := range c.Running() {
		if n := refusedHellos(s); n != 0 {
			t.Errorf("%s refused %d Hellos: the servers do not dial each other with their peer token", s.Name(), n)
		}
		owned := 0
		for _, sh := range s.Store().Shards() {
			if sh.State == store.ShardOwned {
				owned++
			}
		}
		if owned == 0 || owned == proto.NumShards {
			t.Errorf("%s owns %d shards: nothing migrated", s.Name(), owned)
		}
	}
	cl := c.Client(t, func(cfg *client.Config) { cfg.AuthToken = clientToken })
	ctx := context.Background()
	on := map[string]bool{}
	for i := 0; len(on) < 2; i++ {
		k := fmt.Appendf(nil, "k%d", i)
		if err := cl.Put(ctx, k, k); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		if v, err := cl.Get(ctx, k); err != nil || string(v) != string(k) {
			t.Fatalf("get %s: %q, %v", k, v, err)
		}
		o, _ := cl.Owner(k)
		on[o] = true
	}
}

// TestMismatchedPeerTokens: a server whose peer token differs from the
// cluster's is refused both ways (its Raft by it, its pulls of shards by
// the cluster), so it never serves a shard, while the cluster goes on.
func TestMismatchedPeerTokens(t *testing.T) {
	c := testcluster.Start(t, 1, peerTokens(func(name string) string {
		if name == "s2" {
			return "another"
		}
		return "servers only"
	}))
	s1 := c.Server("s1")
	s2 := c.Add("s2")
	// s1 alone votes, so it adds s2 to the map and plans moves to it;
	// s2's pulls and s1's Raft traffic to s2 are refused.
	testcluster.WaitFor(t, 30*time.Second, "moves to s2, and each server refusing the other's peer sessions", func() error {
		moving := 0
		for _, mv := range s1.Map().Moves() {
			if mv.To == "s2" {
				moving++
			}
		}
		if a, b := refusedHellos(s1), refusedHellos(s2); a == 0 || b == 0 || moving == 0 {
			return fmt.Errorf("Hellos refused: %d by s1, %d by s2; %d moves to s2 in s1's map", a, b, moving)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // a pair with one token migrates its first shards in less
	for _, sh := range s2.Store().Shards() {
		if sh.State == store.ShardOwned {
			t.Fatalf("s2, with another peer token, serves %v", sh)
		}
	}
	cl := c.Client(t, func(cfg *client.Config) { cfg.AuthToken = clientToken })
	ctx := context.Background()
	for i := range 20 {
		k := fmt.Appendf(nil, "k%d", i)
		if err := cl.Put(ctx, k, k); err != nil {
			t.Fatalf("put %s, with s2 kept out: %v", k, err)
		}
	}
}
