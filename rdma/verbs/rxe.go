//go:build verbs

package verbs

// Workarounds: where the device this provider is tested on — rxe
// (Soft-RoCE) in Linux 6.1 with rdma-core 44's userspace driver — or the
// verbs API itself would make the provider break the rdma contract that
// soft keeps, and what the provider does instead. Each names the tests
// that show it; they run in the VM with `make test-rxe` (docs/RXE-VM.md).
//
//  1. The guard MR. An SGE may name memory the device has no lkey for, or
//     an lkey that no longer means what the program thinks: an MR of
//     another provider or PD, a deregistered MR (whose lkey the kernel may
//     hand to the next registration), bytes outside the MR. The contract
//     is a LOC_PROT_ERR completion in order, with the QP moving to ERR
//     (soft does exactly that); failing the post instead would report it
//     out of order, and passing the lkey on could touch another MR's
//     memory. So each PD registers one page with no access, and such an
//     SGE is pointed one byte past its end: the device's own lkey bounds
//     check fails the request, in order. Tests: rdmatest LocalProtection
//     and InvalidWR, TestErrors ("local SGE past the MR", "local SGE of
//     another PD"), TestAtomicEmulation ("result buffer of another PD").
//
//  2. Fencing a request that fails locally. rxe 6.1 loses both completions,
//     about one run in ten, when its requester fails a request on a local
//     SGE while the response to an earlier READ is being processed: the
//     error path runs the completer concurrently with the completer task.
//     A guarded request (1) is therefore posted with IBV_SEND_FENCE, so it
//     starts only once the READs and atomics before it have completed.
//     Test: TestLocalErrorAfterRead (ten rounds). Without the fence, five
//     runs of it (50 rounds) lost completions in four (a Wait that timed
//     out); with it, none did.
//
//  3. Misaligned atomics. librxe refuses an atomic whose remote address is
//     not a multiple of 8 at ibv_post_send (EINVAL), where InfiniBand has
//     the responder NAK it: the request completes with REM_INV_REQ_ERR and
//     both QPs move to ERR, which is what soft does. The provider posts it
//     instead as a 1-byte RDMA_READ with rkey 0 from address 0 into the
//     byte past the guard (1): the peer refuses it (REM_ACCESS_ERR, both
//     QPs to ERR) or, should rkey 0 exist there, the local copy fails
//     (LOC_PROT_ERR); either way nothing is modified anywhere, and Poll
//     reports the failure as REM_INV_REQ_ERR. A remote failure rather than
//     a local one because that is what a device does with a misaligned
//     atomic: the peer's QP fails too, and the request takes the
//     completer's ordinary error path. Tests: rdmatest AtomicMisaligned,
//     TestAtomicEmulation ("misaligned": the peer's word is unchanged);
//     without the emulation both fail at PostSend with EINVAL.
//
//  4. RECVs posted in ERR. rxe flushes its receive queue only when its
//     responder task runs; librxe's post_recv only writes the WQE into the
//     queue it shares with the kernel and makes no system call, so a RECV
//     posted on a QP in ERR would wait for a flush that never comes.
//     PostRecv on a QP known to be in ERR therefore moves it to ERR once
//     more after the post (ibv_modify_qp runs the responder). Sends need
//     nothing: librxe's post_send rings the kernel, whose requester
//     flushes. Tests: rdmatest ErrorFlush (a PostSend and a PostRecv in
//     ERR; without the kick the RECV was still not flushed after 60 s),
//     TestErrors ("recv posted in ERR").
//
// Not worked around, because the difference is the device's and harmless:
// rxe reports a SEND longer than the RECV's buffers, and a RECV buffer it
// cannot use, as REM_OP_ERR at the requester and LOC_QP_OP_ERR on the RECV
// (copy_data returns EINVAL, which its responder treats as a malformed
// WQE), where InfiniBand and soft say REM_INV_REQ_ERR and LOC_LEN_ERR.
// rdmatest SendTooLong accepts either pair; TestResponderErrors logs them.

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/mem"
)

