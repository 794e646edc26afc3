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
// (store.Commit). Sessions are reused, so a client needs as many as it
// runs writes at once.
type sessions struct {
	mu   sync.Mutex
	free []*writeSession
	off  bool // tests only (export_test.go): writes opt out with Session 0
}

type writeSession struct{ proto.Write }

// next returns a session with its next sequence number, for one operation.
func (s *sessions) next() *writeSession {
	if s.off {
		return &writeSession{}
	}
	s.mu.Lock()
	var w *writeSession
	if n := len(s.free); n > 0 {
		w, s.free = s.free[n-1], s.free[:n-1]
	}
	s.mu.Unlock()
	if w == nil {
		w = &writeSession{proto.Write{Session: rand.Uint64() | 1}} // never 0: 0 opts out
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
	s.free = append(s.free, w)
	s.mu.Unlock()
}
