// Where the client learns the servers: its own gossip membership, or a server's answers to GetView.

package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
)

// view is the client's view of the servers, whichever way it learns it:
// placement, retries and the commands read members from it and nothing
// else.
func (c *Client) view() *membership.View {
	if c.pv != nil {
		return c.pv.cur.Load()
	}
	return c.ml.View()
}

// polledView is the view of a client that does not join gossip
// (Config.Endpoints): what a server's gossip shows, asked for with GetView
// (which brings the map too) over a control session without a QP, kept
// open to the server that answered last.
type polledView struct {
	addrs []string // Config.Endpoints
	every time.Duration

	cur      atomic.Pointer[membership.View]
	answered atomic.Int64 // when a server last answered, Unix nanoseconds
	bg       atomic.Bool  // a background refresh is running

	// lock serializes fetches; a caller that waited on it for another's
	// fetch takes that one's answer (chanMutex: it respects a ctx).
	lock    chan struct{}
	closed  bool          // under lock
	s       *session.Conn // under lock; nil when none is open
	version uint64        // under lock: the last view's

	stop   context.Context // ends background refreshes at Close
	cancel context.CancelFunc
	bgMu   sync.Mutex // orders the start of a background refresh with close's wait for them
	done   bool       // under bgMu: closed, no background refresh starts
	wg     sync.WaitGroup
}

func newPolledView(addrs []string, every time.Duration) *polledView {
	p := &polledView{addrs: slices.Clone(addrs), every: every, lock: make(chan struct{}, 1)}
	p.cur.Store(membership.NewView(0, nil))
	p.stop, p.cancel = context.WithCancel(context.Background())
	return p
}

// close ends the background refreshes and the session; fetches after it
// fail with ErrClosed.
func (p *polledView) close() error {
	p.bgMu.Lock()
	p.done = true
	p.bgMu.Unlock()
	p.cancel()
	p.lock <- struct{}{}
	p.closed = true
	var err error
	if p.s != nil {
		err = p.s.Close()
		p.s = nil
	}
	<-p.lock
	p.wg.Wait()
	return err
}

// minViewAge is the age below which a retry does not fetch the view
// again: retries of a burst of operations share a fetch, and a server's
// gossip changes no faster.
const minViewAge = 10 * time.Millisecond

// age is how long ago a server last answered with the view.
func (p *polledView) age() time.Duration { return time.Since(time.Unix(0, p.answered.Load())) }

// touchView starts a background refresh of a polled view older than
// Config.ViewRefresh: a client in use follows restarts, deaths and new
// servers within about that time even when nothing fails.
func (c *Client) touchView() {
	p := c.pv
	if p == nil || p.age() < p.every || !p.bg.CompareAndSwap(false, true) {
		return
	}
	p.bgMu.Lock()
	defer p.bgMu.Unlock()
	if p.done {
		p.bg.Store(false)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.bg.Store(false)
		ctx, cancel := context.WithTimeout(p.stop, c.cfg.RetryTimeout)
		defer cancel()
		if err := c.refreshView(ctx, 0); err != nil {
			c.log.Debug("refreshing the view", "err", err)
		}
	}()
}

// refreshView fetches the view (and the map, when newer) from a server,
// until the client holds map epoch atLeast. A caller that waited for
// another's fetch, begun after it asked, takes that one's answer.
func (c *Client) refreshView(ctx context.Context, atLeast uint64) error {
	p := c.pv
	asked := time.Now().UnixNano()
	select {
	case p.lock <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.lock }()
	if p.closed {
		return ErrClosed
	}
	if p.answered.Load() > asked && c.maps.epoch() >= atLeast {
		return nil
	}
	return c.fetchView(ctx, atLeast)
}

