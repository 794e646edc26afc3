// The cluster map as it travels and is stored: servers, shard owners, moves; and the commands that change it.

package proto

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// The cluster map (package clustermap gives it meaning) assigns each of the
// NumShards shards to servers. It is encoded as one positional msgpack
// array:
//
//	[ MapVersion, epoch, clusterID, replicas,
//	  [[name, id, state, added, zone], ...],                  // servers, sorted by name
//	  [[[owner, ...], [origin, ...], since, move | nil], ...] ] // NumShards shards, or none
//	move: [kind, from, to, phase, started]
//
// where owners, from and to are indexes into the server list and origins
// run parallel to owners. A map with no shards is the empty map of a
// cluster not yet bootstrapped. Commands (the Raft log's entries) are
// [MapVersion, op, [name, id, zone], force, [[shard, from, to, started,
// kind], ...], replicas]. Decoders refuse anything inconsistent: an owner
// or target that is not a server, a shard count other than 0 or
// NumShards, unsorted or duplicate servers. They also read version 1 (no
// replicas, zones, origins per owner or move kinds: one owner a shard),
// which the maps and logs of earlier releases hold.
const (
	MapVersion = 2

	// MaxMapServers bounds the servers of a map.
	MaxMapServers = 4096
	// MaxShardOwners bounds a shard's owner list (its replicas), and so
	// the map's Replicas.
	MaxShardOwners = 16
	// MaxZoneLen bounds a server's zone label.
	MaxZoneLen = 64
)

// CheckZone reports whether zone is a zone label a server may carry (its
// --zone): at most MaxZoneLen bytes of printable UTF-8 without spaces, so
// that it reads as one word in logs and tables. "" (no zone) is valid.
func CheckZone(zone string) error {
	if len(zone) > MaxZoneLen {
		return fmt.Errorf("zone %q: %d bytes, at most %d", zone, len(zone), MaxZoneLen)
	}
	if !utf8.ValidString(zone) {
		return fmt.Errorf("zone %q: not UTF-8", zone)
	}
	for _, r := range zone {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("zone %q: %q is not allowed (printable characters without spaces, e.g. rack-1 or eu-west-1a)", zone, r)
		}
	}
	return nil
}

// ErrBadMap means an encoded map or map command that is malformed, of
// another MapVersion, or inconsistent.
var ErrBadMap = errors.New("proto: bad cluster map")

// ServerState is a server's state in the map.
type ServerState uint8

// Server states.
const (
	// ServerActive: the server takes shards.
	ServerActive ServerState = iota + 1
	// ServerDraining: the server is being removed; its shards move away
	// and it takes no new ones.
	ServerDraining
	// ServerRemoved: the server was removed (forgotten). It holds nothing;
	// its entry stays so that the data directory it ran on is never taken
	// back: the name rejoins only with another (empty) one.
	ServerRemoved
	serverStateEnd
)

func (s ServerState) String() string {
	switch s {
	case ServerActive:
		return "active"
	case ServerDraining:
		return "draining"
	case ServerRemoved:
		return "removed"
	}
	return fmt.Sprintf("ServerState(%d)", uint8(s))
}

// MovePhase is where a shard's move stands.
type MovePhase uint8

// Move phases.
const (
	// MoveCopying: the target copies the shard while the owner serves it.
	MoveCopying MovePhase = iota + 1
	// MoveFrozen: the owner refuses writes to the shard while the target
	// copies what changed; reads go on.
	MoveFrozen
	movePhaseEnd
)

func (p MovePhase) String() string {
	switch p {
	case MoveCopying:
		return "copying"
	case MoveFrozen:
		return "frozen"
	}
	return fmt.Sprintf("MovePhase(%d)", uint8(p))
}

// ClusterMap is a cluster map as encoded.
type ClusterMap struct {
	Epoch     uint64
	ClusterID uint64
	// Replicas is how many copies of each shard the cluster keeps (on as
	// many distinct servers as there are, up to it): 1 to MaxShardOwners.
	Replicas int
	Servers  []MapServer // sorted by Name, names unique
	Shards   []MapShard  // NumShards of them, or none before bootstrap
}

