// Tests of dead, silent and misbehaving peers: every outstanding request completes, in bounded time.

package soft

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// closeSide destroys a side's QP, CQ, PD and device, as a crashing peer
// process would lose them.
func closeSide(t *testing.T, s *side, mrs ...rdma.MR) {
	t.Helper()
	if err := s.qp.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range mrs {
		if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []io.Closer{s.cq, s.pd, s.dev} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPeerClosedMidTransfer(t *testing.T) {
	a, b := newPair(t, fastFail)
	const chunk, n = 1 << 20, 32
	local := register(t, a.pd, chunk*n, rw)
	remote := register(t, b.pd, chunk*n, rw)
	wrs := make([]rdma.SendWR, n)
	for i := range wrs {
		wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, i*chunk, chunk), RemoteAddr: remote.Addr() + uint64(i*chunk), RKey: remote.RKey()}
	}
	post(t, a.qp, wrs...)
	expectStatus(t, a.cq, 0, rdma.StatusSuccess)
	start := time.Now()
	closeSide(t, b, remote)
	var failed bool
	for i := 1; i < n; i++ {
		wc := wait(t, a.cq)
		if wc.ID != uint64(i) {
			t.Fatalf("completion %d out of order, want %d", wc.ID, i)
		}
		switch {
		case failed && wc.Status != rdma.StatusWRFlushErr:
			t.Fatalf("after the failure: %+v", wc)
		case !failed && wc.Status == rdma.StatusRetryExcErr:
			failed = true
		case !failed && wc.Status != rdma.StatusSuccess:
			t.Fatalf("completion %+v", wc)
		}
	}
	if !failed {
		t.Log("every READ finished before the peer closed")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v to notice the dead peer", d)
	}
}

func TestPeerClosedWhileIdle(t *testing.T) {
	a, b := newPair(t, fastFail)
	local := register(t, a.pd, 64, rw)
	remote := register(t, b.pd, 64, rw)
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	expectStatus(t, a.cq, 1, rdma.StatusSuccess)
	closeSide(t, b, remote)
	time.Sleep(20 * time.Millisecond)
	if a.qp.State() != rdma.QPStateRTS {
		t.Fatalf("idle QP moved to %v when its peer went away", a.qp.State())
	}
	post(t, a.qp, rdma.SendWR{ID: 2, Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()},
		rdma.SendWR{ID: 3, Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	expectStatus(t, a.cq, 2, rdma.StatusRetryExcErr)
	expectStatus(t, a.cq, 3, rdma.StatusWRFlushErr)
}

func TestPeerUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nobody listens there any more
	a := newSide(t, fastFail)
	local := register(t, a.pd, 64, rw)
	bringUp(t, a.qp, rdma.QPInfo{Provider: "soft", QPNum: 9, Addr: addr})
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: 1, RKey: 1})
	expectStatus(t, a.cq, 1, rdma.StatusRetryExcErr)
}

func bringUp(t *testing.T, q rdma.QP, remote rdma.QPInfo) {
	t.Helper()
	if err := q.ModifyToInit(); err != nil {
		t.Fatal(err)
	}
	if err := q.ModifyToRTR(remote); err != nil {
		t.Fatal(err)
	}
	if err := q.ModifyToRTS(); err != nil {
		t.Fatal(err)
	}
}

