// The control RPC between clients and servers, and between servers: leases, commits, the map, migration.

package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The control RPC runs over the TCP connection whose start carried the
// out-of-band QP handshake (rdma.ConnectQP). It is the server's control
// path only: GETs never use it.
//
// A frame is a 4-byte big-endian body length (at most MaxFrame) and a
// msgpack body, one positional array:
//
//	[ ControlVersion, type, request id, [payload fields...] ]
//
// A reply carries the id of its request. Every request is answered by its
// reply type (MsgType.Reply) or by an Error. Decoding is strict: another
// version, an unknown type, a type's payload with the wrong number of
// fields, a length over its limit or over the bytes left, nil where an
// integer belongs, or bytes after the end all fail with an error wrapping
// ErrBadMessage, before anything is allocated for them. A peer that sends
// a bad frame is answered by an Error (CodeBadRequest, request id 0,
// naming the problem) and disconnected.
//
// Every request that touches keys carries the sender's cluster map epoch;
// commits and deletes also carry an idempotency session and sequence
// number, so that a retry whose first attempt was applied is answered with
// the first result instead of being applied again.
const (
	// ControlVersion 8: HelloReply offers commits on the write QP
	// (CommitSlot); CommitBatch. 7: StatsReply carries the copies in progress
	// (Copying); read leases (RenewReadLease, GetReadLease). 6: a Commit names its replica copies, and primaries
	// forward commits and deletes to backups (ReplicaCommit,
	// ReplicaDelete). 5: a session connects a write QP after its read QP
	// (Hello.NoQP).
	ControlVersion = 8

	// MaxFrame bounds a frame's body. Scan replies are cut to fit.
	MaxFrame = 1 << 20

	// MaxHelloFrame bounds the body of the first frame on a connection,
	// which a server reads before the peer has authenticated: a Hello
	// with the longest name, token and target fits. An unauthenticated
	// peer so cannot make a server allocate MaxFrame per connection.
	MaxHelloFrame = 2048

	// Limits of the variable-length fields.
	MaxControlName    = 512  // Hello.Client, HelloReply.Server, Forget.Node
	MaxControlToken   = 1024 // Hello.Token
	MaxControlMessage = 4096 // Error.Message
	MaxScanEntries    = MaxFrame / 8
	MaxMapBytes       = MaxFrame - 64 // MapReply.Map, MapChange.Command, ViewReply.Map
	// MaxViewMembers bounds ViewReply.Members; the frame's own limit
	// bounds them too.
	MaxViewMembers = 1 << 12
	// MaxViewMeta bounds one member's encoded metadata in a ViewReply:
	// the arena list inline, up to MaxArenaRegions regions of at most 36
	// bytes.
	MaxViewMeta = GossipMetaMaxSize + 36*MaxArenaRegions
)

// ErrBadMessage means a control frame that is malformed, too large, of
// another version or of an unknown type.
var ErrBadMessage = errors.New("proto: bad control message")

// MsgType is a control message's type.
type MsgType uint8

// Message types.
const (
	MsgHello MsgType = iota + 1
	MsgHelloReply
	MsgGrantLease
	MsgLeaseReply
	MsgCommit
	MsgCommitReply
	MsgDelete
	MsgAck
	MsgScan
	MsgScanReply
	MsgEndLease
	MsgStats
	MsgStatsReply
	MsgError
	MsgGetMap
	MsgMapReply
	MsgShardScan
	MsgShardScanReply
	MsgFenceShards
	MsgFenceReply
	MsgReleaseShards
	MsgMapChange
	MsgMapChangeReply
	MsgForget
	MsgGetView
	MsgViewReply
	MsgReplicaCommit
	MsgReplicaDelete
	MsgSetReplicas
	MsgRenewReadLease
	MsgGetReadLease
	MsgReadLeaseReply
	MsgCommitBatch
	MsgCommitBatchReply
	msgTypeEnd
)

// msgTable is every message type's name, constructor and reply type (0 for
// replies): one row to add a message.
var msgTable = [msgTypeEnd]struct {
	name  string
	new   func() Message
	reply MsgType
}{
	MsgHello:          {"Hello", func() Message { return &Hello{} }, MsgHelloReply},
	MsgHelloReply:     {"HelloReply", func() Message { return &HelloReply{} }, 0},
	MsgGrantLease:     {"GrantLease", func() Message { return &GrantLease{} }, MsgLeaseReply},
	MsgLeaseReply:     {"LeaseReply", func() Message { return &LeaseReply{} }, 0},
	MsgCommit:         {"Commit", func() Message { return &Commit{} }, MsgCommitReply},
	MsgCommitReply:    {"CommitReply", func() Message { return &CommitReply{} }, 0},
	MsgDelete:         {"Delete", func() Message { return &Delete{} }, MsgAck},
	MsgAck:            {"Ack", func() Message { return &Ack{} }, 0},
	MsgScan:           {"Scan", func() Message { return &Scan{} }, MsgScanReply},
	MsgScanReply:      {"ScanReply", func() Message { return &ScanReply{} }, 0},
	MsgEndLease:       {"EndLease", func() Message { return &EndLease{} }, MsgAck},
	MsgStats:          {"Stats", func() Message { return &Stats{} }, MsgStatsReply},
	MsgStatsReply:     {"StatsReply", func() Message { return &StatsReply{} }, 0},
	MsgError:          {"Error", func() Message { return &Error{} }, 0},
	MsgGetMap:         {"GetMap", func() Message { return &GetMap{} }, MsgMapReply},
	MsgMapReply:       {"MapReply", func() Message { return &MapReply{} }, 0},
	MsgShardScan:      {"ShardScan", func() Message { return &ShardScan{} }, MsgShardScanReply},
	MsgShardScanReply: {"ShardScanReply", func() Message { return &ShardScanReply{} }, 0},
	MsgFenceShards:    {"FenceShards", func() Message { return &FenceShards{} }, MsgFenceReply},
	MsgFenceReply:     {"FenceReply", func() Message { return &FenceReply{} }, 0},
	MsgReleaseShards:  {"ReleaseShards", func() Message { return &ReleaseShards{} }, MsgAck},
	MsgMapChange:      {"MapChange", func() Message { return &MapChange{} }, MsgMapChangeReply},
	MsgMapChangeReply: {"MapChangeReply", func() Message { return &MapChangeReply{} }, 0},
	MsgForget:         {"Forget", func() Message { return &Forget{} }, MsgMapChangeReply},
	MsgGetView:        {"GetView", func() Message { return &GetView{} }, MsgViewReply},
	MsgViewReply:      {"ViewReply", func() Message { return &ViewReply{} }, 0},
	MsgReplicaCommit:  {"ReplicaCommit", func() Message { return &ReplicaCommit{} }, MsgCommitReply},
	MsgReplicaDelete:  {"ReplicaDelete", func() Message { return &ReplicaDelete{} }, MsgAck},
	MsgSetReplicas:    {"SetReplicas", func() Message { return &SetReplicas{} }, MsgMapChangeReply},
	MsgRenewReadLease: {"RenewReadLease", func() Message { return &RenewReadLease{} }, MsgReadLeaseReply},
	MsgGetReadLease:   {"GetReadLease", func() Message { return &GetReadLease{} }, MsgReadLeaseReply},
	MsgReadLeaseReply: {"ReadLeaseReply", func() Message { return &ReadLeaseReply{} }, 0},

	MsgCommitBatch:      {"CommitBatch", func() Message { return &CommitBatch{} }, MsgCommitBatchReply},
	MsgCommitBatchReply: {"CommitBatchReply", func() Message { return &CommitBatchReply{} }, 0},
}

