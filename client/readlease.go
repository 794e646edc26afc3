// Read leases: with more than one replica, a READ of a primary is trusted only within the primary's read lease.

package client

import (
	"context"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// readLease is what a connection knows of its server's read lease: reads
// that complete before until are trusted. The server's map leader fails
// none of the server's shards over before the lease ends, so a read within
// it returns nothing older than a write acknowledged by a new primary
// (docs/ARCHITECTURE.md, "Read leases"). At one replica there is no
// failover, and no lease is asked for.
type readLease struct {
	until time.Time     // local, monotonic: the time the client asked, plus the TTL
	ttl   time.Duration // the last answer's, to renew at half of it
}

// needsReadLease reports whether reads through t must fall within its
// server's read lease: whenever the map keeps more than one copy.
func needsReadLease(t *target) bool { return t.m.Replicas() > 1 }

// ensureReadLease makes sure, before reads through t, that sc's server
// lease has at least half of its last TTL left, asking the server when
// not. An answer of no lease (its leader has not renewed it: the server
// may be cut off, and its shards about to fail over) is retried as for a
// moving shard, with the map fetched again. The caller holds sc.
func (sc *serverConn) ensureReadLease(ctx context.Context, t *target) error {
	if !needsReadLease(t) || time.Until(sc.readLease.until) > sc.readLease.ttl/2 {
		return nil
	}
	asked := time.Now()
	r, err := sc.rpc(ctx, &proto.GetReadLease{})
	if err != nil {
		if sc.s != nil && time.Now().Before(sc.readLease.until) {
			return nil // the session and the lease still hold: the next read asks again
		}
		return err // the session is gone (rpc dropped it), or the lease ended
	}
	lr := r.(*proto.ReadLeaseReply)
	if lr.TTL <= 0 {
		return retryMoving(sc.name, "%s holds no read lease (its map's leader has not renewed it: it may be cut off, and its shards about to fail over): its reads are not trusted", sc.name)
	}
	sc.readLease = readLease{until: asked.Add(lr.TTL), ttl: lr.TTL}
	return nil
}

// trustReads checks, after reads through t completed, that they completed
// within sc's server's read lease. The caller holds sc.
func (sc *serverConn) trustReads(t *target) error {
	if !needsReadLease(t) || time.Now().Before(sc.readLease.until) {
		return nil
	}
	return retryMoving(sc.name, "a read of %s completed after its read lease ended: not trusted", sc.name)
}
