// Requests sent as SENDs on a session's write QP, answered there: a round trip without the control connection.

package session

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// qpSlots is a session's registered buffer for requests on its write QP:
// the request's frame, then the RECV its reply lands in, each
// proto.CommitSlotSize long.
type qpSlots struct {
	mem   *rdma.Memory
	mr    rdma.MR
	seq   uint64
	frame []byte
	sges  [2]rdma.SGE
	wc    [2]rdma.Completion
}

func newQPSlots(pd rdma.PD) (*qpSlots, error) {
	mem, err := rdma.Alloc(2 * proto.CommitSlotSize)
	if err != nil {
		return nil, fmt.Errorf("write QP slots: %w", err)
	}
	mr, err := pd.Register(mem.Bytes(), rdma.AccessLocalWrite)
	if err != nil {
		_ = mem.Close()
		return nil, fmt.Errorf("registering the write QP slots: %w", err)
	}
	return &qpSlots{mem: mem, mr: mr}, nil
}

// free deregisters and frees the slots, once the QP that used them is
// closed.
func (s *qpSlots) free() error {
	return errors.Join(s.mr.Deregister(), s.mem.Close())
}

// Work request IDs of a call on the write QP.
const (
	qpSendID = iota + 1
	qpRecvID
)

// SignalEvery is how often a request-reply exchange on a write QP (a
// commit, a forward, and the server's reply to either) signals its SEND.
// The others complete silently: the reply proves the SEND arrived, so its
// buffer is free, and nothing else waits for it. A signaled request's
// completion frees the send queue's slots of the unsignaled ones before
// it (verbs), and soft holds the ACKs of unsignaled requests back until
// other answers carry them, so an exchange costs neither side a write and
// a read of its own for them.
const SignalEvery = 16

// qpLiveCheck is how long CallOnQP waits for a reply before it looks at
// the control connection for a server that went away: a verbs RECV waits
// for ever for a reply that never comes, where the connection sees the
// server's process exit at once.
const qpLiveCheck = 100 * time.Millisecond

// ErrNoQPCall: the request cannot go on the write QP (the session has no
// slots, the server offers none, or the frame does not fit them); nothing
// was sent, and the caller sends it with Call instead.
var ErrNoQPCall = errors.New("session: not sendable on the write QP")

// CallOnQP sends req as a SEND on the session's write QP, into one of the
// RECVs the server keeps posted there (HelloReply.CommitSlot), and waits
// for the reply, which the server SENDs into a RECV posted here first
// (and, one call in SignalEvery, for the SEND's completion). It
// returns what Call would, or ErrNoQPCall (nothing sent: use Call). A
// failure of the QP, or the server closing the connection while the
// reply is awaited, breaks the session (ErrBroken). The server takes
// only some requests there (Commit, CommitBatch, and from a peer
// ReplicaCommit and ReplicaDelete). Not concurrently with Call: the
// session carries one request at a time. The reply is the caller's.
func (c *Conn) CallOnQP(ctx context.Context, req proto.Message) (proto.Message, error) {
	s := c.slots
	if c.broken {
		return nil, fmt.Errorf("%w: %s", ErrBroken, c.addr)
	}
	if s == nil || c.Hello.CommitSlot == 0 {
		return nil, ErrNoQPCall
	}
	s.seq++
	var err error
	if s.frame, err = proto.AppendFrame(s.frame[:0], s.seq, req); err != nil {
		return nil, err
	}
	if len(s.frame) > int(min(c.Hello.CommitSlot, proto.CommitSlotSize)) {
		return nil, ErrNoQPCall
	}
	fail := func(what string, err error) (proto.Message, error) {
		c.broken = true
		return nil, fmt.Errorf("%w: %v to %s on the write QP: %s: %w", ErrBroken, req.Type(), c.addr, what, err)
	}
	copy(s.mem.Bytes(), s.frame)
	s.sges = [2]rdma.SGE{
		{MR: s.mr, Offset: 0, Length: len(s.frame)},
		{MR: s.mr, Offset: proto.CommitSlotSize, Length: proto.CommitSlotSize},
	}
	if err := c.WriteQP.PostRecv([]rdma.RecvWR{{ID: qpRecvID, SGL: s.sges[1:]}}); err != nil {
		return fail("posting the reply's RECV", err)
	}
	send := rdma.SendWR{ID: qpSendID, Op: rdma.OpSend, SGL: s.sges[:1]}
	sent := s.seq%SignalEvery != 0 // else its completion is waited for too
	if !sent {
		send.Flags = rdma.Signaled
	}
	if err := c.WriteQP.PostSend([]rdma.SendWR{send}); err != nil {
		return fail("posting", err)
	}
	var replied bool
	var n uint32
	for !sent || !replied {
		wait, cancel := context.WithTimeout(ctx, qpLiveCheck)
		got, err := c.WriteCQ.Wait(wait, s.wc[:])
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return fail("waiting", ctx.Err())
		case errors.Is(err, context.DeadlineExceeded):
			if c.PeerGone() {
				return fail("waiting for the reply", errors.New("the server closed the connection"))
			}
			continue
		case err != nil:
			return fail("waiting", err)
		}
		for _, w := range s.wc[:got] {
			if err := w.Err(); err != nil {
				return fail("the QP failed", err)
			}
			switch w.ID {
			case qpSendID:
				sent = true
			case qpRecvID:
				replied, n = true, w.ByteLen
			}
		}
	}
	reply, err := QPReply(s.mem.Bytes()[proto.CommitSlotSize:proto.CommitSlotSize+int(n)], s.seq, req.Type(), nil)
	if err != nil {
		return fail("reading the reply", err)
	}
	if e, ok := reply.(*proto.Error); ok {
		return nil, e
	}
	return reply, nil
}

// QPReply decodes the reply a server SENT into a RECV for the request of
// type req sent on the write QP with ID seq: frame is the bytes received
// (one length-prefixed control frame), into is as for
// proto.DecodeFrameInto (nil: a new message). It returns the reply, of
// type req.Reply() or the server's *proto.Error, or an error saying what
// is wrong with the frame: the QP is then out of step, and its session
// done.
func QPReply(frame []byte, seq uint64, req proto.MsgType, into proto.Message) (proto.Message, error) {
	n := len(frame)
	if n < 4 || int(binary.BigEndian.Uint32(frame)) != n-4 {
		return nil, fmt.Errorf("a reply of %d bytes that is not one frame", n)
	}
	id, reply, err := proto.DecodeFrameInto(frame[4:], into)
	switch {
	case err != nil:
		return nil, fmt.Errorf("decoding: %w", err)
	case id != seq:
		return nil, fmt.Errorf("a reply to request %d, want %d", id, seq)
	}
	if _, isErr := reply.(*proto.Error); !isErr && reply.Type() != req.Reply() {
		return nil, fmt.Errorf("a %v answered with %v", req, reply.Type())
	}
	return reply, nil
}
