package rdma_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// countingPD registers instantly or after a gate opens, and counts
// deregistrations per MR so double or missing deregistrations show.
type countingPD struct {
	rdma.PD
	gate chan struct{} // when non-nil, Register waits for it
	mu   sync.Mutex
	regs int
	mrs  []*countingMR
}

type countingMR struct {
	rdma.MR
	deregs atomic.Int32
}

func (m *countingMR) Deregister() error {
	if m.deregs.Add(1) > 1 {
		return rdma.ErrClosed
	}
	return nil
}

func (pd *countingPD) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	if pd.gate != nil {
		<-pd.gate
	}
	mr := &countingMR{}
	pd.mu.Lock()
	pd.regs++
	pd.mrs = append(pd.mrs, mr)
	pd.mu.Unlock()
	return mr, nil
}

func (pd *countingPD) checkExactlyOnce(t *testing.T) {
	t.Helper()
	pd.mu.Lock()
	defer pd.mu.Unlock()
	for i, mr := range pd.mrs {
		if n := mr.deregs.Load(); n != 1 {
			t.Errorf("MR %d deregistered %d times, want exactly once", i, n)
		}
	}
}

func TestRegistrarDeregistersEachMRExactlyOnce(t *testing.T) {
	pd := &countingPD{}
	r := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: 3})
	var futures []*rdma.Registration
	for range 50 {
		futures = append(futures, r.Register(context.Background(), nil, rdma.AccessRemoteRead))
	}
	for i, f := range futures {
		if _, err := f.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // half released by the user, half left to Close
			if err := f.Release(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := futures[0].Release(); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("second Release = %v, want ErrClosed", err)
	}
	if err := futures[1].Release(); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Release after Close = %v, want ErrClosed", err)
	}
	if pd.regs != 50 {
		t.Errorf("%d registrations, want 50", pd.regs)
	}
	pd.checkExactlyOnce(t)
}

func TestRegistrarCancelWhileRegistering(t *testing.T) {
	pd := &countingPD{gate: make(chan struct{})}
	r := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: 1})
	ctx, cancel := context.WithCancel(context.Background())
	f := r.Register(ctx, nil, rdma.AccessRemoteRead)
	for r.Stats().InFlight != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	close(pd.gate) // the registration finishes after its context ended
	if _, err := f.Wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	pd.checkExactlyOnce(t) // the orphaned MR was deregistered at once
}

func TestRegistrarCloseFailsQueuedWork(t *testing.T) {
	pd := &countingPD{gate: make(chan struct{})}
	r := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: 1})
	running := r.Register(context.Background(), nil, rdma.AccessRemoteRead)
	for r.Stats().InFlight != 1 {
		time.Sleep(time.Millisecond)
	}
	queued := r.RegisterBatch(context.Background(), make([]rdma.RegisterRequest, 5))
	closed := make(chan error)
	go func() { closed <- r.Close() }()
	for _, f := range queued {
		if _, err := f.Wait(context.Background()); !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("queued registration: %v, want ErrClosed", err)
		}
	}
	close(pd.gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, err := running.Wait(context.Background()); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("registration running at Close: %v, want ErrClosed", err)
	}
	if s := r.Stats(); s.Canceled != 6 || s.Done != 0 {
		t.Errorf("stats %+v, want 6 cancelled", s)
	}
	pd.checkExactlyOnce(t)
}

func TestRegistrarReleaseQueued(t *testing.T) {
	pd := &countingPD{gate: make(chan struct{})}
	r := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: 1})
	defer r.Close()
	r.Register(context.Background(), nil, rdma.AccessRemoteRead)
	for r.Stats().InFlight != 1 {
		time.Sleep(time.Millisecond)
	}
	f := r.Register(context.Background(), nil, rdma.AccessRemoteRead)
	if err := f.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Errorf("released queued registration: %v, want context.Canceled", err)
	}
	close(pd.gate)
}

// TestRegistrarSmallGoAhead: a small registration queued behind large
// ones is taken before them; among each, submission order holds.
func TestRegistrarSmallGoAhead(t *testing.T) {
	var mu sync.Mutex
	var order []int // lengths, as the PD registers them
	pd := &orderPD{countingPD: countingPD{gate: make(chan struct{})}, order: func(n int) {
		mu.Lock()
		order = append(order, n)
		mu.Unlock()
	}}
	r := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: 1, SmallBytes: 4096})
	defer r.Close()
	large := func(n int) []byte { return make([]byte, 8192+n) }
	running := r.Register(context.Background(), large(0), rdma.AccessRemoteRead)
	for r.Stats().InFlight != 1 {
		time.Sleep(time.Millisecond)
	}
	fs := []*rdma.Registration{running,
		r.Register(context.Background(), large(1), rdma.AccessRemoteRead),
		r.Register(context.Background(), large(2), rdma.AccessRemoteRead),
		r.Register(context.Background(), make([]byte, 4096), rdma.AccessRemoteWrite),
		r.Register(context.Background(), make([]byte, 100), rdma.AccessRemoteWrite),
	}
	close(pd.gate)
	for _, f := range fs {
		if _, err := f.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int{8192, 4096, 100, 8193, 8194}; !slices.Equal(order, want) {
		t.Fatalf("registered in the order %v (lengths), want %v", order, want)
	}
}

// orderPD is a countingPD that reports each registration's length.
type orderPD struct {
	countingPD
	order func(n int)
}

func (pd *orderPD) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	mr, err := pd.countingPD.Register(buf, access)
	pd.order(len(buf))
	return mr, err
}

// TestRegistrarRegisterIn: a buffer registered in another PD is registered
// there, not in the Registrar's, and is the Registrar's to deregister like
// any other: by Release, or by Close.
func TestRegistrarRegisterIn(t *testing.T) {
	own, other := &countingPD{}, &countingPD{}
	r := rdma.NewRegistrar(own, rdma.RegistrarOptions{Workers: 2})
	released := r.RegisterIn(context.Background(), other, nil, rdma.AccessRemoteWrite)
	kept := r.RegisterIn(context.Background(), other, nil, rdma.AccessRemoteWrite)
	for _, f := range []*rdma.Registration{released, kept} {
		mr, err := f.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := mr.(*countingMR); !ok {
			t.Fatalf("RegisterIn returned %T", mr)
		}
	}
	if err := released.Release(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if own.regs != 0 || other.regs != 2 {
		t.Fatalf("registrations: %d in the Registrar's PD, %d in the other; want 0 and 2", own.regs, other.regs)
	}
	other.checkExactlyOnce(t)
	if st := r.Stats(); st.Done != 2 {
		t.Errorf("Stats().Done = %d, want 2", st.Done)
	}
}
