// Registrar: asynchronous memory registration on a bounded worker pool.

package rdma

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// RegistrarOptions configures a Registrar. Zero fields take the documented
// defaults.
type RegistrarOptions struct {
	// Workers is how many registrations run at once. Pinning is bound by
	// page faults and memory bandwidth, so a few workers saturate a
	// machine. Default: min(4, GOMAXPROCS).
	Workers int
	// SmallBytes is the largest registration that goes ahead of larger
	// ones still queued: a lease's region, say, is not held up behind
	// the arenas of a start that are still waiting to be pinned. Default
	// 16 MiB.
	SmallBytes int
	// BackgroundNice is how far below the program's priority the requests
	// marked Background are pinned: the thread that pins one raises its
	// nice value by this much (to 19 at most), so that the pinning, whose
	// page faults are CPU work in the kernel, yields the CPUs to the rest
	// of the program (and of the machine). Negative: Background requests
	// are pinned like the others. Default 10, which gives such a thread
	// about a tenth of a CPU that a thread of the program wants too.
	BackgroundNice int
}

// Registrar registers memory off the caller's goroutine. Register returns a
// future at once; a bounded pool of workers pins and registers the buffers in
// the order they were submitted, the small ones (RegistrarOptions.SmallBytes)
// ahead of larger ones still queued, those marked Background at a lower CPU
// priority (RegistrarOptions.BackgroundNice). It owns the MRs it produces: each is
// deregistered exactly once, by Registration.Release or, at the latest, by
// Close; the program must not call Deregister on them. All methods of the
// Registrar and of its Registrations are safe for concurrent use with each
// other.
//
// A submitted buffer is the PD's from submission (see PD.Register: it is
// shared with the NIC, not lent): its Memory must stay mapped until the
// registration has failed or its MR has been released.
type Registrar struct {
	pd      PD
	workers int
	small   int
	nice    int // BackgroundNice; 0: Background requests are not set apart

	mu      sync.Mutex
	wake    *sync.Cond
	queue   []*Registration // FIFO of requests no worker has taken
	live    map[*Registration]struct{}
	closed  bool
	running sync.WaitGroup

	inFlight atomic.Int64
	done     atomic.Uint64
	failed   atomic.Uint64
	canceled atomic.Uint64
	bytes    atomic.Uint64
	latency  [LatencyBuckets]atomic.Uint64
	latSum   atomic.Int64 // nanoseconds
}

// NewRegistrar starts a Registrar that registers memory with pd (or, for
// RegisterIn, the PD given there), and its workers; it does not block. The
// Registrar does not own pd: Close the Registrar before the PD.
func NewRegistrar(pd PD, opts RegistrarOptions) *Registrar {
	if opts.Workers <= 0 {
		opts.Workers = min(4, runtime.GOMAXPROCS(0))
	}
	if opts.SmallBytes <= 0 {
		opts.SmallBytes = 16 << 20
	}
	switch {
	case opts.BackgroundNice == 0:
		opts.BackgroundNice = 10
	case opts.BackgroundNice < 0:
		opts.BackgroundNice = 0
	}
	r := &Registrar{pd: pd, workers: opts.Workers, small: opts.SmallBytes, nice: opts.BackgroundNice, live: map[*Registration]struct{}{}}
	r.wake = sync.NewCond(&r.mu)
	r.running.Add(opts.Workers)
	for range opts.Workers {
		go r.work()
	}
	return r
}

// RegisterRequest is one buffer of a batch.
type RegisterRequest struct {
	Buf    []byte
	Access Access
	// Background pins Buf at a lower priority than the program's
	// (RegistrarOptions.BackgroundNice): for memory the program can do
	// without for a while, such as a start's arenas after the first,
	// whose pinning should not take the CPUs from the work that serves
	// meanwhile. The order in which workers take requests is the same.
	Background bool
}

// Register queues buf for registration with access and returns at once:
// it never waits for a worker. Cancelling ctx before a worker has finished
// the registration fails the future with ctx's error and leaves nothing
// registered (a registration being pinned finishes and is deregistered at
// once). After Close the future has already failed with ErrClosed.
func (r *Registrar) Register(ctx context.Context, buf []byte, access Access) *Registration {
	return r.RegisterBatch(ctx, []RegisterRequest{{Buf: buf, Access: access}})[0]
}

// RegisterIn is Register with another PD than the Registrar's: the same
// workers, queue, statistics and ownership (Release, or Close at the
// latest, deregisters the MR). pd must be of the same device and stay open
// until the MR is released or the registration has failed; PD.Close fails
// with ErrBusy before. It lets memory that belongs to one peer (a lease's
// region) be registered in a PD of that peer's own, so that only its QPs
// reach it, without a pool of workers per PD.
func (r *Registrar) RegisterIn(ctx context.Context, pd PD, buf []byte, access Access) *Registration {
	return r.registerBatch(ctx, pd, []RegisterRequest{{Buf: buf, Access: access}})[0]
}