// MapServer is one server of the map.
type MapServer struct {
	Name  string
	ID    string // the server's data directory ID (NodeMeta.ServerID)
	State ServerState
	Added uint64 // the epoch that added it
	// Zone is the server's failure domain ("" when it names none):
	// replicas of a shard go to distinct zones first.
	Zone string
}

// MapShard is one shard's assignment.
type MapShard struct {
	Owners []uint16 // indexes into Servers: the replicas, primary first
	// Origins run parallel to Owners: the epoch of the move whose copy
	// each owner took the shard from (the move's Started), or 0 when it
	// got the shard empty (the bootstrap, a forced removal of its
	// previous owner). An owner checks it against the copy it holds, so a
	// stale copy is never served.
	Origins []uint64
	Since   uint64 // the epoch that made Owners[0] the primary
	Move    *ShardMove
}

// MoveKind is what a move's finish does with its target.
type MoveKind uint8

// Move kinds.
const (
	// MoveReplace: the target copies the shard and takes the place of
	// From among the owners (the primary's place when From is it).
	MoveReplace MoveKind = iota + 1
	// MoveAddReplica: the target copies the shard and joins the owners
	// as a backup (From is the primary it copies from).
	MoveAddReplica
	// MovePromote: the target, a backup, becomes the primary in From's
	// place, From a backup (nothing is copied: the move is frozen while
	// the two hand over).
	MovePromote
	moveKindEnd
)

var moveKindNames = [...]string{MoveReplace: "replace", MoveAddReplica: "add-replica", MovePromote: "promote"}

func (k MoveKind) String() string {
	if k > 0 && k < moveKindEnd {
		return moveKindNames[k]
	}
	return fmt.Sprintf("MoveKind(%d)", uint8(k))
}

// ShardMove is a shard's move in progress.
type ShardMove struct {
	Kind    MoveKind
	From    uint16 // index into Servers: an owner (the one replaced, the primary)
	To      uint16 // index into Servers
	Phase   MovePhase
	Started uint64 // the epoch that started the move
}

// EncodeClusterMap encodes m. Errors wrap ErrBadMap.
func EncodeClusterMap(m *ClusterMap) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(6)
	_ = e.EncodeUint(MapVersion)
	_ = e.EncodeUint(m.Epoch)
	_ = e.EncodeUint(m.ClusterID)
	_ = e.EncodeUint(uint64(m.Replicas))
	_ = e.EncodeArrayLen(len(m.Servers))
	for _, s := range m.Servers {
		_ = e.EncodeArrayLen(5)
		_ = e.EncodeString(s.Name)
		_ = e.EncodeString(s.ID)
		_ = e.EncodeUint(uint64(s.State))
		_ = e.EncodeUint(s.Added)
		_ = e.EncodeString(s.Zone)
	}
	_ = e.EncodeArrayLen(len(m.Shards))
	for _, sh := range m.Shards {
		_ = e.EncodeArrayLen(4)
		_ = e.EncodeArrayLen(len(sh.Owners))
		for _, o := range sh.Owners {
			_ = e.EncodeUint(uint64(o))
		}
		_ = e.EncodeArrayLen(len(sh.Origins))
		for _, o := range sh.Origins {
			_ = e.EncodeUint(o)
		}
		_ = e.EncodeUint(sh.Since)
		if sh.Move == nil {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeArrayLen(5)
			_ = e.EncodeUint(uint64(sh.Move.Kind))
			_ = e.EncodeUint(uint64(sh.Move.From))
			_ = e.EncodeUint(uint64(sh.Move.To))
			_ = e.EncodeUint(uint64(sh.Move.Phase))
			_ = e.EncodeUint(sh.Move.Started)
		}
	}
	return buf.Bytes(), nil // writes to a bytes.Buffer cannot fail
}

func badMap(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadMap}, args...)...)
}

