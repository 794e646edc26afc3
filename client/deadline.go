// The deadline an operation without one of its own runs under, shared by the operations that start close together.

package client

import (
	"context"
	"sync/atomic"
	"time"
)

// A context of its own per operation (context.WithDeadline: a timer and
// four allocations) cost a warm GET 12% of its p50 and a PUT 5%
// (BenchmarkLatency). Operations whose ctx can be neither cancelled nor
// past a deadline (context.Background, the common case) share one
// instead: made at most once per slice of RetryTimeout, it ends
// RetryTimeout and one slice after it was made, so that it bounds an
// operation's first attempt by RetryTimeout to RetryTimeout and a slice.
// It carries none of the caller's values; nothing under do reads any.
const deadlineSlices = 32

type sharedDeadlines struct {
	timeout time.Duration
	cur     atomic.Pointer[sharedDeadline]
}

type sharedDeadline struct {
	ctx context.Context
	// cancel is never called early: the context ends at its deadline,
	// and its timer then releases it.
	cancel context.CancelFunc
	// until is when operations start taking a newer one.
	until time.Time
}

// get returns a context that ends between timeout and timeout and a slice
// after now. Goroutines that find the current one stale at once may each
// make one; the last stored is the next one shared.
func (d *sharedDeadlines) get(now time.Time) context.Context {
	if cur := d.cur.Load(); cur != nil && now.Before(cur.until) {
		return cur.ctx
	}
	slice := d.timeout / deadlineSlices
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(d.timeout+slice))
	cur := &sharedDeadline{ctx: sharedContext{ctx}, cancel: cancel, until: now.Add(slice)}
	d.cur.Store(cur)
	return cur.ctx
}

// sharedContext marks a context from sharedDeadlines: no caller can cancel
// it, so a wait under it may instead be bounded by a shared tick and look
// at it after (commitOnQP's wait for a reply).
type sharedContext struct{ context.Context }

// isShared reports whether ctx came from sharedDeadlines.get.
func isShared(ctx context.Context) bool {
	_, ok := ctx.(sharedContext)
	return ok
}
