// PostSend and PostRecv: validation, copying into the rings, and starting the transmitter.

package soft

import (
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/postcheck"
)

func (q *qp) PostSend(wrs []rdma.SendWR) error {
	s := &q.sq
	s.mu.Lock()
	st := rdma.QPState(q.state.Load())
	if err := postcheck.SendState(q.num, st, st == stateClosed); err != nil {
		s.mu.Unlock()
		return err
	}
	var perr error
	for i := range wrs {
		if _, err := postcheck.Send(&wrs[i], q.cfg.MaxSGE, MaxMessageSize); err != nil {
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
	if st == rdma.QPStateError && !s.landing {
		q.flushSendLocked()
	}
	s.mu.Unlock()
	if st == rdma.QPStateRTS {
		q.kickTx()
	}
	return perr
}

func (q *qp) PostRecv(wrs []rdma.RecvWR) error {
	r := &q.rq
	r.mu.Lock()
	st := rdma.QPState(q.state.Load())
	if err := postcheck.RecvState(q.num, st, st == stateClosed); err != nil {
		r.mu.Unlock()
		return err
	}
	var perr error
	for i := range wrs {
		if _, err := postcheck.SGL(wrs[i].SGL, q.cfg.MaxSGE, MaxMessageSize); err != nil {
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
	if st == rdma.QPStateError && !r.busy {
		q.flushRecvLocked()
	}
	r.mu.Unlock()
	return perr
}
