// Tests of failed requests: remote and local protection, RNR, lengths, and the flush that follows.

package soft

import (
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// remoteFailure posts wr, expects it to fail with st, then checks that the
// QP flushes a later request and that the responder's QP went to ERR too,
// flushing its posted RECV.
func remoteFailure(t *testing.T, a, b *side, local rdma.MR, wr rdma.SendWR, st rdma.Status) {
	t.Helper()
	postRecv(t, b.qp, rdma.RecvWR{ID: 77})
	wr.ID = 1
	later := rdma.SendWR{ID: 2, Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: wr.RemoteAddr, RKey: wr.RKey}
	post(t, a.qp, wr, later)
	expectStatus(t, a.cq, 1, st)
	expectStatus(t, a.cq, 2, rdma.StatusWRFlushErr)
	if a.qp.State() != rdma.QPStateError {
		t.Fatalf("requester in %v", a.qp.State())
	}
	expectStatus(t, b.cq, 77, rdma.StatusWRFlushErr)
	if b.qp.State() != rdma.QPStateError {
		t.Fatalf("responder in %v", b.qp.State())
	}
	// Posting in ERR is accepted and flushed.
	post(t, a.qp, later)
	expectStatus(t, a.cq, 2, rdma.StatusWRFlushErr)
}

func TestRemoteAccessErrors(t *testing.T) {
	type setup struct {
		a, b   *side
		local  rdma.MR
		remote rdma.MR
	}
	mk := func(t *testing.T, access rdma.Access) setup {
		a, b := newPair(t, rdma.QPConfig{})
		return setup{a, b, register(t, a.pd, 4096, rw), register(t, b.pd, 4096, access)}
	}
	read := func(s setup, addr uint64, rkey uint32, n int) rdma.SendWR {
		return rdma.SendWR{Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(s.local, 0, n), RemoteAddr: addr, RKey: rkey}
	}
	write := func(s setup, addr uint64, rkey uint32, n int) rdma.SendWR {
		return rdma.SendWR{Op: rdma.OpWrite, SGL: sgl(s.local, 0, n), RemoteAddr: addr, RKey: rkey}
	}
	cases := []struct {
		name   string
		access rdma.Access
		wr     func(t *testing.T, s setup) rdma.SendWR
		status rdma.Status
	}{
		{"wrong rkey", rw, func(t *testing.T, s setup) rdma.SendWR {
			return read(s, s.remote.Addr(), s.remote.RKey()^0x5a5a, 8)
		}, rdma.StatusRemAccessErr},
		{"read one byte past the end", rw, func(t *testing.T, s setup) rdma.SendWR {
			return read(s, s.remote.Addr()+1, s.remote.RKey(), 4096)
		}, rdma.StatusRemAccessErr},
		{"read before the start", rw, func(t *testing.T, s setup) rdma.SendWR {
			return read(s, s.remote.Addr()-1, s.remote.RKey(), 8)
		}, rdma.StatusRemAccessErr},
		{"write one byte past the end", rw, func(t *testing.T, s setup) rdma.SendWR {
			return write(s, s.remote.Addr()+4096-7, s.remote.RKey(), 8)
		}, rdma.StatusRemAccessErr},
		{"address wraps", rw, func(t *testing.T, s setup) rdma.SendWR {
			return read(s, ^uint64(0)-3, s.remote.RKey(), 8)
		}, rdma.StatusRemAccessErr},
		{"write to read-only MR", rdma.AccessRemoteRead, func(t *testing.T, s setup) rdma.SendWR {
			return write(s, s.remote.Addr(), s.remote.RKey(), 8)
		}, rdma.StatusRemAccessErr},
		{"read without REMOTE_READ", rdma.AccessLocalWrite | rdma.AccessRemoteWrite, func(t *testing.T, s setup) rdma.SendWR {
			return read(s, s.remote.Addr(), s.remote.RKey(), 8)
		}, rdma.StatusRemAccessErr},
		{"atomic without REMOTE_ATOMIC", rw, func(t *testing.T, s setup) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpFetchAdd, SGL: sgl(s.local, 0, 8), RemoteAddr: s.remote.Addr(), RKey: s.remote.RKey(), CompareAdd: 1}
		}, rdma.StatusRemAccessErr},
		{"misaligned atomic", allRW, func(t *testing.T, s setup) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpCompareSwap, SGL: sgl(s.local, 0, 8), RemoteAddr: s.remote.Addr() + 4, RKey: s.remote.RKey()}
		}, rdma.StatusRemInvReqErr},
		{"rkey of another PD", rw, func(t *testing.T, s setup) rdma.SendWR {
			other := register(t, allocPD(t, s.b.dev), 4096, rw)
			return read(s, other.Addr(), other.RKey(), 8)
		}, rdma.StatusRemAccessErr},
		{"rkey of another device", rw, func(t *testing.T, s setup) rdma.SendWR {
			other := register(t, allocPD(t, openDev(t)), 4096, rw)
			return read(s, other.Addr(), other.RKey(), 8)
		}, rdma.StatusRemAccessErr},
		{"deregistered MR", rw, func(t *testing.T, s setup) rdma.SendWR {
			if err := s.remote.Deregister(); err != nil {
				t.Fatal(err)
			}
			return read(s, s.remote.Addr(), s.remote.RKey(), 8)
		}, rdma.StatusRemAccessErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mk(t, c.access)
			remoteFailure(t, s.a, s.b, s.local, c.wr(t, s), c.status)
		})
	}
}

