// A server's connections: each carries one request at a time, the pool bounds how many run at once.

package client

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// serverPool holds up to Config.ConnsPerServer connections to one server,
// dialed as concurrent requests need them. A request takes a connection
// for its whole duration (a GET's READs, a PUT's WRITE and commit), so a
// connection's buffer and lease are never shared.
//
// On a device with several links to the server (rdma.Multilink: soft's
// Options.Links), each connection's read QP has a lane of its own, so
// that connections of distinct lanes read over distinct links, and a
// request takes an idle connection of the lane fewest requests hold: two
// goroutines' GETs then read their answers off two links, each for
// itself. Among those, it takes the one released last, so that a
// goroutine whose requests come one after another keeps the connection it
// used last: taken in turn, connections on different links had a lone
// goroutine's GETs go over one link after another (0.88x the GETs a
// second over a pool of 16 on three links, against one link).
type serverPool struct {
	c     *Client
	name  string
	size  int
	lanes int // the read lanes the connections take in turn, at least 1

	mu      sync.Mutex
	idle    []*serverConn      // connections no request holds, the last released at the end
	waiting []chan *serverConn // requests waiting for one, first come first served
	all     []*serverConn
	busy    []int // by lane: connections requests hold
	closed  bool
}

func newServerPool(c *Client, name string, size int) *serverPool {
	lanes := max(c.lanes, 1)
	return &serverPool{c: c, name: name, size: size, lanes: lanes, busy: make([]int, lanes)}
}

// acquire returns an idle connection (of the lane fewest requests hold,
// the one released last among them), or a new one while the pool has
// room, or waits for one to be released.
func (p *serverPool) acquire(ctx context.Context) (*serverConn, error) {
	p.mu.Lock()
	if i := p.pickIdle(); i >= 0 {
		sc := p.idle[i]
		p.idle = slices.Delete(p.idle, i, i+1)
		p.busy[sc.lane]++
		p.mu.Unlock()
		return sc, nil
	}
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if len(p.all) < p.size {
		lane := len(p.all) % p.lanes
		sc := &serverConn{c: p.c, name: p.name, node: xxhash.Sum64String(p.name), lane: lane, mu: chanMutex{ch: make(chan struct{}, 1)}}
		p.all = append(p.all, sc)
		p.busy[lane]++
		p.mu.Unlock()
		return sc, nil
	}
	w := make(chan *serverConn, 1)
	p.waiting = append(p.waiting, w)
	p.mu.Unlock()
	select {
	case sc := <-w:
		return sc, nil
	case <-ctx.Done():
		p.mu.Lock()
		i := slices.Index(p.waiting, w)
		if i >= 0 {
			p.waiting = slices.Delete(p.waiting, i, 1+i)
		}
		p.mu.Unlock()
		if i < 0 { // a release took it off the queue, and sends it a connection
			p.release(<-w)
		}
		return nil, retry(p.name, "waiting for a connection to %s: %w", p.name, ctx.Err())
	}
}

// pickIdle returns the index in idle of the connection to take: of the
// lane fewest requests hold, the one released last; -1 when none is
// idle. With one lane it is the last.
func (p *serverPool) pickIdle() int {
	if p.lanes == 1 {
		return len(p.idle) - 1
	}
	best := -1
	for i := len(p.idle) - 1; i >= 0; i-- {
		if best < 0 || p.busy[p.idle[i].lane] < p.busy[p.idle[best].lane] {
			best = i
			if p.busy[p.idle[i].lane] == 0 {
				break
			}
		}
	}
	return best
}

// release gives sc to the request waiting longest, or makes it idle.
func (p *serverPool) release(sc *serverConn) {
	p.mu.Lock()
	if len(p.waiting) > 0 {
		w := p.waiting[0]
		p.waiting = slices.Delete(p.waiting, 0, 1)
		p.mu.Unlock()
		w <- sc // still held, now by the waiter
		return
	}
	p.busy[sc.lane]--
	p.idle = append(p.idle, sc)
	p.mu.Unlock()
}

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
