package postcheck

import (
	"errors"
	"math"
	"testing"

	"github.com/rkv-io/rkv/rdma"
)

// TestStates is the table in rdma.QP's documentation.
func TestStates(t *testing.T) {
	for _, tc := range []struct {
		st         rdma.QPState
		send, recv error
	}{
		{rdma.QPStateReset, rdma.ErrQPState, rdma.ErrQPState},
		{rdma.QPStateInit, rdma.ErrQPState, nil},
		{rdma.QPStateRTR, rdma.ErrQPState, nil},
		{rdma.QPStateRTS, nil, nil},
		{rdma.QPStateError, nil, nil},
	} {
		check := func(what string, err, want error) {
			t.Helper()
			var pe *rdma.PostError
			switch {
			case want == nil && err != nil:
				t.Errorf("%s in %v = %v, want accepted", what, tc.st, err)
			case want != nil && (!errors.Is(err, want) || !errors.As(err, &pe) || pe.Index != 0):
				t.Errorf("%s in %v = %v, want a PostError at 0 wrapping %v", what, tc.st, err, want)
			}
		}
		check("PostSend", SendState(7, tc.st, false), tc.send)
		check("PostRecv", RecvState(7, tc.st, false), tc.recv)
		check("PostSend on a closed QP", SendState(7, tc.st, true), rdma.ErrClosed)
		check("PostRecv on a closed QP", RecvState(7, tc.st, true), rdma.ErrClosed)
	}
}

func TestShapes(t *testing.T) {
	var mr rdma.MR // the checks never look at the MR
	sge := rdma.SGE{MR: mr, Length: 8}
	ok := rdma.SendWR{Op: rdma.OpWrite, Flags: rdma.Signaled | rdma.Fence, SGL: []rdma.SGE{sge, sge}}
	if n, err := Send(&ok, 2, 16); err != nil || n != 16 {
		t.Fatalf("Send(good) = %d, %v", n, err)
	}
	atomic := rdma.SendWR{Op: rdma.OpCompareSwap, SGL: []rdma.SGE{sge}}
	if _, err := Send(&atomic, 2, 16); err != nil {
		t.Fatalf("Send(atomic) = %v", err)
	}
	for what, wr := range map[string]rdma.SendWR{
		"no opcode":          {},
		"RECV opcode":        {Op: rdma.OpRecv},
		"RECV_IMM opcode":    {Op: rdma.OpRecvImm},
		"unknown flags":      {Op: rdma.OpWrite, Flags: 1 << 5},
		"three SGEs":         {Op: rdma.OpWrite, SGL: []rdma.SGE{sge, sge, sge}},
		"negative length":    {Op: rdma.OpWrite, SGL: []rdma.SGE{{Length: -1}}},
		"negative offset":    {Op: rdma.OpRead, SGL: []rdma.SGE{{Offset: -1, Length: 1}}},
		"too long":           {Op: rdma.OpSend, SGL: []rdma.SGE{sge, {Length: 9}}},
		"huge length":        {Op: rdma.OpSend, SGL: []rdma.SGE{sge, {Length: math.MaxInt}}},
		"atomic, no SGE":     {Op: rdma.OpFetchAdd},
		"atomic, 4 bytes":    {Op: rdma.OpFetchAdd, SGL: []rdma.SGE{{Length: 4}}},
		"atomic, two halves": {Op: rdma.OpFetchAdd, SGL: []rdma.SGE{{Length: 4}, {Length: 4}}},
	} {
		if _, err := Send(&wr, 2, 16); !errors.Is(err, rdma.ErrInvalidWR) {
			t.Errorf("Send(%s) = %v, want ErrInvalidWR", what, err)
		}
	}
	if _, err := SGL([]rdma.SGE{sge, sge, sge}, 2, 100); !errors.Is(err, rdma.ErrInvalidWR) {
		t.Errorf("SGL of three with MaxSGE 2 = %v", err)
	}
	if n, err := SGL(nil, 0, 0); n != 0 || err != nil {
		t.Errorf("SGL(nil) = %d, %v", n, err)
	}
}
