// Commits sent on a session's write QP: the PUT in one round trip.

package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// commitRecvs is how many commit slots a session keeps posted as RECVs. A
// client sends its next commit only once it has the reply to the last, so
// one would do; the second takes a commit that arrives before this side
// has seen the last one's RECV complete and posted it again.
const commitRecvs = 2

// qpCommits takes the commits a client sends with a SEND on its session's
// write QP, right after the record's WRITE on the same QP: RC executes
// them in order, so the record is in the lease when the commit's RECV
// completes, and the PUT is one round trip instead of the WRITE's and then
// the control request's. The reply goes back as a SEND into a RECV the
// client posted before its own SEND. On a peer's session it takes a
// primary's forwards (ReplicaCommit, ReplicaDelete) the same way
// (Config.ForwardOnQP at the primary).
//
// Its buffers are registered in the session's own PD, as its leases are:
// commitRecvs slots for RECVs, then one for the reply.
type qpCommits struct {
	c   *conn
	qp  rdma.QP
	cq  rdma.CQ // the write QP's, sends and receives
	mem *rdma.Memory
	mr  rdma.MR
	fwd forwarder
	// The commit being answered and its reply: decoded and filled in
	// place, one commit at a time, so that neither allocates.
	commit proto.Commit
	reply  proto.CommitReply
	wc     [commitRecvs + 1]rdma.Completion
	// Scratch for posts (PostSend and PostRecv copy them).
	sges [1]rdma.SGE
	send [1]rdma.SendWR
	recv [1]rdma.RecvWR
	// replies counts the replies sent: one in session.SignalEvery is
	// signaled. The others complete silently: a reply's slot is free again
	// once the next commit comes, as the client sends that only after the
	// reply has arrived.
	replies uint64
	out     []byte // the reply's frame, before it is copied to its slot
	stop    context.CancelFunc
	done    chan struct{}

	// mu is held by a commitRound using the session (the slots, the
	// scratch above, the QP) and by free, which ends that use.
	mu    sync.Mutex
	freed bool
}

// newQPCommits registers the slots and posts their RECVs on qp, which
// must be connected; cq is qp's CQ for both queues. The caller starts
// serve and, when the session ends, calls close.
func newQPCommits(c *conn, qp rdma.QP, cq rdma.CQ) (_ *qpCommits, err error) {
	q := &qpCommits{c: c, qp: qp, cq: cq, done: make(chan struct{})}
	if q.mem, err = rdma.Alloc((commitRecvs + 1) * proto.CommitSlotSize); err != nil {
		return nil, fmt.Errorf("commit slots: %w", err)
	}
	// In the PD itself, not through the leasePD, whose MRs are wrapped
	// (a provider takes only its own MRs in a local SGE); serve's caller
	// frees them before it closes the PD.
	if q.mr, err = c.lpd.PD.Register(q.mem.Bytes(), rdma.AccessLocalWrite); err != nil {
		_ = q.mem.Close()
		return nil, fmt.Errorf("registering the commit slots: %w", err)
	}
	if h, ok := cq.(rdma.RecvHandling); ok {
		// The commits come to the server's batcher, with other sessions'
		// that came with them; serve sees the rest.
		h.SetRecvHandler(c.s.batcher, q)
	}
	for i := range commitRecvs {
		if err := q.postRecv(i); err != nil {
			_ = q.free()
			return nil, err
		}
	}
	return q, nil
}

func (q *qpCommits) slot(i int) []byte {
	return q.mem.Bytes()[i*proto.CommitSlotSize : (i+1)*proto.CommitSlotSize]
}

func (q *qpCommits) postRecv(i int) error {
	q.sges[0] = rdma.SGE{MR: q.mr, Offset: i * proto.CommitSlotSize, Length: proto.CommitSlotSize}
	q.recv[0] = rdma.RecvWR{ID: uint64(i), SGL: q.sges[:]}
	if err := q.qp.PostRecv(q.recv[:]); err != nil {
		return fmt.Errorf("posting a commit RECV: %w", err)
	}
	return nil
}

// serve answers commits until ctx ends or the QP fails (the client went
// away, or broke the protocol: its own QP fails too, and it dials again).
// It runs on a goroutine of its own, beside the connection's, which
// serves the control requests. On a provider that hands RECVs to the
// server's batcher, serve sees only the QP's failure and the signaled
// replies.
func (q *qpCommits) serve(ctx context.Context) {
	defer close(q.done)
	log := q.c.s.log.With("remote", q.c.nc.RemoteAddr().String(), "client", q.c.client)
	for {
		n, err := q.cq.Wait(ctx, q.wc[:])
		if err != nil {
			return
		}
		for _, w := range q.wc[:n] {
			switch {
			case w.Status != rdma.StatusSuccess:
				if ctx.Err() == nil {
					log.Debug("write QP failed: no more commits on it", "op", w.Op.String(), "status", w.Status.String())
				}
				return
			case w.Op == rdma.OpSend:
				// A signaled reply: its slot was free already.
			case !q.answerLocked(int(w.ID), int(w.ByteLen)):
				return
			}
		}
	}
}

// anyCommit stands for a SEND that is no message, in the refusal's log
// line and count.
var anyCommit = &proto.Commit{}

