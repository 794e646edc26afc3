// Tests of backups: a store that applies its primary's forwarded writes, keeps them unreadable, and takes over.

package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// newBackup opens a store that backs up every shard since epoch 1, as a
// replica added by a copy does (BeginIncoming, then BeginBackup).
func newBackup(t *testing.T, opts Options) *server {
	t.Helper()
	sv := newBareServer(t, opts)
	if err := sv.s.BeginIncoming(AllShards(), 1); err != nil {
		t.Fatal(err)
	}
	if err := sv.s.BeginBackup(AllShards(), 1); err != nil {
		t.Fatal(err)
	}
	return sv
}

// replicaWriter writes records into a lease of a backup with the versions
// their primary gave them, as a client writes the same bytes to every
// replica.
type replicaWriter struct{ lw leaseWriter }

func (rw *replicaWriter) apply(key, value []byte, version uint64) (Committed, error) {
	return rw.applyAs(key, value, version, proto.Write{})
}

// applyAs is apply under w's session and seq.
func (rw *replicaWriter) applyAs(key, value []byte, version uint64, pw proto.Write) (Committed, error) {
	lw := &rw.lw
	n := int64(proto.RecordSize(len(key), len(value)))
	if lw.w != nil && lw.w.off+n > lw.w.lease.Size {
		lw.end()
	}
	if lw.w == nil {
		l, err := lw.c.sv.s.GrantLease(context.Background(), max(n, lw.ask), n)
		if err != nil {
			return Committed{}, err
		}
		lw.w = &writer{c: lw.c, lease: l}
	}
	w := lw.w
	c := w.c
	c.mu.Lock()
	size, err := proto.EncodeRecord(c.mem.Bytes(), version, 0, key, value)
	if err == nil {
		if st := c.do(rdma.OpWrite, 0, size, w.lease.Addr+uint64(w.off), w.lease.RKey); st != rdma.StatusSuccess {
			err = fmt.Errorf("RDMA_WRITE into the backup's lease: %v", st)
		}
	}
	c.mu.Unlock()
	if err != nil {
		return Committed{}, err
	}
	off := w.off
	w.off += int64(size)
	return c.sv.s.ApplyReplica(context.Background(), w.lease.ID, off, int64(size), version, pw)
}

// entriesOf lists every shard's entries: key -> version.
func entriesOf(t *testing.T, s *Store) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for sh := range proto.NumShards {
		es, _, err := s.ShardEntries(proto.Shard(sh), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			out[string(e.Key)] = e.Version
		}
	}
	return out
}

// A backup that applies its primary's puts and deletes holds the same
// keys at the same versions; a one-sided reader never takes its records
// for an answer, nor confirms a miss there; across a restart it stays a
// backup; promoted, it serves every value, and its own versions go on
// above the primary's.
func TestBackupFollowsItsPrimary(t *testing.T) { underEachSyncPolicy(t, testBackupFollowsItsPrimary) }

func testBackupFollowsItsPrimary(t *testing.T, sync SyncPolicy) {
	opts := syncOptions(sync)
	primary, backup := newServer(t, opts), newBackup(t, opts)
	pw := &leaseWriter{c: newClient(t, primary), ask: 64 << 10}
	bw := &replicaWriter{lw: leaseWriter{c: newClient(t, backup), ask: 64 << 10}}
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string]string{}
	for i := range 3000 {
		key := fmt.Appendf(nil, "k%03d", rng.IntN(300))
		if rng.IntN(5) == 0 {
			if err := primary.s.Delete(context.Background(), key, proto.Write{}); err != nil {
				t.Fatal(err)
			}
			if err := backup.s.DeleteReplica(context.Background(), key, proto.Write{}); err != nil {
				t.Fatal(err)
			}
			delete(want, string(key))
			continue
		}
		value := fmt.Appendf(nil, "v%d", i)
		c, err := pw.put(key, value)
		if err != nil {
			t.Fatal(err)
		}
		bc, err := bw.apply(key, value, c.Version)
		if err != nil {
			t.Fatalf("applying %q version %d to the backup: %v", key, c.Version, err)
		}
		if bc.Version != c.Version {
			t.Fatalf("the backup applied version %d, the primary %d", bc.Version, c.Version)
		}
		want[string(key)] = string(value)
	}
	pw.end()
	bw.lw.end()
	pe, be := entriesOf(t, primary.s), entriesOf(t, backup.s)
	if len(pe) != len(want) || fmt.Sprint(pe) != fmt.Sprint(be) {
		t.Fatalf("the backup's entries differ from the primary's: %d keys and %d, %d expected", len(pe), len(be), len(want))
	}
	checkUnreadable := func(when string) {
		t.Helper()
		rc := newClient(t, backup)
		for k := range want {
			if v, res := rc.read([]byte(k), 1); res != readRefresh {
				t.Fatalf("%s: a one-sided read of %q at the backup: %q, %v; want a refresh (nothing to trust)", when, k, v, res)
			}
		}
	}
	checkUnreadable("applied")
	if st := backup.s.Stats(); st.Keys != 0 {
		t.Fatalf("the backup counts %d indexed keys", st.Keys)
	}
	backup.restart()
	checkUnreadable("after a restart")
	if got := backup.s.ShardState(proto.ShardOf([]byte("k001"))).State; got != ShardBackup {
		t.Fatalf("after a restart the shard is %v", got)
	}
	// Promotion: the backup serves every value it was sent.
	if err := backup.s.ActivateShards(AllShards(), 2); err != nil {
		t.Fatal(err)
	}
	rc := newClient(t, backup)
	for k, v := range want {
		if got, res := rc.read([]byte(k), 2); res != readFound || string(got) != v {
			t.Fatalf("promoted: %q read %q, %v; want %q", k, got, res, v)
		}
	}
	if _, res := rc.read([]byte("never"), 2); res != readNotFound {
		t.Fatalf("promoted: an absent key: %v", res)
	}
	high := uint64(0)
	for _, v := range pe {
		high = max(high, v)
	}
	if l, err := backup.s.GrantLease(context.Background(), 0, 0); err != nil || l.VersionBase <= high {
		t.Fatalf("a lease of the promoted store starts at version %d (%v); the primary's reached %d", l.VersionBase, err, high)
	}
}

