package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

// Where sendOnWriteQP keeps the SEND's bytes and the reply's in the raw
// session's buffer (records are written from its start).
const (
	rawSendOff = 32 << 10
	rawRecvOff = 48 << 10
)

// sendOnWriteQP SENDs b on the session's write QP, a RECV posted for the
// reply first, and returns the reply's frame body (nil if the SEND
// failed) and the SEND's completion.
func (ss *rawSession) sendOnWriteQP(b []byte) ([]byte, rdma.Completion) {
	ss.t.Helper()
	copy(ss.mem.Bytes()[rawSendOff:], b)
	recv := rdma.RecvWR{ID: 2, SGL: []rdma.SGE{{MR: ss.mr, Offset: rawRecvOff, Length: proto.CommitSlotSize}}}
	if err := ss.wqp.PostRecv([]rdma.RecvWR{recv}); err != nil {
		ss.t.Fatal(err)
	}
	send := rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: ss.mr, Offset: rawSendOff, Length: len(b)}}}
	if err := ss.wqp.PostSend([]rdma.SendWR{send}); err != nil {
		ss.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var sent, reply rdma.Completion
	for sent.ID == 0 || reply.ID == 0 && sent.Status == rdma.StatusSuccess {
		var wc [2]rdma.Completion
		n, err := ss.wcq.Wait(ctx, wc[:])
		if err != nil {
			ss.t.Fatalf("waiting for the SEND of %d bytes and its reply: %v", len(b), err)
		}
		for _, w := range wc[:n] {
			if w.ID == 1 {
				sent = w
			} else {
				reply = w
			}
		}
	}
	if sent.Status != rdma.StatusSuccess {
		return nil, sent
	}
	if reply.Status != rdma.StatusSuccess {
		ss.t.Fatalf("the reply's RECV: %v", reply.Status)
	}
	frame := ss.mem.Bytes()[rawRecvOff : rawRecvOff+int(reply.ByteLen)]
	if len(frame) < 4 || int(binary.BigEndian.Uint32(frame)) != len(frame)-4 {
		ss.t.Fatalf("a reply of %d bytes that is not one frame", len(frame))
	}
	return frame[4:], sent
}

// commitOnWriteQP sends m as a frame on the write QP and returns the
// decoded reply.
func (ss *rawSession) commitOnWriteQP(id uint64, m proto.Message) proto.Message {
	ss.t.Helper()
	b, err := proto.AppendFrame(nil, id, m)
	if err != nil {
		ss.t.Fatal(err)
	}
	body, wc := ss.sendOnWriteQP(b)
	if body == nil {
		ss.t.Fatalf("the SEND of %v: %v", m.Type(), wc.Status)
	}
	rid, reply, err := proto.DecodeFrame(body)
	if err != nil {
		ss.t.Fatalf("decoding the reply to %v: %v", m.Type(), err)
	}
	if rid != id {
		ss.t.Fatalf("reply to request %d, want %d", rid, id)
	}
	return reply
}

