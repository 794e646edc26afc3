//go:build verbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
	"github.com/rkv-io/rkv/rdma/internal/postcheck"
)

// Transport settings not in rdma.QPConfig.
const (
	// minRNRTimer is the RNR NAK delay this QP asks a requester to wait
	// when a SEND or WRITE_WITH_IMM finds no RECV posted: code 20 of the
	// IB table, 10.24 ms.
	minRNRTimer = 20
	// rnrRetry is how many RNR NAKs a request survives before it completes
	// with RNR_RETRY_EXC_ERR. 7 would mean "retry forever" and hang the
	// sender on a peer that never posts a RECV; 6 bounds the wait to about
	// 7 x 10.24 ms (plus round trips) when the peer is an rkv QP.
	rnrRetry = 6
	// maxRdAtomic caps the READs/atomics in flight per QP (both directions).
	maxRdAtomic = 16
	// hopLimit is the GRH hop limit (IP TTL for RoCEv2).
	hopLimit = 64
)

// ackTimeoutCode returns the IB local ACK timeout exponent n, with a timeout
// of 4.096µs * 2^n, for the smallest such timeout >= d. 0 (infinite) is
// never returned.
func ackTimeoutCode(d time.Duration) uint8 {
	const unit = 4096 * time.Nanosecond
	for n := uint8(1); n < 31; n++ {
		if unit<<n >= d {
			return n
		}
	}
	return 31
}

// retryCount clamps RetryCount to the 3-bit field of verbs.
func retryCount(n int) uint8 { return uint8(min(n, 7)) }

// qp is an RC queue pair. Work requests are built directly in C arrays
// allocated with the QP (MaxSendWR x MaxSGE and MaxRecvWR x MaxSGE) and
// reused, so posting allocates nothing.
type qp struct {
	dev      *device
	pd       *pd
	qp       *C.struct_ibv_qp
	num      uint32
	psn      uint32
	cfg      rdma.QPConfig
	scq, rcq *cq

	state atomic.Uint32 // rdma.QPState: set by Modify*, error completions and async events

	mu     sync.Mutex // serialises Modify*, State and Close; guards closed, attr
	closed bool
	attr   *C.struct_ibv_qp_attr
	iattr  *C.struct_ibv_qp_init_attr

	sendMu sync.Mutex
	swr    []C.struct_ibv_send_wr
	ssge   []C.struct_ibv_sge

	recvMu sync.Mutex
	rwr    []C.struct_ibv_recv_wr
	rsge   []C.struct_ibv_sge

	cmem []unsafe.Pointer // C allocations to free at Close

	emu emulation // requests posted in place of misaligned atomics (rxe.go)
}

