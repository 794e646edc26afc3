// Gossip node metadata: what a node tells the cluster about itself.

package proto

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// Every node gossips a NodeMeta (memberlist's node metadata, at most
// GossipMetaMaxSize bytes). It is one msgpack array, positional so that it
// stays small:
//
//	[ MetaVersion, role, leaving, rkvVersion, controlAddr, provider,
//	  [endpointAddr, gid (bin 16) | nil, lid],
//	  generation,
//	  [indexAddr, indexRKey, slots, neighborhood, seed] | nil,
//	  [[arenaID, addr, length, rkey(, offset)], ...], // sorted by ID, offset
//	  [arenaCount, arenaDigest] | nil,
//	  serverID, clusterID, mapEpoch,
//	  [maxKeyLen, maxValueLen] | nil,
//	  zone ]                                     // only when set
//
// Integers take msgpack's smallest form. Measured (TestNodeMetaSize) for a
// verbs server with its index, a 34-byte control address, a 16-character
// server ID, its record limits and 1 GiB arenas at 47-bit addresses with
// 32-bit rkeys: 153 bytes with no arena, 174 with one, 237 with 4, 321
// with 8, 491 with 16; an arena costs about 21 bytes (27 at most). So 17
// arenas fit in memberlist's 512 bytes (10 with every field at its
// widest). Beyond that, EncodeNodeMetaLimit leaves the arena list out and
// keeps its count and digest (ArenaSet): 163 bytes for 64 arenas. The list then travels as an
// ArenaTable, in memberlist's push/pull state and in direct messages. An
// arena registered in units is a region per unit, each with its offset
// (up to 9 bytes more): 8 arenas of 1 GiB in 128 MiB units are 64 regions.
//
// The version comes first. A decoder refuses any other version: the layout
// is exact, so a change of layout is a new MetaVersion, and a cluster moves
// to it only once every node can read it. One exception, the zone: it is
// the one optional trailing field (16 fields instead of 15), written only
// when the server has one, so that a server without a zone stays readable
// by nodes from before zones, and their metadata by this one. A server
// with a zone is refused by such nodes (as metadata of 16 fields): upgrade
// them before giving servers zones. An empty zone is never written, so
// each value has one encoding. It costs 3 bytes plus its length (the
// array header takes 2 more bytes past 15 fields). An arena region's
// offset is optional the same way: written only when it is not 0, so an
// arena registered whole (one region at offset 0) reads as before, and
// only the later regions of an arena registered in units are refused by
// nodes from before them.
const (
	MetaVersion = 3

	// GossipMetaMaxSize is memberlist's limit on node metadata
	// (memberlist.MetaMaxSize).
	GossipMetaMaxSize = 512

	// Length limits of NodeMeta's strings.
	MaxMetaAddrLen     = 255 // ControlAddr and Endpoint.Addr: host:port
	MaxMetaProviderLen = 32
	MaxMetaVersionLen  = 64 // RKVVersion
	MaxMetaNodeNameLen = 512
	MaxServerIDLen     = 64 // NodeMeta.ServerID
)

// ErrBadMeta means gossip metadata or an arena table that is malformed, of
// another MetaVersion, or inconsistent. Encoders return it too, for values
// that could never be decoded.
var ErrBadMeta = errors.New("proto: bad node metadata")

// Role is what a node does in the cluster.
type Role uint8

// Roles.
const (
	RoleServer Role = 1 // holds data; placement puts keys on servers only
	RoleClient Role = 2 // reads the view; holds no data
)

