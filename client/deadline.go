// The deadline an operation without one of its own runs under, shared by the operations that start close together.

package client

import (
	"context"
	"reflect"
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
	// derived are those shared by the operations under a caller's ctx
	// that can be cancelled but has no deadline (getFor), each in one of
	// two slots chosen by its Done channel: so that the goroutines of a
	// pool, each under a ctx of its own, share one each.
	derived [derivedSlots]atomic.Pointer[sharedDeadline]
}

// derivedSlots bounds the contexts getFor keeps, each ended by its timer
// up to a slice after the next replaces it: at most derivedSlots * (one
// and deadlineSlices) at once.
const derivedSlots = 64

// slotsFor returns the two slots a Done channel's shared context may take.
func slotsFor(done <-chan struct{}) [2]int {
	h := int((uint64(reflect.ValueOf(done).Pointer()) * 0x9e3779b97f4a7c15) >> 58) // 6 bits: derivedSlots
	return [2]int{h, h ^ 1}
}

type sharedDeadline struct {
	// done is the Done channel of the caller's ctx it was derived from
	// (derived only): contexts with one Done channel end together.
	done <-chan struct{}
	ctx  context.Context
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

// getFor is get for an operation under parent, a ctx that can be cancelled
// but has no deadline (a server's request context, a load generator's
// run): it returns a context derived from parent that ends between timeout
// and timeout and a slice after now, shared with the operations under a
// context with the same Done channel (so cancelled together) that start in
// the same slice, and a no-op cancel. A WithDeadline of its own for each
// operation under such a ctx cost a timer and four allocations. Under a
// parent whose slots other parents' live contexts hold (a server serving
// many requests at once), an operation gets a context of its own and the
// cancel that releases it, so that the derived contexts left to end by
// their timers stay bounded (derivedSlots). As with get, nothing under do
// reads parent's values, which the shared context may not carry.
func (d *sharedDeadlines) getFor(parent context.Context, now time.Time) (context.Context, context.CancelFunc) {
	done := parent.Done()
	slots := slotsFor(done)
	free := -1
	for _, i := range slots {
		cur := d.derived[i].Load()
		switch {
		case cur != nil && cur.done == done && now.Before(cur.until):
			return cur.ctx, noCancel
		case free < 0 && (cur == nil || !now.Before(cur.until)):
			free = i
		}
	}
	if free < 0 { // both taken by other contexts' live ones
		return context.WithDeadline(parent, now.Add(d.timeout))
	}
	slice := d.timeout / deadlineSlices
	ctx, cancel := context.WithDeadline(parent, now.Add(d.timeout+slice))
	d.derived[free].Store(&sharedDeadline{done: done, ctx: ctx, cancel: cancel, until: now.Add(slice)})
	return ctx, noCancel
}

// noCancel is the cancel of a shared context: it ends by itself.
func noCancel() {}

// sharedContext marks a context from sharedDeadlines: no caller can cancel
// it, so a wait under it may instead be bounded by a shared tick and look
// at it after (commitOnQP's wait for a reply).
type sharedContext struct{ context.Context }

// isShared reports whether ctx came from sharedDeadlines.get.
func isShared(ctx context.Context) bool {
	_, ok := ctx.(sharedContext)
	return ok
}