// Validate checks m as the encoder and the decoder do. Errors wrap
// ErrBadMap.
func (m *ClusterMap) Validate() error {
	if m.Replicas < 1 || m.Replicas > MaxShardOwners {
		return badMap("%d replicas (1 to %d)", m.Replicas, MaxShardOwners)
	}
	if len(m.Servers) > MaxMapServers {
		return badMap("%d servers, limit %d", len(m.Servers), MaxMapServers)
	}
	for i, s := range m.Servers {
		if s.Name == "" || len(s.Name) > MaxMetaNodeNameLen {
			return badMap("server %d: name of %d bytes (1 to %d)", i, len(s.Name), MaxMetaNodeNameLen)
		}
		if s.ID == "" || len(s.ID) > MaxServerIDLen {
			return badMap("server %s: ID of %d bytes (1 to %d)", s.Name, len(s.ID), MaxServerIDLen)
		}
		if s.State == 0 || s.State >= serverStateEnd {
			return badMap("server %s: state %d", s.Name, s.State)
		}
		if len(s.Zone) > MaxZoneLen {
			return badMap("server %s: zone of %d bytes (at most %d)", s.Name, len(s.Zone), MaxZoneLen)
		}
		if i > 0 && strings.Compare(m.Servers[i-1].Name, s.Name) >= 0 {
			return badMap("servers %q then %q: not sorted or not unique", m.Servers[i-1].Name, s.Name)
		}
	}
	if len(m.Shards) != 0 && len(m.Shards) != NumShards {
		return badMap("%d shards, want %d (or none before bootstrap)", len(m.Shards), NumShards)
	}
	if len(m.Shards) != 0 && len(m.Servers) == 0 {
		return badMap("shards without servers")
	}
	for i, sh := range m.Shards {
		if len(sh.Owners) == 0 || len(sh.Owners) > MaxShardOwners {
			return badMap("shard %d: %d owners (1 to %d)", i, len(sh.Owners), MaxShardOwners)
		}
		for j, o := range sh.Owners {
			if int(o) >= len(m.Servers) {
				return badMap("shard %d: owner %d of %d servers", i, o, len(m.Servers))
			}
			if m.Servers[o].State == ServerRemoved {
				return badMap("shard %d: owned by %s, which is removed", i, m.Servers[o].Name)
			}
			if slices.Contains(sh.Owners[:j], o) {
				return badMap("shard %d: owner %s twice", i, m.Servers[o].Name)
			}
		}
		if sh.Since == 0 || sh.Since > m.Epoch {
			return badMap("shard %d: since epoch %d, map epoch %d", i, sh.Since, m.Epoch)
		}
		if len(sh.Origins) != len(sh.Owners) {
			return badMap("shard %d: %d origins for %d owners", i, len(sh.Origins), len(sh.Owners))
		}
		if sh.Origins[0] >= sh.Since {
			return badMap("shard %d: the primary's origin epoch %d not before since %d", i, sh.Origins[0], sh.Since)
		}
		for j, o := range sh.Origins {
			if o >= m.Epoch {
				return badMap("shard %d: owner %d's origin epoch %d not before the map's %d", i, j, o, m.Epoch)
			}
		}
		if mv := sh.Move; mv != nil {
			if mv.Kind == 0 || mv.Kind >= moveKindEnd {
				return badMap("shard %d: move kind %d", i, mv.Kind)
			}
			if !slices.Contains(sh.Owners, mv.From) || (mv.Kind != MoveReplace && mv.From != sh.Owners[0]) {
				return badMap("shard %d: %v move from server %d (owners %v)", i, mv.Kind, mv.From, sh.Owners)
			}
			if int(mv.To) >= len(m.Servers) || m.Servers[mv.To].State == ServerRemoved ||
				slices.Contains(sh.Owners, mv.To) != (mv.Kind == MovePromote) || mv.To == sh.Owners[0] {
				return badMap("shard %d: %v move to server %d (of %d, owners %v)", i, mv.Kind, mv.To, len(m.Servers), sh.Owners)
			}
			if mv.Phase == 0 || mv.Phase >= movePhaseEnd {
				return badMap("shard %d: move phase %d", i, mv.Phase)
			}
			if mv.Started < sh.Since || mv.Started > m.Epoch {
				return badMap("shard %d: move started at epoch %d, owned since %d, map epoch %d", i, mv.Started, sh.Since, m.Epoch)
			}
		}
	}
	return nil
}

