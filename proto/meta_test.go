package proto

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// testServerMeta is a server as it would advertise itself on verbs (the
// larger endpoint) with n arenas of 1 GiB.
func testServerMeta(n int) NodeMeta {
	m := NodeMeta{
		Role:        RoleServer,
		RKVVersion:  "v0.1.0-dev",
		ControlAddr: "server-12.rack-3.rkv.internal:7380",
		Provider:    "verbs",
		Endpoint: Endpoint{
			GID: [16]byte{0xfe, 0x80, 10: 0x02, 11: 0x1b, 12: 0x21, 13: 0xff, 14: 0xfe, 15: 0x3c},
			LID: 0x11,
		},
		Generation: 1_000_017,
		ServerID:   "3f9a0c71d2e84b56",
		ClusterID:  0x1234_5678_90ab_cdef,
		MapEpoch:   1234,
		Limits:     RecordLimits{MaxKeyLen: 1024, MaxValueLen: 1047520},
		Index: &IndexRegion{
			Addr:     0x7f3a_1c00_0000,
			RKey:     0x8a3c_11f2,
			Geometry: IndexGeometry{Slots: 1 << 22, Neighborhood: DefaultNeighborhood, Seed: 0x9e37_79b9_7f4a_7c15},
		},
	}
	for i := range n {
		m.Arenas = append(m.Arenas, ArenaRegion{
			ID:     uint16(i),
			Addr:   0x7f00_0000_0000 + uint64(i)<<30,
			Length: 1 << 30,
			RKey:   0x9000_0000 + uint32(i)*0x1_0001,
		})
	}
	return m
}

// worstServerMeta has every field at its widest encoding: arenas of 2^40
// bytes with IDs above 255.
func worstServerMeta(n int) NodeMeta {
	m := testServerMeta(0)
	m.Generation = 1<<64 - 1
	m.ServerID = strings.Repeat("f", MaxServerIDLen)
	m.ClusterID, m.MapEpoch = 1<<64-1, 1<<64-1
	m.Limits = RecordLimits{MaxKeyLen: MaxKeyLen, MaxValueLen: 1<<32 - 1}
	m.Index.Addr = 1<<63 + 12345
	m.Index.RKey = 1<<32 - 1
	m.Index.Geometry.Slots = 1 << 40
	m.Index.Geometry.Neighborhood = 255
	m.Index.Geometry.Seed = 1<<64 - 1
	for i := range n {
		m.Arenas = append(m.Arenas, ArenaRegion{
			ID:     uint16(MaxArenas - 1 - i),
			Addr:   1<<62 + uint64(i)<<40,
			Length: 1 << 40,
			RKey:   1<<32 - 1 - uint32(i),
		})
	}
	return m
}

// unitServerMeta has arenas of 512 MiB registered in 4 units of 128 MiB
// each, every unit its own region.
func unitServerMeta(arenas int) NodeMeta {
	m := testServerMeta(0)
	for i := range arenas {
		for u := range 4 {
			m.Arenas = append(m.Arenas, ArenaRegion{
				ID:     uint16(i),
				Addr:   0x7f00_0000_0000 + uint64(i)<<29 + uint64(u)<<27,
				Length: 1 << 27,
				RKey:   0x9000_0000 + uint32(i*4+u),
				Offset: uint64(u) << 27,
			})
		}
	}
	return m
}

func testClientMeta() NodeMeta {
	return NodeMeta{Role: RoleClient, RKVVersion: "v0.1.0-dev"}
}

