// Idempotency sessions: the (session, sequence) pair each PUT and DELETE carries, so a retry is applied once.

package client

import (
	"math/rand/v2"
	"sync"

	"github.com/rkv-io/rkv/proto"
)

// sessions hands out write sessions. A session serves one operation at a
// time, so its sequence numbers grow in the order its operations ran, and
// every retry of an operation carries the operation's number: a server
// that applied the first attempt answers the retry with its first result
// (store.Commit). Sessions are reused, and kept per shard: a server
// remembers the last write of each (shard, session) it applied, so a
// session that wrote to every shard costs it an entry in each, and its
// table is bounded (store.Options.MaxSessions, 2^18 by default, beyond
// which an entry is dropped before its TTL and a retry of its write would
// apply twice). Sessions taken from any shard's writes made a client's
// entries its peak concurrency times the shards it writes: 16 goroutines
// each doing MultiPuts of 16 filled the 2^18 in seconds. Per shard they
// are about the shards it writes times the writes one shard has at once.
type sessions struct {
	mu   sync.Mutex
	free [proto.NumShards][]*writeSession
	off  bool // tests only (export_test.go): writes opt out with Session 0
}

type writeSession struct {
	proto.Write
	shard proto.Shard
}

// next returns a session for one operation on a key of shard sh, with its
// next sequence number.
func (s *sessions) next(sh proto.Shard) *writeSession {
	if s.off {
		return &writeSession{}
	}
	s.mu.Lock()
	var w *writeSession
	if free := s.free[sh]; len(free) > 0 {
		w, s.free[sh] = free[len(free)-1], free[:len(free)-1]
	}
	s.mu.Unlock()
	if w == nil {
		w = &writeSession{Write: proto.Write{Session: rand.Uint64() | 1}, shard: sh} // never 0: 0 opts out
	}
	w.Seq++
	return w
}

// done gives a session back once its operation returned.
func (s *sessions) done(w *writeSession) {
	if w.Session == 0 {
		return
	}
	s.mu.Lock()
	s.free[w.shard] = append(s.free[w.shard], w)
	s.mu.Unlock()
}
