// Package postcheck is what both providers check when work requests are
// posted, so that they accept the same requests in the same QP states and
// refuse the others with the same errors: the shape of a request (what
// ibv_post_send and ibv_post_recv refuse with EINVAL) and the QP state.
//
// What a request may touch (its SGEs' MRs, PDs, access and bounds) is not
// checked here: that fails the request with a LOC_PROT_ERR completion, in
// order, as on a NIC, and each provider does it its own way.
package postcheck

import (
	"fmt"

	"github.com/rkv-io/rkv/rdma"
)

// SendState returns nil when a QP in state st accepts PostSend (RTS, and
// ERR, where the requests are flushed), and otherwise the *rdma.PostError
// PostSend returns: rdma.ErrClosed once the QP is closed, rdma.ErrQPState
// in RESET, INIT and RTR.
func SendState(qpn uint32, st rdma.QPState, closed bool) error {
	switch {
	case closed:
		return &rdma.PostError{Err: rdma.ErrClosed}
	case st == rdma.QPStateRTS || st == rdma.QPStateError:
		return nil
	}
	return &rdma.PostError{Err: fmt.Errorf("%w: PostSend on QP %d in %v", rdma.ErrQPState, qpn, st)}
}

// RecvState is SendState for PostRecv, which INIT and RTR accept too.
func RecvState(qpn uint32, st rdma.QPState, closed bool) error {
	switch {
	case closed:
		return &rdma.PostError{Err: rdma.ErrClosed}
	case st != rdma.QPStateReset:
		return nil
	}
	return &rdma.PostError{Err: fmt.Errorf("%w: PostRecv on QP %d in %v", rdma.ErrQPState, qpn, st)}
}

// Send checks the shape of a send-queue request on a QP allowing maxSGE
// SGEs per request and messages of at most maxMessage bytes: a send opcode,
// known flags, the SGL (see SGL), and for an atomic exactly one 8-byte SGE
// for its result. It returns the request's length, or an error wrapping
// rdma.ErrInvalidWR.
func Send(wr *rdma.SendWR, maxSGE, maxMessage int) (int, error) {
	switch wr.Op {
	case rdma.OpWrite, rdma.OpWriteImm, rdma.OpSend, rdma.OpSendImm, rdma.OpRead, rdma.OpCompareSwap, rdma.OpFetchAdd:
	default:
		return 0, fmt.Errorf("%w: opcode %v cannot be posted to a send queue", rdma.ErrInvalidWR, wr.Op)
	}
	if wr.Flags&^(rdma.Signaled|rdma.Fence) != 0 {
		return 0, fmt.Errorf("%w: unknown send flags %#x", rdma.ErrInvalidWR, uint8(wr.Flags))
	}
	total, err := SGL(wr.SGL, maxSGE, maxMessage)
	if err != nil {
		return 0, err
	}
	if wr.Op.IsAtomic() && (len(wr.SGL) != 1 || total != 8) {
		return 0, fmt.Errorf("%w: %v needs one 8-byte SGE for its result", rdma.ErrInvalidWR, wr.Op)
	}
	return total, nil
}

// SGL checks a scatter/gather list: at most maxSGE elements, none with a
// negative offset or length, at most maxMessage bytes in all. It returns
// the total length, or an error wrapping rdma.ErrInvalidWR.
func SGL(sgl []rdma.SGE, maxSGE, maxMessage int) (int, error) {
	if len(sgl) > maxSGE {
		return 0, fmt.Errorf("%w: %d SGEs, the QP allows %d", rdma.ErrInvalidWR, len(sgl), maxSGE)
	}
	total := 0
	for i := range sgl {
		if sgl[i].Offset < 0 || sgl[i].Length < 0 {
			return 0, fmt.Errorf("%w: SGE %d has offset %d, length %d", rdma.ErrInvalidWR, i, sgl[i].Offset, sgl[i].Length)
		}
		if sgl[i].Length > maxMessage-total {
			return 0, fmt.Errorf("%w: message longer than %d bytes", rdma.ErrInvalidWR, maxMessage)
		}
		total += sgl[i].Length
	}
	return total, nil
}
