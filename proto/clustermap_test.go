package proto

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

// testMap is a bootstrapped map of three servers with one shard moving.
func testMap() *ClusterMap {
	m := &ClusterMap{
		Epoch:     9,
		ClusterID: 0xfeed,
		Servers: []MapServer{
			{Name: "node1", ID: "aaaaaaaaaaaaaaaa", State: ServerActive, Added: 1},
			{Name: "node2", ID: "bbbbbbbbbbbbbbbb", State: ServerActive, Added: 2},
			{Name: "node3", ID: "cccccccccccccccc", State: ServerDraining, Added: 3},
		},
		Shards: make([]MapShard, NumShards),
	}
	for i := range m.Shards {
		m.Shards[i] = MapShard{Owners: []uint16{uint16(i % 3)}, Since: uint64(1 + i%9), Origin: uint64(i % 9)}
	}
	m.Shards[5].Move = &ShardMove{To: 0, Phase: MoveFrozen, Started: 8}
	m.Shards[6].Move = &ShardMove{To: 1, Phase: MoveCopying, Started: 9}
	return m
}

func TestClusterMapRoundTrip(t *testing.T) {
	for _, m := range []*ClusterMap{testMap(), {}, {Epoch: 1, ClusterID: 7, Servers: testMap().Servers}} {
		b, err := EncodeClusterMap(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeClusterMap(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
		}
	}
	b, _ := EncodeClusterMap(testMap())
	t.Logf("a map of 3 servers and %d shards: %d bytes", NumShards, len(b))
	if len(b) > 16<<10 {
		t.Errorf("map of %d bytes: clients fetch it whole", len(b))
	}
}

func TestClusterMapValidate(t *testing.T) {
	for name, mutate := range map[string]func(m *ClusterMap){
		"unsorted servers":   func(m *ClusterMap) { m.Servers[0], m.Servers[1] = m.Servers[1], m.Servers[0] },
		"duplicate server":   func(m *ClusterMap) { m.Servers[1].Name = "node1" },
		"empty name":         func(m *ClusterMap) { m.Servers[0].Name = "" },
		"empty ID":           func(m *ClusterMap) { m.Servers[0].ID = "" },
		"state 0":            func(m *ClusterMap) { m.Servers[0].State = 0 },
		"few shards":         func(m *ClusterMap) { m.Shards = m.Shards[:10] },
		"no owner":           func(m *ClusterMap) { m.Shards[3].Owners = nil },
		"owner out of list":  func(m *ClusterMap) { m.Shards[3].Owners = []uint16{3} },
		"owner twice":        func(m *ClusterMap) { m.Shards[3].Owners = []uint16{1, 1} },
		"since 0":            func(m *ClusterMap) { m.Shards[3].Since = 0 },
		"since future":       func(m *ClusterMap) { m.Shards[3].Since = m.Epoch + 1 },
		"move to owner":      func(m *ClusterMap) { m.Shards[0].Move = &ShardMove{To: 0, Phase: MoveCopying, Started: 9} },
		"move nowhere":       func(m *ClusterMap) { m.Shards[0].Move = &ShardMove{To: 7, Phase: MoveCopying, Started: 9} },
		"move phase 0":       func(m *ClusterMap) { m.Shards[0].Move = &ShardMove{To: 1, Started: 9} },
		"move before since":  func(m *ClusterMap) { m.Shards[8].Move = &ShardMove{To: 1, Phase: MoveCopying, Started: 1} },
		"origin after since": func(m *ClusterMap) { m.Shards[3].Origin = m.Shards[3].Since },
		"shards, no server":  func(m *ClusterMap) { m.Servers = nil },
	} {
		m := testMap()
		mutate(m)
		if _, err := EncodeClusterMap(m); !errors.Is(err, ErrBadMap) {
			t.Errorf("%s: encoded: %v", name, err)
		}
	}
}

func TestDecodeClusterMapRefuses(t *testing.T) {
	good, _ := EncodeClusterMap(testMap())
	for name, b := range map[string][]byte{
		"empty":       {},
		"version 2":   body(t, 2, 1, 1, []any{}, []any{}),
		"nil epoch":   body(t, MapVersion, nil, 1, []any{}, []any{}),
		"nil servers": body(t, MapVersion, 1, 1, nil, []any{}),
		"4 fields":    body(t, MapVersion, 1, 1, []any{}),
		"trailing":    append(good[:len(good):len(good)], 0),
		"truncated":   good[:len(good)-1],
	} {
		if _, err := DecodeClusterMap(b); !errors.Is(err, ErrBadMap) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func testCommands() []*MapCommand {
	return []*MapCommand{
		{Op: MapAddServer, Server: MapServer{Name: "node4", ID: "dddddddddddddddd"}},
		{Op: MapRemoveServer, Server: MapServer{Name: "node3"}, Force: true},
		{Op: MapStartMoves, Moves: []MoveCommand{{Shard: 1, From: "node1", To: "node4"}, {Shard: NumShards - 1, From: "node2", To: "node4"}}},
		{Op: MapFreezeMoves, Moves: []MoveCommand{{Shard: 1, From: "node1", To: "node4", Started: 12}}},
		{Op: MapAbortMoves},
	}
}

func TestMapCommandRoundTrip(t *testing.T) {
	for _, c := range testCommands() {
		b, err := EncodeMapCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeMapCommand(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
		}
	}
	for _, c := range []*MapCommand{{}, {Op: 99}, {Op: MapFreezeMoves, Moves: []MoveCommand{{Shard: NumShards}}}} {
		if _, err := EncodeMapCommand(c); !errors.Is(err, ErrBadMap) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if _, err := DecodeMapCommand(body(t, MapVersion, 1, []any{"a", "b"}, nil, []any{})); !errors.Is(err, ErrBadMap) {
		t.Errorf("nil force: %v", err)
	}
}

// TestShardOfIsBalanced: keys spread over the shards within a few standard
// deviations of uniform, and the function is stable (it is part of the
// format: the store keys its entries by it).
func TestShardOfIsBalanced(t *testing.T) {
	const n = 1 << 20
	var counts [NumShards]int
	key := make([]byte, 0, 16)
	for i := range n {
		key = append(key[:0], "user:"...)
		key = appendInt(key, i)
		counts[ShardOf(key)]++
	}
	mean := float64(n) / NumShards
	sd := math.Sqrt(mean)
	for s, c := range counts {
		if math.Abs(float64(c)-mean) > 6*sd {
			t.Fatalf("shard %d holds %d keys, mean %.0f (sd %.0f)", s, c, mean, sd)
		}
	}
	for key, want := range map[string]Shard{"a": ShardOf([]byte("a")), "user:1": ShardOf([]byte("user:1"))} {
		if ShardOf([]byte(key)) != want {
			t.Fatalf("ShardOf(%q) changed", key)
		}
	}
	if got := ShardOf([]byte("user:1")); got != 709 {
		t.Errorf("ShardOf(user:1) = %d: the function changed, and with it every data directory's layout", got)
	}
}

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

func TestShardWordLayout(t *testing.T) {
	g := IndexGeometry{Slots: 1 << 10, Neighborhood: DefaultNeighborhood}
	if g.ShardWordOffset(0) != g.TableBytes() || g.ShardWordOffset(NumShards-1)+ShardWordSize != g.RegionBytes() {
		t.Fatalf("shard words at %d..%d of a %d-byte region after a %d-byte table",
			g.ShardWordOffset(0), g.ShardWordOffset(NumShards-1), g.RegionBytes(), g.TableBytes())
	}
}

// FuzzDecodeClusterMap: no input panics; whatever decodes re-encodes to
// the same map.
func FuzzDecodeClusterMap(f *testing.F) {
	for _, m := range []*ClusterMap{testMap(), {}} {
		b, _ := EncodeClusterMap(m)
		f.Add(b)
	}
	f.Add(body(f, MapVersion, nil, 1, []any{}, []any{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeClusterMap(b)
		if err != nil {
			if !errors.Is(err, ErrBadMap) {
				t.Fatalf("error not wrapping ErrBadMap: %v", err)
			}
			return
		}
		enc, err := EncodeClusterMap(m)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", m, err)
		}
		m2, err := DecodeClusterMap(enc)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-encoded map decodes to %+v, %v", m2, err)
		}
	})
}

// FuzzDecodeMapCommand: the same for map commands, the Raft log's entries.
func FuzzDecodeMapCommand(f *testing.F) {
	for _, c := range testCommands() {
		b, _ := EncodeMapCommand(c)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeMapCommand(b)
		if err != nil {
			if !errors.Is(err, ErrBadMap) {
				t.Fatalf("error not wrapping ErrBadMap: %v", err)
			}
			return
		}
		enc, err := EncodeMapCommand(c)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", c, err)
		}
		c2, err := DecodeMapCommand(enc)
		if err != nil || !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-encoded command decodes to %+v, %v", c2, err)
		}
	})
}

func TestPrefixEnd(t *testing.T) {
	for _, c := range []struct{ prefix, want []byte }{
		{[]byte("user:"), []byte("user;")},
		{[]byte{'a', 0xff}, []byte{'b'}},
		{[]byte{0xff, 0xff}, nil},
		{nil, nil},
	} {
		if got := PrefixEnd(c.prefix); !bytes.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("PrefixEnd(%q) = %q, want %q", c.prefix, got, c.want)
		}
	}
	p := []byte("ab")
	PrefixEnd(p)
	if string(p) != "ab" {
		t.Errorf("PrefixEnd changed its argument to %q", p)
	}
}
