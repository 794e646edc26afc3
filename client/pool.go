// A server's connections: each carries one request at a time, the pool bounds how many run at once.

package client

import (
	"context"
	"errors"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// serverPool holds up to Config.ConnsPerServer connections to one server,
// dialed as concurrent requests need them. A request takes a connection
// for its whole duration (a GET's READs, a PUT's WRITE and commit), so a
// connection's buffer and lease are never shared.
type serverPool struct {
	c     *Client
	name  string
	idle  chan *serverConn // connections no request holds
	slots chan struct{}    // one token per connection not made yet

	mu     sync.Mutex
	all    []*serverConn
	closed bool
}

func newServerPool(c *Client, name string, size int) *serverPool {
	p := &serverPool{c: c, name: name, idle: make(chan *serverConn, size), slots: make(chan struct{}, size)}
	for range size {
		p.slots <- struct{}{}
	}
	return p
}

// acquire returns an idle connection, or a new one while the pool has
// room, or waits for one to be released.
func (p *serverPool) acquire(ctx context.Context) (*serverConn, error) {
	select {
	case sc := <-p.idle:
		return sc, nil
	default:
	}
	select {
	case sc := <-p.idle:
		return sc, nil
	case <-p.slots:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed {
			return nil, ErrClosed
		}
		sc := &serverConn{c: p.c, name: p.name, node: xxhash.Sum64String(p.name), mu: chanMutex{ch: make(chan struct{}, 1)}}
		p.all = append(p.all, sc)
		return sc, nil
	case <-ctx.Done():
		return nil, retry(p.name, "waiting for a connection to %s: %w", p.name, ctx.Err())
	}
}

func (p *serverPool) release(sc *serverConn) { p.idle <- sc }

// close closes every connection, waiting for requests holding one.
func (p *serverPool) close() error {
	p.mu.Lock()
	p.closed = true
	all := p.all
	p.mu.Unlock()
	var errs []error
	for _, sc := range all {
		errs = append(errs, sc.close())
	}
	return errors.Join(errs...)
}

// poolKey names a pool: a server's connections for requests, or those
// for the copies of records written for its backups (copies), which are
// taken while holding a request's connection to the primary: in pools of
// their own, and taken by a writer in the order of the servers' names
// (postCopies), they cannot deadlock two writers whose keys' primaries
// back up each other.
type poolKey struct {
	name   string
	copies bool
}

// withConn runs op on a connection to the named server.
func (c *Client) withConn(ctx context.Context, name string, op func(*serverConn) error) error {
	return c.withPoolConn(ctx, poolKey{name: name}, op)
}

func (c *Client) withPoolConn(ctx context.Context, k poolKey, op func(*serverConn) error) error {
	p, sc, err := c.acquire(ctx, k)
	if err != nil {
		return err
	}
	defer p.release(sc)
	return op(sc)
}

// acquire takes a connection of pool k; the caller gives it back with
// p.release.
func (c *Client) acquire(ctx context.Context, k poolKey) (p *serverPool, _ *serverConn, _ error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, nil, ErrClosed
	}
	p, ok := c.servers[k]
	if !ok {
		p = newServerPool(c, k.name, c.cfg.ConnsPerServer)
		c.servers[k] = p
	}
	c.mu.Unlock()
	sc, err := p.acquire(ctx)
	return p, sc, err
}
