// Package mem owns the memory that may be registered: page-aligned mappings
// outside the Go heap, tracked so a provider can tell whether a buffer is one,
// keep it mapped while registered, and pin its pages with reference counts.
package mem

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	// ErrNotMapped: see rdma.ErrNotMapped.
	ErrNotMapped = errors.New("rdma: memory not from rdma.Alloc or rdma.MapFile")
	// ErrBusy: see rdma.ErrBusy.
	ErrBusy = errors.New("rdma: resource busy")
	// ErrClosed: see rdma.ErrClosed.
	ErrClosed = errors.New("rdma: closed")
)

// PageSize is the system page size.
var PageSize = os.Getpagesize()

// Memory is a page-aligned mapping outside the Go heap: anonymous memory from
// Alloc or a file mapped MAP_SHARED by MapFile. It never moves.
type Memory struct {
	b    []byte
	addr uintptr
	file bool

	mu     sync.Mutex
	refs   int // live registrations (Refs)
	closed bool
	pins   []uint32 // per-page pin counts, allocated at the first Pin
}

var registry struct {
	sync.RWMutex
	byAddr []*Memory // sorted by addr; mappings never overlap
}

// Alloc maps size bytes of zeroed anonymous memory, rounded up to whole
// pages.
func Alloc(size int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("rdma: Alloc(%d): size must be positive", size)
	}
	n := roundUp(size)
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("rdma: Alloc(%d): mmap: %w", size, err)
	}
	return track(&Memory{b: b[:size:n]}), nil
}

// MapFile maps size bytes of f from offset, which must be a multiple of the
// page size, shared and writable: stores reach the file, and Sync makes them
// durable. The file must be at least offset+size bytes long.
func MapFile(f *os.File, offset int64, size int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("rdma: MapFile(%s, %d, %d): size must be positive", f.Name(), offset, size)
	}
	if offset < 0 || offset%int64(PageSize) != 0 {
		return nil, fmt.Errorf("rdma: MapFile(%s, %d, %d): offset must be a non-negative multiple of %d", f.Name(), offset, size, PageSize)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("rdma: MapFile(%s): %w", f.Name(), err)
	}
	if st.Size() < offset+int64(size) {
		return nil, fmt.Errorf("rdma: MapFile(%s, %d, %d): file is only %d bytes", f.Name(), offset, size, st.Size())
	}
	b, err := unix.Mmap(int(f.Fd()), offset, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("rdma: MapFile(%s, %d, %d): mmap: %w", f.Name(), offset, size, err)
	}
	return track(&Memory{b: b, file: true}), nil
}

func roundUp(n int) int { return (n + PageSize - 1) &^ (PageSize - 1) }

func track(m *Memory) *Memory {
	m.addr = uintptr(unsafe.Pointer(unsafe.SliceData(m.b)))
	registry.Lock()
	defer registry.Unlock()
	i := sort.Search(len(registry.byAddr), func(i int) bool { return registry.byAddr[i].addr > m.addr })
	registry.byAddr = append(registry.byAddr, nil)
	copy(registry.byAddr[i+1:], registry.byAddr[i:])
	registry.byAddr[i] = m
	return m
}

func untrack(m *Memory) {
	registry.Lock()
	defer registry.Unlock()
	for i, x := range registry.byAddr {
		if x == m {
			registry.byAddr = append(registry.byAddr[:i], registry.byAddr[i+1:]...)
			return
		}
	}
}

// lookup returns the live Memory that contains all of [p, p+n).
func lookup(p uintptr, n int) *Memory {
	registry.RLock()
	defer registry.RUnlock()
	i := sort.Search(len(registry.byAddr), func(i int) bool { return registry.byAddr[i].addr > p }) - 1
	if i < 0 {
		return nil
	}
	m := registry.byAddr[i]
	if p+uintptr(n) > m.addr+uintptr(cap(m.b)) {
		return nil
	}
	return m
}

// Bytes returns the mapped memory. It must not be used after Close.
func (m *Memory) Bytes() []byte { return m.b }

// Len returns the mapping's length in bytes.
func (m *Memory) Len() int { return len(m.b) }

// Sync writes the dirty pages of [off, off+n) of a file mapping to the file
// and waits for the device (msync MS_SYNC). It is a no-op for anonymous
// memory.
func (m *Memory) Sync(off, n int) error {
	if !m.file || n == 0 {
		return nil
	}
	if off < 0 || n < 0 || off+n > len(m.b) {
		return fmt.Errorf("rdma: Sync(%d, %d) outside a %d-byte mapping", off, n, len(m.b))
	}
	start := off &^ (PageSize - 1)
	if err := unix.Msync(m.b[start:off+n], unix.MS_SYNC); err != nil {
		return fmt.Errorf("rdma: msync of %d bytes at offset %d: %w", n, off, err)
	}
	return nil
}

// Close unmaps the memory. It fails with ErrBusy while a registration
// covers it, and with ErrClosed the second time.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if m.refs > 0 {
		return fmt.Errorf("rdma: unmap of memory with %d live registrations: %w", m.refs, ErrBusy)
	}
	m.closed = true
	untrack(m)
	if err := unix.Munmap(m.b[:cap(m.b)]); err != nil {
		return fmt.Errorf("rdma: munmap: %w", err)
	}
	return nil
}

// Ref is one registration's hold on a Memory: while it is held, the Memory
// stays mapped and, if pinned, the pages of its buffer stay locked in RAM.
type Ref struct {
	m          *Memory
	first, end int // the pages held, [first, end): pinned if pinned
	pinned     bool
	released   bool
}

