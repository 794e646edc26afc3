// Per-call options: a timeout for any call; limit, keys only and prefix for Scan.

package client

import (
	"context"
	"fmt"
	"time"
)

// An OpOption changes one call, as etcd's clientv3 options do:
//
//	v, err := c.Get(ctx, key, client.WithTimeout(100*time.Millisecond))
//	kvs, err := c.Scan(ctx, []byte("user:"), nil, client.WithPrefix(), client.WithLimit(10))
//
// An option a call does not take fails the call with ErrInvalid.
type OpOption func(*opSettings)

type opSettings struct {
	timeout  time.Duration
	limit    int
	keysOnly bool
	prefix   bool
	scanOnly string // the first Scan option given, for the error of another call
}

// WithTimeout bounds the call, its retries included, to d from now (the
// earlier of it and ctx's deadline wins). A call with neither gets
// Config.RetryTimeout (Config.MoveWait while its key's shard moves).
func WithTimeout(d time.Duration) OpOption {
	return func(o *opSettings) { o.timeout = d }
}

// WithLimit makes Scan return at most n keys (0: no limit, the default).
func WithLimit(n int) OpOption {
	return func(o *opSettings) { o.limit, o.scanOnly = n, first(o.scanOnly, "WithLimit") }
}

// WithKeysOnly makes Scan list the keys without reading their values
// (KV.Value is nil): no RDMA_READ of a record, and the keys of the
// listing even if some are deleted meanwhile.
func WithKeysOnly() OpOption {
	return func(o *opSettings) { o.keysOnly, o.scanOnly = true, first(o.scanOnly, "WithKeysOnly") }
}

// WithPrefix makes Scan's start a prefix: the keys that begin with it
// (end must be nil; an empty prefix is every key).
func WithPrefix() OpOption {
	return func(o *opSettings) { o.prefix, o.scanOnly = true, first(o.scanOnly, "WithPrefix") }
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// applyOptions checks and applies opts for a call named what; scan is
// whether it is a Scan.
func applyOptions(what string, scan bool, opts []OpOption) (opSettings, error) {
	var o opSettings
	for _, f := range opts {
		f(&o)
	}
	switch {
	case o.timeout < 0:
		return o, fmt.Errorf("%w: %s: negative timeout %v", ErrInvalid, what, o.timeout)
	case o.limit < 0:
		return o, fmt.Errorf("%w: %s: negative limit %d", ErrInvalid, what, o.limit)
	case !scan && o.scanOnly != "":
		return o, fmt.Errorf("%w: %s: %s applies to Scan only", ErrInvalid, what, o.scanOnly)
	}
	return o, nil
}

// context is ctx bounded by the timeout, if any.
func (o *opSettings) context(ctx context.Context) (context.Context, context.CancelFunc) {
	if o.timeout == 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, o.timeout)
}

// callContext applies the options of a call other than Scan: ctx bounded
// by WithTimeout, if given. Without options it costs nothing.
func callContext(ctx context.Context, what string, opts []OpOption) (context.Context, context.CancelFunc, error) {
	if len(opts) == 0 {
		return ctx, func() {}, nil
	}
	o, err := applyOptions(what, false, opts)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := o.context(ctx)
	return ctx, cancel, nil
}
