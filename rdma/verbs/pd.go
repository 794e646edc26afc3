//go:build verbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
	"github.com/rkv-io/rkv/rdma/internal/mem"
	"golang.org/x/sys/unix"
)

// pd is a protection domain. Besides the application's MRs it owns a guard
// MR, which SGEs naming memory the QP must not touch are pointed past
// (rxe.go, workaround 1).
type pd struct {
	dev *device
	pd  *C.struct_ibv_pd

	life  life.Lifetime // children: MRs and QPs
	guard guard
}

func (d *device) AllocPD() (_ rdma.PD, err error) {
	if err := d.life.Acquire(life.DevicePDs); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.life.Release(life.DevicePDs)
		}
	}()
	p, cerr := C.ibv_alloc_pd(d.ctx)
	if p == nil {
		return nil, fmt.Errorf("rdma/verbs: ibv_alloc_pd(%s): %v", d.name, errnoOr(cerr, "failed"))
	}
	pd := &pd{dev: d, pd: p}
	pd.life.InitPD("rdma/verbs: PD")
	if err := pd.allocGuard(); err != nil {
		C.ibv_dealloc_pd(p)
		return nil, err
	}
	return pd, nil
}

// Close deallocates the PD: ErrBusy while MRs or QPs of it exist. A failed
// ibv_dealloc_pd leaves the PD allocated (with its guard MR registered
// again) and open, so Close may be retried.
func (p *pd) Close() error {
	return p.life.Close(func() error {
		if err := p.freeGuard(); err != nil {
			return life.StillOpen(err)
		}
		if rc := C.ibv_dealloc_pd(p.pd); rc != 0 {
			err := fmt.Errorf("rdma/verbs: ibv_dealloc_pd: %v", syscall.Errno(rc))
			if gerr := p.allocGuard(); gerr != nil {
				err = errors.Join(err, gerr)
			}
			return life.StillOpen(err)
		}
		p.dev.life.Release(life.DevicePDs)
		return nil
	})
}

// mr is a memory region registered with ibv_reg_mr.
type mr struct {
	pd     *pd
	mr     *C.struct_ibv_mr
	buf    []byte
	ref    *mem.Ref
	access rdma.Access
	addr   uint64
	lkey   uint32
	rkey   uint32

	mu   sync.Mutex  // serialises Deregister
	dead atomic.Bool // deregistered: Post redirects SGEs naming it to the guard
}

// Register registers buf, which must lie in one rdma.Alloc or rdma.MapFile
// mapping. The kernel pins the pages itself (ibv_reg_mr), within
// RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK.
func (p *pd) Register(buf []byte, access rdma.Access) (_ rdma.MR, err error) {
	if err := access.Validate(); err != nil {
		return nil, err
	}
	ref, err := mem.Acquire(buf, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ref.Release()
		}
	}()
	if err := p.life.Acquire(life.PDMRs); err != nil {
		return nil, err
	}
	m, cerr := C.rkv_reg_mr(p.pd, unsafe.Pointer(unsafe.SliceData(buf)), C.size_t(len(buf)), C.int(access))
	if m == nil {
		p.life.Release(life.PDMRs)
		return nil, regError(len(buf), access, cerr)
	}
	return &mr{pd: p, mr: m, buf: buf, ref: ref, access: access,
		addr: uint64(uintptr(m.addr)), lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

// regError explains a failed ibv_reg_mr. ENOMEM and EPERM are what the
// kernel returns when pinning would exceed RLIMIT_MEMLOCK.
func regError(n int, access rdma.Access, err error) error {
	if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EPERM) {
		var lim unix.Rlimit
		_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
		return &rdma.MemlockError{Bytes: n, Limit: lim.Cur, Err: fmt.Errorf("ibv_reg_mr: %w", err)}
	}
	return fmt.Errorf("rdma/verbs: ibv_reg_mr of %d bytes with %v: %v", n, access, errnoOr(err, "failed"))
}

func (m *mr) Addr() uint64        { return m.addr }
func (m *mr) Len() int            { return len(m.buf) }
func (m *mr) LKey() uint32        { return m.lkey }
func (m *mr) RKey() uint32        { return m.rkey }
func (m *mr) Access() rdma.Access { return m.access }
func (m *mr) Bytes() []byte       { return m.buf }

// Deregister revokes the region (ibv_dereg_mr) exactly once.
func (m *mr) Deregister() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dead.Load() {
		return rdma.ErrClosed
	}
	if rc := C.ibv_dereg_mr(m.mr); rc != 0 {
		return fmt.Errorf("rdma/verbs: ibv_dereg_mr (lkey %#x): %v", m.lkey, syscall.Errno(rc))
	}
	m.dead.Store(true)
	m.mr = nil
	m.ref.Release()
	m.pd.life.Release(life.PDMRs)
	return nil
}
