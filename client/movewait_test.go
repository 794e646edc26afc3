package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
)

// TestWritesWaitOutAMovesFreeze: a write to a shard frozen for a move's
// last copy waits for it past RetryTimeout, up to MoveWait, rather than
// failing; past MoveWait it fails as a timeout. The test plays the move's
// target: it freezes the move in the map and fences the shard at its
// owner, then stays away; the move stays frozen until the target (s2,
// stopped) has been down for the servers' MoveTimeout (5s in tests) and
// the leader aborts it.
func TestWritesWaitOutAMovesFreeze(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a move to be aborted")
	}
	c := testcluster.Start(t, 2, testcluster.Options{})
	patient := c.Client(t, func(cfg *client.Config) { cfg.RetryTimeout = 300 * time.Millisecond })
	hasty := c.Client(t, func(cfg *client.Config) {
		cfg.RetryTimeout = 300 * time.Millisecond
		cfg.MoveWait = time.Second
	})
	ctx := context.Background()
	var key []byte
	for i := 0; key == nil; i++ {
		k := []byte(fmt.Sprint("key-", i))
		if owner, _ := c.Map().Owner(proto.ShardOf(k)); owner == "s1" {
			key = k
		}
	}
	if err := patient.Put(ctx, key, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	c.Stop("s2")
	node := c.Server("s1").MapNode()
	shard := proto.ShardOf(key)
	m, err := node.Propose(ctx, &proto.MapCommand{Op: proto.MapStartMoves, Moves: []proto.MoveCommand{{Shard: shard, From: "s1", To: "s2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if m, err = node.Propose(ctx, &proto.MapCommand{Op: proto.MapFreezeMoves, Moves: []proto.MoveCommand{{Shard: shard, From: "s1", To: "s2", Started: m.Epoch()}}}); err != nil {
		t.Fatal(err)
	}
	peer, err := session.Dial(ctx, c.Server("s1").ControlAddr(), "", session.Config{Name: "test-target", Kind: proto.SessionPeer})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if _, err := peer.Call(ctx, &proto.FenceShards{Shards: []proto.Shard{shard}, Epoch: m.Epoch()}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	err = hasty.Put(ctx, key, []byte("hasty"))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("a put into a frozen shard with MoveWait 1s: %v; want unavailable, deadline exceeded", err)
	}
	if d := time.Since(t0); d < 900*time.Millisecond || d > 3*time.Second {
		t.Fatalf("it gave up after %v; want MoveWait (1s)", d)
	}
	if err := patient.Put(ctx, key, []byte("v2")); err != nil {
		t.Fatalf("a put into a shard frozen until its move is aborted, RetryTimeout 300ms, MoveWait 10s: %v (after %v)", err, time.Since(t0))
	}
	t.Logf("the put waited out the freeze: %v after the first attempt", time.Since(t0).Round(time.Millisecond))
	if moves := c.Map().Moves(); len(moves) != 0 {
		t.Fatalf("the put went through while the map still moves %v", moves)
	}
	if v, err := patient.Get(ctx, key); err != nil || string(v) != "v2" {
		t.Fatalf("after the move's abort: %q, %v; want v2", v, err)
	}
}
