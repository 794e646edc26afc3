// Package life is the lifetime every rdma resource that others depend on
// shares: a device (PDs, CQs), a PD (MRs, QPs) and a CQ (QPs) count their
// children, refuse to close while any exist, close exactly once, and refuse
// new children afterwards.
//
// A Lifetime has its own mutex, separate from whatever lock guards the rest
// of the resource: Close holds it while the resource's release function
// runs, so release may take the resource's own lock (to mark its own state
// closed, close connections, wake waiters) and may block (wait for
// goroutines), while Acquire and a second Close wait for the outcome rather
// than guess it. release must not Acquire or Close the same Lifetime (that
// would deadlock); it may Release its parent's count of it, since Release
// and Count take no lock. Nothing must hold the resource's own lock while
// it calls Acquire or Close.
package life

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rkv-io/rkv/rdma/internal/mem"
)

// Kind is the index of a kind of child, in the order given to Init.
type Kind int

// The children of each resource, as InitDevice, InitPD and InitCQ name them.
const (
	DevicePDs Kind = 0
	DeviceCQs Kind = 1
	PDMRs     Kind = 0
	PDQPs     Kind = 1
	CQQPs     Kind = 0
)

// maxKinds is the most kinds of children a resource has (a PD: MRs and QPs).
const maxKinds = 2

// Lifetime counts a resource's children and decides its Close. Call Init
// before use.
type Lifetime struct {
	what  string           // names the resource in ErrBusy errors: "rdma/soft: device soft0"
	kinds [maxKinds]string // names of the kinds of children: "PD", "CQ"

	mu     sync.Mutex
	closed bool
	// n counts the children of each kind: incremented under mu (so no
	// child appears once Close has decided), decremented and read without
	// it, so that a caller holding the resource's own lock never waits for
	// a Close.
	n [maxKinds]atomic.Int64
}

// Init names the resource and its kinds of children (at most two).
func (l *Lifetime) Init(what string, kinds ...string) {
	if len(kinds) > maxKinds {
		panic("life: too many kinds of children")
	}
	l.what = what
	copy(l.kinds[:], kinds)
}

// InitDevice, InitPD and InitCQ are Init for the three resources that have
// children: a device has PDs and CQs, a PD MRs and QPs, a CQ QPs.
func (l *Lifetime) InitDevice(what string) { l.Init(what, "PD", "CQ") }
func (l *Lifetime) InitPD(what string)     { l.Init(what, "MR", "QP") }
func (l *Lifetime) InitCQ(what string)     { l.Init(what, "QP") }

// Acquire counts one more child of kind k, or fails with ErrClosed once the
// resource is closed. It waits while a Close is running.
func (l *Lifetime) Acquire(k Kind) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return mem.ErrClosed
	}
	l.n[k].Add(1)
	return nil
}

// Release counts one child of kind k fewer. Each successful Acquire is
// matched by exactly one Release. It takes no lock, so a child may be
// released while its parent's Close runs.
func (l *Lifetime) Release(k Kind) {
	if l.n[k].Add(-1) < 0 {
		panic("life: " + l.what + ": more " + l.kinds[k] + "s released than acquired")
	}
}

// Count returns the number of children of kind k. It takes no lock: the
// answer may be stale by the time it returns unless the caller excludes
// Acquire and Release by other means.
func (l *Lifetime) Count(k Kind) int { return int(l.n[k].Load()) }

// Close closes the resource: ErrClosed if it is closed already, ErrBusy
// (naming the children) while it has any. Otherwise it calls release,
// which frees what the resource holds; new children wait until release has
// returned. The resource is then closed, whatever release returned, unless
// release's error was made by StillOpen: then the resource stays open, as
// release left it, and Close may be called again. Close returns release's
// error (unwrapped from StillOpen).
func (l *Lifetime) Close(release func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return mem.ErrClosed
	}
	if busy := l.children(); busy != "" {
		return fmt.Errorf("%s: close with %s open: %w", l.what, busy, mem.ErrBusy)
	}
	err := release()
	var open *stillOpen
	if errors.As(err, &open) {
		return open.err
	}
	l.closed = true
	return err
}

// children describes the live children, "" when there are none.
func (l *Lifetime) children() string {
	var parts []string
	for k := range l.kinds {
		switch n := l.n[k].Load(); {
		case n == 1:
			parts = append(parts, "1 "+l.kinds[k])
		case n > 1:
			parts = append(parts, fmt.Sprintf("%d %ss", n, l.kinds[k]))
		}
	}
	return strings.Join(parts, " and ")
}

// StillOpen marks a release error after which the resource is intact and
// open, so that Close may be retried (as after a failed ibv_dealloc_pd).
// StillOpen(nil) is nil.
func StillOpen(err error) error {
	if err == nil {
		return nil
	}
	return &stillOpen{err}
}

type stillOpen struct{ err error }

func (s *stillOpen) Error() string { return s.err.Error() }
func (s *stillOpen) Unwrap() error { return s.err }
