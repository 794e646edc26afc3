package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// persistedSessions counts the session entries in Pebble.
func persistedSessions(t *testing.T, s *Store) int {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: sessionPrefix, UpperBound: sessionEnd})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	return n
}

func mustValue(t *testing.T, s *Store, key []byte, want string) {
	t.Helper()
	if v, err := s.Get(key); err != nil || string(v) != want {
		t.Fatalf("Get(%s) = %q, %v; want %q", key, v, err, want)
	}
}

// A (session, seq) is applied once: retries through the same lease offset
// or a new record get the first result; a lower seq is superseded; the
// table survives a restart.
func TestIdempotentCommitsAndDeletes(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	w := c.newWriter()
	ctx := context.Background()
	k := []byte("the key")
	a1 := proto.Write{Session: 0xa, Seq: 1}

	off, n := w.write(k, []byte("v1"))
	first, err := sv.s.Commit(ctx, w.lease.ID, off, n, a1)
	if err != nil {
		t.Fatal(err)
	}
	same := func(stage string, got Committed, err error, want Committed) {
		t.Helper()
		if err != nil || got != want {
			t.Fatalf("%s: %+v, %v; want %+v", stage, got, err, want)
		}
	}
	// The reply was lost: the same commit again, then rewritten into
	// another lease (a retry over a new connection).
	again, err := sv.s.Commit(ctx, w.lease.ID, off, n, a1)
	same("retry at the same offset", again, err, first)
	again, err = c.newWriter().putW(k, []byte("v1, rewritten"), a1)
	same("retry in a new lease", again, err, first)
	mustValue(t, sv.s, k, "v1")
	if st := sv.s.Stats(); st.Commits != 1 || st.Duplicates != 2 || st.Keys != 1 {
		t.Fatalf("after 2 retries: %d commits, %d duplicates, %d keys; want 1, 2, 1", st.Commits, st.Duplicates, st.Keys)
	}

	second, err := w.putW(k, []byte("v2"), proto.Write{Session: 0xa, Seq: 2})
	if err != nil || second.Version <= first.Version {
		t.Fatalf("seq 2: %+v, %v", second, err)
	}
	if _, err := sv.s.Commit(ctx, w.lease.ID, off, n, a1); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("seq 1 after seq 2: %v, want ErrSuperseded", err)
	}
	if err := sv.s.Delete(ctx, k, a1); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("a delete with seq 1 after seq 2: %v, want ErrSuperseded", err)
	}
	// Another writer supersedes seq 2's record: a retry of it gets its
	// version and no location.
	if _, err := w.putW(k, []byte("v3"), proto.Write{Session: 0xb, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	again, err = c.newWriter().putW(k, []byte("v2 again"), proto.Write{Session: 0xa, Seq: 2})
	same("retry of a superseded commit", again, err, Committed{Version: second.Version})
	mustValue(t, sv.s, k, "v3")

	// Deletes.
	d1 := proto.Write{Session: 0xd, Seq: 1}
	if err := sv.s.Delete(ctx, k, d1); err != nil {
		t.Fatal(err)
	}
	if _, err := w.putW(k, []byte("v4"), proto.Write{Session: 0xb, Seq: 2}); err != nil {
		t.Fatal(err)
	}
	if err := sv.s.Delete(ctx, k, d1); err != nil {
		t.Fatalf("retried delete: %v", err)
	}
	mustValue(t, sv.s, k, "v4")
	if st := sv.s.Stats(); st.Deletes != 1 {
		t.Fatalf("%d deletes applied, want 1", st.Deletes)
	}

	// Across a restart: the table is persisted with the writes.
	current, err := w.putW([]byte("other"), []byte("o1"), proto.Write{Session: 0xc, Seq: 7})
	if err != nil {
		t.Fatal(err)
	}
	commits := sv.s.Stats().Commits
	sv.restart()
	waitArenas(t, sv.s, 2)
	w = c.newWriter()
	again, err = w.putW([]byte("other"), []byte("o1 after restart"), proto.Write{Session: 0xc, Seq: 7})
	same("retry after a restart", again, err, current)
	again, err = w.putW(k, []byte("v2, after restart"), proto.Write{Session: 0xa, Seq: 2})
	same("retry of a superseded commit after a restart", again, err, Committed{Version: second.Version})
	if err := sv.s.Delete(ctx, k, d1); err != nil {
		t.Fatal(err)
	}
	if _, err := w.putW(k, []byte("x"), a1); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("seq 1 after a restart: %v, want ErrSuperseded", err)
	}
	mustValue(t, sv.s, k, "v4")
	mustValue(t, sv.s, []byte("other"), "o1")
	if st := sv.s.Stats(); st.Commits != 0 || st.Deletes != 0 || st.Keys != 2 || st.Sessions != 4 {
		t.Fatalf("after retries since the restart (%d commits before): %+v", commits, st)
	}
	checkAccounting(t, sv.s)
}

