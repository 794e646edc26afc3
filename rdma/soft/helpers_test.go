// Test scaffolding: leak checks, devices, connected QP pairs, registered memory.

package soft

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openDev opens a soft device closed at cleanup.
func openDev(t testing.TB) rdma.Device { t.Helper(); return openDevWith(t, rdma.Options{}) }

func openDevWith(t testing.TB, opts rdma.Options) rdma.Device {
	t.Helper()
	d, err := rdma.Open("soft", "", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("device close: %v", err)
		}
	})
	return d
}

func allocPD(t testing.TB, d rdma.Device) rdma.PD {
	t.Helper()
	p, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("PD close: %v", err)
		}
	})
	return p
}

func createCQ(t testing.TB, d rdma.Device, size int) rdma.CQ {
	t.Helper()
	c, err := d.CreateCQ(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("CQ close: %v", err)
		}
	})
	return c
}

func createQP(t testing.TB, p rdma.PD, cfg rdma.QPConfig) rdma.QP {
	t.Helper()
	q, err := p.CreateQP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("QP close: %v", err)
		}
	})
	return q
}

// register maps size bytes with rdma.Alloc and registers them in p.
func register(t testing.TB, p rdma.PD, size int, access rdma.Access) rdma.MR {
	t.Helper()
	mem, err := rdma.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mem.Close(); err != nil {
			t.Errorf("memory close: %v", err)
		}
	})
	m, err := p.Register(mem.Bytes(), access)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Deregister(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("deregister: %v", err)
		}
	})
	return m
}

// side is one end of a test connection.
type side struct {
	dev rdma.Device
	pd  rdma.PD
	cq  rdma.CQ
	qp  rdma.QP
}

// newSide opens a device with one PD, one CQ and one unconnected QP.
func newSide(t testing.TB, cfg rdma.QPConfig) *side {
	t.Helper()
	s := &side{dev: openDev(t)}
	s.pd = allocPD(t, s.dev)
	s.cq = createCQ(t, s.dev, 1024)
	cfg.SendCQ, cfg.RecvCQ = s.cq, s.cq
	s.qp = createQP(t, s.pd, cfg)
	return s
}

// newPair returns two connected sides on two devices.
func newPair(t testing.TB, cfg rdma.QPConfig) (a, b *side) {
	t.Helper()
	a, b = newSide(t, cfg), newSide(t, cfg)
	rdmatest.Connect(t, a.qp, b.qp)
	return a, b
}

// wait returns the next completion of cq, failing the test after 10 s.
func wait(t testing.TB, cq rdma.CQ) rdma.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]rdma.Completion, 1)
	n, err := cq.Wait(ctx, wc)
	if err != nil || n != 1 {
		t.Fatalf("waiting for a completion: n=%d err=%v", n, err)
	}
	return wc[0]
}

// expectNone checks that cq stays empty for d.
func expectNone(t testing.TB, cq rdma.CQ, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	wc := make([]rdma.Completion, 1)
	if n, err := cq.Wait(ctx, wc); n != 0 {
		t.Fatalf("unexpected completion %+v (err %v)", wc[0], err)
	}
}

func post(t testing.TB, q rdma.QP, wrs ...rdma.SendWR) {
	t.Helper()
	if err := q.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
}

func postRecv(t testing.TB, q rdma.QP, wrs ...rdma.RecvWR) {
	t.Helper()
	if err := q.PostRecv(wrs); err != nil {
		t.Fatal(err)
	}
}

// expectStatus waits for a completion of id with status st.
func expectStatus(t testing.TB, cq rdma.CQ, id uint64, st rdma.Status) rdma.Completion {
	t.Helper()
	wc := wait(t, cq)
	if wc.ID != id || wc.Status != st {
		t.Fatalf("completion %d %v, want %d %v", wc.ID, wc.Status, id, st)
	}
	return wc
}

const (
	rw    = rdma.AccessLocalWrite | rdma.AccessRemoteWrite | rdma.AccessRemoteRead
	allRW = rw | rdma.AccessRemoteAtomic
)

func sgl(m rdma.MR, off, n int) []rdma.SGE { return []rdma.SGE{{MR: m, Offset: off, Length: n}} }

// fastFail is a QP configuration that gives a dead peer 200 ms.
var fastFail = rdma.QPConfig{AckTimeout: 50 * time.Millisecond, RetryCount: 3}
