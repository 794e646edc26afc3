package server

import (
	"testing"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// TestOwnShardFromBackup: a shard the map gives this server, held here as
// a backup, is served (activated), unless a promotion of another replica
// froze it (this server made it a backup for that promotion). A failover
// that made this backup the primary, followed by a move away frozen
// before the server served it, left it a backup for good: the move's
// fence here found no owned shard to freeze and was retried for ever (a
// chaos run's recovery timed out with 18 shards moving).
func TestOwnShardFromBackup(t *testing.T) {
	s := &Server{}
	backup := store.ShardStatus{State: store.ShardBackup, Since: 7}
	for _, c := range []struct {
		name     string
		move     *clustermap.Move
		activate bool
	}{
		{"no move", nil, true},
		{"a move away, copying", &clustermap.Move{Kind: proto.MoveReplace, From: "me", To: "b", Phase: proto.MoveCopying}, true},
		{"a move away, frozen", &clustermap.Move{Kind: proto.MoveReplace, From: "me", To: "b", Phase: proto.MoveFrozen}, true},
		{"a promotion of another replica, frozen", &clustermap.Move{Kind: proto.MovePromote, From: "me", To: "b", Phase: proto.MoveFrozen}, false},
	} {
		a := shardActions{activate: map[uint64][]proto.Shard{}}
		info := clustermap.Shard{Owners: []string{"me", "b"}, Since: 9, Origins: []uint64{0, 0}, Move: c.move}
		s.ownShard(&a, 3, info, backup)
		if got := len(a.activate[9]) == 1; got != c.activate {
			t.Errorf("%s: activated %v, want %v (actions %+v)", c.name, got, c.activate, a)
		}
	}
}
