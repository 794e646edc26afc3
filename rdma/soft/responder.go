// The responder: one goroutine per incoming connection executes READ, WRITE and atomics against the MR table.

package soft

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
)

type responder struct {
	conn   *net.TCPConn
	br     *bufio.Reader
	w      frameWriter
	hdr    [requestHeaderSize]byte
	resp   [responseHeaderSize]byte
	rnr    time.Duration // how long to wait for a RECV before answering RNR
	expect uint32        // sequence number of the next request
	// draining: after a NAK, serve closes the connection gracefully;
	// finishError must not reset it. Guarded by qp.mu.
	draining bool
	// flipped: this responder moved the QP to ERR before completing a
	// RECV with an error (failRecv); serve finishes the move.
	flipped bool
}

func (r *responder) init(c *net.TCPConn, h hello, budget time.Duration) {
	r.conn = c
	r.br = bufio.NewReaderSize(c, readBufSize)
	r.w.conn, r.w.buf, r.w.timeout = c, make([]byte, 0, frameBufSize), budget
	r.rnr = h.rnrBudget
	r.expect = h.psn
}

// errQPGone: the QP left RTR/RTS while the responder waited.
var errQPGone = errors.New("QP left RTS")

// serve runs the responder until the connection ends. A malformed or
// truncated frame, or a NAK other than RNR, moves the QP to ERR.
func (q *qp) serve() {
	defer q.wg.Done()
	fatal, nak, err := q.serveLoop()
	if nak {
		// Close gracefully: the requester may have sent more behind
		// the NAKed request, and closing with unread data would reset
		// the connection and lose the NAK.
		q.mu.Lock()
		q.rsp.draining = true
		q.mu.Unlock()
		_ = q.rsp.conn.CloseWrite()
	}
	switch {
	case q.rsp.flipped:
		q.finishError(fmt.Errorf("responder: %w", err))
	case fatal:
		q.enterError(fmt.Errorf("responder: %w", err))
	case err != nil:
		q.dev.log.Debug("rdma/soft: responder connection ended", "device", q.dev.name, "qp", q.num, "reason", err)
	}
	if nak {
		_ = q.rsp.conn.SetReadDeadline(time.Now().Add(min(q.budget, 10*time.Second)))
		_, _ = io.Copy(io.Discard, q.rsp.conn)
	}
	_ = q.rsp.conn.Close()
	r := &q.rq
	r.mu.Lock()
	r.respActive = false
	if q.state.Load() == uint32(rdma.QPStateError) {
		q.flushRecvLocked()
	}
	r.mu.Unlock()
}

// serveLoop executes requests until the connection ends or a request is
// refused. It reports whether that is the QP's end, whether a NAK was
// sent, and why it stopped.
func (q *qp) serveLoop() (fatal, nak bool, err error) {
	r := &q.rsp
	for {
		if n, err := io.ReadFull(r.br, r.hdr[:]); err != nil {
			// Between frames, the peer went away: not this QP's fault.
			return n > 0 && !q.gone(), false, err
		}
		if q.gone() {
			return false, false, errQPGone
		}
		req, err := decodeRequest(r.hdr[:])
		if err != nil {
			return true, false, fmt.Errorf("malformed request: %w", err)
		}
		if req.seq != r.expect {
			return true, false, fmt.Errorf("request sequence number %d, expected %d", req.seq, r.expect)
		}
		r.expect++
		st, why, err := q.execute(&req)
		if err != nil {
			return !q.gone() && !errors.Is(err, errQPGone), false, fmt.Errorf("request %d: %w", req.seq, err)
		}
		if st != rdma.StatusSuccess {
			// After a NAK a responder drops everything until the
			// requester retries, which it never does here: stop.
			_ = q.respond(respNAK, st, req.seq, 0)
			_ = r.w.flush()
			return st != rdma.StatusRNRRetryExcErr, true, fmt.Errorf("answered request %d with %v: %s", req.seq, st, why)
		}
		if r.br.Buffered() == 0 {
			if err := r.w.flush(); err != nil {
				return false, false, err
			}
		}
	}
}

