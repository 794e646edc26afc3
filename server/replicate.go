// Replication on the server: a primary forwards each commit and delete to the shard's backups; a backup applies what its primary forwards.

package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// forwarder forwards one client write (store.Forwarder) to the backups of
// its shard in this server's map, in parallel, each a SEND on the write
// QP of a session to the backup (Server.forwards).
type forwarder struct {
	s      *Server
	epoch  uint64 // the client's map's
	write  proto.Write
	copies []proto.ReplicaCopy // where the client wrote the record for each backup; none for a delete
}

// Forwards reports whether a write to shard sh must go through Forward:
// always, unless this server's map makes it the shard's only holder. The
// map is Raft's, which runs ahead of the store's shard states: a primary
// paused through its failover resumes with writes queued, and for a few
// milliseconds its map names the new primary alone while its store still
// owns the shard. Forward refuses such a write; applied here without a
// forward, it was acknowledged and lost, as the new primary never had it.
func (f *forwarder) Forwards(sh proto.Shard) bool {
	m := f.s.Map()
	owner, _ := m.Owner(sh)
	return owner != f.s.cfg.Name || m.Holders(sh) > 1
}

// Forward sends w to every backup and waits for each to apply it. An
// error is a *proto.Error: CodeBadRequest for a commit that names no copy
// for a backup, CodeUnavailable when a backup did not apply it (the
// client retries; the write is applied nowhere it was not already, and a
// retry is answered once per replica by the sessions).
func (f *forwarder) Forward(ctx context.Context, w store.Forwarded) error {
	m := f.s.Map()
	if err := f.notOwner(m, w.Shard); err != nil {
		// Refused before any wait for the client's epoch: a map that
		// gives the shard away is already ahead of this store.
		return err
	}
	if m.Epoch() < f.epoch {
		// The client's map is newer than this server's (a dead backup
		// dropped, which the client learned of first): the copies it
		// names are for that map's backups, which this server's map
		// reaches within a moment.
		wait, cancel := context.WithTimeout(ctx, backupWait)
		var err error
		m, err = f.s.waitEpoch(wait, f.epoch)
		cancel()
		if err != nil {
			return &proto.Error{Code: proto.CodeShardMoving, Message: fmt.Sprintf("the commit's map is at epoch %d: %v", f.epoch, err)}
		}
	}
	if err := f.notOwner(m, w.Shard); err != nil {
		return err
	}
	backups := m.Shard(w.Shard).Owners[1:]
	if len(backups) == 0 {
		return nil // dropped since Forwards said there were some
	}
	reqs := make([]proto.Message, len(backups))
	for i, b := range backups {
		if w.Delete {
			reqs[i] = &proto.ReplicaDelete{Epoch: m.Epoch(), Key: w.Key, Write: f.write}
			continue
		}
		j := slices.IndexFunc(f.copies, func(c proto.ReplicaCopy) bool { return c.Server == b })
		if j < 0 && f.epoch < m.Epoch() {
			// The client's map predates this backup (a replica added):
			// refused as for a moving shard, so it fetches the map.
			return &proto.Error{Code: proto.CodeShardMoving, Message: fmt.Sprintf("%v has a backup on %s at map epoch %d, which the commit's map (epoch %d) does not know: fetch the map",
				w.Shard, b, m.Epoch(), f.epoch)}
		}
		if j < 0 {
			return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("the commit names no copy of its record for %s, a backup of %v at map epoch %d (it names %d): a client of a replicated cluster writes every replica",
				b, w.Shard, m.Epoch(), len(f.copies))}
		}
		c := f.copies[j]
		reqs[i] = &proto.ReplicaCommit{Epoch: m.Epoch(), Shard: w.Shard, LeaseID: c.LeaseID, Offset: c.Offset, Length: c.Length, Version: w.Version, Write: f.write}
	}
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	calls := make([]peerRequest, 0, len(backups))
	var errs []error
	for i, name := range backups {
		srv, ok := m.Server(name)
		mb, in := f.s.ml.View().Member(name)
		if !ok || !in || !mb.IsServer() || mb.Meta.ServerID != srv.ID || mb.Meta.ControlAddr == "" {
			errs = append(errs, fmt.Errorf("backup %s is not alive in the gossip view", name))
			continue
		}
		calls = append(calls, peerRequest{ID: srv.ID, Addr: mb.Meta.ControlAddr, Req: reqs[i]})
	}
	if len(errs) == 0 && f.s.ackBeforeBackups.Load() {
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forwardTimeout)
			defer cancel()
			f.s.forwards.callEach(ctx, calls)
		}()
		return nil
	}
	if len(errs) == 0 {
		for i, err := range f.s.forwards.callEach(ctx, calls) {
			if err != nil {
				errs = append(errs, fmt.Errorf("backup %s: %w", backups[i], err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return &proto.Error{Code: proto.CodeUnavailable, Message: err.Error()}
	}
	return nil
}

// notOwner refuses a write to shard sh when map m makes another server its
// primary.
func (f *forwarder) notOwner(m *clustermap.Map, sh proto.Shard) error {
	if owner, _ := m.Owner(sh); owner != f.s.cfg.Name {
		return &proto.Error{Code: proto.CodeNotOwner, Message: fmt.Sprintf("%v is %s's at map epoch %d", sh, owner, m.Epoch())}
	}
	return nil
}

// forwardTimeout bounds a forward to the backups: a commit fails
// (CodeUnavailable, and the client retries) rather than wait longer for a
// backup that does not answer.
const forwardTimeout = 5 * time.Second

// backupWait bounds how long a backup waits for its map and store to
// catch up with a primary's forward (a move that added it finishing).
const backupWait = 5 * time.Second

// forwardedFrom checks that this server backs up shard sh for the
// primary named from, waiting for its map to reach epoch and its store to
// hold the shard as a backup.
func (s *Server) forwardedFrom(ctx context.Context, from string, sh proto.Shard, epoch uint64) *proto.Error {
	// Nearly always the map and the store are there already: answered
	// without the timer a wait takes.
	if m := s.Map(); m.Epoch() >= epoch {
		if e, settled := s.backsUp(m, from, sh); settled {
			return e
		}
	}
	ctx, cancel := context.WithTimeout(ctx, backupWait)
	defer cancel()
	m, err := s.waitEpoch(ctx, epoch)
	for err == nil {
		if e, settled := s.backsUp(m, from, sh); settled {
			return e
		}
		select { // reconcile is making it a backup
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(10 * time.Millisecond):
			m = s.Map()
		}
	}
	return &proto.Error{Code: proto.CodeUnavailable, Message: fmt.Sprintf("a forward of %v from %s: %v", sh, from, err)}
}

// backsUp says whether, in map m, this server backs up shard sh for the
// primary named from: a refusal, or nil once its store holds the shard as
// a backup; settled is false while the store is still being made one.
func (s *Server) backsUp(m *clustermap.Map, from string, sh proto.Shard) (_ *proto.Error, settled bool) {
	info := m.Shard(sh)
	switch {
	case info.Owner() != from:
		return &proto.Error{Code: proto.CodeNotOwner, Message: fmt.Sprintf("a forward from %s of %v, which is %s's at map epoch %d here", from, sh, info.Owner(), m.Epoch())}, true
	case !slices.Contains(info.Owners[1:], s.cfg.Name):
		return &proto.Error{Code: proto.CodeNotOwner, Message: fmt.Sprintf("a forward of %v, which %s does not back up at map epoch %d", sh, s.cfg.Name, m.Epoch())}, true
	}
	return nil, s.st.ShardState(sh).State == store.ShardBackup
}

// replicaCommit applies a commit its primary forwarded.
func (c *conn) replicaCommit(m *proto.ReplicaCommit) proto.Message {
	if m.Offset > 1<<62 || m.Length > 1<<62 || m.Version == 0 {
		return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("replica commit of %d bytes at offset %d, version %d: out of range", m.Length, m.Offset, m.Version)}
	}
	if e := c.s.forwardedFrom(context.Background(), c.client, m.Shard, m.Epoch); e != nil {
		return e
	}
	r, err := c.s.st.ApplyReplica(context.Background(), m.LeaseID, int64(m.Offset), int64(m.Length), m.Version, m.Write)
	yieldUntil := time.Now().Add(copyYield)
	for wait := 20 * time.Microsecond; errors.Is(err, store.ErrRecord) && wait <= copyLandingWait; {
		// The client posts a copy's WRITE and the commit at the primary
		// without waiting between them (client/conn.go, postCopies):
		// the copy may still be landing. Nothing was admitted; look again.
		if time.Now().Before(yieldUntil) {
			runtime.Gosched()
		} else {
			time.Sleep(wait)
			wait *= 2
		}
		r, err = c.s.st.ApplyReplica(context.Background(), m.LeaseID, int64(m.Offset), int64(m.Length), m.Version, m.Write)
	}
	if err != nil {
		return errorReply(err)
	}
	return &proto.CommitReply{Arena: r.Location.Arena, Offset: r.Location.Offset, Length: r.Location.Length, Version: r.Version}
}

// copyYield is how long a backup first looks for a copy that has not
// landed by yielding to its other goroutines (the responder landing it
// among them) rather than sleeping: a sleep in an otherwise idle process
// lasts a whole millisecond (the granularity of the runtime's poller), and
// one forward in six found its copy still landing (nearly all of them
// within 50 µs), which put a 3-replica PUT's p90 at 1.4 ms.
const copyYield = 200 * time.Microsecond

// copyLandingWait bounds, about, how long a backup then sleeps waiting for
// a copy the primary forwarded the commit of to verify (20 µs, doubling:
// 41 ms in all): the client's WRITE of it left before its commit to the
// primary, which forwarded it here, so it is late only by scheduling.
const copyLandingWait = 20 << 10 * time.Microsecond

// replicaDelete applies a delete its primary forwarded.
func (c *conn) replicaDelete(m *proto.ReplicaDelete) proto.Message {
	if e := c.s.forwardedFrom(context.Background(), c.client, proto.ShardOf(m.Key), m.Epoch); e != nil {
		return e
	}
	if err := c.s.st.DeleteReplica(context.Background(), m.Key, m.Write); err != nil {
		return errorReply(err)
	}
	return &proto.Ack{}
}
