// The cluster map as it travels and is stored: servers, shard owners, moves; and the commands that change it.

package proto

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// The cluster map (package clustermap gives it meaning) assigns each of the
// NumShards shards to servers. It is encoded as one positional msgpack
// array:
//
//	[ MapVersion, epoch, clusterID,
//	  [[name, id, state, added], ...],             // servers, sorted by name
//	  [[[owner, ...], since, origin, move | nil], ...] ]   // NumShards shards, or none
//	move: [to, phase, started]
//
// where owners and to are indexes into the server list. A map with no
// shards is the empty map of a cluster not yet bootstrapped. Commands (the
// Raft log's entries) are [MapVersion, op, [name, id], force, [[shard,
// from, to, started], ...]]. Decoders refuse anything inconsistent:
// an owner or target that is not a server, a shard count other than 0 or
// NumShards, unsorted or duplicate servers.
const (
	MapVersion = 1

	// MaxMapServers bounds the servers of a map.
	MaxMapServers = 4096
	// MaxShardOwners bounds a shard's owner list (its replicas).
	MaxShardOwners = 16
)

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
	Servers   []MapServer // sorted by Name, names unique
	Shards    []MapShard  // NumShards of them, or none before bootstrap
}

// MapServer is one server of the map.
type MapServer struct {
	Name  string
	ID    string // the server's data directory ID (NodeMeta.ServerID)
	State ServerState
	Added uint64 // the epoch that added it
}

// MapShard is one shard's assignment.
type MapShard struct {
	Owners []uint16 // indexes into Servers, primary first
	Since  uint64   // the epoch that set Owners
	// Origin is the epoch of the move whose copy the owner took the shard
	// from (the move's Started), or 0 when the owner got it empty (the
	// bootstrap, a forced removal of its previous owner). An owner checks
	// it against the copy it holds, so a stale copy is never served.
	Origin uint64
	Move   *ShardMove
}