// RegisterBatch queues several buffers at once, in order, under one ctx,
// and returns their futures in the same order. reqs is not kept.
func (r *Registrar) RegisterBatch(ctx context.Context, reqs []RegisterRequest) []*Registration {
	return r.registerBatch(ctx, r.pd, reqs)
}

func (r *Registrar) registerBatch(ctx context.Context, pd PD, reqs []RegisterRequest) []*Registration {
	futures := make([]*Registration, len(reqs))
	now := time.Now()
	for i, req := range reqs {
		f := &Registration{r: r, pd: pd, ctx: ctx, buf: req.Buf, access: req.Access, background: req.Background, queued: now, done: make(chan struct{})}
		// Watch ctx before queueing: a cancel that fires first finds nothing
		// queued, and the worker then sees ctx.Err() itself.
		f.stopWatch = context.AfterFunc(ctx, func() { r.cancelQueued(f) })
		futures[i] = f
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		for _, f := range futures {
			f.complete(nil, ErrClosed)
		}
		return futures
	}
	r.queue = append(r.queue, futures...)
	r.mu.Unlock()
	r.wake.Broadcast()
	return futures
}

// cancelQueued fails f with its context's error if no worker has taken it.
func (r *Registrar) cancelQueued(f *Registration) {
	r.mu.Lock()
	removed := r.unqueueLocked(f)
	r.mu.Unlock()
	if removed {
		f.complete(nil, f.ctx.Err())
	}
}

func (r *Registrar) unqueueLocked(f *Registration) bool {
	for i, q := range r.queue {
		if q == f {
			r.queue = append(r.queue[:i], r.queue[i+1:]...)
			return true
		}
	}
	return false
}

func (r *Registrar) work() {
	defer r.running.Done()
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && !r.closed {
			r.wake.Wait()
		}
		if r.closed {
			r.mu.Unlock()
			return
		}
		i := r.nextLocked()
		f := r.queue[i]
		r.queue = slices.Delete(r.queue, i, i+1)
		r.inFlight.Add(1)
		r.mu.Unlock()

		if f.background && r.nice > 0 {
			r.registerNiced(f)
		} else {
			r.register(f)
		}
		r.inFlight.Add(-1)
	}
}

// registerNiced registers f on a thread of its own, whose priority it
// lowers first (Linux keeps a nice value per thread). The goroutine exits
// locked to the thread, which ends the thread with it, so no other
// goroutine ever runs at that priority; the worker waits for it. Where the
// nice value cannot be read or set, the thread keeps the program's.
//
// The runtime never ends the main thread: lowered, it would stay lowered.
// A goroutine that lands on it keeps it locked, so that it cannot run
// another goroutine, while another thread does the work.
func (r *Registrar) registerNiced(f *Registration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if onMainThread() {
			r.registerNiced(f)
			runtime.UnlockOSThread()
			return
		}
		tid := unix.Gettid()
		if prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil {
			nice := 20 - prio // the system call's value, unlike nice(1)'s
			_ = unix.Setpriority(unix.PRIO_PROCESS, tid, min(nice+r.nice, 19))
		}
		r.register(f)
	}()
	<-done
}

// onMainThread reports whether the calling goroutine, locked to its
// thread, runs on the process's main thread (a variable for tests, which
// cannot choose the thread a goroutine lands on).
var onMainThread = func() bool { return unix.Gettid() == unix.Getpid() }

// nextLocked picks the queued request a worker takes: the first small
// one, else the first.
func (r *Registrar) nextLocked() int {
	for i, f := range r.queue {
		if len(f.buf) <= r.small {
			return i
		}
	}
	return 0
}

func (r *Registrar) register(f *Registration) {
	if err := f.ctx.Err(); err != nil {
		f.complete(nil, err)
		return
	}
	mr, err := f.pd.Register(f.buf, f.access)
	if err != nil {
		f.complete(nil, fmt.Errorf("rdma: registering %d bytes with %v: %w", len(f.buf), f.access, err))
		return
	}
	r.mu.Lock()
	cause := f.ctx.Err()
	if r.closed {
		cause = ErrClosed
	}
	if cause == nil {
		r.live[f] = struct{}{}
	}
	r.mu.Unlock()
	if cause != nil {
		// Cancelled or closed while pinning: nobody will ever see this MR.
		_ = mr.Deregister()
		f.complete(nil, cause)
		return
	}
	r.bytes.Add(uint64(len(f.buf)))
	took := time.Since(f.queued)
	r.latency[latencyBucket(took)].Add(1)
	r.latSum.Add(int64(took))
	f.complete(mr, nil)
}

