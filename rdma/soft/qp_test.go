// Tests of the QP state machine and of post-time validation.

package soft

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

func TestQPStateMachine(t *testing.T) {
	a, b := newSide(t, rdma.QPConfig{}), newSide(t, rdma.QPConfig{})
	q := a.qp
	if q.State() != rdma.QPStateReset {
		t.Fatalf("new QP in %v", q.State())
	}
	info := q.Info()
	if info.Provider != "soft" || info.QPNum != q.Num() || info.Addr == "" || info.MTU <= 0 {
		t.Fatalf("Info %+v", info)
	}
	peer := b.qp.Info()
	if err := q.ModifyToRTR(peer); !errors.Is(err, rdma.ErrQPState) {
		t.Fatalf("RESET->RTR: %v", err)
	}
	if err := q.ModifyToRTS(); !errors.Is(err, rdma.ErrQPState) {
		t.Fatalf("RESET->RTS: %v", err)
	}
	if err := q.ModifyToInit(); err != nil {
		t.Fatal(err)
	}
	if err := q.ModifyToInit(); !errors.Is(err, rdma.ErrQPState) {
		t.Fatalf("INIT->INIT: %v", err)
	}
	if err := q.ModifyToRTS(); !errors.Is(err, rdma.ErrQPState) {
		t.Fatalf("INIT->RTS: %v", err)
	}
	if err := q.ModifyToRTR(rdma.QPInfo{Provider: "verbs", QPNum: 1, Addr: "x"}); err == nil {
		t.Fatal("RTR with a verbs peer accepted")
	}
	if err := q.ModifyToRTR(peer); err != nil {
		t.Fatal(err)
	}
	if q.State() != rdma.QPStateRTR {
		t.Fatalf("state %v", q.State())
	}
	// Manual bring-up in one goroutine: b reaches RTR after a is in RTS.
	if err := q.ModifyToRTS(); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ModifyToInit(); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ModifyToRTR(info); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ModifyToRTS(); err != nil {
		t.Fatal(err)
	}
	m := register(t, a.pd, 64, rw)
	r := register(t, b.pd, 64, rw)
	post(t, q, rdma.SendWR{ID: 1, Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: sgl(m, 0, 8), RemoteAddr: r.Addr(), RKey: r.RKey()})
	expectStatus(t, a.cq, 1, rdma.StatusSuccess)

	if err := q.ModifyToError(); err != nil {
		t.Fatal(err)
	}
	if q.State() != rdma.QPStateError {
		t.Fatalf("state %v", q.State())
	}
	if err := q.ModifyToRTS(); !errors.Is(err, rdma.ErrQPState) {
		t.Fatalf("ERR->RTS: %v", err)
	}
	if err := q.ModifyToError(); err != nil {
		t.Fatalf("ERR->ERR: %v", err)
	}
}

func TestQPNumbersUnique(t *testing.T) {
	s := newSide(t, rdma.QPConfig{})
	seen := map[uint32]bool{s.qp.Num(): true}
	for range 100 {
		q := createQP(t, s.pd, rdma.QPConfig{SendCQ: s.cq, RecvCQ: s.cq})
		if q.Num() == 0 || q.Num() > 0xffffff || seen[q.Num()] {
			t.Fatalf("QP number %d", q.Num())
		}
		seen[q.Num()] = true
	}
}

func TestPostWrongState(t *testing.T) {
	s := newSide(t, rdma.QPConfig{})
	peer := newSide(t, rdma.QPConfig{})
	m := register(t, s.pd, 64, rw)
	send := []rdma.SendWR{{ID: 1, Op: rdma.OpSend, SGL: sgl(m, 0, 8)}}
	recv := []rdma.RecvWR{{ID: 2, SGL: sgl(m, 0, 8)}}
	check := func(err error, want error, what string) {
		t.Helper()
		var pe *rdma.PostError
		if !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, want) {
			t.Fatalf("%s: %v", what, err)
		}
	}
	check(s.qp.PostSend(send), rdma.ErrQPState, "PostSend in RESET")
	check(s.qp.PostRecv(recv), rdma.ErrQPState, "PostRecv in RESET")
	s.qp.ModifyToInit()
	check(s.qp.PostSend(send), rdma.ErrQPState, "PostSend in INIT")
	if err := s.qp.PostRecv(recv); err != nil {
		t.Fatalf("PostRecv in INIT: %v", err)
	}
	s.qp.ModifyToRTR(peer.qp.Info())
	check(s.qp.PostSend(send), rdma.ErrQPState, "PostSend in RTR")
	if err := s.qp.PostRecv(recv); err != nil {
		t.Fatalf("PostRecv in RTR: %v", err)
	}
	// ERR flushes what was posted and accepts more, flushing it too.
	s.qp.ModifyToError()
	expectStatus(t, s.cq, 2, rdma.StatusWRFlushErr)
	expectStatus(t, s.cq, 2, rdma.StatusWRFlushErr)
	if err := s.qp.PostSend(send); err != nil {
		t.Fatalf("PostSend in ERR: %v", err)
	}
	expectStatus(t, s.cq, 1, rdma.StatusWRFlushErr)
	if err := s.qp.PostRecv(recv); err != nil {
		t.Fatalf("PostRecv in ERR: %v", err)
	}
	expectStatus(t, s.cq, 2, rdma.StatusWRFlushErr)

	q, err := s.pd.CreateQP(rdma.QPConfig{SendCQ: s.cq, RecvCQ: s.cq})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	check(q.PostSend(send), rdma.ErrClosed, "PostSend after Close")
	check(q.PostRecv(recv), rdma.ErrClosed, "PostRecv after Close")
	if err := q.Close(); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if err := q.ModifyToInit(); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Modify after Close: %v", err)
	}
}

