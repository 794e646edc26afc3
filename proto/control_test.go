package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/rkv-io/rkv/internal/race"
)

func controlSamples() []Message {
	return []Message{
		&Hello{Client: "client-1", Token: []byte("secret")},
		&Hello{Client: "c", Kind: SessionRaft, Target: "0123456789abcdef", NoQP: true},
		&HelloReply{Server: "s1", Generation: 7, ServerID: "0123456789abcdef", MapEpoch: 12},
		&HelloReply{Server: "s1", Generation: 7, ServerID: "0123456789abcdef", MapEpoch: 12, CommitSlot: CommitSlotSize},
		&GrantLease{Epoch: 4, Size: 1 << 20, Min: 4096},
		&LeaseReply{ID: 3, Arena: 1, Addr: 0x7f00_1234_5000, Size: 1 << 20, RKey: 0xdeadbeef, TTL: 30 * time.Second, VersionBase: 100, VersionCount: 32768},
		&Commit{LeaseID: 3, Offset: 4096, Length: 48, Epoch: 9, Write: Write{Session: 1<<64 - 1, Seq: 77}},
		&Commit{LeaseID: 3, Offset: 4096, Length: 48, Epoch: 9, Copies: []ReplicaCopy{{Server: "s2", LeaseID: 4, Offset: 128, Length: 48}, {Server: "s3", LeaseID: 9}}},
		&ReplicaCommit{Epoch: 9, Shard: NumShards - 1, LeaseID: 4, Offset: 128, Length: 48, Version: 1 << 40, Write: Write{Session: 5, Seq: 6}},
		&ReplicaDelete{Epoch: 9, Key: []byte("k"), Write: Write{Session: 5, Seq: 7}},
		&CommitReply{Arena: 1, Offset: 1<<20 + 4096, Length: 48, Version: 101},
		&CommitBatch{Commits: []Commit{{LeaseID: 3, Offset: 0, Length: 48, Epoch: 9, Write: Write{Session: 5, Seq: 1}},
			{LeaseID: 3, Offset: 48, Length: 52, Epoch: 9, Write: Write{Session: 7, Seq: 2}, Copies: []ReplicaCopy{{Server: "s2", LeaseID: 4, Offset: 128, Length: 52}}}}},
		&CommitBatchReply{Results: []CommitResult{{Reply: CommitReply{Arena: 1, Offset: 4096, Length: 48, Version: 101}},
			{Err: &Error{Code: CodeShardMoving, Message: "moving"}}}},
		&Delete{Key: []byte("k"), Epoch: 3, Write: Write{Session: 5, Seq: 6}},
		&Ack{},
		&Scan{Start: []byte("a"), End: []byte("b"), Limit: 10, Epoch: 2, Shards: []Shard{0, 7, NumShards - 1}},
		&Scan{Start: []byte{}, Limit: 0},
		&ScanReply{Entries: []ScanEntry{{Key: []byte("a1"), Arena: 0, Offset: 64, Length: 40, Version: 9}, {Key: []byte("a2"), Arena: 4095, Offset: 1 << 39, Length: 1<<32 - 1, Version: 1<<64 - 1}}, More: true},
		&ScanReply{},
		&EndLease{ID: 3},
		&Stats{},
		&StatsReply{Generation: 2, Keys: 10, Commits: 11, Deletes: 1, LeasesActive: 2, Connections: 1, Handled: 99,
			MapEpoch: 5, ShardsOwned: 341, ShardsIncoming: 16, ShardsMovedIn: 32, CopiedKeys: 1000, CopiedBytes: 1 << 30, CopyTime: time.Second,
			Requests: []uint64{0, 3, 0, 5}, NotReady: "server: no arena is registered", IndexSlots: 1 << 18},
		&StatsReply{Copying: CopyProgress{Groups: 2, Shards: 48, Copied: 20, Keys: 12345, Bytes: 41 << 20, Elapsed: 1100 * time.Millisecond}},
		&StatsReply{},
		&Error{Code: CodeNotFound, Message: "no such key"},
		&Error{Code: CodeBadRequest},
		&Error{Code: CodeSuperseded, Message: "older"},
		&GetMap{Have: 3},
		&MapReply{Epoch: 4, Map: []byte{1, 2, 3}},
		&MapReply{},
		&ShardScan{Shard: 1023, After: []byte("k"), Limit: 100, Sessions: true},
		&ShardScan{},
		&ShardScanReply{Entries: []ScanEntry{{Key: []byte("x"), Arena: 2, Offset: 8, Length: 40, Version: 3}},
			Sessions: []SessionEntry{{Session: 1, Seq: 2, Version: 3, Time: 1 << 60}}, More: true},
		&ShardScanReply{},
		&FenceShards{Shards: []Shard{1, 2}, Epoch: 8},
		&FenceReply{Generation: 3},
		&ReleaseShards{Shards: []Shard{3}, Generation: 3, Backup: true},
		&MapChange{Command: []byte("cmd")},
		&MapChangeReply{Epoch: 9},
		&Forget{Node: "node2", Force: true},
		&SetReplicas{Replicas: 1},
		&SetReplicas{Replicas: MaxShardOwners},
		&RenewReadLease{ServerID: "0123456789abcdef"},
		&GetReadLease{},
		&ReadLeaseReply{TTL: 4 * time.Second, Epoch: 12},
		&ReadLeaseReply{},
		&GetView{Have: 7},
		&ViewReply{},
		&ViewReply{Epoch: 9, Map: []byte{4, 5}, Members: []ViewMember{
			{Name: "node1", Addr: "127.0.0.1:7946", State: 1, Age: 3 * time.Second, Meta: viewSampleMeta(false)},
			{Name: "node2", State: 2, Age: 0, ArenasPending: true, Meta: viewSampleMeta(true)},
		}},
	}
}

