//go:build verbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
)

// pollBatch is the number of ibv_wc entries each CQ keeps in C memory for
// ibv_poll_cq; Poll loops when asked for more.
const pollBatch = 32

// cq is a completion queue with its own completion channel. Poll is
// ibv_poll_cq into a reused C array. Wait polls for the device's
// Options.Spin (0 by default) and then sleeps in Go's netpoller on the
// channel's (non-blocking) fd rather than busy-polling on, which on a
// machine with few CPUs would starve a software device such as rxe of the
// CPU time it needs to produce the completion.
type cq struct {
	dev  *device
	cq   *C.struct_ibv_cq
	ch   *C.struct_ibv_comp_channel
	size int

	life life.Lifetime // children: the QPs using the CQ

	mu     sync.Mutex // guards cq use by Poll/arm, wcs, closed
	wcs    []C.struct_ibv_wc
	closed bool // set by Close: Poll and Wait return ErrClosed

	overrun atomic.Bool   // IBV_EVENT_CQ_ERR arrived
	arms    atomic.Uint64 // ibv_req_notify_cq calls, for the tests

	file     *os.File // a dup of the channel fd, in the netpoller
	rc       syscall.RawConn
	ev       *C.struct_rkv_cq_event
	evErr    error
	readFn   func(uintptr) bool
	waitSem  chan struct{} // one sleeper at a time owns the channel
	closedCh chan struct{}
}

func (d *device) CreateCQ(size int) (_ rdma.CQ, err error) {
	if size <= 0 {
		return nil, fmt.Errorf("rdma/verbs: CreateCQ(%d): size must be positive", size)
	}
	if d.lim.maxCQE > 0 && size > d.lim.maxCQE {
		return nil, fmt.Errorf("rdma/verbs: CreateCQ(%d): %s allows at most %d entries", size, d.name, d.lim.maxCQE)
	}
	if err := d.life.Acquire(life.DeviceCQs); err != nil {
		return nil, err
	}
	c := &cq{dev: d, waitSem: make(chan struct{}, 1), closedCh: make(chan struct{})}
	c.life.InitCQ("rdma/verbs: CQ")
	defer func() {
		if err != nil {
			c.free()
			d.life.Release(life.DeviceCQs)
		}
	}()
	ch, cerr := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		return nil, fmt.Errorf("rdma/verbs: ibv_create_comp_channel(%s): %v", d.name, errnoOr(cerr, "failed"))
	}
	c.ch = ch
	if rc := C.rkv_set_nonblock(ch.fd); rc != 0 {
		return nil, fmt.Errorf("rdma/verbs: completion channel fd: %v", syscall.Errno(rc))
	}
	dup, err := syscall.Dup(int(ch.fd))
	if err != nil {
		return nil, fmt.Errorf("rdma/verbs: dup of the completion channel fd: %w", err)
	}
	syscall.CloseOnExec(dup)
	c.file = os.NewFile(uintptr(dup), "rdma-verbs-cq")
	if c.rc, err = c.file.SyscallConn(); err != nil {
		return nil, err
	}
	cqp, cerr := C.ibv_create_cq(d.ctx, C.int(size), nil, ch, 0)
	if cqp == nil {
		return nil, fmt.Errorf("rdma/verbs: ibv_create_cq(%s, %d): %v", d.name, size, errnoOr(cerr, "failed"))
	}
	c.cq = cqp
	c.size = int(cqp.cqe)
	c.ev = (*C.struct_rkv_cq_event)(C.calloc(1, C.sizeof_struct_rkv_cq_event))
	c.wcs = unsafe.Slice((*C.struct_ibv_wc)(C.calloc(pollBatch, C.sizeof_struct_ibv_wc)), pollBatch)
	c.readFn = c.readEvent
	d.objMu.Lock()
	d.cqByPtr[cqp] = c
	d.objMu.Unlock()
	return c, nil
}

