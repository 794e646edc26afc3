// Write leases: regions carved to fit and registered REMOTE_WRITE for one client, revoked when they end.

package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// Lease is a grant to write records into one region with RDMA_WRITE and
// commit them. The rkey works for this region only, until the lease ends.
type Lease struct {
	ID      uint64
	Arena   uint16
	Addr    uint64 // remote address of the region's first byte
	Size    int64
	RKey    uint32 // write capability for the region
	Expires time.Time
	// Records written under the lease carry versions from VersionBase on,
	// increasing, below VersionBase+VersionCount.
	VersionBase, VersionCount uint64
}

// leaseRegion is a carved region and its REMOTE_WRITE registration.
type leaseRegion struct {
	region
	reg *rdma.Registration
}

type lease struct {
	Lease
	region      *leaseRegion
	next        int64  // region offset where the next commit may start
	nextVersion uint64 // lowest version the next commit may carry
}

var errNoReadyArena = errors.New("store: no registered arena has room yet")

// leaseSize is the size of a lease asked for as size bytes: rounded up to
// leaseGranularity, at most LeaseSize (0: the largest).
func (s *Store) leaseSize(size int64) int64 {
	if size <= 0 || size > s.opts.LeaseSize {
		return s.opts.LeaseSize
	}
	return (size + leaseGranularity - 1) / leaseGranularity * leaseGranularity
}

// GrantLease gives the caller a write lease of size bytes, or less, not
// less than least, when that uses up the segment it is carved from: both
// rounded up to 4 KiB and at most Options.LeaseSize (size 0 asks for
// LeaseSize). Its region is carved when asked for and registered
// REMOTE_WRITE for this lease alone, in the store's PD: any QP of that PD
// holding the rkey can write it (servers use GrantLeaseIn). GrantLease
// waits for that registration, and for an arena to finish registering or
// the cleaner to free a segment (bounded by ctx).
func (s *Store) GrantLease(ctx context.Context, size, least int64) (Lease, error) {
	return s.GrantLeaseIn(ctx, nil, size, least)
}

