// Hostile input against a running server: bad RDMA requests, raw control frames, bad commits.

package server

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// noLeaks checks, after every other cleanup of the test has run, that the
// test left no goroutine behind.
func noLeaks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// wantRemoteAccessError checks that wc, of a request on the session's read
// QP, failed with REM_ACCESS_ERR, that the QP moved to ERR and that a
// later request is flushed.
func wantRemoteAccessError(t *testing.T, ss *rawSession, what string, wc rdma.Completion) {
	t.Helper()
	wantRemoteAccessErrorOn(t, ss, readQP, what, wc)
}

// wantRemoteAccessErrorOn is wantRemoteAccessError for a request on the
// session's QP w.
func wantRemoteAccessErrorOn(t *testing.T, ss *rawSession, w qpOf, what string, wc rdma.Completion) {
	t.Helper()
	if wc.Status != rdma.StatusRemAccessErr {
		t.Fatalf("%s (on the %v): completed with %v, want REM_ACCESS_ERR", what, w, wc.Status)
	}
	qp, _ := ss.qpAndCQ(w)
	if st := qp.State(); st != rdma.QPStateError {
		t.Fatalf("%s: the %v in %v after a remote access error, want ERR", what, w, st)
	}
	if wc := ss.postOn(w, rdma.OpRead, 0, 8, 0, 0); wc.Status != rdma.StatusWRFlushErr {
		t.Fatalf("%s: the next request on the %v completed with %v, want WR_FLUSH_ERR", what, w, wc.Status)
	}
}

