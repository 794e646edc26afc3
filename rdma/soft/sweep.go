// The device's sweeper: gives responses nobody is reading inline to the link's goroutine.

package soft

import (
	"fmt"
	"time"
)

const (
	// watchEvery is the period of the links' watchdog.
	watchEvery = time.Second
	// sweepEvery is the sweeper's period while QPs receive lazily and
	// responses were left unread within sweepQuiet; after that (Waits
	// read them all inline) it doubles at each tick, up to sweepMax.
	// Ticking each millisecond cost a lone GET a sixth of its p50 and a
	// fifth of its client's CPU: each tick woke a thread of an otherwise
	// idle process.
	sweepEvery = time.Millisecond
	sweepQuiet = 50 * time.Millisecond
	sweepMax   = 32 * time.Millisecond
	// sweepIdle: the sweeper sleeps after this long without lazy traffic.
	sweepIdle = 100 * time.Millisecond
)

// sweepSoon notes lazy traffic at t and wakes the sweeper if it sleeps.
// Posting costs an atomic store or two: no timer is touched per request.
func (d *device) sweepSoon(t int64) {
	d.lastLazy.Store(t)
	if !d.sweeping.Load() && d.sweeping.CompareAndSwap(false, true) {
		select {
		case d.sweepKick <- struct{}{}:
		default:
		}
	}
}

// sweeper runs for the device's life, ticking only while links are read
// lazily: each tick hands the links whose responses have waited lazyDelay
// for a Wait to their goroutines. Once no tick has found such a link for
// sweepQuiet, they slow down (sweepPeriod), so one nobody reads is handed
// over within lazyDelay and sweepMax, and within lazyDelay and sweepEvery
// while such responses keep coming. Every watchEvery it is also the links'
// watchdog.
func (d *device) sweeper() {
	defer d.wg.Done()
	t := time.NewTicker(sweepEvery)
	t.Stop()
	defer t.Stop()
	watch := time.NewTicker(watchEvery)
	defer watch.Stop()
	var links []*outLink
	var writers []*linkWriter
	for {
		select {
		case <-d.closing:
			return
		case <-watch.C:
			writers = d.watchWriters(writers[:0])
			continue
		case <-d.sweepKick:
		}
		period, lastLate := sweepEvery, now()
		t.Reset(period)
		for d.sweeping.Load() {
			select {
			case <-d.closing:
				return
			case <-watch.C:
				writers = d.watchWriters(writers[:0])
				continue
			case <-t.C:
			}
			n := now()
			links = d.lazyLinks(links[:0])
			late := false
			for _, l := range links {
				if n-l.pendingSince.Load() >= int64(lazyDelay) {
					l.nudge()
					late = true
				}
			}
			if late {
				lastLate = n
			}
			if next := sweepPeriod(period, time.Duration(n-lastLate)); next != period {
				period = next
				t.Reset(period)
			}
			clear(links)
			if n-d.lastLazy.Load() > int64(sweepIdle) {
				d.sweeping.Store(false)
				// Traffic noted after the check finds sweeping false
				// and kicks; traffic noted before it is seen here.
				if n2 := d.lastLazy.Load(); n2 > n-int64(sweepIdle) && d.sweeping.CompareAndSwap(false, true) {
					continue
				}
			}
		}
		t.Stop()
	}
}

// sweepPeriod is the sweeper's next period after a tick, period after the
// one before, when the last tick that found responses left unread for
// lazyDelay was sinceLate ago.
func sweepPeriod(period, sinceLate time.Duration) time.Duration {
	if sinceLate < sweepQuiet {
		return sweepEvery
	}
	return min(2*period, sweepMax)
}

// lazyLinks appends the device's links with responses waiting for a reader.
func (d *device) lazyLinks(links []*outLink) []*outLink {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	for _, l := range d.outs {
		if l.pending.Load() {
			links = append(links, l)
		}
	}
	return links
}

// watchWriters breaks the links whose writer has been stuck in one write
// for the link's timeout: the peer read nothing all that time, and the
// writer (maybe a Close waiting for its QP's frame) would wait for ever.
// writers is scratch.
func (d *device) watchWriters(writers []*linkWriter) []*linkWriter {
	d.outMu.Lock()
	for _, l := range d.outs {
		writers = append(writers, &l.w)
	}
	d.outMu.Unlock()
	d.mu.Lock()
	for l := range d.ins {
		writers = append(writers, &l.w)
	}
	d.mu.Unlock()
	t := now()
	for _, w := range writers {
		if w.stuck(t) {
			err := fmt.Errorf("the peer read nothing for %v", time.Duration(w.timeout.Load()))
			d.log.Warn("rdma/soft: link stuck", "device", d.name, "remote", w.conn.RemoteAddr(), "err", err)
			w.onError(err)
		}
	}
	clear(writers)
	return writers
}