// free releases whatever CreateCQ or Close got to allocate.
func (c *cq) free() error {
	if c.cq != nil {
		c.dev.objMu.Lock()
		delete(c.dev.cqByPtr, c.cq)
		c.dev.objMu.Unlock()
		if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
			return fmt.Errorf("rdma/verbs: ibv_destroy_cq: %v", syscall.Errno(rc))
		}
		c.cq = nil
	}
	if c.file != nil {
		c.file.Close()
		c.file = nil
	}
	if c.ch != nil {
		if rc := C.ibv_destroy_comp_channel(c.ch); rc != 0 {
			return fmt.Errorf("rdma/verbs: ibv_destroy_comp_channel: %v", syscall.Errno(rc))
		}
		c.ch = nil
	}
	if c.ev != nil {
		C.free(unsafe.Pointer(c.ev))
		c.ev = nil
	}
	if c.wcs != nil {
		C.free(unsafe.Pointer(&c.wcs[0]))
		c.wcs = nil
	}
	return nil
}

// Close destroys the CQ: ErrBusy while a QP uses it, ErrClosed the second
// time. A Wait in progress returns ErrClosed.
func (c *cq) Close() error {
	return c.life.Close(func() error {
		c.mu.Lock()
		c.closed = true
		close(c.closedCh)
		c.mu.Unlock()

		// Wake a sleeping Wait and wait for it to let go of the channel.
		_ = c.file.SetReadDeadline(time.Unix(1, 0))
		c.waitSem <- struct{}{}
		err := c.free()
		c.dev.life.Release(life.DeviceCQs)
		return err
	})
}

// Poll moves up to len(wc) completions into wc without blocking.
func (c *cq) Poll(wc []rdma.Completion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, rdma.ErrClosed
	}
	return c.pollLocked(wc)
}

func (c *cq) pollLocked(wc []rdma.Completion) (int, error) {
	if c.overrun.Load() {
		return 0, fmt.Errorf("rdma/verbs: CQ of %d entries: %w", c.size, rdma.ErrCQOverrun)
	}
	total := 0
	for total < len(wc) {
		want := min(len(wc)-total, len(c.wcs))
		n := int(C.ibv_poll_cq(c.cq, C.int(want), &c.wcs[0]))
		if n < 0 {
			return total, fmt.Errorf("rdma/verbs: ibv_poll_cq failed (%d): %w", n, rdma.ErrCQOverrun)
		}
		for i := range n {
			c.convert(&c.wcs[i], &wc[total+i])
		}
		total += n
		if n < want {
			break
		}
	}
	return total, nil
}

func (c *cq) convert(w *C.struct_ibv_wc, out *rdma.Completion) {
	*out = rdma.Completion{
		ID:      uint64(w.wr_id),
		Status:  rdma.Status(w.status),
		Op:      wcOpcode(w.opcode),
		ByteLen: uint32(w.byte_len),
		QPNum:   uint32(w.qp_num),
	}
	if w.wc_flags&C.IBV_WC_WITH_IMM != 0 {
		out.HasImm = true
		out.Imm = binary.BigEndian.Uint32((*[4]byte)(unsafe.Pointer(&w.anon0))[:])
	}
	if out.Status != rdma.StatusSuccess {
		c.dev.errorCompletion(out)
	}
}

func wcOpcode(op C.enum_ibv_wc_opcode) rdma.Opcode {
	switch op {
	case C.IBV_WC_SEND:
		return rdma.OpSend
	case C.IBV_WC_RDMA_WRITE:
		return rdma.OpWrite
	case C.IBV_WC_RDMA_READ:
		return rdma.OpRead
	case C.IBV_WC_COMP_SWAP:
		return rdma.OpCompareSwap
	case C.IBV_WC_FETCH_ADD:
		return rdma.OpFetchAdd
	case C.IBV_WC_RECV:
		return rdma.OpRecv
	case C.IBV_WC_RECV_RDMA_WITH_IMM:
		return rdma.OpRecvImm
	}
	return 0
}