// viewSampleMeta is a server's metadata for a ViewMember; detached, its
// arena list is summarized and attached, as a server sends it.
func viewSampleMeta(detached bool) NodeMeta {
	m := NodeMeta{Role: RoleServer, ControlAddr: "127.0.0.1:7411", Provider: "soft", Endpoint: Endpoint{Addr: "127.0.0.1:7421"},
		Generation: 3, Index: &IndexRegion{Addr: 0x7f00_0000_0000, RKey: 5, Geometry: IndexGeometry{Slots: 1024, Neighborhood: 8, Seed: 1}},
		Arenas: []ArenaRegion{{ID: 0, Addr: 0x7e00_0000_0000, Length: 1 << 26, RKey: 9}}, ServerID: "0123456789abcdef",
		ClusterID: 1, MapEpoch: 9, Limits: RecordLimits{MaxKeyLen: 1024, MaxValueLen: 1 << 20}}
	if detached {
		m.ArenaSet = SummarizeArenas(m.Arenas)
	}
	return m
}

func TestControlRoundTrip(t *testing.T) {
	for i, m := range controlSamples() {
		b, err := AppendFrame([]byte("prefix"), uint64(i)*1000+1, m)
		if err != nil {
			t.Fatalf("%v: %v", m.Type(), err)
		}
		if string(b[:6]) != "prefix" {
			t.Fatalf("prefix lost")
		}
		id, got, _, err := ReadFrame(bytes.NewReader(b[6:]), nil)
		if err != nil {
			t.Fatalf("%v: %v", m.Type(), err)
		}
		if id != uint64(i)*1000+1 || !reflect.DeepEqual(got, m) {
			t.Errorf("%v: got id %d %#v, want %#v", m.Type(), id, got, m)
		}
	}
}

func TestControlStream(t *testing.T) {
	var buf bytes.Buffer
	msgs := controlSamples()
	for i, m := range msgs {
		if err := WriteFrame(&buf, uint64(i), m); err != nil {
			t.Fatal(err)
		}
	}
	var scratch []byte
	for i, want := range msgs {
		id, m, b, err := ReadFrame(&buf, scratch)
		scratch = b
		if err != nil || id != uint64(i) || !reflect.DeepEqual(m, want) {
			t.Fatalf("frame %d: %d %#v %v", i, id, m, err)
		}
	}
	if _, _, _, err := ReadFrame(&buf, scratch); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
}

