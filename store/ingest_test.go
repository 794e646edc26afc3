package store

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/rkv-io/rkv/proto"
)

// copyShard copies shard sh from store src into dst as a migration's
// target does: page through src's entries, read each record at its
// location (RecordAt standing in for the RDMA_READ), and Ingest the pages;
// with since, also delete what dst has and src no longer has, and skip
// what dst already holds at the same version. The first page carries the
// sessions.
func copyShard(t *testing.T, src, dst *Store, sh proto.Shard) (records int) {
	t.Helper()
	ctx := context.Background()
	have := map[string]uint64{}
	mine, _, err := dst.ShardEntries(sh, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range mine {
		have[string(e.Key)] = e.Version
	}
	sessions := src.ShardSessions(sh)
	for after := []byte(nil); ; {
		page, more, err := src.ShardEntries(sh, after, 8)
		if err != nil {
			t.Fatal(err)
		}
		var recs [][]byte
		for _, e := range page {
			if v, ok := have[string(e.Key)]; ok && v == e.Version {
				delete(have, string(e.Key))
				continue
			}
			delete(have, string(e.Key))
			b, err := src.RecordAt(e.Location)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, b)
		}
		if err := dst.Ingest(ctx, sh, recs, sessions, nil); err != nil {
			t.Fatal(err)
		}
		records += len(recs)
		sessions = nil
		if !more {
			break
		}
		after = page[len(page)-1].Key
	}
	var gone [][]byte
	for k := range have {
		gone = append(gone, []byte(k))
	}
	if err := dst.Ingest(ctx, sh, nil, nil, gone); err != nil {
		t.Fatal(err)
	}
	return records
}

