// Tests of devices, PDs, MRs and CQs: validation, keys, lifetimes and busy resources.

package soft

import (
	"context"
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
)

func TestProvider(t *testing.T) {
	names, err := provider{}.Devices()
	if err != nil || len(names) != 1 || names[0] != "soft0" {
		t.Fatalf("Devices() = %v, %v", names, err)
	}
	d := openDev(t)
	if d.Name() != "soft0" || d.Provider() != "soft" {
		t.Fatalf("device %q of %q", d.Name(), d.Provider())
	}
	named, err := rdma.Open("soft", "other", rdma.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if named.Name() != "other" {
		t.Fatalf("name %q", named.Name())
	}
	if err := named.Close(); err != nil {
		t.Fatal(err)
	}
	if err := named.Close(); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if _, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "256.0.0.1:0"}); err == nil {
		t.Fatal("bad listen address accepted")
	}
}

func TestDeviceCloseBusy(t *testing.T) {
	d, err := rdma.Open("soft", "", rdma.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := d.AllocPD()
	c, _ := d.CreateCQ(4)
	if err := d.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Fatalf("close with PD and CQ: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Fatalf("close with CQ: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AllocPD(); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("AllocPD after close: %v", err)
	}
}

func TestRegisterAccessValidation(t *testing.T) {
	p := allocPD(t, openDev(t))
	mem, err := rdma.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	for _, a := range []rdma.Access{rdma.AccessRemoteWrite, rdma.AccessRemoteAtomic, rdma.AccessRemoteRead | rdma.AccessRemoteWrite, 1 << 7} {
		if m, err := p.Register(mem.Bytes(), a); err == nil {
			m.Deregister()
			t.Errorf("access %v accepted", a)
		}
	}
	for _, a := range []rdma.Access{0, rdma.AccessRemoteRead, rdma.AccessLocalWrite, allRW} {
		m, err := p.Register(mem.Bytes(), a)
		if err != nil {
			t.Fatalf("access %v: %v", a, err)
		}
		if m.Access() != a || m.Len() != 4096 || &m.Bytes()[0] != &mem.Bytes()[0] {
			t.Fatalf("MR %v %d", m.Access(), m.Len())
		}
		if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRegisterNotMapped(t *testing.T) {
	p := allocPD(t, openDev(t))
	if _, err := p.Register(make([]byte, 4096), rdma.AccessRemoteRead); !errors.Is(err, rdma.ErrNotMapped) {
		t.Fatalf("heap memory: %v", err)
	}
}

func TestRegisterAddrKeys(t *testing.T) {
	p := allocPD(t, openDev(t))
	mem, err := rdma.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	buf := mem.Bytes()[100:5000]
	seen := map[uint32]bool{}
	live := []rdma.MR{}
	for i := range 2000 {
		m, err := p.Register(buf, rw)
		if err != nil {
			t.Fatal(err)
		}
		if m.Addr() != uint64(uintptr(unsafe.Pointer(&buf[0]))) {
			t.Fatalf("Addr %#x, buffer at %p", m.Addr(), &buf[0])
		}
		if m.RKey() == 0 || seen[m.RKey()] {
			t.Fatalf("registration %d: rkey %#x reused", i, m.RKey())
		}
		seen[m.RKey()] = true
		// Keep some alive, deregister the rest at once: a new rkey
		// must never repeat a dead one.
		if i%10 == 0 {
			live = append(live, m)
		} else if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range live {
		if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
		if err := m.Deregister(); !errors.Is(err, rdma.ErrClosed) {
			t.Fatalf("second Deregister: %v", err)
		}
	}
}

func TestPDCloseBusy(t *testing.T) {
	d := openDev(t)
	p, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mem, _ := rdma.Alloc(4096)
	defer mem.Close()
	m, err := p.Register(mem.Bytes(), rw)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Fatalf("PD close with MR: %v", err)
	}
	if err := mem.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Fatalf("memory close while registered: %v", err)
	}
	m.Deregister()
	c := createCQ(t, d, 8)
	q, err := p.CreateQP(rdma.QPConfig{SendCQ: c, RecvCQ: c})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Fatalf("PD close with QP: %v", err)
	}
	if err := c.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Fatalf("CQ close with QP: %v", err)
	}
	q.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("second PD close: %v", err)
	}
	if _, err := p.Register(mem.Bytes(), rw); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("Register on closed PD: %v", err)
	}
}

func TestCreateQPValidation(t *testing.T) {
	d := openDev(t)
	p := allocPD(t, d)
	c := createCQ(t, d, 8)
	other := createCQ(t, openDev(t), 8)
	for name, cfg := range map[string]rdma.QPConfig{
		"no CQ":         {SendCQ: c},
		"foreign CQ":    {SendCQ: c, RecvCQ: other},
		"too many WRs":  {SendCQ: c, RecvCQ: c, MaxSendWR: maxWR + 1},
		"too many SGEs": {SendCQ: c, RecvCQ: c, MaxSGE: maxSGE + 1},
		"negative":      {SendCQ: c, RecvCQ: c, MaxRecvWR: -1},
	} {
		if q, err := p.CreateQP(cfg); err == nil {
			q.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCQ(t *testing.T) {
	d := openDev(t)
	if _, err := d.CreateCQ(0); err == nil {
		t.Fatal("CQ of size 0 accepted")
	}
	c, err := d.CreateCQ(3)
	if err != nil {
		t.Fatal(err)
	}
	cq := c.(*cq)
	wc := make([]rdma.Completion, 8)
	if n, err := c.Poll(wc); n != 0 || err != nil {
		t.Fatalf("empty poll: %d %v", n, err)
	}
	for i := range 3 {
		cq.push(&rdma.Completion{ID: uint64(i)}, false)
	}
	if n, _ := c.Poll(wc[:2]); n != 2 || wc[0].ID != 0 || wc[1].ID != 1 {
		t.Fatalf("poll: %d %+v", n, wc[:2])
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if n, err := c.Wait(ctx, wc); n != 1 || err != nil || wc[0].ID != 2 {
		t.Fatalf("wait: %d %v %+v", n, err, wc[0])
	}
	cancel()

	// A waiter is woken by a later push.
	done := make(chan rdma.Completion)
	go func() {
		w := make([]rdma.Completion, 1)
		c.Wait(context.Background(), w)
		done <- w[0]
	}()
	time.Sleep(10 * time.Millisecond)
	cq.push(&rdma.Completion{ID: 42}, false)
	if got := <-done; got.ID != 42 {
		t.Fatalf("woken with %+v", got)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Wait(ctx, wc); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on empty CQ: %v", err)
	}

	// Overrun: capacity is at least 3; pushing far more breaks the CQ.
	for i := range 100 {
		cq.push(&rdma.Completion{ID: uint64(i)}, false)
	}
	if _, err := c.Poll(wc); !errors.Is(err, rdma.ErrCQOverrun) {
		t.Fatalf("poll after overrun: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Poll(wc); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("poll after close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, rdma.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}
