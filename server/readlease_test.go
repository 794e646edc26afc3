package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/server"
)

// TestCutOffPrimaryIsNotReadPastItsLease: a primary cut off from the other
// servers, but not from a client whose map comes from it alone, keeps its
// records live. Its shards fail over only after its read lease ended, and
// the client, whose map never learns the failover, trusts no read of it
// after that: it never returns the value the new primary overwrote. A
// write through it is not acknowledged.
func TestCutOffPrimaryIsNotReadPastItsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers at three replicas, a partition and a failover")
	}
	const lease, drift = 4 * time.Second, 200 * time.Millisecond
	c, cl, leader := replicated(t, 3, 3, func(cfg *server.Config) {
		cfg.FailoverTimeout, cfg.ReadLease, cfg.MaxClockDrift = 200*time.Millisecond, lease, drift
	})
	var cut *server.Server
	for _, s := range c.Running() {
		if s != leader {
			cut = s
			break
		}
	}
	var key []byte
	for i := 0; key == nil; i++ {
		if k := fmt.Appendf(nil, "key-%d", i); c.Map().Shard(proto.ShardOf(k)).Owner() == cut.Name() {
			key = k
		}
	}
	ctx := context.Background()
	if err := cl.Put(ctx, key, []byte("old")); err != nil {
		t.Fatal(err)
	}
	// The stale reader sees the cluster through the cut-off server only.
	stale := c.Client(t, func(cfg *client.Config) {
		cfg.Seeds, cfg.Endpoints = nil, []string{cut.ControlAddr()}
		cfg.MoveWait = 300 * time.Millisecond
	})
	if v, err := stale.Get(ctx, key); err != nil || string(v) != "old" {
		t.Fatalf("before the cut: %q, %v", v, err)
	}

	cutAt := time.Now()
	server.Isolate(cut)
	testcluster.WaitFor(t, 30*time.Second, "the cut-off primary's shard failed over", func() error {
		if o := leader.Map().Shard(proto.ShardOf(key)).Owner(); o == cut.Name() {
			return fmt.Errorf("still owned by %s", o)
		}
		return nil
	})
	// The last grant came at most a quarter of a lease before the cut.
	if took := time.Since(cutAt); took < lease*3/4+drift {
		t.Fatalf("failed over %v after the cut, within the cut-off primary's read lease (%v)", took, lease)
	}
	t.Logf("failover %v after the cut (read lease %v, drift %v)", time.Since(cutAt).Round(time.Millisecond), lease, drift)
	testcluster.WaitFor(t, 30*time.Second, "a write through the new primary", func() error {
		return cl.Put(ctx, key, []byte("new"))
	})

	// The stale reader's lease was asked of the cut-off primary before the
	// cut, so its first read now asks again, and is refused. It then
	// fetches the map again and may learn the new primary (the cut-off
	// server's frozen gossip still lists the others as alive): reads that
	// succeed must say new.
	refusedBefore := cut.Stats().ReadLeasesRefused
	failed := 0
	for range 20 {
		v, err := stale.Get(ctx, key, client.WithTimeout(200*time.Millisecond))
		switch {
		case err != nil:
			failed++
		case bytes.Equal(v, []byte("old")):
			t.Fatal("the cut-off primary was read after its read lease ended: the overwritten value came back")
		}
	}
	refused := cut.Stats().ReadLeasesRefused - refusedBefore
	if refused == 0 {
		t.Fatal("the cut-off primary refused no read lease: the stale reader never asked it, and the test did not read it")
	}
	t.Logf("the cut-off primary refused %d read leases; %d of 20 reads failed, the others said new", refused, failed)
	// Nor can it acknowledge a write. Its client does not reach the
	// backups (the cut-off server's view has them dead), and a client that
	// does, and commits at it with copies on both, is refused: the new
	// primary, one of the backups its map names, takes no forward of the
	// shard from it.
	if err := stale.Put(ctx, key, []byte("stale"), client.WithTimeout(2*time.Second)); err == nil {
		t.Fatal("the cut-off primary acknowledged a write after its shard failed over")
	}
	var others []*server.Server
	for _, s := range c.Running() {
		if s != cut {
			others = append(others, s)
		}
	}
	r := server.CommitWithCopies(t, cut, others, key, []byte("stale"))
	if e, ok := r.(*proto.Error); !ok || e.Code != proto.CodeUnavailable {
		t.Fatalf("a commit at the cut-off primary with copies on its backups: %#v, want CodeUnavailable", r)
	} else {
		t.Logf("a commit at the cut-off primary with copies on its backups: %v", e)
	}
	if v, err := cl.Get(ctx, key); err != nil || string(v) != "new" {
		t.Fatalf("through the new primary: %q, %v", v, err)
	}
}
