package soft

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// recordingHandler records the batches it is handed and answers each
// RECV with a SEND on the QP it came to, as a server answers commits.
// With decline set, it answers none and declines those of odd tags.
type recordingHandler struct {
	t       *testing.T
	p       *devicePair
	decline bool
	mu      sync.Mutex
	calls   [][]rdma.Recv
}

func (h *recordingHandler) HandleRecvs(recvs []rdma.Recv) []rdma.Recv {
	h.mu.Lock()
	h.calls = append(h.calls, append([]rdma.Recv(nil), recvs...))
	h.mu.Unlock()
	if h.decline {
		declined := recvs[:0]
		for _, r := range recvs {
			if r.Tag.(int)%2 == 1 {
				declined = append(declined, r)
			}
		}
		return declined
	}
	for _, r := range recvs {
		q := h.p.qps[r.Tag.(int)]
		reply := rdma.SendWR{ID: r.ID, Op: rdma.OpSend, SGL: sgl(q.remote, 128, 8)}
		if err := q.y.PostSend([]rdma.SendWR{reply}); err != nil {
			h.t.Errorf("reply of QP %d: %v", r.Tag.(int), err)
		}
	}
	return nil
}

func (h *recordingHandler) batches() [][]rdma.Recv {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// sendTogether posts a signaled SEND of 16 bytes, ID 1, from the start of
// each pair's local MR, all leaving in one write: the role held, as a
// writer busy in a syscall would hold it, then the pending frames drained
// at once.
func sendTogether(t *testing.T, p *devicePair) {
	t.Helper()
	w := &p.qps[0].x.(*qp).out.Load().w
	w.mu.Lock()
	w.flushing = true
	w.mu.Unlock()
	for _, q := range p.qps {
		post(t, q.x, rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 16)})
	}
	if err := w.drain(nil); err != nil {
		t.Fatal(err)
	}
}

// The RECVs that one read of a link completes for QPs whose CQs share a
// RecvHandler reach it in one call, tagged, and not through their CQs; the
// replies it posts leave in one write of the other way's link.
func TestRecvHandlerTakesWhatOneReadBrought(t *testing.T) {
	const n = 4
	p := newIdlePair(t, n)
	h := &recordingHandler{t: t, p: p}
	for i, q := range p.qps {
		q.cy.(rdma.RecvHandling).SetRecvHandler(h, i)
		postRecv(t, q.y, rdma.RecvWR{ID: 100 + uint64(i), SGL: sgl(q.remote, 0, 64)})
		postRecv(t, q.x, rdma.RecvWR{ID: 200 + uint64(i), SGL: sgl(q.local, 128, 8)})
		copy(q.local.Bytes(), bytes.Repeat([]byte{byte('a' + i)}, 16))
	}
	// The other way's link up for every QP first: its writes are counted.
	for i, q := range p.qps {
		post(t, q.y, rdma.SendWR{ID: 9, Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: sgl(q.remote, 192, 8), RemoteAddr: q.local.Addr() + 192, RKey: q.local.RKey()})
		expectStatus(t, q.cy, 9, rdma.StatusSuccess)
		waitTxIdle(t, q.y, fmt.Sprintf("QP %d's reverse", i))
	}
	replies := &p.qps[0].y.(*qp).out.Load().w
	repliesBefore := replies.writes.Load()
	sendTogether(t, p)
	for i, q := range p.qps {
		// The SEND's ACK and the handler's reply come on the two links
		// between the devices: in either order.
		var sent, replied bool
		for range 2 {
			switch wc := wait(t, q.cx); {
			case wc.ID == 1 && wc.Op == rdma.OpSend && wc.Status == rdma.StatusSuccess:
				sent = true
			case wc.ID == 200+uint64(i) && wc.Op == rdma.OpRecv && wc.Status == rdma.StatusSuccess && wc.ByteLen == 8:
				replied = true
			default:
				t.Fatalf("QP %d: completion %+v", i, wc)
			}
		}
		if !sent || !replied {
			t.Fatalf("QP %d: SEND completed %v, reply received %v", i, sent, replied)
		}
	}
	got := h.batches()
	if len(got) != 1 || len(got[0]) != n {
		t.Fatalf("handler calls %v, want one with the %d RECVs of the one write", got, n)
	}
	for i, r := range got[0] {
		q := p.qps[i]
		if r.Tag != i || r.ID != 100+uint64(i) || r.Status != rdma.StatusSuccess || r.Op != rdma.OpRecv || r.ByteLen != 16 || r.QPNum != q.y.Num() {
			t.Errorf("RECV %d handed over as %+v", i, r)
		}
		if !bytes.Equal(q.remote.Bytes()[:16], q.local.Bytes()[:16]) {
			t.Errorf("QP %d: the SEND's payload did not land", i)
		}
		expectNone(t, q.cy, 20*time.Millisecond) // not queued for Poll and Wait
	}
	if got := replies.writes.Load() - repliesBefore; got != 1 {
		t.Errorf("the handler's %d replies left in %d writes, want 1", n, got)
	}
}

