// PostSend and PostRecv: validation, copying into the rings, and starting the transmitter.

package soft

import (
	"fmt"

	"github.com/rkv-io/rkv/rdma"
)

func (q *qp) PostSend(wrs []rdma.SendWR) error {
	s := &q.sq
	s.mu.Lock()
	st := rdma.QPState(q.state.Load())
	switch st {
	case rdma.QPStateRTS, rdma.QPStateError:
	case stateClosed:
		s.mu.Unlock()
		return &rdma.PostError{Err: rdma.ErrClosed}
	default:
		s.mu.Unlock()
		return &rdma.PostError{Err: fmt.Errorf("%w: PostSend on QP %d in %v", rdma.ErrQPState, q.num, st)}
	}
	var perr error
	for i := range wrs {
		if err := q.checkSend(&wrs[i]); err != nil {
			perr = &rdma.PostError{Index: i, Err: err}
			break
		}
		if s.tail-s.head == uint64(len(s.ring)) {
			perr = &rdma.PostError{Index: i, Err: rdma.ErrQueueFull}
			break
		}
		s.at(s.tail).load(&wrs[i], q)
		s.tail++
	}
	if st == rdma.QPStateError && !s.readerActive {
		q.flushSendLocked()
	}
	s.mu.Unlock()
	if st == rdma.QPStateRTS {
		q.kickTx()
	}
	return perr
}

// checkSend validates the shape of a request: what ibv_post_send refuses.
func (q *qp) checkSend(wr *rdma.SendWR) error {
	switch wr.Op {
	case rdma.OpWrite, rdma.OpWriteImm, rdma.OpSend, rdma.OpSendImm, rdma.OpRead, rdma.OpCompareSwap, rdma.OpFetchAdd:
	default:
		return fmt.Errorf("%w: opcode %v cannot be posted to a send queue", rdma.ErrInvalidWR, wr.Op)
	}
	if wr.Flags&^(rdma.Signaled|rdma.Fence) != 0 {
		return fmt.Errorf("%w: unknown send flags %#x", rdma.ErrInvalidWR, uint8(wr.Flags))
	}
	total, err := q.checkSGL(wr.SGL)
	if err != nil {
		return err
	}
	if wr.Op.IsAtomic() && (len(wr.SGL) != 1 || total != 8) {
		return fmt.Errorf("%w: %v needs one 8-byte SGE for its result", rdma.ErrInvalidWR, wr.Op)
	}
	return nil
}

func (q *qp) checkSGL(sgl []rdma.SGE) (int, error) {
	if len(sgl) > q.cfg.MaxSGE {
		return 0, fmt.Errorf("%w: %d SGEs, the QP allows %d", rdma.ErrInvalidWR, len(sgl), q.cfg.MaxSGE)
	}
	total := 0
	for i := range sgl {
		if sgl[i].Offset < 0 || sgl[i].Length < 0 {
			return 0, fmt.Errorf("%w: SGE %d has offset %d, length %d", rdma.ErrInvalidWR, i, sgl[i].Offset, sgl[i].Length)
		}
		total += sgl[i].Length
		if total > MaxMessageSize {
			return 0, fmt.Errorf("%w: message longer than %d bytes", rdma.ErrInvalidWR, MaxMessageSize)
		}
	}
	return total, nil
}

func (q *qp) PostRecv(wrs []rdma.RecvWR) error {
	r := &q.rq
	r.mu.Lock()
	st := rdma.QPState(q.state.Load())
	switch st {
	case rdma.QPStateInit, rdma.QPStateRTR, rdma.QPStateRTS, rdma.QPStateError:
	case stateClosed:
		r.mu.Unlock()
		return &rdma.PostError{Err: rdma.ErrClosed}
	default:
		r.mu.Unlock()
		return &rdma.PostError{Err: fmt.Errorf("%w: PostRecv on QP %d in %v", rdma.ErrQPState, q.num, st)}
	}
	var perr error
	for i := range wrs {
		if _, err := q.checkSGL(wrs[i].SGL); err != nil {
			perr = &rdma.PostError{Index: i, Err: err}
			break
		}
		if r.tail-r.head == uint64(len(r.ring)) {
			perr = &rdma.PostError{Index: i, Err: rdma.ErrQueueFull}
			break
		}
		r.at(r.tail).load(&wrs[i], q)
		r.tail++
	}
	if st == rdma.QPStateError && !r.respActive {
		q.flushRecvLocked()
	}
	r.mu.Unlock()
	select {
	case r.posted <- struct{}{}:
	default:
	}
	return perr
}