func (p *pd) CreateQP(cfg rdma.QPConfig) (_ rdma.QP, err error) {
	cfg, err = cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("rdma/verbs: CreateQP: SendCQ and RecvCQ must be verbs CQs (got %T, %T)", cfg.SendCQ, cfg.RecvCQ)
	}
	if scq.dev != p.dev || rcq.dev != p.dev {
		return nil, fmt.Errorf("rdma/verbs: CreateQP: the CQs belong to another device than the PD")
	}
	lim := p.dev.lim
	if lim.maxQPWR > 0 && (cfg.MaxSendWR > lim.maxQPWR || cfg.MaxRecvWR > lim.maxQPWR) {
		return nil, fmt.Errorf("rdma/verbs: CreateQP: %s allows at most %d work requests per queue (asked %d/%d)", p.dev.name, lim.maxQPWR, cfg.MaxSendWR, cfg.MaxRecvWR)
	}
	if lim.maxSGE > 0 && cfg.MaxSGE > lim.maxSGE {
		return nil, fmt.Errorf("rdma/verbs: CreateQP: %s allows at most %d SGEs per request (asked %d)", p.dev.name, lim.maxSGE, cfg.MaxSGE)
	}
	if err := p.life.Acquire(life.PDQPs); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.life.Release(life.PDQPs)
		}
	}()
	if err := scq.life.Acquire(life.CQQPs); err != nil {
		return nil, fmt.Errorf("rdma/verbs: CreateQP: send CQ: %w", err)
	}
	defer func() {
		if err != nil {
			scq.life.Release(life.CQQPs)
		}
	}()
	if err := rcq.life.Acquire(life.CQQPs); err != nil {
		return nil, fmt.Errorf("rdma/verbs: CreateQP: recv CQ: %w", err)
	}
	defer func() {
		if err != nil {
			rcq.life.Release(life.CQQPs)
		}
	}()

	q := &qp{dev: p.dev, pd: p, cfg: cfg, scq: scq, rcq: rcq, psn: rand.Uint32() & 0xffffff}
	defer func() {
		if err != nil {
			q.freeC()
		}
	}()
	q.attr = (*C.struct_ibv_qp_attr)(q.calloc(1, C.sizeof_struct_ibv_qp_attr))
	q.iattr = (*C.struct_ibv_qp_init_attr)(q.calloc(1, C.sizeof_struct_ibv_qp_init_attr))
	ia := q.iattr
	ia.send_cq = scq.cq
	ia.recv_cq = rcq.cq
	ia.cap.max_send_wr = C.uint32_t(cfg.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(cfg.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(cfg.MaxSGE)
	ia.cap.max_recv_sge = C.uint32_t(cfg.MaxSGE)
	ia.qp_type = C.IBV_QPT_RC
	if cfg.SignalAll {
		ia.sq_sig_all = 1
	}
	h, cerr := C.ibv_create_qp(p.pd, ia)
	if h == nil {
		return nil, fmt.Errorf("rdma/verbs: ibv_create_qp(%s, send %d, recv %d, sge %d): %v", p.dev.name, cfg.MaxSendWR, cfg.MaxRecvWR, cfg.MaxSGE, errnoOr(cerr, "failed"))
	}
	q.qp, q.num = h, uint32(h.qp_num)

	// The device may round the queues up; the C arrays hold what it
	// granted, and a post of more requests than that fails with
	// ErrQueueFull at the first one beyond (they could not all be
	// outstanding at once).
	sw := max(cfg.MaxSendWR, int(ia.cap.max_send_wr), 1)
	rw := max(cfg.MaxRecvWR, int(ia.cap.max_recv_wr), 1)
	sge := max(cfg.MaxSGE, 1)
	q.swr = unsafe.Slice((*C.struct_ibv_send_wr)(q.calloc(sw, C.sizeof_struct_ibv_send_wr)), sw)
	q.ssge = unsafe.Slice((*C.struct_ibv_sge)(q.calloc(sw*sge, C.sizeof_struct_ibv_sge)), sw*sge)
	q.rwr = unsafe.Slice((*C.struct_ibv_recv_wr)(q.calloc(rw, C.sizeof_struct_ibv_recv_wr)), rw)
	q.rsge = unsafe.Slice((*C.struct_ibv_sge)(q.calloc(rw*sge, C.sizeof_struct_ibv_sge)), rw*sge)

	q.state.Store(uint32(rdma.QPStateReset))
	p.dev.objMu.Lock()
	p.dev.qpByPtr[h] = q
	p.dev.qpByNum[q.num] = q
	p.dev.objMu.Unlock()
	return q, nil
}

func (q *qp) calloc(n int, size C.size_t) unsafe.Pointer {
	p := C.calloc(C.size_t(n), size)
	if p == nil {
		panic("rdma/verbs: out of C memory")
	}
	q.cmem = append(q.cmem, p)
	return p
}

func (q *qp) freeC() {
	for _, p := range q.cmem {
		C.free(p)
	}
	q.cmem = nil
	q.swr, q.ssge, q.rwr, q.rsge, q.attr, q.iattr = nil, nil, nil, nil, nil, nil
}

func (q *qp) Num() uint32 { return q.num }

// Info returns what the peer needs: QPN, the initial PSN, LID, GID and the
// port's active MTU.
func (q *qp) Info() rdma.QPInfo {
	return rdma.QPInfo{
		Provider: ProviderName,
		QPNum:    q.num,
		PSN:      q.psn,
		LID:      q.dev.lid,
		GID:      q.dev.gid,
		MTU:      mtuBytes(q.dev.mtu),
	}
}

// State returns the QP's state as the device reports it (ibv_query_qp);
// SQD counts as RTS, SQE as ERR. A QP known to be in ERR (an error
// completion was polled, ModifyToError, an async error event) is reported
// as ERR without asking: QPs never leave ERR, and the device may still say
// RTS just after it wrote the error completion (rxe's completer, in
// rxe_comp.c's COMPST_ERROR, calls do_complete before rxe_qp_error).
func (q *qp) State() rdma.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || rdma.QPState(q.state.Load()) == rdma.QPStateError {
		return rdma.QPStateError
	}
	C.memset(unsafe.Pointer(q.attr), 0, C.sizeof_struct_ibv_qp_attr)
	if rc := C.ibv_query_qp(q.qp, q.attr, C.IBV_QP_STATE, q.iattr); rc != 0 {
		return rdma.QPState(q.state.Load())
	}
	var s rdma.QPState
	switch q.attr.qp_state {
	case C.IBV_QPS_RESET:
		s = rdma.QPStateReset
	case C.IBV_QPS_INIT:
		s = rdma.QPStateInit
	case C.IBV_QPS_RTR:
		s = rdma.QPStateRTR
	case C.IBV_QPS_RTS, C.IBV_QPS_SQD:
		s = rdma.QPStateRTS
	default:
		s = rdma.QPStateError
	}
	q.state.Store(uint32(s))
	return s
}

