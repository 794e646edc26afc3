// The requester's side of a data connection: dialing the peer's endpoint, the hello, and the sender goroutine.

package soft

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// sender is the QP's sender goroutine: it connects to the peer's responder,
// starts the receiver, then sends whatever PostSend hands it.
func (q *qp) sender(ctx context.Context, remote rdma.QPInfo) {
	defer q.wg.Done()
	conn, err := q.dial(ctx, remote)
	if err == nil {
		err = q.startReceiver(conn)
	}
	if err != nil {
		if ctx.Err() == nil && !q.gone() {
			q.dev.log.Warn("rdma/soft: cannot connect QP", "device", q.dev.name, "qp", q.num,
				"peer", remote.Addr, "peer_qp", remote.QPNum, "err", err)
		}
		q.sq.mu.Lock()
		q.sq.linkDown = err
		q.sq.mu.Unlock()
	}
	q.runTx(false)
	for {
		select {
		case <-q.tx.kick:
			q.runTx(false)
		case <-q.dead:
			return
		}
	}
}

// dial connects to the responder of the remote QP and introduces this QP.
func (q *qp) dial(ctx context.Context, remote rdma.QPInfo) (*net.TCPConn, error) {
	timeout := max(q.budget, time.Second)
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", remote.Addr)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.TCPConn)
	_ = conn.SetNoDelay(true)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	var b [max(helloSize, helloAckSize)]byte
	encodeHello(b[:helloSize], hello{dstQPN: remote.QPNum, srcQPN: q.num, psn: q.psn, rnrBudget: q.rnrBudget()})
	if _, err := conn.Write(b[:helloSize]); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if _, err := io.ReadFull(conn, b[:helloAckSize]); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("waiting for the hello acknowledgement: %w", err)
	}
	code, err := decodeHelloAck(b[:helloAckSize])
	if err == nil && code != ackOK {
		err = fmt.Errorf("peer refused the connection: %s", ackReasons[code])
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if !stop() {
		_ = conn.Close()
		return nil, ctx.Err()
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}