func (r Role) String() string {
	switch r {
	case RoleServer:
		return "server"
	case RoleClient:
		return "client"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Endpoint is where a server's RDMA device is reached. The soft provider
// uses Addr (host:port of the device's data endpoint); verbs uses GID and
// LID (LID 0 on RoCE).
type Endpoint struct {
	Addr string
	GID  [16]byte
	LID  uint16
}

func (e Endpoint) String() string {
	var parts []string
	if e.Addr != "" {
		parts = append(parts, e.Addr)
	}
	if e.GID != ([16]byte{}) {
		parts = append(parts, "gid "+netip.AddrFrom16(e.GID).String())
	}
	if e.LID != 0 {
		parts = append(parts, fmt.Sprintf("lid %d", e.LID))
	}
	return strings.Join(parts, " ")
}

// IndexRegion is where a server's one-sided hash index lies: the table's
// registered memory and the geometry a reader needs to find a key in it.
type IndexRegion struct {
	Addr     uint64
	RKey     uint32
	Geometry IndexGeometry
}

// ArenaRegion is one registered part of an arena that a reader may
// RDMA_READ: the arena's bytes [Offset, Offset+Length), at Addr. A server
// registers its arenas in units (so that the first serves while the rest
// are still pinned) and advertises each unit as its own region, with its
// own rkey; a record never straddles two.
type ArenaRegion struct {
	ID     uint16 // below MaxArenas; what index slots name
	Addr   uint64 // remote address of the region's first byte (arena offset Offset)
	Length uint64
	RKey   uint32 // read-only capability
	Offset uint64 // where the region starts in its arena
}

// Contains reports whether the region holds the arena's bytes
// [off, off+n).
func (a ArenaRegion) Contains(off, n uint64) bool {
	return off >= a.Offset && off-a.Offset <= a.Length && n <= a.Length-(off-a.Offset)
}

// RemoteAddr is where arena offset off, inside the region, lies remotely.
func (a ArenaRegion) RemoteAddr(off uint64) uint64 { return a.Addr + (off - a.Offset) }

// LocateRecord finds the region of arenas (sorted by ID and offset, as
// every decoder returns them and SortArenas sorts) that holds the record
// at loc.
func LocateRecord(arenas []ArenaRegion, loc Location) (ArenaRegion, bool) {
	// The last region at or before (loc.Arena, loc.Offset).
	i, found := slices.BinarySearchFunc(arenas, loc, func(a ArenaRegion, l Location) int {
		if c := cmp.Compare(a.ID, l.Arena); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, l.Offset)
	})
	if !found {
		i--
	}
	if i < 0 || arenas[i].ID != loc.Arena || !arenas[i].Contains(loc.Offset, uint64(loc.Length)) {
		return ArenaRegion{}, false
	}
	return arenas[i], true
}

// ArenaSet summarizes an arena list that travels outside the metadata:
// how many arenas, and ArenaDigest of the list. The zero value means the
// arenas are inline (NodeMeta.Arenas).
type ArenaSet struct {
	Count  int
	Digest uint64
}

// NodeMeta is a node's gossip metadata.
type NodeMeta struct {
	Role        Role
	Leaving     bool   // the node is leaving the cluster on purpose
	RKVVersion  string // the software's version, for operators
	ControlAddr string // host:port of the control RPC listener
	Provider    string // RDMA provider: "soft" or "verbs"
	Endpoint    Endpoint

	// Generation changes at every start of a server; the index and all
	// arenas belong to it, and their rkeys die with it.
	Generation uint64
	Index      *IndexRegion // nil until the index is registered, and on clients

	// Arenas is the arena list, sorted by ID. When the list is too large
	// for memberlist's 512 bytes, the encoded metadata carries ArenaSet
	// instead and Arenas is empty until the list arrives out of band; a
	// NodeMeta may also carry both (the list attached to its summary),
	// and then they must agree.
	Arenas   []ArenaRegion
	ArenaSet ArenaSet

	// ServerID identifies a server's data directory: made at its first
	// start and kept there, so a server that lost its data (or another
	// one under a reused name) is told apart from the one the cluster map
	// knows. Empty on clients.
	ServerID string
	// ClusterID is the cluster's identity, from its map: 0 until the node
	// holds a map.
	ClusterID uint64
	// MapEpoch is the epoch of the cluster map this node holds (0: none
	// yet). A client that sees a higher epoch than its own refreshes its
	// map.
	MapEpoch uint64
	// Limits are the largest key and value a server takes, so that a
	// writer checks them before it writes anything. Zero on clients.
	Limits RecordLimits
	// Zone is the server's failure domain (its --zone, CheckZone), which
	// the map's leader puts into the map; "" when it names none, and on
	// clients.
	Zone string
}

// RecordLimits bound a record's key and value, in bytes.
type RecordLimits struct {
	MaxKeyLen, MaxValueLen uint32
}

// Detached reports whether the arena list travels outside the metadata.
func (m *NodeMeta) Detached() bool { return m.ArenaSet.Count != 0 }

// ArenaTable is one server's full arena list for one generation: what
// travels outside the metadata when the list does not fit in it.
type ArenaTable struct {
	Node       string // the server's memberlist name
	Generation uint64
	Arenas     []ArenaRegion // sorted by ID
}

// Matches reports whether t is the list that the detached metadata m
// describes.
func (t *ArenaTable) Matches(m *NodeMeta) bool {
	return m.Detached() && t.Generation == m.Generation && SummarizeArenas(t.Arenas) == m.ArenaSet
}

// SummarizeArenas returns the count and digest of an arena list; the list
// must be sorted by ID (as EncodeNodeMeta writes it and every decoder
// returns it).
func SummarizeArenas(arenas []ArenaRegion) ArenaSet {
	if len(arenas) == 0 {
		return ArenaSet{}
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	encodeArenas(e, arenas)
	return ArenaSet{Count: len(arenas), Digest: xxhash.Sum64(buf.Bytes())}
}

// SortArenas returns the arena regions sorted by ID and offset, as a new
// slice.
func SortArenas(arenas []ArenaRegion) []ArenaRegion {
	s := slices.Clone(arenas)
	slices.SortFunc(s, func(a, b ArenaRegion) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Offset, b.Offset))
	})
	return s
}