func sameEntries(t *testing.T, stage string, a, b *Store, sh proto.Shard) {
	t.Helper()
	ea, _, err := a.ShardEntries(sh, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	eb, _, err := b.ShardEntries(sh, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ea) != len(eb) {
		t.Fatalf("%s: source has %d entries, target %d", stage, len(ea), len(eb))
	}
	for i := range ea {
		if !bytes.Equal(ea[i].Key, eb[i].Key) || ea[i].Version != eb[i].Version {
			t.Fatalf("%s: entry %d: source %s v%d, target %s v%d", stage, i, ea[i].Key, ea[i].Version, eb[i].Key, eb[i].Version)
		}
		ra, _ := a.RecordAt(ea[i].Location)
		rb, _ := b.RecordAt(eb[i].Location)
		if recordState(rb) != proto.RecordDead {
			t.Fatalf("%s: ingested record of %s in state %d, want dead", stage, eb[i].Key, recordState(rb))
		}
		putState(ra, 0)
		putState(rb, 0)
		if !bytes.Equal(ra, rb) {
			t.Fatalf("%s: record of %s differs beyond its state word", stage, eb[i].Key)
		}
	}
}

// A shard moves from store A to store B: a first copy while A serves it,
// changes on A, a second copy of what changed while A is frozen, then A
// releases and B activates. B then serves the same values, knows A's
// sessions, and versions on B keep growing past A's.
func TestIngestMovesAShardBetweenStores(t *testing.T) {
	underEachSyncPolicy(t, testIngestMovesAShardBetweenStores)
}

func testIngestMovesAShardBetweenStores(t *testing.T, sync SyncPolicy) {
	a := newServer(t, syncOptions(sync))
	b := newBareServer(t, syncOptions(sync))
	waitArenas(t, a.s, 2)
	waitArenas(t, b.s, 2)
	ca, cb := newClient(t, a), newClient(t, b)
	wa := ca.newWriter()
	const sh = proto.Shard(321)
	ks := keysIn(sh, "m", 30)
	model := map[string]string{}
	put := func(k []byte, v string, wr proto.Write) Committed {
		t.Helper()
		cm, err := wa.putW(k, []byte(v), wr)
		if err != nil {
			t.Fatal(err)
		}
		model[string(k)] = v
		return cm
	}
	for i, k := range ks {
		put(k, fmt.Sprintf("value %d", i), proto.Write{Session: uint64(0x100 + i), Seq: 1})
	}
	for _, k := range keysIn(sh+1, "m", 5) { // a neighbour's keys stay on A
		put(k, "neighbour", proto.Write{})
	}

	if err := b.s.Ingest(context.Background(), sh, nil, nil, nil); !errors.Is(err, ErrShardState) {
		t.Fatalf("Ingest before BeginIncoming: %v, want ErrShardState", err)
	}
	if err := b.s.BeginIncoming([]proto.Shard{sh}, 1); err != nil {
		t.Fatal(err)
	}
	if n := copyShard(t, a.s, b.s, sh); n != 30 {
		t.Fatalf("first copy: %d records, want 30", n)
	}
	sameEntries(t, "first copy", a.s, b.s, sh)
	if _, err := b.s.Get(ks[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an incoming key is served: %v", err)
	}
	if _, r := cb.read(ks[0], 2); r != readRefresh {
		t.Fatalf("one-sided read of an incoming key: %v, want refresh", r)
	}

	// A keeps serving: an update, a delete, a new key.
	superseded := put(ks[0], "value 0, updated", proto.Write{Session: 0x100, Seq: 2})
	if err := a.s.Delete(context.Background(), ks[1], proto.Write{}); err != nil {
		t.Fatal(err)
	}
	delete(model, string(ks[1]))
	fresh := keysIn(sh, "fresh", 1)[0]
	put(fresh, "fresh value", proto.Write{})
	current := put(ks[2], "value 2, updated", proto.Write{Session: 0x102, Seq: 2})
	if _, err := wa.putW(ks[0], []byte("value 0, final"), proto.Write{Session: 0x999, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	model[string(ks[0])] = "value 0, final"

	// The freeze and the second copy: only what changed moves.
	if err := a.s.FreezeShards(context.Background(), []proto.Shard{sh}); err != nil {
		t.Fatal(err)
	}
	if n := copyShard(t, a.s, b.s, sh); n != 3 {
		t.Fatalf("second copy: %d records, want 3 (two updated, one new)", n)
	}
	sameEntries(t, "second copy", a.s, b.s, sh)
	allocated := func() int64 {
		st := b.s.Stats()
		return st.Capacity - st.Free
	}
	before := allocated()
	// A retried Ingest of records B has takes no space twice.
	var recs [][]byte
	entries, _, _ := a.s.ShardEntries(sh, nil, 0)
	for _, e := range entries {
		r, _ := a.s.RecordAt(e.Location)
		recs = append(recs, r)
	}
	if err := b.s.Ingest(context.Background(), sh, recs, a.s.ShardSessions(sh), nil); err != nil {
		t.Fatal(err)
	}
	if got := allocated(); got != before {
		t.Fatalf("re-ingesting the same records took %d bytes", got-before)
	}
	checkAccounting(t, b.s)

	if err := a.s.ReleaseShards([]proto.Shard{sh}); err != nil {
		t.Fatal(err)
	}
	if err := b.s.ActivateShards([]proto.Shard{sh}, 2); err != nil {
		t.Fatal(err)
	}
	checkServes := func(stage string) {
		t.Helper()
		for k, want := range model {
			if proto.ShardOf([]byte(k)) != sh {
				continue
			}
			if v, r := cb.read([]byte(k), 2); r != readFound || string(v) != want {
				t.Fatalf("%s: B reads %s = %q (%v), want %q", stage, k, v, r, want)
			}
			if _, r := ca.read([]byte(k), 1); r != readRefresh {
				t.Fatalf("%s: A still answers for %s: %v", stage, k, r)
			}
		}
		if v, r := cb.read(ks[1], 2); r != readNotFound {
			t.Fatalf("%s: the deleted key reads %q, %v on B", stage, v, r)
		}
		checkAccounting(t, b.s)
	}
	checkServes("activated")
	if got, want := b.s.ShardSessions(sh), a.s.ShardSessions(sh); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sessions on B %v, on A %v", got, want)
	}
	if st := b.s.Stats(); st.Keys != 30 || b.s.Shards()[sh].Keys != 30 {
		t.Fatalf("B: %d keys indexed, %d in the shard; want 30", st.Keys, b.s.Shards()[sh].Keys)
	}

	// Retries reaching B of commits A applied are recognised: the still
	// current one with B's location of it, the superseded one without.
	wb := cb.newWriter()
	retryAndCheck := func(stage string) {
		t.Helper()
		cm, err := wb.putW(ks[2], []byte("value 2, retried on B"), proto.Write{Session: 0x102, Seq: 2})
		loc, _, _ := b.s.index.Get(ks[2])
		if err != nil || cm.Version != current.Version || cm.Location != loc {
			t.Fatalf("%s: retry of a current write on B: %+v, %v; want version %d at %+v", stage, cm, err, current.Version, loc)
		}
		cm, err = wb.putW(ks[0], []byte("value 0, retried"), proto.Write{Session: 0x100, Seq: 2})
		if err != nil || cm != (Committed{Version: superseded.Version}) {
			t.Fatalf("%s: retry of a superseded write on B: %+v, %v", stage, cm, err)
		}
		if _, err := wb.putW(ks[3], []byte("old"), proto.Write{Session: 0x100, Seq: 1}); !errors.Is(err, ErrSuperseded) {
			t.Fatalf("%s: an older seq on B: %v", stage, err)
		}
	}
	retryAndCheck("activated")
	checkServes("after retries")

	// Versions on B continue above everything ingested.
	var maxVersion uint64
	entries, _, _ = b.s.ShardEntries(sh, nil, 0)
	for _, e := range entries {
		maxVersion = max(maxVersion, e.Version)
	}
	if wb := cb.newWriter(); wb.lease.VersionBase <= maxVersion {
		t.Fatalf("a lease on B starts at version %d, ingested versions reach %d", wb.lease.VersionBase, maxVersion)
	}
	cm, err := cb.newWriter().put(ks[0], []byte("value 0, on B"))
	if err != nil || cm.Version <= maxVersion {
		t.Fatalf("a commit on B: %+v, %v; want a version above %d", cm, err, maxVersion)
	}
	model[string(ks[0])] = "value 0, on B"

	b.restart()
	waitArenas(t, b.s, 2)
	wb = cb.newWriter()
	checkServes("B restarted")
	cm, err = wb.putW(ks[2], []byte("value 2, retried on B"), proto.Write{Session: 0x102, Seq: 2})
	if loc, _, _ := b.s.index.Get(ks[2]); err != nil || cm.Version != current.Version || cm.Location != loc {
		t.Fatalf("retry after B restarted: %+v, %v", cm, err)
	}

	// Misuse changes nothing.
	other := keysIn(sh+2, "x", 1)[0]
	if err := b.s.BeginIncoming([]proto.Shard{sh + 2}, 1); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, proto.RecordSize(len(other), 1))
	proto.EncodeRecord(rec, 5, 0, other, []byte("v"))
	if err := b.s.Ingest(context.Background(), sh, recs[:1], nil, nil); !errors.Is(err, ErrShardState) {
		t.Fatalf("Ingest into an owned shard: %v", err)
	}
	if err := b.s.Ingest(context.Background(), sh+2, [][]byte{recs[0]}, nil, nil); !errors.Is(err, ErrRecord) {
		t.Fatalf("Ingest of a record of another shard: %v", err)
	}
	torn := append([]byte(nil), rec...)
	torn[len(torn)-8] ^= 1
	if err := b.s.Ingest(context.Background(), sh+2, [][]byte{rec, torn}, nil, nil); !errors.Is(err, ErrRecord) {
		t.Fatalf("Ingest of a torn record: %v", err)
	}
	if e, _, _ := b.s.ShardEntries(sh+2, nil, 0); len(e) != 0 {
		t.Fatalf("a refused Ingest left %d entries", len(e))
	}
	checkAccounting(t, b.s)
}

const ingestChildEnv = "RKV_STORE_INGEST_CHILD"

const ingestShard = proto.Shard(99)

func ingestValue(key []byte, version uint64) []byte {
	return fmt.Appendf(nil, "value of %s at %d", key, version)
}

func ingestOptions(dir string) Options {
	opts := smallOptions()
	opts.Dir = dir
	opts.ArenaSize = 16 << 20
	opts.CheckpointBytes = 64 << 10 // checkpoints while it runs, too
	return opts
}

// ingestChild runs in a child process: it ingests batches into an
// incoming shard (new keys, newer versions of earlier keys, a delete),
// printing each batch before it is handed to Ingest and "ack" once Ingest
// returned, until killed.
func ingestChild() {
	t := &childT{}
	round, _ := strconv.Atoi(os.Getenv("RKV_CRASH_ROUND"))
	sv := newBareServer(t, ingestOptions(os.Getenv(ingestChildEnv)))
	if err := sv.s.BeginIncoming([]proto.Shard{ingestShard}, 1); err != nil {
		t.Fatal(err)
	}
	var earlier [][]byte
	entries, _, err := sv.s.ShardEntries(ingestShard, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		earlier = append(earlier, e.Key)
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	tag, n := fmt.Sprintf("r%d", round), 0
	nextKey := func() []byte {
		for ; ; n++ {
			if k := fmt.Appendf(nil, "%s-%d", tag, n); proto.ShardOf(k) == ingestShard {
				n++
				return k
			}
		}
	}
	version := uint64(round+1) << 32
	for batch := 0; ; batch++ {
		var recs [][]byte
		fmt.Fprintln(out, "batch", batch)
		add := func(k []byte) {
			version++
			v := ingestValue(k, version)
			rec := make([]byte, proto.RecordSize(len(k), len(v)))
			if _, err := proto.EncodeRecord(rec, version, 0, k, v); err != nil {
				t.Fatal(err)
			}
			putState(rec, uint32(rand.IntN(3))) // whatever the source's state word said
			recs = append(recs, rec)
			fmt.Fprintln(out, "put", string(k), version)
		}
		for range 16 {
			k := nextKey()
			add(k)
			earlier = append(earlier, k)
		}
		add(earlier[rand.IntN(len(earlier))])
		del := earlier[rand.IntN(len(earlier))]
		fmt.Fprintln(out, "del", string(del))
		out.Flush()
		if err := sv.s.Ingest(context.Background(), ingestShard, recs, nil, [][]byte{del}); err != nil {
			t.Fatal("ingest: ", err)
		}
		fmt.Fprintln(out, "ack", batch)
		out.Flush()
	}
}

// ingestOp is one change of a batch the child printed.
type ingestOp struct {
	key     string
	version uint64 // 0: a delete
}

func applyOps(model map[string]uint64, ops []ingestOp) map[string]uint64 {
	out := make(map[string]uint64, len(model)+len(ops))
	for k, v := range model {
		out[k] = v
	}
	for _, op := range ops {
		if op.version == 0 {
			delete(out, op.key)
		} else {
			out[op.key] = op.version
		}
	}
	return out
}

// A child ingesting into a shard is killed with SIGKILL at random points.
// After each kill the shard holds exactly the acknowledged batches, plus
// perhaps the one Ingest had not returned from (batches are atomic);
// every entry points at an intact record that is dead (the shard is not
// owned); and the space adds up, nothing allocated unaccounted. At the
// end the shard activates and serves it all.
func TestIngestSurvivesKill9(t *testing.T) {
	dir := t.TempDir()
	model := map[string]uint64{}
	rounds := 3
	if testing.Short() {
		rounds = 2
	}
	var sv *server
	for round := range rounds {
		var pending []ingestOp
		acked := 0
		runKilledChild(t, round, []string{ingestChildEnv + "=" + dir}, func(f []string) {
			switch {
			case len(f) == 2 && f[0] == "batch":
				pending = pending[:0]
			case len(f) == 3 && f[0] == "put":
				v, _ := strconv.ParseUint(f[2], 10, 64)
				pending = append(pending, ingestOp{f[1], v})
			case len(f) == 2 && f[0] == "del":
				pending = append(pending, ingestOp{f[1], 0})
			case len(f) == 2 && f[0] == "ack":
				model = applyOps(model, pending)
				pending = nil
				acked++
			}
		})
		if acked == 0 {
			t.Fatalf("round %d: nothing acknowledged before the kill", round)
		}

		sv = newBareServer(t, ingestOptions(dir))
		if st := sv.s.ShardState(ingestShard).State; st != ShardIncoming {
			t.Fatalf("round %d: the shard is %v after the kill, want incoming", round, st)
		}
		got := checkIngestedShard(t, sv.s)
		inFlight := "not applied"
		switch withPending := applyOps(model, pending); {
		case fmt.Sprint(got) == fmt.Sprint(model):
		case len(pending) > 0 && fmt.Sprint(got) == fmt.Sprint(withPending):
			model, inFlight = withPending, "applied"
		default:
			for k, v := range model {
				if got[k] != v {
					t.Errorf("round %d: acknowledged %s v%d, found v%d", round, k, v, got[k])
				}
			}
			t.Fatalf("round %d: the shard holds %d keys; the %d acknowledged batches make %d (the batch in flight: %d changes)",
				round, len(got), acked, len(model), len(pending))
		}
		t.Logf("round %d: killed after %d acknowledged batches; the batch in flight was %s", round, acked, inFlight)
		if round < rounds-1 {
			if err := sv.s.Close(); err != nil {
				t.Fatal(err)
			}
			sv.s = nil
			sv.shutdown()
		}
	}
	if err := sv.s.ActivateShards([]proto.Shard{ingestShard}, 4); err != nil {
		t.Fatal(err)
	}
	waitArenas(t, sv.s, sv.opts.ArenaCount)
	c := newClient(t, sv)
	for k, v := range model {
		if got, r := c.read([]byte(k), 4); r != readFound || !bytes.Equal(got, ingestValue([]byte(k), v)) {
			t.Fatalf("%s after activation: %q, %v", k, got, r)
		}
	}
	checkAccounting(t, sv.s)
	t.Logf("%d keys in the shard, all served", len(model))
}

// checkIngestedShard checks the ingested shard's entries and space after a
// restart, and returns its keys and versions.
func checkIngestedShard(t *testing.T, s *Store) map[string]uint64 {
	t.Helper()
	entries, _, err := s.ShardEntries(ingestShard, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	var liveBytes int64
	for _, e := range entries {
		got[string(e.Key)] = e.Version
		liveBytes += int64(e.Location.Length)
		rec, err := s.RecordAt(e.Location)
		if err != nil {
			t.Fatal(err)
		}
		if st := recordState(rec); st != proto.RecordDead {
			t.Fatalf("record of %s in state %d in an incoming shard", e.Key, st)
		}
		putState(rec, proto.RecordLive)
		if r, err := proto.VerifyRecord(rec, e.Key, e.Version); err != nil || !bytes.Equal(r.Value, ingestValue(e.Key, e.Version)) {
			t.Fatalf("entry %s v%d points at a bad record: %v", e.Key, e.Version, err)
		}
	}
	var arenaLive int64
	for _, a := range s.Stats().Arenas {
		arenaLive += a.Live
	}
	if st := s.Stats(); st.Live+st.Dead+st.Free != st.Capacity {
		t.Fatalf("after a restart: %d live + %d dead + %d free != %d", st.Live, st.Dead, st.Free, st.Capacity)
	}
	checkSegments(t, s)
	if st := s.Shards()[ingestShard]; arenaLive != liveBytes || st.LiveBytes != liveBytes || st.Keys != int64(len(entries)) {
		t.Fatalf("the arenas hold %d live bytes, the shard says %d bytes and %d keys, its entries are %d bytes and %d keys",
			arenaLive, st.LiveBytes, st.Keys, liveBytes, len(entries))
	}
	return got
}