func (t MsgType) String() string {
	if t > 0 && t < msgTypeEnd {
		return msgTable[t].name
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// Reply is the type that answers a request of type t (besides Error), or 0
// when t is not a request.
func (t MsgType) Reply() MsgType {
	if t > 0 && t < msgTypeEnd {
		return msgTable[t].reply
	}
	return 0
}

// NumMsgTypes is one more than the largest MsgType: arrays indexed by
// MsgType have this length.
const NumMsgTypes = int(msgTypeEnd)

// Message is one control message: a pointer to one of the types below.
type Message interface {
	Type() MsgType
	encode(e *encoder)
	decode(d *decoder) error
}

// SessionKind says what a connection is for, in its Hello.
type SessionKind uint8

// Session kinds.
const (
	// SessionClient: a client's data and control session (leases,
	// commits, scans, the map). The default.
	SessionClient SessionKind = iota
	// SessionPeer: another server of the cluster, for migration and map
	// changes as well as everything a client may do.
	SessionPeer
	// SessionRaft: the cluster map's Raft traffic; after the HelloReply
	// the connection carries Raft's own protocol.
	SessionRaft
	sessionKindEnd
)

func (k SessionKind) String() string {
	switch k {
	case SessionClient:
		return "client"
	case SessionPeer:
		return "peer"
	case SessionRaft:
		return "raft"
	}
	return fmt.Sprintf("SessionKind(%d)", uint8(k))
}

// Hello opens a session: the first request on every connection.
type Hello struct {
	Client string
	Token  []byte // the server's auth token; empty when it has none
	Kind   SessionKind
	// Target is the server ID the sender means to reach; a server refuses
	// a Hello for another ID (a restarted server on a reused address must
	// not take Raft traffic meant for its predecessor). Empty: any.
	Target string
	// NoQP asks for a session of control requests only: no QP is
	// connected after the Hello (Raft sessions never have one), and no
	// lease is granted. Otherwise two are, one rdma.ConnectQP after the
	// other once the HelloReply is sent (since version 5): the read QP,
	// on the server's PD with the arenas and the index, then the write
	// QP, on a PD of the session's own that holds its leases, so that a
	// lease's rkey works on that QP only.
	NoQP bool
}

// HelloReply names the server, its generation (which changes with every
// start, as the rkeys do), its data directory's ID and its map epoch.
type HelloReply struct {
	Server     string
	Generation uint64
	ServerID   string
	MapEpoch   uint64
	// CommitSlot, when not 0, is the size of the buffers the server keeps
	// posted as RECVs on the session's write QP: a Commit frame of at most
	// that many bytes may be sent there with a SEND after the record's
	// WRITE, instead of by a control round trip, and its reply comes back
	// as a SEND into a RECV the client posted (CommitOverQP). 0: the
	// session has no write QP, or the server takes commits only as
	// control requests.
	CommitSlot uint32
}

// CommitSlotSize is the CommitSlot a server offers: a Commit with two
// copies and server names of 64 bytes takes under 300, and the client
// sends one that does not fit (up to 15 copies of names up to
// MaxMetaNodeNameLen) as a control request instead. Any reply the server
// sends there fits (an Error's message is cut to fit).
const CommitSlotSize = 4096

// GrantLease asks for a write lease of Size bytes, and of at least Min (the
// record the writer has at hand): the server rounds both up to its lease
// granularity, grants at most its largest lease (Size 0 asks for the
// largest), and may grant less than Size, not less than Min, to use up the
// space it is carving from. A writer asks for what it expects to write, so
// that a short session does not hold space it never uses.
type GrantLease struct {
	Epoch     uint64
	Size, Min uint64
}

// LeaseReply is a granted write lease (store.Lease). TTL is its remaining
// life when the server sent it: relative, so clocks need not agree.
type LeaseReply struct {
	ID           uint64
	Arena        uint16
	Addr         uint64
	Size         uint64
	RKey         uint32
	TTL          time.Duration
	VersionBase  uint64
	VersionCount uint64
}

// Write identifies one write for idempotency: Session is chosen at random
// by the writer and used by one operation at a time, Seq grows by one per
// operation of the session. A retry carries the same pair. Session 0 opts
// out.
type Write struct {
	Session, Seq uint64
}

// Commit commits the record written at Offset of lease LeaseID's region,
// Length bytes long. Of a key whose shard has backups it names, in Copies,
// where the client wrote the same record on each of them, for the
// primary to forward.
type Commit struct {
	LeaseID, Offset, Length uint64
	Epoch                   uint64
	Write
	Copies []ReplicaCopy
}

// CommitBatch is several Commits of one session's lease at once (a
// client's MultiPut): the server commits each as a Commit of its own, all
// of them at the same time, so that its group commit takes them together,
// and answers with a CommitBatchReply, one result per commit, in order.
// At most MaxBatchCommits.
type CommitBatch struct {
	Commits []Commit
}

// MaxBatchCommits bounds a CommitBatch.
const MaxBatchCommits = 64

// CommitBatchReply answers a CommitBatch: for each of its commits, in
// order, the CommitReply, or the Error that refused it.
type CommitBatchReply struct {
	Results []CommitResult
}

// CommitResult is one commit's outcome in a CommitBatchReply: Err is nil
// when it was applied, and Reply then says where.
type CommitResult struct {
	Reply CommitReply
	Err   *Error
}

// ReplicaCopy is the copy of a record a client wrote for one backup: in
// lease LeaseID (granted by the server named Server), Length bytes at
// Offset.
type ReplicaCopy struct {
	Server                  string
	LeaseID, Offset, Length uint64
}

// ReplicaCommit is a primary's forward of a commit to a backup of the
// key's shard (between servers only): apply the record the client wrote
// at Offset of lease LeaseID, Length bytes, at the primary's Version,
// under the client's idempotency session. Epoch is the primary's map.
type ReplicaCommit struct {
	Epoch                   uint64
	Shard                   Shard // the record's key's
	LeaseID, Offset, Length uint64
	Version                 uint64
	Write
}

// ReplicaDelete is a primary's forward of a delete to a backup.
type ReplicaDelete struct {
	Epoch uint64
	Key   []byte
	Write
}

// CommitReply says where the committed record lies and its version. A
// retried commit that was applied before is answered with its version and,
// when the record has been superseded or moved since, Length 0.
type CommitReply struct {
	Arena   uint16
	Offset  uint64
	Length  uint32
	Version uint64
}

// Delete deletes a key (absent keys are no error).
type Delete struct {
	Key   []byte
	Epoch uint64
	Write
}

// Ack acknowledges a Delete, an EndLease or a ReleaseShards.
type Ack struct{}

// Scan lists keys in [Start, End) in order, from the Shards the sender's
// map says the server owns at Epoch (the server refuses a shard it does
// not own); End nil means no upper bound, Limit 0 no limit (the reply is
// still cut to fit MaxFrame).
type Scan struct {
	Start, End []byte
	Limit      uint32
	Epoch      uint64
	Shards     []Shard
}

// ScanEntry is one key of a scan and where its record lies.
type ScanEntry struct {
	Key     []byte
	Arena   uint16
	Offset  uint64
	Length  uint32
	Version uint64
}

// ScanEntrySize bounds the encoded size of a scan entry with a key of
// keyLen bytes, for cutting replies to fit a frame.
func ScanEntrySize(keyLen int) int { return keyLen + 30 }

// ScanReply is a scan's keys. More is set when the reply was cut short of
// the limit to fit a frame: scan again from the last key's successor.
type ScanReply struct {
	Entries []ScanEntry
	More    bool
}

// EndLease ends a lease: its write rkey is revoked.
type EndLease struct{ ID uint64 }

// Stats asks for the server's counters.
type Stats struct{}

// StatsReply is a few of the server's counters.
type StatsReply struct {
	Generation   uint64
	Keys         uint64
	Commits      uint64
	Deletes      uint64
	LeasesActive uint64
	Connections  uint64
	Handled      uint64 // control requests handled, all types
	MapEpoch     uint64 // the epoch of the map the server holds
	ShardsOwned  uint64
	// Migration into this server: shards being copied in now, shards
	// moved in since the start, and what their copies took.
	ShardsIncoming uint64
	ShardsMovedIn  uint64
	CopiedKeys     uint64
	CopiedBytes    uint64
	CopyTime       time.Duration
	// Space: bytes of current records, of records and lease remnants
	// nothing reads any more (the cleaner's work), and of segments free
	// for new leases, out of the arenas' capacity; and what the cleaner
	// did since the start.
	LiveBytes, DeadBytes, FreeBytes, CapacityBytes uint64
	SegmentsCleaned, CleanerMovedBytes             uint64
	// Requests counts the control requests handled by type (indexed by
	// MsgType; a sender may know fewer or more types than NumMsgTypes).
	Requests []uint64
	// NotReady is why the server does not serve yet ("" once it does:
	// an arena registered and the cluster map holds it), as its /readyz
	// says.
	NotReady string
	// IndexSlots is its hash index's size (it grows while serving).
	IndexSlots uint64
	// Copying is the moves into this server copying now (the target
	// catching up); zero when none runs. ShardsMovedIn and the Copied
	// counters above count the moves that finished.
	Copying CopyProgress
}

// CopyProgress is how far the moves a server is the target of and that
// copy a shard (every kind but a promotion) have come, while they run.
type CopyProgress struct {
	// Groups is how many groups of moves run (one per source and start);
	// Shards how many shards they copy, Copied how many of those had
	// their first, full pass (the later passes take what changed
	// meanwhile, the last with the shards frozen). Copied <= Shards.
	Groups, Shards, Copied uint64
	// Keys and Bytes are the records (and deletes of keys the source no
	// longer lists) and record bytes copied so far, every pass counted.
	Keys, Bytes uint64
	// Elapsed is the time since the earliest running group began.
	Elapsed time.Duration
}

// GetMap asks for the server's cluster map. Have is the epoch the sender
// holds: a server whose map is not newer answers without one.
type GetMap struct{ Have uint64 }

// MapReply carries the server's map (EncodeClusterMap), or none when it is
// not newer than GetMap.Have. Epoch is the server's epoch either way (0:
// it has no map yet).
type MapReply struct {
	Epoch uint64
	Map   []byte
}

// ShardScan asks a peer for the entries of one shard it holds, in key order
// after After (nil: from the first), for a migration's copy. With
// Sessions, the first reply (After nil) also carries the shard's
// idempotency sessions.
type ShardScan struct {
	Shard    Shard
	After    []byte
	Limit    uint32
	Sessions bool
}

// ShardScanReply is one page of a ShardScan. More is set when the shard has
// entries after the last one.
type ShardScanReply struct {
	Entries  []ScanEntry
	Sessions []SessionEntry
	More     bool
}

// SessionEntry is the last write one idempotency session applied to a
// shard.
type SessionEntry struct {
	Session, Seq uint64
	Version      uint64 // the write's version; 0 for a delete
	Time         int64  // when it was applied, Unix nanoseconds
}

// FenceShards asks the shards' owner to stop writes to them: it answers
// once its map is at Epoch or later (the map that froze them) and every
// write it admitted before is applied.
type FenceShards struct {
	Shards []Shard
	Epoch  uint64
}

// FenceReply is the fenced server's generation: a ReleaseShards must carry
// it, so that a server restarted since (which may have taken writes before
// its map caught up) is fenced again.
type FenceReply struct{ Generation uint64 }

// ReleaseShards asks a fenced owner to hand the shards over: it stops
// serving them (their records dead, their keys out of its index, their
// shard words cleared) and keeps their data until the map gives them to
// the new owner. With Backup (a promotion of one of the shards' backups)
// it keeps them as a backup instead, its records in backup state.
type ReleaseShards struct {
	Shards     []Shard
	Generation uint64
	Backup     bool
}

// MapChange proposes a map command (EncodeMapCommand) to the map's Raft
// leader; any server forwards it there.
type MapChange struct{ Command []byte }

// MapChangeReply is the epoch of the map after the change.
type MapChangeReply struct{ Epoch uint64 }

// Forget asks the cluster to remove a server from the map: a live one is
// drained first (its shards move to the others); with Force a dead one is
// dropped at once, its shards given to the others empty (with one copy of
// each key, its keys are lost).
type Forget struct {
	Node  string
	Force bool
}

// SetReplicas asks the cluster to keep Replicas copies of each shard (1 to
// MaxShardOwners): the map's leader then adds replicas where shards have
// fewer, up to the number of active servers. Answered by MapChangeReply
// with the epoch of the map that holds the count. A server from before
// this message answers it as an unknown type and closes the connection.
type SetReplicas struct {
	Replicas int
}

// RenewReadLease asks the map's Raft leader, between servers, for a read
// lease of ServerID (the asking server's data directory ID): the time
// during which the leader promotes none of its backups while the server
// is down, so that a one-sided read of it that completes within the
// lease returns nothing older than an acknowledged write (see
// docs/ARCHITECTURE.md, "Read leases"). Answered by ReadLeaseReply with
// TTL the lease's length, counted by the asker from before it sent the
// request, and Epoch the leader's map epoch then; or by Error
// CodeNotLeader.
type RenewReadLease struct{ ServerID string }

// GetReadLease asks a server how much of its read lease is left. A client
// that reads the server's shards at more than one replica trusts a read
// that completed before the time it sent this plus the answer's TTL
// (0: no lease: trust nothing read there).
type GetReadLease struct{}

// ReadLeaseReply is a read lease: TTL long from before the request was
// sent, relative, so clocks need only tick at about the same rate. Epoch
// is the map epoch of the grant: a server serves its lease only once its
// shards reflect that map.
type ReadLeaseReply struct {
	TTL   time.Duration
	Epoch uint64
}

// GetView asks a server for the servers it sees in gossip and, like GetMap,
// for its cluster map when it is newer than Have: all a client that does
// not join gossip needs, in one round trip.
type GetView struct{ Have uint64 }

// ViewReply is the server's gossip view of the servers (alive, dead or
// left, sorted by name; clients are left out) and its map, as MapReply
// carries it: Map is empty unless the server's is newer than GetView.Have,
// Epoch is the server's epoch either way.
type ViewReply struct {
	Members []ViewMember
	Epoch   uint64
	Map     []byte
}

// ViewMember is one server as the answering server's gossip sees it.
type ViewMember struct {
	Name string
	// Addr is its gossip address ("ip:port"), for operators; "" when
	// unknown.
	Addr  string
	State uint8 // membership.State: 1 alive, 2 dead, 3 left
	// Age is how long ago the answering server saw State begin: relative,
	// so that clocks need not agree.
	Age time.Duration
	// ArenasPending: the detached arena list the metadata summarizes has
	// not reached the answering server; Meta.Arenas is then the last list
	// of the same generation it holds (still valid), or empty.
	ArenasPending bool
	// Meta is the member's metadata, its arena list attached (inline)
	// even when gossip carries it detached: it travels as EncodeNodeMeta's
	// bytes, decoded with DecodeNodeMeta.
	Meta NodeMeta
}

// ErrorCode classifies an Error.
type ErrorCode uint16

// Error codes.
const (
	CodeNotFound ErrorCode = iota + 1
	CodeLeaseInvalid
	CodeRecordInvalid
	CodeFull
	CodeIndexFull
	CodeUnauthenticated
	CodeInternal
	CodeBadRequest // a request the server does not take (a reply type, a second Hello)
	// CodeNotOwner: the server does not own the key's shard in its map,
	// or the sender's map is older than the server's: refresh the map.
	CodeNotOwner
	// CodeShardMoving: the shard is frozen for a migration's last copy:
	// retry in a moment.
	CodeShardMoving
	// CodeNotLeader: a map change reached a server that is not the Raft
	// leader and could not forward it.
	CodeNotLeader
	// CodeUnavailable: the server cannot serve yet (no map, no quorum).
	CodeUnavailable
	// CodeSuperseded: a write older than one its session already applied.
	CodeSuperseded
	codeEnd
)

// NumErrorCodes is one more than the largest ErrorCode: arrays indexed
// by code have this length.
const NumErrorCodes = int(codeEnd)

var codeNames = [...]string{
	CodeNotFound: "not found", CodeLeaseInvalid: "lease invalid", CodeRecordInvalid: "record invalid",
	CodeFull: "full", CodeIndexFull: "index full", CodeUnauthenticated: "unauthenticated",
	CodeInternal: "internal", CodeBadRequest: "bad request", CodeNotOwner: "not owner",
	CodeShardMoving: "shard moving", CodeNotLeader: "not leader", CodeUnavailable: "unavailable",
	CodeSuperseded: "superseded",
}

func (c ErrorCode) String() string {
	if c > 0 && c < codeEnd {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// Error is a failed request's answer.
type Error struct {
	Code    ErrorCode
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("rkv server: %s: %s", e.Code, e.Message) }

func (*Hello) Type() MsgType            { return MsgHello }
func (*HelloReply) Type() MsgType       { return MsgHelloReply }
func (*GrantLease) Type() MsgType       { return MsgGrantLease }
func (*LeaseReply) Type() MsgType       { return MsgLeaseReply }
func (*Commit) Type() MsgType           { return MsgCommit }
func (*CommitReply) Type() MsgType      { return MsgCommitReply }
func (*Delete) Type() MsgType           { return MsgDelete }
func (*Ack) Type() MsgType              { return MsgAck }
func (*Scan) Type() MsgType             { return MsgScan }
func (*ScanReply) Type() MsgType        { return MsgScanReply }
func (*EndLease) Type() MsgType         { return MsgEndLease }
func (*Stats) Type() MsgType            { return MsgStats }
func (*StatsReply) Type() MsgType       { return MsgStatsReply }
func (*Error) Type() MsgType            { return MsgError }
func (*GetMap) Type() MsgType           { return MsgGetMap }
func (*MapReply) Type() MsgType         { return MsgMapReply }
func (*ShardScan) Type() MsgType        { return MsgShardScan }
func (*ShardScanReply) Type() MsgType   { return MsgShardScanReply }
func (*FenceShards) Type() MsgType      { return MsgFenceShards }
func (*FenceReply) Type() MsgType       { return MsgFenceReply }
func (*ReleaseShards) Type() MsgType    { return MsgReleaseShards }
func (*MapChange) Type() MsgType        { return MsgMapChange }
func (*MapChangeReply) Type() MsgType   { return MsgMapChangeReply }
func (*Forget) Type() MsgType           { return MsgForget }
func (*SetReplicas) Type() MsgType      { return MsgSetReplicas }
func (*RenewReadLease) Type() MsgType   { return MsgRenewReadLease }
func (*GetReadLease) Type() MsgType     { return MsgGetReadLease }
func (*CommitBatch) Type() MsgType      { return MsgCommitBatch }
func (*CommitBatchReply) Type() MsgType { return MsgCommitBatchReply }
func (*ReadLeaseReply) Type() MsgType   { return MsgReadLeaseReply }
func (*GetView) Type() MsgType          { return MsgGetView }
func (*ReplicaCommit) Type() MsgType    { return MsgReplicaCommit }
func (*ReplicaDelete) Type() MsgType    { return MsgReplicaDelete }
func (*ViewReply) Type() MsgType        { return MsgViewReply }

// ---- encoding ----

// encoder writes msgpack and keeps the first error: of the writer, or of a
// value that could never be decoded (which wraps ErrBadMessage).
type encoder struct {
	e   *msgpack.Encoder
	err error
}

func (e *encoder) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("%w: "+format, append([]any{ErrBadMessage}, args...)...)
	}
}

func (e *encoder) keep(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

func (e *encoder) array(n int)    { e.keep(e.e.EncodeArrayLen(n)) }
func (e *encoder) uint(v uint64)  { e.keep(e.e.EncodeUint(v)) }
func (e *encoder) bool(v bool)    { e.keep(e.e.EncodeBool(v)) }
func (e *encoder) bytes(b []byte) { e.keep(e.e.EncodeBytes(b)) }
func (e *encoder) str(s string)   { e.keep(e.e.EncodeString(s)) }
func (e *encoder) shards(s []Shard) {
	if len(s) > NumShards {
		e.fail("%d shards, limit %d", len(s), NumShards)
	}
	for _, x := range s {
		if x >= NumShards {
			e.fail("shard %d, limit %d", x, NumShards-1)
		}
	}
	e.keep(encodeShards(e.e, s))
}

func (e *encoder) uints(vs ...uint64) {
	e.array(len(vs))
	for _, v := range vs {
		e.uint(v)
	}
}

// limit fails for a length over max.
func (e *encoder) limit(what string, n, max int) {
	if n > max {
		e.fail("%s of %d bytes, limit %d", what, n, max)
	}
}

// key fails unless 1 <= len(k) <= MaxKeyLen.
func (e *encoder) key(what string, k []byte) {
	if len(k) == 0 || len(k) > MaxKeyLen {
		e.fail("%s of %d bytes: must be 1 to %d", what, len(k), MaxKeyLen)
	}
}

func (m *Hello) encode(e *encoder) {
	e.limit("client name", len(m.Client), MaxControlName)
	e.limit("token", len(m.Token), MaxControlToken)
	e.limit("target", len(m.Target), MaxServerIDLen)
	if m.Kind >= sessionKindEnd {
		e.fail("session kind %d", m.Kind)
	}
	e.array(5)
	e.str(m.Client)
	e.bytes(m.Token)
	e.uint(uint64(m.Kind))
	e.str(m.Target)
	e.bool(m.NoQP)
}

func (m *HelloReply) encode(e *encoder) {
	e.limit("server name", len(m.Server), MaxControlName)
	e.limit("server ID", len(m.ServerID), MaxServerIDLen)
	e.array(5)
	e.str(m.Server)
	e.uint(m.Generation)
	e.str(m.ServerID)
	e.uint(m.MapEpoch)
	e.uint(uint64(m.CommitSlot))
}

func (m *GrantLease) encode(e *encoder) { e.uints(m.Epoch, m.Size, m.Min) }
func (*Ack) encode(e *encoder)          { e.array(0) }
func (*Stats) encode(e *encoder)        { e.array(0) }

func (m *LeaseReply) encode(e *encoder) {
	if m.TTL < 0 {
		e.fail("negative lease TTL %v", m.TTL)
	}
	e.uints(m.ID, uint64(m.Arena), m.Addr, m.Size, uint64(m.RKey), uint64(m.TTL), m.VersionBase, m.VersionCount)
}

func (m *Commit) encode(e *encoder) {
	if len(m.Copies) > MaxShardOwners-1 {
		e.fail("%d replica copies, limit %d", len(m.Copies), MaxShardOwners-1)
	}
	e.array(7)
	for _, v := range []uint64{m.LeaseID, m.Offset, m.Length, m.Epoch, m.Session, m.Seq} {
		e.uint(v)
	}
	e.array(len(m.Copies))
	for _, c := range m.Copies {
		e.limit("replica copy's server name", len(c.Server), MaxMetaNodeNameLen)
		e.array(4)
		e.str(c.Server)
		e.uint(c.LeaseID)
		e.uint(c.Offset)
		e.uint(c.Length)
	}
}

func (m *CommitBatch) encode(e *encoder) {
	if len(m.Commits) > MaxBatchCommits {
		e.fail("%d commits in a batch, limit %d", len(m.Commits), MaxBatchCommits)
	}
	e.array(len(m.Commits))
	for i := range m.Commits {
		m.Commits[i].encode(e)
	}
}

// A CommitResult is [code, message, arena, offset, length, version]: code
// 0 and an empty message for a commit applied, else the Error's code and
// message and zeros.
func (m *CommitBatchReply) encode(e *encoder) {
	if len(m.Results) > MaxBatchCommits {
		e.fail("%d results in a batch, limit %d", len(m.Results), MaxBatchCommits)
	}
	e.array(len(m.Results))
	for _, r := range m.Results {
		e.array(6)
		if r.Err != nil {
			if r.Err.Code == 0 || r.Err.Code >= codeEnd {
				e.fail("error code %d", r.Err.Code)
			}
			e.uint(uint64(r.Err.Code))
			e.str(r.Err.Message[:min(len(r.Err.Message), MaxControlMessage)])
			for range 4 {
				e.uint(0)
			}
			continue
		}
		e.uint(0)
		e.str("")
		for _, v := range []uint64{uint64(r.Reply.Arena), r.Reply.Offset, uint64(r.Reply.Length), r.Reply.Version} {
			e.uint(v)
		}
	}
}

func (m *ReplicaCommit) encode(e *encoder) {
	e.uints(m.Epoch, uint64(m.Shard), m.LeaseID, m.Offset, m.Length, m.Version, m.Session, m.Seq)
}

func (m *ReplicaDelete) encode(e *encoder) {
	e.key("key", m.Key)
	e.array(4)
	e.uint(m.Epoch)
	e.bytes(m.Key)
	e.uint(m.Session)
	e.uint(m.Seq)
}

func (m *CommitReply) encode(e *encoder) {
	e.uints(uint64(m.Arena), m.Offset, uint64(m.Length), m.Version)
}

func (m *Delete) encode(e *encoder) {
	e.key("key", m.Key)
	e.array(4)
	e.bytes(m.Key)
	e.uint(m.Epoch)
	e.uint(m.Session)
	e.uint(m.Seq)
}

func (m *Scan) encode(e *encoder) {
	e.limit("scan start", len(m.Start), MaxKeyLen)
	e.limit("scan end", len(m.End), MaxKeyLen)
	e.array(5)
	e.bytes(m.Start)
	e.bytes(m.End)
	e.uint(uint64(m.Limit))
	e.uint(m.Epoch)
	e.shards(m.Shards)
}

func encodeScanEntries(e *encoder, entries []ScanEntry) {
	if len(entries) > MaxScanEntries {
		e.fail("%d scan entries, limit %d", len(entries), MaxScanEntries)
	}
	e.array(len(entries))
	for _, en := range entries {
		e.key("scan entry key", en.Key)
		e.array(5)
		e.bytes(en.Key)
		e.uint(uint64(en.Arena))
		e.uint(en.Offset)
		e.uint(uint64(en.Length))
		e.uint(en.Version)
	}
}

func (m *ScanReply) encode(e *encoder) {
	e.array(2)
	encodeScanEntries(e, m.Entries)
	e.bool(m.More)
}

func (m *EndLease) encode(e *encoder) { e.uints(m.ID) }

func (m *StatsReply) encode(e *encoder) {
	if m.CopyTime < 0 {
		e.fail("negative copy time %v", m.CopyTime)
	}
	if len(m.Requests) > 255 {
		e.fail("%d request types, limit 255", len(m.Requests))
	}
	if c := m.Copying; c.Copied > c.Shards || c.Elapsed < 0 {
		e.fail("copy progress of %d shards out of %d, %v elapsed", c.Copied, c.Shards, c.Elapsed)
	}
	e.array(5)
	e.uints(m.Generation, m.Keys, m.Commits, m.Deletes, m.LeasesActive, m.Connections, m.Handled,
		m.MapEpoch, m.ShardsOwned, m.ShardsIncoming, m.ShardsMovedIn, m.CopiedKeys, m.CopiedBytes, uint64(m.CopyTime),
		m.LiveBytes, m.DeadBytes, m.FreeBytes, m.CapacityBytes, m.SegmentsCleaned, m.CleanerMovedBytes)
	e.uints(m.Requests...)
	notReady := m.NotReady
	if len(notReady) > MaxControlMessage {
		notReady = notReady[:MaxControlMessage]
	}
	e.str(notReady)
	e.uint(m.IndexSlots)
	c := m.Copying
	e.uints(c.Groups, c.Shards, c.Copied, c.Keys, c.Bytes, uint64(c.Elapsed))
}

func (m *Error) encode(e *encoder) {
	if m.Code == 0 || m.Code >= codeEnd {
		e.fail("error code %d", m.Code)
	}
	msg := m.Message
	if len(msg) > MaxControlMessage {
		msg = msg[:MaxControlMessage]
	}
	e.array(2)
	e.uint(uint64(m.Code))
	e.str(msg)
}

func (m *GetMap) encode(e *encoder) { e.uints(m.Have) }

func (m *MapReply) encode(e *encoder) {
	e.limit("map", len(m.Map), MaxMapBytes)
	e.array(2)
	e.uint(m.Epoch)
	e.bytes(m.Map)
}

func (m *ShardScan) encode(e *encoder) {
	if m.Shard >= NumShards {
		e.fail("shard %d, limit %d", m.Shard, NumShards-1)
	}
	e.limit("after", len(m.After), MaxKeyLen)
	e.array(4)
	e.uint(uint64(m.Shard))
	e.bytes(m.After)
	e.uint(uint64(m.Limit))
	e.bool(m.Sessions)
}

func (m *ShardScanReply) encode(e *encoder) {
	if len(m.Sessions) > MaxScanEntries {
		e.fail("%d sessions, limit %d", len(m.Sessions), MaxScanEntries)
	}
	e.array(3)
	encodeScanEntries(e, m.Entries)
	e.array(len(m.Sessions))
	for _, s := range m.Sessions {
		if s.Time < 0 {
			e.fail("session time %d", s.Time)
		}
		e.uints(s.Session, s.Seq, s.Version, uint64(s.Time))
	}
	e.bool(m.More)
}

func (m *FenceShards) encode(e *encoder) {
	e.array(2)
	e.shards(m.Shards)
	e.uint(m.Epoch)
}

func (m *FenceReply) encode(e *encoder) { e.uints(m.Generation) }

func (m *ReleaseShards) encode(e *encoder) {
	e.array(3)
	e.shards(m.Shards)
	e.uint(m.Generation)
	e.bool(m.Backup)
}

func (m *MapChange) encode(e *encoder) {
	e.limit("map command", len(m.Command), MaxMapBytes)
	e.array(1)
	e.bytes(m.Command)
}

func (m *MapChangeReply) encode(e *encoder) { e.uints(m.Epoch) }

func (m *Forget) encode(e *encoder) {
	if m.Node == "" {
		e.fail("forget without a node name")
	}
	e.limit("node name", len(m.Node), MaxControlName)
	e.array(2)
	e.str(m.Node)
	e.bool(m.Force)
}

func (m *SetReplicas) encode(e *encoder) {
	if m.Replicas < 1 || m.Replicas > MaxShardOwners {
		e.fail("set replicas to %d: must be 1 to %d", m.Replicas, MaxShardOwners)
	}
	e.uints(uint64(m.Replicas))
}

func (m *RenewReadLease) encode(e *encoder) {
	if m.ServerID == "" {
		e.fail("read lease renewal without a server ID")
	}
	e.limit("server ID", len(m.ServerID), MaxControlName)
	e.array(1)
	e.str(m.ServerID)
}

func (*GetReadLease) encode(e *encoder) { e.array(0) }

func (m *ReadLeaseReply) encode(e *encoder) {
	if m.TTL < 0 {
		e.fail("read lease TTL %v is negative", m.TTL)
	}
	e.uints(uint64(m.TTL), m.Epoch)
}

func (m *GetView) encode(e *encoder) { e.uints(m.Have) }

func (m *ViewReply) encode(e *encoder) {
	if len(m.Members) > MaxViewMembers {
		e.fail("%d view members, limit %d", len(m.Members), MaxViewMembers)
	}
	e.limit("map", len(m.Map), MaxMapBytes)
	e.array(3)
	e.array(len(m.Members))
	for _, mb := range m.Members {
		if mb.Name == "" {
			e.fail("view member without a name")
		}
		e.limit("member name", len(mb.Name), MaxMetaNodeNameLen)
		e.limit("member address", len(mb.Addr), MaxMetaAddrLen)
		if mb.State < viewStateMin || mb.State > viewStateMax {
			e.fail("member %s in state %d", mb.Name, mb.State)
		}
		if mb.Age < 0 {
			e.fail("member %s of negative age %v", mb.Name, mb.Age)
		}
		meta, err := EncodeNodeMeta(mb.Meta)
		if err != nil {
			e.fail("member %s: %v", mb.Name, err)
		}
		e.limit("member metadata", len(meta), MaxViewMeta)
		e.array(6)
		e.str(mb.Name)
		e.str(mb.Addr)
		e.uint(uint64(mb.State))
		e.uint(uint64(mb.Age))
		e.bool(mb.ArenasPending)
		e.bytes(meta)
	}
	e.uint(m.Epoch)
	e.bytes(m.Map)
}

// The states a ViewMember may be in (membership's alive, dead, left).
const (
	viewStateMin = 1
	viewStateMax = 3
)

// frameCodec is what AppendFrame and DecodeFrame reuse, from a pool: a
// msgpack encoder and decoder and their buffers, so that a frame costs
// them no allocation.
type frameCodec struct {
	buf bytes.Buffer
	enc encoder
	rd  bytes.Reader
	dec decoder
}

var frameCodecs = sync.Pool{New: func() any {
	c := &frameCodec{}
	c.enc.e = msgpack.NewEncoder(&c.buf)
	// A bytes.Reader is an io.ByteScanner: the decoder reads it directly,
	// without buffering ahead, so rd.Len() is what is left.
	c.dec = decoder{r: &c.rd, d: msgpack.NewDecoder(&c.rd), bad: ErrBadMessage}
	return c
}}

// maxPooledFrame bounds the encode buffer a pooled codec keeps: a large
// reply (a scan, a map) is encoded once, not held by the pool.
const maxPooledFrame = 64 << 10

func putCodec(c *frameCodec) {
	if c.buf.Cap() <= maxPooledFrame {
		c.rd.Reset(nil)
		frameCodecs.Put(c)
	}
}

// AppendFrame appends m's frame (length prefix and body) with request id
// to dst.
func AppendFrame(dst []byte, id uint64, m Message) ([]byte, error) {
	c := frameCodecs.Get().(*frameCodec)
	defer putCodec(c)
	c.buf.Reset()
	e := &c.enc
	e.err = nil
	t := m.Type()
	e.array(4)
	e.uint(ControlVersion)
	e.uint(uint64(t))
	e.uint(id)
	m.encode(e)
	if e.err != nil {
		return dst, fmt.Errorf("proto: encoding %v: %w", t, e.err)
	}
	body := c.buf.Bytes()
	if len(body) > MaxFrame {
		return dst, fmt.Errorf("%w: %v frame of %d bytes, limit %d", ErrBadMessage, t, len(body), MaxFrame)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)))
	return append(dst, body...), nil
}

// WriteFrame writes m's frame with request id to w in one Write.
func WriteFrame(w io.Writer, id uint64, m Message) error {
	b, err := AppendFrame(nil, id, m)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadFrame reads one frame from r and decodes it. buf is reused for the
// body when large enough; the returned buffer is the one to pass next
// time. The decoded message retains nothing of buf. A length over
// MaxFrame fails before anything is allocated.
func ReadFrame(r io.Reader, buf []byte) (id uint64, m Message, _ []byte, err error) {
	return ReadFrameMax(r, buf, MaxFrame)
}

// ReadFrameMax is ReadFrame with a smaller bound on the body, such as
// MaxHelloFrame; limits above MaxFrame are taken as MaxFrame.
func ReadFrameMax(r io.Reader, buf []byte, limit int) (id uint64, m Message, _ []byte, err error) {
	limit = min(limit, MaxFrame)
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, buf, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(limit) {
		return 0, nil, buf, fmt.Errorf("%w: frame of %d bytes, limit %d", ErrBadMessage, n, limit)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, buf, err
	}
	id, m, err = DecodeFrame(buf)
	return id, m, buf, err
}

// DecodeFrame decodes a frame's body (without its length prefix). It
// retains nothing of b. Errors wrap ErrBadMessage.
func DecodeFrame(b []byte) (id uint64, m Message, err error) {
	return DecodeFrameInto(b, nil)
}

// DecodeFrameInto is DecodeFrame that decodes a frame holding a message
// of into's type into into, zeroing it first, and returns it as m; a frame
// of another type (an Error, say) is decoded into a new message. A caller
// that keeps one message per connection so decodes its stream of replies
// without allocating, and must not use the last one after the next
// decode. into may be nil. On an error into's contents are undefined.
func DecodeFrameInto(b []byte, into Message) (id uint64, m Message, err error) {
	c := frameCodecs.Get().(*frameCodec)
	defer putCodec(c)
	c.rd.Reset(b)
	c.dec.d.Reset(&c.rd)
	d := &c.dec
	t, err := d.frameHeader(len(b))
	if err != nil {
		return 0, nil, err
	}
	if into != nil && into.Type() == t {
		reflect.ValueOf(into).Elem().SetZero()
		m = into
	} else {
		m = msgTable[t].new()
	}
	if id, err = d.u64("request id"); err != nil {
		return 0, nil, err
	}
	if err := m.decode(d); err != nil {
		return 0, nil, fmt.Errorf("%v: %w", t, err)
	}
	if err := d.end(t.String()); err != nil {
		return 0, nil, err
	}
	return id, m, nil
}

// FrameType is the message type of a frame's body (as DecodeFrame takes
// it), read from its header alone: to route a frame before decoding it.
// It retains nothing of b. Errors wrap ErrBadMessage.
func FrameType(b []byte) (MsgType, error) {
	c := frameCodecs.Get().(*frameCodec)
	defer putCodec(c)
	c.rd.Reset(b)
	c.dec.d.Reset(&c.rd)
	return c.dec.frameHeader(len(b))
}

// frameHeader decodes a frame's header, up to its message type, of a
// frame of n bytes.
func (d *decoder) frameHeader(n int) (MsgType, error) {
	if n > MaxFrame {
		return 0, d.fail("frame of %d bytes, limit %d", n, MaxFrame)
	}
	if err := d.fields("frame", 4); err != nil {
		return 0, err
	}
	v, err := d.uint("version", 255)
	if err != nil {
		return 0, err
	}
	if v != ControlVersion {
		return 0, d.fail("control version %d; this side speaks %d", v, ControlVersion)
	}
	t, err := d.uint("type", 255)
	if err != nil {
		return 0, err
	}
	if t == 0 || t >= uint64(msgTypeEnd) {
		return 0, d.fail("unknown message type %d", t)
	}
	return MsgType(t), nil
}

// ---- decoding ----

func (m *Hello) decode(d *decoder) error {
	if err := d.fields("Hello", 5); err != nil {
		return err
	}
	var err error
	if m.Client, err = d.str("client name", MaxControlName); err != nil {
		return err
	}
	if m.Token, err = d.bytes("token", MaxControlToken); err != nil {
		return err
	}
	k, err := d.uint("session kind", uint64(sessionKindEnd-1))
	if err != nil {
		return err
	}
	m.Kind = SessionKind(k)
	if m.Target, err = d.str("target", MaxServerIDLen); err != nil {
		return err
	}
	m.NoQP, err = d.bool("no QP")
	return err
}

func (m *HelloReply) decode(d *decoder) error {
	if err := d.fields("HelloReply", 5); err != nil {
		return err
	}
	var err error
	if m.Server, err = d.str("server name", MaxControlName); err != nil {
		return err
	}
	if m.Generation, err = d.u64("generation"); err != nil {
		return err
	}
	if m.ServerID, err = d.str("server ID", MaxServerIDLen); err != nil {
		return err
	}
	if m.MapEpoch, err = d.u64("map epoch"); err != nil {
		return err
	}
	slot, err := d.uint("commit slot", MaxFrame)
	m.CommitSlot = uint32(slot)
	return err
}

func (m *GrantLease) decode(d *decoder) error {
	return d.uints("GrantLease", &m.Epoch, &m.Size, &m.Min)
}
func (*Ack) decode(d *decoder) error   { return d.fields("Ack", 0) }
func (*Stats) decode(d *decoder) error { return d.fields("Stats", 0) }

func (m *LeaseReply) decode(d *decoder) error {
	var arena, rkey, ttl uint64
	if err := d.uints("LeaseReply", &m.ID, &arena, &m.Addr, &m.Size, &rkey, &ttl, &m.VersionBase, &m.VersionCount); err != nil {
		return err
	}
	if arena >= MaxArenas || rkey > 1<<32-1 || ttl > 1<<63-1 {
		return d.fail("lease arena %d, rkey %#x, TTL %d out of range", arena, rkey, ttl)
	}
	m.Arena, m.RKey, m.TTL = uint16(arena), uint32(rkey), time.Duration(ttl)
	return nil
}

func (m *Commit) decode(d *decoder) error {
	if err := d.fields("Commit", 7); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    *uint64
	}{{"lease", &m.LeaseID}, {"offset", &m.Offset}, {"length", &m.Length}, {"epoch", &m.Epoch}, {"session", &m.Session}, {"seq", &m.Seq}} {
		var err error
		if *f.v, err = d.u64(f.name); err != nil {
			return err
		}
	}
	n, err := d.list("replica copies", MaxShardOwners-1)
	if err != nil || n == 0 {
		return err
	}
	m.Copies = make([]ReplicaCopy, n)
	for i := range m.Copies {
		c := &m.Copies[i]
		if err := d.fields("replica copy", 4); err != nil {
			return err
		}
		if c.Server, err = d.str("replica copy's server name", MaxMetaNodeNameLen); err != nil {
			return err
		}
		if c.Server == "" {
			return d.fail("replica copy %d names no server", i)
		}
		for _, p := range []*uint64{&c.LeaseID, &c.Offset, &c.Length} {
			if *p, err = d.u64("replica copy"); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *CommitBatch) decode(d *decoder) error {
	n, err := d.list("commits", MaxBatchCommits)
	if err != nil || n == 0 {
		return err
	}
	m.Commits = make([]Commit, n)
	for i := range m.Commits {
		if err := m.Commits[i].decode(d); err != nil {
			return err
		}
	}
	return nil
}

func (m *CommitBatchReply) decode(d *decoder) error {
	n, err := d.list("commit results", MaxBatchCommits)
	if err != nil || n == 0 {
		return err
	}
	m.Results = make([]CommitResult, n)
	for i := range m.Results {
		r := &m.Results[i]
		if err := d.fields("commit result", 6); err != nil {
			return err
		}
		code, err := d.uint("error code", uint64(codeEnd-1))
		if err != nil {
			return err
		}
		msg, err := d.str("error message", MaxControlMessage)
		if err != nil {
			return err
		}
		var arena, length uint64
		for _, p := range []*uint64{&arena, &r.Reply.Offset, &length, &r.Reply.Version} {
			if *p, err = d.u64("commit result"); err != nil {
				return err
			}
		}
		switch {
		case code == 0 && msg != "":
			return d.fail("commit result %d: a message without an error code", i)
		case code != 0 && (arena|r.Reply.Offset|length|r.Reply.Version) != 0:
			return d.fail("commit result %d: an error with a location", i)
		case arena >= MaxArenas || length > 1<<32-1:
			return d.fail("commit result %d: arena %d, length %d out of range", i, arena, length)
		}
		r.Reply.Arena, r.Reply.Length = uint16(arena), uint32(length)
		if code != 0 {
			r.Err = &Error{Code: ErrorCode(code), Message: msg}
		}
	}
	return nil
}

func (m *ReplicaCommit) decode(d *decoder) error {
	var sh uint64
	if err := d.uints("ReplicaCommit", &m.Epoch, &sh, &m.LeaseID, &m.Offset, &m.Length, &m.Version, &m.Session, &m.Seq); err != nil {
		return err
	}
	if sh >= NumShards {
		return d.fail("replica commit of shard %d (there are %d)", sh, NumShards)
	}
	m.Shard = Shard(sh)
	return nil
}

func (m *ReplicaDelete) decode(d *decoder) error {
	if err := d.fields("ReplicaDelete", 4); err != nil {
		return err
	}
	var err error
	if m.Epoch, err = d.u64("epoch"); err != nil {
		return err
	}
	if m.Key, err = d.key("key"); err != nil {
		return err
	}
	if m.Session, err = d.u64("session"); err != nil {
		return err
	}
	m.Seq, err = d.u64("seq")
	return err
}

func (m *CommitReply) decode(d *decoder) error {
	var arena, length uint64
	if err := d.uints("CommitReply", &arena, &m.Offset, &length, &m.Version); err != nil {
		return err
	}
	if arena >= MaxArenas || length > 1<<32-1 {
		return d.fail("commit reply arena %d, length %d out of range", arena, length)
	}
	m.Arena, m.Length = uint16(arena), uint32(length)
	return nil
}

// key reads a key: 1 to MaxKeyLen bytes.
func (d *decoder) key(what string) ([]byte, error) {
	k, err := d.bytes(what, MaxKeyLen)
	if err == nil && len(k) == 0 {
		return nil, d.fail("empty %s", what)
	}
	return k, err
}

func (m *Delete) decode(d *decoder) error {
	if err := d.fields("Delete", 4); err != nil {
		return err
	}
	var err error
	if m.Key, err = d.key("key"); err != nil {
		return err
	}
	if m.Epoch, err = d.u64("epoch"); err != nil {
		return err
	}
	if m.Session, err = d.u64("session"); err != nil {
		return err
	}
	m.Seq, err = d.u64("seq")
	return err
}

func (m *Scan) decode(d *decoder) error {
	if err := d.fields("Scan", 5); err != nil {
		return err
	}
	var err error
	if m.Start, err = d.bytes("scan start", MaxKeyLen); err != nil {
		return err
	}
	if m.End, err = d.bytes("scan end", MaxKeyLen); err != nil {
		return err
	}
	limit, err := d.uint("scan limit", 1<<32-1)
	if err != nil {
		return err
	}
	m.Limit = uint32(limit)
	if m.Epoch, err = d.u64("epoch"); err != nil {
		return err
	}
	m.Shards, err = d.shards("scan shards", NumShards)
	return err
}

func decodeScanEntries(d *decoder) ([]ScanEntry, error) {
	n, err := d.list("scan entries", MaxScanEntries)
	if err != nil || n == 0 {
		return nil, err
	}
	// An entry takes at least 7 bytes: array header, 1-byte key, 5 fixints.
	out := make([]ScanEntry, 0, min(n, d.r.Len()/7+1))
	for range n {
		var en ScanEntry
		if err := d.fields("scan entry", 5); err != nil {
			return nil, err
		}
		if en.Key, err = d.key("scan entry key"); err != nil {
			return nil, err
		}
		arena, err := d.uint("scan entry arena", MaxArenas-1)
		if err != nil {
			return nil, err
		}
		if en.Offset, err = d.u64("scan entry offset"); err != nil {
			return nil, err
		}
		length, err := d.uint("scan entry length", 1<<32-1)
		if err != nil {
			return nil, err
		}
		if en.Version, err = d.u64("scan entry version"); err != nil {
			return nil, err
		}
		en.Arena, en.Length = uint16(arena), uint32(length)
		out = append(out, en)
	}
	return out, nil
}

func (m *ScanReply) decode(d *decoder) error {
	if err := d.fields("ScanReply", 2); err != nil {
		return err
	}
	var err error
	if m.Entries, err = decodeScanEntries(d); err != nil {
		return err
	}
	m.More, err = d.bool("scan more")
	return err
}

func (m *EndLease) decode(d *decoder) error { return d.uints("EndLease", &m.ID) }

func (m *StatsReply) decode(d *decoder) error {
	if err := d.fields("StatsReply", 5); err != nil {
		return err
	}
	var copyTime uint64
	if err := d.uints("StatsReply counters", &m.Generation, &m.Keys, &m.Commits, &m.Deletes, &m.LeasesActive, &m.Connections, &m.Handled,
		&m.MapEpoch, &m.ShardsOwned, &m.ShardsIncoming, &m.ShardsMovedIn, &m.CopiedKeys, &m.CopiedBytes, &copyTime,
		&m.LiveBytes, &m.DeadBytes, &m.FreeBytes, &m.CapacityBytes, &m.SegmentsCleaned, &m.CleanerMovedBytes); err != nil {
		return err
	}
	if copyTime > 1<<63-1 {
		return d.fail("copy time %d out of range", copyTime)
	}
	m.CopyTime = time.Duration(copyTime)
	n, err := d.list("requests by type", 255)
	if err != nil {
		return err
	}
	if n > 0 {
		m.Requests = make([]uint64, n)
	}
	for i := range m.Requests {
		if m.Requests[i], err = d.u64("requests of a type"); err != nil {
			return err
		}
	}
	if m.NotReady, err = d.str("not ready", MaxControlMessage); err != nil {
		return err
	}
	if m.IndexSlots, err = d.u64("index slots"); err != nil {
		return err
	}
	c := &m.Copying
	var elapsed uint64
	if err := d.uints("StatsReply copy progress", &c.Groups, &c.Shards, &c.Copied, &c.Keys, &c.Bytes, &elapsed); err != nil {
		return err
	}
	if c.Copied > c.Shards || elapsed > 1<<63-1 {
		return d.fail("copy progress of %d shards out of %d, %d ns elapsed", c.Copied, c.Shards, elapsed)
	}
	c.Elapsed = time.Duration(elapsed)
	return nil
}

func (m *Error) decode(d *decoder) error {
	if err := d.fields("Error", 2); err != nil {
		return err
	}
	c, err := d.uint("error code", uint64(codeEnd-1))
	if err != nil {
		return err
	}
	if c == 0 {
		return d.fail("error code 0")
	}
	m.Code = ErrorCode(c)
	m.Message, err = d.str("error message", MaxControlMessage)
	return err
}

func (m *GetMap) decode(d *decoder) error { return d.uints("GetMap", &m.Have) }

func (m *MapReply) decode(d *decoder) error {
	if err := d.fields("MapReply", 2); err != nil {
		return err
	}
	var err error
	if m.Epoch, err = d.u64("map epoch"); err != nil {
		return err
	}
	m.Map, err = d.bytes("map", MaxMapBytes)
	return err
}

func (m *ShardScan) decode(d *decoder) error {
	if err := d.fields("ShardScan", 4); err != nil {
		return err
	}
	s, err := d.uint("shard", NumShards-1)
	if err != nil {
		return err
	}
	m.Shard = Shard(s)
	if m.After, err = d.bytes("after", MaxKeyLen); err != nil {
		return err
	}
	limit, err := d.uint("limit", 1<<32-1)
	if err != nil {
		return err
	}
	m.Limit = uint32(limit)
	m.Sessions, err = d.bool("sessions")
	return err
}

func (m *ShardScanReply) decode(d *decoder) error {
	if err := d.fields("ShardScanReply", 3); err != nil {
		return err
	}
	var err error
	if m.Entries, err = decodeScanEntries(d); err != nil {
		return err
	}
	n, err := d.list("sessions", MaxScanEntries)
	if err != nil {
		return err
	}
	if n > 0 {
		// A session takes at least 5 bytes.
		m.Sessions = make([]SessionEntry, 0, min(n, d.r.Len()/5+1))
	}
	for range n {
		var s SessionEntry
		var t uint64
		if err := d.uints("session", &s.Session, &s.Seq, &s.Version, &t); err != nil {
			return err
		}
		if t > 1<<63-1 {
			return d.fail("session time %d out of range", t)
		}
		s.Time = int64(t)
		m.Sessions = append(m.Sessions, s)
	}
	m.More, err = d.bool("more")
	return err
}

func (m *FenceShards) decode(d *decoder) error {
	if err := d.fields("FenceShards", 2); err != nil {
		return err
	}
	var err error
	if m.Shards, err = d.shards("shards", NumShards); err != nil {
		return err
	}
	m.Epoch, err = d.u64("epoch")
	return err
}

func (m *FenceReply) decode(d *decoder) error { return d.uints("FenceReply", &m.Generation) }

func (m *ReleaseShards) decode(d *decoder) error {
	if err := d.fields("ReleaseShards", 3); err != nil {
		return err
	}
	var err error
	if m.Shards, err = d.shards("shards", NumShards); err != nil {
		return err
	}
	if m.Generation, err = d.u64("generation"); err != nil {
		return err
	}
	m.Backup, err = d.bool("backup")
	return err
}

func (m *MapChange) decode(d *decoder) error {
	if err := d.fields("MapChange", 1); err != nil {
		return err
	}
	var err error
	m.Command, err = d.bytes("map command", MaxMapBytes)
	return err
}

func (m *MapChangeReply) decode(d *decoder) error { return d.uints("MapChangeReply", &m.Epoch) }

func (m *Forget) decode(d *decoder) error {
	if err := d.fields("Forget", 2); err != nil {
		return err
	}
	var err error
	if m.Node, err = d.str("node name", MaxControlName); err != nil {
		return err
	}
	if m.Node == "" {
		return d.fail("forget without a node name")
	}
	m.Force, err = d.bool("force")
	return err
}

func (m *SetReplicas) decode(d *decoder) error {
	if err := d.fields("SetReplicas", 1); err != nil {
		return err
	}
	n, err := d.uint("replicas", MaxShardOwners)
	if err != nil {
		return err
	}
	if n == 0 {
		return d.fail("set replicas to 0: must be 1 to %d", MaxShardOwners)
	}
	m.Replicas = int(n)
	return nil
}

func (m *RenewReadLease) decode(d *decoder) error {
	if err := d.fields("RenewReadLease", 1); err != nil {
		return err
	}
	var err error
	if m.ServerID, err = d.str("server ID", MaxControlName); err != nil {
		return err
	}
	if m.ServerID == "" {
		return d.fail("read lease renewal without a server ID")
	}
	return nil
}

func (*GetReadLease) decode(d *decoder) error { return d.fields("GetReadLease", 0) }

func (m *ReadLeaseReply) decode(d *decoder) error {
	var ttl uint64
	if err := d.uints("ReadLeaseReply", &ttl, &m.Epoch); err != nil {
		return err
	}
	if ttl > 1<<63-1 {
		return d.fail("read lease TTL %d out of range", ttl)
	}
	m.TTL = time.Duration(ttl)
	return nil
}

func (m *GetView) decode(d *decoder) error { return d.uints("GetView", &m.Have) }

func (m *ViewReply) decode(d *decoder) error {
	if err := d.fields("ViewReply", 3); err != nil {
		return err
	}
	n, err := d.list("view members", MaxViewMembers)
	if err != nil {
		return err
	}
	if n > 0 {
		// A member takes at least 8 bytes: array header, 1-byte name,
		// empty address, 3 fixints or bools, 1 byte of metadata.
		m.Members = make([]ViewMember, 0, min(n, d.r.Len()/8+1))
	}
	for range n {
		var mb ViewMember
		if err := d.fields("view member", 6); err != nil {
			return err
		}
		if mb.Name, err = d.str("member name", MaxMetaNodeNameLen); err != nil {
			return err
		}
		if mb.Name == "" {
			return d.fail("view member without a name")
		}
		if mb.Addr, err = d.str("member address", MaxMetaAddrLen); err != nil {
			return err
		}
		st, err := d.uint("member state", viewStateMax)
		if err != nil {
			return err
		}
		if st < viewStateMin {
			return d.fail("member %s in state %d", mb.Name, st)
		}
		mb.State = uint8(st)
		age, err := d.uint("member age", 1<<63-1)
		if err != nil {
			return err
		}
		mb.Age = time.Duration(age)
		if mb.ArenasPending, err = d.bool("arenas pending"); err != nil {
			return err
		}
		raw, err := d.bytes("member metadata", MaxViewMeta)
		if err != nil {
			return err
		}
		if mb.Meta, err = DecodeNodeMeta(raw); err != nil {
			return d.wrap("metadata of "+mb.Name, err)
		}
		m.Members = append(m.Members, mb)
	}
	if m.Epoch, err = d.u64("map epoch"); err != nil {
		return err
	}
	m.Map, err = d.bytes("map", MaxMapBytes)
	return err
}