// body builds a frame body by hand, to test what an encoder never writes.
func body(t testing.TB, fields ...any) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	if err := e.Encode(fields); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestControlDecodeRejects(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":                      {},
		"not an array":               {0x01},
		"3 fields":                   body(t, ControlVersion, MsgAck, 1),
		"5 fields":                   body(t, ControlVersion, MsgAck, 1, []any{}, 0),
		"version 1":                  body(t, 1, MsgAck, 1, []any{}),
		"older version":              body(t, ControlVersion-1, MsgAck, 1, []any{}),
		"newer version":              body(t, ControlVersion+1, MsgAck, 1, []any{}),
		"version -1":                 body(t, -1, MsgAck, 1, []any{}),
		"type 0":                     body(t, ControlVersion, 0, 1, []any{}),
		"type 99":                    body(t, ControlVersion, 99, 1, []any{}),
		"float id":                   body(t, ControlVersion, MsgAck, 1.5, []any{}),
		"ack with field":             body(t, ControlVersion, MsgAck, 1, []any{1}),
		"commit 2 fields":            body(t, ControlVersion, MsgCommit, 1, []any{1, 2}),
		"negative offset":            body(t, ControlVersion, MsgCommit, 1, []any{1, -2, 3, 0, 0, 0, []any{}}),
		"nil seq":                    body(t, ControlVersion, MsgCommit, 1, []any{1, 2, 3, 0, 0, nil, []any{}}),
		"nil copies":                 body(t, ControlVersion, MsgCommit, 1, []any{1, 2, 3, 0, 0, 0, nil}),
		"copy, no server":            body(t, ControlVersion, MsgCommit, 1, []any{1, 2, 3, 0, 0, 0, []any{[]any{"", 1, 2, 3}}}),
		"copy of 3 fields":           body(t, ControlVersion, MsgCommit, 1, []any{1, 2, 3, 0, 0, 0, []any{[]any{"s2", 1, 2}}}),
		"16 copies":                  body(t, ControlVersion, MsgCommit, 1, []any{1, 2, 3, 0, 0, 0, slices.Repeat([]any{[]any{"s2", 1, 2, 3}}, 16)}),
		"replica commit, shard 1024": body(t, ControlVersion, MsgReplicaCommit, 1, []any{1, NumShards, 1, 2, 3, 4, 0, 0}),
		"replica delete, empty key":  body(t, ControlVersion, MsgReplicaDelete, 1, []any{1, []byte{}, 0, 0}),
		"empty key":                  body(t, ControlVersion, MsgDelete, 1, []any{[]byte{}, 0, 0, 0}),
		"nil key":                    body(t, ControlVersion, MsgDelete, 1, []any{nil, 0, 0, 0}),
		"key as int":                 body(t, ControlVersion, MsgDelete, 1, []any{5, 0, 0, 0}),
		"long key":                   body(t, ControlVersion, MsgDelete, 1, []any{make([]byte, MaxKeyLen+1), 0, 0, 0}),
		"nil epoch":                  body(t, ControlVersion, MsgDelete, 1, []any{[]byte("k"), nil, 0, 0}),
		"shard 1024":                 body(t, ControlVersion, MsgFenceShards, 1, []any{[]any{NumShards}, 1}),
		"session kind 3":             body(t, ControlVersion, MsgHello, 1, []any{"c", nil, 3, "", false}),
		"forget no name":             body(t, ControlVersion, MsgForget, 1, []any{"", false}),
		"bool as int":                body(t, ControlVersion, MsgForget, 1, []any{"n", 1}),
		"set replicas 0":             body(t, ControlVersion, MsgSetReplicas, 1, []any{0}),
		"set replicas 17":            body(t, ControlVersion, MsgSetReplicas, 1, []any{MaxShardOwners + 1}),
		"set replicas -1":            body(t, ControlVersion, MsgSetReplicas, 1, []any{-1}),
		"set replicas nil":           body(t, ControlVersion, MsgSetReplicas, 1, []any{nil}),
		"set replicas as string":     body(t, ControlVersion, MsgSetReplicas, 1, []any{"3"}),
		"set replicas, 2 fields":     body(t, ControlVersion, MsgSetReplicas, 1, []any{3, 0}),
		"read lease without an ID":   body(t, ControlVersion, MsgRenewReadLease, 1, []any{""}),
		"read lease ID as number":    body(t, ControlVersion, MsgRenewReadLease, 1, []any{7}),
		"get read lease with fields": body(t, ControlVersion, MsgGetReadLease, 1, []any{1}),
		"read lease TTL negative":    body(t, ControlVersion, MsgReadLeaseReply, 1, []any{-1, 2}),
		"read lease TTL huge":        body(t, ControlVersion, MsgReadLeaseReply, 1, []any{uint64(1 << 63), 2}),
		"read lease one field":       body(t, ControlVersion, MsgReadLeaseReply, 1, []any{5}),
		"set replicas, no field":     body(t, ControlVersion, MsgSetReplicas, 1, []any{}),
		"stats, 4 fields (v6)":       body(t, ControlVersion, MsgStatsReply, 1, append(statsStart(), "", 0)),
		"stats, copied > shards":     body(t, ControlVersion, MsgStatsReply, 1, append(statsStart(), "", 0, []any{1, 2, 3, 0, 0, 0})),
		"stats, elapsed 2^63":        body(t, ControlVersion, MsgStatsReply, 1, append(statsStart(), "", 0, []any{1, 3, 2, 0, 0, uint64(1) << 63})),
		"stats, progress of 5":       body(t, ControlVersion, MsgStatsReply, 1, append(statsStart(), "", 0, []any{1, 3, 2, 0, 0})),
		"stats, nil progress":        body(t, ControlVersion, MsgStatsReply, 1, append(statsStart(), "", 0, nil)),
		"arena 4096":                 body(t, ControlVersion, MsgCommitReply, 1, []any{4096, 0, 1, 1}),
		"batch of 65":                body(t, ControlVersion, MsgCommitBatch, 1, slices.Repeat([]any{[]any{1, 2, 3, 0, 0, 0, []any{}}}, MaxBatchCommits+1)),
		"batch, nil commits":         body(t, ControlVersion, MsgCommitBatch, 1, nil),
		"batch, a bad commit":        body(t, ControlVersion, MsgCommitBatch, 1, []any{[]any{1, 2}}),
		"result, message, no code":   body(t, ControlVersion, MsgCommitBatchReply, 1, []any{[]any{0, "x", 1, 2, 3, 4}}),
		"result, error and location": body(t, ControlVersion, MsgCommitBatchReply, 1, []any{[]any{int(CodeShardMoving), "m", 0, 2, 0, 0}}),
		"result, code 99":            body(t, ControlVersion, MsgCommitBatchReply, 1, []any{[]any{99, "x", 0, 0, 0, 0}}),
		"result, arena 4096":         body(t, ControlVersion, MsgCommitBatchReply, 1, []any{[]any{0, "", 4096, 0, 1, 1}}),
		"result of 5 fields":         body(t, ControlVersion, MsgCommitBatchReply, 1, []any{[]any{0, "", 1, 0, 1}}),
		"rkey 2^32":                  body(t, ControlVersion, MsgLeaseReply, 1, []any{1, 0, 0, 0, uint64(1) << 32, 0, 0, 0}),
		"error code 0":               body(t, ControlVersion, MsgError, 1, []any{0, "x"}),
		"error code 99":              body(t, ControlVersion, MsgError, 1, []any{99, "x"}),
		"trailing":                   append(body(t, ControlVersion, MsgAck, 1, []any{}), 0),
		"long token":                 body(t, ControlVersion, MsgHello, 1, []any{"c", make([]byte, MaxControlToken+1), 0, "", false}),
		"view state 0":               body(t, ControlVersion, MsgViewReply, 1, []any{[]any{[]any{"n", "", 0, 0, false, []byte{}}}, 0, nil}),
		"view state 4":               body(t, ControlVersion, MsgViewReply, 1, []any{[]any{[]any{"n", "", 4, 0, false, []byte{}}}, 0, nil}),
		"view no name":               body(t, ControlVersion, MsgViewReply, 1, []any{[]any{[]any{"", "", 1, 0, false, []byte{}}}, 0, nil}),
		"view bad meta":              body(t, ControlVersion, MsgViewReply, 1, []any{[]any{[]any{"n", "", 1, 0, false, []byte{0x91, 0x01}}}, 0, nil}),
		"view nil members":           body(t, ControlVersion, MsgViewReply, 1, []any{nil, 0, nil}),
		"view 5 fields":              body(t, ControlVersion, MsgViewReply, 1, []any{[]any{[]any{"n", "", 1, 0, false}}, 0, nil}),
		"entries overflow":           {0x94, ControlVersion, byte(MsgScanReply), 0x01, 0x92, 0xdd, 0x7f, 0xff, 0xff, 0xff},
		"bytes overflow":             {0x94, ControlVersion, byte(MsgDelete), 0x01, 0x94, 0xc6, 0x7f, 0xff, 0xff, 0xff},
	} {
		if _, m, err := DecodeFrame(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: got %#v, %v; want ErrBadMessage", name, m, err)
		}
	}
}

