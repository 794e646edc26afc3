// Growing: arenas added while serving, up to MaxArenaCount, when the cleaner cannot make enough room.

package store

import (
	"context"
	"fmt"
	"os"
	"slices"
)

// growAtLive is the share of the capacity live from which a store that
// runs out of free segments adds an arena instead of waiting for the
// cleaner: cleaning that full a store copies far more than it frees.
const growAtLive = 0.7

// arenaList returns the arenas. The slice is never modified: growing
// replaces it.
func (s *Store) arenaList() []*arena {
	if p := s.arenas.Load(); p != nil {
		return *p
	}
	return nil
}

// arena returns arena id, which must exist.
func (s *Store) arena(id uint16) *arena { return (*s.arenas.Load())[id] }

// arenasOnDisk is how many arenas Open opens: ArenaCount, or more when
// the store grew before (arena files beyond ArenaCount, up to
// MaxArenaCount).
func (s *Store) arenasOnDisk() int {
	n := s.opts.ArenaCount
	for n < s.opts.MaxArenaCount {
		if _, err := os.Stat(arenaPath(s.opts.Dir, n)); err != nil {
			break
		}
		n++
	}
	return n
}

// maybeGrowLocked starts adding an arena when the store may have another,
// none is being added, and the cleaner cannot be counted on: most of the
// capacity is live, or there is nothing to clean.
func (s *Store) maybeGrowLocked() {
	if s.growing || s.closed || len(s.arenaList()) >= s.opts.MaxArenaCount {
		return
	}
	sp := s.spaceNowLocked()
	if float64(sp.live) < growAtLive*float64(sp.capacity) && s.victimLocked(true) != nil {
		return
	}
	s.growing = true
	s.wg.Add(1)
	go s.grow(len(s.arenaList()))
}

// grow adds arena id: creates and maps its file, makes its segments free
// (carves wait for its registration), registers it and announces it.
func (s *Store) grow(id int) {
	defer s.wg.Done()
	a, err := openArena(s.opts.Dir, id, s.opts.ArenaSize, s.opts.RegistrationUnit)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.growing = false
	if err != nil {
		s.log.Error("adding an arena failed", "arena", id, "err", err)
		return
	}
	if s.closed {
		_ = a.close()
		_ = os.Remove(a.path) // never used: the next start need not open it
		return
	}
	arenas := append(slices.Clone(s.arenaList()), a)
	s.arenas.Store(&arenas)
	s.addSegmentsLocked(a)
	a.register(context.Background(), s.registrar)
	s.log.Info("adding an arena: free space ran short", "arena", id, "arenas", len(arenas), "max", s.opts.MaxArenaCount,
		"arena_bytes", s.opts.ArenaSize, "space", s.spaceLocked())
	go s.announceUnits(a, 0) // each unit wakes the writers waiting for space
}

// growHint says how far the store may still grow, for ErrFull's message.
func (s *Store) growHint() string {
	if n := len(s.arenaList()); n < s.opts.MaxArenaCount {
		return fmt.Sprintf("%d of at most %d arenas", n, s.opts.MaxArenaCount)
	}
	return fmt.Sprintf("all %d arenas (raise rkv-server --max-arena-count to let the store grow)", s.opts.MaxArenaCount)
}
