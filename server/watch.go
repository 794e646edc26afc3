// The map leader's watch on each server's process: a session held open to it, whose end tells a crash seconds before gossip does.

package server

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/rkv-io/rkv/internal/session"
)

// processWatch holds an idle peer session to each server it is told to
// watch. A process that dies (kill -9, a crash) has its sockets closed by
// its kernel, so the session ends at once, and a dial after that is
// refused while nothing listens: the server's process is gone, seconds
// before gossip's suspicion ends. A dial that times out or a Hello
// refused says nothing (the server may be busy, or another process under
// its name), and neither does a network that drops packets (no reset
// comes back): gossip still decides those, a paused process and a
// partition among them.
//
// Its methods are safe for concurrent use.
type processWatch struct {
	cfg   session.Config
	retry time.Duration // between dials after a session ended

	mu      sync.Mutex
	stopped bool
	watches map[string]*watched // by server name
	wg      sync.WaitGroup
}

type watched struct {
	id, addr string
	cancel   context.CancelFunc
	gone     time.Time // since when the process has been gone; zero: not known gone
}

func newProcessWatch(cfg session.Config) *processWatch {
	cfg.PD, cfg.Device = nil, nil
	cfg.DialTimeout = time.Second
	return &processWatch{cfg: cfg, retry: 100 * time.Millisecond, watches: map[string]*watched{}}
}

// sync watches the servers in want (name to its server ID and control
// address) and stops watching the others. A server whose ID or address
// changed is watched afresh.
func (w *processWatch) sync(want map[string][2]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	for name, x := range w.watches {
		if t, ok := want[name]; !ok || t != [2]string{x.id, x.addr} {
			x.cancel()
			delete(w.watches, name)
		}
	}
	for name, t := range want {
		if _, ok := w.watches[name]; ok || t[1] == "" {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		x := &watched{id: t[0], addr: t[1], cancel: cancel}
		w.watches[name] = x
		w.wg.Go(func() { w.run(ctx, x) })
	}
}

// goneSince reports since when the named server's process has been gone:
// its watch session ended, or a dial was refused, and no dial has
// succeeded since.
func (w *processWatch) goneSince(name string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	x, ok := w.watches[name]
	if !ok || x.gone.IsZero() {
		return time.Time{}, false
	}
	return x.gone, true
}

// stop ends every watch and waits for them.
func (w *processWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	for name, x := range w.watches {
		x.cancel()
		delete(w.watches, name)
	}
	w.mu.Unlock()
	w.wg.Wait()
}

func (w *processWatch) setGone(x *watched, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !gone:
		x.gone = time.Time{}
	case x.gone.IsZero():
		x.gone = time.Now()
	}
}

// run dials x and waits for the session to end, again and again, until
// ctx ends.
func (w *processWatch) run(ctx context.Context, x *watched) {
	for ctx.Err() == nil {
		c, err := session.Dial(ctx, x.addr, x.id, w.cfg)
		switch {
		case err == nil:
			w.setGone(x, false)
			if waitClosed(ctx, c) {
				w.setGone(x, true)
			}
			c.Close()
		case errors.Is(err, syscall.ECONNREFUSED):
			w.setGone(x, true)
		default: // no answer, or a refused Hello: not known gone
			w.setGone(x, false)
		}
		select {
		case <-ctx.Done():
		case <-time.After(w.retry):
		}
	}
}

// waitClosed blocks until the server ends c's connection (true) or ctx
// ends (false). The server sends nothing unasked on a session, so any
// read returning is the end.
func waitClosed(ctx context.Context, c *session.Conn) bool {
	_ = c.NC.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = c.NC.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var b [1]byte
	_, _ = c.NC.Read(b[:])
	return ctx.Err() == nil
}