// modify runs ibv_modify_qp with q.attr (filled by fill after a memset)
// when the tracked state is from, and records to on success.
func (q *qp) modify(from, to rdma.QPState, mask C.int, fill func(a *C.struct_ibv_qp_attr)) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return rdma.ErrClosed
	}
	if cur := rdma.QPState(q.state.Load()); cur != from {
		return fmt.Errorf("rdma/verbs: QP %d: %v -> %v from %v: %w", q.num, from, to, cur, rdma.ErrQPState)
	}
	C.memset(unsafe.Pointer(q.attr), 0, C.sizeof_struct_ibv_qp_attr)
	fill(q.attr)
	if rc := C.ibv_modify_qp(q.qp, q.attr, mask); rc != 0 {
		err := fmt.Errorf("rdma/verbs: QP %d: ibv_modify_qp %v -> %v: %v", q.num, from, to, syscall.Errno(rc))
		if syscall.Errno(rc) == syscall.EINVAL {
			err = fmt.Errorf("%w (%w)", err, rdma.ErrQPState)
		}
		return err
	}
	q.state.Store(uint32(to))
	return nil
}

// ModifyToInit: RESET -> INIT with remote READ, WRITE and atomic access
// enabled on the QP (each MR's own flags still decide).
func (q *qp) ModifyToInit() error {
	return q.modify(rdma.QPStateReset, rdma.QPStateInit,
		C.IBV_QP_STATE|C.IBV_QP_PKEY_INDEX|C.IBV_QP_PORT|C.IBV_QP_ACCESS_FLAGS,
		func(a *C.struct_ibv_qp_attr) {
			a.qp_state = C.IBV_QPS_INIT
			a.pkey_index = 0
			a.port_num = C.uint8_t(q.dev.port)
			a.qp_access_flags = C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_REMOTE_READ | C.IBV_ACCESS_REMOTE_ATOMIC
		})
}

