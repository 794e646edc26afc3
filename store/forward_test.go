package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// fakeForwarder records what it is asked to forward; block, when set,
// holds each Forward until it is closed; fail makes them fail.
type fakeForwarder struct {
	mu    sync.Mutex
	sent  []Forwarded
	block chan struct{}
	fail  error
	calls chan struct{}
}

func (f *fakeForwarder) Forwards(proto.Shard) bool { return true }

func (f *fakeForwarder) Forward(ctx context.Context, w Forwarded) error {
	f.mu.Lock()
	w.Key = append([]byte(nil), w.Key...)
	f.sent = append(f.sent, w)
	block, fail := f.block, f.fail
	f.mu.Unlock()
	if f.calls != nil {
		f.calls <- struct{}{}
	}
	if block != nil {
		<-block
	}
	return fail
}

func TestForwardedWrites(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 1)
	c := newClient(t, sv)
	ctx := context.Background()

	// A forwarded commit is applied here once forwarded, at the version
	// it was forwarded with.
	f := &fakeForwarder{}
	w := c.newWriter()
	off, n := w.write([]byte("k"), []byte("v1"))
	r, err := sv.s.CommitForwarded(ctx, w.lease.ID, off, n, proto.Write{}, f)
	if err != nil || len(f.sent) != 1 || f.sent[0].Version != r.Version || string(f.sent[0].Key) != "k" || f.sent[0].Delete {
		t.Fatalf("CommitForwarded: %+v, %v; forwarded %+v", r, err, f.sent)
	}
	if v, found, _ := c.get([]byte("k")); !found || string(v) != "v1" {
		t.Fatalf("after the forwarded commit: %q, found %v", v, found)
	}

	// A failed forward applies nothing, and the write may be retried.
	f.fail = errors.New("a backup is down")
	off, n = w.write([]byte("k"), []byte("v2"))
	if _, err := sv.s.CommitForwarded(ctx, w.lease.ID, off, n, proto.Write{Session: 9, Seq: 1}, f); !errors.Is(err, f.fail) {
		t.Fatalf("commit whose forward failed: %v", err)
	}
	if v, _, _ := c.get([]byte("k")); string(v) != "v1" {
		t.Fatalf("a commit whose forward failed was applied: %q", v)
	}
	f.fail = nil
	off, n = w.write([]byte("k"), []byte("v2"))
	if _, err := sv.s.CommitForwarded(ctx, w.lease.ID, off, n, proto.Write{Session: 9, Seq: 1}, f); err != nil {
		t.Fatalf("the retry after a failed forward: %v", err)
	}

	// One key's writes are forwarded one at a time: the second waits
	// until the first is applied; another key's does not.
	f.block, f.calls = make(chan struct{}), make(chan struct{}, 4)
	first, second, other := c.newWriter(), c.newWriter(), c.newWriter()
	errs := make(chan error, 3)
	commit := func(w *writer, key, value string) {
		off, n := w.write([]byte(key), []byte(value))
		_, err := sv.s.CommitForwarded(ctx, w.lease.ID, off, n, proto.Write{}, f)
		errs <- err
	}
	go commit(first, "k", "v3")
	<-f.calls
	go commit(second, "k", "v4")
	go commit(other, "j", "w1")
	<-f.calls // the other key's
	select {
	case <-f.calls:
		t.Fatal("a key's second write was forwarded while its first was")
	case <-time.After(100 * time.Millisecond):
	}
	close(f.block)
	<-f.calls // the second, once the first is applied
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if v, _, _ := c.get([]byte("k")); string(v) != "v4" {
		t.Fatalf("k after its two writes in order: %q", v)
	}

	// Deletes too.
	f.block, f.calls = nil, nil
	if err := sv.s.DeleteForwarded(ctx, []byte("k"), proto.Write{}, f); err != nil {
		t.Fatal(err)
	}
	if last := f.sent[len(f.sent)-1]; !last.Delete || string(last.Key) != "k" {
		t.Fatalf("the delete forwarded as %+v", last)
	}
	if _, found, _ := c.get([]byte("k")); found {
		t.Fatal("k found after its forwarded delete")
	}
}