// Acquire takes a hold on the Memory that contains buf, or fails with
// ErrNotMapped. With pin, it also locks buf's pages into RAM (mlock),
// counting per page so overlapping registrations pin and unpin correctly;
// when the lock fails it says how to raise RLIMIT_MEMLOCK.
func Acquire(buf []byte, pin bool) (*Ref, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("rdma: cannot register an empty buffer")
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	m := lookup(p, len(buf))
	if m == nil {
		return nil, fmt.Errorf("rdma: %d bytes at %#x: %w", len(buf), p, ErrNotMapped)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("rdma: %d bytes at %#x: %w", len(buf), p, ErrNotMapped)
	}
	m.refs++ // from here Close refuses: the pages stay mapped while they are pinned
	m.mu.Unlock()
	off := int(p - m.addr)
	r := &Ref{m: m, first: off / PageSize, end: (off + len(buf) + PageSize - 1) / PageSize}
	if pin {
		if err := m.pin(r.first, r.end); err != nil {
			m.mu.Lock()
			m.refs--
			m.mu.Unlock()
			return nil, err
		}
		r.pinned = true
	}
	return r, nil
}

// pinChunk is the most pages pin locks under one hold of the mutex: 16 MiB
// of 4 KiB pages, about 1.5 ms of faulting them in from a file here. A
// variable for the tests.
var pinChunk = 4096

// testHookPinChunk, when set, runs after each chunk pin has locked but the
// last, outside the mutex (tests).
var testHookPinChunk func()

// pin locks [first, end) chunk by chunk, taking the mutex for each, so
// that another registration of the same mapping (a lease's region in an
// arena whose units a start is still pinning, at a lower priority: see
// rdma.RegisterRequest.Background) waits for one chunk rather than for
// the whole buffer. On failure it unlocks what it locked.
func (m *Memory) pin(first, end int) error {
	for c := first; c < end; c += pinChunk {
		ce := min(c+pinChunk, end)
		m.mu.Lock()
		err := m.pinLocked(c, ce)
		if err != nil {
			m.unpinLocked(first, c)
		}
		m.mu.Unlock()
		if err != nil {
			return err
		}
		if testHookPinChunk != nil && ce < end {
			testHookPinChunk()
		}
	}
	return nil
}

// PrefaultWrite maps the held pages writable ahead of the writes a
// registration for writing expects, as ibv_reg_mr's pinning does. mlock
// brings the pages of a shared file mapping in read-only, without
// dirtying them, so the first store to each would take a fault on the
// writer's path (7 µs a page in a server's profile here; 0.6 µs each in
// one madvise). Best effort: before Linux 5.14 it does nothing.
func (r *Ref) PrefaultWrite() {
	if r.m.file {
		_ = unix.Madvise(r.m.b[r.first*PageSize:r.end*PageSize], unix.MADV_POPULATE_WRITE)
	}
}

// Release drops the hold. It is safe to call more than once.
func (r *Ref) Release() {
	m := r.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.released {
		return
	}
	r.released = true
	if r.pinned {
		m.unpinLocked(r.first, r.end)
	}
	m.refs--
}

func (m *Memory) pinLocked(first, end int) error {
	if m.pins == nil {
		m.pins = make([]uint32, cap(m.b)/PageSize)
	}
	// Lock the runs of pages that nobody has locked yet.
	for i := first; i < end; {
		if m.pins[i] > 0 {
			i++
			continue
		}
		j := i
		for j < end && m.pins[j] == 0 {
			j++
		}
		if err := unix.Mlock(m.b[i*PageSize : j*PageSize]); err != nil {
			m.unlockRuns(first, i) // undo the runs locked so far
			return memlockError(j*PageSize-i*PageSize, err)
		}
		i = j
	}
	for i := first; i < end; i++ {
		m.pins[i]++
	}
	return nil
}

// unlockRuns munlocks the pages in [first, end) whose count is zero: the
// ones pinLocked locked before failing.
func (m *Memory) unlockRuns(first, end int) {
	for i := first; i < end; i++ {
		if m.pins[i] == 0 {
			_ = unix.Munlock(m.b[i*PageSize : (i+1)*PageSize])
		}
	}
}

func (m *Memory) unpinLocked(first, end int) {
	for i := first; i < end; i++ {
		m.pins[i]--
	}
	for i := first; i < end; {
		if m.pins[i] > 0 {
			i++
			continue
		}
		j := i
		for j < end && m.pins[j] == 0 {
			j++
		}
		_ = unix.Munlock(m.b[i*PageSize : j*PageSize])
		i = j
	}
}

// MemlockError is returned when pages cannot be pinned.
type MemlockError struct {
	Bytes int
	Limit uint64 // RLIMIT_MEMLOCK's soft limit in bytes, or unix.RLIM_INFINITY
	Err   error
}

func (e *MemlockError) Error() string {
	limit := "unlimited"
	if e.Limit != unix.RLIM_INFINITY {
		limit = fmt.Sprintf("%d KiB", e.Limit/1024)
	}
	return fmt.Sprintf("rdma: cannot pin %d bytes (mlock: %v): RLIMIT_MEMLOCK is %s; "+
		"raise it (ulimit -l unlimited, LimitMEMLOCK=infinity in a systemd unit, or memlock in /etc/security/limits.conf) "+
		"or grant CAP_IPC_LOCK", e.Bytes, e.Err, limit)
}

func (e *MemlockError) Unwrap() error { return e.Err }

func memlockError(n int, err error) error {
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim)
	return &MemlockError{Bytes: n, Limit: lim.Cur, Err: err}
}
