// A control connection's own protection domain, for its leases and its write QP.

package server

import (
	"sync"

	"github.com/rkv-io/rkv/rdma"
)

// leasePD is the PD of one control connection: its leases' regions are
// registered in it (store.GrantLeaseIn) and its write QP is created in it,
// so a lease's rkey works on that one QP. Every other QP of the server is
// in another PD: the readers' QPs in the server's PD, which holds the
// arenas and the index (too large to register per connection), and the
// other connections' write QPs each in their own.
//
// It counts the MRs registered through it, because leases end on more
// goroutines than the connection's own: the store's expirer deregisters an
// expired lease whenever it finds one, perhaps while the connection closes.
// close waits for them.
type leasePD struct {
	rdma.PD

	mu     sync.Mutex
	idle   sync.Cond // signalled when live drops to 0
	live   int       // MRs registered and not yet deregistered
	closed bool
}

func newLeasePD(dev rdma.Device) (*leasePD, error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	p := &leasePD{PD: pd}
	p.idle.L = &p.mu
	return p, nil
}

// Register registers buf in the PD (see rdma.PD) and counts the MR until
// its Deregister. After Close it fails with rdma.ErrClosed.
func (p *leasePD) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, rdma.ErrClosed
	}
	p.live++ // counted while pinning too, so Close waits for it
	p.mu.Unlock()
	mr, err := p.PD.Register(buf, access)
	if err != nil {
		p.uncount()
		return nil, err
	}
	return &leaseMR{MR: mr, pd: p}, nil
}

func (p *leasePD) uncount() {
	p.mu.Lock()
	if p.live--; p.live == 0 {
		p.idle.Broadcast()
	}
	p.mu.Unlock()
}

// Close waits until every MR registered through p is deregistered, then
// closes the PD (rdma.PD.Close). The caller must have ended the
// connection's leases (the store deregisters them, or its expirer is about
// to) and closed its write QP; it may call Close again if the device
// refused.
func (p *leasePD) Close() error {
	p.mu.Lock()
	p.closed = true
	for p.live > 0 {
		p.idle.Wait()
	}
	p.mu.Unlock()
	return p.PD.Close()
}

// leaseMR is an MR of a leasePD.
type leaseMR struct {
	rdma.MR
	pd   *leasePD
	once sync.Once
}

// Deregister deregisters the MR and, the first time, uncounts it, even if
// the provider failed: the PD's Close then says so (ErrBusy) rather than
// the connection waiting for ever.
func (m *leaseMR) Deregister() error {
	err := m.MR.Deregister()
	m.once.Do(m.pd.uncount)
	return err
}