// A commit sent with a SEND on the write QP after its record's WRITE is
// applied and answered there; what is not one Commit frame is answered
// with a BadRequest and the QP goes on taking commits; a SEND larger than
// the slots fails that QP alone, and the session's control requests go on.
func TestCommitOnTheWriteQP(t *testing.T) {
	s := startServer(t, nil)
	nc := dial(t, s)
	hello, ok := call(t, nc, 1, &proto.Hello{Client: t.Name()}).(*proto.HelloReply)
	if !ok || hello.CommitSlot != proto.CommitSlotSize {
		t.Fatalf("HelloReply %+v: want CommitSlot %d", hello, proto.CommitSlotSize)
	}
	ss := newRDMASession(t, nc)
	ss.id = 1
	l := ss.lease()
	key, off := []byte("on-the-qp"), uint64(0)
	commit := func(id uint64, value string) proto.Message {
		n := ss.writeRecord(l, off, l.VersionBase+id, key, []byte(value), -1)
		r := ss.commitOnWriteQP(id, &proto.Commit{LeaseID: l.ID, Offset: off, Length: uint64(n), Epoch: s.Map().Epoch()})
		off += uint64(n)
		return r
	}
	viaControl := s.handled[proto.MsgCommit].Load()
	if r, ok := commit(1, "first").(*proto.CommitReply); !ok || r.Length == 0 {
		t.Fatalf("commit on the write QP answered %#v", r)
	}
	if got := s.handled[proto.MsgCommit].Load() - viaControl; got != 1 {
		t.Fatalf("%d commits counted, want 1", got)
	}
	readBack(t, s, key, "first")

	badRequest := func(what string, b []byte, want string) {
		t.Helper()
		body, wc := ss.sendOnWriteQP(b)
		if body == nil {
			t.Fatalf("%s: the SEND failed: %v", what, wc.Status)
		}
		_, reply, err := proto.DecodeFrame(body)
		e, ok := reply.(*proto.Error)
		if err != nil || !ok || e.Code != proto.CodeBadRequest || !strings.Contains(e.Message, want) {
			t.Fatalf("%s: answered %#v (%v), want a BadRequest saying %q", what, reply, err, want)
		}
	}
	badRequest("three bytes", []byte{0, 0, 1}, "not one control frame")
	frame, _ := proto.AppendFrame(nil, 7, &proto.Commit{LeaseID: l.ID})
	binary.BigEndian.PutUint32(frame, uint32(len(frame)))
	badRequest("a length prefix one too long", frame, "not one control frame")
	frame, _ = proto.AppendFrame(nil, 8, &proto.GrantLease{})
	badRequest("a GrantLease", frame, "takes Commit, CommitBatch, and from a peer")
	badRequest("garbage", []byte{0, 0, 0, 3, 0xc1, 0xc1, 0xc1}, "bad control message")
	if e, ok := ss.commitOnWriteQP(9, &proto.Commit{LeaseID: l.ID + 1000, Length: 10}).(*proto.Error); !ok || e.Code != proto.CodeLeaseInvalid {
		t.Fatalf("a commit in a lease of no one's: %#v", e)
	}
	if r, ok := commit(10, "second").(*proto.CommitReply); !ok || r.Length == 0 {
		t.Fatalf("a commit after the refusals answered %#v", r)
	}
	readBack(t, s, key, "second")

	// Too large for the slot: that QP fails (as verbs' does, LOC_LEN_ERR
	// at the server's RECV), the connection's control requests go on.
	if body, wc := ss.sendOnWriteQP(make([]byte, proto.CommitSlotSize+1)); body != nil || wc.Status == rdma.StatusSuccess {
		t.Fatalf("a SEND of %d bytes into %d-byte slots: %v", proto.CommitSlotSize+1, proto.CommitSlotSize, wc.Status)
	}
	if _, ok := ss.call(&proto.Stats{}).(*proto.StatsReply); !ok {
		t.Fatal("the session's control requests stopped with its write QP")
	}
}

// readBack checks that a client reads key's value as want.
func readBack(t *testing.T, s *Server, key []byte, want string) {
	t.Helper()
	cl := newClient(t, s, "", nil)
	v, err := cl.Get(context.Background(), key)
	if err != nil || string(v) != want {
		t.Fatalf("Get %q: %q, %v; want %q", key, v, err, want)
	}
}

