// Write leases: regions of an arena registered REMOTE_WRITE for one client, revoked when they end.

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
	arena  *arena
	offset int64 // in the arena
	size   int64
	reg    *rdma.Registration
}

func (r *leaseRegion) release() { _ = r.reg.Release() }

type lease struct {
	Lease
	region      *leaseRegion
	next        int64  // region offset where the next commit may start
	nextVersion uint64 // lowest version the next commit may carry
}

// carveLocked takes the next LeaseSize bytes from the first registered
// arena with room, and starts their REMOTE_WRITE registration. It returns
// errNoReadyArena when only arenas still registering have room.
func (s *Store) carveLocked(ctx context.Context) (*leaseRegion, error) {
	waiting := false
	for _, a := range s.arenas {
		if a.head+s.opts.LeaseSize > s.opts.ArenaSize {
			continue
		}
		if !a.ready() {
			waiting = true
			continue
		}
		r := &leaseRegion{arena: a, offset: a.head, size: s.opts.LeaseSize}
		a.head += s.opts.LeaseSize
		r.reg = s.registrar.Register(ctx, a.mem.Bytes()[r.offset:r.offset+r.size], rdma.AccessLocalWrite|rdma.AccessRemoteWrite)
		return r, nil
	}
	if waiting {
		return nil, errNoReadyArena
	}
	return nil, fmt.Errorf("%w: all %d arenas of %d bytes are allocated (%s); compaction is not implemented yet",
		ErrFull, len(s.arenas), s.opts.ArenaSize, s.spaceLocked())
}

var errNoReadyArena = errors.New("store: no registered arena has room yet")

func (s *Store) spaceLocked() string {
	var live, dead int64
	for _, a := range s.arenas {
		live += a.live
		dead += a.dead
	}
	return fmt.Sprintf("%d bytes live, %d dead", live, dead)
}

// GrantLease gives the caller a write lease. The region usually comes
// registered from the pool kept ahead of demand; otherwise GrantLease waits
// for a registration (bounded by ctx).
func (s *Store) GrantLease(ctx context.Context) (Lease, error) {
	region, err := s.takeRegion(ctx)
	if err != nil {
		return Lease{}, err
	}
	go s.refillPool()
	mr, err := region.reg.Wait(ctx)
	if err != nil {
		s.retireRegion(region, 0)
		return Lease{}, fmt.Errorf("store: registering a lease region: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		region.release()
		return Lease{}, ErrClosed
	}
	s.nextLeaseID++
	// A record takes at least RecordSize(1, 0) bytes: that many versions
	// are enough for any sequence of commits in the region.
	versions := uint64(region.size / int64(proto.RecordSize(1, 0)))
	l := &lease{
		Lease: Lease{
			ID: s.nextLeaseID, Arena: region.arena.id, Addr: mr.Addr(), Size: region.size, RKey: mr.RKey(),
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

func (s *Store) takeRegion(ctx context.Context) (*leaseRegion, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		if len(s.pool) > 0 {
			r := s.pool[0]
			s.pool = s.pool[1:]
			s.mu.Unlock()
			return r, nil
		}
		r, err := s.carveLocked(context.Background())
		s.mu.Unlock()
		if !errors.Is(err, errNoReadyArena) {
			return r, err
		}
		select { // an arena is still registering: wait for it
		case <-ctx.Done():
			return nil, fmt.Errorf("store: waiting for an arena to finish registering: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// refillPool registers regions until LeasePool of them wait for clients.
func (s *Store) refillPool() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.closed && len(s.pool) < s.opts.LeasePool {
		r, err := s.carveLocked(context.Background())
		if err != nil {
			return // full, or arenas still registering: GrantLease carves on demand
		}
		s.pool = append(s.pool, r)
	}
}

// RenewLease extends a lease by the TTL.
func (s *Store) RenewLease(id uint64) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.liveLeaseLocked(id)
	if err != nil {
		return time.Time{}, err
	}
	l.Expires = time.Now().Add(s.opts.LeaseTTL)
	return l.Expires, nil
}

// EndLease ends a lease: its region is deregistered, so its rkey stops
// working, and its unused bytes are counted dead.
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

// retireRegion deregisters a region and counts the bytes from used on as
// dead.
func (s *Store) retireRegion(r *leaseRegion, used int64) {
	r.release()
	s.mu.Lock()
	r.arena.dead += r.size - used
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