// ModifyToRTR: INIT -> RTR connected to remote. On RoCE the address vector
// carries a GRH with the peer's GID and this device's GID index; on
// InfiniBand the peer's LID. The path MTU is the smaller of both ports'.
func (q *qp) ModifyToRTR(remote rdma.QPInfo) error {
	if remote.Provider != ProviderName {
		return fmt.Errorf("rdma/verbs: QP %d: peer QP uses provider %q, not %q", q.num, remote.Provider, ProviderName)
	}
	if remote.QPNum == 0 || remote.QPNum > 0xffffff || remote.PSN > 0xffffff {
		return fmt.Errorf("rdma/verbs: QP %d: invalid peer QPN %d or PSN %d", q.num, remote.QPNum, remote.PSN)
	}
	if q.dev.ethernet && remote.GID == ([16]byte{}) {
		return fmt.Errorf("rdma/verbs: QP %d: peer QP %d has no GID, which RoCE needs", q.num, remote.QPNum)
	}
	if !q.dev.ethernet && remote.LID == 0 && remote.GID == ([16]byte{}) {
		return fmt.Errorf("rdma/verbs: QP %d: peer QP %d has neither LID nor GID", q.num, remote.QPNum)
	}
	mtu := mtuBytes(q.dev.mtu)
	if remote.MTU > 0 {
		mtu = min(mtu, remote.MTU)
	}
	return q.modify(rdma.QPStateInit, rdma.QPStateRTR,
		C.IBV_QP_STATE|C.IBV_QP_AV|C.IBV_QP_PATH_MTU|C.IBV_QP_DEST_QPN|C.IBV_QP_RQ_PSN|
			C.IBV_QP_MAX_DEST_RD_ATOMIC|C.IBV_QP_MIN_RNR_TIMER,
		func(a *C.struct_ibv_qp_attr) {
			a.qp_state = C.IBV_QPS_RTR
			a.path_mtu = mtuEnum(mtu)
			a.dest_qp_num = C.uint32_t(remote.QPNum)
			a.rq_psn = C.uint32_t(remote.PSN)
			a.max_dest_rd_atomic = C.uint8_t(clampRd(q.dev.lim.maxRdAtom))
			a.min_rnr_timer = minRNRTimer
			ah := &a.ah_attr
			ah.port_num = C.uint8_t(q.dev.port)
			ah.dlid = C.uint16_t(remote.LID)
			if q.dev.ethernet || remote.GID != ([16]byte{}) && remote.LID == 0 {
				ah.is_global = 1
				C.rkv_set_gid(&ah.grh.dgid, (*C.uint8_t)(unsafe.Pointer(&remote.GID[0])))
				ah.grh.sgid_index = C.uint8_t(q.dev.gidIndex)
				ah.grh.hop_limit = hopLimit
			}
		})
}

func clampRd(devMax int) int {
	if devMax <= 0 {
		return 1
	}
	return min(devMax, maxRdAtomic)
}

// ModifyToRTS: RTR -> RTS with the ACK timeout and retry count of the
// QPConfig and the finite RNR retry count described at rnrRetry.
func (q *qp) ModifyToRTS() error {
	return q.modify(rdma.QPStateRTR, rdma.QPStateRTS,
		C.IBV_QP_STATE|C.IBV_QP_TIMEOUT|C.IBV_QP_RETRY_CNT|C.IBV_QP_RNR_RETRY|C.IBV_QP_SQ_PSN|C.IBV_QP_MAX_QP_RD_ATOMIC,
		func(a *C.struct_ibv_qp_attr) {
			a.qp_state = C.IBV_QPS_RTS
			a.sq_psn = C.uint32_t(q.psn)
			a.timeout = C.uint8_t(ackTimeoutCode(q.cfg.AckTimeout))
			a.retry_cnt = C.uint8_t(retryCount(q.cfg.RetryCount))
			a.rnr_retry = rnrRetry
			a.max_rd_atomic = C.uint8_t(clampRd(q.dev.lim.maxInitRdAtom))
		})
}

// ModifyToError moves the QP to ERR from any state; outstanding work is
// flushed with WR_FLUSH_ERR.
func (q *qp) ModifyToError() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return rdma.ErrClosed
	}
	if err := q.toErrorLocked(); err != nil {
		return err
	}
	return nil
}

func (q *qp) toErrorLocked() error {
	C.memset(unsafe.Pointer(q.attr), 0, C.sizeof_struct_ibv_qp_attr)
	q.attr.qp_state = C.IBV_QPS_ERR
	if rc := C.ibv_modify_qp(q.qp, q.attr, C.IBV_QP_STATE); rc != 0 {
		return fmt.Errorf("rdma/verbs: QP %d: ibv_modify_qp -> ERR: %v", q.num, syscall.Errno(rc))
	}
	q.state.Store(uint32(rdma.QPStateError))
	return nil
}

// Close destroys the QP (before its CQs and PD can be closed).
func (q *qp) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return rdma.ErrClosed
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	if rc := C.ibv_destroy_qp(q.qp); rc != 0 {
		return fmt.Errorf("rdma/verbs: QP %d: ibv_destroy_qp: %v", q.num, syscall.Errno(rc))
	}
	q.closed = true
	q.dev.objMu.Lock()
	delete(q.dev.qpByPtr, q.qp)
	if q.dev.qpByNum[q.num] == q {
		delete(q.dev.qpByNum, q.num)
	}
	q.dev.objMu.Unlock()
	q.qp = nil
	q.freeC()
	q.scq.life.Release(life.CQQPs)
	q.rcq.life.Release(life.CQQPs)
	q.pd.life.Release(life.PDQPs)
	q.state.Store(uint32(rdma.QPStateError))
	return nil
}

