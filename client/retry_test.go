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
