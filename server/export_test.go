package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// Isolate cuts s off from the other servers, as a partition would, while
// its clients' sessions and their one-sided reads go on: its gossip and
// its Raft replica stop, so it learns no map again, it asks for no read
// lease again, and the view it gives clients has every other server dead.
func Isolate(s *Server) {
	s.isolated.Store(true)
	s.lease.noRenew.Store(true)
	_ = s.ml.Shutdown()
	_ = s.node.Close()
}

// IdleForwardSessions counts the idle sessions s keeps to each other
// server for its forwards, by name: the sessions it needed at once.
func IdleForwardSessions(s *Server) map[string]int {
	m := s.Map()
	out := map[string]int{}
	s.forwards.mu.Lock()
	defer s.forwards.mu.Unlock()
	for id, pc := range s.forwards.conns {
		pc.mu.Lock()
		for _, srv := range m.Servers() {
			if srv.ID == id {
				out[srv.Name] = len(pc.idle)
			}
		}
		pc.mu.Unlock()
	}
	return out
}

// LosePromotionFinishes makes s's next n promotions fail at their finish,
// after the source made the shards backups, and be retried.
func LosePromotionFinishes(s *Server, n int32) { s.moves.loseFinishes.Store(n) }

// PromotionFinishesToLose is how many of those are left.
func PromotionFinishesToLose(s *Server) int32 { return max(s.moves.loseFinishes.Load(), 0) }

// CommitWithCopies writes key=value as a client of a replicated cluster
// does, the record into a lease on primary and the same bytes into one on
// each of backups, commits it at primary at primary's map epoch, and
// returns the commit's reply.
func CommitWithCopies(t *testing.T, primary *Server, backups []*Server, key, value []byte) proto.Message {
	t.Helper()
	return CommitAtEpoch(t, primary, backups, primary.Map().Epoch(), key, value)
}

// CommitAtEpoch is CommitWithCopies with the commit's map epoch given: a
// client whose map is ahead of the primary's, or behind it.
func CommitAtEpoch(t *testing.T, primary *Server, backups []*Server, epoch uint64, key, value []byte) proto.Message {
	t.Helper()
	ps := openSession(t, primary, "")
	pl := ps.lease()
	n := ps.writeRecord(pl, 0, pl.VersionBase, key, value, -1)
	commit := &proto.Commit{LeaseID: pl.ID, Length: uint64(n), Epoch: epoch}
	for _, b := range backups {
		bs := openSession(t, b, "")
		bl := bs.lease()
		bs.writeRecord(bl, 0, pl.VersionBase, key, value, -1)
		commit.Copies = append(commit.Copies, proto.ReplicaCopy{Server: b.Name(), LeaseID: bl.ID, Length: uint64(n)})
	}
	return ps.call(commit)
}

// DeleteAt deletes key at s, at s's map epoch, and returns the reply.
func DeleteAt(t *testing.T, s *Server, key []byte) proto.Message {
	t.Helper()
	return openSession(t, s, "").call(&proto.Delete{Key: key, Epoch: s.Map().Epoch()})
}

// OfferCommitSlot makes s offer new sessions a commit slot of n bytes on
// their write QP (0: proto.CommitSlotSize).
func OfferCommitSlot(s *Server, n uint32) { s.commitSlot.Store(n) }

// ProcessGoneSince is what s's process watch knows of the named server's
// process: since when it has been gone, if it is.
func ProcessGoneSince(s *Server, name string) (time.Time, bool) {
	w := s.watch.Load()
	if w == nil {
		return time.Time{}, false
	}
	return w.goneSince(name)
}

// LeadingSince is when s began to lead the map: zero while it does not.
func LeadingSince(s *Server) time.Time {
	s.grants.mu.Lock()
	defer s.grants.mu.Unlock()
	return s.grants.since
}

// DropReplies makes s close a connection instead of sending the reply to
// a request drop says so of, after serving it (nil: stop), as a crash of
// the connection would.
func DropReplies(s *Server, drop func(proto.Message) bool) {
	if drop == nil {
		s.dropReply.Store(nil)
		return
	}
	s.dropReply.Store(&drop)
}

// AckBeforeBackups makes s, as a primary, acknowledge a write without
// waiting for its backups (the forwards still go, in the background), or
// wait again: for benchmarks that measure what replication costs apart
// from the waiting. A cluster run so loses writes a failover would have
// kept.
func AckBeforeBackups(s *Server, on bool) { s.ackBeforeBackups.Store(on) }

// HoldShardStates keeps s's store at its shard states until release:
// s's Raft replica applies maps meanwhile, but its reconcile waits, as it
// does for the moment after a paused process resumes with maps to apply.
func HoldShardStates(s *Server) (release func()) {
	s.shardMu.Lock()
	return sync.OnceFunc(s.shardMu.Unlock)
}

// ShardState is what s's store holds of shard sh.
func ShardState(s *Server, sh proto.Shard) store.ShardStatus { return s.st.ShardState(sh) }

// StopRenewingReadLease stops s asking for read leases, so that a
// failover of its shards need wait only for the last one to end.
func StopRenewingReadLease(s *Server) { s.lease.noRenew.Store(true) }

// FailOver proposes, through s, the failover of shards from their
// primary, from, to the backup to, as the map's leader does for a primary
// that is down.
func FailOver(ctx context.Context, s *Server, shards []proto.Shard, from, to string) (epoch uint64, err error) {
	moves := make([]proto.MoveCommand, len(shards))
	for i, sh := range shards {
		moves[i] = proto.MoveCommand{Shard: sh, From: from, To: to}
	}
	m, err := s.propose(ctx, &proto.MapCommand{Op: proto.MapFailOver, Moves: moves})
	if err != nil {
		return 0, err
	}
	return m.Epoch(), nil
}