// guard is a PD's guard MR (workaround 1).
type guard struct {
	mem *mem.Memory
	ref *mem.Ref
	mr  *C.struct_ibv_mr
	end C.uint64_t // one past the guard MR: never a valid address for it
}

// allocGuard registers the PD's guard page, with no access.
func (p *pd) allocGuard() error {
	m, err := mem.Alloc(mem.PageSize)
	if err != nil {
		return err
	}
	ref, err := mem.Acquire(m.Bytes(), false)
	if err != nil {
		m.Close()
		return err
	}
	b := m.Bytes()
	g, cerr := C.rkv_reg_mr(p.pd, unsafe.Pointer(unsafe.SliceData(b)), C.size_t(len(b)), 0)
	if g == nil {
		ref.Release()
		m.Close()
		return regError(len(b), 0, cerr)
	}
	p.guard = guard{mem: m, ref: ref, mr: g, end: C.uint64_t(uintptr(g.addr)) + C.uint64_t(g.length)}
	return nil
}

func (p *pd) freeGuard() error {
	if rc := C.ibv_dereg_mr(p.guard.mr); rc != 0 {
		return fmt.Errorf("rdma/verbs: ibv_dereg_mr of the PD's guard MR: %v", syscall.Errno(rc))
	}
	p.guard.ref.Release()
	return p.guard.mem.Close()
}

// guardSGE points dst, an SGE of n bytes, one byte past the PD's guard MR,
// so the device fails its request with LOC_PROT_ERR.
func (q *qp) guardSGE(dst *C.struct_ibv_sge, n int) {
	dst.addr = q.pd.guard.end
	dst.length = C.uint32_t(max(n, 1))
	dst.lkey = q.pd.guard.mr.lkey
}

// adjustSend applies workarounds 2 and 3 to the send request w, filled at
// index i of the post with the SGEs sges (guarded: one of them was pointed
// at the guard). It returns what to post: the opcode, remote address and
// rkey, and whether to fence it.
func (q *qp) adjustSend(i int, w *rdma.SendWR, sges []C.struct_ibv_sge, guarded bool) (op rdma.Opcode, raddr uint64, rkey uint32, fence bool) {
	op, raddr, rkey = w.Op, w.RemoteAddr, w.RKey
	fence = w.Flags&rdma.Fence != 0 || guarded
	if w.Op.IsAtomic() && w.RemoteAddr&7 != 0 {
		op, raddr, rkey = rdma.OpRead, 0, 0
		q.guardSGE(&sges[0], 1)
		q.emu.posting = append(q.emu.posting, emulatedWR{id: w.ID, status: rdma.StatusRemInvReqErr, idx: i})
	}
	return op, raddr, rkey, fence
}

// emulation tracks the requests posted in place of misaligned atomics
// (workaround 3) until their error completions are polled.
type emulation struct {
	mu      sync.Mutex
	posted  []emulatedWR // posted, in posting order
	posting []emulatedWR // filled by the current PostSend (under sendMu), committed once posted
	any     atomic.Bool  // posted is not empty
}

type emulatedWR struct {
	id     uint64
	status rdma.Status // what its completion reports, unless flushed
	idx    int         // index in the PostSend call, until committed
}

// commit records the emulated requests among the first posted ones of
// the current PostSend.
func (e *emulation) commit(posted int) {
	if len(e.posting) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.posting {
		if w.idx < posted {
			e.posted = append(e.posted, w)
		}
	}
	e.posting = e.posting[:0]
	e.any.Store(len(e.posted) > 0)
}

// complete gives the error completion c of an emulated request its status.
// Completions of one QP are polled in posting order, so an emulated
// request's is the first error completion with its ID after it was posted.
func (e *emulation) complete(c *rdma.Completion) {
	if !e.any.Load() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.posted) > 0 && e.posted[0].id == c.ID {
		if c.Status != rdma.StatusWRFlushErr {
			c.Status = e.posted[0].status
		}
		e.posted = e.posted[1:]
		e.any.Store(len(e.posted) > 0)
	}
}

// kickFlush re-applies ERR so the device flushes RECVs posted while the QP
// was already in ERR (workaround 4).
func (q *qp) kickFlush() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		_ = q.toErrorLocked()
	}
}
