// Tests of held-back ACKs: unsignaled WRITEs and SENDs are acknowledged with the link's next answers, or after ackDelay.

package soft

import (
	"fmt"
	"testing"

	"github.com/rkv-io/rkv/rdma"
)

// heldPair is a connected pair whose link from a to b is up (a signaled
// WRITE went through), with a's ring of ring requests; in is b's end of
// that link.
type heldPair struct {
	a, b   *side
	local  rdma.MR
	remote rdma.MR
	in     *inLink
}

func newHeldPair(t *testing.T, ring int) *heldPair {
	t.Helper()
	a, b := newPair(t, rdma.QPConfig{MaxSendWR: ring})
	p := &heldPair{a: a, b: b, local: register(t, a.pd, 4096, rw), remote: register(t, b.pd, 4096, rw)}
	post(t, a.qp, p.write(99, rdma.Signaled))
	expectStatus(t, a.cq, 99, rdma.StatusSuccess)
	dev := b.dev.(*device)
	dev.mu.Lock()
	for l := range dev.ins {
		p.in = l
	}
	dev.mu.Unlock()
	if p.in == nil {
		t.Fatal("no link into b")
	}
	return p
}

// write is an 8-byte WRITE from a to b.
func (p *heldPair) write(id uint64, flags rdma.SendFlags) rdma.SendWR {
	return rdma.SendWR{ID: id, Op: rdma.OpWrite, Flags: flags, SGL: sgl(p.local, 0, 8), RemoteAddr: p.remote.Addr(), RKey: p.remote.RKey()}
}

// freeze keeps the held ACKs from leaving on their own: the timer counts
// as set, so none is started, and they go only with an answer.
func (p *heldPair) freeze() {
	h := &p.in.held
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

// held is the number of ACKs b holds.
func (p *heldPair) held() int {
	h := &p.in.held
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.frames) / responseHeaderSize
}

// acked is the number of a's requests that have been answered.
func (p *heldPair) acked() uint64 {
	s := &p.a.qp.(*qp).sq
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head
}

func (p *heldPair) waitHeld(t *testing.T, n int) {
	t.Helper()
	waitCount(t, "ACKs held", func() uint64 { return uint64(p.held()) }, uint64(n))
}

func (p *heldPair) waitAcked(t *testing.T, n uint64) {
	t.Helper()
	waitCount(t, "requests answered", p.acked, n)
}

// waitCount waits until count returns want.
func waitCount(t *testing.T, what string, count func() uint64, want uint64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d %s", want, what), func() error {
		if got := count(); got != want {
			return fmt.Errorf("%d %s", got, what)
		}
		return nil
	})
}

// Unsignaled WRITEs are acknowledged after ackDelay, all in one write of
// the responder, and their slots are free again.
func TestHeldAcksLeaveTogetherAfterTheDelay(t *testing.T) {
	p := newHeldPair(t, 16)
	before := p.acked()
	writes := p.in.w.writes.Load()
	post(t, p.a.qp, p.write(1, 0), p.write(2, 0), p.write(3, 0))
	p.waitAcked(t, before+3)
	if got := p.in.w.writes.Load() - writes; got != 1 {
		t.Errorf("3 held ACKs left in %d writes, want 1", got)
	}
	expectNone(t, p.a.cq, 5*ackDelay)
}

// Held ACKs go in front of the next answer on the link, in order: the
// READ after the WRITE completes, which it could not if its answer came
// first, and both answers leave in one write.
func TestHeldAcksLeaveWithTheNextAnswer(t *testing.T) {
	p := newHeldPair(t, 16)
	p.freeze()
	before := p.acked()
	post(t, p.a.qp, p.write(1, 0))
	p.waitHeld(t, 1)
	expectNone(t, p.a.cq, 5*ackDelay)
	if got := p.held(); got != 1 || p.acked() != before {
		t.Fatalf("%d ACKs held, %d requests answered: the frozen ACK left", got, p.acked()-before)
	}
	writes := p.in.w.writes.Load()
	post(t, p.a.qp, rdma.SendWR{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(p.local, 64, 8), RemoteAddr: p.remote.Addr(), RKey: p.remote.RKey()})
	expectStatus(t, p.a.cq, 2, rdma.StatusSuccess)
	if got := p.in.w.writes.Load() - writes; got != 1 {
		t.Errorf("the held ACK and the READ's data left in %d writes, want 1", got)
	}
	if got, acked := p.held(), p.acked()-before; got != 0 || acked != 2 {
		t.Errorf("%d ACKs still held, %d requests answered, want 0 and 2", got, acked)
	}
}

// A requester whose ring is half full of requests on the wire asks for
// the next ACK at once, so held ACKs never hold up its posts.
func TestHalfFullRingAsksForTheAck(t *testing.T) {
	p := newHeldPair(t, 8)
	p.freeze()
	before := p.acked()
	post(t, p.a.qp, p.write(1, 0), p.write(2, 0), p.write(3, 0), p.write(4, 0))
	p.waitHeld(t, 4)
	post(t, p.a.qp, p.write(5, 0))
	p.waitAcked(t, before+5)
	if got := p.held(); got != 0 {
		t.Errorf("%d ACKs still held", got)
	}
}

// An unsignaled SEND completes its RECV at once; its ACK is held.
func TestHeldAckOfASend(t *testing.T) {
	p := newHeldPair(t, 16)
	p.freeze()
	recvMR := register(t, p.b.pd, 64, rw)
	postRecv(t, p.b.qp, rdma.RecvWR{ID: 7, SGL: sgl(recvMR, 0, 64)})
	before := p.acked()
	post(t, p.a.qp, rdma.SendWR{ID: 1, Op: rdma.OpSend, SGL: sgl(p.local, 0, 16)})
	if wc := expectStatus(t, p.b.cq, 7, rdma.StatusSuccess); wc.ByteLen != 16 {
		t.Fatalf("RECV of %d bytes, want 16", wc.ByteLen)
	}
	p.waitHeld(t, 1)
	if p.acked() != before {
		t.Fatal("the SEND was answered though its ACK is held")
	}
	post(t, p.a.qp, p.write(2, rdma.Signaled))
	expectStatus(t, p.a.cq, 2, rdma.StatusSuccess)
	if got := p.acked() - before; got != 2 {
		t.Errorf("%d requests answered, want 2", got)
	}
}

// A fenced request waits for earlier READs and atomics only, as in
// InfiniBand: not for WRITEs whose ACKs are held (frozen here for good).
func TestFenceDoesNotWaitForHeldAcks(t *testing.T) {
	p := newHeldPair(t, 16)
	p.freeze()
	post(t, p.a.qp, p.write(1, 0))
	p.waitHeld(t, 1)
	post(t, p.a.qp, rdma.SendWR{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled | rdma.Fence, SGL: sgl(p.local, 64, 8), RemoteAddr: p.remote.Addr(), RKey: p.remote.RKey()})
	expectStatus(t, p.a.cq, 2, rdma.StatusSuccess)
}