var wrOpcodes = [...]C.enum_ibv_wr_opcode{
	rdma.OpWrite:       C.IBV_WR_RDMA_WRITE,
	rdma.OpWriteImm:    C.IBV_WR_RDMA_WRITE_WITH_IMM,
	rdma.OpSend:        C.IBV_WR_SEND,
	rdma.OpSendImm:     C.IBV_WR_SEND_WITH_IMM,
	rdma.OpRead:        C.IBV_WR_RDMA_READ,
	rdma.OpCompareSwap: C.IBV_WR_ATOMIC_CMP_AND_SWP,
	rdma.OpFetchAdd:    C.IBV_WR_ATOMIC_FETCH_AND_ADD,
}

// postError builds the *rdma.PostError for the request at index i.
func postError(i int, err error) error { return &rdma.PostError{Index: i, Err: err} }

func postErrno(rc C.int) error {
	switch syscall.Errno(rc) {
	case syscall.ENOMEM:
		return rdma.ErrQueueFull
	case syscall.EINVAL:
		return fmt.Errorf("%w (the device refused it: EINVAL)", rdma.ErrInvalidWR)
	}
	return fmt.Errorf("rdma/verbs: post: %v", syscall.Errno(rc))
}

// maxMessage is the longest message a request may carry: ibv_sge.length
// and ibv_wc.byte_len have 32 bits.
const maxMessage = math.MaxUint32

// fillSGE writes s, whose shape postcheck has checked, into dst. An SGE
// the QP must not use is pointed past the PD's guard MR, so the device
// fails the request with LOC_PROT_ERR like any other local protection
// error (rxe.go, workaround 1); guarded reports that.
func (q *qp) fillSGE(dst *C.struct_ibv_sge, s *rdma.SGE) (guarded bool) {
	m, ok := s.MR.(*mr)
	if !ok || m == nil || m.pd != q.pd || m.dead.Load() || s.Offset > len(m.buf)-s.Length {
		q.guardSGE(dst, s.Length)
		return true
	}
	dst.addr = C.uint64_t(m.addr + uint64(s.Offset))
	dst.length = C.uint32_t(s.Length)
	dst.lkey = C.uint32_t(m.lkey)
	return false
}

// PostSend posts send-queue work requests. A request of the wrong shape
// (see postcheck.Send) stops the post with a *rdma.PostError wrapping
// rdma.ErrInvalidWR; the ones before it are posted. SGEs naming memory
// outside the QP's reach fail at the device with LOC_PROT_ERR (see fillSGE).
func (q *qp) PostSend(wrs []rdma.SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	if err := postcheck.SendState(q.num, rdma.QPState(q.state.Load()), q.closed); err != nil {
		return err
	}
	maxSGE := q.cfg.MaxSGE
	q.emu.posting = q.emu.posting[:0]
	n := 0
	var bad error
	for n < len(wrs) {
		if n == len(q.swr) {
			bad = fmt.Errorf("%w: %d requests in one post, the send queue holds %d", rdma.ErrQueueFull, len(wrs), len(q.swr))
			break
		}
		if bad = q.fillSend(n, &wrs[n], maxSGE); bad != nil {
			break
		}
		n++
	}
	posted := n
	var perr error
	if n > 0 {
		q.swr[n-1].next = nil
		if r := C.rkv_post_send(q.qp, &q.swr[0]); r.err != 0 {
			posted = int(r.bad)
			perr = postError(posted, postErrno(r.err))
		}
	}
	q.emu.commit(posted)
	if perr != nil {
		return perr
	}
	if bad != nil {
		return postError(n, bad)
	}
	return nil
}

// errorCompletion is called by Poll for each error completion of this QP:
// the QP is in ERR now, and an emulated request gets its status.
func (q *qp) errorCompletion(c *rdma.Completion) {
	q.state.Store(uint32(rdma.QPStateError))
	q.emu.complete(c)
}