// TestHostileRDMA: requests with a wrong rkey, out of bounds, without the
// access they need, or with another connection's lease rkey fail with a
// remote access error, break only the offender's QP, and change no byte;
// the server goes on serving. The cases on a lease's bounds and access are
// posted by its own connection, on its write QP, the one QP that reaches
// the lease at all.
func TestHostileRDMA(t *testing.T) {
	noLeaks(t)
	s := startServer(t, nil)
	cl := newClient(t, s, "", nil)
	healthy(t, cl, "start")

	arenaOf := func(l *proto.LeaseReply) proto.ArenaRegion {
		for _, a := range s.Meta().Arenas {
			if a.ID == l.Arena {
				if l.Addr < a.Addr || l.Addr+l.Size > a.Addr+a.Length {
					t.Fatalf("lease [%#x, +%d) is not inside its arena %+v", l.Addr, l.Size, a)
				}
				return a
			}
		}
		t.Fatalf("lease %+v in no advertised arena", l)
		return proto.ArenaRegion{}
	}
	// The bytes around a lease's edges (within its arena), read back
	// after every case through the arena's read-only rkey.
	edges := func(l *proto.LeaseReply) []byte {
		ss := openSession(t, s, "")
		arena := arenaOf(l)
		lo, hi := max(l.Addr-8, arena.Addr), min(l.Addr+l.Size+8, arena.Addr+arena.Length)
		ss.mustPost(rdma.OpRead, 0, 16, lo, arena.RKey)
		ss.mustPost(rdma.OpRead, 16, 16, hi-16, arena.RKey)
		return bytes.Clone(ss.mem.Bytes()[:32])
	}
	owner := openSession(t, s, "")
	ownerLease := owner.lease()

	type at func(l *proto.LeaseReply, a proto.ArenaRegion) (uint64, uint32)
	for _, c := range []struct {
		name string
		op   rdma.Opcode
		n    int
		on   qpOf
		own  bool // the offender's own lease, else the owner's
		at   at
	}{
		{"READ with a wrong rkey", rdma.OpRead, 64, readQP, false,
			func(_ *proto.LeaseReply, a proto.ArenaRegion) (uint64, uint32) { return a.Addr, a.RKey ^ 0x5a5a5a5a }},
		{"READ past the arena's end", rdma.OpRead, 16, readQP, false,
			func(_ *proto.LeaseReply, a proto.ArenaRegion) (uint64, uint32) { return a.Addr + a.Length - 8, a.RKey }},
		{"READ before the arena's start", rdma.OpRead, 16, readQP, false,
			func(_ *proto.LeaseReply, a proto.ArenaRegion) (uint64, uint32) { return a.Addr - 8, a.RKey }},
		{"READ of the arena on the write QP", rdma.OpRead, 16, writeQP, false,
			func(_ *proto.LeaseReply, a proto.ArenaRegion) (uint64, uint32) { return a.Addr, a.RKey }},
		{"WRITE into its lease with a wrong rkey", rdma.OpWrite, 64, writeQP, true,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr, l.RKey ^ 0x5a5a5a5a }},
		{"WRITE past its lease's end", rdma.OpWrite, 16, writeQP, true,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr + l.Size - 8, l.RKey }},
		{"WRITE before its lease's start", rdma.OpWrite, 16, writeQP, true,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr - 8, l.RKey }},
		{"WRITE into the arena outside its lease with the lease's rkey", rdma.OpWrite, 8, writeQP, true,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr + l.Size, l.RKey }},
		{"READ of its lease through the lease's write-only rkey", rdma.OpRead, 8, writeQP, true,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr, l.RKey }},
		{"FETCH_AND_ADD on its lease", rdma.OpFetchAdd, 8, writeQP, true,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr, l.RKey }},
		{"WRITE into its lease on the read QP", rdma.OpWrite, 8, readQP, true,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr, l.RKey }},
		{"WRITE into another connection's lease on the read QP", rdma.OpWrite, 64, readQP, false,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr, l.RKey }},
		{"WRITE into another connection's lease on the write QP", rdma.OpWrite, 64, writeQP, false,
			func(l *proto.LeaseReply, _ proto.ArenaRegion) (uint64, uint32) { return l.Addr, l.RKey }},
	} {
		ss := openSession(t, s, "")
		for i := range ss.mem.Bytes()[:64] {
			ss.mem.Bytes()[i] = 0xee
		}
		l := ownerLease
		if c.own {
			l = ss.lease()
		}
		before := edges(l)
		raddr, rkey := c.at(l, arenaOf(l))
		wantRemoteAccessErrorOn(t, ss, c.on, c.name, ss.postOn(c.on, c.op, 0, c.n, raddr, rkey))
		healthy(t, cl, c.name)
		if after := edges(l); !bytes.Equal(after, before) {
			t.Fatalf("%s: the bytes at the lease's edges changed from %x to %x", c.name, before, after)
		}
	}
	// The lease's owner, whose QPs are others, still writes and commits.
	n := owner.writeRecord(ownerLease, 0, ownerLease.VersionBase, []byte("owner"), []byte("still works"), -1)
	if r, ok := owner.call(&proto.Commit{LeaseID: ownerLease.ID, Offset: 0, Length: uint64(n)}).(*proto.CommitReply); !ok {
		t.Fatalf("the owner's commit after the attacks: %#v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := cl.Get(ctx, []byte("owner")); err != nil || string(v) != "still works" {
		t.Fatalf("GET of the owner's key: %q, %v", v, err)
	}
}

// mp is v in msgpack.
func mp(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// framed prefixes body with its length.
func framed(body []byte) []byte {
	n := len(body)
	return append([]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, body...)
}

// wantRefused reads the server's answer to a bad frame: an Error with
// request id 0 and code CodeBadRequest whose message contains want; then
// the server must hang up.
func wantRefused(t *testing.T, nc net.Conn, what, want string) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	id, m, _, err := proto.ReadFrame(nc, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v", what, err)
	}
	e, ok := m.(*proto.Error)
	if !ok || id != 0 || e.Code != proto.CodeBadRequest || !strings.Contains(e.Message, want) {
		t.Fatalf("%s: answered %#v with id %d, want a bad-request Error with id 0 saying %q", what, m, id, want)
	}
	if n, err := nc.Read(make([]byte, 1)); err == nil {
		t.Fatalf("%s: the connection is still open (read %d bytes)", what, n)
	}
}

