package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/rkv-io/rkv/proto"
)

// A random sequence of puts, deletes, retries of the last write, aborted
// migrations of a shard, restarts and crashes must read back like a map,
// under each sync policy (SyncNone's index log replayed at each crash).
func TestStoreBehavesLikeAMap(t *testing.T) {
	for _, sync := range []SyncPolicy{SyncAlways, SyncNone} {
		t.Run(sync.String(), func(t *testing.T) { testStoreBehavesLikeAMap(t, sync) })
	}
}

func testStoreBehavesLikeAMap(t *testing.T, sync SyncPolicy) {
	opts := smallOptions()
	opts.Sync = sync
	opts.ArenaSize, opts.LeaseSize = 8<<20, 4<<10 // restarts strand leases: room for many
	sv := newServer(t, opts)
	c := newClient(t, sv)
	round := 0
	since := uint64(1)
	rapid.Check(t, func(rt *rapid.T) {
		round++
		prefix := fmt.Sprintf("r%d/", round) // each run starts from an empty key space
		model := map[string][]byte{}
		var w *writer
		session := proto.Write{Session: uint64(round), Seq: 0} // one writer's idempotency session
		type last struct {
			key    string
			delete bool
			write  proto.Write
			result Committed
		}
		var prev *last
		keyGen := rapid.SampledFrom([]string{"a", "b", "c", "d", "e"})
		writer := func(k string, n int) *writer {
			if w == nil || w.off+int64(len(k)+n+64) > w.lease.Size {
				w = c.newWriter()
			}
			return w
		}
		rt.Repeat(map[string]func(*rapid.T){
			"put": func(rt *rapid.T) {
				k := prefix + keyGen.Draw(rt, "key")
				v := rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(rt, "value")
				session.Seq++
				cm, err := writer(k, len(v)).putW([]byte(k), v, session)
				if err != nil {
					rt.Fatal(err)
				}
				model[k] = v
				prev = &last{key: k, write: session, result: cm}
			},
			"delete": func(rt *rapid.T) {
				k := prefix + keyGen.Draw(rt, "key")
				session.Seq++
				if err := sv.s.Delete(context.Background(), []byte(k), session); err != nil {
					rt.Fatal(err)
				}
				delete(model, k)
				prev = &last{key: k, delete: true, write: session}
			},
			"retry the last write": func(rt *rapid.T) {
				if prev == nil {
					rt.Skip("nothing written yet")
				}
				if prev.delete {
					if err := sv.s.Delete(context.Background(), []byte(prev.key), prev.write); err != nil {
						rt.Fatal(err)
					}
					return
				}
				cm, err := writer(prev.key, 8).putW([]byte(prev.key), []byte("a retry"), prev.write)
				if err != nil || cm.Version != prev.result.Version {
					rt.Fatalf("retry of %s: %+v, %v; first %+v", prev.key, cm, err, prev.result)
				}
			},
			"an older write": func(rt *rapid.T) {
				if prev == nil || prev.write.Seq < 2 {
					rt.Skip("no older write")
				}
				// Sessions are kept per shard: the key of the last
				// write has its seq.
				err := sv.s.Delete(context.Background(), []byte(prev.key), proto.Write{Session: session.Session, Seq: prev.write.Seq - 1})
				if !errors.Is(err, ErrSuperseded) {
					rt.Fatalf("an older seq: %v, want ErrSuperseded", err)
				}
			},
			"a migration aborted": func(rt *rapid.T) {
				sh := proto.ShardOf([]byte(prefix + keyGen.Draw(rt, "key")))
				if err := sv.s.FreezeShards(context.Background(), []proto.Shard{sh}); err != nil {
					rt.Fatal(err)
				}
				if err := sv.s.ReleaseShards([]proto.Shard{sh}); err != nil {
					rt.Fatal(err)
				}
				since++
				if err := sv.s.ActivateShards([]proto.Shard{sh}, since); err != nil {
					rt.Fatal(err)
				}
			},
			"restart": func(rt *rapid.T) {
				sv.restart()
				waitArenas(t, sv.s, opts.ArenaCount)
				w = nil // leases do not survive a restart
			},
			"crash": func(rt *rapid.T) {
				if err := sv.s.close(false); err != nil { // nothing flushed, checkpointed or synced
					rt.Fatal(err)
				}
				sv.open()
				waitArenas(t, sv.s, opts.ArenaCount)
				w = nil
			},
			"": func(rt *rapid.T) {
				for _, k := range []string{"a", "b", "c", "d", "e"} {
					got, ok := c.mustGet([]byte(prefix + k))
					want, exists := model[prefix+k]
					if ok != exists || !bytes.Equal(got, want) {
						rt.Fatalf("GET %s = %q (found %v), model has %q (%v)", prefix+k, got, ok, want, exists)
					}
				}
				checkAccounting(t, sv.s)
			},
		})
	})
}