// Validate checks m as an encoder and a decoder do. Errors wrap ErrBadMeta.
func (m *NodeMeta) Validate() error {
	switch m.Role {
	case RoleServer, RoleClient:
	default:
		return badMeta("role %d", m.Role)
	}
	for _, s := range []struct {
		name, v string
		max     int
	}{
		{"rkv version", m.RKVVersion, MaxMetaVersionLen},
		{"control address", m.ControlAddr, MaxMetaAddrLen},
		{"provider", m.Provider, MaxMetaProviderLen},
		{"endpoint address", m.Endpoint.Addr, MaxMetaAddrLen},
		{"server ID", m.ServerID, MaxServerIDLen},
		{"zone", m.Zone, MaxZoneLen},
	} {
		if len(s.v) > s.max {
			return badMeta("%s of %d bytes, limit %d", s.name, len(s.v), s.max)
		}
	}
	if m.Role == RoleClient && (m.Index != nil || len(m.Arenas) != 0 || m.Detached() || m.ServerID != "" || m.Limits != (RecordLimits{}) || m.Zone != "") {
		return badMeta("a client advertises no index, arenas, server ID, limits or zone")
	}
	if err := CheckZone(m.Zone); err != nil {
		return badMeta("%v", err)
	}
	if m.Limits.MaxKeyLen > MaxKeyLen {
		return badMeta("key limit %d, beyond the record format's %d", m.Limits.MaxKeyLen, MaxKeyLen)
	}
	if x := m.Index; x != nil {
		if err := x.Geometry.Validate(); err != nil {
			return fmt.Errorf("%w: index: %w", ErrBadMeta, err)
		}
		if x.Addr+uint64(x.Geometry.RegionBytes()) < x.Addr {
			return badMeta("index at %#x of %d bytes wraps around", x.Addr, x.Geometry.RegionBytes())
		}
	}
	if err := validateArenas(m.Arenas); err != nil {
		return err
	}
	if m.Detached() {
		if m.ArenaSet.Count < 0 || m.ArenaSet.Count > MaxArenaRegions {
			return badMeta("arena set of %d regions, limit %d", m.ArenaSet.Count, MaxArenaRegions)
		}
		if len(m.Arenas) != 0 && SummarizeArenas(m.Arenas) != m.ArenaSet {
			return badMeta("%d arenas do not match the arena set (%d, %#x)", len(m.Arenas), m.ArenaSet.Count, m.ArenaSet.Digest)
		}
	} else if m.ArenaSet.Digest != 0 {
		return badMeta("arena digest without a count")
	}
	return nil
}