// answer takes the commit in slot i, n bytes long, posts the slot's RECV
// again and SENDs the reply. It reports false when the session is to end.
func (q *qpCommits) answer(i, n int) bool {
	id, m, malformed := q.decode(i, n)
	if malformed != nil {
		return q.respond(i, id, m, malformed)
	}
	s := q.c.s
	var reply proto.Message
	switch cm := m.(type) {
	case *proto.Commit:
		q.taken(m, &s.commitsOnQP)
		reply = q.c.commitWith(cm, &q.fwd, &q.reply)
	case *proto.CommitBatch:
		q.taken(m, &s.commitsOnQP)
		reply = q.c.commitBatch(cm)
	case *proto.ReplicaCommit, *proto.ReplicaDelete:
		// A primary's forward: handle refuses it from a client.
		q.taken(m, &s.fwdsOnQP)
		reply = q.c.handle(m)
	default:
		reply = &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("%v sent on the write QP, which takes Commit, CommitBatch, and from a peer ReplicaCommit and ReplicaDelete, only", m.Type())}
	}
	if q.dropped(m) {
		return false
	}
	return q.respond(i, id, m, reply)
}

// answerLocked is answer under the session's lock, which a commitRound
// holding the session takes too.
func (q *qpCommits) answerLocked(i, n int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.answer(i, n)
}

// decode decodes the SEND in slot i, n bytes long, into q.commit when it
// is a Commit: its request id and message, or the Error that answers a
// SEND that is no control frame (m is then anyCommit).
func (q *qpCommits) decode(i, n int) (id uint64, m proto.Message, malformed *proto.Error) {
	frame := q.slot(i)[:n]
	if n < 4 || int(binary.BigEndian.Uint32(frame)) != n-4 {
		return 0, anyCommit, &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("a SEND of %d bytes on the write QP that is not one control frame", n)}
	}
	id, m, err := proto.DecodeFrameInto(frame[4:], &q.commit)
	if err != nil {
		return 0, anyCommit, &proto.Error{Code: proto.CodeBadRequest, Message: err.Error()}
	}
	return id, m, nil
}

// dropped reports whether a test drops the reply to m: the connection is
// then closed, as in a crash of it.
func (q *qpCommits) dropped(m proto.Message) bool {
	if drop := q.c.s.dropReply.Load(); drop != nil && (*drop)(m) {
		_ = q.c.nc.Close()
		return true
	}
	return false
}

// respond answers m, the request of id in slot i: it posts the slot's RECV
// again and SENDs reply. It reports false when the session is to end.
func (q *qpCommits) respond(i int, id uint64, m, reply proto.Message) bool {
	s := q.c.s
	if e, ok := reply.(*proto.Error); ok {
		s.refused[e.Code].Add(1)
		s.logRefusal(m, e)
	}
	if err := q.postRecv(i); err != nil {
		_ = q.c.nc.Close()
		return false
	}
	var err error
	if q.out, err = appendReply(q.out[:0], id, reply); err != nil {
		// The client would wait for ever: end the session, as a crash
		// would, and it retries on a new one.
		s.log.Error("encoding a commit's reply: closing the connection", "err", err)
		_ = q.c.nc.Close()
		return false
	}
	copy(q.slot(commitRecvs), q.out)
	q.sges[0] = rdma.SGE{MR: q.mr, Offset: commitRecvs * proto.CommitSlotSize, Length: len(q.out)}
	q.send[0] = rdma.SendWR{Op: rdma.OpSend, SGL: q.sges[:]}
	if q.replies++; q.replies%session.SignalEvery == 0 {
		q.send[0].Flags = rdma.Signaled
	}
	if err := q.qp.PostSend(q.send[:]); err != nil {
		_ = q.c.nc.Close()
		return false
	}
	return true
}

// taken counts a request the write QP takes, as the control requests are
// counted, and in onQP.
func (q *qpCommits) taken(m proto.Message, onQP *atomic.Uint64) {
	q.c.s.handled[m.Type()].Add(1)
	onQP.Add(1)
}

// appendReply appends reply's frame to dst, cutting the messages of its
// Errors (a CommitBatchReply may hold one per commit) so that the frame
// fits a commit slot: a batch's results without their messages always do.
func appendReply(dst []byte, id uint64, reply proto.Message) ([]byte, error) {
	out, err := proto.AppendFrame(dst, id, reply)
	for keep := 256; err == nil && len(out) > proto.CommitSlotSize; keep /= 4 {
		switch r := reply.(type) {
		case *proto.Error:
			cut := *r
			cut.Message = r.Message[:min(len(r.Message), keep)]
			reply = &cut
		case *proto.CommitBatchReply:
			cut := &proto.CommitBatchReply{Results: slices.Clone(r.Results)}
			for i, res := range cut.Results {
				if res.Err != nil {
					e := *res.Err
					e.Message = e.Message[:min(len(e.Message), keep)]
					cut.Results[i].Err = &e
				}
			}
			reply = cut
		default:
			return nil, fmt.Errorf("a %v of %d bytes does not fit a commit slot", reply.Type(), len(out))
		}
		out, err = proto.AppendFrame(dst[:0], id, reply)
		if keep == 0 {
			break
		}
	}
	if err == nil && len(out) > proto.CommitSlotSize {
		err = fmt.Errorf("a %v of %d bytes does not fit a commit slot", reply.Type(), len(out))
	}
	return out, err
}

// close stops serve and waits for it; the caller then closes the QP and
// the CQ, and only then frees the slots.
func (q *qpCommits) close() {
	if q.stop == nil {
		return // the handshake failed before serve started
	}
	q.stop()
	<-q.done
}

// free deregisters and frees the slots, once the QP that used them is
// closed, and once no commitRound uses them.
func (q *qpCommits) free() error {
	q.mu.Lock()
	q.freed = true
	q.mu.Unlock()
	err := q.mr.Deregister()
	if cerr := q.mem.Close(); err == nil {
		err = cerr
	}
	return err
}