// GrantLeaseIn is GrantLease with the region registered in pd (nil: the
// store's own), a PD of the writer's own, so that the rkey works from that
// writer's QPs only: the PD shared by every reader's QPs holds the arenas,
// not the lease. pd must be of the store's device, and stay open until the
// lease has ended: EndLease, expiry (on the store's own goroutine) and
// Close deregister the region with MR.Deregister, which a caller that
// wraps pd can count to know when it may close it.
func (s *Store) GrantLeaseIn(ctx context.Context, pd rdma.PD, size, least int64) (Lease, error) {
	want := s.leaseSize(size)
	r, err := s.takeRegion(ctx, s.leaseSize(max(least, 1)), want)
	if err != nil {
		return Lease{}, err
	}
	region := &leaseRegion{region: r}
	buf, access := r.arena().mem.Bytes()[r.off:r.off+r.size], rdma.AccessLocalWrite|rdma.AccessRemoteWrite
	if pd == nil {
		region.reg = s.registrar.Register(ctx, buf, access)
	} else {
		region.reg = s.registrar.RegisterIn(ctx, pd, buf, access)
	}
	mr, err := region.reg.Wait(ctx)
	if err != nil {
		s.retireRegion(region, 0)
		return Lease{}, fmt.Errorf("store: registering a lease region: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		region.reg.Release()
		return Lease{}, ErrClosed
	}
	s.nextLeaseID++
	// A record takes at least RecordSize(1, 0) bytes: that many versions
	// are enough for any sequence of commits in the region.
	versions := uint64(r.size / int64(proto.RecordSize(1, 0)))
	l := &lease{
		Lease: Lease{
			ID: s.nextLeaseID, Arena: r.arena().id, Addr: mr.Addr(), Size: r.size, RKey: mr.RKey(),
			Expires: time.Now().Add(s.opts.LeaseTTL), VersionBase: s.nextVersion, VersionCount: versions,
		},
		region:      region,
		nextVersion: s.nextVersion,
	}
	s.nextVersion += versions
	s.leases[l.ID] = l
	s.stats.leasesGranted.Add(1)
	return l.Lease, nil
}

// A request for space the cleaner has to free waits for up to
// defaultFullWait while the cleaner makes no progress (moves no record,
// frees no segment, and is not waiting on the disk), and
// defaultFullWaitMost in all, before it fails with ErrFull: at a high
// utilization, or on a loaded machine, the next free segment may take
// seconds, and the store is not full.
const (
	defaultFullWait     = 2 * time.Second
	defaultFullWaitMost = 20 * time.Second
)

// takeRegion carves need to want bytes, waiting while arenas are still
// registering, and while the cleaner frees space (see defaultFullWait).
func (s *Store) takeRegion(ctx context.Context, need, want int64) (region, error) {
	var fullSince, stalledSince time.Time
	var progress uint64 // the cleaner's, at stalledSince
	defer func() {
		if !fullSince.IsZero() {
			s.mu.Lock()
			s.spaceWaiters--
			s.mu.Unlock()
		}
	}()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return region{}, ErrClosed
		}
		r, err := s.carveLocked(min(need, want), want, false)
		freed, arenas := s.freed, len(s.arenaList())
		s.mu.Unlock()
		switch {
		case err == nil:
			return r, nil
		case errors.Is(err, ErrFull):
			now := time.Now()
			if fullSince.IsZero() {
				fullSince = now
				s.mu.Lock()
				s.spaceWaiters++
				s.mu.Unlock()
			}
			if p := s.cleanerProgress(); stalledSince.IsZero() || p != progress || s.cleaner.onDisk.Load() > 0 {
				stalledSince, progress = now, p
			}
			if len(s.arenaList()) != arenas {
				continue // an arena was added since (the carve may have started it): carve again
			}
			if now.Sub(stalledSince) > s.fullWait || now.Sub(fullSince) > s.fullWaitMost || !s.cleanable(arenas) {
				s.stats.leasesRefused.Add(1)
				return region{}, err
			}
		case !errors.Is(err, errNoReadyArena):
			return region{}, err
		}
		select { // an arena is still registering, or the cleaner is at work
		case <-ctx.Done():
			return region{}, fmt.Errorf("store: waiting for space: %w (%w)", ctx.Err(), err)
		case <-freed:
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cleanerProgress changes whenever the cleaner moves records or a segment
// comes free.
func (s *Store) cleanerProgress() uint64 {
	return s.stats.cleanerMoved.Load() + s.stats.segmentsFreed.Load()
}

// EndLease ends a lease: its region is deregistered, so its rkey stops
// working, and its unused bytes go back to free space (or count dead, when
// a region was carved after it).
func (s *Store) EndLease(id uint64) error {
	s.mu.Lock()
	l, ok := s.leases[id]
	delete(s.leases, id)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: lease %d is not active", ErrLease, id)
	}
	s.retireRegion(l.region, l.next)
	return nil
}

// retireRegion deregisters a lease's region and gives back its space from
// used on.
func (s *Store) retireRegion(r *leaseRegion, used int64) {
	_ = r.reg.Release()
	s.mu.Lock()
	s.endRegionLocked(r.region, used)
	s.mu.Unlock()
}

func (s *Store) liveLeaseLocked(id uint64) (*lease, error) {
	l, ok := s.leases[id]
	if !ok {
		return nil, fmt.Errorf("%w: lease %d is not active", ErrLease, id)
	}
	if time.Now().After(l.Expires) {
		return nil, fmt.Errorf("%w: lease %d expired at %v", ErrLease, id, l.Expires.Format(time.RFC3339Nano))
	}
	return l, nil
}

// expireLeases ends every lease past its expiry.
func (s *Store) expireLeases(now time.Time) {
	var expired []*lease
	s.mu.Lock()
	for id, l := range s.leases {
		if now.After(l.Expires) {
			expired = append(expired, l)
			delete(s.leases, id)
		}
	}
	s.mu.Unlock()
	for _, l := range expired {
		s.log.Info("lease expired", "lease", l.ID, "arena", l.Arena)
		s.retireRegion(l.region, l.next)
		s.stats.leasesExpired.Add(1)
	}
}
