// Memory regions and the device's MR table, which the responder consults on every request.

package soft

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
	"github.com/rkv-io/rkv/rdma/internal/mem"
)

type mr struct {
	pd     *pd
	buf    []byte
	addr   uint64
	lkey   uint32
	rkey   uint32
	access rdma.Access
	ref    *mem.Ref

	// inuse is held shared while the NIC copies into or out of buf and
	// exclusively by Deregister, which so waits for copies in progress.
	inuse sync.RWMutex
	dead  atomic.Bool // set by Deregister under inuse
	once  atomic.Bool // Deregister was called
}

func (p *pd) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	if err := access.Validate(); err != nil {
		return nil, err
	}
	if err := p.life.Acquire(life.PDMRs); err != nil {
		return nil, err
	}
	ref, err := mem.Acquire(buf, true)
	if err != nil {
		p.life.Release(life.PDMRs)
		return nil, err
	}
	if access&rdma.AccessRemoteWrite != 0 {
		ref.PrefaultWrite() // the peer's writes find the pages writable
	}
	m := &mr{
		pd:     p,
		buf:    buf,
		addr:   uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		access: access,
		ref:    ref,
		lkey:   p.dev.lkeys.next(),
	}
	p.dev.mrs.add(m, p.dev.rkeys)
	return m, nil
}

func (m *mr) Addr() uint64        { return m.addr }
func (m *mr) Len() int            { return len(m.buf) }
func (m *mr) LKey() uint32        { return m.lkey }
func (m *mr) RKey() uint32        { return m.rkey }
func (m *mr) Access() rdma.Access { return m.access }
func (m *mr) Bytes() []byte       { return m.buf }

// Deregister removes the MR from the table, waits for the copies in
// progress, and only then releases the pinned memory.
func (m *mr) Deregister() error {
	if m.once.Swap(true) {
		return rdma.ErrClosed
	}
	m.pd.dev.mrs.remove(m.rkey)
	m.inuse.Lock()
	m.dead.Store(true)
	m.inuse.Unlock()
	m.ref.Release()
	m.pd.life.Release(life.PDMRs)
	return nil
}

// tryLock holds the MR against deregistration for a copy; it reports
// false, holding nothing, once the MR is deregistered. It only tries: the
// NIC's copies hold their frame's link, and a Deregister under way (it
// waits for the lock) would otherwise wait for a peer that waits for the
// link. Failing then is right, as the MR is as good as gone.
func (m *mr) tryLock() bool {
	if !m.inuse.TryRLock() {
		return false
	}
	if m.dead.Load() {
		m.inuse.RUnlock()
		return false
	}
	return true
}

func (m *mr) unlock() { m.inuse.RUnlock() }

// span returns the offset of [addr, addr+n) in m, or false when the range
// is not entirely inside the MR.
func (m *mr) span(addr uint64, n uint32) (int, bool) {
	if addr < m.addr || uint64(n) > uint64(len(m.buf)) {
		return 0, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf))-uint64(n) {
		return 0, false
	}
	return int(off), true
}

// mrTable maps rkeys to the device's MRs. Lookups take a read lock; the
// responder holds it only for the map access.
type mrTable struct {
	mu sync.RWMutex
	m  map[uint32]*mr
}

func (t *mrTable) add(m *mr, keys *keyGen) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		// keyGen does not repeat, but a key may collide with one of a
		// long-lived MR after 2^32 registrations.
		if k := keys.next(); t.m[k] == nil {
			m.rkey = k
			t.m[k] = m
			return
		}
	}
}

func (t *mrTable) remove(rkey uint32) {
	t.mu.Lock()
	delete(t.m, rkey)
	t.mu.Unlock()
}

func (t *mrTable) lookup(rkey uint32) *mr {
	t.mu.RLock()
	m := t.m[rkey]
	t.mu.RUnlock()
	return m
}