func validateArenas(arenas []ArenaRegion) error {
	if len(arenas) > MaxArenaRegions {
		return badMeta("%d arena regions, limit %d", len(arenas), MaxArenaRegions)
	}
	for i, a := range arenas {
		if a.ID >= MaxArenas {
			return badMeta("arena ID %d, limit %d", a.ID, MaxArenas-1)
		}
		if a.Length == 0 || a.Length > MaxArenaOffset+1 || a.Offset > MaxArenaOffset+1-a.Length {
			return badMeta("arena %d region at offset %d of %d bytes: must be 1 to 2^40 bytes, ending by 2^40", a.ID, a.Offset, a.Length)
		}
		if a.Addr+a.Length < a.Addr {
			return badMeta("arena %d at %#x of %d bytes wraps around", a.ID, a.Addr, a.Length)
		}
		if i == 0 {
			continue
		}
		if p := arenas[i-1]; a.ID < p.ID || a.ID == p.ID && a.Offset < p.Offset+p.Length {
			return badMeta("arena %d region at offset %d after arena %d region at %d of %d bytes: not sorted by arena and offset, or overlapping",
				a.ID, a.Offset, p.ID, p.Offset, p.Length)
		}
	}
	return nil
}

func badMeta(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadMeta}, args...)...)
}

// EncodeNodeMeta encodes m, its arenas sorted by ID, whatever its size.
// Errors wrap ErrBadMeta.
func EncodeNodeMeta(m NodeMeta) ([]byte, error) {
	m.Arenas = SortArenas(m.Arenas)
	if err := m.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	fields := metaFields
	if m.Zone != "" {
		fields = metaFieldsZone
	}
	_ = e.EncodeArrayLen(fields)
	_ = e.EncodeUint(MetaVersion)
	_ = e.EncodeUint(uint64(m.Role))
	_ = e.EncodeBool(m.Leaving)
	_ = e.EncodeString(m.RKVVersion)
	_ = e.EncodeString(m.ControlAddr)
	_ = e.EncodeString(m.Provider)
	_ = e.EncodeArrayLen(3)
	_ = e.EncodeString(m.Endpoint.Addr)
	if m.Endpoint.GID == ([16]byte{}) {
		_ = e.EncodeNil()
	} else {
		_ = e.EncodeBytes(m.Endpoint.GID[:])
	}
	_ = e.EncodeUint(uint64(m.Endpoint.LID))
	_ = e.EncodeUint(m.Generation)
	if x := m.Index; x == nil {
		_ = e.EncodeNil()
	} else {
		_ = e.EncodeArrayLen(5)
		_ = e.EncodeUint(x.Addr)
		_ = e.EncodeUint(uint64(x.RKey))
		_ = e.EncodeUint(x.Geometry.Slots)
		_ = e.EncodeUint(uint64(x.Geometry.Neighborhood))
		_ = e.EncodeUint(x.Geometry.Seed)
	}
	encodeArenas(e, m.Arenas)
	if !m.Detached() {
		_ = e.EncodeNil()
	} else {
		_ = e.EncodeArrayLen(2)
		_ = e.EncodeUint(uint64(m.ArenaSet.Count))
		_ = e.EncodeUint(m.ArenaSet.Digest)
	}
	_ = e.EncodeString(m.ServerID)
	_ = e.EncodeUint(m.ClusterID)
	_ = e.EncodeUint(m.MapEpoch)
	if m.Limits == (RecordLimits{}) {
		_ = e.EncodeNil()
	} else {
		_ = e.EncodeArrayLen(2)
		_ = e.EncodeUint(uint64(m.Limits.MaxKeyLen))
		_ = e.EncodeUint(uint64(m.Limits.MaxValueLen))
	}
	if m.Zone != "" {
		_ = e.EncodeString(m.Zone)
	}
	return buf.Bytes(), nil // writes to a bytes.Buffer cannot fail
}

// metaFields is the length of a MetaVersion 3 metadata array;
// metaFieldsZone with the optional zone.
const (
	metaFields     = 15
	metaFieldsZone = metaFields + 1
)

