// The device's sweeper: gives responses nobody is reading inline to the QP's receiver goroutine.

package soft

import "time"

const (
	// sweepEvery is the sweeper's period while QPs receive lazily.
	sweepEvery = time.Millisecond
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

// sweeper runs for the device's life, ticking only while QPs receive
// lazily: each tick hands the QPs whose responses have waited lazyDelay
// for a Wait to their receiver goroutines.
func (d *device) sweeper() {
	defer d.wg.Done()
	t := time.NewTicker(sweepEvery)
	t.Stop()
	defer t.Stop()
	var qps []*qp
	for {
		select {
		case <-d.closing:
			return
		case <-d.sweepKick:
		}
		t.Reset(sweepEvery)
		for d.sweeping.Load() {
			select {
			case <-d.closing:
				return
			case <-t.C:
			}
			n := now()
			qps = d.lazyQPs(qps[:0])
			for _, q := range qps {
				if q.rx.pending.Load() && n-q.rx.pendingSince.Load() >= int64(lazyDelay) {
					q.nudgeRx()
				}
			}
			clear(qps)
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

// lazyQPs appends the device's QPs with responses waiting for a reader.
func (d *device) lazyQPs(qps []*qp) []*qp {
	d.qpMu.RLock()
	defer d.qpMu.RUnlock()
	for _, q := range d.qps {
		if q.rx.pending.Load() {
			qps = append(qps, q)
		}
	}
	return qps
}
