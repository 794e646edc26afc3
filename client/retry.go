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
	"github.com/rkv-io/rkv/proto"
)

// retryable marks an error a fresh attempt may fix: a torn read, a broken
// connection, a restarted server, a shard moving.
type retryable struct {
	node string
	// moving: the key's shard is between owners (a move's last copy, its
	// new owner not serving yet, or the client's map behind the server's).
	// The client first fetches a newer map, and waits for the move to end
	// up to Config.MoveWait.
	moving bool
	// lost: the server could not be reached (dial refused, session or QP
	// broken). For a replica of a shard with others that may be its
	// death, which a failover or a backup's drop ends: doKey waits for it
	// as for a move.
	lost bool
	// stale: the client's view holds an older record of the server than
	// the server shows (its index or an arena not advertised yet, another
	// generation). A client in gossip asks the server for its record
	// (membership.Refresh) rather than wait for a gossip round.
	stale bool
	err   error
}

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

func retry(node, format string, args ...any) error {
	return &retryable{node: node, err: fmt.Errorf(format, args...)}
}

// retryLost is retry for a server that could not be reached.
func retryLost(node, format string, args ...any) error {
	return &retryable{node: node, lost: true, err: fmt.Errorf(format, args...)}
}

// retryStale is retry for a server whose record in the view is behind.
func retryStale(node, format string, args ...any) error {
	return &retryable{node: node, stale: true, err: fmt.Errorf(format, args...)}
}

// retryMoving is retry for a shard between owners.
func retryMoving(node string, format string, args ...any) error {
	return &retryable{node: node, moving: true, err: fmt.Errorf(format, args...)}
}

// notSentError is an attempt's error from before it sent anything: do
// returns it as ErrNotSent only if no earlier attempt sent anything.
type notSentError struct{ err error }

func (e *notSentError) Error() string        { return e.err.Error() }
func (e *notSentError) Unwrap() error        { return e.err }
func (e *notSentError) Is(target error) bool { return target == ErrNotSent }

// do runs attempt until it returns nil or an error that is not
// retryable, or the attempts or the time are spent. The time is ctx's
// deadline when it has one; otherwise RetryTimeout, extended to MoveWait
// from the start while the last error says the key's shard is between
// owners (such attempts do not count towards RetryAttempts either: a
// move's last copy ends by itself, and an operation on it should wait, not
// fail). It then returns an *UnavailableError wrapping the last error, and
// context.DeadlineExceeded when the time ran out (context.Canceled when
// ctx was). The error is ErrNotSent only if it came from the first
// attempt, before that sent anything: any attempt that failed otherwise
// may have reached a server.
func (c *Client) do(ctx context.Context, what string, attempt func(ctx context.Context) error) error {
	c.touchView()
	_, bounded := ctx.Deadline()
	start := time.Now()
	end := start.Add(c.cfg.RetryTimeout) // when ctx has no deadline
	var last *retryable
	counted := 0
	for n := 0; ; n++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		switch {
		case bounded:
		case n == 0 && ctx.Done() == nil:
			actx = c.deadlines.get(start) // see sharedDeadlines
		case n == 0:
			actx, cancel = c.deadlines.getFor(ctx, start)
		default:
			actx, cancel = context.WithDeadline(ctx, end)
		}
		if n > 0 {
			select {
			case <-actx.Done():
				cause := actx.Err()
				cancel()
				return c.giveUp(what, n, last, cause)
			case <-time.After(backoff(n)):
			}
		}
		err := attempt(actx)
		r, ok := errors.AsType[*retryable](err) // not errors.As: &last would escape, an allocation per operation
		if !ok {
			cancel()
			if ns, unsent := err.(*notSentError); unsent && n > 0 {
				return ns.err
			}
			return err
		}
		last = r
		c.retries.add(what)
		c.log.Debug("retrying", "op", what, "server", last.node, "attempt", n+1, "err", err)
		if last.moving {
			want := c.maps.epoch() + 1
			if err := c.refreshMap(actx, want); err != nil {
				c.log.Debug("refreshing the map", "want", want, "err", err)
			}
		} else if c.pv != nil && c.pv.age() >= minViewAge {
			// Without gossip nothing else tells the client that the
			// server restarted, died or moved: ask for the view again.
			if err := c.refreshView(actx, 0); err != nil {
				c.log.Debug("refreshing the view", "err", err)
			}
		} else if last.stale && c.ml != nil {
			c.ml.Refresh(last.node) // in the background, before the next attempt
		}
		cancel()
		if !last.moving {
			counted++
		} else if e := start.Add(c.cfg.MoveWait); !bounded && e.After(end) {
			end = e
		}
		switch {
		case ctx.Err() != nil:
			return c.giveUp(what, n+1, last, ctx.Err())
		case !bounded && !time.Now().Before(end):
			return c.giveUp(what, n+1, last, context.DeadlineExceeded)
		case counted >= c.cfg.RetryAttempts:
			return c.giveUp(what, n+1, last, nil)
		}
	}
}