func TestControlFrameLimit(t *testing.T) {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], MaxFrame+1)
	// A reader that would hand out 4 GiB: ReadFrame must refuse from the
	// header alone.
	r := io.MultiReader(bytes.NewReader(hdr[:]), strings.NewReader("x"))
	if _, _, b, err := ReadFrame(r, nil); !errors.Is(err, ErrBadMessage) || b != nil {
		t.Fatalf("oversized frame: %v (buffer %d)", err, len(b))
	}
	big := &ScanReply{}
	for i := 0; i < MaxFrame/8; i++ {
		big.Entries = append(big.Entries, ScanEntry{Key: []byte("0123456789abcdef"), Offset: 1 << 40, Length: 1 << 20, Version: 1 << 40})
	}
	if _, err := AppendFrame(nil, 1, big); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("encoding a frame over MaxFrame: %v", err)
	}
	// Truncated bodies.
	b, _ := AppendFrame(nil, 1, &Commit{LeaseID: 1, Offset: 2, Length: 3})
	for n := 4; n < len(b); n++ {
		if _, _, _, err := ReadFrame(bytes.NewReader(b[:n]), nil); err == nil {
			t.Fatalf("truncated at %d: decoded", n)
		}
		if _, _, err := DecodeFrame(b[4:n]); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("body truncated at %d: %v", n, err)
		}
	}
}

