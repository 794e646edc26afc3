// Protection domains: they own MRs and QPs, which work only with each other.

package soft

import (
	"fmt"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
)

// Limits of a soft device, as ibv_query_device would report them.
const (
	maxCQSize = 1 << 20
	maxWR     = 1 << 14
	maxSGE    = 64
)

type pd struct {
	dev  *device
	life life.Lifetime // children: MRs and QPs
}

func newPD(d *device) *pd {
	p := &pd{dev: d}
	p.life.InitPD("rdma/soft: PD")
	return p
}

func (p *pd) Close() error {
	return p.life.Close(func() error {
		p.dev.life.Release(life.DevicePDs)
		return nil
	})
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
	if err := p.life.Acquire(life.PDQPs); err != nil {
		return nil, err
	}
	q := newQP(p, cfg, scq, rcq)
	if err := scq.attach(q); err != nil {
		p.life.Release(life.PDQPs)
		return nil, err
	}
	if rcq != scq {
		if err := rcq.attach(q); err != nil {
			scq.detach(q)
			p.life.Release(life.PDQPs)
			return nil, err
		}
	}
	p.dev.addQP(q)
	return q, nil
}