func (q *qp) fillSend(i int, w *rdma.SendWR, maxSGE int) error {
	if _, err := postcheck.Send(w, maxSGE, maxMessage); err != nil {
		return err
	}
	sges := q.ssge[i*maxSGE : i*maxSGE+len(w.SGL)]
	guarded := false
	for j := range w.SGL {
		guarded = q.fillSGE(&sges[j], &w.SGL[j]) || guarded
	}
	op, raddr, rkey, fence := q.adjustSend(i, w, sges, guarded)
	d := &q.swr[i]
	d.wr_id = C.uint64_t(w.ID)
	if i+1 < len(q.swr) {
		d.next = &q.swr[i+1]
	} else {
		d.next = nil
	}
	if len(sges) > 0 {
		d.sg_list = &sges[0]
	} else {
		d.sg_list = nil
	}
	d.num_sge = C.int(len(sges))
	d.opcode = wrOpcodes[op]
	var flags C.uint
	if w.Flags&rdma.Signaled != 0 {
		flags |= C.IBV_SEND_SIGNALED
	}
	if fence {
		flags |= C.IBV_SEND_FENCE
	}
	d.send_flags = flags
	binary.BigEndian.PutUint32((*[4]byte)(unsafe.Pointer(&d.anon0))[:], w.Imm)
	u := unsafe.Pointer(&d.wr)
	switch op {
	case rdma.OpCompareSwap, rdma.OpFetchAdd:
		*(*uint64)(unsafe.Add(u, C.RKV_WR_ATOMIC_RADDR)) = raddr
		*(*uint64)(unsafe.Add(u, C.RKV_WR_ATOMIC_CMP)) = w.CompareAdd
		*(*uint64)(unsafe.Add(u, C.RKV_WR_ATOMIC_SWAP)) = w.Swap
		*(*uint32)(unsafe.Add(u, C.RKV_WR_ATOMIC_RKEY)) = rkey
	default:
		*(*uint64)(unsafe.Add(u, C.RKV_WR_RDMA_RADDR)) = raddr
		*(*uint32)(unsafe.Add(u, C.RKV_WR_RDMA_RKEY)) = rkey
	}
	return nil
}

// PostRecv posts receive buffers. Recvs may be posted from INIT on. On a
// QP known to be in ERR the QP is moved to ERR once more after the post,
// so the device flushes them (rxe.go, workaround 4).
func (q *qp) PostRecv(wrs []rdma.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	st, err := q.postRecvLocked(wrs)
	if st == rdma.QPStateError {
		q.kickFlush() // takes q.mu: not while holding recvMu (Close's order is mu, recvMu)
	}
	return err
}

func (q *qp) postRecvLocked(wrs []rdma.RecvWR) (rdma.QPState, error) {
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	st := rdma.QPState(q.state.Load())
	if err := postcheck.RecvState(q.num, st, q.closed); err != nil {
		return rdma.QPStateReset, err // nothing to kick
	}
	return st, q.postRecv(wrs)
}

func (q *qp) postRecv(wrs []rdma.RecvWR) error {
	maxSGE := q.cfg.MaxSGE
	n := 0
	var bad error
	for n < len(wrs) {
		if n == len(q.rwr) {
			bad = fmt.Errorf("%w: %d requests in one post, the receive queue holds %d", rdma.ErrQueueFull, len(wrs), len(q.rwr))
			break
		}
		w := &wrs[n]
		if _, bad = postcheck.SGL(w.SGL, maxSGE, maxMessage); bad != nil {
			break
		}
		sges := q.rsge[n*maxSGE : n*maxSGE+len(w.SGL)]
		for j := range w.SGL {
			q.fillSGE(&sges[j], &w.SGL[j])
		}
		d := &q.rwr[n]
		d.wr_id = C.uint64_t(w.ID)
		if n+1 < len(q.rwr) {
			d.next = &q.rwr[n+1]
		}
		if len(sges) > 0 {
			d.sg_list = &sges[0]
		} else {
			d.sg_list = nil
		}
		d.num_sge = C.int(len(sges))
		n++
	}
	if n > 0 {
		q.rwr[n-1].next = nil
		if r := C.rkv_post_recv(q.qp, &q.rwr[0]); r.err != 0 {
			return postError(int(r.bad), postErrno(r.err))
		}
	}
	if bad != nil {
		return postError(n, bad)
	}
	return nil
}
