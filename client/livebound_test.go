package client

import (
	"context"
	"testing"
	"time"
)

// TestLiveBound: a commit's waits under a caller's own ctx share one
// bound while it lasts, with the other commits under that ctx, get a fresh
// one once it expired, and end with the caller's ctx; under a shared
// deadline they take the shared tick.
func TestLiveBound(t *testing.T) {
	c := &Client{liveChecks: sharedDeadlines{timeout: liveCheckEvery}, deadlines: sharedDeadlines{timeout: time.Second}}
	ctx, cancel := context.WithCancel(context.Background())
	b := liveBound{c: c, ctx: ctx}
	first := b.next()
	if first == ctx || first.Err() != nil {
		t.Fatalf("first bound %v (err %v): want a live context of its own", first, first.Err())
	}
	if d, ok := first.Deadline(); !ok || time.Until(d) > liveCheckEvery+liveCheckEvery/deadlineSlices {
		t.Fatalf("first bound's deadline %v, %v: want within %v and a slice", d, ok, liveCheckEvery)
	}
	other := liveBound{c: c, ctx: ctx}
	if shared := other.next(); shared != first {
		t.Fatal("another commit under the same ctx a moment later got a bound of its own")
	}
	if again := b.next(); again != first {
		t.Fatal("a second wait got a new bound while the first was live")
	}
	<-first.Done()
	fresh := b.next()
	if fresh == first || fresh.Err() != nil {
		t.Fatalf("after the bound expired: %v (err %v), want a fresh live one", fresh, fresh.Err())
	}
	cancel()
	if err := fresh.Err(); err != context.Canceled {
		t.Fatalf("bound after the caller's cancel: %v, want context.Canceled", err)
	}
	b.stop()

	shared := c.deadlines.get(time.Now()) // an operation's without a ctx of its own
	sb := liveBound{c: c, ctx: shared}
	if got := sb.next(); !isShared(got) || got != c.liveChecks.get(time.Now()) {
		t.Fatalf("under a shared deadline the bound is %v, want the shared tick", got)
	}
	sb.stop()
}

// TestSharedDeadlinesPerParent: operations under a few long-lived
// contexts (a pool's goroutines, each with its own) share one derived
// context per parent rather than make one each; a parent whose two slots
// other parents hold gets one of its own, ended by its cancel.
func TestSharedDeadlinesPerParent(t *testing.T) {
	d := sharedDeadlines{timeout: time.Second}
	now := time.Now()
	a, stopA := context.WithCancel(context.Background())
	defer stopA()
	b, stopB := context.WithCancel(context.Background())
	defer stopB()
	ca, _ := d.getFor(a, now)
	cb, _ := d.getFor(b, now)
	if ca == cb {
		t.Fatal("two parents share a derived context: one's cancel would end the other's operations")
	}
	if again, _ := d.getFor(a, now); again != ca {
		t.Error("a second operation under the first parent got a context of its own")
	}
	if again, _ := d.getFor(b, now); again != cb {
		t.Error("a second operation under the second parent got a context of its own")
	}
	// Fill both slots of a third parent with others' live contexts.
	c, stopC := context.WithCancel(context.Background())
	defer stopC()
	for _, i := range slotsFor(c.Done()) {
		d.derived[i].Store(&sharedDeadline{done: make(chan struct{}), ctx: context.Background(), until: now.Add(time.Hour)})
	}
	own, cancel := d.getFor(c, now)
	if dl, ok := own.Deadline(); !ok || dl.After(now.Add(time.Second)) {
		t.Errorf("an operation with no slot free: deadline %v, %v; want its own, a second away", dl, ok)
	}
	cancel()
	if own.Err() != context.Canceled {
		t.Errorf("its context after its cancel: %v, want context.Canceled", own.Err())
	}
}