// statsStart is the start of a StatsReply's payload: its 20 counters and
// no requests by type.
func statsStart() []any {
	counters := make([]any, 20)
	for i := range counters {
		counters[i] = 0
	}
	return []any{counters, []any{}}
}

func TestControlEncodeRejects(t *testing.T) {
	for _, m := range []Message{
		&Delete{}, &Hello{Client: strings.Repeat("x", MaxControlName+1)}, &Error{}, &LeaseReply{TTL: -1},
		&ScanReply{Entries: []ScanEntry{{}}},
		&Forget{}, &SetReplicas{}, &SetReplicas{Replicas: -1}, &SetReplicas{Replicas: MaxShardOwners + 1}, &Hello{Kind: 9}, &FenceShards{Shards: []Shard{NumShards}}, &ShardScan{Shard: NumShards},
		&MapReply{Map: make([]byte, MaxMapBytes+1)},
		&StatsReply{Copying: CopyProgress{Shards: 1, Copied: 2}}, &StatsReply{Copying: CopyProgress{Elapsed: -1}},
		&ViewReply{Members: []ViewMember{{Name: "n", State: 1, Meta: NodeMeta{}}}}, // no role: metadata that never decodes
		&ViewReply{Members: []ViewMember{{Name: "n", State: 4, Meta: viewSampleMeta(false)}}},
		&ViewReply{Members: []ViewMember{{State: 1, Meta: viewSampleMeta(false)}}},
		&ViewReply{Members: []ViewMember{{Name: "n", State: 1, Age: -1, Meta: viewSampleMeta(false)}}},
	} {
		if _, err := AppendFrame(nil, 1, m); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%#v: %v", m, err)
		}
	}
}

