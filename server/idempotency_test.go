// A commit whose reply is lost and that the client retries is applied once.

package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/proto"
)

// TestRetriedCommitAppliesOnce: the server applies a PUT's commit and the
// connection dies before the reply (as in a crash); before the client's
// retry arrives, another client overwrites the key. The retry must be
// answered from the first attempt, not applied over the newer value: the
// history A (acknowledged), B, A would not be linearizable.
func TestRetriedCommitAppliesOnce(t *testing.T) {
	noLeaks(t)
	var drops atomic.Int32
	other := make(chan struct{})
	s := startServer(t, nil)
	cl := newClient(t, s, "", nil)
	writer := newClient(t, s, "", nil)
	ctx := context.Background()
	key := []byte("contended")
	if err := cl.Put(ctx, key, []byte("first")); err != nil {
		t.Fatal(err)
	}
	commits := s.Store().Stats().Commits
	// Drop the reply to the next commit of "A", and have another client
	// write "B" before the retry: the hook runs on the server's connection
	// goroutine, after the commit was applied.
	drop := func(m proto.Message) bool {
		if _, ok := m.(*proto.Commit); !ok || drops.Load() > 0 {
			return false
		}
		drops.Add(1)
		go func() {
			defer close(other)
			if err := writer.Put(ctx, key, []byte("B")); err != nil {
				t.Errorf("the other writer: %v", err)
			}
		}()
		<-other
		return true
	}
	s.dropReply.Store(&drop)
	if err := cl.Put(ctx, key, []byte("A")); err != nil {
		t.Fatalf("the retried PUT: %v", err)
	}
	s.dropReply.Store(nil)
	if drops.Load() != 1 {
		t.Fatalf("%d replies dropped, want 1", drops.Load())
	}
	v, err := cl.Get(ctx, key)
	if err != nil || string(v) != "B" {
		t.Fatalf("after A (reply lost, retried) then B: read %q, %v; the retry was applied again", v, err)
	}
	if got := s.Store().Stats().Commits - commits; got != 2 {
		t.Fatalf("%d commits applied for A, its retry and B; want 2", got)
	}
}

// TestRetriedCommitBatchAppliesOnce: a MultiPut whose CommitBatch was
// applied and whose reply was lost with its connection is retried, and
// every pair is applied once, not twice.
func TestRetriedCommitBatchAppliesOnce(t *testing.T) {
	noLeaks(t)
	var drops atomic.Int32
	s := startServer(t, nil)
	cl := newClient(t, s, "", nil)
	drop := func(m proto.Message) bool {
		_, ok := m.(*proto.CommitBatch)
		return ok && drops.Add(1) == 1
	}
	s.dropReply.Store(&drop)
	defer s.dropReply.Store(nil)
	kvs := make([]client.KV, 40)
	for i := range kvs {
		kvs[i] = client.KV{Key: fmt.Appendf(nil, "batch-%02d", i), Value: fmt.Appendf(nil, "value-%d", i)}
	}
	commits := s.Store().Stats().Commits
	if err := cl.MultiPut(context.Background(), kvs); err != nil {
		t.Fatalf("the retried MultiPut: %v", err)
	}
	if drops.Load() < 2 {
		t.Fatalf("%d CommitBatches seen, want the dropped one and its retry", drops.Load())
	}
	if got := s.Store().Stats().Commits - commits; got != uint64(len(kvs)) {
		t.Fatalf("%d commits applied for %d pairs, one batch of them retried; want %d", got, len(kvs), len(kvs))
	}
	for _, kv := range kvs {
		if v, err := cl.Get(context.Background(), kv.Key); err != nil || string(v) != string(kv.Value) {
			t.Fatalf("Get %s: %q, %v", kv.Key, v, err)
		}
	}
}