// ShardMove is a shard's move in progress.
type ShardMove struct {
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
	_ = e.EncodeArrayLen(5)
	_ = e.EncodeUint(MapVersion)
	_ = e.EncodeUint(m.Epoch)
	_ = e.EncodeUint(m.ClusterID)
	_ = e.EncodeArrayLen(len(m.Servers))
	for _, s := range m.Servers {
		_ = e.EncodeArrayLen(4)
		_ = e.EncodeString(s.Name)
		_ = e.EncodeString(s.ID)
		_ = e.EncodeUint(uint64(s.State))
		_ = e.EncodeUint(s.Added)
	}
	_ = e.EncodeArrayLen(len(m.Shards))
	for _, sh := range m.Shards {
		_ = e.EncodeArrayLen(4)
		_ = e.EncodeArrayLen(len(sh.Owners))
		for _, o := range sh.Owners {
			_ = e.EncodeUint(uint64(o))
		}
		_ = e.EncodeUint(sh.Since)
		_ = e.EncodeUint(sh.Origin)
		if sh.Move == nil {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeArrayLen(3)
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
		if sh.Origin >= sh.Since {
			return badMap("shard %d: origin epoch %d not before since %d", i, sh.Origin, sh.Since)
		}
		if mv := sh.Move; mv != nil {
			if int(mv.To) >= len(m.Servers) || slices.Contains(sh.Owners, mv.To) || m.Servers[mv.To].State == ServerRemoved {
				return badMap("shard %d: move to server %d (of %d, owners %v)", i, mv.To, len(m.Servers), sh.Owners)
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

// DecodeClusterMap decodes and validates what EncodeClusterMap produced.
// It retains nothing of b. Errors wrap ErrBadMap.
func DecodeClusterMap(b []byte) (*ClusterMap, error) {
	d := newDecoder(b, ErrBadMap)
	if err := d.mapVersion("cluster map", 5); err != nil {
		return nil, err
	}
	m := &ClusterMap{}
	var err error
	if m.Epoch, err = d.u64("epoch"); err != nil {
		return nil, err
	}
	if m.ClusterID, err = d.u64("cluster ID"); err != nil {
		return nil, err
	}
	n, err := d.list("servers", MaxMapServers)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		m.Servers = make([]MapServer, n)
	}
	for i := range m.Servers {
		if m.Servers[i], err = d.mapServer(); err != nil {
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
		sh := &m.Shards[i]
		if err := d.fields("shard", 4); err != nil {
			return nil, err
		}
		k, err := d.list("owners", MaxShardOwners)
		if err != nil {
			return nil, err
		}
		sh.Owners = make([]uint16, k)
		for j := range sh.Owners {
			o, err := d.uint("owner", MaxMapServers-1)
			if err != nil {
				return nil, err
			}
			sh.Owners[j] = uint16(o)
		}
		if sh.Since, err = d.u64("since"); err != nil {
			return nil, err
		}
		if sh.Origin, err = d.u64("origin"); err != nil {
			return nil, err
		}
		isNil, err := d.fixedArray("move", 3, true)
		if err != nil {
			return nil, err
		}
		if !isNil {
			to, err := d.uint("move target", MaxMapServers-1)
			if err != nil {
				return nil, err
			}
			ph, err := d.uint("move phase", 255)
			if err != nil {
				return nil, err
			}
			started, err := d.u64("move started")
			if err != nil {
				return nil, err
			}
			sh.Move = &ShardMove{To: uint16(to), Phase: MovePhase(ph), Started: started}
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

// mapVersion reads the header of a versioned array of n fields.
func (d *decoder) mapVersion(what string, n int) error {
	k, err := d.list(what, n+16)
	if err != nil {
		return err
	}
	if k < 1 {
		return d.fail("%s: empty array", what)
	}
	v, err := d.uint("version", 255)
	if err != nil {
		return err
	}
	if v != MapVersion {
		return d.fail("%s version %d; this node reads version %d", what, v, MapVersion)
	}
	if k != n {
		return d.fail("%s of %d fields, want %d", what, k, n)
	}
	return nil
}

func (d *decoder) mapServer() (MapServer, error) {
	var s MapServer
	if err := d.fields("server", 4); err != nil {
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
	s.Added, err = d.u64("added")
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
	mapOpEnd
)

var mapOpNames = [...]string{
	MapAddServer: "add-server", MapDrainServer: "drain-server", MapRemoveServer: "remove-server",
	MapStartMoves: "start-moves", MapFreezeMoves: "freeze-moves", MapFinishMoves: "finish-moves", MapAbortMoves: "abort-moves",
}

func (o MapOp) String() string {
	if o > 0 && o < mapOpEnd {
		return mapOpNames[o]
	}
	return fmt.Sprintf("MapOp(%d)", uint8(o))
}

// MapCommand is one change of the map: an entry of its Raft log.
type MapCommand struct {
	Op     MapOp
	Server MapServer // Name and ID; State and Added are unused
	Force  bool
	Moves  []MoveCommand
}

// MoveCommand names one move: Shard from server From to server To. In a
// start, Started is unused (the command's epoch becomes it); in a freeze,
// finish or abort it must match the move in progress, so a late command
// about an earlier move of the same shard changes nothing.
type MoveCommand struct {
	Shard    Shard
	From, To string
	Started  uint64
}

// EncodeMapCommand encodes c. Errors wrap ErrBadMap.
func EncodeMapCommand(c *MapCommand) ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(5)
	_ = e.EncodeUint(MapVersion)
	_ = e.EncodeUint(uint64(c.Op))
	_ = e.EncodeArrayLen(2)
	_ = e.EncodeString(c.Server.Name)
	_ = e.EncodeString(c.Server.ID)
	_ = e.EncodeBool(c.Force)
	_ = e.EncodeArrayLen(len(c.Moves))
	for _, m := range c.Moves {
		_ = e.EncodeArrayLen(4)
		_ = e.EncodeUint(uint64(m.Shard))
		_ = e.EncodeString(m.From)
		_ = e.EncodeString(m.To)
		_ = e.EncodeUint(m.Started)
	}
	return buf.Bytes(), nil
}

func (c *MapCommand) validate() error {
	if c.Op == 0 || c.Op >= mapOpEnd {
		return badMap("map op %d", c.Op)
	}
	if len(c.Server.Name) > MaxMetaNodeNameLen || len(c.Server.ID) > MaxServerIDLen {
		return badMap("server name of %d bytes or ID of %d", len(c.Server.Name), len(c.Server.ID))
	}
	if len(c.Moves) > NumShards {
		return badMap("%d moves, limit %d", len(c.Moves), NumShards)
	}
	for _, m := range c.Moves {
		if m.Shard >= NumShards || len(m.From) > MaxMetaNodeNameLen || len(m.To) > MaxMetaNodeNameLen {
			return badMap("move of shard %d from %d-byte name to %d-byte name", m.Shard, len(m.From), len(m.To))
		}
	}
	return nil
}

// DecodeMapCommand decodes what EncodeMapCommand produced. It retains
// nothing of b. Errors wrap ErrBadMap.
func DecodeMapCommand(b []byte) (*MapCommand, error) {
	d := newDecoder(b, ErrBadMap)
	if err := d.mapVersion("map command", 5); err != nil {
		return nil, err
	}
	c := &MapCommand{}
	op, err := d.uint("op", 255)
	if err != nil {
		return nil, err
	}
	c.Op = MapOp(op)
	if err := d.fields("server", 2); err != nil {
		return nil, err
	}
	if c.Server.Name, err = d.str("server name", MaxMetaNodeNameLen); err != nil {
		return nil, err
	}
	if c.Server.ID, err = d.str("server ID", MaxServerIDLen); err != nil {
		return nil, err
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
		if err := d.fields("move", 4); err != nil {
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
	}
	if err := d.end("map command"); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}
