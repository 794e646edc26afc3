// Commits that arrive together on write QPs, committed together: one group commit, replies in one write.

package server

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

// qpBatcher is the server's rdma.RecvHandler for the write QPs of every
// session, on a provider that hands RECVs over (soft): the commits that
// one read of a link brought, from any of its sessions, are committed
// together (one store.CommitBatch: one group commit) and answered
// together (their replies' posts leave in one write). A goroutine per
// session waiting for its own commit and handing it to the store, as on
// verbs, costs each PUT two wake-ups and its own group commit; 16 clients
// on one machine made 1.1 commits a group that way.
//
// A batch runs on the link's goroutine when nothing in it can wait on more
// than the store's own write: under SyncNone or SyncBatch (no commit waits
// for a sync), with no shard holding a backup to forward to. Otherwise (a
// sync, a forward's round trip) it runs on a goroutine of its own, so
// that the link goes on serving READs, and holds its replies' posts
// (rdma.PostHolding) so that they leave together still.
type qpBatcher struct {
	s       *Server
	inline  bool             // no commit waits for a sync
	hold    rdma.PostHolding // the device's, if it has it: for rounds run aside
	rounds  sync.Pool
	holders atomic.Pointer[mapHolders]
	batches atomic.Uint64 // rounds with commits, for Stats
}

// mapHolders caches a map's MaxHolders.
type mapHolders struct {
	m   *clustermap.Map
	max int
}

func newQPBatcher(s *Server, sync store.SyncPolicy) *qpBatcher {
	b := &qpBatcher{s: s, inline: sync != store.SyncAlways}
	b.hold, _ = s.dev.(rdma.PostHolding)
	b.rounds.New = func() any { return &commitRound{b: b} }
	return b
}

// commitRound is one HandleRecvs call's work.
type commitRound struct {
	b      *qpBatcher
	items  []roundItem         // the commits, in arrival order
	batch  []store.BatchCommit // items[k]'s record is batch[k]
	locked []*qpCommits
}

// roundItem is a commit of a round: decoded into its session's q.commit
// (a session sends its next commit only once it has the last's reply, so
// a round holds one of each; another goes to the session's goroutine,
// which answers it after the round).
type roundItem struct {
	q    *qpCommits
	slot int
	id   uint64
}

// HandleRecvs implements rdma.RecvHandler: recvs are commit RECVs of write
// QPs, tagged with their *qpCommits. It takes the Commits and declines the
// rest, which go to their sessions' goroutines (serve), as on verbs: a
// MultiPut's CommitBatch or a forward is work enough to be worth the
// hand-off, and those goroutines run in parallel where the batch would run
// them one after another.
func (b *qpBatcher) HandleRecvs(recvs []rdma.Recv) (declined []rdma.Recv) {
	r := b.rounds.Get().(*commitRound)
	declined = recvs[:0]
	for _, rc := range recvs {
		if !r.take(rc) {
			declined = append(declined, rc)
		}
	}
	if len(r.items) == 0 {
		r.done()
	} else if b.inline && !b.forwarding() {
		r.run(nil) // the handler's run holds the replies' posts already
	} else {
		go r.run(b.hold)
	}
	return declined
}

// forwarding reports whether the map has a shard with a backup, so that a
// commit may be forwarded.
func (b *qpBatcher) forwarding() bool {
	m := b.s.Map()
	h := b.holders.Load()
	if h == nil || h.m != m {
		h = &mapHolders{m: m, max: m.MaxHolders()}
		b.holders.Store(h)
	}
	return h.max > 1
}

// take adds a commit RECV to the round's batch when it is a Commit of a
// lease of its connection, and reports whether it did. (A Commit refused
// before the store, and a session's second commit, which a client does
// not send before the first's reply, go to the session's goroutine too.)
func (r *commitRound) take(rc rdma.Recv) bool {
	q, _ := rc.Tag.(*qpCommits)
	if q == nil {
		return true // not a session's: nothing to answer
	}
	first, ok := r.lock(q) // before the slot is read: free unmaps it
	if !ok {
		return true // the session ended
	}
	if !first {
		return false
	}
	i, n := int(rc.ID), int(rc.ByteLen)
	if !isCommit(q.slot(i)[:n]) {
		r.unlockLast()
		return false
	}
	id, m, malformed := q.decode(i, n)
	cm, _ := m.(*proto.Commit)
	if malformed != nil || cm == nil || q.c.refuseCommit(cm) != nil {
		r.unlockLast()
		return false
	}
	q.taken(cm, &q.c.s.commitsOnQP)
	r.items = append(r.items, roundItem{q: q, slot: i, id: id})
	r.batch = append(r.batch, q.c.batchCommit(cm, &q.fwd))
	return true
}

// isCommit reports whether a SEND is one control frame holding a Commit,
// from its header alone (a CommitBatch is not decoded to be declined).
func isCommit(frame []byte) bool {
	if len(frame) < 4 || int(binary.BigEndian.Uint32(frame)) != len(frame)-4 {
		return false
	}
	t, err := proto.FrameType(frame[4:])
	return err == nil && t == proto.MsgCommit
}

// lock takes q's lock for the round, once; first reports whether q was
// not in the round yet, ok whether its session still is.
func (r *commitRound) lock(q *qpCommits) (first, ok bool) {
	for _, l := range r.locked {
		if l == q {
			return false, true
		}
	}
	q.mu.Lock()
	if q.freed {
		q.mu.Unlock()
		return false, false
	}
	r.locked = append(r.locked, q)
	return true, true
}

// unlockLast lets go of the session locked last.
func (r *commitRound) unlockLast() {
	last := len(r.locked) - 1
	r.locked[last].mu.Unlock()
	r.locked[last] = nil
	r.locked = r.locked[:last]
}

// run commits the round's batch, answers its commits, and puts the round
// back. Under hold (not nil), the replies' posts leave together once all
// are made: a round run aside has no handler's run to hold them. The hold
// is taken after the batch, whose forwards must leave at once.
func (r *commitRound) run(hold rdma.PostHolding) {
	s := r.b.s
	if len(r.batch) > 0 {
		r.b.batches.Add(1)
		s.st.CommitBatch(context.Background(), r.batch)
	}
	if hold != nil {
		hold.HoldPosts()
	}
	for k, it := range r.items {
		q := it.q
		if !q.dropped(&q.commit) {
			q.respond(it.slot, it.id, &q.commit, s.commitReply(q.commit.Epoch, &r.batch[k], &q.reply))
		}
	}
	if hold != nil {
		hold.ReleasePosts()
	}
	r.done()
}

// done lets go of the round's sessions and puts it back.
func (r *commitRound) done() {
	for _, q := range r.locked {
		q.mu.Unlock()
	}
	clear(r.items)
	clear(r.batch)
	clear(r.locked)
	r.items, r.batch, r.locked = r.items[:0], r.batch[:0], r.locked[:0]
	r.b.rounds.Put(r)
}