// Close stops the Registrar: queued registrations fail with ErrClosed,
// running ones finish and are deregistered, and every MR the Registrar
// produced that was not yet released is deregistered. It blocks until all
// of that is done (a running registration takes as long as its pinning),
// so the PD may be closed and the memory unmapped once it returns; any
// request still posted that uses those MRs fails as after Deregister. It
// returns the deregistration errors, if any. A second Close returns
// ErrClosed.
func (r *Registrar) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	r.closed = true
	queued := r.queue
	r.queue = nil
	r.mu.Unlock()
	r.wake.Broadcast()
	for _, f := range queued {
		f.complete(nil, ErrClosed)
	}
	r.running.Wait()

	r.mu.Lock()
	live := r.live
	r.live = nil
	r.mu.Unlock()
	var errs []error
	for f := range live {
		if err := f.mr.Deregister(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// release deregisters f's MR unless Close already did or will.
func (r *Registrar) release(f *Registration) error {
	r.mu.Lock()
	_, ok := r.live[f]
	delete(r.live, f)
	r.mu.Unlock()
	if !ok {
		return ErrClosed
	}
	return f.mr.Deregister()
}

// RegistrarStats is a snapshot of a Registrar's counters.
type RegistrarStats struct {
	Queued   int    // submitted, not yet taken by a worker
	InFlight int    // being registered now
	Done     uint64 // registered successfully
	Failed   uint64 // failed with an error from the provider
	Canceled uint64 // cancelled by their context or by Close
	Bytes    uint64 // bytes registered successfully
	// Latency counts successful registrations by time from submission to
	// completion: bucket i holds those at most LatencyBucketBound(i).
	Latency [LatencyBuckets]uint64
	// LatencySum is the total of those times.
	LatencySum time.Duration
}

// Stats returns the current counters. It does not block on the workers;
// the counters are read one by one, so a snapshot taken while work is
// moving may not add up exactly.
func (r *Registrar) Stats() RegistrarStats {
	r.mu.Lock()
	s := RegistrarStats{Queued: len(r.queue)}
	r.mu.Unlock()
	s.InFlight = int(r.inFlight.Load())
	s.Done, s.Failed, s.Canceled = r.done.Load(), r.failed.Load(), r.canceled.Load()
	s.Bytes = r.bytes.Load()
	for i := range s.Latency {
		s.Latency[i] = r.latency[i].Load()
	}
	s.LatencySum = time.Duration(r.latSum.Load())
	return s
}

// LatencyBuckets is the number of registration-latency buckets: powers of
// two from 1µs up, the last one unbounded.
const LatencyBuckets = 32

// LatencyBucketBound is the upper bound of latency bucket i.
func LatencyBucketBound(i int) time.Duration {
	if i >= LatencyBuckets-1 {
		return time.Duration(1<<63 - 1)
	}
	return time.Microsecond << i
}

func latencyBucket(d time.Duration) int {
	us := uint64((d + time.Microsecond - 1) / time.Microsecond) // rounded up
	if us <= 1 {
		return 0
	}
	return min(bits.Len64(us-1), LatencyBuckets-1)
}

// Registration is the future of one Register call.
type Registration struct {
	r          *Registrar
	pd         PD // the Registrar's, or RegisterIn's
	ctx        context.Context
	buf        []byte
	access     Access
	background bool
	queued     time.Time
	stopWatch  func() bool

	once sync.Once
	done chan struct{}
	mr   MR
	err  error
}

func (f *Registration) complete(mr MR, err error) {
	f.once.Do(func() {
		f.stopWatch()
		f.mr, f.err = mr, err
		switch {
		case err == nil:
			f.r.done.Add(1)
		case errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			f.r.canceled.Add(1)
		default:
			f.r.failed.Add(1)
		}
		close(f.done)
	})
}

// Done is closed when the registration has succeeded or failed. It never
// blocks.
func (f *Registration) Done() <-chan struct{} { return f.done }

// Wait blocks until the registration is done or ctx is done, and returns
// the MR or the registration's error. A ctx that ends the wait does not
// cancel the registration (the ctx given to Register does). Any number of
// goroutines may Wait; all get the same answer. The MR stays the
// Registrar's: release it with Release, not Deregister.
func (f *Registration) Wait(ctx context.Context) (MR, error) {
	select {
	case <-f.done:
		return f.mr, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Release deregisters the MR, or cancels the registration if it is still
// queued. If a worker is pinning the buffer, Release blocks until it has
// finished, then deregisters the MR. Call it at most once, once the MR is
// no longer in use by any posted work request (see QP for when a request's
// buffers are free); it returns ErrClosed if the Registrar already
// deregistered the MR at Close, and nil for a registration that failed.
func (f *Registration) Release() error {
	select {
	case <-f.done:
	default:
		f.r.mu.Lock()
		removed := f.r.unqueueLocked(f)
		f.r.mu.Unlock()
		if removed {
			f.complete(nil, context.Canceled)
			return nil
		}
		<-f.done // a worker is registering it: wait, then release
	}
	if f.err != nil {
		return nil
	}
	return f.r.release(f)
}