func TestStaleRKeyAfterReregistration(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	local := register(t, a.pd, 64, rw)
	mem, err := rdma.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	old, err := b.pd.Register(mem.Bytes(), rw)
	if err != nil {
		t.Fatal(err)
	}
	old.Deregister()
	fresh, err := b.pd.Register(mem.Bytes(), rw)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Deregister()
	if fresh.RKey() == old.RKey() {
		t.Fatal("rkey reused at once")
	}
	remoteFailure(t, a, b, local, rdma.SendWR{Op: rdma.OpRead, SGL: sgl(local, 0, 8), RemoteAddr: old.Addr(), RKey: old.RKey()}, rdma.StatusRemAccessErr)
}

func TestLocalProtectionErrors(t *testing.T) {
	cases := []struct {
		name string
		wr   func(t *testing.T, a, b *side, remote rdma.MR) rdma.SendWR
	}{
		{"MR of another PD", func(t *testing.T, a, b *side, remote rdma.MR) rdma.SendWR {
			m := register(t, allocPD(t, a.dev), 64, rw)
			return rdma.SendWR{Op: rdma.OpWrite, SGL: sgl(m, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
		{"SGE past the MR", func(t *testing.T, a, b *side, remote rdma.MR) rdma.SendWR {
			m := register(t, a.pd, 4096, rw)
			return rdma.SendWR{Op: rdma.OpWrite, SGL: sgl(m, 4000, 97), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
		{"READ into a read-only MR", func(t *testing.T, a, b *side, remote rdma.MR) rdma.SendWR {
			m := register(t, a.pd, 64, rdma.AccessRemoteRead)
			return rdma.SendWR{Op: rdma.OpRead, SGL: sgl(m, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
		{"atomic result in a read-only MR", func(t *testing.T, a, b *side, remote rdma.MR) rdma.SendWR {
			m := register(t, a.pd, 64, 0)
			return rdma.SendWR{Op: rdma.OpFetchAdd, SGL: sgl(m, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
		{"no MR", func(t *testing.T, a, b *side, remote rdma.MR) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpWrite, SGL: []rdma.SGE{{Length: 8}}, RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
		{"deregistered MR", func(t *testing.T, a, b *side, remote rdma.MR) rdma.SendWR {
			m := register(t, a.pd, 64, rw)
			m.Deregister()
			return rdma.SendWR{Op: rdma.OpWrite, SGL: sgl(m, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := newPair(t, rdma.QPConfig{})
			good := register(t, a.pd, 64, rw)
			remote := register(t, b.pd, 4096, allRW)
			postRecv(t, a.qp, rdma.RecvWR{ID: 50, SGL: sgl(good, 0, 8)})
			bad := c.wr(t, a, b, remote)
			bad.ID = 2
			// The good requests before complete first; the bad one
			// fails locally; everything after is flushed.
			first := rdma.SendWR{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(good, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
			third := first
			third.ID = 3
			if err := a.qp.PostSend([]rdma.SendWR{first, bad, third}); err != nil {
				t.Fatalf("local errors must not be post errors: %v", err)
			}
			expectStatus(t, a.cq, 1, rdma.StatusSuccess)
			expectStatus(t, a.cq, 2, rdma.StatusLocProtErr)
			got := map[uint64]rdma.Status{}
			for range 2 {
				wc := wait(t, a.cq)
				got[wc.ID] = wc.Status
			}
			if got[3] != rdma.StatusWRFlushErr || got[50] != rdma.StatusWRFlushErr {
				t.Fatalf("flush: %v", got)
			}
			if a.qp.State() != rdma.QPStateError {
				t.Fatalf("QP in %v", a.qp.State())
			}
		})
	}
}

func TestRecvLocalErrors(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	src := register(t, a.pd, 64, rw)
	ro := register(t, b.pd, 64, rdma.AccessRemoteRead)
	// A RECV into memory without LOCAL_WRITE fails when a SEND consumes it.
	postRecv(t, b.qp, rdma.RecvWR{ID: 9, SGL: sgl(ro, 0, 64)}, rdma.RecvWR{ID: 10})
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpSend, SGL: sgl(src, 0, 8)})
	expectStatus(t, a.cq, 1, rdma.StatusRemOpErr)
	expectStatus(t, b.cq, 9, rdma.StatusLocProtErr)
	expectStatus(t, b.cq, 10, rdma.StatusWRFlushErr)
}

func TestSendTooLong(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	src := register(t, a.pd, 4096, rw)
	dst := register(t, b.pd, 4096, rw)
	postRecv(t, b.qp, rdma.RecvWR{ID: 9, SGL: []rdma.SGE{{MR: dst, Length: 10}, {MR: dst, Offset: 20, Length: 10}}}, rdma.RecvWR{ID: 10, SGL: sgl(dst, 0, 4096)})
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpSend, SGL: sgl(src, 0, 21)})
	expectStatus(t, a.cq, 1, rdma.StatusRemInvReqErr)
	expectStatus(t, b.cq, 9, rdma.StatusLocLenErr)
	expectStatus(t, b.cq, 10, rdma.StatusWRFlushErr)
}

func TestRNR(t *testing.T) {
	a, b := newPair(t, fastFail)
	src := register(t, a.pd, 64, rw)
	dst := register(t, b.pd, 64, rw)
	start := time.Now()
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpSend, SGL: sgl(src, 0, 8)}, rdma.SendWR{ID: 2, Op: rdma.OpSend, SGL: sgl(src, 0, 8)})
	expectStatus(t, a.cq, 1, rdma.StatusRNRRetryExcErr)
	expectStatus(t, a.cq, 2, rdma.StatusWRFlushErr)
	if d := time.Since(start); d < fastFail.AckTimeout {
		t.Fatalf("RNR after %v: the responder did not wait for a RECV", d)
	}
	// RNR leaves the responder's QP alone: a RECV posted now stays posted.
	time.Sleep(20 * time.Millisecond)
	postRecv(t, b.qp, rdma.RecvWR{ID: 5, SGL: sgl(dst, 0, 8)})
	if b.qp.State() != rdma.QPStateRTS {
		t.Fatalf("responder in %v", b.qp.State())
	}
	expectNone(t, b.cq, 20*time.Millisecond)
}

func TestRNRWaitsForLateRecv(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	src := register(t, a.pd, 64, rw)
	dst := register(t, b.pd, 64, rw)
	copy(src.Bytes(), "late")
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(src, 0, 4)})
	time.Sleep(50 * time.Millisecond)
	postRecv(t, b.qp, rdma.RecvWR{ID: 2, SGL: sgl(dst, 0, 64)})
	expectStatus(t, a.cq, 1, rdma.StatusSuccess)
	expectStatus(t, b.cq, 2, rdma.StatusSuccess)
	if string(dst.Bytes()[:4]) != "late" {
		t.Fatalf("got %q", dst.Bytes()[:4])
	}
}

func TestModifyToErrorFlushes(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	local := register(t, a.pd, 64, rw)
	remote := register(t, b.pd, 64, rw)
	postRecv(t, a.qp, rdma.RecvWR{ID: 1, SGL: sgl(local, 0, 8)}, rdma.RecvWR{ID: 2, SGL: sgl(local, 8, 8)})
	// A SEND with no RECV keeps the send queue busy during ModifyToError.
	post(t, a.qp,
		rdma.SendWR{ID: 3, Op: rdma.OpSend, SGL: sgl(local, 0, 8)},
		rdma.SendWR{ID: 4, Op: rdma.OpWrite, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	if err := a.qp.ModifyToError(); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]bool{1: true, 2: true, 3: true, 4: true}
	var order []uint64
	for range 4 {
		wc := wait(t, a.cq)
		if wc.Status != rdma.StatusWRFlushErr || !want[wc.ID] {
			t.Fatalf("completion %+v", wc)
		}
		delete(want, wc.ID)
		order = append(order, wc.ID)
	}
	// Each queue flushes in order.
	pos := map[uint64]int{}
	for i, id := range order {
		pos[id] = i
	}
	if pos[1] > pos[2] || pos[3] > pos[4] {
		t.Fatalf("flush order %v", order)
	}
}
