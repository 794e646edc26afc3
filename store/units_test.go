// Arenas registered in units: a unit serves before the others, and nothing is carved where a reader cannot read yet.

package store

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rkv-io/rkv/rdma"
)

// gatedPD holds back every REMOTE_READ registration of unit bytes after
// the first (the first arena's first unit) until gate is closed.
type gatedPD struct {
	rdma.PD
	unit  int
	gate  chan struct{}
	first atomic.Bool
}

func (p *gatedPD) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	if access == rdma.AccessRemoteRead && len(buf) == p.unit && p.first.Swap(true) {
		<-p.gate
	}
	return p.PD.Register(buf, access)
}

func TestLeasesWaitForTheirUnitsRegistration(t *testing.T) {
	opts := smallOptions()
	opts.RegistrationUnit = 1 << 20 // one segment: 4 leases of 256 KiB
	var pd *gatedPD
	gate := func(inner rdma.PD) rdma.PD {
		pd = &gatedPD{PD: inner, unit: int(opts.RegistrationUnit), gate: make(chan struct{})}
		return pd
	}
	// Workers enough for the held-back units and the leases beside them;
	// it returns once the first unit is registered.
	sv := newBareServerWith(t, opts, gate, rdma.RegistrarOptions{Workers: 16})
	open := func() {
		select {
		case <-pd.gate:
		default:
			close(pd.gate)
		}
	}
	t.Cleanup(open) // before shutdown, which waits for the registrations
	if err := sv.s.ActivateShards(AllShards(), 1); err != nil {
		t.Fatal(err)
	}

	if got := sv.s.Arenas(); len(got) != 1 || got[0].ID != 0 || got[0].Offset != 0 {
		t.Fatalf("registered while the others are held back: %+v, want arena 0's first unit alone", got)
	}
	unit := sv.s.Arenas()[0]
	for i := range 4 { // the first unit holds 4 leases
		l, err := sv.s.GrantLease(context.Background(), 256<<10, 0)
		if err != nil {
			t.Fatal(err)
		}
		if l.Arena != 0 || l.Addr < unit.Addr || l.Addr+uint64(l.Size) > unit.Addr+uint64(unit.Length) {
			t.Fatalf("lease %d %+v outside the one registered unit %+v", i, l, unit)
		}
	}
	granted := make(chan Lease, 1)
	go func() {
		l, err := sv.s.GrantLease(context.Background(), 256<<10, 0)
		if err != nil {
			t.Error(err)
		}
		granted <- l
	}()
	select {
	case l := <-granted:
		t.Fatalf("lease %+v granted while only its unit's registration is held back: no reader could read it", l)
	case <-time.After(100 * time.Millisecond):
	}
	open()
	var l Lease
	select {
	case l = <-granted:
	case <-time.After(30 * time.Second):
		t.Fatal("no lease after the registrations went through")
	}
	in := false
	for _, u := range sv.s.Arenas() {
		in = in || u.ID == l.Arena && l.Addr >= u.Addr && l.Addr+uint64(l.Size) <= u.Addr+uint64(u.Length)
	}
	if !in || l.Addr >= unit.Addr && l.Addr < unit.Addr+uint64(unit.Length) {
		t.Fatalf("lease %+v: want it in another registered unit than the first", l)
	}
	waitArenas(t, sv.s, 2)
	if n := len(sv.s.Arenas()); n != 8 {
		t.Fatalf("%d units registered, want 8 (2 arenas of 4 MiB in 1 MiB)", n)
	}
}

// nicePD records the nice value of the thread that registers each arena
// unit (REMOTE_READ registrations of unit bytes), by its address.
type nicePD struct {
	rdma.PD
	unit int
	mu   sync.Mutex
	nice map[uintptr]int
}

func (p *nicePD) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	if access == rdma.AccessRemoteRead && len(buf) == p.unit {
		nice, err := threadNice()
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		p.nice[uintptr(unsafe.Pointer(unsafe.SliceData(buf)))] = nice
		p.mu.Unlock()
	}
	return p.PD.Register(buf, access)
}

// threadNice is the nice value of the calling thread.
func threadNice() (int, error) {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	return 20 - prio, err // the system call's value, unlike nice(1)'s
}

// TestUnitsAfterTheFirstRegisterInTheBackground: the unit a start serves
// first is pinned at the program's priority, the start's others at a
// lower one, so that their pinning yields the CPUs to the serving the
// first made possible; an arena added while serving, because free space
// runs short, at the program's.
func TestUnitsAfterTheFirstRegisterInTheBackground(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	base, err := threadNice()
	if err != nil {
		t.Fatal(err)
	}
	if base >= 19 {
		t.Skipf("the test runs at nice %d: no lower priority to pin at", base)
	}
	opts := smallOptions() // 2 arenas of 2 units
	opts.MaxArenaCount = 3
	var pd *nicePD
	wrap := func(inner rdma.PD) rdma.PD {
		pd = &nicePD{PD: inner, unit: int(opts.RegistrationUnit), nice: map[uintptr]int{}}
		return pd
	}
	sv := newBareServerWith(t, opts, wrap, rdma.RegistrarOptions{})
	waitArenas(t, sv.s, 2)
	sv.s.mu.Lock()
	sv.s.growing = true // as maybeGrowLocked does when free space runs short
	sv.s.wg.Add(1)
	sv.s.mu.Unlock()
	sv.s.grow(2)
	waitArenas(t, sv.s, 3)
	units := sv.s.Arenas()
	if len(units) != 6 {
		t.Fatalf("%d units registered, want 6 (3 arenas of 2)", len(units))
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	for _, u := range units {
		want := min(base+10, 19) // RegistrarOptions.BackgroundNice's default
		if u.ID == 0 && u.Offset == 0 || u.ID == 2 {
			want = base
		}
		if got, ok := pd.nice[uintptr(u.Addr)]; !ok || got != want {
			t.Errorf("arena %d's unit at %d registered at nice %d (seen: %v), want %d (the program's: %d)", u.ID, u.Offset, got, ok, want, base)
		}
	}
}