// A RECV that fails (a SEND longer than its buffer) completes on the CQ as
// ever, and so do send completions: the handler takes successes only.
func TestRecvHandlerLeavesFailuresToTheCQ(t *testing.T) {
	p := newIdlePair(t, 1)
	q := p.qps[0]
	h := &recordingHandler{t: t, p: p}
	q.cy.(rdma.RecvHandling).SetRecvHandler(h, 0)
	postRecv(t, q.y, rdma.RecvWR{ID: 5, SGL: sgl(q.remote, 0, 8)})
	post(t, q.x, rdma.SendWR{ID: 6, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(q.local, 0, 64)})
	expectStatus(t, q.cy, 5, rdma.StatusLocLenErr)
	expectStatus(t, q.cx, 6, rdma.StatusRemInvReqErr)
	if got := h.batches(); len(got) != 0 {
		t.Fatalf("the handler was handed %v", got)
	}
}

// drainNoWait, a link reader's way of writing what handlers posted, never
// waits for a peer that reads nothing: what the socket does not take at
// once is written by a goroutine, whole and in order.
func TestDrainNoWaitDoesNotBlock(t *testing.T) {
	c, peer := tcpPair(t)
	var spawned sync.WaitGroup
	var w linkWriter
	w.init(c.(*net.TCPConn), func(error) { c.Close() }, &spawned)
	// Far more than the socket buffers hold, with nobody reading.
	frames := make([]byte, 32<<20)
	for i := range frames {
		frames[i] = byte(i * 7)
	}
	if held, took := w.hold(frames, nil); !held || !took {
		t.Fatalf("hold on an idle writer: held %v, took the role %v", held, took)
	}
	returned := make(chan struct{})
	go func() {
		w.drainNoWait()
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("drainNoWait blocked on a peer that reads nothing")
	}
	got, err := io.ReadAll(io.LimitReader(peer, int64(len(frames))))
	if err != nil || !bytes.Equal(got, frames) {
		t.Fatalf("the peer read %d of %d bytes (equal: %v), err %v", len(got), len(frames), bytes.Equal(got, frames), err)
	}
	spawned.Wait()
	if w.busy() {
		t.Error("the flusher role is still held after everything was written")
	}
}

// The RECV completions a handler declines are queued on their CQs, as
// though it had not been set; those it keeps are not.
func TestRecvHandlerDeclines(t *testing.T) {
	const n = 4
	p := newIdlePair(t, n)
	h := &recordingHandler{t: t, p: p, decline: true}
	for i, q := range p.qps {
		q.cy.(rdma.RecvHandling).SetRecvHandler(h, i)
		postRecv(t, q.y, rdma.RecvWR{ID: 100 + uint64(i), SGL: sgl(q.remote, 0, 64)})
	}
	sendTogether(t, p)
	for i, q := range p.qps {
		expectStatus(t, q.cx, 1, rdma.StatusSuccess)
		if i%2 == 0 {
			expectNone(t, q.cy, 20*time.Millisecond)
			continue
		}
		wc := expectStatus(t, q.cy, 100+uint64(i), rdma.StatusSuccess)
		if wc.Op != rdma.OpRecv || wc.ByteLen != 16 || wc.QPNum != q.y.Num() {
			t.Errorf("QP %d: the declined RECV came to its CQ as %+v", i, wc)
		}
	}
	if got := h.batches(); len(got) != 1 || len(got[0]) != n {
		t.Errorf("handler calls %v, want one with the %d RECVs", got, n)
	}
}
