package proto

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

// testMap is a bootstrapped map of three servers, R=3, with moves of each
// kind in progress.
func testMap() *ClusterMap {
	m := &ClusterMap{
		Epoch:     9,
		ClusterID: 0xfeed,
		Replicas:  3,
		Servers: []MapServer{
			{Name: "node1", ID: "aaaaaaaaaaaaaaaa", State: ServerActive, Added: 1, Zone: "rack-a"},
			{Name: "node2", ID: "bbbbbbbbbbbbbbbb", State: ServerActive, Added: 2},
			{Name: "node3", ID: "cccccccccccccccc", State: ServerDraining, Added: 3, Zone: "rack-b"},
		},
		Shards: make([]MapShard, NumShards),
	}
	for i := range m.Shards {
		m.Shards[i] = MapShard{Owners: []uint16{uint16(i % 3)}, Origins: []uint64{uint64(i % 9)}, Since: uint64(1 + i%9)}
	}
	m.Shards[5].Move = &ShardMove{Kind: MoveReplace, From: 2, To: 0, Phase: MoveFrozen, Started: 8}
	m.Shards[6].Move = &ShardMove{Kind: MoveReplace, From: 0, To: 1, Phase: MoveCopying, Started: 9}
	m.Shards[7] = MapShard{Owners: []uint16{1, 2, 0}, Origins: []uint64{0, 4, 6}, Since: 2,
		Move: &ShardMove{Kind: MovePromote, From: 1, To: 0, Phase: MoveFrozen, Started: 8}}
	m.Shards[8] = MapShard{Owners: []uint16{2, 0}, Origins: []uint64{3, 5}, Since: 5,
		Move: &ShardMove{Kind: MoveAddReplica, From: 2, To: 1, Phase: MoveCopying, Started: 8}}
	m.Shards[9] = MapShard{Owners: []uint16{0, 1}, Origins: []uint64{0, 5}, Since: 1,
		Move: &ShardMove{Kind: MoveReplace, From: 1, To: 2, Phase: MoveCopying, Started: 7}}
	return m
}