// At one replica, a commit that does not fit the slot offered is not sent
// on the write QP at all: the WRITE is waited for, then the commit goes as
// a control request; a MultiPut's CommitBatch likewise.
func TestCommitTooLargeForTheSlotOfOneReplica(t *testing.T) {
	s := startServer(t, nil)
	OfferCommitSlot(s, 16)
	cl := newClient(t, s, "", nil)
	before := s.Stats()
	for i := range 20 {
		if err := cl.Put(context.Background(), fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	readBack(t, s, []byte("k19"), "v")
	kvs := make([]client.KV, 100)
	for i := range kvs {
		kvs[i] = client.KV{Key: fmt.Appendf(nil, "batched-%d", i), Value: fmt.Appendf(nil, "v%d", i)}
	}
	if err := cl.MultiPut(context.Background(), kvs); err != nil {
		t.Fatal(err)
	}
	readBack(t, s, []byte("batched-99"), "v99")
	st := s.Stats()
	commits, batches := st.Handled[proto.MsgCommit]-before.Handled[proto.MsgCommit], st.Handled[proto.MsgCommitBatch]-before.Handled[proto.MsgCommitBatch]
	if st.CommitsOnQP != before.CommitsOnQP || commits != 20 || batches == 0 {
		t.Fatalf("20 puts and a MultiPut of 100: %d commits, %d batches, %d on the write QP; want 20, some and 0",
			commits, batches, st.CommitsOnQP-before.CommitsOnQP)
	}
}

// A reply too large for a commit slot has its Errors' messages cut to
// fit, a CommitBatchReply's as an Error's; anything else too large is an
// error (the connection is then closed rather than left unanswered).
func TestAppendReplyFitsTheSlot(t *testing.T) {
	long := strings.Repeat("x", proto.MaxControlMessage)
	batch := &proto.CommitBatchReply{Results: make([]proto.CommitResult, proto.MaxBatchCommits)}
	for i := range batch.Results {
		if i%2 == 0 {
			batch.Results[i].Err = &proto.Error{Code: proto.CodeUnavailable, Message: long}
		} else {
			batch.Results[i].Reply = proto.CommitReply{Arena: 1, Offset: 1 << 40, Length: 1 << 20, Version: 1 << 60}
		}
	}
	for _, reply := range []proto.Message{&proto.Error{Code: proto.CodeBadRequest, Message: long}, batch} {
		out, err := appendReply(nil, 7, reply)
		if err != nil || len(out) > proto.CommitSlotSize {
			t.Fatalf("%v: %d bytes, %v", reply.Type(), len(out), err)
		}
		_, m, err := proto.DecodeFrame(out[4:])
		if err != nil || m.Type() != reply.Type() {
			t.Fatalf("%v cut: decodes to %v, %v", reply.Type(), m, err)
		}
		if b, ok := m.(*proto.CommitBatchReply); ok && (b.Results[0].Err == nil || b.Results[1].Reply.Version != 1<<60) {
			t.Fatalf("the cut batch lost its results: %+v", b.Results[:2])
		}
	}
	if _, err := appendReply(nil, 7, &proto.MapReply{Map: make([]byte, proto.CommitSlotSize)}); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("a MapReply larger than the slot: %v", err)
	}
}

// The commits that goroutines sharing a client send together reach the
// server in the same reads of its link, and are committed in fewer
// batches than there are commits: on the link's goroutine when nothing
// waits for a sync, on a goroutine of the batch's own when a sync does.
// Every write is applied, and read back.
func TestCommitsThatCameTogetherAreCommittedTogether(t *testing.T) {
	for _, sync := range []store.SyncPolicy{store.SyncNone, store.SyncAlways} {
		t.Run(sync.String(), func(t *testing.T) {
			s := startServer(t, func(c *Config) { c.Store.Sync = sync })
			cl := newClient(t, s, "", nil)
			before := s.Stats()
			const goroutines, puts = 16, 50
			errs := make(chan error, goroutines)
			for w := range goroutines {
				go func() {
					for i := range puts {
						if err := cl.Put(context.Background(), fmt.Appendf(nil, "w%d-k%d", w, i), fmt.Appendf(nil, "v%d", i)); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range goroutines {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			st := s.Stats()
			commits, batches := st.CommitsOnQP-before.CommitsOnQP, st.QPCommitBatches-before.QPCommitBatches
			if commits != goroutines*puts || batches == 0 || batches >= commits {
				t.Fatalf("%d puts: %d commits on the write QP in %d batches; want all of them, in fewer batches", goroutines*puts, commits, batches)
			}
			t.Logf("%d commits in %d batches", commits, batches)
			reader := newClient(t, s, "", nil)
			for w := range goroutines {
				key := fmt.Appendf(nil, "w%d-k%d", w, puts-1)
				if v, err := reader.Get(context.Background(), key); err != nil || string(v) != fmt.Sprintf("v%d", puts-1) {
					t.Fatalf("Get %q from another client: %q, %v", key, v, err)
				}
			}
		})
	}
}
