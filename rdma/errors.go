// Errors returned by the API and its providers.

package rdma

import (
	"errors"
	"fmt"

	"github.com/rkv-io/rkv/rdma/internal/mem"
)

var (
	// ErrClosed is returned by any operation on a closed or deregistered
	// object, and by Registrar futures whose work was cancelled by Close.
	ErrClosed = mem.ErrClosed
	// ErrBusy is returned by Close of an object that others still use: a
	// Device with open PDs or CQs, a PD with MRs or QPs, a CQ attached to
	// a QP, a Memory with registrations.
	ErrBusy = mem.ErrBusy
	// ErrNotMapped is returned by Register for memory that does not come
	// from Alloc or MapFile.
	ErrNotMapped = mem.ErrNotMapped
	// ErrQPState is returned by Post and Modify calls made in a QP state
	// that does not allow them (the QP doc has the table for posts).
	ErrQPState = errors.New("rdma: invalid QP state")
	// ErrQueueFull is returned by Post when the queue has no room: the
	// verbs ENOMEM of ibv_post_send.
	ErrQueueFull = errors.New("rdma: work queue full")
	// ErrInvalidWR is returned by Post for a malformed work request:
	// not a send opcode, unknown flags, more SGEs than QPConfig.MaxSGE, a
	// negative offset or length, a message longer than the provider
	// carries, an atomic without exactly one 8-byte result SGE.
	ErrInvalidWR = errors.New("rdma: invalid work request")
	// ErrNoDevice is returned by Open when no device of the asked provider
	// exists.
	ErrNoDevice = errors.New("rdma: no RDMA device found")
	// ErrCQOverrun is returned by Poll after more completions arrived than
	// the CQ could hold; the CQ is then unusable, as in verbs.
	ErrCQOverrun = errors.New("rdma: completion queue overrun")
)

// PostError is returned by PostSend and PostRecv when a work request was
// refused. Requests before Index were posted; Index and later were not.
type PostError struct {
	Index int // the first request not posted (verbs' bad_wr)
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("rdma: post of request %d: %v", e.Index, e.Err)
}
func (e *PostError) Unwrap() error { return e.Err }

// CompletionError is a failed work completion as an error.
type CompletionError struct {
	ID     uint64
	Status Status
	QPNum  uint32
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("rdma: work request %d on QP %d completed with %v", e.ID, e.QPNum, e.Status)
}