func TestClusterMapRoundTrip(t *testing.T) {
	for _, m := range []*ClusterMap{testMap(), {Replicas: 1}, {Epoch: 1, ClusterID: 7, Replicas: 2, Servers: testMap().Servers}} {
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
		"unsorted servers":  func(m *ClusterMap) { m.Servers[0], m.Servers[1] = m.Servers[1], m.Servers[0] },
		"duplicate server":  func(m *ClusterMap) { m.Servers[1].Name = "node1" },
		"empty name":        func(m *ClusterMap) { m.Servers[0].Name = "" },
		"empty ID":          func(m *ClusterMap) { m.Servers[0].ID = "" },
		"state 0":           func(m *ClusterMap) { m.Servers[0].State = 0 },
		"few shards":        func(m *ClusterMap) { m.Shards = m.Shards[:10] },
		"no owner":          func(m *ClusterMap) { m.Shards[3].Owners = nil },
		"owner out of list": func(m *ClusterMap) { m.Shards[3].Owners = []uint16{3} },
		"owner twice":       func(m *ClusterMap) { m.Shards[3].Owners = []uint16{1, 1} },
		"since 0":           func(m *ClusterMap) { m.Shards[3].Since = 0 },
		"since future":      func(m *ClusterMap) { m.Shards[3].Since = m.Epoch + 1 },
		"move to owner": func(m *ClusterMap) {
			m.Shards[0].Move = &ShardMove{Kind: MoveReplace, To: 0, Phase: MoveCopying, Started: 9}
		},
		"move nowhere": func(m *ClusterMap) {
			m.Shards[0].Move = &ShardMove{Kind: MoveReplace, To: 7, Phase: MoveCopying, Started: 9}
		},
		"move phase 0": func(m *ClusterMap) { m.Shards[0].Move = &ShardMove{Kind: MoveReplace, To: 1, Started: 9} },
		"move kind 0":  func(m *ClusterMap) { m.Shards[0].Move = &ShardMove{To: 1, Phase: MoveCopying, Started: 9} },
		"move from a stranger": func(m *ClusterMap) {
			m.Shards[0].Move = &ShardMove{Kind: MoveReplace, From: 1, To: 2, Phase: MoveCopying, Started: 9}
		},
		"add-replica from a backup": func(m *ClusterMap) { m.Shards[8].Move.From = 0 },
		"add-replica of an owner":   func(m *ClusterMap) { m.Shards[8].Move.To = 0 },
		"promote a stranger":        func(m *ClusterMap) { m.Shards[6].Move.Kind = MovePromote },
		"promote the primary":       func(m *ClusterMap) { m.Shards[7].Move.To = 1 },
		"move before since":         func(m *ClusterMap) { m.Shards[6].Move.Started = 0 },
		"origin after since":        func(m *ClusterMap) { m.Shards[3].Origins[0] = m.Shards[3].Since },
		"backup origin now":         func(m *ClusterMap) { m.Shards[7].Origins[2] = m.Epoch },
		"origins short":             func(m *ClusterMap) { m.Shards[7].Origins = m.Shards[7].Origins[:2] },
		"shards, no server":         func(m *ClusterMap) { m.Servers = nil },
		"0 replicas":                func(m *ClusterMap) { m.Replicas = 0 },
		"17 replicas":               func(m *ClusterMap) { m.Replicas = MaxShardOwners + 1 },
		"long zone":                 func(m *ClusterMap) { m.Servers[1].Zone = string(make([]byte, MaxZoneLen+1)) },
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
		"empty":            {},
		"version 3":        body(t, 3, 1, 1, 1, []any{}, []any{}),
		"nil epoch":        body(t, MapVersion, nil, 1, 1, []any{}, []any{}),
		"nil servers":      body(t, MapVersion, 1, 1, 1, nil, []any{}),
		"nil replicas":     body(t, MapVersion, 1, 1, nil, []any{}, []any{}),
		"5 fields":         body(t, MapVersion, 1, 1, []any{}, []any{}),
		"version 1, 6":     body(t, 1, 1, 1, 1, []any{}, []any{}),
		"v1 server, in v2": body(t, MapVersion, 1, 1, 1, []any{[]any{"a", "b", 1, 1}}, []any{}),
		"trailing":         append(good[:len(good):len(good)], 0),
		"truncated":        good[:len(good)-1],
	} {
		if _, err := DecodeClusterMap(b); !errors.Is(err, ErrBadMap) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A map of version 1 (earlier releases' saved maps and snapshots) decodes
// as one replica a shard, each move a replacement of the owner.
func TestDecodeClusterMapVersion1(t *testing.T) {
	shards := make([]any, NumShards)
	for i := range shards {
		shards[i] = []any{[]any{i % 2}, 2, 1, nil}
	}
	shards[3] = []any{[]any{1}, 2, 0, []any{0, MoveCopying, 3}}
	b := body(t, 1, 4, 0xfeed, []any{[]any{"a", "aaaa", ServerActive, 1}, []any{"b", "bbbb", ServerActive, 2}}, shards)
	m, err := DecodeClusterMap(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Replicas != 1 || m.Servers[0].Zone != "" || !reflect.DeepEqual(m.Shards[2], MapShard{Owners: []uint16{0}, Origins: []uint64{1}, Since: 2}) {
		t.Fatalf("version 1 map: replicas %d, server %+v, shard 2 %+v", m.Replicas, m.Servers[0], m.Shards[2])
	}
	want := &ShardMove{Kind: MoveReplace, From: 1, To: 0, Phase: MoveCopying, Started: 3}
	if !reflect.DeepEqual(m.Shards[3].Move, want) {
		t.Fatalf("version 1 move: %+v, want %+v", m.Shards[3].Move, want)
	}
	if _, err := EncodeClusterMap(m); err != nil {
		t.Fatalf("a version 1 map does not re-encode: %v", err)
	}
	c, err := DecodeMapCommand(body(t, 1, MapStartMoves, []any{"", ""}, false, []any{[]any{3, "b", "a", 0}}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Op != MapStartMoves || !reflect.DeepEqual(c.Moves, []MoveCommand{{Shard: 3, From: "b", To: "a", Kind: MoveReplace}}) {
		t.Fatalf("version 1 command: %+v", c)
	}
}

func testCommands() []*MapCommand {
	return []*MapCommand{
		{Op: MapAddServer, Server: MapServer{Name: "node4", ID: "dddddddddddddddd", Zone: "rack-c"}},
		{Op: MapRemoveServer, Server: MapServer{Name: "node3"}, Force: true},
		{Op: MapStartMoves, Moves: []MoveCommand{{Shard: 1, From: "node1", To: "node4", Kind: MoveReplace}, {Shard: NumShards - 1, From: "node2", To: "node4", Kind: MoveAddReplica}}},
		{Op: MapFreezeMoves, Moves: []MoveCommand{{Shard: 1, From: "node1", To: "node4", Started: 12, Kind: MovePromote}}},
		{Op: MapAbortMoves},
		{Op: MapSetReplicas, Replicas: 3},
		{Op: MapDropReplicas, Moves: []MoveCommand{{Shard: 2, From: "node2", Kind: MoveReplace}}},
		{Op: MapFailOver, Moves: []MoveCommand{{Shard: 3, From: "node1", To: "node2", Kind: MoveReplace}}},
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
	for _, c := range []*MapCommand{{}, {Op: 99}, {Op: MapFreezeMoves, Moves: []MoveCommand{{Shard: NumShards}}},
		{Op: MapSetReplicas}, {Op: MapSetReplicas, Replicas: MaxShardOwners + 1}, {Op: MapAddServer, Replicas: 2},
		{Op: MapStartMoves, Moves: []MoveCommand{{Kind: 9}}}} {
		if _, err := EncodeMapCommand(c); !errors.Is(err, ErrBadMap) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if _, err := DecodeMapCommand(body(t, MapVersion, 1, []any{"a", "b", ""}, nil, []any{}, 0)); !errors.Is(err, ErrBadMap) {
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
	for _, m := range []*ClusterMap{testMap(), {Replicas: 1}} {
		b, _ := EncodeClusterMap(m)
		f.Add(b)
	}
	f.Add(body(f, MapVersion, nil, 1, 1, []any{}, []any{}))
	f.Add(body(f, 1, 4, 0xfeed, []any{[]any{"a", "aaaa", ServerActive, 1}}, []any{}))
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
