package main

import (
	"testing"

	"github.com/rkv-io/rkv/proto"
)

// TestArenaCount: members and status count arenas, not the regions of
// their registered units.
func TestArenaCount(t *testing.T) {
	unit := func(id uint16, off uint64) proto.ArenaRegion {
		return proto.ArenaRegion{ID: id, Addr: 1<<40 + off, Length: 1 << 27, RKey: 1, Offset: off}
	}
	for _, c := range []struct {
		regions []proto.ArenaRegion
		want    int
	}{
		{nil, 0},
		{[]proto.ArenaRegion{unit(0, 0)}, 1},
		{[]proto.ArenaRegion{unit(0, 0), unit(0, 1<<27), unit(1, 0), unit(3, 1<<27)}, 3},
	} {
		if got := arenaCount(c.regions); got != c.want {
			t.Errorf("%d regions: %d arenas, want %d", len(c.regions), got, c.want)
		}
	}
}