// A backup mirrors its primary when a write comes again under another
// record. Its first attempt was applied here while the forward failed at
// another backup, so the primary applied nothing; another session then
// wrote the key; the client's retry, a new record under the same session
// and seq, is what the primary applies. Answered from the session, the
// retry would leave this backup at the other session's value. A forward
// sent again at the same version is answered, as before.
func TestBackupReplacesAnEarlierAttempt(t *testing.T) {
	underEachSyncPolicy(t, testBackupReplacesAnEarlierAttempt)
}

func testBackupReplacesAnEarlierAttempt(t *testing.T, sync SyncPolicy) {
	backup := newBackup(t, syncOptions(sync))
	bw := &replicaWriter{lw: leaseWriter{c: newClient(t, backup), ask: 64 << 10}}
	key := []byte("k")
	w := proto.Write{Session: 0x51, Seq: 7}
	if _, err := bw.applyAs(key, []byte("v1"), 10, w); err != nil {
		t.Fatal(err)
	}
	if _, err := bw.applyAs(key, []byte("other"), 11, proto.Write{Session: 0x52, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	retry, err := bw.applyAs(key, []byte("v1"), 12, w)
	if err != nil || retry.Version != 12 {
		t.Fatalf("the retry at version 12: %+v, %v", retry, err)
	}
	if v := entriesOf(t, backup.s)[string(key)]; v != 12 {
		t.Fatalf("the key is at version %d on the backup, its primary applied 12", v)
	}
	again, err := bw.applyAs(key, []byte("v1"), 12, w)
	if err != nil || again.Version != 12 {
		t.Fatalf("the same forward again: %+v, %v; want the first answer, version 12", again, err)
	}
	if st := backup.s.Stats(); st.Duplicates != 1 {
		t.Fatalf("%d writes answered from their session, want 1", st.Duplicates)
	}
}

// A delete applied on a backup whose forward failed elsewhere is applied
// again when its retry comes, even though another session wrote the key
// in between: the primary deletes it then, so the backup must too.
func TestBackupDeletesAgainOnARetry(t *testing.T) {
	underEachSyncPolicy(t, testBackupDeletesAgainOnARetry)
}

func testBackupDeletesAgainOnARetry(t *testing.T, sync SyncPolicy) {
	backup := newBackup(t, syncOptions(sync))
	bw := &replicaWriter{lw: leaseWriter{c: newClient(t, backup), ask: 64 << 10}}
	key := []byte("k")
	if _, err := bw.apply(key, []byte("v"), 10); err != nil {
		t.Fatal(err)
	}
	w := proto.Write{Session: 0x61, Seq: 3}
	if err := backup.s.DeleteReplica(context.Background(), key, w); err != nil {
		t.Fatal(err)
	}
	if _, err := bw.applyAs(key, []byte("other"), 11, proto.Write{Session: 0x62, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if err := backup.s.DeleteReplica(context.Background(), key, w); err != nil {
		t.Fatalf("the delete's retry: %v", err)
	}
	if v, ok := entriesOf(t, backup.s)[string(key)]; ok {
		t.Fatalf("the key is still on the backup at version %d after the delete's retry, which its primary applies", v)
	}
}

// What a backup refuses: a client's commit (it is no owner), a replica's
// write of another version than its record's, or to a shard it does not
// back up; and a primary becomes a backup only frozen, after which its
// keys are no answer any more.
func TestBackupRefusals(t *testing.T) {
	opts := smallOptions()
	backup := newBackup(t, opts)
	c := newClient(t, backup)
	w := c.newWriter()
	if _, err := w.put([]byte("a"), []byte("1")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("a client's commit to a backup: %v, want ErrNotOwner", err)
	}
	rw := &replicaWriter{lw: leaseWriter{c: c}}
	off := int64(0)
	_ = off
	if _, err := rw.apply([]byte("b"), []byte("2"), 0); !errors.Is(err, ErrRecord) {
		t.Fatalf("a replica write of version 0: %v", err)
	}
	primary := newServer(t, opts)
	pc := newClient(t, primary)
	prw := &replicaWriter{lw: leaseWriter{c: pc}}
	if _, err := prw.apply([]byte("c"), []byte("3"), 7); !errors.Is(err, ErrNotBackup) {
		t.Fatalf("a replica write to an owned shard: %v, want ErrNotBackup", err)
	}
	sh := proto.ShardOf([]byte("d"))
	pw := pc.newWriter()
	if _, err := pw.put([]byte("d"), []byte("4")); err != nil {
		t.Fatal(err)
	}
	if err := primary.s.BeginBackup([]proto.Shard{sh}, 3); !errors.Is(err, ErrShardState) {
		t.Fatalf("BeginBackup of a primary shard not frozen: %v", err)
	}
	if err := primary.s.FreezeShards(context.Background(), []proto.Shard{sh}); err != nil {
		t.Fatal(err)
	}
	if err := primary.s.BeginBackup([]proto.Shard{sh}, 3); err != nil {
		t.Fatal(err)
	}
	if v, res := pc.read([]byte("d"), 1); res != readRefresh {
		t.Fatalf("a demoted primary's key read %q, %v; want a refresh", v, res)
	}
	if _, err := pw.put([]byte("d"), []byte("5")); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("a commit to a demoted shard: %v", err)
	}
}

// A backup overwritten many times its capacity stays within it: the
// cleaner moves backup records too (checked against the entries, as they
// are in no index), and every key's latest version survives, readable
// once promoted.
func TestCleanerMovesBackupRecords(t *testing.T) {
	opts := cleanerOptions()
	backup := newBackup(t, opts)
	waitArenas(t, backup.s, opts.ArenaCount)
	rw := &replicaWriter{lw: leaseWriter{c: newClient(t, backup), ask: 32 << 10}}
	capacity := backup.s.Stats().Capacity
	const size = 2000
	n := int(0.5 * float64(capacity) / size)
	version := uint64(1)
	latest := map[int]uint64{}
	for written := int64(0); written < 4*capacity; written += size {
		i := rand.IntN(n)
		version++
		if _, err := rw.apply(fmt.Appendf(nil, "key-%05d", i), soakValue(fmt.Appendf(nil, "key-%05d", i), int(version), size), version); err != nil {
			t.Fatalf("after %d bytes: %v", written, err)
		}
		latest[i] = version
	}
	rw.lw.end()
	st := backup.s.Stats()
	t.Logf("%d keys, 4x the capacity written: %d segments cleaned, %d bytes moved", n, st.SegmentsCleaned, st.CleanerMovedBytes)
	if st.SegmentsCleaned == 0 || st.CleanerMovedBytes == 0 {
		t.Fatal("the cleaner moved nothing of the backup")
	}
	checkAccounting(t, backup.s)
	if err := backup.s.ActivateShards(AllShards(), 2); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, backup)
	for i, v := range latest {
		key := fmt.Appendf(nil, "key-%05d", i)
		got, ok := c.mustGet(key)
		if !ok || string(got) != string(soakValue(key, int(v), size)) {
			t.Fatalf("key %d after promotion: %d bytes, found %v", i, len(got), ok)
		}
	}
}

// A replica the map gives empty (a bootstrap at R > 1) is a backup of
// nothing yet, and takes replica writes at once.
func TestEmptyBackup(t *testing.T) {
	sv := newBareServer(t, smallOptions())
	sh := proto.ShardOf([]byte("k"))
	if err := sv.s.BeginBackup([]proto.Shard{sh}, 2); err != nil {
		t.Fatalf("BeginBackup of a shard this store does not hold: %v", err)
	}
	if st := sv.s.ShardState(sh); st.State != ShardBackup || st.Since != 2 {
		t.Fatalf("shard %v after BeginBackup from nothing: %+v", sh, st)
	}
	rw := &replicaWriter{lw: leaseWriter{c: newClient(t, sv)}}
	if _, err := rw.apply([]byte("k"), []byte("v"), 9); err != nil {
		t.Fatalf("a replica write to an empty backup: %v", err)
	}
}