// DecodeClusterMap decodes and validates what EncodeClusterMap produced,
// or a version 1 map. It retains nothing of b. Errors wrap ErrBadMap.
func DecodeClusterMap(b []byte) (*ClusterMap, error) {
	d := newDecoder(b, ErrBadMap)
	v, err := d.mapVersion("cluster map", 5, 6)
	if err != nil {
		return nil, err
	}
	m := &ClusterMap{Replicas: 1}
	if m.Epoch, err = d.u64("epoch"); err != nil {
		return nil, err
	}
	if m.ClusterID, err = d.u64("cluster ID"); err != nil {
		return nil, err
	}
	if v >= 2 {
		r, err := d.uint("replicas", MaxShardOwners)
		if err != nil {
			return nil, err
		}
		m.Replicas = int(r)
	}
	n, err := d.list("servers", MaxMapServers)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		m.Servers = make([]MapServer, n)
	}
	for i := range m.Servers {
		if m.Servers[i], err = d.mapServer(v); err != nil {
			return nil, err
		}
	}
	if n, err = d.list("shards", NumShards); err != nil {
		return nil, err
	}
	if n > 0 {
		m.Shards = make([]MapShard, n)
	}
	for i := range m.Shards {
		if m.Shards[i], err = d.mapShard(v); err != nil {
			return nil, err
		}
	}
	if err := d.end("cluster map"); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// mapShard reads one shard of a map of version v.
func (d *decoder) mapShard(v int) (MapShard, error) {
	var sh MapShard
	if err := d.fields("shard", 4); err != nil {
		return sh, err
	}
	k, err := d.list("owners", MaxShardOwners)
	if err != nil {
		return sh, err
	}
	sh.Owners = make([]uint16, k)
	for j := range sh.Owners {
		o, err := d.uint("owner", MaxMapServers-1)
		if err != nil {
			return sh, err
		}
		sh.Owners[j] = uint16(o)
	}
	if v >= 2 {
		k, err := d.list("origins", MaxShardOwners)
		if err != nil {
			return sh, err
		}
		sh.Origins = make([]uint64, k)
		for j := range sh.Origins {
			if sh.Origins[j], err = d.u64("origin"); err != nil {
				return sh, err
			}
		}
	}
	if sh.Since, err = d.u64("since"); err != nil {
		return sh, err
	}
	if v == 1 { // [owners, since, origin, move]: one origin, the owner's
		origin, err := d.u64("origin")
		if err != nil {
			return sh, err
		}
		sh.Origins = make([]uint64, len(sh.Owners))
		if len(sh.Origins) > 0 {
			sh.Origins[0] = origin
		}
	}
	fields := 5
	if v == 1 {
		fields = 3 // [to, phase, started]: a replacement of the owner
	}
	isNil, err := d.fixedArray("move", fields, true)
	if err != nil || isNil {
		return sh, err
	}
	mv := &ShardMove{Kind: MoveReplace}
	if v >= 2 {
		kind, err := d.uint("move kind", 255)
		if err != nil {
			return sh, err
		}
		from, err := d.uint("move source", MaxMapServers-1)
		if err != nil {
			return sh, err
		}
		mv.Kind, mv.From = MoveKind(kind), uint16(from)
	} else if len(sh.Owners) > 0 {
		mv.From = sh.Owners[0]
	}
	to, err := d.uint("move target", MaxMapServers-1)
	if err != nil {
		return sh, err
	}
	ph, err := d.uint("move phase", 255)
	if err != nil {
		return sh, err
	}
	if mv.Started, err = d.u64("move started"); err != nil {
		return sh, err
	}
	mv.To, mv.Phase = uint16(to), MovePhase(ph)
	sh.Move = mv
	return sh, nil
}

