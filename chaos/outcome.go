// Which client errors mean "not applied" and which "maybe applied".

package chaos

import (
	"errors"

	"github.com/rkv-io/rkv/client"
)

// Classify maps what a client operation of kind returned to its Outcome,
// and for a get whether it found a value.
//
// A get has no effect, so an error of any kind makes it Failed (the
// checker ignores it); client.ErrNotFound is a successful read of an
// absent key.
//
// A put or delete that returned nil was acknowledged after the server's
// commit (durable under --sync always). Any error makes it Unknown, never
// Failed: client.Client retries a put or delete internally (a new lease,
// a new connection, up to Config.RetryAttempts within RetryTimeout or
// MoveWait), and
// the error it returns describes only how the last attempt ended. An
// earlier attempt may have sent its Commit or Delete, which the server
// applies even when the connection breaks before the reply (the store
// finishes a queued commit whatever happens to the request's context).
// Not even client.ErrUnavailable proves otherwise: it is also what the
// retry loop returns when the server is declared dead after an attempt
// that timed out. The exception is client.ErrNotSent: the client failed
// the operation before any attempt of it left (its server was known to be
// down), so it is Failed. docs/CHAOS.md has the full reasoning.
func Classify(kind Kind, err error) (_ Outcome, found bool) {
	switch {
	case kind == Get && err == nil:
		return OK, true
	case kind == Get && errors.Is(err, client.ErrNotFound):
		return OK, false
	case kind == Get:
		return Failed, false
	case err == nil:
		return OK, false
	case errors.Is(err, client.ErrNotSent):
		return Failed, false
	}
	return Unknown, false
}