func TestPostValidation(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{MaxSendWR: 16, MaxRecvWR: 4, MaxSGE: 2})
	m := register(t, a.pd, 64, rw)
	r := register(t, b.pd, 64, rw)
	ok := rdma.SendWR{ID: 1, Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: sgl(m, 0, 8), RemoteAddr: r.Addr(), RKey: r.RKey()}
	three := []rdma.SGE{{MR: m, Length: 1}, {MR: m, Length: 1}, {MR: m, Length: 1}}
	cases := map[string]rdma.SendWR{
		"opcode 0":          {Op: 0},
		"RECV opcode":       {Op: rdma.OpRecv},
		"unknown opcode":    {Op: 99},
		"too many SGEs":     {Op: rdma.OpWrite, SGL: three},
		"negative length":   {Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: m, Length: -1}}},
		"negative offset":   {Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: m, Offset: -1, Length: 1}}},
		"atomic of 4 bytes": {Op: rdma.OpFetchAdd, SGL: sgl(m, 0, 4)},
		"atomic of 2 SGEs":  {Op: rdma.OpFetchAdd, SGL: []rdma.SGE{{MR: m, Length: 4}, {MR: m, Length: 4}}},
		"unknown flag":      {Op: rdma.OpWrite, Flags: 1 << 5},
		"too long":          {Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: m, Length: MaxMessageSize}, {MR: m, Length: 1}}},
	}
	for name, bad := range cases {
		err := a.qp.PostSend([]rdma.SendWR{ok, bad, ok})
		var pe *rdma.PostError
		if !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, rdma.ErrInvalidWR) {
			t.Errorf("%s: %v", name, err)
		}
		// The request before the bad one was posted, the one after not.
		expectStatus(t, a.cq, 1, rdma.StatusSuccess)
	}
	expectNone(t, a.cq, 20*time.Millisecond)
	if a.qp.State() != rdma.QPStateRTS {
		t.Fatalf("post errors moved the QP to %v", a.qp.State())
	}

	err := a.qp.PostRecv([]rdma.RecvWR{{ID: 1, SGL: three}})
	var pe *rdma.PostError
	if !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, rdma.ErrInvalidWR) {
		t.Fatalf("RECV with 3 SGEs: %v", err)
	}
}

func TestQueueFull(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{MaxSendWR: 4, MaxRecvWR: 4})
	m := register(t, a.pd, 64, rw)
	r := register(t, b.pd, 64, rw)
	wrs := make([]rdma.SendWR, 6)
	for i := range wrs {
		wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(m, 0, 8), RemoteAddr: r.Addr(), RKey: r.RKey()}
	}
	err := a.qp.PostSend(wrs)
	var pe *rdma.PostError
	if !errors.As(err, &pe) || pe.Index != 4 || !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("6 requests on a queue of 4: %v", err)
	}
	for i := range 4 {
		expectStatus(t, a.cq, uint64(i), rdma.StatusSuccess)
	}
	// Completed requests free their slots.
	post(t, a.qp, wrs[:4]...)
	for i := range 4 {
		expectStatus(t, a.cq, uint64(i), rdma.StatusSuccess)
	}

	recvs := make([]rdma.RecvWR, 5)
	for i := range recvs {
		recvs[i] = rdma.RecvWR{ID: uint64(i), SGL: sgl(m, 0, 8)}
	}
	err = a.qp.PostRecv(recvs)
	if !errors.As(err, &pe) || pe.Index != 4 || !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("5 RECVs on a queue of 4: %v", err)
	}
}

// TestCloseWaitsForInlineReader: QP.Close returns only once nothing
// touches the buffers of the QP's requests, including a CQ.Wait reading the
// QP's responses on its own goroutine that is about to land READ data.
func TestCloseWaitsForInlineReader(t *testing.T) {
	for try := 0; ; try++ {
		if try == 20 {
			t.Skip("no Wait read a response inline in 20 tries")
		}
		if closeDuringInlineLand(t) {
			return
		}
	}
}

// closeDuringInlineLand reports false when the response was not read
// inline (the receiver goroutine took it), so the case did not happen.
func closeDuringInlineLand(t *testing.T) bool {
	a, b := newPair(t, rdma.QPConfig{})
	dst := register(t, a.pd, 4096, rw)
	src := register(t, b.pd, 4096, rw)
	landing, proceed := make(chan bool, 1), make(chan struct{})
	testHookLand = func(inline bool) {
		landing <- inline
		if inline {
			<-proceed
		}
	}
	defer func() { testHookLand = nil }()

	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan struct{})
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(dst, 0, 4096), RemoteAddr: src.Addr(), RKey: src.RKey()})
	go func() {
		defer close(waited)
		wc := make([]rdma.Completion, 1)
		_, _ = a.cq.Wait(ctx, wc)
	}()
	defer func() { cancel(); <-waited }()
	if !<-landing {
		return false
	}
	closed := make(chan error, 1)
	go func() { closed <- a.qp.Close() }()
	select {
	case err := <-closed:
		close(proceed)
		t.Fatalf("QP.Close returned (%v) while a Wait was about to land READ data in its buffer", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(proceed)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	return true
}