// mapVersion reads the header of a versioned array: version 1 of n1
// fields or MapVersion of n fields. It returns the version.
func (d *decoder) mapVersion(what string, n1, n int) (int, error) {
	k, err := d.list(what, max(n1, n)+16)
	if err != nil {
		return 0, err
	}
	if k < 1 {
		return 0, d.fail("%s: empty array", what)
	}
	v, err := d.uint("version", 255)
	if err != nil {
		return 0, err
	}
	want := n
	switch v {
	case 1:
		want = n1
	case MapVersion:
	default:
		return 0, d.fail("%s version %d; this node reads versions 1 to %d", what, v, MapVersion)
	}
	if k != want {
		return 0, d.fail("%s of %d fields, want %d", what, k, want)
	}
	return int(v), nil
}

func (d *decoder) mapServer(v int) (MapServer, error) {
	var s MapServer
	fields := 5
	if v == 1 {
		fields = 4
	}
	if err := d.fields("server", fields); err != nil {
		return s, err
	}
	var err error
	if s.Name, err = d.str("server name", MaxMetaNodeNameLen); err != nil {
		return s, err
	}
	if s.ID, err = d.str("server ID", MaxServerIDLen); err != nil {
		return s, err
	}
	st, err := d.uint("server state", 255)
	if err != nil {
		return s, err
	}
	s.State = ServerState(st)
	if s.Added, err = d.u64("added"); err != nil || v == 1 {
		return s, err
	}
	s.Zone, err = d.str("zone", MaxZoneLen)
	return s, err
}

// MapOp is a map command's operation.
type MapOp uint8

// Map operations (the semantics are package clustermap's).
const (
	MapAddServer    MapOp = iota + 1 // add Server (Name, ID); the first one bootstraps the shards
	MapDrainServer                   // mark Server.Name draining
	MapRemoveServer                  // mark Server.Name removed (Force: even while it owns shards)
	MapStartMoves                    // start Moves
	MapFreezeMoves                   // freeze Moves (they must be in progress as given)
	MapFinishMoves                   // give the shards of Moves to their targets
	MapAbortMoves                    // cancel Moves
	MapSetReplicas                   // set the map's Replicas to Replicas
	MapDropReplicas                  // drop each move's From from its shard's backups (To, Started unused)
	MapFailOver                      // make each move's To, a backup, its shard's only owner in place of From, its dead primary (Started unused)
	mapOpEnd
)

var mapOpNames = [...]string{
	MapAddServer: "add-server", MapDrainServer: "drain-server", MapRemoveServer: "remove-server",
	MapStartMoves: "start-moves", MapFreezeMoves: "freeze-moves", MapFinishMoves: "finish-moves", MapAbortMoves: "abort-moves",
	MapSetReplicas: "set-replicas", MapDropReplicas: "drop-replicas", MapFailOver: "fail-over",
}

func (o MapOp) String() string {
	if o > 0 && o < mapOpEnd {
		return mapOpNames[o]
	}
	return fmt.Sprintf("MapOp(%d)", uint8(o))
}

// MapCommand is one change of the map: an entry of its Raft log.
type MapCommand struct {
	Op       MapOp
	Server   MapServer // Name, ID and Zone; State and Added are unused
	Force    bool
	Moves    []MoveCommand
	Replicas int // MapSetReplicas only
}

// MoveCommand names one move: Shard from server From to server To, of
// Kind (0 reads as MoveReplace). In a start, Started is unused (the
// command's epoch becomes it); in a freeze, finish or abort it must match
// the move in progress, so a late command about an earlier move of the
// same shard changes nothing.
type MoveCommand struct {
	Shard    Shard
	From, To string
	Started  uint64
	Kind     MoveKind
}

// EncodeMapCommand encodes c. Errors wrap ErrBadMap.
func EncodeMapCommand(c *MapCommand) ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(6)
	_ = e.EncodeUint(MapVersion)
	_ = e.EncodeUint(uint64(c.Op))
	_ = e.EncodeArrayLen(3)
	_ = e.EncodeString(c.Server.Name)
	_ = e.EncodeString(c.Server.ID)
	_ = e.EncodeString(c.Server.Zone)
	_ = e.EncodeBool(c.Force)
	_ = e.EncodeArrayLen(len(c.Moves))
	for _, m := range c.Moves {
		_ = e.EncodeArrayLen(5)
		_ = e.EncodeUint(uint64(m.Shard))
		_ = e.EncodeString(m.From)
		_ = e.EncodeString(m.To)
		_ = e.EncodeUint(m.Started)
		_ = e.EncodeUint(uint64(m.kind()))
	}
	_ = e.EncodeUint(uint64(c.Replicas))
	return buf.Bytes(), nil
}

