// Tests of the retry loop's verdict on whether a failed write was sent.

package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

func TestNotSentOnlyWhenNoAttemptSentAnything(t *testing.T) {
	c := &Client{cfg: Config{RetryTimeout: time.Second, RetryAttempts: 4}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	down := &UnavailableError{Node: "s1", Reason: "the key's server is dead"}
	ctx := context.Background()

	err := c.do(ctx, "PUT", func(context.Context) error { return &notSentError{down} })
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("first attempt refused before sending: %v, want ErrNotSent and ErrUnavailable", err)
	}

	// The first attempt's connection broke after its commit may have gone
	// out; the second finds the server dead. The write may have been
	// applied.
	n := 0
	err = c.do(ctx, "PUT", func(context.Context) error {
		n++
		if n == 1 {
			return retry("s1", "connection closed while waiting for the commit's reply")
		}
		return &notSentError{down}
	})
	if errors.Is(err, ErrNotSent) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after an attempt that may have sent: %v, want ErrUnavailable without ErrNotSent", err)
	}

	// Out of attempts: each one may have sent.
	err = c.do(ctx, "PUT", func(context.Context) error { return retry("s1", "torn") })
	if errors.Is(err, ErrNotSent) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("out of attempts: %v, want ErrUnavailable without ErrNotSent", err)
	}
}

// sameDone keys a value on a context: one with the same Done channel.
type sameDone struct{}

func TestAttemptDeadlines(t *testing.T) {
	const timeout = 320 * time.Millisecond
	slice := timeout / deadlineSlices
	c := &Client{cfg: Config{RetryTimeout: timeout, RetryAttempts: 4}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		deadlines: sharedDeadlines{timeout: timeout}}
	attemptCtx := func(ctx context.Context) context.Context {
		var got context.Context
		if err := c.do(ctx, "GET", func(ctx context.Context) error { got = ctx; return nil }); err != nil {
			t.Fatal(err)
		}
		return got
	}

	// Operations without a deadline of their own, started within a slice
	// of each other, share one, RetryTimeout to RetryTimeout and a slice
	// away.
	start := time.Now()
	first, second := attemptCtx(context.Background()), attemptCtx(context.Background())
	d, ok := first.Deadline()
	if !ok || d.Before(start.Add(timeout)) || d.After(time.Now().Add(timeout+slice)) {
		t.Fatalf("first attempt's deadline %v after the start (ok %v), want %v to %v", d.Sub(start), ok, timeout, timeout+slice)
	}
	if second != first && time.Since(start) < slice {
		t.Errorf("two operations a moment apart got contexts of their own")
	}
	time.Sleep(2 * slice)
	if third := attemptCtx(context.Background()); third == first {
		t.Errorf("an operation two slices later got the first one's context, which ends too soon for it")
	}

	// Operations under one cancellable ctx without a deadline (a load
	// generator's run) share one derived from it the same way; one under
	// another such ctx meanwhile gets its own, RetryTimeout away.
	run, stop := context.WithCancel(context.Background())
	defer stop()
	start = time.Now()
	first, second = attemptCtx(run), attemptCtx(context.WithValue(run, sameDone{}, true))
	if d, ok := first.Deadline(); !ok || d.Before(start.Add(timeout)) || d.After(time.Now().Add(timeout+slice)) {
		t.Fatalf("attempt under a cancellable ctx: deadline %v after the start (ok %v), want %v to %v", d.Sub(start), ok, timeout, timeout+slice)
	}
	if second != first && time.Since(start) < slice {
		t.Errorf("two operations under one cancellable ctx a moment apart got contexts of their own")
	}
	other, stopOther := context.WithCancel(context.Background())
	if own := attemptCtx(other); own == first && time.Since(start) < slice {
		t.Errorf("an operation under another ctx got the shared one, which its own cancel does not end")
	}
	stopOther()
	stop()
	if first.Err() != context.Canceled {
		t.Errorf("the shared context after its ctx's cancel: %v, want context.Canceled", first.Err())
	}

	// A caller's cancel reaches the attempt at once.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	t0 := time.Now()
	err := c.do(ctx, "GET", func(ctx context.Context) error {
		if d, ok := ctx.Deadline(); !ok || d.After(time.Now().Add(timeout+slice)) {
			t.Errorf("attempt of a cancellable ctx: deadline %v (ok %v), want one within RetryTimeout and a slice", d, ok)
		}
		<-ctx.Done()
		return retry("s1", "%w", ctx.Err())
	})
	if !errors.Is(err, context.Canceled) || time.Since(t0) > timeout/2 {
		t.Fatalf("cancelled after 20ms: %v after %v, want context.Canceled at once", err, time.Since(t0))
	}
}