// CommitBatch admits a lease's records in order and applies them
// together: fewer group commits than records, each record succeeding or
// failing on its own, forwarded ones forwarded, and a retried batch
// answered from the sessions.
func TestCommitBatch(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 1)
	c := newClient(t, sv)
	ctx := context.Background()
	w := c.newWriter()
	f := &fakeForwarder{}
	var batch []BatchCommit
	for i := range 20 {
		off, n := w.write(fmt.Appendf(nil, "batch-%d", i), fmt.Appendf(nil, "v%d", i))
		b := BatchCommit{Lease: w.lease.ID, Off: off, Length: n, Write: proto.Write{Session: uint64(100 + i), Seq: 1}}
		if i%5 == 0 {
			b.Forwarder = f
		}
		batch = append(batch, b)
	}
	batch[7].Length-- // a record whose length is wrong fails alone
	before := sv.s.Stats()
	sv.s.CommitBatch(ctx, batch)
	done := make([]Committed, len(batch))
	for i, b := range batch {
		err := b.Err
		done[i] = b.Result
		if i == 7 {
			if !errors.Is(err, ErrRecord) {
				t.Fatalf("record 7, its length wrong: %v", err)
			}
			continue
		}
		if err != nil || done[i].Location.Length != uint32(batch[i].Length) {
			t.Fatalf("record %d: %+v, %v", i, done[i], err)
		}
		if v, found, _ := c.get(fmt.Appendf(nil, "batch-%d", i)); !found || string(v) != fmt.Sprintf("v%d", i) {
			t.Fatalf("record %d after the batch: %q, found %v", i, v, found)
		}
	}
	after := sv.s.Stats()
	if got := after.Commits - before.Commits; got != 19 {
		t.Fatalf("%d commits applied, want 19", got)
	}
	if groups := after.Batches - before.Batches; groups >= 19 {
		t.Fatalf("19 commits in %d group commits: not applied together", groups)
	}
	if len(f.sent) != 4 {
		t.Fatalf("%d forwarded, want the 4 given a forwarder", len(f.sent))
	}
	// The same batch again: every applied record answered from its
	// session, none applied twice.
	batch[7].Length++
	sv.s.CommitBatch(ctx, batch)
	for i, b := range batch {
		if i != 7 && (b.Err != nil || b.Result.Version != done[i].Version) {
			t.Fatalf("record %d retried: %+v, %v; first %+v", i, b.Result, b.Err, done[i])
		}
	}
	if got := sv.s.Stats().Commits - after.Commits; got > 1 {
		t.Fatalf("the retried batch applied %d commits, want at most record 7's", got)
	}
}

// A retry that comes while its first attempt is being forwarded waits for
// that attempt and gets its outcome: when the forward fails, the failure,
// not the attempt's version as though it had been applied.
func TestRetryWaitingForAFailedForwardFails(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 1)
	c := newClient(t, sv)
	ctx := context.Background()
	f := &fakeForwarder{block: make(chan struct{}), fail: errors.New("a backup is down"), calls: make(chan struct{}, 2)}
	wr := proto.Write{Session: 7, Seq: 1}
	w1, w2 := c.newWriter(), c.newWriter()
	off1, n1 := w1.write([]byte("k"), []byte("v"))
	off2, n2 := w2.write([]byte("k"), []byte("v"))
	first, retry := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := sv.s.CommitForwarded(ctx, w1.lease.ID, off1, n1, wr, f)
		first <- err
	}()
	<-f.calls
	go func() {
		cm, err := sv.s.CommitForwarded(ctx, w2.lease.ID, off2, n2, wr, f)
		if err == nil {
			err = fmt.Errorf("succeeded: %+v", cm)
		}
		retry <- err
	}()
	select {
	case err := <-retry:
		t.Fatalf("the retry returned (%v) while its first attempt was being forwarded", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(f.block)
	if err := <-first; !errors.Is(err, f.fail) {
		t.Fatalf("the first attempt: %v, want the forward's failure", err)
	}
	if err := <-retry; !errors.Is(err, f.fail) {
		t.Fatalf("the retry: %v, want the first attempt's failure", err)
	}
	if len(f.sent) != 1 {
		t.Fatalf("%d forwards, want 1: the retry waited for the first attempt", len(f.sent))
	}
	if _, found, _ := c.get([]byte("k")); found {
		t.Fatal("k found: nothing was applied")
	}
}

// A commit whose owner stopped waiting (its context ended while the
// commit was queued) is still applied, and the pending commit it leaves
// behind is not reused while the writer may still signal it: the commits
// after it each get their own outcome, in the index and readable.
func TestCommitsAfterAnAbandonedWaitGetTheirOwnResults(t *testing.T) {
	sv := newServer(t, smallOptions())
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	entered, unblock := holdFirstApply(t, sv.s)
	first := make(chan error, 1)
	go func() {
		_, err := c.newWriter().put([]byte("holder"), []byte("h"))
		first <- err
	}()
	<-entered // the first commit holds the writer
	w := c.newWriter()
	off, n := w.write([]byte("impatient"), []byte("v"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := sv.s.Commit(ctx, w.lease.ID, off, n, proto.Write{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a commit queued behind a held writer, with a 20 ms deadline: %v", err)
	}
	unblock()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			w := c.newWriter()
			for i := range 50 {
				key := fmt.Appendf(nil, "after-%d-%d", g, i)
				cm, err := w.put(key, key)
				if err != nil {
					t.Error(err)
					return
				}
				if loc, ok, err := sv.s.index.Get(key); err != nil || !ok || loc != cm.Location {
					t.Errorf("%s: committed at %+v, the index has %+v (found %v, %v)", key, cm.Location, loc, ok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	mustValue(t, sv.s, []byte("impatient"), "v") // applied all the same
	for g := range 4 {
		mustValue(t, sv.s, fmt.Appendf(nil, "after-%d-49", g), fmt.Sprintf("after-%d-49", g))
	}
}