// TestHostileFrames sends malformed control frames, before the Hello and
// after it: each is answered by an Error naming the problem, and the
// connection is closed.
func TestHostileFrames(t *testing.T) {
	noLeaks(t)
	s := startServer(t, nil)
	cl := newClient(t, s, "", nil)
	hello := []any{proto.ControlVersion, uint8(proto.MsgHello), 1, []any{"c", []byte{}, 0, "", false}}
	stats := []any{proto.ControlVersion, uint8(proto.MsgStats), 2, []any{}}
	huge := []byte{0x00, 0x10, 0x00, 0x00} // MaxFrame: too large for a Hello, not for a request
	for _, c := range []struct {
		name string
		raw  func(first []any) []byte // given a well-formed first frame
		// what the Error says before the Hello and after it
		pre, post string
		halfClose bool // close the write side after sending
	}{
		{name: "an HTTP request", raw: func([]any) []byte { return []byte("GET / HTTP/1.1\r\nHost: rkv\r\n\r\n") },
			pre: "frame of 1195725856 bytes, limit 2048", post: "frame of 1195725856 bytes, limit 1048576"},
		{name: "a length over MaxFrame", raw: func([]any) []byte { return []byte{0x00, 0x10, 0x00, 0x01} },
			pre: "frame of 1048577 bytes, limit 2048", post: "frame of 1048577 bytes, limit 1048576"},
		{name: "a frame of MaxFrame bytes, body never sent", raw: func([]any) []byte { return huge },
			pre: "frame of 1048576 bytes, limit 2048", post: "unexpected EOF", halfClose: true},
		{name: "a frame cut short by a close", raw: func(f []any) []byte { b := framed(mp(t, f)); return b[:len(b)-2] },
			pre: "unexpected EOF", post: "unexpected EOF", halfClose: true},
		{name: "a body cut short inside its length", raw: func([]any) []byte { return framed([]byte{0x94, proto.ControlVersion}) },
			pre: "frame of 4 elements (limit 4, 1 bytes left)", post: "frame of 4 elements (limit 4, 1 bytes left)"},
		{name: "bytes that are not msgpack", raw: func([]any) []byte { return framed([]byte{0xc1, 0xc1, 0xc1, 0xc1}) },
			pre: "frame: msgpack", post: "frame: msgpack"},
		{name: "an unknown protocol version", raw: func(f []any) []byte { f[0] = 1; return framed(mp(t, f)) },
			pre: "control version 1; this side speaks " + strconv.Itoa(proto.ControlVersion), post: "control version 1; this side speaks " + strconv.Itoa(proto.ControlVersion)},
		{name: "an unknown message type", raw: func(f []any) []byte { f[1] = 99; return framed(mp(t, f)) },
			pre: "unknown message type 99", post: "unknown message type 99"},
		{name: "a payload with a field too many", raw: func(f []any) []byte {
			f[3] = append(f[3].([]any), 7)
			return framed(mp(t, f))
		}, pre: "Hello of 6 elements (limit 5", post: "Stats of 1 elements (limit 0"},
		{name: "trailing bytes after the message", raw: func(f []any) []byte { return framed(append(mp(t, f), 0)) },
			pre: "1 bytes after the end of Hello", post: "1 bytes after the end of Stats"},
		{name: "a negative request id", raw: func(f []any) []byte { f[2] = -1; return framed(mp(t, f)) },
			pre: "request id -1 is negative", post: "request id -1 is negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, authed := range []bool{false, true} {
				var nc net.Conn
				first, want := hello, c.pre
				if authed {
					nc = openSession(t, s, "").nc
					first, want = stats, c.post
				} else {
					nc = dial(t, s)
				}
				if _, err := nc.Write(c.raw(append([]any(nil), first...))); err != nil {
					t.Fatal(err)
				}
				if c.halfClose {
					_ = nc.(*net.TCPConn).CloseWrite()
				}
				wantRefused(t, nc, c.name, want)
			}
			healthy(t, cl, c.name)
		})
	}
	waitFor(t, 10*time.Second, "refused connections closed", func() error {
		if n := s.Stats().Connections; n > 1 { // the client's own
			return errors.New("connections still open")
		}
		return nil
	})
}