// fakePeer is a hand-written responder device: it answers the attach on
// its link with ack, then hands the link to serve, with the attaching QP's
// number (which responses name).
type fakePeer struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newFakePeer(t *testing.T, ack uint8, serve func(c net.Conn, requester uint32)) *fakePeer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePeer{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		h := make([]byte, helloSize+requestHeaderSize)
		if _, err := io.ReadFull(c, h); err != nil {
			return
		}
		a, err := decodeAttach(h[helloSize:])
		if err != nil {
			t.Errorf("fake peer: %v", err)
			return
		}
		b := make([]byte, responseHeaderSize)
		encodeAttachAck(b, attachAck{qpEnds: qpEnds{dst: a.src, src: a.dst}, code: ack})
		c.Write(b)
		if serve != nil {
			serve(c, a.src)
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *fakePeer) info() rdma.QPInfo {
	return rdma.QPInfo{Provider: "soft", QPNum: 99, PSN: 0, Addr: p.ln.Addr().String()}
}

func TestSilentPeer(t *testing.T) {
	done := make(chan struct{})
	p := newFakePeer(t, ackOK, func(c net.Conn, _ uint32) {
		io.Copy(io.Discard, c) // swallow requests, never answer
		close(done)
	})
	a := newSide(t, fastFail)
	local := register(t, a.pd, 64, rw)
	bringUp(t, a.qp, p.info())
	start := time.Now()
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: 1, RKey: 1},
		rdma.SendWR{ID: 2, Op: rdma.OpWrite, SGL: sgl(local, 0, 8), RemoteAddr: 1, RKey: 1})
	expectStatus(t, a.cq, 1, rdma.StatusRetryExcErr)
	expectStatus(t, a.cq, 2, rdma.StatusWRFlushErr)
	budget := fastFail.AckTimeout * time.Duration(fastFail.RetryCount+1)
	if d := time.Since(start); d < budget || d > 3*budget+time.Second {
		t.Fatalf("RETRY_EXC_ERR after %v, budget %v", d, budget)
	}
	<-done // the QP closed its connection
}

func TestPeerRefusesHello(t *testing.T) {
	p := newFakePeer(t, ackWrongPeer, nil)
	a := newSide(t, fastFail)
	local := register(t, a.pd, 64, rw)
	bringUp(t, a.qp, p.info())
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpWrite, SGL: sgl(local, 0, 8), RemoteAddr: 1, RKey: 1})
	expectStatus(t, a.cq, 1, rdma.StatusRetryExcErr)
}

// A peer answering nonsense gets BAD_RESP_ERR, not a hang or a panic.
func TestBadResponses(t *testing.T) {
	respond := func(edit func(b []byte)) func(c net.Conn, requester uint32) {
		return func(c net.Conn, requester uint32) {
			req := make([]byte, requestHeaderSize)
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			seq := binary.BigEndian.Uint32(req[12:])
			b := make([]byte, responseHeaderSize)
			encodeResponse(b, &response{kind: respReadData, dst: requester, seq: seq, length: 8})
			edit(b)
			c.Write(append(b, make([]byte, 8)...))
			io.Copy(io.Discard, c)
		}
	}
	for name, edit := range map[string]func(b []byte){
		"wrong sequence":     func(b []byte) { b[15]++ },
		"wrong kind":         func(b []byte) { b[4] = respAck; binary.BigEndian.PutUint32(b, 0) },
		"gone of another QP": func(b []byte) { encodeGone(b, qpEnds{dst: binary.BigEndian.Uint32(b[8:]), src: 98}) },
		"wrong length":       func(b []byte) { binary.BigEndian.PutUint32(b, 9) },
		"malformed":          func(b []byte) { b[4] = 77 },
		"huge length":        func(b []byte) { binary.BigEndian.PutUint32(b, 0xffffffff) },
		"NAK with bad state": func(b []byte) { b[4], b[5] = respNAK, byte(rdma.StatusSuccess) },
	} {
		t.Run(name, func(t *testing.T) {
			p := newFakePeer(t, ackOK, respond(edit))
			a := newSide(t, rdma.QPConfig{})
			local := register(t, a.pd, 64, rw)
			bringUp(t, a.qp, p.info())
			post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: 1, RKey: 1},
				rdma.SendWR{ID: 2, Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: 1, RKey: 1})
			expectStatus(t, a.cq, 1, rdma.StatusBadRespErr)
			expectStatus(t, a.cq, 2, rdma.StatusWRFlushErr)
		})
	}
}
