// Commits sent on the write QP: a PUT in one round trip.

package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// commitSlots is the room at the end of a connection's registered buffer
// for a commit sent on the write QP: the commit's frame, then the RECV
// its reply lands in.
const commitSlots = 2

// Work request IDs on the write QP while a commit is in flight.
const (
	commitSendID = iota + 1
	commitRecvID
)

// liveCheckEvery is how long a commit's reply is waited for before the
// control connection is checked for a server that went away: a verbs
// RECV waits for ever for a reply that never comes, where the connection
// sees the server's process exit at once.
const liveCheckEvery = 100 * time.Millisecond

// liveBound bounds each wait for a commit's reply to about liveCheckEvery,
// so that the waiter looks at the control connection between them. Under a
// shared deadline, which no caller cancels, the bound is a shared tick too
// (the deadline is then noticed up to a tick late); under a caller's own
// ctx it is one derived from that ctx (sharedDeadlines.getFor: shared with
// the commits under the same ctx that start close together), kept for all
// the waits of a commit (usually one, for the reply; two when the SEND is
// signaled) until it expires. A context with a timer per wait cost a PUT
// 8-11% of the client's CPU at 16 goroutines.
type liveBound struct {
	c      *Client
	ctx    context.Context // the caller's
	own    context.Context // under a caller's own ctx: the current bound
	cancel context.CancelFunc
}

// next returns the context of the next wait.
func (b *liveBound) next() context.Context {
	if isShared(b.ctx) {
		return b.c.liveChecks.get(time.Now())
	}
	if b.own == nil || b.own.Err() != nil {
		b.stop()
		b.own, b.cancel = b.c.liveChecks.getFor(b.ctx, time.Now())
	}
	return b.own
}

// stop releases the current bound's timer.
func (b *liveBound) stop() {
	if b.cancel != nil {
		b.cancel()
	}
}

// buf is the part of the registered buffer that records are encoded and
// read into; the commit slots follow it.
func (sc *serverConn) buf() []byte {
	b := sc.mem.Bytes()
	return b[:len(b)-commitSlots*proto.CommitSlotSize]
}

// commitOnQP sends req, a Commit or a CommitBatch, on the write QP, as
// the server offered in its HelloReply: it posts a RECV for the reply,
// then the records' WRITE (when write is not nil; else the caller posted
// it already, on the same QP) and req's frame as a SEND, which RC
// delivers after the WRITE, and waits for the reply (and, one commit in
// session.SignalEvery, the SEND's completion). ok is false when the frame
// does not fit the server's slot: nothing was posted, and the caller sends
// req as a control request instead. A CommitReply is the connection's, good until its next commit.
func (sc *serverConn) commitOnQP(ctx context.Context, req proto.Message, write *rdma.SendWR) (_ proto.Message, ok bool, _ error) {
	slot := int(sc.s.Hello.CommitSlot)
	sendOff := len(sc.buf())
	recvOff := sendOff + proto.CommitSlotSize
	sc.qpSeq++
	var err error
	if sc.frame, err = proto.AppendFrame(sc.frame[:0], sc.qpSeq, req); err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(sc.frame) > min(slot, proto.CommitSlotSize) {
		return nil, false, nil
	}
	copy(sc.mem.Bytes()[sendOff:], sc.frame)
	fail := func(what string, err error) (proto.Message, bool, error) {
		sc.drop()
		return nil, true, retryLost(sc.name, "a commit on the write QP to %s: %s: %w", sc.name, what, err)
	}
	// Their own SGEs: write's may be sc.sges.
	sc.commitSGEs = [2]rdma.SGE{
		{MR: sc.mr, Offset: recvOff, Length: proto.CommitSlotSize},
		{MR: sc.mr, Offset: sendOff, Length: len(sc.frame)},
	}
	sc.recv[0] = rdma.RecvWR{ID: commitRecvID, SGL: sc.commitSGEs[:1]}
	if err := sc.s.WriteQP.PostRecv(sc.recv[:]); err != nil {
		return fail("posting the reply's RECV", err)
	}
	sc.wrs = sc.wrs[:0]
	if write != nil {
		sc.wrs = append(sc.wrs, *write)
	}
	// The reply says the server has the WRITE and the SEND, so their
	// buffers are free when it comes: only one commit in
	// session.SignalEvery waits for its SEND's completion too.
	send := rdma.SendWR{ID: commitSendID, Op: rdma.OpSend, SGL: sc.commitSGEs[1:]}
	sent := sc.qpSeq%session.SignalEvery != 0
	if !sent {
		send.Flags = rdma.Signaled
	}
	sc.wrs = append(sc.wrs, send)
	if err := sc.s.WriteQP.PostSend(sc.wrs); err != nil {
		return fail("posting", err)
	}
	var replied bool
	var n uint32
	bound := liveBound{c: sc.c, ctx: ctx}
	defer bound.stop()
	for !sent || !replied {
		got, err := sc.s.WriteCQ.Wait(bound.next(), sc.wc[:])
		switch {
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			if sc.s.PeerGone() {
				return fail("waiting for the reply", errors.New("the server closed the connection"))
			}
			continue
		case err != nil && ctx.Err() != nil:
			return fail("waiting", ctx.Err())
		case err != nil:
			return fail("waiting", err)
		}
		for _, w := range sc.wc[:got] {
			if err := w.Err(); err != nil {
				return fail("connection lost", err)
			}
			switch w.ID {
			case commitSendID:
				sent = true
			case commitRecvID:
				replied, n = true, w.ByteLen
			}
		}
	}
	reply, err := session.QPReply(sc.mem.Bytes()[recvOff:recvOff+int(n)], sc.qpSeq, req.Type(), &sc.reply)
	if err != nil {
		return fail("reading the reply", err)
	}
	if pe, isErr := reply.(*proto.Error); isErr {
		return nil, true, serverError(sc.name, req.Type(), pe)
	}
	return reply, true, nil
}