// arenaFields is the length of an arena region's array; arenaFieldsOffset
// with the optional offset.
const (
	arenaFields       = 4
	arenaFieldsOffset = arenaFields + 1
)

func encodeArenas(e *msgpack.Encoder, arenas []ArenaRegion) {
	_ = e.EncodeArrayLen(len(arenas))
	for _, a := range arenas {
		fields := arenaFields
		if a.Offset != 0 {
			fields = arenaFieldsOffset
		}
		_ = e.EncodeArrayLen(fields)
		_ = e.EncodeUint(uint64(a.ID))
		_ = e.EncodeUint(a.Addr)
		_ = e.EncodeUint(a.Length)
		_ = e.EncodeUint(uint64(a.RKey))
		if a.Offset != 0 {
			_ = e.EncodeUint(a.Offset)
		}
	}
}

// EncodeNodeMetaLimit encodes m in at most limit bytes: inline if it fits,
// otherwise with its arena list detached (ArenaSet instead of Arenas). It
// returns whether it detached the list; the caller then sends the list as
// an ArenaTable. Errors wrap ErrBadMeta, also when m does not fit even
// without its arenas.
func EncodeNodeMetaLimit(m NodeMeta, limit int) (b []byte, detached bool, err error) {
	if m.Detached() {
		return nil, false, badMeta("EncodeNodeMetaLimit wants the arena list, not an arena set")
	}
	if b, err = EncodeNodeMeta(m); err != nil || len(b) <= limit {
		return b, false, err
	}
	m.Arenas = SortArenas(m.Arenas)
	m.ArenaSet = SummarizeArenas(m.Arenas)
	m.Arenas = nil
	if b, err = EncodeNodeMeta(m); err != nil {
		return nil, false, err
	}
	if len(b) > limit {
		return nil, false, badMeta("%d bytes without the arena list, limit %d", len(b), limit)
	}
	return b, m.Detached(), nil
}

// DecodeNodeMeta decodes and validates metadata that EncodeNodeMeta
// produced. It retains nothing of b. Errors wrap ErrBadMeta.
func DecodeNodeMeta(b []byte) (NodeMeta, error) {
	d := newDecoder(b, ErrBadMeta)
	n, err := d.arrayLen("metadata", metaFields+16)
	if err != nil {
		return NodeMeta{}, err
	}
	if n < 1 {
		return NodeMeta{}, d.fail("empty array")
	}
	v, err := d.uint("version", 255)
	if err != nil {
		return NodeMeta{}, err
	}
	if v != MetaVersion {
		return NodeMeta{}, d.fail("metadata version %d; this node reads version %d", v, MetaVersion)
	}
	if n != metaFields && n != metaFieldsZone {
		return NodeMeta{}, d.fail("version %d metadata of %d fields, want %d (or %d with a zone)", v, n, metaFields, metaFieldsZone)
	}
	var m NodeMeta
	role, err := d.uint("role", 255)
	if err != nil {
		return NodeMeta{}, err
	}
	m.Role = Role(role)
	if m.Leaving, err = d.bool("leaving"); err != nil {
		return NodeMeta{}, err
	}
	if m.RKVVersion, err = d.str("rkv version", MaxMetaVersionLen); err != nil {
		return NodeMeta{}, err
	}
	if m.ControlAddr, err = d.str("control address", MaxMetaAddrLen); err != nil {
		return NodeMeta{}, err
	}
	if m.Provider, err = d.str("provider", MaxMetaProviderLen); err != nil {
		return NodeMeta{}, err
	}
	if m.Endpoint, err = d.endpoint(); err != nil {
		return NodeMeta{}, err
	}
	if m.Generation, err = d.uint("generation", 1<<64-1); err != nil {
		return NodeMeta{}, err
	}
	if m.Index, err = d.index(); err != nil {
		return NodeMeta{}, err
	}
	if m.Arenas, err = d.arenas(); err != nil {
		return NodeMeta{}, err
	}
	if m.ArenaSet, err = d.arenaSet(); err != nil {
		return NodeMeta{}, err
	}
	if m.ServerID, err = d.str("server ID", MaxServerIDLen); err != nil {
		return NodeMeta{}, err
	}
	if m.ClusterID, err = d.u64("cluster ID"); err != nil {
		return NodeMeta{}, err
	}
	if m.MapEpoch, err = d.u64("map epoch"); err != nil {
		return NodeMeta{}, err
	}
	if m.Limits, err = d.limits(); err != nil {
		return NodeMeta{}, err
	}
	if n == metaFieldsZone {
		if m.Zone, err = d.str("zone", MaxZoneLen); err != nil {
			return NodeMeta{}, err
		}
		if m.Zone == "" {
			return NodeMeta{}, d.fail("an empty zone field (a server without a zone leaves it out)")
		}
	}
	if err := d.end("metadata"); err != nil {
		return NodeMeta{}, err
	}
	if err := m.Validate(); err != nil {
		return NodeMeta{}, err
	}
	return m, nil
}

