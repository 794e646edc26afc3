// Space seen from a client: arenas the store adds while serving are advertised and read one-sidedly.

package server_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/store"
)

// A server that starts with one arena and may grow to three takes more
// data than one holds: the arenas it adds reach the client through gossip,
// and every value reads back one-sidedly, across a restart too.
func TestGrownArenasServeReads(t *testing.T) {
	c := testcluster.Start(t, 1, testcluster.Options{Store: store.Options{ArenaSize: 2 << 20, ArenaCount: 1, MaxArenaCount: 3,
		IndexSlots: 1 << 12, LeaseSize: 128 << 10, SegmentSize: 256 << 10}})
	cl := c.Client(t, nil)
	ctx := context.Background()
	const n = 1200 // 1200 x 3 KiB: more than 1.5 arenas
	v := func(i int) []byte { return fmt.Appendf(make([]byte, 0, 3000), "%03000d", i) }
	for i := range n {
		if err := cl.Put(ctx, fmt.Appendf(nil, "grow-%d", i), v(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	srv := c.Running()[0]
	if got := len(srv.Store().Arenas()); got < 2 {
		t.Fatalf("%d arenas after %d puts of 3 KB into 2 MiB arenas", got, n)
	}
	check := func(when string) {
		t.Helper()
		for i := range n {
			got, err := cl.Get(ctx, fmt.Appendf(nil, "grow-%d", i))
			if err != nil || string(got) != string(v(i)) {
				t.Fatalf("%s: get grow-%d: %d bytes, %v", when, i, len(got), err)
			}
		}
	}
	check("after growing")
	t.Logf("%d arenas after %d puts", len(srv.Store().Arenas()), n)
	c.Stop("s1")
	c.Restart("s1")
	cl = c.Client(t, nil) // the old one gossiped with s1 alone, which left
	check("after a restart")
}