func roundTrip(t *testing.T, m NodeMeta) []byte {
	t.Helper()
	b, err := EncodeNodeMeta(m)
	if err != nil {
		t.Fatalf("encode %+v: %v", m, err)
	}
	got, err := DecodeNodeMeta(b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := m
	want.Arenas = SortArenas(m.Arenas)
	if len(want.Arenas) == 0 {
		want.Arenas = nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	return b
}

func TestNodeMetaRoundTrip(t *testing.T) {
	roundTrip(t, testClientMeta())
	roundTrip(t, NodeMeta{Role: RoleClient, Leaving: true})
	roundTrip(t, testServerMeta(0))
	roundTrip(t, testServerMeta(5))
	roundTrip(t, worstServerMeta(3))
	soft := testServerMeta(2)
	soft.Provider, soft.Endpoint = "soft", Endpoint{Addr: "127.0.0.1:7390"}
	roundTrip(t, soft)
	noIndex := testServerMeta(0)
	noIndex.Index = nil
	roundTrip(t, noIndex)

	// Arenas in any order come back sorted.
	m := testServerMeta(4)
	m.Arenas[0], m.Arenas[3] = m.Arenas[3], m.Arenas[0]
	roundTrip(t, m)

	// Arenas in units: regions in any order come back sorted by arena
	// and offset.
	units := unitServerMeta(3)
	units.Arenas[1], units.Arenas[10] = units.Arenas[10], units.Arenas[1]
	roundTrip(t, units)

	// Detached, and attached (list and summary together).
	full := testServerMeta(40)
	det := full
	det.ArenaSet, det.Arenas = SummarizeArenas(full.Arenas), nil
	roundTrip(t, det)
	att := det
	att.Arenas = full.Arenas
	roundTrip(t, att)
}

func TestEndpointString(t *testing.T) {
	if s := (Endpoint{Addr: "127.0.0.1:7390"}).String(); s != "127.0.0.1:7390" {
		t.Errorf("soft endpoint %q", s)
	}
	if s := testServerMeta(0).Endpoint.String(); s != "gid fe80::21b:21ff:fe3c lid 17" {
		t.Errorf("verbs endpoint %q", s)
	}
}

// TestNodeMetaSize measures the encoding and pins the numbers that the
// comments of meta.go and package membership quote.
func TestNodeMetaSize(t *testing.T) {
	size := func(m NodeMeta) int {
		b, err := EncodeNodeMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	maxFit := func(mk func(int) NodeMeta) int {
		n := 0
		for size(mk(n+1)) <= GossipMetaMaxSize {
			n++
		}
		return n
	}
	t.Logf("client: %d bytes", size(testClientMeta()))
	want := map[int]int{0: 153, 1: 174, 4: 237, 8: 321, 16: 491}
	for _, n := range []int{0, 1, 4, 8, 16} {
		s, w := size(testServerMeta(n)), size(worstServerMeta(n))
		t.Logf("server with index and %2d arenas: %3d bytes (widest fields: %3d)", n, s, w)
		if s != want[n] {
			t.Errorf("%d arenas: %d bytes, the documentation says %d", n, s, want[n])
		}
	}
	typical, worst := maxFit(testServerMeta), maxFit(worstServerMeta)
	t.Logf("most arenas inline in %d bytes: %d (1 GiB arenas), %d (widest fields)", GossipMetaMaxSize, typical, worst)
	if typical != 17 || worst != 10 {
		t.Errorf("most arenas inline: %d and %d, the documentation says 17 and 10", typical, worst)
	}

	// Beyond that the list detaches, and the metadata stays small even
	// for the most arenas a server can have.
	for _, n := range []int{typical + 1, 64, MaxArenas} {
		for _, m := range []NodeMeta{testServerMeta(n), worstServerMeta(min(n, MaxArenas))} {
			b, detached, err := EncodeNodeMetaLimit(m, GossipMetaMaxSize)
			if err != nil || !detached || len(b) > GossipMetaMaxSize {
				t.Fatalf("%d arenas: %d bytes, detached %v, %v", n, len(b), detached, err)
			}
			got, err := DecodeNodeMeta(b)
			if err != nil || got.ArenaSet != SummarizeArenas(SortArenas(m.Arenas)) || len(got.Arenas) != 0 {
				t.Fatalf("%d arenas: decoded %+v, %v", n, got.ArenaSet, err)
			}
			if n == 64 && m.Generation != 1<<64-1 {
				t.Logf("64 arenas detached: %d bytes of metadata", len(b))
			}
		}
	}
	b, detached, err := EncodeNodeMetaLimit(testServerMeta(typical), GossipMetaMaxSize)
	if err != nil || detached || len(b) > GossipMetaMaxSize {
		t.Fatalf("%d arenas: %d bytes, detached %v, %v", typical, len(b), detached, err)
	}
}

func TestEncodeNodeMetaLimitRefuses(t *testing.T) {
	m := testClientMeta()
	m.RKVVersion = strings.Repeat("v", MaxMetaVersionLen)
	if _, _, err := EncodeNodeMetaLimit(m, 40); !errors.Is(err, ErrBadMeta) {
		t.Errorf("client of 70 bytes in 40: %v", err)
	}
	det := testServerMeta(0)
	det.ArenaSet = ArenaSet{Count: 3, Digest: 7}
	if _, _, err := EncodeNodeMetaLimit(det, GossipMetaMaxSize); !errors.Is(err, ErrBadMeta) {
		t.Errorf("detached input: %v", err)
	}
}

func TestNodeMetaValidate(t *testing.T) {
	bad := map[string]func(m *NodeMeta){
		"role 0":             func(m *NodeMeta) { m.Role = 0 },
		"role 9":             func(m *NodeMeta) { m.Role = 9 },
		"long control addr":  func(m *NodeMeta) { m.ControlAddr = strings.Repeat("h", MaxMetaAddrLen+1) },
		"long endpoint addr": func(m *NodeMeta) { m.Endpoint.Addr = strings.Repeat("h", MaxMetaAddrLen+1) },
		"long provider":      func(m *NodeMeta) { m.Provider = strings.Repeat("p", MaxMetaProviderLen+1) },
		"long version":       func(m *NodeMeta) { m.RKVVersion = strings.Repeat("v", MaxMetaVersionLen+1) },
		"bad geometry":       func(m *NodeMeta) { m.Index.Geometry.Slots = 3 },
		"index wraps":        func(m *NodeMeta) { m.Index.Addr = 1<<64 - 64 },
		"duplicate arena":    func(m *NodeMeta) { m.Arenas[1].ID = m.Arenas[0].ID },
		"arena ID too large": func(m *NodeMeta) { m.Arenas[1].ID = MaxArenas },
		"empty arena":        func(m *NodeMeta) { m.Arenas[0].Length = 0 },
		"arena too long":     func(m *NodeMeta) { m.Arenas[0].Length = MaxArenaOffset + 2 },
		"arena wraps":        func(m *NodeMeta) { m.Arenas[0].Addr = 1<<64 - 4096 },
		"set mismatch":       func(m *NodeMeta) { m.ArenaSet = ArenaSet{Count: 2, Digest: 1} },
		"digest without set": func(m *NodeMeta) { m.ArenaSet = ArenaSet{Digest: 1} },
		"set too large":      func(m *NodeMeta) { m.Arenas, m.ArenaSet = nil, ArenaSet{Count: MaxArenaRegions + 1} },
		"regions overlap": func(m *NodeMeta) {
			m.Arenas[1] = ArenaRegion{ID: 0, Addr: 1 << 40, Length: 4096, RKey: 1, Offset: 1<<30 - 4096}
		},
		"region ends past 2^40": func(m *NodeMeta) {
			m.Arenas[1] = ArenaRegion{ID: 1, Addr: 1 << 40, Length: 8192, RKey: 1, Offset: MaxArenaOffset - 4095}
		},
		"client with index":   func(m *NodeMeta) { m.Role = RoleClient; m.Arenas = nil },
		"client with arenas":  func(m *NodeMeta) { m.Role = RoleClient; m.Index = nil },
		"client with arenset": func(m *NodeMeta) { m.Role, m.Index, m.Arenas, m.ArenaSet = RoleClient, nil, nil, ArenaSet{Count: 1} },
	}
	for name, f := range bad {
		m := testServerMeta(2)
		f(&m)
		if _, err := EncodeNodeMeta(m); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: encoded, err %v", name, err)
		}
	}
	// Too many regions.
	m := testServerMeta(0)
	m.Arenas = make([]ArenaRegion, MaxArenaRegions+1)
	if _, err := EncodeNodeMeta(m); !errors.Is(err, ErrBadMeta) {
		t.Errorf("%d arenas: %v", len(m.Arenas), err)
	}
}

// encodeRaw builds msgpack by hand, for inputs EncodeNodeMeta refuses to
// produce.
func encodeRaw(t *testing.T, v ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := msgpack.NewEncoder(&buf).Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeNodeMetaRefuses(t *testing.T) {
	good, err := EncodeNodeMeta(testServerMeta(3))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := []any{"", nil, 0}
	cases := map[string][]byte{
		"empty":         nil,
		"not an array":  {0x01},
		"empty array":   {0x90},
		"truncated":     good[:len(good)-1],
		"trailing byte": append(append([]byte(nil), good...), 0xc0),
		"fields":        encodeRaw(t, MetaVersion, 2, false),
		"negative role": encodeRaw(t, MetaVersion, -1, false, "", "", "", endpoint, 0, nil, []any{}, nil),
		"string role":   encodeRaw(t, MetaVersion, "server", false, "", "", "", endpoint, 0, nil, []any{}, nil),
		"nil arenas":    encodeRaw(t, MetaVersion, 2, false, "", "", "", endpoint, 0, nil, nil, nil),
		"short GID":     encodeRaw(t, MetaVersion, 1, false, "", "", "", []any{"", []byte{1, 2}, 0}, 0, nil, []any{}, nil),
		"LID too large": encodeRaw(t, MetaVersion, 1, false, "", "", "", []any{"", nil, 1 << 16}, 0, nil, []any{}, nil),
		"empty set":     encodeRaw(t, MetaVersion, 1, false, "", "", "", endpoint, 0, nil, []any{}, []any{0, 0}),
		"unsorted arenas": encodeRaw(t, MetaVersion, 1, false, "", "", "", endpoint, 1, nil,
			[]any{[]any{2, 4096, 4096, 1}, []any{1, 8192, 4096, 1}}, nil),
		"unsorted regions": encodeRaw(t, MetaVersion, 1, false, "", "", "", endpoint, 1, nil,
			[]any{[]any{1, 8192, 4096, 1, 8192}, []any{1, 4096, 4096, 1}}, nil),
		"offset 0 written": encodeRaw(t, MetaVersion, 1, false, "", "", "", endpoint, 1, nil,
			[]any{[]any{1, 4096, 4096, 1, 0}}, nil),
		"arena of 6 fields": encodeRaw(t, MetaVersion, 1, false, "", "", "", endpoint, 1, nil,
			[]any{[]any{1, 4096, 4096, 1, 4096, 1}}, nil),
		"huge array":  {0x9b, 0x01, 0x01, 0xc2, 0xa0, 0xa0, 0xa0, 0x93, 0xa0, 0xc0, 0x00, 0x00, 0xc0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"huge string": append([]byte{0x9b, 0x01, 0x01, 0xc2, 0xdb, 0x7f, 0xff, 0xff, 0xff}, make([]byte, 32)...),
	}
	for name, b := range cases {
		if m, err := DecodeNodeMeta(b); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: decoded %+v, err %v", name, m, err)
		}
	}
}

func TestDecodeNodeMetaOtherVersion(t *testing.T) {
	b, err := EncodeNodeMeta(testClientMeta())
	if err != nil {
		t.Fatal(err)
	}
	b[1] = MetaVersion + 1 // the version follows the array header
	_, err = DecodeNodeMeta(b)
	if !errors.Is(err, ErrBadMeta) || !strings.Contains(err.Error(), fmt.Sprintf("metadata version %d; this node reads version %d", MetaVersion+1, MetaVersion)) {
		t.Fatalf("version %d: %v", MetaVersion+1, err)
	}
	// A later version may have another number of fields: the version
	// is what the error names.
	_, err = DecodeNodeMeta(encodeRaw(t, 7, "whatever"))
	if !errors.Is(err, ErrBadMeta) || !strings.Contains(err.Error(), "version 7") {
		t.Fatalf("version 7: %v", err)
	}
}

func TestLocateRecord(t *testing.T) {
	arenas := SortArenas(unitServerMeta(2).Arenas)
	const unit = 1 << 27
	cases := []struct {
		loc    Location
		offset uint64 // of the region found, when found
		found  bool
	}{
		{Location{Arena: 0, Offset: 0, Length: 64}, 0, true},
		{Location{Arena: 0, Offset: unit - 64, Length: 64}, 0, true},   // the unit's last bytes
		{Location{Arena: 0, Offset: unit - 64, Length: 128}, 0, false}, // straddles two units
		{Location{Arena: 0, Offset: unit, Length: 64}, unit, true},
		{Location{Arena: 1, Offset: 3*unit + 4096, Length: 4096}, 3 * unit, true},
		{Location{Arena: 1, Offset: 4*unit - 8, Length: 16}, 0, false}, // past the arena
		{Location{Arena: 2, Offset: 0, Length: 64}, 0, false},          // no such arena
	}
	for _, c := range cases {
		r, ok := LocateRecord(arenas, c.loc)
		if ok != c.found || ok && (r.ID != c.loc.Arena || r.Offset != c.offset) {
			t.Errorf("%+v: region %+v, found %v; want offset %d, found %v", c.loc, r, ok, c.offset, c.found)
		}
		if ok && r.RemoteAddr(c.loc.Offset) != r.Addr+c.loc.Offset-c.offset {
			t.Errorf("%+v: remote address %#x", c.loc, r.RemoteAddr(c.loc.Offset))
		}
	}
	// A region not yet registered is not found.
	missing := slices.Delete(slices.Clone(arenas), 1, 2) // arena 0's second unit
	if r, ok := LocateRecord(missing, Location{Arena: 0, Offset: unit + 4096, Length: 64}); ok {
		t.Errorf("found %+v in a unit that is not advertised", r)
	}
}

func TestArenaTablesRoundTrip(t *testing.T) {
	tables := []ArenaTable{
		{Node: "s1", Generation: 3, Arenas: testServerMeta(64).Arenas},
		{Node: "s2", Generation: 1<<64 - 1, Arenas: worstServerMeta(5).Arenas},
		{Node: "s3", Generation: 9},
	}
	b, err := EncodeArenaTables(tables)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3 tables (64, 5, 0 arenas): %d bytes", len(b))
	got, err := DecodeArenaTables(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range tables {
		tables[i].Arenas = SortArenas(tables[i].Arenas)
		if len(tables[i].Arenas) == 0 {
			tables[i].Arenas = nil
		}
	}
	if !reflect.DeepEqual(got, tables) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, tables)
	}

	// A table matches the detached metadata of its generation and list.
	full := testServerMeta(64)
	b, _, err = EncodeNodeMetaLimit(full, GossipMetaMaxSize)
	if err != nil {
		t.Fatal(err)
	}
	det, err := DecodeNodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	tab := ArenaTable{Node: "s1", Generation: full.Generation, Arenas: full.Arenas}
	if !tab.Matches(&det) {
		t.Error("the table does not match its metadata")
	}
	if tab.Matches(&full) {
		t.Error("a table matches metadata with inline arenas")
	}
	old := tab
	old.Generation--
	short := tab
	short.Arenas = short.Arenas[:63]
	changed := tab
	changed.Arenas = SortArenas(tab.Arenas)
	changed.Arenas[10].RKey++
	for name, x := range map[string]ArenaTable{"other generation": old, "fewer arenas": short, "another rkey": changed} {
		if x.Matches(&det) {
			t.Errorf("%s: matches", name)
		}
	}
}

func TestArenaTablesRefused(t *testing.T) {
	if _, err := EncodeArenaTables([]ArenaTable{{Node: ""}}); !errors.Is(err, ErrBadMeta) {
		t.Errorf("table without a node: %v", err)
	}
	dup := []ArenaRegion{{ID: 1, Addr: 4096, Length: 4096}, {ID: 1, Addr: 8192, Length: 4096}}
	if _, err := EncodeArenaTables([]ArenaTable{{Node: "s", Arenas: dup}}); !errors.Is(err, ErrBadMeta) {
		t.Errorf("duplicate arena IDs: %v", err)
	}
	good, _ := EncodeArenaTables([]ArenaTable{{Node: "s", Generation: 1, Arenas: testServerMeta(3).Arenas}})
	for name, b := range map[string][]byte{
		"empty":         nil,
		"truncated":     good[:len(good)-2],
		"trailing":      append(append([]byte(nil), good...), 0),
		"version":       encodeRaw(t, MetaVersion+1, []any{}),
		"fields":        encodeRaw(t, MetaVersion, []any{}, 1),
		"table fields":  encodeRaw(t, MetaVersion, []any{[]any{"s", 1}}),
		"no node":       encodeRaw(t, MetaVersion, []any{[]any{"", 1, []any{}}}),
		"unsorted":      encodeRaw(t, MetaVersion, []any{[]any{"s", 1, []any{[]any{2, 4096, 4096, 1}, []any{1, 8192, 4096, 1}}}}),
		"many tables":   {0x92, 0x01, 0xdd, 0x00, 0x10, 0x00, 0x00},
		"nil list":      {0x92, 0x01, 0xc0}, // found by FuzzDecodeArenaTables
		"arena of junk": encodeRaw(t, MetaVersion, []any{[]any{"s", 1, []any{"junk"}}}),
	} {
		if got, err := DecodeArenaTables(b); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: decoded %+v, err %v", name, got, err)
		}
	}
}

// preZoneMeta is what a server from before zones gossiped (the encoder of
// that release, run on zonedSample without its zone): 15 fields.
const preZoneMeta = "9f0301c2a676302e312e30ae3132372e302e302e313a37343131a4736f667493ae3132372e302e302e313a37343231c0000395cf00007f000000000005cd04000801919400cf00007e0000000000ce0400000009c0b030313233343536373839616263646566010992cd0400ce00100000"

// zonedSample is a soft server with a zone.
func zonedSample() NodeMeta {
	return NodeMeta{Role: RoleServer, RKVVersion: "v0.1.0", ControlAddr: "127.0.0.1:7411", Provider: "soft", Endpoint: Endpoint{Addr: "127.0.0.1:7421"},
		Generation: 3, Index: &IndexRegion{Addr: 0x7f00_0000_0000, RKey: 5, Geometry: IndexGeometry{Slots: 1024, Neighborhood: 8, Seed: 1}},
		Arenas: []ArenaRegion{{ID: 0, Addr: 0x7e00_0000_0000, Length: 1 << 26, RKey: 9}}, ServerID: "0123456789abcdef",
		ClusterID: 1, MapEpoch: 9, Limits: RecordLimits{MaxKeyLen: 1024, MaxValueLen: 1 << 20}, Zone: "eu-west-1a"}
}

// The zone is an optional trailing field: metadata without one is byte for
// byte what servers from before zones sent, and theirs still decodes.
func TestNodeMetaZone(t *testing.T) {
	old, err := hex.DecodeString(preZoneMeta)
	if err != nil {
		t.Fatal(err)
	}
	noZone := zonedSample()
	noZone.Zone = ""
	got, err := DecodeNodeMeta(old)
	if err != nil || !reflect.DeepEqual(got, noZone) {
		t.Fatalf("metadata of a server from before zones: %+v, %v; want %+v", got, err, noZone)
	}
	if b := roundTrip(t, noZone); !bytes.Equal(b, old) {
		t.Fatalf("without a zone: %x, want the 15-field encoding older nodes read, %x", b, old)
	}
	z := zonedSample()
	b := roundTrip(t, z)
	if want := len(old) + 3 + len(z.Zone); len(b) != want {
		t.Errorf("with zone %q: %d bytes, want %d (the comment in meta.go says 3 plus its length)", z.Zone, len(b), want)
	}
	if b[0] != 0xdc || b[1] != 0 || b[2] != metaFieldsZone {
		t.Errorf("with a zone: header % x, want an array of %d", b[:3], metaFieldsZone)
	}
	widest := z
	widest.Zone = strings.Repeat("z", MaxZoneLen)
	roundTrip(t, widest)

	for name, zone := range map[string]string{
		"too long": strings.Repeat("z", MaxZoneLen+1), "space": "rack 1", "tab": "rack\t1", "newline": "a\n", "not UTF-8": "\xff",
	} {
		m := zonedSample()
		m.Zone = zone
		if _, err := EncodeNodeMeta(m); !errors.Is(err, ErrBadMeta) {
			t.Errorf("zone %s (%q): encoded, err %v", name, zone, err)
		}
	}
	client := testClientMeta()
	client.Zone = "a"
	if _, err := EncodeNodeMeta(client); !errors.Is(err, ErrBadMeta) {
		t.Errorf("a client with a zone: %v", err)
	}

	// A 16th field that is empty, nil, not a string or too long, or a
	// 17th, is refused: one encoding per value.
	raw := func(zone any, extra ...any) []byte {
		// The 15 fields of old, then zone (and extra), in a new header.
		var buf bytes.Buffer
		e := msgpack.NewEncoder(&buf)
		_ = e.EncodeArrayLen(metaFields + 1 + len(extra))
		buf.Write(old[1:])
		for _, v := range append([]any{zone}, extra...) {
			_ = e.Encode(v)
		}
		return buf.Bytes()
	}
	if got, err := DecodeNodeMeta(raw("rack-1")); err != nil || got.Zone != "rack-1" {
		t.Fatalf("hand-built zoned metadata: %+v, %v", got, err)
	}
	for name, b := range map[string][]byte{
		"empty zone":  raw(""),
		"nil zone":    raw(nil),
		"zone as int": raw(7),
		"long zone":   raw(strings.Repeat("z", MaxZoneLen+1)),
		"zone, space": raw("rack 1"),
		"17 fields":   raw("rack-1", "more"),
	} {
		if m, err := DecodeNodeMeta(b); !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: decoded %+v, err %v", name, m, err)
		}
	}
}