// A retry that arrives while the first attempt is still in the commit
// pipeline waits for it and gets its result; a lower seq is refused at
// once.
func TestConcurrentRetryWaitsForTheFirst(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	entered, unblock := holdFirstApply(t, sv.s)
	type result struct {
		cm  Committed
		err error
	}
	wr := proto.Write{Session: 0x5e55, Seq: 9}
	w1, w2 := c.newWriter(), c.newWriter()
	off1, n1 := w1.write([]byte("k"), []byte("first"))
	off2, n2 := w2.write([]byte("k"), []byte("retry"))
	r1, r2 := make(chan result, 1), make(chan result, 1)
	go func() {
		cm, err := sv.s.Commit(context.Background(), w1.lease.ID, off1, n1, wr)
		r1 <- result{cm, err}
	}()
	<-entered
	go func() {
		cm, err := sv.s.Commit(context.Background(), w2.lease.ID, off2, n2, wr)
		r2 <- result{cm, err}
	}()
	select {
	case r := <-r2:
		t.Fatalf("the retry returned %+v while the first attempt was in flight", r)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := c.newWriter().putW([]byte("k"), []byte("older"), proto.Write{Session: wr.Session, Seq: 8}); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("seq 8 while seq 9 is in flight: %v, want ErrSuperseded", err)
	}
	// A waiting retry gives up with its context.
	w3 := c.newWriter()
	off3, n3 := w3.write([]byte("k"), []byte("impatient"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	if _, err := sv.s.Commit(ctx, w3.lease.ID, off3, n3, wr); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a retry with a short deadline: %v, want its deadline", err)
	}
	cancel()
	unblock()
	a, b := <-r1, <-r2
	if a.err != nil || b.err != nil || a.cm != b.cm {
		t.Fatalf("first %+v, retry %+v: want the same result", a, b)
	}
	mustValue(t, sv.s, []byte("k"), "first")
	if st := sv.s.Stats(); st.Commits != 1 || st.Keys != 1 {
		t.Fatalf("%d commits, %d keys; want 1 and 1", st.Commits, st.Keys)
	}
}

// The table is bounded: the oldest entries beyond MaxSessions go (counted
// as early evictions), entries past SessionTTL go (not counted), and both
// are deleted from Pebble too.
func TestSessionTableBounds(t *testing.T) {
	opts := smallOptions()
	opts.MaxSessions = 4
	sv := newServer(t, opts)
	waitArenas(t, sv.s, 2)
	w := newClient(t, sv).newWriter()
	var results []Committed
	for i := range 10 {
		cm, err := w.putW(key(i), []byte("v"), proto.Write{Session: uint64(100 + i), Seq: 1})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, cm)
	}
	if st := sv.s.Stats(); st.Sessions != 4 || st.SessionsEvictedEarly != 6 {
		t.Fatalf("%d sessions held, %d evicted early; want 4 and 6", st.Sessions, st.SessionsEvictedEarly)
	}
	// The next flush of the index log deletes the evicted entries from
	// Pebble.
	if err := sv.s.flushIndex(); err != nil {
		t.Fatal(err)
	}
	if n := persistedSessions(t, sv.s); n != 4 {
		t.Fatalf("%d session entries in Pebble, want 4", n)
	}
	// The newest are remembered; an evicted one is not (which is why
	// early evictions are counted).
	if cm, err := w.putW(key(9), []byte("again"), proto.Write{Session: 109, Seq: 1}); err != nil || cm != results[9] {
		t.Fatalf("retry of a kept session: %+v, %v", cm, err)
	}
	if cm, err := w.putW(key(0), []byte("again"), proto.Write{Session: 100, Seq: 1}); err != nil || cm == results[0] {
		t.Fatalf("retry of an evicted session: %+v, %v; want applied anew", cm, err)
	}
	mustValue(t, sv.s, key(0), "again")
	sv.restart()
	waitArenas(t, sv.s, 2)
	if st := sv.s.Stats(); st.Sessions != 4 {
		t.Fatalf("%d sessions loaded, want 4", st.Sessions)
	}

	// The TTL: the expiry tick (every second here) drops and deletes
	// them, without counting them early.
	sv.s.Close()
	sv.opts.SessionTTL, sv.opts.MaxSessions = 100*time.Millisecond, 100
	sv.open()
	waitArenas(t, sv.s, 2)
	w = newClient(t, sv).newWriter()
	if _, err := w.putW([]byte("short-lived"), []byte("v"), proto.Write{Session: 7, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for sv.s.Stats().Sessions != 0 || persistedSessions(t, sv.s) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the TTL: %d sessions, %d in Pebble", sv.s.Stats().Sessions, persistedSessions(t, sv.s))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := sv.s.Stats(); st.SessionsEvictedEarly != 0 {
		t.Fatalf("%d expired sessions counted as early evictions", st.SessionsEvictedEarly)
	}
}

// The table orders entries by when their session last applied, though a
// session applying again does not re-sort it at once: the cap evicts the
// least recently applied, and the TTL spares an entry pushed long ago but
// applied since.
func TestSessionTableAgesByLastApplied(t *testing.T) {
	tab := newSessionTable(time.Hour, 2)
	base := time.Unix(1_000_000, 0)
	apply := func(session, seq uint64, at time.Duration) {
		c := &pendingCommit{shard: 1, write: proto.Write{Session: session, Seq: seq}}
		tab.begin(c)
		tab.finish(c, true, base.Add(at).UnixNano())
	}
	held := func(session, seq uint64) bool {
		v, err := tab.check(1, proto.Write{Session: session, Seq: seq})
		return err == nil && v.dup != nil
	}
	apply(1, 1, 0)
	apply(2, 1, time.Second)
	apply(1, 2, 2*time.Second) // session 1 is now the more recent
	apply(3, 1, 3*time.Second)
	tab.evict(base.Add(3 * time.Second))
	if !held(1, 2) || held(2, 1) || !held(3, 1) || tab.early != 1 || tab.byAge.Len() != 2 {
		t.Fatalf("after the cap: sessions 1 %v, 2 %v, 3 %v, %d early, %d held; want 1 and 3 held, 1 early",
			held(1, 2), held(2, 1), held(3, 1), tab.early, tab.byAge.Len())
	}
	// 2.5 s past the TTL: session 1 (pushed at 0, applied at 2 s) is
	// still young enough, 3 too.
	tab.evict(base.Add(time.Hour + 1500*time.Millisecond))
	if !held(1, 2) || !held(3, 1) || tab.early != 1 {
		t.Fatalf("before their TTL: sessions 1 %v, 3 %v, %d early", held(1, 2), held(3, 1), tab.early)
	}
	tab.evict(base.Add(time.Hour + 2500*time.Millisecond))
	if held(1, 2) || !held(3, 1) || tab.early != 1 {
		t.Fatalf("past session 1's TTL: sessions 1 %v, 3 %v, %d early", held(1, 2), held(3, 1), tab.early)
	}
	if len(tab.doomed) != 2 {
		t.Fatalf("%d entries to delete from Pebble, want 2", len(tab.doomed))
	}
}
