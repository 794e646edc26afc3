// Test fixtures: devices, protection domains, connected QP pairs and buffers for the suite.

package rdmatest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// Config says which provider and devices the suite runs against.
type Config struct {
	Provider string // a registered provider name
	// DeviceA and DeviceB name the two devices the QP pairs connect. They
	// may be the same name (loopback through one device). "" means the
	// provider's first device.
	DeviceA, DeviceB string
	// OptionsA and OptionsB are passed to Open for each device.
	OptionsA, OptionsB rdma.Options
	// LargeSize is the size of the large-region case. Default 1 GiB.
	LargeSize int
	// CompletionTimeout bounds every wait for a completion that must come.
	// Default 60s.
	CompletionTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.LargeSize == 0 {
		c.LargeSize = 1 << 30
	}
	if c.CompletionTimeout == 0 {
		c.CompletionTimeout = 60 * time.Second
	}
	return c
}

// side is one end of a connection: its device, PD, CQs and QP.
type side struct {
	dev    rdma.Device
	pd     rdma.PD
	sendCQ rdma.CQ
	recvCQ rdma.CQ
	qp     rdma.QP
}

// pair is two connected QPs on DeviceA and DeviceB.
type pair struct {
	cfg  Config
	a, b *side
}

func openDevices(t testing.TB, cfg Config) (rdma.Device, rdma.Device) {
	t.Helper()
	a, err := rdma.Open(cfg.Provider, cfg.DeviceA, cfg.OptionsA)
	if err != nil {
		t.Fatalf("Open(%q, %q): %v", cfg.Provider, cfg.DeviceA, err)
	}
	t.Cleanup(func() { closeOK(t, "device A", a.Close) })
	b, err := rdma.Open(cfg.Provider, cfg.DeviceB, cfg.OptionsB)
	if err != nil {
		t.Fatalf("Open(%q, %q): %v", cfg.Provider, cfg.DeviceB, err)
	}
	t.Cleanup(func() { closeOK(t, "device B", b.Close) })
	return a, b
}

// closeOK closes and reports errors, except ErrClosed: a case may have
// closed the object itself already.
func closeOK(t testing.TB, what string, close func() error) {
	t.Helper()
	if err := close(); err != nil && !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("closing %s: %v", what, err)
	}
}

func newSide(t testing.TB, dev rdma.Device, qcfg rdma.QPConfig) *side {
	t.Helper()
	s := &side{dev: dev}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	t.Cleanup(func() { closeOK(t, "PD", s.pd.Close) })
	s.sendCQ = newCQ(t, dev, 1024)
	s.recvCQ = newCQ(t, dev, 1024)
	qcfg.SendCQ, qcfg.RecvCQ = s.sendCQ, s.recvCQ
	if s.qp, err = s.pd.CreateQP(qcfg); err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	t.Cleanup(func() { closeOK(t, "QP", s.qp.Close) })
	return s
}

func newCQ(t testing.TB, dev rdma.Device, size int) rdma.CQ {
	t.Helper()
	cq, err := dev.CreateCQ(size)
	if err != nil {
		t.Fatalf("CreateCQ(%d): %v", size, err)
	}
	t.Cleanup(func() { closeOK(t, "CQ", cq.Close) })
	return cq
}

// newPair opens fresh devices and connects one QP on each.
func newPair(t testing.TB, cfg Config, qcfg rdma.QPConfig) *pair {
	t.Helper()
	da, db := openDevices(t, cfg)
	p := &pair{cfg: cfg, a: newSide(t, da, qcfg), b: newSide(t, db, qcfg)}
	Connect(t, p.a.qp, p.b.qp)
	return p
}

// Connect brings a and b to RTS against each other, running
// rdma.ConnectQP for both over an in-memory pipe; it fails the test if
// either side fails.
func Connect(t testing.TB, a, b rdma.QP) {
	t.Helper()
	ca, cb := net.Pipe()
	defer ca.Close()
	defer cb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var errB error
	wg.Add(1)
	go func() { defer wg.Done(); _, errB = rdma.ConnectQP(ctx, cb, b) }()
	_, errA := rdma.ConnectQP(ctx, ca, a)
	wg.Wait()
	if err := errors.Join(errA, errB); err != nil {
		t.Fatalf("ConnectQP: %v", err)
	}
	for _, qp := range []rdma.QP{a, b} {
		if st := qp.State(); st != rdma.QPStateRTS {
			t.Fatalf("QP %d in %v after ConnectQP, want RTS", qp.Num(), st)
		}
	}
}

// buffer is registered memory of one side.
type buffer struct {
	mem *rdma.Memory
	mr  rdma.MR
}

// alloc maps size bytes and registers them in pd with access.
func alloc(t testing.TB, pd rdma.PD, size int, access rdma.Access) *buffer {
	t.Helper()
	m, err := rdma.Alloc(size)
	if err != nil {
		t.Fatalf("Alloc(%d): %v", size, err)
	}
	mr, err := pd.Register(m.Bytes(), access)
	if err != nil {
		_ = m.Close()
		t.Fatalf("Register(%d bytes, %v): %v", size, access, err)
	}
	b := &buffer{mem: m, mr: mr}
	t.Cleanup(func() {
		if err := mr.Deregister(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("Deregister: %v", err)
		}
		closeOK(t, "memory", m.Close)
	})
	return b
}

func (b *buffer) bytes() []byte { return b.mem.Bytes() }

func (b *buffer) sge(off, n int) []rdma.SGE { return []rdma.SGE{{MR: b.mr, Offset: off, Length: n}} }

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

// post posts wrs on s's QP, failing the test on a post error.
func (s *side) post(t testing.TB, wrs ...rdma.SendWR) {
	t.Helper()
	if err := s.qp.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

func (s *side) postRecv(t testing.TB, wrs ...rdma.RecvWR) {
	t.Helper()
	if err := s.qp.PostRecv(wrs); err != nil {
		t.Fatalf("PostRecv: %v", err)
	}
}

// await collects exactly n completions from cq within the suite's timeout.
func await(t testing.TB, cfg Config, cq rdma.CQ, n int) []rdma.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.CompletionTimeout)
	defer cancel()
	out := make([]rdma.Completion, 0, n)
	buf := make([]rdma.Completion, 64)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("waiting for completion %d of %d: %v (got %+v)", len(out)+1, n, err, out)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// awaitOne waits for one completion and checks its ID and status.
func awaitOne(t testing.TB, cfg Config, cq rdma.CQ, id uint64, want rdma.Status) rdma.Completion {
	t.Helper()
	c := await(t, cfg, cq, 1)[0]
	if c.ID != id || c.Status != want {
		t.Fatalf("completion = {ID:%d Status:%v Op:%v}, want ID %d with %v", c.ID, c.Status, c.Op, id, want)
	}
	return c
}

// expectNone checks that cq stays empty for a short while.
func expectNone(t testing.TB, cq rdma.CQ, wait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var wc [4]rdma.Completion
	n, err := cq.Wait(ctx, wc[:])
	if n > 0 {
		t.Fatalf("unexpected completions %+v", wc[:n])
	}
	if err == nil {
		t.Fatalf("Wait returned no completion and no error")
	}
}

func equalBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: %d bytes differ from offset %d (len got %d, want %d)", what, len(want), i, len(got), len(want))
	}
}