// TestHostileCommits: commits the server must refuse, each with the code
// and a message naming the problem; none advances the lease, so a good
// commit at the end still lands at offset 0.
func TestHostileCommits(t *testing.T) {
	noLeaks(t)
	const maxValue = 4096
	s := startServer(t, func(c *Config) { c.Store.MaxValueLen = maxValue })
	cl := newClient(t, s, "", nil)
	ss := openSession(t, s, "")
	l := ss.lease()
	other := openSession(t, s, "")
	otherLease := other.lease()

	key, value := []byte("k"), []byte("v")
	size := uint64(proto.RecordSize(len(key), len(value)))
	for _, c := range []struct {
		name   string
		write  func() // what the client wrote into its lease first
		commit proto.Commit
		code   proto.ErrorCode
		want   string
	}{
		{name: "a record outside the lease", commit: proto.Commit{LeaseID: l.ID, Offset: l.Size - 8, Length: size},
			code: proto.CodeLeaseInvalid, want: "outside [0, 262144)"},
		{name: "an offset beyond any arena", commit: proto.Commit{LeaseID: l.ID, Offset: 1 << 63, Length: size},
			code: proto.CodeLeaseInvalid, want: "at offset 9223372036854775808 in lease"},
		{name: "a length shorter than a record header", commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: 8},
			code: proto.CodeLeaseInvalid, want: "commit of 8 bytes at 0"},
		{name: "another connection's lease", commit: proto.Commit{LeaseID: otherLease.ID, Offset: 0, Length: size},
			code: proto.CodeLeaseInvalid, want: "was not granted on this connection"},
		{name: "a lease never granted", commit: proto.Commit{LeaseID: 1 << 40, Offset: 0, Length: size},
			code: proto.CodeLeaseInvalid, want: "lease 1099511627776 was not granted"},
		{name: "nothing written", commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: size},
			code: proto.CodeRecordInvalid, want: "magic 0"},
		{name: "a bad CRC", write: func() {
			n, _ := proto.EncodeRecord(ss.mem.Bytes(), l.VersionBase, 0, key, value)
			ss.mem.Bytes()[n-8] ^= 0xff // the value's byte
			ss.mustPostOn(writeQP, rdma.OpWrite, 0, n, l.Addr, l.RKey)
		}, commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: size}, code: proto.CodeRecordInvalid, want: "CRC"},
		{name: "a length that disagrees with the record", write: func() { ss.writeRecord(l, 0, l.VersionBase, key, value, -1) },
			commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: size + 8}, code: proto.CodeRecordInvalid, want: "commit says 48"},
		{name: "a key over the limit", write: func() { ss.writeRecord(l, 0, l.VersionBase, bytes.Repeat([]byte("k"), 1025), value, -1) },
			commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: uint64(proto.RecordSize(1025, 1))},
			code:   proto.CodeRecordInvalid, want: "key 1025 bytes (max 1024)"},
		{name: "a value over the limit", write: func() { ss.writeRecord(l, 0, l.VersionBase, key, make([]byte, maxValue+1), -1) },
			commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: uint64(proto.RecordSize(1, maxValue+1))},
			code:   proto.CodeRecordInvalid, want: "value 4097 bytes (max 4096)"},
		{name: "a version outside the lease's range", write: func() { ss.writeRecord(l, 0, l.VersionBase+l.VersionCount, key, value, -1) },
			commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: size}, code: proto.CodeRecordInvalid, want: "outside the lease's remaining range"},
		{name: "a tombstone", write: func() {
			n, _ := proto.EncodeRecord(ss.mem.Bytes(), l.VersionBase, proto.RecordTombstone, key, nil)
			ss.mustPostOn(writeQP, rdma.OpWrite, 0, n, l.Addr, l.RKey)
		}, commit: proto.Commit{LeaseID: l.ID, Offset: 0, Length: uint64(proto.RecordSize(1, 0))}, code: proto.CodeRecordInvalid, want: "deletes are committed with Delete"},
	} {
		if c.write != nil {
			c.write()
		}
		e, ok := ss.call(&c.commit).(*proto.Error)
		if !ok || e.Code != c.code || !strings.Contains(e.Message, c.want) {
			t.Fatalf("commit of %s: %#v, want a %v Error saying %q", c.name, e, c.code, c.want)
		}
		healthy(t, cl, "commit of "+c.name)
	}
	for _, c := range []struct {
		name string
		req  proto.Message
		code proto.ErrorCode
		want string
	}{
		{"a delete of a key over the limit", &proto.Delete{Key: bytes.Repeat([]byte("k"), 1025)}, proto.CodeRecordInvalid, "key of 1025 bytes (1 to 1024)"},
		{"a second Hello", &proto.Hello{Client: "again"}, proto.CodeBadRequest, "Hello is not a request this server takes"},
		{"an EndLease of another connection's lease", &proto.EndLease{ID: otherLease.ID}, proto.CodeLeaseInvalid, "was not granted on this connection"},
		{"a reply sent as a request", &proto.CommitReply{}, proto.CodeBadRequest, "CommitReply is not a request"},
	} {
		e, ok := ss.call(c.req).(*proto.Error)
		if !ok || e.Code != c.code || !strings.Contains(e.Message, c.want) {
			t.Fatalf("%s: %#v, want a %v Error saying %q", c.name, e, c.code, c.want)
		}
	}
	// Requests between servers are refused on a client session, and served
	// on a peer's.
	for mt, m := range peerRequests {
		want := mt.String() + " is a request between servers"
		if e, ok := ss.call(m).(*proto.Error); !ok || e.Code != proto.CodeBadRequest || e.Message != want {
			t.Fatalf("%v on a client session: %#v, want a %v Error saying %q", mt, e, proto.CodeBadRequest, want)
		}
	}
	pc := dial(t, s)
	if r, ok := call(t, pc, 1, &proto.Hello{Client: t.Name(), Kind: proto.SessionPeer, NoQP: true}).(*proto.HelloReply); !ok {
		t.Fatalf("peer hello: %#v", r)
	}
	if r, ok := call(t, pc, 2, &proto.ShardScan{Shard: 0, Limit: 1}).(*proto.ShardScanReply); !ok {
		t.Fatalf("ShardScan on a peer session: %#v, want a ShardScanReply", r)
	}
	// Nothing refused was kept: the first good record still commits at 0,
	// and a replay of it is refused.
	n := ss.writeRecord(l, 0, l.VersionBase, key, value, -1)
	good := &proto.Commit{LeaseID: l.ID, Offset: 0, Length: uint64(n)}
	if r, ok := ss.call(good).(*proto.CommitReply); !ok || r.Version != l.VersionBase {
		t.Fatalf("good commit: %#v", r)
	}
	if e, ok := ss.call(good).(*proto.Error); !ok || e.Code != proto.CodeLeaseInvalid {
		t.Fatalf("replayed commit: %#v", e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := cl.Get(ctx, key); err != nil || !bytes.Equal(v, value) {
		t.Fatalf("GET %q after the refused commits: %q, %v", key, v, err)
	}
	// The server refuses foreign leases and absurd offsets itself (3 of
	// the cases); the store refused the other 9 and the replay.
	if st := s.Store().Stats(); st.CommitsRejected != 10 {
		t.Errorf("store counted %d rejected commits, want 10", st.CommitsRejected)
	}
}

// TestDisconnectMidCommit: clients that write into a lease, send the
// commit and hang up at once. A whole record is committed entirely or not
// at all, a torn one never; both leases are revoked: their connections'
// PDs are closed, which the device refuses while an MR is registered in
// one. (From any other QP their rkeys never worked.)
func TestDisconnectMidCommit(t *testing.T) {
	noLeaks(t)
	s := startServer(t, nil)
	cl := newClient(t, s, "", nil)
	healthy(t, cl, "start")
	conns, pds := s.Stats().Connections, s.leasePDs.Load()

	value := bytes.Repeat([]byte("0123456789abcdef"), 64)
	var leases []*proto.LeaseReply
	for _, c := range []struct {
		key  string
		part int // bytes of the record written; -1 all
	}{{"whole", -1}, {"torn", 200}} {
		ss := openSession(t, s, "")
		l := ss.lease()
		leases = append(leases, l)
		n := ss.writeRecord(l, 0, l.VersionBase, []byte(c.key), value, c.part)
		if err := proto.WriteFrame(ss.nc, ss.id+1, &proto.Commit{LeaseID: l.ID, Offset: 0, Length: uint64(n)}); err != nil {
			t.Fatal(err)
		}
		ss.close()
	}
	// The server ends a connection's leases before it counts it closed.
	waitFor(t, 10*time.Second, "the hung-up connections closed", func() error {
		if n := s.Stats().Connections; n != conns {
			return errors.New("still open")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if v, err := cl.Get(ctx, []byte("whole")); err != nil && !errors.Is(err, client.ErrNotFound) || err == nil && !bytes.Equal(v, value) {
		t.Fatalf("GET of the whole record committed by a client that hung up: %d bytes, %v", len(v), err)
	}
	if v, err := cl.Get(ctx, []byte("torn")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("GET of a torn record: %d bytes, %v; want not found", len(v), err)
	}
	if kvs, err := cl.Scan(ctx, []byte("torn"), []byte("torn\x00")); err != nil || len(kvs) != 0 {
		t.Fatalf("scan of the torn key: %v, %v", kvs, err)
	}
	// A connection's PD is closed before the connection is counted closed.
	if n := s.leasePDs.Load(); n != pds {
		t.Fatalf("%d connection PDs open after the hung-up clients' connections closed, want %d", n, pds)
	}
	for i, l := range leases {
		ss := openSession(t, s, "")
		wantRemoteAccessErrorOn(t, ss, writeQP, "WRITE with the rkey of a hung-up client's lease", ss.postOn(writeQP, rdma.OpWrite, 0, 64, l.Addr, l.RKey))
		healthy(t, cl, "revoked lease "+string(rune('a'+i)))
	}
}

// TestExpiredLeaseIsRevoked: a lease left to expire loses its write rkey,
// and a commit on it is refused; the client library moves on to a new
// lease.
func TestExpiredLeaseIsRevoked(t *testing.T) {
	noLeaks(t)
	const ttl = 400 * time.Millisecond
	s := startServer(t, func(c *Config) { c.Store.LeaseTTL = ttl })
	cl := newClient(t, s, "", nil)
	ss := openSession(t, s, "")
	l := ss.lease()
	if l.TTL <= 0 || l.TTL > ttl {
		t.Fatalf("lease TTL %v, want (0, %v]", l.TTL, ttl)
	}
	n := ss.writeRecord(l, 0, l.VersionBase, []byte("late"), []byte("too late"), -1)
	expired := s.Store().Stats().LeasesExpired
	// The expiry counter moves after the region is deregistered.
	waitFor(t, 10*time.Second, "lease expiry", func() error {
		if s.Store().Stats().LeasesExpired == expired {
			return errors.New("no lease expired yet")
		}
		return nil
	})
	if e, ok := ss.call(&proto.Commit{LeaseID: l.ID, Offset: 0, Length: uint64(n)}).(*proto.Error); !ok ||
		e.Code != proto.CodeLeaseInvalid || !strings.Contains(e.Message, "not active") {
		t.Fatalf("commit on an expired lease: %#v", e)
	}
	wantRemoteAccessErrorOn(t, ss, writeQP, "WRITE with an expired lease's rkey", ss.postOn(writeQP, rdma.OpWrite, 0, 64, l.Addr, l.RKey))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cl.Get(ctx, []byte("late")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("GET of a record written under an expired lease: %v", err)
	}
	// The client's own leases expire too: it keeps writing across them.
	for i := range 3 {
		healthy(t, cl, "expiry "+string(rune('a'+i)))
		time.Sleep(ttl / 2)
	}
}