func fuzzSeeds(f *testing.F, prefixed bool) {
	for i, m := range controlSamples() {
		b, err := AppendFrame(nil, uint64(i), m)
		if err != nil {
			f.Fatal(err)
		}
		if !prefixed {
			b = b[4:]
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x94, ControlVersion, byte(MsgScanReply), 0x01, 0x92, 0xdd, 0x7f, 0xff, 0xff, 0xff})
}

// FuzzDecodeFrame: no input panics or allocates past its size; whatever
// decodes re-encodes and decodes to the same message.
func FuzzDecodeFrame(f *testing.F) {
	fuzzSeeds(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, terr := FrameType(b)
		if terr != nil && !errors.Is(terr, ErrBadMessage) {
			t.Fatalf("FrameType's error not wrapping ErrBadMessage: %v", terr)
		}
		id, m, err := DecodeFrame(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error not wrapping ErrBadMessage: %v", err)
			}
			return
		}
		if terr != nil || typ != m.Type() {
			t.Fatalf("FrameType says %v (%v) of a frame that decodes to a %v", typ, terr, m.Type())
		}
		enc, err := AppendFrame(nil, id, m)
		if err != nil {
			t.Fatalf("decoded %#v does not re-encode: %v", m, err)
		}
		id2, m2, err := DecodeFrame(enc[4:])
		if err != nil || id2 != id || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-encoded %#v decodes to %#v, %v", m, m2, err)
		}
		// Decoded into the last message of its type this process saw, it
		// is the same: nothing of that one is left over.
		if used := lastDecoded[m.Type()]; used != nil {
			id3, m3, err := DecodeFrameInto(b, used)
			if err != nil || id3 != id || m3 != used || !reflect.DeepEqual(m, m3) {
				t.Fatalf("decoded into a used %v: %#v, %v; fresh: %#v", m.Type(), m3, err, m)
			}
		}
		lastDecoded[m.Type()] = m2
	})
}

// lastDecoded holds, per type, a message FuzzDecodeFrame decoded, for the
// next frame of that type to be decoded into.
var lastDecoded = map[MsgType]Message{}

// TestDecodeFrameInto: a frame of into's type is decoded into it, without
// allocating, and leaves nothing of its last contents; one of another
// type is decoded into a new message.
func TestDecodeFrameInto(t *testing.T) {
	withCopies, err := AppendFrame(nil, 1, &Commit{LeaseID: 3, Offset: 64, Length: 1088, Epoch: 2,
		Copies: []ReplicaCopy{{Server: "n2", LeaseID: 4, Offset: 128, Length: 1088}}})
	if err != nil {
		t.Fatal(err)
	}
	plain := &Commit{LeaseID: 5, Offset: 0, Length: 100, Write: Write{Session: 9, Seq: 10}}
	without, err := AppendFrame(nil, 2, plain)
	if err != nil {
		t.Fatal(err)
	}
	into := &Commit{}
	if _, m, err := DecodeFrameInto(withCopies[4:], into); err != nil || m != into || len(into.Copies) != 1 {
		t.Fatalf("a Commit decoded into a Commit: %#v, %v", m, err)
	}
	if id, m, err := DecodeFrameInto(without[4:], into); err != nil || id != 2 || m != into || !reflect.DeepEqual(into, plain) {
		t.Fatalf("a Commit without copies decoded into one with: %#v, %v; want %#v", m, err, plain)
	}
	e, err := AppendFrame(nil, 3, &Error{Code: CodeNotOwner, Message: "moved"})
	if err != nil {
		t.Fatal(err)
	}
	if _, m, err := DecodeFrameInto(e[4:], into); err != nil || m == Message(into) || m.Type() != MsgError || !reflect.DeepEqual(into, plain) {
		t.Fatalf("an Error decoded with a Commit to reuse: %#v, %v; the Commit: %#v", m, err, into)
	}
}