func FuzzDecodeNodeMeta(f *testing.F) {
	det, _, _ := EncodeNodeMetaLimit(testServerMeta(64), GossipMetaMaxSize)
	f.Add(det)
	if old, err := hex.DecodeString(preZoneMeta); err == nil {
		f.Add(old)
	}
	for _, m := range []NodeMeta{testClientMeta(), testServerMeta(0), testServerMeta(3), worstServerMeta(2), zonedSample(), unitServerMeta(2)} {
		b, err := EncodeNodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{0x9b, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeNodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrBadMeta) {
				t.Fatalf("error %v does not wrap ErrBadMeta", err)
			}
			return
		}
		// Whatever decodes re-encodes to the same value, canonically.
		b2, err := EncodeNodeMeta(m)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", m, err)
		}
		m2, err := DecodeNodeMeta(b2)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-decoded %+v, %v; want %+v", m2, err, m)
		}
		if b3, _ := EncodeNodeMeta(m2); !bytes.Equal(b2, b3) {
			t.Fatal("encoding is not canonical")
		}
	})
}

func FuzzDecodeArenaTables(f *testing.F) {
	b, _ := EncodeArenaTables([]ArenaTable{{Node: "s1", Generation: 2, Arenas: testServerMeta(5).Arenas}, {Node: "c", Generation: 1}})
	f.Add(b)
	units, _ := EncodeArenaTables([]ArenaTable{{Node: "s2", Generation: 3, Arenas: unitServerMeta(2).Arenas}})
	f.Add(units)
	f.Add(b[:len(b)-3])
	f.Add([]byte("\x92\x01\xc00")) // a nil list once made a slice of capacity -1
	f.Fuzz(func(t *testing.T, b []byte) {
		tables, err := DecodeArenaTables(b)
		if err != nil {
			if !errors.Is(err, ErrBadMeta) {
				t.Fatalf("error %v does not wrap ErrBadMeta", err)
			}
			return
		}
		b2, err := EncodeArenaTables(tables)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", tables, err)
		}
		if t2, err := DecodeArenaTables(b2); err != nil || !reflect.DeepEqual(t2, tables) {
			t.Fatalf("re-decoded %+v, %v; want %+v", t2, err, tables)
		}
	})
}
