// A follower advances its commit index only over entries the leader's request proved it shares, the Raft paper's rule, which hashicorp/raft v1.8.0 does not keep.

package replica

import (
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// safeCommitTransport is Raft's transport with every incoming
// AppendEntries's LeaderCommitIndex lowered to the last entry the request
// proves the follower shares with the leader (PrevLogEntry plus its
// entries). hashicorp/raft v1.8.0 lets a follower commit up to
// min(LeaderCommitIndex, its own last index), and an AppendEntries can
// match at PrevLogEntry while the follower's log goes on with entries of a
// deposed term: an old leader, cut off with an entry it never committed,
// then applied that entry when the new leader's first request after the
// heal carried no entries, and its map kept a change the cluster never
// made (clustermap/replica TestMinorityCannotChangeTheMap found it, about
// one run in 50 under the race detector). With the clamp, the entry is
// overwritten by the leader's before it can apply. The leader's requests
// are not changed otherwise: an empty request sent to bring a follower's
// commit index up has PrevLogEntry at that follower's last matching entry,
// so it still does.
type safeCommitTransport struct {
	raft.Transport
	preVote raft.WithPreVote
	in      <-chan raft.RPC
	out     chan raft.RPC
	stop    chan struct{}
	wg      sync.WaitGroup
}

// newSafeCommitTransport wraps t, which must implement raft.WithPreVote
// (raft's network and in-memory transports do): Raft runs pre-votes on a
// transport that has them. close stops it; t stays open.
func newSafeCommitTransport(t raft.Transport) (*safeCommitTransport, error) {
	pv, ok := t.(raft.WithPreVote)
	if !ok {
		return nil, fmt.Errorf("clustermap: the Raft transport %T has no pre-vote (raft.WithPreVote)", t)
	}
	s := &safeCommitTransport{Transport: t, preVote: pv, in: t.Consumer(), out: make(chan raft.RPC), stop: make(chan struct{})}
	s.wg.Go(s.relay)
	return s, nil
}

// Consumer is where Raft takes the requests, after the clamp.
func (s *safeCommitTransport) Consumer() <-chan raft.RPC { return s.out }

// RequestPreVote is the wrapped transport's.
func (s *safeCommitTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return s.preVote.RequestPreVote(id, target, args, resp)
}

func (s *safeCommitTransport) relay() {
	for {
		var rpc raft.RPC
		select {
		case rpc = <-s.in:
		case <-s.stop:
			return
		}
		rpc.Command = clampCommit(rpc.Command)
		select {
		case s.out <- rpc:
		case <-s.stop:
			return
		}
	}
}

// clampCommit returns cmd, or for an AppendEntries committing past what it
// proves, a copy that commits no further (the request itself may be the
// leader's, with an in-memory transport).
func clampCommit(cmd any) any {
	ae, ok := cmd.(*raft.AppendEntriesRequest)
	if !ok {
		return cmd
	}
	proven := ae.PrevLogEntry + uint64(len(ae.Entries))
	if ae.LeaderCommitIndex <= proven {
		return cmd
	}
	c := *ae
	c.LeaderCommitIndex = proven
	return &c
}

// close stops the relay. Call it after Raft has shut down.
func (s *safeCommitTransport) close() {
	close(s.stop)
	s.wg.Wait()
}
