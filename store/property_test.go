package store

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/rkv-io/rkv/proto"
)

// A random sequence of puts, deletes and restarts must read back like a map.
func TestStoreBehavesLikeAMap(t *testing.T) {
	opts := smallOptions()
	opts.ArenaSize, opts.LeaseSize = 8<<20, 4<<10 // restarts strand leases: room for many
	sv := newServer(t, opts)
	c := newClient(t, sv)
	round := 0
	rapid.Check(t, func(rt *rapid.T) {
		round++
		prefix := fmt.Sprintf("r%d/", round) // each run starts from an empty key space
		model := map[string][]byte{}
		var w *writer
		keyGen := rapid.SampledFrom([]string{"a", "b", "c", "d", "e"})
		rt.Repeat(map[string]func(*rapid.T){
			"put": func(rt *rapid.T) {
				k := prefix + keyGen.Draw(rt, "key")
				v := rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(rt, "value")
				if w == nil || w.off+int64(len(k)+len(v)+64) > w.lease.Size {
					w = c.newWriter()
				}
				if _, err := w.put([]byte(k), v); err != nil {
					rt.Fatal(err)
				}
				model[k] = v
			},
			"delete": func(rt *rapid.T) {
				k := prefix + keyGen.Draw(rt, "key")
				if err := sv.s.Delete(context.Background(), []byte(k), proto.Write{}); err != nil {
					rt.Fatal(err)
				}
				delete(model, k)
			},
			"restart": func(rt *rapid.T) {
				sv.restart()
				waitArenas(t, sv.s, opts.ArenaCount)
				w = nil // leases do not survive a restart
			},
			"": func(rt *rapid.T) {
				for _, k := range []string{"a", "b", "c", "d", "e"} {
					got, ok := c.mustGet([]byte(prefix + k))
					want, exists := model[prefix+k]
					if ok != exists || !bytes.Equal(got, want) {
						rt.Fatalf("GET %s = %q (found %v), model has %q (%v)", prefix+k, got, ok, want, exists)
					}
				}
			},
		})
	})
}
