// Protection domains: they own MRs and QPs, which work only with each other.

package soft

import (
	"fmt"
	"sync"

	"github.com/rkv-io/rkv/rdma"
)

// Limits of a soft device, as ibv_query_device would report them.
const (
	maxCQSize = 1 << 20
	maxWR     = 1 << 14
	maxSGE    = 64
)

type pd struct {
	dev *device

	mu     sync.Mutex
	mrs    int
	qps    int
	closed bool
}

// hold counts one more MR or QP, unless the PD is closed.
func (p *pd) hold(n *int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return rdma.ErrClosed
	}
	*n++
	return nil
}

func (p *pd) release(n *int) {
	p.mu.Lock()
	*n--
	p.mu.Unlock()
}

func (p *pd) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return rdma.ErrClosed
	}
	if p.mrs > 0 || p.qps > 0 {
		return fmt.Errorf("rdma/soft: PD has %d MRs and %d QPs: %w", p.mrs, p.qps, rdma.ErrBusy)
	}
	p.closed = true
	p.dev.release(&p.dev.pds)
	return nil
}

func (p *pd) CreateQP(cfg rdma.QPConfig) (rdma.QP, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.MaxSendWR > maxWR || cfg.MaxRecvWR > maxWR || cfg.MaxSGE > maxSGE {
		return nil, fmt.Errorf("rdma/soft: QPConfig asks for %d send WRs, %d recv WRs, %d SGEs; the device allows %d, %d, %d",
			cfg.MaxSendWR, cfg.MaxRecvWR, cfg.MaxSGE, maxWR, maxWR, maxSGE)
	}
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.dev != p.dev || rcq.dev != p.dev {
		return nil, fmt.Errorf("rdma/soft: QP's CQs must come from the same soft device as its PD")
	}
	if err := p.hold(&p.qps); err != nil {
		return nil, err
	}
	q := newQP(p, cfg, scq, rcq)
	if err := scq.attach(q); err != nil {
		p.release(&p.qps)
		return nil, err
	}
	if rcq != scq {
		if err := rcq.attach(q); err != nil {
			scq.detach(q)
			p.release(&p.qps)
			return nil, err
		}
	}
	p.dev.addQP(q)
	return q, nil
}
