// The replication settings: Config.Replicas at bootstrap and ignored after, Config.Zone into gossip and the map, SetReplicas from a client session.

package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// A server bootstrapping a cluster with Replicas 3 and a zone starts the
// map at 3 replicas with the zone; a client session sets 2 (authenticated
// as for forget, answered with the map's new epoch); a bad count is refused
// by the decoder; restarted with another count and zone, the map keeps its
// count (an INFO line says the flag was ignored) and takes the new zone.
func TestReplicasAndZoneSettings(t *testing.T) {
	dir := t.TempDir()
	var logs logBuffer
	s := newTestServer(t, func(c *Config) {
		c.Store.Dir, c.AuthToken, c.Replicas, c.Zone, c.Logger = dir, "tok", 3, "rack-1", logs.logger()
	})
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	waitFor(t, 20*time.Second, "the bootstrap's replica count in the map", func() error {
		if m := s.Map(); m.Replicas() != 3 {
			return fmt.Errorf("map %v at %d replicas, want 3", m, m.Replicas())
		}
		return nil
	})
	if srv, _ := s.Map().Server("s1"); srv.Zone != "rack-1" || s.Meta().Zone != "rack-1" {
		t.Fatalf("zone in the map %q, in the metadata %q; want rack-1", srv.Zone, s.Meta().Zone)
	}
	if r := s.Map().Replication(); r.Target != 1 || r.UnderReplicated != 0 {
		t.Fatalf("one server at 3 replicas: %+v, want a target of 1 and none under-replicated", r)
	}

	// Not before a Hello: the session must be authenticated first.
	nc := dial(t, s)
	if e, ok := call(t, nc, 1, &proto.SetReplicas{Replicas: 2}).(*proto.Error); !ok || e.Code != proto.CodeUnauthenticated {
		t.Fatalf("SetReplicas before the Hello: %#v, want unauthenticated", e)
	}
	// With a wrong token, not at all.
	nc = dial(t, s)
	if e, ok := call(t, nc, 1, &proto.Hello{Client: "c", Token: []byte("nope"), NoQP: true}).(*proto.Error); !ok || e.Code != proto.CodeUnauthenticated {
		t.Fatalf("Hello with a wrong token: %#v", e)
	}
	if s.Map().Replicas() != 3 {
		t.Fatalf("replicas %d after refused sessions", s.Map().Replicas())
	}

	// A client session (not a peer's) may: the reply is the new epoch.
	nc = dial(t, s)
	if _, ok := call(t, nc, 1, &proto.Hello{Client: "c", Token: []byte("tok"), NoQP: true}).(*proto.HelloReply); !ok {
		t.Fatal("Hello refused")
	}
	before := s.Map().Epoch()
	r, ok := call(t, nc, 2, &proto.SetReplicas{Replicas: 2}).(*proto.MapChangeReply)
	if !ok || r.Epoch <= before {
		t.Fatalf("SetReplicas 2: %#v, want a MapChangeReply past epoch %d", r, before)
	}
	if m := s.Map(); m.Epoch() < r.Epoch || m.Replicas() != 2 {
		t.Fatalf("after SetReplicas 2 (epoch %d): map %v at %d replicas", r.Epoch, m, m.Replicas())
	}
	// Strictly decoded: 0 never reaches the handler.
	if _, err := nc.Write(framed(mp(t, []any{proto.ControlVersion, uint8(proto.MsgSetReplicas), 3, []any{0}}))); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, nc, "SetReplicas 0", "set replicas to 0")

	// A restart with another count: ignored, and said so; another zone:
	// the map takes it.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	var logs2 logBuffer
	s2 := newTestServer(t, func(c *Config) {
		c.Store.Dir, c.Bootstrap, c.Replicas, c.Zone, c.Logger = dir, true, 5, "rack-2", logs2.logger()
	})
	defer s2.Close()
	waitFor(t, 20*time.Second, "the new zone in the map", func() error {
		if srv, _ := s2.Map().Server("s1"); srv.Zone != "rack-2" {
			return fmt.Errorf("zone %q in the map %v", srv.Zone, s2.Map())
		}
		return nil
	})
	const ignored = "replica count given (--replicas) ignored: the cluster map's stands; change it with rkv-client replicas N"
	waitFor(t, 10*time.Second, "the INFO line", func() error {
		if recs := logs2.records(t, ignored); len(recs) != 1 || recs[0]["level"] != "INFO" || recs[0]["given"] != 5.0 || recs[0]["map_replicas"] != 2.0 {
			return fmt.Errorf("records %v", recs)
		}
		return nil
	})
	if recs := logs.records(t, ignored); len(recs) != 0 {
		t.Fatalf("the bootstrap logged the count ignored: %v", recs)
	}
	time.Sleep(time.Second) // the leader's duties ran a few times
	if m := s2.Map(); m.Replicas() != 2 {
		t.Fatalf("after a restart with Replicas 5: %d replicas, want the map's 2", m.Replicas())
	}
}

func TestReplicasAndZoneConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Replicas = -1 }, "Config.Replicas -1: must be 0 to 16"},
		{func(c *Config) { c.Replicas = proto.MaxShardOwners + 1 }, "Config.Replicas 17: must be 0 to 16"},
		{func(c *Config) { c.Zone = "rack 1" }, `Config.Zone: zone "rack 1": ' ' is not allowed`},
		{func(c *Config) { c.Zone = strings.Repeat("z", proto.MaxZoneLen+1) }, "bytes, at most 64"},
	} {
		cfg := Config{Name: "s1", Device: testDevice(t)}
		cfg.Store.Dir = t.TempDir()
		tc.mod(&cfg)
		_, err := cfg.withDefaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", cfg, err, tc.want)
		}
	}
}