// TestDecodeFrameIntoAllocs: a reply decoded into the last one allocates
// nothing.
func TestDecodeFrameIntoAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocations are counted without the race detector: make test-allocs")
	}
	reply, err := AppendFrame(nil, 4, &CommitReply{Arena: 1, Offset: 4096, Length: 1088, Version: 77})
	if err != nil {
		t.Fatal(err)
	}
	r := &CommitReply{}
	if allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := DecodeFrameInto(reply[4:], r); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 || r.Version != 77 {
		t.Errorf("a CommitReply decoded into one: %.1f allocations, %#v", allocs, r)
	}
}

// FuzzReadFrame: a byte stream of frames never panics and never reads a
// length it refused.
func FuzzReadFrame(f *testing.F) {
	fuzzSeeds(f, true)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		var buf []byte
		for {
			_, _, nb, err := ReadFrame(r, buf)
			buf = nb
			if len(buf) > MaxFrame {
				t.Fatalf("buffer of %d bytes", len(buf))
			}
			if err != nil {
				return
			}
		}
	})
}

// SetReplicas is answered as Forget is, and its count reads as sent.
func TestSetReplicasMessage(t *testing.T) {
	if MsgSetReplicas.Reply() != MsgMapChangeReply || MsgSetReplicas.String() != "SetReplicas" {
		t.Fatalf("%v answered by %v", MsgSetReplicas, MsgSetReplicas.Reply())
	}
	_, m, err := DecodeFrame(body(t, ControlVersion, MsgSetReplicas, 7, []any{3}))
	if sr, ok := m.(*SetReplicas); err != nil || !ok || sr.Replicas != 3 {
		t.Fatalf("SetReplicas of 3: %#v, %v", m, err)
	}
	_, err = AppendFrame(nil, 1, &SetReplicas{Replicas: 0})
	if !errors.Is(err, ErrBadMessage) || !strings.Contains(err.Error(), "set replicas to 0: must be 1 to 16") {
		t.Fatalf("encoding SetReplicas of 0: %v", err)
	}
}

// A StatsReply's copy progress reads as sent, from a body built by hand
// as the rejections above are (so they fail for what they change alone).
func TestStatsReplyCopyProgress(t *testing.T) {
	_, m, err := DecodeFrame(body(t, ControlVersion, MsgStatsReply, 1, append(statsStart(), "", 0, []any{1, 3, 2, 10, 4096, int64(time.Second)})))
	if err != nil {
		t.Fatal(err)
	}
	want := CopyProgress{Groups: 1, Shards: 3, Copied: 2, Keys: 10, Bytes: 4096, Elapsed: time.Second}
	if got := m.(*StatsReply).Copying; got != want {
		t.Fatalf("copy progress %+v, want %+v", got, want)
	}
}

// BenchmarkCommitFrame: a PUT's Commit encoded and its CommitReply
// decoded, as the client and the server do for every PUT. The codecs
// come from a pool: what is left per operation is the decoded message.
func BenchmarkCommitFrame(b *testing.B) {
	commit := &Commit{LeaseID: 3, Offset: 4096, Length: 1100, Epoch: 9, Write: Write{Session: 1<<63 + 5, Seq: 77}}
	reply, err := AppendFrame(nil, 1, &CommitReply{Arena: 1, Offset: 1 << 30, Length: 1100, Version: 1 << 40})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		if buf, err = AppendFrame(buf[:0], 1, commit); err != nil {
			b.Fatal(err)
		}
		if _, _, err := DecodeFrame(reply[4:]); err != nil {
			b.Fatal(err)
		}
	}
}
