// Tests of a start whose store and map replica open together.

package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rkv-io/rkv/proto"
)

// TestStartDirInUse starts a second server on a running one's data
// directory: it fails with the store's reason, its map replica never
// opened (it opens once the store holds the directory, which it does
// not), and the running server goes on serving.
func TestStartDirInUse(t *testing.T) {
	s := startServer(t, nil)
	cfg := testConfig(t, s.Store().Options().Dir)
	second, err := New(context.Background(), cfg)
	if err == nil {
		second.Close()
		t.Fatal("a second server started on a data directory in use")
	}
	if !strings.Contains(err.Error(), "in use by another store") {
		t.Fatalf("the error does not say the directory is in use: %v", err)
	}
	if strings.Contains(strings.ToLower(err.Error()), "raft") {
		t.Errorf("the error speaks of the replica's failure, which follows from the store's: %v", err)
	}
	cl := newClient(t, s, "", nil)
	healthy(t, cl, "a second server failed on the data directory")
}

// TestStartReplicaFailsStoreReleased fails a start in the map replica's
// open (its directory is a file) while the store opens fine: the error
// says why, and the store is closed again, so that the next start on the
// same directory takes its lock and serves.
func TestStartReplicaFailsStoreReleased(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "raft"), []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), testConfig(t, dir))
	if err == nil {
		s.Close()
		t.Fatal("a server started with a file where its Raft directory goes")
	}
	if !strings.Contains(err.Error(), "raft") {
		t.Fatalf("the error does not name the Raft directory: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "raft")); err != nil {
		t.Fatal(err)
	}
	s, err = New(context.Background(), testConfig(t, dir))
	if err != nil {
		t.Fatalf("the start after the failed one: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the server: %v", err)
		}
	})
	waitServing(t, s, proto.NumShards)
	cl := newClient(t, s, "", nil)
	healthy(t, cl, "a start after one that failed in the replica")
}