// Wait blocks until a completion is available or ctx is done. It polls,
// and keeps polling for the device's Options.Spin; then it follows the
// usual protocol for completion channels: arm (ibv_req_notify_cq) and poll
// again, so a completion that arrived before the arm is not missed; only
// then sleep on the channel fd until the event, which is read and
// acknowledged at once; repeat.
func (c *cq) Wait(ctx context.Context, wc []rdma.Completion) (int, error) {
	if n, err := c.Poll(wc); n > 0 || err != nil || len(wc) == 0 {
		return n, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if c.dev.spin > 0 {
		if n, err := c.spin(ctx, wc); n > 0 || err != nil {
			return n, err
		}
	}
	select {
	case c.waitSem <- struct{}{}:
	case <-ctx.Done():
		return c.pollAfterCancel(ctx, wc)
	case <-c.closedCh:
		return 0, rdma.ErrClosed
	}
	defer func() { <-c.waitSem }()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = c.file.SetReadDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	for {
		n, err := c.pollArmed(wc)
		if n > 0 || err != nil {
			return n, err
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		c.evErr = nil
		err = c.rc.Read(c.readFn)
		switch {
		case err == nil && c.evErr != nil:
			return 0, fmt.Errorf("rdma/verbs: ibv_get_cq_event: %w", c.evErr)
		case err == nil:
			continue
		case ctx.Err() != nil:
			_ = c.file.SetReadDeadline(time.Time{})
			return c.pollAfterCancel(ctx, wc)
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Set by Close, or left over from an earlier sleeper's
			// cancelled context: clear it and look again.
			_ = c.file.SetReadDeadline(time.Time{})
		default:
			if c.isClosed() {
				return 0, rdma.ErrClosed
			}
			return 0, fmt.Errorf("rdma/verbs: waiting on the completion channel: %w", err)
		}
	}
}

// spin polls until a completion comes, ctx ends or the device's spin
// time has passed, yielding the thread to other goroutines between polls.
// It returns what it found, or ctx's error.
func (c *cq) spin(ctx context.Context, wc []rdma.Completion) (int, error) {
	end := time.Now().Add(c.dev.spin)
	for {
		runtime.Gosched()
		if n, err := c.Poll(wc); n > 0 || err != nil {
			return n, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		default:
		}
		if !time.Now().Before(end) {
			return 0, nil
		}
	}
}

func (c *cq) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// pollAfterCancel returns what is there when ctx ended the wait, or
// ctx.Err() when nothing is.
func (c *cq) pollAfterCancel(ctx context.Context, wc []rdma.Completion) (int, error) {
	n, err := c.Poll(wc)
	if n > 0 || err != nil {
		return n, err
	}
	return 0, ctx.Err()
}

// pollArmed polls, and when the CQ is empty arms it and polls once more.
func (c *cq) pollArmed(wc []rdma.Completion) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, rdma.ErrClosed
	}
	n, err := c.pollLocked(wc)
	if n > 0 || err != nil {
		return n, err
	}
	c.arms.Add(1)
	if rc := C.ibv_req_notify_cq(c.cq, 0); rc != 0 {
		return 0, fmt.Errorf("rdma/verbs: ibv_req_notify_cq: %v", syscall.Errno(rc))
	}
	return c.pollLocked(wc)
}

// readEvent is the RawConn.Read callback: it reports done once an event
// was consumed (or reading failed), not done on EAGAIN.
func (c *cq) readEvent(uintptr) bool {
	rc := C.rkv_get_cq_event(c.ch, c.ev)
	switch syscall.Errno(rc) {
	case 0:
		return true
	case syscall.EAGAIN, syscall.EINTR:
		return false
	default:
		c.evErr = syscall.Errno(rc)
		return true
	}
}
