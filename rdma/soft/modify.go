// The RC state machine: RESET -> INIT -> RTR -> RTS, ERR from anywhere, and Close.

package soft

import (
	"context"
	"fmt"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
)

// move changes the state from "from" to "to" under q.mu, or says why not.
func (q *qp) moveLocked(from, to rdma.QPState) error {
	if q.closed {
		return rdma.ErrClosed
	}
	if !q.state.CompareAndSwap(uint32(from), uint32(to)) {
		return fmt.Errorf("%w: QP %d cannot move to %v from %v", rdma.ErrQPState, q.num, to, q.State())
	}
	return nil
}

func (q *qp) ModifyToInit() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.moveLocked(rdma.QPStateReset, rdma.QPStateInit)
}

func (q *qp) ModifyToRTR(remote rdma.QPInfo) error {
	if remote.Provider != ProviderName || remote.Addr == "" || remote.QPNum == 0 {
		return fmt.Errorf("rdma/soft: QP %d: remote QP info %+v is not a soft QP's", q.num, remote)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.moveLocked(rdma.QPStateInit, rdma.QPStateRTR); err != nil {
		return err
	}
	q.remote = remote
	close(q.rtr)
	return nil
}

// ModifyToRTS starts the sender goroutine, which attaches the QP to its
// peer over the link to the peer's device; requests posted meanwhile wait
// for the attach.
func (q *qp) ModifyToRTS() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	// The sender goroutine owns the transmitter until it is connected.
	q.tx.state.Store(txBusy)
	if err := q.moveLocked(rdma.QPStateRTR, rdma.QPStateRTS); err != nil {
		q.tx.state.Store(txIdle)
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	q.cancel = cancel
	q.wg.Add(1)
	go q.sender(ctx, q.remote)
	return nil
}

func (q *qp) ModifyToError() error {
	if q.isClosed() {
		return rdma.ErrClosed
	}
	q.enterError(errModifyToError)
	return nil
}

func (q *qp) isClosed() bool { return q.state.Load() == uint32(stateClosed) }

// Close destroys the QP: it leaves its links, waits for its goroutine, for
// any PostSend or Wait working inline and for any landing of data in its
// buffers, and drops outstanding requests without completions. When it
// returns, nothing touches the buffers of those requests any more.
func (q *qp) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return rdma.ErrClosed
	}
	q.closed = true
	q.state.Store(uint32(stateClosed))
	cancel := q.cancel
	q.mu.Unlock()
	q.kill()
	q.leaveLinks()
	if cancel != nil {
		cancel()
	}
	q.sq.mu.Lock()
	q.stopRNRLocked()
	q.sq.mu.Unlock()
	q.wg.Wait()
	q.inline.Lock()
	q.inline.Unlock() // a barrier: inline senders and landers are done
	q.dev.removeQP(q)
	q.sendCQ.detach(q)
	if q.recvCQ != q.sendCQ {
		q.recvCQ.detach(q)
	}
	q.pd.life.Release(life.PDQPs)
	return nil
}
