// The responder: executes a QP's READ, WRITE and atomic requests against the device's MR table.

package soft

import (
	"sync/atomic"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
)

// responder is a QP's responder state. But for attached (under q.mu) and
// nakd, its link's responder goroutine owns it.
type responder struct {
	w        writeCount  // link writes that carried this QP's answers
	attached bool        // the QP served a requester once; it never serves another
	nakd     atomic.Bool // a NAK moved the QP to ERR: its requester knows
	peer     uint32      // the requester QP, which every answer names
	expect   uint32      // sequence number of the next request
	rnrHold  bool        // an RNR NAK was sent for expect: later requests are dropped
	// flipped: this responder moved the QP to ERR before completing a
	// RECV with an error (failRecv); serveRequest finishes the move.
	flipped bool
	gen     uint64 // the link batch generation whose write counters list w
}

// execute carries out one request. A non-success status is answered with a
// NAK; why explains it for the log. An error means the link failed.
func (q *qp) execute(l *inLink, req *request) (st rdma.Status, why string, err error) {
	switch req.op {
	case wireRead:
		return q.doRead(l, req)
	case wireWrite, wireWriteImm:
		return q.doWrite(l, req)
	case wireSend, wireSendImm:
		return q.doSend(l, req)
	default:
		return q.doAtomic(l, req)
	}
}

// target resolves the remote memory a request names, checking rkey, PD,
// access and bounds, or says why not.
func (q *qp) target(req *request, need rdma.Access) (*mr, int, string) {
	m := q.dev.mrs.lookup(req.rkey)
	switch {
	case m == nil:
		return nil, 0, "unknown rkey"
	case m.pd != q.pd:
		return nil, 0, "rkey of an MR in another PD"
	case m.access&need == 0:
		return nil, 0, "MR lacks the access flag"
	}
	off, ok := m.span(req.addr, req.length)
	if !ok {
		return nil, 0, "range outside the MR"
	}
	return m, off, ""
}

func (q *qp) doRead(l *inLink, req *request) (rdma.Status, string, error) {
	// A zero-length READ or WRITE needs no valid rkey (IBA C9-88).
	var m *mr
	var off int
	if req.length > 0 {
		var why string
		if m, off, why = q.target(req, rdma.AccessRemoteRead); m == nil {
			return rdma.StatusRemAccessErr, why, nil
		}
		if !m.tryLock() {
			return rdma.StatusRemAccessErr, "MR deregistered", nil
		}
		defer m.unlock()
	}
	r := response{kind: respReadData, dst: q.rsp.peer, seq: req.seq, length: req.length}
	if err := l.respondHeader(q, &r); err != nil || m == nil {
		return rdma.StatusSuccess, "", err
	}
	data := m.buf[off : off+int(req.length)]
	if len(data) <= copyMax {
		l.out = append(l.out, data...)
		return rdma.StatusSuccess, "", nil
	}
	return rdma.StatusSuccess, "", l.writeLarge(data)
}

func (q *qp) doWrite(l *inLink, req *request) (rdma.Status, string, error) {
	var m *mr
	var off int
	if req.length > 0 {
		var why string
		if m, off, why = q.target(req, rdma.AccessRemoteWrite); m == nil {
			return rdma.StatusRemAccessErr, why, nil
		}
	}
	if req.op == wireWriteImm {
		recv := q.takeRecv()
		if recv == nil {
			return rdma.StatusRNRRetryExcErr, "no RECV posted", nil
		}
		if m != nil {
			if st, why, err := q.writeTo(l, m, off, req); st != rdma.StatusSuccess || err != nil {
				q.releaseRecv(recv, nil)
				return st, why, err
			}
		}
		q.completeRecv(l, recv, rdma.Completion{Op: rdma.OpRecvImm, ByteLen: req.length, Imm: req.imm, HasImm: true})
	} else if m != nil {
		if st, why, err := q.writeTo(l, m, off, req); st != rdma.StatusSuccess || err != nil {
			return st, why, err
		}
	}
	if q.ackWaits(req) {
		return rdma.StatusSuccess, "", l.holdAck(q, req.seq)
	}
	return rdma.StatusSuccess, "", l.respond(q, respAck, 0, req.seq, 0)
}

// writeTo reads a WRITE's payload into m at off.
func (q *qp) writeTo(l *inLink, m *mr, off int, req *request) (rdma.Status, string, error) {
	if !m.tryLock() {
		return rdma.StatusRemAccessErr, "MR deregistered", nil
	}
	err := l.readPayload(m.buf[off:off+int(req.length)], q.budget)
	m.unlock()
	return rdma.StatusSuccess, "", err
}

func (q *qp) doAtomic(l *inLink, req *request) (rdma.Status, string, error) {
	m, off, why := q.target(req, rdma.AccessRemoteAtomic)
	if m == nil {
		return rdma.StatusRemAccessErr, why, nil
	}
	if req.addr%8 != 0 {
		return rdma.StatusRemInvReqErr, "misaligned atomic", nil
	}
	if !m.tryLock() {
		return rdma.StatusRemAccessErr, "MR deregistered", nil
	}
	// The 8 bytes are a uint64 in the host's byte order, as rxe does.
	p := (*uint64)(unsafe.Pointer(&m.buf[off]))
	var old uint64
	if req.op == wireFetchAdd {
		old = atomic.AddUint64(p, req.compareAdd) - req.compareAdd
	} else {
		for {
			old = atomic.LoadUint64(p)
			if old != req.compareAdd || atomic.CompareAndSwapUint64(p, old, req.swap) {
				break
			}
		}
	}
	m.unlock()
	return rdma.StatusSuccess, "", l.respond(q, respAtomic, 0, req.seq, old)
}
