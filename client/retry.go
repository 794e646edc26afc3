// The one retry loop every operation runs in, and what makes an error worth another attempt.

package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rkv-io/rkv/membership"
)

// retryable marks an error a fresh attempt may fix: a torn read, a broken
// connection, a restarted server, a shard moving. With refresh set, the
// client first fetches a map of that epoch or later (the server holds one,
// or a one-sided read showed the map is behind).
type retryable struct {
	node    string
	refresh uint64
	err     error
}

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

func retry(node, format string, args ...any) error {
	return &retryable{node: node, err: fmt.Errorf(format, args...)}
}

// retryWithMap is retry, after fetching a map of epoch atLeast
// (newerMap: any map newer than the one the client holds then).
func retryWithMap(node string, atLeast uint64, format string, args ...any) error {
	return &retryable{node: node, refresh: atLeast, err: fmt.Errorf(format, args...)}
}

// newerMap asks retryWithMap for a map newer than the client's.
const newerMap = ^uint64(0)

// do runs attempt until it returns nil or an error that is not
// retryable, or RetryAttempts attempts or the ctx are spent (its deadline,
// or RetryTimeout when it has none). It then returns an
// *UnavailableError wrapping the last error (and ctx's, when ctx ended:
// errors.Is(err, context.DeadlineExceeded) tells a timeout).
func (c *Client) do(ctx context.Context, what string, attempt func(ctx context.Context) error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RetryTimeout)
		defer cancel()
	}
	var last *retryable
	n := 0
	for ; n < c.cfg.RetryAttempts; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return c.giveUp(ctx, what, n, last)
			case <-time.After(min(time.Millisecond<<n, 100*time.Millisecond)):
			}
		}
		err := attempt(ctx)
		if err == nil || !errors.As(err, &last) {
			return err
		}
		c.retries.add(what)
		c.log.Debug("retrying", "op", what, "server", last.node, "attempt", n+1, "err", err)
		if want := last.refresh; want > 0 {
			if want == newerMap {
				want = c.maps.epoch() + 1
			}
			if err := c.refreshMap(ctx, want); err != nil {
				c.log.Debug("refreshing the map", "want", want, "err", err)
			}
		}
		if ctx.Err() != nil {
			n++
			break
		}
	}
	return c.giveUp(ctx, what, n, last)
}

func (c *Client) giveUp(ctx context.Context, what string, attempts int, last *retryable) error {
	reason := fmt.Sprintf("%s failed after %d attempts", what, attempts)
	var err error = last
	if ctx.Err() != nil {
		reason += " (" + ctx.Err().Error() + ")"
		err = errors.Join(ctx.Err(), last)
	}
	return &UnavailableError{Node: last.node, Reason: reason, Err: err}
}

// doKey runs op against key's owner in the client's map, in do's loop.
func (c *Client) doKey(ctx context.Context, what string, key []byte, op func(ctx context.Context, sc *serverConn, t target) error) error {
	return c.do(ctx, what, func(ctx context.Context) error {
		t, err := c.targetFor(key)
		if err != nil {
			return err
		}
		return c.withConn(ctx, t.name, func(sc *serverConn) error { return op(ctx, sc, t) })
	})
}

// doNode runs op against the named server, in do's loop.
func (c *Client) doNode(ctx context.Context, name string, op func(ctx context.Context, sc *serverConn, mb membership.Member) error) error {
	return c.do(ctx, "other", func(ctx context.Context) error {
		mb, ok := c.ml.View().Member(name)
		if !ok || !mb.IsServer() {
			return &UnavailableError{Node: name, Reason: "not alive in the gossip view"}
		}
		return c.withConn(ctx, name, func(sc *serverConn) error { return op(ctx, sc, mb) })
	})
}

// doAny runs op against any live server, the one gossiping the newest map
// first, in do's loop.
func (c *Client) doAny(ctx context.Context, op func(ctx context.Context, sc *serverConn, mb membership.Member) error) error {
	return c.do(ctx, "other", func(ctx context.Context) error {
		servers := c.ml.View().Servers()
		if len(servers) == 0 {
			return &UnavailableError{Node: "(none)", Reason: "no server in the gossip view"}
		}
		mb := slices.MaxFunc(servers, func(a, b membership.Member) int { return cmp.Compare(a.Meta.MapEpoch, b.Meta.MapEpoch) })
		return c.withConn(ctx, mb.Name, func(sc *serverConn) error { return op(ctx, sc, mb) })
	})
}