// fetchView asks the server of the open session, then the alive servers
// of the view (the newest map first), then Config.Endpoints, for the view
// and the map, until one answers with epoch atLeast or later; at most
// three answers are taken. The caller holds p.lock.
func (c *Client) fetchView(ctx context.Context, atLeast uint64) error {
	p := c.pv
	var addrs []string
	if p.s != nil {
		addrs = append(addrs, p.s.NC.RemoteAddr().String())
	}
	servers := p.cur.Load().Servers()
	slices.SortStableFunc(servers, func(a, b membership.Member) int { return cmp.Compare(b.Meta.MapEpoch, a.Meta.MapEpoch) })
	for _, mb := range servers {
		addrs = append(addrs, mb.Meta.ControlAddr)
	}
	addrs = append(addrs, p.addrs...)
	seen := map[string]bool{}
	var errs []error
	answers, closed := 0, 0
	for _, addr := range addrs {
		if addr == "" || seen[addr] {
			continue
		}
		seen[addr] = true
		// A server that is stopped (SIGSTOP, a hung machine) accepts
		// connections and never answers: give each a short while.
		actx, cancel := context.WithTimeout(ctx, mapFetchTimeout)
		r, err := c.askView(actx, addr)
		cancel()
		if errors.Is(err, ErrUnauthenticated) {
			return err // no other server will take this client either
		}
		if _, ok := errors.AsType[*closedAtHello](err); ok {
			closed++
		}
		if err == nil {
			answers++
			err = c.installView(addr, r)
		}
		switch {
		case err == nil && c.maps.epoch() >= atLeast:
			p.answered.Store(time.Now().UnixNano())
			return nil
		case err == nil:
			err = fmt.Errorf("%s holds map epoch %d, want %d", addr, r.Epoch, atLeast)
		}
		errs = append(errs, err)
		if answers >= 3 || ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return errors.New("no server control address to ask for the view (Config.Endpoints is empty)")
	}
	if closed == len(errs) {
		return fmt.Errorf("%w: %w", ErrNotControlPort, errors.Join(errs...))
	}
	return fmt.Errorf("no server answered with the view: %w", errors.Join(errs...))
}

// askView sends GetView to addr, over the open session when it goes
// there, else over a new one that replaces it once it answers. The caller
// holds p.lock.
func (c *Client) askView(ctx context.Context, addr string) (*proto.ViewReply, error) {
	p := c.pv
	s := p.s
	if s == nil || s.NC.RemoteAddr().String() != addr {
		var err error
		s, err = session.Dial(ctx, addr, "", session.Config{Name: c.name, Token: []byte(c.cfg.AuthToken), Kind: proto.SessionClient, TLS: c.cfg.TLS})
		switch {
		case errors.Is(err, session.ErrRefused):
			return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		case err != nil:
			return nil, hintGossipPort(addr, err)
		}
	}
	r, err := s.Call(ctx, &proto.GetView{Have: c.maps.epoch()})
	if err != nil {
		_ = s.Close()
		if s == p.s {
			p.s = nil
		}
		return nil, fmt.Errorf("GetView to %s: %w", addr, err)
	}
	if s != p.s {
		if p.s != nil {
			_ = p.s.Close()
		}
		p.s = s
	}
	return r.(*proto.ViewReply), nil
}

// closedAtHello marks a dial whose peer accepted the connection and closed
// it without answering the Hello: memberlist does that, an rkv server
// never (it refuses with an Error, or is not listening).
type closedAtHello struct{ err error }

func (e *closedAtHello) Error() string { return e.err.Error() }
func (e *closedAtHello) Unwrap() error { return e.err }

// hintGossipPort marks a failed dial of addr whose peer closed the
// connection without a word, and says the likeliest cause: a gossip port
// given where a control port belongs.
func hintGossipPort(addr string, err error) error {
	if errors.Is(err, session.ErrBroken) && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		return &closedAtHello{fmt.Errorf("%w (the peer closed the connection without answering the Hello, as a gossip port does: is %s a server's gossip address? its control address is the \"control\" of its ready log line)", err, addr)}
	}
	return err
}

// installView makes r the client's view, and its map the client's when
// newer.
func (c *Client) installView(addr string, r *proto.ViewReply) error {
	have := c.maps.load()
	if len(r.Map) > 0 {
		m, err := clustermap.Decode(r.Map)
		if err != nil {
			return fmt.Errorf("the map from %s: %w", addr, err)
		}
		if have.Epoch() > 0 && m.ClusterID() != have.ClusterID() {
			return fmt.Errorf("%s belongs to another cluster (%x, this client's is %x)", addr, m.ClusterID(), have.ClusterID())
		}
		if m.Epoch() > have.Epoch() {
			c.maps.install(m)
			c.log.Debug("cluster map", "epoch", m.Epoch(), "from", addr)
		}
	}
	now := time.Now()
	members := make([]membership.Member, 0, len(r.Members))
	for _, vm := range r.Members {
		if id := c.maps.load().ClusterID(); id != 0 && vm.Meta.ClusterID != 0 && vm.Meta.ClusterID != id {
			continue // a server of another cluster, seen by a misconfigured gossip
		}
		mb := membership.Member{Name: vm.Name, State: membership.State(vm.State), Since: now.Add(-vm.Age), Meta: vm.Meta, ArenasPending: vm.ArenasPending}
		mb.Addr, _ = netip.ParseAddrPort(vm.Addr) // for display only; zero when absent
		members = append(members, mb)
	}
	p := c.pv
	p.version++
	p.cur.Store(membership.NewView(p.version, members))
	return nil
}
