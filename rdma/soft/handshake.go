// The responder's side of a data connection: reading the hello and attaching the connection to its QP.

package soft

import (
	"io"
	"net"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// handshakeTimeout bounds the hello exchange, including the wait for the
// named QP to reach RTR.
const handshakeTimeout = 10 * time.Second

// handshake serves one accepted connection: the hello, then, once it is
// attached to a QP, that QP's responder.
func (d *device) handshake(c *net.TCPConn) {
	defer d.wg.Done()
	_ = c.SetNoDelay(true)
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	b := make([]byte, helloSize)
	if _, err := io.ReadFull(c, b); err != nil {
		// A requester that gave up before saying hello (its QP was
		// destroyed while connecting) looks like this too.
		d.log.Debug("rdma/soft: data connection closed before its hello", "device", d.name, "remote", c.RemoteAddr(), "err", err)
		d.forget(c)
		_ = c.Close()
		return
	}
	h, err := decodeHello(b)
	if err != nil {
		d.reject(c, "malformed hello", err)
		return
	}
	q, code := d.admit(c, h)
	ack := make([]byte, helloAckSize)
	encodeHelloAck(ack, code)
	_, werr := c.Write(ack)
	if code != ackOK {
		d.log.Warn("rdma/soft: refused a data connection", "device", d.name, "remote", c.RemoteAddr(),
			"qp", h.dstQPN, "peer_qp", h.srcQPN, "reason", ackReasons[code])
		d.forget(c)
		_ = c.Close()
		return
	}
	d.forget(c) // the QP owns it now
	if werr == nil {
		_ = c.SetDeadline(time.Time{})
	}
	q.serve()
}

func (d *device) reject(c *net.TCPConn, what string, err error) {
	select {
	case <-d.closing:
	default:
		d.log.Warn("rdma/soft: dropped a data connection", "device", d.name, "remote", c.RemoteAddr(), "stage", what, "err", err)
	}
	d.forget(c)
	_ = c.Close()
}

// admit finds the QP a hello names, waits (bounded) for it to reach RTR,
// and attaches c to its responder.
func (d *device) admit(c *net.TCPConn, h hello) (*qp, uint8) {
	q := d.lookupQP(h.dstQPN)
	if q == nil {
		return nil, ackNoQP
	}
	t := time.NewTimer(handshakeTimeout)
	defer t.Stop()
	select {
	case <-q.rtr:
	case <-q.dead:
		return nil, ackNotReady
	case <-d.closing:
		return nil, ackNotReady
	case <-t.C:
		return nil, ackNotReady
	}
	return q, q.attach(c, h)
}

// attach makes c the connection of q's responder. A QP takes one such
// connection in its life: a second hello, even after the first connection
// ended, is refused, so old requests cannot be replayed into it.
func (q *qp) attach(c *net.TCPConn, h hello) uint8 {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.state.Load()
	switch {
	case q.closed || st != uint32(rdma.QPStateRTR) && st != uint32(rdma.QPStateRTS):
		return ackNotReady
	case q.remote.QPNum != h.srcQPN || q.remote.PSN != h.psn:
		return ackWrongPeer
	case q.rsp.conn != nil:
		return ackBusy
	}
	q.respConn = c
	q.rsp.init(c, h, q.budget)
	q.rq.mu.Lock()
	q.rq.respActive = true
	q.rq.mu.Unlock()
	q.wg.Add(1)
	return ackOK
}