// gone reports whether the QP is in ERR or closed, so its connections
// were closed on purpose.
func (q *qp) gone() bool {
	s := q.state.Load()
	return s == uint32(rdma.QPStateError) || s == uint32(stateClosed)
}

// execute carries out one request. A non-success status is answered with a
// NAK; why explains it for the log. An error means the connection failed.
func (q *qp) execute(req *request) (st rdma.Status, why string, err error) {
	switch req.op {
	case wireRead:
		return q.doRead(req)
	case wireWrite, wireWriteImm:
		return q.doWrite(req)
	case wireSend, wireSendImm:
		return q.doSend(req)
	default:
		return q.doAtomic(req)
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

func (q *qp) respond(kind uint8, st rdma.Status, seq uint32, value uint64) error {
	r := response{kind: kind, status: st, seq: seq, value: value}
	encodeResponse(q.rsp.resp[:], &r)
	return q.rsp.w.write(q.rsp.resp[:])
}

func (q *qp) doRead(req *request) (rdma.Status, string, error) {
	// A zero-length READ or WRITE needs no valid rkey (IBA C9-88).
	var m *mr
	var off int
	if req.length > 0 {
		var why string
		if m, off, why = q.target(req, rdma.AccessRemoteRead); m == nil {
			return rdma.StatusRemAccessErr, why, nil
		}
		if !m.lock() {
			return rdma.StatusRemAccessErr, "MR deregistered", nil
		}
		defer m.unlock()
	}
	w := &q.rsp.w
	r := response{kind: respReadData, seq: req.seq, length: req.length}
	encodeResponse(q.rsp.resp[:], &r)
	if err := w.write(q.rsp.resp[:]); err != nil || m == nil {
		return rdma.StatusSuccess, "", err
	}
	data := m.buf[off : off+int(req.length)]
	if len(data) <= copyMax {
		return rdma.StatusSuccess, "", w.write(data)
	}
	return rdma.StatusSuccess, "", w.writeLarge(data, nil)
}

func (q *qp) doWrite(req *request) (rdma.Status, string, error) {
	var m *mr
	var off int
	if req.length > 0 {
		var why string
		if m, off, why = q.target(req, rdma.AccessRemoteWrite); m == nil {
			return rdma.StatusRemAccessErr, why, nil
		}
	}
	var recv *recvWQE
	if req.op == wireWriteImm {
		var st rdma.Status
		var err error
		if recv, st, err = q.peekRecv(); recv == nil {
			return st, "no RECV posted", err
		}
	}
	if m != nil {
		if !m.lock() {
			return rdma.StatusRemAccessErr, "MR deregistered", nil
		}
		err := q.readPayload(m.buf[off : off+int(req.length)])
		m.unlock()
		if err != nil {
			return 0, "", err
		}
	}
	if recv != nil {
		q.popRecv(recv, rdma.Completion{Op: rdma.OpRecvImm, ByteLen: req.length, Imm: req.imm, HasImm: true})
	}
	return rdma.StatusSuccess, "", q.respond(respAck, 0, req.seq, 0)
}

func (q *qp) doAtomic(req *request) (rdma.Status, string, error) {
	m, off, why := q.target(req, rdma.AccessRemoteAtomic)
	if m == nil {
		return rdma.StatusRemAccessErr, why, nil
	}
	if req.addr%8 != 0 {
		return rdma.StatusRemInvReqErr, "misaligned atomic", nil
	}
	if !m.lock() {
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
	return rdma.StatusSuccess, "", q.respond(respAtomic, 0, req.seq, old)
}

// readPayload reads request data straight into registered memory. A
// requester that stalls mid-payload gets q.budget per chunk, so a
// Deregister waiting for this copy is not held for ever.
func (q *qp) readPayload(p []byte) error {
	r := &q.rsp
	for len(p) > 0 {
		n := min(len(p), chunkSize)
		timed := n > r.br.Buffered()
		if timed {
			if err := r.w.flush(); err != nil {
				return err
			}
			_ = r.conn.SetReadDeadline(time.Now().Add(q.budget))
		}
		_, err := io.ReadFull(r.br, p[:n])
		if timed {
			_ = r.conn.SetReadDeadline(time.Time{})
		}
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}