// backoff is the wait before attempt n (from 1): 2 ms, 4 ms, ... 100 ms.
func backoff(n int) time.Duration {
	if n >= 7 {
		return 100 * time.Millisecond
	}
	return min(time.Millisecond<<n, 100*time.Millisecond)
}

// giveUp is the error of an operation that ran out of attempts or of
// time (cause, when set: the ctx error that ended it).
func (c *Client) giveUp(what string, attempts int, last *retryable, cause error) error {
	reason := fmt.Sprintf("%s failed after %d attempts", what, attempts)
	var err error = last
	if cause != nil {
		reason += " (" + cause.Error() + ")"
		err = errors.Join(cause, last)
	}
	return &UnavailableError{Node: last.node, Reason: reason, Err: err}
}

// doKey runs op against key's owner in the client's map, in do's loop.
func (c *Client) doKey(ctx context.Context, what string, key []byte, op func(ctx context.Context, sc *serverConn, t *target) error) error {
	return c.do(ctx, what, func(ctx context.Context) error {
		t, err := c.targetFor(key)
		if err != nil {
			return &notSentError{err}
		}
		err = c.withConn(ctx, t.name, func(sc *serverConn) error { return op(ctx, sc, t) })
		if r, ok := errors.AsType[*retryable](err); ok && r.lost {
			// A replica of the key's shard may be dead: with others, the
			// map's leader fails a primary over or drops a backup, so
			// wait for that as for a move.
			if sh := proto.ShardOf(key); t.m.Holders(sh) > 1 && slices.Contains(t.m.Shard(sh).Owners, r.node) {
				r.moving = true
			}
		}
		return err
	})
}

// doNode runs op against the named server, in do's loop.
func (c *Client) doNode(ctx context.Context, name string, op func(ctx context.Context, sc *serverConn, mb *membership.Member) error) error {
	return c.do(ctx, "other", func(ctx context.Context) error {
		mb := c.view().Lookup(name)
		if mb == nil || !mb.IsServer() {
			return &UnavailableError{Node: name, Reason: "not alive in the gossip view"}
		}
		return c.withConn(ctx, name, func(sc *serverConn) error { return op(ctx, sc, mb) })
	})
}

// doAny runs op against any live server, the one gossiping the newest map
// first, in do's loop.
func (c *Client) doAny(ctx context.Context, op func(ctx context.Context, sc *serverConn, mb *membership.Member) error) error {
	return c.do(ctx, "other", func(ctx context.Context) error {
		servers := c.view().Servers()
		if len(servers) == 0 {
			return &UnavailableError{Node: "(none)", Reason: "no server in the gossip view"}
		}
		mb := slices.MaxFunc(servers, func(a, b membership.Member) int { return cmp.Compare(a.Meta.MapEpoch, b.Meta.MapEpoch) })
		return c.withConn(ctx, mb.Name, func(sc *serverConn) error { return op(ctx, sc, &mb) })
	})
}
