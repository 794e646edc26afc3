// Waiting for the first arena: what a server needs before it can say it serves.

package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ArenaError is one arena's failed registration.
type ArenaError struct {
	Arena uint16
	Err   error
}

func (e *ArenaError) Error() string { return fmt.Sprintf("arena %d: %v", e.Arena, e.Err) }
func (e *ArenaError) Unwrap() error { return e.Err }

// WaitArena blocks until one arena unit is registered, and returns nil;
// or until every unit's registration has failed, and returns their
// *ArenaErrors joined (the first failure of each arena, in arena order);
// or until ctx is done or the store closes. A store with no registered
// unit grants no lease, so a server that cannot get one has nothing to
// serve and should say why.
func (s *Store) WaitArena(ctx context.Context) error {
	var errs []error
	for _, a := range s.arenaList() { // those Open opened: later ones are added to a serving store
		var first error
		for i := range a.units {
			reg := a.registration(i)
			// The units after the first arena's first are submitted once
			// its registration is done (registerRest), so a unit may not
			// be submitted yet for a moment after the one before it
			// failed.
			for reg == nil {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-s.stop:
					return ErrClosed
				case <-time.After(time.Millisecond):
				}
				reg = a.registration(i)
			}
			_, err := reg.Wait(ctx)
			switch {
			case err == nil:
				return nil
			case ctx.Err() != nil:
				return ctx.Err()
			case first == nil:
				first = err
			}
		}
		errs = append(errs, &ArenaError{Arena: a.id, Err: first})
	}
	return errors.Join(errs...)
}
