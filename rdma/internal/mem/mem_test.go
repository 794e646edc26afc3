package mem

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rkv-io/rkv/rdma/internal/memlimit"
)

func TestAcquireRejectsHeapMemory(t *testing.T) {
	if _, err := Acquire(make([]byte, 4096), false); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("Acquire(heap) = %v, want ErrNotMapped", err)
	}
}

func TestAcquireRejectsRangesPastTheMapping(t *testing.T) {
	m, err := Alloc(PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := Acquire(m.Bytes()[:PageSize:PageSize][1:PageSize], false); err != nil {
		t.Fatalf("Acquire inside the mapping: %v", err)
	}
	// A slice reaching past the mapping cannot be built safely, but an
	// unmapped one can: after Close, the memory is unknown.
	m2, _ := Alloc(PageSize)
	b := m2.Bytes()
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(b, false); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("Acquire(unmapped) = %v, want ErrNotMapped", err)
	}
}

func TestPinsAreCountedPerPage(t *testing.T) {
	m, err := Alloc(4 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := Acquire(m.Bytes(), true)
	if err != nil {
		t.Fatal(err)
	}
	middle, err := Acquire(m.Bytes()[PageSize+10:2*PageSize+10], true)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{1, 2, 2, 1}
	for i, n := range m.pins {
		if n != want[i] {
			t.Fatalf("pins %v, want %v", m.pins, want)
		}
	}
	if err := m.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Close with registrations = %v, want ErrBusy", err)
	}
	middle.Release()
	middle.Release() // idempotent
	for i, n := range m.pins {
		if n != 1 {
			t.Fatalf("after releasing the overlap, page %d has %d pins, want 1", i, n)
		}
	}
	whole.Release()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
}

func TestMapFileSharesStoresWithTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "arena")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(2 * PageSize)); err != nil {
		t.Fatal(err)
	}
	if _, err := MapFile(f, 1, PageSize); err == nil {
		t.Error("unaligned offset accepted")
	}
	if _, err := MapFile(f, 0, 3*PageSize); err == nil {
		t.Error("mapping past the end of the file accepted")
	}
	m, err := MapFile(f, int64(PageSize), PageSize)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Bytes()[5:], "durable")
	if err := m.Sync(5, 7); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 7)
	if _, err := f.ReadAt(got, int64(PageSize)+5); err != nil || string(got) != "durable" {
		t.Fatalf("file has %q (%v), want %q", got, err, "durable")
	}
}

// Pinning beyond RLIMIT_MEMLOCK fails with an error that names the limit
// and how to raise it.
func TestPinFailsWithMemlockAdvice(t *testing.T) {
	m, err := Alloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if rerr := memlimit.Run(64<<10, func() error { _, err = Acquire(m.Bytes(), true); return nil }); rerr != nil {
		t.Fatal(rerr)
	}
	var me *MemlockError
	if !errors.As(err, &me) {
		t.Fatalf("pinning 4 MiB under a 64 KiB limit: %v, want a MemlockError", err)
	}
	for _, want := range []string{"RLIMIT_MEMLOCK is 64 KiB", "ulimit -l", "CAP_IPC_LOCK"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for i, n := range m.pins {
		if n != 0 {
			t.Fatalf("page %d still counted pinned after the failure", i)
		}
	}
}

// TestPrefaultWriteTakesTheWritersFaults: pinned pages of a shared file
// mapping are mapped read-only until written, so a first store to each
// faults; after PrefaultWrite the stores take (almost) none.
func TestPrefaultWriteTakesTheWritersFaults(t *testing.T) {
	const pages = 256
	probe, err := Alloc(PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if err := unix.Madvise(probe.Bytes(), unix.MADV_POPULATE_WRITE); errors.Is(err, unix.EINVAL) {
		t.Skipf("this kernel has no MADV_POPULATE_WRITE (Linux 5.14): PrefaultWrite does nothing here")
	}
	faults := func(prefault bool) int64 {
		f, err := os.Create(filepath.Join(t.TempDir(), "arena"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(pages*PageSize)); err != nil {
			t.Fatal(err)
		}
		m, err := MapFile(f, 0, pages*PageSize)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		r, err := Acquire(m.Bytes(), true)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Release()
		if prefault {
			r.PrefaultWrite()
		}
		var before, after unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &before)
		for i := 0; i < pages; i++ {
			m.Bytes()[i*PageSize+1] = 1
		}
		unix.Getrusage(unix.RUSAGE_SELF, &after)
		return after.Minflt - before.Minflt
	}
	without, with := faults(false), faults(true)
	if without < pages/2 || with > pages/8 {
		t.Fatalf("stores to %d pinned pages faulted %d times without PrefaultWrite and %d with it", pages, without, with)
	}
}

// TestPinYieldsBetweenChunks: a large pin holds the mapping's mutex one
// chunk at a time, so another registration of the same mapping goes
// ahead between chunks instead of waiting for the whole buffer, a Close
// meanwhile is refused (the pages are held), and a pin that fails past
// its first chunk unlocks every chunk it locked.
func TestPinYieldsBetweenChunks(t *testing.T) {
	defer func(n int) { pinChunk = n }(pinChunk)
	pinChunk = 16
	chunk := pinChunk * PageSize
	m, err := Alloc(3 * chunk)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	paused, resume := make(chan struct{}), make(chan struct{})
	testHookPinChunk = func() { paused <- struct{}{}; <-resume }
	defer func() { testHookPinChunk = nil }()
	type acquired struct {
		r   *Ref
		err error
	}
	large := make(chan acquired, 1)
	go func() {
		r, err := Acquire(m.Bytes()[:2*chunk], true)
		large <- acquired{r, err}
	}()
	select {
	case <-paused: // the first chunk is pinned, the second not yet
	case a := <-large:
		t.Fatalf("a pin of two chunks returned (%v) without a pause between them", a.err)
	}
	small := make(chan acquired, 1)
	go func() {
		r, err := Acquire(m.Bytes()[2*chunk:][:PageSize], true)
		small <- acquired{r, err}
	}()
	select {
	case a := <-small:
		if a.err != nil {
			t.Fatal(a.err)
		}
		a.r.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("a registration of other pages waited for the whole of a large pin")
	}
	if err := m.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Close during a pin: %v, want ErrBusy", err)
	}
	close(resume)
	a := <-large
	if a.err != nil {
		t.Fatal(a.err)
	}
	for i, n := range m.pins[:3*pinChunk] {
		want := uint32(0)
		if i < 2*pinChunk {
			want = 1
		}
		if n != want {
			t.Fatalf("page %d counted %d pins after pinning pages 0 to %d, want %d", i, n, 2*pinChunk-1, want)
		}
	}
	a.r.Release()

	testHookPinChunk = nil
	limit := uint64(chunk + 2*PageSize) // the first chunk fits, the second not
	if rerr := memlimit.Run(limit, func() error { _, err = Acquire(m.Bytes()[:2*chunk], true); return nil }); rerr != nil {
		t.Fatal(rerr)
	}
	if _, ok := errors.AsType[*MemlockError](err); !ok {
		t.Fatalf("pinning two chunks under a limit of one and two pages: %v, want a MemlockError", err)
	}
	for i, n := range m.pins {
		if n != 0 {
			t.Fatalf("page %d still counted pinned after a failure in the second chunk", i)
		}
	}
}
