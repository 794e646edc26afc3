package rdma_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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

// nicePD is a countingPD that records the nice value of the thread each
// registration runs on, by the buffer's length.
type nicePD struct {
	countingPD
	mu   sync.Mutex
	nice map[int]int
	tid  map[int]int // the thread, by the buffer's length too
}

func (pd *nicePD) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	tid := unix.Gettid()
	nice, err := threadNice(tid)
	if err != nil {
		return nil, err
	}
	pd.mu.Lock()
	pd.nice[len(buf)] = nice
	if pd.tid != nil {
		pd.tid[len(buf)] = tid
	}
	pd.mu.Unlock()
	return pd.countingPD.Register(buf, access)
}

// programNice locks the test's goroutine to its thread, which has the
// program's priority, for the rest of the test, and returns that nice
// value; it skips the test where no lower priority is left to pin at.
func programNice(t *testing.T) int {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	base, err := threadNice(unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	if base >= 19 {
		t.Skipf("the test runs at nice %d: no lower priority to pin at", base)
	}
	return base
}

// threadNice is the nice value of thread tid of this process.
func threadNice(tid int) (int, error) {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	return 20 - prio, err // the system call's value, unlike nice(1)'s
}

// TestRegistrarPinsBackgroundRequestsAtALowerPriority: a Background
// request is pinned on a thread BackgroundNice below the program's, the
// others at the program's, and no thread stays lowered after: the
// threads that pinned in the background ended with their goroutines.
func TestRegistrarPinsBackgroundRequestsAtALowerPriority(t *testing.T) {
	base := programNice(t)
	for _, tc := range []struct {
		name string
		opt  int
		want int
	}{{"default", 0, min(base+10, 19)}, {"BackgroundNice 3", 3, base + 3}, {"BackgroundNice -1", -1, base}} {
		t.Run(tc.name, func(t *testing.T) {
			pd := &nicePD{nice: map[int]int{}}
			r := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: 1, BackgroundNice: tc.opt})
			var reqs []rdma.RegisterRequest
			for n := 1; n <= 32; n++ {
				reqs = append(reqs, rdma.RegisterRequest{Buf: make([]byte, n), Access: rdma.AccessRemoteRead, Background: n%2 == 1})
			}
			for _, f := range r.RegisterBatch(context.Background(), reqs) {
				if _, err := f.Wait(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			pd.mu.Lock()
			defer pd.mu.Unlock()
			for n := 1; n <= 32; n++ {
				want := base
				if n%2 == 1 {
					want = tc.want
				}
				if pd.nice[n] != want {
					t.Errorf("request %d (background: %v) pinned at nice %d, want %d (the program's: %d)", n, n%2 == 1, pd.nice[n], want, base)
				}
			}
			// A thread ends shortly after its goroutine.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				lowered, err := loweredThreads(base)
				if err != nil {
					t.Fatal(err)
				}
				if len(lowered) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("threads %v are still at another nice value than the program's (%d): goroutines may run on them", lowered, base)
				}
			}
		})
	}
}

// TestRegistrarNeverLowersTheMainThread: the runtime never ends the main
// thread, so a Background request whose goroutine lands on it is pinned,
// lowered, on another thread, and the main thread keeps the program's
// priority. (A goroutine on the main thread cannot be arranged: the first
// thread to ask plays it.)
func TestRegistrarNeverLowersTheMainThread(t *testing.T) {
	base := programNice(t)
	var mu sync.Mutex
	main := 0
	defer rdma.SetOnMainThread(func() bool {
		mu.Lock()
		defer mu.Unlock()
		if main == 0 {
			main = unix.Gettid()
		}
		return unix.Gettid() == main
	})()
	pd := &nicePD{nice: map[int]int{}, tid: map[int]int{}}
	r := rdma.NewRegistrar(pd, rdma.RegistrarOptions{Workers: 1})
	f := r.RegisterBatch(context.Background(), []rdma.RegisterRequest{{Buf: make([]byte, 1), Access: rdma.AccessRemoteRead, Background: true}})
	if _, err := f[0].Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if main == 0 {
		t.Fatal("the Registrar never asked whether it was on the main thread")
	}
	if pd.tid[1] == main || pd.nice[1] != min(base+10, 19) {
		t.Fatalf("pinned on thread %d at nice %d; want a thread other than the main one (%d), at nice %d", pd.tid[1], pd.nice[1], main, min(base+10, 19))
	}
	// The thread that played the main one went back to the runtime: it
	// must have the program's priority.
	if nice, err := threadNice(main); err == nil && nice != base {
		t.Fatalf("the main thread %d was left at nice %d, the program's is %d", main, nice, base)
	}
}

// loweredThreads lists this process's threads whose nice value is not base.
func loweredThreads(base int) ([]int, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	var lowered []int
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if nice, err := threadNice(tid); err == nil && nice != base {
			lowered = append(lowered, tid)
		}
	}
	return lowered, nil
}