// EncodeArenaTables encodes arena tables: [MetaVersion, [[node,
// generation, arenas], ...]]. Each table's arenas are sorted. Errors wrap
// ErrBadMeta.
func EncodeArenaTables(tables []ArenaTable) ([]byte, error) {
	if len(tables) > maxArenaTables {
		return nil, badMeta("%d arena tables, limit %d", len(tables), maxArenaTables)
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(2)
	_ = e.EncodeUint(MetaVersion)
	_ = e.EncodeArrayLen(len(tables))
	for _, t := range tables {
		if t.Node == "" || len(t.Node) > MaxMetaNodeNameLen {
			return nil, badMeta("arena table of node name of %d bytes: must be 1 to %d", len(t.Node), MaxMetaNodeNameLen)
		}
		arenas := SortArenas(t.Arenas)
		if err := validateArenas(arenas); err != nil {
			return nil, fmt.Errorf("%w (arena table of %s)", err, t.Node)
		}
		_ = e.EncodeArrayLen(3)
		_ = e.EncodeString(t.Node)
		_ = e.EncodeUint(t.Generation)
		encodeArenas(e, arenas)
	}
	return buf.Bytes(), nil
}

// maxArenaTables bounds the tables in one message: one per server.
const maxArenaTables = 1 << 16

// DecodeArenaTables decodes what EncodeArenaTables produced. It retains
// nothing of b. Errors wrap ErrBadMeta.
func DecodeArenaTables(b []byte) ([]ArenaTable, error) {
	d := newDecoder(b, ErrBadMeta)
	n, err := d.arrayLen("arena tables", 16)
	if err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, d.fail("empty array")
	}
	v, err := d.uint("version", 255)
	if err != nil {
		return nil, err
	}
	if v != MetaVersion {
		return nil, d.fail("arena tables version %d; this node reads version %d", v, MetaVersion)
	}
	if n != 2 {
		return nil, d.fail("arena tables of %d fields, want 2", n)
	}
	n, err = d.arrayLen("arena table list", maxArenaTables)
	if err != nil {
		return nil, err
	}
	if n == -1 {
		return nil, d.fail("arena table list: nil, want an array")
	}
	tables := make([]ArenaTable, 0, n)
	for range n {
		if _, err := d.fixedArray("arena table", 3, false); err != nil {
			return nil, err
		}
		var t ArenaTable
		if t.Node, err = d.str("node name", MaxMetaNodeNameLen); err != nil {
			return nil, err
		}
		if t.Node == "" {
			return nil, d.fail("arena table without a node name")
		}
		if t.Generation, err = d.uint("generation", 1<<64-1); err != nil {
			return nil, err
		}
		if t.Arenas, err = d.arenas(); err != nil {
			return nil, fmt.Errorf("%w (arena table of %s)", err, t.Node)
		}
		tables = append(tables, t)
	}
	if err := d.end("arena tables"); err != nil {
		return nil, err
	}
	return tables, nil
}