// kind is m's Kind, MoveReplace when unset.
func (m MoveCommand) kind() MoveKind {
	if m.Kind == 0 {
		return MoveReplace
	}
	return m.Kind
}

func (c *MapCommand) validate() error {
	if c.Op == 0 || c.Op >= mapOpEnd {
		return badMap("map op %d", c.Op)
	}
	if len(c.Server.Name) > MaxMetaNodeNameLen || len(c.Server.ID) > MaxServerIDLen || len(c.Server.Zone) > MaxZoneLen {
		return badMap("server name of %d bytes, ID of %d or zone of %d", len(c.Server.Name), len(c.Server.ID), len(c.Server.Zone))
	}
	if c.Replicas < 0 || c.Replicas > MaxShardOwners || (c.Op == MapSetReplicas) != (c.Replicas != 0) {
		return badMap("%v with %d replicas (1 to %d, set-replicas only)", c.Op, c.Replicas, MaxShardOwners)
	}
	if len(c.Moves) > NumShards {
		return badMap("%d moves, limit %d", len(c.Moves), NumShards)
	}
	for _, m := range c.Moves {
		if m.Shard >= NumShards || len(m.From) > MaxMetaNodeNameLen || len(m.To) > MaxMetaNodeNameLen || m.Kind >= moveKindEnd {
			return badMap("%v move of shard %d from %d-byte name to %d-byte name", m.Kind, m.Shard, len(m.From), len(m.To))
		}
	}
	return nil
}

// DecodeMapCommand decodes what EncodeMapCommand produced, or a version 1
// command. It retains nothing of b. Errors wrap ErrBadMap.
func DecodeMapCommand(b []byte) (*MapCommand, error) {
	d := newDecoder(b, ErrBadMap)
	v, err := d.mapVersion("map command", 5, 6)
	if err != nil {
		return nil, err
	}
	c := &MapCommand{}
	op, err := d.uint("op", 255)
	if err != nil {
		return nil, err
	}
	c.Op = MapOp(op)
	fields := 3
	if v == 1 {
		fields = 2
	}
	if err := d.fields("server", fields); err != nil {
		return nil, err
	}
	if c.Server.Name, err = d.str("server name", MaxMetaNodeNameLen); err != nil {
		return nil, err
	}
	if c.Server.ID, err = d.str("server ID", MaxServerIDLen); err != nil {
		return nil, err
	}
	if v >= 2 {
		if c.Server.Zone, err = d.str("zone", MaxZoneLen); err != nil {
			return nil, err
		}
	}
	if c.Force, err = d.bool("force"); err != nil {
		return nil, err
	}
	n, err := d.list("moves", NumShards)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		c.Moves = make([]MoveCommand, n)
	}
	for i := range c.Moves {
		m := &c.Moves[i]
		if err := d.fields("move", fields+2); err != nil {
			return nil, err
		}
		s, err := d.uint("move shard", NumShards-1)
		if err != nil {
			return nil, err
		}
		m.Shard = Shard(s)
		if m.From, err = d.str("move from", MaxMetaNodeNameLen); err != nil {
			return nil, err
		}
		if m.To, err = d.str("move to", MaxMetaNodeNameLen); err != nil {
			return nil, err
		}
		if m.Started, err = d.u64("move started"); err != nil {
			return nil, err
		}
		m.Kind = MoveReplace
		if v >= 2 {
			k, err := d.uint("move kind", 255)
			if err != nil {
				return nil, err
			}
			if m.Kind = MoveKind(k); m.Kind == 0 {
				m.Kind = MoveReplace
			}
		}
	}
	if v >= 2 {
		r, err := d.uint("replicas", MaxShardOwners)
		if err != nil {
			return nil, err
		}
		c.Replicas = int(r)
	}
	if err := d.end("map command"); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}
