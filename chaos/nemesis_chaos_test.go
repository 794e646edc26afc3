//go:build chaos

// The nemesis: real faults on a seeded random schedule, each logged and healed.

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Fault kinds.
const (
	faultKill      = "kill"      // SIGKILL, restart on the same data dir after the fault's duration
	faultPause     = "pause"     // SIGSTOP, SIGCONT after the fault's duration
	faultPartition = "partition" // the server cut off from everyone (netns only)
	faultNetem     = "netem"     // delay, jitter and loss on the server's link (netns only)
)

// nemesisConfig is the schedule's shape.
type nemesisConfig struct {
	kinds []string
	// A fault lasts between minFault and maxFault, with a pause of
	// between minGap and maxGap before the next.
	minFault, maxFault time.Duration
	minGap, maxGap     time.Duration
}

// nemesis injects one fault at a time into c.
type nemesis struct {
	c    *cluster
	cfg  nemesisConfig
	rng  *rand.Rand
	h    *History
	logf func(format string, args ...any)

	mu     sync.Mutex
	faults []Fault
	errs   []error
}

func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// run injects faults until ctx ends, healing each before the next; a fault
// in progress when ctx ends is healed at once.
func (nm *nemesis) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(between(nm.rng, nm.cfg.minGap, nm.cfg.maxGap)):
		}
		kind := nm.cfg.kinds[nm.rng.IntN(len(nm.cfg.kinds))]
		n := nm.c.nodes[nm.rng.IntN(len(nm.c.nodes))]
		d := between(nm.rng, nm.cfg.minFault, nm.cfg.maxFault)
		nm.record(nm.inject(ctx, kind, n, d))
	}
}

// record keeps a fault (unless its Kind is empty: none was injected) and
// an error, and logs them.
func (nm *nemesis) record(f Fault, err error) {
	nm.mu.Lock()
	if f.Kind != "" {
		nm.faults = append(nm.faults, f)
	}
	if err != nil {
		nm.errs = append(nm.errs, err)
	}
	nm.mu.Unlock()
	if err != nil {
		nm.logf("nemesis: %v", err)
	} else {
		nm.logf("nemesis: %v", f)
	}
}

// hold waits d or until ctx ends.
func hold(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// inject applies one fault for d and heals it.
func (nm *nemesis) inject(ctx context.Context, kind string, n *node, d time.Duration) (Fault, error) {
	c := nm.c
	f := Fault{Kind: kind, Node: n.name, Start: nm.h.Now()}
	var err error
	switch kind {
	case faultKill:
		if err = c.kill(n); err != nil {
			return Fault{}, err
		}
		hold(ctx, d)
		f.Detail = fmt.Sprintf("down %v", (nm.h.Now() - f.Start).Round(time.Millisecond))
		err = c.restart(n)
	case faultPause:
		if err = c.pause(n); err != nil {
			return Fault{}, err
		}
		hold(ctx, d)
		f.Detail = fmt.Sprintf("stopped %v", (nm.h.Now() - f.Start).Round(time.Millisecond))
		err = c.resume(n)
	case faultPartition:
		if err = c.net.isolate(n.idx); err != nil {
			return Fault{}, fmt.Errorf("isolating %s: %w", n.name, err)
		}
		hold(ctx, d)
		f.Detail = fmt.Sprintf("isolated %v", (nm.h.Now() - f.Start).Round(time.Millisecond))
		err = c.net.heal(n.idx)
	case faultNetem:
		delay := between(nm.rng, 5*time.Millisecond, 100*time.Millisecond)
		loss := float64(nm.rng.IntN(30))
		if err = c.net.slow(n.idx, delay, delay/2, loss); err != nil {
			return Fault{}, fmt.Errorf("slowing %s: %w", n.name, err)
		}
		hold(ctx, d)
		f.Detail = fmt.Sprintf("delay %v±%v loss %.0f%% for %v", delay, delay/2, loss, (nm.h.Now() - f.Start).Round(time.Millisecond))
		err = c.net.unslow(n.idx)
	default:
		return Fault{}, fmt.Errorf("unknown fault kind %q", kind)
	}
	f.End = nm.h.Now()
	if err != nil {
		err = fmt.Errorf("healing %v: %w", f, err)
	}
	return f, err
}

// healAll undoes every fault: continues paused servers, heals the
// network, restarts killed servers.
func (nm *nemesis) healAll() error {
	var errs []error
	for _, n := range nm.c.nodes {
		errs = append(errs, nm.c.resume(n), nm.c.net.heal(n.idx), nm.c.net.unslow(n.idx), nm.c.restart(n))
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// report returns the faults injected and the errors met.
func (nm *nemesis) report() ([]Fault, []error) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	return append([]Fault(nil), nm.faults...), append([]error(nil), nm.errs...)
}