func (d *decoder) endpoint() (Endpoint, error) {
	var e Endpoint
	if _, err := d.fixedArray("endpoint", 3, false); err != nil {
		return e, err
	}
	var err error
	if e.Addr, err = d.str("endpoint address", MaxMetaAddrLen); err != nil {
		return e, err
	}
	gid, err := d.bytes("GID", len(e.GID))
	if err != nil {
		return e, err
	}
	if gid != nil && len(gid) != len(e.GID) {
		return e, d.fail("GID of %d bytes, want %d", len(gid), len(e.GID))
	}
	copy(e.GID[:], gid)
	lid, err := d.uint("LID", 1<<16-1)
	e.LID = uint16(lid)
	return e, err
}

func (d *decoder) index() (*IndexRegion, error) {
	if isNil, err := d.fixedArray("index", 5, true); err != nil || isNil {
		return nil, err
	}
	var x IndexRegion
	var err error
	if x.Addr, err = d.uint("index address", 1<<64-1); err != nil {
		return nil, err
	}
	rkey, err := d.uint("index rkey", 1<<32-1)
	if err != nil {
		return nil, err
	}
	x.RKey = uint32(rkey)
	if x.Geometry.Slots, err = d.uint("index slots", 1<<64-1); err != nil {
		return nil, err
	}
	nb, err := d.uint("index neighborhood", maxIndexNeighborhood)
	if err != nil {
		return nil, err
	}
	x.Geometry.Neighborhood = int(nb)
	if x.Geometry.Seed, err = d.uint("index seed", 1<<64-1); err != nil {
		return nil, err
	}
	return &x, nil
}

func (d *decoder) limits() (RecordLimits, error) {
	if isNil, err := d.fixedArray("limits", 2, true); err != nil || isNil {
		return RecordLimits{}, err
	}
	k, err := d.uint("key limit", 1<<32-1)
	if err != nil {
		return RecordLimits{}, err
	}
	v, err := d.uint("value limit", 1<<32-1)
	return RecordLimits{MaxKeyLen: uint32(k), MaxValueLen: uint32(v)}, err
}

func (d *decoder) arenas() ([]ArenaRegion, error) {
	n, err := d.arrayLen("arenas", MaxArenaRegions)
	if err != nil {
		return nil, err
	}
	if n == -1 {
		return nil, d.fail("arenas: nil, want an array")
	}
	if n == 0 {
		return nil, nil
	}
	arenas := make([]ArenaRegion, n)
	for i := range arenas {
		a := &arenas[i]
		k, err := d.arrayLen("arena", arenaFieldsOffset)
		if err != nil {
			return nil, err
		}
		if k != arenaFields && k != arenaFieldsOffset {
			return nil, d.fail("arena of %d fields, want %d (or %d with an offset)", k, arenaFields, arenaFieldsOffset)
		}
		id, err := d.uint("arena ID", MaxArenas-1)
		if err != nil {
			return nil, err
		}
		a.ID = uint16(id)
		if a.Addr, err = d.uint("arena address", 1<<64-1); err != nil {
			return nil, err
		}
		if a.Length, err = d.uint("arena length", 1<<64-1); err != nil {
			return nil, err
		}
		rkey, err := d.uint("arena rkey", 1<<32-1)
		if err != nil {
			return nil, err
		}
		a.RKey = uint32(rkey)
		if k == arenaFieldsOffset {
			if a.Offset, err = d.uint("arena region offset", MaxArenaOffset); err != nil {
				return nil, err
			}
			if a.Offset == 0 {
				return nil, d.fail("arena %d region: offset 0 written, which is left out", a.ID) // one encoding per value
			}
		}
	}
	if err := validateArenas(arenas); err != nil {
		return nil, err
	}
	return arenas, nil
}

func (d *decoder) arenaSet() (ArenaSet, error) {
	var s ArenaSet
	if isNil, err := d.fixedArray("arena set", 2, true); err != nil || isNil {
		return s, err
	}
	count, err := d.uint("arena count", MaxArenaRegions)
	if err != nil {
		return s, err
	}
	if count == 0 {
		return s, d.fail("arena set of 0 arenas: should be nil")
	}
	s.Count = int(count)
	s.Digest, err = d.uint("arena digest", 1<<64-1)
	return s, err
}
