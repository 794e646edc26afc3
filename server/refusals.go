// Logging refused requests without flooding the log.

package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// refusalLogEvery is how often, at most, refusals of one kind are logged:
// a full store refuses every write, and a line for each would bury the
// rest of the log.
const refusalLogEvery = time.Second

// refusalLog logs the first refusal of each kind at once, then counts the
// refusals of that kind for refusalLogEvery and logs their number with the
// last one's details (count, period), until a period passes without
// any.
type refusalLog struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	closed bool
	kinds  map[string]*refusals
}

type refusals struct {
	level slog.Level
	msg   string
	args  []any // the last refusal's
	n     int   // refusals since the last line
	timer *time.Timer
}

func newRefusalLog(log *slog.Logger, every time.Duration) *refusalLog {
	return &refusalLog{log: log, every: every, kinds: map[string]*refusals{}}
}

// note records a refusal of the given kind: logged now if none of its
// kind was in the last period, else counted into the period's line.
func (l *refusalLog) note(kind string, level slog.Level, msg string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if r := l.kinds[kind]; r != nil {
		r.level, r.msg, r.args = level, msg, args
		r.n++
		return
	}
	l.log.Log(context.Background(), level, msg, args...)
	r := &refusals{}
	r.timer = time.AfterFunc(l.every, func() { l.flush(kind, r) })
	l.kinds[kind] = r
}

// flush ends a period: it logs the refusals counted in it, and starts
// another, or forgets the kind when there were none.
func (l *refusalLog) flush(kind string, r *refusals) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.kinds[kind] != r {
		return
	}
	if r.n == 0 {
		delete(l.kinds, kind)
		return
	}
	l.log.Log(context.Background(), r.level, r.msg, append(r.args, "count", r.n, "period", l.every.String())...)
	r.n = 0
	r.timer.Reset(l.every)
}

// close stops the periods' timers; refusals counted and not yet logged
// are logged now.
func (l *refusalLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, r := range l.kinds {
		r.timer.Stop()
		if r.n > 0 {
			l.log.Log(context.Background(), r.level, r.msg, append(r.args, "count", r.n, "period", "since the last line")...)
		}
	}
	clear(l.kinds)
}

// logRefusal logs a request the server refused with e, when the refusal
// is one an operator acts on: a full store or index (add arenas or
// servers, or delete), and leases refused for any other reason. Other
// refusals (a key not found, a stale map) are the protocol at work.
func (s *Server) logRefusal(m proto.Message, e *proto.Error) {
	switch {
	case e.Code == proto.CodeFull || e.Code == proto.CodeIndexFull:
		st := s.st.Stats()
		s.refusals.note("full/"+e.Code.String(), slog.LevelWarn, "store full: refusing writes",
			"request", m.Type().String(), "code", e.Code.String(), "reason", e.Message,
			"free_bytes", st.Free, "dead_bytes", st.Dead, "capacity_bytes", st.Capacity, "keys", st.Keys)
	case m.Type() == proto.MsgGrantLease:
		s.refusals.note("lease/"+e.Code.String(), slog.LevelInfo, "lease refused",
			"code", e.Code.String(), "reason", e.Message)
	}
}
